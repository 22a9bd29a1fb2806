//! Reporting failures of the engine's background work (claiming runs, recording outcomes) in the
//! log: nobody awaits that work, so without a report a database that refuses every claim (a
//! schema from another release, a revoked permission, a full disk) would leave the engine idle
//! without a word. A failure that keeps repeating is reported once, then at most once per
//! interval with the number of repeats in between, and the recovery is reported too.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::StoreError;

/// Least time between two reports of a failure that keeps repeating.
const REPORT_INTERVAL: Duration = Duration::from_secs(30);

/// Failures of one kind of background work, shared by the engine's workers.
pub(crate) struct FailureLog {
    /// What fails, for the messages ("claiming runs").
    work: &'static str,
    /// Least time between two reports.
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    failing_since: Option<Instant>,
    last_report: Option<Instant>,
    unreported: u64,
}

impl FailureLog {
    pub(crate) fn new(work: &'static str) -> FailureLog {
        FailureLog::with_interval(work, REPORT_INTERVAL)
    }

    fn with_interval(work: &'static str, interval: Duration) -> FailureLog {
        FailureLog { work, interval, state: Mutex::new(State::default()) }
    }

    /// Notes a failure; reports it unless one was reported less than the interval ago.
    pub(crate) fn failed(&self, error: &StoreError) {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.failing_since.get_or_insert(now);
        if s.last_report.is_some_and(|at| now.duration_since(at) < self.interval) {
            s.unreported += 1;
            return;
        }
        let repeats = std::mem::take(&mut s.unreported);
        s.last_report = Some(now);
        drop(s);
        if repeats == 0 {
            tracing::warn!(work = self.work, %error, "{} failed; retrying", self.work);
        } else {
            tracing::warn!(work = self.work, %error, repeats, "{} still fails ({repeats} more failures); retrying", self.work);
        }
    }

    /// Notes a success; reports the recovery if the work was failing.
    pub(crate) fn succeeded(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(since) = s.failing_since.take() {
            *s = State::default();
            drop(s);
            let seconds = since.elapsed().as_secs_f64();
            tracing::info!(work = self.work, seconds, "{} works again after failing for {seconds:.1} s", self.work);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Runs `f` with a subscriber that collects the log; returns the log.
    fn log_of(f: impl FnOnce()) -> String {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let subscriber =
            tracing_subscriber::fmt().with_ansi(false).with_writer(move || Sink(Arc::clone(&sink))).finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = lines.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_repeating_failure_is_reported_once_per_interval_with_the_repeats_in_between() {
        let failures = FailureLog::with_interval("claiming runs", Duration::from_millis(50));
        let error = StoreError::database("disk full");
        let log = log_of(|| {
            failures.failed(&error);
            failures.failed(&error);
            failures.failed(&error);
            std::thread::sleep(Duration::from_millis(60));
            failures.failed(&error);
            failures.succeeded();
            failures.succeeded();
        });
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains("claiming runs failed") && lines[0].contains("disk full")
        );
        assert!(lines[1].contains("still fails (2 more failures)"), "{log}");
        assert!(lines[2].contains("INFO") && lines[2].contains("claiming runs works again"), "{log}");
    }

    #[test]
    fn success_without_a_failure_says_nothing() {
        let failures = FailureLog::new("claiming runs");
        assert_eq!(log_of(|| failures.succeeded()), "");
    }
}
