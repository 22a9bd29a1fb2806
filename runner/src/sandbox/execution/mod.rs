//! One run inside one fresh realm: the host-call bridge, replay and the event loop.
//!
//! Ordering rules that make replay exact:
//! * every settle (recorded or live) happens only when the job queue is empty,
//!   one settle at a time, followed by draining the queue again;
//! * recorded settles are applied in their recorded order, and no host
//!   function runs until all of them have been applied and every recorded call
//!   has been matched (so a diverging script fails before any effect);
//! * the logical clock moves to the settle's recorded time at each settle.

use super::console::ConsoleBuffer;
use super::engine::{Engine, GC_HEADROOM, Realm, RealmShared};
use super::interrupt::RunGuard;
use super::js::{self, Bytecode};
use super::serialize::{ClassIds, Mode, SerializeError, Serializer, js_string};
use super::stack_guard::{StackGuard, stack_pointer};
use crate::determinism::{SeededRandom, wall_clock_ms};
use crate::error::{ErrorCode, RunError};
use crate::event::{CallSettlement, EventSink, RunEvent};
use crate::job::{Job, RawOutcome, WorkerMessage};
use crate::ledger_feed::LedgerFeed;
use crate::limits::Limit;
use crate::link::{CallRequest, HostLink};
use crate::outcome::ConsoleLevel;
use crate::state::{CallOutcome, LedgerEntry, check_head, output_too_large, unknown_interruption};
use crate::text::{clip, truncate};
use resumable_host::{HostResult, Resume, unknown_function_message};
use rquickjs::function::Rest;
use rquickjs::promise::PromiseState;
use rquickjs::{Ctx, Function, Object, Promise, Value, qjs};
use serde_json::Value as Json;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// Room beyond twice the stack limit before the engine's own check refuses a frame.
const ENGINE_STACK_SLACK: usize = 1024 * 1024;
/// Longest text of one console argument.
const CONSOLE_ARGUMENT_BYTES: usize = 16 * 1024;

pub(crate) fn execute(engine: &mut Engine, job: &mut Job) -> Result<RawOutcome, RunError> {
    let started = Instant::now();
    let deadline = started + job.run.limits.timeout();
    engine.configure_cache(job.run.cache);
    let (code, lookup) = engine.bytecode(&job.run.source, &job.run.source_hash)?;
    job.lookup = Some(lookup);
    engine.begin_run();
    let realm = &engine.realm;

    let stack_size = job.run.limits.usize(Limit::Stack);
    let runtime = realm.context.get_runtime_ptr();
    // The engine's own check sits at twice the limit plus room for one huge
    // frame; the script's limit is the guard band, which any frame crossing
    // it writes to, caught or not. SAFETY: the worker thread's stack is four
    // times the largest JS stack, and the band lies below this frame.
    let stack = unsafe {
        qjs::JS_UpdateStackTop(runtime);
        qjs::JS_SetMaxStackSize(runtime, (2 * stack_size + ENGINE_STACK_SLACK) as _);
        StackGuard::paint(stack_pointer() - stack_size)
    };
    engine.guard.arm(deadline, job.run.limits.cpu_time(), job.abort.clone(), stack);
    // The engine is ready; the script waits for the continuation's head.
    if let Err(error) = take_over_continuation(job, deadline) {
        engine.guard.disarm();
        return Err(error);
    }
    realm.shared.clock.set(job.run.replay.start_clock);
    *realm.shared.rng.borrow_mut() = SeededRandom::new(job.run.replay.seed);
    let budget = job.run.limits.usize(Limit::Memory);
    // Garbage the script makes is collected well inside its budget, so that
    // garbage never looks like the script's memory.
    engine.runtime.set_gc_threshold(engine.meter.used() + (budget / 2).min(GC_HEADROOM));
    engine.meter.start_budget(budget);
    // The budget bounds the heap's extent as well as the bytes in use, so gaps between blocks
    // cannot make a run resident beyond its limit.
    engine.confine_heap(budget);

    let outcome = run_in_realm(realm, engine.guard.clone(), engine.classes, job, &code, deadline);

    // Jobs left in the queue, a latched limit and everything else the run did
    // are undone when the engine restores the realm's image (`Engine::reset`);
    // after a panic in a native the worker replaces the engine instead.
    engine.poisoned |= realm.shared.panicked.replace(false);
    engine.meter.lift();
    engine.guard.disarm();
    outcome
}

