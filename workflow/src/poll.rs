//! How often a reader that waits looks at the store for what other processes wrote (what this
//! process writes wakes it at once): soon after something arrived, then less and less often.

use std::time::Duration;

/// The first wait, again after something arrived.
const MIN: Duration = Duration::from_millis(25);
/// The longest wait.
const MAX: Duration = Duration::from_millis(500);

/// A reader's wait between two looks: [`MIN`], doubling while nothing arrives, up to [`MAX`].
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff(MIN)
    }

    /// Something arrived: look again soon.
    pub(crate) fn reset(&mut self) {
        self.0 = MIN;
    }

    /// Waits, and waits longer next time.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(MAX);
    }
}
