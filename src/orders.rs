//! A small order system, exposed to scripts as host functions: the demo back office of
//! `resumable serve --demo` and the model for embedding your own.
//!
//! * `orders.get(id)` → `{id, customer, total, refunded, status}`
//! * `orders.list(filter?)` → an array of orders; `filter` is `{status?, limit?}`
//! * `orders.refund(id, amount)` interrupts with `{kind: 'refund-approval', orderId, amount}`;
//!   resumed with `{approved: true}` it refunds **once** (keyed by the call's idempotency key) and
//!   returns `{approved: true, orderId, refunded, refundId}`; with `{approved: false, reason?}`
//!   it returns `{approved: false, reason}` and changes nothing.
//!
//! An approved refund acts on what the approver saw: the order and amount of the approved request
//! (the interruption's payload, which the runner's parent process recorded), never on arguments a
//! resumed call brings; a resumed call whose arguments differ from that request is refused. Every
//! effectful host function should follow this pattern.
//!
//! Amounts are integer cents. Every call is scoped to one tenant and audited in `host_calls`.

use std::sync::Arc;

use resumable_host::{HostCallContext, HostError, HostFunctions};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::db::{AppDb, DbError, Guard, Row, Step, TxOutcome, now_ms};

/// The demo data set: (tenant, id, customer, total in cents, status).
const DEMO_ORDERS: &[(&str, &str, &str, i64, &str)] = &[
    ("acme", "A-1001", "Ada Lovelace", 4_990, "delivered"),
    ("acme", "A-1002", "Alan Turing", 12_900, "delivered"),
    ("acme", "A-1003", "Grace Hopper", 2_500, "shipped"),
    ("acme", "A-1004", "Edsger Dijkstra", 31_000, "delivered"),
    ("globex", "G-2001", "Hank Scorpio", 99_900, "delivered"),
    ("globex", "G-2002", "Homer Simpson", 1_200, "shipped"),
];

/// The most orders one `orders.list` call returns.
const MAX_LIST: i64 = 100;

/// The order book of all tenants, in the application database.
#[derive(Clone, Debug)]
pub struct OrderBook {
    db: AppDb,
}

/// The filter of `orders.list`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListFilter {
    status: Option<String>,
    limit: Option<i64>,
}

/// What an approver was asked to approve: the refund's interruption payload.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RefundRequest {
    order_id: String,
    amount: i64,
}

/// The decision a refund is resumed with.
#[derive(Debug, Deserialize)]
struct RefundDecision {
    approved: bool,
    #[serde(default)]
    reason: Option<String>,
}

fn order_json(row: &Row) -> Result<Value, DbError> {
    Ok(json!({
        "id": row.get::<String>("id")?,
        "customer": row.get::<String>("customer")?,
        "total": row.get::<i64>("total_cents")?,
        "refunded": row.get::<i64>("refunded_cents")?,
        "status": row.get::<String>("status")?,
    }))
}

impl OrderBook {
    /// The order book on `db`.
    pub fn new(db: AppDb) -> OrderBook {
        OrderBook { db }
    }

    /// Adds an order (or leaves an existing one with this id untouched).
    pub async fn add_order(
        &self,
        tenant: &str,
        id: &str,
        customer: &str,
        total_cents: i64,
        status: &str,
    ) -> Result<(), DbError> {
        self.db
            .execute(
                "INSERT INTO orders (tenant, id, customer, total_cents, status, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, id) DO NOTHING",
                vec![tenant.into(), id.into(), customer.into(), total_cents.into(), status.into(), now_ms().into()],
            )
            .await?;
        Ok(())
    }

    /// Seeds the demo orders of tenants `acme` and `globex` (idempotent).
    pub async fn seed_demo(&self) -> Result<(), DbError> {
        for &(tenant, id, customer, total, status) in DEMO_ORDERS {
            self.add_order(tenant, id, customer, total, status).await?;
        }
        Ok(())
    }

