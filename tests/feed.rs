//! The tenant event feed end to end, `GET /v1/events`, on SQLite and (when a test server is
//! configured) PostgreSQL: two automations interleaved and a session, read live, from the start
//! and from the middle, each event once and in order, only the caller's tenant's, and resumed from
//! a cursor after a SIGKILL of the server.

#[macro_use]
#[allow(dead_code)]
mod support;

use serde_json::{Value, json};
use support::{Backend, Client, Lines, Server, TempDir};

/// Reads an order, then asks to refund part of it.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

/// An auditor of acme, who may read the audit log but not the automations, and a submitter of
/// another tenant.
const KEYS: &str = r#"{"keys":[
    {"key":"auditor-key","actor":"carol","tenant":"acme","roles":["auditor"]},
    {"key":"globex-key","actor":"gus","tenant":"globex","roles":["submitter"]}
]}"#;

/// Opens the caller's feed from `from` (a cursor or `latest`; no `from` when `None`).
async fn feed(client: &Client, from: Option<&str>) -> Lines {
    let path = from.map_or("/v1/events".to_owned(), |from| format!("/v1/events?from={from}"));
    let (head, lines) = client.stream(&path).await;
    assert_eq!(head.status, 200, "{path}: {head:?}");
    assert_eq!(head.header("content-type"), Some("application/x-ndjson"));
    lines
}

/// The next `n` lines of a feed.
async fn take(lines: &mut Lines, n: usize) -> Vec<Value> {
    let mut taken = Vec::with_capacity(n);
    for _ in 0..n {
        taken.push(lines.next_json().await.expect("the feed stays open"));
    }
    taken
}

/// The feed's lines until one satisfies `done`, that one included.
async fn until(lines: &mut Lines, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut taken = Vec::new();
    loop {
        let line = lines.next_json().await.expect("the feed stays open");
        let finished = done(&line);
        taken.push(line);
        if finished {
            return taken;
        }
    }
}

/// `(id, event type)` of each line.
fn ids_and_types(lines: &[Value]) -> Vec<(String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    lines.iter().map(|l| (text(&l["id"]), text(&l["event"]["type"]))).collect()
}

/// Approves every request of an `approval_requested` event.
async fn approve(client: &Client, line: &Value) {
    assert_eq!(line["event"]["type"], "approval_requested", "{line}");
    let decisions: Vec<Value> = line["event"]["pending"]
        .as_array()
        .expect("pending requests")
        .iter()
        .map(|r| json!({ "interruptionId": r["interruptionId"], "approved": true }))
        .collect();
    let id = line["id"].as_str().unwrap();
    let response = client.post(&format!("/v1/automations/{id}/decisions"), &json!({ "decisions": decisions })).await;
    assert_eq!(response.status, 202, "{}", response.text());
}

