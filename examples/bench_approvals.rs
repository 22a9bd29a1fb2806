//! Benchmark of approval-gated automations end to end: submit a refund script, wait until it
//! asks for approval, approve it, wait until it completed, for many automations at once.
//!
//! `cargo run --release --example bench_approvals [-- --db URL] [--count N] [--reps R] [--warmup M] [--concurrency C] [--workers W]`
//! prints one JSON object: approvals per second over a batch of N automations (500), as the
//! median of R repetitions (3) on one running service warmed up with M automations (128),
//! each repetition's figure, and the median repetition's per-automation latency of
//! submit → pending and decide → completed (`{n, min, median, p99, max}` in ms).
//! The default database is a fresh SQLite file (WAL, `synchronous=FULL`); pass
//! `--db postgres://…` for PostgreSQL (its tables are reused; orders are per-run ids).
//! `--workers` is the service's concurrency, automations executing at once (default: the
//! service's, `DEFAULT_CONCURRENCY`). Scripts run on worker threads here; the server runs them
//! in worker processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use resumable::automation::{Automations, DEFAULT_CONCURRENCY, Decision, DecisionBatch};
use resumable::db::AppDb;
use resumable::orders::OrderBook;
use resumable::workflow::{RunId, RunStatus};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// The script of automation `order` (each its own order, so refunds never collide).
fn script(order: &str) -> String {
    format!("const o = await orders.get('{order}');\nreturn await orders.refund(o.id, 100);")
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn stats(mut xs: Vec<f64>) -> Value {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        return json!({ "n": 0 });
    }
    let at = |q: f64| xs[((n as f64 - 1.0) * q).round() as usize];
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({ "n": n, "min": r(xs[0]), "median": r(at(0.5)), "p99": r(at(0.99)), "max": r(xs[n - 1]) })
}

/// Waits (on the engine's change notifications) until the automation waits for a decision or ended.
async fn settled(automations: &Automations, id: &RunId) -> resumable::automation::AutomationView {
    let live = |r: &resumable::workflow::RunInfo| r.status == RunStatus::Waiting || r.status.is_terminal();
    automations.engine().wait_until(id, Duration::from_secs(120), live).await.expect("the automation settles");
    automations.get("bench", id).await.expect("read the automation")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Warnings of the engine (a database that refuses claims, say) go to stderr, away from the JSON.
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(tracing::Level::WARN).init();
    let count: usize = arg("--count").and_then(|c| c.parse().ok()).unwrap_or(500);
    let reps: usize = arg("--reps").and_then(|c| c.parse().ok()).unwrap_or(3).max(1);
    let concurrency: usize = arg("--concurrency").and_then(|c| c.parse().ok()).unwrap_or(64);
    let workers: usize = arg("--workers").and_then(|c| c.parse().ok()).unwrap_or(DEFAULT_CONCURRENCY);
    let dir = Scratch(std::env::temp_dir().join(format!("resumable-bench-approvals-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    let url = arg("--db").unwrap_or_else(|| format!("sqlite://{}", dir.0.join("bench.db").display()));
    let db = AppDb::open(&url).await?;
    let store = db.store();
    let orders = OrderBook::new(db.clone());
    let host = orders.clone();
    let automations = Automations::builder(store, db, &[5u8; 32])
        .host(move |tenant| host.host_functions(tenant))
        .concurrency(workers)
        .build()?;

    // Warmed up first, like the peers' benches: the service's script workers start their
    // engines on their first runs.
    let warmup: usize = arg("--warmup").and_then(|c| c.parse().ok()).unwrap_or(128);
    if warmup > 0 {
        repetition(&automations, &orders, &format!("{:x}-warmup", std::process::id()), warmup, concurrency).await?;
    }
    let mut reps_out = Vec::with_capacity(reps);
    for rep in 0..reps {
        let batch = format!("{:x}-{rep}", std::process::id());
        reps_out.push(repetition(&automations, &orders, &batch, count, concurrency).await?);
    }
    reps_out.sort_by(|a, b| a.approvals_per_s.total_cmp(&b.approvals_per_s));
    let rates: Vec<f64> = reps_out.iter().map(|r| r.approvals_per_s).collect();
    let median = &reps_out[reps_out.len() / 2];
    let backend = if url.starts_with("postgres") { "postgres" } else { "sqlite" };
    println!(
        "{}",
        json!({
            "backend": backend,
            "automations": count,
            "reps": reps,
            "warmup": warmup,
            "concurrency": concurrency,
            "workers": workers,
            "approvals_per_s": median.approvals_per_s.round(),
            "approvals_per_s_reps": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
            "total_s": (median.elapsed * 1000.0).round() / 1000.0,
            "submit_to_pending_ms": stats(median.asked.clone()),
            "decide_to_completed_ms": stats(median.decided.clone()),
            "refunds": median.refunds,
        })
    );
    automations.engine().shutdown().await;
    drop(dir);
    Ok(())
}

/// The bench's scratch directory, removed when the bench ends, after an error too.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One repetition's figures (its latencies come out as their distribution).
struct Repetition {
    approvals_per_s: f64,
    elapsed: f64,
    asked: Vec<f64>,
    decided: Vec<f64>,
    refunds: usize,
}

/// Runs `count` automations, `concurrency` at a time, each on its own new order of `batch`.
async fn repetition(
    automations: &Automations,
    orders: &OrderBook,
    batch: &str,
    count: usize,
    concurrency: usize,
) -> Result<Repetition, Box<dyn std::error::Error>> {
    for i in 0..count {
        orders.add_order("bench", &format!("{batch}-{i}"), "customer", 10_000, "delivered").await?;
    }
    let gate = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let (automations, gate, order) = (automations.clone(), Arc::clone(&gate), format!("{batch}-{i}"));
            tokio::spawn(async move {
                let _permit = gate.acquire().await.expect("semaphore open");
                let t0 = Instant::now();
                let id = automations.submit("bench", &script(&order), Value::Null, "bench", None).await?;
                let view = settled(&automations, &id).await;
                let asked = t0.elapsed().as_secs_f64() * 1000.0;
                let pending =
                    view.pending.ok_or_else(|| format!("no approval asked: {} {:?}", view.status, view.error))?;
                let decisions = pending
                    .requests
                    .iter()
                    .map(|r| Decision { interruption_id: r.interruption_id.clone(), approved: true, reason: None })
                    .collect();
                let t1 = Instant::now();
                automations
                    .decide("bench", &id, DecisionBatch { decisions, actor: "bench".into() }, &["approver"], None)
                    .await?;
                automations.engine().wait_for(&id, Duration::from_secs(120)).await?;
                let view = automations.get("bench", &id).await?;
                if view.status != RunStatus::Completed {
                    return Err(format!("automation ended {}: {:?}", view.status, view.error).into());
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((asked, t1.elapsed().as_secs_f64() * 1000.0))
            })
        })
        .collect();
    let (mut asked, mut decided) = (Vec::new(), Vec::new());
    for t in tasks {
        let (a, d) = t.await?.map_err(|e| e.to_string())?;
        asked.push(a);
        decided.push(d);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let refunds = orders.refunds("bench").await?.iter().filter(|(id, _)| id.starts_with(&format!("{batch}-"))).count();
    Ok(Repetition { approvals_per_s: count as f64 / elapsed, elapsed, asked, decided, refunds })
}
