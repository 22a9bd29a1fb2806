//! A durable, approval-gated automation embedded without HTTP.
//!
//! The script reads an order and asks to refund part of it. The refund needs approval, so the
//! automation waits, durably, in the database. This program then *stops its engine* (as if the
//! process were restarted), opens a new one on the same database, approves, and shows that the
//! refund happened exactly once and that `orders.get` was not run again.
//!
//! Run with `cargo run --example durable_order_automation`.

use std::time::Duration;

use resumable::automation::{Automations, Decision, DecisionBatch};
use resumable::db::AppDb;
use resumable::orders::OrderBook;
use resumable::workflow::RunStatus;
use serde_json::Value;

const SCRIPT: &str = r#"
const order = await orders.get("A-1002");
console.log("refunding part of", order.id, "total", order.total);
const refund = await orders.refund(order.id, 2500);
return { order: order.id, refund };
"#;

/// Opens the automation service on the database at `url` (the same URL every time).
async fn open(url: &str, secret: &[u8]) -> Result<(Automations, OrderBook), Box<dyn std::error::Error>> {
    let db = AppDb::open(url).await?;
    let store = db.store();
    let orders = OrderBook::new(db.clone());
    orders.seed_demo().await?;
    let host = orders.clone();
    let automations =
        Automations::builder(store, db, secret).host(move |tenant| host.host_functions(tenant)).build()?;
    Ok((automations, orders))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("resumable-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("automations.db").display());
    // A real deployment keeps this secret in a file (see `resumable serve --secret-file`).
    let secret = [7u8; 32];

    let (automations, _) = open(&url, &secret).await?;
    let id = automations.submit("acme", SCRIPT, Value::Null, "example", None).await?;
    let pending = loop {
        if let Some(p) = automations.get("acme", &id).await?.pending {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("automation {id} waits for approval of {}", pending.requests[0].request);

    // "Restart": stop this engine; nothing of the automation stays in memory.
    automations.engine().shutdown().await;
    drop(automations);

    let (automations, orders) = open(&url, &secret).await?;
    let decisions = pending
        .requests
        .iter()
        .map(|r| Decision { interruption_id: r.interruption_id.clone(), approved: true, reason: None })
        .collect();
    automations
        .decide("acme", &id, DecisionBatch { decisions, actor: "example-approver".into() }, &["approver"], None)
        .await?;
    let done = automations.engine().wait_for(&id, Duration::from_secs(30)).await?;
    assert_eq!(done.status, RunStatus::Completed);
    let view = automations.get("acme", &id).await?;
    println!("result: {}", view.result.unwrap_or_default());
    println!("refunds of acme: {:?}", orders.refunds("acme").await?);
    println!("orders.get ran {} time(s)", orders.live_calls(id.as_str(), "orders.get").await?);
    automations.engine().shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
