//! Reading a feed: the stream events of every run in it, from a number on, live.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::engine::Shared;
use crate::error::EngineError;
use crate::poll::Backoff;
use crate::store::FeedEntry;

/// How many entries one store read fetches.
const BATCH: u32 = 256;

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
    poll: Backoff,
}

impl fmt::Debug for FeedReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeedReader").field("feed", &self.feed).field("next_cursor", &self.next_cursor).finish()
    }
}

impl FeedReader {
    pub(crate) fn new(shared: Arc<Shared>, feed: String, from: u64) -> FeedReader {
        FeedReader { shared, feed, next_cursor: from.max(1), buffer: VecDeque::new(), poll: Backoff::new() }
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
                self.poll.reset();
                continue;
            }
            tokio::select! {
                _ = appended => {}
                _ = self.poll.wait() => {}
            }
        }
    }
}
