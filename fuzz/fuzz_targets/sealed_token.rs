//! Any text handed to the sealed codec is refused or decoded, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resumable_runner::codec::{SealedCodec, SealedCodecConfig};
use std::sync::LazyLock;
use std::time::SystemTime;

static CODEC: LazyLock<SealedCodec> =
    LazyLock::new(|| SealedCodec::new(SealedCodecConfig::new(*b"fuzzing-secret-fuzzing-secret-32")).unwrap());

fuzz_target!(|data: &[u8]| {
    if let Ok(token) = std::str::from_utf8(data) {
        let now = SystemTime::now();
        let _ = CODEC.decode(token, "default", now);
        let _ = CODEC.decode_unscoped(token, now);
    }
});
