//! Reading a run's stream: every event from an index on, live while the run is writing it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::engine::Shared;
use crate::error::EngineError;
use crate::ids::RunId;
use crate::poll::Backoff;

/// How many events one store read fetches.
const BATCH: u32 = 256;

/// The events of a run's stream from some index on, in order, returned by
/// [`Engine::read_stream`](crate::Engine::read_stream).
///
/// [`next`](StreamReader::next) yields `(index, event)` pairs, waiting for new events while the
/// run is live, and `None` once the run has ended and every event was delivered. A client that
/// reconnects opens a new reader from the index after the last one it saw.
pub struct StreamReader {
    shared: Arc<Shared>,
    run_id: RunId,
    next_index: u64,
    buffer: VecDeque<(u64, Value)>,
    ended: bool,
    poll: Backoff,
}

impl fmt::Debug for StreamReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamReader")
            .field("run_id", &self.run_id)
            .field("next_index", &self.next_index)
            .field("ended", &self.ended)
            .finish()
    }
}

impl StreamReader {
    pub(crate) fn new(shared: Arc<Shared>, run_id: RunId, from_index: u64) -> StreamReader {
        StreamReader {
            shared,
            run_id,
            next_index: from_index,
            buffer: VecDeque::new(),
            ended: false,
            poll: Backoff::new(),
        }
    }

    /// The run whose stream this reads.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The index of the next event this reader yields.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// The next `(index, event)`, waiting for it while the run is live; `None` once the run has
    /// ended and every event was delivered. After an error, calling again retries.
    pub async fn next(&mut self) -> Option<Result<(u64, Value), EngineError>> {
        loop {
            if let Some((index, value)) = self.buffer.pop_front() {
                self.next_index = index + 1;
                return Some(Ok((index, value)));
            }
            if self.ended {
                return None;
            }
            // Register for wake-ups before reading, so an event appended in between is not missed.
            let listener = self.shared.changes.listen(&self.run_id);
            let changed = listener.next_change();
            // The status is read before the events: a run that had ended by then wrote its last
            // event before, so the read below sees all of them.
            let run = match self.shared.store.get_run(&self.run_id).await {
                Ok(Some(run)) => run,
                Ok(None) => return Some(Err(EngineError::RunNotFound(self.run_id.clone()))),
                Err(e) => return Some(Err(e.into())),
            };
            let events = match self.shared.store.read_stream(&self.run_id, self.next_index, BATCH).await {
                Ok(events) => events,
                Err(e) => return Some(Err(e.into())),
            };
            if !events.is_empty() {
                self.buffer.extend(events);
                self.poll.reset();
                continue;
            }
            if run.status.is_terminal() {
                self.ended = true;
                return None;
            }
            tokio::select! {
                _ = changed => {}
                _ = self.poll.wait() => {}
            }
        }
    }

    /// Reads every remaining event until the run ends.
    pub async fn collect(mut self) -> Result<Vec<(u64, Value)>, EngineError> {
        let mut all = Vec::new();
        while let Some(item) = self.next().await {
            all.push(item?);
        }
        Ok(all)
    }
}
