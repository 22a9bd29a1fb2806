//! The turn that one thread or task at a time may hold, such as the right to poll.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The one turn that a counter hands out, given back on drop.
#[derive(Debug)]
pub struct Turn<'a>(&'a AtomicUsize);

impl<'a> Turn<'a> {
    /// The turn, unless someone holds it.
    pub fn take(holders: &'a AtomicUsize) -> Option<Turn<'a>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_turn_comes_back_on_drop() {
        let holders = AtomicUsize::new(0);
        let first = Turn::take(&holders).expect("the first taker has the turn");
        assert!(Turn::take(&holders).is_none(), "a second taker waits");
        drop(first);
        assert!(Turn::take(&holders).is_some(), "the turn came back");
        assert_eq!(holders.load(Ordering::Acquire), 0);
    }
}
