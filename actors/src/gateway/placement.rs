//! VIP placement on the leader, free of I/O and clocks.
//!
//! The leader's gateway shell calls [`plan`] with the applied gateway tables and the lease
//! table's verdicts ([`super::lease`]) and proposes the result as one
//! `GatewayCommand::Assign`. Every change is a compare-and-set against the record the plan was
//! computed from, so a plan made from a stale view is skipped by `apply` instead of overwriting a
//! newer decision; the shell simply plans again after the next apply.
//!
//! # Safety: at most one node answers for a VIP
//!
//! A node answers ARP for a VIP only while it is the record's owner with no handoff in progress
//! and its own lease runs. So the planner takes a VIP away from an owner only when
//! - the owner has *certainly* fenced itself (`expired`: its lease ran out, margin included), or
//! - a handoff was committed and the owner has *confirmed* the release (it reported an applied
//!   revision at least the handoff's revision, so it has stopped answering ARP for it).
//!
//! A node that is neither live nor expired is *unknown*: its lease may still be running, so its
//! VIPs are neither taken nor given to it. A VIP is never set unowned.
//!
//! # Rules (one pass, loads updated as decisions are made)
//!
//! *Eligible* nodes are live, not draining and not expired. The *load* of a node is the number
//! of VIPs it owns with no handoff plus the VIPs being handed off to it: loads count where a VIP
//! is going, not where it is, so a move in flight is already accounted for and never planned
//! twice. Every choice picks the least-loaded eligible node, ties to the lowest id; because the
//! chosen node's load is bumped before the next choice, ties rotate and one plan spreads its
//! work (a dead node's VIPs go round-robin over the survivors, not all to one). The lowest id
//! is deterministic and needs no hashing: the load update alone already spreads.
//!
//! 1. An unowned VIP goes to the least-loaded eligible node (left alone if there is none).
//! 2. A VIP owned by an expired node goes directly to a new owner: the handoff target if one was
//!    in progress and is still eligible (it was already counted there), else the least-loaded
//!    eligible node.
//! 3. A handoff in progress (owner X, target Y) completes (owner Y) once X has released or X is
//!    expired. If Y is no longer eligible: when X has released, the VIP goes directly to the
//!    least-loaded eligible node (nobody is answering for it); otherwise the handoff is retargeted
//!    to the least-loaded eligible node other than X, or cancelled if no such node exists and X
//!    is eligible again. A degenerate handoff to the owner itself is cancelled.
//! 4. A VIP owned with no handoff by a live draining node starts a handoff to the least-loaded
//!    eligible node; with no eligible node it stays where it is.
//! 5. Balance: while the most-loaded eligible node has at least two more VIPs than the
//!    least-loaded one, one VIP moves from the former to the latter (ties: lowest id).
//!
//! Rules 1 and 2 (VIPs that nobody answers for) choose first, then rule 3's retargets, then rule
//! 4's drains, then balance, so the most urgent VIPs get the least-loaded nodes.
//!
//! # Balance without oscillation
//!
//! - The VIP moved is the highest address among those the node owns with no handoff and that
//!   this plan has not already changed. A VIP already in a handoff is never rebalanced, except a
//!   *stuck* one (its source is not live, so it may never confirm the release): retargeting it
//!   is safe because nobody answers ARP during a handoff.
//! - If the most-loaded node has nothing movable (its load is all incoming handoffs from live
//!   sources), balancing stops for this plan rather than moving from some other node: those
//!   handoffs complete on the next plan and their VIPs become movable then.
//! - Each move goes from a maximum to a minimum with a gap of at least two, so the sum of squared
//!   loads strictly decreases: with a fixed set of eligible nodes, repeated planning reaches a
//!   fixed point and never moves a VIP back. The moves are also the fewest possible: a node that
//!   receives never becomes a source, so on a join exactly the VIPs the new node needs move,
//!   all to it.
//! - Balance only looks at eligible nodes: a node that misses a renewal (unknown) keeps its VIPs
//!   and nothing is moved around it, so a renewal blip moves nothing (except handoffs that were
//!   headed to it, rule 3).

//!
//! # Planned placement
//!
//! When the leader holds a plan ([`Planned`]: a target node per VIP from the service planner),
//! rule 5 changes: instead of balancing counts, a VIP owned with no handoff by an eligible
//! node, untouched by rules 1-4, whose target is another eligible node, starts a handoff to its
//! target — the drain's handoff, so the new owner answers only after the old one has released
//! it. At most `max_moves` such handoffs start per plan (VIP order), which caps the churn of a
//! re-plan; rules 1-4 are never capped, so a dead node's VIPs still move at once by counts and
//! the plan improves on that afterwards. With a fixed target each VIP moves at most once, so
//! repeated planning reaches a fixed point: every VIP at its target, or its target ineligible.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use yard_raft_store::gateway::{VipChange, VipRecord};
pub use yard_raft_store::NodeId;

