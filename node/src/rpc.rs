//! Every request a node accepts on its QUIC endpoint, and the replies. One enum for the whole
//! endpoint so Raft, admin, join and liveness traffic share one listener and one frame codec.

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

pub use yard_raft_store::aggregation::Grouping;
use yard_raft_store::gateway::{Endpoint, EndpointKey};
use yard_raft_store::{NodeId, TypeConfig};

use crate::tls::CertPem;

/// A request on one bidirectional stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Raft traffic: nodes only.
    Raft(RaftRequest),
    /// Operator requests: admins, or nodes forwarding an admin's request to the leader.
    Admin(AdminRequest),
    /// A node with a certificate asks to join (forwarded to the leader).
    Join(JoinRequest),
    /// A node without a certificate redeems a join token for one.
    RedeemToken(RedeemRequest),
    /// Liveness probe from the leader.
    Probe,
    /// A gateway node renews its lease with a voter (it asks every voter each round), reporting
    /// the revision it has applied (and executed on its data plane) and the lease its data plane
    /// has left. The node is the one named by the caller's certificate.
    GatewayRenew { applied: u64, lease_left_ms: u64 },
    /// A gateway node about to restart asks to keep its VIPs for `grace_ms` without renewing.
    GatewayGrace { applied: u64, grace_ms: u64 },
    /// A node's probe summary for the analyzer on the leader.
    ProbeReport {
        batches: Vec<yard_actors::probe::core::JobBatch>,
    },
    /// An admin write tagged with the client's session, so that it applies at most once
    /// however often it is retried (by the forwarding node on a new leader, or by the client on
    /// another endpoint). Admins send it; nodes forward it unchanged.
    AdminOnce {
        tag: yard_raft_store::SessionTag,
        req: AdminRequest,
    },
    /// The leader revokes `node`'s gateway lease at this voter (stored durably before the
    /// answer): `LeaseRevoked` with how long this voter's promise to it still runs, or an error
    /// when a newer stamp was already applied. Renewals go to every voter, not only the leader.
    GatewayRevoke {
        node: NodeId,
        stamp: yard_actors::gateway::lease::Stamp,
    },
    /// The leader lifts a revocation at this voter: `LeaseUnrevoked`.
    GatewayUnrevoke {
        node: NodeId,
        stamp: yard_actors::gateway::lease::Stamp,
    },
    /// A voter that stopped hearing its leader asks whether this node would vote for it
    /// (the pre-vote): `PreVote { granted }`.
    PreVote,
    /// A gateway node's smoothed per-VIP rates for the service planner on the leader:
    /// `RatesAccepted`. The node is the one named by the caller's certificate.
    GatewayRates {
        rates: Vec<(Ipv4Addr, yard_actors::gateway::replan::Rate)>,
    },
    /// An agent follows the replicated tables from this member: the entries
    /// from log index `from` on, or a snapshot when the member no longer keeps them. With
    /// nothing new the member holds the request up to `hold_ms` before answering empty; the
    /// poll is also the agent's heartbeat. Answered `Watch`.
    Watch { from: u64, hold_ms: u64 },
    /// A member's transitions of the agents it serves, for the leader's host liveness
    /// (host liveness), in the order it judged them: `ReportsAccepted`.
    HostReports {
        reports: Vec<yard_control::host_liveness::Report>,
    },
    /// The agents this member serves and their watch positions: `Watchers`.
    Watchers,
    /// An agent asks the leader for the index its local tables must reach before a
    /// linearizable read: `ReadIndex`.
    ReadIndex,
    /// A node about to sign a certificate for a token redemption asks the leader to mark the
    /// token used through Raft first: `TokenConsumed`, or why the redemption is refused.
    ConsumeToken(RedeemRequest),
    /// A node asks a node holding the CA key for a renewed certificate: `Renewed`. `csr` is a
    /// certificate signing request (DER) over the node's key; the certificate names the node of
    /// the caller's certificate, with the name and address the cluster has for it.
    RenewCertificate { csr: Vec<u8> },
    /// A host about to probe this node's bandwidth sink asks for a ticket to open the probe
    /// with (`crate::sink_tickets`): `BandwidthTicket`.
    BandwidthTicket,
    /// An operator's request with the operator's signature (`crate::operator_proof`), tagged
    /// when it is a key-value write. The CLI sends it; a node forwards it to the leader
    /// unchanged, and the leader takes a forwarded operator write only with a proof. Last in
    /// the enum, so the variants before it decode as earlier releases encoded them.
    SignedAdmin {
        tag: Option<yard_raft_store::SessionTag>,
        req: AdminRequest,
        proof: crate::operator_proof::OperatorProof,
    },
    /// Which release level this node runs, and the cluster level its tables hold
    /// (`yard_raft_store::version`): `Level`. A node of a release before levels cannot decode
    /// this request and answers so, which the asker reads as level 0.
    Level,
    /// Which CAs this node trusts, which signed the certificate it presents and which it signs
    /// with (`yard ca rotate status`): `Pki`.
    Pki,
    /// The leader hands its leadership to voter `to` (`crate::roles::leader_transfer`): the
    /// other voters hold back from standing for a while, `to` stands for election now.
    /// `Standing`. Last in the enum.
    Handover { to: NodeId },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RaftRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum RaftReply {
    AppendEntries(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    InstallSnapshot(InstallSnapshotResponse<NodeId>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AdminRequest {
    Status,
    KvGet {
        key: String,
    },
    KvList {
        prefix: String,
    },
    KvPut {
        key: String,
        value: String,
    },
    KvDelete {
        key: String,
    },
    KvCas {
        key: String,
        expect: Option<String>,
        value: String,
    },
    MembersRemove {
        id: NodeId,
    },
    /// `yard members`: every host's role, zone, lag and liveness, from the leader.
    Members,
    TokenCreate {
        ttl_secs: u64,
    },
    Gateway(GatewayRequest),
    /// Current verdicts of one job (or every job), optionally with the collective records
    /// around the top verdict for a timeline picture.
    Diagnose {
        job: Option<String>,
        timeline: bool,
    },
    /// Aggregation jobs and this node's aggregator.
    Agg(AggRequest),
    /// `yard plan show`: the leader's service planner.
    PlanShow,
    /// `yard token create --node-id N --name NAME`: a join token redeemable once, for that
    /// node id and name only (`TokenCreate`, unbound, is refused).
    TokenCreateBound {
        ttl_secs: u64,
        node_id: NodeId,
        name: String,
    },
    /// `yard snapshot save`: the tables at one revision, as a snapshot file
    /// (`yard_raft_store::backup`), read linearizably from the leader or a caught-up agent.
    SnapshotSave,
    /// `yard node drain ID` / `yard node undrain ID`: `Command::DrainNode`, which needs
    /// cluster level 1.
    NodeDrain {
        id: NodeId,
        drained: bool,
    },
    /// `yard leader transfer [NODE]`: the leader hands its leadership to `to` (None: the most
    /// caught-up voter): `LeaderMoved`. Last in the enum.
    LeaderTransfer {
        to: Option<NodeId>,
    },
}

/// Operator and worker requests about aggregation jobs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AggRequest {
    /// A new job; its chunk size is the largest a link of `mtu` carries.
    Create {
        name: String,
        workers: u16,
        values: u32,
        dtype: u8,
        elastic: bool,
        mtu: u32,
        colocate: bool,
        grouping: Grouping,
    },
    Delete {
        name: String,
    },
    /// A worker of `name` with rank `rank` sends from `addr`.
    Join {
        name: String,
        rank: u16,
        addr: std::net::SocketAddrV4,
    },
    List,
    /// One job (linearizable).
    Show {
        name: String,
    },
    /// The contacted node's aggregator (never forwarded).
    Stats,
    /// A node registers as an aggregator with its slot budget (its daemon, at start).
    Host {
        node: NodeId,
        ip: std::net::Ipv4Addr,
        slots: u32,
        cpu_millis: u32,
    },
    /// A worker's session with its node's agent ended without a goodbye.
    WorkerGone {
        name: String,
        rank: u16,
        reason: String,
    },
    /// A node measured its bandwidth to an aggregating host (its daemon's probe).
    Bandwidth {
        from: NodeId,
        to: NodeId,
        bytes_per_s: u64,
    },
    /// An aggregating host's counters saw a pair's rate move (its daemon's drift watch).
    Remeasure {
        from: NodeId,
        to: NodeId,
    },
}

impl AggRequest {
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            AggRequest::List | AggRequest::Show { .. } | AggRequest::Stats
        )
    }
}

