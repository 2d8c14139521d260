//! The gateway's replicated tables: which node owns each VIP, which compute host each tenant
//! endpoint lives on, and which nodes are draining.
//!
//! Ownership changes are compare-and-set ([`VipChange`]): the leader's placement core computes
//! them from the state it has applied, and a change whose expectation no longer holds is
//! skipped rather than applied over a newer decision. One VIP record holds one owner, so two
//! owners are impossible by construction; a planned move is a two-step handoff (the old owner
//! releases, then the new one takes) so that no two nodes ever answer ARP for a VIP at once.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// The largest VXLAN network identifier (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// Who answers for a VIP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VipRecord {
    /// The node that owns the VIP (`None`: not yet placed).
    pub owner: Option<NodeId>,
    /// A planned move in progress: `owner` has been asked to release the VIP to this node.
    /// While set, the owner forwards tunnel traffic still addressed to it but answers no ARP,
    /// and the target takes the VIP only once the owner has applied the release.
    pub handoff_to: Option<NodeId>,
    /// The revision at which the handoff was committed: the owner has released the VIP once
    /// it reports an applied revision at least this high.
    pub handoff_revision: u64,
}

/// A tenant endpoint's address in the overlay: VXLAN network id plus inner IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EndpointKey {
    pub vni: u32,
    pub ip: Ipv4Addr,
}

/// Where a tenant endpoint lives: its MAC and the compute host behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EndpointRecord {
    pub mac: [u8; 6],
    pub host: Ipv4Addr,
}

/// One endpoint row, as commands and the CLI carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    pub key: EndpointKey,
    pub record: EndpointRecord,
}

/// A compare-and-set on one VIP's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipChange {
    pub vip: Ipv4Addr,
    /// What the proposer saw; the change is skipped if the record differs.
    pub expect: VipRecord,
    /// The new record (`handoff_revision` is filled in at apply time).
    pub set: VipRecord,
}

/// Gateway commands, wrapped in `Command::Gateway`. Never reorder: the index is the wire tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GatewayCommand {
    /// Add VIPs to the pool, unplaced (existing ones are left as they are).
    AddVips(Vec<Ipv4Addr>),
    /// Remove VIPs from the pool; their owners withdraw them.
    RemoveVips(Vec<Ipv4Addr>),
    /// Insert or replace endpoints.
    PutEndpoints(Vec<Endpoint>),
    /// Remove endpoints.
    RemoveEndpoints(Vec<EndpointKey>),
    /// Mark a node as draining (its VIPs are handed off and it gets no new ones) or not.
    SetDrain { node: NodeId, draining: bool },
    /// Placement decisions of the leader, each a compare-and-set; all in one Raft entry.
    Assign(Vec<VipChange>),
    /// A planned restart of `node`: it keeps its VIPs for `ms` without renewing (`0` clears
    /// the grace). Replicated before it is granted, so every later leader holds the node too.
    Grace { node: NodeId, ms: u64 },
}

/// One change to the gateway tables, as actors see it on the change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayChange {
    Vip {
        vip: Ipv4Addr,
        record: Option<VipRecord>,
    },
    Endpoint {
        key: EndpointKey,
        record: Option<EndpointRecord>,
    },
    Drain {
        node: NodeId,
        draining: bool,
    },
    Grace {
        node: NodeId,
        ms: u64,
    },
}

/// The gateway's part of the replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayTables {
    pub vips: BTreeMap<Ipv4Addr, VipRecord>,
    pub endpoints: BTreeMap<EndpointKey, EndpointRecord>,
    pub draining: BTreeSet<NodeId>,
    /// Restart graces in force: node → ms.
    pub graces: BTreeMap<NodeId, u64>,
    /// The revision of the last command that changed these tables. Gateway nodes compare it,
    /// not the cluster-wide revision (which every KV write moves), to know whether the tables
    /// they act on are as new as the leader's.
    pub revision: u64,
}

