//! The deterministic state machine: what every command does to the replicated tables.
//!
//! No I/O and no clock here: given the same entries in the same order, every node ends with the
//! same tables and emits the same changes.

use std::collections::BTreeMap;

use openraft::{EntryPayload, LogId, StoredMembership};

use crate::aggregation::AggTables;
use crate::command::{BoundToken, Command, JoinToken, NodeInfo, NodeMeta, Response, Versioned};
use crate::diagnosis::DiagnosisTables;
use crate::gateway::{GatewayChange, GatewayTables};
use crate::session::{Admission, Sessions};
use crate::{NodeId, TypeConfig};

/// One change to the replicated tables, as actors see it on the change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A KV key now holds `value` (`None`: deleted) as of `revision`.
    Kv {
        revision: u64,
        key: String,
        value: Option<String>,
    },
    /// A node's metadata changed (`None`: removed).
    Node {
        revision: u64,
        id: u64,
        meta: Option<NodeMeta>,
    },
    /// The whole state was replaced (snapshot installed): subscribers must resync.
    Reset { revision: u64 },
    /// The leader decided host `id` is dead or alive again.
    HostLiveness { revision: u64, id: u64, alive: bool },
    /// Host `id` was drained for maintenance, or its drain ended.
    Drain {
        revision: u64,
        id: u64,
        drained: bool,
    },
    /// Gateway tables changed: everything one command changed, as one message (an import of
    /// thousands of endpoints must not overrun subscribers' queues).
    Gateway {
        revision: u64,
        changes: std::sync::Arc<Vec<GatewayChange>>,
    },
    /// The aggregator tables changed: all of them as of `revision` (they are small, and every
    /// subscriber recomputes what it serves from the whole).
    Aggregation {
        revision: u64,
        tables: std::sync::Arc<AggTables>,
    },
}

/// Every replicated table plus the bookkeeping openraft needs. Encoded and decoded by
/// [`crate::earlier_tables`], so that adjacent releases read each other's tables.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateMachineData {
    pub last_applied: Option<LogId<NodeId>>,
    pub last_membership: StoredMembership<NodeId, NodeInfo>,
    /// Cluster-wide revision: bumped by every write that changes a table.
    pub revision: u64,
    pub kv: BTreeMap<String, Versioned>,
    pub nodes: BTreeMap<u64, NodeMeta>,
    pub tokens: BTreeMap<String, JoinToken>,
    pub gateway: GatewayTables,
    /// Appended by a later release (see [`crate::earlier_tables`]), like every field below.
    pub diagnosis: DiagnosisTables,
    /// Client sessions (exactly-once writes). Appended last, like `diagnosis`.
    pub sessions: Sessions,
    /// Aggregation jobs and hosts. Appended last, like `diagnosis`.
    pub aggregation: AggTables,
    /// Hosts the leader decided are dead (`Command::HostLiveness`). Appended last.
    pub hosts_down: std::collections::BTreeSet<u64>,
    /// Join tokens bound to one node id and name (`Command::CreateBoundToken`), used or not.
    /// Appended last. The unbound `tokens` above are only replayed from old logs: no
    /// redemption accepts them.
    pub bound_tokens: BTreeMap<String, BoundToken>,
    /// Node ids removed from the cluster (`Command::RemoveNode`): their certificates are
    /// refused by every node, and the ids are never given out again (as etcd never reuses a
    /// member id), so a certificate issued to a removed host stays worthless. Appended last.
    pub revoked: std::collections::BTreeSet<u64>,
    /// The cluster level (`crate::version`): the formats every host reads, raised by the
    /// leader with `Command::SetClusterLevel` once every host runs a release of that level.
    /// Appended last; 0 until the first raise.
    pub cluster_level: u32,
    /// Hosts drained for maintenance (`Command::DrainNode`): no role, seat or VIP is given to
    /// them and the work they have moves off. Appended last.
    pub drained: std::collections::BTreeSet<u64>,
}

/// Why a removed node's id cannot be used again.
fn revoked_id(id: u64) -> String {
    format!("node id {id} was removed from this cluster and is revoked; use a new id")
}

impl StateMachineData {
    /// Applies one log entry, returning its response and the changes it made.
    pub fn apply_entry(&mut self, entry: &openraft::Entry<TypeConfig>) -> (Response, Vec<Change>) {
        self.last_applied = Some(entry.log_id);
        match &entry.payload {
            EntryPayload::Blank => (Response::None, Vec::new()),
            EntryPayload::Membership(m) => {
                self.last_membership = StoredMembership::new(Some(entry.log_id), m.clone());
                (Response::None, Vec::new())
            }
            EntryPayload::Normal(cmd) => self.apply_command(cmd),
        }
    }

