//! Hostile scripts. Every one must end in a clean error with a sensible code or
//! a correct value: never a crash, a hang past the deadline, or runner code
//! running a guest getter, trap, `toJSON` or iterator.
//!
//! Detecting guest code the runner should not run: either a guest counter the
//! script returns (when the script survives), or a getter/trap that spins
//! forever (when the run ends in an error): if the runner invoked it, the run
//! would end in `RUN_TIMEOUT` instead of the expected code.

use crate::common::*;
use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
use resumable_runner::host::HostFunctions;
use resumable_runner::{
    ConsoleLevel, ErrorCode, Limit, LimitOverrides, Outcome, Resolution, RunError, RunRequest, Runner, RunnerConfig,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Proxy traps that spin forever. `get` answers `then` with `undefined`:
/// promise resolution asks for it, which is the guest's own semantics.
const SPIN_TRAPS: &str = "const spin = () => { for (;;) {} }; \
    const traps = { get: (t, k) => k === 'then' ? undefined : spin(), has: spin, ownKeys: spin, \
    getOwnPropertyDescriptor: spin, getPrototypeOf: spin, defineProperty: spin, set: spin, deleteProperty: spin, \
    isExtensible: spin, preventExtensions: spin, setPrototypeOf: spin, apply: spin, construct: spin };";

/// A proxy handler that counts every trap the engine looks up (`hits`).
const COUNTING: &str =
    "let hits = 0; const counting = new Proxy({}, { get(_, trap) { hits++; return Reflect[trap] } });";

fn one_second() -> LimitOverrides {
    timeout_ms(1000)
}

/// A runner with one worker, so consecutive runs share one engine runtime.
fn single_worker() -> (Runner, SignedCodec) {
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    (Runner::new(RunnerConfig::new().workers(1).codec(codec.clone())).unwrap(), codec)
}

/// Runs `request`; it must fail with `code` within `within`.
async fn fails(runner: &Runner, request: RunRequest, code: ErrorCode, within: Duration, what: &str) -> RunError {
    let started = Instant::now();
    let result = runner.run(request).await;
    let elapsed = started.elapsed();
    let err = match result {
        Err(e) => e,
        Ok(other) => panic!("{what}: expected {code}, got {other:?}"),
    };
    assert_eq!(err.code, code, "{what}: {err}");
    assert!(elapsed < within, "{what}: ended after {elapsed:?}");
    err
}

/// Runs `request`; it must complete within `within`.
async fn completes(runner: &Runner, request: RunRequest, within: Duration, what: &str) -> Value {
    let started = Instant::now();
    let result = runner.run(request).await;
    let elapsed = started.elapsed();
    assert!(elapsed < within, "{what}: ended after {elapsed:?}");
    match result {
        Ok(Outcome::Completed(c)) => c.value,
        other => panic!("{what}: expected completion, got {other:?}"),
    }
}

async fn still_works(runner: &Runner) {
    assert_eq!(value(runner, RunRequest::new("return 1")).await, json!(1), "the runner survives");
}

const SECOND: Duration = Duration::from_secs(1);
const TWO_SECONDS: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// Prototype pollution
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollution_does_not_outlive_a_run() {
    let (runner, _) = single_worker();
    let tools = Tools::default();
    let pollute = r#"
        globalThis.leaked = 1;
        Object.prototype.polluted = 1;
        Object.defineProperty(Object.prototype, 'then', { get() { return undefined }, configurable: true });
        Array.prototype.map = () => 'polluted';
        Array.prototype[Symbol.iterator] = function* () { yield 'polluted' };
        Map.prototype[Symbol.iterator] = function* () { yield 'polluted' };
        Set.prototype[Symbol.iterator] = function* () { yield 'polluted' };
        String.prototype.trim = () => 'polluted';
        RegExp.prototype.exec = () => ['polluted'];
        Object.keys = () => ['polluted'];
        Function.prototype.call = () => 'polluted';
        try { JSON.stringify = () => 'polluted' } catch {}
        try { Promise.prototype.then = () => 'polluted' } catch {}
        try { Object.defineProperty(Promise.prototype, 'then', { value: () => 'polluted' }) } catch {}
    "#;
    let check = r#"return [typeof leaked, ({}).polluted === undefined, 'then' in {}, [1, 2].map(x => x * 2),
        [...[1, 2]],
        [...new Map([[1, 2]])], [...new Set([3])], ' a '.trim(), new RegExp('a').exec('a')[0],
        Object.keys({ k: 1 }),
        JSON.stringify({ x: 1 }), (function (y) { return y }).call(null, 7), await tools.echo({ a: [1] })]"#;
    let clean =
        json!(["undefined", true, false, [2, 4], [1, 2], [[1, 2]], [3], "a", "a", ["k"], "{\"x\":1}", 7, {"a": [1]}]);
    for ending in ["return 'polluted'", "throw new Error('after polluting')", "await tools.fail('after polluting')"] {
        let _ = runner.run(RunRequest::new(format!("{pollute}\n{ending}")).host(tools.host())).await;
        assert_eq!(value(&runner, RunRequest::new(check).host(tools.host())).await, clean, "after: {ending}");
    }
    still_works(&runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollution_does_not_break_the_bridge() {
    let runner = runner();
    let tools = Tools::default();
    // Every intrinsic the bridge could conceivably use is replaced by a counter.
    let source = r#"'use strict';
        let hits = 0;
        const count = () => { hits++ };
        const accessor = { get() { hits++ }, set() { hits++ }, configurable: true };
        Object.defineProperty(Array.prototype, 0, accessor);
        Object.defineProperty(Object.prototype, 'a', accessor);
        Object.defineProperty(Object.prototype, 'toJSON',
            { get() { hits++; return () => 'hijacked' }, configurable: true });
        let promiseThen = 'replaced';
        // Replacing it is allowed (the runner never calls it); the bridge must not notice.
        try { Promise.prototype.then = count } catch (e) { promiseThen = e.constructor.name }
        Function.prototype.call = count; Function.prototype.apply = count; Function.prototype.bind = count;
        Array.prototype[Symbol.iterator] = function* () { hits++ };
        Array.prototype.push = count; Array.prototype.join = count;
        Object.prototype.toString = count; Object.prototype.valueOf = count; String.prototype.toString = count;
        Error.prototype.toString = count;
        Object.defineProperty = count; Object.keys = count; Object.getOwnPropertyNames = count;
        Reflect.get = count; Reflect.apply = count; Reflect.construct = count;
        const sum = await tools.sum(1, 2);
        const echoed = await tools.echo({ a: [1, 2], b: 'x' });
        let failed; try { await tools.fail('boom') } catch (e) { failed = [e.code, e.message] }
        let unknown; try { await tools.nope(1) } catch (e) { unknown = e.code }
        const refund = await orders.refund('o1', 5);
        return { sum, echoed, failed, unknown, refund, promiseThen, hits }"#;
    let got = completes(&runner, RunRequest::new(source).host(tools.host()), TWO_SECONDS, "polluted bridge").await;
    assert_eq!(
        got,
        json!({ "sum": 3, "echoed": { "a": [1, 2], "b": "x" }, "failed": ["RUN_HOST_FUNCTION_ERROR", "boom"],
                "unknown": "RUN_HOST_FUNCTION_ERROR", "refund": { "refunded": "o1", "amount": 5 },
                "promiseThen": "replaced", "hits": 0 })
    );
    assert_eq!((tools.count("sum"), tools.count("echo"), tools.count("fail")), (1, 1, 1));
    still_works(&runner).await;
}

/// What "correct" means with a `then` on `Object.prototype`: host results are
/// delivered by resolving a promise of the guest's realm, so standard promise
/// resolution consults the guest's `then` for *object* results (a function
/// `then` adopts, exactly as for any JS promise; a getter is asked once).
/// That is guest code running in the guest's own realm under the run's limits,
/// never runner code. What must hold: each host function runs exactly once,
/// primitives and rejections are delivered untouched, the reserved error codes
/// stay, and the run ends cleanly (a spinning getter ends at the deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_then_on_object_prototype_is_the_guests_own_business() {
    let runner = runner();
    let tools = Tools::default();
    let getter = r#"
        let asked = 0;
        Object.defineProperty(Object.prototype, 'then', { get() { asked++; return undefined }, configurable: true });
        const obj = await tools.echo({ a: 1 });
        const arr = await tools.echo([1, 2]);
        const num = await tools.sum(1, 2);
        const str = await tools.echo('s');
        let failed; try { await tools.fail('boom') } catch (e) { failed = [e.code, e.message] }
        delete Object.prototype.then;
        return [obj, arr, num, str, failed, asked]"#;
    assert_eq!(
        value(&runner, RunRequest::new(getter).host(tools.host())).await,
        json!([{ "a": 1 }, [1, 2], 3, "s", ["RUN_HOST_FUNCTION_ERROR", "boom"], 2]),
        "the getter is asked once per object result, by promise resolution"
    );
    assert_eq!((tools.count("echo"), tools.count("sum"), tools.count("fail")), (3, 1, 1));

    let tools = Tools::default();
    let function = r#"
        Object.prototype.then = function (resolve) { resolve('adopted') };
        const obj = await tools.echo({ a: 1 });
        const num = await tools.sum(1, 2);
        let failed; try { await tools.fail('boom') } catch (e) { failed = [e.code, e.message] }
        delete Object.prototype.then;
        return [obj, num, failed]"#;
    assert_eq!(
        value(&runner, RunRequest::new(function).host(tools.host())).await,
        json!(["adopted", 3, ["RUN_HOST_FUNCTION_ERROR", "boom"]])
    );
    assert_eq!((tools.count("echo"), tools.count("sum"), tools.count("fail")), (1, 1, 1));

    let tools = Tools::default();
    let host = tools.host();
    let then = "Object.prototype.then = function (resolve) { resolve('adopted') };";
    let err = fails(
        &runner,
        RunRequest::new(format!("{then} await tools.fail('boom')")).host(host.clone()),
        ErrorCode::HostFunctionError,
        SECOND,
        "uncaught host failure",
    )
    .await;
    assert_eq!(err.message, "boom");
    let got = completes(&runner, RunRequest::new(format!("{then} return {{ a: 1 }}")), SECOND, "result").await;
    assert_eq!(got, json!("adopted"), "the final result is resolved like any promise");
    let silent = "Object.prototype.then = function () {}; return { a: 1 }";
    let err = fails(&runner, RunRequest::new(silent), ErrorCode::Error, SECOND, "silent then").await;
    assert!(err.message.contains("nothing can settle"), "{}", err.message);
    let spinning = "Object.defineProperty(Object.prototype, 'then', { get() { for (;;) {} } }); \
                    await tools.echo({ a: 1 }); return 'unreachable'";
    let request = RunRequest::new(spinning).host(host.clone()).limits(timeout_ms(300));
    fails(&runner, request, ErrorCode::Timeout, SECOND, "spinning then getter").await;
    let throwing = "Object.defineProperty(Object.prototype, 'then', { get() { throw new Error('from getter') } }); \
                    try { await tools.echo({ a: 1 }) } catch (e) { return String(e) }";
    let got = completes(&runner, RunRequest::new(throwing).host(host.clone()), SECOND, "throwing getter").await;
    assert_eq!(got, json!("Error: from getter"), "the call's promise rejects with what the getter threw");
    assert_eq!(tools.count("echo"), 2);
    still_works(&runner).await;
}

// ---------------------------------------------------------------------------
// Values that cannot or should not cross
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maps_and_sets_with_replaced_iterators_are_refused_without_iterating() {
    let runner = runner();
    let tools = Tools::default();
    let replace = "for (const C of [Map, Set]) \
                   for (const k of [Symbol.iterator, 'entries', 'keys', 'values', 'forEach']) \
                   C.prototype[k] = function () { for (;;) {} };";
    for result in ["new Map([[1, 2]])", "new Set([1])", "{ m: new Map() }", "[new Set()]", "new WeakMap()"] {
        let request = RunRequest::new(format!("{replace} return {result}")).limits(one_second());
        fails(&runner, request, ErrorCode::SerializationError, SECOND, result).await;
    }
    let source = r#"
        let hits = 0;
        for (const C of [Map, Set])
            for (const k of [Symbol.iterator, 'entries', 'keys', 'values', 'forEach', 'get', 'has'])
            C.prototype[k] = function () { hits++; return [][Symbol.iterator]() };
        Object.defineProperty(Map.prototype, 'size', { get() { hits++; return 0 } });
        const codes = [];
        for (const v of [new Map([[1, 2]]), new Set([1]), { s: new Set() }]) {
            try { await tools.echo(v); codes.push('accepted') } catch (e) { codes.push(e.code) }
        }
        return [codes, hits]"#;
    assert_eq!(
        value(&runner, RunRequest::new(source).host(tools.host())).await,
        json!([["RUN_SERIALIZATION_ERROR", "RUN_SERIALIZATION_ERROR", "RUN_SERIALIZATION_ERROR"], 0])
    );
    assert_eq!(tools.count("echo"), 0);
    still_works(&runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_sparse_arrays_fail_fast() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    let sparse = "const a = []; a.length = 2 ** 32 - 1;";
    let big_result = LimitOverrides::new().with(Limit::Result, 64 << 20).unwrap();
    for (body, code, limits) in [
        ("return a", ErrorCode::SerializationError, LimitOverrides::new()),
        ("return a", ErrorCode::SerializationError, big_result),
        ("return { nested: [1, a] }", ErrorCode::SerializationError, LimitOverrides::new()),
        ("await tools.echo(a)", ErrorCode::BridgeLimit, LimitOverrides::new()),
        ("try { await tools.echo({ a }) } catch { return 'caught' }", ErrorCode::BridgeLimit, LimitOverrides::new()),
        ("await tools.echo(1, [a])", ErrorCode::BridgeLimit, LimitOverrides::new()),
    ] {
        let request = RunRequest::new(format!("{sparse} {body}")).host(host.clone()).limits(limits);
        fails(&runner, request, code, SECOND, body).await;
    }
    assert_eq!(tools.count("echo"), 0, "the host never saw the array");
    let started = Instant::now();
    let outcome = run(&runner, RunRequest::new(format!("{sparse} console.log(a); return 'printed'"))).await.unwrap();
    assert!(started.elapsed() < SECOND);
    assert_eq!(outcome.completed().unwrap().value, json!("printed"));
    assert_eq!(outcome.console()[0].text, "[value too large to print]");
    still_works(&runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_surrogates_become_replacement_characters() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    let strings =
        r#"['a\uD800b', '\uDC00', '\uDE00\uD83D', '\uD83D\uDE00', { '\uD800key': '\uDBFF', ok: '\uD83D\uDE00' }]"#;
    let expected =
        json!(["a\u{FFFD}b", "\u{FFFD}", "\u{FFFD}\u{FFFD}", "😀", { "\u{FFFD}key": "\u{FFFD}", "ok": "😀" }]);
    assert_eq!(value(&runner, RunRequest::new(format!("return {strings}"))).await, expected, "returned");
    let echoed =
        value(&runner, RunRequest::new(format!("return await tools.echo({strings})")).host(host.clone())).await;
    assert_eq!(echoed, expected, "through the host and back");
    // What the host itself received: the interruption records the arguments it was called with.
    let outcome =
        run(&runner, RunRequest::new(format!("return await tools.approve({strings})")).host(host.clone())).await;
    let suspension = outcome.unwrap().interrupted().cloned().unwrap();
    assert_eq!(suspension.interruptions[0].arguments, vec![expected.clone()]);
    assert_eq!(suspension.interruptions[0].payload["args"], json!([expected]));
    let outcome = run(&runner, RunRequest::new(r#"console.log('a\uD800b', { '\uDC00': 1 }); return 1"#)).await.unwrap();
    assert_eq!(outcome.console()[0].text, "a\u{FFFD}b {\"\u{FFFD}\":1}");
    let err = error(&runner, RunRequest::new(r#"throw new Error('bad \uD800')"#)).await;
    assert_code(&err, ErrorCode::Error);
    assert!(err.message.starts_with("Error: bad \u{FFFD}"), "{}", err.message);
    still_works(&runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_mebibyte_strings_hit_their_limits() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    let huge = "'x'.repeat(50 * 2 ** 20)";
    let slow = Duration::from_secs(10); // the string is copied once; debug builds are slow
    let err =
        fails(&runner, RunRequest::new(format!("return {huge}")), ErrorCode::SerializationError, slow, "result").await;
    assert!(err.message.contains("larger than the limit of 1048576 bytes"), "{}", err.message);
    for source in
        [format!("await tools.echo({huge})"), format!("try {{ await tools.echo(1, {huge}) }} catch {{}} return 1")]
    {
        let err =
            fails(&runner, RunRequest::new(source).host(host.clone()), ErrorCode::BridgeLimit, slow, "argument").await;
        assert!(err.message.contains("arguments of tools.echo"), "{}", err.message);
    }
    assert_eq!(tools.count("echo"), 0, "the host is not called");
    let small = LimitOverrides::new().with(Limit::Memory, 16 << 20).unwrap();
    for source in [format!("return {huge}"), format!("try {{ {huge} }} catch {{}} return 'caught'")] {
        let request = RunRequest::new(source).limits(small);
        fails(&runner, request, ErrorCode::MemoryLimit, SECOND, "small memory").await;
    }
    still_works(&runner).await;
}

/// A string of control characters is escaped six-fold (`\u0001`) before the
/// size check: 50 MiB of guest string becomes 300 MiB of unmetered host memory
/// and seconds of work that ignore the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_strings_are_refused_before_they_are_copied() {
    let runner = runner();
    let tools = Tools::default();
    // A generous deadline (debug builds on a loaded machine): the point is that the
    // refusal comes from the size check, long before the deadline.
    let limits = timeout_ms(4_000);
    for source in ["return '\\x01'.repeat(50 * 2 ** 20)", "await tools.echo('\\x01'.repeat(50 * 2 ** 20))"] {
        let request = RunRequest::new(source).host(tools.host()).limits(limits);
        let started = Instant::now();
        let err = error(&runner, request).await;
        assert!(started.elapsed() < Duration::from_secs(4), "{source}: ended after {:?}: {err}", started.elapsed());
        assert!(matches!(err.code, ErrorCode::SerializationError | ErrorCode::BridgeLimit), "{source}: {err}");
    }
    still_works(&runner).await;
}

// ---------------------------------------------------------------------------
// Deep nesting
// ---------------------------------------------------------------------------

fn deep_host() -> HostFunctions {
    HostFunctions::builder()
        .function("deep.make", |_ctx, args| async move {
            let depth = args.first().and_then(Value::as_u64).unwrap_or(0);
            let mut v = json!(0);
            for _ in 0..depth {
                v = Value::Array(vec![v]);
            }
            Ok(v)
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_fails_cleanly() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    for (source, code) in [
        ("let v = 0; for (let i = 0; i < 100000; i++) v = [v]; return v", ErrorCode::SerializationError),
        ("let v = 0; for (let i = 0; i < 100000; i++) v = { v }; return v", ErrorCode::SerializationError),
        ("let v = 0; for (let i = 0; i < 100000; i++) v = { v }; await tools.echo(v)", ErrorCode::SerializationError),
        // The engine's parser recursion reaches the stack limit, which no catch survives.
        ("try { JSON.parse('['.repeat(100000) + ']'.repeat(100000)) } catch {} return 1", ErrorCode::StackOverflow),
        ("try { JSON.parse('{\"a\":'.repeat(100000) + '1' + '}'.repeat(100000)) } catch {}", ErrorCode::StackOverflow),
    ] {
        // Building 100,000 levels takes a while in a debug build on a busy machine.
        let request = RunRequest::new(source).host(host.clone()).limits(timeout_ms(5_000));
        let err = fails(&runner, request, code, Duration::from_secs(10), source).await;
        if code == ErrorCode::SerializationError {
            assert!(err.message.contains("nesting deeper than 100 levels"), "{}", err.message);
        }
    }
    assert_eq!(tools.count("echo"), 0);
    let caught = "let v = 0; for (let i = 0; i < 100000; i++) v = [v]; \
                  try { await tools.echo(v) } catch (e) { return e.code }";
    assert_eq!(value(&runner, RunRequest::new(caught).host(host.clone())).await, json!("RUN_SERIALIZATION_ERROR"));

    // Source code nested 100,000 levels deep: the compiler refuses it.
    for (open, close) in [("(", ")"), ("[", "]"), ("{a:", "}"), ("-", ""), ("!", "")] {
        let source = format!("return {}1{}", open.repeat(100_000), close.repeat(100_000));
        let limits = LimitOverrides::new().with(Limit::Source, 1 << 20).unwrap();
        let err = fails(&runner, RunRequest::new(source).limits(limits), ErrorCode::Error, TWO_SECONDS, open).await;
        assert!(err.message.len() < 5000, "{open}: {}", err.message);
    }
    let nested_functions = format!("return {}1{}", "(() => ".repeat(20_000), ")()".repeat(20_000));
    fails(&runner, RunRequest::new(nested_functions), ErrorCode::Error, TWO_SECONDS, "nested functions").await;

    // Deep values from the host: moderate depths arrive intact, deeper ones end cleanly.
    let host = deep_host();
    let measure = |n: u32| {
        format!("let v = await deep.make({n}); let d = 0; while (Array.isArray(v)) {{ v = v[0]; d++ }} return d")
    };
    assert_eq!(value(&runner, RunRequest::new(measure(100)).host(host.clone())).await, json!(100));
    for depth in [101, 1_000, 5_000] {
        let started = Instant::now();
        let err = error(&runner, RunRequest::new(measure(depth)).host(host.clone())).await;
        assert_code(&err, ErrorCode::HostFunctionError);
        assert!(err.message.contains("nested deeper than 100"), "host value {depth} deep: {err}");
        assert!(started.elapsed() < TWO_SECONDS);
        still_works(&runner).await;
    }
}

/// Values up to the documented depth (100) cross in every direction; deeper ones are refused cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_nested_up_to_the_documented_depth_cross_intact() {
    let runner = runner();
    let tools = Tools::default();
    let depth = |mut v: &Value| {
        let mut d = 0;
        while let Some(inner) = v.get(0) {
            v = inner;
            d += 1;
        }
        d
    };
    // 99 arrays around a number: 100 levels counting the innermost array's contents.
    let build = "let v = 0; for (let i = 0; i < 100; i++) v = [v];";
    let measure = "let d = 0; while (Array.isArray(r)) { r = r[0]; d++ }";
    match &run(&runner, RunRequest::new(format!("{build} return v"))).await {
        Ok(Outcome::Completed(c)) => assert_eq!(depth(&c.value), 100),
        other => panic!("a result 100 levels deep: {other:?}"),
    }
    let echo = format!("{build} let r = await tools.echo(v); {measure} return d");
    assert_eq!(value(&runner, RunRequest::new(echo).host(tools.host())).await, json!(100), "the host got the argument");
    // tools.approve wraps its arguments into its payload ({args: [v]}), two levels more.
    let build = "let v = 0; for (let i = 0; i < 98; i++) v = [v];";
    let outcome = run(&runner, RunRequest::new(format!("{build} await tools.approve(v)")).host(tools.host())).await;
    let suspension = outcome.unwrap().interrupted().cloned().unwrap();
    assert_eq!(depth(&suspension.interruptions[0].arguments[0]), 98, "the approver sees the argument");
    // One level more is refused cleanly, as a result and as an argument (the host is not called).
    let deeper = "let v = 0; for (let i = 0; i < 101; i++) v = [v];";
    let err = error(&runner, RunRequest::new(format!("{deeper} return v"))).await;
    assert_code(&err, ErrorCode::SerializationError);
    assert!(err.message.contains("deeper than 100"), "{}", err.message);
    let before = tools.count("echo");
    let source = format!("{deeper} try {{ await tools.echo(v) }} catch (e) {{ return e.code }}");
    assert_eq!(value(&runner, RunRequest::new(source).host(tools.host())).await, json!("RUN_SERIALIZATION_ERROR"));
    assert_eq!(tools.count("echo"), before);
}

// ---------------------------------------------------------------------------
// Getters, toJSON and proxies
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getters_to_json_and_proxy_traps_never_run() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    // Results: any getter, toJSON or trap the runner invoked would spin until RUN_TIMEOUT.
    for (result, path) in [
        ("{ get g() { spin() } }", "a getter at result.g"),
        ("[1, { get x() { spin() } }]", "a getter at result[1].x"),
        ("Object.defineProperty([1], 1, { get: spin, enumerable: true })", "a getter at result[1]"),
        ("{ toJSON: spin }", "a function at result.toJSON"),
        ("new Proxy({}, traps)", "a Proxy at result"),
        ("[new Proxy([], traps)]", "a Proxy at result[0]"),
        ("{ p: new Proxy(function () {}, traps) }", "result.p"),
        ("Object.setPrototypeOf({ a: new Proxy({}, traps) }, new Proxy({}, traps))", "a Proxy at result.a"),
    ] {
        let request = RunRequest::new(format!("{SPIN_TRAPS} return {result}")).limits(one_second());
        let err = fails(&runner, request, ErrorCode::SerializationError, TWO_SECONDS, result).await;
        assert!(err.message.contains(path), "{result}: {}", err.message);
    }
    for (source, expected) in [
        ("Object.defineProperty(Object.prototype, 'toJSON', { value: spin }); return { a: 1 }", json!({ "a": 1 })),
        ("Object.defineProperty(Array.prototype, 1, { get: spin }); return [0, , 2]", json!([0, null, 2])),
        ("const d = new Date(0); d.toJSON = spin; d.toISOString = spin; return d", json!("1970-01-01T00:00:00.000Z")),
        (
            "const d = new Date(0); Object.setPrototypeOf(d, new Proxy({}, traps)); return [d]",
            json!(["1970-01-01T00:00:00.000Z"]),
        ),
        ("return Object.create(new Proxy({}, traps), { a: { value: 1, enumerable: true } })", json!({ "a": 1 })),
        ("return { a: 1, [Symbol('s')]: 2, get [Symbol.iterator]() { spin() } }", json!({ "a": 1 })),
        ("return Object.defineProperty({ a: 1 }, 'hidden', { get: spin })", json!({ "a": 1 })),
    ] {
        let request = RunRequest::new(format!("{SPIN_TRAPS} {source}")).limits(one_second());
        assert_eq!(completes(&runner, request, TWO_SECONDS, source).await, expected, "{source}");
    }
    // Arguments: counted; each is refused with a catchable error and the host is not called.
    let source = format!(
        r#"{COUNTING}
        const count = () => {{ hits++; return 1 }};
        Object.defineProperty(Object.prototype, 'toJSON', {{ get: count, configurable: true }});
        const values = [
            {{ get g() {{ return count() }} }},
            {{ toJSON: count }},
            new Proxy({{}}, counting),
            new Proxy([1], counting),
            [Object.defineProperty({{}}, 'x', {{ get: count, enumerable: true }})],
            Object.defineProperty([], 0, {{ get: count, enumerable: true }}),
            {{ nested: {{ deeper: [new Proxy({{}}, counting)] }} }},
        ];
        const codes = [];
        for (const v of values) {{
            try {{ await tools.echo(v); codes.push('accepted') }} catch (e) {{ codes.push(e.code) }}
        }}
        const plain = await tools.echo({{ a: 1 }});
        delete Object.prototype.toJSON;
        return [codes, plain, hits]"#
    );
    let got = value(&runner, RunRequest::new(source).host(host.clone())).await;
    assert_eq!(got[0], json!(vec!["RUN_SERIALIZATION_ERROR"; 7]), "{got}");
    assert_eq!(got[1], json!({ "a": 1 }), "an inherited toJSON is ignored");
    assert_eq!(got[2], json!(0), "no getter, toJSON or trap ran");
    assert_eq!(tools.count("echo"), 1);
    still_works(&runner).await;
}

// ---------------------------------------------------------------------------
// Uncaught values and error hooks
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncaught_non_errors_are_described_without_running_guest_code() {
    let runner = runner();
    let getters = "{ get: spin, configurable: true }";
    for (thrown, fragment) in [
        ("throw null".to_string(), "Uncaught null"),
        ("throw 42".into(), "Uncaught 42"),
        ("throw 'plain text'".into(), "Uncaught plain text"),
        ("throw Symbol('s')".into(), "symbol"),
        ("throw 10n".into(), "BigInt"),
        ("throw () => 1".into(), "function"),
        ("throw new Proxy({}, traps)".into(), "Proxy"),
        ("throw new Proxy(new Error('m'), traps)".into(), "Proxy"),
        ("throw { get message() { spin() }, get name() { spin() }, get stack() { spin() } }".into(), "getter"),
        (
            format!(
                "const e = new Error('m'); for (const k of ['message', 'name', 'stack', 'cause']) \
                 Object.defineProperty(e, k, {getters}); throw e"
            ),
            "Error",
        ),
        (
            "class E extends Error { get name() { spin() } get message() { spin() } get stack() { spin() } } \
             throw new E('m')"
                .into(),
            "Error",
        ),
        (
            format!(
                "for (const k of ['name', 'message', 'stack', 'toString', 'constructor']) \
                 Object.defineProperty(Error.prototype, k, {getters}); throw new Error('m')"
            ),
            "m",
        ),
        ("const e = new Error('m'); Object.setPrototypeOf(e, new Proxy({}, traps)); throw e".into(), "Error: m"),
        ("const e = new TypeError('m'); Object.setPrototypeOf(e, null); throw e".into(), "Error: m"),
        ("const o = {}; o.self = o; throw o".into(), "cycle"),
        ("throw new Promise(() => {})".into(), "Uncaught"),
        ("throw new Error('m'.repeat(10 ** 6))".into(), "Error: mmm"),
        ("throw Object.assign(new Error('x'), { code: 'RUN_BRIDGE_LIMIT', name: 'HostFunctionError' })".into(), "x"),
        ("await Promise.reject(new Proxy({}, traps))".into(), "Proxy"),
    ] {
        let request = RunRequest::new(format!("{SPIN_TRAPS} {thrown}")).limits(one_second());
        let err = fails(&runner, request, ErrorCode::Error, TWO_SECONDS, &thrown).await;
        assert!(err.message.contains(fragment), "{thrown}: {}", err.message);
        assert!(err.message.len() <= 4100, "{thrown}: the message is bounded");
    }
    still_works(&runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throwing_undefined_says_undefined() {
    let runner = runner();
    let err = error(&runner, RunRequest::new("throw undefined")).await;
    assert_code(&err, ErrorCode::Error);
    assert_eq!(err.message, "Uncaught undefined");
}

/// Lenient output (console, uncaught values) writes an accessor member as a
/// placeholder under its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lenient_output_of_getters_is_well_formed() {
    let runner = runner();
    let outcome = run(&runner, RunRequest::new("console.log({ get g() { return 1 }, b: 2 }); return 1")).await.unwrap();
    assert_eq!(outcome.console()[0].text, r#"{"g":"[a getter]","b":2}"#);
    let err = error(&runner, RunRequest::new("throw { a: 1, get message() { return 'm' } }")).await;
    assert_eq!(err.message, r#"Uncaught {"a":1,"message":"[a getter]"}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_hooks_are_inert_and_host_errors_keep_their_code() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    let tamper = r#"'use strict';
        const spin = () => { for (;;) {} };
        const refused = [];
        for (const attempt of [
            () => { Error.prepareStackTrace = spin },
            () => Object.defineProperty(Error, 'prepareStackTrace', { get: spin }),
            () => { Error.stackTraceLimit = { valueOf: spin } },
            () => Object.defineProperty(Error, 'stackTraceLimit', { get: spin }),
            () => { delete Error.prepareStackTrace },
            () => { delete Error.stackTraceLimit },
            () => { class E extends Error {}; E.prepareStackTrace = spin },
        ]) { try { attempt(); refused.push(false) } catch (e) { refused.push(e instanceof TypeError) } }
        for (const k of ['name', 'message', 'stack', 'code', 'toString'])
            try { Object.defineProperty(Error.prototype, k, { get: spin, configurable: true }) } catch {}
        const limit = Error.stackTraceLimit, prepare = typeof Error.prepareStackTrace;
    "#;
    let caught = format!(
        "{tamper} let caught; try {{ await tools.fail('boom') }} catch (e) {{ caught = [e.code, e.name, e.message] }} \
         new Error('hooks stay off'); return [refused, limit, prepare, caught]"
    );
    let request = RunRequest::new(caught).host(host.clone()).limits(one_second());
    assert_eq!(
        completes(&runner, request, TWO_SECONDS, "tampering").await,
        json!([vec![true; 7], 10, "undefined", ["RUN_HOST_FUNCTION_ERROR", "HostFunctionError", "boom"]])
    );
    for (ending, code, message) in [
        ("await tools.fail('boom')", ErrorCode::HostFunctionError, "boom"),
        ("await tools.nope()", ErrorCode::HostFunctionError, "unknown host function tools.nope"),
        (
            "try { await tools.fail('orig') } catch (e) { e.message = 'forged'; Error.captureStackTrace(e); throw e }",
            ErrorCode::HostFunctionError,
            "orig",
        ),
        ("try { await tools.fail('orig') } catch (e) { throw Object.create(e) }", ErrorCode::Error, "Uncaught"),
        ("throw Object.assign(new Error('x'), { code: 'RUN_HOST_FUNCTION_ERROR' })", ErrorCode::Error, ""),
        ("await tools.echo(new Map())", ErrorCode::SerializationError, "an argument of tools.echo"),
    ] {
        let request = RunRequest::new(format!("{tamper} {ending}")).host(host.clone()).limits(one_second());
        let err = fails(&runner, request, code, TWO_SECONDS, ending).await;
        assert!(err.message.starts_with(message), "{ending}: {}", err.message);
    }
    still_works(&runner).await;
}

// ---------------------------------------------------------------------------
// Promises and thenables
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise_and_thenable_abuse_ends_the_run() {
    let runner = runner();
    let never = "nothing can settle";
    for (body, code, fragment) in [
        ("return { then() {} }", ErrorCode::Error, never),
        ("await { then() {} }; return 1", ErrorCode::Error, never),
        ("await new Promise(() => {})", ErrorCode::Error, never),
        ("await Promise.all([1, new Promise(() => {})])", ErrorCode::Error, never),
        ("return { then() { throw new Error('from then') } }", ErrorCode::Error, "from then"),
        ("return new Proxy({}, traps)", ErrorCode::SerializationError, "Proxy"),
        ("return Promise.resolve(new Proxy({}, traps))", ErrorCode::SerializationError, "Proxy"),
        (
            "let resolve; const p = new Promise(r => { resolve = r }); resolve(p); return p",
            ErrorCode::Error,
            "TypeError",
        ),
        ("const { proxy, revoke } = Proxy.revocable({}, {}); revoke(); return proxy", ErrorCode::Error, "revoked"),
        ("return { get then() { spin() } }", ErrorCode::Timeout, ""),
        ("const t = { then(r) { r(t) } }; return t", ErrorCode::Timeout, ""),
    ] {
        let request = RunRequest::new(format!("{SPIN_TRAPS} {body}")).limits(timeout_ms(500));
        let err = fails(&runner, request, code, TWO_SECONDS, body).await;
        assert!(err.message.contains(fragment), "{body}: {}", err.message);
    }
    for (body, expected) in [
        ("return { then(resolve) { resolve(1); resolve(2); throw new Error('late') } }", json!(1)),
        ("return new Proxy({}, { get: (t, k) => k === 'then' ? (resolve) => resolve(42) : undefined })", json!(42)),
        ("return { then: 5, a: 1 }", json!({ "then": 5, "a": 1 })),
        ("return { then(resolve) { resolve({ then(r) { r('twice adopted') } }) } }", json!("twice adopted")),
    ] {
        assert_eq!(completes(&runner, RunRequest::new(body), SECOND, body).await, expected, "{body}");
    }
    still_works(&runner).await;
}

/// Found while writing the pollution tests: scripts are compiled in a context
/// without the RegExp compiler, so any regular-expression literal is a syntax error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regexp_literals_compile() {
    let runner = runner();
    assert_eq!(value(&runner, RunRequest::new("return /a+/.exec('caab')[0]")).await, json!("aa"));
}

// ---------------------------------------------------------------------------
// Bridge floods
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_call_floods_hit_the_bridge_limit() {
    let runner = runner();
    for (source, most) in [
        ("for (let i = 0; i < 1000; i++) await tools.sum(i); return 'done'", 256),
        ("for (let i = 0; i < 1000; i++) try { await tools.sum(i) } catch {} return 'done'", 256),
        ("for (;;) tools.sum(1)", 32),
        ("for (;;) try { tools.sum(1) } catch {}", 32),
        ("let n = 0; for (let i = 0; i < 100000; i++) { try { tools.nope() } catch (e) { n++ } } return n", 0),
        ("for (let i = 0; i < 100000; i++) { try { await tools.nope(i) } catch {} } return 'done'", 0),
        ("const f = tools.missing; for (;;) { try { f() } catch {} }", 0),
        ("for (let i = 0; i < 1000; i++) { try { await tools.echo(new Map()) } catch {} } return 'done'", 0),
    ] {
        let tools = Tools::default();
        let request = RunRequest::new(source).host(tools.host()).limits(timeout_ms(5000));
        let err = fails(&runner, request, ErrorCode::BridgeLimit, TWO_SECONDS, source).await;
        assert!(err.message.contains("host calls"), "{source}: {}", err.message);
        assert!(tools.total() <= most, "{source}: the host ran {} times", tools.total());
    }
    still_works(&runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_functions_with_lone_surrogate_names_are_counted() {
    let runner = runner();
    let tools = Tools::default();
    let source = r#"try { tools['\uD800']() } catch (e) { return e.code }"#;
    assert_eq!(value(&runner, RunRequest::new(source).host(tools.host())).await, json!("RUN_HOST_FUNCTION_ERROR"));
    let flood =
        r#"let n = 0; for (let i = 0; i < 100000; i++) { try { tools['\uD800' + i]() } catch (e) { n++ } } return n"#;
    fails(&runner, RunRequest::new(flood).host(tools.host()), ErrorCode::BridgeLimit, TWO_SECONDS, flood).await;
}

// ---------------------------------------------------------------------------
// Console
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_output_is_inert_and_bounded() {
    let runner = runner();
    let source = format!(
        r#"{COUNTING}
        const count = () => {{ hits++; return 1 }};
        Object.defineProperty(Object.prototype, 'toJSON', {{ get: count, configurable: true }});
        Object.defineProperty(Object.prototype, Symbol.toPrimitive, {{ get: count, configurable: true }});
        const o = {{ get g() {{ return count() }}, toString: count, valueOf: count }};
        o.self = o;
        console.log(new Proxy({{}}, counting), [o.self, new Proxy([], counting)], new Map([[1, 2]]), new Date(0));
        console.info(o);
        console.warn({{ a: 'x'.repeat(100000) }});
        console.error('x'.repeat(10 * 2 ** 20));
        for (let i = 0; i < 100000; i++) console.log('line', i, o);
        delete Object.prototype.toJSON;
        return hits"#
    );
    let started = Instant::now();
    let outcome = run(&runner, RunRequest::new(source)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(outcome.completed().unwrap().value, json!(0), "no getter, trap, toJSON or conversion ran");
    let lines = outcome.console();
    let first = &lines[0].text;
    assert!(
        first.starts_with(r#""[a Proxy]" [{"#) && first.contains(r#""self":"[a cycle]"},"[a Proxy]"] "[an object"#),
        "{first}"
    );
    assert!(first.ends_with(r#" "1970-01-01T00:00:00.000Z""#), "{first}");
    assert!(lines[1].text.contains("[a getter]") && lines[1].text.contains("[a cycle]"), "{}", lines[1].text);
    assert_eq!(lines[2].text, "[value too large to print]");
    assert_eq!(lines.last().unwrap().level, ConsoleLevel::Truncated);
    let printed: usize = lines[..lines.len() - 1].iter().map(|l| l.text.len()).sum();
    assert!(printed <= 64 * 1024, "{printed} bytes kept");
    still_works(&runner).await;
}

// ---------------------------------------------------------------------------
// Ambient authority
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_shared_memory_weak_refs_or_code_from_strings() {
    let runner = runner();
    let tools = Tools::default();
    let source = r#"
        const routes = [
            () => Object.getPrototypeOf(async function* () {}).constructor('yield 1'),
            () => Object.getPrototypeOf(function* () {}).constructor('yield 1'),
            () => Object.getPrototypeOf(async () => {}).constructor('return 1'),
            () => globalThis.constructor.constructor('return 1')(),
            () => Object.getPrototypeOf(tools).constructor.constructor('return 1')(),
            () => tools.sum.constructor('return 1')(),
            () => tools.missing.constructor('return 1')(),
            () => console.log.constructor('return 1')(),
            () => Date.now.constructor('return 1')(),
            () => Date.constructor('return 1')(),
            () => Math.random.constructor('return 1')(),
            () => JSON.parse.constructor('return 1')(),
            () => Error.captureStackTrace.constructor('return 1')(),
            () => Promise.resolve().constructor.constructor('return 1')(),
            () => (async () => {})().then.constructor('return 1')(),
            () => new Proxy(function () {}, {}).constructor('return 1')(),
            () => Reflect.construct(Object.getPrototypeOf(async function* () {}).constructor, ['yield 1']),
            () => Object.getOwnPropertyDescriptor(Object.prototype, '__proto__').get.constructor('return 1')(),
            () => Object.getPrototypeOf(tools.sum).constructor('return 1')(),
            () => new (Object.getPrototypeOf(async function () {}).constructor)('return 1'),
            () => Symbol.prototype.toString.constructor('return 1')(),
        ];
        const outcomes = routes.map(f => { try { f(); return 'escaped' } catch (e) { return 'threw' } });
        return [typeof Atomics, typeof SharedArrayBuffer, typeof WeakRef, typeof FinalizationRegistry, typeof eval,
                'Atomics' in globalThis, 'SharedArrayBuffer' in globalThis, 'WeakRef' in globalThis,
                outcomes.every(o => o === 'threw') || outcomes]"#;
    assert_eq!(
        value(&runner, RunRequest::new(source).host(tools.host())).await,
        json!(["undefined", "undefined", "undefined", "undefined", "undefined", false, false, false, true])
    );
    assert_eq!(tools.total(), 0);
    still_works(&runner).await;
}

// ---------------------------------------------------------------------------
// Limits that must not be caught, and runs that must not leak into the next
// ---------------------------------------------------------------------------

/// QuickJS checks a frame's size before allocating it, so a function whose
/// frame is larger than the remaining stack throws a catchable RangeError
/// without ever writing into the painted guard band.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_the_stack_limit_cannot_be_caught() {
    let runner = runner();
    let vars: Vec<String> = (0..5000).map(|i| format!("v{i}")).collect();
    let source = format!(
        "function big() {{ var {}; return 1 }} try {{ big() }} catch (e) {{ return 'caught ' + e }} return 'ran'",
        vars.join(",")
    );
    let stack = LimitOverrides::new().with(Limit::Stack, 64 * 1024).unwrap();
    let err =
        fails(&runner, RunRequest::new(source).limits(stack), ErrorCode::StackOverflow, SECOND, "big frame").await;
    assert!(err.message.contains("stack limit"), "{}", err.message);
}

/// A run that ends with a latched error that does not throw the engine away
/// (here `RUN_PROTOCOL_ERROR`, when the script diverges from its continuation)
/// leaves its pending jobs in the worker's runtime; the *next* run on that
/// worker executes them, under its own deadline and memory budget. The same
/// happens without forging when only the per-run stack limit differs between
/// the first run and the resume (see the frame-size bug above). With a job
/// that calls an unknown host function in a loop, the next run's engine is
/// freed with live objects and the process aborts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_run_leaves_no_work_for_the_next_run() {
    for (job, what) in [("for (;;) {}", "a spinning job"), ("globalThis.x = 'y'.repeat(2 ** 27)", "an allocating job")]
    {
        let (runner, _) = single_worker();
        let tools = Tools::default();
        // The job is harmless in the first run (the call returns first) and
        // left pending in the resume (the call throws uncatchably first).
        let source = format!(
            "let reached = false; Promise.resolve().then(() => {{ if (!reached) {{ {job} }} }}); \
             const p = tools.approve(1); reached = true; return await p"
        );
        let first = run(&runner, RunRequest::new(source.clone()).host(tools.host())).await.unwrap();
        let token = first.interrupted().unwrap().continuation.clone();
        let forged = forge_replacing(&token, b"[1]", b"[2]");
        let resume =
            RunRequest::new(source).host(tools.host()).resume(forged, [Resolution::new("interrupt-1", json!(1))]);
        let err = fails(&runner, resume, ErrorCode::ProtocolError, TWO_SECONDS, "diverged resume").await;
        assert!(err.message.contains("diverged"), "{}", err.message);
        let next = RunRequest::new("return 'innocent'").limits(timeout_ms(500));
        assert_eq!(completes(&runner, next, TWO_SECONDS, what).await, json!("innocent"), "{what}");
    }
}
