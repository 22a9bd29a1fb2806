//! A script that must get a human's approval before it sends a newsletter.
//!
//! Run with `cargo run --example approval_cli` and answer `y` or `n`
//! (or pipe the answer: `echo y | cargo run --example approval_cli`).
//!
//! 1. The script renders the newsletter and calls `newsletter.send(subject, body)`.
//! 2. The host function does not send yet: it *interrupts* with a payload that
//!    describes the email. The run ends with a signed continuation token, which a
//!    real system would store next to the pending request.
//! 3. A human decides.
//! 4. The same script runs again with the token and the decision. Calls that had
//!    completed are replayed from the token; `newsletter.send` is called again, now
//!    with the decision in `ctx.resume()`, and sends only if it was approved.

use resumable::{HostFunctions, Outcome, Resolution, RunRequest, Runner, RunnerConfig, SignedCodec, SignedCodecConfig};
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};

/// The untrusted script. It cannot send anything by itself: only through `newsletter.send`.
const SCRIPT: &str = r#"
const items = [
  { title: "Resumable 0.1 is out", url: "https://example.com/release" },
  { title: "Writing safe host functions", url: "https://example.com/host" },
  { title: "Approvals in five minutes", url: "https://example.com/approvals" },
];
const subject = `This week: ${items.length} stories`;
const body = items.map((item, i) => `${i + 1}. ${item.title} <${item.url}>`).join("\n");
console.log(`rendered "${subject}" (${body.length} characters)`);

const receipt = await newsletter.send(subject, body);
return receipt.sent ? `sent to ${receipt.recipients} subscribers` : "not sent: the newsletter was not approved";
"#;

const SUBSCRIBERS: u64 = 1280;

/// Demo only: a constant secret, so the example needs no setup. In production, load at
/// least 32 random bytes from your secret store; whoever knows the secret can forge tokens.
const DEMO_SECRET: &[u8] = b"resumable approval_cli demo secret - do not use in production";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let host = HostFunctions::builder()
        .typed("newsletter.send", ["subject", "body"], |ctx, (subject, body): (String, String)| async move {
            match ctx.resume() {
                // First call: ask for a decision instead of sending.
                None => Err(ctx.interrupt(json!({ "subject": subject, "body": body, "recipients": SUBSCRIBERS }))),
                // Called again on resume, with the decision.
                Some(resume) if resume.resolution == json!(true) => {
                    println!("sent \"{subject}\" to {SUBSCRIBERS} subscribers");
                    Ok(json!({ "sent": true, "recipients": SUBSCRIBERS }))
                }
                Some(_) => Ok(json!({ "sent": false })),
            }
        })
        .build()?;
    // The codec signs continuations so that a script's state cannot be tampered with.
    let codec = SignedCodec::new(SignedCodecConfig::new(DEMO_SECRET))?;
    let runner = Runner::new(RunnerConfig::new().workers(1).codec(codec))?;

    // Round 1: the script runs until newsletter.send interrupts.
    let suspension = match runner.run(RunRequest::new(SCRIPT).host(host.clone())).await? {
        Outcome::Interrupted(suspension) => suspension,
        Outcome::Completed(done) => return Err(format!("expected an approval request, got {}", done.value).into()),
    };
    print_console("round 1", &suspension.console);
    for request in &suspension.interruptions {
        println!("Pending {} ({}):", request.id, request.function);
        print_payload(&request.payload);
    }

    // The decision. Reading the terminal blocks, so keep it off the async worker threads.
    let approved = tokio::task::spawn_blocking(|| ask("Send this newsletter? [y/N] ")).await??;

    // Round 2: the same source, the token, and one resolution per pending request.
    let resolutions = suspension.interruptions.iter().map(|request| Resolution::new(&request.id, json!(approved)));
    let request = RunRequest::new(SCRIPT).host(host).resume(suspension.continuation, resolutions);
    match runner.run(request).await? {
        Outcome::Completed(done) => {
            print_console("round 2", &done.console);
            println!("result: {}", done.value);
        }
        Outcome::Interrupted(_) => return Err("the script asked for approval again".into()),
    }
    Ok(())
}

/// Prints what the script logged. The source runs again on resume, so its logs repeat.
fn print_console(round: &str, console: &[resumable::ConsoleLine]) {
    for line in console {
        println!("[script, {round}] {}", line.text);
    }
}

/// Shows the email the script wants to send.
fn print_payload(payload: &Value) {
    println!("  to:      {} subscribers", payload["recipients"]);
    println!("  subject: {}", payload["subject"].as_str().unwrap_or_default());
    for line in payload["body"].as_str().unwrap_or_default().lines() {
        println!("  | {line}");
    }
}

/// Asks a yes/no question on the terminal; anything but `y`/`yes` (end of input included) is no.
fn ask(question: &str) -> std::io::Result<bool> {
    print!("{question}");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    let stdin = std::io::stdin();
    stdin.lock().read_line(&mut answer)?;
    if !stdin.is_terminal() {
        println!("{}", answer.trim()); // echo a piped answer so the transcript reads well
    }
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}