/// One job as `yard agg job list|show` give it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AggJobRow {
    pub job: yard_raft_store::aggregation::AggJob,
    /// Where workers send: the aggregator's address and port, once placed.
    pub aggregator: Option<std::net::SocketAddrV4>,
    /// Why the job has no aggregator yet, if it is complete and waits for one.
    pub waiting: Option<String>,
    /// The addresses of the job's aggregators by node: the root's, and each cluster's in a tree.
    pub aggregators: std::collections::BTreeMap<NodeId, Ipv4Addr>,
    /// Each member's measured bandwidth to the aggregator it sends to, bytes/s (ranks whose
    /// node has not measured it are absent).
    pub bandwidth: std::collections::BTreeMap<u16, u64>,
}

impl AggJobRow {
    /// What worker `rank` sums as, if the job runs: an operator's worker (joined with `yard agg
    /// job join`) follows the job through these rows, as an agent's session does through its
    /// pushed memberships.
    pub fn membership(&self, rank: u16) -> Option<yard_agg::worker::Membership> {
        yard_actors::aggregator::core::membership(&self.job, &self.aggregators, rank)
    }
}

/// `yard agg stats`: one node's aggregator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AggStats {
    pub node: NodeId,
    pub enabled: bool,
    pub slot_count: u32,
    pub jobs: Vec<yard_actors::aggregator::actor::JobStats>,
    pub counters: Vec<(String, u64, u64)>,
    pub errors: u64,
    pub last_error: Option<String>,
}

