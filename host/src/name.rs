//! Rules for namespace and function names.

use std::fmt;

/// Longest namespace or function name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Global names of the JavaScript realm (and of common hosts) that a namespace
/// may not shadow.
const RESERVED_NAMESPACES: &[&str] = &[
    "AggregateError",
    "Array",
    "ArrayBuffer",
    "AsyncDisposableStack",
    "Atomics",
    "BigInt",
    "BigInt64Array",
    "BigUint64Array",
    "Boolean",
    "DataView",
    "Date",
    "DisposableStack",
    "DOMException",
    "Error",
    "EvalError",
    "FinalizationRegistry",
    "Float16Array",
    "Float32Array",
    "Float64Array",
    "Function",
    "Infinity",
    "Int16Array",
    "Int32Array",
    "Int8Array",
    "InternalError",
    "Intl",
    "Iterator",
    "JSON",
    "Map",
    "Math",
    "NaN",
    "Number",
    "Object",
    "Promise",
    "Proxy",
    "RangeError",
    "ReferenceError",
    "Reflect",
    "RegExp",
    "Set",
    "SharedArrayBuffer",
    "String",
    "SuppressedError",
    "Symbol",
    "SyntaxError",
    "TypeError",
    "URIError",
    "Uint16Array",
    "Uint32Array",
    "Uint8Array",
    "Uint8ClampedArray",
    "WeakMap",
    "WeakRef",
    "WeakSet",
    "WebAssembly",
    "__proto__",
    "arguments",
    "clearInterval",
    "clearTimeout",
    "console",
    "constructor",
    "decodeURI",
    "decodeURIComponent",
    "encodeURI",
    "encodeURIComponent",
    "escape",
    "eval",
    "exports",
    "fetch",
    "globalThis",
    "import",
    "isFinite",
    "isNaN",
    "module",
    "navigator",
    "parseFloat",
    "parseInt",
    "performance",
    "process",
    "prototype",
    "queueMicrotask",
    "require",
    "setInterval",
    "setTimeout",
    "structuredClone",
    "then",
    "undefined",
    "unescape",
    "window",
];

/// Function names that would change how a namespace object behaves.
const RESERVED_FUNCTIONS: &[&str] = &["__proto__", "constructor", "prototype", "then"];

/// Words a script cannot use as a bare identifier, so not as a namespace either.
const KEYWORDS: &[&str] = &[
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "implements",
    "in",
    "instanceof",
    "interface",
    "let",
    "new",
    "null",
    "package",
    "private",
    "protected",
    "public",
    "return",
    "static",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
];

/// Why a host-function name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    /// The name as given.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid host function name {:?}: {}", self.name, self.reason)
    }
}

impl std::error::Error for NameError {}

/// Why a part of a host-function name is not an identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentifierError {
    /// The part is empty.
    Empty,
    /// The part is longer than [`MAX_NAME_LEN`] bytes.
    TooLong,
    /// The part starts with something else than a letter, `_` or `$`.
    BadStart(String),
    /// The part holds a character that an identifier may not.
    BadCharacter(String, char),
}

impl fmt::Display for IdentifierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentifierError::Empty => write!(f, "empty name"),
            IdentifierError::TooLong => write!(f, "longer than {MAX_NAME_LEN} bytes"),
            IdentifierError::BadStart(part) => write!(f, "{part:?} must start with a letter, '_' or '$'"),
            IdentifierError::BadCharacter(part, bad) => {
                write!(f, "{part:?} contains {bad:?}; only letters, digits, '_' and '$' are allowed")
            }
        }
    }
}

impl std::error::Error for IdentifierError {}

/// Checks that `part` is an ASCII JavaScript identifier (`[A-Za-z_$][A-Za-z0-9_$]*`)
/// of at most [`MAX_NAME_LEN`] bytes.
pub fn validate_identifier(part: &str) -> Result<(), IdentifierError> {
    if part.is_empty() {
        return Err(IdentifierError::Empty);
    }
    if part.len() > MAX_NAME_LEN {
        return Err(IdentifierError::TooLong);
    }
    let mut chars = part.chars();
    let first = chars.next().unwrap_or('0');
    if !(first.is_ascii_alphabetic() || first == '_' || first == '$') {
        return Err(IdentifierError::BadStart(part.to_string()));
    }
    if let Some(bad) = chars.find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '$')) {
        return Err(IdentifierError::BadCharacter(part.to_string(), bad));
    }
    Ok(())
}

/// True when `namespace` names a global of the realm or a keyword.
pub fn is_reserved_namespace(namespace: &str) -> bool {
    RESERVED_NAMESPACES.contains(&namespace) || KEYWORDS.contains(&namespace)
}

/// Checks a full name `namespace.function` as [`HostFunctions`](crate::HostFunctions) would.
pub fn validate_function_name(full: &str) -> Result<(), NameError> {
    parse_full_name(full).map(drop)
}

/// Splits and validates a full name `namespace.function`.
pub(crate) fn parse_full_name(full: &str) -> Result<(String, String), NameError> {
    let fail = |reason: String| NameError { name: full.to_string(), reason };
    let Some((namespace, function)) = full.split_once('.') else {
        return Err(fail("expected `namespace.function`".into()));
    };
    validate_identifier(namespace).map_err(|r| fail(format!("namespace: {r}")))?;
    validate_identifier(function).map_err(|r| fail(format!("function: {r}")))?;
    if is_reserved_namespace(namespace) {
        return Err(fail(format!("namespace {namespace:?} is reserved")));
    }
    if RESERVED_FUNCTIONS.contains(&function) {
        return Err(fail(format!("function name {function:?} is reserved")));
    }
    Ok((namespace.to_string(), function.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        assert_eq!(parse_full_name("orders.get").unwrap(), ("orders".into(), "get".into()));
        assert!(parse_full_name("$x._y9").is_ok());
        assert!(parse_full_name("orders.delete").is_ok(), "keywords are fine as property names");
    }

    #[test]
    fn rejects_bad_names_naming_them() {
        for bad in [
            "orders",
            "orders.",
            ".get",
            "a.b.c",
            "Math.random",
            "console.log",
            "globalThis.x",
            "eval.x",
            "Function.x",
            "Promise.x",
            "__proto__.x",
            "constructor.x",
            "then.x",
            "orders.then",
            "orders.__proto__",
            "orders.constructor",
            "orders.prototype",
            "9lives.x",
            "or-ders.get",
            "orders.g et",
            "delete.x",
            "ordérs.get",
        ] {
            let err = parse_full_name(bad).expect_err(bad);
            assert_eq!(err.name, bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
        let long = format!("{}.x", "a".repeat(MAX_NAME_LEN + 1));
        assert!(parse_full_name(&long).is_err());
    }
}
