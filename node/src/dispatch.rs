//! What a node does with each request: authorise it by the peer's role (the role model in
//! `crate::admission`, asked first for every request), then hand it to the
//! part of the node that serves it (Raft, the tables, a host's join, an agent's watch, the
//! gateway, aggregation and diagnosis services). Operators' requests arrive here through the
//! admin actor (`serve_admin`); nodes' requests through the transport's [`Handler`].

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use yard_raft_store::{Command, NodeId, SessionTag};

use crate::admission;
use crate::metrics::METRICS;
use crate::operator_proof::{self, OperatorProof};
use crate::rpc::{AdminReply, AdminRequest, Reply, Request};
use crate::service::{entry, Attempt, Node, ServeAdmin};
use crate::tls::PeerRole;
use crate::transport::{BoxFut, Handler};

impl Node {
    /// Serves one request this node's own daemon makes (an aggregator's registration, a
    /// bandwidth figure), or an operator's without a signature.
    pub async fn serve_admin(&self, req: AdminRequest) -> Reply {
        self.handle_admin(false, None, req).await
    }

    /// Serves one operator request (what the admin actor runs), with the operator's signature
    /// when it came with one: a forward to the leader carries it.
    pub async fn serve_operator(
        &self,
        req: AdminRequest,
        proof: Option<Arc<OperatorProof>>,
    ) -> Reply {
        operator_proof::FORWARD_PROOF
            .scope(proof, self.handle_admin(false, None, req))
            .await
    }

    /// Serves `req` through the door an admin peer's requests take: the admin actor's
    /// admission gate (at most `admin.max_in_flight` at once, the rest refused "busy"), when
    /// the actor runs. Local peers without certificates (the aggregation agent's workers) come
    /// in here, so that a flood of them is admitted like a flood of operators, not served
    /// unbounded.
    pub async fn serve_admitted(&self, req: AdminRequest) -> Reply {
        self.serve_admitted_operator(req, None).await
    }

