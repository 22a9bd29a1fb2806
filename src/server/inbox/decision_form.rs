//! The form that decides one round of an automation, and how its post becomes a
//! [`DecisionBatch`].
//!
//! One form per round, because a batch must decide every pending request of the round exactly
//! once. It has one optional reason (given to every decision) and the buttons *Approve* and
//! *Reject* (for all requests of the round); a round with several requests also has an approve or
//! reject choice per request and a button that submits those choices. A hidden `round` field
//! makes a stale form (for a round that was decided meanwhile) fail instead of deciding a newer one.

use axum::http::StatusCode;

use super::csrf;
use super::error::PageError;
use super::form::PostedForm;
use super::html::{Html, html};
use crate::automation::{Decision, DecisionBatch, MAX_REASON_CHARS, PendingApproval};
use crate::server::error::ApiError;

/// The name of the per-request choice field of `interruption_id`.
fn choice_field(interruption_id: &str) -> String {
    format!("decision:{interruption_id}")
}

/// The decision form of `approval`, with the session's CSRF token.
pub fn render(approval: &PendingApproval, csrf: &str) -> Html {
    let id = approval.automation_id.as_str();
    let several = approval.requests.len() > 1;
    let mut out = Html::new();
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
        for request in &approval.requests {
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

/// The batch that a post of the form of `approval` stands for, decided by `actor`.
pub fn parse(form: &PostedForm, approval: &PendingApproval, actor: &str) -> Result<DecisionBatch, PageError> {
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
    let decisions = approval
        .requests
        .iter()
        .map(|r| {
            let approved =
                all.or_else(|| approved(form.get(&choice_field(r.interruption_id.as_str())))).ok_or_else(|| {
                    PageError::bad_form(format!(
                        "choose approve or reject for {}; nothing was changed",
                        r.interruption_id
                    ))
                })?;
            Ok(Decision { interruption_id: r.interruption_id.clone(), approved, reason: reason.clone() })
        })
        .collect::<Result<Vec<_>, PageError>>()?;
    Ok(DecisionBatch { decisions, actor: actor.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automation::PendingRequest;
    use serde_json::json;

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
                })
                .collect(),
            progress: Vec::new(),
            requested_at: std::time::UNIX_EPOCH,
        }
    }

    fn form(fields: &[(&str, &str)]) -> PostedForm {
        PostedForm(fields.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect())
    }

    #[test]
    fn buttons_decide_every_request_of_the_round() {
        let a = approval(&["interrupt-1", "interrupt-2"]);
        let batch =
            parse(&form(&[("round", "2"), ("choice", "reject"), ("reason", "  too much ")]), &a, "ann").unwrap();
        assert_eq!(batch.actor, "ann");
        assert_eq!(batch.decisions.len(), 2);
        assert!(batch.decisions.iter().all(|d| !d.approved && d.reason.as_deref() == Some("too much")));
        let batch = parse(&form(&[("round", "2"), ("choice", "approve"), ("reason", " ")]), &a, "ann").unwrap();
        assert!(batch.decisions.iter().all(|d| d.approved && d.reason.is_none()));
    }

    #[test]
    fn choices_per_request_must_all_be_made() {
        let a = approval(&["interrupt-1", "interrupt-2"]);
        let each = [("round", "2"), ("choice", "each"), ("decision:interrupt-1", "approve")];
        assert_eq!(parse(&form(&each), &a, "ann").unwrap_err().code(), "BAD_FORM");
        let mut both = each.to_vec();
        both.push(("decision:interrupt-2", "reject"));
        let batch = parse(&form(&both), &a, "ann").unwrap();
        assert_eq!(batch.decisions.iter().map(|d| d.approved).collect::<Vec<_>>(), [true, false]);
    }

    #[test]
    fn stale_and_malformed_forms_are_refused() {
        let a = approval(&["interrupt-1"]);
        assert_eq!(parse(&form(&[("round", "1"), ("choice", "approve")]), &a, "x").unwrap_err().code(), "STALE_FORM");
        assert_eq!(parse(&form(&[("choice", "approve")]), &a, "x").unwrap_err().code(), "BAD_FORM");
        assert_eq!(parse(&form(&[("round", "2"), ("choice", "maybe")]), &a, "x").unwrap_err().code(), "BAD_FORM");
        assert_eq!(parse(&form(&[("round", "2")]), &a, "x").unwrap_err().code(), "BAD_FORM");
    }

    #[test]
    fn the_form_posts_the_round_and_token() {
        let one = render(&approval(&["interrupt-1"]), "tok").into_string();
        assert!(one.contains("action=\"/automations/run_ab12/decide\""), "{one}");
        assert!(one.contains("name=\"csrf\" value=\"tok\"") && one.contains("name=\"round\" value=\"2\""), "{one}");
        assert!(!one.contains("radio") && one.contains(">Approve</button>"), "{one}");
        let two = render(&approval(&["interrupt-1", "interrupt-2"]), "tok").into_string();
        assert!(two.contains("name=\"decision:interrupt-2\" value=\"reject\"") && two.contains("Approve all"), "{two}");
    }
}
