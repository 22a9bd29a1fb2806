//! End-to-end tests of sessions over real HTTP, on SQLite and (when a test server is configured)
//! PostgreSQL: state shared between commands, hibernation, a server restart, destroy and 410,
//! reconnecting to the event stream, detaching versus cancelling, and approvals inside a command.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Backend, Client, Server, TempDir, WAIT};

/// Starts a session with `options`; its id.
async fn start_session(client: &Client, options: &Value) -> String {
    let response = client.post("/v1/sessions", options).await;
    assert_eq!(response.status, 201, "start: {}", response.text());
    response.json()["id"].as_str().expect("an id").to_owned()
}

/// Queues `source`; the command's number.
async fn command(client: &Client, session: &str, source: &str) -> u64 {
    let response = client.post(&format!("/v1/sessions/{session}/commands"), &json!({ "source": source })).await;
    assert_eq!(response.status, 202, "command: {}", response.text());
    response.json()["command"].as_u64().expect("a command number")
}

/// Reads the session's events from `from` until one satisfies `done`; every event read, with
/// its index.
async fn events_until(client: &Client, session: &str, from: u64, done: impl Fn(&Value) -> bool) -> Vec<(u64, Value)> {
    let (response, mut lines) = client.stream(&format!("/v1/sessions/{session}/events?from={from}")).await;
    assert_eq!(response.status, 200);
    let mut events = Vec::new();
    while let Some(line) = lines.next_json().await {
        let (index, event) = (line["index"].as_u64().expect("an index"), line["event"].clone());
        let finished = done(&event);
        events.push((index, event));
        if finished {
            return events;
        }
    }
    panic!("the stream ended before the awaited event: {events:?}");
}

/// The `command_end` event of `command`, waiting for it.
async fn command_end(client: &Client, session: &str, command: u64) -> Value {
    let events = events_until(client, session, 0, |e| e["type"] == "command_end" && e["command"] == command).await;
    events.last().expect("an event").1.clone()
}

fn is_status(event: &Value, status: &str) -> bool {
    event["type"] == "status" && event["status"] == status
}

fn assert_gone(response: &support::Response, status: &str) {
    assert_eq!(response.status, 410, "{}", response.text());
    let body = response.json();
    assert_eq!(body["error"]["code"], "SESSION_GONE", "{body}");
    assert_eq!(body["error"]["status"], status, "{body}");
    assert!(body["error"]["next"].as_str().is_some_and(|n| n.contains("POST /v1/sessions")), "{body}");
}

on_both_backends! {
    async fn three_commands_share_state_hibernate_survive_a_restart_and_end_with_destroy(backend) {
        let Some(dir) = TempDir::on(backend, "session-life") else { return };
        let mut server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let id = start_session(&client, &json!({ "idleMs": 1500 })).await;

        let first = command(&client, &id, "await session.set('greeting', { text: 'hi', n: 1 }); return 'set';").await;
        let second = command(&client, &id, "const g = await session.get('greeting'); return g.text + g.n;").await;
        let third = command(&client, &id, "console.log('third'); return await session.keys();").await;
        assert_eq!((first, second, third), (1, 2, 3));
        assert_eq!(command_end(&client, &id, 1).await["value"], "set");
        assert_eq!(command_end(&client, &id, 2).await["value"], "hi1");
        let end = command_end(&client, &id, 3).await;
        assert_eq!(end["status"], "completed", "{end}");
        assert_eq!(end["value"], json!(["greeting"]));
        let history = events_until(&client, &id, 0, |e| is_status(e, "hibernated")).await;
        let output = history.iter().find(|(_, e)| e["type"] == "command_output").expect("the console line");
        assert_eq!(output.1["console"], json!([{ "level": "log", "text": "third" }]));
        let view = client.get(&format!("/v1/sessions/{id}")).await.json();
        assert_eq!(view["status"], "hibernated", "{view}");

        server.kill();
        let server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let fourth = command(&client, &id, "return (await session.get('greeting')).n + 41;").await;
        let end = command_end(&client, &id, fourth).await;
        assert_eq!(end["value"], 42, "{end}");
        let all = events_until(&client, &id, 0, |e| e["type"] == "command_end" && e["command"] == 4).await;
        let after_hibernation: Vec<&str> = all
            .iter()
            .skip_while(|(_, e)| !is_status(e, "hibernated"))
            .filter_map(|(_, e)| e["status"].as_str().filter(|_| e["type"] == "status"))
            .collect();
        assert_eq!(after_hibernation, ["hibernated", "resuming", "active"]);

        let (_, mut follower) = client.stream(&format!("/v1/sessions/{id}/events?from=0")).await;
        let response = client.post(&format!("/v1/sessions/{id}/commands"), &json!({ "source": "/destroy" })).await;
        assert_eq!(response.status, 202, "{}", response.text());
        let followed = follower.rest().await;
        let last = &followed.last().expect("events")["event"];
        assert!(is_status(last, "destroyed"), "a follower sees the end last: {last}");
        let response = client.post(&format!("/v1/sessions/{id}/commands"), &json!({ "source": "return 1" })).await;
        assert_gone(&response, "destroyed");
        assert_gone(&client.get(&format!("/v1/sessions/{id}")).await, "destroyed");
        assert_gone(&client.request("DELETE", &format!("/v1/sessions/{id}"), None).await, "destroyed");
    }
}

