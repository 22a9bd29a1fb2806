//! Support for the end-to-end HTTP tests: a real `resumable serve --demo` process per test (killed
//! when its guard drops), a minimal HTTP/1.1 client over a tokio `TcpStream` (one request per
//! connection; `Content-Length`, chunked and read-to-close bodies; NDJSON event streams read line
//! by line as they arrive), and read access to the server's database (SQLite, or a fresh
//! PostgreSQL schema when `RESUMABLE_TEST_PG_URL` is set) to count effects.

use std::fs::File;
use std::io::{BufRead, BufReader as StdBufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use sqlx::Connection;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long anything may take before a test gives up: generous, the machine is small and busy.
pub const WAIT: Duration = Duration::from_secs(60);

/// A fresh directory under the system's temp directory (secret, keys, logs, and the SQLite
/// database), removed on drop; or, for PostgreSQL, a fresh schema dropped on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    db_url: String,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pg_schema: Option<(String, String)>,
}

#[cfg(feature = "postgres")]
use resumable_workflow::testing::postgres_execute as pg_execute;
use resumable_workflow::testing::random_suffix;

impl TempDir {
    /// Creates the directory, named `resumable-http-<name>-<random>`, for a SQLite database.
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("resumable-http-{name}-{}", random_suffix()));
        std::fs::create_dir_all(&path).expect("the temp directory is created");
        let db_url = format!("sqlite://{}", path.join("db.sqlite").display());
        TempDir { path, db_url, pg_schema: None }
    }

    /// `None`: a build without PostgreSQL tests SQLite only.
    #[cfg(not(feature = "postgres"))]
    pub fn postgres(name: &str) -> Option<TempDir> {
        eprintln!("{name}: skipped on PostgreSQL: this build has no postgres feature");
        None
    }

    /// A directory plus a fresh PostgreSQL schema, or `None` (after saying so) when no test server
    /// is configured.
    #[cfg(feature = "postgres")]
    pub fn postgres(name: &str) -> Option<TempDir> {
        let server = resumable_workflow::testing::postgres_url()?;
        let mut dir = TempDir::new(name);
        let schema = format!("http_{}_{}", name.replace('-', "_"), random_suffix());
        pg_execute(&server, &format!("CREATE SCHEMA {schema}"));
        let sep = if server.contains('?') { '&' } else { '?' };
        dir.db_url = format!("{server}{sep}options=-c%20search_path%3D{schema}");
        dir.pg_schema = Some((server, schema));
        Some(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `text` as the configuration file `resumable.toml` of the directory, with mode 0600
    /// (a file that holds keys in clear must be its owner's only); its path.
    #[allow(dead_code)] // Not every test binary that includes this module needs it.
    pub fn write_config(&self, text: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = self.path.join("resumable.toml");
        std::fs::write(&path, text).expect("the configuration file is written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("its mode is set");
        path
    }

    /// The server's database URL.
    pub fn db_url(&self) -> String {
        self.db_url.clone()
    }

    /// Makes servers started on this directory reach their database at `url` instead (the same
    /// database, through a proxy, say).
    #[allow(dead_code)] // Not every test binary that includes this module needs it.
    pub fn set_db_url(&mut self, url: String) {
        self.db_url = url;
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        #[cfg(feature = "postgres")]
        if let Some((server, schema)) = &self.pg_schema {
            pg_execute(server, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

/// A running `resumable serve` process; SIGKILLed and reaped on drop.
#[derive(Debug)]
pub struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    /// Starts `resumable serve --demo` on a free port with the database and the secret file in
    /// `dir`, plus `extra` arguments, and waits for its `listening on http://ADDR` line.
    pub fn start(dir: &TempDir, extra: &[&str]) -> Server {
        Server::start_with_env(dir, extra, &[])
    }

    /// Starts like [`Server::start`], with `env` added to the server's environment.
    pub fn start_with_env(dir: &TempDir, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let extra: Vec<&str> = ["--demo"].into_iter().chain(extra.iter().copied()).collect();
        Server::start_without_demo(dir, &extra, env)
    }

    /// Starts `resumable serve` like [`Server::start_with_env`], without `--demo` unless `extra`
    /// has it.
    pub fn start_without_demo(dir: &TempDir, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let n = std::fs::read_dir(dir.path()).map(|d| d.count()).unwrap_or(0);
        let log = dir.path().join(format!("server-{n}.log"));
        let stderr = File::create(&log).expect("the log file is created");
        let secret = dir.path().join("secret");
        let mut child = Command::new(env!("CARGO_BIN_EXE_resumable"))
            .args(["serve", "--listen", "127.0.0.1:0", "--db", &dir.db_url(), "--secret-file"])
            .arg(&secret)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("resumable serve starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        // Drains stdout for the life of the process, so the server never writes to a closed pipe.
        std::thread::spawn(move || {
            for line in StdBufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = sender.send(line);
            }
        });
        let mut server = Server { child, addr: SocketAddr::from(([127, 0, 0, 1], 0)), log };
        loop {
            match lines.recv_timeout(WAIT) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("listening on http://") {
                        server.addr = addr.trim().parse().expect("the address parses");
                        return server;
                    }
                }
                Err(e) => panic!("the server did not say where it listens ({e}); its log:\n{}", server.log_text()),
            }
        }
    }

    /// Starts `resumable serve --config` (without `--demo`) with `text` written as the
    /// configuration file of `dir`, and `env` added to the server's environment.
    #[allow(dead_code)] // Not every test binary that includes this module needs it.
    pub fn start_with_config(dir: &TempDir, text: &str, env: &[(&str, &str)]) -> Server {
        let path = dir.write_config(text);
        Server::start_without_demo(dir, &["--config", &path.display().to_string()], env)
    }

    /// Starts like [`Server::start`], with `keys` (a keys file's JSON), if given, written to
    /// `keys.json` in `dir` and passed as `--keys` (next to the demo keys).
    pub fn start_with_keys(dir: &TempDir, keys: Option<&str>) -> Server {
        let keys_file = dir.path().join("keys.json");
        let mut extra = Vec::new();
        if let Some(keys) = keys {
            std::fs::write(&keys_file, keys).expect("the keys file is written");
            extra = vec!["--keys".to_owned(), keys_file.display().to_string()];
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        Server::start(dir, &extra)
    }

    /// The server's base URL, `http://127.0.0.1:PORT`.
    #[allow(dead_code)] // Not every test binary that includes this module needs it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of this server presenting `key` (or no key).
    pub fn client(&self, key: Option<&str>) -> Client {
        Client { addr: self.addr, key: key.map(str::to_owned) }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The server's process id.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `within` for the process to exit on its own (a fault point killed it, say);
    /// whether it did.
    #[allow(dead_code)]
    pub fn exited_within(&mut self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if !self.is_running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// SIGKILLs the process (no graceful shutdown) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (graceful shutdown) and waits up to `within` for the process to exit; its
    /// exit status, or `None` if it is still running then.
    pub async fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child, which has not been reaped yet (we hold its `Child`).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the server logged on stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A complete HTTP response.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The decoded body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: body is not JSON ({e}): {:?}", self.status, self.text()))
    }
}

/// How a response body is delimited.
#[derive(Clone, Copy, Debug)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// A response body being read from its connection.
struct Body {
    reader: BufReader<TcpStream>,
    framing: Framing,
    done: bool,
}

fn invalid(message: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.into())
}

impl Body {
    async fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_owned())
    }

    /// The next piece of the body as sent (one chunk of a chunked body), `None` at its end.
    async fn chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        match self.framing {
            Framing::Length(n) => {
                self.done = true;
                let mut buf = vec![0; n];
                self.reader.read_exact(&mut buf).await?;
                Ok(Some(buf))
            }
            Framing::UntilClose => {
                self.done = true;
                let mut buf = Vec::new();
                self.reader.read_to_end(&mut buf).await?;
                Ok(Some(buf))
            }
            Framing::Chunked => {
                let size_line = self.line().await?;
                let hex = size_line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(hex, 16).map_err(|_| invalid(format!("chunk size {size_line:?}")))?;
                if size == 0 {
                    // Trailers, then the empty line that ends the message.
                    while !self.line().await?.is_empty() {}
                    self.done = true;
                    return Ok(None);
                }
                let mut buf = vec![0; size + 2];
                self.reader.read_exact(&mut buf).await?;
                if !buf.ends_with(b"\r\n") {
                    return Err(invalid("a chunk does not end with CRLF"));
                }
                buf.truncate(size);
                Ok(Some(buf))
            }
        }
    }
}

/// A client of one server: each request on a new connection (`Connection: close`).
#[derive(Clone, Debug)]
pub struct Client {
    addr: SocketAddr,
    key: Option<String>,
}

impl Client {
    /// Submits `source` (`POST /v1/automations`, which must answer 202); the automation's id.
    #[allow(dead_code)] // Not every test binary that includes this module needs it.
    pub async fn submit(&self, source: &str) -> String {
        let response = self.post("/v1/automations", &serde_json::json!({ "source": source })).await;
        assert_eq!(response.status, 202, "submit: {}", response.text());
        response.json()["id"].as_str().expect("an id").to_owned()
    }

    /// `GET path` until `done` holds for its JSON answer, within [`WAIT`].
    #[allow(dead_code)] // Not every test binary that includes this module needs it.
    pub async fn poll(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let response = self.get(path).await;
            let value = response.json();
            if done(&value) {
                return value;
            }
            assert!(tokio::time::Instant::now() < deadline, "{path} never got there: {} {value}", response.status);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.request("GET", path, None).await
    }

    /// `POST path` with `body` as JSON.
    pub async fn post(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, Some(body.to_string().as_bytes())).await
    }

    /// `POST path` with these exact body bytes (declared as JSON).
    pub async fn post_raw(&self, path: &str, body: &[u8]) -> Response {
        self.request("POST", path, Some(body)).await
    }

    /// `method path` with an optional body; the whole response. Panics on a transport error or
    /// after [`WAIT`].
    pub async fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Response {
        self.send(method, path, &[], body).await
    }

    /// `method path` with extra `headers` (a `Content-Type` among them replaces the JSON one) and
    /// an optional body; the whole response. Panics on a transport error or after [`WAIT`].
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Response {
        match self.try_send(method, path, headers, body).await {
            Ok(response) => response,
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// Like [`Client::send`], but a transport error (a server that died, say) or no response
    /// within [`WAIT`] is returned, not a panic.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> std::io::Result<Response> {
        let exchange = async {
            let (status, headers, mut body) = self.open(method, path, headers, body).await?;
            let mut bytes = Vec::new();
            while let Some(chunk) = body.chunk().await? {
                bytes.extend_from_slice(&chunk);
            }
            Ok::<_, std::io::Error>(Response { status, headers, body: bytes })
        };
        match tokio::time::timeout(WAIT, exchange).await {
            Ok(result) => result,
            Err(_) => {
                Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no complete response within {WAIT:?}")))
            }
        }
    }

    /// `GET path` whose body is read line by line as it arrives (NDJSON). The response's
    /// `body` is empty; read the lines from the [`Lines`].
    pub async fn stream(&self, path: &str) -> (Response, Lines) {
        let (status, headers, body) = match tokio::time::timeout(WAIT, self.open("GET", path, &[], None)).await {
            Ok(Ok(head)) => head,
            Ok(Err(e)) => panic!("GET {path}: {e}"),
            Err(_) => panic!("GET {path}: no response head within {WAIT:?}"),
        };
        (Response { status, headers, body: Vec::new() }, Lines { body, pending: Vec::new() })
    }

    /// Connects and sends all of `method path` but its last byte: [`Prepared::send`] completes
    /// it, so that many prepared requests reach the server at (almost) the same instant.
    pub async fn prepare(&self, method: &str, path: &str, body: Option<&[u8]>) -> Prepared {
        let mut bytes = self.request_bytes(method, path, &[], body);
        let last = bytes.pop().expect("a request is never empty");
        let connect = async {
            let mut stream = TcpStream::connect(self.addr).await?;
            stream.write_all(&bytes).await?;
            Ok::<_, std::io::Error>(stream)
        };
        match tokio::time::timeout(WAIT, connect).await {
            Ok(Ok(stream)) => Prepared { stream, last, method: method.to_owned(), path: path.to_owned() },
            Ok(Err(e)) => panic!("{method} {path}: {e}"),
            Err(_) => panic!("{method} {path}: cannot connect within {WAIT:?}"),
        }
    }

    fn request_bytes(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Vec<u8> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.addr);
        if let Some(key) = &self.key {
            head.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(body) = body {
            if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
                head.push_str("Content-Type: application/json\r\n");
            }
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        bytes
    }

    async fn open(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> std::io::Result<(u16, Vec<(String, String)>, Body)> {
        let mut stream = TcpStream::connect(self.addr).await?;
        let sent = stream.write_all(&self.request_bytes(method, path, headers, body)).await;
        read_response(stream, method, sent).await
    }
}

/// A request sent but for its last byte; see [`Client::prepare`].
#[derive(Debug)]
pub struct Prepared {
    stream: TcpStream,
    last: u8,
    method: String,
    path: String,
}

impl Prepared {
    /// Sends the last byte and reads the whole response.
    pub async fn send(mut self) -> Response {
        let (method, path) = (self.method.clone(), self.path.clone());
        let exchange = async {
            let sent = self.stream.write_all(&[self.last]).await;
            let (status, headers, mut body) = read_response(self.stream, &method, sent).await?;
            let mut bytes = Vec::new();
            while let Some(chunk) = body.chunk().await? {
                bytes.extend_from_slice(&chunk);
            }
            Ok::<_, std::io::Error>(Response { status, headers, body: bytes })
        };
        match tokio::time::timeout(WAIT, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => panic!("{method} {path}: {e}"),
            Err(_) => panic!("{method} {path}: no complete response within {WAIT:?}"),
        }
    }
}

/// Reads the response head on `stream` after a request was written (or failed to be: a server
/// may answer 413 and close before reading all of a large body, so the answer is read even then
/// and the write error reported only when there is none).
async fn read_response(
    stream: TcpStream,
    method: &str,
    sent: std::io::Result<()>,
) -> std::io::Result<(u16, Vec<(String, String)>, Body)> {
    let mut reader = BufReader::new(stream);
    let (status, headers) = match (read_head(&mut reader).await, sent) {
        (Ok(head), _) => head,
        (Err(_), Err(write_error)) => return Err(write_error),
        (Err(read_error), Ok(())) => return Err(read_error),
    };
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_ascii_lowercase());
    let framing = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        Framing::Chunked
    } else if let Some(length) = header("content-length") {
        Framing::Length(length.trim().parse().map_err(|_| invalid(format!("content-length {length:?}")))?)
    } else if method == "HEAD" || status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    Ok((status, headers, Body { reader, framing, done: false }))
}

async fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    loop {
        let mut status_line = String::new();
        if reader.read_line(&mut status_line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut parts = status_line.split_whitespace();
        let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
            return Err(invalid(format!("status line {status_line:?}")));
        };
        if !version.starts_with("HTTP/1.") {
            return Err(invalid(format!("status line {status_line:?}")));
        }
        let status: u16 = code.parse().map_err(|_| invalid(format!("status line {status_line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').ok_or_else(|| invalid(format!("header {line:?}")))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        // 1xx answers are followed by the real one.
        if !(100..200).contains(&status) {
            return Ok((status, headers));
        }
    }
}

/// Serves `router` (a test's own application: a connector's or a webhook's receiver) on a free
/// loopback port in the background; its address.
#[allow(dead_code)] // Not every test binary that includes this module needs it.
pub async fn serve_router(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("the test application serves") });
    addr
}

/// The lines of a streamed response body.
pub struct Lines {
    body: Body,
    pending: Vec<u8>,
}

impl Lines {
    /// The next line (without its newline), waiting for it; `None` once the body has ended.
    /// Panics on a transport error or after [`WAIT`].
    pub async fn next_line(&mut self) -> Option<String> {
        match tokio::time::timeout(WAIT, self.read_line()).await {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => panic!("reading the stream: {e}"),
            Err(_) => panic!("no line and no end of the stream within {WAIT:?}"),
        }
    }

