//! Waiting for a role instead of polling for it.
//!
//! Several loops have work only in one Raft state: the leader's loops (gateway leases,
//! aggregation placement, the analyzer, host liveness, the autopilot) and the voters' pre-vote
//! gate. They used to wake at their working interval (20-100 ms) on every host just to find
//! they had nothing to do, which is most of what an idle agent cost (0.7% of a core). Outside
//! their state they now sleep on openraft's metrics channel: a change of role wakes them at
//! once, sooner than the next poll would have, and an agent's Raft, which hears from no
//! leader, stays quiet.

use std::time::Duration;

use openraft::ServerState;
use yard_raft_store::{NodeId, NodeInfo, Raft};

/// The longest a waiting loop sleeps before it looks again on its own. Every change of
/// state wakes it sooner; the bound keeps a loop that missed one (none is known) from
/// sleeping for good.
pub const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// Sleeps until `raft`'s metrics satisfy `ready`, or for `max` at most.
pub async fn wait_raft(
    raft: &Raft,
    max: Duration,
    ready: impl FnMut(&openraft::RaftMetrics<NodeId, NodeInfo>) -> bool,
) {
    let mut metrics = raft.metrics();
    let _ = tokio::time::timeout(max, metrics.wait_for(ready)).await;
}

/// [`wait_raft`] until this node leads.
pub async fn wait_leading(raft: &Raft, max: Duration) {
    wait_raft(raft, max, |m| m.state == ServerState::Leader).await;
}

/// [`wait_raft`] until node `me` is a voter of its Raft's own membership (an agent's Raft has
/// none until the autopilot adds it).
pub async fn wait_voting(raft: &Raft, me: NodeId, max: Duration) {
    wait_raft(raft, max, |m| is_voter(m, me)).await;
}

/// Whether `me` votes in the membership `m` shows.
pub fn is_voter(m: &openraft::RaftMetrics<NodeId, NodeInfo>, me: NodeId) -> bool {
    m.membership_config
        .membership()
        .voter_ids()
        .any(|v| v == me)
}
