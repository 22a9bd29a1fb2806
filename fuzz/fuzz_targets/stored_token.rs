//! Any text used as a stored token is refused (malformed or unknown), never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resumable_runner::{ContinuationCodec, MemoryContinuationStore, StoredCodec};
use std::sync::{Arc, LazyLock};

static CODEC: LazyLock<ContinuationCodec> =
    LazyLock::new(|| StoredCodec::new(Arc::new(MemoryContinuationStore::new())).into());
static RUNTIME: LazyLock<tokio::runtime::Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_current_thread().build().unwrap());

fuzz_target!(|data: &[u8]| {
    if let Ok(token) = std::str::from_utf8(data) {
        assert!(RUNTIME.block_on(CODEC.inspect(token)).is_err());
    }
});
