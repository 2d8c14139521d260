//! The pre-vote gate's loop on this node: reads openraft's state, asks the voters, and sets
//! openraft's `elect` from the [`Gate`]'s effects.

use std::time::Duration;

use openraft::ServerState;
use rand::Rng;
use tokio::sync::mpsc;
use yard_control::prevote::{Effect, Gate, LocalView};
use yard_raft_store::NodeId;

use crate::raft_wait::{is_voter, wait_voting, IDLE_RECHECK};
use crate::rpc::{Reply, Request};
use crate::service::Node;

/// This node's view for a pre-vote, read from openraft.
pub async fn local_view(node: &Node) -> Option<LocalView> {
    let (leader, heard_ms_ago) = node
        .raft()
        .with_raft_state(|s| {
            let leader = s.server_state == ServerState::Leader;
            let following = s.vote_ref().is_committed() && !leader;
            let heard = s
                .vote_last_modified()
                .filter(|_| following)
                .map(|t| t.elapsed().as_millis() as u64);
            (leader, heard)
        })
        .await
        .ok()?;
    Some(LocalView {
        leader,
        heard_ms_ago: node.prevote_watch().heard(heard_ms_ago),
        voters: node.voter_ids(),
    })
}

/// The gate's loop on this node; returns when the task is aborted.
pub async fn run(node: Node) {
    let me = node.id();
    let cfg = super::config_of(node.raft().config());
    let mut gate = Gate::new(cfg, me);
    let (tx, mut rx) = mpsc::channel::<(u64, NodeId, bool)>(64);
    let watch = node.prevote_watch();
    let mut ticker = tokio::time::interval(Duration::from_millis(cfg.round_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let effects = tokio::select! {
            _ = ticker.tick() => {
                if is_voter(&node.raft().metrics().borrow(), me) {
                    let now = watch.tick(&cfg);
                    match local_view(&node).await {
                        Some(view) => gate.tick(now, &view),
                        None => return,
                    }
                } else {
                    // Nothing to gate on a replica or an agent; the watch restarts itself after
                    // the gap once this node votes (`Watch::tick`).
                    wait_voting(node.raft(), me, IDLE_RECHECK).await;
                    Vec::new()
                }
            }
            Some((round, from, granted)) = rx.recv() => gate.answer(round, from, granted, watch.now_ms()),
        };
        // A voter told of a handover to another does not open elections or stand meanwhile
        // (`crate::roles::leader_transfer::Standby`).
        let standing_by = node
            .standby()
            .holds(node.raft().metrics().borrow().current_leader);
        for effect in effects {
            match effect {
                Effect::Elect(true) | Effect::Campaign if standing_by => {
                    tracing::debug!(node = me, "pre-vote: a handover is under way; not standing");
                }
                Effect::Elect(on) => {
                    if on {
                        tracing::info!(
                            node = me,
                            "pre-vote: a majority would vote; elections enabled"
                        );
                    } else {
                        tracing::debug!(node = me, "pre-vote: elections disabled");
                    }
                    node.raft().runtime_config().elect(on);
                }
                Effect::Campaign => {
                    // A random stagger within openraft's own election-timeout spread, so two
                    // nodes that won their pre-votes in the same round rarely split the vote.
                    let spread = node.raft().config().election_timeout_max
                        - node.raft().config().election_timeout_min;
                    let stagger = Duration::from_millis(rand::thread_rng().gen_range(0..=spread));
                    let node = node.clone();
                    let term = node.raft().metrics().borrow().current_term;
                    tokio::spawn(async move {
                        tokio::time::sleep(stagger).await;
                        let m = node.raft().metrics().borrow().clone();
                        // Another node stood meanwhile (this one voted in a newer term or
                        // follows its winner), or this node leads already: nothing to stand for.
                        if m.state == ServerState::Leader || m.current_term != term {
                            return;
                        }
                        if let Err(e) = node.raft().trigger().elect().await {
                            tracing::warn!(error = %e, "pre-vote: cannot stand for election");
                        }
                    });
                }
                Effect::Ask { round, to } => {
                    for voter in to {
                        let (node, tx) = (node.clone(), tx.clone());
                        // An answer later than a round is useless: the next round asks again.
                        let timeout = Duration::from_millis(cfg.round_ms.saturating_mul(2));
                        tokio::spawn(async move {
                            let granted = matches!(
                                node.call_node(voter, Request::PreVote, timeout).await,
                                Ok(Reply::PreVote { granted: true })
                            );
                            let _ = tx.send((round, voter, granted)).await;
                        });
                    }
                }
            }
        }
    }
}
