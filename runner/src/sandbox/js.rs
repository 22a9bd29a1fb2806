//! Thin, safe wrappers over the few raw engine calls the sandbox needs.

use super::serialize::js_string;
use crate::text::truncate;
use rquickjs::{Ctx, Value, qjs};
use std::ffi::CString;
use std::rc::Rc;

/// File name scripts are compiled under; error positions name it.
pub(crate) const SCRIPT_FILE: &str = "script.js";
/// Lines the wrapper adds before the user's first line.
const WRAPPER_LINES: u32 = 1;

/// Bytecode made by this process's own compiler. Only [`compile`] makes one and
/// [`load`] takes nothing else, so no bytecode from outside (a request, a
/// continuation, a file) can ever reach the engine's loader, which trusts its input.
#[derive(Clone)]
pub(crate) struct Bytecode(Rc<[u8]>);

impl Bytecode {
    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Why a script did not compile: the engine's error text, positions mapped to the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompileError(pub String);

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompileError {}

impl From<&str> for CompileError {
    fn from(message: &str) -> CompileError {
        CompileError(message.to_string())
    }
}

/// Compiles `text` in `ctx` (which must have the eval intrinsic) to bytecode.
/// On failure returns the engine's error text, positions already mapped.
pub(crate) fn compile(ctx: &Ctx<'_>, text: &str, file: &str, line_offset: u32) -> Result<Bytecode, CompileError> {
    let raw = ctx.as_raw().as_ptr();
    let Ok(input) = CString::new(text) else {
        return Err("SyntaxError: the source contains a NUL character".into());
    };
    let file = CString::new(file).expect("file names have no NUL");
    let flags = (qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_COMPILE_ONLY) as i32;
    // SAFETY: `raw` is the live context of `ctx`; `input` (NUL-terminated, `text.len()` bytes
    // before the NUL) and `file` outlive the calls. The compiled value and a pending exception are
    // ours: the first is freed once, the second taken over by a `Value`. `JS_WriteObject` returns
    // `size` bytes allocated in this context, copied out and then freed with `js_free`.
    unsafe {
        let compiled = qjs::JS_Eval(raw, input.as_ptr(), text.len() as _, file.as_ptr(), flags);
        if qjs::JS_IsException(compiled) {
            // The compiler realm never runs guest code, so reading `stack` normally is safe here.
            let error = Value::from_raw(ctx.clone(), qjs::JS_GetException(raw));
            let stack: Option<rquickjs::Function> = ctx
                .eval::<Value, _>("Object.getOwnPropertyDescriptor(Error.prototype, 'stack')?.get")
                .ok()
                .and_then(|v| v.into_function());
            return Err(CompileError(describe_error(ctx, &error, stack.as_ref(), line_offset, &|_| {
                "a non-error value".into()
            })));
        }
        let mut size: qjs::size_t = 0;
        let buf = qjs::JS_WriteObject(raw, &mut size, compiled, qjs::JS_WRITE_OBJ_BYTECODE as i32);
        qjs::JS_FreeValue(raw, compiled);
        if buf.is_null() {
            let _ = ctx.catch();
            return Err("InternalError: out of memory while compiling".into());
        }
        let bytes: Rc<[u8]> = std::slice::from_raw_parts(buf, size as usize).into();
        qjs::js_free(raw, buf.cast());
        Ok(Bytecode(bytes))
    }
}

/// Wraps a function body so top-level `await` and `return` work.
pub(crate) fn wrap_source(source: &str) -> String {
    let mut text = String::with_capacity(source.len() + 32);
    text.push_str("(async function () {\n");
    text.push_str(source);
    text.push_str("\n})");
    text
}

/// Whether `text` compiles as a script (the compiled code is dropped, never run or written out).
fn parses(ctx: &Ctx<'_>, text: &str) -> bool {
    let raw = ctx.as_raw().as_ptr();
    let Ok(input) = CString::new(text) else { return false };
    let file = CString::new(SCRIPT_FILE).expect("file names have no NUL");
    let flags = (qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_COMPILE_ONLY) as i32;
    // SAFETY: `input` and `file` are NUL-terminated and outlive the call; the compiled value is
    // freed at once, and an exception is taken off the context (the compiler realm runs no code).
    unsafe {
        let compiled = qjs::JS_Eval(raw, input.as_ptr(), text.len() as _, file.as_ptr(), flags);
        let ok = !qjs::JS_IsException(compiled);
        if ok {
            qjs::JS_FreeValue(raw, compiled);
        } else {
            qjs::JS_FreeValue(raw, qjs::JS_GetException(raw));
        }
        ok
    }
}

/// Compiles a user script; positions in errors refer to the user's lines.
///
/// The script runs inside a wrapper function, so a body that closes the wrapper early
/// (`return 1; }); globalThis.x = 1; (async function () {`) would put code outside it. So the
/// body is also compiled, and never run, as `(async function () { L: {` body `break L; } })`
/// with a random label `L`: labels do not cross function boundaries and cannot be guessed, so
/// that compiles only if the body ends inside the wrapper, where it began. (QuickJS's
/// `AsyncFunction` constructor cannot do this check: it concatenates too, and evaluates.)
pub(crate) fn compile_script(ctx: &Ctx<'_>, source: &str) -> Result<Bytecode, CompileError> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| CompileError(format!("InternalError: no randomness: {e}")))?;
    let label: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let mut fenced = String::with_capacity(source.len() + 80);
    fenced.push_str(&format!("(async function () {{ fence_{label}: {{\n"));
    fenced.push_str(source);
    fenced.push_str(&format!("\nbreak fence_{label}; }} }})"));
    let compiled = compile(ctx, &wrap_source(source), SCRIPT_FILE, WRAPPER_LINES);
    // A body with a syntax error of its own gets that error, with its position.
    if compiled.is_err() || parses(ctx, &fenced) {
        return compiled;
    }
    Err("SyntaxError: the script closes its function body early (a `}` with no `{` of its own); a script is a \
         function body, and nothing of it may run outside (this check reads top-level declarations as \
         block-scoped, so it also refuses a name declared twice at the top, such as `var f` with \
         `function f`: rename one)"
        .into())
}

/// Loads bytecode this process compiled and evaluates it in `ctx`.
pub(crate) fn load<'js>(ctx: &Ctx<'js>, bytecode: &Bytecode) -> Result<Value<'js>, Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    let bytecode = &bytecode.0;
    // SAFETY: `raw` is the live context of `ctx`. The loader trusts its input, and a `Bytecode` is
    // only ever made by `compile` from this process's own compiler. `JS_EvalFunction` takes over
    // the function object; every result or pending exception is ours and taken over by a `Value`.
    unsafe {
        let object = qjs::JS_ReadObject(raw, bytecode.as_ptr(), bytecode.len() as _, qjs::JS_READ_OBJ_BYTECODE as i32);
        if qjs::JS_IsException(object) {
            return Err(Value::from_raw(ctx.clone(), qjs::JS_GetException(raw)));
        }
        let value = qjs::JS_EvalFunction(raw, object);
        if qjs::JS_IsException(value) {
            return Err(Value::from_raw(ctx.clone(), qjs::JS_GetException(raw)));
        }
        Ok(Value::from_raw(ctx.clone(), value))
    }
}

