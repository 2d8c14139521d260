//! Liveness: the leader probes every member on an interval and publishes who is reachable.
//! A member is unreachable after `misses` consecutive failed probes and reachable again on the
//! first success; followers publish nothing (reachability is the leader's view).

pub mod actor;
pub mod core;

pub use self::actor::{LivenessActor, ProbeTarget, Prober};
pub use self::core::{Effect, Event, LivenessCore};

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// The published view: member id → reachable. Shared between the liveness shell (writer) and
/// status/metrics (readers).
#[derive(Debug, Clone, Default)]
pub struct Reachability {
    inner: Arc<RwLock<BTreeMap<u64, bool>>>,
}

impl Reachability {
    pub fn snapshot(&self) -> BTreeMap<u64, bool> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn publish(&self, view: BTreeMap<u64, bool>) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = view;
    }
}
