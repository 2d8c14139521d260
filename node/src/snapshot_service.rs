//! `yard snapshot save` on the node: the tables at one revision, read linearizably (from the
//! leader, or an agent's local copy once it has caught up with the leader's read index) and
//! encoded as a snapshot file (`yard_raft_store::backup`) off the runtime and off the lock.

use crate::rpc::{AdminReply, AdminRequest, Reply};
use crate::service::Node;

impl Node {
    pub(crate) async fn snapshot_save(&self, forwarded: bool, req: &AdminRequest) -> Reply {
        let cluster = self.inner.cluster.clone();
        // The reply crosses one or two hops, each bounded by the frame limit (less the reply's
        // own framing).
        let max = (self.inner.max_frame as usize).saturating_sub(4096);
        self.read_then(forwarded, req, Clone::clone, |data| {
            let cluster = cluster.clone();
            async move {
                let bytes = tokio::task::spawn_blocking(move || {
                    yard_raft_store::backup::encode_backup(&cluster, &data)
                })
                .await
                .map_err(|e| Reply::Error(format!("the snapshot's encoding failed: {e}")))?
                .map_err(|e| Reply::Error(e.to_string()))?;
                if bytes.len() > max {
                    return Err(Reply::Error(format!(
                        "the snapshot is {} bytes, more than one reply may carry ({max}); raise transport.max_frame_bytes on the nodes",
                        bytes.len()
                    )));
                }
                Ok(AdminReply::Snapshot(bytes))
            }
        })
        .await
    }
}
