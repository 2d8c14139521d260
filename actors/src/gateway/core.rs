//! The node side of the gateway, pure: given the replicated tables, this node's id, its lease
//! and the time, decide what the XDP maps, the interface's addresses and the announcements must
//! be. The shell feeds it events and executes the effects it returns, in order.
//!
//! What a node serves for a VIP follows from the record and the lease:
//! - owner = me, no handoff: `Owned` (forward, answer ARP, announce when taken);
//! - owner = me, handoff in progress: `ForwardOnly` (the release: no ARP, but tunnel traffic
//!   still addressed here by stale caches is forwarded);
//! - no longer mine: `ForwardOnly` for `linger_ms` more (the new owner's announcements need
//!   that long to reach every cache), then removed.
//!
//! The data plane fences itself with the lease deadline in its config map; the core also takes
//! the addresses off the interface when the lease lapses, so the kernel stops answering for them
//! as well, and puts them back (and re-announces) when a renewal succeeds again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use yard_raft_store::gateway::{
    Endpoint, EndpointKey, EndpointRecord, GatewayChange, GatewayTables, VipRecord,
};
use yard_raft_store::NodeId;

use super::sources::{self, Source, Sources};

/// How soon a host whose MAC is still unknown is looked up again.
const UNRESOLVED_RETRY_MS: u64 = 50;

/// What the data plane does for a VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    Owned,
    ForwardOnly,
}

/// Timings of the node side.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// How long a released VIP keeps being forwarded.
    pub linger_ms: u64,
    /// Gratuitous ARPs per takeover (the first at once).
    pub garp_repeats: u32,
    /// Spacing of the repeats: over 1 s, the neighbour lock time, so one always lands.
    pub garp_interval_ms: u64,
    /// How often compute hosts' MACs are looked up again (a host may change NIC).
    pub resolve_every_ms: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            linger_ms: 3_000,
            garp_repeats: 3,
            garp_interval_ms: 1_100,
            resolve_every_ms: 1_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The whole table (start, or a snapshot was installed) as of `revision`.
    Reset {
        tables: Box<GatewayTables>,
        revision: u64,
        now_ms: u64,
    },
    /// One change from the feed.
    Changed {
        revision: u64,
        change: GatewayChange,
        now_ms: u64,
    },
    /// The leader granted `granted_ms` to a renewal sent at `sent_ms`, when it had applied
    /// `leader_revision`.
    Granted {
        sent_ms: u64,
        granted_ms: u64,
        leader_revision: u64,
        now_ms: u64,
    },
    /// A compute host's MAC as the kernel's neighbour table has it.
    HostResolved {
        host: Ipv4Addr,
        mac: [u8; 6],
    },
    Tick {
        now_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write the data plane's lease deadline (monotonic ms).
    SetLease {
        deadline_ms: u64,
    },
    PutVip {
        vip: Ipv4Addr,
        serve: Serve,
    },
    RemoveVip {
        vip: Ipv4Addr,
    },
    AddAddress {
        vip: Ipv4Addr,
    },
    RemoveAddress {
        vip: Ipv4Addr,
    },
    /// Send a gratuitous ARP for `vip` (`repeat` counts from 0).
    Announce {
        vip: Ipv4Addr,
        repeat: u32,
    },
    /// Log: this node now owns `vip` as of `revision`.
    Taken {
        vip: Ipv4Addr,
        revision: u64,
    },
    PutEndpoint(Endpoint),
    RemoveEndpoint(EndpointKey),
    /// Accept tunnel frames for `vni` from the outer source `source` ([`super::sources`]).
    PutSource {
        vni: u32,
        source: Ipv4Addr,
    },
    RemoveSource {
        vni: u32,
        source: Ipv4Addr,
    },
    /// Look these hosts up in the neighbour table (and make the kernel resolve missing ones).
    Resolve(Vec<Ipv4Addr>),
    PutHost {
        host: Ipv4Addr,
        mac: [u8; 6],
    },
    RemoveHost {
        host: Ipv4Addr,
    },
    /// The lease lapsed (`true`) or was regained (`false`).
    Fenced(bool),
}

