//! Who may send what: the one role model every request on the endpoint passes before it is
//! served ([`admitted`], called first by `dispatch`). It is a pure function of the peer's role
//! (from its verified certificate), the request and what this node knows of the cluster
//! ([`ClusterView`]), so every rule is unit-tested here without a cluster.
//!
//! The rules, by role:
//! - **Admin certificates** do operators' work: `Admin` requests, and `AdminOnce` for
//!   key-value writes. They take no part in Raft, joins, leases or reports.
//! - **Anonymous peers** (no client certificate) may only redeem a join token.
//! - **Node certificates** do their own node's work only:
//!   - Raft: a `Vote` only from the candidate it names, `AppendEntries` and `InstallSnapshot`
//!     only from the leader their vote names, and pre-votes only from members. A node that
//!     knows no membership yet (a host being added, whose first entries bring the membership)
//!     takes entries from any node, still only from the leader their vote names.
//!   - Gateway lease revocations only from the leader this node follows, stamped with the
//!     current term: a revocation from another node, or one stamped with a later term that
//!     could never be superseded, is refused. Renewals, graces and rates are about the
//!     caller's own lease by construction (the node is the certificate's).
//!   - Host reports only from members (they serve the agents reported on); probe reports only
//!     from hosts. A probe batch names ranks and a host name its client declared, not the
//!     node, so it cannot be tied closer to its sender than that.
//!   - A join for its own id, or a host passing another host's join on to the leader.
//!   - Marking a token used (`ConsumeToken`) only from a host: the signing node asks the
//!     leader, presenting the token's secret.
//!   - A certificate renewal only from a host, for itself: the certificate names the caller.
//!   - A bandwidth sink's ticket only for a host.
//!   - Operators' requests forwarded to the leader (see below).
//!
//! # Forwarded operators' requests
//!
//! A follower or an agent forwards an operator's request to the leader over its own
//! connection, so the leader sees the forwarder's node certificate, not the admin's. The
//! leader accepts such a request only when:
//! - the forwarder is a host of the cluster (a Raft member, or an agent in the hosts table):
//!   a certificate whose host was never admitted or has been removed forwards nothing;
//! - the request is one a host forwards at all: a node's own stats (`gateway stats`,
//!   `agg stats`) are served where they are asked and never forwarded;
//! - a request a daemon makes about itself names the forwarder: an aggregator's registration
//!   (`Host`), a bandwidth figure (`Bandwidth`, from the measuring node) and a re-measure
//!   (`Remeasure`, to the aggregating node). No operator tool sends these, so one naming
//!   another node is a forgery.
//!
//! The forwarder in turn forwards only what it served itself: an admin it authenticated by
//! its certificate, its own daemon, or a local worker the aggregation agent admitted.
//!
//! Operator writes need the operator's proof: the CLI signs every request with the admin key
//! (`crate::operator_proof`), a forwarder sends the signature on with the request, and an
//! operator write forwarded without one is refused ([`needs_operator_proof`]), so a
//! compromised host cannot pass off writes it made up. The node serving a signed request
//! checks the proof (an admin certificate of this cluster valid now, the signature, the time,
//! the nonce). Unsigned forwarding is taken only where no CA is known or
//! `admin.unsigned_forwarding` is set for an upgrade from a release whose CLI does not sign.

use std::fmt;

use yard_raft_store::NodeId;

use crate::rpc::{AdminRequest, AggRequest, GatewayRequest, RaftRequest, Request};
use crate::tls::PeerRole;

/// What the role model needs to know of the cluster, as this node sees it now.
pub trait ClusterView {
    /// Whether `id` is a Raft member (voter or replica) in the membership in force here.
    fn is_member(&self, id: NodeId) -> bool;
    /// Whether this node knows any membership at all (false on a host not yet added).
    fn knows_membership(&self) -> bool;
    /// Whether `id` is a host of the cluster: a member, or an agent in the hosts table.
    fn is_host(&self, id: NodeId) -> bool;
    /// The leader this node follows in its current term, if it knows one.
    fn leader(&self) -> Option<NodeId>;
    /// This node's current Raft term.
    fn term(&self) -> u64;
    /// Whether node `id` was removed from the cluster, its certificate revoked with it.
    fn is_revoked(&self, id: NodeId) -> bool;
    /// Whether hosts may forward operator writes without the operator's signature: only where
    /// no CA is known (the in-memory test clusters) or `admin.unsigned_forwarding` is set for a
    /// rolling upgrade from a release whose CLI does not sign.
    fn takes_unsigned_operator_writes(&self) -> bool;
}

