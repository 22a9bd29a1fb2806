//! The sessions list and the page of one session: its facts, and its events, with a link to the
//! automation of each command.

use serde_json::Value;

use super::format;
use super::html::{Html, html};
use super::layout::{self, Viewer};
use super::request::json_text;
use crate::automation::Page;
use crate::session::{SessionSummary, SessionView};

/// The sessions page of `viewer`: one page of sessions, and the link to older ones.
pub fn list(viewer: Viewer<'_>, page: &Page<SessionSummary>, next: Option<String>) -> Html {
    let mut main = Html::new();
    html!(main, "<h1>Sessions</h1>\n");
    if page.items.is_empty() {
        html!(main, "<p class=\"empty\">No sessions yet.</p>\n");
    } else {
        html!(
            main,
            "<table class=\"sessions\" id=\"sessions\">\n<thead><tr><th>Session</th><th>State</th>\
             <th>Started by</th><th>Started at</th></tr></thead>\n<tbody>\n"
        );
        for s in &page.items {
            let state = if s.live { "live" } else { "ended" };
            html!(
                main,
                "<tr><td><a href=\"/sessions/{}\"><code>{}</code></a></td><td>{}</td><td>{}</td>\
                 <td><time>{}</time></td></tr>\n",
                s.id.as_str(),
                s.id.as_str(),
                state,
                s.created_by,
                format::utc(s.created_at)
            );
        }
        html!(main, "</tbody>\n</table>\n");
    }
    if let Some(next) = next {
        html!(main, "<p><a rel=\"next\" href=\"/sessions?cursor={}\">Older sessions →</a></p>\n", next);
    }
    layout::page("Sessions", Some(viewer), main)
}

/// One event of a session, as a list item.
fn event(index: u64, event: &Value) -> Html {
    let mut out = Html::new();
    let kind = event["type"].as_str().unwrap_or("event");
    html!(out, "<li data-index=\"{}\"><strong>{}</strong>", index, kind);
    if let Some(command) = event["command"].as_u64() {
        html!(out, " · command {}", command);
    }
    if let Some(automation) = event["automation"].as_str() {
        html!(out, " · <a href=\"/automations/{}\"><code>{}</code></a>", automation, automation);
    }
    if let Some(status) = event["status"].as_str() {
        html!(out, " · {}", status);
    }
    for field in ["value", "error"] {
        if let Some(value) = event.get(field).filter(|v| !v.is_null()) {
            html!(out, "<pre>{}</pre>", json_text(value));
        }
    }
    if let Some(lines) = event["console"].as_array().filter(|l| !l.is_empty()) {
        html!(out, "<pre class=\"console\">");
        for line in lines {
            let text = line["text"].as_str().map(str::to_owned).unwrap_or_else(|| line["text"].to_string());
            html!(out, "[{}] {}\n", line["level"].as_str().unwrap_or("log"), text);
        }
        html!(out, "</pre>");
    }
    html!(out, "</li>\n");
    out
}

/// The page of session `view`, with its `events`.
pub fn render(viewer: Viewer<'_>, view: &SessionView, events: &[(u64, Value)]) -> Html {
    let id = view.id.as_str();
    let mut main = Html::new();
    html!(
        main,
        "<p><a href=\"/sessions\">← Sessions</a></p>\n<h1>Session <code>{}</code></h1>\n<dl class=\"facts\">\
         <dt>Status</dt><dd><strong id=\"status\">{}</strong></dd><dt>Started by</dt><dd>{}</dd>\
         <dt>Commands</dt><dd>{} ({} ended)</dd></dl>\n<h2>Events</h2>\n<ol class=\"events\" id=\"session-events\">\n",
        id,
        view.status,
        view.created_by,
        view.commands,
        view.commands_ended
    );
    for (index, e) in events {
        html!(main, "{}", event(*index, e));
    }
    html!(main, "</ol>\n");
    layout::page(&format!("Session {id}"), Some(viewer), main)
}
