//! When a request nobody decides expires, and when its approvers are reminded of it.
//!
//! A policy is set per function (`expires_after`, `on_expiry`, `remind_after` in its
//! configuration) with a default per tenant. When a round asks, each request's policy is turned
//! into a [`Deadline`] of absolute times, recorded with the round, so the workflow's durable race
//! of the hook against timers decides the same way on every replay, whatever the configuration
//! says later.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The actor of the decisions the system makes itself (on expiry). No API key may name it.
pub const SYSTEM_ACTOR: &str = "system";

/// The reason of a decision made because nobody decided in time.
pub const EXPIRED_REASON: &str = "expired";

/// The error code of an automation failed because a request expired with `on_expiry = "fail"`.
pub const APPROVAL_EXPIRED: &str = "APPROVAL_EXPIRED";

/// What happens to a request nobody decided before it expired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpiry {
    /// The system rejects it: the script sees `{approved: false, reason: "expired"}`.
    #[default]
    Reject,
    /// The automation fails with [`APPROVAL_EXPIRED`].
    Fail,
}

/// A request's expiry and reminders, as configured; a field left out takes the tenant's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpiryPolicy {
    /// How long a request may wait for its decision (for ever when absent).
    pub expires_after: Option<Duration>,
    /// What expiry does (reject unless set).
    pub on_expiry: Option<OnExpiry>,
    /// How often its approvers are reminded while it waits (never when absent).
    pub remind_after: Option<Duration>,
}

impl ExpiryPolicy {
    /// This policy, with what it leaves out taken from `default`.
    pub fn or(self, default: ExpiryPolicy) -> ExpiryPolicy {
        ExpiryPolicy {
            expires_after: self.expires_after.or(default.expires_after),
            on_expiry: self.on_expiry.or(default.on_expiry),
            remind_after: self.remind_after.or(default.remind_after),
        }
    }

    /// The deadline of a request asked at `asked_at_ms` (ms since the epoch), if it has one.
    pub(crate) fn deadline(self, asked_at_ms: i64) -> Option<Deadline> {
        if self.expires_after.is_none() && self.remind_after.is_none() {
            return None;
        }
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Some(Deadline {
            asked_at: asked_at_ms,
            expires_at: self.expires_after.map(|d| asked_at_ms.saturating_add(ms(d))),
            on_expiry: self.on_expiry.unwrap_or_default(),
            remind_every: self.remind_after.map(|d| ms(d).max(MIN_REMIND_EVERY)),
        })
    }
}

/// A request's deadline, recorded when its round asked (times in ms since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deadline {
    /// When its round asked.
    pub asked_at: i64,
    /// When it expires, if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// What its expiry does.
    pub on_expiry: OnExpiry,
    /// How often, in ms, its approvers are reminded while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remind_every: Option<i64>,
}

/// The expiry policies of functions and tenants, shared by every round; clones share one table,
/// and [`replace`](ExpiryPolicies::replace) changes it for rounds that ask from then on.
#[derive(Clone, Debug, Default)]
pub struct ExpiryPolicies {
    table: Arc<RwLock<Arc<PolicyTable>>>,
}

#[derive(Debug, Default)]
struct PolicyTable {
    functions: BTreeMap<String, ExpiryPolicy>,
    tenants: BTreeMap<String, ExpiryPolicy>,
}

impl ExpiryPolicies {
    /// The policies of `functions` (by full name) and the defaults of `tenants`.
    pub fn new(functions: BTreeMap<String, ExpiryPolicy>, tenants: BTreeMap<String, ExpiryPolicy>) -> ExpiryPolicies {
        ExpiryPolicies { table: Arc::new(RwLock::new(Arc::new(PolicyTable { functions, tenants }))) }
    }

    /// Makes `other`'s table this one's (and every clone's) from now on.
    pub fn replace_with(&self, other: &ExpiryPolicies) {
        let table = Arc::clone(&other.table.read().unwrap_or_else(|e| e.into_inner()));
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
    }

    /// The policy of a request of `function` in a script of `tenant`.
    pub fn for_request(&self, tenant: &str, function: &str) -> ExpiryPolicy {
        let table = Arc::clone(&self.table.read().unwrap_or_else(|e| e.into_inner()));
        let own = table.functions.get(function).copied().unwrap_or_default();
        own.or(table.tenants.get(tenant).copied().unwrap_or_default())
    }
}

/// What a waiting round expects next, besides a decision: a reminder or an expiry, at a time in
/// ms since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alarm {
    /// Remind the approvers of what is still undecided.
    Remind(i64),
    /// The undecided requests whose time is up at this moment expire.
    Expire(i64),
}

