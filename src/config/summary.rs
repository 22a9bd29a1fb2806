//! A function's `summary` template: text with `{param}` placeholders, read the same way where the
//! configuration is checked and where a request's summary is rendered.

use serde_json::Value;

/// A piece of a template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part<'a> {
    /// Text shown as it is.
    Text(&'a str),
    /// `{name}`: the argument `name`.
    Param(&'a str),
}

/// The pieces of `template`, in one pass. A `{` with no `}` after it, or with another `{` before
/// its `}`, is text.
fn parts(template: &str) -> Vec<Part<'_>> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let name = after.find('}').map(|close| &after[..close]).filter(|name| !name.contains('{'));
        match name {
            Some(name) => {
                parts.push(Part::Text(&rest[..open]));
                parts.push(Part::Param(name));
                rest = &after[name.len() + 1..];
            }
            None => {
                parts.push(Part::Text(&rest[..=open]));
                rest = after;
            }
        }
    }
    parts.push(Part::Text(rest));
    parts
}

/// The parameters `template` names.
pub fn placeholders_in(template: &str) -> impl Iterator<Item = &str> {
    parts(template).into_iter().filter_map(|part| match part {
        Part::Param(name) => Some(name),
        Part::Text(_) => None,
    })
}

/// `template` with each `{param}` replaced by the argument (strings without their quotes; a
/// missing argument leaves its placeholder). An argument's own text is never read as a
/// placeholder.
pub fn render_summary(template: &str, arguments: &Value) -> String {
    let mut out = String::with_capacity(template.len());
    for part in parts(template) {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Param(name) => match &arguments[name] {
                Value::String(s) => out.push_str(s),
                Value::Null => out.push_str(&format!("{{{name}}}")),
                other => out.push_str(&other.to_string()),
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_summary_names_the_arguments() {
        let arguments = json!({ "order_id": "A-1", "amount": 1500 });
        assert_eq!(render_summary("Refund {amount} on order {order_id}", &arguments), "Refund 1500 on order A-1");
        let sneaky = json!({ "order_id": "{amount}", "amount": 1 });
        assert_eq!(render_summary("{order_id}: {amount}", &sneaky), "{amount}: 1", "an argument is not a template");
    }

    #[test]
    fn checking_and_rendering_read_a_template_alike() {
        for template in ["{x{a}", "{a", "a}", "{}{a}b{", "{{a}}"] {
            let named: Vec<&str> = placeholders_in(template).collect();
            let rendered = render_summary(template, &json!({ "a": "A", "x": "X" }));
            assert_eq!(rendered.contains('A'), named.contains(&"a"), "{template}: {named:?} {rendered}");
        }
        assert_eq!(render_summary("{x{a}", &json!({ "a": 1 })), "{x1");
    }
}
