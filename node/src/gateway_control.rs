//! The leader's half of the gateway: it grants VIP leases to gateway nodes and places VIPs.
//!
//! Every node runs [`GatewayControl::run`], which does nothing unless the node leads. As
//! leader it confirms its leadership with a quorum round every renewal period (grants are only
//! made inside a confirmed window, see `yard_actors::gateway::lease`), classifies gateway nodes
//! as live or certainly fenced from their lease records, and proposes the placement core's
//! decisions as one Raft command. Decisions and arithmetic live in the pure cores; this is the
//! clock, the loop and the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::ServerState;
use yard_actors::gateway::lease::{LeaseConfig, LeaseTable};
use yard_actors::gateway::placement::{plan, PlacementInput};
use yard_raft_store::gateway::GatewayCommand;
use yard_raft_store::{Command, NodeId, Raft};

use crate::metrics::METRICS;

/// The longest restart grace granted: a node gone longer than this should lose its VIPs.
pub const MAX_GRACE_MS: u64 = 600_000;

/// The leader-side lease and placement state of this node (empty unless it leads).
pub struct GatewayControl {
    cfg: LeaseConfig,
    /// Whether the Raft leader may own VIPs while other gateway nodes are live.
    leader_holds_vips: bool,
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
    /// A placement write is being committed: a lapsed node is not granted a lease meanwhile,
    /// so it cannot re-arm from tables older than a reassignment of its VIPs.
    in_flight: bool,
    /// Nodes on a restart grace → when it was granted (or this leader took over).
    graced: BTreeMap<NodeId, u64>,
    /// Graced nodes whose new daemon has renewed: their grace can be cleared.
    back: BTreeSet<NodeId>,
}

impl GatewayControl {
    pub fn new(cfg: LeaseConfig, interval: Duration, leader_holds_vips: bool) -> Self {
        Self {
            cfg,
            leader_holds_vips,
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
    pub fn renew(&self, node: NodeId, applied: u64, lease_left_ms: u64) -> Result<u64, String> {
        let now = self.now_ms();
        let mut st = self.state();
        let ControlState {
            table,
            in_flight,
            graced,
            back,
            ..
        } = &mut *st;
        let Some((_, table)) = table.as_mut() else {
            return Err("this node is not the leader".into());
        };
        if *in_flight && table.is_expired(node, now) {
            return Err("a placement is being committed; try again".into());
        }
        // Renewals still in flight from the daemon that asked for the grace arrive within one
        // lease; later ones come from its successor, which is back once its data plane runs on
        // an ordinary lease again (a later leader would not know to wait out the grace).
        if lease_left_ms <= self.cfg.lease_ms
            && graced
                .get(&node)
                .is_some_and(|at| now > at + self.cfg.lease_ms)
        {
            back.insert(node);
        }
        match table.renew(node, applied, now) {
            Some(granted) => {
                METRICS.gateway_renewals.inc();
                Ok(granted)
            }
            None => Err("leadership is not confirmed; try again".into()),
        }
    }

    /// A planned restart of `node`: commits a grace of `grace_ms` through Raft (so any later
    /// leader holds the node too), then holds it here; the node's data plane keeps answering
    /// for its VIPs that long with no daemon behind it.
    pub async fn grace(
        &self,
        raft: &Raft,
        node: NodeId,
        applied: u64,
        grace_ms: u64,
    ) -> Result<u64, String> {
        if grace_ms == 0 || grace_ms > MAX_GRACE_MS {
            return Err(format!(
                "a restart grace must be 1 to {MAX_GRACE_MS} ms, not {grace_ms}"
            ));
        }
        {
            // Held at once, before the commit (which may take a while): the node stops renewing
            // now, and this leader must not give its VIPs away meanwhile.
            let mut st = self.state();
            let now = self.now_ms();
            let Some((_, table)) = st.table.as_mut() else {
                return Err("this node is not the leader".into());
            };
            if table.renew(node, applied, now).is_none() {
                return Err("leadership is not confirmed; try again".into());
            }
            table.hold(node, now + grace_ms);
        }
        raft.client_write(Command::Gateway(GatewayCommand::Grace {
            node,
            ms: grace_ms,
        }))
        .await
        .map_err(|e| format!("the grace was not committed: {e}"))?;
        let now = self.now_ms();
        let mut st = self.state();
        let Some((_, table)) = st.table.as_mut() else {
            return Err("this node lost the leadership".into());
        };
        table.hold(node, now + grace_ms);
        st.graced.insert(node, now);
        st.back.remove(&node);
        tracing::info!(node, grace_ms, "gateway restart grace granted");
        Ok(grace_ms)
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
            let fresh = self
                .state()
                .table
                .as_ref()
                .is_none_or(|(term, _)| *term != m.current_term);
            if fresh {
                // The takeover wait starts now (after the election, so never too early). The
                // predecessor's restart graces must be read from tables that include everything
                // it committed: wait until this term's first entry is applied.
                let now = self.now_ms();
                if !matches!(
                    tokio::time::timeout(self.interval * 10, raft.ensure_linearizable()).await,
                    Ok(Ok(_))
                ) {
                    continue;
                }
                let mut st = self.state();
                {
                    tracing::info!(
                        term = m.current_term,
                        wait_ms = self.cfg.lease_ms + self.cfg.margin_ms,
                        "gateway leases: leading; predecessors' grants run out first"
                    );
                    let mut table = LeaseTable::new(self.cfg, now);
                    // Graces a predecessor granted run at most this long from now.
                    let graces = feed.read(|d| d.gateway.graces.clone());
                    for (node, ms) in &graces {
                        table.hold(*node, now + ms);
                    }
                    st.graced = graces.keys().map(|n| (*n, now)).collect();
                    st.back.clear();
                    st.table = Some((m.current_term, table));
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
            let (vips, draining, graces) = feed.read(|d| {
                (
                    d.gateway.vips.clone(),
                    d.gateway.draining.clone(),
                    d.gateway.graces.clone(),
                )
            });
            let now = self.now_ms();
            let mut ended = Vec::new();
            let changes = {
                let mut st = self.state();
                let ControlState {
                    table,
                    lapsed,
                    graced,
                    back,
                    ..
                } = &mut *st;
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
                // A grace ends when the restarted daemon renews, or when it ran out.
                for node in graces.keys() {
                    if back.contains(node) || expired.contains(node) {
                        ended.push(*node);
                        graced.remove(node);
                        back.remove(node);
                    }
                }
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
                // The leader holds no VIP while another gateway node can: its failure then
                // costs an election but strands no VIP (a stranded VIP would wait for the
                // election and the new leader's takeover wait). Its VIPs leave by handoff.
                let mut draining = draining.clone();
                let me = m.id;
                if !self.leader_holds_vips
                    && live
                        .iter()
                        .any(|n| *n != me && !draining.contains(n) && !expired.contains(n))
                {
                    draining.insert(me);
                }
                plan(&PlacementInput {
                    vips: &vips,
                    draining: &draining,
                    live: &live,
                    expired: &expired,
                    applied: table.applied(),
                })
            };
            for node in ended {
                let cleared = raft
                    .client_write(Command::Gateway(GatewayCommand::Grace { node, ms: 0 }))
                    .await;
                tracing::info!(node, ok = cleared.is_ok(), "gateway restart grace ended");
            }
            if changes.is_empty() {
                continue;
            }
            let moves = changes.len();
            self.state().in_flight = true;
            let written = raft
                .client_write(Command::Gateway(GatewayCommand::Assign(changes)))
                .await;
            self.state().in_flight = false;
            match written {
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
