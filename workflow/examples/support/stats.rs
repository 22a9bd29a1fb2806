//! Figures shared by the workflow benches: rounding, percentiles, summaries, machine load.

use std::time::Duration;

use serde_json::{Value, json};

/// Rounds to three decimals (microseconds when the unit is milliseconds).
pub fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// `{n, min, p50, p90, p99, max, mean}` of the values.
pub fn stats(xs: &[f64]) -> Value {
    if xs.is_empty() {
        return json!({ "n": 0 });
    }
    let s = sorted(xs);
    json!({
        "n": s.len(),
        "min": r3(s[0]),
        "p50": r3(percentile(&s, 50.0)),
        "p90": r3(percentile(&s, 90.0)),
        "p99": r3(percentile(&s, 99.0)),
        "max": r3(s[s.len() - 1]),
        "mean": r3(s.iter().sum::<f64>() / s.len() as f64),
    })
}

/// The median of the values (NaN when there are none).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() { f64::NAN } else { r3(percentile(&sorted(xs), 50.0)) }
}

/// The 1, 5 and 15 minute load averages (other processes compete for the cores and the disk).
pub fn loadavg() -> Vec<f64> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).filter_map(|v| v.parse().ok()).collect()
}
