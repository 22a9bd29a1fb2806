//! Wall-clock helpers. Times are stored as milliseconds since the Unix epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, the unit every stored time uses.
pub type Millis = i64;

/// The current wall-clock time in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> Millis {
    to_ms(SystemTime::now())
}

/// Converts a `SystemTime` to milliseconds since the Unix epoch (negative before it).
pub(crate) fn to_ms(t: SystemTime) -> Millis {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// Converts milliseconds since the Unix epoch to a `SystemTime`.
pub(crate) fn from_ms(ms: Millis) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

/// Converts a duration to whole milliseconds, rounding up so a timer never fires early.
pub(crate) fn duration_ms(d: Duration) -> Millis {
    let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
    i64::try_from(ms).unwrap_or(i64::MAX)
}
