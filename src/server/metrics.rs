//! `GET /metrics` (Prometheus text) and `GET /readyz` (whether the service can work now).
//!
//! The Prometheus recorder is the process's global `metrics` recorder, installed by
//! [`install_metrics`] (which `serve` calls); without it `/metrics` is 404. Figures read from the
//! database are refreshed at most once per [`REFRESH`], so scraping often costs the database
//! little, and a scrape never fails because of them: a failed read keeps the last figures and is
//! counted as a store error.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::automation::Readiness;

/// How often scrapes read the database's figures at most.
const REFRESH: Duration = Duration::from_secs(1);

/// How often the recorder folds recorded histogram samples in.
const UPKEEP: Duration = Duration::from_secs(5);

/// How long a scrape waits for the database's figures.
const DATABASE_WAIT: Duration = Duration::from_secs(3);

/// How often readiness checks run at most; a probe in between gets the last answer.
const READINESS_EVERY: Duration = Duration::from_secs(1);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
static REFRESHED: Mutex<Option<Instant>> = Mutex::new(None);
/// The last readiness answer, and whether a check runs now (one at a time: probes meanwhile get
/// the last answer).
static READINESS: Mutex<Option<(Instant, Readiness)>> = Mutex::new(None);
static CHECKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Installs the Prometheus recorder as the process's metrics recorder, once, with its upkeep task
/// on the current Tokio runtime; `false` when the process has another recorder already (then
/// `/metrics` is 404 and the metrics go to that one).
pub fn install_metrics() -> bool {
    RECORDER
        .get_or_init(|| {
            let recorder = match histograms(PrometheusBuilder::new()) {
                Ok(builder) => builder.build_recorder(),
                Err(e) => {
                    tracing::warn!(error = %e, "histogram buckets refused: histograms are summaries");
                    PrometheusBuilder::new().build_recorder()
                }
            };
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    crate::metrics::describe();
                    // Histograms keep their samples until an upkeep folds them in: without one, a
                    // server nobody scrapes would grow without bound.
                    let upkeep = handle.clone();
                    match tokio::runtime::Handle::try_current() {
                        Ok(runtime) => {
                            runtime.spawn(async move {
                                let mut every = tokio::time::interval(UPKEEP);
                                loop {
                                    every.tick().await;
                                    upkeep.run_upkeep();
                                }
                            });
                        }
                        // Outside a runtime, scrapes fold the samples in (each render does).
                        Err(_) => tracing::warn!("no Tokio runtime: histogram samples wait for the next scrape"),
                    }
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "another metrics recorder is installed: /metrics is off");
                    None
                }
            }
        })
        .is_some()
}

/// Prometheus histograms (not summaries) for the durations, with buckets that suit each: host
/// calls and script rounds from a millisecond, approvals from seconds to a week.
fn histograms(builder: PrometheusBuilder) -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    use crate::metrics::{APPROVAL_WAIT_SECONDS, HOST_CALL_SECONDS, SCRIPT_RUN_SECONDS};
    use metrics_exporter_prometheus::Matcher;
    const FAST: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
    const HUMAN: &[f64] = &[1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4.0 * 3600.0, 86400.0, 3.0 * 86400.0, 7.0 * 86400.0];
    builder
        .set_buckets_for_metric(Matcher::Full(HOST_CALL_SECONDS.into()), FAST)?
        .set_buckets_for_metric(Matcher::Full(SCRIPT_RUN_SECONDS.into()), FAST)?
        .set_buckets_for_metric(Matcher::Full(APPROVAL_WAIT_SECONDS.into()), HUMAN)
}

/// The metrics in Prometheus's text format.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let Some(Some(handle)) = RECORDER.get() else {
        return Err(ApiError::not_found("metrics are not enabled in this process"));
    };
    let due = {
        let mut refreshed = REFRESHED.lock().unwrap_or_else(|p| p.into_inner());
        let due = refreshed.is_none_or(|at| at.elapsed() >= REFRESH);
        if due {
            *refreshed = Some(Instant::now());
        }
        due
    };
    crate::metrics::publish_runner(&state.automations.runner_stats());
    if due {
        match tokio::time::timeout(DATABASE_WAIT, state.automations.gauges()).await {
            Ok(Ok(gauges)) => gauges.publish(),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read the figures of /metrics"),
            Err(_) => tracing::warn!("the database did not answer the figures of /metrics in time"),
        }
    }
    let body = handle.render();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response())
}

/// 200 when the database answers, its schema is current and a worker runs a script; 503 with
/// what failed otherwise: `{"ready", "checks": {"database", "migrations", "worker"}}`, each check
/// `"ok"` or why not.
pub async fn readiness(State(state): State<AppState>) -> Response {
    let last = || READINESS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let readiness = loop {
        if let Some((at, readiness)) = last()
            && at.elapsed() < READINESS_EVERY
        {
            break readiness;
        }
        match CHECKING.try_lock() {
            Ok(_checking) => {
                let readiness = state.automations.readiness().await;
                *READINESS.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), readiness.clone()));
                break readiness;
            }
            // Another probe is checking: the last answer, or (before the first) the one it finds.
            Err(_) => match last() {
                Some((_, readiness)) => break readiness,
                None => drop(CHECKING.lock().await),
            },
        }
    };
    let check = |failure: &Option<String>| json!(failure.as_deref().unwrap_or("ok"));
    let body = json!({
        "ready": readiness.is_ready(),
        "checks": {
            "database": check(&readiness.database),
            "migrations": check(&readiness.migrations),
            "worker": check(&readiness.worker),
        },
    });
    let status = if readiness.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}
