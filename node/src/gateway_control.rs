//! The gateway's voter and leader halves on this node: the clock, the loop and the I/O around
//! the pure cores in `yard_actors::gateway` (`lease::VoterLeases`, `leader::LeaderCore`).
//!
//! - As a voter (every node): grants gateway leases to renewals, applies revocations and
//!   un-revocations, and keeps the revocations on disk (a restarted voter must still refuse a
//!   revoked node). Short critical sections only: no lock is held across an await or I/O.
//! - As leader: `GatewayControl::run` (`crate::gateway_loop`) feeds the leader core with renewals, revocation answers,
//!   grace requests and the replicated tables, and executes its effects (revocation RPCs to the
//!   voters, placement and grace writes through Raft) without waiting on any of them, so one slow
//!   voter or write never holds back the decisions about other nodes. The core itself is owned by
//!   the loop, never shared behind a lock.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use yard_actors::gateway::damping::DampingConfig;
use yard_actors::gateway::leader::{Effect, LeaderConfig, LeaderCore};
use yard_actors::gateway::lease::{LeaseConfig, Revocations, RevokeOutcome, Stamp, VoterLeases};
use yard_raft_store::gateway::GatewayCommand;
use yard_raft_store::{Command, NodeId, Raft};

use crate::metrics::{FailoverPhase, Family, METRICS};
use crate::planner_control::{PlanRecords, PlannerLoop, PlannerSettings};
use crate::rpc::{NodeHealthView, PlanRecord, PlanView};
use yard_actors::gateway::replan::{Rate, Replan};

pub use crate::config::MAX_GRACE_MS;

/// What reaches the leader loop.
pub(crate) enum Input {
    Renewal {
        node: NodeId,
        applied: u64,
        lease_left_ms: u64,
        granted: bool,
        at: u64,
    },
    GraceAsk {
        node: NodeId,
        grace_ms: u64,
        reply: oneshot::Sender<Result<(), String>>,
    },
    GraceCommitted {
        node: NodeId,
        grace_ms: u64,
    },
    RevokeAnswer {
        node: NodeId,
        stamp: Stamp,
        voter: NodeId,
        remaining_ms: u64,
        at: u64,
    },
    UnrevokeAck {
        node: NodeId,
        stamp: Stamp,
        voter: NodeId,
    },
    PlacementDone {
        term: u64,
    },
    /// A gateway node's smoothed per-VIP rates.
    Rates {
        node: NodeId,
        rates: Vec<(std::net::Ipv4Addr, Rate)>,
        at: u64,
    },
    /// A re-plan of `term` finished on its blocking thread.
    Replanned {
        term: u64,
        result: Result<Replan, String>,
        measured_vips: usize,
    },
}

/// Renewals and answers queued for the loop at most; more are dropped (a dropped renewal is a
/// missed renewal, which the lease covers).
const QUEUE: usize = 4096;

/// This node's gateway lease and placement control.
pub struct GatewayControl {
    pub(crate) cfg: LeaderConfig,
    pub(crate) interval: Duration,
    pub(crate) epoch: Instant,
    voter: Mutex<VoterLeases>,
    /// Where the voter's revocations are kept (`None`: in memory only, for tests).
    state_file: Option<PathBuf>,
    /// Serialises writes of `state_file`, each writing the latest state.
    file_lock: tokio::sync::Mutex<()>,
    pub(crate) tx: mpsc::Sender<Input>,
    pub(crate) rx: Mutex<Option<mpsc::Receiver<Input>>>,
    /// When this leader saw each node's lease lapse (ms on `epoch`), until the node is fenced
    /// or restored: the start of the fence phase that the failover histogram records.
    lapsed_at: Mutex<BTreeMap<NodeId, u64>>,
    /// The service planner (`[planner]`), if enabled.
    pub(crate) planner: Option<PlannerSettings>,
    /// The latest re-plans and the nodes' history, as this node last led them.
    plans: Mutex<PlanRecords>,
    health: Mutex<Vec<NodeHealthView>>,
}