/// Operator requests about the gateway.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum GatewayRequest {
    AddVips(Vec<Ipv4Addr>),
    RemoveVips(Vec<Ipv4Addr>),
    PutEndpoints(Vec<Endpoint>),
    RemoveEndpoints(Vec<EndpointKey>),
    SetDrain {
        node: NodeId,
        draining: bool,
    },
    ListVips,
    ListEndpoints,
    /// The contacted node's own data plane (never forwarded).
    Stats,
}

impl GatewayRequest {
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            GatewayRequest::ListVips | GatewayRequest::ListEndpoints | GatewayRequest::Stats
        )
    }
}

/// One row of `yard gateway vip list`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipRow {
    pub vip: Ipv4Addr,
    pub owner: Option<NodeId>,
    pub handoff_to: Option<NodeId>,
}

/// `yard gateway stats`: one node's data plane.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GatewayStats {
    pub node: NodeId,
    pub enabled: bool,
    pub lease_remaining_ms: u64,
    pub fenced: bool,
    /// (vip, "owned" | "forward_only")
    pub vips: Vec<(Ipv4Addr, String)>,
    /// Owned VIPs answered for and since when (the host's monotonic clock, ms).
    pub owned_since: Vec<(Ipv4Addr, u64)>,
    /// The host's monotonic clock when these stats were published (ms).
    pub now_ms: u64,
    pub endpoints: usize,
    pub revision: u64,
    /// (counter, packets, bytes)
    pub counters: Vec<(String, u64, u64)>,
    pub errors: u64,
}

impl AdminRequest {
    /// Whether this is a key-value operation (the data path) rather than cluster management.
    pub fn is_kv(&self) -> bool {
        matches!(
            self,
            AdminRequest::KvGet { .. }
                | AdminRequest::KvList { .. }
                | AdminRequest::KvPut { .. }
                | AdminRequest::KvDelete { .. }
                | AdminRequest::KvCas { .. }
        )
    }

