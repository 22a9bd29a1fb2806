//! Webhooks: automation events delivered to the URLs a tenant subscribed, signed with the
//! Standard Webhooks scheme, at least once and in order per (subscription, automation).
//!
//! An automation learns its tenant's subscriptions when it is submitted (they are part of its
//! input, so every replay makes the same choices). The first event a subscription wants starts
//! a *delivery run* for that (subscription, automation): a child workflow that owns a hook, takes
//! the event from its input and each later one from its hook, and sends each in turn as a step
//! retried with exponential backoff for a day. A receiver that keeps failing so holds up only its
//! own deliveries, and a restart resumes them where they were. Every attempt is recorded for
//! `GET /v1/webhooks/deliveries`.

mod attempts;
mod body;
mod delivery;
mod publisher;
mod subscriptions;

pub use attempts::{DeliveryAttempt, DeliveryLog};
pub use body::{escape_slack, webhook_id};
pub(crate) use delivery::{DeliveryDeps, WORKFLOW, run_delivery};
pub(crate) use publisher::Publisher;
pub use subscriptions::{Subscribed, Webhooks};