fn run_in_realm(
    realm: &Realm,
    guard: Rc<RunGuard>,
    classes: ClassIds,
    job: &mut Job,
    code: &Bytecode,
    deadline: Instant,
) -> Result<RawOutcome, RunError> {
    realm.context.with(|ctx| {
        let helpers = realm.helpers.clone().restore(&ctx).map_err(engine_error)?;
        let env = Rc::new(RunEnv::new(job, guard, classes, realm.shared.clone(), &helpers, deadline)?);
        let serving = realm.shared.current.serve(&env);
        let job = &*job;
        let result = install(&ctx, &env, &helpers)
            .and_then(|()| Driver { ctx: ctx.clone(), env: env.clone(), job }.run(code, deadline));
        drop(serving);
        env.finish();
        result
    })
}

/// The run a realm's dispatching natives serve. The natives are part of the
/// realm's image and own no Rust state of any run: they find the run here,
/// set only while its script can execute.
#[derive(Default)]
pub(crate) struct CurrentRun(Cell<*const ()>);

/// Clears [`CurrentRun`] when the run ends, however it ends.
struct Serving<'a>(&'a CurrentRun);

impl CurrentRun {
    fn serve<'a>(&'a self, env: &Rc<RunEnv<'_>>) -> Serving<'a> {
        self.0.set(Rc::as_ptr(env).cast());
        Serving(self)
    }

    /// The run being served, if any.
    ///
    /// The pointer is set by [`CurrentRun::serve`] from a `RunEnv` of this
    /// realm's context that outlives the `Serving` guard, and natives run
    /// only inside that context while the guard exists; `'js` names the same
    /// context there.
    fn env<'js>(&self) -> Option<&RunEnv<'js>> {
        let env = self.0.get().cast::<RunEnv<'js>>();
        // SAFETY: see above.
        unsafe { env.as_ref() }
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.0.set(std::ptr::null());
    }
}

/// Runs the body of a dispatching native for the run being served (none is: an uncatchable
/// error), without letting a panic out (see [`without_panics`]).
fn serve_native<'js, R>(
    ctx: &Ctx<'js>,
    realm: &RealmShared,
    body: impl FnOnce(&RunEnv<'js>) -> rquickjs::Result<R>,
) -> rquickjs::Result<R> {
    let env: Option<&RunEnv<'js>> = realm.current.env();
    let Some(env) = env else { return Err(js::throw_uncatchable(ctx, "no run is active")) };
    without_panics(ctx, realm, || body(env))
}

/// Runs the body of a native. A panic in it ends the run with an internal error and marks the
/// realm for replacement: left to rquickjs, the panic would wait outside the heap, which a
/// restore does not reset, and surface in a later run.
fn without_panics<'js, R>(
    ctx: &Ctx<'js>,
    realm: &RealmShared,
    body: impl FnOnce() -> rquickjs::Result<R>,
) -> rquickjs::Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|_| {
        realm.panicked.set(true);
        let env: Option<&RunEnv<'js>> = realm.current.env();
        if let Some(env) = env {
            env.guard.latch(RunError::internal("the runner failed while serving the script"));
        }
        Err(js::throw_uncatchable(ctx, "the runner failed while serving the script"))
    })
}