    /// One order of `tenant`, if it exists.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<Value>, DbError> {
        let row = self
            .db
            .fetch_optional(
                "SELECT id, customer, total_cents, refunded_cents, status FROM orders WHERE tenant = $1 AND id = $2",
                vec![tenant.into(), id.into()],
            )
            .await?;
        row.as_ref().map(order_json).transpose()
    }

    /// The refunds applied to orders of `tenant`: (order id, amount in cents), oldest first.
    pub async fn refunds(&self, tenant: &str) -> Result<Vec<(String, i64)>, DbError> {
        let rows = self
            .db
            .fetch_all(
                "SELECT order_id, amount_cents FROM refunds WHERE tenant = $1 ORDER BY created_at, idempotency_key",
                vec![tenant.into()],
            )
            .await?;
        rows.iter().map(|r| Ok((r.get("order_id")?, r.get("amount_cents")?))).collect()
    }

    /// How many times `function` ran live (not replayed) for the run `run_id`.
    pub async fn live_calls(&self, run_id: &str, function: &str) -> Result<i64, DbError> {
        let row = self
            .db
            .fetch_one(
                "SELECT COUNT(*) AS calls FROM host_calls WHERE run_id = $1 AND function = $2",
                vec![run_id.into(), function.into()],
            )
            .await?;
        row.get("calls")
    }

    async fn audit(&self, tenant: &str, ctx: &HostCallContext) -> Result<(), HostError> {
        self.db
            .execute(
                "INSERT INTO host_calls (tenant, run_id, function, created_at) VALUES ($1, $2, $3, $4)",
                vec![tenant.into(), ctx.logical_run_id().into(), ctx.function().into(), now_ms().into()],
            )
            .await
            .map_err(HostError::internal)?;
        Ok(())
    }

    async fn list(&self, tenant: &str, filter: ListFilter) -> Result<Value, DbError> {
        let limit = filter.limit.unwrap_or(MAX_LIST).clamp(0, MAX_LIST);
        let rows = self
            .db
            .fetch_all(
                "SELECT id, customer, total_cents, refunded_cents, status FROM orders
                 WHERE tenant = $1 AND ($2 IS NULL OR status = $2) ORDER BY id LIMIT $3",
                vec![tenant.into(), filter.status.into(), limit.into()],
            )
            .await?;
        Ok(Value::Array(rows.iter().map(order_json).collect::<Result<_, _>>()?))
    }

    /// Applies a refund once per idempotency key, in one transaction; a repeated key returns the
    /// refund it recorded. Errors the script may see: unknown order, amount above what is left.
    pub(crate) async fn apply_refund(
        &self,
        tenant: &str,
        id: &str,
        amount: i64,
        key: &str,
    ) -> Result<Value, HostError> {
        let steps = vec![
            // A key seen before: the refund was applied then, nothing more to do.
            Step::new(
                "INSERT INTO refunds (idempotency_key, tenant, order_id, amount_cents, created_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING",
                vec![key.into(), tenant.into(), id.into(), amount.into(), now_ms().into()],
            )
            .guard(Guard::StopUnless(1)),
            Step::new(
                "UPDATE orders SET refunded_cents = refunded_cents + $1
                 WHERE tenant = $2 AND id = $3 AND refunded_cents + $1 <= total_cents",
                vec![amount.into(), tenant.into(), id.into()],
            )
            .guard(Guard::RefuseUnless(1, format!("order {id} cannot be refunded {amount} any more"))),
        ];
        match self.db.transaction(steps).await.map_err(HostError::internal)? {
            TxOutcome::Committed => Ok(json!({ "approved": true, "orderId": id, "refunded": amount, "refundId": key })),
            TxOutcome::Refused(message) => Err(HostError::new(message)),
        }
    }

    async fn refund(&self, tenant: &str, ctx: HostCallContext, id: String, amount: i64) -> Result<Value, HostError> {
        if amount <= 0 {
            return Err(HostError::new("orders.refund: amount must be a positive number of cents"));
        }
        let Some(order) = self.get(tenant, &id).await.map_err(HostError::internal)? else {
            return Err(HostError::new(format!("order {id} not found")));
        };
        let Some(resume) = ctx.resume() else {
            let left = order["total"].as_i64().unwrap_or(0) - order["refunded"].as_i64().unwrap_or(0);
            if amount > left {
                return Err(HostError::new(format!("order {id} has only {left} cents left to refund")));
            }
            return Err(ctx.interrupt(json!({ "kind": "refund-approval", "orderId": id, "amount": amount })));
        };
        let decision: RefundDecision = serde_json::from_value(resume.resolution.clone())
            .map_err(|e| HostError::new(format!("orders.refund: invalid decision: {e}")))?;
        let approved: RefundRequest = serde_json::from_value(resume.payload.clone())
            .map_err(|e| HostError::new(format!("orders.refund: the approved request is unreadable: {e}")))?;
        if approved.order_id != id || approved.amount != amount {
            return Err(HostError::new(format!(
                "orders.refund: this call asks for {amount} on {id}, but {} on {} was approved",
                approved.amount, approved.order_id
            )));
        }
        if !decision.approved {
            return Ok(json!({ "approved": false, "orderId": approved.order_id, "reason": decision.reason }));
        }
        self.apply_refund(tenant, &approved.order_id, approved.amount, &ctx.idempotency_key()).await
    }

    /// The `orders.*` host functions for scripts of `tenant`.
    pub fn host_functions(&self, tenant: &str) -> HostFunctions {
        let tenant: Arc<str> = tenant.into();
        let book = Arc::new(self.clone());
        let (get_book, get_tenant) = (Arc::clone(&book), Arc::clone(&tenant));
        let (list_book, list_tenant) = (Arc::clone(&book), Arc::clone(&tenant));
        HostFunctions::builder()
            .typed("orders.get", ["id"], move |ctx, (id,): (String,)| {
                let (book, tenant) = (Arc::clone(&get_book), Arc::clone(&get_tenant));
                async move {
                    book.audit(&tenant, &ctx).await?;
                    match book.get(&tenant, &id).await.map_err(HostError::internal)? {
                        Some(order) => Ok(order),
                        None => Err(HostError::new(format!("order {id} not found"))),
                    }
                }
            })
            .typed("orders.list", ["filter"], move |ctx, (filter,): (Option<ListFilter>,)| {
                let (book, tenant) = (Arc::clone(&list_book), Arc::clone(&list_tenant));
                async move {
                    book.audit(&tenant, &ctx).await?;
                    book.list(&tenant, filter.unwrap_or_default()).await.map_err(HostError::internal)
                }
            })
            .typed("orders.refund", ["id", "amount"], move |ctx, (id, amount): (String, i64)| {
                let (book, tenant) = (Arc::clone(&book), Arc::clone(&tenant));
                async move {
                    book.audit(&tenant, &ctx).await?;
                    book.refund(&tenant, ctx, id, amount).await
                }
            })
            .build()
            .expect("the orders.* names are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempDb;
    use resumable_host::{CancelSignal, Resume};

    fn resumed(payload: Value) -> HostCallContext {
        let resume = Resume { interruption_id: "interrupt-1".into(), payload, resolution: json!({ "approved": true }) };
        HostCallContext::new("run_1", "orders.refund", 1, Some(resume), CancelSignal::new())
    }

    #[tokio::test]
    async fn an_approval_is_spent_only_on_the_request_that_was_approved() {
        let db = TempDb::sqlite().await;
        let book = OrderBook::new(db.open().await);
        book.seed_demo().await.unwrap();
        let host = book.host_functions("acme");
        let approved = json!({ "kind": "refund-approval", "orderId": "A-1002", "amount": 1500 });
        // A resumed call that asks for another order or amount than was approved does nothing.
        for args in [json!(["A-1004", 31000]), json!(["A-1002", 1600]), json!(["A-1004", 1500])] {
            let args = args.as_array().unwrap().clone();
            let refused = host.call("orders.refund", resumed(approved.clone()), args).await.unwrap_err();
            assert!(refused.to_string().contains("was approved"), "{refused}");
        }
        assert!(book.refunds("acme").await.unwrap().is_empty());
        let args = vec![json!("A-1002"), json!(1500)];
        let done = host.call("orders.refund", resumed(approved), args).await.unwrap();
        assert_eq!(done["refunded"], 1500);
        assert_eq!(book.refunds("acme").await.unwrap(), vec![("A-1002".to_owned(), 1500)]);
    }
}
