//! HTTP connectors: host functions declared in the configuration file, each a signed request to
//! an application's URL, with an approval policy evaluated before anything is sent.
//!
//! A call `billing.refund("A-1002", 1500)` is mapped to the function's `params` in order and
//! validated against their JSON Schemas. When its policy requires approval the run interrupts
//! before any request; once approved the call runs again with the recorded arguments and the
//! decision, and one request is sent (retried with the call's stable idempotency key). A
//! rejected call sends nothing: the script gets `{approved: false, reason, decidedBy}`.

mod audit;
mod catalog;
mod policy;
mod request;
mod signature;

use std::sync::{Arc, RwLock};

use resumable_host::{HostCallContext, HostError, HostFunctions, Signature};
use resumable_runner::RunnerConfig;
use serde_json::{Map, Value, json};

pub use policy::Predicates;
pub use signature::{TOLERANCE_SECS, sign, verify};

use crate::audit::Audit;
use crate::config::{Approval, FunctionConfig, FunctionName, render_summary};
use request::Sender;
pub use request::describe as describe_send_error;

/// The interrupt payload's `kind` for a connector's approval request.
pub const APPROVAL_KIND: &str = "connector-approval";

/// One configured function, ready to call.
struct Connector {
    name: FunctionName,
    config: FunctionConfig,
    secret: Vec<u8>,
    validators: Vec<jsonschema::Validator>,
    /// [`FunctionConfig::signature`].
    signature: Signature,
}

/// Why the connectors could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectorError {
    /// A parameter's schema does not compile.
    #[error("{function}: parameter {param}: {message}")]
    Schema {
        /// The function.
        function: String,
        /// The parameter.
        param: String,
        /// Why.
        message: String,
    },
    /// The HTTP client could not be built.
    #[error("the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The predicates' runner could not start.
    #[error("the approval predicates' runner: {0}")]
    Predicates(#[source] resumable_runner::ConfigError),
}

/// The configured HTTP connectors, shared by every run; [`reload`](Connectors::reload) replaces
/// them all at once (rounds that started keep the set they started with).
#[derive(Clone)]
pub struct Connectors {
    current: Arc<RwLock<Arc<ConnectorSet>>>,
    /// How approval predicates run.
    predicate_runner: RunnerConfig,
}

/// Connectors built by [`Connectors::prepare`], ready to install.
pub struct PreparedConnectors(Arc<ConnectorSet>);

/// One configuration's connectors.
struct ConnectorSet {
    functions: Vec<Connector>,
    sender: Sender,
    /// The predicates' runner, when some function has a `when` policy.
    predicates: Option<Predicates>,
}

impl std::fmt::Debug for Connectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.snapshot();
        let names: Vec<&str> = set.functions.iter().map(|c| c.name.as_str()).collect();
        f.debug_struct("Connectors").field("functions", &names).finish_non_exhaustive()
    }
}

/// Who a call is made for (the request names them), and the audit log its exchanges go to.
#[derive(Clone, Debug)]
pub struct CallScope {
    /// The tenant whose script calls.
    pub tenant: String,
    /// Who submitted the automation.
    pub actor: String,
    /// Where each request is recorded before it is sent, and each attempt's outcome after it
    /// (digests of the bodies, never the bodies); `None` records nothing.
    pub audit: Option<Audit>,
}

/// A function's name and configuration with its signing secret, as the configuration file gives it.
pub type FunctionSpec = (FunctionName, FunctionConfig, Vec<u8>);

impl Connectors {
    /// Connectors for `functions`, whose approval predicates run on threads of this process.
    pub fn new(functions: Vec<FunctionSpec>) -> Result<Connectors, ConnectorError> {
        Connectors::with_predicate_runner(functions, RunnerConfig::new())
    }

    /// Connectors for `functions`, whose approval predicates run as `runner` says (the server
    /// gives them worker processes, as it does scripts).
    pub fn with_predicate_runner(
        functions: Vec<FunctionSpec>,
        runner: RunnerConfig,
    ) -> Result<Connectors, ConnectorError> {
        let set = ConnectorSet::new(functions, &runner)?;
        Ok(Connectors { current: Arc::new(RwLock::new(Arc::new(set))), predicate_runner: runner })
    }

    /// No connectors.
    pub fn none() -> Result<Connectors, ConnectorError> {
        Connectors::new(Vec::new())
    }

    /// Replaces every connector with `functions`; on an error the current ones stay.
    pub fn reload(&self, functions: Vec<FunctionSpec>) -> Result<(), ConnectorError> {
        let prepared = self.prepare(functions)?;
        self.install(prepared);
        Ok(())
    }

    /// Builds the set of `functions` without installing it (see [`install`](Connectors::install)).
    pub fn prepare(&self, functions: Vec<FunctionSpec>) -> Result<PreparedConnectors, ConnectorError> {
        Ok(PreparedConnectors(Arc::new(ConnectorSet::new(functions, &self.predicate_runner)?)))
    }

