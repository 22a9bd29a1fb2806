//! Metrics and health end to end: `/metrics` scraped before and after an approval round on a real
//! `resumable serve`, `/healthz`, and `/readyz` answering 503 while a TCP proxy between the server
//! and its PostgreSQL is cut, and 200 again once it is restored.

#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Client, Server, TempDir, WAIT};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// Reads an order, then asks to refund part of it.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

/// The samples of a Prometheus text page: `(name, labels) → value`.
struct Samples(Vec<(String, BTreeMap<String, String>, f64)>);

impl Samples {
    fn parse(text: &str) -> Samples {
        let mut samples = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {line:?}"));
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line:?}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("a label: {line:?}"));
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            samples.push((name.to_owned(), labels, value));
        }
        Samples(samples)
    }

    /// The sum of the samples of `name` that have all of `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let has = |l: &BTreeMap<String, String>| labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v));
        self.0.iter().filter(|(n, l, _)| n == name && has(l)).map(|(_, _, v)| v).sum()
    }
}

async fn scrape(client: &Client) -> Samples {
    let response = client.get("/metrics").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.header("content-type").is_some_and(|c| c.starts_with("text/plain")), "{:?}", response.headers);
    Samples::parse(&response.text())
}

/// Scrapes until `done` holds (the database's figures are refreshed once a second).
async fn scrape_until(client: &Client, what: &str, done: impl Fn(&Samples) -> bool) -> Samples {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let samples = scrape(client).await;
        if done(&samples) {
            return samples;
        }
        assert!(tokio::time::Instant::now() < deadline, "the metrics never showed {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_round_moves_the_counters_and_histograms() {
    let dir = TempDir::new("metrics");
    let server = Server::start(&dir, &[]);
    let (acme, anonymous) = (server.client(Some("demo-acme")), server.client(None));
    let health = anonymous.get("/healthz").await;
    assert_eq!((health.status, health.json()), (200, json!({ "ok": true })));
    let ready = anonymous.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(
        ready.json(),
        json!({ "ready": true, "checks": { "database": "ok", "migrations": "ok", "worker": "ok" } })
    );

    let before = scrape(&anonymous).await;
    let response = acme.post("/v1/automations", &json!({ "source": REFUND })).await;
    assert_eq!(response.status, 202, "{}", response.text());
    let id = response.json()["id"].as_str().unwrap().to_owned();
    let waiting = acme
        .poll(&format!("/v1/automations/{id}"), |v| v["status"] == "waiting" && !v["pendingApproval"].is_null())
        .await;
    let pending = scrape_until(&anonymous, "the pending approval", |s| {
        s.sum("resumable_pending_approvals", &[]) == 1.0
            && s.sum("resumable_automations", &[("status", "waiting")]) == 1.0
    })
    .await;
    assert_eq!(pending.sum("resumable_script_run_seconds_count", &[("outcome", "interrupted")]), 1.0);

    let decisions: Vec<Value> = waiting["pendingApproval"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({ "interruptionId": r["interruptionId"], "approved": true }))
        .collect();
    let response = acme.post(&format!("/v1/automations/{id}/decisions"), &json!({ "decisions": decisions })).await;
    assert_eq!(response.status, 202, "{}", response.text());
    let done = acme.poll(&format!("/v1/automations/{id}"), |v| v["status"] == "completed").await;
    assert_eq!(done["result"]["refunded"], 1500);
    let after = scrape_until(&anonymous, "the completed automation", |s| {
        s.sum("resumable_automations", &[("status", "waiting")]) == 0.0
            && s.sum("resumable_pending_approvals", &[]) == 0.0
    })
    .await;

    let moved = |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    // The first round read the order and was interrupted by the refund; the second round called
    // the refund again (the read came from the ledger).
    assert_eq!(moved("resumable_host_calls_total", &[("function", "orders.get"), ("outcome", "ok")]), 1.0);
    assert_eq!(moved("resumable_host_calls_total", &[("function", "orders.refund"), ("outcome", "interrupted")]), 1.0);
    assert_eq!(moved("resumable_host_calls_total", &[("function", "orders.refund"), ("outcome", "ok")]), 1.0);
    assert_eq!(moved("resumable_host_calls_total", &[("outcome", "error")]), 0.0, "an approval request is no error");
    assert_eq!(moved("resumable_host_call_seconds_count", &[("function", "orders.refund")]), 2.0);
    assert!(moved("resumable_host_call_seconds_bucket", &[("function", "orders.refund"), ("le", "+Inf")]) == 2.0);
    assert_eq!(moved("resumable_script_run_seconds_count", &[("outcome", "interrupted")]), 1.0);
    assert_eq!(moved("resumable_script_run_seconds_count", &[("outcome", "completed")]), 1.0);
    assert!(moved("resumable_script_run_seconds_sum", &[]) > 0.0);
    assert_eq!(moved("resumable_approval_wait_seconds_count", &[("decided_by", "person")]), 1.0);
    assert!(after.sum("resumable_approval_wait_seconds_sum", &[]) > 0.0);
    assert!(after.sum("resumable_worker_processes_started_total", &[]) >= 1.0, "scripts ran in worker processes");
    assert_eq!(after.sum("resumable_worker_processes", &[("state", "busy")]), 0.0);
    assert!(after.sum("resumable_worker_processes", &[("state", "idle")]) >= 1.0);
    assert!(moved("resumable_bytecode_cache_total", &[]) >= 2.0, "each round looked its bytecode up");
    assert_eq!(after.sum("resumable_store_errors_total", &[]), 0.0);
    assert_eq!(after.sum("resumable_webhook_backlog", &[]), 0.0);
    let text = anonymous.get("/metrics").await.text();
    for described in ["# HELP resumable_approval_wait_seconds", "# TYPE resumable_approval_wait_seconds histogram"] {
        assert!(text.contains(described), "{text}");
    }
}

/// A TCP proxy to `upstream` that can be cut (every connection dropped, new ones refused) and
/// restored.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (accepting, cut_flag) = (Arc::clone(&links), Arc::clone(&cut));
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if cut_flag.load(Ordering::SeqCst) {
                    continue;
                }
                let upstream = upstream.clone();
                accepting.lock().await.push(tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }));
            }
        });
        Proxy { port, cut, links }
    }

    async fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.links.lock().await.drain(..) {
            link.abort();
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// `url` with its `host:port` replaced by `127.0.0.1:port`.
fn through(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (credentials, rest) = rest.rsplit_once('@').map_or(("", rest), |(c, r)| (c, r));
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = if host.contains(':') { host.to_owned() } else { format!("{host}:5432") };
    let at = if credentials.is_empty() { String::new() } else { format!("{credentials}@") };
    (format!("{scheme}://{at}127.0.0.1:{port}/{path}"), host.replace("localhost", "127.0.0.1"))
}

async fn readyz(client: &Client) -> (u16, Value) {
    let response = client.get("/readyz").await;
    (response.status, response.json())
}

async fn readyz_until(client: &Client, status: u16) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (got, body) = readyz(client).await;
        if got == status {
            return body;
        }
        assert!(tokio::time::Instant::now() < deadline, "/readyz never answered {status}: {got} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_the_database_is_cut_off_and_200_again_after() {
    let Some(mut dir) = TempDir::postgres("readyz") else { return };
    let url = dir.db_url();
    let proxy = Proxy::start(through(&url, 0).1).await;
    dir.set_db_url(through(&url, proxy.port).0);
    let server = Server::start(&dir, &[]);
    let client = server.client(None);
    assert_eq!(readyz(&client).await.0, 200);

    proxy.cut().await;
    let body = readyz_until(&client, 503).await;
    assert_eq!(body["ready"], false, "{body}");
    assert_ne!(body["checks"]["database"], "ok", "{body}");
    assert_eq!(body["checks"]["worker"], "ok", "scripts still run: {body}");
    assert!(!body.to_string().contains("resumable:resumable"), "no password in the answer: {body}");
    assert_eq!(client.get("/healthz").await.status, 200, "the process is alive");

    proxy.restore();
    let body = readyz_until(&client, 200).await;
    assert_eq!(body["checks"]["database"], "ok");
    // And it works again.
    let acme = server.client(Some("demo-acme"));
    let response = acme.post("/v1/automations", &json!({ "source": "return 6 * 7" })).await;
    assert_eq!(response.status, 202, "{}", response.text());
    let id = response.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(acme.poll(&format!("/v1/automations/{id}"), |v| v["status"] == "completed").await["result"], 42);
    // The failures of the cut were counted.
    assert!(scrape(&client).await.sum("resumable_store_errors_total", &[]) >= 1.0);
}