/// Defines an own, non-enumerable-free data property without invoking setters.
pub(crate) fn define<'js>(ctx: &Ctx<'js>, object: &Value<'js>, key: &str, value: Value<'js>) -> bool {
    let raw = ctx.as_raw().as_ptr();
    let key = CString::new(key).expect("keys are literals");
    let flags = (qjs::JS_PROP_CONFIGURABLE | qjs::JS_PROP_WRITABLE | qjs::JS_PROP_ENUMERABLE) as i32;
    // SAFETY: `raw` is the live context of `ctx`, `object` and `value` live values of it, and `key`
    // NUL-terminated. The duplicated reference is the one `JS_DefinePropertyValueStr` consumes
    // (it frees it on failure too); `value` keeps its own.
    unsafe {
        let value = qjs::JS_DupValue(raw, value.as_raw());
        qjs::JS_DefinePropertyValueStr(raw, object.as_raw(), key.as_ptr(), value, flags) >= 0
    }
}

/// A new `Error` object carrying `code` (and optional `details`), built
/// without running any script code (error hooks are pinned by the hardening).
pub(crate) fn new_error<'js>(
    ctx: &Ctx<'js>,
    name: &str,
    code: &str,
    message: &str,
    details: Option<Value<'js>>,
) -> Option<Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: `raw` is the live context of `ctx`.
    let error = unsafe { qjs::JS_NewError(raw) };
    // SAFETY: only reads the value's tag.
    if unsafe { qjs::JS_IsException(error) } {
        return None;
    }
    // SAFETY: `error` is a new object of this context that we own; the `Value` takes it over.
    let error = unsafe { Value::from_raw(ctx.clone(), error) };
    let ok = define(ctx, &error, "message", rquickjs::String::from_str(ctx.clone(), message).ok()?.into_value())
        && define(ctx, &error, "name", rquickjs::String::from_str(ctx.clone(), name).ok()?.into_value())
        && define(ctx, &error, "code", rquickjs::String::from_str(ctx.clone(), code).ok()?.into_value())
        && details.is_none_or(|d| define(ctx, &error, "details", d));
    ok.then_some(error)
}

