//! Support for tests of code built on the engine (not part of the stable API).

/// The PostgreSQL server tests should use, from `RESUMABLE_TEST_PG_URL`, or `None` (after
/// printing that the test is skipped) when it is not set.
///
/// # Panics
/// When it is not set but `CI` is: under CI the PostgreSQL tests must not be skipped.
pub fn postgres_url() -> Option<String> {
    match std::env::var("RESUMABLE_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
            assert!(!ci, "RESUMABLE_TEST_PG_URL must be set under CI: the PostgreSQL tests cannot be skipped");
            eprintln!("skipped: RESUMABLE_TEST_PG_URL is not set");
            None
        }
    }
}
