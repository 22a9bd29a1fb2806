//! A model-based property test of replay: thousands of generated scripts are run
//! round by round through interruptions and compared with an uninterrupted
//! reference run of the same script.
//!
//! # The generated scripts
//!
//! Every trace is a script that calls three host functions, all taking
//! `(T, label, delay, x)` where `T` is the trace id and `label` names the call
//! site (with the loop counters appended inside loops), so every call of every
//! trace is counted under its own key:
//!
//! * `m.ok` waits (`delay` 0: not at all, so it settles on its first poll; 1: one
//!   tokio yield; 2-3: a yield and a 1-2 ms tokio sleep, to vary settle order) and
//!   fulfils with a value derived from `label` and `x`;
//! * `m.fail` waits and rejects (with JSON details for some labels);
//! * `m.ask` waits and interrupts with `{label, x}`; resumed, it returns the
//!   decision. In the reference run it returns the same decision instead.
//!
//! Decisions are derived from the interruption id and the call's arguments
//! ([`decision`]), so the driver and the reference host agree on them.
//!
//! The generator covers (see [`Gen::statement`]):
//! * sequential calls of every kind, with arguments computed from earlier
//!   results (`acc % 1000`, loop counters), so data flows through the ledger;
//! * `try/catch/finally` around sequences that may reject part-way (the calls
//!   after a rejection are never made);
//! * `Promise.all` batches of 2-3 `ok`/`ask` calls (one round may hold several
//!   interruptions), and `Promise.all` batches with exactly one rejecting call
//!   inside `try` followed by `Promise.allSettled` of the same promises;
//! * `Promise.allSettled` batches of any kinds;
//! * `Promise.race` of 2-3 `ok`/`fail` calls whose winner is determined by
//!   construction (the first call with no delay wins: it settles on its first
//!   poll, before any call that waits; see [`pause`]): its result is folded
//!   into the compared value;
//! * `Promise.race` of any kinds and delays (`ask` included), whose winner
//!   depends on timing and on which interruptions were resolved: its result is
//!   only logged (see below), never compared with the reference;
//! * `for` loops (nested up to two deep) and `if/else` on the accumulated value;
//! * `Date.now()`, `new Date()` and `Math.random()` samples, and pure computation.
//!
//! # The properties
//!
//! The driver runs a trace round by round: while the outcome is `Interrupted`,
//! it resolves all pending interruptions or a random non-empty subset of them (and
//! rarely first checks that a resume deciding none is refused), and resumes with the
//! continuation. Then it checks:
//!
//! 1. every `ok`/`fail` call reached the host exactly once over all rounds, every
//!    `ask` exactly twice (first without, then with `resume` naming its own
//!    interruption id, payload and decision), at the same call index as in the
//!    reference run, with the logical run id of the trace; the set of calls is the
//!    reference's;
//! 2. the returned `trail` (every folded result, in order) and `acc` (a checksum
//!    of them that also drives arguments and branches) equal the reference run's;
//! 3. time, randomness and timing-dependent race winners are not compared with
//!    the reference (they differ by design) but must replay exactly: each round's
//!    console output is a prefix of the next round's, and the final `log` the
//!    script returns equals the final round's console;
//! 4. pending interruptions behave: ids are `interrupt-<index>` in call order with
//!    the call's function, arguments and payload; an unresolved one stays pending,
//!    a resolved one never comes back, a round resumed with no resolution ends
//!    exactly like the one before, and a run completes only when none is left.
//!
//! Failures print the trace id, the seed and the script. `REPLAY_MODEL_TRACES`,
//! `REPLAY_MODEL_SEED` and `REPLAY_MODEL_FIRST` (first trace id) change what
//! runs: `REPLAY_MODEL_FIRST=26 REPLAY_MODEL_TRACES=1` reruns trace 26 alone
//! (same script and resolution choices; host timing may differ).
//!
//! Found while writing it: retired realms were never collected (fixed then;
//! realms are now restored from an image, see `every_run_starts_from_the_image`
//! in `runner/src/sandbox/engine.rs`).

