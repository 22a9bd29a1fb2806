//! Reads guest values as JSON text without running any guest code.
//!
//! The walker never calls a getter, `toJSON`, a proxy trap or an iterator: it
//! reads own data properties through the engine's descriptor API and refuses
//! everything that is not plain data. Rules (also in `docs/security.md`):
//!
//! | value | crosses as |
//! |---|---|
//! | `undefined` | omitted in objects, `null` in arrays and at the top level |
//! | `-0` | `0` |
//! | `NaN`, `±Infinity`, `BigInt`, symbols, functions | refused, naming the path |
//! | `Date` | its ISO string (invalid dates are refused) |
//! | `Map`, `Set`, typed arrays, proxies, promises, class instances other than plain objects | refused |
//! | getters | refused (never invoked) |
//! | cycles, nesting deeper than 100 | refused |
//! | lone surrogates in strings | U+FFFD |
//! | array holes | `null` |
//! | symbol-keyed and non-enumerable properties | skipped |

use rquickjs::{Ctx, Function, Value, function::This, qjs};
use std::ffi::c_void;
use std::fmt::Write as _;

/// Deepest nesting accepted, in objects and arrays; below serde_json's own
/// recursion limit (128) so every accepted value also parses on the host side.
pub(crate) const MAX_DEPTH: usize = 100;

/// Class ids of the few kinds of object the walker accepts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassIds {
    pub object: u32,
    pub array: u32,
    pub date: u32,
    pub error: u32,
}

/// Why a value could not be serialized.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SerializeError {
    /// A value of an unsupported kind at `path`.
    Unsupported { path: String, what: String },
    /// The output grew past `limit` bytes.
    TooLarge { limit: usize },
    /// The engine failed (out of memory) while reading.
    Engine,
}

impl SerializeError {
    pub(crate) fn message(&self, subject: &str) -> String {
        match self {
            SerializeError::Unsupported { path, what } => {
                format!("{subject} cannot cross the boundary: {what} at {path}")
            }
            SerializeError::TooLarge { limit } => format!("{subject} is larger than the limit of {limit} bytes"),
            SerializeError::Engine => format!("{subject} could not be read (engine out of memory)"),
        }
    }
}

/// Strict for values that cross the boundary; lenient for console output.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Strict,
    Lenient,
}

pub(crate) struct Serializer<'a, 'js> {
    ctx: &'a Ctx<'js>,
    raw: *mut qjs::JSContext,
    classes: ClassIds,
    date_to_iso: &'a Function<'js>,
    mode: Mode,
    limit: usize,
    out: String,
    path: Vec<Segment>,
    ancestors: Vec<*mut c_void>,
}

enum Segment {
    Key(String),
    Index(u32),
    /// The root of the path of a host call's argument (`args[0]`), written out only when a
    /// path is reported.
    Argument(usize),
}

impl<'a, 'js> Serializer<'a, 'js> {
    pub(crate) fn new(
        ctx: &'a Ctx<'js>,
        classes: ClassIds,
        date_to_iso: &'a Function<'js>,
        mode: Mode,
        limit: usize,
    ) -> Self {
        Serializer {
            ctx,
            raw: ctx.as_raw().as_ptr(),
            classes,
            date_to_iso,
            mode,
            limit,
            out: String::new(),
            path: Vec::new(),
            ancestors: Vec::new(),
        }
    }

    /// Serializes `value`; `root` names it in error paths (`result`, `args[0]`).
    pub(crate) fn serialize(mut self, value: &Value<'js>, root: &str) -> Result<String, SerializeError> {
        self.path.push(Segment::Key(root.to_string()));
        if value.is_undefined() {
            self.out.push_str("null");
        } else {
            self.value(value)?;
        }
        Ok(self.out)
    }