/// Adds the natives that serve every run (`hostCall`, `consoleWrite`,
/// `unknownFunction`) to `natives`, for the hardening script to wrap.
pub(crate) fn add_dispatchers<'js>(
    ctx: &Ctx<'js>,
    natives: &Object<'js>,
    shared: &Rc<RealmShared>,
) -> rquickjs::Result<()> {
    let realm = shared.clone();
    let host = Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
        serve_native(&ctx, &realm, |env| {
            let mut args = args.0;
            let function = args.first().and_then(Value::as_int).and_then(|i| env.functions.get(i as usize));
            let Some(function) = function else { return Err(js::throw_uncatchable(&ctx, "unknown host function")) };
            args.remove(0);
            host_call(&ctx, env, function, args)
        })
    })?;
    natives.set("hostCall", host.with_name("hostCall")?)?;
    let realm = shared.clone();
    let console = Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
        serve_native(&ctx, &realm, |env| {
            let level = match args.0.first().and_then(Value::as_int) {
                Some(1) => ConsoleLevel::Info,
                Some(2) => ConsoleLevel::Warn,
                Some(3) => ConsoleLevel::Error,
                _ => ConsoleLevel::Log,
            };
            console_write(&ctx, env, level, args.0.get(1..).unwrap_or_default());
            Ok(())
        })
    })?;
    natives.set("consoleWrite", console.with_name("consoleWrite")?)?;
    let realm = shared.clone();
    let unknown = Function::new(ctx.clone(), move |ctx: Ctx<'js>, name: Value<'js>| -> rquickjs::Result<()> {
        serve_native(&ctx, &realm, |env| {
            counted_attempt(&ctx, env)?;
            let name = js_string(ctx.as_raw().as_ptr(), name.as_raw()).unwrap_or_default();
            let message = unknown_function_message(&name, env.functions.iter().map(String::as_str));
            let error = env.our_error(&ctx, ErrorCode::HostFunctionError, message, None)?;
            Err(ctx.throw(error))
        })
    })?;
    natives.set("unknownFunction", unknown.with_name("unknownFunction")?)?;
    Ok(())
}

fn engine_error(e: rquickjs::Error) -> RunError {
    RunError::internal(format!("engine: {e}"))
}

/// Everything the natives of one run share.
struct RunEnv<'js> {
    guard: Rc<RunGuard>,
    shared: Rc<RealmShared>,
    classes: ClassIds,
    /// Realm functions the runner calls natively; dropped in `finish` to break cycles.
    realm_functions: RefCell<Option<RealmFunctions<'js>>>,
    link: HostLink,
    functions: Arc<[String]>,
    deadline: Instant,
    logical_run_id: Arc<str>,
    can_interrupt: bool,
    max_calls: u32,
    max_in_flight: usize,
    argument_bytes: usize,
    output_bytes: usize,
    /// Where live events go, when someone listens.
    events: Option<Box<dyn EventSink>>,
    bridge: RefCell<Bridge<'js>>,
}

/// Original intrinsics captured by the hardening script.
#[derive(Clone)]
struct RealmFunctions<'js> {
    date_to_iso: Function<'js>,
    error_stack: Option<Function<'js>>,
}

/// Mutable bookkeeping of the host-call bridge.
struct Bridge<'js> {
    /// The recorded calls received so far, then the live ones.
    ledger: Vec<LedgerEntry>,
    /// The recorded calls still being decoded, until all have arrived.
    feed: Option<LedgerFeed>,
    recorded: usize,
    /// Call index for each recorded settle order; 0 while not received.
    recorded_settles: Vec<u32>,
    replaying: bool,
    resolutions: HashMap<u32, Json>,
    calls_made: u32,
    attempts: u32,
    next_settle: u32,
    /// The settle functions of the calls made and not settled yet, by call index.
    promises: BTreeMap<u32, (Function<'js>, Function<'js>)>,
    held: Vec<u32>,
    /// Live calls the script made that have not started: a call starts only once the script's
    /// jobs have run and the run is still pending, so a call nobody awaits when the script
    /// returns never runs.
    requested: Vec<u32>,
    ready: VecDeque<(u32, HostResult, Option<f64>)>,
    in_flight: usize,
    interrupted: BTreeSet<u32>,
    our_errors: Vec<OurError<'js>>,
    console: ConsoleBuffer,
}

