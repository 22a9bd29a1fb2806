//! What a delivery sends: the event as JSON, or as a Slack incoming-webhook message.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Who and what a delivery is about, beside the event itself.
pub(crate) struct Envelope<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) automation: &'a str,
    /// When the event happened (ms since the epoch).
    pub(crate) at: i64,
    /// The automation's page in the inbox, when the server knows its public address.
    pub(crate) link: Option<String>,
}

/// The stable `webhook-id` of event `index` of `automation` for `subscription`: the same on
/// every attempt, so a receiver can drop what it has seen.
pub fn webhook_id(subscription: &str, automation: &str, index: u64) -> String {
    let digest = Sha256::digest(format!("{subscription}\n{automation}\n{index}").as_bytes());
    format!("msg_{}", hex_simd::encode_to_string(&digest[..16], hex_simd::AsciiCase::Lower))
}

/// The JSON body: `type`, `tenant`, `automation`, `at` (RFC 3339) and the event's own data;
/// `approval_requested` and `reminder` name their `requests` (with their summaries) and carry
/// the `inboxUrl`. The script's console is left out.
pub(crate) fn json_body(envelope: &Envelope<'_>, event: &Value) -> Value {
    let mut body = Map::new();
    body.insert("type".into(), event["type"].clone());
    body.insert("tenant".into(), envelope.tenant.into());
    body.insert("automation".into(), envelope.automation.into());
    body.insert("at".into(), rfc3339(envelope.at).into());
    for (key, value) in event.as_object().into_iter().flatten() {
        match key.as_str() {
            "type" | "console" => {}
            "pending" => {
                body.insert("requests".into(), Value::Array(requests(value).collect()));
            }
            _ => {
                body.insert(key.clone(), value.clone());
            }
        }
    }
    if let Some(link) = &envelope.link {
        body.insert("inboxUrl".into(), link.as_str().into());
    }
    Value::Object(body)
}

/// The requests of an event, each with its summary and arguments.
fn requests(pending: &Value) -> impl Iterator<Item = Value> + '_ {
    pending.as_array().into_iter().flatten().map(|r| {
        let request = &r["request"];
        json!({
            "interruptionId": r["interruptionId"],
            "function": r["function"],
            "summary": request.get("summary").cloned().unwrap_or(Value::Null),
            "arguments": request.get("arguments").cloned().unwrap_or_else(|| request.clone()),
            "expiresAt": r["deadline"].get("expiresAt").and_then(Value::as_i64).map(rfc3339),
        })
    })
}

/// A Slack incoming-webhook message: a `text` (what notifications show) and the same as a
/// `mrkdwn` section, with a link to the inbox. Everything a script or a person wrote is escaped,
/// so it cannot make links or mentions (`<!channel>`).
pub(crate) fn slack_body(envelope: &Envelope<'_>, event: &Value) -> Value {
    let automation = escape_slack(envelope.automation);
    let round = event["round"].as_u64().map(|r| format!(" (round {r})")).unwrap_or_default();
    let mut lines = Vec::new();
    let headline = match event["type"].as_str().unwrap_or_default() {
        "approval_requested" => format!("*Approval requested*{round} by automation `{automation}`"),
        "reminder" => format!("*Reminder:* automation `{automation}` still waits for a decision{round}"),
        "expired" => format!("*Expired:* nobody decided in time{round} for automation `{automation}`"),
        "decided" => {
            let actor = escape_slack(event["actor"].as_str().unwrap_or_default());
            format!("*Decided*{round} by {actor} for automation `{automation}`")
        }
        "completed" => format!("*Completed:* automation `{automation}`"),
        "failed" => {
            let code = escape_slack(event["code"].as_str().unwrap_or_default());
            format!("*Failed:* automation `{automation}` ({code})")
        }
        other => format!("{}: automation `{automation}`", escape_slack(other)),
    };
    lines.push(headline);
    for request in requests(&event["pending"]) {
        let function = escape_slack(request["function"].as_str().unwrap_or_default());
        let what = match request["summary"].as_str() {
            Some(summary) => escape_slack(summary),
            None => escape_slack(&request["arguments"].to_string()),
        };
        let amount = request["arguments"]["amount"].as_f64().map(|a| format!(" — amount {a}")).unwrap_or_default();
        lines.push(format!("• {what}{amount} ({function})"));
    }
    for decision in event["decisions"].as_array().into_iter().flatten() {
        let verdict = if decision["approved"] == Value::Bool(true) { "approved" } else { "rejected" };
        let id = escape_slack(decision["interruptionId"].as_str().unwrap_or_default());
        let reason = decision["reason"].as_str().map(|r| format!(": {}", escape_slack(r))).unwrap_or_default();
        lines.push(format!("• {id} {verdict}{reason}"));
    }
    let text = slack_limited(lines.join("\n"));
    let mut blocks = vec![json!({ "type": "section", "text": { "type": "mrkdwn", "text": text } })];
    if let Some(link) = &envelope.link {
        blocks.push(json!({
            "type": "context",
            "elements": [{ "type": "mrkdwn", "text": format!("<{}|Open in the inbox>", escape_slack(link)) }],
        }));
    }
    json!({ "text": text, "blocks": blocks })
}

