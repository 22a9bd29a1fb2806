//! Decoding a call's JSON arguments into typed Rust values.

use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;

/// Why a call's arguments could not be decoded.
#[derive(Debug)]
#[non_exhaustive]
pub enum ArgsError {
    /// More arguments than the function takes.
    TooMany {
        /// How many it takes.
        arity: usize,
        /// How many it got.
        got: usize,
        /// The names of its arguments.
        names: Vec<String>,
    },
    /// The argument at `position` (from 0), named `name`, has the wrong type or shape.
    Invalid {
        /// Its position, from 0.
        position: usize,
        /// Its name.
        name: String,
        /// What serde said.
        source: serde_json::Error,
    },
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::TooMany { arity, got, names } => {
                write!(f, "takes {arity} argument(s) ({}), got {got}", names.join(", "))
            }
            ArgsError::Invalid { position, name, source } => write!(f, "argument {} ({name}): {source}", position + 1),
        }
    }
}

impl std::error::Error for ArgsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArgsError::Invalid { source, .. } => Some(source),
            ArgsError::TooMany { .. } => None,
        }
    }
}

/// A tuple of argument types a typed host function takes.
///
/// Implemented for tuples of up to eight [`DeserializeOwned`] types. A missing
/// argument decodes from `null` (so `Option<T>` makes it optional); extra
/// arguments are refused.
pub trait FromArgs: Sized + Send + 'static {
    /// Number of arguments.
    const ARITY: usize;

    /// Decodes `args`; on failure names the argument by position and by `names`.
    fn from_args(args: Vec<Value>, names: &[String]) -> Result<Self, ArgsError>;
}

fn decode<T: DeserializeOwned>(value: Value, position: usize, names: &[String]) -> Result<T, ArgsError> {
    serde_json::from_value(value).map_err(|source| ArgsError::Invalid {
        position,
        name: names.get(position).cloned().unwrap_or_else(|| "?".into()),
        source,
    })
}

fn check_count(got: usize, arity: usize, names: &[String]) -> Result<(), ArgsError> {
    if got > arity {
        return Err(ArgsError::TooMany { arity, got, names: names.to_vec() });
    }
    Ok(())
}

macro_rules! impl_from_args {
    ($arity:literal; $($ty:ident),*) => {
        impl<$($ty: DeserializeOwned + Send + 'static),*> FromArgs for ($($ty,)*) {
            const ARITY: usize = $arity;

            #[allow(unused_mut, unused_variables, unused_assignments, clippy::unused_unit)]
            fn from_args(args: Vec<Value>, names: &[String]) -> Result<Self, ArgsError> {
                check_count(args.len(), $arity, names)?;
                let mut values = args.into_iter();
                let mut position = 0usize;
                Ok(($({
                    let value: $ty = decode(values.next().unwrap_or(Value::Null), position, names)?;
                    position += 1;
                    value
                },)*))
            }
        }
    };
}

impl_from_args!(0;);
impl_from_args!(1; A);
impl_from_args!(2; A, B);
impl_from_args!(3; A, B, C);
impl_from_args!(4; A, B, C, D);
impl_from_args!(5; A, B, C, D, E);
impl_from_args!(6; A, B, C, D, E, F);
impl_from_args!(7; A, B, C, D, E, F, G);
impl_from_args!(8; A, B, C, D, E, F, G, H);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn decodes_and_names_the_bad_argument() {
        let n = names(&["order_id", "amount"]);
        let ok: (String, u64) = FromArgs::from_args(vec![json!("o1"), json!(10)], &n).unwrap();
        assert_eq!(ok, ("o1".to_string(), 10));
        let err = <(String, u64)>::from_args(vec![json!("o1"), json!("10")], &n).unwrap_err().to_string();
        assert!(err.starts_with("argument 2 (amount): invalid type: string \"10\""), "{err}");
        let err = <(String, u64)>::from_args(vec![json!("o1"), json!(1), json!(2)], &n).unwrap_err().to_string();
        assert!(err.contains("got 3"), "{err}");
        let err = <(String, u64)>::from_args(vec![json!("o1")], &n).unwrap_err().to_string();
        assert!(err.contains("argument 2 (amount)"), "{err}");
        let opt: (String, Option<u64>) = FromArgs::from_args(vec![json!("o1")], &n).unwrap();
        assert_eq!(opt.1, None);
    }
}