/// The revision a renewal reports as applied. Normally what the core has executed. A
/// restarted daemon follows the tables only after a grant, and a revoked node gets no grant
/// until it reports a revision at least the leader's: while it does not follow the tables *and*
/// its data plane's lease has lapsed (it answers ARP for nothing, so it holds nothing to
/// release), it reports its store's revision instead, and takes the next grant only once its
/// store is that new (`actor.rs`), syncing before it serves.
pub fn reported_revision(
    synced: bool,
    lapsed: bool,
    core_revision: u64,
    store_revision: u64,
) -> u64 {
    if !synced && lapsed {
        store_revision
    } else {
        core_revision
    }
}

/// The node-side gateway state machine.
#[derive(Debug)]
pub struct NodeCore {
    me: NodeId,
    cfg: CoreConfig,
    revision: u64,
    vips: BTreeMap<Ipv4Addr, VipRecord>,
    endpoints: BTreeMap<EndpointKey, EndpointRecord>,
    /// Compute hosts in use → number of endpoints on them.
    hosts: BTreeMap<Ipv4Addr, usize>,
    /// The (VNI, outer source) pairs the endpoints allow.
    sources: Sources,
    /// What the data plane's source table holds (adopted, then kept equal to `sources`).
    programmed_sources: BTreeSet<Source>,
    resolved: BTreeMap<Ipv4Addr, [u8; 6]>,
    next_resolve_ms: u64,
    /// When hosts still without a MAC are looked up again.
    next_unresolved_ms: u64,
    deadline_ms: u64,
    fenced: bool,
    /// What the maps hold.
    programmed: BTreeMap<Ipv4Addr, Serve>,
    addresses: BTreeSet<Ipv4Addr>,
    /// Released VIPs still forwarded until then.
    lingering: BTreeMap<Ipv4Addr, u64>,
    /// Pending announcements: vip → (next repeat, when).
    announcing: BTreeMap<Ipv4Addr, (u32, u64)>,
    /// Owned VIPs answered for (lease valid) → since when, without a break: what an observer
    /// needs to check that no two nodes ever answered for one VIP at the same time.
    owned_since: BTreeMap<Ipv4Addr, u64>,
    /// State adopted from a previous daemon's pinned maps and no tables yet: until the first
    /// reset nothing is changed, since reconciling against tables not yet read would remove
    /// every adopted VIP (a restart grace granted before the first reset did, and the next
    /// daemon adopted no VIP: 110-160 ms of a VIP's traffic lost).
    adopted_untabled: bool,
}

impl NodeCore {
    pub fn new(me: NodeId, cfg: CoreConfig) -> Self {
        Self {
            me,
            cfg,
            revision: 0,
            vips: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            hosts: BTreeMap::new(),
            sources: Sources::default(),
            programmed_sources: BTreeSet::new(),
            resolved: BTreeMap::new(),
            next_resolve_ms: 0,
            next_unresolved_ms: 0,
            deadline_ms: 0,
            fenced: true,
            programmed: BTreeMap::new(),
            addresses: BTreeSet::new(),
            lingering: BTreeMap::new(),
            announcing: BTreeMap::new(),
            owned_since: BTreeMap::new(),
            adopted_untabled: false,
        }
    }

    /// Owned VIPs this node answers for, each with the time it started doing so.
    pub fn owned_since(&self) -> &BTreeMap<Ipv4Addr, u64> {
        &self.owned_since
    }

    /// The revision whose effects have been produced: renewals report it so the leader knows
    /// a release was applied.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Monotonic ms at which this node's lease ends.
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// What the data plane serves, as programmed.
    pub fn serving(&self) -> &BTreeMap<Ipv4Addr, Serve> {
        &self.programmed
    }

    pub fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// The (VNI, outer source) pairs the data plane accepts tunnel frames from.
    pub fn sources(&self) -> &BTreeSet<Source> {
        &self.programmed_sources
    }