use resumable_runner::codec::{SignedCodec, SignedCodecConfig};

/// Its own test binary: cargo runs binaries one after another, so this
/// CPU-heavy suite never competes with the timing-sensitive runner tests.
const SECRET: &[u8] = b"an-example-secret-of-at-least-32-bytes!!";
use resumable_runner::host::{HostCallContext, HostError, HostFunctions};
use resumable_runner::{ConsoleLine, ErrorCode, Interruption, Outcome, Resolution, RunRequest, Runner, RunnerConfig};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DEFAULT_TRACES: u64 = 10_000;
const DEFAULT_SEED: u64 = 0x005E_ED2E_B1A7_0DE1;
/// Runners, each with one worker thread. A worker waiting on a sleeping host call
/// uses no CPU, so more workers than cores keep both cores busy. One worker per
/// runner keeps the runs of a trace on one worker, which compiles the script once.
const RUNNERS: usize = 6;
/// Traces driven at the same time on each runner.
const TRACES_PER_WORKER: usize = 3;
/// `ask` call sites per script (loops multiply them).
const MAX_ASK_SITES: u32 = 3;
const MAX_ROUNDS: usize = 64;
/// Traces run on one runner before it is replaced (see [`Model::runner`]).
const TRACES_PER_RUNNER: u64 = 500;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ok,
    Fail,
    Ask,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Fail => "fail",
            Kind::Ask => "ask",
        }
    }
}

/// The script text every trace starts with (`T` and the initial `acc` follow).
const PRELUDE: &str = r#"const trail = [];
const log = [];
const fold = (v) => {
  const n = typeof v === "number" ? v : v === undefined ? 1 : JSON.stringify(v).length;
  acc = (acc * 31 + n) % 1000003;
  trail.push(v === undefined ? null : v);
};
const note = (v) => { const s = JSON.stringify(v); log.push(s); console.log(s); };
const settle = (p) => p.then((v) => ["ok", v], (e) => ["err", e.message]);
"#;

/// Generates one script.
struct Gen<'a> {
    rng: &'a mut Rng,
    out: String,
    site: u32,
    asks: u32,
    loops: Vec<String>,
    /// Statements left to generate (keeps scripts small).
    budget: u32,
}