    /// Serializes a list of arguments as a JSON array (`undefined` becomes `null`).
    pub(crate) fn serialize_arguments(mut self, args: &[Value<'js>]) -> Result<String, SerializeError> {
        self.out.push('[');
        for (i, arg) in args.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.path.clear();
            self.path.push(Segment::Argument(i));
            if arg.is_undefined() {
                self.out.push_str("null");
            } else {
                self.value(arg)?;
            }
            self.check_size()?;
        }
        self.out.push(']');
        self.check_size()?;
        Ok(self.out)
    }

    fn check_size(&self) -> Result<(), SerializeError> {
        if self.out.len() > self.limit { Err(SerializeError::TooLarge { limit: self.limit }) } else { Ok(()) }
    }

    fn path_string(&self) -> String {
        let mut s = String::new();
        let skip = self.path.len().saturating_sub(24);
        for (i, seg) in self.path.iter().enumerate() {
            if i > 0 && i < skip {
                if i == 1 {
                    s.push('…');
                }
                continue;
            }
            match seg {
                Segment::Key(k) if i == 0 => s.push_str(k),
                Segment::Key(k) if is_identifier(k) => {
                    s.push('.');
                    s.push_str(k);
                }
                Segment::Key(k) => {
                    s.push('[');
                    write_json_string(&mut s, k);
                    s.push(']');
                }
                Segment::Index(n) => {
                    let _ = write!(s, "[{n}]");
                }
                Segment::Argument(n) => {
                    let _ = write!(s, "args[{n}]");
                }
            }
        }
        s
    }

    /// Refuses (strict) or writes a placeholder string (lenient).
    fn unsupported(&mut self, what: &str) -> Result<(), SerializeError> {
        match self.mode {
            Mode::Strict => Err(SerializeError::Unsupported { path: self.path_string(), what: what.to_string() }),
            Mode::Lenient => {
                write_json_string(&mut self.out, &format!("[{what}]"));
                Ok(())
            }
        }
    }

    fn value(&mut self, value: &Value<'js>) -> Result<(), SerializeError> {
        if let Some(i) = value.as_int() {
            let _ = write!(self.out, "{i}");
        } else if let Some(f) = value.as_float() {
            self.number(f)?;
        } else if let Some(b) = value.as_bool() {
            self.out.push_str(if b { "true" } else { "false" });
        } else if value.is_null() || value.is_undefined() {
            self.out.push_str("null");
        } else if value.is_string() {
            // Every UTF-16 unit takes at least one byte: refuse before copying.
            let mut units: i64 = 0;
            // SAFETY: `self.raw` is the context of `self.ctx`, which outlives the serializer, and
            // `value` a live string of it; a string's `length` is read without running code.
            if unsafe { qjs::JS_GetLength(self.raw, value.as_raw(), &mut units) } == 0
                && self.out.len() as i64 + units > self.limit as i64
            {
                return Err(SerializeError::TooLarge { limit: self.limit });
            }
            let text = js_string(self.raw, value.as_raw()).ok_or(SerializeError::Engine)?;
            // Refused before escaping, which could multiply its size.
            if self.out.len() + text.len() > self.limit {
                return Err(SerializeError::TooLarge { limit: self.limit });
            }
            write_json_string(&mut self.out, &text);
        } else if value.is_object() {
            self.object(value)?;
        // SAFETY: only reads the tag of a live value.
        } else if unsafe { qjs::JS_IsBigInt(value.as_raw()) } {
            self.unsupported("a BigInt")?;
        // SAFETY: only reads the tag of a live value.
        } else if unsafe { qjs::JS_IsSymbol(value.as_raw()) } {
            self.unsupported("a symbol")?;
        } else {
            self.unsupported("an unsupported value")?;
        }
        self.check_size()
    }

