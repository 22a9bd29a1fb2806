//! End-to-end tests of the approval inbox pages over real HTTP (a `resumable serve --demo`
//! process on a fresh SQLite database per test): signing in with a key sets a strict cookie, the
//! inbox lists pending refunds, decisions need the session's CSRF token, values from scripts and
//! people are escaped, and every page carries the security headers.

#[allow(dead_code)]
mod support;

use serde_json::{Value, json};
use support::{Client, Db, Response, Server, TempDir, WAIT};

/// Reads an order, then asks to refund part of it.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

/// What an attacker would like a page to run.
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

/// A server with the demo keys (and `keys` as `--keys`, if given), a bearer client for the API,
/// and the database. Fields drop in order: the server is killed before its directory goes.
struct Fixture {
    server: Server,
    api: Client,
    db: Db,
    _dir: TempDir,
}

impl Fixture {
    fn start(name: &str, keys: Option<&str>) -> Fixture {
        let dir = TempDir::new(name);
        let server = Server::start_with_keys(&dir, keys);
        Fixture { api: server.client(Some("demo-acme")), db: Db::of(&dir), server, _dir: dir }
    }

    /// A browser-like client without a key: it sends the cookie it is given.
    fn browser(&self) -> Browser {
        Browser { client: self.server.client(None), cookie: None }
    }

    /// Signs in with `key`; the signed-in browser.
    async fn signed_in(&self, key: &str) -> Browser {
        let mut browser = self.browser();
        let response = browser.login(key).await;
        assert_eq!(response.status, 303, "{}", response.text());
        assert!(browser.cookie.is_some());
        browser
    }
}

/// The fields of the decision form approving round 1 with a reason, with this CSRF token.
fn approve(csrf: &str) -> [(&str, &str); 4] {
    [("round", "1"), ("choice", "approve"), ("reason", "customer called"), ("csrf", csrf)]
}

/// Percent-encodes a form field (`application/x-www-form-urlencoded`).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => (b as char).to_string(),
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn form(fields: &[(&str, &str)]) -> String {
    fields.iter().map(|(n, v)| format!("{}={}", encode(n), encode(v))).collect::<Vec<_>>().join("&")
}

/// A client that keeps the session cookie, like a browser.
struct Browser {
    client: Client,
    cookie: Option<String>,
}

impl Browser {
    fn headers<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut headers = extra.to_vec();
        if let Some(cookie) = &self.cookie {
            headers.push(("Cookie", cookie.as_str()));
        }
        headers
    }

    async fn get(&self, path: &str) -> Response {
        self.client.send("GET", path, &self.headers(&[]), None).await
    }

    async fn post_form(&self, path: &str, fields: &[(&str, &str)], extra: &[(&str, &str)]) -> Response {
        let mut headers = vec![("Content-Type", "application/x-www-form-urlencoded")];
        headers.extend_from_slice(extra);
        let body = form(fields);
        self.client.send("POST", path, &self.headers(&headers), Some(body.as_bytes())).await
    }

    /// Posts the sign-in form; keeps the cookie it sets.
    async fn login(&mut self, key: &str) -> Response {
        let response = self.post_form("/login", &[("key", key)], &[]).await;
        if let Some(set) = response.header("set-cookie") {
            self.cookie = Some(set.split(';').next().unwrap_or_default().to_owned());
        }
        response
    }
}

/// The value of the first hidden `csrf` field of a page.
fn csrf_token(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + "name=\"csrf\" value=\"".len();
    page[start..].split('"').next().expect("a token").to_owned()
}

#[track_caller]
fn assert_secure_headers(response: &Response) {
    let csp = response.header("content-security-policy").expect("a CSP");
    for directive in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(response.header("referrer-policy"), Some("no-referrer"));
    assert_eq!(response.header("x-frame-options"), Some("DENY"));
}

#[track_caller]
fn assert_html(response: &Response, status: u16) -> String {
    assert_eq!(response.status, status, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("text/html; charset=utf-8"));
    assert_secure_headers(response);
    response.text()
}

async fn submit(api: &Client, source: &str) -> String {
    let response = api.post("/v1/automations", &json!({ "source": source })).await;
    assert_eq!(response.status, 202, "{}", response.text());
    response.json()["id"].as_str().expect("an id").to_owned()
}

