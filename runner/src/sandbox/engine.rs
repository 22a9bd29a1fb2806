//! One QuickJS runtime per worker thread, with its compiler and the image of a hardened realm.
//!
//! Warm state and configuration: what a worker keeps between runs (the
//! runtime, the compiler context, the realm's image, the bytecode cache)
//! depends on nothing a run can configure. Intrinsics and the hardening
//! script are fixed per build (and part of [`engine_version`]); every limit
//! that touches the runtime (stack size, memory budget, garbage-collection
//! threshold, deadlines, CPU time) is applied at the start of each run by
//! `execution::execute` and lifted after it. So one warm runtime serves runs
//! with any limits, and a run never inherits the previous run's settings.

use super::alloc::{HeapMeter, MeteredAllocator, SystemBlocks};
use super::arena::Arena;
use super::bytecode::{BytecodeCache, CacheKey};
use super::execution::{self, CurrentRun};
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
/// Garbage a run may make before the engine collects it.
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
    /// The run the realm's dispatching natives serve (see `execution::CurrentRun`).
    pub current: CurrentRun,
    /// Set when a native panicked; the engine is then replaced, not restored.
    pub panicked: Cell<bool>,
}

/// The hardened realm every run starts from.
pub(crate) struct Realm {
    pub helpers: Persistent<Object<'static>>,
    pub shared: Rc<RealmShared>,
    pub context: Context,
}

/// Per-worker engine. Not `Send`: it lives and dies on its worker thread.
///
/// Fresh realm per run: the guest runtime and its one hardened realm live in
/// an [`Arena`] whose image is saved once they are built; after every run the
/// image is copied back, so each run starts from the same bytes, untouched by
/// any run before it (and a run that hit a limit leaves nothing behind).
pub(crate) struct Engine {
    // Field order is drop order: JavaScript handles, then the runtime, then its memory.
    pub(crate) realm: Realm,
    /// Set while the realm differs from its image.
    dirty: bool,
    /// Set when a run panicked on the Rust side (in a native or around one): the worker
    /// replaces the engine.
    pub(crate) poisoned: bool,
    /// Heap bytes in use in the image.
    image_used: usize,
    pub(crate) classes: ClassIds,
    cache: BytecodeCache,
    pub(crate) guard: Rc<RunGuard>,
    pub(crate) meter: Rc<HeapMeter>,
    pub(crate) runtime: Runtime,
    compiler: Context,
    arena: Rc<Arena>,
}

impl Engine {
    /// A fresh runtime with a default bytecode cache (see [`Engine::configure_cache`]).
    pub(crate) fn new() -> Result<Engine, RunError> {
        let start = |e: rquickjs::Error| RunError::internal(format!("cannot start the engine: {e}"));
        let compiler_runtime =
            Runtime::new_with_alloc(MeteredAllocator { meter: HeapMeter::new(), blocks: SystemBlocks })
                .map_err(start)?;
        let compiler = Context::custom::<CompilerIntrinsics>(&compiler_runtime)
            .map_err(|e| RunError::internal(format!("cannot create the compiler: {e}")))?;
        let (harden, classes) = compiler.with(|ctx| {
            let harden = js::compile(&ctx, HARDEN_JS, "harden.js", 0)
                .map_err(|e| RunError::internal(format!("hardening script: {e}")))?;
            let raw = ctx.as_raw().as_ptr();
            let date: Value = ctx.eval("new Date(0)").map_err(|e| RunError::internal(e.to_string()))?;
            // SAFETY: `raw` is the live compiler context this closure runs in. Each new value is
            // ours and freed once (freeing `JS_EXCEPTION`, should one fail, does nothing);
            // `JS_GetClassID` only reads the tag and class of a value, `date` one we still hold.
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

        let arena =
            Rc::new(Arena::new().map_err(|e| RunError::internal(format!("cannot set up the engine's heap: {e}")))?);
        let meter = HeapMeter::new();
        let runtime =
            Runtime::new_with_alloc(MeteredAllocator { meter: meter.clone(), blocks: arena.clone() }).map_err(start)?;
        let guard = RunGuard::new(meter.clone());
        let handler_guard = guard.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || handler_guard.should_stop_checking_stack())));
        let realm = build_realm(&runtime, &harden)?;
        // Garbage of the hardening would only make the image bigger.
        runtime.run_gc();
        arena.save();
        Ok(Engine {
            realm,
            dirty: false,
            poisoned: false,
            image_used: meter.used(),
            classes,
            cache: BytecodeCache::new(BytecodeCacheConfig::default()),
            guard,
            meter,
            runtime,
            compiler,
            arena,
        })
    }

    /// Readies [`Engine::realm`] for a run: as its image has it.
    pub(crate) fn begin_run(&mut self) {
        self.reset();
        self.dirty = true;
    }

    /// Keeps the heap's extent within `bytes` above the image for this run (see
    /// [`Arena::confine`]).
    pub(crate) fn confine_heap(&self, bytes: usize) {
        self.arena.confine(bytes);
    }

    /// Puts the realm back to its image. Called after the caller has its
    /// answer; every handle a run took is gone by then.
    pub(crate) fn reset(&mut self) {
        if self.dirty {
            // SAFETY: no script runs now, and the run's handles were dropped
            // when `execute` returned; the realm's own handles predate the image.
            unsafe { self.arena.restore() };
            self.meter.reset_to(self.image_used);
            self.dirty = false;
        }
    }

    /// Bytes copied back after each run.
    #[cfg(test)]
    pub(crate) fn image_bytes(&self) -> usize {
        self.arena.image_bytes()
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
            .map_err(|error| RunError::new(ErrorCode::Error, error.0))
    }

    /// Runs one job to its outcome.
    pub(crate) fn execute(&mut self, job: &mut Job) -> Result<RawOutcome, RunError> {
        super::execution::execute(self, job)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // A run that panicked may have left the heap in any state; the
        // runtime is freed from its image instead.
        self.reset();
    }
}