    /// Adopts what a previous daemon left in the pinned maps, so a restart changes nothing that
    /// the tables still want (no flap) and removes what they no longer do.
    pub fn adopt(
        &mut self,
        vips: impl IntoIterator<Item = (Ipv4Addr, Serve)>,
        addresses: impl IntoIterator<Item = Ipv4Addr>,
        deadline_ms: u64,
        endpoints: impl IntoIterator<Item = Endpoint>,
        sources: impl IntoIterator<Item = Source>,
    ) {
        // Known endpoints are diffed against the tables at the first reset, so one removed
        // while no daemon ran is removed from the map too; so are the sources (a data plane
        // pinned by a daemon without them has none, and gets them all then).
        self.endpoints = endpoints.into_iter().map(|e| (e.key, e.record)).collect();
        self.programmed_sources = sources.into_iter().collect();
        self.programmed = vips.into_iter().collect();
        self.addresses = addresses.into_iter().collect();
        self.deadline_ms = deadline_ms;
        self.fenced = false;
        self.adopted_untabled = true;
    }

    pub fn handle(&mut self, event: Event) -> Vec<Effect> {
        if self.adopted_untabled && !matches!(event, Event::Reset { .. }) {
            return Vec::new();
        }
        self.adopted_untabled = false;
        let mut out = Vec::new();
        let now = match event {
            Event::Reset {
                tables,
                revision,
                now_ms,
            } => {
                let old_endpoints = std::mem::take(&mut self.endpoints);
                // Sources first in, last out: a new endpoint's host may send as soon as the
                // gateway can send to it, and a removed one stops only once it is gone.
                self.sources = Sources::of_table(&tables.endpoints);
                let (allow, withdraw) =
                    sources::diff(&self.programmed_sources, &self.sources.pairs());
                for (vni, source) in allow {
                    out.push(Effect::PutSource { vni, source });
                }
                for key in old_endpoints.keys() {
                    if !tables.endpoints.contains_key(key) {
                        out.push(Effect::RemoveEndpoint(*key));
                    }
                }
                for (key, record) in &tables.endpoints {
                    if old_endpoints.get(key) != Some(record) {
                        out.push(Effect::PutEndpoint(Endpoint {
                            key: *key,
                            record: *record,
                        }));
                    }
                }
                for (vni, source) in withdraw {
                    out.push(Effect::RemoveSource { vni, source });
                }
                self.programmed_sources = self.sources.pairs();
                self.endpoints = tables.endpoints.clone();
                self.recount_hosts(&mut out, now_ms);
                self.vips = tables.vips.clone();
                self.revision = revision;
                now_ms
            }
            Event::Changed {
                revision,
                change,
                now_ms,
            } => {
                self.revision = self.revision.max(revision);
                match change {
                    GatewayChange::Vip { vip, record } => match record {
                        Some(r) => {
                            self.vips.insert(vip, r);
                        }
                        None => {
                            self.vips.remove(&vip);
                        }
                    },
                    GatewayChange::Endpoint { key, record } => {
                        let old_host = self.endpoints.get(&key).map(|o| o.host);
                        let change = self.sources.update(&key, old_host, record.map(|r| r.host));
                        if let Some((vni, source)) = change.allowed {
                            self.programmed_sources.insert((vni, source));
                            out.push(Effect::PutSource { vni, source });
                        }
                        let old = match record {
                            Some(r) => {
                                out.push(Effect::PutEndpoint(Endpoint { key, record: r }));
                                self.endpoints.insert(key, r)
                            }
                            None => {
                                out.push(Effect::RemoveEndpoint(key));
                                self.endpoints.remove(&key)
                            }
                        };
                        if let Some((vni, source)) = change.withdrawn {
                            self.programmed_sources.remove(&(vni, source));
                            out.push(Effect::RemoveSource { vni, source });
                        }
                        if old.map(|o| o.host) != record.map(|r| r.host) {
                            if let Some(o) = old {
                                self.unref_host(o.host, &mut out);
                            }
                            if let Some(r) = record {
                                self.ref_host(r.host, &mut out);
                            }
                        }
                    }
                    GatewayChange::Drain { .. } | GatewayChange::Grace { .. } => {}
                }
                now_ms
            }
            Event::Granted {
                sent_ms,
                granted_ms,
                leader_revision,
                now_ms,
            } => {
                let deadline = super::lease::node_deadline(sent_ms, granted_ms);
                // After a lapse the leader may have given our VIPs away: serve again only once
                // the tables we act on are at least as new as the leader's at the grant.
                let stale = now_ms >= self.deadline_ms && self.revision < leader_revision;
                // The latest grant sets the deadline, shortening it too: after a restart grace
                // the first ordinary grant brings the data plane back to an ordinary lease.
                if stale {
                    // Not taken; the next renewal (after the feed caught up) will be.
                } else if deadline != self.deadline_ms {
                    self.deadline_ms = deadline;
                    out.push(Effect::SetLease {
                        deadline_ms: deadline,
                    });
                }
                now_ms
            }
            Event::HostResolved { host, mac } => {
                if self.hosts.contains_key(&host) && self.resolved.get(&host) != Some(&mac) {
                    self.resolved.insert(host, mac);
                    out.push(Effect::PutHost { host, mac });
                }
                return out;
            }
            Event::Tick { now_ms } => {
                if now_ms >= self.next_resolve_ms && !self.hosts.is_empty() {
                    self.next_resolve_ms = now_ms + self.cfg.resolve_every_ms;
                    self.next_unresolved_ms = now_ms + UNRESOLVED_RETRY_MS;
                    out.push(Effect::Resolve(self.hosts.keys().copied().collect()));
                } else if now_ms >= self.next_unresolved_ms {
                    // Frames to a host with no MAC yet are dropped: look again soon, not in a
                    // second (the kernel answers the first lookup's nudge within milliseconds).
                    let missing: Vec<Ipv4Addr> = self
                        .hosts
                        .keys()
                        .filter(|h| !self.resolved.contains_key(h))
                        .copied()
                        .collect();
                    if !missing.is_empty() {
                        self.next_unresolved_ms = now_ms + UNRESOLVED_RETRY_MS;
                        out.push(Effect::Resolve(missing));
                    }
                }
                now_ms
            }
        };
        self.reconcile(now, &mut out);
        out
    }