impl Bridge<'_> {
    /// Appends recorded calls that have arrived.
    fn absorb(&mut self, entries: Vec<LedgerEntry>) {
        for entry in entries {
            let index = self.ledger.len() as u32 + 1;
            match entry.settle_order {
                // The decoder checks that the orders number the settles; until its verdict,
                // an order out of range is left for it to report.
                Some(order) => {
                    if let Some(slot) = self.recorded_settles.get_mut(order as usize) {
                        *slot = index;
                    }
                }
                None => {
                    self.interrupted.insert(index);
                }
            }
            self.ledger.push(entry);
        }
    }

    /// Takes in recorded calls from the feed until `enough` holds or all have arrived (and the
    /// state was found valid).
    fn pull(&mut self, deadline: Instant, enough: impl Fn(&Self) -> bool) -> Result<(), RunError> {
        while !enough(self) {
            let Some(feed) = &mut self.feed else { return Ok(()) };
            match feed.next(deadline)? {
                Some(entries) => self.absorb(entries),
                None => self.feed = None,
            }
        }
        Ok(())
    }

    /// The call index of recorded settle `order`, once its entry has arrived.
    fn recorded_settle(&self, order: usize) -> Option<u32> {
        self.recorded_settles.get(order).copied().filter(|&index| index != 0)
    }
}

/// An error object the runner created; only these carry reserved codes.
struct OurError<'js> {
    object: Value<'js>,
    code: ErrorCode,
    message: String,
}

impl<'js> RunEnv<'js> {
    /// Takes the recorded ledger and resolutions out of `job`.
    fn new(
        job: &mut Job,
        guard: Rc<RunGuard>,
        classes: ClassIds,
        shared: Rc<RealmShared>,
        helpers: &Object<'js>,
        deadline: Instant,
    ) -> Result<Self, RunError> {
        let date_to_iso: Function = helpers.get("dateToISOString").map_err(engine_error)?;
        let error_stack: Option<Function> = helpers.get("errorStack").map_err(engine_error)?;
        let decoded = std::mem::take(&mut job.run.replay.ledger);
        let (feed, recorded) = match job.run.replay.streamed.take() {
            Some(streamed) => (Some(streamed.feed), streamed.count),
            None => (None, decoded.len()),
        };
        let resolutions = std::mem::take(&mut job.run.replay.resolutions);
        let replay = &job.run.replay;
        let limits = &job.run.limits;
        let mut bridge = Bridge {
            recorded,
            replaying: recorded > 0,
            ledger: Vec::with_capacity(recorded),
            feed,
            recorded_settles: vec![0; recorded],
            resolutions,
            calls_made: 0,
            attempts: 0,
            next_settle: 0,
            promises: BTreeMap::new(),
            held: Vec::new(),
            requested: Vec::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            interrupted: BTreeSet::new(),
            our_errors: Vec::new(),
            console: ConsoleBuffer::new(limits.usize(Limit::Console)),
        };
        bridge.absorb(decoded);
        Ok(RunEnv {
            guard,
            shared,
            classes,
            realm_functions: RefCell::new(Some(RealmFunctions { date_to_iso, error_stack })),
            link: job.link.take().ok_or_else(|| RunError::internal("the run has no host link"))?,
            functions: job.run.functions.clone(),
            deadline,
            logical_run_id: replay.logical_run_id.clone(),
            can_interrupt: job.run.can_interrupt,
            max_calls: limits.get(Limit::HostCalls) as u32,
            max_in_flight: limits.usize(Limit::HostCallsInFlight),
            argument_bytes: limits.usize(Limit::HostCallArguments),
            output_bytes: limits.usize(Limit::HostCallOutput),
            events: job.events.take(),
            bridge: RefCell::new(bridge),
        })
    }