/// Why a request was refused before it was served; each renders as one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The peer's certificate is of the wrong kind for this request.
    #[error("{what} need {needs}")]
    Role {
        what: &'static str,
        needs: &'static str,
    },
    /// The sender was removed from the cluster: its certificate is refused for everything.
    #[error("node {sender} was removed from this cluster and its certificate is revoked")]
    Revoked { sender: NodeId },
    /// The sender is not (or no longer) a Raft member here.
    #[error("node {sender} is not a raft member of this cluster")]
    NotMember { sender: NodeId },
    /// An operator write forwarded without the operator's signature.
    #[error("node {sender} forwarded an operator write without the operator's signature; this cluster takes forwarded operator writes only as the yard CLI of this release signs them")]
    Unsigned { sender: NodeId },
    /// The sender is not (or no longer) a host of this cluster.
    #[error("node {sender} is not a host of this cluster")]
    NotHost { sender: NodeId },
    /// A vote sent by a node other than the candidate it names.
    #[error("node {sender} sent a vote for candidate {candidate}")]
    NotCandidate { sender: NodeId, candidate: Named },
    /// Entries or a snapshot sent by a node other than the leader their vote names.
    #[error("node {sender} sent raft entries of leader {leader}")]
    NotVoteLeader { sender: NodeId, leader: Named },
    /// A lease revocation from a node that is not the leader this node follows.
    #[error(
        "gateway lease revocations come only from the leader; node {sender} is not leader {leader}"
    )]
    NotLeader { sender: NodeId, leader: Named },
    /// A lease revocation stamped with another term than the current one.
    #[error(
        "a gateway lease revocation stamped with term {stamp} is not of the current term {term}"
    )]
    WrongTerm { stamp: u64, term: u64 },
    /// A node's request about another node.
    #[error("node {sender} may not {what} for node {named}")]
    NotItsOwn {
        sender: NodeId,
        what: &'static str,
        named: NodeId,
    },
    /// A request no one forwards, arriving forwarded.
    #[error("{0}")]
    NotForwardable(&'static str),
    /// A client session on something other than a key-value write.
    #[error("only key-value writes carry a client session")]
    SessionOnNonKv,
}

/// A node id that may be absent (a vote naming no node), printed as "none" then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named(pub Option<NodeId>);

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, "{id}"),
            None => f.write_str("none"),
        }
    }
}

/// Whether a peer with `role` may send `req` to a node that sees the cluster as `view`;
/// otherwise why not. Called first for every request the endpoint serves.
pub fn admitted(role: &PeerRole, req: &Request, view: &impl ClusterView) -> Result<(), Refusal> {
    match role {
        PeerRole::Anonymous => match req {
            Request::RedeemToken(_) => Ok(()),
            other => Err(Refusal::Role {
                what: kind(other),
                needs: needed(other),
            }),
        },
        PeerRole::Admin => match req {
            Request::Admin(_) => Ok(()),
            Request::AdminOnce { req, .. } if req.is_kv() => Ok(()),
            Request::AdminOnce { .. } => Err(Refusal::SessionOnNonKv),
            Request::SignedAdmin {
                tag: Some(_), req, ..
            } if !req.is_kv() => Err(Refusal::SessionOnNonKv),
            Request::SignedAdmin { .. } | Request::Level | Request::Pki => Ok(()),
            Request::RedeemToken(_) => Err(Refusal::Role {
                what: "token redemptions",
                needs: "no certificate (a host without one redeems its token)",
            }),
            other => Err(Refusal::Role {
                what: kind(other),
                needs: needed(other),
            }),
        },
        PeerRole::Node(sender) => node_admitted(*sender, req, view),
    }
}