impl Alarm {
    /// When it rings.
    pub(crate) fn at(self) -> i64 {
        match self {
            Alarm::Remind(at) | Alarm::Expire(at) => at,
        }
    }
}

/// The most reminders one round sends.
pub(crate) const MAX_REMINDERS: u32 = 100;

/// The shortest interval between two reminders, in ms.
const MIN_REMIND_EVERY: i64 = 1_000;

/// Reminders a round has sent: how many, and when the last one went out (ms since the epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reminded {
    pub(crate) count: u32,
    pub(crate) last_at: Option<i64>,
}

/// The next alarm of a round whose `undecided` requests have these deadlines, leaving out expiry
/// while `expiring` (the system's batch is on its way). A reminder is due `remind_every` (the
/// shortest of the undecided requests') after the last one, or after the round asked; only
/// before the first expiry, and at most [`MAX_REMINDERS`].
pub(crate) fn next_alarm(undecided: &[Deadline], reminded: Reminded, expiring: bool) -> Option<Alarm> {
    let expiry = if expiring { None } else { undecided.iter().filter_map(|d| d.expires_at).min() };
    let since = reminded.last_at.or_else(|| undecided.iter().map(|d| d.asked_at).min())?;
    let reminder = undecided
        .iter()
        .filter_map(|d| d.remind_every)
        .min()
        .map(|every| since.saturating_add(every))
        .filter(|at| expiry.is_none_or(|expiry| at < &expiry) && !expiring && reminded.count < MAX_REMINDERS);
    match (reminder, expiry) {
        (Some(at), _) => Some(Alarm::Remind(at)),
        (None, Some(at)) => Some(Alarm::Expire(at)),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_policy_overrides_its_tenant_default_field_by_field() {
        let hour = Duration::from_secs(3600);
        let functions = BTreeMap::from([(
            "billing.refund".to_owned(),
            ExpiryPolicy { expires_after: Some(hour), ..ExpiryPolicy::default() },
        )]);
        let tenants = BTreeMap::from([(
            "acme".to_owned(),
            ExpiryPolicy { expires_after: Some(2 * hour), on_expiry: Some(OnExpiry::Fail), remind_after: Some(hour) },
        )]);
        let policies = ExpiryPolicies::new(functions, tenants);
        let refund = policies.for_request("acme", "billing.refund");
        assert_eq!(refund.expires_after, Some(hour));
        assert_eq!(refund.on_expiry, Some(OnExpiry::Fail));
        assert_eq!(refund.remind_after, Some(hour));
        assert_eq!(policies.for_request("other", "billing.refund").on_expiry, None);
        assert_eq!(policies.for_request("other", "orders.cancel"), ExpiryPolicy::default());
        assert_eq!(policies.for_request("other", "orders.cancel").deadline(5), None);
        let deadline = refund.deadline(1_000).expect("a deadline");
        assert_eq!(deadline.expires_at, Some(1_000 + 3_600_000));
        assert_eq!(deadline.remind_every, Some(3_600_000));
    }

    #[test]
    fn a_replaced_table_is_seen_by_every_clone() {
        let policies = ExpiryPolicies::default();
        let clone = policies.clone();
        let tenants = BTreeMap::from([(
            "acme".to_owned(),
            ExpiryPolicy { remind_after: Some(Duration::from_secs(1)), ..ExpiryPolicy::default() },
        )]);
        policies.replace_with(&ExpiryPolicies::new(BTreeMap::new(), tenants));
        assert_eq!(clone.for_request("acme", "x.y").remind_after, Some(Duration::from_secs(1)));
    }

    #[test]
    fn reminders_come_before_the_expiry_and_stop_while_it_is_decided() {
        let d = |expires_at, remind_every| Deadline {
            asked_at: 1_000,
            expires_at,
            on_expiry: OnExpiry::Reject,
            remind_every,
        };
        let both = [d(Some(3_500), Some(1_000)), d(None, Some(600))];
        let after = |count, last_at| Reminded { count, last_at };
        assert_eq!(next_alarm(&both, after(0, None), false), Some(Alarm::Remind(1_600)));
        // The next reminder counts from the last one, whenever it went out (late, after a restart).
        assert_eq!(next_alarm(&both, after(3, Some(2_800)), false), Some(Alarm::Remind(3_400)));
        assert_eq!(next_alarm(&both, after(4, Some(3_400)), false), Some(Alarm::Expire(3_500)));
        assert_eq!(next_alarm(&both, after(4, Some(3_400)), true), None);
        assert_eq!(next_alarm(&both[1..], after(MAX_REMINDERS, Some(9_000)), false), None);
        assert_eq!(next_alarm(&[d(None, None)], after(0, None), false), None);
        assert_eq!(next_alarm(&[], after(0, None), false), None);
    }
}
