//! Support for tests of code built on the engine (not part of the stable API).

/// Whether the tests run under CI (`CI` is set, and not to `false` or `0`): tests that need
/// something missing must fail there instead of being skipped.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The PostgreSQL server tests should use, from `RESUMABLE_TEST_PG_URL`, or `None` (after
/// printing that the test is skipped) when it is not set.
///
/// # Panics
/// When it is not set but `CI` is: under CI the PostgreSQL tests must not be skipped.
pub fn postgres_url() -> Option<String> {
    match std::env::var("RESUMABLE_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(!under_ci(), "RESUMABLE_TEST_PG_URL must be set under CI: the PostgreSQL tests cannot be skipped");
            eprintln!("skipped: RESUMABLE_TEST_PG_URL is not set");
            None
        }
    }
}

/// Sixteen random hex digits, for names of throwaway directories and schemas.
///
/// # Panics
/// When the operating system has no randomness to give.
pub fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `sql` (one or more statements) on the PostgreSQL server at `url`, on a thread and
/// runtime of its own, so that it can be called from `Drop` and from inside a runtime.
///
/// # Panics
/// When the server cannot be reached or a statement fails.
#[cfg(feature = "postgres")]
pub fn postgres_execute(url: &str, sql: &str) {
    use sqlx::Connection as _;
    let (url, sql) = (url.to_owned(), sql.to_owned());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async {
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("PostgreSQL answers");
            sqlx::raw_sql(&sql).execute(&mut conn).await.expect("the statement runs");
            let _ = conn.close().await;
        })
    })
    .join()
    .expect("the PostgreSQL thread");
}
