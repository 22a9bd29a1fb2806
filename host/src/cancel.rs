//! A cheap, clonable cancellation signal.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A one-way signal: once [`cancel`](CancelSignal::cancel) is called, every clone
/// reports cancelled and every pending [`cancelled`](CancelSignal::cancelled)
/// future completes.
///
/// The runner hands one to each host call (fired when the run ends early), and
/// callers pass one into a run to abort it.
#[derive(Clone, Default)]
pub struct CancelSignal {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

impl CancelSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal. Idempotent.
    pub fn cancel(&self) {
        if !self.inner.cancelled.swap(true, Ordering::SeqCst) {
            let wakers = std::mem::take(&mut *self.lock_wakers());
            for waker in wakers {
                waker.wake();
            }
        }
    }

    /// Whether the signal has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// A future that completes once the signal has fired.
    pub fn cancelled(&self) -> Cancelled {
        Cancelled { signal: self.clone() }
    }

    fn lock_wakers(&self) -> std::sync::MutexGuard<'_, Vec<Waker>> {
        self.inner.wakers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for CancelSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelSignal").field("cancelled", &self.is_cancelled()).finish()
    }
}

/// Future returned by [`CancelSignal::cancelled`].
#[derive(Debug)]
pub struct Cancelled {
    signal: CancelSignal,
}

impl Future for Cancelled {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.is_cancelled() {
            return Poll::Ready(());
        }
        {
            let mut wakers = self.signal.lock_wakers();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
        }
        // Checked again: `cancel` may have drained the list before we registered.
        if self.signal.is_cancelled() { Poll::Ready(()) } else { Poll::Pending }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn wakes_waiters_across_tasks() {
        let signal = CancelSignal::new();
        let waiter = tokio::spawn(signal.cancelled());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        signal.clone().cancel();
        tokio::time::timeout(Duration::from_secs(1), waiter).await.unwrap().unwrap();
        assert!(signal.is_cancelled());
        signal.cancelled().await; // already fired: completes at once
    }
}
