//! The automation service as a library: scripts over the demo order system on SQLite, approved,
//! rejected, in several rounds, across a restart, and decided concurrently.

use std::time::Duration;

use resumable::automation::{AutomationError, Automations, Decision, DecisionBatch};
use resumable::db::AppDb;
use resumable::orders::OrderBook;
use resumable_workflow::{RunId, RunStatus};
use serde_json::{Value, json};

const SECRET: &[u8] = &[42; 32];
const WAIT: Duration = Duration::from_secs(20);

struct Service {
    automations: Automations,
    orders: OrderBook,
    db: AppDb,
}

fn db_url(dir: &std::path::Path) -> String {
    format!("sqlite://{}", dir.join("service.db").display())
}

async fn service(dir: &std::path::Path) -> Service {
    let db = AppDb::open(&db_url(dir)).await.unwrap();
    let store = db.store();
    let orders = OrderBook::new(db.clone());
    orders.seed_demo().await.unwrap();
    let host = orders.clone();
    let automations = Automations::builder(store, db.clone(), SECRET)
        .host(move |tenant| host.host_functions(tenant))
        .engine(|e| e.workers(4))
        .build()
        .unwrap();
    Service { automations, orders, db }
}

fn temp_dir() -> std::path::PathBuf {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap();
    let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("resumable-automation-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn submit(s: &Service, source: &str) -> RunId {
    s.automations.submit("acme", source, Value::Null, "tester", None).await.unwrap()
}

/// Waits until the automation waits for a decision (or has ended) and returns its view.
async fn settled(s: &Service, id: &RunId) -> resumable::automation::AutomationView {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = s.automations.get("acme", id).await.unwrap();
        if view.pending.is_some() || view.status.is_terminal() {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "automation never settled: {view:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn decide_all(view: &resumable::automation::AutomationView, approved: bool) -> DecisionBatch {
    let pending = view.pending.as_ref().expect("a pending approval");
    DecisionBatch {
        decisions: pending
            .requests
            .iter()
            .map(|r| Decision { interruption_id: r.interruption_id.clone(), approved, reason: Some("checked".into()) })
            .collect(),
        actor: "approver".into(),
    }
}

const REFUND: &str = "const order = await orders.get('A-1002');
    const r = await orders.refund(order.id, 1500);
    return { order: order.id, refund: r };";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_script_completes() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, "return 6 * 7").await;
    let view = settled(&s, &id).await;
    assert_eq!((view.status, view.result), (RunStatus::Completed, Some(json!(42))));
    assert_eq!(view.rounds, 0);
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_read_the_context_they_were_submitted_with() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let source = "const c = await automation.context(); return (await orders.get(c.order)).total;";
    let id = s.automations.submit("acme", source, json!({ "order": "A-1003" }), "tester", None).await.unwrap();
    let view = settled(&s, &id).await;
    assert_eq!((view.status, view.result), (RunStatus::Completed, Some(json!(2_500))));
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_refund_happens_once_and_reads_are_not_repeated() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    let view = settled(&s, &id).await;
    let pending = view.pending.clone().unwrap();
    assert_eq!(pending.round, 1);
    assert_eq!(pending.requests[0].request, json!({ "kind": "refund-approval", "orderId": "A-1002", "amount": 1500 }));
    assert_eq!(s.automations.pending_approvals("acme", 10).await.unwrap().len(), 1);
    assert!(s.automations.pending_approvals("globex", 10).await.unwrap().is_empty());

    assert_eq!(s.automations.decide("acme", &id, decide_all(&view, true), &["approver"], None).await, Ok(1));
    let view = settled(&s, &id).await;
    assert_eq!(view.status, RunStatus::Completed, "{view:?}");
    let refund = &view.result.unwrap()["refund"];
    assert_eq!((refund["approved"].clone(), refund["refunded"].clone()), (json!(true), json!(1500)));
    assert_eq!(s.orders.refunds("acme").await.unwrap(), vec![("A-1002".to_owned(), 1500)]);
    assert_eq!(s.orders.live_calls(id.as_str(), "orders.get").await.unwrap(), 1, "replayed, not re-run");
    assert_eq!(
        s.automations.decide("acme", &id, decide_all_ids(&["interrupt-2"]), &["approver"], None).await,
        Err(AutomationError::AlreadyDecided),
        "decided already, even though the automation has ended"
    );
    assert_eq!(
        s.automations.decide("acme", &id, decide_all_ids(&["interrupt-9"]), &["approver"], None).await,
        Err(AutomationError::Ended(RunStatus::Completed)),
        "never decided, in an automation that has ended"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn decide_all_ids(ids: &[&str]) -> DecisionBatch {
    DecisionBatch {
        decisions: ids
            .iter()
            .map(|i| Decision { interruption_id: (*i).into(), approved: true, reason: None })
            .collect(),
        actor: "x".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_refund_changes_nothing_and_the_script_sees_it() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    let view = settled(&s, &id).await;
    s.automations.decide("acme", &id, decide_all(&view, false), &["approver"], None).await.unwrap();
    let view = settled(&s, &id).await;
    assert_eq!(view.result.unwrap()["refund"], json!({ "approved": false, "orderId": "A-1002", "reason": "checked" }));
    assert!(s.orders.refunds("acme").await.unwrap().is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rounds_and_a_parallel_batch() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let source = "const both = await Promise.all([orders.refund('A-1001', 100), orders.refund('A-1003', 200)]);
        const last = await orders.refund('A-1004', 300);
        return [both.map(r => r.refunded), last.refunded];";
    let id = submit(&s, source).await;
    let view = settled(&s, &id).await;
    assert_eq!(view.pending.as_ref().unwrap().requests.len(), 2, "both refunds in one batch");
    // A batch that decides one of them counts; the round waits for the other.
    s.automations.decide("acme", &id, decide_all_ids(&["interrupt-1"]), &["approver"], None).await.unwrap();
    let partly = s.automations.get("acme", &id).await.unwrap();
    let progress = &partly.pending.as_ref().expect("still pending").progress;
    assert_eq!(progress.iter().map(|p| p.approved_by.len()).collect::<Vec<_>>(), [1, 0], "{partly:?}");
    assert!(s.orders.refunds("acme").await.unwrap().is_empty(), "nothing resumes before the round is decided");
    // A batch that names the decided request too counts for nothing, and says why.
    let mixed =
        s.automations.decide("acme", &id, decide_all_ids(&["interrupt-1", "interrupt-2"]), &["approver"], None).await;
    assert_eq!(mixed, Err(AutomationError::AlreadyDecided));
    s.automations.decide("acme", &id, decide_all_ids(&["interrupt-2"]), &["approver"], None).await.unwrap();
    let view = settled(&s, &id).await;
    assert_eq!(view.pending.as_ref().map(|p| p.round), Some(2), "{view:?}");
    s.automations.decide("acme", &id, decide_all(&view, true), &["approver"], None).await.unwrap();
    let view = settled(&s, &id).await;
    assert_eq!(view.result, Some(json!([[100, 200], 300])));
    assert_eq!(view.rounds, 2);
    assert_eq!(s.orders.refunds("acme").await.unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_service_on_the_same_database_finishes_the_automation() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    let view = settled(&s, &id).await;
    s.automations.engine().shutdown().await;
    drop(s);
    let s = service(&dir).await;
    s.automations.decide("acme", &id, decide_all(&view, true), &["approver"], None).await.unwrap();
    let view = settled(&s, &id).await;
    assert_eq!(view.status, RunStatus::Completed);
    assert_eq!(s.orders.refunds("acme").await.unwrap().len(), 1);
    assert_eq!(s.orders.live_calls(id.as_str(), "orders.get").await.unwrap(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_32_concurrent_decisions_exactly_one_is_applied() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    let view = settled(&s, &id).await;
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (automations, id, batch) = (s.automations.clone(), id.clone(), decide_all(&view, i % 2 == 0));
            tokio::spawn(async move { automations.decide("acme", &id, batch, &["approver"], None).await })
        })
        .collect();
    let mut applied = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => applied += 1,
            Err(AutomationError::AlreadyDecided) => {}
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(applied, 1);
    let view = settled(&s, &id).await;
    assert_eq!(view.status, RunStatus::Completed);
    assert!(s.orders.refunds("acme").await.unwrap().len() <= 1);
    // Another tenant cannot see or decide it.
    assert_eq!(s.automations.get("globex", &id).await.unwrap_err(), AutomationError::WrongTenant);
    let _ = std::fs::remove_dir_all(dir);
}

/// The service's concurrency sizes the script workers too: `concurrency` automations can each
/// be inside a host call at the same moment (a runner left at one worker per core would hold
/// all but two of them back, and the gate below would never open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_many_scripts_wait_on_host_calls_at_once_as_the_concurrency_allows() {
    const AT_ONCE: usize = 6;
    let dir = temp_dir();
    let url = format!("sqlite://{}", dir.join("service.db").display());
    let db = AppDb::open(&url).await.unwrap();
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(AT_ONCE));
    let automations = Automations::builder(db.store(), db, SECRET)
        .host(move |_tenant| {
            let gate = gate.clone();
            resumable_runner::host::HostFunctions::builder()
                .function("gate.arrive", move |_ctx, _args| {
                    let gate = gate.clone();
                    async move {
                        let opened = tokio::time::timeout(Duration::from_secs(10), gate.wait()).await.is_ok();
                        Ok(json!(opened))
                    }
                })
                .build()
                .unwrap()
        })
        .concurrency(AT_ONCE)
        .build()
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..AT_ONCE {
        ids.push(automations.submit("acme", "return await gate.arrive()", Value::Null, "tester", None).await.unwrap());
    }
    for id in &ids {
        automations.engine().wait_for(id, WAIT).await.unwrap();
        let view = automations.get("acme", id).await.unwrap();
        assert_eq!((view.status, view.result.clone()), (RunStatus::Completed, Some(json!(true))), "{view:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The continuation token of the round that waits for approval, from the step's recorded result.
async fn waiting_continuation(s: &Service, id: &RunId) -> String {
    let events = s.automations.engine().events(id).await.unwrap();
    events
        .iter()
        .rev()
        .filter(|e| e.kind == resumable_workflow::EventKind::StepCompleted)
        .find_map(|e| e.payload["result"]["continuation"].as_str().map(str::to_owned))
        .expect("the waiting round recorded its continuation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_dead_attempt_is_taken_over_by_the_next_attempt_of_the_round() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    let view = settled(&s, &id).await;
    // A resume claims the token for ten minutes and is never heard from again (its server died).
    let token = waiting_continuation(&s, &id).await;
    let key: [u8; 32] =
        base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &token).unwrap().try_into().unwrap();
    let store = resumable::continuations::SqlContinuationStore::new(AppDb::open(&db_url(&dir)).await.unwrap());
    use resumable_runner::ContinuationStore as _;
    store.acquire(key, 7, Duration::from_secs(600)).await.unwrap();
    assert_eq!(
        store.acquire(key, 8, Duration::from_secs(600)).await,
        Err(resumable_runner::ContinuationStoreError::Claimed),
        "a different resumer is refused"
    );
    // The round's first attempt finds the token claimed; the next attempt takes it over at once.
    let started = tokio::time::Instant::now();
    assert_eq!(s.automations.decide("acme", &id, decide_all(&view, true), &["approver"], None).await, Ok(1));
    let view = settled(&s, &id).await;
    assert_eq!(view.status, RunStatus::Completed, "{view:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "taken over at once, not after the claim's lease");
    assert_eq!(view.result.unwrap()["refund"]["refunded"], json!(1500));
    assert_eq!(s.orders.refunds("acme").await.unwrap(), vec![("A-1002".to_owned(), 1500)]);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_asks_twice_is_decided_in_each_round_under_the_same_id() {
    let dir = temp_dir();
    let db = AppDb::open(&db_url(&dir)).await.unwrap();
    // Asks once, and once more after the first approval (a second approval stage).
    let host = |_tenant: &str| {
        resumable::HostFunctions::builder()
            .function("stage.approve", |ctx, _args| async move {
                match ctx.resume().map(|r| r.payload["stage"].as_u64()) {
                    None => Err(ctx.interrupt(json!({ "stage": 1 }))),
                    Some(Some(1)) => Err(ctx.interrupt(json!({ "stage": 2 }))),
                    Some(_) => Ok(json!("approved twice")),
                }
            })
            .build()
            .unwrap()
    };
    let automations = Automations::builder(db.store(), db.clone(), SECRET).host(host).build().unwrap();
    let s = Service { automations, orders: OrderBook::new(db.clone()), db };
    let id = submit(&s, "return await stage.approve()").await;
    let first = settled(&s, &id).await;
    assert_eq!(s.automations.decide("acme", &id, decide_all(&first, true), &["approver"], None).await, Ok(1));
    let deadline = tokio::time::Instant::now() + WAIT;
    let second = loop {
        let view = s.automations.get("acme", &id).await.unwrap();
        if view.pending.as_ref().is_some_and(|p| p.round == 2) {
            break view;
        }
        assert!(tokio::time::Instant::now() < deadline, "round 2 never asked: {view:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let ids: Vec<&str> = second.pending.as_ref().unwrap().requests.iter().map(|r| r.interruption_id.as_str()).collect();
    assert_eq!(ids, ["interrupt-1"], "the same call asks again");
    assert_eq!(s.automations.decide("acme", &id, decide_all(&second, true), &["approver"], None).await, Ok(2));
    let done = settled(&s, &id).await;
    assert_eq!(done.status, RunStatus::Completed, "{done:?}");
    assert_eq!(done.result, Some(json!("approved twice")));
    assert_eq!(
        s.automations.decide("acme", &id, decide_all(&second, true), &["approver"], None).await,
        Err(AutomationError::AlreadyDecided)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automations_that_waited_before_the_approval_index_are_listed_once_indexed() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    settled(&s, &id).await;
    assert_eq!(s.automations.pending_approvals("acme", 10).await.unwrap().len(), 1);
    // A database made before the index: the waiting automation has no row.
    s.db.execute("DELETE FROM approval_index", Vec::new()).await.unwrap();
    assert!(s.automations.pending_approvals("acme", 10).await.unwrap().is_empty());
    assert_eq!(s.automations.index_waiting().await.unwrap(), 1);
    let listed = s.automations.pending_approvals("acme", 10).await.unwrap();
    assert_eq!(listed.iter().map(|a| &a.automation_id).collect::<Vec<_>>(), [&id]);
    assert_eq!(s.automations.index_waiting().await.unwrap(), 1, "indexing again adds nothing new");
    assert_eq!(s.automations.pending_approvals("acme", 10).await.unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_automations_continuation_does_not_expire_before_its_request() {
    let dir = temp_dir();
    let s = service(&dir).await;
    let id = submit(&s, REFUND).await;
    settled(&s, &id).await;
    let row = s.db.fetch_one("SELECT MIN(expires_at) AS expires_at FROM continuations", Vec::new()).await.unwrap();
    let expires_at: i64 = row.get("expires_at").unwrap();
    let in_ten_years = std::time::SystemTime::now() + Duration::from_secs(10 * 365 * 24 * 3600);
    let in_ten_years = i64::try_from(in_ten_years.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    assert!(expires_at > in_ten_years, "the continuation of a request that may wait for ever expires at {expires_at}");
    let _ = std::fs::remove_dir_all(dir);
}
