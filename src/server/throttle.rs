//! Failed authentications by client address: an address that presented [`MAX_FAILURES`] unknown
//! keys within [`WINDOW`] is refused until that window has passed, so API keys cannot be guessed at
//! speed. Bounded: at most [`MAX_ADDRESSES`] addresses are remembered.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::convert::Infallible;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

/// Unknown keys an address may present within [`WINDOW`].
pub const MAX_FAILURES: u32 = 20;
/// How long failures count.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The most addresses remembered at once.
pub const MAX_ADDRESSES: usize = 10_000;

/// Failures of one address since the start of its window.
#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    since: Instant,
}

/// The failed authentications of the server's clients.
#[derive(Clone, Debug, Default)]
pub struct AuthThrottle {
    failures: Arc<Mutex<HashMap<IpAddr, Failures>>>,
}

impl AuthThrottle {
    /// Whether `client` may try a key now; `Err(wait)` while it is refused. A client of unknown
    /// address (a server not told its peers' addresses) is never refused.
    pub fn check(&self, client: Option<IpAddr>) -> Result<(), Duration> {
        self.check_at(client, Instant::now())
    }

    /// Counts an unknown key presented by `client`.
    pub fn failed(&self, client: Option<IpAddr>) {
        self.failed_at(client, Instant::now());
    }

    fn check_at(&self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let Some(ip) = client else { return Ok(()) };
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        match failures.get(&ip) {
            Some(f) if f.count >= MAX_FAILURES && now.duration_since(f.since) < WINDOW => {
                Err(WINDOW - now.duration_since(f.since))
            }
            _ => Ok(()),
        }
    }

    fn failed_at(&self, client: Option<IpAddr>, now: Instant) {
        let Some(ip) = client else { return };
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= MAX_ADDRESSES && !failures.contains_key(&ip) {
            failures.retain(|_, f| now.duration_since(f.since) < WINDOW);
            if failures.len() >= MAX_ADDRESSES {
                // Still full of live windows: forget the oldest one.
                let oldest = failures.iter().min_by_key(|(_, f)| f.since).map(|(ip, _)| *ip);
                if let Some(oldest) = oldest {
                    failures.remove(&oldest);
                }
            }
        }
        let entry = failures.entry(ip).or_insert(Failures { count: 0, since: now });
        if now.duration_since(entry.since) >= WINDOW {
            *entry = Failures { count: 0, since: now };
        }
        entry.count = entry.count.saturating_add(1);
    }
}

/// The client's address, when the server was started with peer addresses.
pub fn client_ip(parts: &Parts) -> Option<IpAddr> {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip())
}

/// The client's address as an extractor (`None` without peer addresses); never rejects.
#[derive(Clone, Copy, Debug)]
pub struct ClientIp(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<ClientIp, Infallible> {
        Ok(ClientIp(client_ip(parts)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_with_too_many_failures_waits_out_its_window() {
        let throttle = AuthThrottle::default();
        let (ip, other): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let start = Instant::now();
        for _ in 0..MAX_FAILURES - 1 {
            throttle.failed_at(Some(ip), start);
        }
        assert!(throttle.check_at(Some(ip), start).is_ok());
        throttle.failed_at(Some(ip), start);
        let wait = throttle.check_at(Some(ip), start + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, WINDOW - Duration::from_secs(10));
        assert!(throttle.check_at(Some(other), start).is_ok(), "other addresses are not affected");
        assert!(throttle.check_at(None, start).is_ok(), "an unknown address is never refused");
        assert!(throttle.check_at(Some(ip), start + WINDOW).is_ok(), "the window passes");
        throttle.failed_at(Some(ip), start + WINDOW);
        assert!(throttle.check_at(Some(ip), start + WINDOW).is_ok(), "a new window starts from one failure");
    }

    #[test]
    fn it_remembers_a_bounded_number_of_addresses() {
        let throttle = AuthThrottle::default();
        let start = Instant::now();
        for i in 0..(MAX_ADDRESSES as u32 + 50) {
            throttle.failed_at(Some(IpAddr::from(i.to_be_bytes())), start + Duration::from_micros(u64::from(i)));
        }
        assert_eq!(throttle.failures.lock().unwrap().len(), MAX_ADDRESSES);
    }
}