    fn number(&mut self, f: f64) -> Result<(), SerializeError> {
        if !f.is_finite() {
            let what = if f.is_nan() { "NaN" } else { "an infinite number" };
            return self.unsupported(what);
        }
        if f == 0.0 {
            self.out.push('0'); // also -0
        } else if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
            let _ = write!(self.out, "{}", f as i64);
        } else if let Some(n) = serde_json::Number::from_f64(f) {
            let _ = write!(self.out, "{n}");
        } else {
            return self.unsupported("an unrepresentable number");
        }
        Ok(())
    }

    fn object(&mut self, value: &Value<'js>) -> Result<(), SerializeError> {
        let raw = value.as_raw();
        // SAFETY: `raw` is a live object; this only reads its class.
        let class = unsafe { qjs::JS_GetClassID(raw) };
        if class == self.classes.date {
            return self.date(value);
        }
        if class != self.classes.object && class != self.classes.array {
            // SAFETY: `self.raw` is the context of `self.ctx` and `raw` a live object of it; both
            // calls only inspect the object, running no code.
            let what = if unsafe { qjs::JS_IsFunction(self.raw, raw) } {
                "a function"
            // SAFETY: as above.
            } else if unsafe { qjs::JS_IsProxy(raw) } {
                "a Proxy"
            } else if class == self.classes.error {
                "an Error (pass error.message instead)"
            } else {
                "an object that is not plain data (Map, Set, typed array, promise, boxed primitive…)"
            };
            return self.unsupported(what);
        }
        // SAFETY: `raw` is an object, so its value holds the object's pointer; it is only compared.
        let ptr = unsafe { qjs::JS_VALUE_GET_PTR(raw) };
        if self.ancestors.contains(&ptr) {
            return self.unsupported("a cycle");
        }
        if self.ancestors.len() >= MAX_DEPTH {
            return self.unsupported("nesting deeper than 100 levels");
        }
        self.ancestors.push(ptr);
        let result = if class == self.classes.array { self.array(raw) } else { self.plain_object(raw) };
        self.ancestors.pop();
        result
    }

    fn date(&mut self, value: &Value<'js>) -> Result<(), SerializeError> {
        match self.date_to_iso.call::<_, String>((This(value.clone()),)) {
            Ok(iso) => {
                write_json_string(&mut self.out, &iso);
                Ok(())
            }
            Err(_) => {
                let _ = self.ctx.catch();
                self.unsupported("an invalid Date")
            }
        }
    }

    fn array(&mut self, raw: qjs::JSValue) -> Result<(), SerializeError> {
        // SAFETY: `self.raw` is the context of `self.ctx`, which outlives the serializer.
        let atom = unsafe { length_atom(self.raw) };
        let slot = self.own_property(raw, atom);
        // SAFETY: frees the reference `length_atom` returned, once, after its last use.
        unsafe { qjs::JS_FreeAtom(self.raw, atom) };
        let length = match slot? {
            Slot::Data(v) => v.as_int().map(f64::from).or_else(|| v.as_float()),
            _ => None,
        }
        .ok_or(SerializeError::Engine)?;
        let length = length as u64;
        // Every element takes at least one byte and one comma.
        if length.saturating_mul(2) > self.limit as u64 {
            return Err(SerializeError::TooLarge { limit: self.limit });
        }
        self.out.push('[');
        for index in 0..length as u32 {
            if index > 0 {
                self.out.push(',');
            }
            // SAFETY: `self.raw` is the context of `self.ctx`, which outlives the serializer.
            let atom = unsafe { qjs::JS_NewAtomUInt32(self.raw, index) };
            let slot = self.own_property(raw, atom);
            // SAFETY: frees the atom just made, once, after its last use.
            unsafe { qjs::JS_FreeAtom(self.raw, atom) };
            self.path.push(Segment::Index(index));
            match slot? {
                Slot::Missing => self.out.push_str("null"),
                Slot::Accessor => self.unsupported("a getter")?,
                Slot::Data(element) if element.is_undefined() => self.out.push_str("null"),
                Slot::Data(element) => self.value(&element)?,
            }
            self.path.pop();
            self.check_size()?;
        }
        self.out.push(']');
        Ok(())
    }

    fn plain_object(&mut self, raw: qjs::JSValue) -> Result<(), SerializeError> {
        let mut tab: *mut qjs::JSPropertyEnum = std::ptr::null_mut();
        let mut len: u32 = 0;
        let flags = (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_ENUM_ONLY) as i32;
        // SAFETY: `self.raw` is the context of `self.ctx` and `raw` a live plain object of it (its
        // class was checked, so no proxy trap runs); `tab` and `len` are valid places to write.
        if unsafe { qjs::JS_GetOwnPropertyNames(self.raw, &mut tab, &mut len, raw, flags) } < 0 {
            let _ = self.ctx.catch();
            return Err(SerializeError::Engine);
        }
        // SAFETY: on success `tab` points to `len` entries, and `i < len`.
        let atoms: Vec<qjs::JSAtom> = (0..len as usize).map(|i| unsafe { (*tab.add(i)).atom }).collect();
        // The atoms stay valid while `tab` holds them, until it is freed below.
        let result = self.object_members(raw, &atoms);
        // SAFETY: `tab` and `len` are what `JS_GetOwnPropertyNames` returned; freed once, after the
        // last use of its atoms.
        unsafe { qjs::JS_FreePropertyEnum(self.raw, tab, len) };
        result
    }

    fn object_members(&mut self, raw: qjs::JSValue, atoms: &[qjs::JSAtom]) -> Result<(), SerializeError> {
        self.out.push('{');
        let mut first = true;
        for &atom in atoms {
            let key = atom_string(self.raw, atom).ok_or(SerializeError::Engine)?;
            let slot = self.own_property(raw, atom)?;
            if matches!(&slot, Slot::Missing) || matches!(&slot, Slot::Data(v) if v.is_undefined()) {
                continue;
            }
            if !first {
                self.out.push(',');
            }
            first = false;
            write_json_string(&mut self.out, &key);
            self.out.push(':');
            self.path.push(Segment::Key(key));
            match slot {
                Slot::Accessor => self.unsupported("a getter")?,
                Slot::Data(member) => self.value(&member)?,
                Slot::Missing => {}
            }
            self.path.pop();
            self.check_size()?;
        }
        self.out.push('}');
        Ok(())
    }

    fn own_property(&self, obj: qjs::JSValue, atom: qjs::JSAtom) -> Result<Slot<'js>, SerializeError> {
        let mut desc = qjs::JSPropertyDescriptor {
            flags: 0,
            value: qjs::JS_UNDEFINED,
            getter: qjs::JS_UNDEFINED,
            setter: qjs::JS_UNDEFINED,
        };
        // SAFETY: `self.raw` is the context of `self.ctx`, `obj` a live plain object or array of it
        // (no proxy trap can run) and `atom` an atom the caller holds; `desc` is a valid place to
        // write.
        let found = unsafe { qjs::JS_GetOwnProperty(self.raw, &mut desc, obj, atom) };
        if found < 0 {
            let _ = self.ctx.catch();
            return Err(SerializeError::Engine);
        }
        if found == 0 {
            return Ok(Slot::Missing);
        }
        // SAFETY: a found property fills `desc` with three new references we own; the `Value`
        // takes over the value's.
        let value = unsafe { Value::from_raw(self.ctx.clone(), desc.value) };
        // SAFETY: frees the getter's and the setter's references, once each.
        unsafe {
            qjs::JS_FreeValue(self.raw, desc.getter);
            qjs::JS_FreeValue(self.raw, desc.setter);
        }
        if desc.flags & qjs::JS_PROP_GETSET as i32 != 0 {
            return Ok(Slot::Accessor);
        }
        Ok(Slot::Data(value))
    }
}

