//! Decoding a call's JSON arguments into typed Rust values.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A tuple of argument types a typed host function takes.
///
/// Implemented for tuples of up to eight [`DeserializeOwned`] types. A missing
/// argument decodes from `null` (so `Option<T>` makes it optional); extra
/// arguments are refused.
pub trait FromArgs: Sized + Send + 'static {
    /// Number of arguments.
    const ARITY: usize;

    /// Decodes `args`; on failure names the argument by position and by `names`.
    fn from_args(args: Vec<Value>, names: &[String]) -> Result<Self, String>;
}

fn decode<T: DeserializeOwned>(value: Value, position: usize, names: &[String]) -> Result<T, String> {
    serde_json::from_value(value).map_err(|err| {
        let name = names.get(position).map(String::as_str).unwrap_or("?");
        format!("argument {} ({name}): {err}", position + 1)
    })
}

fn check_count(got: usize, arity: usize, names: &[String]) -> Result<(), String> {
    if got > arity {
        return Err(format!("takes {arity} argument(s) ({}), got {got}", names.join(", ")));
    }
    Ok(())
}

macro_rules! impl_from_args {
    ($arity:literal; $($ty:ident),*) => {
        impl<$($ty: DeserializeOwned + Send + 'static),*> FromArgs for ($($ty,)*) {
            const ARITY: usize = $arity;

            #[allow(unused_mut, unused_variables, unused_assignments, clippy::unused_unit)]
            fn from_args(args: Vec<Value>, names: &[String]) -> Result<Self, String> {
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
        let err = <(String, u64)>::from_args(vec![json!("o1"), json!("10")], &n).unwrap_err();
        assert!(err.starts_with("argument 2 (amount): invalid type: string \"10\""), "{err}");
        let err = <(String, u64)>::from_args(vec![json!("o1"), json!(1), json!(2)], &n).unwrap_err();
        assert!(err.contains("got 3"), "{err}");
        let err = <(String, u64)>::from_args(vec![json!("o1")], &n).unwrap_err();
        assert!(err.contains("argument 2 (amount)"), "{err}");
        let opt: (String, Option<u64>) = FromArgs::from_args(vec![json!("o1")], &n).unwrap();
        assert_eq!(opt.1, None);
    }
}
