//! What a continuation is bound to, and what a resume needs of its host functions.
//!
//! A state's scope hash binds it to the audience, the context and the source of the run that
//! made it, and (format 2) to the functions its ledger called, each with the digest of its
//! [`Signature`]. The state lists those functions; a resume checks each against the host it is
//! given: still there (else `RUN_FUNCTION_REMOVED`) with the same signature (else
//! `RUN_FUNCTION_CHANGED`). So a release that adds host functions, removes ones a paused run
//! never called, or changes what a signature leaves out (a connector's URL, timeout, summary)
//! leaves paused runs resumable.
//!
//! States of format 1, made by earlier releases, bound the sorted names of *every* host
//! function of the run instead, and list no functions: one resumes exactly where the host has
//! the same set of names as the run that made it (its hash is computed again from the names
//! the resume is given).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use resumable_host::{HostFunctions, Signature};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{ErrorCode, RunError};
use crate::state::{LedgerEntry, StateHead};

/// Domain of the scope hash of format 2.
const SCOPE_DOMAIN: &[u8] = b"resumable-scope-v2";
/// Domain of the scope hash of format 1.
const LEGACY_SCOPE_DOMAIN: &[u8] = b"resumable-scope-v1";
/// Domain of a signature's digest.
const SIGNATURE_DOMAIN: &[u8] = b"resumable-signature-v1";

/// A function a ledger called, with the digest of the signature it had then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UsedFunction {
    /// Full name.
    pub name: String,
    /// [`signature_digest`] of its signature.
    pub signature: [u8; 32],
}

/// The scope of one run: what a continuation it makes is bound to, and what one it resumes
/// must have been made for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Scope {
    /// The hash of (audience, context, source hash) that a scope hash of format 2 starts from.
    binding: [u8; 32],
    /// The scope hash of format 1 for this run (over every host-function name).
    legacy: [u8; 32],
    /// Each host function's signature digest, by full name.
    signatures: Arc<BTreeMap<String, [u8; 32]>>,
}

impl Scope {
    /// The scope of a run of the source hashed `source_hash` for `audience`, with `context`
    /// and `host`.
    pub(crate) fn new(audience: &str, host: &HostFunctions, context: &Value, source_hash: &[u8; 32]) -> Scope {
        let canonical = resumable_host::canonical_json(context);
        let binding = fields([SCOPE_DOMAIN, audience.as_bytes(), canonical.as_bytes(), source_hash]);
        let names: Vec<&str> = host.names().collect();
        let legacy = fields([
            LEGACY_SCOPE_DOMAIN,
            audience.as_bytes(),
            names.join("\n").as_bytes(),
            canonical.as_bytes(),
            source_hash,
        ]);
        let signatures = host.signatures().map(|(name, signature)| (name.to_owned(), signature_digest(signature)));
        Scope { binding, legacy, signatures: Arc::new(signatures.collect()) }
    }

    /// The functions `ledger` calls, sorted, each with its signature here: what a state of this
    /// run lists.
    ///
    /// # Errors
    ///
    /// An internal error if the ledger calls a function this run does not have (a call of an
    /// unknown function is never recorded).
    pub(crate) fn used_by(&self, ledger: &[LedgerEntry]) -> Result<Vec<UsedFunction>, RunError> {
        let names: BTreeSet<&str> = ledger.iter().map(|entry| entry.function.as_str()).collect();
        names
            .into_iter()
            .map(|name| match self.signatures.get(name) {
                Some(signature) => Ok(UsedFunction { name: name.to_owned(), signature: *signature }),
                None => Err(RunError::internal(format!("the ledger calls {name}, which the run does not have"))),
            })
            .collect()
    }

    /// The scope hash (format 2) of a state of this run whose ledger calls `functions`.
    pub(crate) fn hash(&self, functions: &[UsedFunction]) -> [u8; 32] {
        let mut h = Sha256::new();
        field(&mut h, &self.binding);
        field(&mut h, &(functions.len() as u64).to_le_bytes());
        for function in functions {
            field(&mut h, function.name.as_bytes());
            field(&mut h, &function.signature);
        }
        h.finalize().into()
    }

