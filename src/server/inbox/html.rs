//! HTML output that is escaped by construction: markup comes only from format-string literals,
//! and every value interpolated into them goes through [`Render`], which escapes text.
//!
//! Write with the [`html!`] macro and positional `{}` placeholders only (an inline `{name}`
//! capture would bypass the escaping). Every attribute value is double-quoted.

use std::fmt::{self, Write as _};

/// A piece of HTML being built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Html(String);

impl Html {
    /// Empty.
    pub fn new() -> Html {
        Html::default()
    }

    /// The markup.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The markup, owned.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Appends formatted markup; used by [`html!`], whose arguments are wrapped in [`Safe`].
    pub fn write_markup(&mut self, args: fmt::Arguments<'_>) {
        // Writing to a String cannot fail.
        let _ = self.0.write_fmt(args);
    }
}

/// A value that can be put into HTML: text is escaped, [`Html`] is inserted as it is.
pub trait Render {
    /// Writes the value as HTML.
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl Render for str {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            out.write_str(&rest[..at])?;
            out.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        out.write_str(rest)
    }
}

impl Render for String {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_str().render(out)
    }
}

impl Render for crate::automation::InterruptionId {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_str().render(out)
    }
}

impl Render for Html {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        out.write_str(&self.0)
    }
}

impl<T: Render + ?Sized> Render for &T {
    fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).render(out)
    }
}

macro_rules! render_as_display {
    ($($t:ty),*) => {$(
        impl Render for $t {
            fn render(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(out, "{self}")
            }
        }
    )*};
}

render_as_display!(u32, u64, i64, usize);

/// Displays a [`Render`] value as HTML (the wrapper [`html!`] puts around its arguments).
pub struct Safe<'a, T: ?Sized>(pub &'a T);

impl<T: Render + ?Sized> fmt::Display for Safe<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.render(f)
    }
}

/// `text` with `& < > " '` replaced by character references, for element content and
/// double- or single-quoted attribute values.
pub fn escape(text: &str) -> String {
    Safe(text).to_string()
}

/// Appends markup to an [`Html`]: `html!(out, "<p>{}</p>", value)`; every argument is rendered
/// through [`Render`] (text escaped).
macro_rules! html {
    ($out:expr, $fmt:literal $(, $arg:expr)* $(,)?) => {
        $out.write_markup(format_args!($fmt $(, $crate::server::inbox::html::Safe(&$arg))*))
    };
}

pub(crate) use html;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_markup_is_not() {
        assert_eq!(
            escape(r#"<img src=x onerror="alert(1)">&'"#),
            "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;&#39;"
        );
        assert_eq!(escape("plain ünïcode"), "plain ünïcode");
        assert_eq!(escape(""), "");
        let mut inner = Html::new();
        html!(inner, "<b>{}</b>", "<i>");
        let mut out = Html::new();
        html!(out, "<p title=\"{}\">{} {} {}</p>", "a\"b", inner, 42u32, String::from("x&y"));
        assert_eq!(out.as_str(), "<p title=\"a&quot;b\"><b>&lt;i&gt;</b> 42 x&amp;y</p>");
    }
}
