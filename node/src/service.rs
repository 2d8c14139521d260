//! What a node does with each request: authorise it by the peer's role, then serve it from the
//! local Raft (reads through `ensure_linearizable`, writes through `client_write`) or forward it
//! to the leader, so a client never needs to know who leads.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
use openraft::{ChangeMembers, ServerState};
use rand::Rng;
use yard_actors::health::HealthRegistry;
use yard_actors::liveness::Reachability;
use yard_raft_store::{
    ChangeFeed, Command, JoinToken, NodeId, NodeInfo, NodeMeta, Raft, Response, SessionTag,
};

use crate::admin_actor::ServeAdmin;
use crate::batcher::{BatchError, WriteBatcher};
use crate::gateway_control::GatewayControl;
use crate::metrics::{GaugeSource, METRICS};
use crate::roles::{host_meta, role_named};
use crate::rpc::{
    ActorHealth, AdminReply, AdminRequest, JoinRequest, KvEntry, MemberStatus, RaftFailure,
    RaftReply, RaftRequest, RedeemRequest, Reply, Request, Status,
};
use crate::tls::{CertAuthority, PeerRole};
use crate::transport::{BoxFut, Handler, Target, Transport, TransportError};
use yard_actors::gateway::actor::GatewayView;
use yard_control::roles::Role;

/// Everything a node's request handling needs.
pub struct NodeParts {
    pub id: NodeId,
    pub name: String,
    pub cluster: String,
    pub addr: String,
    pub raft: Raft,
    pub feed: ChangeFeed,
    pub transport: Arc<dyn Transport>,
    /// Present on nodes that hold `ca.key`: only they can sign certificates for token joins.
    pub ca: Option<Arc<CertAuthority>>,
    pub ca_hash: String,
    pub rpc_timeout: Duration,
    /// How long a request waits for a leader to appear before giving up.
    pub leader_wait: Duration,
    pub health: HealthRegistry,
    pub reachability: Reachability,
    /// Gateway leases and placement (acts only while this node leads).
    pub gateway: Arc<GatewayControl>,
    /// The analyzer (acts only while this node leads).
    pub diagnosis: Arc<crate::diagnosis_control::DiagnosisControl>,
    /// This host's failure domain (`node.zone`; empty: none).
    pub zone: String,
    /// The voter and replica counts the leader keeps (`raft.voters`, `raft.replicas`).
    pub roles: yard_control::roles::RolesConfig,
    /// Agents' liveness (`[liveness]` hold_ms, silent_ms, …).
    pub host_liveness: yard_control::host_liveness::LivenessConfig,
}

/// A running node's request handler. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeParts>,
    writes: WriteBatcher,
    /// The admin actor, once the actor system runs; operators' requests go through it.
    admin: Arc<std::sync::OnceLock<actix::Recipient<ServeAdmin>>>,
    /// This node's gateway data plane, when the gateway is enabled here.
    gateway_view: Arc<std::sync::OnceLock<GatewayView>>,
    /// This node's probe, when it runs.
    probe_view: Arc<std::sync::OnceLock<yard_actors::probe::socket::SharedProbe>>,
    /// How long the pre-vote gate has been watching (`crate::prevote::Watch`).
    prevote_watch: Arc<crate::prevote::SharedWatch>,
    /// This node's aggregator, when it aggregates.
    agg_view: Arc<std::sync::OnceLock<yard_actors::aggregator::actor::AggView>>,
    /// The job limits this node checks creations against when it leads.
    agg_quota: Arc<std::sync::OnceLock<yard_raft_store::aggregation::Quota>>,
    /// On an agent: the leader its watch last named (a member reads it from Raft instead).
    agent_leader: Arc<std::sync::Mutex<Option<(NodeId, NodeInfo)>>>,
    /// The autopilot's latest reason, for `yard members`.
    autopilot_reason: Arc<std::sync::Mutex<String>>,
    /// What this node judges of the agents it serves, and the reports it takes as leader.
    host_liveness: Arc<crate::roles::liveness::HostLiveness>,
}

enum Attempt<T> {
    Done(T),
    /// Not the leader: where to forward, if a leader is known.
    Forward(Option<(NodeId, NodeInfo)>),
    /// A tagged write was proposed here but leadership was lost under it: it may still commit,
    /// so it is sent again (to whoever leads now) and can no longer be answered "not applied".
    Unknown,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn entry(key: &str, v: &yard_raft_store::Versioned) -> KvEntry {
    KvEntry {
        key: key.to_owned(),
        value: v.value.clone(),
        revision: v.revision,
    }
}

/// Client-write proposals the leader keeps in Raft at once (see `batcher`). openraft 0.9's
/// core flushes each proposal's log append before it takes the next and replicates one
/// payload per follower at a time, so every proposal costs an fsync and a round of
/// AppendEntries on each node: one at a time makes each proposal carry everything that queued
/// while the previous one committed (about 7 writes with 16 clients, against 4.5 with two in
/// flight). Measured with `kv-vs-etcd --rounds 2 --kill-trials 0 --cli-trials 0 --ops 6000`
/// (one runtime worker, two runs each, interleaved): 3,300 puts/s with one, 2,300 with two;
/// with eight the CPU went to fsyncs (1.14x etcd against 1.45x with two, an earlier run).
const PROPOSALS_IN_FLIGHT: usize = 1;

/// The most client writes one proposal carries.
const MAX_WRITES_PER_PROPOSAL: usize = 512;

impl Node {
    /// Wraps the parts; must run inside a tokio runtime (it starts the write batcher).
    pub fn new(parts: NodeParts) -> Self {
        let host_liveness = Arc::new(crate::roles::liveness::HostLiveness::new(
            parts.host_liveness.clone(),
        ));
        let writes = WriteBatcher::start(
            parts.raft.clone(),
            PROPOSALS_IN_FLIGHT,
            MAX_WRITES_PER_PROPOSAL,
        );
        Self {
            inner: Arc::new(parts),
            writes,
            admin: Arc::default(),
            gateway_view: Arc::default(),
            probe_view: Arc::default(),
            prevote_watch: Arc::default(),
            agg_view: Arc::default(),
            agg_quota: Arc::default(),
            agent_leader: Arc::default(),
            host_liveness,
            autopilot_reason: Arc::default(),
        }
    }

    /// The voter and replica counts this node keeps when it leads.
    pub fn roles(&self) -> &yard_control::roles::RolesConfig {
        &self.inner.roles
    }

