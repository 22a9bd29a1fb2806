//! The bounded hand-off of one run's events from its worker to its consumer.
//!
//! A worker never waits for the consumer: when [`EVENT_QUEUE_CAPACITY`] events
//! are waiting, further live events are dropped and counted, and the consumer
//! later reads one [`RunEvent::Lagged`] in their place. The terminal event is
//! never dropped. So a slow (or absent) consumer costs at most the queue's
//! capacity in memory, whatever the script does, and the run still finishes:
//! 1,024 events, of which console lines hold at most the console limit in
//! all, and call events at most [`EVENT_VALUE_BYTES`](crate::EVENT_VALUE_BYTES)
//! of value each (plus their names).

use crate::event::{EventSink, RunEvent};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// Events that may wait for the consumer before live events are dropped.
pub const EVENT_QUEUE_CAPACITY: usize = 1024;

/// Events waiting for the consumer of one run.
pub(crate) struct EventQueue {
    state: Mutex<QueueState>,
    capacity: usize,
}

#[derive(Default)]
struct QueueState {
    events: VecDeque<RunEvent>,
    /// Live events dropped since the last one queued.
    missed: u64,
    /// The terminal event is queued: nothing more is accepted.
    ended: bool,
    /// The consumer went away: nothing more is kept.
    closed: bool,
    waker: Option<Waker>,
}

impl EventQueue {
    pub(crate) fn new(capacity: usize) -> Arc<EventQueue> {
        Arc::new(EventQueue { state: Mutex::default(), capacity: capacity.max(1) })
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a live event, or drops and counts it when the queue is full.
    pub(crate) fn push(&self, event: RunEvent) {
        let mut state = self.lock();
        if state.ended || state.closed {
            return;
        }
        if state.missed > 0 {
            // The count of the events missed goes first, and only with room for this event after it.
            if state.events.len() + 2 > self.capacity {
                state.missed += 1;
                return;
            }
            let missed = std::mem::take(&mut state.missed);
            state.events.push_back(RunEvent::Lagged { missed });
        }
        if state.events.len() >= self.capacity {
            state.missed += 1;
            return;
        }
        state.events.push_back(event);
        wake(state);
    }

    /// Queues the terminal event (only the first one counts) past any limit.
    pub(crate) fn end(&self, event: RunEvent) {
        let mut state = self.lock();
        if state.ended {
            return;
        }
        state.ended = true;
        if state.missed > 0 {
            let missed = std::mem::take(&mut state.missed);
            state.events.push_back(RunEvent::Lagged { missed });
        }
        state.events.push_back(event);
        wake(state);
    }

    /// The next event; `None` after the terminal event was read.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<RunEvent>> {
        let mut state = self.lock();
        if let Some(event) = state.events.pop_front() {
            return Poll::Ready(Some(event));
        }
        if state.ended {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The consumer is gone: drops what waits and ignores what comes.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.events.clear();
    }
}

/// Wakes the consumer after releasing the lock.
fn wake(mut state: MutexGuard<'_, QueueState>) {
    let waker = state.waker.take();
    drop(state);
    if let Some(waker) = waker {
        waker.wake();
    }
}

impl std::fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl EventSink for Arc<EventQueue> {
    fn emit(&self, event: RunEvent) {
        self.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(queue: &EventQueue) -> Vec<RunEvent> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(event)) = queue.poll_next(&mut cx) {
            out.push(event);
        }
        out
    }

    fn console(text: &str) -> RunEvent {
        RunEvent::Console { level: crate::ConsoleLevel::Log, text: text.into() }
    }

    #[test]
    fn a_full_queue_drops_live_events_and_says_how_many() {
        let queue = EventQueue::new(2);
        for i in 0..10 {
            queue.push(console(&i.to_string()));
        }
        assert_eq!(drain(&queue), vec![console("0"), console("1")]);
        queue.push(console("10"));
        queue.end(RunEvent::Completed { value: serde_json::json!(1) });
        assert_eq!(
            drain(&queue),
            vec![RunEvent::Lagged { missed: 8 }, console("10"), RunEvent::Completed { value: serde_json::json!(1) }]
        );
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(queue.poll_next(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn one_count_of_missed_events_comes_before_the_next_event_that_fits() {
        let queue = EventQueue::new(3);
        for i in 0..5 {
            queue.push(console(&i.to_string()));
        }
        assert_eq!(drain(&queue).len(), 3);
        queue.push(console("5"));
        queue.push(console("6"));
        queue.push(console("7"));
        assert_eq!(drain(&queue), vec![RunEvent::Lagged { missed: 2 }, console("5"), console("6")]);
        queue.push(console("8"));
        assert_eq!(drain(&queue), vec![RunEvent::Lagged { missed: 1 }, console("8")]);
    }

    #[test]
    fn the_terminal_event_always_fits_and_comes_once() {
        let queue = EventQueue::new(1);
        queue.push(console("a"));
        queue.push(console("b"));
        queue.end(RunEvent::Interrupted { interruptions: vec!["interrupt-1".into()] });
        queue.end(RunEvent::Completed { value: serde_json::Value::Null });
        queue.push(console("late"));
        let events = drain(&queue);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[1], RunEvent::Lagged { missed: 1 });
        assert!(matches!(events[2], RunEvent::Interrupted { .. }));
    }

    #[test]
    fn a_closed_queue_keeps_nothing() {
        let queue = EventQueue::new(4);
        queue.push(console("a"));
        queue.close();
        queue.push(console("b"));
        assert!(drain(&queue).is_empty());
    }
}
