use super::*;

fn temp_url() -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("resumable-sqlite-unit-{}", crate::ids::random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("t.db").display());
    (dir, url)
}

/// Runs one query returning a single integer on `pool`.
async fn scalar(pool: &ConnectionPool, sql: &'static str) -> i64 {
    pool.run(move |c| c.query_row(sql, [], |row| row.get(0)).map_err(db)).await.unwrap()
}

#[test]
fn urls_parse_as_before() {
    let file = |path: &str| Database::File(PathBuf::from(path));
    let cases = [
        ("sqlite://path/to/file.db", file("path/to/file.db")),
        ("sqlite:///abs/file.db", file("/abs/file.db")),
        ("sqlite:relative.db", file("relative.db")),
        ("SQLite://x.db", file("x.db")),
        ("sqlite://with%20space%3F.db", file("with space?.db")),
        ("sqlite://100%.db", file("100%.db")),
        ("sqlite::memory:", Database::Memory),
        ("sqlite://:memory:", Database::Memory),
        ("sqlite://?mode=memory", Database::Memory),
        ("sqlite://named?mode=memory&cache=shared", Database::Memory),
    ];
    for (url, database) in cases {
        assert_eq!(parse_url(url).unwrap().database, database, "{url}");
    }
    let rwc = parse_url("sqlite://a.db?mode=rwc").unwrap();
    assert_eq!((rwc.read_only, rwc.shared_cache, rwc.vfs), (false, None, None));
    let ro = parse_url("sqlite://a.db?mode=ro&cache=private&vfs=unix-none").unwrap();
    assert_eq!((ro.read_only, ro.shared_cache, ro.vfs.as_deref()), (true, Some(false), Some("unix-none")));
    assert!(ro.flags(false).contains(OpenFlags::SQLITE_OPEN_READ_ONLY));
    let writer = parse_url("sqlite://a.db").unwrap().flags(false);
    assert!(writer.contains(OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE));
    assert!(!writer.contains(OpenFlags::SQLITE_OPEN_URI), "paths are never read as file: URIs");
}

#[test]
fn bad_urls_are_errors() {
    for url in [
        "",
        "sqlite",
        "sqlite://",
        "sqlite:",
        "postgres://u@h/db",
        "runs.db",
        "sqlite://a.db?mode=bogus",
        "sqlite://a.db?cache=",
        "sqlite://a.db?immutable=1",
        "sqlite://a.db?journal=wal",
        "sqlite://%ff.db",
        "sqlité://a.db",
    ] {
        let parsed = parse_url(url);
        assert!(
            matches!(&parsed, Err(StoreError::Database(m)) if m.message().starts_with("invalid SQLite URL")),
            "{url}: {parsed:?}"
        );
    }
}

#[tokio::test]
async fn opening_a_bad_url_or_an_unopenable_file_is_an_error() {
    assert!(matches!(SqliteStore::open("sqlite://a.db?mode=bogus").await, Err(StoreError::Database(_))));
    let missing = std::env::temp_dir().join(format!("resumable-missing-{}", crate::ids::random_hex(8)));
    let url = format!("sqlite://{}", missing.join("t.db").display());
    assert!(matches!(SqliteStore::open(&url).await, Err(StoreError::Database(_))));
}

#[tokio::test]
async fn file_database_uses_wal_and_full_sync_and_migrates_once() {
    let (dir, url) = temp_url();
    let store = SqliteStore::open(&url).await.unwrap();
    let mode: String =
        store.writer.run(|c| c.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(db)).await.unwrap();
    assert_eq!((mode.as_str(), scalar(&store.writer, "PRAGMA synchronous").await), ("wal", 2));
    assert_eq!(scalar(&store.writer, "PRAGMA foreign_keys").await, 1);
    assert_eq!(scalar(&store.writer, "PRAGMA busy_timeout").await, 5000);
    // Readers: small page cache, read-only, same busy timeout.
    assert_eq!(scalar(&store.reader, "PRAGMA cache_size").await, -i64::from(READER_CACHE_KIB));
    assert_eq!(scalar(&store.reader, "PRAGMA busy_timeout").await, 5000);
    let write = store.reader.run(|c| c.execute("DELETE FROM runs", []).map_err(db)).await;
    let Err(refused) = write else { panic!("a reader wrote") };
    assert!(matches!(refused, StoreError::Database(_)), "{refused:?}");
    // The driver's error is kept as the cause: SQLite said the connection is read-only.
    let cause = std::error::Error::source(&refused).and_then(|e| e.downcast_ref::<rusqlite::Error>());
    let code = cause.and_then(rusqlite::Error::sqlite_error_code);
    assert_eq!(code, Some(rusqlite::ErrorCode::ReadOnly), "{refused:?}");
    store.close().await;
    // Reopening applies nothing twice.
    let store = SqliteStore::open(&url).await.unwrap();
    let versions = store
        .writer
        .run(|c| all_rows(c, "SELECT version FROM schema_migrations", [], |row| row.get::<_, i64>(0).map_err(db)))
        .await
        .unwrap();
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    store.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn options_reach_every_connection() {
    let (dir, url) = temp_url();
    let options = SqliteStoreOptions {
        synchronous: Synchronous::Off,
        busy_timeout: Duration::from_millis(250),
        read_connections: 2,
    };
    let store = SqliteStore::open_with(&url, options).await.unwrap();
    assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 0);
    assert_eq!(scalar(&store.writer, "PRAGMA busy_timeout").await, 250);
    assert_eq!(scalar(&store.reader, "PRAGMA busy_timeout").await, 250);
    // Not durable: claims and step starts leave the setting alone.
    let new =
        NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None, feed: None };
    store.create_run(new).await.unwrap();
    let req = ClaimRequest { owner: "o".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
    store.claim(&req).await.unwrap().unwrap();
    assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 0);
    store.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn memory_database_works_and_keeps_its_data() {
    let store = SqliteStore::open("sqlite::memory:").await.unwrap();
    let mode: String =
        store.writer.run(|c| c.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(db)).await.unwrap();
    assert_eq!(mode, "memory");
    let created = store
        .create_run(NewRun {
            workflow: "w".into(),
            input: json!({"a": 1}),
            idempotency_key: Some("k".into()),
            parent_run_id: None,
            feed: None,
        })
        .await
        .unwrap();
    let again = store
        .create_run(NewRun {
            workflow: "w".into(),
            input: json!(null),
            idempotency_key: Some("k".into()),
            parent_run_id: None,
            feed: None,
        })
        .await
        .unwrap();
    assert!(created.created && !again.created);
    assert_eq!(created.run_id, again.run_id);
    let run = store.get_run(&created.run_id).await.unwrap().unwrap();
    assert_eq!((run.status, run.input), (RunStatus::Pending, json!({"a": 1})));
    // Each in-memory store is its own database.
    let other = SqliteStore::open("sqlite::memory:").await.unwrap();
    assert_eq!(other.get_run(&created.run_id).await.unwrap(), None);
}