/// Parses JSON text into a value of `ctx` (no reviver, so no script runs;
/// a `__proto__` key stays an own property).
pub(crate) fn parse_json<'js>(ctx: &Ctx<'js>, text: &str) -> Option<Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    // Fast path: in valid JSON text (which is all the runner ever passes here),
    // a string literal without a backslash has no escapes, so it is its own contents.
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
            // SAFETY: `raw` is the live context of `ctx`; `inner` is `inner.len()` bytes of UTF-8.
            let value = unsafe { qjs::JS_NewStringLen(raw, inner.as_ptr().cast(), inner.len() as _) };
            // SAFETY: only reads the value's tag.
            if unsafe { qjs::JS_IsException(value) } {
                let _ = ctx.catch();
                return None;
            }
            // SAFETY: `value` is a new string of this context that we own; the `Value` takes it over.
            return Some(unsafe { Value::from_raw(ctx.clone(), value) });
        }
    }
    let input = CString::new(text).ok()?;
    // SAFETY: `raw` is the live context of `ctx`; `input` is NUL-terminated after `text.len()`
    // bytes, as the parser needs, and outlives the call. A parsed value is new and ours, taken
    // over by the `Value`.
    unsafe {
        let value = qjs::JS_ParseJSON(raw, input.as_ptr(), text.len() as _, c"<host>".as_ptr());
        if qjs::JS_IsException(value) {
            let _ = ctx.catch();
            return None;
        }
        Some(Value::from_raw(ctx.clone(), value))
    }
}

/// Throws `error` so that no `catch` or `finally` of the script sees it.
pub(crate) fn throw_uncatchable<'js>(ctx: &Ctx<'js>, message: &str) -> rquickjs::Error {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: `raw` is the live context of `ctx`, and `error` a new object we own. The message
    // string (of `message.len()` bytes, `text` holding the same bytes) is consumed by
    // `JS_DefinePropertyValueStr`; `JS_SetUncatchableError` only marks `error`, and `JS_Throw`
    // takes over our reference to it.
    unsafe {
        let error = qjs::JS_NewError(raw);
        if !qjs::JS_IsException(error) {
            if let Ok(text) = CString::new(message) {
                let value = qjs::JS_NewStringLen(raw, text.as_ptr(), message.len() as _);
                qjs::JS_DefinePropertyValueStr(
                    raw,
                    error,
                    c"message".as_ptr(),
                    value,
                    qjs::JS_PROP_CONFIGURABLE as i32,
                );
            }
            qjs::JS_SetUncatchableError(raw, error);
            qjs::JS_Throw(raw, error);
        }
    }
    rquickjs::Error::Exception
}

/// Reads an own data property (never a getter, never through a proxy).
pub(crate) fn own_data<'js>(ctx: &Ctx<'js>, object: &Value<'js>, key: &str) -> Option<Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: `object` is a live value; this only reads its tag and class.
    if !object.is_object() || unsafe { qjs::JS_IsProxy(object.as_raw()) } {
        return None;
    }
    let key = CString::new(key).ok()?;
    // SAFETY: `raw` is the live context of `ctx`, `object` a live object of it (not a proxy, so no
    // trap runs) and `key` NUL-terminated. We own the atom, freed once, and on success the three
    // references `desc` holds: getter and setter are freed, the value taken over by a `Value`.
    unsafe {
        let atom = qjs::JS_NewAtom(raw, key.as_ptr());
        let mut desc = qjs::JSPropertyDescriptor {
            flags: 0,
            value: qjs::JS_UNDEFINED,
            getter: qjs::JS_UNDEFINED,
            setter: qjs::JS_UNDEFINED,
        };
        let found = qjs::JS_GetOwnProperty(raw, &mut desc, object.as_raw(), atom);
        qjs::JS_FreeAtom(raw, atom);
        if found < 0 {
            let _ = ctx.catch();
            return None;
        }
        if found == 0 {
            return None;
        }
        qjs::JS_FreeValue(raw, desc.getter);
        qjs::JS_FreeValue(raw, desc.setter);
        let value = Value::from_raw(ctx.clone(), desc.value);
        (desc.flags & qjs::JS_PROP_GETSET as i32 == 0).then_some(value)
    }
}

