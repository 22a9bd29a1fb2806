//! A host function's signature: the parameter list that a recorded call of it relies on.

use serde_json::Value;
use std::fmt;
use std::sync::Arc;

/// A host function's parameter list, in a canonical text form.
///
/// A paused run's continuation records, for each function its ledger called, a digest of this
/// text; a resume refuses to replay a call of a function whose signature is no longer the same
/// (`RUN_FUNCTION_CHANGED`). So a signature should hold what the recorded arguments are read
/// with (the parameters' names, order and types), and nothing else: a function's URL, timeout
/// or description may change under a paused run.
///
/// * [`HostFunctionsBuilder::typed`](crate::HostFunctionsBuilder::typed) registers
///   [`Signature::named`] with its argument names;
/// * [`HostFunctionsBuilder::function`](crate::HostFunctionsBuilder::function) registers
///   [`Signature::untyped`], the empty text;
/// * [`HostFunctionsBuilder::function_with_signature`](crate::HostFunctionsBuilder::function_with_signature)
///   registers any [`Signature::of`] a JSON description (an HTTP connector: each parameter's
///   name and JSON Schema).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Signature(Arc<str>);

impl Signature {
    /// No declared parameters: the empty text.
    pub fn untyped() -> Signature {
        Signature::default()
    }

    /// Positional parameters named `names`, in order: the JSON array of the names.
    pub fn named<S: AsRef<str>>(names: &[S]) -> Signature {
        Signature::of(&Value::Array(names.iter().map(|name| Value::String(name.as_ref().to_owned())).collect()))
    }

    /// The parameters `description` describes, as canonical JSON: object keys sorted, no
    /// whitespace, so that equal descriptions have equal signatures however they were built.
    pub fn of(description: &Value) -> Signature {
        Signature(canonical_json(description).into())
    }

    /// The canonical text (empty when untyped).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether no parameters are declared.
    pub fn is_untyped(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_untyped() { f.write_str("Signature(untyped)") } else { write!(f, "Signature({})", self.0) }
    }
}

/// `value` as JSON text with object keys sorted at every depth and no whitespace: the same text
/// for equal values, whatever order their maps were built in (signatures, scope hashes and the
/// audit log hash it).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    canonical(value, &mut out);
    out
}

/// Appends `value` as JSON with every object's keys sorted (whatever order the map keeps).
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signatures_are_canonical_and_tell_parameter_lists_apart() {
        assert_eq!(Signature::named(&["order_id", "amount"]).as_str(), r#"["order_id","amount"]"#);
        assert_ne!(Signature::named(&["order_id", "amount"]), Signature::named(&["amount", "order_id"]));
        assert_ne!(Signature::named::<&str>(&[]), Signature::untyped());
        assert!(Signature::untyped().is_untyped() && Signature::default().is_untyped());
        let a = json!([{ "name": "n", "schema": { "type": "integer", "minimum": 1 } }]);
        let b: Value = serde_json::from_str(r#"[{"schema":{"minimum":1,"type":"integer"},"name":"n"}]"#).unwrap();
        assert_eq!(Signature::of(&a), Signature::of(&b));
        assert_eq!(Signature::of(&a).as_str(), r#"[{"name":"n","schema":{"minimum":1,"type":"integer"}}]"#);
        assert_ne!(Signature::of(&a), Signature::of(&json!([{ "name": "n", "schema": { "type": "integer" } }])));
        assert_eq!(Signature::of(&json!(["a\"b\n"])).as_str(), r#"["a\"b\n"]"#);
    }
}
