//! `yard members` on the leader: every host's role, zone, lag and liveness. Members' lag is
//! Raft's replication progress; agents' lag and the member each follows come from the members
//! that serve their watches, asked once per request (the only place the leader's work grows
//! with the hosts, and only when an operator asks).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use yard_raft_store::NodeId;

use crate::roles::zone_of;
use crate::rpc::{HostRow, MembersView, Reply, Request};
use crate::service::Node;

/// Where an agent's watch stands, from the member that heard its latest poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub ago_ms: u64,
    pub member: NodeId,
    /// The log index its latest poll asked from.
    pub from: u64,
}

impl Position {
    /// Entries the agent trails `commit` by: a poll asks from the index after the last one it
    /// applied.
    pub fn lag(&self, commit: u64) -> u64 {
        commit.saturating_sub(self.from.saturating_sub(1))
    }
}

/// Each agent's freshest poll among `members`, asked of each member once.
pub async fn agent_positions(
    node: &Node,
    members: &std::collections::BTreeSet<NodeId>,
    timeout: Duration,
) -> BTreeMap<NodeId, Position> {
    let asked = join_all(
        members
            .iter()
            .map(|m| async move { (*m, node.call_node(*m, Request::Watchers, timeout).await) }),
    )
    .await;
    let mut polls: BTreeMap<NodeId, Position> = BTreeMap::new();
    for (member, reply) in asked {
        let Ok(Reply::Watchers(rows)) = reply else {
            continue;
        };
        for w in rows {
            let fresh = Position {
                ago_ms: w.ago_ms,
                member,
                from: w.from,
            };
            polls
                .entry(w.host)
                .and_modify(|p| {
                    if fresh.ago_ms < p.ago_ms {
                        *p = fresh;
                    }
                })
                .or_insert(fresh);
        }
    }
    polls
}

/// Gathers the view; call it on the leader.
pub async fn view(node: &Node, timeout: Duration) -> MembersView {
    let metrics = node.raft().metrics().borrow().clone();
    let commit = metrics.last_applied.map_or(0, |l| l.index);
    let last = metrics.last_log_index.unwrap_or(0);
    let (voters, members) = (node.voter_ids(), node.member_ids());
    let reach = node.reachability();
    let polls = agent_positions(node, &members, timeout).await;
    // Taken before the tables' read lock: `member` reads the tables too, and a second read
    // lock on the same thread waits behind a queued writer (std's RwLock), a deadlock.
    let infos: BTreeMap<NodeId, yard_raft_store::NodeInfo> = members
        .iter()
        .filter_map(|id| node.member(*id).map(|n| (*id, n)))
        .collect();
    let hosts = node.feed().read(|d| {
        let mut ids: Vec<NodeId> = d.nodes.keys().copied().collect();
        ids.extend(members.iter().filter(|m| !d.nodes.contains_key(m)));
        ids.sort_unstable();
        ids.into_iter()
            .map(|id| {
                let meta = d.nodes.get(&id);
                let info = infos.get(&id);
                let (role, alive, lag, follows) = if members.contains(&id) {
                    let matched = metrics
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(&id))
                        .map(|l| l.map_or(0, |l| l.index));
                    let lag = if id == node.id() {
                        Some(0)
                    } else {
                        matched.map(|m| last.saturating_sub(m))
                    };
                    let role = if voters.contains(&id) {
                        "voter"
                    } else {
                        "replica"
                    };
                    let alive = id == node.id() || reach.get(&id).copied().unwrap_or(true);
                    (role, alive, lag, None)
                } else {
                    let poll = polls.get(&id);
                    // A poll asks from the index after the last one the agent applied.
                    let lag = poll.map(|p| p.lag(commit));
                    (
                        "agent",
                        !d.hosts_down.contains(&id),
                        lag,
                        poll.map(|p| p.member),
                    )
                };
                HostRow {
                    id,
                    name: meta
                        .map(|m| m.name.clone())
                        .or_else(|| info.as_ref().map(|i| i.name.clone()))
                        .unwrap_or_default(),
                    addr: meta
                        .map(|m| m.addr.clone())
                        .or_else(|| info.as_ref().map(|i| i.addr.clone()))
                        .unwrap_or_default(),
                    role: role.into(),
                    zone: meta.and_then(zone_of).unwrap_or_default(),
                    alive,
                    lag,
                    follows,
                }
            })
            .collect()
    });
    MembersView {
        leader: node.id(),
        commit_index: commit,
        hosts,
        autopilot: node.autopilot_reason(),
    }
}