    /// Applies one command. Pure: the only input is the command and the current tables.
    pub fn apply_command(&mut self, cmd: &Command) -> (Response, Vec<Change>) {
        match cmd {
            Command::Put { key, value } => {
                let revision = self.bump();
                self.put(key, value.clone(), revision);
                (
                    Response::Written { revision },
                    vec![Change::Kv {
                        revision,
                        key: key.clone(),
                        value: Some(value.clone()),
                    }],
                )
            }
            Command::Delete { key } => {
                if self.kv.contains_key(key) {
                    let revision = self.bump();
                    self.kv.remove(key);
                    (
                        Response::Deleted {
                            revision,
                            existed: true,
                        },
                        vec![Change::Kv {
                            revision,
                            key: key.clone(),
                            value: None,
                        }],
                    )
                } else {
                    (
                        Response::Deleted {
                            revision: self.revision,
                            existed: false,
                        },
                        Vec::new(),
                    )
                }
            }
            Command::Cas { key, expect, value } => {
                let current = self.kv.get(key);
                if current.map(|v| &v.value) != expect.as_ref() {
                    return (
                        Response::Cas {
                            succeeded: false,
                            revision: self.revision,
                            current: current.cloned(),
                        },
                        Vec::new(),
                    );
                }
                let revision = self.bump();
                self.put(key, value.clone(), revision);
                (
                    Response::Cas {
                        succeeded: true,
                        revision,
                        current: self.kv.get(key).cloned(),
                    },
                    vec![Change::Kv {
                        revision,
                        key: key.clone(),
                        value: Some(value.clone()),
                    }],
                )
            }
            Command::SetNode(meta) => {
                if self.revoked.contains(&meta.id) {
                    return (Response::Rejected(revoked_id(meta.id)), Vec::new());
                }
                let revision = self.bump();
                self.nodes.insert(meta.id, meta.clone());
                (
                    Response::Written { revision },
                    vec![Change::Node {
                        revision,
                        id: meta.id,
                        meta: Some(meta.clone()),
                    }],
                )
            }
            Command::HostLiveness { id, alive } => {
                let changed = if *alive {
                    self.hosts_down.remove(id)
                } else {
                    self.hosts_down.insert(*id)
                };
                if !changed {
                    return (
                        Response::Written {
                            revision: self.revision,
                        },
                        Vec::new(),
                    );
                }
                let revision = self.bump();
                (
                    Response::Written { revision },
                    vec![Change::HostLiveness {
                        revision,
                        id: *id,
                        alive: *alive,
                    }],
                )
            }
            Command::SetClusterLevel { level } => {
                if *level <= self.cluster_level {
                    return (
                        Response::Written {
                            revision: self.revision,
                        },
                        Vec::new(),
                    );
                }
                self.cluster_level = *level;
                let revision = self.bump();
                (Response::Written { revision }, Vec::new())
            }
            Command::DrainNode { id, drained } => {
                if *drained && !self.nodes.contains_key(id) {
                    return (
                        Response::Rejected(format!("node {id} is not a host of this cluster")),
                        Vec::new(),
                    );
                }
                let gateway = crate::GatewayCommand::SetDrain {
                    node: *id,
                    draining: *drained,
                };
                let was = self.drained.contains(id);
                let revision = self.revision + 1;
                let gateway_changes = self.gateway.apply(&gateway, revision);
                if was == *drained && gateway_changes.is_empty() {
                    return (
                        Response::Written {
                            revision: self.revision,
                        },
                        Vec::new(),
                    );
                }
                self.revision = revision;
                if *drained {
                    self.drained.insert(*id);
                } else {
                    self.drained.remove(id);
                }
                let mut changes = vec![Change::Drain {
                    revision,
                    id: *id,
                    drained: *drained,
                }];
                if !gateway_changes.is_empty() {
                    changes.push(Change::Gateway {
                        revision,
                        changes: std::sync::Arc::new(gateway_changes),
                    });
                }
                (Response::Written { revision }, changes)
            }
            Command::RemoveNode { id } => {
                let revision = self.bump();
                let existed = self.nodes.remove(id).is_some();
                self.revoked.insert(*id);
                let mut changes = vec![Change::Node {
                    revision,
                    id: *id,
                    meta: None,
                }];
                if self.drained.remove(id) {
                    changes.push(Change::Drain {
                        revision,
                        id: *id,
                        drained: false,
                    });
                }
                // In the same revision: a removed host must not stay placeable.
                if self.aggregation.forget_node(*id, revision) {
                    changes.push(Change::Aggregation {
                        revision,
                        tables: std::sync::Arc::new(self.aggregation.clone()),
                    });
                }
                (Response::Deleted { revision, existed }, changes)
            }
            Command::CreateToken { token, now_unix_ms } => {
                let revision = self.bump();
                self.tokens.retain(|_, t| t.expires_unix_ms > *now_unix_ms);
                self.tokens.insert(token.id.clone(), token.clone());
                (Response::Written { revision }, Vec::new())
            }
            Command::CreateBoundToken { token, now_unix_ms } => {
                if self.revoked.contains(&token.node_id) {
                    return (Response::Rejected(revoked_id(token.node_id)), Vec::new());
                }
                let revision = self.bump();
                self.drop_expired_tokens(*now_unix_ms);
                self.bound_tokens.insert(token.id.clone(), token.clone());
                (Response::Written { revision }, Vec::new())
            }
            Command::RedeemToken {
                token_id,
                secret_sha256,
                node_id,
                name,
                now_unix_ms,
            } => {
                if let Err(why) =
                    self.check_redemption(token_id, secret_sha256, *node_id, name, *now_unix_ms)
                {
                    return (Response::Rejected(why), Vec::new());
                }
                let revision = self.bump();
                if let Some(t) = self.bound_tokens.get_mut(token_id) {
                    t.used = true;
                }
                (Response::Written { revision }, Vec::new())
            }
            Command::Gateway(cmd) => {
                if let Err(why) = self.gateway.admit(cmd) {
                    return (Response::Rejected(why), Vec::new());
                }
                let revision = self.revision + 1;
                let changes = self.gateway.apply(cmd, revision);
                if changes.is_empty() {
                    return (
                        Response::Written {
                            revision: self.revision,
                        },
                        Vec::new(),
                    );
                }
                self.revision = revision;
                (
                    Response::Written { revision },
                    vec![Change::Gateway {
                        revision,
                        changes: std::sync::Arc::new(changes),
                    }],
                )
            }
            Command::Diagnosis(cmd) => {
                let revision = self.revision + 1;
                if self.diagnosis.apply(cmd, revision) {
                    self.revision = revision;
                }
                (
                    Response::Written {
                        revision: self.revision,
                    },
                    Vec::new(),
                )
            }
            Command::Aggregation(cmd) => {
                // Only a member may register as an aggregator: a removed node's daemon that is
                // still running (and retrying its registration) must not bring the host back.
                if let crate::aggregation::AggCommand::Host { node, slots, .. } = cmd {
                    if *slots > 0 && !self.nodes.contains_key(node) {
                        return (
                            Response::Rejected(format!(
                                "node {node} is not a member of the cluster, so it cannot aggregate"
                            )),
                            Vec::new(),
                        );
                    }
                }
                let revision = self.revision + 1;
                match self.aggregation.apply(cmd, revision) {
                    Err(why) => (Response::Rejected(why), Vec::new()),
                    Ok(false) => (
                        Response::Written {
                            revision: self.revision,
                        },
                        Vec::new(),
                    ),
                    Ok(true) => {
                        self.revision = revision;
                        (
                            Response::Written { revision },
                            vec![Change::Aggregation {
                                revision,
                                tables: std::sync::Arc::new(self.aggregation.clone()),
                            }],
                        )
                    }
                }
            }
            Command::Once {
                tag,
                now_unix_ms,
                cmd,
            } => {
                self.sessions.tick(*now_unix_ms);
                match self.sessions.admit(tag) {
                    Admission::Duplicate(reply) => (reply, Vec::new()),
                    Admission::Refused(why) => (Response::Refused(why), Vec::new()),
                    // A session wraps one client command; nested wrappers and batches are
                    // answered with nothing and change nothing.
                    Admission::Apply
                        if matches!(**cmd, Command::Once { .. } | Command::Batch(_)) =>
                    {
                        (Response::None, Vec::new())
                    }
                    Admission::Apply => {
                        let (reply, changes) = self.apply_command(cmd);
                        self.sessions.record(tag, &reply);
                        (reply, changes)
                    }
                }
            }
            Command::Batch(cmds) => {
                let mut responses = Vec::with_capacity(cmds.len());
                let mut changes = Vec::new();
                for cmd in cmds {
                    // Batches hold client commands only; a nested batch is answered with
                    // nothing and changes nothing, so a batch is always one level deep.
                    if matches!(cmd, Command::Batch(_)) {
                        responses.push(Response::None);
                        continue;
                    }
                    let (r, ch) = self.apply_command(cmd);
                    responses.push(r);
                    changes.extend(ch);
                }
                (Response::Batch(responses), changes)
            }
        }
    }

