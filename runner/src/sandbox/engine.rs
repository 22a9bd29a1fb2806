//! One QuickJS runtime per worker thread, with its compiler and a spare realm.
//!
//! Warm state and configuration: what a worker keeps between runs (the
//! runtime, the compiler context, the hardened spare realm, the bytecode
//! cache) depends on nothing a run can configure. Intrinsics and the hardening
//! script are fixed per build (and part of [`engine_version`]); every limit
//! that touches the runtime (stack size, memory budget, garbage-collection
//! threshold, deadlines, CPU time) is applied at the start of each run by
//! `execution::execute` and lifted after it. So one warm runtime serves runs
//! with any limits, and a run never inherits the previous run's settings.

use super::alloc::{HeapMeter, MeteredAllocator};
use super::bytecode::{BytecodeCache, CacheKey};
use super::interrupt::RunGuard;
use super::js::{self, Bytecode};
use super::serialize::ClassIds;
use crate::bytecode_cache::{BytecodeCacheConfig, CacheLookup};
use crate::determinism::SeededRandom;
use crate::error::{ErrorCode, RunError};
use crate::job::{Job, RawOutcome};
use rquickjs::context::intrinsic::{Date, Eval, Json, MapSet, Promise, Proxy, RegExp, RegExpCompiler};
use rquickjs::{Context, Function, Object, Persistent, Runtime, Value, qjs};
use sha2::{Digest, Sha256};
use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::Instant;

/// What every guest realm gets: no eval, no WeakRef, no performance, and no
/// typed arrays (values cross the boundary as JSON; leaving them out also
/// leaves out `SharedArrayBuffer` and `Atomics`, and makes a realm cheaper).
type GuestIntrinsics = (Date, RegExpCompiler, RegExp, Json, Proxy, MapSet, Promise);
/// The compiler context: it only parses (regular expressions included), and never runs guest code.
type CompilerIntrinsics = (Eval, Date, RegExpCompiler, RegExp);

const HARDEN_JS: &str = include_str!("harden.js");
/// Garbage of retired realms allowed before a collection between runs.
pub(crate) const GC_HEADROOM: usize = 4 * 1024 * 1024;
/// The rquickjs release this crate is built against (checked against `Cargo.lock` by a test).
const RQUICKJS_VERSION: &str = "0.14.0";

/// Identifies everything compiled bytecode depends on: the rquickjs and QuickJS
/// builds, this crate's version, the script wrapper, the hardening script, the
/// intrinsics of both contexts and the platform. Part of every bytecode cache
/// key, so a changed engine never loads bytecode another one made.
pub(crate) fn engine_version() -> [u8; 32] {
    static VERSION: OnceLock<[u8; 32]> = OnceLock::new();
    *VERSION.get_or_init(|| {
        // SAFETY: JS_GetVersion returns a static NUL-terminated string.
        let quickjs = unsafe { CStr::from_ptr(qjs::JS_GetVersion()) }.to_bytes();
        let platform = format!("{}-{}-{}", std::env::consts::ARCH, usize::BITS, cfg!(target_endian = "little"));
        let mut hash = Sha256::new();
        for part in [
            b"resumable-engine-v1".as_slice(),
            RQUICKJS_VERSION.as_bytes(),
            quickjs,
            env!("CARGO_PKG_VERSION").as_bytes(),
            js::wrap_source("").as_bytes(),
            HARDEN_JS.as_bytes(),
            std::any::type_name::<CompilerIntrinsics>().as_bytes(),
            std::any::type_name::<GuestIntrinsics>().as_bytes(),
            platform.as_bytes(),
        ] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        hash.finalize().into()
    })
}

/// Rust-side state a realm's natives read (no JavaScript values: no cycles).
pub(crate) struct RealmShared {
    pub clock: Cell<f64>,
    pub rng: RefCell<SeededRandom>,
}

/// A hardened realm that no script has touched yet.
pub(crate) struct Realm {
    pub helpers: Persistent<Object<'static>>,
    pub shared: Rc<RealmShared>,
    pub context: Context,
}