impl Gen<'_> {
    fn script(rng: &mut Rng, trace: u64) -> String {
        let initial = rng.below(1000);
        let mut generator = Gen { rng, out: String::new(), site: 0, asks: 0, loops: Vec::new(), budget: 0 };
        // Mostly short scripts (the test runs ~36,000 scripts), some long ones.
        generator.budget =
            if generator.rng.chance(10) { 6 + generator.rng.below(6) } else { 2 + generator.rng.below(3) } as u32;
        let _ = writeln!(generator.out, "const T = {trace};\nlet acc = {initial};");
        generator.out.push_str(PRELUDE);
        while generator.budget > 0 {
            generator.statement(0);
        }
        generator.out.push_str("return { acc, trail, log: log.join(\"\\n\") };\n");
        generator.out
    }

    fn line(&mut self, depth: usize, text: &str) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// A JS expression naming a fresh call site (loop counters appended).
    fn label(&mut self) -> String {
        self.site += 1;
        if self.loops.is_empty() {
            format!("\"s{}\"", self.site)
        } else {
            let counters: String = self.loops.iter().map(|v| format!("_${{{v}}}")).collect();
            format!("`s{}{counters}`", self.site)
        }
    }

    fn argument(&mut self) -> String {
        match self.rng.below(3) {
            0 => self.rng.below(100).to_string(),
            1 => "acc % 1000".to_string(),
            _ => match self.loops.last() {
                Some(counter) => format!("(acc + {counter} * 7) % 1000"),
                None => format!("(acc + {}) % 1000", self.rng.below(50)),
            },
        }
    }

    fn delay(&mut self) -> u64 {
        match self.rng.below(100) {
            0..55 => 0,
            55..80 => 1,
            80..92 => 2,
            _ => 3,
        }
    }

    fn kind(&mut self, fail: bool, ask: bool) -> Kind {
        let ask = ask && self.asks < MAX_ASK_SITES;
        loop {
            let kind = match self.rng.below(3) {
                0 => Kind::Ok,
                1 => Kind::Fail,
                _ => Kind::Ask,
            };
            if (kind != Kind::Fail || fail) && (kind != Kind::Ask || ask) {
                if kind == Kind::Ask {
                    self.asks += 1;
                }
                return kind;
            }
        }
    }

    fn call(&mut self, kind: Kind, delay: u64) -> String {
        let label = self.label();
        let argument = self.argument();
        format!("m.{}(T, {label}, {delay}, {argument})", kind.name())
    }

    fn calls(&mut self, kinds: &[Kind], delays: Option<&[u64]>) -> String {
        let mut parts = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            let delay = match delays {
                Some(delays) => delays[i],
                None => self.delay(),
            };
            parts.push(self.call(*kind, delay));
        }
        parts.join(", ")
    }

    fn statement(&mut self, depth: usize) {
        self.budget = self.budget.saturating_sub(1);
        let nested = depth < 2 && self.budget > 0;
        match self.rng.below(if nested { 13 } else { 11 }) {
            // A sequential call that fulfils.
            0 => {
                let delay = self.delay();
                let call = self.call(Kind::Ok, delay);
                self.line(depth, &format!("fold(await {call});"));
            }
            // A sequential call that interrupts.
            1 | 2 => {
                let kind = self.kind(false, true);
                let delay = self.delay();
                let call = self.call(kind, delay);
                self.line(depth, &format!("fold(await {call});"));
            }
            // try/catch(/finally) around a sequence that may reject part-way.
            3 => {
                self.line(depth, "try {");
                for _ in 0..1 + self.rng.below(3) {
                    let kind = self.kind(true, true);
                    let delay = self.delay();
                    let call = self.call(kind, delay);
                    self.line(depth + 1, &format!("fold(await {call});"));
                }
                self.line(depth, "} catch (e) {");
                self.line(depth + 1, "fold([e.name, e.code, e.message, e.details ?? null]);");
                if self.rng.chance(30) {
                    self.line(depth, "} finally {");
                    self.line(depth + 1, "note([\"finally\", Date.now(), Math.random()]);");
                }
                self.line(depth, "}");
            }
            // Promise.all of ok/ask calls: several interruptions in one round.
            4 => {
                let kinds: Vec<Kind> = (0..2 + self.rng.below(2)).map(|_| self.kind(false, true)).collect();
                let calls = self.calls(&kinds, None);
                self.line(depth, &format!("fold(await Promise.all([{calls}]));"));
            }
            // Promise.all with exactly one rejection, then allSettled of the same promises.
            5 => {
                let mut kinds: Vec<Kind> = (0..1 + self.rng.below(2)).map(|_| self.kind(false, true)).collect();
                let at = self.rng.below(kinds.len() as u64 + 1) as usize;
                kinds.insert(at, Kind::Fail);
                let calls = self.calls(&kinds, None);
                self.line(depth, "{");
                self.line(depth + 1, &format!("const ps = [{calls}];"));
                self.line(depth + 1, "try { fold(await Promise.all(ps)); } catch (e) { fold([\"all\", e.message]); }");
                self.line(depth + 1, "fold((await Promise.allSettled(ps)).map((r) => r.status));");
                self.line(depth, "}");
            }
            // Promise.allSettled of any kinds.
            6 => {
                let kinds: Vec<Kind> = (0..2 + self.rng.below(2)).map(|_| self.kind(true, true)).collect();
                let calls = self.calls(&kinds, None);
                self.line(
                    depth,
                    &format!(
                        "fold((await Promise.allSettled([{calls}])).map((r) => r.status === \"fulfilled\" ? r.value : r.reason.message));"
                    ),
                );
            }
            // Promise.race whose winner is fixed by construction: compared.
            7 => {
                let n = 2 + self.rng.below(2) as usize;
                let kinds: Vec<Kind> = (0..n).map(|_| self.kind(true, false)).collect();
                let winner = self.rng.below(n as u64) as usize;
                let delays: Vec<u64> = (0..n)
                    .map(|i| match i.cmp(&winner) {
                        std::cmp::Ordering::Less => 1 + self.rng.below(3),
                        std::cmp::Ordering::Equal => 0,
                        std::cmp::Ordering::Greater => self.rng.below(4),
                    })
                    .collect();
                let calls = self.calls(&kinds, Some(&delays));
                self.line(depth, "{");
                self.line(depth + 1, &format!("const ps = [{calls}];"));
                self.line(depth + 1, "fold(await settle(Promise.race(ps)));");
                self.line(depth + 1, "await Promise.allSettled(ps);");
                self.line(depth, "}");
            }
            // Promise.race that depends on timing and resolutions: logged only.
            8 => {
                let kinds: Vec<Kind> = (0..2).map(|_| self.kind(true, true)).collect();
                let delays: Vec<u64> = (0..2).map(|_| self.rng.below(4)).collect();
                let calls = self.calls(&kinds, Some(&delays));
                let site = self.site;
                self.line(depth, "{");
                self.line(depth + 1, &format!("const ps = [{calls}];"));
                self.line(depth + 1, &format!("note([\"race\", {site}, await settle(Promise.race(ps))]);"));
                self.line(depth + 1, "await Promise.allSettled(ps);");
                self.line(depth, "}");
            }
            // Time and randomness.
            9 => {
                self.line(depth, "note([\"t\", Date.now(), Math.random(), new Date().toISOString(), Math.random()]);");
            }
            // Pure computation.
            10 => {
                let c = self.rng.below(1000);
                self.line(depth, &format!("for (let k = 0; k < 20; k++) acc = (acc * 3 + k + {c}) % 1000003;"));
            }
            // A loop.
            11 => {
                let counter = format!("i{}", self.loops.len());
                let n = 1 + self.rng.below(2);
                self.line(depth, &format!("for (let {counter} = 0; {counter} < {n}; {counter}++) {{"));
                self.loops.push(counter);
                for _ in 0..1 + self.rng.below(2) {
                    self.statement(depth + 1);
                }
                self.loops.pop();
                self.line(depth, "}");
            }
            // A branch on the accumulated value.
            _ => {
                let m = 2 + self.rng.below(2);
                self.line(depth, &format!("if (acc % {m} === 0) {{"));
                self.statement(depth + 1);
                self.line(depth, "} else {");
                self.statement(depth + 1);
                self.line(depth, "}");
            }
        }
    }
}