on_both_backends! {
    async fn the_tenant_feed_is_complete_in_order_resumable_and_live(backend) {
        let Some(dir) = TempDir::on(backend, "feed") else { return };
        let mut server = Server::start_with_keys(&dir, Some(KEYS));
        let (acme, globex) = (server.client(Some("demo-acme")), server.client(Some("globex-key")));

        // Opened before anything happened: it follows live.
        let mut live = feed(&acme, None).await;
        let other = globex.submit(REFUND).await;
        let a = acme.submit(REFUND).await;
        let first = take(&mut live, 1).await;
        let b = acme.submit(REFUND).await;
        let second = take(&mut live, 1).await;
        approve(&acme, &second[0]).await;
        let b_done = take(&mut live, 2).await;
        approve(&acme, &first[0]).await;
        let a_done = take(&mut live, 2).await;
        let automations = [first, second, b_done, a_done].concat();
        let kind = |t: &str| t.to_owned();
        assert_eq!(
            ids_and_types(&automations),
            [
                (a.clone(), kind("approval_requested")),
                (b.clone(), kind("approval_requested")),
                (b.clone(), kind("decided")),
                (b.clone(), kind("completed")),
                (a.clone(), kind("decided")),
                (a.clone(), kind("completed")),
            ],
            "two automations interleaved, in the order their events happened"
        );
        assert_eq!(automations[5]["event"]["value"]["refunded"], 1500);

        // A session and the automation its command runs are in the feed too.
        let response = acme.post("/v1/sessions", &json!({})).await;
        assert_eq!(response.status, 201, "{}", response.text());
        let session = response.json()["id"].as_str().unwrap().to_owned();
        let response = acme.post(&format!("/v1/sessions/{session}/commands"), &json!({ "source": "return 6 * 7" })).await;
        assert_eq!(response.status, 202, "{}", response.text());
        let session_lines = until(&mut live, |l| l["event"]["type"] == "command_end").await;
        let command = session_lines.iter().find(|l| l["kind"] == "automation").expect("the command's automation");
        assert_eq!((&command["event"]["type"], &command["event"]["value"]), (&json!("completed"), &json!(42)));
        let end = session_lines.last().unwrap();
        assert_eq!((end["kind"].as_str(), end["id"].as_str()), (Some("session"), Some(session.as_str())));
        assert_eq!(end["event"]["automation"], command["id"]);

        let all = [automations, session_lines].concat();
        let cursors: Vec<u64> = all.iter().map(|l| l["cursor"].as_u64().expect("a cursor")).collect();
        assert_eq!(cursors, (1..=all.len() as u64).collect::<Vec<_>>(), "numbered without gaps: {all:?}");
        assert!(all.iter().all(|l| l["id"] != other.as_str()), "another tenant's automation is not in the feed");
        for line in &all {
            let keys: Vec<&String> = line.as_object().unwrap().keys().collect();
            assert_eq!(keys, ["cursor", "event", "id", "index", "kind"], "{line}");
        }

        // Each automation's lines are its own event stream, index by index.
        let (_, mut stream) = acme.stream(&format!("/v1/automations/{a}/events")).await;
        let own: Vec<Value> = all.iter().filter(|l| l["id"] == a.as_str())
            .map(|l| json!({ "index": l["index"], "event": l["event"] })).collect();
        assert_eq!(stream.rest().await, own);

        // From the start (0 and 1 alike) and from the middle: the same lines, each once, then live.
        for from in ["0", "1"] {
            let mut again = feed(&acme, Some(from)).await;
            assert_eq!(take(&mut again, all.len()).await, all, "from {from}");
        }
        let mut middle = feed(&acme, Some("4")).await;
        assert_eq!(take(&mut middle, all.len() - 3).await, all[3..]);
        let c = acme.submit("return 1").await;
        let next = take(&mut middle, 1).await.remove(0);
        assert_eq!((next["cursor"].as_u64(), next["id"].as_str()), (Some(all.len() as u64 + 1), Some(c.as_str())));
        assert_eq!(take(&mut live, 1).await[0], next, "every live reader sees it");

        // From the latest on: only what comes next. A cursor beyond the next one is refused.
        let head = all.len() as u64 + 1;
        let mut latest = feed(&acme, Some("latest")).await;
        let ahead = acme.get(&format!("/v1/events?from={}", head + 2)).await;
        assert_eq!((ahead.status, &ahead.json()["error"]["code"]), (409, &json!("CURSOR_AHEAD")), "{}", ahead.text());
        let mut at_next = feed(&acme, Some(&(head + 1).to_string())).await;
        let e = acme.submit("return 3").await;
        let newest = take(&mut latest, 1).await.remove(0);
        assert_eq!((newest["cursor"].as_u64(), newest["id"].as_str()), (Some(head + 1), Some(e.as_str())));
        assert_eq!(take(&mut at_next, 1).await[0], newest);

        // The other tenant sees only its own automation.
        let mut theirs = feed(&globex, None).await;
        let line = take(&mut theirs, 1).await.remove(0);
        assert_eq!((line["cursor"].as_u64(), line["id"].as_str()), (Some(1), Some(other.as_str())));

        // Bad cursors, keys without a role that reads automations, and no key at all are refused.
        for query in ["from=abc", "from=-1", "since=3"] {
            let response = acme.get(&format!("/v1/events?{query}")).await;
            assert_eq!((response.status, &response.json()["error"]["code"]), (400, &json!("BAD_REQUEST")));
        }
        let auditor = server.client(Some("auditor-key")).get("/v1/events").await;
        assert_eq!((auditor.status, &auditor.json()["error"]["code"]), (403, &json!("FORBIDDEN")));
        assert_eq!(server.client(None).get("/v1/events").await.status, 401);

        // A reader resumes from the cursor after the last one it saw, across a SIGKILL.
        drop((live, middle, theirs, latest, at_next));
        server.kill();
        let server = Server::start_with_keys(&dir, Some(KEYS));
        let acme = server.client(Some("demo-acme"));
        let mut resumed = feed(&acme, Some(&head.to_string())).await;
        assert_eq!(take(&mut resumed, 2).await, [next, newest]);
        let d = acme.submit("return 2").await;
        let line = take(&mut resumed, 1).await.remove(0);
        assert_eq!((line["cursor"].as_u64(), line["id"].as_str()), (Some(head + 2), Some(d.as_str())));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_feed_sends_heartbeats_with_the_next_cursor() {
    let dir = TempDir::new("feed-heartbeat");
    // Requests time out after 6 s, a stream's body does not.
    let server = Server::start(&dir, &["--header-timeout-secs", "2"]);
    let acme = server.client(Some("demo-acme"));
    let id = acme.submit("return 1").await;
    let mut all = feed(&acme, None).await;
    assert_eq!(take(&mut all, 1).await[0]["id"], id.as_str());
    let started = std::time::Instant::now();
    let mut latest = feed(&acme, Some("latest")).await;
    let heartbeat = take(&mut latest, 1).await.remove(0);
    assert_eq!(heartbeat, json!({ "heartbeat": true, "next": 2 }));
    let waited = started.elapsed();
    assert!((15..40).contains(&waited.as_secs()), "a heartbeat after about 20 s of silence, not {waited:?}");
    assert_eq!(take(&mut all, 1).await[0], heartbeat, "every idle reader gets one");
}