enum Slot<'js> {
    Missing,
    Accessor,
    Data(Value<'js>),
}

/// The `length` atom, to be freed with `JS_FreeAtom`.
///
/// # Safety
/// `ctx` is a live context, used from the thread that holds its runtime's lock.
unsafe fn length_atom(ctx: *mut qjs::JSContext) -> qjs::JSAtom {
    // JS_ATOM_length is predefined, so this lookup never allocates a new atom.
    // SAFETY: `ctx` is live (the caller's contract); the name is 6 readable bytes.
    unsafe { qjs::JS_NewAtomLen(ctx, c"length".as_ptr(), 6) }
}

/// Converts a JS string to UTF-8; lone surrogates become U+FFFD.
pub(crate) fn js_string(ctx: *mut qjs::JSContext, value: qjs::JSValue) -> Option<String> {
    let mut len: qjs::size_t = 0;
    // SAFETY: relies on every caller passing a live context and a live string value of it (this
    // safe function cannot check that); `len` is a valid place to write.
    let ptr = unsafe { qjs::JS_ToCStringLen2(ctx, &mut len, value, false) };
    if ptr.is_null() {
        return None;
    }
    Some(take_c_string(ctx, ptr, len))
}

fn atom_string(ctx: *mut qjs::JSContext, atom: qjs::JSAtom) -> Option<String> {
    let mut len: qjs::size_t = 0;
    // SAFETY: relies on the caller passing a live context and an atom it holds (not checked
    // here); `len` is a valid place to write.
    let ptr = unsafe { qjs::JS_AtomToCStringLen(ctx, &mut len, atom) };
    if ptr.is_null() {
        return None;
    }
    Some(take_c_string(ctx, ptr, len))
}

