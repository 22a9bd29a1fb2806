//! Handing work to a thread and its answer back, polling for a moment before sleeping.
//!
//! Waking a sleeping thread costs tens of microseconds on a virtual machine, more than most of
//! the work handed over (a database statement, a short script). So both ends poll briefly first:
//! an idle thread polls its queue ([`next_job`]) and a caller polls for its answer
//! ([`answer_soon`]). Only one thread at a time polls on each side ([`Turn`]): more pollers
//! would only take the cores from the threads that have work.
//!
//! The runner's worker pool and the SQLite store's connection threads both hand off this way.

mod answer;
mod queue;
mod turn;

pub use answer::{AnswerPolling, answer_soon};
pub use queue::next_job;
pub use turn::Turn;