    fn bump(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    fn put(&mut self, key: &str, value: String, revision: u64) {
        let create_revision = self.kv.get(key).map_or(revision, |old| old.create_revision);
        self.kv.insert(
            key.to_owned(),
            Versioned {
                value,
                revision,
                create_revision,
            },
        );
    }

    /// Keys with `prefix`, in order.
    pub fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Versioned)> + 'a {
        self.kv
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
    }
}

impl StateMachineData {
    /// Whether a redemption of join token `token_id` with a secret hashing to `secret_sha256`
    /// may sign a certificate for node `node_id` named `name` at `now_unix_ms`; otherwise why
    /// not, in one sentence. The leader's apply of `Command::RedeemToken` decides with this,
    /// and a signing node asks it first for an early answer.
    pub fn check_redemption(
        &self,
        token_id: &str,
        secret_sha256: &[u8; 32],
        node_id: u64,
        name: &str,
        now_unix_ms: u64,
    ) -> Result<(), String> {
        let Some(token) = self.bound_tokens.get(token_id) else {
            return Err(if self.tokens.contains_key(token_id) {
                "join token is bound to no node; create one with `yard token create --node-id N --name NAME`".to_owned()
            } else {
                "join token is not valid for this cluster".to_owned()
            });
        };
        if &token.secret_sha256 != secret_sha256 {
            return Err("join token is not valid for this cluster".to_owned());
        }
        if token.expires_unix_ms <= now_unix_ms {
            return Err("join token expired; create a new one with `yard token create`".to_owned());
        }
        if token.used {
            return Err(
                "join token was already redeemed; create a new one with `yard token create`"
                    .to_owned(),
            );
        }
        if token.node_id != node_id || token.name != name {
            return Err(format!(
                "join token is for node {} named {}, not node {node_id} named {name}",
                token.node_id, token.name
            ));
        }
        if self.is_known_host(node_id) {
            return Err(format!(
                "node id {node_id} already belongs to a host of this cluster"
            ));
        }
        if self.revoked.contains(&node_id) {
            return Err(revoked_id(node_id));
        }
        Ok(())
    }

