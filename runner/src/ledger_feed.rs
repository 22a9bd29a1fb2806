//! The ledger of a continuation, handed to the worker while it is still being decoded.
//!
//! Resuming from a large token is mostly authenticating, decompressing and decoding its
//! ledger, then replaying it. With a feed the two overlap: the worker starts the script while
//! the caller's thread authenticates and decodes the state, and each recorded call waits only
//! for its own entry. Only authenticated entries are sent. A worker process fills its feed
//! itself, parsing the state as it arrives from the parent (see [`FeedSource`]); the parent
//! checks the whole state before it serves any host call.
//! Whatever the feed ends with (a checksum or settle order found wrong at the end, say) is
//! known before the replay ends, so before any host function runs.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::error::{ErrorCode, RunError};
use crate::state::{LedgerEntry, StateHead};

/// What the decoding thread sends: the head, entries, then the verdict (or the verdict alone,
/// for a state that fails before its head).
pub(crate) enum FeedItem {
    /// What the state records before its ledger.
    Head(StateHead),
    /// The next entries, in call order.
    Entries(Vec<LedgerEntry>),
    /// The state ended: every entry was sent and the state is valid, or it is not.
    End(Result<(), RunError>),
}

/// How long the worker polls for the next part of a state before it sleeps.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(300);

/// The sending half, for the decoding thread.
pub(crate) type FeedSender = Sender<FeedItem>;

/// Where a feed's items come from, other than a decoding thread: a worker process parses the
/// state itself as its bytes arrive from the parent.
pub(crate) trait FeedSource {
    /// The next item, waiting until `deadline` at most.
    fn next_item(&mut self, deadline: Instant) -> Result<FeedItem, RunError>;
}

/// The receiving half: a state's head, then the entries of its ledger as they are decoded.
pub(crate) struct LedgerFeed {
    source: Source,
}

enum Source {
    Channel(Receiver<FeedItem>),
    Parsed(Box<dyn FeedSource + Send + Sync>),
}

impl LedgerFeed {
    /// An empty feed, and the sender that fills it.
    pub(crate) fn new() -> (FeedSender, LedgerFeed) {
        let (sender, receiver) = crossbeam_channel::unbounded();
        (sender, LedgerFeed { source: Source::Channel(receiver) })
    }

    /// A feed of the items `source` makes.
    pub(crate) fn from_source(source: Box<dyn FeedSource + Send + Sync>) -> LedgerFeed {
        LedgerFeed { source: Source::Parsed(source) }
    }

    /// The state's head, which comes first. Waits until `deadline` at most.
    ///
    /// # Errors
    ///
    /// As for [`next`](Self::next).
    pub(crate) fn head(&mut self, deadline: Instant) -> Result<StateHead, RunError> {
        match self.receive(deadline)? {
            FeedItem::Head(head) => Ok(head),
            FeedItem::End(verdict) => {
                Err(verdict.err().unwrap_or_else(|| RunError::internal("a state without a head")))
            }
            FeedItem::Entries(_) => Err(RunError::internal("ledger entries before the state's head")),
        }
    }

    /// The next entries; `None` once the state ended valid. Waits until `deadline` at most.
    ///
    /// # Errors
    ///
    /// The state's own error (`RUN_PROTOCOL_ERROR`), `RUN_TIMEOUT` past `deadline`, or an
    /// internal error if the decoding thread went away without a verdict.
    pub(crate) fn next(&mut self, deadline: Instant) -> Result<Option<Vec<LedgerEntry>>, RunError> {
        match self.receive(deadline)? {
            FeedItem::Entries(entries) => Ok(Some(entries)),
            FeedItem::End(verdict) => verdict.map(|()| None),
            FeedItem::Head(_) => Err(RunError::internal("a second head in the state")),
        }
    }

    fn receive(&mut self, deadline: Instant) -> Result<FeedItem, RunError> {
        let receiver = match &mut self.source {
            Source::Channel(receiver) => receiver,
            Source::Parsed(source) => return source.next_item(deadline),
        };
        // The decoding thread is at work: its next part is usually a few dozen microseconds
        // away, less than waking this thread would take. Poll a while before sleeping.
        let polling_until = Instant::now() + POLL_BEFORE_SLEEP;
        while Instant::now() < polling_until.min(deadline) {
            match receiver.try_recv() {
                Ok(item) => return Ok(item),
                Err(TryRecvError::Empty) => std::thread::yield_now(),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        receiver.recv_deadline(deadline).map_err(|error| match error {
            RecvTimeoutError::Timeout => {
                RunError::new(ErrorCode::Timeout, "the continuation was still being decoded at the time limit")
            }
            RecvTimeoutError::Disconnected => RunError::internal("the continuation's decoder stopped"),
        })
    }
}
