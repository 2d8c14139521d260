//! The agent: a host that holds no vote follows the replicated tables through a watch from a
//! Raft member and applies the same entries with the same `apply`, so its actors, its change
//! feed and its local reads are a member's. Writes and linearizable reads go to the leader the
//! watch names (`Node::leader_or_forward`).
//!
//! Which member it follows is `yard_control::follow::Follower`: rendezvous hashing, leader
//! last, the member that answered last kept, failed members avoided for a doubling time. The
//! agent resumes from its own index on whichever member answers, which sends the entries after
//! it or a snapshot when its watch log no longer reaches back.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use yard_control::follow::{
    leaderless_ms, member_check_due, removed_while_away, seeds_to_remember, Follower,
};
use yard_raft_store::{NodeId, StateMachineStore};

use crate::rpc::{Reply, Request, WatchBatch};
use crate::service::Node;
use crate::transport::Target;

/// The pause after a failed poll, so a lost member is not hammered.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// How an agent follows.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a member may hold a poll when nothing changes (`liveness.hold_ms`).
    pub hold: Duration,
    /// Added to `hold` for one poll's deadline.
    pub rpc_timeout: Duration,
    /// The shortest time between two polls that brought entries (`raft.watch_pace_ms`): a
    /// busy cluster's writes reach an agent in batches of this period, not one poll per
    /// commit, so each agent costs its member at most `1000 / pace` polls a second.
    pub pace: Duration,
    /// Where to start before any member is known (the `--join` address, or what a restarted
    /// agent remembered).
    pub seeds: Vec<String>,
    /// Where the agent writes the seeds its next start should use (`seeds_to_remember`)
    /// whenever the members it follows change.
    pub remember: PathBuf,
}

