//! The admin commands: `resumable automations|approvals|sessions …`, which speak HTTP to a
//! running `resumable serve` (`--server URL`) with the API key in `RESUMABLE_API_KEY`.
//!
//! Each prints the server's JSON answer on stdout, whatever its status, and exits 0 for a 2xx,
//! 1 for an answer that refuses (4xx, 5xx: the answer's `error.code` says why), and 2 when the
//! command cannot ask (no key, a bad flag, the server cannot be reached).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use reqwest::{Method, Url};
use serde_json::{Value, json};

use super::{EXIT_USAGE, usage_error};

/// The environment variable holding the API key (never a flag: flags show in `ps`).
pub const API_KEY_ENV: &str = "RESUMABLE_API_KEY";

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Where the server is.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The server's base URL.
    #[arg(long, value_name = "URL", env = "RESUMABLE_SERVER", default_value = "http://127.0.0.1:8080")]
    server: Url,
}

/// A page of a list: which, from where, how many.
#[derive(Debug, Args)]
pub struct PageArgs {
    /// Only these statuses (automations: pending, running, waiting, completed, failed,
    /// cancelled, comma-separated; sessions: live or ended).
    #[arg(long, value_name = "STATUS")]
    status: Option<String>,
    /// At most this many (1 to 200).
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// Continue after the page whose `next` this is.
    #[arg(long, value_name = "CURSOR")]
    cursor: Option<String>,
}

impl PageArgs {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        query.extend(self.status.clone().map(|s| ("status", s)));
        query.extend(self.limit.map(|n| ("limit", n.to_string())));
        query.extend(self.cursor.clone().map(|c| ("cursor", c)));
        query
    }
}

/// `resumable automations …`.
#[derive(Debug, Subcommand)]
pub enum AutomationsCommand {
    /// The tenant's automations, newest first: `{automations, next}`.
    List {
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One automation: status, result or error, pending approval, source and host calls.
    Show {
        #[command(flatten)]
        server: ServerArgs,
        /// The automation's id.
        id: String,
    },
    /// Cancels an automation that has not ended.
    Cancel {
        #[command(flatten)]
        server: ServerArgs,
        /// The automation's id.
        id: String,
    },
}

/// `resumable approvals …`.
#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// The tenant's pending approvals, oldest first.
    List {
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Decides requests of an automation's open round.
    Decide {
        #[command(flatten)]
        server: ServerArgs,
        /// The automation's id.
        id: String,
        /// `INTERRUPTION_ID=true` to approve, `=false` to reject (repeat for each request).
        #[arg(long = "decision", value_name = "ID=BOOL", required = true, value_parser = parse_decision)]
        decisions: Vec<(String, bool)>,
        /// Why (kept with each decision).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
}

/// `resumable sessions …`.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// The tenant's sessions, newest first: `{sessions, next}`.
    List {
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One live session.
    Show {
        #[command(flatten)]
        server: ServerArgs,
        /// The session's id.
        id: String,
    },
    /// Ends a session for good.
    Destroy {
        #[command(flatten)]
        server: ServerArgs,
        /// The session's id.
        id: String,
    },
}

/// `ID=true` or `ID=false`.
pub fn parse_decision(text: &str) -> Result<(String, bool), String> {
    let (id, verdict) = text.split_once('=').ok_or("expected INTERRUPTION_ID=true or =false")?;
    let approved = match verdict {
        "true" | "approve" | "yes" => true,
        "false" | "reject" | "no" => false,
        other => return Err(format!("{other:?} is neither true nor false")),
    };
    if id.is_empty() {
        return Err("the interruption id is empty".to_owned());
    }
    Ok((id.to_owned(), approved))
}

/// One request to the server.
struct Call<'a> {
    method: Method,
    server: &'a ServerArgs,
    path: Vec<&'a str>,
    query: Vec<(&'static str, String)>,
    body: Option<Value>,
}

impl<'a> Call<'a> {
    fn new(method: Method, server: &'a ServerArgs, path: &[&'a str]) -> Call<'a> {
        Call { method, server, path: path.to_vec(), query: Vec::new(), body: None }
    }