/// The decision for interruption `interrupt-<k>` of `m.ask(T, label, _, x)`.
fn decision(k: u32, label: &str, x: i64) -> Value {
    if k % 3 == 0 { json!({ "k": k, "label": label }) } else { json!(i64::from(k) * 1000 + x) }
}

/// One invocation of a host function.
#[derive(Clone, Debug)]
struct Hit {
    function: &'static str,
    index: u32,
    run_id: String,
    x: i64,
    /// `(interruption id, payload, resolution)` when run again with a decision.
    resume: Option<(String, Value, Value)>,
}

/// Invocations per trace and label.
#[derive(Default)]
struct Hits(Mutex<HashMap<u64, HashMap<String, Vec<Hit>>>>);

impl Hits {
    fn take(&self, trace: u64) -> HashMap<String, Vec<Hit>> {
        self.0.lock().unwrap().remove(&trace).unwrap_or_default()
    }
}

struct Call {
    label: String,
    delay: u64,
    x: i64,
}

/// Records the invocation (before the function's future is first polled).
fn record(hits: &Hits, function: &'static str, ctx: &HostCallContext, args: &[Value]) -> Result<Call, HostError> {
    let (Some(trace), Some(label), Some(delay), Some(x)) = (
        args.first().and_then(Value::as_u64),
        args.get(1).and_then(Value::as_str),
        args.get(2).and_then(Value::as_u64),
        args.get(3).and_then(Value::as_i64),
    ) else {
        return Err(HostError::new(format!("bad arguments {args:?}")));
    };
    let resume = ctx.resume().map(|r| (r.interruption_id.clone(), r.payload.clone(), r.resolution.clone()));
    let hit = Hit { function, index: ctx.index(), run_id: ctx.logical_run_id().to_string(), x, resume };
    hits.0.lock().unwrap().entry(trace).or_default().entry(label.to_string()).or_default().push(hit);
    Ok(Call { label: label.to_string(), delay, x })
}