on_both_backends! {
    async fn a_reconnecting_reader_gets_every_event_in_order_without_gaps_or_duplicates(backend) {
        let Some(dir) = TempDir::on(backend, "session-reconnect") else { return };
        let server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let id = start_session(&client, &json!({})).await;
        for i in 1..=5 {
            command(&client, &id, &format!("console.log('command {i}'); return {i} * 10;")).await;
        }
        let all = events_until(&client, &id, 0, |e| e["type"] == "command_end" && e["command"] == 5).await;
        let indexes: Vec<u64> = all.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, (0..all.len() as u64).collect::<Vec<_>>(), "contiguous from 0");
        let ends: Vec<&Value> = all.iter().filter(|(_, e)| e["type"] == "command_end").map(|(_, e)| &e["value"]).collect();
        assert_eq!(ends, [&json!(10), &json!(20), &json!(30), &json!(40), &json!(50)]);
        let kinds: Vec<&str> = all.iter().map(|(_, e)| e["type"].as_str().unwrap_or("?")).collect();
        assert_eq!(&kinds[..2], ["created", "status"]);
        assert_eq!(kinds.iter().filter(|k| **k == "command_start").count(), 5);
        assert_eq!(kinds.iter().filter(|k| **k == "command_output").count(), 5);

        let middle = all.len() as u64 / 2;
        let rest = events_until(&client, &id, middle, |e| e["type"] == "command_end" && e["command"] == 5).await;
        assert_eq!(rest, all[middle as usize..].to_vec(), "reading from the middle continues exactly");
    }
}

on_both_backends! {
    async fn a_dropped_stream_only_detaches_while_cancel_stops_the_command(backend) {
        let Some(dir) = TempDir::on(backend, "session-detach") else { return };
        let server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let id = start_session(&client, &json!({ "commandTimeoutMs": 120000 })).await;
        let slow = "let x = 0; for (let i = 0; i < 4000000; i++) { x = (x + i) % 1000003; } return x;";
        let n = command(&client, &id, slow).await;
        {
            let (_, mut lines) = client.stream(&format!("/v1/sessions/{id}/events?from=0")).await;
            while let Some(line) = lines.next_json().await {
                if line["event"]["type"] == "command_start" {
                    break;
                }
            }
            // The client goes away in the middle of the command.
        }
        let end = command_end(&client, &id, n).await;
        assert_eq!(end["status"], "completed", "the command finished without a reader: {end}");
        assert!(end["value"].is_number(), "{end}");

        let endless = command(&client, &id, "for (;;) {}").await;
        events_until(&client, &id, 0, |e| e["type"] == "command_start" && e["command"] == endless).await;
        let response = client.post(&format!("/v1/sessions/{id}/cancel"), &json!({})).await;
        assert_eq!(response.status, 202, "{}", response.text());
        assert_eq!(response.json()["command"], endless);
        let cancelled_at = Instant::now();
        let end = command_end(&client, &id, endless).await;
        assert_eq!(end["status"], "cancelled", "{end}");
        assert_eq!(end["error"]["code"], "RUN_ABORTED", "{end}");
        assert!(cancelled_at.elapsed() < Duration::from_secs(20), "cancel took {:?}", cancelled_at.elapsed());

        let after = command(&client, &id, "return 'still here';").await;
        assert_eq!(command_end(&client, &id, after).await["value"], "still here");
        let response = client.post(&format!("/v1/sessions/{id}/cancel"), &json!({})).await;
        assert_eq!(response.status, 409, "nothing runs: {}", response.text());
    }
}