    /// Ends the run: stops host work still running and drops every script value.
    fn finish(&self) {
        let mut bridge = self.bridge.borrow_mut();
        self.link.finish(bridge.in_flight > 0);
        bridge.promises.clear();
        bridge.our_errors.clear();
        bridge.ready.clear();
        self.realm_functions.borrow_mut().take();
    }

    /// Reports a live event made by `event`, which runs only when someone listens.
    fn emit(&self, event: impl FnOnce() -> RunEvent) {
        if let Some(sink) = &self.events {
            sink.emit(event());
        }
    }

    /// Records `error` as the run's end and throws past every `catch`.
    fn fatal(&self, ctx: &Ctx<'js>, error: RunError) -> rquickjs::Error {
        let message = error.message.clone();
        self.guard.latch(error);
        js::throw_uncatchable(ctx, &message)
    }

    /// A catchable error object with a reserved `code`, remembered as ours.
    fn our_error(
        &self,
        ctx: &Ctx<'js>,
        code: ErrorCode,
        message: String,
        details: Option<&str>,
    ) -> rquickjs::Result<Value<'js>> {
        let name = match code {
            ErrorCode::SerializationError => "SerializationError",
            _ => "HostFunctionError",
        };
        let details = details.and_then(|d| js::parse_json(ctx, d));
        let object = js::new_error(ctx, name, code.as_str(), &message, details).ok_or(rquickjs::Error::Exception)?;
        self.bridge.borrow_mut().our_errors.push(OurError { object: object.clone(), code, message });
        Ok(object)
    }

    /// `None` once the run has finished (a native called after that gets an engine error).
    fn realm_functions(&self) -> Option<RealmFunctions<'js>> {
        self.realm_functions.borrow().clone()
    }

    /// Serializes `value` as JSON text under `mode`.
    fn to_json(
        &self,
        ctx: &Ctx<'js>,
        value: &Value<'js>,
        root: &str,
        mode: Mode,
        limit: usize,
    ) -> Result<String, SerializeError> {
        let functions = self.realm_functions().ok_or(SerializeError::Engine)?;
        Serializer::new(ctx, self.classes, &functions.date_to_iso, mode, limit).serialize(value, root)
    }

    fn arguments_to_json(&self, ctx: &Ctx<'js>, args: &[Value<'js>]) -> Result<String, SerializeError> {
        let functions = self.realm_functions().ok_or(SerializeError::Engine)?;
        Serializer::new(ctx, self.classes, &functions.date_to_iso, Mode::Strict, self.argument_bytes)
            .serialize_arguments(args)
    }

    /// Starts the host function of call `index` (its ledger entry is in place).
    fn start_host(&self, index: u32, resume: Option<Resume>) {
        let (function, arguments) = {
            let bridge = self.bridge.borrow();
            let entry = &bridge.ledger[index as usize - 1];
            (entry.function.clone(), entry.arguments.clone())
        };
        self.emit(|| RunEvent::CallStarted { index, name: function.clone() });
        let request = CallRequest {
            logical_run_id: &self.logical_run_id,
            index,
            function: &function,
            arguments: &arguments,
            resume,
        };
        let finished = self.link.start(request);
        let mut bridge = self.bridge.borrow_mut();
        bridge.in_flight += 1;
        if let Some(result) = finished {
            bridge.ready.push_back((index, result, None));
        }
    }

    /// Namespaces with their function names and indexes in `functions`, from the sorted full names.
    fn namespaces(&self) -> Vec<(&str, Vec<(&str, usize)>)> {
        let mut out: Vec<(&str, Vec<(&str, usize)>)> = Vec::new();
        for (index, name) in self.functions.iter().enumerate() {
            let Some((namespace, function)) = name.split_once('.') else { continue };
            match out.last_mut() {
                Some((last, members)) if *last == namespace => members.push((function, index)),
                _ => out.push((namespace, vec![(function, index)])),
            }
        }
        out
    }
}

