//! A turn that one thread or task at a time may hold, such as the right to poll instead of sleep.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The one turn that a counter hands out, given back on drop.
pub(crate) struct Turn<'a>(&'a AtomicUsize);

impl<'a> Turn<'a> {
    /// The turn, unless someone holds it.
    pub(crate) fn take(holders: &'a AtomicUsize) -> Option<Turn<'a>> {
        if holders.fetch_add(1, Ordering::AcqRel) == 0 {
            Some(Turn(holders))
        } else {
            holders.fetch_sub(1, Ordering::AcqRel);
            None
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
