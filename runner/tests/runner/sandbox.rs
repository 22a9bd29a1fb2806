use crate::common::*;
use resumable_runner::{ErrorCode, RunRequest};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambient_authority_is_absent() {
    let runner = runner();
    let names = [
        "eval",
        "WeakRef",
        "FinalizationRegistry",
        "SharedArrayBuffer",
        "Atomics",
        "performance",
        "setTimeout",
        "setInterval",
        "clearTimeout",
        "setImmediate",
        "queueMicrotask",
        "process",
        "require",
        "fetch",
        "XMLHttpRequest",
        "WebAssembly",
        "std",
        "os",
        "Deno",
        "Bun",
    ];
    let checks: Vec<String> = names.iter().map(|n| format!("typeof {n} === 'undefined'")).collect();
    let source = format!("return [{}]", checks.join(", "));
    let got = value(&runner, RunRequest::new(source)).await;
    for (name, present) in names.iter().zip(got.as_array().unwrap()) {
        assert_eq!(present, &json!(true), "{name} should be absent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dynamic_code_route_throws() {
    let runner = runner();
    let routes = [
        "Function('return 1')()",
        "new Function('return 1')()",
        "(function () {}).constructor('return 1')()",
        "(async function () {}).constructor('return 1')",
        "(function* () {}).constructor('yield 1')",
        "(async function* () {}).constructor('yield 1')",
        "(() => {}).constructor('return 1')()",
        "Reflect.construct(Function, ['return 1'])()",
        "Reflect.construct((async () => {}).constructor, ['return 1'])",
        "Object.getPrototypeOf(async function () {}).constructor('return 1')",
        "globalThis.constructor.constructor('return 1')()",
        "[].constructor.constructor('return 1')()",
        "(0, eval)('1')",
        "new (Object.getPrototypeOf(function* () {}).constructor)('yield 1')",
    ];
    for route in routes {
        let source =
            format!("try {{ const r = {route}; return 'escaped: ' + String(r) }} catch (e) {{ return 'threw' }}");
        assert_eq!(value(&runner, RunRequest::new(source)).await, json!("threw"), "{route}");
    }
    let source =
        "try { await import('data:text/javascript,export default 1'); return 'escaped' } catch (e) { return 'threw' }";
    assert_eq!(value(&runner, RunRequest::new(source)).await, json!("threw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_globals_are_pinned_and_error_hooks_are_inert() {
    let runner = runner();
    let attempts = r#"
        const refused = [];
        for (const attempt of [
          () => { Math.random = () => 4 },
          () => { Date.now = () => 4 },
          () => { globalThis.Date = function () { return 4 } },
          () => { Object.defineProperty(globalThis, 'Math', { value: { random: () => 4 } }) },
          () => { Error.prepareStackTrace = () => 'hooked' },
          () => { Error.stackTraceLimit = { valueOf() { throw 'hooked' } } },
          () => { console.log = () => 4 },
        ]) {
          try { attempt(); } catch (e) { refused.push(e instanceof TypeError) }
        }
        const unchanged = [Math.random() < 1, Date.now() !== 4, typeof new Date().getTime() === 'number',
          !String(new Error('x').stack).includes('hooked'), typeof console.log === 'function'];
        return [refused, unchanged]"#;
    let sloppy = value(&runner, RunRequest::new(attempts)).await;
    assert_eq!(sloppy[1], json!([true, true, true, true, true]));
    let strict = value(&runner, RunRequest::new(format!("'use strict';\n{attempts}"))).await;
    assert_eq!(strict[0], json!([true, true, true, true, true, true, true]), "strict mode reports each refusal");
    assert_eq!(strict[1], sloppy[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_keeps_working_with_a_deterministic_now() {
    let runner = runner();
    let source = "const a = new Date(); const b = Date.now(); class D extends Date {}; \
                  return [a.getTime() === b, new Date(0).toISOString(), typeof Date(), new D(5).getTime(), new D() instanceof Date, Date.UTC(2020, 0, 1)]";
    let got = value(&runner, RunRequest::new(source)).await;
    assert_eq!(got, json!([true, "1970-01-01T00:00:00.000Z", "string", 5, true, 1577836800000u64]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_closes_its_wrapper_early_is_a_syntax_error_and_nothing_runs() {
    let runner = runner();
    let tools = Tools::default();
    for source in [
        "return 1; }); tools.effect(); (async function () { return 2;",
        "return 1; })(); tools.effect(); ({",
        "}) + tools.effect() + (function () {",
        "} + { a: tools.effect() ",
        "}(tools.effect()), ({",
    ] {
        let err = error(&runner, RunRequest::new(source).host(tools.host())).await;
        assert_code(&err, ErrorCode::Error);
        assert!(err.message.contains("SyntaxError"), "{source}: {err}");
    }
    assert_eq!(tools.count("effect"), 0, "no code outside the body ran");
    // Bodies that only look as if they close something, or use what a function body may, run.
    for (source, expected) in [
        ("const s = '}); (function () {'; /* }) */ return s.length", json!(18)),
        ("'use strict'; return f(); function f() { return 7 }", json!(7)),
        ("label: { break label; } return `${'}'}`", json!("}")),
        ("let n = 0; for (const x of [1, 2]) { if (x) { n += x; } } return n", json!(3)),
    ] {
        assert_eq!(value(&runner, RunRequest::new(source)).await, expected, "{source}");
    }
}