fn node_admitted(sender: NodeId, req: &Request, view: &impl ClusterView) -> Result<(), Refusal> {
    if view.is_revoked(sender) {
        return Err(Refusal::Revoked { sender });
    }
    let member = || {
        if view.is_member(sender) {
            Ok(())
        } else {
            Err(Refusal::NotMember { sender })
        }
    };
    let host = || {
        if view.is_host(sender) {
            Ok(())
        } else {
            Err(Refusal::NotHost { sender })
        }
    };
    match req {
        Request::Raft(r) => {
            // A host being added knows no membership until its first entries bring it.
            if view.knows_membership() {
                member()?;
            }
            let named = match r {
                RaftRequest::Vote(v) => v.vote.leader_id().voted_for(),
                RaftRequest::AppendEntries(a) => a.vote.leader_id().voted_for(),
                RaftRequest::InstallSnapshot(s) => s.vote.leader_id().voted_for(),
            };
            if named == Some(sender) {
                Ok(())
            } else if matches!(r, RaftRequest::Vote(_)) {
                Err(Refusal::NotCandidate {
                    sender,
                    candidate: Named(named),
                })
            } else {
                Err(Refusal::NotVoteLeader {
                    sender,
                    leader: Named(named),
                })
            }
        }
        Request::PreVote => member(),
        Request::GatewayRevoke { stamp, .. } | Request::GatewayUnrevoke { stamp, .. } => {
            let leader = view.leader();
            if leader != Some(sender) {
                return Err(Refusal::NotLeader {
                    sender,
                    leader: Named(leader),
                });
            }
            if stamp.term != view.term() {
                return Err(Refusal::WrongTerm {
                    stamp: stamp.term,
                    term: view.term(),
                });
            }
            Ok(())
        }
        Request::HostReports { .. } => member(),
        Request::ProbeReport { .. } => host(),
        Request::Join(j) if j.id == sender => Ok(()),
        Request::Join(_) => host(),
        Request::RedeemToken(_) | Request::ConsumeToken(_) => host(),
        // For the caller's own certificate by construction (the signer names the certificate's
        // node), and only while it is a host: a removed host's is revoked above.
        Request::RenewCertificate { .. } => host(),
        // Only hosts measure bandwidth; the ticket names the caller.
        Request::BandwidthTicket => host(),
        Request::Admin(r) => {
            host()?;
            forwardable(sender, r)?;
            unsigned_forwardable(sender, r, view)
        }
        Request::AdminOnce { req, .. } if req.is_kv() => {
            host()?;
            unsigned_forwardable(sender, req, view)
        }
        Request::AdminOnce { .. } => Err(Refusal::SessionOnNonKv),
        Request::SignedAdmin {
            tag: Some(_), req, ..
        } if !req.is_kv() => Err(Refusal::SessionOnNonKv),
        // The proof itself is checked where the request is served (`crate::operator_proof`).
        Request::SignedAdmin { req, .. } => {
            host()?;
            forwardable(sender, req)
        }
        // About the caller's own lease and data plane by construction: the node is the
        // certificate's.
        Request::GatewayRenew { .. }
        | Request::GatewayGrace { .. }
        | Request::GatewayRates { .. } => Ok(()),
        // A probe answers with the id the certificate already shows. Watches serve the
        // tables to any node certificate: a removed voter learns of its removal from one, and
        // a removed host's certificate is refused by revocation, not here.
        Request::Probe | Request::Watch { .. } | Request::Watchers | Request::ReadIndex => Ok(()),
        // Two numbers every host and operator may know (the leader asks every host), and which
        // CAs a node trusts and uses (public certificates' hashes).
        Request::Level | Request::Pki => Ok(()),
        // The handler takes it only from the leader this node follows.
        Request::Handover { .. } => Ok(()),
    }
}

/// Whether a host may forward operator request `r` to the leader (see the module doc).
fn forwardable(sender: NodeId, r: &AdminRequest) -> Result<(), Refusal> {
    let own = |what: &'static str, named: NodeId| {
        if named == sender {
            Ok(())
        } else {
            Err(Refusal::NotItsOwn {
                sender,
                what,
                named,
            })
        }
    };
    match r {
        AdminRequest::Gateway(GatewayRequest::Stats) => Err(Refusal::NotForwardable(
            "a node's gateway stats are served where they are asked, never forwarded",
        )),
        AdminRequest::Agg(AggRequest::Stats) => Err(Refusal::NotForwardable(
            "a node's aggregator stats are served where they are asked, never forwarded",
        )),
        AdminRequest::Agg(AggRequest::Host { node, .. }) => own("register an aggregator", *node),
        AdminRequest::Agg(AggRequest::Bandwidth { from, .. }) => own("report bandwidth", *from),
        AdminRequest::Agg(AggRequest::Remeasure { to, .. }) => own("ask a re-measure", *to),
        _ => Ok(()),
    }
}

