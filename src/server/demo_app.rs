//! The demo order system as an HTTP application under `/demo/billing/…`, on the server itself.
//! With `--demo` the bundled connectors `billing.order` and `billing.refund` call it like any
//! application: signed Standard Webhooks requests, an idempotency key per call, and a refund
//! above 10.00 that needs approval (`when = "args.amount > 1000"`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::AppState;
use crate::config::ServeConfig;
use crate::connector::{FunctionSpec, verify};
use crate::orders::OrderBook;

/// The amount (in cents) above which the demo's refunds need approval.
const APPROVAL_ABOVE_CENTS: i64 = 1000;

/// The demo application: the order book it serves and the secret its callers sign with.
#[derive(Clone, Debug)]
pub struct DemoApp {
    orders: OrderBook,
    secret: Vec<u8>,
}

/// The secret the demo's connectors sign with, derived from the server's.
fn demo_secret(server_secret: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(server_secret).expect("HMAC takes a key of any length");
    mac.update(b"resumable demo connectors");
    mac.finalize().into_bytes().to_vec()
}

impl DemoApp {
    /// The application over `orders`, checking the signatures of [`DemoApp::functions`].
    pub fn new(orders: OrderBook, server_secret: &[u8]) -> DemoApp {
        DemoApp { orders, secret: demo_secret(server_secret) }
    }

    /// The bundled connectors, calling the application at `listening` (the server's address).
    /// They exist before the engine starts, so that every round of an automation sees them.
    pub fn functions(server_secret: &[u8], listening: SocketAddr) -> Vec<FunctionSpec> {
        let host = match listening.ip() {
            ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ip => ip,
        };
        let base = SocketAddr::new(host, listening.port());
        let config = format!(
            r#"
[functions."billing.order"]
url = "http://{base}/demo/billing/order"
params = [{{ name = "order_id", type = "string" }}]
secret = "whsec_{secret}"
approval = "never"

[functions."billing.refund"]
url = "http://{base}/demo/billing/refund"
params = [{{ name = "order_id", type = "string" }}, {{ name = "amount", type = {{ type = "integer", minimum = 1 }} }}]
secret = "whsec_{secret}"
approval = {{ when = "args.amount > {APPROVAL_ABOVE_CENTS}" }}
summary = "Refund {{amount}} cents on order {{order_id}}"
"#,
            secret = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, demo_secret(server_secret)),
        );
        ServeConfig::parse(&config).map(|c| c.functions).unwrap_or_default()
    }
}

/// The application's routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/demo/billing/order", post(order)).route("/demo/billing/refund", post(refund))
}

/// A refusal the way an application answers one: `{code, message}`.
fn refusal(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    Refusal(status, code.to_owned(), message.into()).into_response()
}

/// An answer that refuses: its status, code and message.
struct Refusal(StatusCode, String, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "code": self.1, "message": self.2 }))).into_response()
    }
}

/// The verified request body, or the answer to an unsigned or badly signed one.
fn verified(state: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<(DemoApp, Value), Refusal> {
    let refused = |status, code: &str, message: &str| Refusal(status, code.to_owned(), message.to_owned());
    let Some(app) = state.demo.clone() else {
        return Err(refused(StatusCode::NOT_FOUND, "NOT_FOUND", "the demo application is off (serve --demo)"));
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let signed =
        verify(&app.secret, header("webhook-id"), header("webhook-timestamp"), body, header("webhook-signature"), now);
    if !signed {
        return Err(refused(StatusCode::UNAUTHORIZED, "BAD_SIGNATURE", "the request is not signed by the server"));
    }
    let body = serde_json::from_slice(body)
        .map_err(|_| refused(StatusCode::BAD_REQUEST, "BAD_REQUEST", "the body is not JSON"))?;
    Ok((app, body))
}

async fn order(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let (app, body) = match verified(&state, &headers, &body) {
        Ok(verified) => verified,
        Err(refusal) => return refusal.into_response(),
    };
    let (tenant, id) = (body["tenant"].as_str().unwrap_or_default(), body["arguments"]["order_id"].as_str());
    match app.orders.get(tenant, id.unwrap_or_default()).await {
        Ok(Some(order)) => Json(order).into_response(),
        Ok(None) => refusal(StatusCode::NOT_FOUND, "ORDER_NOT_FOUND", format!("order {} not found", id.unwrap_or("?"))),
        Err(e) => refusal(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", e.to_string()),
    }
}

async fn refund(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let (app, body) = match verified(&state, &headers, &body) {
        Ok(verified) => verified,
        Err(refusal) => return refusal.into_response(),
    };
    let tenant = body["tenant"].as_str().unwrap_or_default();
    let (Some(id), Some(amount)) = (body["arguments"]["order_id"].as_str(), body["arguments"]["amount"].as_i64())
    else {
        return refusal(StatusCode::BAD_REQUEST, "BAD_REQUEST", "order_id and amount are required");
    };
    // The application checks the approval itself too: the server's policy is not its only guard.
    if amount > APPROVAL_ABOVE_CENTS && body["decision"]["approved"] != Value::Bool(true) {
        return refusal(
            StatusCode::FORBIDDEN,
            "APPROVAL_REQUIRED",
            format!("a refund above {APPROVAL_ABOVE_CENTS} needs approval"),
        );
    }
    // The key an effect is applied under is the signed webhook-id; the Idempotency-Key header,
    // which the signature does not cover, must say the same.
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).filter(|k| !k.is_empty());
    let Some(key) = header("webhook-id").filter(|id| header("idempotency-key") == Some(*id)) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "an Idempotency-Key equal to the webhook-id is required",
        );
    };
    match app.orders.apply_refund(tenant, id, amount, key).await {
        Ok(refunded) => Json(refunded).into_response(),
        Err(e) => refusal(StatusCode::CONFLICT, "REFUND_REFUSED", e.to_string()),
    }
}