    /// The next line parsed as JSON; `None` once the body has ended.
    pub async fn next_json(&mut self) -> Option<Value> {
        let line = self.next_line().await?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}")))
    }

    /// Every remaining line, parsed as JSON, until the body ends.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut all = Vec::new();
        while let Some(v) = self.next_json().await {
            all.push(v);
        }
        all
    }

    async fn read_line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..at]).into_owned()));
            }
            match self.body.chunk().await? {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None if self.pending.is_empty() => return Ok(None),
                None => return Ok(Some(String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned())),
            }
        }
    }
}

/// Read access to the server's database (WAL on SQLite: readers do not block the server), on the
/// drivers the server itself uses: rusqlite, and sqlx on PostgreSQL.
pub struct Db {
    url: String,
}

/// A value a test reads back: the columns it reads are text or integers.
trait Cell: Sized + Send + 'static {
    fn sqlite(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Self>;
    fn postgres(row: &sqlx::postgres::PgRow, at: usize) -> Result<Self, sqlx::Error>;
}

impl Cell for String {
    fn sqlite(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Self> {
        row.get(at)
    }
    fn postgres(row: &sqlx::postgres::PgRow, at: usize) -> Result<Self, sqlx::Error> {
        sqlx::Row::try_get(row, at)
    }
}

impl Cell for i64 {
    fn sqlite(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Self> {
        row.get(at)
    }
    fn postgres(row: &sqlx::postgres::PgRow, at: usize) -> Result<Self, sqlx::Error> {
        sqlx::Row::try_get(row, at)
    }
}

impl Db {
    /// The database of the server started in `dir`.
    pub fn of(dir: &TempDir) -> Db {
        Db { url: dir.db_url() }
    }

