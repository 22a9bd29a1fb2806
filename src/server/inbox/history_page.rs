//! The history page: the tenant's automations, newest first, with their status, submitter and
//! result, a page at a time.

use super::format;
use super::html::{Html, html};
use super::layout::{self, Viewer};
use super::request::json_text;
use crate::automation::{AutomationSummary, Page};

/// The longest result or error a row shows; the automation's page has all of it.
const SHORT: usize = 120;

fn short(text: String) -> String {
    if text.chars().count() <= SHORT {
        return text;
    }
    let cut: String = text.chars().take(SHORT).collect();
    format!("{cut}…")
}

/// The history page of `viewer`: one page of automations, and the link to older ones.
pub fn render(viewer: Viewer<'_>, page: &Page<AutomationSummary>, next: Option<String>) -> Html {
    let mut main = Html::new();
    html!(main, "<h1>History</h1>\n");
    if page.items.is_empty() {
        html!(main, "<p class=\"empty\">No automations yet.</p>\n");
    } else {
        html!(
            main,
            "<table class=\"history\" id=\"history\">\n<thead><tr><th>Automation</th><th>Status</th>\
             <th>Submitted by</th><th>Submitted at</th><th>Result</th></tr></thead>\n<tbody>\n"
        );
        for a in &page.items {
            let result = match (&a.result, &a.error) {
                (Some(result), _) => short(json_text(result).replace('\n', " ")),
                (None, Some(error)) => {
                    let code = error["code"].as_str().unwrap_or_default();
                    short(format!("{code} {}", error["message"].as_str().unwrap_or_default()))
                }
                (None, None) => String::new(),
            };
            html!(
                main,
                "<tr><td><a href=\"/automations/{}\"><code>{}</code></a></td>\
                 <td><span class=\"status\" data-status=\"{}\">{}</span></td><td>{}</td><td><time>{}</time></td>\
                 <td class=\"result\">{}</td></tr>\n",
                a.id.as_str(),
                a.id.as_str(),
                a.status.as_str(),
                a.status.as_str(),
                a.submitted_by,
                format::utc(a.created_at),
                result
            );
        }
        html!(main, "</tbody>\n</table>\n");
    }
    if let Some(next) = next {
        html!(main, "<p><a rel=\"next\" href=\"/history?cursor={}\">Older automations →</a></p>\n", next);
    }
    layout::page("History", Some(viewer), main)
}