on_both_backends! {
    async fn a_command_asks_for_approval_like_any_automation(backend) {
        let Some(dir) = TempDir::on(backend, "session-approval") else { return };
        let server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let id = start_session(&client, &json!({})).await;
        let n = command(&client, &id, "const r = await orders.refund('A-1002', 700); await session.set('refund', r); return r;").await;
        let started = events_until(&client, &id, 0, |e| e["type"] == "command_start" && e["command"] == n).await;
        let automation = started.last().expect("command_start").1["automation"].as_str().expect("an automation").to_owned();
        let deadline = Instant::now() + WAIT;
        let approval = loop {
            let approvals = client.get("/v1/approvals").await.json();
            let found = approvals["approvals"].as_array().and_then(|a| a.iter().find(|a| a["automationId"] == automation.as_str()).cloned());
            if let Some(found) = found {
                break found;
            }
            assert!(Instant::now() < deadline, "no approval for the command: {approvals}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let decision = json!({ "decisions": [{ "interruptionId": approval["requests"][0]["interruptionId"], "approved": true }] });
        let response = client.post(&format!("/v1/automations/{automation}/decisions"), &decision).await;
        assert_eq!(response.status, 202, "{}", response.text());
        let end = command_end(&client, &id, n).await;
        assert_eq!(end["status"], "completed", "{end}");
        assert_eq!(end["value"]["refunded"], 700, "{end}");
        let read = command(&client, &id, "return (await session.get('refund')).refunded;").await;
        assert_eq!(command_end(&client, &id, read).await["value"], 700);
    }
}

on_both_backends! {
    async fn unknown_foreign_and_malformed_sessions_are_gone_and_bad_options_are_refused(backend) {
        let Some(dir) = TempDir::on(backend, "session-gone") else { return };
        let server = Server::start(&dir, &[]);
        let acme = server.client(Some("demo-acme"));
        let id = start_session(&acme, &json!({})).await;
        let other = server.client(Some("demo-globex"));
        assert_gone(&other.get(&format!("/v1/sessions/{id}")).await, "unknown");
        assert_gone(&other.get(&format!("/v1/sessions/{id}/events?from=0")).await, "unknown");
        assert_gone(&acme.get("/v1/sessions/run_00000000000000000000000000000000").await, "unknown");
        let gone = acme.get("/v1/sessions/not-an-id").await;
        assert_gone(&gone, "unknown");
        assert_eq!(gone.header("x-content-type-options"), Some("nosniff"), "API answers are never sniffed");
        assert_eq!(gone.header("cache-control"), Some("no-store"));
        let response = acme.post("/v1/sessions", &json!({ "idleMs": 0 })).await;
        assert_eq!(response.status, 400, "{}", response.text());
        let response = acme.post("/v1/sessions", &json!({ "commandTimeoutMs": 999999999999u64 })).await;
        assert_eq!(response.status, 400, "{}", response.text());
        let response = acme.post("/v1/sessions", &json!({ "idle": 5 })).await;
        assert_eq!(response.status, 400, "unknown fields are refused: {}", response.text());
        let response = acme.post(&format!("/v1/sessions/{id}/commands"), &json!({ "source": "x".repeat(300 * 1024) })).await;
        assert_eq!(response.status, 413, "{}", response.text());
        let response = acme.request("DELETE", &format!("/v1/sessions/{id}"), None).await;
        assert_eq!(response.status, 202, "{}", response.text());
        assert_gone(&acme.post(&format!("/v1/sessions/{id}/commands"), &json!({ "source": "return 1" })).await, "destroyed");
    }
}

on_both_backends! {
    async fn the_state_is_size_limited_with_errors_the_script_can_catch(backend) {
        let Some(dir) = TempDir::on(backend, "session-limits") else { return };
        let server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let id = start_session(&client, &json!({})).await;
        let script = "const out = [];
            try { await session.set('big', 'x'.repeat(70000)); } catch (e) { out.push(e.details.code); }
            let stored = 0;
            for (let i = 0; i < 20; i++) {
                try { await session.set('k' + i, 'y'.repeat(60000)); stored++; }
                catch (e) { out.push(e.details.code); break; }
            }
            try { await session.set('', 1); } catch (e) { out.push(e.code); }
            out.push(await session.delete('k0'), await session.delete('k0'));
            await session.set('after-delete', 1);
            return { out, stored, keys: (await session.keys()).length };";
        let n = command(&client, &id, script).await;
        let end = command_end(&client, &id, n).await;
        assert_eq!(end["status"], "completed", "{end}");
        let expected = json!(["SESSION_STATE_LIMIT", "SESSION_STATE_LIMIT", "RUN_HOST_FUNCTION_ERROR", true, false]);
        assert_eq!(end["value"]["out"], expected, "{end}");
        assert_eq!(end["value"]["stored"], 17, "1 MiB holds 17 values of 60 KB: {end}");
        assert_eq!(end["value"]["keys"], 17, "{end}");
    }
}

on_both_backends! {
    async fn each_command_has_its_own_time_cap_and_the_session_goes_on(backend) {
        let Some(dir) = TempDir::on(backend, "session-timeout") else { return };
        let server = Server::start(&dir, &[]);
        let client = server.client(Some("demo-acme"));
        let id = start_session(&client, &json!({ "commandTimeoutMs": 300 })).await;
        let endless = command(&client, &id, "await session.set('before', true); for (;;) {}").await;
        let quick = command(&client, &id, "return await session.get('before');").await;
        let end = command_end(&client, &id, endless).await;
        assert_eq!(end["status"], "failed", "{end}");
        assert_eq!(end["error"]["code"], "RUN_TIMEOUT", "{end}");
        assert_eq!(command_end(&client, &id, quick).await["value"], true);
    }
}
