//! Approval predicates: a `when` expression over a call's arguments, evaluated in a fresh sandbox
//! realm of a runner of its own (never in the scripts' pool, so a predicate cannot wait on a script
//! that waits on it). The server gives that runner its worker processes, so the arguments, which a
//! script chose, meet QuickJS only in a confined worker. A predicate that throws, runs out of time or gives
//! anything but `false` requires approval: it fails closed.

use resumable_host::HostFunctions;
use resumable_runner::{Limit, LimitOverrides, Outcome, RunRequest, Runner, RunnerConfig};
use serde_json::Value;

/// How long a predicate may run, in milliseconds.
const PREDICATE_TIMEOUT_MS: i128 = 100;
/// The heap a predicate may use, in bytes.
const PREDICATE_MEMORY: i128 = 8 << 20;

/// The runner that evaluates approval predicates.
#[derive(Clone, Debug)]
pub struct Predicates {
    runner: Runner,
}

impl Predicates {
    /// A runner of two workers for predicates, configured as `config` says (threads or worker
    /// processes).
    pub fn new(config: RunnerConfig) -> Result<Predicates, resumable_runner::ConfigError> {
        Ok(Predicates { runner: Runner::new(config.workers(2))? })
    }

    /// Whether `expression` over `args` requires approval: only a `false` result does not.
    pub async fn requires_approval(&self, function: &str, expression: &str, args: &Value) -> bool {
        let args = args.clone();
        let host = HostFunctions::builder()
            .function("policy.args", move |_ctx, _| {
                let args = args.clone();
                async move { Ok(args) }
            })
            .build();
        let Ok(host) = host else { return true };
        let limits = LimitOverrides::new()
            .with(Limit::Timeout, PREDICATE_TIMEOUT_MS)
            .and_then(|l| l.with(Limit::Memory, PREDICATE_MEMORY))
            .and_then(|l| l.with(Limit::HostCalls, 1));
        let Ok(limits) = limits else { return true };
        // The expression is the operator's, from the configuration; the arguments are data.
        let source = format!("const args = await policy.args();\nreturn ({expression}\n);");
        match self.runner.run(RunRequest::new(source).host(host).limits(limits)).await {
            Ok(Outcome::Completed(done)) if done.value == Value::Bool(false) => false,
            Ok(Outcome::Completed(done)) if done.value == Value::Bool(true) => true,
            Ok(other) => {
                tracing::warn!(function, outcome = ?other.completed().map(|c| &c.value), "an approval predicate gave no boolean: approval is required");
                true
            }
            Err(e) => {
                tracing::warn!(function, error = %e, "an approval predicate failed: approval is required");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn true_requires_false_does_not_and_anything_else_fails_closed() {
        let predicates = Predicates::new(RunnerConfig::new()).unwrap();
        let args = json!({ "amount": 1500 });
        assert!(predicates.requires_approval("f", "args.amount > 1000", &args).await);
        assert!(!predicates.requires_approval("f", "args.amount > 2000", &args).await);
        for closed in ["args.missing.field", "(() => { for (;;) {} })()", "'yes'", "undefined", "throw 1"] {
            assert!(predicates.requires_approval("f", closed, &args).await, "{closed}");
        }
    }
}