/// The most characters Slack takes in a section block's text.
const SLACK_SECTION_CHARS: usize = 3000;

/// `text` cut to fit a Slack section, with `…` at the end when it was cut, never inside one of
/// [`escape_slack`]'s entities (a cut `&amp;` would show as text).
fn slack_limited(text: String) -> String {
    if text.chars().count() <= SLACK_SECTION_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(SLACK_SECTION_CHARS - 1).collect();
    if let Some(amp) = cut.rfind('&')
        && !cut[amp..].contains(';')
    {
        cut.truncate(amp);
    }
    cut.push('…');
    cut
}

/// `text` with Slack's control characters escaped (`&`, `<`, `>`), as its formatting rules ask.
pub fn escape_slack(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Milliseconds since the epoch as an RFC 3339 time (the last millisecond of year 9999 for any
/// later time, which RFC 3339 cannot write).
fn rfc3339(ms: i64) -> String {
    const LAST: i64 = 253_402_300_799_999;
    humantime::format_rfc3339_millis(crate::db::from_ms(ms.clamp(0, LAST))).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_slack_text_is_cut_to_fit_a_section_and_never_inside_an_entity() {
        let short = "x".repeat(SLACK_SECTION_CHARS);
        assert_eq!(slack_limited(short.clone()), short, "it fits");
        let long = format!("{}{}", "é".repeat(SLACK_SECTION_CHARS - 3), "&amp;&lt;tail");
        let cut = slack_limited(long);
        assert!(cut.chars().count() <= SLACK_SECTION_CHARS, "{}", cut.chars().count());
        assert!(
            cut.ends_with("&amp;…") || cut.ends_with("é…"),
            "cut after a whole entity: {:?}",
            &cut[cut.len() - 12..]
        );
        let body = slack_body(&envelope(), &requested(&"<".repeat(4000)));
        let text = body["blocks"][0]["text"]["text"].as_str().unwrap();
        assert!(text.chars().count() <= SLACK_SECTION_CHARS && text.ends_with('…'), "{}", text.chars().count());
        assert!(!text.trim_end_matches('…').ends_with('&') && !text.contains("&l…"), "no half entity");
    }

    fn envelope() -> Envelope<'static> {
        Envelope {
            tenant: "acme",
            automation: "run_1",
            at: 1_700_000_000_000,
            link: Some("https://inbox.example/automations/run_1".into()),
        }
    }

    fn requested(summary: &str) -> Value {
        json!({
            "type": "approval_requested",
            "round": 1,
            "console": [{ "level": "log", "text": "secret-ish" }],
            "pending": [{
                "interruptionId": "interrupt-1",
                "function": "billing.refund",
                "request": { "kind": "connector-approval", "summary": summary, "arguments": { "amount": 1500 } },
                "deadline": { "askedAt": 1, "expiresAt": 1_700_000_360_000_i64, "onExpiry": "reject" },
            }],
        })
    }

    #[test]
    fn the_json_body_names_the_requests_and_the_inbox() {
        let body = json_body(&envelope(), &requested("Refund 1500"));
        assert_eq!(body["type"], "approval_requested");
        assert_eq!(body["tenant"], "acme");
        assert_eq!(body["automation"], "run_1");
        assert_eq!(body["at"], "2023-11-14T22:13:20.000Z");
        assert_eq!(body["round"], 1);
        assert_eq!(body["requests"][0]["summary"], "Refund 1500");
        assert_eq!(body["requests"][0]["arguments"]["amount"], 1500);
        assert_eq!(body["requests"][0]["expiresAt"], "2023-11-14T22:19:20.000Z");
        assert_eq!(body["inboxUrl"], "https://inbox.example/automations/run_1");
        assert!(body.get("console").is_none() && body.get("pending").is_none());
    }

    #[test]
    fn slack_text_cannot_forge_links_or_mentions() {
        let body = slack_body(&envelope(), &requested("<!channel> <https://evil.example|click> & co"));
        let text = body["text"].as_str().unwrap();
        assert!(!text.contains("<!channel>") && !text.contains("<https://evil"), "{text}");
        assert!(text.contains("&lt;!channel&gt; &lt;https://evil.example|click&gt; &amp; co"), "{text}");
        assert!(text.contains("amount 1500"), "{text}");
        assert_eq!(body["blocks"][0]["type"], "section");
        assert_eq!(body["blocks"][0]["text"]["type"], "mrkdwn");
        assert_eq!(
            body["blocks"][1]["elements"][0]["text"],
            "<https://inbox.example/automations/run_1|Open in the inbox>"
        );
    }

    #[test]
    fn webhook_ids_are_stable_and_distinct() {
        assert_eq!(webhook_id("ops", "run_1", 0), webhook_id("ops", "run_1", 0));
        assert_ne!(webhook_id("ops", "run_1", 0), webhook_id("ops", "run_1", 1));
        assert_ne!(webhook_id("ops", "run_1", 0), webhook_id("dev", "run_1", 0));
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
    }
}
