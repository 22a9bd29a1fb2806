//! One request a script made for approval, as approvers read it: the host function, the order and
//! amount when the request names them (refunds do), and the whole request as JSON. Everything in
//! a request is script-controlled and escaped.

use serde_json::Value;

use super::format;
use super::html::{Html, html};
use crate::automation::PendingRequest;

/// A JSON value as indented text.
pub fn json_text(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// The request as a list of its facts.
pub fn render(request: &PendingRequest) -> Html {
    let mut out = Html::new();
    html!(out, "<dl class=\"request\"><dt>Function</dt><dd><code>{}</code></dd>", request.function);
    // A connector's request says what it is in its function's summary.
    if let Value::String(summary) = &request.request["summary"] {
        html!(out, "<dt>Summary</dt><dd class=\"summary\">{}</dd>", summary);
    }
    match &request.request["orderId"] {
        Value::Null => {}
        Value::String(order) => html!(out, "<dt>Order</dt><dd class=\"order\">{}</dd>", order),
        other => html!(out, "<dt>Order</dt><dd class=\"order\">{}</dd>", other.to_string()),
    }
    match &request.request["amount"] {
        Value::Null => {}
        Value::Number(n) if n.as_i64().is_some() => {
            let cents = n.as_i64().unwrap_or_default();
            html!(
                out,
                "<dt>Amount</dt><dd class=\"amount\">{} <span class=\"muted\">({} cents)</span></dd>",
                format::cents(cents),
                cents
            );
        }
        other => html!(out, "<dt>Amount</dt><dd class=\"amount\">{}</dd>", other.to_string()),
    }
    html!(
        out,
        "<dt>Request</dt><dd><details><summary><code>{}</code></summary><pre>{}</pre></details></dd></dl>\n",
        request.interruption_id,
        json_text(&request.request)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_connectors_summary_is_shown_escaped() {
        let request = PendingRequest {
            interruption_id: "interrupt-1".into(),
            function: "billing.refund".into(),
            request: json!({ "kind": "connector-approval", "summary": "Refund 1500 on <b>A-1</b>" }),
            deadline: None,
        };
        let html = render(&request).into_string();
        assert!(html.contains("<dd class=\"summary\">Refund 1500 on &lt;b&gt;A-1&lt;/b&gt;</dd>"), "{html}");
    }

    #[test]
    fn refunds_show_order_and_amount_escaped() {
        let request = PendingRequest {
            interruption_id: "interrupt-2".into(),
            function: "orders.refund".into(),
            request: json!({ "kind": "refund-approval", "orderId": "<img src=x onerror=alert(1)>", "amount": 1500 }),
            deadline: None,
        };
        let html = render(&request).into_string();
        assert!(html.contains("<dd class=\"amount\">15.00 <span class=\"muted\">(1500 cents)</span></dd>"), "{html}");
        assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"), "{html}");
        assert!(!html.contains("<img"), "{html}");
    }
}
