use super::*;
use sqlx::Connection;

fn server_url() -> Option<String> {
    crate::testing::postgres_url()
}

/// A fresh schema name, in the format whose leftovers the conformance tests sweep away.
fn schema_name() -> String {
    let secs = now_ms() / 1000;
    format!("rt_{secs}_{}_unit", crate::ids::random_hex(6))
}

async fn drop_schema(url: &str, schema: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    Executor::execute(&mut conn, format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str()).await.unwrap();
    conn.close().await.unwrap();
}

fn options(schema: &str) -> PgStoreOptions {
    PgStoreOptions {
        max_connections: 2,
        min_connections: 1,
        schema: Some(schema.to_owned()),
        notify_channel: schema.to_owned(),
        ..PgStoreOptions::default()
    }
}

fn new_run(workflow: &str) -> NewRun {
    NewRun {
        workflow: workflow.into(),
        input: json!({ "a": 1 }),
        idempotency_key: None,
        parent_run_id: None,
        feed: None,
    }
}

#[tokio::test]
async fn unsupported_url_schemes_are_refused_without_echoing_the_url() {
    for url in ["mysql://admin:hunter2@db.example/prod", "admin:hunter2@db.example", "hunter2"] {
        let Err(StoreError::Database(e)) = crate::store::open(url).await else {
            panic!("{url} was accepted");
        };
        let message = e.message();
        assert!(message.contains("postgres://") && message.contains("sqlite:"), "{message}");
        assert!(!message.contains("hunter2") && !message.contains("admin"), "{message}");
    }
    let sqlite = crate::store::open("sqlite::memory:").await.unwrap();
    assert!(sqlite.wake_signal().is_none(), "SQLite has no wake-up channel");
    assert!(sqlite.create_run(new_run("w")).await.unwrap().created);
}

#[tokio::test]
async fn invalid_schema_and_channel_names_are_refused_before_connecting() {
    let url = "postgres://nobody:secret@127.0.0.1:1/none";
    for schema in ["Upper", "has-dash", "1digit", "semi;colon", ""] {
        let options = PgStoreOptions { schema: Some(schema.to_owned()), ..PgStoreOptions::default() };
        let Err(StoreError::Database(e)) = PgStore::open_with(url, options).await else {
            panic!("schema {schema:?} was accepted");
        };
        let message = e.message();
        assert!(message.contains("invalid schema name"), "{message}");
    }
    let options = PgStoreOptions { notify_channel: "c".repeat(64), ..PgStoreOptions::default() };
    assert!(matches!(PgStore::open_with(url, options).await, Err(StoreError::Database(_))));
}

#[tokio::test]
async fn postgres_urls_open_a_pg_store() {
    let Some(url) = server_url() else { return };
    // A schema created beforehand and chosen through the URL, so the default options apply.
    let schema = schema_name();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    Executor::execute(&mut conn, format!("CREATE SCHEMA {schema}").as_str()).await.unwrap();
    conn.close().await.unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    for scheme in ["postgres", "postgresql"] {
        let rest = url.split_once("://").unwrap().1;
        let store =
            crate::store::open(&format!("{scheme}://{rest}{separator}options[search_path]={schema}")).await.unwrap();
        assert!(store.wake_signal().is_some(), "PostgreSQL stores listen for wake-ups");
        let created = store.create_run(new_run("w")).await.unwrap();
        assert_eq!(store.get_run(&created.run_id).await.unwrap().unwrap().status, RunStatus::Pending);
    }
    let pg = PgStore::open_with(&url, options(&schema)).await.unwrap();
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs").fetch_one(&pg.pool).await.unwrap();
    assert_eq!(runs, 2, "both stores wrote to the schema named in the URL");
    pg.close().await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn concurrent_first_opens_migrate_once() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let (url, options) = (url.clone(), options(&schema));
            tokio::spawn(async move { PgStore::open_with(&url, options).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().expect("every concurrent open succeeds"));
    }
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM schema_migrations ORDER BY version")
        .fetch_all(&stores[0].pool)
        .await
        .unwrap();
    assert_eq!(versions, MIGRATIONS.iter().map(|m| m.version).collect::<Vec<_>>());
    for store in &stores {
        store.close().await;
    }
    // Reopening applies nothing again.
    let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM schema_migrations").fetch_one(&store.pool).await.unwrap();
    assert_eq!(count, MIGRATIONS.len() as i64);
    store.close().await;
    drop_schema(&url, &schema).await;
}