/// Builds the hardened realm in `runtime`: natives, then the hardening script.
fn build_realm(runtime: &Runtime, harden: &Bytecode) -> Result<Realm, RunError> {
    let fail = |e: rquickjs::Error| RunError::internal(format!("cannot create a realm: {e}"));
    let context = Context::custom::<GuestIntrinsics>(runtime).map_err(fail)?;
    let shared = Rc::new(RealmShared {
        clock: Cell::new(0.0),
        rng: RefCell::new(SeededRandom::new(0)),
        current: CurrentRun::default(),
        panicked: Cell::new(false),
    });
    let helpers = context.with(|ctx| {
        let natives = Object::new(ctx.clone())?;
        let clock = shared.clone();
        natives.set("now", Function::new(ctx.clone(), move || clock.clock.get())?.with_name("now")?)?;
        let rng = shared.clone();
        natives
            .set("random", Function::new(ctx.clone(), move || rng.rng.borrow_mut().next_f64())?.with_name("random")?)?;
        execution::add_dispatchers(&ctx, &natives, &shared)?;
        let harden = js::load(&ctx, harden).map_err(|_| rquickjs::Error::Exception)?;
        let harden = Function::from_value(harden)?;
        let helpers: Object = harden.call((natives,))?;
        Ok::<_, rquickjs::Error>(Persistent::save(&ctx, helpers))
    });
    let helpers = helpers.map_err(fail)?;
    Ok(Realm { helpers, shared, context })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `source` (a function body) in the engine's realm, as a run would.
    fn run_in(engine: &mut Engine, source: &str) -> String {
        let code = engine.compile(source).unwrap();
        engine.begin_run();
        evaluate(engine, &code)
    }

    /// Evaluates compiled `code` in the realm as it is now; its value as JSON text.
    fn evaluate(engine: &Engine, code: &Bytecode) -> String {
        engine.realm.context.with(|ctx| {
            let main = Function::from_value(js::load(&ctx, code).unwrap()).unwrap();
            let promise: rquickjs::Promise = main.call(()).unwrap();
            while ctx.execute_pending_job() {}
            let value: Value = promise.result::<Value>().unwrap().unwrap();
            let text = ctx.json_stringify(value).unwrap().map(|s| s.to_string().unwrap());
            text.unwrap_or_default()
        })
    }

    /// After a run the realm is its image again: what the run changed and
    /// allocated is gone, and 2,000 runs leave nothing behind.
    #[test]
    fn every_run_starts_from_the_image() {
        let mut engine = Engine::new().unwrap();
        let image_used = engine.meter.used();
        let mutate = "Object.prototype.leak = (Object.prototype.leak || 0) + 1; globalThis.kept = []; \
                      for (let i = 0; i < 1000; i++) kept.push({ i }); return [({}).leak, typeof seen]";
        for _ in 0..2_000 {
            assert_eq!(run_in(&mut engine, mutate), "[1,\"undefined\"]");
            engine.reset();
            assert_eq!(engine.meter.used(), image_used);
        }
        assert_eq!(run_in(&mut engine, "return [typeof kept, ({}).leak === undefined]"), "[\"undefined\",true]");
    }

    /// The run's budget bounds the heap's extent, not only the bytes in use, and running out
    /// of heap latches the limit like running out of budget (QuickJS alone would throw a
    /// catchable error). Found in review: gaps between blocks once let a run's heap grow to
    /// the whole 4 GiB reserve under a 64 MiB limit.
    #[test]
    fn running_out_of_heap_is_a_latched_limit() {
        let mut engine = Engine::new().unwrap();
        let code =
            engine.compile("try { return 'x'.repeat(8 * 1024 * 1024).length } catch (e) { return 'caught' }").unwrap();
        engine.begin_run();
        engine.meter.start_budget(usize::MAX / 2);
        engine.confine_heap(2 * 1024 * 1024);
        assert_eq!(evaluate(&engine, &code), "\"caught\"");
        assert!(engine.meter.exceeded(), "the script caught an out-of-memory error that no limit latched");
        engine.reset();
        assert_eq!(run_in(&mut engine, "return 'x'.repeat(8 * 1024 * 1024).length"), "8388608");
    }

    /// Restoring the image is sound only while no run makes rquickjs keep runtime-wide Rust
    /// state (see `Arena::restore`): Rust functions are made while the image is built, and
    /// nowhere else. A new one here needs the same care.
    #[test]
    fn rust_functions_are_made_only_while_the_image_is_built() {
        let sources = [
            ("alloc.rs", include_str!("alloc.rs")),
            ("arena.rs", include_str!("arena.rs")),
            ("bytecode.rs", include_str!("bytecode.rs")),
            ("console.rs", include_str!("console.rs")),
            ("engine.rs", include_str!("engine.rs")),
            ("execution.rs", include_str!("execution/mod.rs")),
            ("execution/driver.rs", include_str!("execution/driver.rs")),
            ("interrupt.rs", include_str!("interrupt.rs")),
            ("js.rs", include_str!("js.rs")),
            ("serialize.rs", include_str!("serialize.rs")),
            ("stack_guard.rs", include_str!("stack_guard.rs")),
        ];
        let made = concat!("Function", "::new(");
        for (file, text) in sources {
            for kept in [concat!("Class", "::instance"), concat!("new", "_class"), concat!("store", "_userdata")] {
                assert!(!text.contains(kept), "{file} uses {kept}");
            }
            let expected = match file {
                "engine.rs" => 2,    // `build_realm`: now, random
                "execution.rs" => 3, // `add_dispatchers`: hostCall, consoleWrite, unknownFunction
                _ => 0,
            };
            assert_eq!(text.matches(made).count(), expected, "{file}");
        }
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

    /// What a fresh realm costs built anew and restored from the image.
    /// `cargo test --release -p resumable-runner --lib realm_costs -- --ignored --nocapture`
    #[test]
    #[ignore = "timing report, run by hand in release mode"]
    fn realm_costs() {
        let mut engine = Engine::new().unwrap();
        let per = |started: Instant, n: usize| started.elapsed().as_secs_f64() * 1e6 / n as f64;
        let harden = engine.compiler.with(|ctx| js::compile(&ctx, HARDEN_JS, "harden.js", 0)).unwrap();
        for _ in 0..3 {
            let n = 500;
            let started = Instant::now();
            let realms: Vec<Realm> = (0..n).map(|_| build_realm(&engine.runtime, &harden).unwrap()).collect();
            let build_us = per(started, n);
            drop(realms);
            engine.runtime.run_gc();
            engine.reset();
            let started = Instant::now();
            for _ in 0..n {
                engine.begin_run();
                engine.reset();
            }
            let restore_us = per(started, n);
            eprintln!(
                "per realm: built {build_us:.1} µs, restored {restore_us:.1} µs ({} bytes copied)",
                engine.image_bytes()
            );
        }
    }
}