    /// Sends it and prints the answer; the exit status.
    fn run(self) -> ExitCode {
        // URL paths drop `.` and `..` segments: such an id would call another endpoint.
        if let Some(bad) = self.path.iter().find(|s| s.is_empty() || **s == "." || **s == "..") {
            return usage_error(format_args!("{bad:?} is not an id"));
        }
        let Ok(key) = std::env::var(API_KEY_ENV) else {
            return usage_error(format_args!("no API key: set {API_KEY_ENV}"));
        };
        let mut url = self.server.server.clone();
        match url.path_segments_mut() {
            // Each segment is percent-encoded: an id cannot reach another path.
            Ok(mut segments) => {
                segments.pop_if_empty().extend(self.path.iter());
            }
            Err(()) => return usage_error(format_args!("{} cannot be a server's base URL", self.server.server)),
        }
        if !self.query.is_empty() {
            url.query_pairs_mut().extend_pairs(self.query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => return usage_error(format_args!("cannot start the async runtime: {e}")),
        };
        let sent = runtime.block_on(async {
            let client = reqwest::Client::builder().timeout(TIMEOUT).build()?;
            let mut request = client.request(self.method.clone(), url.clone()).bearer_auth(key.trim());
            if let Some(body) = &self.body {
                request = request.json(body);
            }
            let response = request.send().await?;
            let status = response.status();
            Ok::<_, reqwest::Error>((status, response.text().await?))
        });
        let (status, text) = match sent {
            Ok(answer) => answer,
            Err(e) => {
                let path = url.path();
                eprintln!("error: {} {path}: {}", self.method, resumable::connector::describe_send_error(e));
                return ExitCode::from(EXIT_USAGE);
            }
        };
        // The answer as one JSON line; a body that is not JSON is wrapped, not lost.
        match serde_json::from_str::<Value>(&text) {
            Ok(value) => println!("{value}"),
            Err(_) => println!("{}", json!({ "status": status.as_u16(), "body": text })),
        }
        if status.is_success() { ExitCode::SUCCESS } else { ExitCode::from(1) }
    }
}

/// Runs `resumable automations …`.
pub fn automations(command: AutomationsCommand) -> ExitCode {
    match command {
        AutomationsCommand::List { server, page } => {
            Call { query: page.query(), ..Call::new(Method::GET, &server, &["v1", "automations"]) }.run()
        }
        AutomationsCommand::Show { server, id } => Call::new(Method::GET, &server, &["v1", "automations", &id]).run(),
        AutomationsCommand::Cancel { server, id } => {
            Call { body: Some(json!({})), ..Call::new(Method::POST, &server, &["v1", "automations", &id, "cancel"]) }
                .run()
        }
    }
}

/// Runs `resumable approvals …`.
pub fn approvals(command: ApprovalsCommand) -> ExitCode {
    match command {
        ApprovalsCommand::List { server } => Call::new(Method::GET, &server, &["v1", "approvals"]).run(),
        ApprovalsCommand::Decide { server, id, decisions, reason } => {
            let decisions: Vec<Value> = decisions
                .iter()
                .map(|(interruption, approved)| {
                    json!({ "interruptionId": interruption, "approved": approved, "reason": reason })
                })
                .collect();
            let path = ["v1", "automations", id.as_str(), "decisions"];
            Call { body: Some(json!({ "decisions": decisions })), ..Call::new(Method::POST, &server, &path) }.run()
        }
    }
}

/// Runs `resumable sessions …`.
pub fn sessions(command: SessionsCommand) -> ExitCode {
    match command {
        SessionsCommand::List { server, page } => {
            Call { query: page.query(), ..Call::new(Method::GET, &server, &["v1", "sessions"]) }.run()
        }
        SessionsCommand::Show { server, id } => Call::new(Method::GET, &server, &["v1", "sessions", &id]).run(),
        SessionsCommand::Destroy { server, id } => Call::new(Method::DELETE, &server, &["v1", "sessions", &id]).run(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_read_as_id_and_verdict() {
        assert_eq!(parse_decision("interrupt-2=true"), Ok(("interrupt-2".to_owned(), true)));
        assert_eq!(parse_decision("interrupt-3=false"), Ok(("interrupt-3".to_owned(), false)));
        assert!(parse_decision("interrupt-2").is_err());
        assert!(parse_decision("=true").is_err());
        assert!(parse_decision("interrupt-2=maybe").is_err());
    }
}
