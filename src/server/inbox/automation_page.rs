//! The page of one automation: status, the open approval (with the decision form for approvers),
//! every round's requests and decisions, the result or error, the final console, and the events,
//! which `/static/inbox.js` follows live from the cookie-authenticated events route.

use serde_json::Value;

use super::decision_form;
use super::format;
use super::html::{Html, html};
use super::inbox_page::NOT_AN_APPROVER;
use super::layout::{self, Viewer};
use super::request::{self, json_text};
use crate::automation::{AutomationView, CallOutcome, RoundCall, RoundRecord};
use crate::server::auth::Role;

fn console(lines: &[Value]) -> Html {
    let mut out = Html::new();
    if lines.is_empty() {
        return out;
    }
    html!(out, "<h3>Console</h3>\n<pre class=\"console\">");
    for line in lines {
        let level = line["level"].as_str().unwrap_or("log");
        let text = line["text"].as_str().map(str::to_owned).unwrap_or_else(|| line["text"].to_string());
        html!(out, "[{}] {}\n", level, text);
    }
    html!(out, "</pre>\n");
    out
}

fn round(record: &RoundRecord) -> Html {
    let mut out = Html::new();
    html!(out, "<section class=\"card round\">\n<h3>Round {}</h3>\n", record.round);
    for r in &record.requests {
        html!(out, "{}", request::render(r));
    }
    match &record.decision {
        // The page script fills this in when the decision arrives.
        None => html!(out, "<p class=\"muted\" id=\"round-{}-decision\">Not decided yet.</p>\n", record.round),
        Some(batch) => {
            html!(out, "<p>Decided by <strong>{}</strong>:</p>\n<ul class=\"decisions\">\n", batch.actor);
            for d in &batch.decisions {
                let (class, verdict) = if d.approved { ("approved", "approved") } else { ("rejected", "rejected") };
                html!(out, "<li><code>{}</code> <span class=\"{}\">{}</span>", d.interruption_id, class, verdict);
                if let Some(reason) = &d.reason {
                    html!(out, " — <q class=\"reason\">{}</q>", reason);
                }
                html!(out, "</li>\n");
            }
            html!(out, "</ul>\n");
        }
    }
    html!(out, "{}</section>\n", console(&record.console));
    out
}

/// The script's source and the host calls its rounds made: what an approver judges a request by.
fn script_and_calls(view: &AutomationView) -> Html {
    let mut out = Html::new();
    html!(
        out,
        "<h2>Script</h2>\n<details class=\"card\" open><summary>Source ({} bytes)</summary>\n\
         <pre class=\"source\" id=\"source\">{}</pre></details>\n<h2>Host calls</h2>\n",
        view.source.len(),
        view.source
    );
    if view.calls.is_empty() {
        html!(out, "<p class=\"muted\" id=\"no-calls\">No host calls yet.</p>\n");
        return out;
    }
    html!(
        out,
        "<table class=\"calls\" id=\"calls\">\n<thead><tr><th>Round</th><th>Function</th><th>Arguments</th>\
         <th>Outcome</th><th>Took</th></tr></thead>\n<tbody>\n"
    );
    for RoundCall { round, call } in &view.calls {
        let arguments = json_text(&Value::Array(call.arguments.clone()));
        let outcome = match (call.outcome, &call.result, &call.error) {
            (CallOutcome::Ok, Some(result), _) => json_text(result),
            (CallOutcome::Error, _, Some(error)) => format!("error: {error}"),
            (CallOutcome::Interrupted, _, _) => "asked for a decision".to_owned(),
            _ => call.outcome.as_str().to_owned(),
        };
        html!(
            out,
            "<tr class=\"call {}\"><td>{}</td><td><code>{}</code></td><td><pre>{}</pre></td><td><pre>{}</pre></td>\
             <td>{} ms</td></tr>\n",
            call.outcome.as_str(),
            *round,
            call.function,
            arguments,
            outcome,
            call.duration_ms
        );
    }
    html!(out, "</tbody>\n</table>\n");
    out
}

fn outcome(view: &AutomationView) -> Html {
    let mut out = Html::new();
    html!(out, "<section id=\"outcome\">\n");
    if let Some(result) = &view.result {
        html!(out, "<h2>Result</h2>\n<pre id=\"result\">{}</pre>\n", json_text(result));
    } else if let Some(error) = &view.error {
        let code = error["code"].as_str().unwrap_or("AUTOMATION_FAILED");
        let message = error["message"].as_str().unwrap_or_default();
        html!(out, "<h2>Error</h2>\n<p id=\"error\"><code>{}</code> {}</p>\n", code, message);
    } else {
        html!(out, "<p class=\"muted\" id=\"pending-outcome\">The result appears here when the automation ends.</p>\n");
    }
    html!(out, "{}</section>\n", console(&view.console));
    out
}

/// The page of `view` as `viewer` sees it.
pub fn render(viewer: Viewer<'_>, view: &AutomationView) -> Html {
    let id = view.id.as_str();
    let mut main = Html::new();
    html!(
        main,
        "<p><a href=\"/\">← Inbox</a></p>\n<h1>Automation <code>{}</code></h1>\n<dl class=\"facts\">\
         <dt>Status</dt><dd><strong id=\"status\" class=\"status\" data-status=\"{}\">{}</strong></dd>\
         <dt>Submitted by</dt><dd>{}</dd><dt>Submitted at</dt><dd><time>{}</time></dd>",
        id,
        view.status.as_str(),
        view.status.as_str(),
        view.submitted_by,
        format::utc(view.created_at)
    );
    if let Some(ended) = view.completed_at {
        html!(main, "<dt>Ended at</dt><dd><time>{}</time></dd>", format::utc(ended));
    }
    html!(main, "<dt>Rounds</dt><dd>{}</dd></dl>\n", view.rounds);
    if let Some(pending) = &view.pending {
        html!(
            main,
            "<section class=\"card waiting\" id=\"pending\">\n<h2>Waiting for a decision</h2>\n\
             <p class=\"muted\">Round {} · requested at <time>{}</time></p>\n",
            pending.round,
            format::utc(pending.requested_at)
        );
        for r in &pending.requests {
            html!(main, "{}", request::render(r));
        }
        if viewer.caller.roles.contains(&Role::APPROVER) {
            let roles: Vec<&str> = viewer.caller.roles.iter().map(Role::as_str).collect();
            html!(main, "{}", decision_form::render(pending, &viewer.caller.actor, &roles, viewer.csrf));
        } else {
            html!(main, "<p class=\"notice\" role=\"status\">{}</p>\n", NOT_AN_APPROVER);
        }
        html!(main, "</section>\n");
    }
    html!(main, "{}", outcome(view));
    if viewer.caller.reads_automations() {
        html!(main, "{}", script_and_calls(view));
    }
    if !view.history.is_empty() {
        html!(main, "<h2>Requests and decisions</h2>\n");
        for record in &view.history {
            html!(main, "{}", round(record));
        }
    }
    html!(
        main,
        "<h2>Events</h2>\n<p id=\"live\" class=\"muted\" role=\"status\">Events appear here as they happen.</p>\n\
         <ol id=\"events\" class=\"events\" data-src=\"/automations/{}/events?from=0\" data-rounds=\"{}\"></ol>\n\
         <noscript><p class=\"muted\">Reload the page to see new events.</p></noscript>\n",
        id,
        view.rounds
    );
    layout::page(&format!("Automation {id}"), Some(viewer), main)
}