    /// Makes a prepared set the connectors of this handle and every clone.
    pub fn install(&self, prepared: PreparedConnectors) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = prepared.0;
    }

    fn snapshot(&self) -> Arc<ConnectorSet> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The functions `tenant` may call (every function for `None`), described as JSON.
    pub fn catalog(&self, tenant: Option<&str>) -> Value {
        let set = self.snapshot();
        catalog::describe(set.visible(tenant).map(|c| (&c.name, &c.config)))
    }

    /// The functions `tenant` may call (every function for `None`), declared in TypeScript.
    pub fn typescript(&self, tenant: Option<&str>) -> String {
        let set = self.snapshot();
        catalog::typescript(set.visible(tenant).map(|c| (&c.name, &c.config)))
    }

    /// The functions `scope`'s tenant may call now, each with its [`FunctionConfig::signature`].
    /// A paused round resumes with the current ones too: its continuation needs only the
    /// functions its ledger called, unchanged (else the round fails with
    /// `RUN_FUNCTION_REMOVED` or `RUN_FUNCTION_CHANGED`, naming them).
    pub fn host_functions(&self, scope: &CallScope) -> HostFunctions {
        let set = self.snapshot();
        let mut builder = HostFunctions::builder();
        for (index, connector) in set.functions.iter().enumerate() {
            if !connector.serves(&scope.tenant) {
                continue;
            }
            let (set, scope) = (Arc::clone(&set), scope.clone());
            let signature = connector.signature.clone();
            builder = builder.function_with_signature(connector.name.as_str(), signature, move |ctx, args| {
                let (set, scope) = (Arc::clone(&set), scope.clone());
                async move { set.call(index, &scope, ctx, args).await }
            });
        }
        // The names were checked when the configuration was read.
        builder.build().unwrap_or_else(|_| HostFunctions::empty())
    }
}

impl ConnectorSet {
    fn new(functions: Vec<FunctionSpec>, runner: &RunnerConfig) -> Result<ConnectorSet, ConnectorError> {
        let mut connectors = Vec::with_capacity(functions.len());
        for (name, config, secret) in functions {
            let mut validators = Vec::with_capacity(config.params.len());
            for param in &config.params {
                let validator = jsonschema::validator_for(&param.schema.0).map_err(|e| ConnectorError::Schema {
                    function: name.to_string(),
                    param: param.name.clone(),
                    message: e.to_string(),
                })?;
                validators.push(validator);
            }
            let signature = config.signature();
            connectors.push(Connector { name, config, secret, validators, signature });
        }
        let predicated = connectors.iter().any(|c| matches!(c.config.approval, Approval::When(_)));
        Ok(ConnectorSet {
            functions: connectors,
            sender: Sender::new().map_err(ConnectorError::Client)?,
            predicates: match predicated {
                true => Some(Predicates::new(runner.clone()).map_err(ConnectorError::Predicates)?),
                false => None,
            },
        })
    }

    fn visible<'a>(&'a self, tenant: Option<&'a str>) -> impl Iterator<Item = &'a Connector> + 'a {
        self.functions.iter().filter(move |c| tenant.is_none_or(|t| c.serves(t)))
    }

    /// One call of function number `index`.
    async fn call(
        &self,
        index: usize,
        scope: &CallScope,
        ctx: HostCallContext,
        args: Vec<Value>,
    ) -> Result<Value, HostError> {
        let connector = &self.functions[index];
        let name = connector.name.as_str();
        let arguments = connector.arguments(args)?;
        let decision = match ctx.resume() {
            Some(resume) => {
                if resume.payload["arguments"] != Value::Object(arguments.clone()) {
                    return Err(HostError::new(format!(
                        "{name}: this call's arguments differ from the ones that were approved"
                    )));
                }
                let decision = resume.resolution.clone();
                if decision["approved"] != Value::Bool(true) {
                    return Ok(json!({
                        "approved": false,
                        "reason": decision.get("reason").cloned().unwrap_or(Value::Null),
                        "decidedBy": decision.get("decidedBy").cloned().unwrap_or(json!([])),
                    }));
                }
                Some(decision)
            }
            None => {
                let arguments = Value::Object(arguments.clone());
                let required = match &connector.config.approval {
                    Approval::Never => false,
                    Approval::Always => true,
                    Approval::When(expression) => match &self.predicates {
                        Some(predicates) => predicates.requires_approval(name, expression, &arguments).await,
                        None => true,
                    },
                };
                if required {
                    return Err(ctx.interrupt(connector.approval_request(arguments)));
                }
                None
            }
        };
        let mut body = json!({
            "function": name,
            "arguments": arguments,
            "tenant": scope.tenant,
            "actor": scope.actor,
            "automation": ctx.logical_run_id(),
            "call": ctx.index(),
        });
        if let Some(decision) = decision {
            body["decision"] = decision;
        }
        self.sender.send(connector, &ctx, &body, scope).await
    }
}

impl Connector {
    /// Whether scripts of `tenant` have this function.
    fn serves(&self, tenant: &str) -> bool {
        self.config.tenants.as_ref().is_none_or(|tenants| tenants.iter().any(|t| t == tenant))
    }

    /// The positional `args` as named arguments, each checked against its schema.
    fn arguments(&self, args: Vec<Value>) -> Result<Map<String, Value>, HostError> {
        let name = self.name.as_str();
        let params = &self.config.params;
        if args.len() > params.len() {
            return Err(HostError::new(format!("{name} takes {} arguments, {} given", params.len(), args.len())));
        }
        let mut arguments = Map::new();
        let mut args = args.into_iter();
        for (param, validator) in params.iter().zip(&self.validators) {
            let value = args.next().unwrap_or(Value::Null);
            if let Some(error) = validator.iter_errors(&value).next() {
                return Err(HostError::new(format!("{name}: argument {}: {error}", param.name))
                    .with_details(json!({ "code": "CONNECTOR_INVALID_ARGUMENT", "param": param.name })));
            }
            arguments.insert(param.name.clone(), value);
        }
        Ok(arguments)
    }

    /// What an approver is asked to decide.
    fn approval_request(&self, arguments: Value) -> Value {
        let summary = self.config.summary.as_deref().map(|t| render_summary(t, &arguments));
        json!({
            "kind": APPROVAL_KIND,
            "function": self.name.as_str(),
            "arguments": arguments,
            "summary": summary,
            "approvers": self.config.approvers,
            "fourEyes": self.config.four_eyes,
            "quorum": self.config.quorum.map_or(1, std::num::NonZeroU32::get),
        })
    }
}