/// Whether operator request `r`, forwarded by a host, needs the operator's signature: every
/// write but the ones a daemon makes about itself or for a local worker (an aggregator's
/// registration, a bandwidth figure, a re-measure, a worker's join and departure). Reads need
/// none: every host holds the tables they read.
pub fn needs_operator_proof(r: &AdminRequest) -> bool {
    !r.is_read_only()
        && !matches!(
            r,
            AdminRequest::Agg(
                AggRequest::Host { .. }
                    | AggRequest::Bandwidth { .. }
                    | AggRequest::Remeasure { .. }
                    | AggRequest::Join { .. }
                    | AggRequest::WorkerGone { .. }
            )
        )
}

/// Whether a host may forward `r` without the operator's signature.
fn unsigned_forwardable(
    sender: NodeId,
    r: &AdminRequest,
    view: &impl ClusterView,
) -> Result<(), Refusal> {
    if needs_operator_proof(r) && !view.takes_unsigned_operator_writes() {
        Err(Refusal::Unsigned { sender })
    } else {
        Ok(())
    }
}

/// What a request is, for a refusal.
fn kind(req: &Request) -> &'static str {
    match req {
        Request::Raft(_) | Request::PreVote => "raft traffic",
        Request::Admin(_) | Request::AdminOnce { .. } | Request::SignedAdmin { .. } => {
            "admin requests"
        }
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
        Request::Join(_) => "joins",
        Request::RedeemToken(_) | Request::ConsumeToken(_) => "token redemptions",
        Request::RenewCertificate { .. } => "certificate renewals",
        Request::BandwidthTicket => "bandwidth probes",
        Request::Level => "release levels",
        Request::Pki => "certificate authorities",
        Request::Handover { .. } => "leadership handovers",
    }
}