    fn ref_host(&mut self, host: Ipv4Addr, out: &mut Vec<Effect>) {
        let n = self.hosts.entry(host).or_insert(0);
        *n += 1;
        if *n == 1 {
            out.push(Effect::Resolve(vec![host]));
        }
    }

    fn unref_host(&mut self, host: Ipv4Addr, out: &mut Vec<Effect>) {
        if let Some(n) = self.hosts.get_mut(&host) {
            *n -= 1;
            if *n == 0 {
                self.hosts.remove(&host);
                if self.resolved.remove(&host).is_some() {
                    out.push(Effect::RemoveHost { host });
                }
            }
        }
    }

    fn recount_hosts(&mut self, out: &mut Vec<Effect>, now_ms: u64) {
        let mut hosts: BTreeMap<Ipv4Addr, usize> = BTreeMap::new();
        for r in self.endpoints.values() {
            *hosts.entry(r.host).or_insert(0) += 1;
        }
        for host in self.hosts.keys() {
            if !hosts.contains_key(host) && self.resolved.remove(host).is_some() {
                out.push(Effect::RemoveHost { host: *host });
            }
        }
        let fresh: Vec<Ipv4Addr> = hosts
            .keys()
            .filter(|h| !self.resolved.contains_key(h))
            .copied()
            .collect();
        self.hosts = hosts;
        if !fresh.is_empty() {
            out.push(Effect::Resolve(fresh));
            self.next_resolve_ms = now_ms + self.cfg.resolve_every_ms;
        }
    }

    /// What the data plane should serve now.
    fn desired(&self, now_ms: u64) -> BTreeMap<Ipv4Addr, Serve> {
        let mut want = BTreeMap::new();
        for (vip, until) in &self.lingering {
            if *until > now_ms {
                want.insert(*vip, Serve::ForwardOnly);
            }
        }
        for (vip, r) in &self.vips {
            if r.owner == Some(self.me) {
                let serve = if r.handoff_to.is_some() {
                    Serve::ForwardOnly
                } else {
                    Serve::Owned
                };
                want.insert(*vip, serve);
            }
        }
        want
    }

