//! The expiry and reminder settings of a function or a tenant (`expires_after`, `on_expiry`,
//! `remind_after`), and the `[tenants.NAME]` table that holds a tenant's defaults and quotas.

use serde::Deserialize;

use super::values::Seconds;
use crate::automation::{ExpiryPolicy, OnExpiry, TenantQuota};

/// `[tenants.NAME]`: what a tenant's requests do when a function says nothing.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// How long a request waits for its decision before it expires (for ever unless set).
    pub expires_after: Option<Seconds>,
    /// What an expired request does: `"reject"` (the default) or `"fail"`.
    pub on_expiry: Option<OnExpiry>,
    /// How often the approvers are reminded while a request waits (never unless set).
    pub remind_after: Option<Seconds>,
    /// Automations not ended yet (queued, running or waiting) the tenant may have at once.
    pub max_automations: Option<usize>,
    /// Live sessions the tenant may have at once.
    pub max_sessions: Option<usize>,
}

impl TenantConfig {
    /// The settings as a policy.
    pub fn policy(&self) -> ExpiryPolicy {
        policy(self.expires_after, self.on_expiry, self.remind_after)
    }

    /// The tenant's quotas.
    pub fn quota(&self) -> TenantQuota {
        TenantQuota { max_automations: self.max_automations, max_sessions: self.max_sessions }
    }
}

/// The policy of the three settings, wherever they are given.
pub(super) fn policy(
    expires_after: Option<Seconds>,
    on_expiry: Option<OnExpiry>,
    remind_after: Option<Seconds>,
) -> ExpiryPolicy {
    ExpiryPolicy { expires_after: expires_after.map(|s| s.0), on_expiry, remind_after: remind_after.map(|s| s.0) }
}
