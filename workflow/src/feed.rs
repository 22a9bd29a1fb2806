//! Reading a feed: the stream events of every run in it, from a number on, live.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Shared;
use crate::error::EngineError;
use crate::store::FeedEntry;

/// How many entries one store read fetches.
const BATCH: u32 = 256;

/// How often a reader looks for entries written by other processes (appends through an engine of
/// this process wake it at once): every [`POLL_MIN`] after an entry arrived, then less and less
/// often, down to every [`POLL_MAX`], while none does.
const POLL_MIN: Duration = Duration::from_millis(25);
/// See [`POLL_MIN`].
const POLL_MAX: Duration = Duration::from_millis(500);

/// The entries of a feed from some number on, in order, returned by
/// [`Engine::read_feed`](crate::Engine::read_feed).
///
/// [`next`](FeedReader::next) yields each [`FeedEntry`] once, in the order the events committed,
/// and then waits for the next one: a feed has no end. Numbers have no gaps, so a reader that
/// reconnects from the number after the last one it saw misses nothing.
pub struct FeedReader {
    shared: Arc<Shared>,
    feed: String,
    next_cursor: u64,
    buffer: VecDeque<FeedEntry>,
    poll: Duration,
}

impl fmt::Debug for FeedReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeedReader").field("feed", &self.feed).field("next_cursor", &self.next_cursor).finish()
    }
}

impl FeedReader {
    pub(crate) fn new(shared: Arc<Shared>, feed: String, from: u64) -> FeedReader {
        FeedReader { shared, feed, next_cursor: from.max(1), buffer: VecDeque::new(), poll: POLL_MIN }
    }

    /// The feed this reads.
    pub fn feed(&self) -> &str {
        &self.feed
    }

    /// The number of the next entry this reader yields.
    pub fn next_cursor(&self) -> u64 {
        self.next_cursor
    }

    /// The next entry, waiting for it. After an error, calling again retries.
    pub async fn next(&mut self) -> Result<FeedEntry, EngineError> {
        loop {
            if let Some(entry) = self.buffer.pop_front() {
                self.next_cursor = entry.cursor + 1;
                return Ok(entry);
            }
            // Armed before reading, so an append in between is not missed.
            let appended = self.shared.changes.next_append();
            let entries = self.shared.store.read_feed(&self.feed, self.next_cursor, BATCH).await?;
            if !entries.is_empty() {
                self.buffer.extend(entries);
                self.poll = POLL_MIN;
                continue;
            }
            tokio::select! {
                _ = appended => {}
                _ = tokio::time::sleep(self.poll) => self.poll = (self.poll * 2).min(POLL_MAX),
            }
        }
    }
}
