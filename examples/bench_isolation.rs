//! Benchmark of isolation between tenants: what a busy tenant B costs tenant A.
//!
//! `cargo run --release --example bench_isolation [-- --db URL] [--waiting N] [--queued M] [--samples S]`
//! prints one JSON object with two figures, each against an idle database of the same service:
//!
//! - `approvals`: the time of tenant A's approvals list (`pending_approvals`, what
//!   `GET /v1/approvals` serves) with N automations of tenant B waiting for approval (10,000),
//!   against the same with none of B's; `{idle_ms, loaded_ms, ratio}` of the medians of S reads.
//! - `submit_to_pending`: the time from submitting an automation of a quiet tenant to its
//!   approval request while M automations of B are queued (5,000, submitted at once just before),
//!   against an idle service; medians of S submissions (10 at most while loaded). The quiet
//!   tenant is not A, so that A keeps its one waiting automation for the first figure.
//!
//! Scripts run on worker threads here (the server runs them in worker processes), with the
//! service's default concurrency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use resumable::automation::Automations;
use resumable::db::AppDb;
use resumable::orders::OrderBook;
use resumable::workflow::{RunId, RunStatus};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// An automation that asks to refund a cent of `order` and waits for the decision.
fn refund(order: &str) -> String {
    format!("const o = await orders.get('{order}');\nreturn await orders.refund(o.id, 1);")
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let m = xs.get(xs.len() / 2).copied().unwrap_or(0.0);
    (m * 1000.0).round() / 1000.0
}

fn ratio(loaded: f64, idle: f64) -> f64 {
    ((loaded / idle.max(1e-9)) * 100.0).round() / 100.0
}

/// Waits until automation `id` of `tenant` waits for a decision (or ended).
async fn settled(automations: &Automations, id: &RunId) {
    let live = |r: &resumable::workflow::RunInfo| r.status == RunStatus::Waiting || r.status.is_terminal();
    automations.engine().wait_until(id, Duration::from_secs(600), live).await.expect("the automation settles");
}

/// Submits one automation of `tenant` on `order` and waits for its request: the time it took, in ms.
async fn submit_to_pending(automations: &Automations, tenant: &str, order: &str) -> f64 {
    let started = Instant::now();
    let id = automations.submit(tenant, &refund(order), Value::Null, "bench", None).await.expect("submit");
    settled(automations, &id).await;
    started.elapsed().as_secs_f64() * 1000.0
}

/// The median time of `samples` reads of tenant A's approvals, in ms.
async fn approvals_read(automations: &Automations, samples: usize) -> f64 {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        let listed = automations.pending_approvals("a", 500).await.expect("approvals");
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(listed.len(), 1, "tenant A has its one waiting automation");
    }
    median(times)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(tracing::Level::WARN).init();
    let waiting: usize = arg("--waiting").and_then(|c| c.parse().ok()).unwrap_or(10_000);
    let queued: usize = arg("--queued").and_then(|c| c.parse().ok()).unwrap_or(5_000);
    let samples: usize = arg("--samples").and_then(|c| c.parse().ok()).unwrap_or(50).max(1);
    let dir = std::env::temp_dir().join(format!("resumable-bench-isolation-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = arg("--db").unwrap_or_else(|| format!("sqlite://{}", dir.join("bench.db").display()));
    let db = AppDb::open(&url).await?;
    let orders = OrderBook::new(db.clone());
    for tenant in ["a", "b", "c"] {
        orders.add_order(tenant, "big", "customer", i64::MAX / 4, "delivered").await?;
    }
    let host = orders.clone();
    let automations =
        Automations::builder(db.store(), db, &[7u8; 32]).host(move |tenant| host.host_functions(tenant)).build()?;

    // Warm up, and tenant A's one waiting automation.
    for _ in 0..64 {
        submit_to_pending(&automations, "b", "big").await;
    }
    submit_to_pending(&automations, "a", "big").await;
    let idle_pending = {
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            times.push(submit_to_pending(&automations, "c", "big").await);
        }
        median(times)
    };
    let idle_approvals = approvals_read(&automations, samples).await;

    // Tenant B: `waiting` automations waiting for approval.
    let gate = Arc::new(Semaphore::new(64));
    let started = Instant::now();
    let tasks: Vec<_> = (0..waiting)
        .map(|_| {
            let (automations, gate) = (automations.clone(), Arc::clone(&gate));
            tokio::spawn(async move {
                let _permit = gate.acquire().await.expect("semaphore open");
                submit_to_pending(&automations, "b", "big").await
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let filled_s = started.elapsed().as_secs_f64();
    let loaded_approvals = approvals_read(&automations, samples).await;

    // Tenant B: `queued` more submitted at once; A's automations right behind them.
    let mut a_times = Vec::with_capacity(samples);
    // Submitted many at a time, faster than the workers run them, so that they queue.
    let submitting = Arc::new(Semaphore::new(256));
    let submits: Vec<_> = (0..queued)
        .map(|_| {
            let (automations, gate) = (automations.clone(), Arc::clone(&submitting));
            tokio::spawn(async move {
                let _permit = gate.acquire().await.expect("semaphore open");
                automations.submit("b", &refund("big"), Value::Null, "bench", None).await.expect("submit")
            })
        })
        .collect();
    let mut b_ids = Vec::with_capacity(queued);
    for task in submits {
        b_ids.push(task.await?);
    }
    let mut backlog = 0;
    let mut cursor = None;
    loop {
        let page = automations.list("b", &[RunStatus::Pending], cursor, 200).await?;
        backlog += page.items.len();
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    // All at once, so that each is submitted while B's are still queued.
    let a_samples = samples.min(10);
    let quiet: Vec<_> = (0..a_samples)
        .map(|_| {
            let automations = automations.clone();
            tokio::spawn(async move { submit_to_pending(&automations, "c", "big").await })
        })
        .collect();
    for task in quiet {
        a_times.push(task.await?);
    }
    let loaded_pending = median(a_times);
    for id in &b_ids {
        settled(&automations, id).await;
    }
    let backend = if url.starts_with("postgres") { "postgres" } else { "sqlite" };
    println!(
        "{}",
        json!({
            "backend": backend,
            "approvals": {
                "b_waiting": waiting,
                "idle_ms": idle_approvals,
                "loaded_ms": loaded_approvals,
                "ratio": ratio(loaded_approvals, idle_approvals),
                "samples": samples,
            },
            "submit_to_pending": {
                "b_queued": queued,
                "b_pending_when_a_submitted": backlog,
                "idle_ms": idle_pending,
                "loaded_ms": loaded_pending,
                "ratio": ratio(loaded_pending, idle_pending),
                "samples": a_samples,
            },
            "b_waiting_filled_s": (filled_s * 100.0).round() / 100.0,
        })
    );
    automations.engine().shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
