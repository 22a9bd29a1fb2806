//! Any bytes a codec might hand over as a state are decoded or refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = resumable_runner::fuzzing::decode_state(data);
});