    /// [`Node::serve_admitted`] for an operator's request with its signature.
    async fn serve_admitted_operator(
        &self,
        req: AdminRequest,
        proof: Option<Arc<OperatorProof>>,
    ) -> Reply {
        match self.admin.get() {
            Some(actor) => actor
                .send(ServeAdmin { req, proof })
                .await
                .unwrap_or_else(|_| Reply::Error("the admin actor is not running".into())),
            None => self.serve_operator(req, proof).await,
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
            AdminRequest::SnapshotSave => self.snapshot_save(forwarded, &req).await,
            AdminRequest::MembersRemove { id } => self.remove_member(forwarded, &req, *id).await,
            AdminRequest::NodeDrain { id, drained } => {
                // Whether `id` is a host is the tables' answer (`Command::DrainNode`), not
                // this node's copy, which may lag.
                let cmd = Command::DrainNode {
                    id: *id,
                    drained: *drained,
                };
                self.write(forwarded, &req, cmd).await
            }
            AdminRequest::LeaderTransfer { to } => {
                let to = *to;
                self.leader_or_forward(forwarded, None, &req, || async move {
                    if self.inner.raft.metrics().borrow().state == ServerState::Leader {
                        let from = self.id();
                        match crate::roles::leader_transfer::transfer(self, to).await {
                            Ok(to) => Ok(Attempt::Done(AdminReply::LeaderMoved { from, to })),
                            Err(why) => Err(Reply::Error(why)),
                        }
                    } else {
                        Ok(Attempt::Forward(self.known_leader()))
                    }
                })
                .await
            }
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
            AdminRequest::TokenCreate { .. } => Reply::Error(
                "a join token must be bound to one node: use `yard token create --node-id N --name NAME`"
                    .into(),
            ),
            AdminRequest::TokenCreateBound {
                ttl_secs,
                node_id,
                name,
            } => {
                self.create_token(forwarded, &req, *ttl_secs, *node_id, name)
                    .await
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
}

/// The role model's view of the cluster from this node ([`admission::ClusterView`]).
struct NodeView<'a>(&'a Node);

impl admission::ClusterView for NodeView<'_> {
    fn is_member(&self, id: NodeId) -> bool {
        self.0.member(id).is_some()
    }

    fn knows_membership(&self) -> bool {
        self.0.with_membership(|m| m.nodes().next().is_some())
    }

    fn is_host(&self, id: NodeId) -> bool {
        self.0.is_host(id)
    }

    fn leader(&self) -> Option<NodeId> {
        self.0.inner.raft.metrics().borrow().current_leader
    }

    fn term(&self) -> u64 {
        self.0.inner.raft.metrics().borrow().current_term
    }

    fn is_revoked(&self, id: NodeId) -> bool {
        self.0.inner.feed.read(|d| d.revoked.contains(&id))
    }

    fn takes_unsigned_operator_writes(&self) -> bool {
        self.0.inner.operator_proofs.is_none()
    }
}

impl Handler for Node {
    fn handle(&self, role: PeerRole, req: Request) -> BoxFut<Reply> {
        let this = self.clone();
        Box::pin(async move {
            // Every request passes the role model first, whatever serves it.
            if let Err(refusal) = admission::admitted(&role, &req, &NodeView(&this)) {
                METRICS.requests_refused.inc();
                if let (admission::Refusal::NotMember { sender }, Request::Raft(r)) =
                    (&refusal, &req)
                {
                    let (ours, last) = {
                        let m = this.inner.raft.metrics();
                        let m = m.borrow();
                        (m.vote, m.last_applied)
                    };
                    if let Some(answer) = crate::stale_raft::higher_vote_answer(r, &ours, last) {
                        tracing::info!(sender, vote = %ours, "told a node that is no longer a raft member this node's newer vote");
                        return Reply::Raft(Ok(answer));
                    }
                }
                tracing::warn!(?role, %refusal, "refused a request for the peer's role");
                return Reply::Error(refusal.to_string());
            }
            match (role, req) {
                (PeerRole::Node(_), Request::Raft(r)) => this.handle_raft(r).await,
                (PeerRole::Node(_), Request::Probe) => Reply::Pong { id: this.inner.id },
                (_, Request::Level) => Reply::Level {
                    release: yard_raft_store::version::LEVEL,
                    cluster: this.inner.feed.read(|d| d.cluster_level),
                },
                (_, Request::Pki) => Reply::Pki(this.inner.pki.get().report()),
                (PeerRole::Node(from), Request::Handover { to }) => {
                    this.handle_handover(from, to).await
                }
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
                    let cfg = crate::prevote::config_of(this.inner.raft.config());
                    Reply::PreVote {
                        granted: crate::prevote::gate::local_view(&this)
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
                (PeerRole::Node(_), Request::AdminOnce { tag, req }) => {
                    this.handle_admin(true, Some(tag), req).await
                }
                (PeerRole::Admin, Request::SignedAdmin { tag, req, proof }) => {
                    let proof = Some(Arc::new(proof));
                    match tag {
                        Some(tag) => {
                            operator_proof::FORWARD_PROOF
                                .scope(proof, this.handle_admin(false, Some(tag), req))
                                .await
                        }
                        None if req.is_kv() => this.serve_operator(req, proof).await,
                        None => this.serve_admitted_operator(req, proof).await,
                    }
                }
                (PeerRole::Node(sender), Request::SignedAdmin { tag, req, proof }) => {
                    if let Some(check) = this.inner.operator_proofs.clone() {
                        if admission::needs_operator_proof(&req) {
                            let now = crate::service::now_unix_ms();
                            // Two ECDSA verifications at worst: off the runtime's worker.
                            let (proof2, req2) = (proof.clone(), req.clone());
                            let checked = tokio::task::spawn_blocking(move || {
                                check.check(&proof2, tag.as_ref(), &req2, now)
                            })
                            .await
                            .unwrap_or(Err(operator_proof::ProofError::Unchecked));
                            if let Err(e) = checked {
                                METRICS.requests_refused.inc();
                                tracing::warn!(sender, refusal = %e, "refused a forwarded operator request's signature");
                                return Reply::Error(format!(
                                    "node {sender} forwarded an operator request whose signature is refused: {e}"
                                ));
                            }
                        }
                    }
                    operator_proof::FORWARD_PROOF
                        .scope(Some(Arc::new(proof)), this.handle_admin(true, tag, req))
                        .await
                }
                (role, Request::Join(r)) => this.handle_join(role, r).await,
                (role, Request::RedeemToken(r)) => this.handle_redeem(role, r).await,
                (PeerRole::Node(_), Request::ConsumeToken(r)) => {
                    match this.consume_token(true, &r).await {
                        Ok(()) => Reply::TokenConsumed,
                        Err(why) => Reply::Error(why),
                    }
                }
                (PeerRole::Node(id), Request::RenewCertificate { csr }) => {
                    this.handle_renewal(id, &csr)
                }
                (PeerRole::Node(id), Request::BandwidthTicket) => {
                    let ticket: [u8; 16] = rand::random();
                    this.sink_tickets()
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .give(ticket, id, std::time::Instant::now());
                    Reply::BandwidthTicket { ticket }
                }
                // The role model admitted nothing else.
                (role, req) => {
                    tracing::error!(
                        ?role,
                        ?req,
                        "a request the role model admitted has no handler"
                    );
                    Reply::Error("this request is not served for the peer's role".into())
                }
            }
        })
    }
}
