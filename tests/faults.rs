//! The fault matrix: a real `resumable serve` process, killed with SIGKILL at named points and at
//! random moments (0–30 ms after a decision was accepted among them) under load, restarted on the
//! same database each time, on SQLite and on PostgreSQL. Whatever the kills, every approved
//! refund happens exactly once, no rejected one happens, no automation fails, and no decision
//! answered with a 202 is lost.
//!
//! Also here: a first start killed while it writes its secret never leaves a short secret file,
//! and worker processes die with their server.
//!
//! The random matrix runs a fixed seed and a few kills by default. For a longer local run:
//! `RESUMABLE_FAULT_SEED=N RESUMABLE_FAULT_KILLS=60 cargo test --test faults -- --nocapture`.

#[macro_use]
#[allow(dead_code)] // Each test binary uses a part of the support module.
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use resumable::fault::FaultPoint;
use serde_json::{Value, json};
use support::{Backend, Client, Db, Response, Server, TempDir, WAIT};

/// The engine's lease in these tests: a killed server's automations are taken over a second later.
const LEASE: &[&str] = &["--lease-secs", "1"];

/// Two rounds of approval: a refund of A-1004, then one of A-1002, with amounts from the context.
const TWO_REFUNDS: &str = "const ctx = await automation.context();
    const first = await orders.refund('A-1004', ctx.first);
    const second = await orders.refund('A-1002', ctx.second);
    return { first, second };";

/// A small deterministic generator (SplitMix64): the same seed gives the same kills.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn submit(client: &Client, first: u32, second: u32) -> String {
    let body = json!({ "source": TWO_REFUNDS, "context": { "first": first, "second": second } });
    let response = client.post("/v1/automations", &body).await;
    assert_eq!(response.status, 202, "submit: {}", response.text());
    response.json()["id"].as_str().expect("an id").to_owned()
}

/// `GET /v1/automations/{id}`, or `None` when the server does not answer (it was killed).
async fn try_view(client: &Client, id: &str) -> Option<Value> {
    let response = client.try_send("GET", &format!("/v1/automations/{id}"), &[], None).await.ok()?;
    (response.status == 200).then(|| response.json())
}

