//! The trusted boundary of Resumable.
//!
//! An embedding application describes what a script may do as a set of
//! namespaced async host functions (`orders.get`, `orders.refund`). This crate
//! holds that registry, the per-call [`HostCallContext`] (run id, call index,
//! resume information, interrupts, idempotency keys, cancellation) and the
//! [`HostError`] a function returns. It knows nothing of JavaScript, so an
//! order system can implement its host functions against this crate alone.
//!
//! ```
//! use resumable_host::{HostFunctions, HostError};
//! use serde_json::json;
//!
//! let host = HostFunctions::builder()
//!     .typed("orders.refund", ["order_id", "amount"], |ctx, (order_id, amount): (String, u64)| async move {
//!         match ctx.resume() {
//!             None => Err(ctx.interrupt(json!({ "kind": "refund-approval", "orderId": order_id, "amount": amount }))),
//!             Some(resume) if resume.resolution == json!(true) => Ok(json!({ "refunded": amount })),
//!             Some(_) => Ok(json!({ "approved": false })),
//!         }
//!     })
//!     .build()
//!     .unwrap();
//! assert!(host.contains("orders.refund"));
//! ```

mod args;
mod cancel;
mod context;
mod error;
mod name;
mod registry;
mod signature;

pub use args::{ArgsError, FromArgs};
pub use cancel::CancelSignal;
pub use context::{HostCallContext, Resume};
pub use error::{HOST_FUNCTION_ERROR_CODE, HostError, HostFailure};
pub use name::{IdentifierError, NameError, is_reserved_namespace, validate_function_name, validate_identifier};
pub use registry::{
    HostFunction, HostFunctions, HostFunctionsBuilder, HostFuture, HostResult, unknown_function_message,
};
pub use signature::{Signature, canonical_json};
