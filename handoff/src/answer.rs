//! The caller's side: waiting for the answer to the job it handed over.

use std::sync::atomic::AtomicUsize;
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::Turn;

/// Spin-loop hints between two polls on a spare core (about a microsecond).
const SPIN_BETWEEN_POLLS: usize = 64;

/// How a caller polls for its answer before it waits to be woken.
#[derive(Clone, Copy)]
pub struct AnswerPolling<'a> {
    /// Counts the callers polling now; only the one holding the [`Turn`] polls.
    pub pollers: &'a AtomicUsize,
    /// How long it polls, yielding its core between polls.
    pub poll: Duration,
    /// How much longer it goes on polling, without system calls, while the second value says that
    /// a core is left over by the busy threads (so the poller takes no core from a job).
    pub with_spare_core: Option<(Duration, &'a (dyn Fn() -> bool + Sync))>,
}

/// Waits for `answer`, polling as `polling` says first: most jobs finish in less time than it
/// takes to wake a sleeping executor thread. `None` when the sender was dropped unanswered.
pub async fn answer_soon<T>(answer: &mut oneshot::Receiver<T>, polling: AnswerPolling<'_>) -> Option<T> {
    let started = Instant::now();
    let turn = Turn::take(polling.pollers);
    while turn.is_some() {
        let elapsed = started.elapsed();
        let spinning = elapsed >= polling.poll;
        if spinning && !polling.with_spare_core.is_some_and(|(longer, spare)| elapsed < longer && spare()) {
            break;
        }
        match answer.try_recv() {
            Ok(value) => return Some(value),
            Err(TryRecvError::Empty) => {
                if spinning {
                    // On a core of its own: wait lightly for a core that shares its execution
                    // units with the worker's.
                    for _ in 0..SPIN_BETWEEN_POLLS {
                        std::hint::spin_loop();
                    }
                } else {
                    // Lets other threads of this core run (the one answering may be one).
                    thread::yield_now();
                }
                // Then the other tasks of this executor.
                tokio::task::yield_now().await;
            }
            // A closed receiver may not be awaited again (tokio panics): answer here.
            Err(TryRecvError::Closed) => return None,
        }
    }
    answer.await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polling(pollers: &AtomicUsize) -> AnswerPolling<'_> {
        AnswerPolling { pollers, poll: Duration::from_micros(100), with_spare_core: None }
    }

    #[tokio::test]
    async fn an_answer_arrives_polled_or_woken_and_a_dropped_sender_is_none() {
        let pollers = AtomicUsize::new(0);
        let (send, mut answer) = oneshot::channel();
        send.send(7).unwrap();
        assert_eq!(answer_soon(&mut answer, polling(&pollers)).await, Some(7));

        let (send, mut answer) = oneshot::channel();
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            send.send(8).unwrap();
        });
        assert_eq!(answer_soon(&mut answer, polling(&pollers)).await, Some(8));
        late.join().unwrap();

        let (send, mut answer) = oneshot::channel::<i32>();
        drop(send);
        assert_eq!(answer_soon(&mut answer, polling(&pollers)).await, None);
        assert_eq!(pollers.load(std::sync::atomic::Ordering::Acquire), 0, "the turn was given back");
    }

    #[tokio::test]
    async fn a_spare_core_extends_polling_only_while_it_is_spare() {
        let pollers = AtomicUsize::new(0);
        let asked = AtomicUsize::new(0);
        let spare = || asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 10;
        let extended = AnswerPolling { with_spare_core: Some((Duration::from_secs(5), &spare)), ..polling(&pollers) };
        let (send, mut answer) = oneshot::channel();
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            send.send(9).unwrap();
        });
        assert_eq!(answer_soon(&mut answer, extended).await, Some(9));
        late.join().unwrap();
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 11, "it stopped polling once no core was spare");
    }
}
