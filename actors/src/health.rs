//! The health registry: every actor reports here, `yard status` and the metrics read it.
//! A plain shared map rather than an actor, so a wedged actor system cannot hide behind it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One actor's last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorHealth {
    pub healthy: bool,
    pub detail: String,
    pub updated: Instant,
}

/// Shared, cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct HealthRegistry {
    inner: Arc<Mutex<BTreeMap<String, ActorHealth>>>,
}

impl HealthRegistry {
    pub fn report(&self, actor: &str, healthy: bool, detail: impl Into<String>) {
        let entry = ActorHealth {
            healthy,
            detail: detail.into(),
            updated: Instant::now(),
        };
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(actor.to_owned(), entry);
    }

    pub fn snapshot(&self) -> BTreeMap<String, ActorHealth> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
