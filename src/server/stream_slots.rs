//! How many live event streams (NDJSON responses that stay open) the server holds, in all and
//! per API key: one key cannot open a thousand streams and hold the server's connections and the
//! database's attention. A stream takes its slot before it starts and gives it back when it ends,
//! however it ends (the client leaves, the run ends, the server shuts down).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::error::ApiError;

/// The caps on live event streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Streams open at once on this server.
    pub total: usize,
    /// Streams open at once with one API key.
    pub per_key: usize,
}

impl Default for StreamLimits {
    fn default() -> StreamLimits {
        // Half the default connection cap: streams leave room for every other request.
        StreamLimits { total: 500, per_key: 20 }
    }
}

/// The streams open now, shared by the handlers.
#[derive(Clone, Debug, Default)]
pub struct StreamSlots {
    limits: StreamLimits,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_key: HashMap<String, usize>,
}

impl StreamSlots {
    /// No stream open yet, within `limits`.
    pub fn new(limits: StreamLimits) -> StreamSlots {
        StreamSlots { limits, open: Arc::default() }
    }

    /// A slot for a stream of the key `key_id`; 429 `TOO_MANY_STREAMS` when that key, or the
    /// server, holds as many as it may.
    pub fn take(&self, key_id: &str) -> Result<StreamSlot, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let of_key = open.by_key.get(key_id).copied().unwrap_or(0);
        let refuse = |message: String| Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_STREAMS", message));
        if of_key >= self.limits.per_key {
            return refuse(format!(
                "this API key has {of_key} event streams open, the most it may: close one, or follow \
                 GET /v1/events, which carries every automation's and session's events"
            ));
        }
        if open.total >= self.limits.total {
            return refuse("the server holds as many event streams as it may: retry later".to_owned());
        }
        open.total += 1;
        *open.by_key.entry(key_id.to_owned()).or_default() += 1;
        Ok(StreamSlot { slots: self.clone(), key_id: key_id.to_owned() })
    }

    /// How many streams are open (for tests and metrics).
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

/// A stream's slot, given back when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    slots: StreamSlots,
    key_id: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_key.get_mut(&self.key_id) {
            *n -= 1;
            if *n == 0 {
                open.by_key.remove(&self.key_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_per_key_and_in_all_and_come_back_when_dropped() {
        let slots = StreamSlots::new(StreamLimits { total: 3, per_key: 2 });
        let (a1, a2) = (slots.take("a").unwrap(), slots.take("a").unwrap());
        let refused = slots.take("a").unwrap_err();
        assert_eq!((refused.status, refused.code), (StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_STREAMS"));
        let b1 = slots.take("b").unwrap();
        assert!(slots.take("c").is_err(), "the server's cap");
        drop(a1);
        assert_eq!(slots.open(), 2);
        let _a3 = slots.take("a").unwrap();
        drop((a2, b1));
        assert_eq!(slots.open(), 1);
    }
}
