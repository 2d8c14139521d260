//! The command set replicated through Raft and the responses `apply` returns.
//!
//! `Command` is encoded by variant index, so new variants go at the end and old ones are never
//! reordered or removed: a log written by an older `yard` must replay on a newer one.

use serde::{Deserialize, Serialize};

/// What openraft knows about a node: enough to reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The QUIC address (`host:port`) other nodes dial.
    pub addr: String,
    /// The node's name; its certificate carries `node-<id>.<cluster>`.
    pub name: String,
}

impl std::fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.addr)
    }
}

/// Node metadata kept in the replicated state (richer than [`NodeInfo`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMeta {
    pub id: u64,
    pub name: String,
    pub addr: String,
    pub roles: Vec<String>,
    pub labels: Vec<(String, String)>,
}

/// A stored join token: only the secret's hash is replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    pub id: String,
    pub secret_sha256: [u8; 32],
    pub expires_unix_ms: u64,
}

/// A join token bound to the one host it was made for: redeemable once, and only for that
/// node id and name, so that a leaked token cannot mint a certificate for any other identity
/// (in particular an existing member's) and cannot be used twice. Only the secret's hash is
/// replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundToken {
    pub id: String,
    pub secret_sha256: [u8; 32],
    pub expires_unix_ms: u64,
    /// The node id the certificate may name.
    pub node_id: u64,
    /// The node name the certificate may name.
    pub name: String,
    /// Set by the one redemption that succeeded; a used token is kept until it expires so
    /// that a second redemption is refused as used rather than as unknown.
    pub used: bool,
}

/// A value with the revision that last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versioned {
    pub value: String,
    /// Revision of the write that produced this value.
    pub revision: u64,
    /// Revision of the write that created the key.
    pub create_revision: u64,
}

/// A replicated command. Never reorder: the variant index is the wire tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Set `key` to `value`.
    Put { key: String, value: String },
    /// Remove `key`.
    Delete { key: String },
    /// Set `key` to `value` only if its current value is `expect` (`None`: key absent).
    Cas {
        key: String,
        expect: Option<String>,
        value: String,
    },
    /// Record or replace a node's metadata.
    SetNode(NodeMeta),
    /// Forget a node's metadata.
    RemoveNode { id: u64 },
    /// Store a join token (hash and expiry only) and drop every token that expired before
    /// `now_unix_ms`, the proposer's clock (carried in the command so replay is deterministic),
    /// so expired tokens never pile up.
    CreateToken { token: JoinToken, now_unix_ms: u64 },
    /// Several client commands in one log entry, applied in order. The leader batches concurrent
    /// writes this way because openraft appends (and flushes) once per proposal.
    Batch(Vec<Command>),
    /// A change to the gateway tables (VIP pool and owners, endpoints, drains).
    Gateway(crate::gateway::GatewayCommand),
    /// A change to the diagnosis verdicts (committed by the analyzer on the leader).
    Diagnosis(crate::diagnosis::DiagnosisCommand),
    /// A client's write tagged with its session, applied at most once however often it is
    /// proposed (see [`crate::session`]). `now_unix_ms` is the proposer's clock: it advances the
    /// replicated clock that expires idle sessions, so replay stays deterministic.
    Once {
        tag: crate::session::SessionTag,
        now_unix_ms: u64,
        cmd: Box<Command>,
    },
    /// A change to the aggregator tables (jobs, members, placements, hosts).
    Aggregation(crate::aggregation::AggCommand),
    /// The leader's one decision that a host which holds no vote is dead (`alive: false`) or
    /// back: every node's actors react to this entry, never to a detector of their own.
    HostLiveness { id: u64, alive: bool },
    /// Store a join token bound to one node id and name, and drop every bound or unbound
    /// token that expired before `now_unix_ms` (the proposer's clock, as in `CreateToken`).
    CreateBoundToken { token: BoundToken, now_unix_ms: u64 },
    /// Mark a bound token used for the certificate about to be signed. Applying it checks
    /// everything a redemption must satisfy, so two concurrent redemptions of one token cannot
    /// both succeed: the token exists, `secret_sha256` matches, it had not expired at
    /// `now_unix_ms` (the proposer's clock), it is unused, `node_id` and `name` are its
    /// binding, and `node_id` is no member or host of the cluster. Otherwise the response is
    /// `Rejected` with the reason.
    RedeemToken {
        token_id: String,
        secret_sha256: [u8; 32],
        node_id: u64,
        name: String,
        now_unix_ms: u64,
    },
    /// Raise the cluster level (`crate::version`) to `level`: the leader's decision that every
    /// host runs a release that reads the formats of that level. It never lowers the level.
    SetClusterLevel { level: u32 },
    /// Drain host `id` before maintenance (`drained: true`), or end the drain: a drained host
    /// is given no vote, replica seat, aggregator seat or VIP, and the work it has moves off it
    /// (its VIPs as the gateway's own drain moves them, in the same revision). Added at
    /// cluster level 1.
    DrainNode { id: u64, drained: bool },
}

/// What applying a command produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A membership or blank entry: nothing to report.
    None,
    /// The write succeeded at `revision`.
    Written { revision: u64 },
    /// A delete at `revision`; `existed` says whether there was anything to delete.
    Deleted { revision: u64, existed: bool },
    /// A compare-and-swap: on failure `current` is what the key held instead.
    Cas {
        succeeded: bool,
        revision: u64,
        current: Option<Versioned>,
    },
    /// One response per command of a [`Command::Batch`], in order.
    Batch(Vec<Response>),
    /// A tagged write that cannot be answered: its session expired or the client had already
    /// acknowledged it, so whether it applied is unknown. Nothing changed.
    Refused(String),
    /// The command was refused by the tables (a quota, a name, a rank): nothing changed, and
    /// this is why, in one sentence.
    Rejected(String),
}
