//! The smallest embedding: one host function, one script, one result.
//!
//! Run with `cargo run --example basic`.

use resumable::{HostFunctions, Outcome, RunRequest, Runner, RunnerConfig};
use serde_json::json;

/// The untrusted script: the body of an async function, so `await` and `return` work at the top.
const SCRIPT: &str = r#"
const n = await math.double(21);
console.log("math.double(21) =", n);
return { doubled: n };
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Host functions are the script's only way out of the sandbox. `typed` decodes
    // the JSON arguments into Rust values (here one number, named `n` in error messages).
    let host = HostFunctions::builder()
        .typed("math.double", ["n"], |_ctx, (n,): (f64,)| async move { Ok(json!(n * 2.0)) })
        .build()?;

    // One runner per process: it owns the worker threads that run the sandboxes.
    let runner = Runner::new(RunnerConfig::new().workers(1))?;

    match runner.run(RunRequest::new(SCRIPT).host(host)).await? {
        Outcome::Completed(done) => {
            for line in &done.console {
                println!("[script] {}", line.text);
            }
            println!("result: {}", done.value);
        }
        Outcome::Interrupted(_) => unreachable!("math.double never interrupts"),
    }
    Ok(())
}
