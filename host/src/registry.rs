//! The registry of host functions a run may call.

use crate::name::{NameError, parse_full_name};
use crate::{FromArgs, HostCallContext, HostError, Signature};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a host function resolves to.
pub type HostResult = Result<Value, HostError>;

/// The boxed future a host function returns.
pub type HostFuture = Pin<Box<dyn Future<Output = HostResult> + Send + 'static>>;

/// A host function: JSON arguments in, JSON value (or [`HostError`]) out.
pub type HostFunction = Arc<dyn Fn(HostCallContext, Vec<Value>) -> HostFuture + Send + Sync>;

/// An immutable, cheaply clonable set of namespaced host functions.
///
/// Built once with [`HostFunctions::builder`] and shared by every run that may
/// use it. Each function has a [`Signature`]; a continuation records the signatures of the
/// functions its ledger called, and resumes only where each of them is still registered with
/// the same signature (adding or removing other functions does not matter).
#[derive(Clone, Default)]
pub struct HostFunctions {
    functions: Arc<BTreeMap<String, Registered>>,
}

/// A function and the signature it was registered with.
#[derive(Clone)]
struct Registered {
    function: HostFunction,
    signature: Signature,
}

impl HostFunctions {
    /// Starts a registry.
    pub fn builder() -> HostFunctionsBuilder {
        HostFunctionsBuilder::default()
    }

    /// A registry with no functions.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Whether `full_name` (`orders.get`) is registered.
    pub fn contains(&self, full_name: &str) -> bool {
        self.functions.contains_key(full_name)
    }

    /// The function registered as `full_name`.
    pub fn get(&self, full_name: &str) -> Option<&HostFunction> {
        self.functions.get(full_name).map(|registered| &registered.function)
    }

    /// The signature `full_name` was registered with.
    pub fn signature(&self, full_name: &str) -> Option<&Signature> {
        self.functions.get(full_name).map(|registered| &registered.signature)
    }

    /// Every full name with its signature, sorted by name.
    pub fn signatures(&self) -> impl Iterator<Item = (&str, &Signature)> {
        self.functions.iter().map(|(name, registered)| (name.as_str(), &registered.signature))
    }

    /// Every full name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.functions.keys().map(String::as_str)
    }

    /// Namespaces with their function names, both sorted.
    pub fn namespaces(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for name in self.functions.keys() {
            if let Some((namespace, function)) = name.split_once('.') {
                out.entry(namespace).or_default().push(function);
            }
        }
        out
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// True when there are no functions.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// Calls `full_name`; an unknown name fails with a message listing what exists.
    pub fn call(&self, full_name: &str, ctx: HostCallContext, args: Vec<Value>) -> HostFuture {
        match self.functions.get(full_name) {
            Some(registered) => (registered.function)(ctx, args),
            None => {
                let err = HostError::new(self.unknown_function_message(full_name));
                Box::pin(async move { Err(err) })
            }
        }
    }

    /// "unknown host function x.y; available: a.b, a.c" (or "none are available").
    pub fn unknown_function_message(&self, full_name: &str) -> String {
        unknown_function_message(full_name, self.names())
    }
}

impl fmt::Debug for HostFunctions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// The message for a call of `full_name`, which is not among `available`.
pub fn unknown_function_message<'a>(full_name: &str, available: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = available.collect();
    if names.is_empty() {
        format!("unknown host function {full_name}; none are available to this run")
    } else {
        format!("unknown host function {full_name}; available: {}", names.join(", "))
    }
}

/// Collects host functions; names are checked by [`build`](HostFunctionsBuilder::build).
#[derive(Default)]
pub struct HostFunctionsBuilder {
    functions: BTreeMap<String, Registered>,
    errors: Vec<NameError>,
}

