//! The node: its Raft, its tables and the paths every request takes through them. A read is
//! served from the local tables once they are linearizable (`ensure_linearizable`, or an
//! agent's read index), a write goes through `client_write` on the leader, and either is
//! forwarded to the leader when this node does not lead, so a client never needs to know who
//! leads. Which request goes where is `crate::dispatch`; a host's join is `crate::roles::join`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
use openraft::{ChangeMembers, ServerState};
use rand::Rng;
use yard_actors::health::HealthRegistry;
use yard_actors::liveness::Reachability;
use yard_raft_store::{
    BoundToken, ChangeFeed, Command, NodeId, NodeInfo, Raft, Response, SessionTag,
};

use crate::batcher::{BatchError, WriteBatcher};
use crate::gateway_control::GatewayControl;
use crate::metrics::METRICS;
use crate::rpc::{
    ActorHealth, AdminReply, AdminRequest, KvEntry, MemberStatus, RaftFailure, RaftReply,
    RaftRequest, Reply, Request, Status,
};
use crate::tls::PeerRole;
use crate::transport::{Handler, Target, Transport, TransportError};
use yard_actors::gateway::actor::GatewayView;

/// Everything a node's request handling needs.
/// One operator request for the admin actor (`crate::admin_actor`) to serve.
#[derive(Debug, actix::Message)]
#[rtype(result = "Reply")]
pub struct ServeAdmin {
    pub req: AdminRequest,
    /// The operator's signature, when the request came with one (`crate::operator_proof`).
    pub proof: Option<Arc<crate::operator_proof::OperatorProof>>,
}

pub struct NodeParts {
    pub id: NodeId,
    pub name: String,
    pub cluster: String,
    pub addr: String,
    pub raft: Raft,
    pub feed: ChangeFeed,
    pub transport: Arc<dyn Transport>,
    /// What the node trusts, signs with (nodes holding `ca.key`: only they sign certificates
    /// for token joins and renewals) and presents, as its certificate files say now.
    pub pki: Arc<crate::pki::PkiCell>,
    /// How long the node certificates it signs are valid (`tls.cert_validity_s`).
    pub cert_validity: Duration,
    /// This node's side of a leadership handover, shared with its Raft network.
    pub handover: crate::raft_network::Handover,
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
    /// The transport's frame limit (`transport.max_frame_bytes`): proposals stay well below it
    /// (`crate::limits`).
    pub max_frame: u32,
    /// What forwarded operator writes are checked with; `None` takes them unsigned (a cluster
    /// without a CA, as the in-memory test clusters are, or `admin.unsigned_forwarding` during
    /// a rolling upgrade from a release whose CLI does not sign).
    pub operator_proofs: Option<Arc<crate::operator_proof::ProofCheck>>,
}

/// A running node's request handler. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<NodeParts>,
    pub(crate) writes: WriteBatcher,
    /// The admin actor, once the actor system runs; operators' requests go through it.
    pub(crate) admin: Arc<std::sync::OnceLock<actix::Recipient<ServeAdmin>>>,
    /// This node's gateway data plane, when the gateway is enabled here.
    gateway_view: Arc<std::sync::OnceLock<GatewayView>>,
    /// This node's probe, when it runs.
    probe_view: Arc<std::sync::OnceLock<yard_actors::probe::socket::SharedProbe>>,
    /// How long the pre-vote gate has been watching (`yard_control::prevote::Watch`).
    prevote_watch: Arc<crate::prevote::watch::SharedWatch>,
    /// A handover to another voter this node was told of: it does not stand meanwhile.
    standby: Arc<crate::roles::leader_transfer::Standby>,
    /// This node's aggregator, when it aggregates.
    agg_view: Arc<std::sync::OnceLock<yard_actors::aggregator::actor::AggView>>,
    /// The job limits this node checks creations against when it leads.
    agg_quota: Arc<std::sync::OnceLock<yard_raft_store::aggregation::Quota>>,
    /// On an agent: the leader its watch last named (a member reads it from Raft instead).
    agent_leader: Arc<std::sync::Mutex<Option<(NodeId, NodeInfo)>>>,
    /// The autopilot's latest reason, for `yard members`.
    autopilot_reason: Arc<std::sync::Mutex<String>>,
    /// What this node judges of the agents it serves, and the reports it takes as leader.
    pub(crate) host_liveness: Arc<crate::roles::liveness_state::HostLiveness>,
    /// The tickets this node's bandwidth sink takes (`crate::sink_tickets`).
    sink_tickets: Arc<std::sync::Mutex<crate::sink_tickets::TicketBook>>,
}

