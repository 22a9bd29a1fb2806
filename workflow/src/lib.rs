//! The durable workflow engine of Resumable.
//!
//! A *workflow* is a registered async Rust function of a [`WorkflowContext`] and a JSON input that
//! returns JSON. It is run again from the top every time its run wakes up and must therefore be
//! deterministic: side effects happen only inside [`WorkflowContext::step`], whose results are
//! recorded once and replayed afterwards. A workflow may suspend durably on a [`Hook`] (resumed from
//! outside with [`Engine::resume_hook`]) or on a timer ([`WorkflowContext::sleep`]), and append
//! events to its stream ([`WorkflowContext::emit`], read with [`Engine::read_stream`]); a suspended run
//! holds no memory and no worker, only rows in the [`Store`].
//!
//! Every state change is one store transaction that appends to the run's ordered event log
//! ([`Event`]); uniqueness (idempotency keys, active hook tokens) is enforced by constraints.
//! Workers claim runnable runs with a lease and fence every write by the lease attempt, so a worker
//! that lost its lease cannot overwrite a newer execution.
//!
//! ```no_run
//! use resumable_workflow::{Engine, SqliteStore, StartOptions, StepContext, WorkflowContext, WorkflowError};
//! use serde_json::{Value, json};
//!
//! async fn greet(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
//!     let name: String = ctx.step("load", |_s: StepContext| async move { Ok("world".to_owned()) }).await?;
//!     Ok(json!({ "greeting": format!("hello {name}"), "input": input }))
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open("sqlite://runs.db").await?;
//! let engine = Engine::builder(std::sync::Arc::new(store)).register("greet", greet).build();
//! let run = engine.start("greet", json!({}), StartOptions::default()).await?;
//! let info = engine.wait_for(&run, std::time::Duration::from_secs(5)).await?;
//! println!("{:?}", info.output);
//! # Ok(()) }
//! ```

// Without a backend only the engine's API is built: the store helpers have no user.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

mod changes;
mod child;
mod context;
mod engine;
mod error;
mod event;
mod execution;
mod failure_log;
mod feed;
mod hook;
mod hook_data;
mod ids;
pub mod migrations;
mod poll;
mod registry;
mod run;
mod step;
pub mod store;
mod stream;
#[doc(hidden)]
pub mod testing;
mod time;
mod worker;

pub use child::ChildRun;
pub use context::WorkflowContext;
pub use engine::{Engine, EngineBuilder, EngineOptions, WeakEngine};
pub use error::{DatabaseError, EngineError, StepError, StepFailure, StoreError, UnknownName, WorkflowError};
pub use event::{Event, EventKind};
pub use feed::FeedReader;
pub use hook::{Hook, HookInfo, ResumeReceipt};
pub use ids::RunId;
pub use registry::WorkflowFn;
pub use run::{RunCursor, RunFilter, RunInfo, RunPage, RunStatus, StartOptions};
pub use step::{RetryPolicy, StepContext};
#[cfg(feature = "postgres")]
pub use store::postgres::{PgStore, PgStoreOptions};
#[cfg(feature = "sqlite")]
pub use store::sqlite::{SqliteStore, SqliteStoreOptions};
pub use store::{FeedEntry, HookPayload};
pub use store::{Store, WakeHints};
pub use stream::StreamReader;