/// Runs on every host: follows the tables whenever this host is not a Raft member (a host the
/// autopilot adds as a replica is then fed by Raft, and the entries its watch had applied are
/// skipped by index; one it drops follows again). A host Raft still calls a member asks now and
/// then whether it was removed while it was away (`member_check_due`), and follows as an agent
/// when a member's answer shows so.
pub async fn follow(node: Node, store: StateMachineStore, settings: Settings) {
    let epoch = Instant::now();
    let mut follower = Follower::default();
    let mut seed_turn = 0usize;
    let mut following: Option<NodeId> = None;
    let mut checked: Option<Instant> = None;
    let mut paced = false;
    let mut polled_at = tokio::time::Instant::now();
    let mut remembered = settings.seeds.clone();
    loop {
        let mut hold = settings.hold;
        let mut checking = false;
        if node.is_member() {
            let voter = node.voter_ids().contains(&node.id());
            let Some(view) = crate::prevote::gate::local_view(&node).await else {
                return;
            };
            let quorum_ack = node.raft().metrics().borrow().millis_since_quorum_ack;
            let leaderless = leaderless_ms(view.leader, view.heard_ms_ago, quorum_ack);
            let since_check = checked.map(|at: Instant| at.elapsed().as_millis() as u64);
            if !member_check_due(voter, leaderless, since_check) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            checked = Some(Instant::now());
            hold = Duration::ZERO;
            checking = true;
        }
        let now_ms = epoch.elapsed().as_millis() as u64;
        let sources = node.watch_sources();
        let leader = node.known_leader().map(|(id, _)| id);
        let ids: BTreeSet<NodeId> = sources.keys().copied().collect();
        let (primary, backup) = match follower.targets(node.id(), &ids, leader, now_ms) {
            Some(t) => (
                (
                    Some(t.primary),
                    Target::node(t.primary, sources[&t.primary].clone()),
                ),
                (
                    Some(t.backup),
                    Target::node(t.backup, sources[&t.backup].clone()),
                ),
            ),
            None if settings.seeds.is_empty() => {
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
            None => {
                seed_turn += 1;
                let seed = Target::any(settings.seeds[seed_turn % settings.seeds.len()].clone());
                ((None, seed.clone()), (None, seed))
            }
        };
        if std::mem::take(&mut paced) {
            tokio::time::sleep_until(polled_at + settings.pace).await;
        }
        polled_at = tokio::time::Instant::now();
        let from = node.feed().next_index();
        let req = Request::Watch {
            from,
            hold_ms: hold.as_millis() as u64,
        };
        let (answered_by, outcome) = poll(&node, [&primary, &backup], req, &settings).await;
        let now_ms = epoch.elapsed().as_millis() as u64;
        let failure = match outcome {
            Ok(Reply::Watch(batch)) => {
                if checking {
                    let (mine_at, _) = node.membership();
                    if !removed_while_away(node.id(), mine_at, batch.membership_at, &batch.members)
                    {
                        // Still a member, or the answer is no newer: Raft catches it up.
                        continue;
                    }
                    tracing::warn!(
                        membership_at = batch.membership_at,
                        "this host was removed from raft's membership while it was away; it follows the tables as an agent"
                    );
                }
                // A small batch means the agent is caught up and writes are streaming in:
                // wait out the pace so the next batch carries more of them. A large one (or a
                // snapshot) means it is behind: ask again at once.
                let bytes: usize = batch.entries.iter().map(|e| e.len()).sum();
                paced = !batch.entries.is_empty()
                    && batch.snapshot.is_none()
                    && bytes < crate::roles::watch::MAX_BATCH_BYTES / 2;
                apply(&node, &store, batch).await.err()
            }
            Ok(Reply::Error(e)) => Some(e),
            Ok(other) => Some(format!("unexpected reply to a watch: {other:?}")),
            Err(e) => Some(e.to_string()),
        };
        let (member, addr) = if answered_by == 0 { &primary } else { &backup };
        match (failure, member) {
            (None, Some(m)) => {
                if answered_by == 1 && primary.0 != Some(*m) {
                    // The primary did not answer within two holds: slower than its backup.
                    if let Some(p) = primary.0 {
                        follower.failed(p, now_ms);
                    }
                }
                follower.answered(*m);
                if !node.is_member() {
                    remember(&settings.remember, &node, &settings.seeds, &mut remembered).await;
                }
                if following != Some(*m) {
                    tracing::info!(member = m, addr = %addr.addr, "following the tables from a member");
                    following = Some(*m);
                }
            }
            (None, None) => {}
            (Some(e), m) => {
                tracing::debug!(member = ?m, addr = %addr.addr, error = %e, "watch poll failed; trying another member");
                if let Some(m) = m {
                    follower.failed(*m, now_ms);
                }
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

/// Writes the seeds a restart should use when they differ from the ones last written; a
/// failed write is logged and tried again after the next poll.
async fn remember(
    path: &std::path::Path,
    node: &Node,
    started_with: &[String],
    last: &mut Vec<String>,
) {
    let seeds = seeds_to_remember(&node.watch_sources(), started_with);
    if seeds.is_empty() || seeds == *last {
        return;
    }
    let (path, contents) = (path.to_owned(), seeds.join("\n") + "\n");
    let write = tokio::task::spawn_blocking(move || {
        crate::tls::write_file(&path, contents.as_bytes(), false).map_err(|e| e.to_string())
    });
    match write.await.map_err(|e| e.to_string()).and_then(|r| r) {
        Ok(()) => {
            tracing::info!(?seeds, "remembered the members for the next start");
            *last = seeds;
        }
        Err(error) => tracing::warn!(%error, "cannot remember the members for the next start"),
    }
}

/// One poll, nudged: when no answer came `2 * hold` after it was sent to the first target, a
/// second poll goes on a new stream to the second (another member, when there is one) and
/// whichever answers first counts; returns which (0 or 1) and its outcome. Under 30% loss a
/// single round trip takes longer than the member's `silent_ms` about once in 2,250 polls
/// (QUIC's probe timeouts double per consecutive loss); the second stream makes that about 3
/// in 10 million (`yard_control::host_liveness`), and a dead member costs the agent two holds,
/// not a timeout.
async fn poll(
    node: &Node,
    targets: [&(Option<NodeId>, Target); 2],
    req: Request,
    settings: &Settings,
) -> (usize, Result<Reply, crate::transport::TransportError>) {
    let deadline = settings.hold + settings.rpc_timeout;
    let first = node
        .transport()
        .call(targets[0].1.clone(), req.clone(), deadline);
    tokio::pin!(first);
    tokio::select! {
        r = &mut first => (0, r),
        () = tokio::time::sleep(settings.hold * 2) => {
            let second = node.transport().call(targets[1].1.clone(), req, deadline);
            tokio::select! {
                r = &mut first => (0, r),
                r = second => (1, r),
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
        let applied = store.apply_watched(&batch.entries)?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for stamp in applied.stamps_unix_ms {
            crate::metrics::METRICS
                .watch_visible
                .observe(now_ms.saturating_sub(stamp) as f64 / 1000.0);
        }
    }
    Ok(())
}