/// The certificate a request needs, for a refusal.
fn needed(req: &Request) -> &'static str {
    match req {
        Request::Admin(_) | Request::AdminOnce { .. } | Request::SignedAdmin { .. } => {
            "an admin certificate"
        }
        Request::Join(_) => "a node certificate; redeem a join token first",
        _ => "a node certificate",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    use openraft::{SnapshotMeta, Vote};
    use yard_actors::gateway::lease::Stamp;

    use crate::rpc::{JoinRequest, RedeemRequest};

    /// Members 1-3 (2 leads in term 5), agent 4; 9 is no host.
    struct View {
        members: BTreeSet<NodeId>,
        agents: BTreeSet<NodeId>,
        leader: Option<NodeId>,
        term: u64,
        revoked: BTreeSet<NodeId>,
        unsigned: bool,
    }

    impl View {
        fn three() -> Self {
            View {
                members: [1, 2, 3].into(),
                agents: [4].into(),
                leader: Some(2),
                term: 5,
                revoked: BTreeSet::new(),
                unsigned: false,
            }
        }

        fn fresh() -> Self {
            View {
                members: BTreeSet::new(),
                agents: BTreeSet::new(),
                leader: None,
                term: 0,
                revoked: BTreeSet::new(),
                unsigned: false,
            }
        }
    }

    impl ClusterView for View {
        fn is_member(&self, id: NodeId) -> bool {
            self.members.contains(&id)
        }
        fn knows_membership(&self) -> bool {
            !self.members.is_empty()
        }
        fn is_host(&self, id: NodeId) -> bool {
            self.members.contains(&id) || self.agents.contains(&id)
        }
        fn leader(&self) -> Option<NodeId> {
            self.leader
        }
        fn term(&self) -> u64 {
            self.term
        }
        fn is_revoked(&self, id: NodeId) -> bool {
            self.revoked.contains(&id)
        }
        fn takes_unsigned_operator_writes(&self) -> bool {
            self.unsigned
        }
    }

    fn vote(candidate: NodeId) -> Request {
        Request::Raft(RaftRequest::Vote(VoteRequest {
            vote: Vote::new(6, candidate),
            last_log_id: None,
        }))
    }

    fn append(leader: NodeId) -> Request {
        Request::Raft(RaftRequest::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(5, leader),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        }))
    }

    fn snapshot(leader: NodeId) -> Request {
        Request::Raft(RaftRequest::InstallSnapshot(InstallSnapshotRequest {
            vote: Vote::new_committed(5, leader),
            meta: SnapshotMeta::default(),
            offset: 0,
            data: vec![],
            done: true,
        }))
    }

    fn kv_put() -> AdminRequest {
        AdminRequest::KvPut {
            key: "k".into(),
            value: "v".into(),
        }
    }

    fn redeem() -> Request {
        Request::RedeemToken(RedeemRequest {
            token: "a.b.c".into(),
            id: 9,
            name: "n9".into(),
            ips: vec![],
        })
    }

    fn join(id: NodeId) -> Request {
        Request::Join(JoinRequest {
            id,
            name: format!("n{id}"),
            addr: "198.18.0.9:7480".into(),
            zone: String::new(),
        })
    }

    fn revoke(term: u64) -> Request {
        Request::GatewayRevoke {
            node: 3,
            stamp: Stamp { term, seq: 1 },
        }
    }

    fn ok(role: PeerRole, req: &Request) -> bool {
        admitted(&role, req, &View::three()).is_ok()
    }

    fn why(role: PeerRole, req: &Request) -> String {
        admitted(&role, req, &View::three())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_vote_is_taken_only_from_the_candidate_it_names_and_a_member() {
        assert!(ok(PeerRole::Node(3), &vote(3)));
        assert_eq!(
            why(PeerRole::Node(1), &vote(3)),
            "node 1 sent a vote for candidate 3"
        );
        assert_eq!(
            why(PeerRole::Node(9), &vote(9)),
            "node 9 is not a raft member of this cluster"
        );
        // An agent holds no vote.
        assert!(!ok(PeerRole::Node(4), &vote(4)));
    }

    #[test]
    fn entries_and_snapshots_are_taken_only_from_the_leader_their_vote_names() {
        for req in [append(2), snapshot(2)] {
            assert!(ok(PeerRole::Node(2), &req));
            assert_eq!(
                why(PeerRole::Node(3), &req),
                "node 3 sent raft entries of leader 2"
            );
            assert!(!ok(PeerRole::Node(9), &req));
        }
        // A host being added takes its first entries from the leader they name, member or not.
        assert!(admitted(&PeerRole::Node(1), &append(1), &View::fresh()).is_ok());
        assert!(admitted(&PeerRole::Node(1), &append(2), &View::fresh()).is_err());
    }

    #[test]
    fn raft_traffic_needs_a_node_certificate() {
        for req in [vote(1), append(2), snapshot(2), Request::PreVote] {
            assert_eq!(
                why(PeerRole::Admin, &req),
                "raft traffic need a node certificate"
            );
            assert!(!ok(PeerRole::Anonymous, &req));
        }
        assert!(ok(PeerRole::Node(1), &Request::PreVote));
        assert!(!ok(PeerRole::Node(4), &Request::PreVote));
    }

    #[test]
    fn lease_revocations_come_only_from_the_leader_in_its_term() {
        let unrevoke = Request::GatewayUnrevoke {
            node: 3,
            stamp: Stamp { term: 5, seq: 2 },
        };
        assert!(ok(PeerRole::Node(2), &revoke(5)));
        assert!(ok(PeerRole::Node(2), &unrevoke));
        assert_eq!(
            why(PeerRole::Node(3), &revoke(5)),
            "gateway lease revocations come only from the leader; node 3 is not leader 2"
        );
        assert!(!ok(PeerRole::Node(1), &unrevoke));
        // A stamp no later revocation could supersede.
        assert_eq!(
            why(PeerRole::Node(2), &revoke(u64::MAX)),
            format!(
                "a gateway lease revocation stamped with term {} is not of the current term 5",
                u64::MAX
            )
        );
        let leaderless = View {
            leader: None,
            ..View::three()
        };
        assert!(admitted(&PeerRole::Node(2), &revoke(5), &leaderless).is_err());
        assert!(!ok(PeerRole::Admin, &revoke(5)));
    }

    /// A removed host's certificate does nothing any more: not its Raft traffic, not its own
    /// reports, not a forwarded write, not even a watch. Others are unaffected.
    /// The leader asks every host for its release level, and an operator asks any node; a
    /// peer without a certificate learns nothing, and a revoked one is refused as for all.
    #[test]
    fn release_levels_are_answered_to_hosts_and_operators_only() {
        let mut view = View::three();
        view.revoked.insert(4);
        assert_eq!(admitted(&PeerRole::Admin, &Request::Level, &view), Ok(()));
        assert_eq!(admitted(&PeerRole::Admin, &Request::Pki, &view), Ok(()));
        assert_eq!(admitted(&PeerRole::Node(2), &Request::Pki, &view), Ok(()));
        assert!(matches!(
            admitted(&PeerRole::Anonymous, &Request::Pki, &view),
            Err(Refusal::Role { .. })
        ));
        assert_eq!(admitted(&PeerRole::Node(2), &Request::Level, &view), Ok(()));
        assert!(matches!(
            admitted(&PeerRole::Anonymous, &Request::Level, &view),
            Err(Refusal::Role { .. })
        ));
        assert_eq!(
            admitted(&PeerRole::Node(4), &Request::Level, &view),
            Err(Refusal::Revoked { sender: 4 })
        );
    }

    #[test]
    fn a_revoked_node_certificate_is_refused_for_everything() {
        let mut view = View::three();
        view.revoked.insert(4);
        view.revoked.insert(3);
        let requests = [
            signed(None, kv_put()),
            Request::Watch {
                from: 0,
                hold_ms: 0,
            },
            Request::Probe,
            Request::GatewayRenew {
                applied: 0,
                lease_left_ms: 0,
            },
            append(3),
            join(4),
        ];
        for (sender, req) in [(4, &requests[..]), (3, &requests[..])]
            .into_iter()
            .flat_map(|(s, rs)| rs.iter().map(move |r| (s, r)))
        {
            assert_eq!(
                admitted(&PeerRole::Node(sender), req, &view),
                Err(Refusal::Revoked { sender }),
                "{req:?}"
            );
        }
        assert_eq!(
            Refusal::Revoked { sender: 4 }.to_string(),
            "node 4 was removed from this cluster and its certificate is revoked"
        );
        assert!(admitted(&PeerRole::Node(1), &signed(None, kv_put()), &view).is_ok());
        assert!(admitted(&PeerRole::Node(2), &append(2), &view).is_ok());
    }

    /// A request with a proof; admission does not check the proof itself (the server does,
    /// `crate::operator_proof`), only who forwards what.
    fn signed(tag: Option<yard_raft_store::SessionTag>, req: AdminRequest) -> Request {
        Request::SignedAdmin {
            tag,
            req,
            proof: crate::operator_proof::OperatorProof {
                cert: Vec::new(),
                issued_unix_ms: 0,
                nonce: [0; 16],
                signature: Vec::new(),
            },
        }
    }

    const TAG: yard_raft_store::SessionTag = yard_raft_store::SessionTag {
        client: 1,
        seq: 1,
        first_unacked: 0,
    };

    #[test]
    fn a_node_certificate_forwards_operators_requests_only_from_a_host() {
        let put = signed(None, kv_put());
        assert!(ok(PeerRole::Node(3), &put));
        assert!(ok(PeerRole::Node(4), &put));
        assert_eq!(
            why(PeerRole::Node(9), &put),
            "node 9 is not a host of this cluster"
        );
        assert!(ok(PeerRole::Node(4), &signed(Some(TAG), kv_put())));
        assert!(!ok(PeerRole::Node(9), &signed(Some(TAG), kv_put())));
        assert_eq!(
            why(PeerRole::Node(1), &signed(Some(TAG), AdminRequest::Status)),
            "only key-value writes carry a client session"
        );
        assert!(ok(PeerRole::Admin, &signed(Some(TAG), kv_put())));
        assert!(!ok(PeerRole::Anonymous, &put));
        let once = |req| Request::AdminOnce { tag: TAG, req };
        assert_eq!(
            why(PeerRole::Node(1), &once(AdminRequest::Status)),
            "only key-value writes carry a client session"
        );
        assert!(!ok(PeerRole::Admin, &once(AdminRequest::Status)));
        assert!(ok(PeerRole::Admin, &once(kv_put())));
    }

    /// A compromised host cannot pass off an operator write it made up: without the
    /// operator's signature a forwarded write is refused, whatever its kind; reads and what a
    /// daemon reports about itself pass.
    #[test]
    fn a_forwarded_operator_write_needs_the_operator_s_signature() {
        let writes = [
            kv_put(),
            AdminRequest::MembersRemove { id: 2 },
            AdminRequest::TokenCreateBound {
                ttl_secs: 60,
                node_id: 9,
                name: "n9".into(),
            },
            AdminRequest::Agg(AggRequest::Delete { name: "j".into() }),
        ];
        for w in &writes {
            assert_eq!(
                admitted(
                    &PeerRole::Node(3),
                    &Request::Admin(w.clone()),
                    &View::three()
                ),
                Err(Refusal::Unsigned { sender: 3 }),
                "{w:?}"
            );
            assert!(ok(PeerRole::Node(3), &signed(None, w.clone())));
            assert!(
                ok(PeerRole::Admin, &Request::Admin(w.clone())),
                "an admin's own"
            );
        }
        assert_eq!(
            admitted(
                &PeerRole::Node(4),
                &Request::AdminOnce {
                    tag: TAG,
                    req: kv_put()
                },
                &View::three()
            ),
            Err(Refusal::Unsigned { sender: 4 })
        );
        for read in [
            AdminRequest::Status,
            AdminRequest::KvGet { key: "k".into() },
        ] {
            assert!(ok(PeerRole::Node(3), &Request::Admin(read)));
        }
        let gone = AdminRequest::Agg(AggRequest::WorkerGone {
            name: "j".into(),
            rank: 0,
            reason: "gone".into(),
        });
        assert!(ok(PeerRole::Node(3), &Request::Admin(gone)));
        // During a rolling upgrade from a release whose CLI does not sign.
        let upgrading = View {
            unsigned: true,
            ..View::three()
        };
        assert!(admitted(&PeerRole::Node(3), &Request::Admin(kv_put()), &upgrading).is_ok());
    }

    #[test]
    fn a_node_reports_only_about_itself_and_never_forwards_stats() {
        let host = |node| {
            Request::Admin(AdminRequest::Agg(AggRequest::Host {
                node,
                ip: "198.18.0.3".parse().unwrap(),
                slots: 1,
                cpu_millis: 1,
            }))
        };
        assert!(ok(PeerRole::Node(3), &host(3)));
        assert_eq!(
            why(PeerRole::Node(3), &host(1)),
            "node 3 may not register an aggregator for node 1"
        );
        assert!(ok(PeerRole::Admin, &host(1)));
        let bandwidth = |from| {
            Request::Admin(AdminRequest::Agg(AggRequest::Bandwidth {
                from,
                to: 1,
                bytes_per_s: 1,
            }))
        };
        assert!(ok(PeerRole::Node(3), &bandwidth(3)));
        assert!(!ok(PeerRole::Node(3), &bandwidth(2)));
        let remeasure =
            |to| Request::Admin(AdminRequest::Agg(AggRequest::Remeasure { from: 1, to }));
        assert!(ok(PeerRole::Node(3), &remeasure(3)));
        assert!(!ok(PeerRole::Node(3), &remeasure(1)));
        for stats in [
            AdminRequest::Gateway(GatewayRequest::Stats),
            AdminRequest::Agg(AggRequest::Stats),
        ] {
            assert!(!ok(PeerRole::Node(3), &Request::Admin(stats.clone())));
            assert!(ok(PeerRole::Admin, &Request::Admin(stats)));
        }
    }

    #[test]
    fn reports_come_from_members_and_hosts() {
        let reports = Request::HostReports { reports: vec![] };
        assert!(ok(PeerRole::Node(1), &reports));
        assert!(!ok(PeerRole::Node(4), &reports));
        let probe = Request::ProbeReport { batches: vec![] };
        assert!(ok(PeerRole::Node(4), &probe));
        assert!(!ok(PeerRole::Node(9), &probe));
        assert!(!ok(PeerRole::Admin, &probe));
        assert!(!ok(PeerRole::Anonymous, &reports));
    }

    #[test]
    fn joins_are_a_host_s_own_or_passed_on_by_a_host() {
        assert!(ok(PeerRole::Node(9), &join(9)));
        assert!(ok(PeerRole::Node(1), &join(9)));
        assert_eq!(
            why(PeerRole::Node(8), &join(9)),
            "node 8 is not a host of this cluster"
        );
        assert_eq!(
            why(PeerRole::Anonymous, &join(9)),
            "joins need a node certificate; redeem a join token first"
        );
        assert!(!ok(PeerRole::Admin, &join(9)));
    }

    #[test]
    fn an_anonymous_peer_only_redeems_a_token() {
        assert!(ok(PeerRole::Anonymous, &redeem()));
        assert_eq!(
            why(PeerRole::Anonymous, &Request::Admin(AdminRequest::Status)),
            "admin requests need an admin certificate"
        );
        for req in [
            Request::Probe,
            Request::Watch {
                from: 0,
                hold_ms: 0,
            },
            Request::Watchers,
            Request::ReadIndex,
            Request::GatewayRenew {
                applied: 0,
                lease_left_ms: 0,
            },
            Request::GatewayGrace {
                applied: 0,
                grace_ms: 0,
            },
            Request::GatewayRates { rates: vec![] },
            Request::ConsumeToken(RedeemRequest {
                token: "a.b.c".into(),
                id: 9,
                name: "n9".into(),
                ips: vec![],
            }),
        ] {
            assert!(!ok(PeerRole::Anonymous, &req), "{req:?}");
            assert!(!ok(PeerRole::Admin, &req), "{req:?}");
        }
        // An admin certificate does not redeem tokens; a host passes a redemption on to a
        // signing node, and marks a token used at the leader.
        assert!(!ok(PeerRole::Admin, &redeem()));
        assert!(ok(PeerRole::Node(1), &redeem()));
        assert!(!ok(PeerRole::Node(9), &redeem()));
    }

    #[test]
    fn a_node_s_own_lease_and_watch_need_only_its_certificate() {
        for req in [
            Request::Probe,
            Request::Watch {
                from: 0,
                hold_ms: 0,
            },
            Request::Watchers,
            Request::ReadIndex,
            Request::GatewayRenew {
                applied: 0,
                lease_left_ms: 0,
            },
            Request::GatewayGrace {
                applied: 0,
                grace_ms: 0,
            },
            Request::GatewayRates { rates: vec![] },
        ] {
            assert!(ok(PeerRole::Node(4), &req), "{req:?}");
        }
    }

    #[test]
    fn only_a_host_renews_and_only_its_own_certificate() {
        let renew = Request::RenewCertificate { csr: vec![1, 2] };
        assert!(ok(PeerRole::Node(4), &renew), "an agent renews");
        assert!(ok(PeerRole::Node(2), &renew), "a member renews");
        let refused = |role: PeerRole, view: &View| admitted(&role, &renew, view).unwrap_err();
        let three = View::three();
        assert_eq!(
            refused(PeerRole::Node(9), &three).to_string(),
            "node 9 is not a host of this cluster"
        );
        assert_eq!(
            refused(PeerRole::Anonymous, &three).to_string(),
            "certificate renewals need a node certificate"
        );
        assert_eq!(
            refused(PeerRole::Admin, &three).to_string(),
            "certificate renewals need a node certificate"
        );
        let mut removed = View::three();
        removed.revoked.insert(4);
        removed.agents.remove(&4);
        assert_eq!(
            refused(PeerRole::Node(4), &removed).to_string(),
            "node 4 was removed from this cluster and its certificate is revoked"
        );
    }

    #[test]
    fn only_a_host_gets_a_bandwidth_sink_ticket() {
        assert!(ok(PeerRole::Node(4), &Request::BandwidthTicket));
        assert_eq!(
            why(PeerRole::Node(9), &Request::BandwidthTicket),
            "node 9 is not a host of this cluster"
        );
        assert!(!ok(PeerRole::Anonymous, &Request::BandwidthTicket));
        assert!(!ok(PeerRole::Admin, &Request::BandwidthTicket));
    }
}