fn is_terminal(view: &Value) -> bool {
    matches!(view["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

/// The pending approval of a view that waits for one.
fn waiting_approval(view: &Value) -> Option<&Value> {
    (view["status"] == "waiting").then(|| &view["pendingApproval"]).filter(|a| !a.is_null())
}

/// Polls until `done` holds for the automation's view (the server must stay up meanwhile).
async fn poll(client: &Client, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(view) = try_view(client, id).await
            && done(&view)
        {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} never {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn decisions(approval: &Value, approved: bool) -> Value {
    let decisions: Vec<Value> = approval["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| json!({ "interruptionId": r["interruptionId"], "approved": approved, "reason": "fault matrix" }))
        .collect();
    json!({ "decisions": decisions })
}

/// Whether `response` is 409 `ALREADY_DECIDED` (the decision was kept, its answer maybe lost).
fn is_already_decided(response: &Response) -> bool {
    response.status == 409 && response.json()["error"]["code"] == "ALREADY_DECIDED"
}

async fn try_decide(client: &Client, id: &str, body: &Value) -> std::io::Result<Response> {
    let bytes = body.to_string();
    client.try_send("POST", &format!("/v1/automations/{id}/decisions"), &[], Some(bytes.as_bytes())).await
}

/// What the test decided for one interruption, and whether a 202 (or a 409 for the same body
/// after a lost answer) confirmed it.
#[derive(Clone, Copy, Debug)]
struct Intended {
    approved: bool,
    accepted: bool,
}

/// The automations of one scenario and what was decided for each.
#[derive(Default)]
struct Ledger {
    /// automation id -> interruption id -> decision.
    decisions: BTreeMap<String, BTreeMap<String, Intended>>,
    /// automation id -> (first amount, second amount).
    amounts: BTreeMap<String, (u32, u32)>,
}

impl Ledger {
    /// The decision for `interruption` of `id`: chosen once by `choose`, the same on every retry.
    fn decision(&mut self, id: &str, interruption: &str, choose: impl FnOnce() -> bool) -> bool {
        let entry = self.decisions.entry(id.to_owned()).or_default();
        entry
            .entry(interruption.to_owned())
            .or_insert_with(|| Intended { approved: choose(), accepted: false })
            .approved
    }

    /// Fails when `approval` asks again for a decision that was accepted: it was lost.
    fn assert_not_lost(&self, id: &str, approval: &Value) {
        for request in approval["requests"].as_array().into_iter().flatten() {
            let interruption = request["interruptionId"].as_str().unwrap_or_default();
            let accepted = self.decisions.get(id).and_then(|m| m.get(interruption)).is_some_and(|d| d.accepted);
            assert!(!accepted, "{id}: the accepted decision on {interruption} was lost: it is asked again");
        }
    }

    fn accept(&mut self, id: &str, approval: &Value) {
        for request in approval["requests"].as_array().into_iter().flatten() {
            let interruption = request["interruptionId"].as_str().unwrap_or_default();
            if let Some(d) = self.decisions.get_mut(id).and_then(|m| m.get_mut(interruption)) {
                d.accepted = true;
            }
        }
    }

    /// Checks the end state: every automation completed, every accepted decision is the one its
    /// events record, and the refunds are exactly the approved ones, once each.
    async fn check(&self, client: &Client, db: &Db, log: &str) {
        let mut expected = Vec::new();
        for (id, (first, second)) in &self.amounts {
            let view = poll(client, id, "ended", is_terminal).await;
            assert_eq!(view["status"], "completed", "{id} did not complete: {view}\n{log}");
            let decided = &self.decisions[id];
            for (interruption, d) in decided {
                assert!(d.accepted, "{id}: {interruption} was never accepted");
            }
            assert_eq!(view["rounds"], 2, "{view}");
            // The script's own call numbers: 1 reads the context, 2 and 3 ask for the refunds.
            let rounds = [("first", "interrupt-2", "A-1004", *first), ("second", "interrupt-3", "A-1002", *second)];
            assert_eq!(decided.len(), 2, "{id}: {decided:?}");
            for (field, interruption, order, amount) in rounds {
                let intended = decided.get(interruption).map(|d| d.approved);
                let seen = view["result"][field]["approved"].as_bool();
                assert_eq!(seen, intended, "{id}: the decision on {interruption} was lost or changed: {view}");
                if intended == Some(true) {
                    expected.push((format!("{id}:{interruption}"), order.to_owned(), i64::from(amount)));
                }
            }
        }
        expected.sort();
        assert_eq!(db.refund_keys("acme").await, expected, "approved refunds exactly once, rejected ones never");
    }
}

/// Servers on one database (`dir`) that may be killed and restarted, and a client of each.
struct Crashable<'a> {
    dir: &'a TempDir,
    servers: Vec<Server>,
    clients: Vec<Client>,
    logs: String,
}

impl<'a> Crashable<'a> {
    /// `count` servers on `dir`, with `env` added to the environment of each.
    fn start(dir: &'a TempDir, count: usize, env: &[(&str, &str)]) -> Crashable<'a> {
        let servers: Vec<Server> = (0..count).map(|_| Server::start_with_env(dir, LEASE, env)).collect();
        let clients = servers.iter().map(|s| s.client(Some("demo-acme"))).collect();
        Crashable { dir, servers, clients, logs: String::new() }
    }

    /// The client of the first server.
    fn client(&self) -> &Client {
        &self.clients[0]
    }

    /// SIGKILLs server `i` (if a fault point has not already) and starts a new one, without faults.
    fn restart(&mut self, i: usize) {
        self.servers[i].kill();
        self.logs.push_str(&self.servers[i].log_text());
        self.servers[i] = Server::start_with_env(self.dir, LEASE, &[]);
        self.clients[i] = self.servers[i].client(Some("demo-acme"));
    }

    /// Every server's log so far.
    fn log(&self) -> String {
        let mut log = self.logs.clone();
        for server in &self.servers {
            log.push_str(&server.log_text());
        }
        log
    }
}

/// Decides the open round of `id` as the ledger says, retrying across restarts until a 202 or
/// a 409 for the same body (a decision whose answer a kill swallowed) confirms it.
async fn decide_until_accepted(c: &mut Crashable<'_>, ledger: &mut Ledger, id: &str, approval: &Value, yes: bool) {
    ledger.assert_not_lost(id, approval);
    let body = decisions(approval, yes);
    for _ in 0..5 {
        match try_decide(c.client(), id, &body).await {
            Ok(r) if r.status == 202 || is_already_decided(&r) => {
                ledger.accept(id, approval);
                return;
            }
            Ok(r) => panic!("deciding {id}: {} {}", r.status, r.text()),
            Err(_) => c.restart(0),
        }
    }
    panic!("deciding {id} never got an answer");
}

/// Waits for the round of `id` that is open after `round` rounds were decided, or its end.
async fn next_approval(c: &Crashable<'_>, id: &str, decided: u32) -> Option<Value> {
    let view = poll(c.client(), id, "settled", |v| {
        is_terminal(v) || waiting_approval(v).is_some_and(|a| a["round"].as_u64() > Some(u64::from(decided)))
    })
    .await;
    waiting_approval(&view).cloned()
}

on_both_backends! {
    /// Each named point, armed in turn: the server dies there once, its successor finishes.
    async fn every_named_fault_point_loses_nothing(backend) {
        // The first time each point is reached after an approval (a round's end is reached once
        // before it, when round 1 asks).
        let points = FaultPoint::ALL.map(|p| match p {
            FaultPoint::BeforeRoundRecorded => (p, 2),
            _ => (p, 1),
        });
        for (point, nth) in points {
            let Some(dir) = TempDir::on(backend, &format!("fault_{}", point.name().replace('-', "_"))) else { return };
            let armed = format!("{}:{nth}", point.name());
            let mut c = Crashable::start(&dir, 1, &[("RESUMABLE_FAULT", armed.as_str())]);
            let mut ledger = Ledger::default();
            let id = submit(c.client(), 100, 50).await;
            ledger.amounts.insert(id.clone(), (100, 50));
            let approval = next_approval(&c, &id, 0).await.expect("round 1 asks");
            ledger.decision(&id, approval["requests"][0]["interruptionId"].as_str().unwrap(), || true);
            let answer = try_decide(c.client(), &id, &decisions(&approval, true)).await;
            if matches!(&answer, Ok(r) if r.status == 202) {
                ledger.accept(&id, &approval);
            }
            assert!(c.servers[0].exited_within(WAIT), "{armed}: the server never reached its fault point");
            c.restart(0);
            if point == FaultPoint::DecisionCommitted {
                assert!(answer.is_err(), "{armed}: the 202 was sent before the kill");
                // The retry of a decision whose answer was lost is answered 409: it was kept.
                let retry = try_decide(c.client(), &id, &decisions(&approval, true)).await.expect("an answer");
                assert!(is_already_decided(&retry), "{armed}: {}", retry.text());
                ledger.accept(&id, &approval);
            } else if !matches!(&answer, Ok(r) if r.status == 202) {
                decide_until_accepted(&mut c, &mut ledger, &id, &approval, true).await;
            }
            let approval = next_approval(&c, &id, 1).await.expect("round 2 asks");
            ledger.decision(&id, approval["requests"][0]["interruptionId"].as_str().unwrap(), || false);
            decide_until_accepted(&mut c, &mut ledger, &id, &approval, false).await;
            ledger.check(c.client(), &Db::of(&dir), &c.log()).await;
        }
    }
}

/// Automations under load on `servers` servers sharing one database, one of them SIGKILLed at
/// random moments (many of them 0–30 ms after it accepted a decision) and restarted each time.
async fn random_kills_under_load(backend: Backend, servers: usize) {
    let seed = env_number("RESUMABLE_FAULT_SEED", 16) + servers as u64;
    let kills = env_number("RESUMABLE_FAULT_KILLS", 6);
    let Some(dir) = TempDir::on(backend, &format!("random_kills_{servers}")) else { return };
    let mut rng = Rng(seed);
    let mut c = Crashable::start(&dir, servers, &[]);
    let mut ledger = Ledger::default();
    let (mut killed, mut just_after_a_decision) = (0, 0);
    let mut ids: Vec<String> = Vec::new();
    while killed < kills {
        // Keep more and more automations in flight, submitted to any server.
        while ids.len() < 4 + killed as usize {
            let (first, second) = (10 + rng.below(40) as u32, 5 + rng.below(20) as u32);
            let body = json!({ "source": TWO_REFUNDS, "context": { "first": first, "second": second } });
            let client = &c.clients[rng.below(servers as u64) as usize];
            let Ok(r) = client.try_send("POST", "/v1/automations", &[], Some(body.to_string().as_bytes())).await else {
                break;
            };
            assert_eq!(r.status, 202, "{}", r.text());
            let id = r.json()["id"].as_str().expect("an id").to_owned();
            ledger.amounts.insert(id.clone(), (first, second));
            ids.push(id);
        }
        // Decide whatever waits, one automation at a time, through the server to be killed, and
        // sometimes kill it right after.
        let victim = rng.below(servers as u64) as usize;
        let mut kill_now = false;
        for id in ids.clone() {
            let client = c.clients[victim].clone();
            let Some(view) = try_view(&client, &id).await else { break };
            let Some(approval) = waiting_approval(&view).cloned() else { continue };
            ledger.assert_not_lost(&id, &approval);
            let interruption = approval["requests"][0]["interruptionId"].as_str().unwrap_or_default().to_owned();
            let yes = ledger.decision(&id, &interruption, || rng.chance(60));
            match try_decide(&client, &id, &decisions(&approval, yes)).await {
                Ok(r) if r.status == 202 => {
                    ledger.accept(&id, &approval);
                    if rng.chance(40) {
                        tokio::time::sleep(Duration::from_micros(rng.below(30_000))).await;
                        kill_now = true;
                        just_after_a_decision += 1;
                        break;
                    }
                }
                Ok(r) if is_already_decided(&r) => ledger.accept(&id, &approval),
                Ok(r) => panic!("deciding {id}: {} {}", r.status, r.text()),
                Err(_) => break,
            }
        }
        if !kill_now {
            tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        }
        c.restart(victim);
        killed += 1;
    }
    // No more kills: decide what is left until every automation has ended.
    for id in ids.clone() {
        for decided in 0..2 {
            let Some(approval) = next_approval(&c, &id, decided).await else { break };
            let interruption = approval["requests"][0]["interruptionId"].as_str().unwrap_or_default().to_owned();
            let yes = ledger.decision(&id, &interruption, || rng.chance(60));
            decide_until_accepted(&mut c, &mut ledger, &id, &approval, yes).await;
        }
    }
    ledger.check(c.client(), &Db::of(&dir), &c.log()).await;
    eprintln!(
        "random kills on {servers} server(s): seed {seed}, {killed} kills ({just_after_a_decision} within 30 ms of a \
         decision), {} automations",
        ids.len()
    );
}

on_both_backends! {
    async fn random_kills_of_one_server_under_load_lose_nothing(backend) {
        random_kills_under_load(backend, 1).await;
    }
}

on_both_backends! {
    async fn random_kills_of_one_of_two_servers_under_load_lose_nothing(backend) {
        random_kills_under_load(backend, 2).await;
    }
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet: it runs no more code).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => true,
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).ok().is_some_and(|stat| {
                stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_exit_within_a_second_of_their_servers_sigkill() {
    let dir = TempDir::new("orphans");
    let mut server = Server::start(&dir, &[]);
    let client = server.client(Some("demo-acme"));
    // A script that computes for a long time keeps its worker busy.
    let body = json!({ "source": "let x = 0; for (;;) { x = (x + 1) % 7; }" });
    assert_eq!(client.post("/v1/automations", &body).await.status, 202);
    let deadline = std::time::Instant::now() + WAIT;
    let workers = loop {
        let workers = children_of(server.pid());
        if !workers.is_empty() {
            break workers;
        }
        assert!(std::time::Instant::now() < deadline, "no worker process started");
        std::thread::sleep(Duration::from_millis(20));
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();
    let killed = std::time::Instant::now();
    while !workers.iter().all(|w| gone(*w)) {
        assert!(killed.elapsed() < Duration::from_secs(1), "workers {workers:?} outlived their server by 1 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_first_start_killed_while_it_writes_its_secret_never_leaves_a_short_file() {
    let dir = TempDir::new("secret_kill");
    let secret = dir.path().join("secret");
    let mut rng = Rng(7);
    for attempt in 0..24 {
        let _ = std::fs::remove_file(&secret);
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_resumable"))
            .args(["serve", "--demo", "--listen", "127.0.0.1:0", "--db", &dir.db_url(), "--secret-file"])
            .arg(&secret)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("resumable serve starts");
        if attempt % 2 == 0 {
            // Killed the moment the file appears.
            let deadline = std::time::Instant::now() + WAIT;
            while !secret.exists() && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        }
        let _ = child.kill();
        let _ = child.wait();
        if let Ok(text) = std::fs::read_to_string(&secret) {
            assert!(text.trim().len() >= 64, "attempt {attempt}: the secret file holds {:?}", text);
        }
    }
    // And a server starts on whatever the kills left.
    let server = Server::start(&dir, &[]);
    drop(server);
}
