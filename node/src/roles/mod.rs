//! Where a host's role is executed. The decisions live in `yard_control` (pure cores: which
//! role a joining host gets and the autopilot's changes in `roles`, agents' liveness in
//! `host_liveness`, the member an agent follows in `follow`); the loops here carry them out:
//! - `watch`: a Raft member serves agents' watches from its watch log;
//! - `agent`: a host that holds no vote follows the tables through a watch from a member and
//!   forwards every write and linearizable read to the leader it learns from the watch;
//! - `autopilot`: the leader executes the roles core's membership changes one at a time;
//! - `liveness`: members judge their agents, the leader commits their deaths (the state they
//!   share with the RPC handlers is `liveness_state`);
//! - `members`: `yard members`, gathered on the leader;
//! - `cluster_level`: the leader raises the cluster level once every host runs a release of
//!   it (the decision is `yard_raft_store::version`).
//!
//! - `join`: a host joins; the leader asks the roles core for its role and carries it out.
//! - `leader_transfer`: the leader hands its leadership to another voter (`yard leader
//!   transfer`, a drained leader; the decisions are `yard_control::leader_transfer`).

pub mod agent;
pub mod autopilot;
pub mod cluster_level;
pub mod join;
pub mod leader_transfer;
pub mod liveness;
pub mod liveness_state;
pub mod members;
pub mod watch;

use yard_control::roles::Role;
use yard_raft_store::{NodeId, NodeMeta};

/// A host's record in the replicated hosts table.
pub fn host_meta(id: NodeId, name: &str, addr: &str, zone: &str, role: Role) -> NodeMeta {
    NodeMeta {
        id,
        name: name.to_owned(),
        addr: addr.to_owned(),
        roles: vec![role.to_string()],
        labels: if zone.is_empty() {
            Vec::new()
        } else {
            vec![("zone".to_owned(), zone.to_owned())]
        },
    }
}

/// A host's zone from its record.
pub fn zone_of(meta: &NodeMeta) -> Option<String> {
    meta.labels
        .iter()
        .find(|(k, _)| k == "zone")
        .map(|(_, v)| v.clone())
}

/// Reads a role from its name on the wire.
pub(crate) fn role_named(name: &str) -> Result<Role, String> {
    match name {
        "voter" => Ok(Role::Voter),
        "replica" => Ok(Role::Replica),
        "agent" => Ok(Role::Agent),
        other => Err(format!(
            "the cluster gave this host an unknown role {other:?}"
        )),
    }
}