/// A database made before checksums were kept adopts them once; an edited migration is then
/// refused with what to do.
#[tokio::test]
async fn applied_migrations_are_checked_against_their_checksums() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
    sqlx::query("ALTER TABLE schema_migrations DROP COLUMN checksum").execute(&store.pool).await.unwrap();
    store.close().await;
    let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
    let checksums: Vec<String> = sqlx::query_scalar("SELECT checksum FROM schema_migrations ORDER BY version")
        .fetch_all(&store.pool)
        .await
        .unwrap();
    assert_eq!(checksums, MIGRATIONS.iter().map(Migration::checksum).collect::<Vec<_>>());
    sqlx::query("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 3")
        .execute(&store.pool)
        .await
        .unwrap();
    store.close().await;
    let refused = PgStore::open_with(&url, options(&schema)).await;
    assert!(
        matches!(refused, Err(StoreError::Corrupt(ref m)) if m.contains("migration 3") && m.contains("was changed")),
        "{refused:?}"
    );
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn newer_schema_is_refused() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
    sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)")
        .execute(&store.pool)
        .await
        .unwrap();
    store.close().await;
    let refused = PgStore::open_with(&url, options(&schema)).await;
    assert!(matches!(refused, Err(StoreError::Corrupt(ref m)) if m.contains("99")), "{refused:?}");
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn a_claim_lost_with_the_server_and_made_again_fences_out_its_old_worker() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
    store.create_run(new_run("w")).await.unwrap();
    let lease = Duration::from_secs(30);
    let first = ClaimRequest { owner: "first".into(), workflows: vec!["w".into()], lease };
    let lost = store.claim(&first).await.unwrap().expect("claimed");
    // The server forgets the claim, as a crash before its WAL flush would; its worker lives on.
    sqlx::query(
        "UPDATE runs SET status = 'pending', lease_attempt = lease_attempt - 1, lease_owner = NULL,
             lease_expires_at = NULL, lease_token = 0",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    let second = ClaimRequest { owner: "second".into(), workflows: vec!["w".into()], lease };
    let again = store.claim(&second).await.unwrap().expect("claimed again");
    assert_eq!(again.fence.attempt, lost.fence.attempt, "the same lease attempt is handed out again");
    assert_ne!(again.fence.token, lost.fence.token);
    let stale = store.start_step(&lost.fence, 1, "s").await;
    assert!(matches!(stale, Err(StoreError::LeaseLost { .. })), "{stale:?}");
    let stale = store.renew_lease(&lost.fence, lease).await;
    assert!(matches!(stale, Err(StoreError::LeaseLost { .. })), "{stale:?}");
    let stale = store.append_stream(&lost.fence, 2, &json!(1)).await;
    assert!(matches!(stale, Err(StoreError::LeaseLost { .. })), "{stale:?}");
    assert_eq!(store.start_step(&again.fence, 1, "s").await.unwrap(), 1);
    store.renew_lease(&again.fence, lease).await.unwrap();
    store.close().await;
    drop_schema(&url, &schema).await;
}

#[test]
fn notifications_that_name_a_run_wake_its_waiters_and_the_others_wake_everybody() {
    let (hints, watched) = watch::channel(WakeHints::default());
    let (runs, mut named) = broadcast::channel(8);
    let announced = Announced { hints, runs };
    announced.tell(["changed:run_a"]);
    assert_eq!(*watched.borrow(), WakeHints::default(), "a named change is for that run's waiters only");
    assert_eq!(named.try_recv().unwrap(), RunId::from("run_a"));
    // One notification per transaction, with several entries (a finished child and its parent).
    announced.tell(["work:run_b changed:run_c"]);
    assert_eq!(*watched.borrow(), WakeHints { work: 1, changes: 0 });
    assert_eq!(named.try_recv().unwrap(), RunId::from("run_b"));
    assert_eq!(named.try_recv().unwrap(), RunId::from("run_c"));
    // Payloads of an earlier release name no run.
    announced.tell(["changed"]);
    assert_eq!(*watched.borrow(), WakeHints { work: 1, changes: 1 });
    announced.tell(["work"]);
    assert_eq!(*watched.borrow(), WakeHints { work: 2, changes: 2 });
    announced.anything();
    assert_eq!(*watched.borrow(), WakeHints { work: 3, changes: 3 });
    assert!(named.try_recv().is_err());
}

