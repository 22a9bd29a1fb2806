//! The workflows an engine can execute, by name.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use crate::context::WorkflowContext;
use crate::error::WorkflowError;
use crate::store::BoxFuture;

/// A registered workflow function, type-erased.
pub type WorkflowFn =
    Arc<dyn Fn(WorkflowContext, Value) -> BoxFuture<'static, Result<Value, WorkflowError>> + Send + Sync>;

/// Workflow functions by name.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    map: HashMap<String, WorkflowFn>,
}

impl Registry {
    /// Registers (or replaces) a workflow.
    pub(crate) fn insert<F, Fut>(&mut self, name: impl Into<String>, f: F)
    where
        F: Fn(WorkflowContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, WorkflowError>> + Send + 'static,
    {
        let f: WorkflowFn = Arc::new(move |ctx, input| Box::pin(f(ctx, input)));
        self.map.insert(name.into(), f);
    }

    /// The workflow of this name.
    pub(crate) fn get(&self, name: &str) -> Option<WorkflowFn> {
        self.map.get(name).cloned()
    }

    /// The registered names, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.map.keys().cloned().collect();
        names.sort();
        names
    }
}