/// Reads and checks the head of a streamed continuation (authenticated by the thread that
/// decodes it) before anything of it is used; the replay then starts from that head.
fn take_over_continuation(job: &mut Job, deadline: Instant) -> Result<(), RunError> {
    let Some(streamed) = job.run.replay.streamed.as_mut() else { return Ok(()) };
    let head = streamed.feed.head(deadline)?;
    check_head(&head, &job.run.source_hash, &job.run.scope, &job.run.limits)?;
    streamed.count = head.count;
    job.run.replay.logical_run_id = head.logical_run_id.into();
    job.run.replay.seed = head.seed;
    job.run.replay.start_clock = head.start_clock;
    Ok(())
}

/// Puts the run's host namespaces into the realm (the console is part of its image).
fn install<'js>(ctx: &Ctx<'js>, env: &Rc<RunEnv<'js>>, helpers: &Object<'js>) -> Result<(), RunError> {
    let build = || -> rquickjs::Result<()> {
        let make_namespace: Function = helpers.get("makeNamespace")?;
        for (namespace, functions) in env.namespaces() {
            let names = rquickjs::Array::new(ctx.clone())?;
            let indexes = rquickjs::Array::new(ctx.clone())?;
            for (i, (function, index)) in functions.into_iter().enumerate() {
                names.set(i, function)?;
                indexes.set(i, index as i32)?;
            }
            make_namespace.call::<_, ()>((namespace, names, indexes))?;
        }
        Ok(())
    };
    build().map_err(|e| env.guard.check().unwrap_or_else(|| engine_error(e)))
}

fn console_write<'js>(ctx: &Ctx<'js>, env: &RunEnv<'js>, level: ConsoleLevel, args: &[Value<'js>]) {
    if !env.bridge.borrow().console.accepting() {
        return;
    }
    let raw = ctx.as_raw().as_ptr();
    let mut parts = Vec::with_capacity(args.len());
    for arg in args {
        let text = if arg.is_string() {
            truncate(js_string(raw, arg.as_raw()).unwrap_or_default(), CONSOLE_ARGUMENT_BYTES)
        } else if arg.is_undefined() {
            "undefined".to_string()
        } else {
            env.to_json(ctx, arg, "console", Mode::Lenient, CONSOLE_ARGUMENT_BYTES)
                .unwrap_or_else(|_| "[value too large to print]".into())
        };
        parts.push(text);
    }
    let mut bridge = env.bridge.borrow_mut();
    if let Some(line) = bridge.console.push(level, parts.join(" ")) {
        env.emit(|| RunEvent::Console { level: line.level, text: line.text.clone() });
    }
}

/// Counts one use of the bridge against the host-call limit.
fn counted_attempt<'js>(ctx: &Ctx<'js>, env: &RunEnv<'js>) -> rquickjs::Result<()> {
    let attempts = {
        let mut bridge = env.bridge.borrow_mut();
        bridge.attempts += 1;
        bridge.attempts
    };
    if attempts > env.max_calls {
        let message = format!("the script made more than {} host calls", env.max_calls);
        return Err(env.fatal(ctx, RunError::new(ErrorCode::BridgeLimit, message)));
    }
    Ok(())
}

