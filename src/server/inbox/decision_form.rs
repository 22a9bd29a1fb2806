//! The form that decides one round of an automation, and how its post becomes a
//! [`DecisionBatch`].
//!
//! One form per round. It decides the round's requests that are still open for the viewer (not
//! decided yet, nor decided by the viewer already): one optional reason (given to every decision)
//! and the buttons *Approve* and *Reject* (for all of them); with several open requests also an
//! approve or reject choice per request and a button that submits the choices made, leaving the
//! others open. A hidden `round` field makes a stale form (for a round that was decided
//! meanwhile) fail instead of deciding a newer one.

use axum::http::StatusCode;

use super::csrf;
use super::error::PageError;
use super::form::PostedForm;
use super::html::{Html, html};
use crate::automation::{Decision, DecisionBatch, MAX_REASON_CHARS, PendingApproval, PendingRequest};
use crate::server::error::ApiError;

/// The name of the per-request choice field of `interruption_id`.
fn choice_field(interruption_id: &str) -> String {
    format!("decision:{interruption_id}")
}

/// The requests of `approval` that `actor`, holding `roles`, may still decide: not decided, nor
/// approved by them, and theirs to decide (a role the function names; not their own submission of
/// a four-eyes function). "Approve all" then never names one the server would refuse.
fn open_requests<'a>(approval: &'a PendingApproval, actor: &str, roles: &[&str]) -> Vec<&'a PendingRequest> {
    approval
        .requests
        .iter()
        .filter(|r| {
            let progress = approval.progress.iter().find(|p| p.interruption_id == r.interruption_id);
            progress.is_none_or(|p| !p.is_decided() && !p.approved_by.iter().any(|a| a == actor))
                && approval.may_decide(r, roles, actor)
        })
        .collect()
}

/// The decision form of `approval` for `actor` holding `roles`, with the session's CSRF token.
pub fn render(approval: &PendingApproval, actor: &str, roles: &[&str], csrf: &str) -> Html {
    let id = approval.automation_id.as_str();
    let open = open_requests(approval, actor, roles);
    let several = open.len() > 1;
    let mut out = Html::new();
    if open.is_empty() {
        html!(
            out,
            "<p class=\"notice\" role=\"status\">Nothing here is left for you to decide; the round waits for others.</p>\n"
        );
        return out;
    }
    html!(
        out,
        "<form method=\"post\" action=\"/automations/{}/decide\" class=\"decide\">\n\
         <input type=\"hidden\" name=\"{}\" value=\"{}\">\n<input type=\"hidden\" name=\"round\" value=\"{}\">\n",
        id,
        csrf::FIELD,
        csrf,
        approval.round
    );
    if several {
        for request in &open {
            let field = choice_field(request.interruption_id.as_str());
            html!(
                out,
                "<fieldset class=\"choice\"><legend>{} ({})</legend>\
                 <label><input type=\"radio\" name=\"{}\" value=\"approve\"> Approve</label>\
                 <label><input type=\"radio\" name=\"{}\" value=\"reject\"> Reject</label></fieldset>\n",
                request.interruption_id,
                request.function,
                field,
                field
            );
        }
    }
    html!(
        out,
        "<label for=\"reason-{}\">Reason (optional)</label>\n\
         <textarea id=\"reason-{}\" name=\"reason\" rows=\"2\" maxlength=\"{}\"></textarea>\n<div class=\"buttons\">",
        id,
        id,
        MAX_REASON_CHARS
    );
    let all = if several { " all" } else { "" };
    html!(
        out,
        "<button type=\"submit\" name=\"choice\" value=\"approve\" class=\"approve\">Approve{}</button>\
         <button type=\"submit\" name=\"choice\" value=\"reject\" class=\"reject\">Reject{}</button>",
        all,
        all
    );
    if several {
        html!(out, "<button type=\"submit\" name=\"choice\" value=\"each\">Submit the choices above</button>");
    }
    html!(out, "</div>\n</form>\n");
    out
}

fn approved(value: Option<&str>) -> Option<bool> {
    match value {
        Some("approve") => Some(true),
        Some("reject") => Some(false),
        _ => None,
    }
}

