//! The name of one pending request: the interruption it made (`interrupt-<call>`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// An interruption's id, as the script's continuation and the decisions name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InterruptionId(String);

impl InterruptionId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InterruptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for InterruptionId {
    fn from(id: String) -> InterruptionId {
        InterruptionId(id)
    }
}

impl From<&str> for InterruptionId {
    fn from(id: &str) -> InterruptionId {
        InterruptionId(id.to_owned())
    }
}

impl From<InterruptionId> for String {
    fn from(id: InterruptionId) -> String {
        id.0
    }
}

impl PartialEq<str> for InterruptionId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}