/// No delay: the call is ready on its first poll. A delay: the call is never
/// ready on its first poll (it yields first). A bare `sleep` is not enough: when
/// the thread is held up for a millisecond between computing the deadline and
/// registering the timer (preempted, or waiting for the timer driver's lock),
/// tokio finds the deadline passed and the sleep is ready on its first poll; the
/// runner polls every host call once when the script makes it, so such a call
/// settles first and wins a race against a call the script made after it (seen
/// in ~1 of 10 races under load; the runner recorded and replayed it faithfully).
async fn pause(delay: u64) {
    if delay > 0 {
        tokio::task::yield_now().await;
    }
    if delay > 1 {
        tokio::time::sleep(Duration::from_millis(delay - 1)).await;
    }
}

/// `ok`'s value: a number or, for some labels, a small array.
fn ok_value(label: &str, x: i64) -> Value {
    if label.len() % 3 == 0 { json!([label, x]) } else { json!(x * 3 + label.len() as i64) }
}

fn fail_error(label: &str, x: i64) -> HostError {
    let error = HostError::new(format!("{label} failed on {x}"));
    if label.len() % 2 == 0 { error.with_details(json!({ "x": x })) } else { error }
}

/// The host functions; `reference` makes `ask` answer at once instead of interrupting.
fn host(hits: Arc<Hits>, reference: bool) -> HostFunctions {
    let (h1, h2, h3) = (hits.clone(), hits.clone(), hits);
    HostFunctions::builder()
        .function("m.ok", move |ctx, args| {
            let call = record(&h1, "ok", &ctx, &args);
            async move {
                let call = call?;
                pause(call.delay).await;
                Ok(ok_value(&call.label, call.x))
            }
        })
        .function("m.fail", move |ctx, args| {
            let call = record(&h2, "fail", &ctx, &args);
            async move {
                let call = call?;
                pause(call.delay).await;
                Err(fail_error(&call.label, call.x))
            }
        })
        .function("m.ask", move |ctx, args| {
            let call = record(&h3, "ask", &ctx, &args);
            async move {
                let call = call?;
                pause(call.delay).await;
                if reference {
                    return Ok(decision(ctx.index(), &call.label, call.x));
                }
                match ctx.resume() {
                    None => Err(ctx.interrupt(json!({ "label": call.label, "x": call.x }))),
                    Some(resume) => Ok(resume.resolution.clone()),
                }
            }
        })
        .build()
        .unwrap()
}

/// What one trace did.
#[derive(Default)]
struct Stats {
    rounds: usize,
    interruptions: usize,
    partial_rounds: usize,
    calls: usize,
}

struct Model {
    /// The runners, each with the generation it belongs to (see [`Model::runner`]).
    runners: Vec<Mutex<(u64, Runner)>>,
    live: HostFunctions,
    reference: HostFunctions,
    live_hits: Arc<Hits>,
    reference_hits: Arc<Hits>,
}

fn texts(console: &[ConsoleLine]) -> Vec<&str> {
    console.iter().map(|l| l.text.as_str()).collect()
}

fn check_log(value: &Value, console: &[ConsoleLine], what: &str) -> Result<(), String> {
    let joined = texts(console).join("\n");
    if value["log"].as_str() != Some(joined.as_str()) {
        return Err(format!("{what}: the returned log {} differs from the console {joined:?}", value["log"]));
    }
    Ok(())
}

