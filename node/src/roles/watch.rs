//! The member side of an agent's watch: one long-poll per request. The member answers at once
//! with the entries after the agent's index (at most `MAX_BATCH_BYTES` of them), with its
//! tables when its watch log no longer reaches back that far, or after `hold` with nothing.
//!
//! Nothing is buffered per watcher: an agent pulls the next batch only when it has applied the
//! last, so a slow or stopped agent costs its member nothing but the shared watch log, and it
//! resumes from its own index (or a snapshot) whenever it reads again. That is the bounded
//! buffer per watcher, with the bound at one batch.

use std::time::Duration;

use yard_raft_store::watch::Since;

use crate::rpc::{Reply, WatchBatch};
use crate::service::Node;

/// The most entry bytes one answer carries (well under the transport's frame limit; one entry
/// larger than this still goes alone).
pub const MAX_BATCH_BYTES: usize = 4 << 20;

/// The longest a member holds a watch, whatever the agent asks: a watch is also a heartbeat.
pub const MAX_HOLD: Duration = Duration::from_secs(5);

/// Answers one watch poll from log index `from`.
pub async fn serve(node: &Node, from: u64, hold: Duration) -> Reply {
    let feed = node.feed().clone();
    let mut applied = feed.applied_changes();
    let deadline = tokio::time::Instant::now() + hold.min(MAX_HOLD);
    loop {
        // Marked seen before the log is read, so an entry applied in between wakes the wait.
        applied.borrow_and_update();
        match feed.watch_since(from, MAX_BATCH_BYTES) {
            Since::Entries(entries) => return batch(node, None, entries),
            Since::Compacted => {
                let f = feed.clone();
                let encoded = match tokio::task::spawn_blocking(move || f.watch_snapshot()).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return Reply::Error(e),
                    Err(e) => return Reply::Error(format!("snapshot encoding failed: {e}")),
                };
                let (index, snapshot) = encoded;
                let entries = match feed.watch_since(index + 1, MAX_BATCH_BYTES) {
                    Since::Entries(e) => e,
                    Since::UpToDate | Since::Compacted => Vec::new(),
                };
                return batch(node, Some(snapshot), entries);
            }
            Since::UpToDate => {
                if tokio::time::timeout_at(deadline, applied.changed())
                    .await
                    .is_err()
                {
                    return batch(node, None, Vec::new());
                }
            }
        }
    }
}

fn batch(
    node: &Node,
    snapshot: Option<yard_raft_store::watch::Encoded>,
    entries: Vec<yard_raft_store::watch::Encoded>,
) -> Reply {
    let (membership_at, members) = node.membership();
    Reply::Watch(WatchBatch {
        leader: node.known_leader(),
        snapshot,
        entries,
        membership_at,
        members,
    })
}
