//! The configured subscriptions, shared by every delivery and replaced as a whole on reload.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::WebhookSpec;

/// What an automation records of a subscription when it is submitted: which events it wants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribed {
    /// The subscription's name.
    pub name: String,
    /// The `type`s of the events it receives.
    pub events: Vec<String>,
}

/// The webhook subscriptions and the HTTP client that delivers to them. Clones share one set:
/// [`replace_with`](Webhooks::replace_with) changes it for every clone.
#[derive(Clone, Debug)]
pub struct Webhooks {
    set: Arc<RwLock<Arc<SubscriptionSet>>>,
    client: reqwest::Client,
}

#[derive(Debug, Default)]
struct SubscriptionSet {
    subscriptions: Vec<WebhookSpec>,
    public_url: Option<reqwest::Url>,
}

impl Webhooks {
    /// The subscriptions `specs`, whose links point at `public_url` (the address people reach
    /// the inbox at; deliveries carry no link without it).
    pub fn new(specs: Vec<WebhookSpec>, public_url: Option<reqwest::Url>) -> Result<Webhooks, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .user_agent(concat!("resumable/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let set = SubscriptionSet { subscriptions: specs, public_url };
        Ok(Webhooks { set: Arc::new(RwLock::new(Arc::new(set))), client })
    }

    /// No subscriptions.
    pub fn none() -> Result<Webhooks, reqwest::Error> {
        Webhooks::new(Vec::new(), None)
    }

    /// Makes `other`'s subscriptions this set's (and every clone's) from now on. Deliveries in
    /// flight follow their subscription by name: to its new URL and secret, or nowhere once it is
    /// gone.
    pub fn replace_with(&self, other: &Webhooks) {
        let set = other.snapshot();
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = set;
    }

    fn snapshot(&self) -> Arc<SubscriptionSet> {
        Arc::clone(&self.set.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The subscriptions of `tenant`, as an automation records them.
    pub fn subscribed(&self, tenant: &str) -> Vec<Subscribed> {
        self.snapshot()
            .subscriptions
            .iter()
            .filter(|s| s.config.tenant == tenant)
            .map(|s| Subscribed {
                name: s.name.clone(),
                events: s.config.events.iter().map(|e| e.as_str().to_owned()).collect(),
            })
            .collect()
    }

    /// The subscription named `name` of `tenant`, if it is still configured, and the public URL.
    pub(crate) fn get(&self, tenant: &str, name: &str) -> Option<(WebhookSpec, Option<reqwest::Url>)> {
        let set = self.snapshot();
        let spec = set.subscriptions.iter().find(|s| s.name == name && s.config.tenant == tenant)?;
        Some((spec.clone(), set.public_url.clone()))
    }

    /// The client deliveries are sent with.
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }
}
