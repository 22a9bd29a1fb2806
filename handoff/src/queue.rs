//! The thread's side: taking the next job from a queue.

use std::sync::atomic::AtomicUsize;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::Turn;

/// The next job from `queue`, or `None` once every sender is gone. The first idle thread (the
/// holder of the turn counted by `spinners`) polls for up to `spin` before it sleeps, and keeps
/// the turn while it sleeps; the others sleep at once. So at most one idle thread polls, and
/// threads coming back from a job go to sleep without polling while one idle thread waits.
pub fn next_job<T>(queue: &Receiver<T>, spinners: &AtomicUsize, spin: Duration) -> Option<T> {
    let started = Instant::now();
    let spinning = Turn::take(spinners);
    while spinning.is_some() && started.elapsed() < spin {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => thread::yield_now(),
        }
    }
    queue.recv().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_sent_while_sleeping_or_polling_arrives_and_a_closed_queue_ends() {
        let (send, queue) = crossbeam_channel::unbounded();
        let spinners = AtomicUsize::new(0);
        let sender = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            send.send(1).unwrap();
            send.send(2).unwrap();
        });
        // Past the polling window: the job wakes the sleeping thread.
        assert_eq!(next_job(&queue, &spinners, Duration::from_micros(50)), Some(1));
        // While polling.
        assert_eq!(next_job(&queue, &spinners, Duration::from_secs(5)), Some(2));
        sender.join().unwrap();
        assert_eq!(next_job(&queue, &spinners, Duration::from_micros(50)), None);
        assert_eq!(spinners.load(std::sync::atomic::Ordering::Acquire), 0, "the turn was given back");
    }
}
