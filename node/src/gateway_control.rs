//! The leader's half of the gateway: it grants VIP leases to gateway nodes and places VIPs.
//!
//! Every node runs [`GatewayControl::run`], which does nothing unless the node leads. As
//! leader it confirms its leadership with a quorum round every renewal period (grants are only
//! made inside a confirmed window, see `yard_actors::gateway::lease`), classifies gateway nodes
//! as live or certainly fenced from their lease records, and proposes the placement core's
//! decisions as one Raft command. Decisions and arithmetic live in the pure cores; this is the
//! clock, the loop and the I/O.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::ServerState;
use yard_actors::gateway::lease::{LeaseConfig, LeaseTable};
use yard_actors::gateway::placement::{plan, PlacementInput};
use yard_raft_store::gateway::GatewayCommand;
use yard_raft_store::{Command, NodeId, Raft};

use crate::metrics::METRICS;

/// The leader-side lease and placement state of this node (empty unless it leads).
pub struct GatewayControl {
    cfg: LeaseConfig,
    interval: Duration,
    epoch: Instant,
    state: Mutex<ControlState>,
}

#[derive(Default)]
struct ControlState {
    /// The lease table of the current term, while this node leads.
    table: Option<(u64, LeaseTable)>,
    /// Nodes already reported as lapsed (log once per lapse).
    lapsed: BTreeSet<NodeId>,
}

impl GatewayControl {
    pub fn new(cfg: LeaseConfig, interval: Duration) -> Self {
        Self {
            cfg,
            interval,
            epoch: Instant::now(),
            state: Mutex::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ControlState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renewal from `node`: the granted milliseconds, or why none was granted.
    pub fn renew(&self, node: NodeId, applied: u64) -> Result<u64, String> {
        let now = self.now_ms();
        let mut st = self.state();
        let Some((_, table)) = st.table.as_mut() else {
            return Err("this node is not the leader".into());
        };
        match table.renew(node, applied, now) {
            Some(granted) => {
                METRICS.gateway_renewals.inc();
                Ok(granted)
            }
            None => Err("leadership is not confirmed; try again".into()),
        }
    }

    /// The leader loop; returns when the task is aborted.
    pub async fn run(&self, raft: Raft, feed: yard_raft_store::ChangeFeed) {
        let mut sleep_for = self.interval;
        loop {
            tokio::time::sleep(sleep_for).await;
            sleep_for = self.interval;
            let m = raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                let mut st = self.state();
                st.table = None;
                st.lapsed.clear();
                continue;
            }
            {
                let mut st = self.state();
                if st
                    .table
                    .as_ref()
                    .is_none_or(|(term, _)| *term != m.current_term)
                {
                    tracing::info!(
                        term = m.current_term,
                        wait_ms = self.cfg.lease_ms + self.cfg.margin_ms,
                        "gateway leases: leading; predecessors' grants run out first"
                    );
                    st.table = Some((m.current_term, LeaseTable::new(self.cfg, self.now_ms())));
                    st.lapsed.clear();
                }
            }
            let started = self.now_ms();
            // A quorum heartbeat round only (`get_read_log_id`), not `ensure_linearizable`:
            // leadership is what a grant needs, and waiting for the state machine to apply the
            // read index would let a slow apply (a snapshot being built) fence every node.
            let confirmed = matches!(
                tokio::time::timeout(self.interval * 4, raft.get_read_log_id()).await,
                Ok(Ok(_))
            );
            let (vips, draining) =
                feed.read(|d| (d.gateway.vips.clone(), d.gateway.draining.clone()));
            let now = self.now_ms();
            let changes = {
                let mut st = self.state();
                let ControlState { table, lapsed } = &mut *st;
                let Some((_, table)) = table.as_mut() else {
                    continue;
                };
                if confirmed {
                    table.confirm_leadership(started);
                }
                let mut known: BTreeSet<NodeId> = vips
                    .values()
                    .flat_map(|r| r.owner.into_iter().chain(r.handoff_to))
                    .collect();
                known.extend(table.applied().keys().copied());
                let live = table.live(now);
                let expired = table.expired(&known, now);
                for node in expired.difference(lapsed) {
                    let owned = vips.values().filter(|r| r.owner == Some(*node)).count();
                    if owned > 0 {
                        tracing::info!(node, owned, "gateway lease lapsed");
                    }
                }
                lapsed.clone_from(&expired);
                if let Some(next) = table.next_expiry(now) {
                    // (`next_expiry` already includes the margin.)
                    let wait = next.saturating_sub(now);
                    sleep_for = sleep_for.min(Duration::from_millis(wait.max(1)));
                }
                plan(&PlacementInput {
                    vips: &vips,
                    draining: &draining,
                    live: &live,
                    expired: &expired,
                    applied: table.applied(),
                })
            };
            if changes.is_empty() {
                continue;
            }
            let moves = changes.len();
            match raft
                .client_write(Command::Gateway(GatewayCommand::Assign(changes)))
                .await
            {
                Ok(resp) => {
                    METRICS.gateway_placements.inc();
                    let revision = match resp.data {
                        yard_raft_store::Response::Written { revision } => revision,
                        _ => 0,
                    };
                    tracing::info!(revision, moves, "gateway placement committed");
                    // Look again at once: a handoff's second step may already be possible.
                    sleep_for = Duration::from_millis(1);
                }
                Err(e) => tracing::debug!(error = %e, "gateway placement not committed"),
            }
        }
    }
}
