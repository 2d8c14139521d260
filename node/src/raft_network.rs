//! openraft's network over a [`Transport`]: each Raft RPC is one request on the shared endpoint,
//! dialled by the target's id so the certificate must name exactly that node.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
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
    /// This node's id (openraft's timeout errors name both ends).
    pub id: NodeId,
    /// How long replication to an unreachable peer pauses before trying again. It must stay
    /// well below the election timeout: openraft sends that peer no heartbeat meanwhile, so a
    /// peer that is alive but was briefly unreachable (a handshake lost to congestion) would
    /// stand for election and depose a healthy leader (openraft's default is 500 ms). One
    /// heartbeat interval is what the daemon uses.
    pub retry_after: Duration,
    /// Set while this leader hands its leadership over (`crate::roles::leader_transfer`).
    pub handover: Handover,
}

/// The voter a leader hands over to, while it does: replication to every other voter is held
/// back so that their leader leases run out while the target gets every entry
/// (`yard_control::leader_transfer`). Shared by the node and its Raft network.
#[derive(Clone, Default)]
pub struct Handover(Arc<std::sync::Mutex<Option<NodeId>>>);

impl Handover {
    /// Holds replication to every voter but `target` back until [`Handover::release`].
    pub fn hold(&self, target: NodeId) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(target);
    }

    pub fn release(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether a handover is under way.
    pub fn active(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Waits until no handover is under way, at most `within`.
    pub async fn released(&self, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        while self.active() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Whether replication to `peer` is held back now.
    fn holds(&self, peer: NodeId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|target| target != peer)
    }
}

impl RaftNetworkFactory<TypeConfig> for RaftNet {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Self::Network {
        PeerLink {
            transport: self.transport.clone(),
            id: self.id,
            peer: target,
            target: Target::node(target, node.addr.clone()),
            retry_after: self.retry_after,
            handover: self.handover.clone(),
        }
    }
}

pub struct PeerLink {
    transport: Arc<dyn Transport>,
    id: NodeId,
    peer: NodeId,
    target: Target,
    retry_after: Duration,
    handover: Handover,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>;

impl PeerLink {
    /// Whether replication to this peer is held back by a handover: openraft is told the peer
    /// is unreachable ([`held`]) and retries after its backoff.
    fn is_held(&self) -> bool {
        self.handover.holds(self.peer)
    }

    async fn send<E: std::error::Error>(
        &self,
        action: RPCTypes,
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
            // Unreachable makes openraft back off (`backoff`) instead of hammering a dead peer.
            Err(e @ TransportError::Unreachable { .. }) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            // A slow answer is not a dead peer: the next heartbeat goes out on time. Reported
            // as unreachable, a follower behind a congested link (its answers queued past the
            // RPC timeout, one heartbeat) got no heartbeat for a whole backoff, stood for
            // election and deposed the leader again and again (the probe's slow-link test saw
            // nine terms in half a minute).
            Err(TransportError::Timeout { .. }) => Err(RPCError::Timeout(Timeout {
                action,
                id: self.id,
                target: self.peer,
                timeout: option.hard_ttl(),
            })),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

/// What a replication RPC to `peer` held back by a handover returns.
fn held<E: std::error::Error>(peer: NodeId) -> RpcErr<E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
        "replication to node {peer} is held during a leadership handover"
    ))))
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
        if self.is_held() {
            return Err(held(self.peer));
        }
        match self
            .send(
                RPCTypes::AppendEntries,
                RaftRequest::AppendEntries(rpc),
                &option,
            )
            .await?
        {
            RaftReply::AppendEntries(r) => Ok(r),
            other => Err(mismatch(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        if self.is_held() {
            return Err(held(self.peer));
        }
        match self
            .send(
                RPCTypes::InstallSnapshot,
                RaftRequest::InstallSnapshot(rpc),
                &option,
            )
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
        match self
            .send(RPCTypes::Vote, RaftRequest::Vote(rpc), &option)
            .await?
        {
            RaftReply::Vote(r) => Ok(r),
            other => Err(mismatch(other)),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.retry_after))
    }
}
