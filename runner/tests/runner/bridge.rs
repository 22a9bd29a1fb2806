use crate::common::*;
use resumable_runner::{ErrorCode, Limit, LimitOverrides, RunRequest};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_return_values_and_know_their_context() {
    let runner = runner();
    let tools = Tools::default();
    let host = tools.host();
    assert_eq!(
        value(&runner, RunRequest::new("return await tools.sum(1, 2, 3, 4)").host(host.clone())).await,
        json!(10)
    );
    let source = "const r = await Promise.all([tools.index(), tools.index(), tools.index()]); return r";
    let got = value(&runner, RunRequest::new(source).host(host.clone()).logical_run_id("run-42")).await;
    let indexes: Vec<u64> = got.as_array().unwrap().iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, [1, 2, 3], "distinct, in call order, valid after an await");
    assert!(got.as_array().unwrap().iter().all(|r| r["function"] == "tools.index" && r["run"] == "run-42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_run_concurrently() {
    let runner = runner();
    let host = Tools::default().host();
    let source =
        "const all = []; for (let i = 0; i < 10; i++) all.push(tools.wait(20, i)); return await Promise.all(all)";
    let started = Instant::now();
    let got = value(&runner, RunRequest::new(source).host(host)).await;
    let elapsed = started.elapsed();
    assert_eq!(got, json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]));
    assert!(elapsed < Duration::from_millis(150), "10 parallel 20 ms calls took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_errors_are_catchable_with_a_stable_code() {
    let runner = runner();
    let host = Tools::default().host();
    let source =
        "try { await tools.fail('out of stock') } catch (e) { return [e.name, e.code, e.message, e instanceof Error] }";
    assert_eq!(
        value(&runner, RunRequest::new(source).host(host.clone())).await,
        json!(["HostFunctionError", "RUN_HOST_FUNCTION_ERROR", "out of stock", true])
    );
    let err = error(&runner, RunRequest::new("await tools.fail('boom')").host(host.clone())).await;
    assert_code(&err, ErrorCode::HostFunctionError);
    assert_eq!(err.message, "boom");
    // Typed arguments are checked and the failure names the argument.
    let source = "try { await orders.refund('o1', '10') } catch (e) { return [e.code, e.message] }";
    let got = value(&runner, RunRequest::new(source).host(host.clone())).await;
    assert_eq!(got[0], "RUN_HOST_FUNCTION_ERROR");
    assert!(got[1].as_str().unwrap().contains("argument 2 (amount)"), "{got}");
    assert_eq!(
        value(&runner, RunRequest::new("return await orders.refund('o1', 10)").host(host.clone())).await,
        json!({ "refunded": "o1", "amount": 10 })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_functions_list_what_exists() {
    let runner = runner();
    let host = Tools::default().host();
    let source = "try { await tools.nope(1) } catch (e) { return [e.code, e.message] }";
    let got = value(&runner, RunRequest::new(source).host(host.clone())).await;
    assert_eq!(got[0], "RUN_HOST_FUNCTION_ERROR");
    let message = got[1].as_str().unwrap();
    assert!(
        message.contains("tools.nope") && message.contains("tools.sum") && message.contains("orders.refund"),
        "{message}"
    );
    let err = error(&runner, RunRequest::new("await tools.nope()").host(host.clone())).await;
    assert_code(&err, ErrorCode::HostFunctionError);
    // Namespaces still behave like plain objects.
    let got = value(
        &runner,
        RunRequest::new("return [typeof tools.then, typeof tools.toString, Object.isFrozen(tools)]").host(host),
    )
    .await;
    assert_eq!(got, json!(["undefined", "function", true]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_calls_fail_the_run() {
    let runner = runner();
    let host = Tools::default().host();
    let err = error(&runner, RunRequest::new("tools.wait(50); return 1").host(host)).await;
    assert_code(&err, ErrorCode::DetachedBridgeRequest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_limits_stop_before_the_host_runs_again() {
    let runner = runner();
    let tools = Tools::default();
    let one_call = LimitOverrides::new().with(Limit::HostCalls, 1).unwrap();
    let source = "await tools.effect(); try { await tools.effect() } catch {} return 'caught'";
    let err = error(&runner, RunRequest::new(source).host(tools.host()).limits(one_call)).await;
    assert_code(&err, ErrorCode::BridgeLimit);
    assert_eq!(tools.count("effect"), 1);

    let tools = Tools::default();
    let one_in_flight = LimitOverrides::new().with(Limit::HostCallsInFlight, 1).unwrap();
    let source = "try { await Promise.all([tools.effect(), tools.effect()]) } catch {} return 'caught'";
    let err = error(&runner, RunRequest::new(source).host(tools.host()).limits(one_in_flight)).await;
    assert_code(&err, ErrorCode::BridgeLimit);
    // Calls start only once the script waits: the second call is refused before the first starts.
    assert_eq!(tools.count("effect"), 0);

    let tools = Tools::default();
    let small = LimitOverrides::new().with(Limit::HostCallArguments, 100).unwrap();
    let err =
        error(&runner, RunRequest::new("await tools.echo('x'.repeat(200))").host(tools.host()).limits(small)).await;
    assert_code(&err, ErrorCode::BridgeLimit);
    assert_eq!(tools.count("echo"), 0);

    let small = LimitOverrides::new().with(Limit::HostCallOutput, 100).unwrap();
    let err =
        error(&runner, RunRequest::new("await tools.echo('x'.repeat(200))").host(tools.host()).limits(small)).await;
    assert_code(&err, ErrorCode::BridgeLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_cross_as_json_with_documented_rules() {
    let runner = runner();
    let host = Tools::default().host();
    let source = r#"return await tools.echo({
        u: undefined, n: null, z: -0, arr: [1, undefined, , 3], d: new Date(0), s: 'é\u{1F600}',
        nested: {a: {b: [true, false]}}, ['__proto__']: {polluted: true}
    })"#;
    let got = value(&runner, RunRequest::new(source).host(host.clone())).await;
    assert_eq!(
        got,
        json!({ "n": null, "z": 0, "arr": [1, null, null, 3], "d": "1970-01-01T00:00:00.000Z", "s": "é😀",
                "nested": {"a": {"b": [true, false]}}, "__proto__": {"polluted": true} })
    );
    // A host-provided __proto__ key stays an own property: no pollution.
    let source = "const v = await tools.echo(JSON.parse('{\"__proto__\": {\"polluted\": 1}}')); \
                  return [Object.keys(v), ({}).polluted === undefined, Object.getPrototypeOf(v) === Object.prototype]";
    assert_eq!(value(&runner, RunRequest::new(source).host(host.clone())).await, json!([["__proto__"], true, true]));
    for (expr, path, what) in [
        ("{items: [1, {handler() {}}]}", "args[0].items[1].handler", "function"),
        ("{x: NaN}", "args[0].x", "NaN"),
        ("[Infinity]", "args[0][0]", "infinite"),
        ("{b: 10n}", "args[0].b", "BigInt"),
        ("{m: new Map()}", "args[0].m", "Map"),
        ("(() => { const a = {}; a.self = a; return a })()", "args[0].self", "cycle"),
        ("{get g() { return 1 }}", "args[0].g", "getter"),
        ("{'odd key': Symbol('s')}", "args[0][\"odd key\"]", "symbol"),
        ("new Proxy({}, {})", "args[0]", "Proxy"),
        ("new Date(NaN)", "args[0]", "invalid Date"),
    ] {
        let source = format!("try {{ await tools.echo({expr}) }} catch (e) {{ return [e.code, e.message] }}");
        let got = value(&runner, RunRequest::new(source).host(host.clone())).await;
        assert_eq!(got[0], "RUN_SERIALIZATION_ERROR", "{expr}: {got}");
        let message = got[1].as_str().unwrap();
        assert!(message.contains(path) && message.contains(what), "{expr}: {message}");
    }
    let err = error(&runner, RunRequest::new("return {f() {}}")).await;
    assert_code(&err, ErrorCode::SerializationError);
    assert!(err.message.contains("result.f"), "{}", err.message);
    let small = LimitOverrides::new().with(Limit::Result, 10).unwrap();
    let err = error(&runner, RunRequest::new("return 'x'.repeat(100)").limits(small)).await;
    assert_code(&err, ErrorCode::SerializationError);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getters_and_to_json_never_run_on_the_host_path() {
    let runner = runner();
    let tools = Tools::default();
    let source = r#"
        let touched = 0;
        Object.defineProperty(Object.prototype, 'toJSON', { get() { touched++; return () => 'hijacked' } });
        Object.defineProperty(Array.prototype, 0, { get() { touched++; return 'proto' }, configurable: true });
        const r = await tools.echo({ a: [ , 2] });
        try { await tools.echo({ get g() { touched++; return 1 } }) } catch {}
        return [r, touched]"#;
    assert_eq!(value(&runner, RunRequest::new(source).host(tools.host())).await, json!([{ "a": [null, 2] }, 0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_nobody_awaits_when_the_script_returns_never_runs() {
    let runner = runner();
    let tools = Tools::default();
    for source in ["tools.effect(); return 1", "tools.effect(); tools.echo('x'); return await Promise.resolve(2)"] {
        let err = error(&runner, RunRequest::new(source).host(tools.host())).await;
        assert_code(&err, ErrorCode::DetachedBridgeRequest);
        assert!(err.message.contains("not started"), "{err}");
    }
    assert_eq!(tools.total(), 0, "no effect happened in a run that was then lost");
    // Awaited, the same calls run.
    let done = value(&runner, RunRequest::new("await tools.effect(); return 1").host(tools.host())).await;
    assert_eq!((done, tools.count("effect")), (json!(1), 1));
}