#[tokio::test]
async fn claims_and_step_starts_skip_the_fsync() {
    let (dir, url) = temp_url();
    let store = SqliteStore::open(&url).await.unwrap();
    let new =
        NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None, feed: None };
    store.create_run(new).await.unwrap();
    assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 2, "FULL to begin with");
    let req = ClaimRequest { owner: "o".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
    let fence = store.claim(&req).await.unwrap().unwrap().fence;
    assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 1, "NORMAL for the claim");
    assert_eq!(store.start_step(&fence, 0, "s").await.unwrap(), 1);
    assert_eq!(
        scalar(&store.writer, "PRAGMA synchronous").await,
        1,
        "NORMAL while the start record waits for the next commit"
    );
    let done = StepUpdate::Completed { attempt: 1, result: json!(1) };
    store.update_step(&fence, 0, done).await.unwrap();
    assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 2, "FULL again for every other commit");
    // A failed durable write restores FULL all the same.
    let stale = Fence { run_id: fence.run_id.clone(), attempt: fence.attempt + 1, token: 0 };
    assert_eq!(store.start_step(&fence, 1, "t").await.unwrap(), 1);
    let lost = store.update_step(&stale, 1, StepUpdate::Completed { attempt: 1, result: json!(2) }).await;
    assert!(matches!(lost, Err(StoreError::LeaseLost { .. })), "{lost:?}");
    assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 2);
    store.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A migration edited after it was applied is refused with what to do; a database made
/// before checksums were kept adopts them once, and then checks them like any other.
#[tokio::test]
async fn applied_migrations_are_checked_against_their_checksums() {
    let (dir, url) = temp_url();
    let store = SqliteStore::open(&url).await.unwrap();
    let edit = |sql: &'static str| {
        let store = store.clone();
        async move { store.writer.run(move |c| c.execute_batch(sql).map_err(db)).await.unwrap() }
    };
    // As a build before checksums left it.
    edit("ALTER TABLE schema_migrations DROP COLUMN checksum").await;
    store.close().await;
    let store = SqliteStore::open(&url).await.unwrap();
    let checksums = store
        .writer
        .run(|c| {
            all_rows(c, "SELECT checksum FROM schema_migrations ORDER BY version", [], |row| {
                row.get::<_, String>(0).map_err(db)
            })
        })
        .await
        .unwrap();
    let expected: Vec<String> = MIGRATIONS.iter().map(Migration::checksum).collect();
    assert_eq!(checksums, expected, "the checksums were adopted");
    // As if the file of migration 2 had been edited since.
    let edit = |sql: &'static str| {
        let store = store.clone();
        async move { store.writer.run(move |c| c.execute_batch(sql).map_err(db)).await.unwrap() }
    };
    edit("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 2").await;
    store.close().await;
    let Err(StoreError::Corrupt(message)) = SqliteStore::open(&url).await else {
        panic!("an edited migration was accepted")
    };
    assert!(message.contains("migration 2 (stream_positions) was changed"), "{message}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn newer_schema_is_refused() {
    let (dir, url) = temp_url();
    let store = SqliteStore::open(&url).await.unwrap();
    store
        .writer
        .run(|c| {
            c.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)", [])
                .map_err(db)
        })
        .await
        .unwrap();
    store.close().await;
    assert!(matches!(SqliteStore::open(&url).await, Err(StoreError::Corrupt(_))));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn close_lets_pending_work_finish_and_refuses_later_work() {
    let (dir, url) = temp_url();
    let store = SqliteStore::open(&url).await.unwrap();
    let new =
        NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None, feed: None };
    let (created, ()) = tokio::join!(store.create_run(new.clone()), store.close());
    let id = created.unwrap().run_id;
    assert!(matches!(store.get_run(&id).await, Err(StoreError::Database(_))));
    assert!(matches!(store.create_run(new).await, Err(StoreError::Database(_))));
    store.close().await;
    // Every connection is closed: the log was checkpointed into the file and removed.
    assert!(!dir.join("t.db-wal").exists());
    let store = SqliteStore::open(&url).await.unwrap();
    assert_eq!(store.get_run(&id).await.unwrap().map(|r| r.status), Some(RunStatus::Pending));
    store.close().await;
    let _ = std::fs::remove_dir_all(dir);
}