impl GatewayTables {
    /// Why `cmd` cannot be applied, if it cannot: a VIP pool or an endpoint table larger than
    /// the XDP maps every gateway node programs them into ([`crate::capacity`]), whose excess
    /// traffic would be dropped without a word. Refused whole, in one sentence.
    pub fn admit(&self, cmd: &GatewayCommand) -> Result<(), String> {
        match cmd {
            GatewayCommand::AddVips(vips) => {
                let new: BTreeSet<&Ipv4Addr> =
                    vips.iter().filter(|v| !self.vips.contains_key(v)).collect();
                let cap = crate::capacity::GATEWAY_VIPS;
                if self.vips.len() + new.len() > cap {
                    return Err(format!(
                        "the gateway has {} vips and this adds {}, over the {cap} its xdp maps hold; remove some first",
                        self.vips.len(),
                        new.len()
                    ));
                }
            }
            GatewayCommand::PutEndpoints(eps) => {
                let new: BTreeSet<&EndpointKey> = eps
                    .iter()
                    .map(|e| &e.key)
                    .filter(|k| !self.endpoints.contains_key(k))
                    .collect();
                let cap = crate::capacity::GATEWAY_ENDPOINTS;
                if self.endpoints.len() + new.len() > cap {
                    return Err(format!(
                        "the gateway has {} endpoints and this adds {}, over the {cap} its xdp maps hold; remove some first",
                        self.endpoints.len(),
                        new.len()
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Applies `cmd` at `revision`, returning what changed. A command that changes nothing
    /// returns no changes (the caller then does not bump the revision).
    pub fn apply(&mut self, cmd: &GatewayCommand, revision: u64) -> Vec<GatewayChange> {
        let mut out = Vec::new();
        match cmd {
            GatewayCommand::AddVips(vips) => {
                for vip in vips {
                    if !self.vips.contains_key(vip) {
                        self.vips.insert(*vip, VipRecord::default());
                        out.push(GatewayChange::Vip {
                            vip: *vip,
                            record: Some(VipRecord::default()),
                        });
                    }
                }
            }
            GatewayCommand::RemoveVips(vips) => {
                for vip in vips {
                    if self.vips.remove(vip).is_some() {
                        out.push(GatewayChange::Vip {
                            vip: *vip,
                            record: None,
                        });
                    }
                }
            }
            GatewayCommand::PutEndpoints(eps) => {
                for ep in eps {
                    if self.endpoints.insert(ep.key, ep.record) != Some(ep.record) {
                        out.push(GatewayChange::Endpoint {
                            key: ep.key,
                            record: Some(ep.record),
                        });
                    }
                }
            }
            GatewayCommand::RemoveEndpoints(keys) => {
                for key in keys {
                    if self.endpoints.remove(key).is_some() {
                        out.push(GatewayChange::Endpoint {
                            key: *key,
                            record: None,
                        });
                    }
                }
            }
            GatewayCommand::SetDrain { node, draining } => {
                let changed = if *draining {
                    self.draining.insert(*node)
                } else {
                    self.draining.remove(node)
                };
                if changed {
                    out.push(GatewayChange::Drain {
                        node: *node,
                        draining: *draining,
                    });
                }
            }
            GatewayCommand::Grace { node, ms } => {
                let changed = if *ms == 0 {
                    self.graces.remove(node).is_some()
                } else {
                    self.graces.insert(*node, *ms) != Some(*ms)
                };
                if changed {
                    out.push(GatewayChange::Grace {
                        node: *node,
                        ms: *ms,
                    });
                }
            }
            GatewayCommand::Assign(changes) => {
                for ch in changes {
                    let Some(current) = self.vips.get_mut(&ch.vip) else {
                        continue;
                    };
                    if *current != ch.expect {
                        continue;
                    }
                    let mut set = ch.set;
                    set.handoff_revision = match set.handoff_to {
                        None => 0,
                        Some(_) if set.handoff_to == current.handoff_to => current.handoff_revision,
                        Some(_) => revision,
                    };
                    if set != *current {
                        *current = set;
                        out.push(GatewayChange::Vip {
                            vip: ch.vip,
                            record: Some(set),
                        });
                    }
                }
            }
        }
        if !out.is_empty() {
            self.revision = revision;
        }
        out
    }

    /// VIPs per owner (handoff targets not counted): what `yard gateway vip list` shows.
    pub fn owned_by(&self, node: NodeId) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.vips
            .iter()
            .filter(move |(_, r)| r.owner == Some(node))
            .map(|(v, _)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 255, n)
    }

    #[test]
    fn assign_is_compare_and_set() {
        let mut t = GatewayTables::default();
        t.apply(&GatewayCommand::AddVips(vec![vip(1)]), 1);
        let take = |owner| VipChange {
            vip: vip(1),
            expect: VipRecord::default(),
            set: VipRecord {
                owner: Some(owner),
                ..VipRecord::default()
            },
        };
        assert_eq!(t.apply(&GatewayCommand::Assign(vec![take(1)]), 2).len(), 1);
        // A second decision made from the same stale view is skipped: one owner stays.
        assert!(t
            .apply(&GatewayCommand::Assign(vec![take(2)]), 3)
            .is_empty());
        assert_eq!(t.vips[&vip(1)].owner, Some(1));
    }

    #[test]
    fn handoff_revision_is_the_commit_revision() {
        let mut t = GatewayTables::default();
        t.apply(&GatewayCommand::AddVips(vec![vip(1)]), 1);
        let owned = VipRecord {
            owner: Some(1),
            ..VipRecord::default()
        };
        t.apply(
            &GatewayCommand::Assign(vec![VipChange {
                vip: vip(1),
                expect: VipRecord::default(),
                set: owned,
            }]),
            2,
        );
        t.apply(
            &GatewayCommand::Assign(vec![VipChange {
                vip: vip(1),
                expect: owned,
                set: VipRecord {
                    owner: Some(1),
                    handoff_to: Some(2),
                    handoff_revision: 999,
                },
            }]),
            7,
        );
        assert_eq!(t.vips[&vip(1)].handoff_revision, 7);
    }

    #[test]
    fn unchanged_writes_report_no_change() {
        let mut t = GatewayTables::default();
        let ep = Endpoint {
            key: EndpointKey {
                vni: 100,
                ip: Ipv4Addr::new(198, 19, 1, 1),
            },
            record: EndpointRecord {
                mac: [2, 0, 0, 0, 0, 1],
                host: Ipv4Addr::new(198, 18, 0, 5),
            },
        };
        assert_eq!(t.apply(&GatewayCommand::PutEndpoints(vec![ep]), 1).len(), 1);
        assert!(t
            .apply(&GatewayCommand::PutEndpoints(vec![ep]), 2)
            .is_empty());
        assert!(t.apply(&GatewayCommand::AddVips(vec![]), 3).is_empty());
    }
}
