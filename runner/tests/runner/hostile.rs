use crate::common::*;
use resumable_runner::{Limit, LimitOverrides, Outcome, RunRequest};
use std::time::Instant;

fn show(r: &Result<Outcome, resumable_runner::RunError>) -> String {
    let s = match r {
        Ok(Outcome::Completed(c)) => format!(
            "OK {} console={:?}",
            c.value,
            c.console.iter().map(|l| l.text.chars().take(200).collect::<String>()).collect::<Vec<_>>()
        ),
        Ok(o) => format!("{o:?}"),
        Err(e) => format!("ERR {} {}", e.code, e.message),
    };
    s.chars().take(600).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe() {
    let runner = runner();
    let tools = Tools::default();
    let filter = std::env::var("PROBE").unwrap_or_default();
    let probes: Vec<(&str, String, LimitOverrides)> = vec![
        ("len32", "const a = []; a.length = 2**32-1; return a".into(), LimitOverrides::new()),
        ("len32arg", "const a = []; a.length = 2**32-1; return await tools.echo(a)".into(), LimitOverrides::new()),
        ("len32argc", "const a = []; a.length = 2**32-1; try { await tools.echo(a) } catch (e) { return [e.code, e.message] }".into(), LimitOverrides::new()),
        ("surr", "return ['a\\uD800b', {'\\uDC00k': '\\uD83D'}]".into(), LimitOverrides::new()),
        ("surrhost", "return await tools.echo(['a\\uD800b', {'\\uDC00k': '\\uD83D'}])".into(), LimitOverrides::new()),
        ("big", "return 'x'.repeat(50*2**20)".into(), LimitOverrides::new()),
        ("bighost", "return await tools.echo('x'.repeat(50*2**20))".into(), LimitOverrides::new()),
        ("bigmem", "return 'x'.repeat(50*2**20)".into(), LimitOverrides::new().with(Limit::Memory, 16*1024*1024).unwrap()),
        ("deep", "let v = 0; for (let i = 0; i < 100000; i++) v = [v]; return v".into(), LimitOverrides::new()),
        ("deepo", "let v = 0; for (let i = 0; i < 100000; i++) v = {v}; return v".into(), LimitOverrides::new()),
        ("deeparg", "let v = 0; for (let i = 0; i < 100000; i++) v = {v}; try { await tools.echo(v) } catch (e) { return [e.code, e.message.slice(0, 100)] }".into(), LimitOverrides::new()),
        ("deepparse", "try { JSON.parse('['.repeat(100000) + ']'.repeat(100000)); return 'parsed' } catch (e) { return String(e) }".into(), LimitOverrides::new()),
        ("deepsrc", format!("return {}1{}", "(".repeat(100000), ")".repeat(100000)), LimitOverrides::new().with(Limit::Source, 1<<20).unwrap()),
        ("deepsrcarr", format!("return {}1{}", "[".repeat(100000), "]".repeat(100000)), LimitOverrides::new().with(Limit::Source, 1<<20).unwrap()),
        ("deepsrcobj", format!("return {}{}", "{a:".repeat(50000), "}".repeat(50000)), LimitOverrides::new().with(Limit::Source, 1<<20).unwrap()),
        ("bigframe", format!("function big() {{ var {}; return 1 }} try {{ big(); return 'ran' }} catch (e) {{ return 'caught ' + e }}", (0..5000).map(|i| format!("v{i}")).collect::<Vec<_>>().join(",")), LimitOverrides::new().with(Limit::Stack, 64*1024).unwrap()),
        ("thenable", "return { then() {} }".into(), LimitOverrides::new()),
        ("thenthrow", "return { then() { throw new Error('t') } }".into(), LimitOverrides::new()),
        ("proxyres", "let n = 0; const p = new Proxy({}, new Proxy({}, { get() { n++; return undefined } })); return p".into(), LimitOverrides::new()),
        ("throwproxy", "throw new Proxy({}, { get() { throw 'trap' } })".into(), LimitOverrides::new()),
        ("throwsym", "throw Symbol('s')".into(), LimitOverrides::new()),
        ("thrownull", "throw null".into(), LimitOverrides::new()),
        ("throwundef", "throw undefined".into(), LimitOverrides::new()),
        ("throwgetter", "throw { get message() { while(1){} }, get name() { while(1){} }, get stack() { while(1){} } }".into(), LimitOverrides::new()),
        ("throwerrgetter", "const e = new Error('m'); Object.defineProperty(e, 'message', { get() { while(1){} } }); Object.defineProperty(e, 'name', { get() { while(1){} } }); throw e".into(), LimitOverrides::new()),
        ("throwerrstack", "const e = new Error('m'); Object.defineProperty(e, 'stack', { get() { while(1){} } }); throw e".into(), LimitOverrides::new()),
        ("throwerrproto", "class E extends Error { get name() { while(1){} } get stack() { while(1){} } }; throw new E('x')".into(), LimitOverrides::new()),
        ("throwerrprotoerr", "Object.defineProperty(Error.prototype, 'name', { get() { while(1){} } }); throw new Error('x')".into(), LimitOverrides::new()),
        ("prepare", "try { Error.prepareStackTrace = () => { while(1){} } } catch {} try { Error.stackTraceLimit = 1e9 } catch {} ; class E extends Error {}; try { E.prepareStackTrace = () => { while(1){} } } catch (e) { return String(e) } throw new E('x')".into(), LimitOverrides::new()),
        ("objthen", "Object.prototype.then = function (r) { r('hijacked') }; const v = await tools.echo({a: 1}); const n = await tools.sum(1, 2); delete Object.prototype.then; return [v, n]".into(), LimitOverrides::new()),
        ("objthenget", "let hits = 0; Object.defineProperty(Object.prototype, 'then', { get() { hits++; return undefined }, configurable: true }); const v = await tools.echo({a: 1}); const n = await tools.sum(1, 2); delete Object.prototype.then; return [v, n, hits]".into(), LimitOverrides::new()),
        ("objthenreturn", "Object.prototype.then = function (r) { r('hijacked') }; return {a: 1}".into(), LimitOverrides::new()),
        ("unknownloop", "let n = 0; for (let i = 0; i < 100000; i++) { try { tools.nope() } catch (e) { n++ } } return n".into(), LimitOverrides::new()),
        ("manycalls", "const a = []; for (let i = 0; i < 1000; i++) a.push(tools.sum(i)); return (await Promise.all(a)).length".into(), LimitOverrides::new().with(Limit::HostCallsInFlight, 1024).unwrap()),
        ("consolehostile", "let n = 0; const o = { get g() { n++; return 1 } }; o.self = o; console.log(o, new Proxy({}, { get() { n++ } }), 'x'.repeat(1e6), [o]); return n".into(), LimitOverrides::new()),
        ("absent", "return [typeof Atomics, typeof SharedArrayBuffer, typeof WeakRef, typeof globalThis.constructor, (()=>{ try { return Object.getPrototypeOf(async function*(){}).constructor('return 1') } catch (e) { return String(e) } })()]".into(), LimitOverrides::new()),
        ("mapiter", "Map.prototype[Symbol.iterator] = function* () { while(1){} }; Map.prototype.entries = function* () { while(1) {} }; return new Map([[1,2]])".into(), LimitOverrides::new()),
        ("ctl", "return '\\x01'.repeat(50*2**20)".into(), LimitOverrides::new()),
        ("ctlhost", "return await tools.echo('\\x01'.repeat(50*2**20))".into(), LimitOverrides::new()),
        ("ctlconsole", "console.log('\\x01'.repeat(50*2**20)); return 1".into(), LimitOverrides::new()),
        ("d200", "let v = 0; for (let i = 0; i < 200; i++) v = [v]; return v".into(), LimitOverrides::new()),
        ("d200arg", "let v = 0; for (let i = 0; i < 200; i++) v = [v]; const r = await tools.echo(v); return r === null ? 'host got nothing' : 'ok'".into(), LimitOverrides::new()),
        ("d130arg", "let v = 0; for (let i = 0; i < 130; i++) v = [v]; const r = await tools.echo(v); return r === null ? 'host got nothing' : 'ok'".into(), LimitOverrides::new()),
        ("d120arg", "let v = 0; for (let i = 0; i < 120; i++) v = [v]; const r = await tools.echo(v); return r === null ? 'host got nothing' : 'ok'".into(), LimitOverrides::new()),
        ("d200int", "let v = 0; for (let i = 0; i < 200; i++) v = [v]; return await tools.approve(v)".into(), LimitOverrides::new()),
        ("consolefmt", "console.log({get g() { return 1 }, b: 2}, [1, {get x() {}}], new Proxy({}, {}), {f() {}}, Symbol('s'), 10n, undefined, null, NaN, new Map()); return 1".into(), LimitOverrides::new()),
        ("thenreent", "let hits = 0; Object.defineProperty(Object.prototype, 'then', { get() { hits++; if (hits < 5) tools.effect().catch(() => {}); return undefined }, configurable: true }); const v = await tools.echo({a: 1}); const w = await tools.echo({b: 2}); delete Object.prototype.then; return [v, w, hits]".into(), LimitOverrides::new()),
        ("thenloop", "Object.defineProperty(Object.prototype, 'then', { get() { for(;;){} }, configurable: true }); await tools.echo({a: 1}); return 1".into(), LimitOverrides::new().with(Limit::Timeout, 300).unwrap()),
        ("thenthrowget", "Object.defineProperty(Object.prototype, 'then', { get() { throw new Error('from getter') }, configurable: true }); try { await tools.echo({a: 1}) } catch (e) { return String(e) } return 'no'".into(), LimitOverrides::new()),
        ("thenfail", "Object.prototype.then = function (res, rej) { rej('nope') }; try { await tools.fail('x') } catch (e) { return [e.code, e.message] }".into(), LimitOverrides::new()),
        ("thenfailunc", "Object.prototype.then = function (res, rej) { res(1) }; await tools.fail('x')".into(), LimitOverrides::new()),
        ("thenuncaught", "Object.prototype.then = function (res, rej) { res(1) }; return await tools.fail('x')".into(), LimitOverrides::new()),
        ("arrsetter", "let hits = 0; Object.defineProperty(Array.prototype, 0, { set(v) { hits++ }, get() { hits++ }, configurable: true }); Object.defineProperty(Object.prototype, 'a', { set(v) { hits++ }, get() { hits++ }, configurable: true }); const v = await tools.echo({a: [1, 2]}); const r = [v.a[0], v.a[1], Object.keys(v)]; delete Array.prototype[0]; delete Object.prototype.a; return [r, hits]".into(), LimitOverrides::new()),
        ("fnproto", "Function.prototype.call = () => { throw 'x' }; Function.prototype.apply = () => { throw 'x' }; Function.prototype.bind = () => { throw 'x' }; Array.prototype[Symbol.iterator] = function* () { throw 'x' }; Object.defineProperty = () => { throw 'x' }; Reflect.get = () => { throw 'x' }; Object.prototype.toString = () => { throw 'x' }; String.prototype.toString = () => { throw 'x' }; return [await tools.sum(1, 2), await tools.echo([1, {a: 'b'}]), await tools.nope().catch(e => e.code)]".into(), LimitOverrides::new()),
        ("surrname", "let n = 0; for (let i = 0; i < 1000; i++) { try { tools['\\uD800' + i]() } catch (e) { n++ } } return n".into(), LimitOverrides::new()),
        ("surrname1", "try { tools['\\uD800']() } catch (e) { return [e.code, e.message.slice(0, 60)] }".into(), LimitOverrides::new()),
        ("classinst", "return new (class A { constructor() { this.x = 1 } })()".into(), LimitOverrides::new()),
        ("capture", "try { Error.captureStackTrace(tools) } catch (e) { return String(e) } return Object.getOwnPropertyNames(tools)".into(), LimitOverrides::new()),
        ("rethrow", "try { await tools.fail('orig') } catch (e) { e.message = 'forged'; e.code = 'X'; Error.captureStackTrace(e); throw e }".into(), LimitOverrides::new()),
        ("forge", "throw Object.assign(new Error('x'), { code: 'RUN_BRIDGE_LIMIT', name: 'HostFunctionError' })".into(), LimitOverrides::new()),
        ("errproxyproto", "const e = new Error('m'); Object.setPrototypeOf(e, new Proxy({}, { get() { for(;;){} }, getPrototypeOf() { for(;;){} }, has() { for(;;){} }, getOwnPropertyDescriptor() { for(;;){} } })); throw e".into(), LimitOverrides::new()),
        ("errhuge", "throw new Error('m'.repeat(1e7))".into(), LimitOverrides::new()),
        ("errstackcheck", "function f() { throw new Error('deep') } f()".into(), LimitOverrides::new()),
        ("stl", "'use strict'; const r = []; for (const f of [() => { Error.prepareStackTrace = () => 1 }, () => Object.defineProperty(Error, 'prepareStackTrace', { get() { for(;;){} } }), () => { Error.stackTraceLimit = { valueOf() { for(;;){} } } }, () => { delete Error.stackTraceLimit }]) { try { f(); r.push('allowed') } catch (e) { r.push(e.constructor.name) } } return [r, Error.stackTraceLimit, typeof Error.prepareStackTrace]".into(), LimitOverrides::new()),
        ("setres", "return new Set([1])".into(), LimitOverrides::new()),
    ];
    for (name, src, limits) in probes {
        if !filter.is_empty() && !filter.split(',').any(|f| f == name) {
            continue;
        }
        let started = Instant::now();
        let r = runner
            .run(RunRequest::new(src).host(tools.host()).limits(limits.with(Limit::Timeout, 2000).unwrap()))
            .await;
        let hwm = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("VmHWM"))
            .unwrap()
            .to_string();
        eprintln!("{hwm}");
        eprintln!("{name:16} {:>6}ms {}", started.elapsed().as_millis(), show(&r));
        let r = runner.run(RunRequest::new("return 1")).await;
        if !matches!(r, Ok(Outcome::Completed(_))) {
            eprintln!("   NEXT RUN: {}", show(&r));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_leftover() {
    use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
    use resumable_runner::{DEFAULT_AUDIENCE, Runner, RunnerConfig};
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let runner = Runner::new(RunnerConfig::new().workers(1).codec(codec.clone())).unwrap();
    let tools = Tools::default();
    let body = std::env::var("JOB").unwrap_or("for (;;) {}".into());
    let source = format!(
        "let reached = false; Promise.resolve().then(() => {{ if (!reached) {{ {body} }} }}); const p = tools.approve(1); reached = true; return await p"
    );
    let r = runner.run(RunRequest::new(source.clone()).host(tools.host())).await.unwrap();
    let token = r.interrupted().unwrap().continuation.clone();
    let mut bytes = codec.decode(&token, DEFAULT_AUDIENCE, std::time::SystemTime::now()).unwrap();
    let at = bytes.windows(3).position(|w| w == b"[1]").unwrap();
    bytes[at + 1] = b'2';
    let forged = codec.encode(&bytes, DEFAULT_AUDIENCE, std::time::SystemTime::now());
    let r = runner
        .run(
            RunRequest::new(source)
                .host(tools.host())
                .resume(forged, [resumable_runner::Resolution::new("interrupt-1", serde_json::json!(1))]),
        )
        .await;
    eprintln!("resume: {}", show(&r));
    let started = Instant::now();
    let r = runner.run(RunRequest::new("return 1").limits(timeout_ms(500))).await;
    eprintln!("next: {} after {:?}; effects {}", show(&r), started.elapsed(), tools.total());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_deep_host() {
    use resumable_runner::host::HostFunctions;
    let runner = runner();
    let host = HostFunctions::builder()
        .function("deep.make", |_ctx, args| async move {
            let depth = args.first().and_then(serde_json::Value::as_u64).unwrap_or(0);
            let mut v = serde_json::json!(0);
            for _ in 0..depth {
                v = serde_json::Value::Array(vec![v]);
            }
            Ok(v)
        })
        .build()
        .unwrap();
    for n in [100u64, 300, 1000, 5000] {
        let src = format!(
            "let v; try {{ v = await deep.make({n}) }} catch (e) {{ return [e.code, e.message] }} let d = 0; while (Array.isArray(v)) {{ v = v[0]; d++ }} return d"
        );
        let r = runner.run(RunRequest::new(src).host(host.clone())).await;
        eprintln!("deep {n}: {}", show(&r));
        let r = runner.run(RunRequest::new("return 1")).await;
        if !matches!(r, Ok(Outcome::Completed(_))) {
            eprintln!("   NEXT RUN: {}", show(&r));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_legit_divergence() {
    use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
    use resumable_runner::{Runner, RunnerConfig};
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let runner = Runner::new(RunnerConfig::new().workers(1).codec(codec.clone())).unwrap();
    let tools = Tools::default();
    let vars = (0..5000).map(|i| format!("v{i}")).collect::<Vec<_>>().join(",");
    let source = format!(
        "let reached = false; Promise.resolve().then(() => {{ if (!reached) for (;;) {{}} }}); function big() {{ var {vars}; return 1 }} let small = false; try {{ big() }} catch {{ small = true }} const p = tools.approve(small ? 2 : 1); reached = true; return await p"
    );
    let r = runner.run(RunRequest::new(source.clone()).host(tools.host())).await.unwrap();
    let token = r.interrupted().unwrap().continuation.clone();
    let r = runner
        .run(
            RunRequest::new(source)
                .host(tools.host())
                .limits(LimitOverrides::new().with(Limit::Stack, 64 * 1024).unwrap())
                .resume(token, [resumable_runner::Resolution::new("interrupt-1", serde_json::json!(1))]),
        )
        .await;
    eprintln!("resume: {}", show(&r));
    let r = runner.run(RunRequest::new("return 1").limits(timeout_ms(500))).await;
    eprintln!("next: {}", show(&r));
}