    /// Every row of `sql` (with `$1`, `$2`… bound to `params`), as `columns` cells each.
    async fn rows<T: Cell>(&self, sql: &'static str, params: &[&str], columns: usize) -> Vec<Vec<T>> {
        let params: Vec<String> = params.iter().map(|p| (*p).to_owned()).collect();
        if let Some(path) = self.url.strip_prefix("sqlite://") {
            let path = path.to_owned();
            return tokio::task::spawn_blocking(move || {
                let conn = rusqlite::Connection::open(path).expect("the database opens");
                conn.busy_timeout(WAIT).expect("busy timeout");
                let mut statement = conn.prepare(sql).expect("the query compiles");
                let rows = statement.query_map(rusqlite::params_from_iter(&params), |row| {
                    (0..columns).map(|at| T::sqlite(row, at)).collect::<rusqlite::Result<Vec<T>>>()
                });
                rows.expect("the query runs").collect::<rusqlite::Result<Vec<_>>>().expect("the rows are read")
            })
            .await
            .expect("the read ran");
        }
        let mut conn = sqlx::PgConnection::connect(&self.url).await.expect("the database opens");
        let query = params.iter().fold(sqlx::query(sql), |query, param| query.bind(param.as_str()));
        let rows = query.fetch_all(&mut conn).await.expect("the query runs");
        let _ = conn.close().await;
        let cells = |row: &sqlx::postgres::PgRow| (0..columns).map(|at| T::postgres(row, at)).collect();
        rows.iter().map(cells).collect::<Result<_, _>>().expect("the rows are read")
    }

