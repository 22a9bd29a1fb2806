//! Sending a connector's request: signed, keyed for idempotency, retried with backoff when the
//! failure may pass, with the response capped and read as JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use resumable_host::{HostCallContext, HostError};
use serde_json::{Value, json};

use super::audit::{ExchangeLog, Outcome};
use super::signature::sign;
use super::{CallScope, Connector};

/// How long one attempt may take unless the function says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait before a retry; it doubles each time, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two attempts, whatever `Retry-After` asks.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The HTTP client every connector shares (pooled connections, rustls, no redirects).
#[derive(Clone, Debug)]
pub(super) struct Sender {
    client: reqwest::Client,
}

/// How one attempt ended, when it gave no result.
enum Failure {
    /// It may pass: retry after the wait, if any, the service asked for.
    Transient { why: String, retry_after: Option<Duration> },
    /// It will not pass: the script gets this error.
    Final(HostError),
}

impl Sender {
    pub(super) fn new() -> Result<Sender, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("resumable/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Sender { client })
    }

    /// Sends `body` for a call of `connector`, retrying as its configuration allows. With the
    /// scope's audit log, the request is recorded in the audit log before anything is sent (nothing is when it
    /// cannot be), and each attempt's outcome after it.
    pub(super) async fn send(
        &self,
        connector: &Connector,
        ctx: &HostCallContext,
        body: &Value,
        scope: &CallScope,
    ) -> Result<Value, HostError> {
        let name = connector.name.as_str();
        let body = serde_json::to_vec(body).map_err(HostError::internal)?;
        let key = ctx.idempotency_key();
        let log = scope.audit.as_ref().map(|audit| ExchangeLog::new(audit.clone(), scope, name, ctx, &body));
        if let Some(log) = &log {
            log.request().await?;
        }
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let failure = match self.attempt(connector, &key, &body, log.as_ref(), attempt).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            let (why, retry_after) = match failure {
                Failure::Final(error) => {
                    crate::metrics::connector_error(name, false);
                    return Err(error);
                }
                Failure::Transient { why, retry_after } => (why, retry_after),
            };
            let last = attempt > connector.config.retries || ctx.is_cancelled();
            crate::metrics::connector_error(name, !last);
            if last {
                return Err(HostError::new(format!("{name}: the service failed {attempt} times; last: {why}"))
                    .with_details(json!({ "code": "CONNECTOR_UNAVAILABLE", "attempts": attempt })));
            }
            let wait = retry_after.unwrap_or(backoff).min(MAX_BACKOFF);
            tracing::info!(
                function = name,
                attempt,
                why,
                wait_ms = wait.as_millis() as u64,
                "retrying a connector call"
            );
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One signed request, attempt number `attempt`, its outcome recorded in `log`.
    async fn attempt(
        &self,
        connector: &Connector,
        key: &str,
        body: &[u8],
        log: Option<&ExchangeLog>,
        attempt: u32,
    ) -> Result<Value, Failure> {
        let name = connector.name.as_str();
        let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let signature = sign(&connector.secret, key, timestamp, body);
        let request = self
            .client
            .post(connector.config.url.0.clone())
            .timeout(connector.config.timeout.map_or(DEFAULT_TIMEOUT, |t| t.0))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("idempotency-key", key)
            .header("webhook-id", key)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.to_vec());
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let why = describe(e);
                if let Some(log) = log {
                    log.outcome(attempt, Outcome::NoResponse(&why)).await;
                }
                return Err(Failure::Transient { why, retry_after: None });
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let cap = connector.config.max_response_bytes;
        // Read (within the cap) whatever the status, so that the log has the body's digest.
        let body = read_capped(response, cap).await;
        if let Some(log) = log {
            let body = match &body {
                Ok(body) => Ok(body.as_slice()),
                Err(ReadError::TooLarge) => Err("the body is larger than the function's max_response_bytes"),
                Err(ReadError::Broken(why)) => Err(why.as_str()),
            };
            log.outcome(attempt, Outcome::Response { status: status.as_u16(), body }).await;
        }
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Err(Failure::Transient { why: format!("status {status}"), retry_after });
        }
        let body = body.map_err(|e| match e {
            ReadError::TooLarge => Failure::Final(
                HostError::new(format!("{name}: the response is larger than {cap} bytes"))
                    .with_details(json!({ "code": "CONNECTOR_RESPONSE_TOO_LARGE", "status": status.as_u16() })),
            ),
            ReadError::Broken(why) => Failure::Transient { why, retry_after: None },
        })?;
        let json: Result<Value, _> = serde_json::from_slice(&body);
        if status.is_success() {
            return json.map_err(|_| {
                Failure::Final(
                    HostError::new(format!("{name}: the response is not JSON"))
                        .with_details(json!({ "code": "CONNECTOR_RESPONSE_NOT_JSON", "status": status.as_u16() })),
                )
            });
        }
        if status.is_redirection() {
            return Err(Failure::Final(
                HostError::new(format!("{name}: the service answered {status}; redirects are not followed"))
                    .with_details(json!({ "code": "CONNECTOR_REDIRECT", "status": status.as_u16() })),
            ));
        }
        // Any other 4xx: the service refused the call, and will again.
        let json = json.unwrap_or(Value::Null);
        let code = json["code"].as_str().unwrap_or("CONNECTOR_REFUSED").to_owned();
        let message = json["message"].as_str().map_or_else(|| format!("the service answered {status}"), str::to_owned);
        Err(Failure::Final(
            HostError::new(format!("{name}: {message}"))
                .with_details(json!({ "code": code, "message": message, "status": status.as_u16() })),
        ))
    }
}

/// Why reading a body failed.
enum ReadError {
    TooLarge,
    Broken(String),
}

/// The body of `response`, refused past `cap` bytes without reading further.
async fn read_capped(mut response: reqwest::Response, cap: u64) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|length| length > cap) {
        return Err(ReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| ReadError::Broken(describe(e)))? {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// What went wrong with a request, for the script and the logs (never the URL's query).
pub fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        e.without_url().to_string()
    }
}
