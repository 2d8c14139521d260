//! The agent: a host that holds no vote follows the replicated tables through a watch from a
//! Raft member and applies the same entries with the same `apply`, so its actors, its change
//! feed and its local reads are a member's. Writes and linearizable reads go to the leader the
//! watch names (`Node::leader_or_forward`).
//!
//! Which member it follows is `yard_control::follow::ranked`: rendezvous hashing, leader last,
//! members that just failed it after the others. A member that fails a poll is avoided for
//! `AVOID_FOR`; the agent resumes from its own index on the next one, which answers with the
//! entries after it or with a snapshot when its watch log no longer reaches back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use yard_raft_store::{NodeId, StateMachineStore};

use crate::rpc::{Reply, Request, WatchBatch};
use crate::service::Node;
use crate::transport::Target;

/// How long a member that failed a poll is tried after the others.
const AVOID_FOR: Duration = Duration::from_secs(5);
/// The pause after a failed poll, so a lost member is not hammered.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// How an agent follows.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a member may hold a poll when nothing changes (`raft.watch_hold_ms`).
    pub hold: Duration,
    /// Added to `hold` for one poll's deadline.
    pub rpc_timeout: Duration,
    /// Where to start before any member is known (the `--join` address).
    pub seeds: Vec<String>,
}

/// Follows the tables for as long as this host is not a Raft member; a host the autopilot
/// adds as a replica is then fed by Raft, and its applied entries are skipped by index.
pub async fn follow(node: Node, store: StateMachineStore, settings: Settings) {
    let mut avoid: BTreeMap<NodeId, Instant> = BTreeMap::new();
    let mut seed_turn = 0usize;
    let mut following: Option<NodeId> = None;
    loop {
        if node.is_member() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        avoid.retain(|_, at| at.elapsed() < AVOID_FOR);
        let sources = node.watch_sources();
        let leader = node.known_leader().map(|(id, _)| id);
        let avoided: BTreeSet<NodeId> = avoid.keys().copied().collect();
        let ids: BTreeSet<NodeId> = sources.keys().copied().collect();
        let choice = yard_control::follow::ranked(node.id(), &ids, leader, &avoided)
            .first()
            .copied();
        let target = match choice {
            Some(id) => Target::node(id, sources[&id].clone()),
            None if settings.seeds.is_empty() => {
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
            None => {
                seed_turn += 1;
                Target::any(settings.seeds[seed_turn % settings.seeds.len()].clone())
            }
        };
        if choice != following {
            tracing::info!(member = ?choice, addr = %target.addr, "following the tables from a member");
            following = choice;
        }
        let from = node.feed().next_index();
        let req = Request::Watch {
            from,
            hold_ms: settings.hold.as_millis() as u64,
        };
        let outcome = poll(&node, &target, req, &settings).await;
        let failure = match outcome {
            Ok(Reply::Watch(batch)) => match apply(&node, &store, batch).await {
                Ok(()) => continue,
                Err(e) => e,
            },
            Ok(Reply::Error(e)) => e,
            Ok(other) => format!("unexpected reply to a watch: {other:?}"),
            Err(e) => e.to_string(),
        };
        tracing::debug!(member = ?choice, addr = %target.addr, error = %failure, "watch poll failed; trying another member");
        if let Some(id) = choice {
            avoid.insert(id, Instant::now());
        }
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// One poll, nudged: when no answer came `2 * hold` after it was sent, a second poll goes on a
/// new stream and whichever answers first counts. Under 30% loss a single round trip takes
/// longer than the member's `silent_ms` about once in 2,250 polls (QUIC's probe timeouts double
/// per consecutive loss); the second stream makes that about 3 in 10 million, so a lossy link
/// alone does not get a live agent committed dead (`yard_control::host_liveness`).
async fn poll(
    node: &Node,
    target: &Target,
    req: Request,
    settings: &Settings,
) -> Result<Reply, crate::transport::TransportError> {
    let deadline = settings.hold + settings.rpc_timeout;
    let first = node.transport().call(target.clone(), req.clone(), deadline);
    tokio::pin!(first);
    tokio::select! {
        r = &mut first => r,
        () = tokio::time::sleep(settings.hold * 2) => {
            let second = node.transport().call(target.clone(), req, deadline);
            tokio::select! {
                r = &mut first => r,
                r = second => r,
            }
        }
    }
}

async fn apply(node: &Node, store: &StateMachineStore, batch: WatchBatch) -> Result<(), String> {
    if let Some(leader) = batch.leader {
        node.set_agent_leader(leader);
    }
    if let Some(snapshot) = batch.snapshot {
        let s = store.clone();
        let index = tokio::task::spawn_blocking(move || s.install_watched(&snapshot))
            .await
            .map_err(|e| format!("installing a watched snapshot failed: {e}"))??;
        tracing::info!(index, "installed the tables from a member's snapshot");
    }
    if !batch.entries.is_empty() {
        store.apply_watched(&batch.entries)?;
    }
    Ok(())
}