/// Reads a data property along the prototype chain, refusing getters and proxies.
fn inherited_data<'js>(ctx: &Ctx<'js>, object: &Value<'js>, key: &str) -> Option<Value<'js>> {
    let raw = ctx.as_raw().as_ptr();
    let mut current = object.clone();
    for _ in 0..16 {
        if let Some(v) = own_data(ctx, &current, key) {
            return Some(v);
        }
        // SAFETY: `current` is a live value; this only reads its tag and class.
        if !current.is_object() || unsafe { qjs::JS_IsProxy(current.as_raw()) } {
            return None;
        }
        // SAFETY: `raw` is the live context of `ctx`, `current` a live object of it, not a proxy
        // (so no trap runs).
        let proto = unsafe { qjs::JS_GetPrototype(raw, current.as_raw()) };
        // SAFETY: only reads the value's tag.
        if unsafe { qjs::JS_IsException(proto) } {
            let _ = ctx.catch();
            return None;
        }
        // SAFETY: `JS_GetPrototype` returns a new reference, which the `Value` takes over.
        current = unsafe { Value::from_raw(ctx.clone(), proto) };
        if !current.is_object() {
            return None;
        }
    }
    None
}

/// Describes a thrown value for an error message without running script code:
/// `Name: message` plus the stack (user line numbers) when it is an `Error`.
pub(crate) fn describe_error<'js>(
    ctx: &Ctx<'js>,
    thrown: &Value<'js>,
    stack_getter: Option<&rquickjs::Function<'js>>,
    line_offset: u32,
    fallback: &dyn Fn(&Value<'js>) -> String,
) -> String {
    let raw = ctx.as_raw().as_ptr();
    let text = |v: &Value<'js>| v.is_string().then(|| js_string(raw, v.as_raw())).flatten();
    // SAFETY: `thrown` is a live value; this only reads its tag and class.
    if thrown.is_object() && unsafe { qjs::JS_IsError(thrown.as_raw()) } {
        let name = inherited_data(ctx, thrown, "name").and_then(|v| text(&v)).unwrap_or_else(|| "Error".into());
        let message = own_data(ctx, thrown, "message").and_then(|v| text(&v)).unwrap_or_default();
        let mut out = if message.is_empty() { name } else { format!("{name}: {message}") };
        let stack = match stack_getter {
            Some(getter) => getter.call::<_, Value>((rquickjs::function::This(thrown.clone()),)).ok(),
            None => own_data(ctx, thrown, "stack"),
        };
        if ctx.has_exception() {
            let _ = ctx.catch();
        }
        if let Some(stack) = stack.and_then(|v| text(&v)) {
            let stack = map_positions(&stack, line_offset);
            let stack = stack.trim_end();
            if !stack.is_empty() {
                out.push('\n');
                out.push_str(stack);
            }
        }
        truncate(out, 4096)
    } else if let Some(s) = text(thrown) {
        truncate(format!("Uncaught {s}"), 4096)
    } else {
        truncate(format!("Uncaught {}", fallback(thrown)), 4096)
    }
}

/// Rewrites `script.js:LINE:COL` so lines count from the user's first line.
fn map_positions(stack: &str, line_offset: u32) -> String {
    let needle = format!("{SCRIPT_FILE}:");
    let mut out = String::with_capacity(stack.len());
    let mut rest = stack;
    while let Some(at) = rest.find(&needle) {
        let (before, after) = rest.split_at(at + needle.len());
        out.push_str(before);
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        match after[..digits].parse::<u32>() {
            Ok(line) => out.push_str(&line.saturating_sub(line_offset).max(1).to_string()),
            Err(_) => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_from_the_users_first_line() {
        assert_eq!(
            map_positions("    at f (script.js:3:7)\n    at script.js:2:1", 1),
            "    at f (script.js:2:7)\n    at script.js:1:1"
        );
        assert_eq!(map_positions("at other.js:9:1", 1), "at other.js:9:1");
    }
}