async fn poll(api: &Client, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = api.get(&format!("/v1/automations/{id}")).await.json();
        if done(&view) {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} never {what}: {view}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the automation waits for a decision.
async fn waiting(api: &Client, id: &str) -> Value {
    poll(api, id, "waited", |v| v["status"] == "waiting" && !v["pendingApproval"].is_null()).await
}

async fn finished(api: &Client, id: &str) -> Value {
    poll(api, id, "ended", |v| matches!(v["status"].as_str(), Some("completed" | "failed" | "cancelled"))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_sets_a_strict_http_only_cookie_and_a_bad_key_is_refused() {
    let f = Fixture::start("inbox-sign-in", None);
    let mut browser = f.browser();
    let page = assert_html(&browser.get("/").await, 200);
    assert!(page.contains("action=\"/login\"") && page.contains("type=\"password\""), "{page}");
    assert!(page.contains("name=\"viewport\""), "{page}");
    assert_secure_headers(&browser.get("/static/inbox.js").await);

    let refused = browser.login("not-a-key-at-all").await;
    let page = assert_html(&refused, 401);
    assert!(page.contains("That API key is not valid") && page.contains("action=\"/login\""), "{page}");
    assert_eq!(refused.header("set-cookie"), None);
    assert!(assert_html(&browser.post_form("/login", &[], &[]).await, 401).contains("Enter your API key"));

    let accepted = browser.login("demo-acme").await;
    assert_eq!((accepted.status, accepted.header("location")), (303, Some("/")), "{}", accepted.text());
    let cookie = accepted.header("set-cookie").expect("a cookie");
    let attributes: Vec<&str> = cookie.split(';').map(str::trim).skip(1).collect();
    assert_eq!(attributes, ["HttpOnly", "SameSite=Strict", "Path=/"], "{cookie}");
    assert!(!cookie.contains("demo-acme"), "the key is encoded in the cookie: {cookie}");
    let inbox = assert_html(&browser.get("/").await, 200);
    assert!(inbox.contains("Pending approvals") && inbox.contains("acme-demo"), "{inbox}");
    assert!(inbox.contains("Nothing waits for a decision"), "{inbox}");
    assert!(!f.server.log_text().contains("demo-acme"), "keys are never logged");

    // Signing out needs the CSRF token too; then the cookie is cleared.
    let token = csrf_token(&inbox);
    assert!(assert_html(&browser.post_form("/logout", &[], &[]).await, 403).contains("CSRF_INVALID"));
    let out = browser.post_form("/logout", &[("csrf", &token)], &[]).await;
    assert_eq!((out.status, out.header("location")), (303, Some("/")));
    assert!(out.header("set-cookie").is_some_and(|c| c.starts_with("resumable_inbox=;") && c.contains("Max-Age=0")));
    // The JSON API and its fallback are unchanged.
    let unknown = f.server.client(None).get("/nope").await;
    assert_eq!((unknown.status, unknown.json()["error"]["code"].clone()), (404, json!("NOT_FOUND")));
    assert_eq!(f.server.client(None).get("/v1/approvals").await.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_refund_is_listed_and_decided_only_with_the_sessions_csrf_token() {
    let f = Fixture::start("inbox-decide", None);
    let id = submit(&f.api, REFUND).await;
    let approval = waiting(&f.api, &id).await["pendingApproval"].clone();
    let browser = f.signed_in("demo-acme").await;

    let inbox = assert_html(&browser.get("/").await, 200);
    for expected in [
        format!("href=\"/automations/{id}\""),
        "<code>orders.refund</code>".to_owned(),
        "<dd class=\"order\">A-1002</dd>".to_owned(),
        "15.00 <span class=\"muted\">(1500 cents)</span>".to_owned(),
        "Round 1 · requested at <time>".to_owned(),
        format!("action=\"/automations/{id}/decide\""),
    ] {
        assert!(inbox.contains(&expected), "{expected:?} in {inbox}");
    }
    let token = csrf_token(&inbox);
    let decide = format!("/automations/{id}/decide");

    // Without a token, with a wrong one, with another key's token, or cross-site: 403, nothing decided.
    let no_token = browser.post_form(&decide, &[("round", "1"), ("choice", "approve")], &[]).await;
    assert!(assert_html(&no_token, 403).contains("CSRF_INVALID"));
    assert!(assert_html(&browser.post_form(&decide, &approve("AAAAAAAA"), &[]).await, 403).contains("CSRF_INVALID"));
    let globex = f.signed_in("demo-globex").await;
    let globex_token = csrf_token(&assert_html(&globex.get("/").await, 200));
    assert!(assert_html(&browser.post_form(&decide, &approve(&globex_token), &[]).await, 403).contains("CSRF_INVALID"));
    let cross = browser.post_form(&decide, &approve(&token), &[("Sec-Fetch-Site", "cross-site")]).await;
    assert!(assert_html(&cross, 403).contains("CROSS_SITE"));
    // The cookie alone, without the form's token, never decides: not even for the right key.
    let view = f.api.get(&format!("/v1/automations/{id}")).await.json();
    assert_eq!((&view["status"], &view["pendingApproval"]), (&json!("waiting"), &approval), "{view}");
    assert!(f.db.refunds("acme").await.is_empty());
    // Another tenant's approver with its own valid token cannot decide acme's automation.
    let foreign = globex.post_form(&decide, &approve(&globex_token), &[]).await;
    assert!(assert_html(&foreign, 403).contains("FORBIDDEN"));
    // A stale round is refused.
    let stale = browser.post_form(&decide, &[("round", "2"), ("choice", "approve"), ("csrf", &token)], &[]).await;
    assert!(assert_html(&stale, 409).contains("STALE_FORM"));

    let decided = browser.post_form(&decide, &approve(&token), &[("Sec-Fetch-Site", "same-origin")]).await;
    assert_eq!((decided.status, decided.header("location")), (303, Some(format!("/automations/{id}").as_str())));
    let view = finished(&f.api, &id).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(view["result"]["refunded"], 1500);
    assert_eq!(f.db.refunds("acme").await, [("A-1002".to_owned(), 1500)]);

    let page = assert_html(&browser.get(&format!("/automations/{id}")).await, 200);
    for expected in [
        "data-status=\"completed\">completed</strong>",
        "Decided by <strong>acme-demo</strong>",
        "<span class=\"approved\">approved</span>",
        "<q class=\"reason\">customer called</q>",
        "<pre id=\"result\">",
        "&quot;refunded&quot;: 1500",
        &format!("data-src=\"/automations/{id}/events?from=0\""),
    ] {
        assert!(page.contains(expected), "{expected:?} in {page}");
    }
    // A second post of the same form is refused: the round was decided.
    assert!(assert_html(&browser.post_form(&decide, &approve(&token), &[]).await, 410).contains("ENDED"));
    // The inbox is empty again.
    assert!(assert_html(&browser.get("/").await, 200).contains("Nothing waits for a decision"));

    // The page's events route: the session cookie reads it; without it, 401.
    let events = browser.get(&format!("/automations/{id}/events?from=0")).await;
    assert_eq!(events.status, 200, "{}", events.text());
    assert_eq!(events.header("content-type"), Some("application/x-ndjson"));
    let types: Vec<String> = events
        .text()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line")["event"]["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["approval_requested", "decided", "completed"]);
    assert_eq!(f.browser().get(&format!("/automations/{id}/events")).await.status, 401);
    assert_eq!(f.browser().get(&format!("/automations/{id}")).await.status, 401);
    assert!(assert_html(&globex.get(&format!("/automations/{id}")).await, 403).contains("FORBIDDEN"));
    assert!(assert_html(&browser.get("/automations/run_0000").await, 404).contains("NOT_FOUND"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_approvers_see_what_waits_but_no_decision_forms() {
    let keys = r#"{"keys":[{"key":"submit-only-key","actor":"bob","tenant":"acme","roles":["submitter"]}]}"#;
    let f = Fixture::start("inbox-submitter", Some(keys));
    let id = submit(&f.api, REFUND).await;
    waiting(&f.api, &id).await;
    let bob = f.signed_in("submit-only-key").await;
    let inbox = assert_html(&bob.get("/").await, 200);
    assert!(inbox.contains("does not have the approver role") && inbox.contains("A-1002"), "{inbox}");
    assert!(!inbox.contains("/decide"), "{inbox}");
    let page = assert_html(&bob.get(&format!("/automations/{id}")).await, 200);
    assert!(page.contains("does not have the approver role") && !page.contains("/decide"), "{page}");
    let token = csrf_token(&inbox);
    let post = bob
        .post_form(
            &format!("/automations/{id}/decide"),
            &[("round", "1"), ("choice", "approve"), ("csrf", &token)],
            &[],
        )
        .await;
    assert!(assert_html(&post, 403).contains("approver role"));
    assert_eq!(f.api.get(&format!("/v1/automations/{id}")).await.json()["status"], "waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_from_scripts_and_people_are_escaped() {
    let f = Fixture::start("inbox-escape", None);
    let browser = f.signed_in("demo-acme").await;
    let source = format!(
        "console.log({h:?}); const r = await orders.refund('A-1002', 100); return {{ note: {h:?}, r }};",
        h = HOSTILE
    );
    let id = submit(&f.api, &source).await;
    waiting(&f.api, &id).await;
    let page = assert_html(&browser.get(&format!("/automations/{id}")).await, 200);
    let token = csrf_token(&page);
    let reason = "<script>alert(2)</script>";
    let decided = browser
        .post_form(
            &format!("/automations/{id}/decide"),
            &[("round", "1"), ("choice", "reject"), ("reason", reason), ("csrf", &token)],
            &[],
        )
        .await;
    assert_eq!(decided.status, 303, "{}", decided.text());
    let view = finished(&f.api, &id).await;
    assert_eq!(view["result"]["note"], HOSTILE, "{view}");
    assert_eq!(view["result"]["r"]["reason"], reason, "{view}");

    let failing = submit(&f.api, &format!("throw new Error({HOSTILE:?})")).await;
    assert_eq!(finished(&f.api, &failing).await["status"], "failed");

    for path in [format!("/automations/{id}"), format!("/automations/{failing}")] {
        let page = assert_html(&browser.get(&path).await, 200);
        assert!(!page.contains("<img") && !page.contains("<script>alert"), "{page}");
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"), "{page}");
    }
    let page = assert_html(&browser.get(&format!("/automations/{id}")).await, 200);
    assert!(page.contains("&lt;script&gt;alert(2)&lt;/script&gt;"), "{page}");
    assert!(page.contains("[log] &lt;img src=x onerror=alert(1)&gt;"), "the console is shown escaped: {page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_sessions_and_the_calls_an_approver_judges_by() {
    let f = Fixture::start("inbox-history", None);
    let browser = f.signed_in("demo-acme").await;
    let id = submit(&f.api, REFUND).await;
    let done = submit(&f.api, &format!("return {HOSTILE:?}")).await;
    finished(&f.api, &done).await;
    let view = waiting(&f.api, &id).await;

    // The automation's page shows the source and the calls made so far, with their arguments.
    assert_eq!(view["source"], REFUND);
    let calls = view["calls"].as_array().expect("calls");
    let functions: Vec<(&str, &str)> =
        calls.iter().map(|c| (c["function"].as_str().unwrap(), c["outcome"].as_str().unwrap())).collect();
    assert_eq!(functions, [("orders.get", "ok"), ("orders.refund", "interrupted")], "{view}");
    assert_eq!((&calls[0]["round"], &calls[0]["arguments"]), (&json!(1), &json!(["A-1002"])));
    assert_eq!(calls[0]["result"]["id"], "A-1002", "the read's result: {view}");
    let page = assert_html(&browser.get(&format!("/automations/{id}")).await, 200);
    assert!(page.contains("id=\"source\"") && page.contains("orders.refund(o.id, 1500)"), "{page}");
    assert!(page.contains("<code>orders.get</code>") && page.contains("&quot;A-1002&quot;"), "{page}");
    assert!(page.contains("asked for a decision"), "{page}");

    // Approved, the refund ran once more, in round 2.
    let token = csrf_token(&page);
    let decided = browser.post_form(&format!("/automations/{id}/decide"), &approve(&token), &[]).await;
    assert_eq!(decided.status, 303, "{}", decided.text());
    let view = finished(&f.api, &id).await;
    let rounds: Vec<(u64, &str)> = view["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["round"].as_u64().unwrap(), c["function"].as_str().unwrap()))
        .collect();
    assert_eq!(rounds, [(1, "orders.get"), (1, "orders.refund"), (2, "orders.refund")], "{view}");

    // The history lists both, newest first, escaped, with links.
    let history = assert_html(&browser.get("/history").await, 200);
    let (at_done, at_refund) = (history.find(&done).unwrap(), history.find(&id).unwrap());
    assert!(at_done < at_refund, "newest first: {history}");
    assert!(history.contains(&format!("href=\"/automations/{id}\"")) && history.contains("acme-demo"), "{history}");
    assert!(!history.contains("<img") && history.contains("&lt;img"), "{history}");
    assert!(
        history.contains("href=\"/history\"") && history.contains("href=\"/sessions\""),
        "the navigation: {history}"
    );
    assert_eq!(browser.get("/history?cursor=bogus").await.status, 400);

    // Sessions: the list and a session's page with its command's automation linked.
    let response = f.api.post("/v1/sessions", &json!({})).await;
    assert_eq!(response.status, 201, "{}", response.text());
    let session = response.json()["id"].as_str().unwrap().to_owned();
    let response = f.api.post(&format!("/v1/sessions/{session}/commands"), &json!({ "source": "return 6 * 7" })).await;
    assert_eq!(response.status, 202, "{}", response.text());
    let deadline = tokio::time::Instant::now() + WAIT;
    let page = loop {
        let page = assert_html(&browser.get(&format!("/sessions/{session}")).await, 200);
        if page.contains("command_end") {
            break page;
        }
        assert!(tokio::time::Instant::now() < deadline, "the command never ended: {page}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(page.contains("command_start") && page.contains("href=\"/automations/run_"), "{page}");
    assert!(page.contains("<pre>42</pre>"), "the command's value: {page}");
    let list = assert_html(&browser.get("/sessions").await, 200);
    assert!(list.contains(&format!("href=\"/sessions/{session}\"")) && list.contains("live"), "{list}");
    assert_eq!(browser.get("/sessions/run_0123456789abcdef0123456789abcdef").await.status, 404);
    assert_eq!(browser.get("/sessions/not-an-id").await.status, 404);
    // Signed out, the pages ask to sign in.
    assert_ne!(f.browser().get("/history").await.status, 200);
}
