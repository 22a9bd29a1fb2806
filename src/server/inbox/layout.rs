//! The frame of every page (head, header with the signed-in actor and the sign-out form), the
//! sign-in page and the error page.

use axum::http::StatusCode;

use super::csrf;
use super::html::{Html, html};
use crate::server::auth::{Caller, Role};

/// Who is signed in, as the header shows it, with the CSRF token of the sign-out form.
#[derive(Clone, Copy, Debug)]
pub struct Viewer<'a> {
    /// The signed-in caller.
    pub caller: &'a Caller,
    /// The CSRF token of the caller's forms.
    pub csrf: &'a str,
}

/// The role names of `caller`, comma-separated (`none` when it has none).
pub fn roles(caller: &Caller) -> String {
    let names: Vec<&str> = caller.roles.iter().map(Role::as_str).collect();
    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
}

/// A whole page: `title`, the header (with the viewer, if signed in) and `main`.
pub fn page(title: &str, viewer: Option<Viewer<'_>>, main: Html) -> Html {
    let mut out = Html::new();
    html!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{} · Resumable</title>\n<link rel=\"stylesheet\" href=\"/static/inbox.css\">\n\
         <script src=\"/static/inbox.js\" defer></script>\n</head>\n<body>\n\
         <header class=\"top\"><a class=\"brand\" href=\"/\">Resumable inbox</a>",
        title
    );
    if let Some(v) = viewer {
        html!(
            out,
            "<nav><a href=\"/\">Inbox</a> <a href=\"/history\">History</a> <a href=\"/sessions\">Sessions</a></nav>\
             <span class=\"who\">{} · tenant {} · {}</span>\
             <form method=\"post\" action=\"/logout\" class=\"inline\">\
             <input type=\"hidden\" name=\"{}\" value=\"{}\">\
             <button type=\"submit\" class=\"link\">Sign out</button></form>",
            v.caller.actor,
            v.caller.tenant,
            roles(v.caller),
            csrf::FIELD,
            v.csrf
        );
    }
    html!(out, "</header>\n<main>\n{}</main>\n</body>\n</html>\n", main);
    out
}

/// The sign-in page, with `message` (why the last attempt failed) if any.
pub fn sign_in(message: Option<&str>) -> Html {
    let mut main = Html::new();
    html!(main, "<h1>Sign in</h1>\n");
    if let Some(message) = message {
        html!(main, "<p class=\"alert\" role=\"alert\">{}</p>\n", message);
    }
    html!(
        main,
        "<form method=\"post\" action=\"/login\" class=\"card\">\n\
         <label for=\"key\">API key</label>\n\
         <input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" required>\n\
         <button type=\"submit\">Sign in</button>\n</form>\n\
         <p class=\"muted\">The key is kept in a cookie that scripts on the page cannot read, \
         until you sign out or close the browser.</p>\n"
    );
    page("Sign in", None, main)
}

/// The page of an error: its status, stable `code` and `message`.
pub fn error(status: StatusCode, code: &str, message: &str) -> Html {
    let mut main = Html::new();
    let title = status.canonical_reason().unwrap_or("Error");
    html!(
        main,
        "<h1>{}</h1>\n<p class=\"alert\" role=\"alert\">{}</p>\n<p class=\"muted\">Error code <code>{}</code> \
         (HTTP {}).</p>\n<p><a href=\"/\">Back to the inbox</a></p>\n",
        title,
        message,
        code,
        u32::from(status.as_u16())
    );
    page(title, None, main)
}