/// A target placement from the service planner (`yard-planner`) and how many VIPs one plan may
/// start moving toward it: the churn cap of a re-plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Planned {
    /// Where each VIP should live. VIPs it does not name stay where the rules put them.
    pub target: BTreeMap<Ipv4Addr, NodeId>,
    /// Planned moves one plan may start (rules 1-4 are never capped: they are the fast path).
    pub max_moves: usize,
}

/// What the planner looks at: the applied replicated state plus the leader's lease verdicts.
#[derive(Debug, Clone, Copy)]
pub struct PlacementInput<'a> {
    /// The applied replicated VIP table.
    pub vips: &'a BTreeMap<Ipv4Addr, VipRecord>,
    /// The replicated drain flags.
    pub draining: &'a BTreeSet<NodeId>,
    /// Gateway nodes whose lease the leader currently holds as valid.
    pub live: &'a BTreeSet<NodeId>,
    /// Nodes whose lease has certainly run out (their data plane has fenced itself). A node in
    /// both `live` and `expired` is treated as expired.
    pub expired: &'a BTreeSet<NodeId>,
    /// The applied revision each node last reported.
    pub applied: &'a BTreeMap<NodeId, u64>,
    /// With a plan, rule 5 moves VIPs toward it instead of balancing counts (see "Planned
    /// placement" in the module doc).
    pub planned: Option<&'a Planned>,
}

impl PlacementInput<'_> {
    fn is_eligible(&self, n: NodeId) -> bool {
        self.live.contains(&n) && !self.draining.contains(&n) && !self.expired.contains(&n)
    }

    /// Whether `rec`'s owner has confirmed releasing the VIP for its handoff.
    fn released(&self, owner: NodeId, rec: &VipRecord) -> bool {
        self.applied
            .get(&owner)
            .is_some_and(|a| *a >= rec.handoff_revision)
    }
}

/// What the first pass decided for one VIP.
enum Step {
    /// Leave the record as it is.
    Keep,
    /// A decision that needed no choice of node.
    Set(VipRecord),
    /// Rules 1, 2 and 3 (released, target gone): owner := least-loaded eligible node.
    Place,
    /// Rule 3 (not released, target gone): retarget the handoff away from the owner `from`.
    Retarget(NodeId),
    /// Rule 4: start a handoff away from the draining owner `from`.
    Drain(NodeId),
}

fn owned(owner: NodeId) -> VipRecord {
    VipRecord {
        owner: Some(owner),
        handoff_to: None,
        handoff_revision: 0,
    }
}

fn handoff(owner: NodeId, to: NodeId) -> VipRecord {
    VipRecord {
        owner: Some(owner),
        handoff_to: Some(to),
        handoff_revision: 0,
    }
}

fn classify(input: &PlacementInput, rec: &VipRecord) -> Step {
    let Some(x) = rec.owner else {
        return Step::Place;
    };
    if input.expired.contains(&x) {
        return match rec.handoff_to {
            Some(y) if y != x && input.is_eligible(y) => Step::Set(owned(y)),
            _ => Step::Place,
        };
    }
    let Some(y) = rec.handoff_to else {
        return if input.live.contains(&x) && input.draining.contains(&x) {
            Step::Drain(x)
        } else {
            Step::Keep
        };
    };
    if y == x {
        return Step::Set(owned(x));
    }
    match (input.released(x, rec), input.is_eligible(y)) {
        (true, true) => Step::Set(owned(y)),
        (true, false) => Step::Place,
        (false, true) => Step::Keep,
        (false, false) => Step::Retarget(x),
    }
}

/// Loads of the eligible nodes, with the least- and most-loaded picks.
struct Loads(BTreeMap<NodeId, usize>);

impl Loads {
    /// The least-loaded eligible node other than `except` (ties: lowest id).
    fn least(&self, except: Option<NodeId>) -> Option<NodeId> {
        self.0
            .iter()
            .filter(|(n, _)| Some(**n) != except)
            .min_by_key(|(n, l)| (**l, **n))
            .map(|(n, _)| *n)
    }

    /// The most-loaded eligible node (ties: lowest id).
    fn most(&self) -> Option<NodeId> {
        self.0
            .iter()
            .min_by_key(|(n, l)| (std::cmp::Reverse(**l), **n))
            .map(|(n, _)| *n)
    }

    fn add(&mut self, n: NodeId) {
        if let Some(l) = self.0.get_mut(&n) {
            *l += 1;
        }
    }

    fn sub(&mut self, n: NodeId) {
        if let Some(l) = self.0.get_mut(&n) {
            *l = l.saturating_sub(1);
        }
    }