/// Checks one pending interruption against what the host saw; returns its call
/// index and decision.
fn check_interruption(
    interruption: &Interruption,
    hits: &Arc<Hits>,
    trace: u64,
) -> Result<(u32, String, Value), String> {
    let k: u32 = interruption
        .id
        .strip_prefix("interrupt-")
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| format!("bad interruption id {}", interruption.id))?;
    let label = interruption.arguments.get(1).and_then(Value::as_str).ok_or("no label")?.to_string();
    let x = interruption.arguments.get(3).and_then(Value::as_i64).ok_or("no x")?;
    if interruption.function != "m.ask" || interruption.arguments[0] != json!(trace) {
        return Err(format!("unexpected interruption {interruption:?}"));
    }
    if interruption.payload != json!({ "label": label, "x": x }) {
        return Err(format!("interruption {} has payload {}", interruption.id, interruption.payload));
    }
    let first = hits.0.lock().unwrap().get(&trace).and_then(|m| m.get(&label)).and_then(|v| v.first().cloned());
    match first {
        Some(hit) if hit.index == k && hit.resume.is_none() && hit.x == x => {}
        other => {
            return Err(format!("interruption {} ({label}) does not match its first call {other:?}", interruption.id));
        }
    }
    Ok((k, interruption.id.clone(), decision(k, &label, x)))
}

impl Model {
    /// The current runner of `slot`. Every `TRACES_PER_RUNNER` traces a new runner
    /// replaces it and the old one shuts down after its last run. Traces still going
    /// at a switch resume on the new runner (same secret), so resuming on another
    /// runner is covered too.
    fn runner(&self, slot: usize, trace: u64) -> Runner {
        let generation = trace / TRACES_PER_RUNNER;
        let mut slot = self.runners[slot].lock().unwrap();
        if slot.0 < generation {
            *slot = (generation, new_runner());
        }
        slot.1.clone()
    }

    async fn trace(&self, slot: usize, trace: u64, source: &str, rng: &mut Rng) -> Result<Stats, String> {
        let source: Arc<str> = source.into();
        let mut stats = Stats::default();

        // The reference: `ask` answers at once.
        let reference = self
            .runner(slot, trace)
            .run(RunRequest::new(source.clone()).host(self.reference.clone()).logical_run_id(format!("ref-{trace}")))
            .await;
        let reference = match reference {
            Ok(Outcome::Completed(c)) => c,
            other => return Err(format!("the reference run did not complete: {other:?}")),
        };
        check_log(&reference.value, &reference.console, "reference")?;

        // The interrupted runs.
        let run_id = format!("trace-{trace}");
        let mut request = RunRequest::new(source.clone()).host(self.live.clone()).logical_run_id(run_id.clone());
        let mut previous_console: Vec<ConsoleLine> = Vec::new();
        let mut unresolved: BTreeSet<String> = BTreeSet::new();
        let mut resolved: BTreeSet<String> = BTreeSet::new();
        let mut empty_rounds = 0;
        let completion = loop {
            stats.rounds += 1;
            if stats.rounds > MAX_ROUNDS {
                return Err("too many rounds".into());
            }
            let outcome =
                self.runner(slot, trace).run(request).await.map_err(|e| format!("round {}: {e:?}", stats.rounds))?;
            let console = outcome.console();
            if !console.starts_with(&previous_console) {
                return Err(format!(
                    "round {}: the console {:?} does not start with the previous round's {:?}",
                    stats.rounds,
                    texts(console),
                    texts(&previous_console)
                ));
            }
            previous_console = console.to_vec();
            let suspension = match outcome {
                Outcome::Completed(c) => {
                    if !unresolved.is_empty() {
                        return Err(format!("completed with unresolved interruptions {unresolved:?}"));
                    }
                    break c;
                }
                Outcome::Interrupted(s) => s,
            };
            if suspension.logical_run_id != run_id {
                return Err(format!("logical run id {} instead of {run_id}", suspension.logical_run_id));
            }
            let pending: Vec<&str> = suspension.interruptions.iter().map(|i| i.id.as_str()).collect();
            for id in &unresolved {
                if !pending.contains(&id.as_str()) {
                    return Err(format!("round {}: unresolved {id} is no longer pending: {pending:?}", stats.rounds));
                }
            }
            if let Some(again) = pending.iter().find(|id| resolved.contains(**id)) {
                return Err(format!("round {}: resolved {again} is pending again", stats.rounds));
            }
            let mut decisions = Vec::new();
            let mut indices = Vec::new();
            for interruption in &suspension.interruptions {
                let (k, id, value) = check_interruption(interruption, &self.live_hits, trace)?;
                indices.push(k);
                decisions.push((id, value));
            }
            if !indices.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("round {}: interruptions out of order {pending:?}", stats.rounds));
            }
            let new = pending.iter().filter(|id| !unresolved.contains(**id)).count();
            stats.interruptions += new;

