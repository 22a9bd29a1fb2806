//! The inbox: the tenant's pending approvals, oldest first, each with the script's requests and,
//! for approvers, the form that decides it.

use super::decision_form;
use super::format;
use super::html::{Html, html};
use super::layout::{self, Viewer};
use super::request;
use crate::automation::PendingApproval;
use crate::server::auth::Role;

/// What non-approvers read instead of the decision forms.
pub const NOT_AN_APPROVER: &str = "Your API key does not have the approver role: you can see what waits for a decision, but only an approver can decide.";

/// One pending approval: its automation, round, time and requests, and, for a `decider`, the form
/// of what they may decide.
pub fn approval(approval: &PendingApproval, decider: Option<Viewer<'_>>) -> Html {
    let id = approval.automation_id.as_str();
    let mut out = Html::new();
    html!(
        out,
        "<article class=\"card approval\" id=\"approval-{}\">\n<h2><a href=\"/automations/{}\">Automation {}</a></h2>\n\
         <p class=\"muted\">Round {} · requested at <time>{}</time></p>\n",
        id,
        id,
        id,
        approval.round,
        format::utc(approval.requested_at)
    );
    for r in &approval.requests {
        html!(out, "{}", request::render(r));
    }
    if let Some(viewer) = decider {
        let roles: Vec<&str> = viewer.caller.roles.iter().map(Role::as_str).collect();
        html!(out, "{}", decision_form::render(approval, &viewer.caller.actor, &roles, viewer.csrf));
    }
    html!(out, "</article>\n");
    out
}

/// The inbox page of `viewer` with these pending approvals.
pub fn render(viewer: Viewer<'_>, approvals: &[PendingApproval]) -> Html {
    let approver = viewer.caller.roles.contains(&Role::APPROVER);
    let mut main = Html::new();
    html!(main, "<h1>Pending approvals <span class=\"count\">{}</span></h1>\n", approvals.len());
    if !approver {
        html!(main, "<p class=\"notice\" role=\"status\">{}</p>\n", NOT_AN_APPROVER);
    }
    if approvals.is_empty() {
        html!(main, "<p class=\"empty\">Nothing waits for a decision.</p>\n");
    }
    for a in approvals {
        html!(main, "{}", approval(a, approver.then_some(viewer)));
    }
    layout::page("Inbox", Some(viewer), main)
}