#[tokio::test]
async fn wake_signal_follows_other_stores_and_ends_with_its_store() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let writer = PgStore::open_with(&url, options(&schema)).await.unwrap();
    let reader = PgStore::open_with(&url, options(&schema)).await.unwrap();
    let mut signal = reader.wake_signal().unwrap();
    let mut runs = reader.changed_runs().unwrap();
    signal.borrow_and_update();
    let wait = Duration::from_secs(5);
    let created = writer.create_run(new_run("w")).await.unwrap().run_id;
    // A new run is work for a worker, and names itself for whoever waits on it.
    tokio::time::timeout(wait, signal.changed()).await.expect("notified of a new run").unwrap();
    let hints = *signal.borrow_and_update();
    assert!(hints.work >= 1 && hints.changes == 0, "{hints:?}");
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told which run").unwrap(), created);
    // A run that ends without a parent to wake is a change of that run, not work for anyone.
    let request = ClaimRequest { owner: "hints".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
    let claimed = writer.claim(&request).await.unwrap().expect("the run is claimed");
    writer.finish_run(&claimed.fence, RunOutcome::Completed(json!(1))).await.unwrap();
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told of the change").unwrap(), created);
    assert_eq!(*signal.borrow(), hints, "an ended run wakes no worker and names itself");
    // A child that ends names itself and its parent, which is work again, in one notification.
    let parent = writer.create_run(new_run("w")).await.unwrap().run_id;
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), parent);
    let child = writer.create_run(NewRun { parent_run_id: Some(parent.clone()), ..new_run("c") }).await.unwrap().run_id;
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), child);
    let request = ClaimRequest { owner: "hints".into(), workflows: vec!["c".into()], lease: Duration::from_secs(30) };
    let claimed = writer.claim(&request).await.unwrap().expect("the child is claimed");
    let before = *signal.borrow_and_update();
    writer.finish_run(&claimed.fence, RunOutcome::Completed(json!(2))).await.unwrap();
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), parent);
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), child);
    assert_eq!(signal.borrow_and_update().work, before.work + 1, "the woken parent is work");
    // A cancelled run names itself too.
    let doomed = writer.create_run(new_run("w")).await.unwrap().run_id;
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told of the new run").unwrap(), doomed);
    tokio::time::timeout(wait, signal.changed()).await.expect("notified of a new run").unwrap();
    let hints = *signal.borrow_and_update();
    writer.cancel_run(&doomed, "not needed").await.unwrap();
    assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told of the cancel").unwrap(), doomed);
    assert_eq!(*signal.borrow(), hints, "a cancelled run without a parent wakes no worker");
    // A store without notifications neither sends nor listens.
    let quiet = PgStore::open_with(&url, PgStoreOptions { notifications: false, ..options(&schema) }).await.unwrap();
    assert!(quiet.wake_signal().is_none() && quiet.changed_runs().is_none());
    signal.borrow_and_update();
    quiet.create_run(new_run("w")).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), signal.changed()).await.is_err());
    assert!(runs.try_recv().is_err());
    // Dropping the last clone of the store ends its listener task, and with it the signals.
    let clone = reader.clone();
    drop(reader);
    drop(clone);
    let ended = tokio::time::timeout(wait, async { while signal.changed().await.is_ok() {} }).await;
    assert!(ended.is_ok(), "the listener outlived its store");
    assert!(matches!(runs.recv().await, Err(broadcast::error::RecvError::Closed)));
    writer.close().await;
    quiet.close().await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn listener_reconnects_and_signals_after_losing_its_connection() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
    let mut signal = store.wake_signal().unwrap();
    signal.borrow_and_update();
    let wait = Duration::from_secs(10);
    // The listener's connection, by its last statement (`LISTEN "<channel>"`, maybe with `;`).
    let listening = format!("LISTEN \"{schema}\"%");
    let killed: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE $1")
            .bind(&listening)
            .fetch_all(&store.pool)
            .await
            .unwrap();
    assert_eq!(killed, vec![true], "one listener connection");
    // The reconnection itself is signalled: notifications may have been missed meanwhile.
    tokio::time::timeout(wait, signal.changed()).await.expect("signalled after reconnecting").unwrap();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let listeners: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1")
            .bind(&listening)
            .fetch_one(&store.pool)
            .await
            .unwrap();
        if listeners == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the listener did not reconnect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal.borrow_and_update();
    store.create_run(new_run("w")).await.unwrap();
    tokio::time::timeout(wait, signal.changed()).await.expect("notified after reconnecting").unwrap();
    store.close().await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn a_feed_number_taken_by_an_open_transaction_holds_back_the_next_until_it_commits() {
    let Some(url) = server_url() else { return };
    let schema = schema_name();
    let store = PgStore::open_with(&url, PgStoreOptions { max_connections: 3, ..options(&schema) }).await.unwrap();
    for _ in 0..2 {
        store.create_run(NewRun { feed: Some("t".into()), ..new_run("w") }).await.unwrap();
    }
    let claim = ClaimRequest { owner: "o".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
    let first = store.claim(&claim).await.unwrap().expect("claimed").fence;
    let second = store.claim(&claim).await.unwrap().expect("claimed").fence;

    // An append of the first run that has taken its number and not committed yet.
    let mut slow = sqlx::PgConnection::connect(&url).await.unwrap();
    Executor::execute(&mut slow, format!("SET search_path TO {schema}; BEGIN").as_str()).await.unwrap();
    let append = "SELECT resumable_append_stream($1, $2, 1, '{\"n\": 1}'::jsonb, 'stream_emitted', $3)";
    let index: i64 = sqlx::query_scalar(append)
        .bind(first.run_id.as_str())
        .bind(lease_key(&first))
        .bind(now_ms())
        .fetch_one(&mut slow)
        .await
        .unwrap();
    assert_eq!(index, 0);

    // The second run's append waits for it, so the reader never sees number 2 without number 1.
    let store = Arc::new(store);
    let writer = {
        let (store, fence) = (Arc::clone(&store), second.clone());
        tokio::spawn(async move { store.append_stream(&fence, 1, &json!({ "n": 2 })).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the next append of the feed waits for the open one");
    assert!(store.read_feed("t", 1, 10).await.unwrap().is_empty(), "nothing has committed");
    Executor::execute(&mut slow, "COMMIT").await.unwrap();
    assert_eq!(writer.await.unwrap().unwrap(), 0);
    let entries = store.read_feed("t", 1, 10).await.unwrap();
    let seen: Vec<(u64, &RunId)> = entries.iter().map(|e| (e.cursor, &e.run_id)).collect();
    assert_eq!(seen, [(1, &first.run_id), (2, &second.run_id)]);

    // A number taken by a transaction that rolls back is given again: no gap.
    Executor::execute(&mut slow, "BEGIN").await.unwrap();
    let again = append.replace("$2, 1,", "$2, 2,");
    sqlx::query(&again)
        .bind(first.run_id.as_str())
        .bind(lease_key(&first))
        .bind(now_ms())
        .fetch_one(&mut slow)
        .await
        .unwrap();
    Executor::execute(&mut slow, "ROLLBACK").await.unwrap();
    store.append_stream(&second, 2, &json!({ "n": 3 })).await.unwrap();
    let last = store.read_feed("t", 3, 10).await.unwrap();
    assert_eq!(last.iter().map(|e| (e.cursor, e.index)).collect::<Vec<_>>(), [(3, 1)]);
    slow.close().await.unwrap();
    store.close().await;
    drop_schema(&url, &schema).await;
}
