//! The server's connection limits over real TCP: a client that never finishes its request headers
//! is dropped after `--header-timeout-secs`, and past `--max-connections` a new connection waits
//! until one closes.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::{Server, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads what the server sends until it closes the connection or `within` passes: the bytes,
/// and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buffer[..n]),
            Err(_) => return (got, false),
        }
    }
}

async fn connect(server: &Server) -> TcpStream {
    let addr = server.url().trim_start_matches("http://").to_owned();
    TcpStream::connect(addr).await.expect("the server accepts TCP connections")
}

const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_dropped() {
    let dir = TempDir::new("header-timeout");
    let server = Server::start(&dir, &["--header-timeout-secs", "1"]);
    let mut slow = connect(&server).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").await.unwrap();
    let started = Instant::now();
    let (got, closed) = read_until_closed(&mut slow, Duration::from_secs(10)).await;
    let waited = started.elapsed();
    assert!(closed, "the connection stays open: {:?}", String::from_utf8_lossy(&got));
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(5), "closed after {waited:?}");
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"), "nothing was served: {got:?}");
    // A client that sends its request at once is served.
    let mut quick = connect(&server).await;
    quick.write_all(HEALTH).await.unwrap();
    let (got, _) = read_until_closed(&mut quick, Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_limit_a_new_connection_waits_for_one_to_close() {
    let dir = TempDir::new("max-connections");
    let server = Server::start(&dir, &["--max-connections", "2", "--header-timeout-secs", "30"]);
    let (first, _second) = (connect(&server).await, connect(&server).await);
    // Both are accepted (and idle): the third waits in the listen queue, unanswered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = connect(&server).await;
    third.write_all(HEALTH).await.unwrap();
    let (got, closed) = read_until_closed(&mut third, Duration::from_secs(1)).await;
    assert!(got.is_empty() && !closed, "served past the limit: {:?}", String::from_utf8_lossy(&got));
    drop(first);
    let (got, _) = read_until_closed(&mut third, Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
}

/// Two keys of acme and one of globex, for the stream caps.
const KEYS: &str = r#"{"keys":[{"key":"globex-key","actor":"gus","tenant":"globex","roles":["submitter"]}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_event_streams_are_capped_per_key_and_per_server() {
    let dir = TempDir::new("stream-caps");
    let keys = dir.path().join("keys.json");
    std::fs::write(&keys, KEYS).unwrap();
    let server =
        Server::start(&dir, &["--keys", keys.to_str().unwrap(), "--max-streams-per-key", "2", "--max-streams", "3"]);
    let (acme, globex) = (server.client(Some("demo-acme")), server.client(Some("globex-key")));
    let id = acme.submit("const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);").await;
    let open = |client: &support::Client, path: String| {
        let client = client.clone();
        async move { client.stream(&path).await }
    };
    let (first, _first_lines) = open(&acme, "/v1/events".to_owned()).await;
    let (second, _second_lines) = open(&acme, format!("/v1/automations/{id}/events")).await;
    assert_eq!((first.status, second.status), (200, 200));
    let refused = acme.get("/v1/events").await;
    assert_eq!((refused.status, &refused.json()["error"]["code"]), (429, &serde_json::json!("TOO_MANY_STREAMS")));
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("GET /v1/events"), "says what to do instead");
    let (theirs, _their_lines) = open(&globex, "/v1/events".to_owned()).await;
    assert_eq!(theirs.status, 200, "another key has its own slots");
    let (full, _) = open(&globex, "/v1/events".to_owned()).await;
    assert_eq!(full.status, 429, "the server's cap");
    // A client that leaves gives its slot back.
    drop((first, _first_lines));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (again, lines) = open(&acme, "/v1/events".to_owned()).await;
        if again.status == 200 {
            drop(lines);
            break;
        }
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_sent_a_byte_at_a_time_ends_the_request() {
    let dir = TempDir::new("body-timeout");
    let server = Server::start(&dir, &["--header-timeout-secs", "1"]);
    let mut slow = connect(&server).await;
    slow.write_all(b"POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nkey=").await.unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut closed = false;
    // One more byte every half second: never idle long enough for a read timeout.
    for _ in 0..20 {
        if slow.write_all(b"a").await.is_err() {
            closed = true;
            break;
        }
        let (more, ended) = read_until_closed(&mut slow, Duration::from_millis(500)).await;
        got.extend(more);
        if ended || !got.is_empty() {
            closed = true;
            break;
        }
    }
    let waited = started.elapsed();
    assert!(closed, "the request is still open after {waited:?}");
    assert!(waited < Duration::from_secs(8), "ended after {waited:?}, not about 3 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "answered 408: {text}");
}