    /// Whether `id` is a Raft member (as of the last applied membership) or a recorded host.
    pub fn is_known_host(&self, id: u64) -> bool {
        self.nodes.contains_key(&id) || self.last_membership.membership().get_node(&id).is_some()
    }

    /// Drops every join token, bound or not, that expired before `now_unix_ms`.
    fn drop_expired_tokens(&mut self, now_unix_ms: u64) {
        self.tokens.retain(|_, t| t.expires_unix_ms > now_unix_ms);
        self.bound_tokens
            .retain(|_, t| t.expires_unix_ms > now_unix_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn put(k: &str, v: &str) -> Command {
        Command::Put {
            key: k.into(),
            value: v.into(),
        }
    }

    #[test]
    fn cas_succeeds_only_on_expected_value() {
        let mut sm = StateMachineData::default();
        sm.apply_command(&put("a", "1"));
        let (r, _) = sm.apply_command(&Command::Cas {
            key: "a".into(),
            expect: Some("2".into()),
            value: "3".into(),
        });
        assert!(
            matches!(r, Response::Cas { succeeded: false, revision: 1, current: Some(ref v) } if v.value == "1")
        );
        let (r, ch) = sm.apply_command(&Command::Cas {
            key: "a".into(),
            expect: Some("1".into()),
            value: "3".into(),
        });
        assert!(matches!(
            r,
            Response::Cas {
                succeeded: true,
                revision: 2,
                ..
            }
        ));
        assert_eq!(ch.len(), 1);
        assert_eq!(sm.kv["a"].value, "3");
        assert_eq!(sm.kv["a"].create_revision, 1);
    }

    #[test]
    fn cas_with_no_expectation_creates_only_absent_keys() {
        let mut sm = StateMachineData::default();
        let cas = Command::Cas {
            key: "k".into(),
            expect: None,
            value: "v".into(),
        };
        assert!(matches!(
            sm.apply_command(&cas).0,
            Response::Cas {
                succeeded: true,
                ..
            }
        ));
        assert!(matches!(
            sm.apply_command(&cas).0,
            Response::Cas {
                succeeded: false,
                ..
            }
        ));
    }

    #[test]
    fn delete_of_missing_key_changes_nothing() {
        let mut sm = StateMachineData::default();
        let (r, ch) = sm.apply_command(&Command::Delete { key: "x".into() });
        assert_eq!(
            r,
            Response::Deleted {
                revision: 0,
                existed: false
            }
        );
        assert!(ch.is_empty());
        assert_eq!(sm.revision, 0);
    }

    #[test]
    fn creating_a_token_drops_the_expired_ones() {
        let token = |id: &str, expires_unix_ms| JoinToken {
            id: id.into(),
            secret_sha256: [0; 32],
            expires_unix_ms,
        };
        let mut sm = StateMachineData::default();
        sm.apply_command(&Command::CreateToken {
            token: token("old", 1_000),
            now_unix_ms: 500,
        });
        sm.apply_command(&Command::CreateToken {
            token: token("live", 9_000),
            now_unix_ms: 900,
        });
        assert_eq!(sm.tokens.keys().collect::<Vec<_>>(), ["live", "old"]);
        sm.apply_command(&Command::CreateToken {
            token: token("new", 9_000),
            now_unix_ms: 2_000,
        });
        assert_eq!(sm.tokens.keys().collect::<Vec<_>>(), ["live", "new"]);
    }

    fn bound(id: &str, node_id: u64, name: &str, expires_unix_ms: u64) -> Command {
        Command::CreateBoundToken {
            token: BoundToken {
                id: id.into(),
                secret_sha256: [7; 32],
                expires_unix_ms,
                node_id,
                name: name.into(),
                used: false,
            },
            now_unix_ms: 0,
        }
    }

    fn redeem(id: &str, secret: u8, node_id: u64, name: &str, now_unix_ms: u64) -> Command {
        Command::RedeemToken {
            token_id: id.into(),
            secret_sha256: [secret; 32],
            node_id,
            name: name.into(),
            now_unix_ms,
        }
    }

    fn rejected(sm: &mut StateMachineData, cmd: Command) -> String {
        match sm.apply_command(&cmd).0 {
            Response::Rejected(why) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_cluster_level_only_rises_and_a_raise_is_one_revision() {
        let mut sm = StateMachineData::default();
        assert_eq!(sm.cluster_level, 0);
        let (r, _) = sm.apply_command(&Command::SetClusterLevel { level: 1 });
        assert_eq!(r, Response::Written { revision: 1 });
        assert_eq!(sm.cluster_level, 1);
        // A lower or equal level (a stale leader's proposal) changes nothing.
        for level in [0, 1] {
            let (r, _) = sm.apply_command(&Command::SetClusterLevel { level });
            assert_eq!(r, Response::Written { revision: 1 });
            assert_eq!(sm.cluster_level, 1);
        }
    }

    #[test]
    fn a_drain_marks_the_host_and_drains_its_gateway_in_one_revision() {
        let mut sm = StateMachineData::default();
        let (r, _) = sm.apply_command(&Command::DrainNode {
            id: 2,
            drained: true,
        });
        assert_eq!(
            r,
            Response::Rejected("node 2 is not a host of this cluster".into())
        );
        for id in [2, 3] {
            sm.apply_command(&Command::SetNode(NodeMeta {
                id,
                ..NodeMeta::default()
            }));
        }
        sm.revision = 0;
        let (r, changes) = sm.apply_command(&Command::DrainNode {
            id: 2,
            drained: true,
        });
        assert_eq!(r, Response::Written { revision: 1 });
        assert!(sm.drained.contains(&2));
        assert!(sm.gateway.draining.contains(&2));
        assert!(matches!(
            changes[..],
            [
                Change::Drain {
                    revision: 1,
                    id: 2,
                    drained: true
                },
                Change::Gateway { revision: 1, .. }
            ]
        ));
        // Again: nothing changes, no revision.
        let (r, changes) = sm.apply_command(&Command::DrainNode {
            id: 2,
            drained: true,
        });
        assert_eq!((r, changes.len()), (Response::Written { revision: 1 }, 0));
        sm.apply_command(&Command::DrainNode {
            id: 2,
            drained: false,
        });
        assert!(sm.drained.is_empty() && sm.gateway.draining.is_empty());
        assert_eq!(sm.revision, 2);
        // A removed host is no longer drained.
        sm.apply_command(&Command::DrainNode {
            id: 3,
            drained: true,
        });
        sm.apply_command(&Command::RemoveNode { id: 3 });
        assert!(sm.drained.is_empty());
    }

    #[test]
    fn a_removed_node_id_is_revoked_and_never_given_out_again() {
        let mut sm = StateMachineData::default();
        let meta = |id: u64| NodeMeta {
            id,
            name: format!("n{id}"),
            addr: format!("198.18.0.{id}:7480"),
            ..NodeMeta::default()
        };
        sm.apply_command(&Command::SetNode(meta(4)));
        sm.apply_command(&bound("early", 4, "n4", 10_000));
        sm.apply_command(&Command::RemoveNode { id: 4 });
        assert!(sm.revoked.contains(&4));
        let why = "node id 4 was removed from this cluster and is revoked; use a new id";
        // Its daemon registering again, a token made for the id, and one made before the
        // removal are all refused; the tables keep no trace of the host.
        assert_eq!(rejected(&mut sm, Command::SetNode(meta(4))), why);
        assert_eq!(rejected(&mut sm, bound("late", 4, "n4", 10_000)), why);
        assert_eq!(rejected(&mut sm, redeem("early", 7, 4, "n4", 100)), why);
        assert!(!sm.nodes.contains_key(&4));
        // Another id is unaffected.
        assert!(matches!(
            sm.apply_command(&Command::SetNode(meta(5))).0,
            Response::Written { .. }
        ));
    }

    #[test]
    fn a_bound_token_is_redeemed_once_and_only_for_its_binding() {
        let mut sm = StateMachineData::default();
        sm.apply_command(&bound("t", 4, "n4", 10_000));
        assert!(rejected(&mut sm, redeem("t", 7, 5, "n4", 100)).contains("not node 5"));
        assert!(rejected(&mut sm, redeem("t", 7, 4, "n5", 100)).contains("named n5"));
        assert!(rejected(&mut sm, redeem("t", 8, 4, "n4", 100)).contains("not valid"));
        assert!(rejected(&mut sm, redeem("t", 7, 4, "n4", 10_000)).contains("expired"));
        let revision = sm.revision;
        assert!(matches!(
            sm.apply_command(&redeem("t", 7, 4, "n4", 100)).0,
            Response::Written { .. }
        ));
        assert!(sm.bound_tokens["t"].used);
        assert!(sm.revision > revision);
        assert!(rejected(&mut sm, redeem("t", 7, 4, "n4", 200)).contains("already redeemed"));
    }

    #[test]
    fn a_token_for_an_existing_host_or_without_a_binding_is_refused() {
        let mut sm = StateMachineData::default();
        sm.apply_command(&Command::SetNode(NodeMeta {
            id: 2,
            name: "n2".into(),
            ..Default::default()
        }));
        sm.apply_command(&bound("t", 2, "n2", 10_000));
        assert!(rejected(&mut sm, redeem("t", 7, 2, "n2", 100)).contains("already belongs"));
        sm.apply_command(&Command::CreateToken {
            token: JoinToken {
                id: "old".into(),
                secret_sha256: [7; 32],
                expires_unix_ms: 10_000,
            },
            now_unix_ms: 0,
        });
        assert!(rejected(&mut sm, redeem("old", 7, 3, "n3", 100)).contains("bound to no node"));
        // Creating a token drops the expired bound ones too.
        sm.apply_command(&Command::CreateBoundToken {
            token: BoundToken {
                id: "new".into(),
                secret_sha256: [7; 32],
                expires_unix_ms: 30_000,
                node_id: 9,
                name: "n9".into(),
                used: false,
            },
            now_unix_ms: 20_000,
        });
        assert_eq!(sm.bound_tokens.keys().collect::<Vec<_>>(), ["new"]);
        assert!(sm.tokens.is_empty());
    }

    #[test]
    fn list_returns_prefix_in_order() {
        let mut sm = StateMachineData::default();
        for k in ["b/2", "a/1", "b/1", "c"] {
            sm.apply_command(&put(k, "v"));
        }
        let keys: Vec<_> = sm.list("b/").map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b/1", "b/2"]);
    }

    fn arb_command() -> impl Strategy<Value = Command> {
        let key = "[a-c]";
        let val = "[0-2]";
        prop_oneof![
            (key, val).prop_map(|(k, v)| Command::Put { key: k, value: v }),
            key.prop_map(|k| Command::Delete { key: k }),
            (key, proptest::option::of(val), val).prop_map(|(k, e, v)| Command::Cas {
                key: k,
                expect: e,
                value: v
            }),
        ]
    }

    fn once(client: u64, seq: u64, first_unacked: u64, cmd: Command) -> Command {
        Command::Once {
            tag: crate::session::SessionTag {
                client,
                seq,
                first_unacked,
            },
            now_unix_ms: 1_000 + seq,
            cmd: Box::new(cmd),
        }
    }

    #[test]
    fn a_retried_compare_and_swap_reports_its_first_outcome() {
        let mut sm = StateMachineData::default();
        let cas = once(
            1,
            1,
            1,
            Command::Cas {
                key: "c".into(),
                expect: None,
                value: "1".into(),
            },
        );
        let (first, changes) = sm.apply_command(&cas);
        assert!(matches!(
            first,
            Response::Cas {
                succeeded: true,
                ..
            }
        ));
        assert_eq!(changes.len(), 1);
        // Without the session the retry would fail (the key exists now) and so mislead.
        let (again, changes) = sm.apply_command(&cas);
        assert_eq!(again, first);
        assert!(changes.is_empty());
        assert_eq!(sm.revision, 1);
    }

    /// A removed node stops aggregating in the removal's own revision (its host, its
    /// bandwidth figures both ways), and its daemon, if still running, cannot register again.
    #[test]
    fn a_removed_node_is_no_longer_an_aggregating_host_and_cannot_register_again() {
        use crate::aggregation::AggCommand;
        let mut sm = StateMachineData::default();
        for id in [1u64, 2] {
            sm.apply_command(&Command::SetNode(NodeMeta {
                id,
                name: format!("n{id}"),
                addr: format!("198.18.0.{id}:7480"),
                ..NodeMeta::default()
            }));
        }
        let host = |node: u64| {
            Command::Aggregation(AggCommand::Host {
                node,
                ip: std::net::Ipv4Addr::new(198, 18, 0, node as u8),
                slots: 100,
                cpu_millis: 1000,
            })
        };
        let figure = |from: u64, to: u64| {
            Command::Aggregation(AggCommand::Bandwidth {
                from,
                to,
                bytes_per_s: 1_000_000,
            })
        };
        for cmd in [host(1), host(2), figure(1, 2), figure(2, 1)] {
            assert!(matches!(sm.apply_command(&cmd).0, Response::Written { .. }));
        }
        let (reply, changes) = sm.apply_command(&Command::RemoveNode { id: 2 });
        let Response::Deleted { revision, existed } = reply else {
            panic!("{reply:?}");
        };
        assert!(existed);
        assert_eq!(sm.aggregation.hosts.keys().collect::<Vec<_>>(), [&1]);
        assert!(
            sm.aggregation.bandwidth.is_empty(),
            "both figures named node 2"
        );
        assert_eq!(sm.aggregation.revision, revision);
        assert!(
            matches!(&changes[..], [Change::Node { meta: None, .. }, Change::Aggregation { tables, .. }] if !tables.hosts.contains_key(&2)),
            "{changes:?}"
        );
        // The removed node's daemon retrying its registration is refused, in one sentence.
        let (reply, changes) = sm.apply_command(&host(2));
        assert_eq!(
            reply,
            Response::Rejected(
                "node 2 is not a member of the cluster, so it cannot aggregate".into()
            )
        );
        assert!(changes.is_empty());
        assert!(!sm.aggregation.hosts.contains_key(&2));
        // A node that never aggregated is removed with nothing to tell the aggregator.
        let (_, changes) = sm.apply_command(&Command::RemoveNode { id: 9 });
        assert_eq!(changes.len(), 1);
    }

    proptest! {
        /// Tagged writes delivered any number of times (at least once), in any interleaving of
        /// retries, leave the tables as if each had applied exactly once, and every delivery of a
        /// write gets the same reply.
        #[test]
        fn tagged_writes_apply_exactly_once(
            cmds in proptest::collection::vec((arb_command(), 1usize..4), 0..32),
        ) {
            let mut once_each = StateMachineData::default();
            let mut retried = StateMachineData::default();
            let mut first_unacked = 1;
            for (i, (cmd, copies)) in cmds.iter().enumerate() {
                let seq = i as u64 + 1;
                let tagged = once(42, seq, first_unacked, cmd.clone());
                let (want, _) = once_each.apply_command(&tagged);
                for _ in 0..*copies {
                    let (got, _) = retried.apply_command(&tagged);
                    prop_assert_eq!(&got, &want);
                }
                // The client acknowledges every other reply late, so retries of unacknowledged
                // writes are still answered from the table.
                if seq.is_multiple_of(2) {
                    first_unacked = seq + 1;
                }
            }
            prop_assert_eq!(&once_each.kv, &retried.kv);
            prop_assert_eq!(once_each.revision, retried.revision);
        }

        /// A batch does exactly what its commands do one by one.
        #[test]
        fn a_batch_equals_its_commands_in_order(cmds in proptest::collection::vec(arb_command(), 0..32)) {
            let mut one_by_one = StateMachineData::default();
            let singles: Vec<Response> = cmds.iter().map(|c| one_by_one.apply_command(c).0).collect();
            let mut batched = StateMachineData::default();
            let (r, _) = batched.apply_command(&Command::Batch(cmds));
            prop_assert_eq!(r, Response::Batch(singles));
            prop_assert_eq!(batched, one_by_one);
        }

        /// Replaying the same commands gives the same tables (determinism), revisions never go
        /// back, and every key's value equals the last successful write to it.
        #[test]
        fn apply_is_deterministic_and_matches_a_model(cmds in proptest::collection::vec(arb_command(), 0..64)) {
            let mut a = StateMachineData::default();
            let mut b = StateMachineData::default();
            let mut model: BTreeMap<String, String> = BTreeMap::new();
            let mut last_rev = 0;
            for c in &cmds {
                let (ra, _) = a.apply_command(c);
                let (rb, _) = b.apply_command(c);
                prop_assert_eq!(&ra, &rb);
                prop_assert!(a.revision >= last_rev);
                last_rev = a.revision;
                match c {
                    Command::Put { key, value } => { model.insert(key.clone(), value.clone()); }
                    Command::Delete { key } => { model.remove(key); }
                    Command::Cas { key, expect, value } if model.get(key) == expect.as_ref() => {
                        model.insert(key.clone(), value.clone());
                    }
                    _ => {}
                }
            }
            prop_assert_eq!(&a, &b);
            let got: BTreeMap<String, String> = a.kv.iter().map(|(k, v)| (k.clone(), v.value.clone())).collect();
            prop_assert_eq!(got, model);
        }
    }

    /// Nothing past the XDP maps' sizes is accepted: a VIP, an endpoint or an aggregation job
    /// beyond what the data planes hold is refused in one sentence and changes nothing, while
    /// rewriting what is there (or removing) still works at the bound.
    #[test]
    fn gateway_tables_and_jobs_past_the_xdp_maps_are_refused_whole() {
        use crate::aggregation::{AggCommand, Grouping, Quota};
        use crate::capacity::{AGG_JOBS, GATEWAY_ENDPOINTS, GATEWAY_VIPS};
        use crate::gateway::{Endpoint, EndpointKey, EndpointRecord, GatewayCommand};
        use std::net::Ipv4Addr;

        let ep = |i: usize| Endpoint {
            key: EndpointKey {
                vni: 1 + (i >> 16) as u32,
                ip: Ipv4Addr::from(0xc613_0000 | (i as u32 & 0xffff)),
            },
            record: EndpointRecord {
                mac: [2, 0, 0, 0, 0, 1],
                host: Ipv4Addr::new(198, 18, 0, 1 + (i % 200) as u8),
            },
        };
        let vip = |i: usize| Ipv4Addr::from(0xc612_0000 | i as u32);
        let gw = |c: GatewayCommand| Command::Gateway(c);
        let mut sm = StateMachineData::default();
        let (r, _) = sm.apply_command(&gw(GatewayCommand::PutEndpoints(
            (0..GATEWAY_ENDPOINTS).map(ep).collect(),
        )));
        assert!(matches!(r, Response::Written { .. }), "{r:?}");
        let (r, _) = sm.apply_command(&gw(GatewayCommand::AddVips(
            (0..GATEWAY_VIPS - 1).map(vip).collect(),
        )));
        assert!(matches!(r, Response::Written { .. }), "{r:?}");
        let before = sm.clone();

        let refused = |sm: &mut StateMachineData, cmd: Command, why: &str| {
            let (r, changes) = sm.apply_command(&cmd);
            assert_eq!(r, Response::Rejected(why.to_owned()));
            assert!(changes.is_empty());
        };
        // One endpoint more, even inside a batch of existing ones: nothing of it applies.
        let mut batch: Vec<Endpoint> = (0..10).map(ep).collect();
        batch[3].record.host = Ipv4Addr::new(198, 18, 1, 1);
        batch.push(ep(GATEWAY_ENDPOINTS));
        refused(
            &mut sm,
            gw(GatewayCommand::PutEndpoints(batch)),
            "the gateway has 262144 endpoints and this adds 1, over the 262144 its xdp maps hold; remove some first",
        );
        // Two VIPs where one fits (a repeated one counts once).
        refused(
            &mut sm,
            gw(GatewayCommand::AddVips(vec![
                vip(GATEWAY_VIPS),
                vip(GATEWAY_VIPS + 1),
                vip(GATEWAY_VIPS),
                vip(0),
            ])),
            "the gateway has 4095 vips and this adds 2, over the 4096 its xdp maps hold; remove some first",
        );
        assert_eq!(sm, before, "a refused command changes nothing");

        // At the bound: the last VIP fits, a rewrite of an endpoint changes it, a removal
        // makes room for one more.
        let (r, _) = sm.apply_command(&gw(GatewayCommand::AddVips(vec![vip(GATEWAY_VIPS - 1)])));
        assert!(matches!(r, Response::Written { .. }), "{r:?}");
        let mut moved = ep(5);
        moved.record.host = Ipv4Addr::new(198, 18, 1, 1);
        let (r, _) = sm.apply_command(&gw(GatewayCommand::PutEndpoints(vec![moved])));
        assert!(matches!(r, Response::Written { .. }), "{r:?}");
        assert_eq!(sm.gateway.endpoints[&moved.key], moved.record);
        sm.apply_command(&gw(GatewayCommand::RemoveEndpoints(vec![ep(0).key])));
        let (r, _) = sm.apply_command(&gw(GatewayCommand::PutEndpoints(vec![ep(
            GATEWAY_ENDPOINTS,
        )])));
        assert!(matches!(r, Response::Written { .. }), "{r:?}");
        assert_eq!(sm.gateway.endpoints.len(), GATEWAY_ENDPOINTS);

        // Aggregation jobs: as many as an aggregator's job map, then no more.
        let create = |name: String| {
            Command::Aggregation(AggCommand::Create {
                name,
                workers: 2,
                values: 10,
                dtype: 0,
                elastic: false,
                chunk_values: 10,
                colocate: false,
                quota: Quota {
                    job_bytes: 1 << 30,
                    cluster_bytes: 1 << 40,
                },
                grouping: Grouping::Auto,
                secret: [7; 16],
            })
        };
        for i in 0..AGG_JOBS {
            let (r, _) = sm.apply_command(&create(format!("job{i}")));
            assert!(matches!(r, Response::Written { .. }), "{i}: {r:?}");
        }
        let before = sm.clone();
        refused(
            &mut sm,
            create("one-more".into()),
            "the cluster has 1024 aggregation jobs, as many as an aggregator's job map holds; delete one before creating one-more",
        );
        assert_eq!(sm, before, "a refused job changes nothing");
    }
}
