//! A host joining the cluster, executed: the joining side (`Node::join`, `Node::bootstrap`)
//! and the leader's side (`handle_join`), which asks the roles core
//! (`yard_control::roles::role_for_join`) whether the host votes, replicates or follows as an
//! agent, and then carries that out: a voter or replica is added to Raft's membership, an agent
//! only to the hosts table. A token join (`handle_redeem`) first gets the host its certificate.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::{ChangeMembers, ServerState};
use yard_control::roles::Role;
use yard_raft_store::{Command, NodeInfo, NodeMeta};

use super::{host_meta, role_named};
use crate::metrics::METRICS;
use crate::rpc::{JoinRequest, RedeemRequest, Reply, Request};
use crate::service::{now_unix_ms, sha256, Node};
use crate::tls::PeerRole;
use crate::transport::Target;

impl Node {
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
    /// A host's join at the leader (forwarded there by any member): checks its certificate,
    /// asks the roles core for its role and executes it.
    pub(crate) async fn handle_join(&self, role: PeerRole, req: JoinRequest) -> Reply {
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
        let view = crate::roles::autopilot::members_view(self);
        let zone = (!req.zone.is_empty()).then_some(req.zone.as_str());
        yard_control::roles::role_for_join(&self.inner.roles, &view, req.id, zone)
    }

    /// Signs a node certificate for the holder of a valid join token.
    pub(crate) async fn handle_redeem(&self, role: PeerRole, req: RedeemRequest) -> Reply {
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
}
