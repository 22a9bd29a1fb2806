//! The QuickJS sandbox of Resumable: limits, host-call bridge, replay ledger
//! and continuations.

mod bytecode_cache;
mod clock;
pub mod codec;
mod continuation;
mod determinism;
mod error;
mod event;
mod event_queue;
mod handle;
mod job;
mod leb128;
mod ledger_feed;
mod limits;
mod link;
mod outcome;
mod sandbox;
mod scope;
mod state;
mod store;
mod text;

pub use bytecode_cache::{BytecodeCacheConfig, RunnerStats};
pub use clock::Clock;
pub use error::{ConfigError, ErrorCode, RunError, UnknownErrorCode};
pub use event::{CallSettlement, EVENT_VALUE_BYTES, EventError, RunEvent};
pub use event_queue::EVENT_QUEUE_CAPACITY;
pub use handle::{RunEvents, RunHandle};
pub use limits::{Limit, LimitError, LimitOverrides, Limits};
pub use outcome::{Completion, ConsoleLevel, ConsoleLine, Interruption, Outcome, Resolution, Suspension};
mod pool;
pub mod process;
mod runner;

pub use continuation::{ContinuationCodec, Inspection, StoredCodec};
pub use resumable_host as host;
pub use runner::{DEFAULT_AUDIENCE, RunRequest, Runner, RunnerConfig};
pub use store::{
    ClaimId, ContinuationStore, ContinuationStoreError, MemoryContinuationStore, StoreFuture, StoredContinuation,
    check_continuation_store,
};

/// Entry points for the fuzz targets in `fuzz/` (compiled only under `cargo fuzz`).
#[cfg(fuzzing)]
pub mod fuzzing {
    /// Decodes `body` as a state body (its checksum added, so the fuzzer
    /// reaches the parser) and also as a compressed state; never panics.
    pub fn decode_state(body: &[u8]) -> bool {
        let mut bytes = body.to_vec();
        bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        let parsed = crate::state::ContinuationState::decode(&bytes).is_ok();
        // Read as it would arrive, in pieces, the state is accepted exactly when it is whole.
        let mut parser = crate::state::StateParser::new(bytes.len());
        let streamed =
            (1..=bytes.len()).step_by(97).chain([bytes.len()]).all(|end| parser.advance(&bytes[..end], |_| {}).is_ok())
                && parser.finish(&bytes).is_ok();
        assert_eq!(streamed, parsed, "the streaming parser disagrees with decode");
        let unpacked = crate::codec::decompress(body, 32 << 20)
            .is_ok_and(|raw| crate::state::ContinuationState::decode(&raw).is_ok());
        parsed || unpacked
    }
}