/// The native behind every `namespace.function(...)`.
fn host_call<'js>(
    ctx: &Ctx<'js>,
    env: &RunEnv<'js>,
    function: &str,
    args: Vec<Value<'js>>,
) -> rquickjs::Result<Value<'js>> {
    // The stack band is read only before a host function really starts: a call served from
    // the ledger has no effect, and reading the band costs more than the rest of this check.
    if env.guard.should_stop() {
        return Err(js::throw_uncatchable(ctx, "the run is stopping"));
    }
    counted_attempt(ctx, env)?;
    let arguments = match env.arguments_to_json(ctx, &args) {
        Ok(text) => text,
        Err(SerializeError::TooLarge { limit }) => {
            let message = format!("the arguments of {function} are larger than the limit of {limit} bytes");
            return Err(env.fatal(ctx, RunError::new(ErrorCode::BridgeLimit, message)));
        }
        Err(err) => {
            let error = env.our_error(
                ctx,
                ErrorCode::SerializationError,
                err.message(&format!("an argument of {function}")),
                None,
            )?;
            let (promise, _, reject) = Promise::new(ctx)?;
            reject.call::<_, ()>((error,))?;
            return Ok(promise.into_value());
        }
    };
    let (promise, resolve, reject) = Promise::new(ctx)?;
    let mut bridge = env.bridge.borrow_mut();
    let index = bridge.calls_made + 1;
    bridge.calls_made = index;
    if (index as usize) <= bridge.recorded {
        if let Err(error) = bridge.pull(env.deadline, |b| b.ledger.len() >= index as usize) {
            drop(bridge);
            return Err(env.fatal(ctx, error));
        }
        let Some(entry) = bridge.ledger.get(index as usize - 1) else {
            drop(bridge);
            return Err(env.fatal(ctx, RunError::internal("a recorded call is missing from the continuation")));
        };
        if entry.function != function || entry.arguments != arguments {
            let message = format!(
                "the script diverged from its continuation at host call {index}: recorded {}({}), now {function}({})",
                entry.function,
                clip(&entry.arguments, 200),
                clip(&arguments, 200)
            );
            drop(bridge);
            return Err(env.fatal(ctx, RunError::protocol(message)));
        }
        if matches!(entry.outcome, CallOutcome::Interrupted(_)) && bridge.resolutions.contains_key(&index) {
            // Runs again, live, once the replay has matched (reported then).
            bridge.held.push(index);
        } else {
            env.emit(|| RunEvent::CallReplayed { index, name: function.to_string() });
        }
        bridge.promises.insert(index, (resolve, reject));
        return Ok(promise.into_value());
    }
    if bridge.replaying {
        drop(bridge);
        let message = format!("the script made host call {index} ({function}), which its continuation does not record");
        return Err(env.fatal(ctx, RunError::protocol(message)));
    }
    if bridge.in_flight + bridge.requested.len() >= env.max_in_flight {
        drop(bridge);
        let message = format!("the script had more than {} host calls in flight", env.max_in_flight);
        return Err(env.fatal(ctx, RunError::new(ErrorCode::BridgeLimit, message)));
    }
    drop(bridge);
    if env.guard.should_stop_checking_stack() {
        return Err(js::throw_uncatchable(ctx, "the run is stopping"));
    }
    let mut bridge = env.bridge.borrow_mut();
    bridge.ledger.push(LedgerEntry {
        function: function.to_string(),
        arguments,
        outcome: CallOutcome::Interrupted(String::new()),
        settle_order: None,
        clock: env.shared.clock.get(),
    });
    bridge.promises.insert(index, (resolve, reject));
    bridge.requested.push(index);
    Ok(promise.into_value())
}

mod driver;
use driver::Driver;

#[cfg(test)]
mod tests {
    use super::*;

    /// A native that panics throws past the script and marks the realm for replacement;
    /// rquickjs never sees the panic (it would keep it outside the heap for a later run).
    #[test]
    fn a_panicking_native_marks_the_realm_for_replacement() {
        let engine = Engine::new().unwrap();
        let shared = engine.realm.shared.clone();
        engine.realm.context.with(|ctx| {
            let failed = without_panics(&ctx, &shared, || -> rquickjs::Result<()> { panic!("a bug in a native") });
            assert!(matches!(failed, Err(rquickjs::Error::Exception)), "{failed:?}");
            let _ = ctx.catch();
        });
        assert!(shared.panicked.get());
    }
}