/// Copies an engine-owned C string (lone surrogates as U+FFFD) and frees it.
fn take_c_string(ctx: *mut qjs::JSContext, ptr: *const std::ffi::c_char, len: qjs::size_t) -> String {
    // SAFETY: relies on the callers (`js_string`, `atom_string`) passing a non-null string the
    // engine just made in `ctx`, `len` bytes long; it stays valid until freed below.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
    let text = utf8_replacing_surrogates(bytes);
    // SAFETY: frees that string once; `bytes` is not used after this.
    unsafe { qjs::JS_FreeCString(ctx, ptr) };
    text
}

/// The engine encodes a lone surrogate as its 3-byte (WTF-8) form; each such
/// sequence, and any other invalid byte, becomes one U+FFFD.
pub(crate) fn utf8_replacing_surrogates(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut out = String::with_capacity(bytes.len());
            let mut rest = bytes;
            while !rest.is_empty() {
                match std::str::from_utf8(rest) {
                    Ok(s) => {
                        out.push_str(s);
                        break;
                    }
                    Err(e) => {
                        let (valid, after) = rest.split_at(e.valid_up_to());
                        out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                        out.push('\u{FFFD}');
                        let skip = match after {
                            [0xED, b1, b2, ..] if (0xA0..=0xBF).contains(b1) && (0x80..=0xBF).contains(b2) => 3,
                            _ => e.error_len().unwrap_or(after.len()),
                        };
                        rest = &after[skip.min(after.len())..];
                    }
                }
            }
            out
        }
    }
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// Appends `s` as a JSON string literal.
pub(crate) fn write_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_json() {
        let mut out = String::new();
        write_json_string(&mut out, "a\"b\\c\n\u{1}é");
        assert_eq!(out, r#""a\"b\\c\n\u0001é""#);
        let parsed: String = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed, "a\"b\\c\n\u{1}é");
    }

    #[test]
    fn lone_surrogates_become_one_replacement_each() {
        assert_eq!(utf8_replacing_surrogates(b"a\xED\xA0\x80b"), "a\u{FFFD}b");
        assert_eq!(utf8_replacing_surrogates(b"\xED\xB0\x80\xED\xA0\x80"), "\u{FFFD}\u{FFFD}");
        assert_eq!(utf8_replacing_surrogates(b"ok"), "ok");
    }
}