    /// Whether serving the request changes nothing, so it may be sent again after a timeout.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            AdminRequest::Status
                | AdminRequest::Members
                | AdminRequest::KvGet { .. }
                | AdminRequest::KvList { .. }
                | AdminRequest::Diagnose { .. }
                | AdminRequest::PlanShow
                | AdminRequest::SnapshotSave
        ) || matches!(self, AdminRequest::Gateway(g) if g.is_read_only())
            || matches!(self, AdminRequest::Agg(a) if a.is_read_only())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    pub id: NodeId,
    pub name: String,
    pub addr: String,
    /// The host's failure domain (`node.zone`; empty: none).
    pub zone: String,
}

/// One answer to a watch: entries in log order, after the snapshot when there is one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchBatch {
    /// The leader the member knows of, so the agent can forward writes without a vote.
    pub leader: Option<(NodeId, yard_raft_store::NodeInfo)>,
    /// The member's tables, when the asked index was older than its watch log.
    pub snapshot: Option<std::sync::Arc<Vec<u8>>>,
    /// Encoded log entries, in order from the asked index (or from after the snapshot).
    pub entries: Vec<std::sync::Arc<Vec<u8>>>,
    /// The log index of the membership in force at the member, and its members (voters and
    /// replicas): a host that Raft still calls a member learns from it that it was removed.
    pub membership_at: u64,
    pub members: std::collections::BTreeSet<NodeId>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedeemRequest {
    pub token: String,
    pub id: NodeId,
    pub name: String,
    pub ips: Vec<std::net::IpAddr>,
}

/// The reply on the same stream.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Raft(Result<RaftReply, RaftFailure>),
    Admin(AdminReply),
    Joined {
        leader: NodeId,
        /// What the cluster made the host: "voter", "replica" or "agent".
        role: String,
    },
    Watch(WatchBatch),
    /// The leader took a member's host reports.
    ReportsAccepted,
    /// The agents a member serves.
    Watchers(Vec<Watched>),
    /// The leader's read index.
    ReadIndex {
        index: u64,
    },
    Certificate {
        ca: String,
        cert: CertPem,
    },
    Pong {
        id: NodeId,
    },
    /// The request was refused or failed and did not take effect; one clear sentence.
    Error(String),
    /// The request may or may not have taken effect (e.g. the leader died mid-write); a client
    /// must not assume either.
    Indefinite(String),
    /// A voter's answer to a lease renewal: the lease, and the revision the voter had
    /// applied. A node whose lease had lapsed must apply the highest such revision of a round
    /// before serving again: its VIPs may have been given away meanwhile.
    LeaseGranted {
        granted_ms: u64,
        revision: u64,
    },
    /// The leader took a probe summary.
    ProbeAccepted,
    /// A voter applied a revocation; its promise to the node ran `remaining_ms` more when it
    /// applied it, `held_ms` before it answered (storing it durably).
    LeaseRevoked {
        remaining_ms: u64,
        held_ms: u64,
    },
    /// A voter applied an un-revocation.
    LeaseUnrevoked,
    /// The answer to a pre-vote: whether this node would vote for the asker now.
    PreVote {
        granted: bool,
    },
    /// The leader took a gateway node's rates.
    RatesAccepted,
    /// The leader marked a join token used for the redemption asked.
    TokenConsumed,
    /// A renewed node certificate (PEM) for the key of the request, and the CA (PEM).
    Renewed {
        ca: String,
        cert: String,
    },
    /// A one-use ticket for this node's bandwidth sink.
    BandwidthTicket {
        ticket: [u8; 16],
    },
    /// This node's release level and the cluster level of its tables.
    Level {
        release: u32,
        cluster: u32,
    },
    /// This node's PKI as it serves now.
    Pki(crate::pki::PkiReport),
    /// This voter took the handover in: it stands for election, or holds back. Last in the enum.
    Standing,
}