    /// Every value of the one text column `sql` selects.
    #[allow(dead_code)]
    pub async fn texts(&self, sql: &'static str) -> Vec<String> {
        self.rows::<String>(sql, &[], 1).await.into_iter().flatten().collect()
    }

    /// The one integer `sql` selects.
    async fn integer(&self, sql: &'static str, params: &[&str]) -> i64 {
        let rows = self.rows::<i64>(sql, params, 1).await;
        *rows.first().and_then(|row| row.first()).expect("one row")
    }

    /// The refunds applied for `tenant`: (idempotency key, order id, amount in cents), in the
    /// order they were applied.
    async fn refund_rows(&self, tenant: &str) -> Vec<(String, String, i64)> {
        let sql = "SELECT idempotency_key, order_id, CAST(amount_cents AS TEXT) FROM refunds WHERE tenant = $1
                   ORDER BY created_at, idempotency_key";
        let rows = self.rows::<String>(sql, &[tenant], 3).await;
        let amount = |text: &str| text.parse().expect("an amount in cents");
        rows.into_iter().map(|row| (row[0].clone(), row[1].clone(), amount(&row[2]))).collect()
    }

    /// The refunds applied for `tenant`: (order id, amount in cents), in the order they were applied.
    pub async fn refunds(&self, tenant: &str) -> Vec<(String, i64)> {
        self.refund_rows(tenant).await.into_iter().map(|(_, order, amount)| (order, amount)).collect()
    }

