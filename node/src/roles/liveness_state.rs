//! One node's state in host liveness, held by the `Node` and shared with the loops in
//! `liveness`: the agents this member judges (their watch polls) and, on the leader, the
//! members' reports waiting for the judging loop.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::mpsc;
use yard_control::host_liveness::{LivenessConfig, Report, WatcherCore};
use yard_raft_store::NodeId;

use crate::rpc::Watched;

/// One node's part in host liveness: what it judges as a member, the reports that reached it
/// as leader.
pub struct HostLiveness {
    pub(crate) cfg: LivenessConfig,
    epoch: Instant,
    watchers: Mutex<Watchers>,
    reports_tx: mpsc::UnboundedSender<MemberReports>,
    /// Taken once by the leader's loop (`judge`).
    pub(crate) reports_rx: Mutex<Option<mpsc::UnboundedReceiver<MemberReports>>>,
}

/// Reports from one member, in its order.
pub(crate) type MemberReports = (NodeId, Vec<Report>);

impl std::fmt::Debug for HostLiveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLiveness")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// The agents this member serves: the judging core, and each one's watch position (its lag).
pub(crate) struct Watchers {
    pub(crate) core: WatcherCore,
    pub(crate) from: BTreeMap<NodeId, u64>,
}

impl HostLiveness {
    pub fn new(cfg: LivenessConfig) -> Self {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        Self {
            watchers: Mutex::new(Watchers {
                core: WatcherCore::new(cfg.clone()),
                from: BTreeMap::new(),
            }),
            cfg,
            epoch: Instant::now(),
            reports_tx,
            reports_rx: Mutex::new(Some(reports_rx)),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(crate) fn watchers(&self) -> std::sync::MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a watch poll from `host` asking from log index `from`.
    pub fn polled(&self, host: NodeId, from: u64) {
        let now = self.now_ms();
        let mut w = self.watchers();
        w.core.polled(host, now);
        w.from.insert(host, from);
    }

    /// The agents this member serves.
    pub fn watched(&self) -> Vec<Watched> {
        let now = self.now_ms();
        let w = self.watchers();
        w.core
            .hosts()
            .map(|(host, last)| Watched {
                host,
                from: w.from.get(&host).copied().unwrap_or(0),
                ago_ms: now.saturating_sub(last),
            })
            .collect()
    }

    /// Takes reports a member sent this node (the leader).
    pub fn accept(&self, replica: NodeId, reports: Vec<Report>) {
        let _ = self.reports_tx.send((replica, reports));
    }
}