    fn reconcile(&mut self, now_ms: u64, out: &mut Vec<Effect>) {
        let valid = now_ms < self.deadline_ms;
        if valid == self.fenced {
            self.fenced = !valid;
            out.push(Effect::Fenced(self.fenced));
        }
        // VIPs that stop being ours start lingering.
        // (A VIP removed from the pool stops at once: nobody else will serve it either.)
        // A VIP lost while fenced does not linger: its traffic moved on long ago.
        for vip in self.programmed.keys() {
            let record = self.vips.get(vip);
            let still_mine = record.is_some_and(|r| r.owner == Some(self.me));
            if valid && !still_mine && record.is_some() && !self.lingering.contains_key(vip) {
                self.lingering.insert(*vip, now_ms + self.cfg.linger_ms);
            }
        }
        let me = self.me;
        self.lingering.retain(|vip, until| {
            *until > now_ms && self.vips.get(vip).is_some_and(|r| r.owner != Some(me))
        });
        let want = self.desired(now_ms);
        let old = std::mem::take(&mut self.programmed);
        for vip in old.keys() {
            if !want.contains_key(vip) {
                out.push(Effect::RemoveVip { vip: *vip });
                self.announcing.remove(vip);
            }
        }
        for (vip, serve) in &want {
            let before = old.get(vip);
            if before != Some(serve) {
                out.push(Effect::PutVip {
                    vip: *vip,
                    serve: *serve,
                });
                if *serve == Serve::Owned {
                    out.push(Effect::Taken {
                        vip: *vip,
                        revision: self.revision,
                    });
                    if valid {
                        self.announcing.insert(*vip, (0, now_ms));
                    }
                } else {
                    self.announcing.remove(vip);
                }
            }
        }
        self.programmed = want;
        // Addresses: every owned VIP while the lease holds, none once it lapses. A forward-only
        // VIP has none: the program passes its ARP to the kernel, which must not answer it.
        let addrs: BTreeSet<Ipv4Addr> = if valid {
            self.programmed
                .iter()
                .filter(|(_, s)| **s == Serve::Owned)
                .map(|(v, _)| *v)
                .collect()
        } else {
            BTreeSet::new()
        };
        for vip in self.addresses.difference(&addrs) {
            out.push(Effect::RemoveAddress { vip: *vip });
        }
        for vip in addrs.difference(&self.addresses) {
            out.push(Effect::AddAddress { vip: *vip });
            // Regaining the lease: whoever cached us before the lapse may have moved on.
            if self.programmed.get(vip) == Some(&Serve::Owned) && !self.announcing.contains_key(vip)
            {
                self.announcing.insert(*vip, (0, now_ms));
            }
        }
        self.addresses = addrs;
        let programmed = &self.programmed;
        self.owned_since
            .retain(|vip, _| valid && programmed.get(vip) == Some(&Serve::Owned));
        if valid {
            for (vip, serve) in &self.programmed {
                if *serve == Serve::Owned {
                    self.owned_since.entry(*vip).or_insert(now_ms);
                }
            }
        }
        if !valid {
            self.announcing.clear();
            self.lingering.clear();
            return;
        }
        let repeats = self.cfg.garp_repeats;
        let interval = self.cfg.garp_interval_ms;
        self.announcing.retain(|vip, (repeat, at)| {
            if *at <= now_ms {
                out.push(Effect::Announce {
                    vip: *vip,
                    repeat: *repeat,
                });
                *repeat += 1;
                *at = now_ms + interval;
            }
            *repeat < repeats
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yard_raft_store::gateway::GatewayCommand;

    fn vip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 255, n)
    }

    fn owned(node: NodeId) -> VipRecord {
        VipRecord {
            owner: Some(node),
            ..VipRecord::default()
        }
    }

    fn core() -> NodeCore {
        NodeCore::new(1, CoreConfig::default())
    }

    fn changed(rev: u64, v: Ipv4Addr, r: Option<VipRecord>, now_ms: u64) -> Event {
        Event::Changed {
            revision: rev,
            change: GatewayChange::Vip { vip: v, record: r },
            now_ms,
        }
    }

    fn grant(c: &mut NodeCore, now_ms: u64) -> Vec<Effect> {
        c.handle(Event::Granted {
            sent_ms: now_ms,
            granted_ms: 100,
            leader_revision: 0,
            now_ms,
        })
    }

    #[test]
    fn after_a_lapse_a_grant_waits_for_the_leaders_revision() {
        let mut c = core();
        grant(&mut c, 0);
        c.handle(changed(5, vip(1), Some(owned(1)), 10));
        c.handle(Event::Tick { now_ms: 200 });
        // The leader gave the VIP away at revision 9; we have applied only 5.
        let fx = c.handle(Event::Granted {
            sent_ms: 300,
            granted_ms: 100,
            leader_revision: 9,
            now_ms: 300,
        });
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::AddAddress { .. })),
            "{fx:?}"
        );
        // Once the reassignment is applied, the grant is taken and nothing of the VIP returns.
        c.handle(changed(9, vip(1), Some(owned(2)), 310));
        let fx = c.handle(Event::Granted {
            sent_ms: 320,
            granted_ms: 100,
            leader_revision: 9,
            now_ms: 320,
        });
        assert!(fx.contains(&Effect::Fenced(false)));
        assert!(
            !fx.iter()
                .any(|e| matches!(e, Effect::AddAddress { .. } | Effect::Announce { .. })),
            "{fx:?}"
        );
    }

    #[test]
    fn a_restarted_daemon_reports_its_store_only_while_fenced() {
        // Following the tables: what the core executed.
        assert_eq!(reported_revision(true, true, 5, 9), 5);
        // Not yet following, its pinned data plane still serving (a restart grace): what it
        // executed, so no release is confirmed before it really happened.
        assert_eq!(reported_revision(false, false, 0, 9), 0);
        // Not following and fenced: its store's revision, so the leader can let it back.
        assert_eq!(reported_revision(false, true, 0, 9), 9);
    }

    #[test]
    fn taking_a_vip_programs_adds_and_announces_with_spacing() {
        let mut c = core();
        grant(&mut c, 0);
        let fx = c.handle(changed(5, vip(1), Some(owned(1)), 10));
        assert!(fx.contains(&Effect::PutVip {
            vip: vip(1),
            serve: Serve::Owned
        }));
        assert!(fx.contains(&Effect::AddAddress { vip: vip(1) }));
        assert!(fx.contains(&Effect::Announce {
            vip: vip(1),
            repeat: 0
        }));
        // Keep the lease alive and tick: the next announcement comes 1100 ms later, not before.
        c.handle(Event::Granted {
            sent_ms: 1000,
            granted_ms: 500,
            leader_revision: 0,
            now_ms: 1000,
        });
        let fx = c.handle(Event::Tick { now_ms: 1050 });
        assert!(!fx.iter().any(|e| matches!(e, Effect::Announce { .. })));
        let fx = c.handle(Event::Tick { now_ms: 1110 });
        assert!(fx.contains(&Effect::Announce {
            vip: vip(1),
            repeat: 1
        }));
    }

    #[test]
    fn lapsed_lease_withdraws_addresses_and_regained_lease_reannounces() {
        let mut c = core();
        grant(&mut c, 0);
        c.handle(changed(5, vip(1), Some(owned(1)), 10));
        let fx = c.handle(Event::Tick { now_ms: 150 });
        assert!(fx.contains(&Effect::Fenced(true)));
        assert!(fx.contains(&Effect::RemoveAddress { vip: vip(1) }));
        let fx = grant(&mut c, 200);
        assert!(fx.contains(&Effect::Fenced(false)));
        assert!(fx.contains(&Effect::AddAddress { vip: vip(1) }));
        assert!(fx.contains(&Effect::Announce {
            vip: vip(1),
            repeat: 0
        }));
    }

    #[test]
    fn a_handoff_releases_to_forward_only_and_lingers_after_the_move() {
        let mut c = core();
        grant(&mut c, 0);
        c.handle(changed(5, vip(1), Some(owned(1)), 10));
        let releasing = VipRecord {
            owner: Some(1),
            handoff_to: Some(2),
            handoff_revision: 6,
        };
        let fx = c.handle(changed(6, vip(1), Some(releasing), 20));
        assert!(fx.contains(&Effect::PutVip {
            vip: vip(1),
            serve: Serve::ForwardOnly
        }));
        // Released: the kernel must not answer ARP for it either.
        assert!(fx.contains(&Effect::RemoveAddress { vip: vip(1) }));
        assert_eq!(c.revision(), 6);
        let fx = c.handle(changed(7, vip(1), Some(owned(2)), 30));
        assert!(!fx.iter().any(|e| matches!(e, Effect::RemoveVip { .. })));
        assert_eq!(c.serving().get(&vip(1)), Some(&Serve::ForwardOnly));
        // Keep the lease and pass the linger time: removed.
        let mut fx = Vec::new();
        for t in (100..3100).step_by(50) {
            fx.extend(grant(&mut c, t));
        }
        fx.extend(c.handle(Event::Tick { now_ms: 3100 }));
        assert!(fx.contains(&Effect::RemoveVip { vip: vip(1) }));
    }

    #[test]
    fn endpoints_follow_the_table_and_hosts_are_resolved_once() {
        let mut c = core();
        let mut t = GatewayTables::default();
        let ep = |n: u8, host: u8| Endpoint {
            key: EndpointKey {
                vni: 100,
                ip: Ipv4Addr::new(198, 19, 1, n),
            },
            record: EndpointRecord {
                mac: [2, 0, 0, 0, 0, n],
                host: Ipv4Addr::new(198, 18, 0, host),
            },
        };
        t.apply(&GatewayCommand::PutEndpoints(vec![ep(1, 5), ep(2, 5)]), 1);
        let fx = c.handle(Event::Reset {
            tables: Box::new(t),
            revision: 1,
            now_ms: 0,
        });
        assert_eq!(
            fx.iter()
                .filter(|e| matches!(e, Effect::PutEndpoint(_)))
                .count(),
            2
        );
        assert!(fx.contains(&Effect::Resolve(vec![Ipv4Addr::new(198, 18, 0, 5)])));
        let host = Ipv4Addr::new(198, 18, 0, 5);
        let fx = c.handle(Event::HostResolved { host, mac: [2; 6] });
        assert_eq!(fx, vec![Effect::PutHost { host, mac: [2; 6] }]);
        // Removing one endpoint keeps the host; removing the last drops it.
        let rm = |n: u8| Event::Changed {
            revision: 2,
            change: GatewayChange::Endpoint {
                key: ep(n, 5).key,
                record: None,
            },
            now_ms: 0,
        };
        assert!(!c.handle(rm(1)).contains(&Effect::RemoveHost { host }));
        assert!(c.handle(rm(2)).contains(&Effect::RemoveHost { host }));
    }

    /// The data plane's source table follows the endpoints: a host may send for a VNI while it
    /// holds an endpoint of it; an adopted table is brought to the tables at the first reset.
    #[test]
    fn sources_follow_the_endpoints_hosts_per_vni() {
        let h = |n: u8| Ipv4Addr::new(198, 18, 0, n);
        let ep = |vni: u32, n: u8, host: u8| Endpoint {
            key: EndpointKey {
                vni,
                ip: Ipv4Addr::new(198, 19, 1, n),
            },
            record: EndpointRecord {
                mac: [2, 0, 0, 0, 0, n],
                host: h(host),
            },
        };
        let put = |vni, host| Effect::PutSource {
            vni,
            source: h(host),
        };
        let remove = |vni, host| Effect::RemoveSource {
            vni,
            source: h(host),
        };
        let sources = |fx: &[Effect]| -> Vec<Effect> {
            fx.iter()
                .filter(|e| matches!(e, Effect::PutSource { .. } | Effect::RemoveSource { .. }))
                .cloned()
                .collect()
        };
        // Adopted: a stale pair (VNI 300 from host 9) and one still wanted.
        let mut c = core();
        c.adopt([], [], 0, [], [(100, h(5)), (300, h(9))]);
        let mut t = GatewayTables::default();
        t.apply(
            &GatewayCommand::PutEndpoints(vec![ep(100, 1, 5), ep(100, 2, 5), ep(200, 1, 6)]),
            1,
        );
        let fx = c.handle(Event::Reset {
            tables: Box::new(t),
            revision: 1,
            now_ms: 0,
        });
        assert_eq!(sources(&fx), vec![put(200, 6), remove(300, 9)]);
        assert_eq!(
            c.sources(),
            &[(100, h(5)), (200, h(6))].into_iter().collect()
        );
        let change = |e: Endpoint, present: bool| Event::Changed {
            revision: 2,
            change: GatewayChange::Endpoint {
                key: e.key,
                record: present.then_some(e.record),
            },
            now_ms: 0,
        };
        // Host 6 gets an endpoint of VNI 100 too: allowed before the endpoint is written.
        let fx = c.handle(change(ep(100, 3, 6), true));
        assert_eq!(sources(&fx), vec![put(100, 6)]);
        let at = |fx: &[Effect], want: &Effect| fx.iter().position(|e| e == want);
        assert!(
            at(&fx, &put(100, 6)) < fx.iter().position(|e| matches!(e, Effect::PutEndpoint(_)))
        );
        // One of host 5's two endpoints goes: it still has one.
        assert_eq!(sources(&c.handle(change(ep(100, 1, 5), false))), vec![]);
        // The other moves to host 7: host 7 in, host 5 out, after the endpoint was rewritten.
        let fx = c.handle(change(ep(100, 2, 7), true));
        assert_eq!(sources(&fx), vec![put(100, 7), remove(100, 5)]);
        assert!(
            at(&fx, &remove(100, 5)) > fx.iter().position(|e| matches!(e, Effect::PutEndpoint(_)))
        );
        assert_eq!(
            c.sources(),
            &[(100, h(6)), (100, h(7)), (200, h(6))]
                .into_iter()
                .collect()
        );
    }

    /// The first reset, with tables in which VIP 1 is this node's (node 1).
    fn reset_owning_vip1(c: &mut NodeCore, revision: u64, now_ms: u64) -> Vec<Effect> {
        let mut t = GatewayTables::default();
        t.apply(&GatewayCommand::AddVips(vec![vip(1)]), 1);
        t.vips.insert(vip(1), owned(1));
        c.handle(Event::Reset {
            tables: Box::new(t),
            revision,
            now_ms,
        })
    }

    #[test]
    fn adopted_state_is_left_alone_until_the_tables_are_read() {
        let mut c = core();
        c.adopt([(vip(1), Serve::Owned)], [vip(1)], 500, [], []);
        // A restart grace granted before the first reset, a tick: the core has no tables, and
        // reconciling against none would remove the adopted VIP from the pinned maps.
        let fx = c.handle(Event::Granted {
            sent_ms: 1000,
            granted_ms: 10_000,
            leader_revision: 9,
            now_ms: 1000,
        });
        assert!(fx.is_empty(), "{fx:?}");
        assert!(c.handle(Event::Tick { now_ms: 1100 }).is_empty());
        // The tables (VIP 1 ours) find it programmed: nothing to put or remove.
        let fx = reset_owning_vip1(&mut c, 9, 1200);
        assert!(
            !fx.iter()
                .any(|e| matches!(e, Effect::PutVip { .. } | Effect::RemoveVip { .. })),
            "{fx:?}"
        );
        // From then on the core acts: a grant is taken.
        assert!(!grant(&mut c, 1300).is_empty());
    }

    #[test]
    fn a_restart_adopting_the_same_state_changes_nothing() {
        let mut c = core();
        c.adopt([(vip(1), Serve::Owned)], [vip(1)], 500, [], []);
        let fx = reset_owning_vip1(&mut c, 2, 100);
        assert!(
            !fx.iter().any(|e| matches!(
                e,
                Effect::PutVip { .. } | Effect::RemoveVip { .. } | Effect::RemoveAddress { .. }
            )),
            "{fx:?}"
        );
    }
}
