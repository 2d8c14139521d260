//! The leader hands its leadership to another voter (`yard leader transfer`, and a leader the
//! operator drained): `yard_control::leader_transfer` decides whom and when; this carries it
//! out through the Raft network's [`crate::raft_network::Handover`] and the voters'
//! [`crate::rpc::Request::Handover`].
//!
//! The other voters are told first, and do not stand for election for a while ([`Standby`]):
//! they hear nothing from the leader during the handover, and once the target stands (it then
//! grants pre-votes, having no leader) one of them could win a pre-vote and campaign against
//! it; a voter at a higher term then deposes the new leader, and leadership lands anywhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use openraft::ServerState;
use yard_control::leader_transfer::{self, Step};
use yard_raft_store::NodeId;

use crate::rpc::{Reply, Request};
use crate::service::Node;

/// How long the leader holds replication to the other voters back for the target to catch
/// up, at most. With [`ELECTION_LIMIT`] it keeps a handover within a forwarded request's
/// RPC timeout (`transport.rpc_timeout_ms`, 2 s by default).
const CATCH_UP_LIMIT: Duration = Duration::from_millis(1_000);
/// How long the leader waits for the target's election after asking it.
const ELECTION_LIMIT: Duration = Duration::from_millis(700);
/// How often the leader looks at its replication progress meanwhile.
const LOOK_EVERY: Duration = Duration::from_millis(5);
/// How long a voter told of a handover holds back from standing, at most (until it sees the
/// target lead): if the leader dies mid-handover, failover waits this much longer.
const STANDBY: Duration = Duration::from_secs(2);

/// A handover this node was told of: to whom, and until when it does not stand.
#[derive(Debug, Default)]
pub struct Standby(std::sync::Mutex<Option<(NodeId, Instant)>>);

impl Standby {
    fn hold(&self, to: NodeId) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((to, Instant::now() + STANDBY));
    }

    fn release(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether this node holds back from standing, given the leader it follows now.
    pub fn holds(&self, leader: Option<NodeId>) -> bool {
        let mut pending = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *pending {
            Some((to, until)) if Instant::now() < until && leader != Some(to) => true,
            Some(_) => {
                *pending = None;
                false
            }
            None => false,
        }
    }
}

/// Hands this node's leadership to `asked` (None: the most caught-up voter); returns the
/// node that leads afterwards.
pub async fn transfer(node: &Node, asked: Option<NodeId>) -> Result<NodeId, String> {
    let me = node.id();
    let metrics = node.raft().metrics().borrow().clone();
    if metrics.state != ServerState::Leader {
        return Err(format!("node {me} does not lead"));
    }
    let drained = node.feed().read(|d| d.drained.clone());
    let target = leader_transfer::pick(me, &node.voter_ids(), &drained, &matched(&metrics), asked)?;
    let cfg = node.raft().config();
    // The followers' lease runs from the last append they received; one heartbeat more covers
    // an append already on its way when the hold began.
    let lease_ms = cfg.election_timeout_max + cfg.heartbeat_interval;
    tracing::info!(target, "handing leadership over");
    // Every other voter holds back from standing first (see the module doc); one that cannot
    // be told is one the hold keeps from the new leader's log anyway, and cannot win.
    let others: Vec<NodeId> = node
        .voter_ids()
        .into_iter()
        .filter(|id| *id != me && *id != target)
        .collect();
    futures::future::join_all(others.iter().map(|id| {
        node.call_node(
            *id,
            Request::Handover { to: target },
            node.inner.rpc_timeout,
        )
    }))
    .await;
    // This node too: once it steps down for the target, its pre-vote gate would otherwise win
    // a round (the candidate grants it) and campaign against the target it just chose, with a
    // log as long as the target's (seen by hand: the leadership came straight back).
    node.standby().hold(target);
    node.inner.handover.hold(target);
    let result = async {
        let held = Instant::now();
        loop {
            let metrics = node.raft().metrics().borrow().clone();
            if metrics.state != ServerState::Leader {
                return Err(format!("node {me} lost its leadership during the handover"));
            }
            match leader_transfer::step(
                target,
                held.elapsed().as_millis() as u64,
                lease_ms,
                matched(&metrics).get(&target).copied(),
                metrics.last_log_index.unwrap_or(0),
                CATCH_UP_LIMIT.as_millis() as u64,
            ) {
                Step::Wait => tokio::time::sleep(LOOK_EVERY).await,
                Step::Elect => break,
                Step::GiveUp(why) => return Err(why),
            }
        }
        match node
            .call_node(
                target,
                Request::Handover { to: target },
                node.inner.rpc_timeout,
            )
            .await
        {
            Ok(Reply::Standing) => {}
            Ok(Reply::Error(e)) => return Err(format!("node {target} refused to stand: {e}")),
            Ok(other) => return Err(format!("node {target} answered {other:?}")),
            Err(e) => return Err(format!("cannot reach node {target}: {e}")),
        }
        let asked_at = Instant::now();
        let term = node.raft().metrics().borrow().current_term;
        loop {
            let m = node.raft().metrics().borrow().clone();
            match m.current_leader {
                Some(l) if l != me => return Ok(l),
                // Leading again in a later term: the target lost, and this node must not keep
                // the other voters' replication held while it leads.
                Some(l) if l == me && m.current_term > term => {
                    return Err(format!(
                        "node {target} stood for election but node {me} was elected again; leadership stays"
                    ))
                }
                _ if asked_at.elapsed() > ELECTION_LIMIT => {
                    return Err(format!(
                        "node {target} stood for election but no other node leads after {} ms",
                        ELECTION_LIMIT.as_millis()
                    ))
                }
                _ => tokio::time::sleep(LOOK_EVERY).await,
            }
        }
    }
    .await;
    node.inner.handover.release();
    if result.is_err() {
        node.standby().release();
    }
    match &result {
        Ok(leader) => tracing::info!(target, leader, "handed leadership over"),
        Err(why) => tracing::warn!(target, %why, "leadership handover failed"),
    }
    result
}

/// The last log index each voter is known to hold, from the leader's replication progress.
fn matched(
    metrics: &openraft::RaftMetrics<NodeId, yard_raft_store::NodeInfo>,
) -> BTreeMap<NodeId, u64> {
    metrics
        .replication
        .iter()
        .flatten()
        .map(|(id, log)| (*id, log.map_or(0, |l| l.index)))
        .collect()
}

impl Node {
    /// The leader (`from`) hands its leadership to `to`: this voter stands for election now if
    /// it is `to` (the leader held replication to the others back so that their leases ran
    /// out), else holds back from standing until `to` leads or [`STANDBY`] passed.
    pub(crate) async fn handle_handover(&self, from: NodeId, to: NodeId) -> Reply {
        let me = self.id();
        if self.known_leader().map(|(l, _)| l) != Some(from) {
            return Reply::Error(format!("node {from} is not the leader node {me} follows"));
        }
        if !self.voter_ids().contains(&me) {
            return Reply::Error(format!("node {me} is not a voter"));
        }
        if to != me {
            self.standby().hold(to);
            tracing::info!(
                leader = from,
                to,
                "the leader hands over: not standing meanwhile"
            );
            return Reply::Standing;
        }
        match self.raft().trigger().elect().await {
            Ok(()) => {
                tracing::info!(
                    leader = from,
                    "standing for election: the leader hands over"
                );
                Reply::Standing
            }
            Err(e) => Reply::Error(format!("cannot stand for election: {e}")),
        }
    }
}