    /// Counts `rec` for the node it is headed to, if that node is eligible.
    fn count(&mut self, rec: &VipRecord) {
        if let Some(n) = rec.handoff_to.or(rec.owner) {
            self.add(n);
        }
    }
}

/// The placement changes for one `GatewayCommand::Assign`, in VIP order; empty when there is
/// nothing to do. Each change expects the record as it is in `input.vips` and sets
/// `handoff_revision` to 0 (apply fills it in). See the module doc for the rules.
pub fn plan(input: &PlacementInput) -> Vec<VipChange> {
    let mut loads = Loads(
        input
            .live
            .iter()
            .filter(|n| input.is_eligible(**n))
            .map(|n| (*n, 0))
            .collect(),
    );
    let mut decided: BTreeMap<Ipv4Addr, VipRecord> = BTreeMap::new();
    let mut place = Vec::new();
    let mut retarget = Vec::new();
    let mut drain = Vec::new();
    // Settled records (kept or decided without a choice) count first, so every choice below sees
    // the load the node will really have.
    for (vip, rec) in input.vips {
        match classify(input, rec) {
            Step::Keep => loads.count(rec),
            Step::Set(set) => {
                loads.count(&set);
                decided.insert(*vip, set);
            }
            Step::Place => place.push(*vip),
            Step::Retarget(from) => retarget.push((*vip, from)),
            Step::Drain(from) => drain.push((*vip, from)),
        }
    }
    // Rules 1-2 (and 3 with a released owner): nobody answers for these VIPs.
    for vip in place {
        if let Some(n) = loads.least(None) {
            loads.add(n);
            decided.insert(vip, owned(n));
        }
    }
    // Rule 3: handoffs whose target is gone.
    for (vip, from) in retarget {
        if let Some(n) = loads.least(Some(from)) {
            loads.add(n);
            decided.insert(vip, handoff(from, n));
        } else if input.is_eligible(from) {
            loads.add(from);
            decided.insert(vip, owned(from));
        }
    }
    // Rule 4: drains.
    for (vip, from) in drain {
        if let Some(n) = loads.least(Some(from)) {
            loads.add(n);
            decided.insert(vip, handoff(from, n));
        }
    }
    match input.planned {
        Some(p) => toward(input, p, &mut loads, &mut decided),
        None => balance(input, &mut loads, &mut decided),
    }

    decided
        .into_iter()
        .filter_map(|(vip, set)| {
            let expect = input.vips[&vip];
            (set != expect).then_some(VipChange { vip, expect, set })
        })
        .collect()
}

/// Rule 5 with a plan; see "Planned placement" in the module doc.
fn toward(
    input: &PlacementInput,
    planned: &Planned,
    loads: &mut Loads,
    decided: &mut BTreeMap<Ipv4Addr, VipRecord>,
) {
    let mut moves = 0;
    for (vip, rec) in input.vips {
        if moves >= planned.max_moves {
            return;
        }
        if decided.contains_key(vip) {
            continue;
        }
        let (Some(x), None) = (rec.owner, rec.handoff_to) else {
            continue;
        };
        let Some(&y) = planned.target.get(vip) else {
            continue;
        };
        if y == x || !input.is_eligible(y) || !input.is_eligible(x) {
            continue;
        }
        decided.insert(*vip, handoff(x, y));
        loads.sub(x);
        loads.add(y);
        moves += 1;
    }
}

