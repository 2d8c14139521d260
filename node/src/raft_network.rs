//! openraft's network over a [`Transport`]: each Raft RPC is one request on the shared endpoint,
//! dialled by the target's id so the certificate must name exactly that node.

use std::sync::Arc;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use yard_raft_store::{NodeId, NodeInfo, TypeConfig};

use crate::rpc::{RaftReply, RaftRequest, Reply, Request};
use crate::transport::{Target, Transport, TransportError};

/// Builds one [`PeerLink`] per target.
#[derive(Clone)]
pub struct RaftNet {
    pub transport: Arc<dyn Transport>,
}

impl RaftNetworkFactory<TypeConfig> for RaftNet {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Self::Network {
        PeerLink {
            transport: self.transport.clone(),
            target: Target::node(target, node.addr.clone()),
        }
    }
}

pub struct PeerLink {
    transport: Arc<dyn Transport>,
    target: Target,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>;

impl PeerLink {
    async fn send<E: std::error::Error>(
        &self,
        req: RaftRequest,
        option: &RPCOption,
    ) -> Result<RaftReply, RpcErr<E>> {
        match self
            .transport
            .call(self.target.clone(), Request::Raft(req), option.hard_ttl())
            .await
        {
            Ok(Reply::Raft(Ok(reply))) => Ok(reply),
            Ok(Reply::Raft(Err(failure))) => Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(failure.0),
            ))),
            Ok(other) => Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(format!("unexpected reply to a raft request: {other:?}")),
            ))),
            // Unreachable makes openraft back off instead of hammering a dead peer.
            Err(e @ (TransportError::Unreachable { .. } | TransportError::Timeout { .. })) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

fn mismatch<E: std::error::Error>(reply: RaftReply) -> RpcErr<E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(format!(
        "mismatched raft reply: {reply:?}"
    ))))
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        match self.send(RaftRequest::AppendEntries(rpc), &option).await? {
            RaftReply::AppendEntries(r) => Ok(r),
            other => Err(mismatch(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        match self
            .send(RaftRequest::InstallSnapshot(rpc), &option)
            .await?
        {
            RaftReply::InstallSnapshot(r) => Ok(r),
            other => Err(mismatch(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        match self.send(RaftRequest::Vote(rpc), &option).await? {
            RaftReply::Vote(r) => Ok(r),
            other => Err(mismatch(other)),
        }
    }
}