impl HostFunctionsBuilder {
    /// Registers a function taking raw JSON arguments, without a declared parameter list
    /// ([`Signature::untyped`]).
    pub fn function<F, Fut>(self, full_name: &str, function: F) -> Self
    where
        F: Fn(HostCallContext, Vec<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HostResult> + Send + 'static,
    {
        self.function_with_signature(full_name, Signature::untyped(), function)
    }

    /// Registers a function taking raw JSON arguments whose parameters `signature` declares
    /// (for one that checks its arguments itself, or that wraps another function and keeps
    /// its signature).
    pub fn function_with_signature<F, Fut>(mut self, full_name: &str, signature: Signature, function: F) -> Self
    where
        F: Fn(HostCallContext, Vec<Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HostResult> + Send + 'static,
    {
        let function: HostFunction = Arc::new(move |ctx, args| Box::pin(function(ctx, args)));
        self.insert(full_name, Registered { function, signature });
        self
    }

    /// Registers a function with typed arguments.
    ///
    /// `arg_names` names each element of the tuple `A`, so a bad call is refused
    /// with a catchable `RUN_HOST_FUNCTION_ERROR` such as
    /// `orders.refund: argument 2 (amount): invalid type: string "10", expected u64`.
    /// The names, in order, are the function's signature ([`Signature::named`]): renaming,
    /// adding or reordering them stops paused runs that called it from resuming.
    pub fn typed<A, F, Fut, const N: usize>(mut self, full_name: &str, arg_names: [&str; N], function: F) -> Self
    where
        A: FromArgs,
        F: Fn(HostCallContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HostResult> + Send + 'static,
    {
        if N != A::ARITY {
            self.errors.push(NameError {
                name: full_name.to_string(),
                reason: format!("declares {N} argument name(s) but takes {} argument(s)", A::ARITY),
            });
            return self;
        }
        let signature = Signature::named(&arg_names);
        let names: Arc<[String]> = arg_names.iter().map(|s| s.to_string()).collect();
        let label: Arc<str> = full_name.into();
        let function = Arc::new(function);
        let wrapped: HostFunction = Arc::new(move |ctx, args| match A::from_args(args, &names) {
            Ok(decoded) => Box::pin(function(ctx, decoded)),
            Err(msg) => {
                let err = HostError::new(format!("{label}: {msg}"));
                Box::pin(async move { Err(err) })
            }
        });
        self.insert(full_name, Registered { function: wrapped, signature });
        self
    }

    fn insert(&mut self, full_name: &str, registered: Registered) {
        if let Err(err) = parse_full_name(full_name) {
            self.errors.push(err);
        } else if self.functions.insert(full_name.to_string(), registered).is_some() {
            self.errors.push(NameError { name: full_name.to_string(), reason: "registered twice".into() });
        }
    }

    /// Checks every name and freezes the set; the first bad name is the error.
    pub fn build(self) -> Result<HostFunctions, NameError> {
        match self.errors.into_iter().next() {
            Some(err) => Err(err),
            None => Ok(HostFunctions { functions: Arc::new(self.functions) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CancelSignal;
    use serde_json::json;

    fn ctx(name: &str) -> HostCallContext {
        HostCallContext::new("run", name, 1, None, CancelSignal::new())
    }

    #[tokio::test]
    async fn typed_functions_decode_and_refuse() {
        let host = HostFunctions::builder()
            .typed("orders.refund", ["order_id", "amount"], |_, (id, amount): (String, u64)| async move {
                Ok(json!({ "id": id, "amount": amount }))
            })
            .build()
            .unwrap();
        let ok = host.call("orders.refund", ctx("orders.refund"), vec![json!("o1"), json!(10)]).await;
        assert_eq!(ok.unwrap(), json!({ "id": "o1", "amount": 10 }));
        let err = host.call("orders.refund", ctx("orders.refund"), vec![json!("o1"), json!("10")]).await;
        let HostError::Failed(failure) = err.unwrap_err() else { panic!() };
        assert!(failure.message.contains("argument 2 (amount)"), "{}", failure.message);
        let err = host.call("orders.nope", ctx("orders.nope"), vec![]).await.unwrap_err();
        assert_eq!(err.to_string(), "unknown host function orders.nope; available: orders.refund");
    }

    #[test]
    fn functions_keep_the_signature_they_were_registered_with() {
        let noop = |_: HostCallContext, _: Vec<Value>| async { Ok(Value::Null) };
        let declared = Signature::of(&json!([{ "name": "id", "schema": { "type": "string" } }]));
        let host = HostFunctions::builder()
            .typed("orders.refund", ["order_id", "amount"], |_, (_id, _n): (String, u64)| async { Ok(Value::Null) })
            .function("orders.list", noop)
            .function_with_signature("orders.get", declared.clone(), noop)
            .build()
            .unwrap();
        assert_eq!(host.signature("orders.refund"), Some(&Signature::named(&["order_id", "amount"])));
        assert_eq!(host.signature("orders.list"), Some(&Signature::untyped()));
        assert_eq!(host.signature("orders.get"), Some(&declared));
        assert_eq!(host.signature("orders.nope"), None);
        let names: Vec<&str> = host.signatures().map(|(name, _)| name).collect();
        assert_eq!(names, ["orders.get", "orders.list", "orders.refund"]);
    }

    #[test]
    fn build_reports_bad_names_and_duplicates() {
        let noop = |_: HostCallContext, _: Vec<Value>| async { Ok(Value::Null) };
        let err = HostFunctions::builder().function("Math.random", noop).build().unwrap_err();
        assert!(err.to_string().contains("Math.random"));
        let err = HostFunctions::builder().function("a.b", noop).function("a.b", noop).build().unwrap_err();
        assert!(err.to_string().contains("registered twice"));
        let err = HostFunctions::builder()
            .typed("a.b", ["x"], |_, (_x, _y): (u8, u8)| async { Ok(Value::Null) })
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("declares 1"));
        let host = HostFunctions::builder().function("b.z", noop).function("a.y", noop).build().unwrap();
        assert_eq!(host.names().collect::<Vec<_>>(), ["a.y", "b.z"]);
        assert_eq!(host.namespaces().into_iter().collect::<Vec<_>>(), [("a", vec!["y"]), ("b", vec!["z"])]);
    }
}