/// A Raft RPC failed on the receiver (serialised openraft error text).
#[derive(Debug, Serialize, Deserialize)]
pub struct RaftFailure(pub String);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KvEntry {
    pub key: String,
    pub value: String,
    pub revision: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberStatus {
    pub id: NodeId,
    pub name: String,
    pub addr: String,
    pub role: String,
    pub reachable: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ActorHealth {
    pub name: String,
    pub healthy: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub commit_index: u64,
    pub members: Vec<MemberStatus>,
    pub actors: Vec<ActorHealth>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AdminReply {
    Status(Status),
    Value(Option<KvEntry>),
    List(Vec<KvEntry>),
    Written {
        revision: u64,
    },
    Deleted {
        revision: u64,
        existed: bool,
    },
    Cas {
        succeeded: bool,
        revision: u64,
        current: Option<KvEntry>,
    },
    Removed {
        id: NodeId,
    },
    Token {
        token: String,
        expires_unix_ms: u64,
    },
    Vips(Vec<VipRow>),
    Endpoints(Vec<Endpoint>),
    GatewayStats(GatewayStats),
    Diagnosis(DiagnosisView),
    AggJobs(Vec<AggJobRow>),
    AggStats(AggStats),
    Plan(Box<PlanView>),
    Members(MembersView),
    /// A snapshot file's bytes.
    Snapshot(Vec<u8>),
    /// Leadership moved from `from` to `to`. Last in the enum.
    LeaderMoved {
        from: NodeId,
        to: NodeId,
    },
}

/// One host in `yard members`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostRow {
    pub id: NodeId,
    pub name: String,
    pub addr: String,
    /// "voter", "replica" or "agent".
    pub role: String,
    /// Its `node.zone` (empty: none).
    pub zone: String,
    /// Whether the leader holds it alive: its member liveness for voters and replicas, the
    /// committed host liveness for agents.
    pub alive: bool,
    /// Log entries it trails the leader's commit by (None: not known, e.g. an agent no member
    /// serves).
    pub lag: Option<u64>,
    /// For an agent: the member whose watch it follows.
    pub follows: Option<NodeId>,
}

/// `yard members`: the hosts and the autopilot's latest reason.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MembersView {
    pub leader: NodeId,
    pub commit_index: u64,
    pub hosts: Vec<HostRow>,
    pub autopilot: String,
}

/// `yard plan show`: the leader's service planner as it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlanView {
    pub leader: NodeId,
    /// Whether `[planner]` is enabled on the leader.
    pub enabled: bool,
    /// The latest re-plan, and the latest that moved a VIP.
    pub latest: Option<PlanRecord>,
    pub last_moved: Option<PlanRecord>,
    /// Each gateway node's replicated liveness history and failure estimate.
    pub health: Vec<NodeHealthView>,
}

/// One re-plan on the leader.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlanRecord {
    pub at_unix_ms: u64,
    pub term: u64,
    /// VIPs with a measured rate.
    pub measured_vips: usize,
    pub report: yard_actors::gateway::replan::ReplanReport,
}

/// One node's liveness history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeHealthView {
    pub node: NodeId,
    pub history: yard_actors::gateway::replan::NodeHealth,
    pub fail_prob: f64,
}

/// One job's diagnosis as replicated.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobView {
    pub job: String,
    /// Current verdicts, root cause first.
    pub verdicts: Vec<yard_diagnosis::verdict::Verdict>,
    /// Verdicts raised since the job was first seen (newest last, bounded).
    pub history: Vec<yard_diagnosis::verdict::Verdict>,
    pub updated_unix_ms: u64,
}

/// `yard diagnose`: jobs' verdicts, and the timeline records when asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiagnosisView {
    pub jobs: Vec<JobView>,
    /// Collective records and members around the top verdict of the (single) job asked for,
    /// from the leader's analyzer; `None` if it no longer watches the job.
    pub timeline: Option<(
        Vec<yard_diagnosis::event::Coll>,
        Vec<yard_diagnosis::event::Member>,
    )>,
}

/// One watched agent as its member sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Watched {
    pub host: NodeId,
    /// The log index its last poll asked from.
    pub from: u64,
    /// How long ago its last poll arrived.
    pub ago_ms: u64,
}