impl GatewayControl {
    /// A control keeping its revocations in memory (see [`with_state_file`](Self::with_state_file)).
    pub fn new(cfg: LeaseConfig, interval: Duration, leader_holds_vips: bool) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        Self {
            cfg: LeaderConfig {
                lease: cfg,
                leader_holds_vips,
                damping: DampingConfig::default(),
            },
            interval,
            epoch: Instant::now(),
            voter: Mutex::new(VoterLeases::new(cfg.lease_ms, 0, Revocations::default())),
            state_file: None,
            file_lock: tokio::sync::Mutex::new(()),
            tx,
            rx: Mutex::new(Some(rx)),
            lapsed_at: Mutex::default(),
            planner: None,
            plans: Mutex::default(),
            health: Mutex::default(),
        }
    }

    /// Places VIPs by the service planner (see `planner_control`).
    pub fn with_planner(mut self, settings: PlannerSettings) -> Self {
        self.planner = Some(settings);
        self
    }

    /// Whether the service planner is enabled.
    pub fn planner_enabled(&self) -> bool {
        self.planner.is_some()
    }

    /// A gateway node's rates, for the leader's planner (dropped when the loop is busy: the
    /// next report replaces it anyway).
    pub fn rates(&self, node: NodeId, rates: Vec<(std::net::Ipv4Addr, Rate)>) {
        let _ = self.tx.try_send(Input::Rates {
            node,
            rates,
            at: self.now_ms(),
        });
    }

    /// Keeps a re-plan for `yard plan show` and the metrics.
    pub fn record_plan(&self, record: PlanRecord) {
        self.plans().record(record);
    }

    pub(crate) fn plans(&self) -> std::sync::MutexGuard<'_, PlanRecords> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn health(&self) -> std::sync::MutexGuard<'_, Vec<NodeHealthView>> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `yard plan show` as this node (the leader) sees it.
    pub fn plan_view(&self, me: NodeId) -> PlanView {
        let plans = self.plans().clone();
        PlanView {
            leader: me,
            enabled: self.planner.is_some(),
            latest: plans.latest,
            last_moved: plans.last_moved,
            health: self.health().clone(),
        }
    }

    /// The planner's metrics: load factor, predicted and measured load per node, moves.
    pub fn planner_families(&self) -> Vec<Family> {
        let plans = self.plans().clone();
        let Some(latest) = plans.latest else {
            return Vec::new();
        };
        let r = &latest.report;
        let mut load = Vec::new();
        for n in &r.nodes {
            load.push((
                format!("node=\"{}\",kind=\"predicted\"", n.node),
                n.predicted,
            ));
            load.push((format!("node=\"{}\",kind=\"measured\"", n.node), n.measured));
        }
        vec![
            Family {
                name: "yard_planner_load_factor",
                help: "the worst load (over capacity), nominal or after any single gateway failure, of the placement the latest re-plan chose",
                kind: "gauge",
                samples: vec![(String::new(), r.planned_worst)],
            },
            Family {
                name: "yard_planner_node_load",
                help: "each gateway node's load over capacity: measured where the vips are, predicted where the latest re-plan puts them",
                kind: "gauge",
                samples: load,
            },
            Family {
                name: "yard_planner_moves_total",
                help: "vip moves the leader's re-plans started",
                kind: "counter",
                samples: vec![(String::new(), plans.moves_total as f64)],
            },
            Family {
                name: "yard_planner_replans_total",
                help: "re-plans the leader ran",
                kind: "counter",
                samples: vec![(String::new(), plans.replans_total as f64)],
            },
            Family {
                name: "yard_planner_last_moves",
                help: "vip moves the latest re-plan started",
                kind: "gauge",
                samples: vec![(String::new(), r.moves.len() as f64)],
            },
        ]
    }

    /// Ownership damping settings.
    pub fn with_damping(mut self, damping: DampingConfig) -> Self {
        self.cfg.damping = damping;
        self
    }

    /// Keeps this voter's revocations in `path`, loading what a previous run stored there.
    pub fn with_state_file(mut self, path: PathBuf) -> Result<Self, String> {
        let durable = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Revocations>(&bytes).map_err(|e| {
                format!(
                    "the gateway revocations in {} are unreadable: {e}",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Revocations::default(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let revoked = durable.nodes.values().filter(|(_, r)| *r).count();
        if revoked > 0 {
            tracing::info!(revoked, "gateway voter: revocations restored");
        }
        self.voter = Mutex::new(VoterLeases::new(self.cfg.lease.lease_ms, 0, durable));
        self.state_file = Some(path);
        Ok(self)
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn voter(&self) -> std::sync::MutexGuard<'_, VoterLeases> {
        self.voter.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lapsed_at(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, u64>> {
        self.lapsed_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `node` is fenced from `at_ms`: records the fence phase if this leader saw the lapse.
    pub(crate) fn fenced(&self, node: NodeId, at_ms: u64) {
        if let Some(lapsed) = self.lapsed_at().remove(&node) {
            METRICS.observe_failover(
                FailoverPhase::Fence,
                Duration::from_millis(at_ms.saturating_sub(lapsed)),
            );
        }
    }

    /// A renewal from `node` at this voter: the granted milliseconds, or why none was granted.
    pub fn renew(&self, node: NodeId, applied: u64, lease_left_ms: u64) -> Result<u64, String> {
        let now = self.now_ms();
        let granted = self.voter().grant(node, now);
        let _ = self.tx.try_send(Input::Renewal {
            node,
            applied,
            lease_left_ms,
            granted: granted.is_some(),
            at: now,
        });
        match granted {
            Some(ms) => {
                METRICS.gateway_renewals.inc();
                Ok(ms)
            }
            None => Err("this node's gateway lease is revoked".into()),
        }
    }

    /// A revocation of `node` at this voter, answered once it is on disk: how long this voter's
    /// promise still ran when the revocation was applied (from then on it grants nothing), and
    /// how long ago that was. The leader's bound is then `received − held + remaining`: the
    /// time spent storing the revocation does not delay the fence.
    pub async fn revoke(&self, node: NodeId, stamp: Stamp) -> Result<(u64, u64), String> {
        let applied_at = self.now_ms();
        let outcome = self.voter().revoke(node, stamp, applied_at);
        match outcome {
            RevokeOutcome::Superseded => Err("a newer revocation or un-revocation applies".into()),
            RevokeOutcome::Revoked {
                remaining_ms,
                changed,
            } => {
                if changed {
                    self.persist().await?;
                    tracing::info!(node, remaining_ms, "gateway voter: lease revoked");
                }
                Ok((remaining_ms, self.now_ms().saturating_sub(applied_at)))
            }
        }
    }

    /// An un-revocation of `node` at this voter.
    pub async fn unrevoke(&self, node: NodeId, stamp: Stamp) -> Result<(), String> {
        let changed = self.voter().unrevoke(node, stamp);
        if changed {
            self.persist().await?;
        }
        Ok(())
    }

    /// Writes the latest revocations (write, fsync, rename): under a lock of its own, so a
    /// slower write of an older state never lands last.
    async fn persist(&self) -> Result<(), String> {
        let Some(path) = self.state_file.clone() else {
            return Ok(());
        };
        let _guard = self.file_lock.lock().await;
        // A copy under the lock (revocations are few), encoded outside it.
        let durable = self.voter().durable().clone();
        let bytes = serde_json::to_vec(&durable)
            .map_err(|e| format!("cannot encode the gateway revocations: {e}"))?;
        tokio::task::spawn_blocking(move || write_durably(&path, &bytes))
            .await
            .map_err(|e| format!("the revocation write failed: {e}"))?
    }

    /// A planned restart of `node`: commits a grace of `grace_ms` through Raft (so any later
    /// leader holds the node too), held by the leader from the request on; the node's data
    /// plane keeps answering for its VIPs that long with no daemon behind it.
    pub async fn grace(
        &self,
        raft: &Raft,
        node: NodeId,
        _applied: u64,
        grace_ms: u64,
    ) -> Result<u64, String> {
        if grace_ms == 0 || grace_ms > MAX_GRACE_MS {
            return Err(format!(
                "a restart grace must be 1 to {MAX_GRACE_MS} ms, not {grace_ms}"
            ));
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Input::GraceAsk {
                node,
                grace_ms,
                reply,
            })
            .await
            .map_err(|_| "the gateway control is not running".to_owned())?;
        answer
            .await
            .map_err(|_| "the gateway control is not running".to_owned())??;
        raft.client_write(Command::Gateway(GatewayCommand::Grace {
            node,
            ms: grace_ms,
        }))
        .await
        .map_err(|e| format!("the grace was not committed: {e}"))?;
        let _ = self.tx.send(Input::GraceCommitted { node, grace_ms }).await;
        tracing::info!(node, grace_ms, "gateway restart grace granted");
        Ok(grace_ms)
    }

    /// Feeds one input to the core; whether a decision may have changed at once.
    pub(crate) fn input(
        &self,
        core: &mut LeaderCore,
        pl: &mut Option<PlannerLoop>,
        input: Input,
    ) -> bool {
        let now = self.now_ms();
        match input {
            Input::Rates { node, rates, at } => {
                if let Some(pl) = pl.as_mut() {
                    pl.report(node, at, rates);
                }
                false
            }
            Input::Replanned {
                term,
                result,
                measured_vips,
            } => {
                let Some(pl) = pl.as_mut() else {
                    return false;
                };
                pl.busy = false;
                if core.term() != Some(term) {
                    return false;
                }
                match result {
                    Ok(r) => {
                        let moves = r.report.moves.len();
                        // No plan (no traffic measured yet, no node to plan on): counts
                        // balance the VIPs, as without the planner.
                        core.set_planned(r.planned);
                        tracing::info!(
                            moves,
                            deferred = r.report.deferred,
                            load_factor = r.report.planned_worst,
                            reason = %r.report.reason,
                            "planner: re-planned"
                        );
                        let at_unix_ms = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64);
                        self.record_plan(PlanRecord {
                            at_unix_ms,
                            term,
                            measured_vips,
                            report: r.report,
                        });
                        moves > 0
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "planner: the re-plan failed; the placement stays");
                        false
                    }
                }
            }
            Input::Renewal {
                node,
                applied,
                lease_left_ms,
                granted,
                at,
            } => {
                core.renewal(node, applied, lease_left_ms, granted, at);
                false
            }
            Input::GraceAsk {
                node,
                grace_ms,
                reply,
            } => {
                let _ = reply.send(core.grace_requested(node, grace_ms, now));
                false
            }
            Input::GraceCommitted { node, grace_ms } => {
                core.grace_committed(node, grace_ms, now);
                false
            }
            Input::RevokeAnswer {
                node,
                stamp,
                voter,
                remaining_ms,
                at,
            } => match core.revoke_answer(node, stamp, voter, remaining_ms, at) {
                Some(Effect::Fenced { node, at_ms }) => {
                    self.fenced(node, at_ms);
                    tracing::info!(
                        node,
                        fenced_at_ms = at_ms,
                        in_ms = at_ms.saturating_sub(now),
                        "gateway lease revoked at a majority"
                    );
                    true
                }
                _ => false,
            },
            Input::UnrevokeAck { node, stamp, voter } => {
                core.unrevoke_ack(node, stamp, voter);
                false
            }
            Input::PlacementDone { term } => {
                if core.term() == Some(term) {
                    core.placement_done();
                }
                true
            }
        }
    }
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content.
fn write_durably(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| {
        format!(
            "cannot store the gateway revocations in {}: {e}",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn revocations_survive_a_restart_of_the_voter() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway-revocations.json");
        let cfg = LeaseConfig {
            lease_ms: 90,
            margin_ms: 10,
        };
        let ctl = GatewayControl::new(cfg, Duration::from_millis(20), false)
            .with_state_file(path.clone())
            .unwrap();
        assert!(ctl.renew(7, 0, 0).is_ok());
        let stamp = Stamp { term: 3, seq: 1 };
        let (left, _) = ctl.revoke(7, stamp).await.unwrap();
        assert!(left <= 90 && left > 0, "{left}");
        assert!(ctl.renew(7, 0, 0).is_err());
        // A restarted voter still refuses, and reports a promise of up to a lease.
        let ctl = GatewayControl::new(cfg, Duration::from_millis(20), false)
            .with_state_file(path.clone())
            .unwrap();
        assert!(ctl.renew(7, 0, 0).is_err());
        assert!(
            ctl.revoke(7, Stamp { term: 3, seq: 0 }).await.is_err(),
            "stale stamp"
        );
        ctl.unrevoke(7, Stamp { term: 3, seq: 2 }).await.unwrap();
        assert!(ctl.renew(7, 0, 0).is_ok());
        let again = GatewayControl::new(cfg, Duration::from_millis(20), false)
            .with_state_file(path.clone())
            .unwrap();
        assert!(again.renew(7, 0, 0).is_ok());
        // A damaged file is an error, not an empty state.
        std::fs::write(&path, b"{").unwrap();
        let err = GatewayControl::new(cfg, Duration::from_millis(20), false)
            .with_state_file(path)
            .err()
            .unwrap();
        assert!(err.contains("unreadable"), "{err}");
    }
}