pub(crate) enum Attempt<T> {
    Done(T),
    /// Not the leader: where to forward, if a leader is known.
    Forward(Option<(NodeId, NodeInfo)>),
    /// A tagged write was proposed here but leadership was lost under it: it may still commit,
    /// so it is sent again (to whoever leads now) and can no longer be answered "not applied".
    Unknown,
}

pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn entry(key: &str, v: &yard_raft_store::Versioned) -> KvEntry {
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

/// How long a node whose forwarded request was refused waits to see the leader change before
/// it takes the refusal as the leader's answer: a few election timeouts.
const LEADER_MOVE_WAIT: Duration = Duration::from_millis(250);

/// The most client writes one proposal carries.
const MAX_WRITES_PER_PROPOSAL: usize = 512;

impl Node {
    /// Wraps the parts; must run inside a tokio runtime (it starts the write batcher).
    pub fn new(parts: NodeParts) -> Self {
        let host_liveness = Arc::new(crate::roles::liveness_state::HostLiveness::new(
            parts.host_liveness.clone(),
        ));
        let writes = WriteBatcher::start(
            parts.raft.clone(),
            PROPOSALS_IN_FLIGHT,
            MAX_WRITES_PER_PROPOSAL,
            crate::limits::RaftBudgets::for_frame(parts.max_frame).entry_bytes,
        );
        Self {
            inner: Arc::new(parts),
            writes,
            admin: Arc::default(),
            gateway_view: Arc::default(),
            probe_view: Arc::default(),
            prevote_watch: Arc::default(),
            standby: Arc::default(),
            agg_view: Arc::default(),
            agg_quota: Arc::default(),
            agent_leader: Arc::default(),
            host_liveness,
            autopilot_reason: Arc::default(),
            sink_tickets: Arc::default(),
        }
    }

    /// The tickets this node's bandwidth sink takes, shared with the sink.
    pub fn sink_tickets(&self) -> Arc<std::sync::Mutex<crate::sink_tickets::TicketBook>> {
        self.sink_tickets.clone()
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
    pub fn host_liveness(&self) -> &Arc<crate::roles::liveness_state::HostLiveness> {
        &self.host_liveness
    }

    /// How long a request to another node may take (`transport.rpc_timeout_ms`).
    pub fn rpc_timeout(&self) -> Duration {
        self.inner.rpc_timeout
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

    /// The handover this node was told of, which keeps it from standing (its pre-vote gate).
    pub fn standby(&self) -> &crate::roles::leader_transfer::Standby {
        &self.standby
    }

    /// The pre-vote gate's watch, shared by its loop and the `PreVote` handler.
    pub fn prevote_watch(&self) -> &crate::prevote::watch::SharedWatch {
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

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Whether the leader this node knows of stops being `id` within `within`.
    async fn leader_moves_from(&self, id: NodeId, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if self.known_leader().map(|(l, _)| l) != Some(id) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn feed(&self) -> &ChangeFeed {
        &self.inner.feed
    }

    /// Reads the membership in force: Raft's own view, or the one in the tables when they
    /// are newer (on an agent, whose Raft never hears from the leader, they always are).
    pub(crate) fn with_membership<T>(
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

    /// The membership in force: its log index and every member's id.
    pub fn membership(&self) -> (u64, BTreeSet<NodeId>) {
        let raft = self.inner.raft.metrics().borrow().membership_config.clone();
        let ids =
            |m: &openraft::Membership<NodeId, NodeInfo>| m.nodes().map(|(id, _)| *id).collect();
        self.inner.feed.read(|d| {
            if d.last_membership.log_id() > raft.log_id() {
                (
                    d.last_membership.log_id().map_or(0, |l| l.index),
                    ids(d.last_membership.membership()),
                )
            } else {
                (raft.log_id().map_or(0, |l| l.index), ids(raft.membership()))
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

    pub(crate) async fn write_until_leader(&self, cmd: Command) -> Result<Response, String> {
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
    pub(crate) async fn leader_or_forward<T, F, Fut>(
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
        // The operator's signature goes with the request, so the leader can tell it from one
        // this host made up; dropped if the leader runs a release that cannot decode it.
        let mut proof = crate::operator_proof::current();
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
            // A leader handing its leadership over proposes nothing new: an entry appended
            // after the target caught up could be cut off by its election, and the write
            // would answer "unknown". Once the handover ends this node forwards to the new
            // leader (or, if it failed, still leads).
            p.handover
                .released(p.leader_wait.saturating_sub(start.elapsed()))
                .await;
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
                let request = match (&proof, tag) {
                    (Some(proof), tag) => Request::SignedAdmin {
                        tag,
                        req: req.clone(),
                        proof: (**proof).clone(),
                    },
                    (None, Some(tag)) => Request::AdminOnce {
                        tag,
                        req: req.clone(),
                    },
                    (None, None) => Request::Admin(req.clone()),
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
                    // A refusal: nothing happened. From a node that stopped leading ("not the
                    // leader") it is worth trying again on the next leader; from the leader
                    // this node still follows it is that leader's answer (a token for a revoked
                    // id, a job that does not fit), and retrying it until the deadline turned
                    // it into "no leader answered".
                    // A leader of an earlier release: it takes the request unsigned.
                    Ok(Reply::Error(e)) if proof.is_some() && crate::frame::is_undecodable(&e) => {
                        tracing::debug!(
                            leader = id,
                            "the leader cannot decode a signed request; sending it unsigned"
                        );
                        proof = None;
                        continue;
                    }
                    Ok(Reply::Error(e)) => {
                        if !self.leader_moves_from(id, LEADER_MOVE_WAIT).await {
                            return Reply::Error(e);
                        }
                        tracing::debug!(leader = id, error = %e, "forwarded request refused by a former leader; retrying")
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
        // Refused here, before it is forwarded or proposed: no entry could carry it.
        if let Err(BatchError::TooLarge(why)) = self.writes.check(&cmd) {
            METRICS.requests_refused.inc();
            tracing::warn!(reason = %why, "refused a write larger than a raft entry");
            return Reply::Error(why);
        }
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
                // Nothing an earlier release still running on some host cannot decode.
                let level = self.inner.feed.read(|d| d.cluster_level);
                yard_raft_store::version::gate(&cmd, level).map_err(Reply::Error)?;
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
                    Err(BatchError::TooLarge(why)) => Err(Reply::Error(why)),
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
        self.read_then(forwarded, req, f, |t| std::future::ready(Ok(t)))
            .await
    }

    /// As [`Node::read`], for an answer that takes real work (the placement core's search):
    /// `copy` runs under the state machine's read lock and only copies what `compute` needs;
    /// `compute` runs on a blocking thread with no lock held, so neither the appliers nor the
    /// runtime wait for it.
    pub(crate) async fn read_off_lock<C, T>(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        copy: impl Fn(&yard_raft_store::StateMachineData) -> C,
        compute: impl Fn(C) -> T + Clone + Send + 'static,
    ) -> Reply
    where
        C: Send + 'static,
        T: Into<AdminReply> + Send + 'static,
    {
        self.read_then(forwarded, req, copy, |c| {
            let compute = compute.clone();
            async move {
                tokio::task::spawn_blocking(move || compute(c))
                    .await
                    .map_err(|e| Reply::Error(format!("the read's computation failed: {e}")))
            }
        })
        .await
    }

    /// A linearizable read: `copy` under the lock, then `finish` on what it copied.
    pub(crate) async fn read_then<C, T, Fin, FinFut>(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        copy: impl Fn(&yard_raft_store::StateMachineData) -> C,
        finish: Fin,
    ) -> Reply
    where
        T: Into<AdminReply>,
        Fin: Fn(C) -> FinFut,
        FinFut: std::future::Future<Output = Result<T, Reply>>,
    {
        if !forwarded && !self.is_member() {
            match self.read_index().await {
                Ok(()) => {
                    METRICS.kv_reads.inc();
                    return match finish(self.inner.feed.read(&copy)).await {
                        Ok(t) => Reply::Admin(t.into()),
                        Err(reply) => reply,
                    };
                }
                // Forwarding the whole read is as correct, only dearer.
                Err(e) => tracing::debug!(error = %e, "read index failed; forwarding the read"),
            }
        }
        self.leader_or_forward(forwarded, None, req, || async {
            match self.inner.raft.ensure_linearizable().await {
                Ok(_) => {
                    METRICS.kv_reads.inc();
                    let copied = self.inner.feed.read(&copy);
                    Ok(Attempt::Done(finish(copied).await?))
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
    pub(crate) async fn serve_read_index(&self) -> Reply {
        match self.inner.raft.ensure_linearizable().await {
            Ok(read) => Reply::ReadIndex {
                index: read.map_or(0, |l| l.index),
            },
            Err(e) => Reply::Error(format!("not a leader that can serve a read index: {e}")),
        }
    }

    /// The status as this node sees it; reachability is the leader's view, so a follower
    /// forwards to the leader and falls back to its own view only if the leader is unreachable.
    pub(crate) async fn status(&self, forwarded: bool, req: &AdminRequest) -> Reply {
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

    pub(crate) async fn remove_member(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        id: NodeId,
    ) -> Reply {
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
            // The host's record goes and its certificate is revoked. If that write fails the
            // host is out of the membership but still a host: the operator runs the removal
            // again, which then takes the agent path above.
            if let Err(e) = self
                .inner
                .raft
                .client_write(Command::RemoveNode { id })
                .await
            {
                return Reply::Error(format!(
                    "node {id} left the membership but its certificate is not revoked yet ({e}); run `yard members remove {id}` again"
                ));
            }
        }
        reply
    }

    /// Creates a join token bound to node `node_id` named `name`: the redemption that uses it
    /// gets a certificate for exactly that identity, once.
    pub(crate) async fn create_token(
        &self,
        forwarded: bool,
        req: &AdminRequest,
        ttl_secs: u64,
        node_id: NodeId,
        name: &str,
    ) -> Reply {
        if ttl_secs == 0 || ttl_secs > 7 * 24 * 3600 {
            return Reply::Error("token ttl must be between 1 second and 7 days".into());
        }
        if name.is_empty() {
            return Reply::Error("a join token needs the name of the node it is for".into());
        }
        // The redemption refuses it as well; this answers the operator at once.
        if self.is_host(node_id) {
            return Reply::Error(format!(
                "node id {node_id} already belongs to a host of this cluster; remove it first"
            ));
        }
        let (id, secret) = (random_token_part(6), random_token_part(16));
        let now = now_unix_ms();
        let expires_unix_ms = now + ttl_secs * 1000;
        let cmd = Command::CreateBoundToken {
            token: BoundToken {
                id: id.clone(),
                secret_sha256: sha256(secret.as_bytes()),
                expires_unix_ms,
                node_id,
                name: name.to_owned(),
                used: false,
            },
            now_unix_ms: now,
        };
        match self.write(forwarded, req, cmd).await {
            // Forwarded: the leader made and stored its own token, so that is the one to hand out.
            reply @ Reply::Admin(AdminReply::Token { .. }) => reply,
            // Stored here, as this node leads.
            Reply::Admin(AdminReply::Written { .. }) => {
                tracing::info!(token = %id, node_id, name, expires_unix_ms, "created a join token");
                Reply::Admin(AdminReply::Token {
                    token: format!("{id}.{secret}.{}", self.inner.pki.get().active_hash()),
                    expires_unix_ms,
                })
            }
            Reply::Admin(other) => {
                Reply::Error(format!("unexpected reply to storing a token: {other:?}"))
            }
            other => other,
        }
    }

    pub(crate) async fn handle_raft(&self, req: RaftRequest) -> Reply {
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

pub(crate) fn leader_of(f: ForwardToLeader<NodeId, NodeInfo>) -> Option<(NodeId, NodeInfo)> {
    f.leader_id.zip(f.leader_node)
}

pub(crate) fn random_token_part(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect()
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
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
