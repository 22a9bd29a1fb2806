//! How times and amounts read on the pages.

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` as `YYYY-MM-DD HH:MM:SS UTC` (times before 1970 read as the epoch).
pub fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's days-to-civil).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// An amount in cents as `units.cents` (`1500` → `15.00`, `-5` → `-0.05`).
pub fn cents(amount: i64) -> String {
    let sign = if amount < 0 { "-" } else { "" };
    let abs = amount.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_read_in_utc() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(UNIX_EPOCH + Duration::from_millis(1_735_787_045_999)), "2025-01-02 03:04:05 UTC");
    }

    #[test]
    fn cents_read_as_units() {
        assert_eq!(cents(1500), "15.00");
        assert_eq!(cents(7), "0.07");
        assert_eq!(cents(-5), "-0.05");
        assert_eq!(cents(i64::MIN), "-92233720368547758.08");
    }
}
