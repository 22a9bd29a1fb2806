//! Wake-ups for those who wait on one run (its status or its stream): a change of a run wakes
//! only that run's waiters, so a thousand followers of a thousand runs do not all read the store
//! again whenever any one of them changes. A hint from another process, which does not say which
//! run changed, wakes every waiter.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::ids::RunId;

/// The waiters of each run, and a wake-up for all of them.
#[derive(Default)]
pub(crate) struct RunChanges {
    /// One `Notify` per run that somebody waits on, with the number of its listeners.
    runs: Mutex<HashMap<RunId, (Arc<Notify>, usize)>>,
    /// Signalled when some run, unknown which, may have changed (another process's hint).
    any: Notify,
    /// Signalled whenever a run of this process appends to its stream (for feed readers).
    appended: Notify,
}

impl RunChanges {
    /// Wakes whoever waits on `run` right now.
    pub(crate) fn notify(&self, run: &RunId) {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((notify, _)) = runs.get(run) {
            notify.notify_waiters();
        }
    }

    /// Wakes the feed readers: `run` appended to its stream.
    pub(crate) fn notify_appended(&self, run: &RunId) {
        self.notify(run);
        self.appended.notify_waiters();
    }

    /// A wake-up for the next append of any run, or another process's hint, armed at once (as
    /// [`RunListener::next_change`]).
    pub(crate) fn next_append(&self) -> impl Future<Output = ()> + '_ {
        either(&self.appended, &self.any)
    }

    /// Wakes every waiter of every run.
    pub(crate) fn notify_all(&self) {
        self.any.notify_waiters();
    }

    /// Registers interest in `run` until the listener is dropped.
    pub(crate) fn listen(&self, run: &RunId) -> RunListener<'_> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let entry = runs.entry(run.clone()).or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        RunListener { changes: self, run: run.clone(), notify: Arc::clone(&entry.0) }
    }

    /// How many runs have listeners (for tests).
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Interest in one run's changes.
pub(crate) struct RunListener<'a> {
    changes: &'a RunChanges,
    run: RunId,
    notify: Arc<Notify>,
}

impl RunListener<'_> {
    /// A wake-up for the run's next change, armed at once: create it before reading the state it
    /// guards, await it after, and a change made in between is not missed.
    pub(crate) fn next_change(&self) -> impl Future<Output = ()> + '_ {
        either(&self.notify, &self.changes.any)
    }
}

/// A wake-up by `one` or `other`, whichever is notified first, armed at once.
fn either<'a>(one: &'a Notify, other: &'a Notify) -> impl Future<Output = ()> + 'a {
    let mut one = Box::pin(one.notified());
    let mut other = Box::pin(other.notified());
    one.as_mut().enable();
    other.as_mut().enable();
    async move {
        tokio::select! {
            _ = one => {}
            _ = other => {}
        }
    }
}

impl Drop for RunListener<'_> {
    fn drop(&mut self) {
        let mut runs = self.changes.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = runs.get_mut(&self.run) {
            entry.1 -= 1;
            if entry.1 == 0 {
                runs.remove(&self.run);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(id: &str) -> RunId {
        RunId::from(id)
    }

    #[tokio::test]
    async fn a_change_wakes_the_waiters_of_its_run_only() {
        let changes = RunChanges::default();
        let (a, b) = (changes.listen(&run("a")), changes.listen(&run("b")));
        let (wait_a, wait_b) = (a.next_change(), b.next_change());
        changes.notify(&run("a"));
        tokio::time::timeout(Duration::from_secs(1), wait_a).await.expect("a's waiter woke");
        assert!(tokio::time::timeout(Duration::from_millis(50), wait_b).await.is_err(), "b's waiter slept on");
    }

    #[tokio::test]
    async fn a_change_made_after_arming_and_before_awaiting_is_not_missed() {
        let changes = RunChanges::default();
        let listener = changes.listen(&run("a"));
        let next = listener.next_change();
        changes.notify(&run("a"));
        tokio::time::timeout(Duration::from_secs(1), next).await.expect("woken by the earlier change");
    }

    #[tokio::test]
    async fn a_hint_without_a_run_wakes_everybody() {
        let changes = RunChanges::default();
        let (a, b) = (changes.listen(&run("a")), changes.listen(&run("b")));
        let (wait_a, wait_b) = (a.next_change(), b.next_change());
        changes.notify_all();
        tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(wait_a, wait_b) }).await.expect("both woke");
    }

    #[tokio::test]
    async fn an_append_wakes_the_feed_readers_and_the_runs_own_waiters() {
        let changes = RunChanges::default();
        let listener = changes.listen(&run("a"));
        let (feed, own) = (changes.next_append(), listener.next_change());
        changes.notify_appended(&run("a"));
        tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(feed, own) }).await.expect("both woke");
        let feed = changes.next_append();
        changes.notify(&run("a"));
        assert!(tokio::time::timeout(Duration::from_millis(50), feed).await.is_err(), "a status change is no append");
    }

    #[test]
    fn a_run_is_forgotten_when_its_last_listener_goes() {
        let changes = RunChanges::default();
        let first = changes.listen(&run("a"));
        let second = changes.listen(&run("a"));
        drop(first);
        assert_eq!(changes.watched(), 1);
        drop(second);
        assert_eq!(changes.watched(), 0);
        changes.notify(&run("a"));
    }
}