    /// The refunds applied for `tenant` with their idempotency keys (`automation:interruption`),
    /// sorted by key.
    #[allow(dead_code)]
    pub async fn refund_keys(&self, tenant: &str) -> Vec<(String, String, i64)> {
        let mut rows = self.refund_rows(tenant).await;
        rows.sort();
        rows
    }

    /// How many times `function` ran live for automation `run_id`.
    pub async fn host_calls(&self, run_id: &str, function: &str) -> i64 {
        let sql = "SELECT COUNT(*) FROM host_calls WHERE run_id = $1 AND function = $2";
        self.integer(sql, &[run_id, function]).await
    }

    /// How much of order `id` of `tenant` was refunded, in cents.
    pub async fn refunded_cents(&self, tenant: &str, id: &str) -> i64 {
        let sql = "SELECT refunded_cents FROM orders WHERE tenant = $1 AND id = $2";
        self.integer(sql, &[tenant, id]).await
    }
}

/// Where a test's server keeps its data.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    /// A SQLite file in the test's directory.
    Sqlite,
    /// A fresh schema on the PostgreSQL test server.
    Postgres,
}

impl TempDir {
    /// A fresh directory whose database is on `backend`; `None` on PostgreSQL when no test server
    /// is configured.
    pub fn on(backend: Backend, name: &str) -> Option<TempDir> {
        match backend {
            Backend::Sqlite => Some(TempDir::new(name)),
            Backend::Postgres => TempDir::postgres(name),
        }
    }
}

/// Declares a scenario as a module of two tests: `sqlite`, and `postgres`, which passes without
/// doing anything when no PostgreSQL test server is configured (`RESUMABLE_TEST_PG_URL`).
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($(#[$attr:meta])* async fn $name:ident($backend:ident) $body:block) => {
        mod $name {
            use super::*;

            async fn scenario($backend: Backend) $body

            $(#[$attr])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                scenario(Backend::Sqlite).await
            }

            $(#[$attr])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                scenario(Backend::Postgres).await
            }
        }
    };
}