            // (Rarely) a resume that decides nothing, which is refused and leaves the
            // continuation usable; then all, or a random non-empty subset.
            if empty_rounds < 1 && rng.chance(4) {
                empty_rounds += 1;
                let nothing = RunRequest::new(source.clone())
                    .host(self.live.clone())
                    .resume(suspension.continuation.clone(), Vec::<Resolution>::new());
                match self.runner(slot, trace).run(nothing).await {
                    Err(e) if e.code == ErrorCode::ProtocolError => {}
                    other => return Err(format!("round {}: a resume deciding nothing gave {other:?}", stats.rounds)),
                }
            }
            let chosen: Vec<(String, Value)> = if decisions.len() > 1 && rng.chance(40) {
                stats.partial_rounds += 1;
                let mut chosen: Vec<(String, Value)> = decisions.iter().filter(|_| rng.chance(50)).cloned().collect();
                if chosen.is_empty() {
                    chosen.push(decisions[rng.below(decisions.len() as u64) as usize].clone());
                }
                chosen
            } else {
                decisions.clone()
            };
            unresolved =
                decisions.iter().map(|(id, _)| id.clone()).filter(|id| !chosen.iter().any(|c| &c.0 == id)).collect();
            resolved.extend(chosen.iter().map(|(id, _)| id.clone()));
            request = RunRequest::new(source.clone())
                .host(self.live.clone())
                .resume(suspension.continuation, chosen.into_iter().map(|(id, value)| Resolution::new(id, value)));
        };

        // 3. Time, randomness and race winners replayed exactly.
        check_log(&completion.value, &completion.console, "final round")?;
        // 2. The same value as the uninterrupted reference.
        for key in ["trail", "acc"] {
            if completion.value[key] != reference.value[key] {
                return Err(format!(
                    "{key} differs from the reference:\n  resumed:   {}\n  reference: {}",
                    completion.value[key], reference.value[key]
                ));
            }
        }
        // 1. Every call reached the host once, every interrupting call twice.
        let live = self.live_hits.take(trace);
        let reference_hits = self.reference_hits.take(trace);
        let live_labels: BTreeSet<&String> = live.keys().collect();
        let reference_labels: BTreeSet<&String> = reference_hits.keys().collect();
        if live_labels != reference_labels {
            return Err(format!("calls made {live_labels:?}, reference made {reference_labels:?}"));
        }
        for (label, seen) in &reference_hits {
            let expected = &seen[0];
            if seen.len() != 1 || expected.resume.is_some() || expected.run_id != format!("ref-{trace}") {
                return Err(format!("reference call {label}: {seen:?}"));
            }
            let hits = &live[label];
            stats.calls += hits.len();
            let bad = |why: &str| Err(format!("call {label} ({why}): {hits:?}, reference {expected:?}"));
            if hits.iter().any(|h| h.run_id != run_id || h.index != expected.index || h.function != expected.function) {
                return bad("run id, index or function");
            }
            match expected.function {
                "ask" => {
                    if hits.len() != 2 || hits[0].resume.is_some() {
                        return bad("an interrupting call runs exactly twice");
                    }
                    let id = format!("interrupt-{}", expected.index);
                    let want =
                        (id, json!({ "label": label, "x": hits[0].x }), decision(expected.index, label, hits[0].x));
                    if hits[1].resume.as_ref() != Some(&want) || hits[1].x != hits[0].x {
                        return bad("resumed with the wrong id, payload or decision");
                    }
                }
                _ => {
                    if hits.len() != 1 || hits[0].resume.is_some() {
                        return bad("a settled call runs exactly once");
                    }
                }
            }
        }
        Ok(stats)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn new_runner() -> Runner {
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    Runner::new(RunnerConfig::new().workers(1).codec(codec)).unwrap()
}