/// Rule 5; see "Balance without oscillation" in the module doc.
fn balance(input: &PlacementInput, loads: &mut Loads, decided: &mut BTreeMap<Ipv4Addr, VipRecord>) {
    // Per node: VIPs it owns with no handoff, and stuck handoffs headed to it, untouched so far.
    let mut owned_by: BTreeMap<NodeId, BTreeSet<Ipv4Addr>> = BTreeMap::new();
    let mut stuck_to: BTreeMap<NodeId, BTreeSet<Ipv4Addr>> = BTreeMap::new();
    for (vip, rec) in input.vips {
        if decided.contains_key(vip) {
            continue;
        }
        match (rec.owner, rec.handoff_to) {
            (Some(x), None) => {
                owned_by.entry(x).or_default().insert(*vip);
            }
            (Some(x), Some(y)) if !input.live.contains(&x) => {
                stuck_to.entry(y).or_default().insert(*vip);
            }
            _ => {}
        }
    }
    loop {
        let (Some(max), Some(min)) = (loads.most(), loads.least(None)) else {
            return;
        };
        if loads.0[&max] <= loads.0[&min] + 1 {
            return;
        }
        if let Some(vip) = owned_by.get_mut(&max).and_then(|s| s.pop_last()) {
            decided.insert(vip, handoff(max, min));
        } else if let Some(vip) = stuck_to.get_mut(&max).and_then(|s| s.pop_last()) {
            let owner = input.vips[&vip].owner.unwrap_or(max);
            decided.insert(vip, handoff(owner, min));
        } else {
            return;
        }
        loads.sub(max);
        loads.add(min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use yard_raft_store::gateway::{GatewayCommand, GatewayTables};

    fn vip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, (i / 250) as u8, (i % 250) as u8 + 1)
    }

    fn rec(owner: Option<NodeId>, handoff_to: Option<NodeId>, rev: u64) -> VipRecord {
        VipRecord {
            owner,
            handoff_to,
            handoff_revision: rev,
        }
    }

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    /// A little cluster: the replicated table plus the leader's view, and the revision counter.
    #[derive(Debug, Clone)]
    struct World {
        tables: GatewayTables,
        live: BTreeSet<NodeId>,
        expired: BTreeSet<NodeId>,
        applied: BTreeMap<NodeId, u64>,
        revision: u64,
        planned: Option<Planned>,
    }

    impl World {
        fn new(live: &[NodeId]) -> Self {
            Self {
                tables: GatewayTables::default(),
                live: set(live),
                expired: BTreeSet::new(),
                applied: live.iter().map(|n| (*n, 0)).collect(),
                revision: 0,
                planned: None,
            }
        }

        fn with_vips(mut self, records: &[VipRecord]) -> Self {
            for (i, r) in records.iter().enumerate() {
                self.tables.vips.insert(vip(i), *r);
            }
            self
        }

        fn plan(&self) -> Vec<VipChange> {
            plan(&PlacementInput {
                vips: &self.tables.vips,
                draining: &self.tables.draining,
                live: &self.live,
                expired: &self.expired,
                applied: &self.applied,
                planned: self.planned.as_ref(),
            })
        }

        fn apply(&mut self, changes: Vec<VipChange>) {
            self.revision += 1;
            self.tables
                .apply(&GatewayCommand::Assign(changes), self.revision);
        }

        /// Every live node reports the current revision.
        fn confirm(&mut self) {
            for n in &self.live {
                self.applied.insert(*n, self.revision);
            }
        }

        /// One plan → apply → confirm round; false when the plan was empty.
        fn step(&mut self) -> bool {
            let changes = self.plan();
            if changes.is_empty() {
                return false;
            }
            self.apply(changes);
            self.confirm();
            true
        }

        /// Runs to a fixed point; returns the number of non-empty rounds.
        fn settle(&mut self) -> usize {
            let bound = 4 + self.tables.vips.len();
            for round in 0..=bound {
                if !self.step() {
                    return round;
                }
            }
            panic!("no fixed point within {bound} rounds: {self:?}");
        }

        fn eligible(&self) -> BTreeSet<NodeId> {
            self.live
                .iter()
                .filter(|n| !self.tables.draining.contains(n) && !self.expired.contains(n))
                .copied()
                .collect()
        }

        fn load(&self, n: NodeId) -> usize {
            load_in(&self.tables.vips, n)
        }

        fn owners(&self) -> BTreeMap<Ipv4Addr, Option<NodeId>> {
            self.tables
                .vips
                .iter()
                .map(|(v, r)| (*v, r.owner))
                .collect()
        }
    }

    fn load_in(vips: &BTreeMap<Ipv4Addr, VipRecord>, n: NodeId) -> usize {
        vips.values()
            .filter(|r| (r.owner == Some(n) && r.handoff_to.is_none()) || r.handoff_to == Some(n))
            .count()
    }

    fn spread(w: &World, nodes: &BTreeSet<NodeId>) -> usize {
        let loads: Vec<usize> = nodes.iter().map(|n| w.load(*n)).collect();
        loads.iter().max().unwrap_or(&0) - loads.iter().min().unwrap_or(&0)
    }

    /// `n` live nodes 1..=n sharing `v` VIPs at a balanced fixed point.
    fn balanced(n: u64, v: usize) -> World {
        let nodes: Vec<NodeId> = (1..=n).collect();
        let mut w = World::new(&nodes).with_vips(&vec![VipRecord::default(); v]);
        w.settle();
        w
    }

    // ----- rule 1 -----

    #[test]
    fn unowned_vips_spread_over_eligible_nodes() {
        let w = World::new(&[1, 2, 3]).with_vips(&[VipRecord::default(); 7]);
        let changes = w.plan();
        assert_eq!(changes.len(), 7);
        let mut got = BTreeMap::new();
        for c in &changes {
            assert_eq!(c.expect, VipRecord::default());
            assert_eq!(c.set.handoff_to, None);
            *got.entry(c.set.owner.unwrap()).or_insert(0) += 1;
        }
        assert_eq!(got, BTreeMap::from([(1, 3), (2, 2), (3, 2)]));
    }

    #[test]
    fn unowned_vips_go_to_the_least_loaded_first() {
        let w = World::new(&[1, 2]).with_vips(&[
            rec(Some(1), None, 0),
            rec(Some(1), None, 0),
            VipRecord::default(),
        ]);
        let changes = w.plan();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].set, owned(2));
    }

    #[test]
    fn nothing_to_do_without_eligible_nodes() {
        let mut w = World::new(&[1]).with_vips(&[VipRecord::default(), rec(Some(2), None, 0)]);
        w.tables.draining.insert(1);
        w.expired.insert(2);
        assert!(w.plan().is_empty());
        let w = World::new(&[]).with_vips(&[VipRecord::default()]);
        assert!(w.plan().is_empty());
    }

    #[test]
    fn unknown_nodes_get_nothing_and_lose_nothing() {
        // Node 3 is neither live nor expired: its lease may still run.
        let w = World::new(&[1]).with_vips(&[
            rec(Some(3), None, 0),
            rec(Some(3), None, 0),
            rec(Some(3), None, 0),
            VipRecord::default(),
        ]);
        let changes = w.plan();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].vip, vip(3));
        assert_eq!(changes[0].set, owned(1));
    }

    // ----- rule 2 -----

    #[test]
    fn dead_nodes_vips_spread_over_survivors() {
        let mut w = balanced(4, 20);
        let dead_vips: BTreeSet<Ipv4Addr> = w.tables.owned_by(4).collect();
        assert_eq!(dead_vips.len(), 5);
        w.live.remove(&4);
        w.expired.insert(4);
        let changes = w.plan();
        assert_eq!(
            changes.iter().map(|c| c.vip).collect::<BTreeSet<_>>(),
            dead_vips
        );
        w.apply(changes);
        let loads: Vec<usize> = (1..=3).map(|n| w.load(n)).collect();
        assert_eq!(loads, vec![7, 7, 6]);
        assert!(w.tables.vips.values().all(|r| r.handoff_to.is_none()));
    }

    #[test]
    fn expired_owner_mid_handoff_completes_to_an_eligible_target() {
        let mut w = World::new(&[2, 3]).with_vips(&[rec(Some(1), Some(2), 5)]);
        w.expired.insert(1);
        let changes = w.plan();
        assert_eq!(changes[0].set, owned(2));
    }

    #[test]
    fn expired_owner_mid_handoff_to_a_gone_target_is_placed() {
        let mut w = World::new(&[3]).with_vips(&[rec(Some(1), Some(2), 5)]);
        w.expired.extend([1, 2]);
        let changes = w.plan();
        assert_eq!(changes[0].set, owned(3));
    }

    // ----- rule 3 -----

    #[test]
    fn handoff_completes_only_after_release() {
        let mut w = World::new(&[1, 2]).with_vips(&[rec(Some(1), Some(2), 5)]);
        w.applied.insert(1, 4);
        assert!(w.plan().is_empty(), "owner has not released yet");
        w.applied.insert(1, 5);
        let changes = w.plan();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].expect, rec(Some(1), Some(2), 5));
        assert_eq!(changes[0].set, owned(2));
    }

    #[test]
    fn handoff_to_a_gone_target_is_retargeted() {
        let mut w =
            World::new(&[1, 3, 4]).with_vips(&[rec(Some(1), Some(2), 5), rec(Some(3), None, 0)]);
        w.applied.insert(1, 4);
        let changes = w.plan();
        assert_eq!(changes.len(), 1);
        // 4 is the least loaded eligible node other than the owner.
        assert_eq!(changes[0].set, handoff(1, 4));
        w.apply(changes);
        assert_eq!(w.tables.vips[&vip(0)].handoff_revision, w.revision);
    }

    #[test]
    fn handoff_to_a_gone_target_is_cancelled_when_the_owner_is_alone() {
        let mut w = World::new(&[1]).with_vips(&[rec(Some(1), Some(2), 5)]);
        w.applied.insert(1, 4);
        let changes = w.plan();
        assert_eq!(changes[0].set, owned(1));
    }

    #[test]
    fn handoff_released_to_a_gone_target_is_placed_directly() {
        let mut w = World::new(&[1, 3]).with_vips(&[rec(Some(1), Some(2), 5)]);
        w.tables.draining.insert(1);
        w.applied.insert(1, 5);
        let changes = w.plan();
        assert_eq!(changes[0].set, owned(3));
    }

    #[test]
    fn handoff_from_an_unknown_owner_waits() {
        let mut w = World::new(&[2]).with_vips(&[rec(Some(1), Some(2), 5)]);
        w.applied.remove(&1);
        assert!(w.plan().is_empty());
    }

    // ----- rule 4 -----

    #[test]
    fn draining_node_hands_off_each_vip() {
        let mut w = balanced(3, 9);
        w.tables.draining.insert(2);
        let changes = w.plan();
        assert_eq!(changes.len(), 3);
        for c in &changes {
            assert_eq!(c.expect.owner, Some(2));
            assert_eq!(c.set.owner, Some(2), "the owner keeps it until it releases");
            assert_ne!(c.set.handoff_to, Some(2));
        }
        w.settle();
        assert_eq!(w.tables.owned_by(2).count(), 0);
        assert_eq!((w.load(1), w.load(3)), (5, 4));
    }

    #[test]
    fn draining_alone_keeps_its_vips() {
        let mut w = balanced(1, 3);
        w.tables.draining.insert(1);
        assert!(w.plan().is_empty());
    }

    // ----- rule 5 -----

    #[test]
    fn join_moves_exactly_what_balance_needs() {
        let mut w = balanced(3, 60);
        let before = w.owners();
        w.live.insert(4);
        w.applied.insert(4, w.revision);
        assert_eq!(w.settle(), 2, "start the handoffs, then complete them");
        let after = w.owners();
        let moved: Vec<_> = before
            .iter()
            .filter(|(v, o)| after[*v] != **o)
            .map(|(v, _)| after[v])
            .collect();
        assert_eq!(moved.len(), 15);
        assert!(moved.iter().all(|o| *o == Some(4)));
        assert_eq!((1..=4).map(|n| w.load(n)).collect::<Vec<_>>(), [15; 4]);
    }

    #[test]
    fn balance_moves_the_highest_addresses() {
        let w = World::new(&[1, 2]).with_vips(&[rec(Some(1), None, 0); 4]);
        let changes = w.plan();
        assert_eq!(
            changes.iter().map(|c| c.vip).collect::<Vec<_>>(),
            [vip(2), vip(3)]
        );
        assert!(changes.iter().all(|c| c.set == handoff(1, 2)));
    }

    #[test]
    fn balance_counts_handoffs_in_flight() {
        // 1 owns 2 and is already handing 2 more to node 2: balanced as far as the plan goes.
        let mut w = World::new(&[1, 2]).with_vips(&[
            rec(Some(1), None, 0),
            rec(Some(1), None, 0),
            rec(Some(1), Some(2), 3),
            rec(Some(1), Some(2), 3),
        ]);
        w.applied.insert(1, 2);
        assert!(w.plan().is_empty());
    }

    #[test]
    fn balance_waits_for_incoming_handoffs_from_live_sources() {
        // Node 2's load is all incoming handoffs: nothing to move from it yet.
        let mut w = World::new(&[1, 2, 3]).with_vips(&[rec(Some(1), Some(2), 3); 3]);
        w.applied.insert(1, 2);
        assert!(w.plan().is_empty());
    }

    #[test]
    fn stuck_handoffs_are_rebalanced() {
        // The source (node 9) is unknown and may never confirm; its handoffs all target 2.
        let w = World::new(&[2, 3]).with_vips(&[rec(Some(9), Some(2), 3); 4]);
        let changes = w.plan();
        assert_eq!(changes.len(), 2);
        assert!(changes.iter().all(|c| c.set == handoff(9, 3)));
    }

    #[test]
    fn renewal_blip_moves_nothing() {
        let mut w = balanced(3, 10);
        w.live.remove(&3);
        assert!(w.plan().is_empty());
        w.live.insert(3);
        assert!(w.plan().is_empty());
    }

    #[test]
    fn degenerate_handoff_to_the_owner_is_cancelled() {
        let w = World::new(&[1]).with_vips(&[rec(Some(1), Some(1), 3)]);
        assert_eq!(w.plan()[0].set, owned(1));
    }

    // ----- rule 5 with a plan -----

    fn all_to(w: &World, n: NodeId, max_moves: usize) -> Planned {
        Planned {
            target: w.tables.vips.keys().map(|v| (*v, n)).collect(),
            max_moves,
        }
    }

    /// Runs plan → apply → confirm to a fixed point, checking that no plan starts more than
    /// `cap` handoffs to a live owner's VIPs; returns the rounds.
    fn settle_capped(w: &mut World, cap: usize) -> usize {
        for round in 0..(4 + 2 * w.tables.vips.len()) {
            let changes = w.plan();
            if changes.is_empty() {
                return round;
            }
            let started = changes
                .iter()
                .filter(|c| c.expect.handoff_to.is_none() && c.set.handoff_to.is_some())
                .count();
            assert!(started <= cap, "round {round} started {started} handoffs");
            w.apply(changes);
            w.confirm();
        }
        panic!("no fixed point: {w:?}");
    }

    #[test]
    fn planned_moves_are_handoffs_capped_per_plan() {
        let mut w = balanced(3, 9);
        w.planned = Some(all_to(&w, 1, 2));
        let changes = w.plan();
        assert_eq!(changes.len(), 2);
        for c in &changes {
            // Make-before-break as a drain: the owner stays until it has released.
            let owner = c.expect.owner.unwrap();
            assert_ne!(owner, 1);
            assert_eq!(c.set, handoff(owner, 1));
        }
        settle_capped(&mut w, 2);
        assert!(w.owners().values().all(|o| *o == Some(1)));
        // A fixed target is a fixed point: nothing moves again.
        assert!(w.plan().is_empty());
    }

    #[test]
    fn a_dead_nodes_vips_move_at_once_then_toward_the_plan() {
        let mut w = balanced(3, 6);
        w.planned = Some(all_to(&w, 2, 1));
        let on_1: Vec<Ipv4Addr> = w
            .owners()
            .iter()
            .filter(|(_, o)| **o == Some(1))
            .map(|(v, _)| *v)
            .collect();
        assert_eq!(on_1.len(), 2);
        w.live.remove(&1);
        w.expired.insert(1);
        let changes = w.plan();
        // Rule 2 is not capped: both orphans get a new owner directly, by counts.
        for v in &on_1 {
            let c = changes.iter().find(|c| c.vip == *v).expect("orphan moved");
            assert_eq!(c.set.handoff_to, None);
            assert!(matches!(c.set.owner, Some(2 | 3)));
        }
        let started = changes
            .iter()
            .filter(|c| c.set.handoff_to.is_some())
            .count();
        assert!(started <= 1);
        w.apply(changes);
        w.confirm();
        settle_capped(&mut w, 1);
        assert!(w.owners().values().all(|o| *o == Some(2)));
    }

    #[test]
    fn a_plan_neither_targets_an_ineligible_node_nor_balances_counts() {
        let mut w = World::new(&[1, 2, 3]).with_vips(&[rec(Some(1), None, 0); 4]);
        w.tables.draining.insert(3);
        assert!(!w.plan().is_empty(), "without a plan, counts are balanced");
        w.planned = Some(all_to(&w, 3, 10));
        assert!(w.plan().is_empty(), "node 3 drains, so nothing moves to it");
        w.planned = Some(all_to(&w, 1, 10));
        assert!(w.plan().is_empty(), "already at the target");
    }

    // ----- properties -----

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Status {
        Live,
        Expired,
        Unknown,
    }

    fn status() -> impl Strategy<Value = Status> {
        prop_oneof![
            6 => Just(Status::Live),
            2 => Just(Status::Expired),
            1 => Just(Status::Unknown),
        ]
    }

    /// A node id that may not exist (0 and n+1..n+2 are never members).
    fn any_node(n: u64) -> impl Strategy<Value = Option<NodeId>> {
        prop::option::weighted(0.85, 0..=n + 2)
    }

    fn any_record(n: u64) -> impl Strategy<Value = VipRecord> {
        (
            any_node(n),
            prop::option::weighted(0.3, 0..=n + 2),
            0..25u64,
        )
            .prop_map(|(owner, handoff_to, rev)| {
                rec(
                    owner,
                    handoff_to,
                    if handoff_to.is_some() { rev } else { 0 },
                )
            })
    }

    fn any_world() -> impl Strategy<Value = World> {
        (1..8u64).prop_flat_map(|n| {
            (
                prop::collection::vec(status(), n as usize),
                prop::collection::vec(any::<bool>(), n as usize),
                prop::collection::vec(0..25u64, n as usize),
                prop::collection::vec(any_record(n), 0..200),
            )
                .prop_map(move |(st, drain, applied, records)| {
                    let mut w = World::new(&[]).with_vips(&records);
                    w.revision = 25;
                    for id in 1..=n {
                        let i = (id - 1) as usize;
                        match st[i] {
                            Status::Live => {
                                w.live.insert(id);
                                w.applied.insert(id, applied[i]);
                            }
                            Status::Expired => {
                                w.expired.insert(id);
                            }
                            Status::Unknown => {}
                        }
                        if drain[i] {
                            w.tables.draining.insert(id);
                        }
                    }
                    w
                })
        })
    }

    /// Checks one plan against the single-step invariants and applies it.
    fn checked_step(w: &mut World) -> Result<bool, TestCaseError> {
        let eligible = w.eligible();
        let before = w.tables.vips.clone();
        let changes = w.plan();
        let mut seen = BTreeSet::new();
        for c in &changes {
            prop_assert!(seen.insert(c.vip), "one change per VIP");
            prop_assert_eq!(
                Some(&c.expect),
                before.get(&c.vip),
                "expect is the input record"
            );
            let new_owner = c.set.owner;
            prop_assert!(new_owner.is_some(), "never strand a VIP: {:?}", c);
            if new_owner != c.expect.owner {
                prop_assert!(eligible.contains(&new_owner.unwrap()), "{:?}", c);
            }
            if let Some(to) = c
                .set
                .handoff_to
                .filter(|_| c.set.handoff_to != c.expect.handoff_to)
            {
                prop_assert!(eligible.contains(&to), "{:?}", c);
            }
        }
        let empty = changes.is_empty();
        w.apply(changes);
        for (v, old) in &before {
            let new = w.tables.vips[v];
            if let Some(x) = old.owner {
                if new.owner != old.owner && !w.expired.contains(&x) {
                    // Only a completed handoff whose release the owner confirmed.
                    prop_assert!(old.handoff_to.is_some(), "{:?} -> {:?}", old, new);
                    prop_assert!(
                        w.applied
                            .get(&x)
                            .is_some_and(|a| *a >= old.handoff_revision),
                        "{:?} -> {:?}",
                        old,
                        new
                    );
                }
            }
        }
        if !eligible.is_empty() {
            for r in w.tables.vips.values() {
                prop_assert!(r.owner.is_some());
                prop_assert!(!w.expired.contains(&r.owner.unwrap()));
            }
        }
        Ok(!empty)
    }

    /// Runs checked rounds to a fixed point and checks it.
    fn checked_settle(w: &mut World) -> Result<(), TestCaseError> {
        let bound = 4 + w.tables.vips.len();
        let mut rounds = 0;
        loop {
            let changed = checked_step(w)?;
            // Nodes report their applied revision whether or not a round changed anything: a
            // handoff written before this world began (its owner behind on it) completes only
            // once the owner has confirmed it.
            w.confirm();
            if !changed && w.plan().is_empty() {
                break;
            }
            rounds += 1;
            prop_assert!(rounds <= bound, "no fixed point within {} rounds", bound);
        }
        let eligible = w.eligible();
        prop_assert!(spread(w, &eligible) <= 1, "unbalanced: {:?}", w);
        prop_assert!(w.plan().is_empty());
        for d in w.live.intersection(&w.tables.draining) {
            if eligible.iter().any(|n| n != d) {
                prop_assert_eq!(w.tables.owned_by(*d).count(), 0);
            }
        }
        Ok(())
    }

    fn any_balanced() -> impl Strategy<Value = (World, u64)> {
        (2..8u64, 0..200usize, any::<prop::sample::Index>())
            .prop_map(|(n, v, pick)| (balanced(n, v), pick.index(n as usize) as u64 + 1))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_tables_settle_safely(mut w in any_world()) {
            checked_settle(&mut w)?;
        }

        #[test]
        fn death_moves_exactly_the_dead_nodes_vips((mut w, dead) in any_balanced()) {
            let theirs: BTreeSet<Ipv4Addr> = w.tables.owned_by(dead).collect();
            w.live.remove(&dead);
            w.expired.insert(dead);
            let changes = w.plan();
            prop_assert_eq!(changes.iter().map(|c| c.vip).collect::<BTreeSet<_>>(), theirs);
            let survivors = w.eligible();
            for c in &changes {
                prop_assert!(survivors.contains(&c.set.owner.unwrap()));
                prop_assert_eq!(c.set.handoff_to, None);
            }
            w.apply(changes);
            prop_assert!(spread(&w, &survivors) <= 1);
            prop_assert!(w.plan().is_empty());
        }

        #[test]
        fn join_moves_the_minimum_all_to_the_new_node((mut w, _) in any_balanced()) {
            let n = w.live.len();
            let v = w.tables.vips.len();
            let before = w.owners();
            let new = n as u64 + 1;
            w.live.insert(new);
            w.applied.insert(new, w.revision);
            checked_settle(&mut w)?;
            let after = w.owners();
            let moved: Vec<_> = before
                .iter()
                .filter(|(vip, o)| after[*vip] != **o)
                .map(|(vip, _)| after[vip])
                .collect();
            prop_assert!(moved.iter().all(|o| *o == Some(new)));
            // The fewest VIPs the new node can take with the rest within one of it.
            let minimum = (0..=v).find(|k| (v - k).div_ceil(n) <= k + 1).unwrap();
            prop_assert_eq!(moved.len(), minimum);
        }

        #[test]
        fn drain_empties_the_node((mut w, d) in any_balanced()) {
            w.tables.draining.insert(d);
            checked_settle(&mut w)?;
            prop_assert_eq!(w.tables.owned_by(d).count(), 0);
            prop_assert!(w.tables.vips.values().all(|r| r.owner.is_some() && r.handoff_to.is_none()));
        }
    }
}
