//! `resumable inspect TOKEN`: verify a continuation and show what it waits for.

use super::usage_error;
use clap::Args;
use resumable::runner::ContinuationCodec;
use resumable::runner::codec::SealedCodec;
use resumable::{SignedCodec, SignedCodecConfig};
use std::path::PathBuf;
use std::process::ExitCode;

/// Environment variable holding the continuation secret.
pub const SECRET_ENV: &str = "RESUMABLE_SECRET";

const INSPECT_AFTER_HELP: &str = "\
The secret comes from --secret-file, or else from the RESUMABLE_SECRET environment variable;
it is never printed. Output: one JSON line, for example
  {\"status\":\"valid\",\"continuation\":{\"logical_run_id\":\"run_…\",\"audience\":\"default\",\"issued_at\":…,\"expires_at\":…,\"interruptions\":[…]}}
  {\"status\":\"rejected\",\"error\":{\"code\":\"RUN_PROTOCOL_ERROR\",\"message\":\"…\"}}

Exit status: 0 valid, 1 rejected, 2 usage error (no secret, unreadable secret file).";

/// Arguments of `resumable inspect`.
#[derive(Debug, Args)]
#[command(after_help = INSPECT_AFTER_HELP)]
pub struct InspectArgs {
    /// The continuation token.
    #[arg(value_name = "TOKEN")]
    token: String,

    /// A file whose whole content (a trailing newline removed) is the secret.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
}

/// Verifies the token and prints its pending interruptions, expiry and run id.
pub fn execute(args: InspectArgs) -> ExitCode {
    let secret = match read_secret(args.secret_file.as_deref()) {
        Ok(secret) => secret,
        Err(message) => return usage_error(message),
    };
    let config = SignedCodecConfig::new(secret);
    let codecs = match (SignedCodec::new(config.clone()), SealedCodec::new(config)) {
        (Ok(signed), Ok(sealed)) => [ContinuationCodec::from(signed), ContinuationCodec::from(sealed)],
        (Err(err), _) | (_, Err(err)) => return usage_error(err),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(runtime) => runtime,
        Err(err) => return usage_error(format_args!("cannot start the async runtime: {err}")),
    };
    // A signed token has three parts (header.state.mac), a sealed one two (header.sealed).
    let token = args.token.trim();
    let codec = if token.split('.').count() == 2 { &codecs[1] } else { &codecs[0] };
    let inspected = runtime.block_on(codec.inspect(token));
    let (line, status) = match inspected {
        Ok(seen) => (serde_json::json!({ "status": "valid", "continuation": seen }), 0),
        Err(err) => {
            (serde_json::json!({ "status": "rejected", "error": { "code": err.code, "message": err.message } }), 1)
        }
    };
    println!("{line}");
    ExitCode::from(status)
}

/// The secret in `secret_file` (its whole content, a trailing newline removed), or else in
/// [`SECRET_ENV`].
pub fn read_secret(secret_file: Option<&std::path::Path>) -> Result<Vec<u8>, String> {
    let secret = match secret_file {
        Some(path) => {
            std::fs::read(path).map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?
        }
        None => std::env::var(SECRET_ENV)
            .map_err(|_| format!("no secret: pass --secret-file or set {SECRET_ENV}"))?
            .into_bytes(),
    };
    let trimmed = secret.strip_suffix(b"\n").unwrap_or(&secret);
    Ok(trimmed.strip_suffix(b"\r").unwrap_or(trimmed).to_vec())
}