/// The batch that a post of the form of `approval` stands for, decided by `actor` holding `roles`.
pub fn parse(
    form: &PostedForm,
    approval: &PendingApproval,
    actor: &str,
    roles: &[&str],
) -> Result<DecisionBatch, PageError> {
    let round: u32 = form
        .get("round")
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| PageError::bad_form("the form does not say which round it decides"))?;
    if round != approval.round {
        return Err(PageError(ApiError::new(
            StatusCode::CONFLICT,
            "STALE_FORM",
            format!(
                "this form decides round {round}, but the automation now waits for round {}; nothing was changed",
                approval.round
            ),
        )));
    }
    let reason = form.get("reason").map(str::trim).filter(|r| !r.is_empty()).map(str::to_owned);
    let all = match form.get("choice") {
        Some("each") => None,
        choice => Some(approved(choice).ok_or_else(|| PageError::bad_form("choose approve or reject"))?),
    };
    let open = open_requests(approval, actor, roles);
    let decisions: Vec<Decision> = open
        .iter()
        .filter_map(|r| {
            let approved = all.or_else(|| approved(form.get(&choice_field(r.interruption_id.as_str()))))?;
            Some(Decision { interruption_id: r.interruption_id.clone(), approved, reason: reason.clone() })
        })
        .collect();
    if decisions.is_empty() {
        return Err(PageError::bad_form("choose approve or reject for at least one request; nothing was changed"));
    }
    Ok(DecisionBatch { decisions, actor: actor.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automation::PendingRequest;
    use serde_json::json;

    const APPROVER: &[&str] = &["approver"];

    fn approval(ids: &[&str]) -> PendingApproval {
        PendingApproval {
            automation_id: "run_ab12".into(),
            round: 2,
            requests: ids
                .iter()
                .map(|id| PendingRequest {
                    interruption_id: (*id).into(),
                    function: "orders.refund".into(),
                    request: json!({ "orderId": "<b>", "amount": 1 }),
                    deadline: None,
                })
                .collect(),
            progress: Vec::new(),
            requested_at: std::time::UNIX_EPOCH,
            submitted_by: "sam".into(),
        }
    }

    fn form(fields: &[(&str, &str)]) -> PostedForm {
        PostedForm(fields.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect())
    }

    #[test]
    fn buttons_decide_every_request_of_the_round() {
        let a = approval(&["interrupt-1", "interrupt-2"]);
        let batch =
            parse(&form(&[("round", "2"), ("choice", "reject"), ("reason", "  too much ")]), &a, "ann", APPROVER)
                .unwrap();
        assert_eq!(batch.actor, "ann");
        assert_eq!(batch.decisions.len(), 2);
        assert!(batch.decisions.iter().all(|d| !d.approved && d.reason.as_deref() == Some("too much")));
        let batch =
            parse(&form(&[("round", "2"), ("choice", "approve"), ("reason", " ")]), &a, "ann", APPROVER).unwrap();
        assert!(batch.decisions.iter().all(|d| d.approved && d.reason.is_none()));
    }

    #[test]
    fn choices_decide_the_requests_chosen_and_leave_the_others_open() {
        let a = approval(&["interrupt-1", "interrupt-2"]);
        let none = [("round", "2"), ("choice", "each")];
        assert_eq!(parse(&form(&none), &a, "ann", APPROVER).unwrap_err().code(), "BAD_FORM");
        let each = [("round", "2"), ("choice", "each"), ("decision:interrupt-1", "approve")];
        let one = parse(&form(&each), &a, "ann", APPROVER).unwrap();
        assert_eq!(one.decisions.iter().map(|d| d.interruption_id.as_str()).collect::<Vec<_>>(), ["interrupt-1"]);
        let mut both = each.to_vec();
        both.push(("decision:interrupt-2", "reject"));
        let batch = parse(&form(&both), &a, "ann", APPROVER).unwrap();
        assert_eq!(batch.decisions.iter().map(|d| d.approved).collect::<Vec<_>>(), [true, false]);
    }

    #[test]
    fn a_request_decided_already_is_left_out() {
        let mut a = approval(&["interrupt-1", "interrupt-2"]);
        let progress = |id: &str, by: &[&str]| crate::automation::RequestProgress {
            interruption_id: id.into(),
            quorum: 2,
            approved_by: by.iter().map(|a| (*a).to_owned()).collect(),
            rejected_by: None,
            reason: None,
        };
        a.progress = vec![progress("interrupt-1", &["ann"]), progress("interrupt-2", &["bob"])];
        let batch = parse(&form(&[("round", "2"), ("choice", "approve")]), &a, "ann", APPROVER).unwrap();
        assert_eq!(batch.decisions.iter().map(|d| d.interruption_id.as_str()).collect::<Vec<_>>(), ["interrupt-2"]);
        let html = render(&a, "ann", APPROVER, "tok").into_string();
        assert!(!html.contains("decision:interrupt-1"), "{html}");
        a.progress = vec![progress("interrupt-1", &["ann"]), progress("interrupt-2", &["ann"])];
        let html = render(&a, "ann", APPROVER, "tok").into_string();
        assert!(html.contains("waits for others") && !html.contains("<form"), "nothing left to decide: {html}");
    }

    #[test]
    fn stale_and_malformed_forms_are_refused() {
        let a = approval(&["interrupt-1"]);
        assert_eq!(
            parse(&form(&[("round", "1"), ("choice", "approve")]), &a, "x", APPROVER).unwrap_err().code(),
            "STALE_FORM"
        );
        assert_eq!(parse(&form(&[("choice", "approve")]), &a, "x", APPROVER).unwrap_err().code(), "BAD_FORM");
        assert_eq!(
            parse(&form(&[("round", "2"), ("choice", "maybe")]), &a, "x", APPROVER).unwrap_err().code(),
            "BAD_FORM"
        );
        assert_eq!(parse(&form(&[("round", "2")]), &a, "x", APPROVER).unwrap_err().code(), "BAD_FORM");
    }

    #[test]
    fn the_form_posts_the_round_and_token() {
        let one = render(&approval(&["interrupt-1"]), "ann", APPROVER, "tok").into_string();
        assert!(one.contains("action=\"/automations/run_ab12/decide\""), "{one}");
        assert!(one.contains("name=\"csrf\" value=\"tok\"") && one.contains("name=\"round\" value=\"2\""), "{one}");
        assert!(!one.contains("radio") && one.contains(">Approve</button>"), "{one}");
        let two = render(&approval(&["interrupt-1", "interrupt-2"]), "ann", APPROVER, "tok").into_string();
        assert!(two.contains("name=\"decision:interrupt-2\" value=\"reject\"") && two.contains("Approve all"), "{two}");
    }

    #[test]
    fn requests_the_viewer_may_not_decide_are_left_out_of_approve_all() {
        let mut a = approval(&["interrupt-1", "interrupt-2", "interrupt-3"]);
        a.requests[0].request = json!({ "kind": crate::connector::APPROVAL_KIND, "approvers": ["finance"] });
        a.requests[1].request =
            json!({ "kind": crate::connector::APPROVAL_KIND, "approvers": ["approver"], "fourEyes": true });
        let batch = parse(&form(&[("round", "2"), ("choice", "approve")]), &a, "sam", APPROVER).unwrap();
        let ids: Vec<&str> = batch.decisions.iter().map(|d| d.interruption_id.as_str()).collect();
        assert_eq!(ids, ["interrupt-3"], "not finance's request, not sam's own four-eyes one");
        let html = render(&a, "sam", APPROVER, "tok").into_string();
        assert!(!html.contains("decision:interrupt-1") && !html.contains("Approve all"), "{html}");
        let finance = parse(&form(&[("round", "2"), ("choice", "approve")]), &a, "fay", &["finance"]).unwrap();
        assert_eq!(finance.decisions.iter().map(|d| d.interruption_id.as_str()).collect::<Vec<_>>(), ["interrupt-1"]);
        let nobody = render(&a, "auditor", &["auditor"], "tok").into_string();
        assert!(nobody.contains("left for you") && !nobody.contains("<form"), "{nobody}");
    }
}
