//! A host joining the cluster, executed: the joining side (`Node::join`, `Node::bootstrap`)
//! and the leader's side (`handle_join`), which asks the roles core
//! (`yard_control::roles::role_for_join`) whether the host votes, replicates or follows as an
//! agent, and then carries that out: a voter or replica is added to Raft's membership, an agent
//! only to the hosts table. A token join (`handle_redeem`) first gets the host its certificate.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::{ChangeMembers, ServerState};
use yard_control::roles::Role;
use yard_raft_store::{Command, NodeInfo, NodeMeta, Response};

use super::{host_meta, role_named};
use crate::batcher::BatchError;
use crate::metrics::METRICS;
use crate::rpc::{JoinRequest, RedeemRequest, Reply, Request};
use crate::service::{leader_of, now_unix_ms, sha256, Node};
use crate::tls::PeerRole;
use crate::transport::{Target, TransportError};

impl Node {
    /// Initialises a one-node cluster of this node unless the store already belongs to one.
    pub async fn bootstrap(&self) -> Result<(), String> {
        let p = &self.inner;
        if p.raft.is_initialized().await.map_err(|e| e.to_string())? {
            // A store seeded from a backup (`yard snapshot restore`) has this node as its only
            // voter but no host entry for it yet (the backup's hosts were the old cluster's).
            let sole_voter = self.voter_ids() == std::collections::BTreeSet::from([p.id]);
            if sole_voter && !p.feed.read(|d| d.nodes.contains_key(&p.id)) {
                self.write_until_leader(Command::SetNode(self.meta()))
                    .await?;
                tracing::info!(id = p.id, "started a cluster restored from a snapshot");
                return Ok(());
            }
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
    /// A host's join at the leader (forwarded there by any member): checks its certificate,
    /// asks the roles core for its role and executes it.
    pub(crate) async fn handle_join(&self, role: PeerRole, req: JoinRequest) -> Reply {
        let p = &self.inner;
        // The role model admitted only a host's own join or one a host passes on.
        let PeerRole::Node(sender) = role else {
            return Reply::Error(
                "joining needs a node certificate; redeem a join token first".into(),
            );
        };
        let forwarded = sender != req.id;
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
        // Once the cluster level rose, a host of an earlier release could not read the tables
        // it is sent: it is asked its release first and refused in one sentence.
        let cluster_level = p.feed.read(|d| d.cluster_level);
        if cluster_level > 0 {
            let reply = p
                .transport
                .call(
                    Target::node(req.id, req.addr.clone()),
                    Request::Level,
                    p.rpc_timeout,
                )
                .await
                .map_err(|e| e.to_string());
            let release = crate::roles::cluster_level::level_of(reply);
            if let Err(why) = yard_raft_store::version::admits_host(cluster_level, req.id, release)
            {
                tracing::warn!(id = req.id, %why, "refused a join");
                return Reply::Error(why);
            }
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
        let view = crate::roles::autopilot::members_view(self);
        let zone = (!req.zone.is_empty()).then_some(req.zone.as_str());
        yard_control::roles::role_for_join(&self.inner.roles, &view, req.id, zone)
    }

    /// Signs a node certificate for the holder of a valid join token, after the leader has
    /// marked the token used through Raft: a token yields one certificate, for the node id and
    /// name it was created for, and never for a host the cluster already has.
    pub(crate) async fn handle_redeem(&self, role: PeerRole, req: RedeemRequest) -> Reply {
        let p = &self.inner;
        if role == PeerRole::Admin {
            return Reply::Error("admin certificates cannot redeem join tokens".into());
        }
        let pki = p.pki.get();
        let Some(ca) = pki.signer.clone() else {
            // Only nodes holding ca.key can sign; the leader is the best guess for one.
            if let (Some((leader, node)), PeerRole::Anonymous) =
                (self.known_leader().filter(|(l, _)| *l != p.id), role)
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
            return Reply::Error(
                "no node reachable from here holds the CA key to sign certificates".into(),
            );
        };
        let (token_id, secret) = match self.parse_token(&req.token) {
            Ok(parts) => parts,
            Err(why) => return Reply::Error(why),
        };
        // Tokens only ever appear before they are used, so a local read can wrongly refuse a
        // token that is not replicated here yet, never wrongly accept one (the leader's apply
        // decides): wait briefly for replication, then answer early from the same rule.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !p
            .feed
            .read(|d| d.bound_tokens.contains_key(token_id) || d.tokens.contains_key(token_id))
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let secret_sha256 = sha256(secret.as_bytes());
        if let Err(why) = p.feed.read(|d| {
            d.check_redemption(token_id, &secret_sha256, req.id, &req.name, now_unix_ms())
        }) {
            tracing::warn!(token = token_id, id = req.id, name = %req.name, %why, "refused a token redemption");
            return Reply::Error(why);
        }
        if let Err(why) = self.consume_token(false, &req).await {
            tracing::warn!(token = token_id, id = req.id, name = %req.name, %why, "refused a token redemption");
            return Reply::Error(why);
        }
        match ca.sign_node(&p.cluster, &req.name, req.id, &req.ips, p.cert_validity) {
            Ok(cert) => {
                tracing::info!(token = token_id, id = req.id, name = %req.name, "signed a node certificate for a token join");
                Reply::Certificate {
                    ca: pki.trust_pem().unwrap_or_else(|| ca.cert_pem.clone()),
                    cert,
                }
            }
            Err(e) => Reply::Error(format!("cannot sign a certificate: {e}")),
        }
    }

    /// Splits a join token `<id>.<secret>.<ca-hash>` made for this cluster's CA.
    fn parse_token<'t>(&self, token: &'t str) -> Result<(&'t str, &'t str), String> {
        let mut parts = token.splitn(3, '.');
        let (Some(id), Some(secret), Some(hash)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err("join token is malformed; expected <id>.<secret>.<ca-hash>".into());
        };
        if !self.inner.pki.get().ca_hashes.iter().any(|h| h == hash) {
            return Err("join token belongs to another cluster's CA".into());
        }
        Ok((id, secret))
    }

    /// Marks the token of redemption `req` used through Raft, on the leader (asking it with
    /// `ConsumeToken` from a follower). The leader's apply checks the secret, expiry, binding
    /// and that the token is unused, so of two concurrent redemptions at most one succeeds.
    /// `forwarded`: this is the leader's side of a follower's request, never passed on again.
    pub(crate) async fn consume_token(
        &self,
        forwarded: bool,
        req: &RedeemRequest,
    ) -> Result<(), String> {
        let p = &self.inner;
        let (token_id, secret) = self.parse_token(&req.token)?;
        let start = Instant::now();
        loop {
            let cmd = Command::RedeemToken {
                token_id: token_id.to_owned(),
                secret_sha256: sha256(secret.as_bytes()),
                node_id: req.id,
                name: req.name.clone(),
                now_unix_ms: now_unix_ms(),
            };
            match self.writes.write(cmd).await {
                Ok(Response::Rejected(why) | Response::Refused(why)) => return Err(why),
                Ok(_) => return Ok(()),
                Err(BatchError::TooLarge(why)) => return Err(why),
                Err(BatchError::Indefinite(e)) => {
                    return Err(format!(
                        "whether the join token was marked used is unknown ({e}); create a new one"
                    ))
                }
                Err(BatchError::Forward(f)) => {
                    if forwarded {
                        return Err(format!("node {} is not the leader", p.id));
                    }
                    if let Some((leader, node)) = leader_of(f).filter(|(l, _)| *l != p.id) {
                        let ask = Request::ConsumeToken(req.clone());
                        match p
                            .transport
                            .call(Target::node(leader, node.addr), ask, p.rpc_timeout)
                            .await
                        {
                            Ok(Reply::TokenConsumed) => return Ok(()),
                            Ok(Reply::Error(why)) => return Err(why),
                            Ok(other) => {
                                return Err(format!("unexpected reply to a token's use: {other:?}"))
                            }
                            // Never sent: asking again cannot use the token twice.
                            Err(e @ TransportError::Unreachable { .. }) => {
                                tracing::debug!(leader, error = %e, "leader unreachable")
                            }
                            Err(e) => {
                                return Err(format!(
                                    "the leader did not answer whether the join token was marked used ({e}); create a new one"
                                ))
                            }
                        }
                    }
                }
            }
            if start.elapsed() > p.leader_wait {
                return Err(
                    "no leader to mark the join token used; is a majority of the cluster up?"
                        .into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
