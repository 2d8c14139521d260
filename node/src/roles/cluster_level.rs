//! The leader raises the cluster level (`yard_raft_store::version`) once every host runs a
//! release of that level. The decision is `version::next_level`; this loop only asks the hosts
//! and proposes what it decides.
//!
//! Asking costs one small request per host, so the leader asks only while the cluster is below
//! this release's level (during and just after a rolling upgrade), every [`ASK_EVERY`], with
//! at most [`IN_FLIGHT`] requests at a time. Hosts the cluster knows are dead are not asked:
//! a host that comes back must come back on a release of the cluster's level.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use openraft::ServerState;
use yard_raft_store::version::{self, Raise};
use yard_raft_store::{Command, NodeId};

use crate::rpc::{Reply, Request};
use crate::service::Node;

/// How often the leader asks the hosts while the cluster is below this release's level.
pub const ASK_EVERY: Duration = Duration::from_secs(3);
/// Requests in flight at once.
const IN_FLIGHT: usize = 64;
/// How long one host has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// Runs on every node; works only while it leads and the cluster is below [`version::LEVEL`].
pub async fn run(node: Node) {
    let mut held: Option<Vec<(NodeId, Option<u32>)>> = None;
    loop {
        let raft = node.raft().clone();
        if raft.metrics().borrow().state != ServerState::Leader {
            crate::raft_wait::wait_leading(&raft, crate::raft_wait::IDLE_RECHECK).await;
            continue;
        }
        let current = node.feed().read(|d| d.cluster_level);
        if current >= version::LEVEL {
            // Nothing to ask until a leader of a later release takes over.
            tokio::time::sleep(ASK_EVERY * 10).await;
            continue;
        }
        let answers = ask_hosts(&node).await;
        match version::next_level(current, &answers) {
            Raise::Done => {}
            Raise::To(level) => {
                match raft.client_write(Command::SetClusterLevel { level }).await {
                    Ok(_) => tracing::info!(
                        from = current,
                        to = level,
                        hosts = answers.len(),
                        "every host runs a release of this level; raised the cluster level"
                    ),
                    Err(e) => tracing::warn!(error = %e, level, "raising the cluster level failed"),
                }
                held = None;
            }
            Raise::Hold(behind) => {
                if held.as_ref() != Some(&behind) {
                    tracing::info!(
                        level = current,
                        release = version::LEVEL,
                        behind = ?behind,
                        "the cluster level stays: these hosts run an earlier release or did not answer"
                    );
                    held = Some(behind);
                }
            }
        }
        tokio::time::sleep(ASK_EVERY).await;
    }
}

/// Every host's release level from the tables' hosts and the Raft members, skipping hosts
/// known dead and revoked ids: `None` for a host that did not answer. A host that cannot decode
/// the question runs a release from before levels: level 0.
async fn ask_hosts(node: &Node) -> BTreeMap<NodeId, Option<u32>> {
    let mut ids: Vec<NodeId> = node.feed().read(|d| {
        d.nodes
            .keys()
            .filter(|id| !d.hosts_down.contains(id) && !d.revoked.contains(id))
            .copied()
            .collect()
    });
    ids.extend(node.member_ids());
    ids.sort_unstable();
    ids.dedup();
    futures::stream::iter(ids)
        .map(|id| {
            let node = node.clone();
            async move {
                let reply = node.call_node(id, Request::Level, ANSWER_WITHIN).await;
                (id, level_of(reply))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await
}

/// A host's release level from its answer to [`Request::Level`].
pub(crate) fn level_of(reply: Result<Reply, String>) -> Option<u32> {
    match reply {
        Ok(Reply::Level { release, .. }) => Some(release),
        Ok(Reply::Error(e)) if crate::frame::is_undecodable(&e) => Some(0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_release_that_cannot_decode_the_question_is_level_0() {
        let undecodable = crate::frame::FrameError::Decode("unexpected variant".into()).to_string();
        assert_eq!(level_of(Ok(Reply::Error(undecodable))), Some(0));
        assert_eq!(
            level_of(Ok(Reply::Level {
                release: 1,
                cluster: 0
            })),
            Some(1)
        );
        // Any other refusal or a timeout says nothing about the release.
        assert_eq!(level_of(Ok(Reply::Error("node 4 is revoked".into()))), None);
        assert_eq!(level_of(Err("timed out".into())), None);
    }
}