    /// Checks that a state's head was made for this scope and that every function its ledger
    /// calls is still here with the same signature.
    ///
    /// # Errors
    ///
    /// `RUN_PROTOCOL_ERROR` for another audience or context (or, format 1, another set of
    /// function names); `RUN_FUNCTION_REMOVED` naming the functions the ledger calls that are
    /// gone; `RUN_FUNCTION_CHANGED` naming those whose signature changed.
    pub(crate) fn check(&self, head: &StateHead) -> Result<(), RunError> {
        let Some(used) = &head.functions else {
            if head.scope_hash != self.legacy {
                return Err(RunError::protocol(
                    "continuation rejected: it was made for a different scope (audience, context or host \
                     functions; a continuation of state format 1 resumes only with the same host-function names)",
                ));
            }
            return Ok(());
        };
        if head.scope_hash != self.hash(used) {
            return Err(RunError::protocol(
                "continuation rejected: it was made for a different scope (audience or context)",
            ));
        }
        let removed: Vec<&str> =
            used.iter().filter(|f| !self.signatures.contains_key(&f.name)).map(|f| f.name.as_str()).collect();
        if !removed.is_empty() {
            return Err(RunError::new(
                ErrorCode::FunctionRemoved,
                format!(
                    "continuation rejected: the paused run called {}, which the host no longer has",
                    removed.join(", ")
                ),
            ));
        }
        let changed: Vec<&str> = used
            .iter()
            .filter(|f| self.signatures.get(&f.name) != Some(&f.signature))
            .map(|f| f.name.as_str())
            .collect();
        if !changed.is_empty() {
            return Err(RunError::new(
                ErrorCode::FunctionChanged,
                format!(
                    "continuation rejected: the parameters of {} changed since the paused run called it",
                    changed.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// The digest a state records of `signature`.
pub(crate) fn signature_digest(signature: &Signature) -> [u8; 32] {
    fields([SIGNATURE_DOMAIN, signature.as_str().as_bytes()])
}

/// SHA-256 over each of `parts`, each preceded by its length.
fn fields<const N: usize>(parts: [&[u8]; N]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in parts {
        field(&mut h, part);
    }
    h.finalize().into()
}

fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::source_hash;
    use serde_json::json;

    fn host(functions: &[(&str, Signature)]) -> HostFunctions {
        let mut builder = HostFunctions::builder();
        for (name, signature) in functions {
            builder = builder.function_with_signature(name, signature.clone(), |_, _| async { Ok(Value::Null) });
        }
        builder.build().unwrap()
    }

    fn untyped(names: &[&'static str]) -> HostFunctions {
        host(&names.iter().map(|n| (*n, Signature::untyped())).collect::<Vec<_>>())
    }

    fn head(scope_hash: [u8; 32], functions: Option<Vec<UsedFunction>>) -> StateHead {
        StateHead {
            source_hash: [0; 32],
            scope_hash,
            logical_run_id: "run".into(),
            seed: 0,
            start_clock: 0.0,
            functions,
            count: 0,
        }
    }

    fn entry(function: &str) -> LedgerEntry {
        LedgerEntry {
            function: function.into(),
            arguments: "[]".into(),
            outcome: crate::state::CallOutcome::Interrupted("null".into()),
            settle_order: None,
            clock: 0.0,
        }
    }

    /// The head of a state that `scope`'s run makes, its ledger calling `called`.
    fn made_by(scope: &Scope, called: &[&str]) -> StateHead {
        let ledger: Vec<LedgerEntry> = called.iter().map(|name| entry(name)).collect();
        let used = scope.used_by(&ledger).unwrap();
        head(scope.hash(&used), Some(used))
    }

    #[test]
    fn the_legacy_hash_is_the_hash_of_format_1() {
        // Computed by the release that made states of format 1, for this input.
        let scope = Scope::new("a", &untyped(&["t.g", "t.f"]), &json!({"k": 1}), &source_hash("x"));
        let hex: String = scope.legacy.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "b7836959402679752d62079e5abe966b7ddd9b09e1f2dbb56cd7cc34478f6f25");
    }

    #[test]
    fn the_legacy_hash_depends_on_every_name_and_the_rest() {
        let src = source_hash("x");
        let legacy = |aud: &str, names: &[&'static str], context: Value, src: &[u8; 32]| {
            Scope::new(aud, &untyped(names), &context, src).legacy
        };
        let base = legacy("a", &["t.f", "t.g"], json!({"k": 1}), &src);
        assert_eq!(base, legacy("a", &["t.g", "t.f"], json!({"k": 1}), &src));
        assert_ne!(base, legacy("b", &["t.f", "t.g"], json!({"k": 1}), &src));
        assert_ne!(base, legacy("a", &["t.f"], json!({"k": 1}), &src));
        assert_ne!(base, legacy("a", &["t.f", "t.g"], json!({"k": 2}), &src));
        assert_ne!(base, legacy("a", &["t.f", "t.g"], json!({"k": 1}), &source_hash("y")));
    }

    #[test]
    fn a_state_resumes_where_its_functions_are_unchanged_whatever_else_there_is() {
        let src = source_hash("x");
        let refund = ("t.refund", Signature::named(&["id", "amount"]));
        let scope = Scope::new("a", &host(&[refund.clone(), ("t.f", Signature::untyped())]), &json!({}), &src);
        let made = made_by(&scope, &["t.refund", "t.refund"]);
        assert_eq!(made.functions.as_ref().unwrap().len(), 1, "each function is listed once");
        let more = host(&[refund.clone(), ("t.g", Signature::untyped()), ("u.h", Signature::named(&["x"]))]);
        Scope::new("a", &more, &json!({}), &src).check(&made).unwrap();
        Scope::new("a", &host(&[refund]), &json!({}), &src).check(&made).unwrap();
    }

    #[test]
    fn another_audience_or_context_is_a_protocol_error() {
        let (src, tools) = (source_hash("x"), untyped(&["t.f"]));
        let made = made_by(&Scope::new("a", &tools, &json!({"k": 1}), &src), &["t.f"]);
        for other in [Scope::new("b", &tools, &json!({"k": 1}), &src), Scope::new("a", &tools, &json!({"k": 2}), &src)]
        {
            assert_eq!(other.check(&made).unwrap_err().code, ErrorCode::ProtocolError);
        }
        let mut forged = made.clone();
        forged.functions.as_mut().unwrap()[0].signature = [1; 32];
        let error = Scope::new("a", &tools, &json!({"k": 1}), &src).check(&forged).unwrap_err();
        assert_eq!(error.code, ErrorCode::ProtocolError, "the list is bound by the hash");
    }

    #[test]
    fn a_removed_or_changed_function_is_named() {
        let src = source_hash("x");
        let typed = |names: &[&str]| Signature::named(names);
        let scope =
            Scope::new("a", &host(&[("t.a", typed(&["x"])), ("t.b", Signature::untyped())]), &json!(null), &src);
        let made = made_by(&scope, &["t.b", "t.a"]);
        let removed = Scope::new("a", &host(&[("t.a", typed(&["x"]))]), &json!(null), &src).check(&made).unwrap_err();
        assert_eq!(removed.code, ErrorCode::FunctionRemoved);
        assert!(removed.message.contains("t.b,") || removed.message.contains("called t.b"), "{}", removed.message);
        assert!(!removed.retryable);
        let renamed = host(&[("t.a", typed(&["y"])), ("t.b", Signature::untyped())]);
        let changed = Scope::new("a", &renamed, &json!(null), &src).check(&made).unwrap_err();
        assert_eq!(changed.code, ErrorCode::FunctionChanged);
        assert!(changed.message.contains("parameters of t.a changed"), "{}", changed.message);
        let none = Scope::new("a", &HostFunctions::empty(), &json!(null), &src).check(&made).unwrap_err();
        assert_eq!(none.code, ErrorCode::FunctionRemoved);
        assert!(none.message.contains("t.a, t.b"), "{}", none.message);
    }

    #[test]
    fn a_state_of_format_1_resumes_only_with_the_same_names() {
        let src = source_hash("x");
        let scope = Scope::new("a", &untyped(&["t.f", "t.g"]), &json!({}), &src);
        let old = head(scope.legacy, None);
        scope.check(&old).unwrap();
        let typed = host(&[("t.f", Signature::named(&["x"])), ("t.g", Signature::untyped())]);
        Scope::new("a", &typed, &json!({}), &src).check(&old).expect("format 1 recorded no signatures");
        for other in [untyped(&["t.f"]), untyped(&["t.f", "t.g", "t.h"])] {
            let error = Scope::new("a", &other, &json!({}), &src).check(&old).unwrap_err();
            assert_eq!(error.code, ErrorCode::ProtocolError);
        }
    }

    #[test]
    fn used_by_refuses_a_function_the_run_does_not_have() {
        let scope = Scope::new("a", &untyped(&["t.f"]), &json!({}), &source_hash("x"));
        assert!(scope.used_by(&[entry("t.g")]).is_err());
        assert_eq!(scope.used_by(&[]).unwrap(), []);
    }

    #[test]
    fn signature_digests_tell_signatures_apart() {
        assert_ne!(signature_digest(&Signature::untyped()), signature_digest(&Signature::named::<&str>(&[])));
        assert_eq!(signature_digest(&Signature::named(&["a"])), signature_digest(&Signature::of(&json!(["a"]))));
    }
}
