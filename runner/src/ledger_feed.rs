//! The ledger of a continuation, handed to the worker while it is still being decoded.
//!
//! Resuming from a large token is mostly decompressing and decoding its ledger, then replaying
//! it. With a feed the two overlap: the worker authenticates the token and starts the script
//! while the caller's thread decodes, and each recorded call waits only for its own entry.
//! Whatever the feed ends with (a checksum or settle order found wrong at the end, say) is
//! known before the replay ends, so before any host function runs.

use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::{ErrorCode, RunError};
use crate::state::LedgerEntry;

/// What the decoding thread sends.
pub(crate) enum FeedItem {
    /// The next entries, in call order.
    Entries(Vec<LedgerEntry>),
    /// The state ended: every entry was sent and the state is valid, or it is not.
    End(Result<(), RunError>),
}

/// The sending half, for the decoding thread.
pub(crate) type FeedSender = Sender<FeedItem>;

/// The receiving half: entries of a ledger of known length, as they are decoded.
pub(crate) struct LedgerFeed {
    count: usize,
    receiver: Receiver<FeedItem>,
}

impl LedgerFeed {
    /// A feed of a ledger of `count` entries, and the sender that fills it.
    pub(crate) fn new(count: usize) -> (FeedSender, LedgerFeed) {
        let (sender, receiver) = crossbeam_channel::unbounded();
        (sender, LedgerFeed { count, receiver })
    }

    /// How many entries the ledger has.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The next entries; `None` once the state ended valid. Waits until `deadline` at most.
    ///
    /// # Errors
    ///
    /// The state's own error (`RUN_PROTOCOL_ERROR`), `RUN_TIMEOUT` past `deadline`, or an
    /// internal error if the decoding thread went away without a verdict.
    pub(crate) fn next(&self, deadline: Instant) -> Result<Option<Vec<LedgerEntry>>, RunError> {
        match self.receiver.recv_deadline(deadline) {
            Ok(FeedItem::Entries(entries)) => Ok(Some(entries)),
            Ok(FeedItem::End(verdict)) => verdict.map(|()| None),
            Err(RecvTimeoutError::Timeout) => {
                Err(RunError::new(ErrorCode::Timeout, "the continuation was still being decoded at the time limit"))
            }
            Err(RecvTimeoutError::Disconnected) => Err(RunError::internal("the continuation's decoder stopped")),
        }
    }
}