fn model() -> Arc<Model> {
    let live_hits = Arc::new(Hits::default());
    let reference_hits = Arc::new(Hits::default());
    Arc::new(Model {
        runners: (0..RUNNERS).map(|_| Mutex::new((0, new_runner()))).collect(),
        live: host(live_hits.clone(), false),
        reference: host(reference_hits.clone(), true),
        live_hits,
        reference_hits,
    })
}

/// The per-trace generator (script and resolution choices).
fn trace_rng(seed: u64, trace: u64) -> Rng {
    let mut rng = Rng(seed ^ trace.wrapping_mul(0xD1B5_4A32_D192_ED03));
    rng.next();
    rng
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_matches_an_uninterrupted_reference_over_generated_traces() {
    let traces = env_u64("REPLAY_MODEL_TRACES", DEFAULT_TRACES);
    let seed = env_u64("REPLAY_MODEL_SEED", DEFAULT_SEED);
    let model = model();
    let started = Instant::now();
    // REPLAY_MODEL_FIRST starts at another trace id (to rerun one failing trace).
    let first = env_u64("REPLAY_MODEL_FIRST", 1);
    let last = first + traces - 1;
    let next = Arc::new(AtomicU64::new(first));
    let mut tasks = Vec::new();
    for task in 0..RUNNERS * TRACES_PER_WORKER {
        let slot = task % RUNNERS;
        let (model, next) = (model.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut totals = (0u64, Stats::default(), 0usize);
            let mut failures = Vec::new();
            loop {
                let trace = next.fetch_add(1, Ordering::Relaxed);
                if trace > last {
                    break;
                }
                let mut rng = trace_rng(seed, trace);
                let source = Gen::script(&mut rng, trace);
                match model.trace(slot, trace, &source, &mut rng).await {
                    Ok(stats) => {
                        totals.0 += 1;
                        totals.1.rounds += stats.rounds;
                        totals.1.interruptions += stats.interruptions;
                        totals.1.partial_rounds += stats.partial_rounds;
                        totals.1.calls += stats.calls;
                        totals.2 = totals.2.max(stats.rounds);
                    }
                    Err(why) => failures
                        .push((trace, format!("trace {trace} (seed {seed:#x}): {why}\n--- script ---\n{source}"))),
                }
            }
            (totals, failures)
        }));
    }
    let (mut passed, mut totals, mut max_rounds, mut failures) = (0, Stats::default(), 0, Vec::new());
    for task in tasks {
        let ((count, stats, most), mut failed) = task.await.unwrap();
        passed += count;
        totals.rounds += stats.rounds;
        totals.interruptions += stats.interruptions;
        totals.partial_rounds += stats.partial_rounds;
        totals.calls += stats.calls;
        max_rounds = max_rounds.max(most);
        failures.append(&mut failed);
    }
    eprintln!(
        "replay model: {passed} of {traces} traces passed in {:.1?}: {} rounds (at most {max_rounds} in one trace), \
         {} interruptions, {} partially resolved rounds, {} host invocations",
        started.elapsed(),
        totals.rounds,
        totals.interruptions,
        totals.partial_rounds,
        totals.calls
    );
    if !failures.is_empty() {
        failures.sort();
        let ids: Vec<u64> = failures.iter().map(|f| f.0).take(20).collect();
        panic!("{} of {traces} traces failed (ids {ids:?}…); the first:\n{}", failures.len(), failures[0].1);
    }
    assert_eq!(passed, traces);
}
