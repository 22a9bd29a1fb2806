//! Makes a stack overflow impossible for the script to swallow.
//!
//! QuickJS reports a stack overflow as a catchable `RangeError` and offers no
//! hook when it happens. The runner therefore sets the engine's own check
//! well below the script's limit and paints a guard band of the worker
//! thread's stack just below the script's limit with a known pattern before
//! the script runs. Only a call chain (or one huge frame) that goes past the
//! limit writes there, so a changed word means the script exhausted its stack,
//! caught or not; the interrupt handler then ends the run.

/// Bytes of the band below the script's limit.
const BAND_BELOW: usize = 32 * 1024;
/// Bytes of the band above the limit, so that reaching the limit is enough.
const BAND_ABOVE: usize = 1024;
/// Distance between sampled words.
const STRIDE: usize = 128;
const PATTERN: u64 = 0x5afe_57ac_c0de_f00d;

/// A painted band of the current thread's stack.
pub(crate) struct StackGuard {
    low: usize,
    high: usize,
}

impl StackGuard {
    /// Paints the band around `limit`, the lowest stack address the engine allows.
    ///
    /// # Safety
    /// Must run on the thread whose stack holds `limit`, with the current stack
    /// pointer well above `limit + BAND_ABOVE`, and the band inside the thread's
    /// mapped stack (the worker's stack is four times the largest JS stack).
    pub(crate) unsafe fn paint(limit: usize) -> StackGuard {
        let low = (limit - BAND_BELOW) & !7;
        let high = limit + BAND_ABOVE;
        let mut addr = low;
        while addr < high {
            // SAFETY: `addr` is 8-aligned and inside the band, which the caller guarantees lies in
            // this thread's mapped stack, below this frame, in memory no live frame uses.
            unsafe { std::ptr::write_volatile(addr as *mut u64, PATTERN) };
            addr += STRIDE;
        }
        StackGuard { low, high }
    }

    /// True once anything has written into the band since it was painted.
    pub(crate) fn tripped(&self) -> bool {
        let mut addr = self.low;
        while addr < self.high {
            // SAFETY: the caller of `paint` (the only way to make a guard) ensured the band lies in
            // this thread's mapped stack, and the guard stays on that thread (its `RunGuard` is an
            // `Rc`); `addr` is 8-aligned and inside the band. A deeper frame may own those bytes by
            // now, which is what this check looks for.
            if unsafe { std::ptr::read_volatile(addr as *const u64) } != PATTERN {
                return true;
            }
            addr += STRIDE;
        }
        false
    }
}

/// The current stack pointer, approximately.
#[inline(never)]
pub(crate) fn stack_pointer() -> usize {
    let marker = 0u8;
    std::hint::black_box(&marker) as *const u8 as usize
}