    /// Records the autopilot's latest reason.
    pub fn set_autopilot_reason(&self, reason: String) {
        *self
            .autopilot_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// The autopilot's latest reason (empty on a node that has not led).
    pub fn autopilot_reason(&self) -> String {
        self.autopilot_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether a host the leader has not committed dead (`Command::HostLiveness`).
    pub fn host_alive(&self, id: NodeId) -> bool {
        !self.inner.feed.read(|d| d.hosts_down.contains(&id))
    }

    /// This node's part in hosts' liveness.
    pub fn host_liveness(&self) -> &Arc<crate::roles::liveness::HostLiveness> {
        &self.host_liveness
    }

    /// The transport this node calls others with.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.transport
    }

    /// Whether this host is a Raft member (voter or replica). Otherwise it is an agent, or
    /// not yet part of a cluster: it holds no vote and follows the tables through a watch.
    pub fn is_member(&self) -> bool {
        let me = self.inner.id;
        self.with_membership(|m| m.get_node(&me).is_some())
    }

    /// The leader this node knows of, with its address: Raft's on a member, the watch's on an
    /// agent.
    pub fn known_leader(&self) -> Option<(NodeId, NodeInfo)> {
        if self.is_member() {
            let leader = self.inner.raft.metrics().borrow().current_leader?;
            return self.member(leader).map(|n| (leader, n));
        }
        self.agent_leader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the leader an agent's watch named.
    pub fn set_agent_leader(&self, leader: (NodeId, NodeInfo)) {
        *self.agent_leader.lock().unwrap_or_else(|e| e.into_inner()) = Some(leader);
    }

    /// The members an agent may follow (every Raft member but this host), with their addresses.
    pub fn watch_sources(&self) -> std::collections::BTreeMap<NodeId, String> {
        let me = self.inner.id;
        self.with_membership(|m| {
            m.nodes()
                .filter(|(id, _)| **id != me)
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        })
    }

    /// The pre-vote gate's watch, shared by its loop and the `PreVote` handler.
    pub fn prevote_watch(&self) -> &crate::prevote::SharedWatch {
        &self.prevote_watch
    }

    /// Shows this node's gateway data plane in stats and metrics from now on.
    pub fn attach_gateway(&self, view: GatewayView) {
        let _ = self.gateway_view.set(view);
    }

    /// The leader-side gateway control.
    pub fn gateway(&self) -> &Arc<GatewayControl> {
        &self.inner.gateway
    }

    /// Shows this node's probe in metrics from now on.
    pub fn attach_probe(&self, probe: yard_actors::probe::socket::SharedProbe) {
        let _ = self.probe_view.set(probe);
    }

    pub(crate) fn probe_view(&self) -> Option<&yard_actors::probe::socket::SharedProbe> {
        self.probe_view.get()
    }

    /// The leader-side analyzer.
    pub fn diagnosis(&self) -> &Arc<crate::diagnosis_control::DiagnosisControl> {
        &self.inner.diagnosis
    }

    pub(crate) fn gateway_view(&self) -> Option<&GatewayView> {
        self.gateway_view.get()
    }

    /// Shows this node's aggregator in stats and metrics from now on.
    pub fn attach_aggregator(&self, view: yard_actors::aggregator::actor::AggView) {
        let _ = self.agg_view.set(view);
    }

    pub(crate) fn agg_view(&self) -> Option<&yard_actors::aggregator::actor::AggView> {
        self.agg_view.get()
    }

    /// Sets the limits job creations are checked against (the `[aggregator]` config).
    pub fn set_agg_quota(&self, quota: yard_raft_store::aggregation::Quota) {
        let _ = self.agg_quota.set(quota);
    }

    pub(crate) fn agg_quota(&self) -> yard_raft_store::aggregation::Quota {
        self.agg_quota
            .get()
            .copied()
            .unwrap_or(yard_raft_store::aggregation::Quota {
                job_bytes: 256 << 20,
                cluster_bytes: 4096 << 20,
            })
    }

    /// The leader's reachability view (empty on a follower).
    pub fn reachability(&self) -> std::collections::BTreeMap<NodeId, bool> {
        self.inner.reachability.snapshot()
    }

    /// Routes operators' requests through the admin actor from now on.
    pub fn attach_admin(&self, admin: actix::Recipient<ServeAdmin>) {
        let _ = self.admin.set(admin);
    }

    /// Serves one operator request (what the admin actor runs).
    pub async fn serve_admin(&self, req: AdminRequest) -> Reply {
        self.handle_admin(false, None, req).await
    }

    /// Serves `req` through the door an admin peer's requests take: the admin actor's
    /// admission gate (at most `admin.max_in_flight` at once, the rest refused "busy"), when
    /// the actor runs. Local peers without certificates (the aggregation agent's workers) come
    /// in here, so that a flood of them is admitted like a flood of operators, not served
    /// unbounded.
    pub async fn serve_admitted(&self, req: AdminRequest) -> Reply {
        match self.admin.get() {
            Some(actor) => actor
                .send(ServeAdmin(req))
                .await
                .unwrap_or_else(|_| Reply::Error("the admin actor is not running".into())),
            None => self.serve_admin(req).await,
        }
    }

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    pub fn feed(&self) -> &ChangeFeed {
        &self.inner.feed
    }

    /// Reads the membership in force: Raft's own view, or the one in the tables when they
    /// are newer (on an agent, whose Raft never hears from the leader, they always are).
    fn with_membership<T>(
        &self,
        f: impl FnOnce(&openraft::Membership<NodeId, NodeInfo>) -> T,
    ) -> T {
        let raft = self.inner.raft.metrics().borrow().membership_config.clone();
        let raft_at = *raft.log_id();
        self.inner.feed.read(|d| {
            if d.last_membership.log_id() > &raft_at {
                f(d.last_membership.membership())
            } else {
                f(raft.membership())
            }
        })
    }

    /// A member's address and name, from the membership in force.
    pub fn member(&self, id: NodeId) -> Option<NodeInfo> {
        self.with_membership(|m| m.get_node(&id).cloned())
    }

    /// The voters of the membership in force (both halves of a joint configuration).
    pub fn voter_ids(&self) -> BTreeSet<NodeId> {
        self.with_membership(|m| m.voter_ids().collect())
    }

    /// Sends `req` to node `id` as this node (straight to its own handler when `id` is this
    /// node) and returns the reply, or why there is none.
    pub async fn call_node(
        &self,
        id: NodeId,
        req: Request,
        timeout: Duration,
    ) -> Result<Reply, String> {
        if id == self.inner.id {
            return Ok(self.handle(PeerRole::Node(id), req).await);
        }
        let addr = self
            .member(id)
            .map(|n| n.addr)
            .or_else(|| {
                self.inner
                    .feed
                    .read(|d| d.nodes.get(&id).map(|n| n.addr.clone()))
            })
            .ok_or_else(|| format!("node {id} is not in the membership"))?;
        self.inner
            .transport
            .call(Target::node(id, addr), req, timeout)
            .await
            .map_err(|e| e.to_string())
    }

    /// Whether `id` is a host of this cluster: a Raft member or an agent in the hosts table.
    pub fn is_host(&self, id: NodeId) -> bool {
        self.member(id).is_some() || self.inner.feed.read(|d| d.nodes.contains_key(&id))
    }

    /// Every member's id (voters and learners).
    pub fn member_ids(&self) -> BTreeSet<NodeId> {
        self.with_membership(|m| m.nodes().map(|(id, _)| *id).collect())
    }

    /// Initialises a one-node cluster of this node unless the store already belongs to one.
    pub async fn bootstrap(&self) -> Result<(), String> {
        let p = &self.inner;
        if p.raft.is_initialized().await.map_err(|e| e.to_string())? {
            tracing::info!("store already initialised; not bootstrapping again");
            return Ok(());
        }
        let node = NodeInfo {
            addr: p.addr.clone(),
            name: p.name.clone(),
        };
        p.raft
            .initialize(std::collections::BTreeMap::from([(p.id, node)]))
            .await
            .map_err(|e| format!("bootstrap failed: {e}"))?;
        self.write_until_leader(Command::SetNode(self.meta()))
            .await?;
        tracing::info!(id = p.id, "bootstrapped a one-node cluster");
        Ok(())
    }

    fn meta(&self) -> NodeMeta {
        host_meta(
            self.inner.id,
            &self.inner.name,
            &self.inner.addr,
            &self.inner.zone,
            Role::Voter,
        )
    }

    /// Joins the cluster through any member at `seed`; retries until `deadline` passes.
    /// Returns the role the cluster gave this host.
    pub async fn join(&self, seed: &str, deadline: Duration) -> Result<Role, String> {
        let p = &self.inner;
        if p.raft.is_initialized().await.map_err(|e| e.to_string())? {
            tracing::info!("store already belongs to a cluster; not joining again");
            return Ok(Role::Voter);
        }
        let req = JoinRequest {
            id: p.id,
            name: p.name.clone(),
            addr: p.addr.clone(),
            zone: p.zone.clone(),
        };
        let start = Instant::now();
        loop {
            let timeout = p.rpc_timeout.max(Duration::from_secs(30));
            let err = match p
                .transport
                .call(Target::any(seed), Request::Join(req.clone()), timeout)
                .await
            {
                Ok(Reply::Joined { leader, role }) => {
                    tracing::info!(seed, leader, %role, "joined the cluster");
                    return role_named(&role);
                }
                Ok(Reply::Error(e)) => e,
                Ok(other) => format!("unexpected reply {other:?}"),
                Err(e) => e.to_string(),
            };
            if start.elapsed() > deadline {
                return Err(format!("could not join through {seed}: {err}"));
            }
            tracing::warn!(seed, error = %err, "join attempt failed; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Proposes `cmd`, waiting out an election if there is no leader yet (used at bootstrap).
    async fn write_until_leader(&self, cmd: Command) -> Result<Response, String> {
        let start = Instant::now();
        loop {
            match self.inner.raft.client_write(cmd.clone()).await {
                Ok(resp) => return Ok(resp.data),
                Err(e) if start.elapsed() < Duration::from_secs(10) => {
                    tracing::debug!(error = %e, "waiting for leadership");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Runs `local` on this node, or forwards `req` to the leader when this node does not lead.
    /// A request that was itself forwarded is never forwarded again (no loops): the original
    /// forwarder retries instead. Everything happens within `leader_wait`: a request is never
    /// re-sent after its client has given up, and a write proposed here that does not commit in
    /// time (this node may be a deposed leader behind a partition) is answered as unknown.
    ///
    /// Reads and session-tagged writes (`tag`) are safe to send again: a forward to a leader
    /// that this node sees replaced (or gone) is abandoned at once and retried on the new one,
    /// rather than waiting out the RPC timeout on a dead leader, and an unknown outcome there is
    /// retried too. Only untagged writes can still answer "unknown".
    async fn leader_or_forward<T, F, Fut>(
        &self,
        forwarded: bool,
        tag: Option<SessionTag>,
        req: &AdminRequest,
        local: F,
    ) -> Reply
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, Reply>>,
        T: Into<AdminReply>,
    {
        let p = &self.inner;
        let start = Instant::now();
        let retry_safe = req.is_read_only() || tag.is_some();
        // Whether an earlier attempt of this write may have reached a leader: then giving up
        // must answer "unknown", never "not applied".
        let mut maybe_applied = false;
        let gave_up = |maybe_applied: bool| {
            let msg = format!(
                "no leader answered within {} ms; is a majority of the cluster up?",
                p.leader_wait.as_millis()
            );
            if maybe_applied && !req.is_read_only() {
                Reply::Indefinite(format!("{msg} (an earlier attempt may have applied)"))
            } else {
                Reply::Error(msg)
            }
        };
        loop {
            let remaining = p.leader_wait.saturating_sub(start.elapsed());
            // An agent holds no copy Raft would let it write or read linearizably: it forwards
            // to the leader its watch names.
            let attempt = if self.is_member() || forwarded {
                tokio::time::timeout(remaining, local()).await
            } else {
                Ok(Ok(Attempt::Forward(self.known_leader())))
            };
            let leader = match attempt {
                Ok(Ok(Attempt::Done(r))) => return Reply::Admin(r.into()),
                Ok(Ok(Attempt::Forward(leader))) => leader,
                Ok(Ok(Attempt::Unknown)) => {
                    maybe_applied = true;
                    None
                }
                Ok(Err(reply)) => return reply,
                Err(_) if req.is_read_only() => return gave_up(false),
                Err(_) => {
                    return Reply::Indefinite(format!(
                        "the write was proposed but not committed within {} ms, so its outcome is unknown",
                        p.leader_wait.as_millis()
                    ))
                }
            };
            // A forward is what makes a request take effect elsewhere: never after the deadline.
            if start.elapsed() > p.leader_wait {
                return gave_up(maybe_applied);
            }
            if let Some((id, node)) = leader.filter(|(id, _)| *id != p.id) {
                if forwarded {
                    return Reply::Error(format!("node {} is not the leader; node {id} is", p.id));
                }
                METRICS.forwarded.inc();
                let _forward_timer = METRICS.forward_latency.start_timer();
                let request = match tag {
                    Some(tag) => Request::AdminOnce {
                        tag,
                        req: req.clone(),
                    },
                    None => Request::Admin(req.clone()),
                };
                let call =
                    p.transport
                        .call(Target::node(id, node.addr.clone()), request, p.rpc_timeout);
                let outcome = if retry_safe {
                    // Only a change seen from now on counts: metrics published a moment late
                    // must not abandon a forward the moment it starts.
                    let mut metrics = p.raft.metrics();
                    metrics.borrow_and_update();
                    let leader_replaced = async move {
                        while metrics.changed().await.is_ok() {
                            if metrics.borrow_and_update().current_leader != Some(id) {
                                return;
                            }
                        }
                        std::future::pending::<()>().await
                    };
                    tokio::select! {
                        outcome = call => Some(outcome),
                        () = leader_replaced => None,
                    }
                } else {
                    Some(call.await)
                };
                let Some(outcome) = outcome else {
                    maybe_applied = true;
                    METRICS.forward_retries.inc();
                    tracing::debug!(
                        leader = id,
                        "the leader changed under a forwarded request; retrying on the new one"
                    );
                    continue;
                };
                match outcome {
                    Ok(reply @ Reply::Admin(_)) => return reply,
                    // The write carries its session: sending it again cannot apply it twice.
                    Ok(Reply::Indefinite(e)) if tag.is_some() => {
                        maybe_applied = true;
                        METRICS.forward_retries.inc();
                        tracing::debug!(leader = id, error = %e, "forwarded write's outcome unknown; retrying it")
                    }
                    Ok(reply @ Reply::Indefinite(_)) => return reply,
                    // A refusal (e.g. "not the leader"): nothing happened, so trying again is safe.
                    Ok(Reply::Error(e)) => {
                        tracing::debug!(leader = id, error = %e, "forwarded request refused")
                    }
                    Ok(other) => {
                        return Reply::Error(format!("unexpected reply from the leader: {other:?}"))
                    }
                    // Never sent: safe to try again.
                    Err(e @ TransportError::Unreachable { .. }) => {
                        tracing::debug!(leader = id, error = %e, "leader unreachable")
                    }
                    // A read changes nothing and a tagged write applies at most once, so asking
                    // again (the leader may have changed) is safe.
                    Err(e) if retry_safe => {
                        maybe_applied = true;
                        METRICS.forward_retries.inc();
                        tracing::debug!(leader = id, error = %e, "leader did not answer; retrying")
                    }
                    // A write may have been applied: retrying could apply it twice.
                    Err(e) => {
                        return Reply::Indefinite(format!(
                            "the leader did not answer, so the outcome is unknown: {e}"
                        ))
                    }
                }
            }
            if start.elapsed() > p.leader_wait {
                return gave_up(maybe_applied);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) async fn write(&self, forwarded: bool, req: &AdminRequest, cmd: Command) -> Reply {
        self.write_tagged(forwarded, None, req, cmd).await
    }

    /// Proposes `cmd` (wrapped in its client session when tagged, stamped with this node's
    /// clock, which advances the replicated clock that expires sessions) or forwards `req`.
    pub(crate) async fn write_tagged(
        &self,
        forwarded: bool,
        tag: Option<SessionTag>,
        req: &AdminRequest,
        cmd: Command,
    ) -> Reply {
        self.leader_or_forward(forwarded, tag, req, || {
            let cmd = match tag {
                Some(tag) => Command::Once {
                    tag,
                    now_unix_ms: now_unix_ms(),
                    cmd: Box::new(cmd.clone()),
                },
                None => cmd.clone(),
            };
            async move {
                match self.writes.write(cmd).await {
                    // Which earlier attempt applied cannot be told any more: the client must
                    // treat the outcome as unknown (and open a new session).
                    Ok(Response::Refused(why)) => Err(Reply::Indefinite(why)),
                    Ok(Response::Rejected(why)) => Err(Reply::Error(why)),
                    Ok(resp) => {
                        METRICS.kv_writes.inc();
                        Ok(Attempt::Done(resp))
                    }
                    Err(BatchError::Forward(f)) => Ok(Attempt::Forward(leader_of(f))),
                    // Leadership was lost under a tagged write: propose it again wherever the
                    // leader now is; a copy that commits as well is answered from the session.
                    Err(BatchError::Indefinite(e)) if tag.is_some() => {
                        tracing::debug!(error = %e, "tagged write's outcome unknown; retrying it");
                        Ok(Attempt::Unknown)
                    }
                    // Raft stopped under the write: it may still be committed by the next leader.
                    Err(BatchError::Indefinite(e)) => Err(Reply::Indefinite(e)),
                }
            }
        })
        .await
    }

    pub(crate) async fn read<T: Into<AdminReply>>(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        f: impl Fn(&yard_raft_store::StateMachineData) -> T,
    ) -> Reply {
        if !forwarded && !self.is_member() {
            match self.read_index().await {
                Ok(()) => {
                    METRICS.kv_reads.inc();
                    return Reply::Admin(self.inner.feed.read(&f).into());
                }
                // Forwarding the whole read is as correct, only dearer.
                Err(e) => tracing::debug!(error = %e, "read index failed; forwarding the read"),
            }
        }
        self.leader_or_forward(forwarded, None, req, || async {
            match self.inner.raft.ensure_linearizable().await {
                Ok(_) => {
                    METRICS.kv_reads.inc();
                    Ok(Attempt::Done(self.inner.feed.read(&f)))
                }
                Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(
                    f,
                ))) => Ok(Attempt::Forward(leader_of(f))),
                Err(RaftError::APIError(e)) => {
                    tracing::debug!(error = %e, "read barrier failed; retrying");
                    Ok(Attempt::Forward(None))
                }
                Err(e) => Err(Reply::Error(format!("read failed: {e}"))),
            }
        })
        .await
    }

    /// On an agent: makes the local tables good for a linearizable read. The leader confirms
    /// it still leads and names the index every acknowledged write is at or below (Raft's
    /// read index, as etcd's learners read); once the watch has applied up to it, the local
    /// tables hold every write acknowledged before the read began. The leader ships an index,
    /// not the data.
    async fn read_index(&self) -> Result<(), String> {
        let p = &self.inner;
        let (leader, info) = self
            .known_leader()
            .ok_or_else(|| "no leader is known".to_owned())?;
        let reply = p
            .transport
            .call(
                Target::node(leader, info.addr),
                Request::ReadIndex,
                p.rpc_timeout,
            )
            .await
            .map_err(|e| e.to_string())?;
        let index = match reply {
            Reply::ReadIndex { index } => index,
            Reply::Error(e) => return Err(e),
            other => return Err(format!("unexpected reply to a read index: {other:?}")),
        };
        let mut applied = p.feed.applied_changes();
        let wait = async {
            while *applied.borrow_and_update() < index {
                if applied.changed().await.is_err() {
                    return Err("the tables closed".to_owned());
                }
            }
            Ok(())
        };
        tokio::time::timeout(p.rpc_timeout, wait)
            .await
            .map_err(|_| format!("the watch did not reach index {index} in time"))?
    }

    /// The leader's side of a read index: the index a read must wait for, once this node has
    /// confirmed with a quorum that it still leads.
    async fn serve_read_index(&self) -> Reply {
        match self.inner.raft.ensure_linearizable().await {
            Ok(read) => Reply::ReadIndex {
                index: read.map_or(0, |l| l.index),
            },
            Err(e) => Reply::Error(format!("not a leader that can serve a read index: {e}")),
        }
    }

    /// Serves one admin request; `tag` is the client session of a tagged write (key-value
    /// writes only: other requests ignore it).
    async fn handle_admin(
        &self,
        forwarded: bool,
        tag: Option<SessionTag>,
        req: AdminRequest,
    ) -> Reply {
        match &req {
            AdminRequest::KvPut { key, value } => {
                let _put_timer = METRICS.put_latency.start_timer();
                let cmd = Command::Put {
                    key: key.clone(),
                    value: value.clone(),
                };
                self.write_tagged(forwarded, tag, &req, cmd).await
            }
            AdminRequest::KvDelete { key } => {
                let cmd = Command::Delete { key: key.clone() };
                self.write_tagged(forwarded, tag, &req, cmd).await
            }
            AdminRequest::KvCas { key, expect, value } => {
                let cmd = Command::Cas {
                    key: key.clone(),
                    expect: expect.clone(),
                    value: value.clone(),
                };
                self.write_tagged(forwarded, tag, &req, cmd).await
            }
            AdminRequest::KvGet { key } => {
                let key = key.clone();
                self.read(forwarded, &req, move |d| {
                    AdminReply::Value(d.kv.get(&key).map(|v| entry(&key, v)))
                })
                .await
            }
            AdminRequest::KvList { prefix } => {
                let prefix = prefix.clone();
                self.read(forwarded, &req, move |d| {
                    AdminReply::List(d.list(&prefix).map(|(k, v)| entry(k, v)).collect())
                })
                .await
            }
            AdminRequest::Status => self.status(forwarded, &req).await,
            AdminRequest::MembersRemove { id } => self.remove_member(forwarded, &req, *id).await,
            AdminRequest::Members => {
                self.leader_or_forward(forwarded, None, &req, || async {
                    if self.inner.raft.metrics().borrow().state == ServerState::Leader {
                        let view = crate::roles::members::view(self, self.inner.rpc_timeout).await;
                        Ok(Attempt::Done(AdminReply::Members(view)))
                    } else {
                        Ok(Attempt::Forward(self.known_leader()))
                    }
                })
                .await
            }
            AdminRequest::TokenCreate { ttl_secs } => {
                self.create_token(forwarded, &req, *ttl_secs).await
            }
            AdminRequest::Gateway(g) => self.handle_gateway(forwarded, &req, g).await,
            AdminRequest::Diagnose { job, timeline } => {
                self.handle_diagnose(forwarded, &req, job.as_deref(), *timeline)
                    .await
            }
            AdminRequest::Agg(a) => self.handle_agg(forwarded, &req, a).await,
            AdminRequest::PlanShow => {
                let me = self.inner.id;
                self.read(forwarded, &req, |_| {
                    AdminReply::Plan(Box::new(self.inner.gateway.plan_view(me)))
                })
                .await
            }
        }
    }

    /// The status as this node sees it; reachability is the leader's view, so a follower
    /// forwards to the leader and falls back to its own view only if the leader is unreachable.
    async fn status(&self, forwarded: bool, req: &AdminRequest) -> Reply {
        let p = &self.inner;
        let leads = p.raft.metrics().borrow().state == ServerState::Leader;
        if !forwarded && !leads {
            if let Some((leader, node)) = self.known_leader() {
                let target = Target::node(leader, node.addr.clone());
                if let Ok(reply @ Reply::Admin(_)) = p
                    .transport
                    .call(target, Request::Admin(req.clone()), p.rpc_timeout)
                    .await
                {
                    return reply;
                }
            }
        }
        Reply::Admin(AdminReply::Status(self.local_status()))
    }

    /// This node's own view of the cluster.
    pub fn local_status(&self) -> Status {
        let p = &self.inner;
        let m = p.raft.metrics().borrow().clone();
        let membership = self.with_membership(|m| m.clone());
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let reach = p.reachability.snapshot();
        let is_leader = m.state == ServerState::Leader;
        let members = membership
            .nodes()
            .map(|(id, node)| MemberStatus {
                id: *id,
                name: node.name.clone(),
                addr: node.addr.clone(),
                role: if voters.contains(id) {
                    "voter"
                } else {
                    "learner"
                }
                .into(),
                reachable: *id == p.id || (is_leader && reach.get(id).copied().unwrap_or(false)),
            })
            .collect::<Vec<_>>();
        // Agents are no Raft members: the hosts table lists them.
        let agents: Vec<MemberStatus> = p.feed.read(|d| {
            d.nodes
                .values()
                .filter(|n| membership.get_node(&n.id).is_none())
                .map(|n| MemberStatus {
                    id: n.id,
                    name: n.name.clone(),
                    addr: n.addr.clone(),
                    role: "agent".into(),
                    reachable: n.id == p.id || !d.hosts_down.contains(&n.id),
                })
                .collect()
        });
        let members = members.into_iter().chain(agents).collect();
        // Raft's health is read live, not reported: a stuck core shows up here at once. An
        // agent's Raft never runs: its health is its watch's (a leader named, tables applied).
        let leader = self.known_leader().map(|(l, _)| l);
        let role = if membership.get_node(&p.id).is_some() {
            format!("{:?}", m.state)
        } else {
            "Agent".to_owned()
        };
        let raft = ActorHealth {
            name: "raft".into(),
            healthy: m.running_state.is_ok() && leader.is_some(),
            detail: match (&m.running_state, leader) {
                (Err(e), _) => format!("stopped: {e}"),
                (Ok(()), None) => format!("{role}, no leader known"),
                (Ok(()), Some(l)) => format!("{role}, leader {l}"),
            },
        };
        let actors = std::iter::once(raft)
            .chain(
                p.health
                    .snapshot()
                    .into_iter()
                    .map(|(name, h)| ActorHealth {
                        name,
                        healthy: h.healthy,
                        detail: h.detail,
                    }),
            )
            .collect();
        Status {
            id: p.id,
            leader,
            term: m.current_term,
            commit_index: p.feed.applied_index(),
            members,
            actors,
        }
    }

    async fn remove_member(&self, forwarded: bool, req: &AdminRequest, id: NodeId) -> Reply {
        let known = self.member(id).is_some();
        if !known && self.inner.feed.read(|d| d.nodes.contains_key(&id)) {
            // An agent holds no vote: forgetting its record is the whole removal.
            return match self.write(forwarded, req, Command::RemoveNode { id }).await {
                Reply::Admin(_) => Reply::Admin(AdminReply::Removed { id }),
                other => other,
            };
        }
        if !known {
            return Reply::Error(format!("node {id} is not a member of this cluster"));
        }
        let reply = self
            .leader_or_forward(forwarded, None, req, || async move {
                let ids = BTreeSet::from([id]);
                // A voter leaves the voter set and the membership in one change (not
                // retained as a learner); a replica only the membership.
                let change = if self.voter_ids().contains(&id) {
                    ChangeMembers::RemoveVoters(ids)
                } else {
                    ChangeMembers::RemoveNodes(ids)
                };
                match self.inner.raft.change_membership(change, false).await {
                    Ok(_) => Ok(Attempt::Done(AdminReply::Removed { id })),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                        Ok(Attempt::Forward(leader_of(f)))
                    }
                    Err(e) => Err(Reply::Error(format!("cannot remove node {id}: {e}"))),
                }
            })
            .await;
        if matches!(reply, Reply::Admin(_))
            && self.inner.raft.metrics().borrow().state == ServerState::Leader
        {
            // Best effort: the membership change is what matters; metadata follows.
            let _ = self
                .inner
                .raft
                .client_write(Command::RemoveNode { id })
                .await;
        }
        reply
    }

    async fn create_token(&self, forwarded: bool, req: &AdminRequest, ttl_secs: u64) -> Reply {
        if ttl_secs == 0 || ttl_secs > 7 * 24 * 3600 {
            return Reply::Error("token ttl must be between 1 second and 7 days".into());
        }
        let (id, secret) = (random_token_part(6), random_token_part(16));
        let now = now_unix_ms();
        let expires_unix_ms = now + ttl_secs * 1000;
        let cmd = Command::CreateToken {
            token: JoinToken {
                id: id.clone(),
                secret_sha256: sha256(secret.as_bytes()),
                expires_unix_ms,
            },
            now_unix_ms: now,
        };
        match self.write(forwarded, req, cmd).await {
            // Forwarded: the leader made and stored its own token, so that is the one to hand out.
            reply @ Reply::Admin(AdminReply::Token { .. }) => reply,
            // Stored here, as this node leads.
            Reply::Admin(AdminReply::Written { .. }) => Reply::Admin(AdminReply::Token {
                token: format!("{id}.{secret}.{}", self.inner.ca_hash),
                expires_unix_ms,
            }),
            Reply::Admin(other) => {
                Reply::Error(format!("unexpected reply to storing a token: {other:?}"))
            }
            other => other,
        }
    }

    /// Adds a node as a learner, waits for it to catch up, then promotes it to voter.
    async fn handle_join(&self, role: PeerRole, req: JoinRequest) -> Reply {
        let p = &self.inner;
        let members = self.member_ids();
        match role {
            PeerRole::Node(id) if id == req.id || members.contains(&id) || self.is_host(id) => {}
            PeerRole::Node(id) => {
                return Reply::Error(format!(
                    "certificate names node {id} but the join is for node {}",
                    req.id
                ));
            }
            _ => {
                return Reply::Error(
                    "joining needs a node certificate; redeem a join token first".into(),
                )
            }
        }
        let forwarded = role != PeerRole::Node(req.id);
        let start = Instant::now();
        loop {
            let m = p.raft.metrics().borrow().clone();
            if m.state == ServerState::Leader {
                break;
            }
            if let Some((leader, node)) = self.known_leader().filter(|(l, _)| *l != p.id) {
                if forwarded {
                    return Reply::Error(format!(
                        "node {} is not the leader; node {leader} is",
                        p.id
                    ));
                }
                {
                    METRICS.forwarded.inc();
                    let timeout = Duration::from_secs(30);
                    match p
                        .transport
                        .call(
                            Target::node(leader, node.addr.clone()),
                            Request::Join(req.clone()),
                            timeout,
                        )
                        .await
                    {
                        Ok(reply) => return reply,
                        Err(e) => tracing::debug!(error = %e, "forwarding join failed"),
                    }
                }
            }
            if start.elapsed() > p.leader_wait {
                return Reply::Error(
                    "no leader to add the node; is a majority of the cluster up?".into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let node = NodeInfo {
            addr: req.addr.clone(),
            name: req.name.clone(),
        };
        let known = self.member(req.id).map(|n| n.addr).or_else(|| {
            p.feed
                .read(|d| d.nodes.get(&req.id).map(|n| n.addr.clone()))
        });
        if let Some(addr) = known.filter(|a| *a != req.addr) {
            return Reply::Error(format!(
                "node id {} is already a member at {addr}; remove it first",
                req.id
            ));
        }
        let role = self.role_for_join(&req);
        tracing::info!(id = req.id, addr = %req.addr, %role, "adding a host");
        if role != Role::Agent {
            if let Err(e) = p.raft.add_learner(req.id, node, true).await {
                return Reply::Error(format!("cannot add node {} as a learner: {e}", req.id));
            }
        }
        if role == Role::Voter {
            if let Err(e) = p
                .raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([req.id])), false)
                .await
            {
                return Reply::Error(format!("cannot promote node {} to voter: {e}", req.id));
            }
        }
        let meta = host_meta(req.id, &req.name, &req.addr, &req.zone, role);
        if let Err(e) = p.raft.client_write(Command::SetNode(meta)).await {
            // An agent is known to the cluster by this record only.
            if role == Role::Agent {
                return Reply::Error(format!("cannot record node {} as an agent: {e}", req.id));
            }
            tracing::warn!(error = %e, "node metadata not recorded");
        }
        tracing::info!(id = req.id, %role, "host joined");
        Reply::Joined {
            leader: p.id,
            role: role.to_string(),
        }
    }

    /// The role a joining host gets (`yard_control::roles::role_for_join`). A host that is
    /// already a member keeps its role, and one recorded as an agent stays one: a restart
    /// must never change the voter set.
    fn role_for_join(&self, req: &JoinRequest) -> Role {
        let (voters, members) = (self.voter_ids(), self.member_ids());
        if voters.contains(&req.id) {
            return Role::Voter;
        }
        if members.contains(&req.id) {
            return Role::Replica;
        }
        if self.inner.feed.read(|d| d.nodes.contains_key(&req.id)) {
            return Role::Agent;
        }
        let view =
            crate::roles::autopilot::view(self, &mut Default::default(), 0, &Default::default());
        let zone = (!req.zone.is_empty()).then_some(req.zone.as_str());
        yard_control::roles::role_for_join(&self.inner.roles, &view, req.id, zone)
    }

    /// Signs a node certificate for the holder of a valid join token.
    async fn handle_redeem(&self, role: PeerRole, req: RedeemRequest) -> Reply {
        let p = &self.inner;
        if role == PeerRole::Admin {
            return Reply::Error("admin certificates cannot redeem join tokens".into());
        }
        let Some(ca) = p.ca.clone() else {
            // Only nodes holding ca.key can sign; the leader is the best guess for one.
            if let (Some((leader, node)), PeerRole::Anonymous) =
                (self.known_leader().filter(|(l, _)| *l != p.id), role)
            {
                {
                    return match p
                        .transport
                        .call(
                            Target::node(leader, node.addr.clone()),
                            Request::RedeemToken(req),
                            p.rpc_timeout,
                        )
                        .await
                    {
                        Ok(reply) => reply,
                        Err(e) => Reply::Error(format!(
                            "cannot reach the leader to sign a certificate: {e}"
                        )),
                    };
                }
            }
            return Reply::Error(
                "no node reachable from here holds the CA key to sign certificates".into(),
            );
        };
        let mut parts = req.token.splitn(3, '.');
        let (Some(id), Some(secret), Some(hash)) = (parts.next(), parts.next(), parts.next())
        else {
            return Reply::Error(
                "join token is malformed; expected <id>.<secret>.<ca-hash>".into(),
            );
        };
        if hash != p.ca_hash {
            return Reply::Error("join token belongs to another cluster's CA".into());
        }
        // Tokens only ever appear and expire, so a local read can wrongly refuse a token that
        // is not replicated here yet, never wrongly accept one: wait briefly for replication.
        let deadline = Instant::now() + Duration::from_secs(2);
        let stored = loop {
            match p.feed.read(|d| d.tokens.get(id).cloned()) {
                Some(t) => break t,
                None if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                None => return Reply::Error("join token is not valid for this cluster".into()),
            }
        };
        if stored.secret_sha256 != sha256(secret.as_bytes()) {
            return Reply::Error("join token is not valid for this cluster".into());
        }
        if stored.expires_unix_ms <= now_unix_ms() {
            return Reply::Error(
                "join token expired; create a new one with `yard token create`".into(),
            );
        }
        let known = self.member(req.id);
        if let Some(existing) = known {
            if existing.name != req.name {
                return Reply::Error(format!(
                    "node id {} already belongs to {}",
                    req.id, existing.name
                ));
            }
        }
        match ca.sign_node(&p.cluster, &req.name, req.id, &req.ips) {
            Ok(cert) => {
                tracing::info!(id = req.id, name = %req.name, "signed a node certificate for a token join");
                Reply::Certificate {
                    ca: ca.cert_pem.clone(),
                    cert,
                }
            }
            Err(e) => Reply::Error(format!("cannot sign a certificate: {e}")),
        }
    }

    async fn handle_raft(&self, req: RaftRequest) -> Reply {
        let raft = &self.inner.raft;
        let res = match req {
            RaftRequest::AppendEntries(r) => raft
                .append_entries(r)
                .await
                .map(RaftReply::AppendEntries)
                .map_err(|e| RaftFailure(e.to_string())),
            RaftRequest::Vote(r) => raft
                .vote(r)
                .await
                .map(RaftReply::Vote)
                .map_err(|e| RaftFailure(e.to_string())),
            RaftRequest::InstallSnapshot(r) => raft
                .install_snapshot(r)
                .await
                .map(RaftReply::InstallSnapshot)
                .map_err(|e| RaftFailure(e.to_string())),
        };
        Reply::Raft(res)
    }
}

fn leader_of(f: ForwardToLeader<NodeId, NodeInfo>) -> Option<(NodeId, NodeInfo)> {
    f.leader_id.zip(f.leader_node)
}

fn random_token_part(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl From<Response> for AdminReply {
    fn from(r: Response) -> Self {
        match r {
            // Client commands never answer with these; the batcher unpacks batches.
            Response::None | Response::Batch(_) | Response::Refused(_) | Response::Rejected(_) => {
                AdminReply::Written { revision: 0 }
            }
            Response::Written { revision } => AdminReply::Written { revision },
            Response::Deleted { revision, existed } => AdminReply::Deleted { revision, existed },
            Response::Cas {
                succeeded,
                revision,
                current,
            } => AdminReply::Cas {
                succeeded,
                revision,
                current: current.map(|v| KvEntry {
                    key: String::new(),
                    value: v.value,
                    revision: v.revision,
                }),
            },
        }
    }
}

impl Handler for Node {
    fn handle(&self, role: PeerRole, req: Request) -> BoxFut<Reply> {
        let this = self.clone();
        Box::pin(async move {
            match (role, req) {
                (PeerRole::Node(_), Request::Raft(r)) => this.handle_raft(r).await,
                (PeerRole::Node(_), Request::Probe) => Reply::Pong { id: this.inner.id },
                (PeerRole::Node(_), Request::Watch { .. }) if !this.is_member() => {
                    Reply::Error(format!(
                        "node {} is not a raft member and serves no watch",
                        this.inner.id
                    ))
                }
                // A member cut off from the leader sheds its agents, so they move to one that
                // is not (and the leader's liveness judges them there).
                (PeerRole::Node(_), Request::Watch { .. }) if this.known_leader().is_none() => {
                    Reply::Error(format!("node {} knows no leader to follow", this.inner.id))
                }
                (PeerRole::Node(id), Request::Watch { from, hold_ms }) => {
                    this.host_liveness.polled(id, from);
                    crate::roles::watch::serve(&this, from, Duration::from_millis(hold_ms)).await
                }
                (PeerRole::Node(id), Request::HostReports { reports }) => {
                    if this.inner.raft.metrics().borrow().state != ServerState::Leader {
                        Reply::Error(format!("node {} is not the leader", this.inner.id))
                    } else if !this.member_ids().contains(&id) {
                        Reply::Error(format!("node {id} is not a raft member"))
                    } else {
                        this.host_liveness.accept(id, reports);
                        Reply::ReportsAccepted
                    }
                }
                (PeerRole::Node(_), Request::ReadIndex) => this.serve_read_index().await,
                (PeerRole::Node(_), Request::Watchers) => {
                    Reply::Watchers(this.host_liveness.watched())
                }
                (PeerRole::Node(_), Request::PreVote) => {
                    let cfg = crate::prevote::PreVoteConfig::of(this.inner.raft.config());
                    Reply::PreVote {
                        granted: crate::prevote::local_view(&this)
                            .await
                            .is_some_and(|v| crate::prevote::grant(&cfg, &v)),
                    }
                }
                (PeerRole::Node(_), Request::ProbeReport { batches }) => {
                    this.handle_probe_report(batches)
                }
                (PeerRole::Node(id), Request::GatewayGrace { applied, grace_ms }) => {
                    match this
                        .inner
                        .gateway
                        .grace(&this.inner.raft, id, applied, grace_ms)
                        .await
                    {
                        Ok(granted_ms) => Reply::LeaseGranted {
                            granted_ms,
                            revision: this.inner.feed.read(|d| d.gateway.revision),
                        },
                        Err(e) => Reply::Error(e),
                    }
                }
                (
                    PeerRole::Node(id),
                    Request::GatewayRenew {
                        applied,
                        lease_left_ms,
                    },
                ) => {
                    let revision = this.inner.feed.read(|d| d.gateway.revision);
                    match this.inner.gateway.renew(id, applied, lease_left_ms) {
                        Ok(granted_ms) => Reply::LeaseGranted {
                            granted_ms,
                            revision,
                        },
                        Err(e) => Reply::Error(e),
                    }
                }
                (PeerRole::Node(id), Request::GatewayRates { rates }) => {
                    this.inner.gateway.rates(id, rates);
                    Reply::RatesAccepted
                }
                (PeerRole::Node(_), Request::GatewayRevoke { node, stamp }) => {
                    match this.inner.gateway.revoke(node, stamp).await {
                        Ok((remaining_ms, held_ms)) => Reply::LeaseRevoked {
                            remaining_ms,
                            held_ms,
                        },
                        Err(e) => Reply::Error(e),
                    }
                }
                (PeerRole::Node(_), Request::GatewayUnrevoke { node, stamp }) => {
                    match this.inner.gateway.unrevoke(node, stamp).await {
                        Ok(()) => Reply::LeaseUnrevoked,
                        Err(e) => Reply::Error(e),
                    }
                }
                // The KV data path skips the actor: the hop through the actix thread and back
                // cost 60% of put throughput when measured (bench kv, 16 clients).
                (PeerRole::Admin, Request::Admin(r)) if r.is_kv() => this.serve_admin(r).await,
                (PeerRole::Admin, Request::Admin(r)) => this.serve_admitted(r).await,
                (PeerRole::Node(_), Request::Admin(r)) => this.handle_admin(true, None, r).await,
                // Tagged writes are key-value writes: the data path, straight to the node.
                (PeerRole::Admin, Request::AdminOnce { tag, req }) if req.is_kv() => {
                    this.handle_admin(false, Some(tag), req).await
                }
                (PeerRole::Node(_), Request::AdminOnce { tag, req }) if req.is_kv() => {
                    this.handle_admin(true, Some(tag), req).await
                }
                (PeerRole::Admin | PeerRole::Node(_), Request::AdminOnce { .. }) => {
                    Reply::Error("only key-value writes carry a client session".into())
                }
                (role, Request::Join(r)) => this.handle_join(role, r).await,
                (role, Request::RedeemToken(r)) => this.handle_redeem(role, r).await,
                (role, req) => {
                    METRICS.requests_refused.inc();
                    let what = match req {
                        Request::Raft(_) | Request::PreVote => "raft traffic",
                        Request::Admin(_) | Request::AdminOnce { .. } => "admin requests",
                        Request::Probe => "liveness probes",
                        Request::GatewayRenew { .. }
                        | Request::GatewayGrace { .. }
                        | Request::GatewayRevoke { .. }
                        | Request::GatewayUnrevoke { .. } => "gateway lease renewals",
                        Request::ProbeReport { .. } => "probe reports",
                        Request::GatewayRates { .. } => "gateway rate reports",
                        Request::Watch { .. }
                        | Request::HostReports { .. }
                        | Request::Watchers
                        | Request::ReadIndex => "watches",
                        Request::Join(_) | Request::RedeemToken(_) => "joins",
                    };
                    tracing::warn!(?role, what, "refused request for the peer's role");
                    Reply::Error(format!(
                        "{what} need a {} certificate",
                        if what == "admin requests" {
                            "admin"
                        } else {
                            "node"
                        }
                    ))
                }
            }
        })
    }
}

/// Gauges read from openraft at scrape time.
pub struct RaftGauges(pub Node);

impl GaugeSource for RaftGauges {
    fn families(&self) -> Vec<crate::metrics::Family> {
        use crate::metrics::Family;
        let mut families = self.0.diagnosis().families(self.0.feed());
        families.extend(self.0.gateway().planner_families());
        if let Some(view) = self.0.agg_view() {
            families.extend(crate::agg_service::families(&view.snapshot()));
        }
        if let Some(probe) = self.0.probe_view() {
            let p = probe.snapshot();
            families.push(Family {
                name: "yard_probe_events_total",
                help:
                    "events from local ranks: accepted, dropped (buffer full), coalesced, reported",
                kind: "counter",
                samples: vec![
                    ("what=\"accepted\"".into(), p.stats.accepted as f64),
                    ("what=\"dropped\"".into(), p.stats.dropped as f64),
                    ("what=\"coalesced\"".into(), p.stats.coalesced as f64),
                    ("what=\"reported\"".into(), p.stats.reported as f64),
                ],
            });
            families.push(Family {
                name: "yard_probe_state",
                help: "the probe now: connected clients, jobs, pending events, refused connections",
                kind: "gauge",
                samples: vec![
                    ("what=\"connections\"".into(), p.connections as f64),
                    ("what=\"jobs\"".into(), p.jobs as f64),
                    ("what=\"pending\"".into(), p.stats.pending as f64),
                    ("what=\"protocol_errors\"".into(), p.protocol_errors as f64),
                ],
            });
        }
        let Some(view) = self.0.gateway_view() else {
            return families;
        };
        let s = view.snapshot();
        let per_reason = |pick: fn(&yard_actors::gateway::actor::CounterRow) -> u64| {
            s.counters
                .iter()
                .map(|c| (format!("reason=\"{}\"", c.0), pick(c) as f64))
                .collect()
        };
        let owned = s
            .vips
            .iter()
            .filter(|(_, m)| *m == yard_actors::gateway::core::Serve::Owned)
            .count();
        families.extend([
            Family {
                name: "yard_gateway_xdp_packets_total",
                help: "packets the gateway XDP program handled, by outcome",
                kind: "counter",
                samples: per_reason(|c| c.1),
            },
            Family {
                name: "yard_gateway_xdp_bytes_total",
                help: "bytes the gateway XDP program handled, by outcome",
                kind: "counter",
                samples: per_reason(|c| c.2),
            },
            Family {
                name: "yard_gateway_state",
                help: "gateway node state: lease_remaining_ms, vips_owned, vips_served, endpoints, errors",
                kind: "gauge",
                samples: vec![
                    ("what=\"lease_remaining_ms\"".into(), s.lease_remaining_ms as f64),
                    ("what=\"vips_owned\"".into(), owned as f64),
                    ("what=\"vips_served\"".into(), s.vips.len() as f64),
                    ("what=\"endpoints\"".into(), s.endpoints as f64),
                    ("what=\"errors\"".into(), s.errors as f64),
                ],
            },
        ]);
        families
    }

    fn gauges(&self) -> Vec<(&'static str, &'static str, f64)> {
        let m = self.0.inner.raft.metrics().borrow().clone();
        let reach = self.0.inner.reachability.snapshot();
        vec![
            ("yard_raft_term", "current raft term", m.current_term as f64),
            (
                "yard_raft_is_leader",
                "1 when this node leads",
                f64::from(u8::from(m.state == ServerState::Leader)),
            ),
            (
                "yard_raft_leader_id",
                "id of the current leader (on an agent, the one its watch names), 0 if none",
                self.0.known_leader().map_or(0, |(l, _)| l) as f64,
            ),
            (
                "yard_tables_applied_index",
                "log index this host's tables stand at (raft on members, the watch on agents)",
                self.0.inner.feed.applied_index() as f64,
            ),
            (
                "yard_host_is_agent",
                "1 when this host holds no raft membership and follows a watch",
                f64::from(u8::from(!self.0.is_member())),
            ),
            (
                "yard_raft_last_log_index",
                "index of the last log entry",
                m.last_log_index.unwrap_or(0) as f64,
            ),
            (
                "yard_raft_last_applied_index",
                "index of the last applied entry",
                m.last_applied.map_or(0, |l| l.index) as f64,
            ),
            (
                "yard_raft_snapshot_index",
                "index covered by the last snapshot",
                m.snapshot.map_or(0, |l| l.index) as f64,
            ),
            (
                "yard_raft_members",
                "nodes in the membership",
                m.membership_config.membership().nodes().count() as f64,
            ),
            (
                "yard_liveness_reachable_members",
                "members the leader can reach",
                reach.values().filter(|r| **r).count() as f64,
            ),
        ]
    }
}
