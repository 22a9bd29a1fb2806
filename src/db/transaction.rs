//! Transactions of guarded steps, written once for both backends.

use super::Param;

/// What a [`Step`] of a [`AppDb::transaction`] decides from the number of rows its statement
/// affected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// Go on, whatever the count.
    Continue,
    /// Unless exactly this many rows were affected, stop here: commit the steps so far (this one
    /// included) and skip the rest.
    StopUnless(u64),
    /// Unless exactly this many rows were affected, roll the whole transaction back and end it
    /// with [`TxOutcome::Refused`] carrying the message.
    RefuseUnless(u64, String),
}

/// One statement of a [`AppDb::transaction`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The SQL (`$1`-style parameters).
    pub(super) sql: &'static str,
    /// The parameters.
    pub(super) params: Vec<Param>,
    /// What the affected-row count decides.
    pub(super) guard: Guard,
}

impl Step {
    /// A step that runs `sql` with `params` and goes on whatever it affected.
    pub fn new(sql: &'static str, params: Vec<Param>) -> Step {
        Step { sql, params, guard: Guard::Continue }
    }

    /// The step with `guard` deciding what follows it.
    pub fn guard(mut self, guard: Guard) -> Step {
        self.guard = guard;
        self
    }

    /// What follows the step, given the rows its statement affected; `None` to go on.
    pub(super) fn decide(&self, affected: u64) -> Option<TxOutcome> {
        match &self.guard {
            Guard::StopUnless(n) if affected != *n => Some(TxOutcome::Committed),
            Guard::RefuseUnless(n, message) if affected != *n => Some(TxOutcome::Refused(message.clone())),
            _ => None,
        }
    }
}

/// How a [`AppDb::transaction`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    /// Committed: every step ran, or a [`Guard::StopUnless`] stopped it.
    Committed,
    /// Rolled back by a [`Guard::RefuseUnless`], with its message.
    Refused(String),
}