/// Per-worker engine. Not `Send`: it lives and dies on its worker thread.
pub(crate) struct Engine {
    spare: Option<Realm>,
    /// The realm of the last run, dropped after its caller has the answer.
    pub(crate) retired: Option<Realm>,
    /// Bytes in use right after the last collection between runs.
    collected_at: usize,
    /// Set when the last run left state behind (a latched limit, queued jobs):
    /// the worker then replaces the whole engine.
    pub(crate) poisoned: bool,
    compiler: Context,
    harden: Bytecode,
    pub(crate) classes: ClassIds,
    cache: BytecodeCache,
    pub(crate) guard: Rc<RunGuard>,
    pub(crate) meter: Rc<HeapMeter>,
    pub(crate) runtime: Runtime,
}

impl Engine {
    /// A fresh runtime with a default bytecode cache (see [`Engine::configure_cache`]).
    pub(crate) fn new() -> Result<Engine, RunError> {
        let meter = HeapMeter::new();
        let runtime = Runtime::new_with_alloc(MeteredAllocator { meter: meter.clone() })
            .map_err(|e| RunError::internal(format!("cannot start the engine: {e}")))?;
        let guard = RunGuard::new(meter.clone());
        let handler_guard = guard.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || handler_guard.should_stop_checking_stack())));
        let compiler = Context::custom::<CompilerIntrinsics>(&runtime)
            .map_err(|e| RunError::internal(format!("cannot create the compiler: {e}")))?;
        let (harden, classes) = compiler.with(|ctx| {
            let harden = js::compile(&ctx, HARDEN_JS, "harden.js", 0)
                .map_err(|e| RunError::internal(format!("hardening script: {e}")))?;
            let raw = ctx.as_raw().as_ptr();
            let date: Value = ctx.eval("new Date(0)").map_err(|e| RunError::internal(e.to_string()))?;
            let classes = unsafe {
                let object = qjs::JS_NewObject(raw);
                let array = qjs::JS_NewArray(raw);
                let error = qjs::JS_NewError(raw);
                let ids = ClassIds {
                    object: qjs::JS_GetClassID(object),
                    array: qjs::JS_GetClassID(array),
                    date: qjs::JS_GetClassID(date.as_raw()),
                    error: qjs::JS_GetClassID(error),
                };
                qjs::JS_FreeValue(raw, object);
                qjs::JS_FreeValue(raw, array);
                qjs::JS_FreeValue(raw, error);
                ids
            };
            Ok::<_, RunError>((harden, classes))
        })?;
        Ok(Engine {
            poisoned: false,
            collected_at: 0,
            spare: None,
            retired: None,
            compiler,
            harden,
            classes,
            cache: BytecodeCache::new(BytecodeCacheConfig::default()),
            guard,
            meter,
            runtime,
        })
    }

    /// Builds a realm now so the next run does not wait for it.
    pub(crate) fn prepare_spare(&mut self) {
        if self.spare.is_none() {
            self.spare = self.new_realm().ok();
        }
    }

    fn new_realm(&self) -> Result<Realm, RunError> {
        let fail = |e: rquickjs::Error| RunError::internal(format!("cannot create a realm: {e}"));
        let context = Context::custom::<GuestIntrinsics>(&self.runtime).map_err(fail)?;
        let shared = Rc::new(RealmShared { clock: Cell::new(0.0), rng: RefCell::new(SeededRandom::new(0)) });
        let helpers = context.with(|ctx| {
            let natives = Object::new(ctx.clone())?;
            let clock = shared.clone();
            natives.set("now", Function::new(ctx.clone(), move || clock.clock.get())?.with_name("now")?)?;
            let rng = shared.clone();
            natives.set(
                "random",
                Function::new(ctx.clone(), move || rng.rng.borrow_mut().next_f64())?.with_name("random")?,
            )?;
            let harden = js::load(&ctx, &self.harden).map_err(|_| rquickjs::Error::Exception)?;
            let harden = Function::from_value(harden)?;
            let helpers: Object = harden.call((natives,))?;
            Ok::<_, rquickjs::Error>(Persistent::save(&ctx, helpers))
        });
        let helpers = helpers.map_err(fail)?;
        Ok(Realm { helpers, shared, context })
    }

    /// Takes the spare realm or builds one.
    pub(crate) fn take_realm(&mut self) -> Result<Realm, RunError> {
        match self.spare.take() {
            Some(realm) => Ok(realm),
            None => self.new_realm(),
        }
    }

    /// Applies the runner's bytecode cache bounds.
    pub(crate) fn configure_cache(&mut self, config: BytecodeCacheConfig) {
        self.cache.configure(config);
    }

    /// Bytecode for `source`, from the cache or compiled now, and which it was.
    pub(crate) fn bytecode(&mut self, source: &str, hash: &[u8; 32]) -> Result<(Bytecode, CacheLookup), RunError> {
        let key = CacheKey { source: *hash, engine: engine_version() };
        if let Some(code) = self.cache.get(&key, Instant::now()) {
            return Ok((code, CacheLookup::Hit));
        }
        let code = self.compile(source)?;
        self.cache.insert(key, code.clone(), Instant::now());
        Ok((code, CacheLookup::Miss))
    }

    /// Compiles `source` (a function body) with this engine's compiler.
    pub(crate) fn compile(&self, source: &str) -> Result<Bytecode, RunError> {
        self.compiler
            .with(|ctx| js::compile_script(&ctx, source))
            .map_err(|message| RunError::new(ErrorCode::Error, message))
    }

    /// Frees the last run's realm. A realm is full of reference cycles, so it
    /// is only reclaimed by a collection: one runs here, off the caller's path,
    /// whenever the garbage of retired realms has grown by [`GC_HEADROOM`].
    pub(crate) fn retire(&mut self) {
        self.retired = None;
        if self.meter.used() > self.collected_at.saturating_add(GC_HEADROOM) {
            self.runtime.run_gc();
            self.collected_at = self.meter.used();
        }
    }

    /// Runs one job to its outcome.
    pub(crate) fn execute(&mut self, job: &mut Job) -> Result<RawOutcome, RunError> {
        super::execution::execute(self, job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Realms are full of cycles: without a collection between runs every
    /// retired realm would stay in memory.
    #[test]
    fn retired_realms_are_collected() {
        let mut engine = Engine::new().unwrap();
        engine.retired = Some(engine.take_realm().unwrap());
        engine.retire();
        let baseline = engine.meter.used();
        for _ in 0..2_000 {
            // As before every run: the engine's own collector waits for headroom.
            engine.runtime.set_gc_threshold(engine.meter.used() + GC_HEADROOM);
            engine.retired = Some(engine.take_realm().unwrap());
            engine.retire();
        }
        let grown = engine.meter.used().saturating_sub(baseline);
        assert!(grown <= 2 * GC_HEADROOM, "2,000 retired realms left {grown} bytes behind");
    }

    /// A new rquickjs release must change the engine version (and so every cache key).
    #[test]
    fn the_engine_version_names_the_locked_rquickjs_release() {
        let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock")).unwrap();
        let locked = lock.split("[[package]]").find(|p| p.contains("name = \"rquickjs\"\n")).unwrap();
        assert!(locked.contains(&format!("version = \"{RQUICKJS_VERSION}\"")), "{locked}");
        assert_eq!(engine_version(), engine_version());
    }
}

#[cfg(test)]
mod realm_timing {
    use super::*;
    use std::time::Instant;

    /// What one fresh realm costs: the floor under every run's CPU time.
    /// `cargo test --release -p resumable-runner --lib realm_costs -- --ignored --nocapture`
    #[test]
    #[ignore = "timing report, run by hand in release mode"]
    fn realm_costs() {
        let engine = Engine::new().unwrap();
        let per = |started: Instant, n: usize| started.elapsed().as_secs_f64() * 1e6 / n as f64;
        for _ in 0..3 {
            let n = 500;
            engine.runtime.set_gc_threshold(usize::MAX);
            let started = Instant::now();
            let contexts: Vec<Context> =
                (0..n).map(|_| Context::custom::<GuestIntrinsics>(&engine.runtime).unwrap()).collect();
            let context_us = per(started, n);
            drop(contexts);
            engine.runtime.run_gc();
            let started = Instant::now();
            let realms: Vec<Realm> = (0..n).map(|_| engine.new_realm().unwrap()).collect();
            let realm_us = per(started, n);
            let started = Instant::now();
            drop(realms);
            let drop_us = per(started, n);
            let started = Instant::now();
            engine.runtime.run_gc();
            let gc_us = per(started, n);
            eprintln!(
                "per realm: context {context_us:.1} µs, hardened realm {realm_us:.1} µs, \
                 drop {drop_us:.1} µs, collection {gc_us:.1} µs"
            );
        }
    }
}
