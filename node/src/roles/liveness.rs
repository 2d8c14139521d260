//! Hosts' liveness at cluster size, executed (the rules are `yard_control::host_liveness`):
//! every member judges the agents whose watches it serves (their polls are the heartbeats) and
//! sends the leader only transitions; the leader turns them into verdicts and commits each as
//! one `Command::HostLiveness` entry, which every node's actors then read from the tables.
//! The leader's work per tick is the due reattach deadlines and the reports that arrived, never
//! a walk over all hosts.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::broadcast::error::TryRecvError;
use yard_control::host_liveness::{HostLivenessCore, LivenessConfig, Report, Verdict};
use yard_raft_store::{Change, Command, NodeId};

use crate::raft_wait::{wait_leading, wait_raft, IDLE_RECHECK};
use crate::rpc::{Reply, Request};
use crate::service::Node;

pub use super::liveness_state::HostLiveness;

/// How often members judge their agents and the leader its reports.
const TICK: Duration = Duration::from_millis(100);
/// How often a member adds its whole picture to what it sends the leader. The leader's core
/// ignores reports from a member its own liveness holds lost and withdraws that member's
/// vouches, and nothing tells the member when it is back; a chaos run left an agent committed
/// dead for good that way, polling a live member all along. Re-sent attachments are idempotent
/// in the core, and a member serves a few thousand agents at most: a few kilobytes every few
/// seconds.
const RESYNC_EVERY: Duration = Duration::from_secs(5);
/// Reports a member keeps for a leader it cannot reach; past this it sends its full picture
/// (`WatcherCore::resync`) once one answers, instead of an unbounded backlog.
const MAX_QUEUED: usize = 65_536;

/// Every member, every tick: judges its agents and sends the transitions to the leader, in
/// order; a new leader gets the member's whole picture first.
pub async fn report(node: Node) {
    let hl = node.host_liveness().clone();
    let mut queue: Vec<Report> = Vec::new();
    let mut told: Option<NodeId> = None;
    let mut resynced = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        if !node.is_member() {
            let me = node.id();
            wait_raft(node.raft(), IDLE_RECHECK, |m| {
                m.membership_config.membership().get_node(&me).is_some()
            })
            .await;
            continue;
        }
        let (fresh, resync) = {
            let mut w = hl.watchers();
            let fresh = w.core.tick(hl.now_ms());
            for r in &fresh {
                if let Report::Silent { host, .. } = r {
                    w.from.remove(host);
                }
            }
            (fresh, w.core.resync())
        };
        let Some((leader, _)) = node.known_leader() else {
            continue;
        };
        if told != Some(leader) || queue.len() > MAX_QUEUED {
            // The new leader knows nothing of this member's agents: the whole picture, which
            // already reflects every transition queued for the old one.
            queue = resync;
            resynced = tokio::time::Instant::now();
        } else {
            queue.extend(fresh);
            if resynced.elapsed() >= RESYNC_EVERY {
                // After the transitions, not instead of them: the leader still holds this
                // member's earlier vouches, and only a `Silent` withdraws one.
                queue.extend(resync);
                resynced = tokio::time::Instant::now();
            }
        }
        if queue.is_empty() && told == Some(leader) {
            continue;
        }
        let batch = std::mem::take(&mut queue);
        let delivered = if leader == node.id() {
            hl.accept(leader, batch.clone());
            true
        } else {
            let req = Request::HostReports {
                reports: batch.clone(),
            };
            matches!(
                node.call_node(leader, req, TICK * 5).await,
                Ok(Reply::ReportsAccepted)
            )
        };
        if delivered {
            told = Some(leader);
        } else {
            queue = batch;
            told = None;
        }
    }
}

/// On the leader: turns members' reports into verdicts and commits each as one entry.
pub async fn judge(node: Node) {
    let hl = node.host_liveness().clone();
    let Some(mut reports) = hl
        .reports_rx
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    else {
        return;
    };
    let mut led: Option<Led> = None;
    loop {
        tokio::time::sleep(TICK).await;
        if node.raft().metrics().borrow().state != ServerState::Leader {
            led = None;
            while reports.try_recv().is_ok() {}
            wait_leading(node.raft(), IDLE_RECHECK).await;
            continue;
        }
        let now = hl.now_ms();
        let l = led.get_or_insert_with(|| Led::start(&node, hl.cfg.clone(), now));
        l.follow_tables(&node, now);
        l.follow_members(&node, now);
        let members = node.member_ids();
        while let Ok((replica, batch)) = reports.try_recv() {
            if !members.contains(&replica) {
                continue;
            }
            tracing::debug!(replica, reports = ?batch, "host reports");
            for r in batch {
                l.core.report(replica, r, now);
            }
        }
        for verdict in l.core.tick(now) {
            let (id, alive) = match verdict {
                Verdict::Dead { host } => (host, false),
                Verdict::Alive { host } => (host, true),
            };
            commit(&node, id, alive).await;
        }
        // Hosts a former leader committed dead that this leader's core holds attached: their
        // return happened before this leader's core existed, so no transition announces it.
        let down: Vec<NodeId> = node.feed().read(|d| d.hosts_down.iter().copied().collect());
        for id in down {
            if l.core.is_dead(id) == Some(false) && l.core.current_replica(id).is_some() {
                commit(&node, id, true).await;
            }
        }
    }
}

async fn commit(node: &Node, id: NodeId, alive: bool) {
    let down = node.feed().read(|d| d.hosts_down.contains(&id));
    if down != alive {
        return;
    }
    match node
        .raft()
        .client_write(Command::HostLiveness { id, alive })
        .await
    {
        Ok(_) => tracing::info!(host = id, alive, "host liveness committed"),
        Err(e) => tracing::warn!(host = id, alive, error = %e, "host liveness not committed"),
    }
}

/// The leader's state while it leads.
struct Led {
    core: HostLivenessCore,
    feed: tokio::sync::broadcast::Receiver<Change>,
    lost: BTreeSet<NodeId>,
}

impl Led {
    fn start(node: &Node, cfg: LivenessConfig, now: u64) -> Self {
        let (data, feed) = node.feed().subscribe();
        let members = node.member_ids();
        let mut core = HostLivenessCore::new(cfg);
        for id in data.nodes.keys().filter(|id| !members.contains(id)) {
            core.known(*id, now);
        }
        Self {
            core,
            feed,
            lost: BTreeSet::new(),
        }
    }

    /// Hosts joining, leaving or becoming members since the last tick.
    fn follow_tables(&mut self, node: &Node, now: u64) {
        loop {
            match self.feed.try_recv() {
                Ok(Change::Node { id, meta, .. }) => {
                    if meta.is_none() || node.member_ids().contains(&id) {
                        self.core.forget(id);
                    } else {
                        self.core.known(id, now);
                    }
                }
                Ok(_) => {}
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => {
                    // Missed changes: take the hosts table as it is (rare; O(hosts) once).
                    let (data, feed) = node.feed().subscribe();
                    self.feed = feed;
                    let members = node.member_ids();
                    for id in data.nodes.keys() {
                        if members.contains(id) {
                            self.core.forget(*id);
                        } else {
                            self.core.known(*id, now);
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Members the leader's own liveness lost or found again: their agents' vouches.
    fn follow_members(&mut self, node: &Node, now: u64) {
        for (id, reachable) in node.reachability() {
            if !reachable && self.lost.insert(id) {
                self.core.replica_lost(id, now);
            } else if reachable && self.lost.remove(&id) {
                self.core.replica_back(id, now);
            }
        }
    }
}
