//! The gateway's invariants under faults, as pure checkers over what the chaos run observed.
//!
//! Every time here is a [`Ms`]: milliseconds on one run clock (CLOCK_MONOTONIC, which every
//! namespace on the machine shares, shifted so that 0 is the start of the fault schedule), so a
//! node's data-plane timestamps, the runner's fault times and the probe stream's datagrams all
//! compare directly.
//!
//! - [`AnsweringLog`]: the data plane's "who answers ARP for this VIP" intervals, from each node's
//!   `gateway stats`; two nodes answering for one VIP at the same time is a violation
//!   ([`AnsweringLog::overlaps`]).
//! - [`check_ownership`]: the control plane's VIP → owner table sampled over time; a VIP left
//!   with a down owner, or with no owner, for longer than a budget is a violation.
//! - [`LossGap`] and its helpers: the probe stream's loss windows, attributed to run phases.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

/// Milliseconds on the run clock (negative: before the schedule started).
pub type Ms = i64;

/// A yard node id (node `i` runs on topology host `i`).
pub type NodeId = u64;

/// An unbroken interval during which `node`'s data plane answered ARP for `vip`, as far as it
/// was observed: from the start the node reported to its latest observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub vip: Ipv4Addr,
    pub node: NodeId,
    pub since: Ms,
    pub until: Ms,
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node {} answered for {} over [{}, {}] ms",
            self.node, self.vip, self.since, self.until
        )
    }
}

/// Two nodes answering for one VIP at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub vip: Ipv4Addr,
    pub first: Interval,
    pub second: Interval,
    /// The common part, `[from, to]`.
    pub from: Ms,
    pub to: Ms,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DOUBLE OWNER of {}: nodes {} and {} both answered over [{}, {}] ms ({}; {})",
            self.vip,
            self.first.node,
            self.second.node,
            self.from,
            self.to,
            self.first,
            self.second
        )
    }
}

/// Answering intervals per (VIP, node), built from observations `(since, now)`: consecutive
/// observations with the same `since` extend one interval.
#[derive(Debug, Clone, Default)]
pub struct AnsweringLog {
    /// (vip, node, since) → latest observation.
    spans: BTreeMap<(Ipv4Addr, NodeId, Ms), Ms>,
    observations: usize,
}

impl AnsweringLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// `node` reported at `now` that it has answered for `vip` without a break since `since`.
    pub fn observe(&mut self, node: NodeId, vip: Ipv4Addr, since: Ms, now: Ms) {
        // A report cannot end before it starts; clamp rather than invent a negative interval.
        let until = now.max(since);
        let end = self.spans.entry((vip, node, since)).or_insert(until);
        *end = (*end).max(until);
        self.observations += 1;
    }

    /// Observations recorded so far.
    pub fn observations(&self) -> usize {
        self.observations
    }

    /// Every interval, by VIP, node and start.
    pub fn intervals(&self) -> Vec<Interval> {
        self.spans
            .iter()
            .map(|(&(vip, node, since), &until)| Interval {
                vip,
                node,
                since,
                until,
            })
            .collect()
    }

    /// Every pair of intervals of one VIP on different nodes that share an instant (closed
    /// intervals: a node that was seen answering at the very millisecond another started
    /// counts), earliest first.
    pub fn overlaps(&self) -> Vec<Overlap> {
        let mut by_vip: BTreeMap<Ipv4Addr, Vec<Interval>> = BTreeMap::new();
        for i in self.intervals() {
            by_vip.entry(i.vip).or_default().push(i);
        }
        let mut out = Vec::new();
        for (vip, mut list) in by_vip {
            list.sort_by_key(|i| (i.since, i.until, i.node));
            for (k, a) in list.iter().enumerate() {
                // Sorted by start: once a later interval starts after `a` ends, none overlaps.
                for b in list[k + 1..].iter().take_while(|b| b.since <= a.until) {
                    if a.node != b.node {
                        out.push(Overlap {
                            vip,
                            first: *a,
                            second: *b,
                            from: b.since,
                            to: a.until.min(b.until),
                        });
                    }
                }
            }
        }
        out.sort_by_key(|o| (o.from, o.vip));
        out
    }
}

/// Stretches longer than `budget` within `[from, to]` during which no node was seen answering
/// for a VIP of `vips`: (vip, start, end). A VIP owned by a node that has fenced itself but still
/// renews, so that the leader never moves it, shows up here and nowhere else.
pub fn unanswered(
    log: &AnsweringLog,
    vips: &[Ipv4Addr],
    from: Ms,
    to: Ms,
    budget: Ms,
) -> Vec<(Ipv4Addr, Ms, Ms)> {
    let all = log.intervals();
    let mut out = Vec::new();
    for &vip in vips {
        let mut list: Vec<&Interval> = all.iter().filter(|i| i.vip == vip).collect();
        list.sort_by_key(|i| i.since);
        let mut covered = from;
        for i in list {
            if i.since > covered && i.since.min(to) - covered > budget {
                out.push((vip, covered, i.since.min(to)));
            }
            covered = covered.max(i.until);
        }
        if to - covered > budget {
            out.push((vip, covered, to));
        }
    }
    out.sort_by_key(|u| (u.1, u.0));
    out
}

/// One row of `yard gateway vip list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipRow {
    pub vip: Ipv4Addr,
    pub owner: Option<NodeId>,
    pub handoff_to: Option<NodeId>,
}

/// One answered `vip list`: the table held at some instant in `[sent, received]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipSample {
    pub sent: Ms,
    pub received: Ms,
    pub rows: Vec<VipRow>,
}

impl VipSample {
    /// The owner of `vip` in this sample (`None`: no owner, or not in the pool).
    pub fn owner(&self, vip: Ipv4Addr) -> Option<NodeId> {
        self.rows
            .iter()
            .find(|r| r.vip == vip)
            .and_then(|r| r.owner)
    }
}

/// A node that was down (killed, paused, link down or cut off) over `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outage {
    pub node: NodeId,
    pub from: Ms,
    pub to: Ms,
}

impl Outage {
    fn overlaps(&self, from: Ms, to: Ms) -> bool {
        self.from <= to && from < self.to
    }
}

/// A breach of "every VIP has a live owner within the budget".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnershipViolation {
    /// `vip` was still owned by `owner` at `seen_at`, more than the budget after `owner` went
    /// down at `down_from` (and before it came back). Reported once per VIP and outage.
    StaleOwner {
        vip: Ipv4Addr,
        owner: NodeId,
        down_from: Ms,
        seen_at: Ms,
    },
    /// `vip` had no owner over at least `[from, to]`, longer than the budget, while some node
    /// was up throughout.
    Unowned { vip: Ipv4Addr, from: Ms, to: Ms },
}

impl OwnershipViolation {
    /// When the violation began, for attributing it to a phase of the run.
    pub fn at(&self) -> Ms {
        match self {
            OwnershipViolation::StaleOwner { down_from, .. } => *down_from,
            OwnershipViolation::Unowned { from, .. } => *from,
        }
    }
}

impl fmt::Display for OwnershipViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnershipViolation::StaleOwner {
                vip,
                owner,
                down_from,
                seen_at,
            } => write!(
                f,
                "{vip} still owned by node {owner} at {seen_at} ms, {} ms after it went down at {down_from} ms",
                seen_at - down_from
            ),
            OwnershipViolation::Unowned { vip, from, to } => write!(
                f,
                "{vip} had no owner over [{from}, {to}] ms ({} ms) while a node was up",
                to - from
            ),
        }
    }
}

/// Checks the sampled VIP table against the outages: a VIP owned by a down node must move within
/// `budget` ms of the node going down, and no VIP may stay ownerless for more than `budget` ms
/// while one of `nodes` is up. `samples` are in the order they were taken.
///
/// Conservative both ways, since a sample shows the table at an unknown instant in
/// `[sent, received]`: a stale owner counts only if the sample was sent more than the budget
/// after the outage began and received before it ended; an ownerless stretch is measured from
/// the first ownerless sample's receipt to the last one's sending.
pub fn check_ownership(
    samples: &[VipSample],
    outages: &[Outage],
    nodes: &[NodeId],
    budget: Ms,
) -> Vec<OwnershipViolation> {
    let mut out = Vec::new();
    // Stale owners, once per (vip, outage).
    let mut reported = std::collections::BTreeSet::new();
    for s in samples {
        for row in &s.rows {
            let Some(owner) = row.owner else { continue };
            for (k, o) in outages.iter().enumerate() {
                if o.node == owner
                    && s.sent > o.from + budget
                    && s.received < o.to
                    && reported.insert((row.vip, k))
                {
                    out.push(OwnershipViolation::StaleOwner {
                        vip: row.vip,
                        owner,
                        down_from: o.from,
                        seen_at: s.sent,
                    });
                }
            }
        }
    }
    // Ownerless stretches per VIP.
    let mut vips: Vec<Ipv4Addr> = samples
        .iter()
        .flat_map(|s| s.rows.iter().map(|r| r.vip))
        .collect();
    vips.sort_unstable();
    vips.dedup();
    let someone_up = |from: Ms, to: Ms| {
        nodes
            .iter()
            .any(|n| !outages.iter().any(|o| o.node == *n && o.overlaps(from, to)))
    };
    for vip in vips {
        // (first ownerless sample's receipt, latest ownerless sample's sending)
        let mut stretch: Option<(Ms, Ms)> = None;
        let close = |stretch: &mut Option<(Ms, Ms)>, out: &mut Vec<OwnershipViolation>| {
            if let Some((from, to)) = stretch.take() {
                if to - from > budget && someone_up(from, to) {
                    out.push(OwnershipViolation::Unowned { vip, from, to });
                }
            }
        };
        for s in samples {
            match s.rows.iter().find(|r| r.vip == vip) {
                Some(r) if r.owner.is_none() => {
                    let st = stretch.get_or_insert((s.received, s.sent));
                    st.1 = st.1.max(s.sent);
                }
                _ => close(&mut stretch, &mut out),
            }
        }
        close(&mut stretch, &mut out);
    }
    out.sort_by_key(OwnershipViolation::at);
    out
}

/// How long a down node's VIPs took to move, as the samples show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reassignment {
    /// The node owned no VIP when it went down (or nothing was sampled before).
    NothingOwned,
    /// The first sample showing it owning nothing arrived this long after it went down (an
    /// upper bound on the failover time, at the sampling resolution).
    After(Ms),
    /// No sample during the outage showed it owning nothing.
    NotSeen,
}

impl fmt::Display for Reassignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reassignment::NothingOwned => f.write_str("owned no vip"),
            Reassignment::After(ms) => write!(f, "its vips moved within {ms} ms"),
            Reassignment::NotSeen => f.write_str("its vips were not seen moving"),
        }
    }
}

/// See [`Reassignment`].
pub fn reassignment(samples: &[VipSample], outage: &Outage) -> Reassignment {
    let owns = |s: &VipSample| s.rows.iter().any(|r| r.owner == Some(outage.node));
    let before = samples.iter().rev().find(|s| s.received <= outage.from);
    if !before.is_some_and(owns) {
        return Reassignment::NothingOwned;
    }
    samples
        .iter()
        .filter(|s| s.sent >= outage.from && s.received < outage.to)
        .find(|s| !owns(s))
        .map_or(Reassignment::NotSeen, |s| {
            Reassignment::After(s.received - outage.from)
        })
}

/// The VIPs `node` owned according to the last sample taken before `at`.
pub fn owned_before(samples: &[VipSample], node: NodeId, at: Ms) -> Vec<Ipv4Addr> {
    samples
        .iter()
        .rev()
        .find(|s| s.received <= at)
        .map(|s| {
            s.rows
                .iter()
                .filter(|r| r.owner == Some(node))
                .map(|r| r.vip)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `vip` was owned by one of `nodes` at any instant in `[from, to]` as far as the
/// samples tell: the last sample before `from` (the owner then) and every sample in between.
pub fn owned_by_any(
    samples: &[VipSample],
    vip: Ipv4Addr,
    nodes: &[NodeId],
    from: Ms,
    to: Ms,
) -> bool {
    let by = |s: &VipSample| s.owner(vip).is_some_and(|o| nodes.contains(&o));
    samples
        .iter()
        .rev()
        .find(|s| s.received <= from)
        .is_some_and(by)
        || samples
            .iter()
            .filter(|s| s.received >= from && s.sent <= to)
            .any(by)
}

/// A run of lost probe datagrams on the run clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossGap {
    /// When the first lost datagram was due.
    pub start: Ms,
    /// Just after the last lost datagram was due (`start + lost × interval`).
    pub lost_until: Ms,
    /// The loss window: from the last datagram received before to the first one after.
    pub len: Ms,
    pub lost: u64,
    /// Whether anything arrived after it (a gap at the end of the stream has not closed).
    pub resumed: bool,
}

/// The gaps that started in `[from, to)`.
pub fn gaps_in(gaps: &[LossGap], from: Ms, to: Ms) -> impl Iterator<Item = &LossGap> {
    gaps.iter().filter(move |g| g.start >= from && g.start < to)
}

/// The largest loss window among the gaps that started in `[from, to)`, 0 if none.
pub fn largest_gap(gaps: &[LossGap], from: Ms, to: Ms) -> Ms {
    gaps_in(gaps, from, to).map(|g| g.len).max().unwrap_or(0)
}

/// Datagrams due in `[from, to)` that never arrived.
pub fn lost_within(gaps: &[LossGap], from: Ms, to: Ms, interval_ms: f64) -> u64 {
    gaps.iter()
        .filter(|g| g.start < to && g.lost_until > from)
        .map(|g| {
            // Count the gap's datagrams whose due time falls in the window.
            (0..g.lost)
                .filter(|k| {
                    let due = g.start as f64 + *k as f64 * interval_ms;
                    due >= from as f64 && due < to as f64
                })
                .count() as u64
        })
        .sum()
}

/// Whether every VIP in `rows` has an owner among `nodes`, none is being handed off, and the
/// nodes' VIP counts differ by at most one.
pub fn balanced(rows: &[VipRow], nodes: &[NodeId]) -> bool {
    let settled = rows
        .iter()
        .all(|r| r.handoff_to.is_none() && r.owner.is_some_and(|o| nodes.contains(&o)));
    let loads: Vec<usize> = nodes
        .iter()
        .map(|n| rows.iter().filter(|r| r.owner == Some(*n)).count())
        .collect();
    let (lo, hi) = (
        loads.iter().copied().min().unwrap_or(0),
        loads.iter().copied().max().unwrap_or(0),
    );
    settled && hi - lo <= 1
}

/// Compares the data plane with the VIP table: every VIP must be answered for by exactly its
/// owner. `answering` lists, per node, the VIPs it answers ARP for. Returns what differs.
pub fn answering_mismatches(rows: &[VipRow], answering: &[(NodeId, Vec<Ipv4Addr>)]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let by: Vec<NodeId> = answering
            .iter()
            .filter(|(_, vips)| vips.contains(&r.vip))
            .map(|(n, _)| *n)
            .collect();
        match (r.owner, by.as_slice()) {
            (Some(o), [n]) if *n == o => {}
            (owner, by) => out.push(format!(
                "{} is owned by {} but answered for by {:?}",
                r.vip,
                owner.map_or("nobody".to_owned(), |o| format!("node {o}")),
                by
            )),
        }
    }
    for (n, vips) in answering {
        for v in vips {
            if !rows.iter().any(|r| r.vip == *v) {
                out.push(format!(
                    "node {n} answers for {v}, which is not in the pool"
                ));
            }
        }
    }
    out
}

/// How many times each VIP changed owner among the samples received in `[from, to)`: a change
/// from one node to another, as the samples show it (a stretch without an owner in between is
/// not a change by itself, and a VIP that goes A → none → A has not changed). The first sample
/// before `from` gives the owner the count starts from. Ownership must be stable as well as
/// safe: a VIP that moves away from a faulted owner and back once it heals changes twice.
pub fn owner_changes(samples: &[VipSample], from: Ms, to: Ms) -> BTreeMap<Ipv4Addr, u32> {
    let mut last: BTreeMap<Ipv4Addr, NodeId> = BTreeMap::new();
    if let Some(s) = samples.iter().rev().find(|s| s.received < from) {
        for r in &s.rows {
            if let Some(o) = r.owner {
                last.insert(r.vip, o);
            }
        }
    }
    let mut changes: BTreeMap<Ipv4Addr, u32> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.received >= from && s.received < to)
    {
        for r in &s.rows {
            let n = changes.entry(r.vip).or_default();
            let Some(o) = r.owner else { continue };
            if last.insert(r.vip, o).is_some_and(|prev| prev != o) {
                *n += 1;
            }
        }
    }
    changes
}

/// The first instant at or after `from` at which every VIP of `vips` is answered by exactly
/// the owner the VIP table gives it: the receipt of the first table sample (sent at or after
/// `from`) whose every owner was seen answering for its VIP within `slack` ms of the sample,
/// and no other node was. `None`: never, as far as was observed. After the last fault heals the
/// cluster must get there within seconds, whatever state the faults left it in.
pub fn converged_at(
    samples: &[VipSample],
    log: &AnsweringLog,
    vips: &[Ipv4Addr],
    from: Ms,
    slack: Ms,
) -> Option<Ms> {
    let intervals = log.intervals();
    let answering = |vip: Ipv4Addr, node: NodeId, s: &VipSample| {
        intervals.iter().any(|i| {
            i.vip == vip
                && i.node == node
                && i.since <= s.received + slack
                && i.until >= s.sent - slack
        })
    };
    let others_answering = |vip: Ipv4Addr, owner: NodeId, s: &VipSample| {
        // Another node seen answering while the sample was taken: a second owner.
        intervals
            .iter()
            .any(|i| i.vip == vip && i.node != owner && i.since <= s.received && i.until >= s.sent)
    };
    samples.iter().filter(|s| s.sent >= from).find_map(|s| {
        let ok = vips.iter().all(|v| match s.owner(*v) {
            Some(o) => answering(*v, o, s) && !others_answering(*v, o, s),
            None => false,
        });
        ok.then_some(s.received)
    })
}

/// The index of the phase containing `t`, where phase `k` covers `[starts[k], starts[k+1])` and
/// the last one runs on forever; times before the first start belong to phase 0.
pub fn phase_of(starts: &[Ms], t: Ms) -> usize {
    starts.iter().rposition(|s| *s <= t).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 255, n)
    }

    #[test]
    fn consecutive_observations_with_one_start_merge_into_one_interval() {
        let mut log = AnsweringLog::new();
        for now in [100, 350, 600] {
            log.observe(1, vip(1), 50, now);
        }
        // An older reply arriving late does not shorten it.
        log.observe(1, vip(1), 50, 200);
        assert_eq!(
            log.intervals(),
            vec![Interval {
                vip: vip(1),
                node: 1,
                since: 50,
                until: 600
            }]
        );
        assert_eq!(log.observations(), 4);
        assert!(log.overlaps().is_empty());
    }

    #[test]
    fn a_clean_failover_is_no_overlap_but_an_early_takeover_is() {
        let mut log = AnsweringLog::new();
        // Node 1 answers until it is last seen at 1000; node 2 takes over at 1200.
        log.observe(1, vip(1), 0, 1000);
        log.observe(2, vip(1), 1200, 1500);
        // Node 2 answering for another VIP meanwhile is irrelevant.
        log.observe(2, vip(2), 0, 1500);
        assert!(log.overlaps().is_empty());

        // Node 3 claims vip 1 from 1400: it overlaps node 2's interval over [1400, 1500].
        log.observe(3, vip(1), 1400, 1700);
        let o = log.overlaps();
        assert_eq!(o.len(), 1, "{o:?}");
        assert_eq!((o[0].vip, o[0].from, o[0].to), (vip(1), 1400, 1500));
        assert_eq!((o[0].first.node, o[0].second.node), (2, 3));
        assert!(o[0].to_string().contains("DOUBLE OWNER"));
    }

    #[test]
    fn touching_intervals_overlap_and_one_node_never_overlaps_itself() {
        let mut log = AnsweringLog::new();
        log.observe(1, vip(1), 0, 1000);
        log.observe(2, vip(1), 1000, 2000);
        assert_eq!(log.overlaps().len(), 1);

        let mut log = AnsweringLog::new();
        // Node 1 answered, was fenced, answered again: two intervals of its own.
        log.observe(1, vip(1), 0, 1000);
        log.observe(1, vip(1), 500, 1500);
        assert_eq!(log.intervals().len(), 2);
        assert!(log.overlaps().is_empty());
    }

    #[test]
    fn an_interval_nested_in_a_long_one_is_found_past_shorter_ones() {
        let mut log = AnsweringLog::new();
        log.observe(1, vip(1), 0, 10_000);
        log.observe(1, vip(1), 100, 200);
        log.observe(2, vip(1), 5_000, 5_100);
        let o = log.overlaps();
        assert_eq!(o.len(), 1, "{o:?}");
        assert_eq!((o[0].from, o[0].to), (5_000, 5_100));
    }

    fn sample(sent: Ms, owners: &[(u8, Option<NodeId>)]) -> VipSample {
        VipSample {
            sent,
            received: sent + 10,
            rows: owners
                .iter()
                .map(|&(n, owner)| VipRow {
                    vip: vip(n),
                    owner,
                    handoff_to: None,
                })
                .collect(),
        }
    }

    /// Samples every 250 ms from `from` to `to` with the given owners.
    fn samples(from: Ms, to: Ms, owners: &[(u8, Option<NodeId>)]) -> Vec<VipSample> {
        (from..to).step_by(250).map(|t| sample(t, owners)).collect()
    }

    const NODES: &[NodeId] = &[1, 2, 3];

    #[test]
    fn a_down_owner_must_lose_its_vips_within_the_budget() {
        let down = Outage {
            node: 1,
            from: 1_000,
            to: 10_000,
        };
        // Moved after 1.5 s: fine.
        let mut s = samples(0, 2_500, &[(1, Some(1)), (2, Some(2))]);
        s.extend(samples(2_500, 12_000, &[(1, Some(3)), (2, Some(2))]));
        assert!(check_ownership(&s, &[down], NODES, 3_000).is_empty());
        assert_eq!(reassignment(&s, &down), Reassignment::After(1_510));
        assert_eq!(owned_before(&s, 1, 1_000), vec![vip(1)]);

        // Still on node 1 five seconds in: one violation, at the first sample past the budget.
        let mut s = samples(0, 6_000, &[(1, Some(1)), (2, Some(2))]);
        s.extend(samples(6_000, 12_000, &[(1, Some(3)), (2, Some(2))]));
        let v = check_ownership(&s, &[down], NODES, 3_000);
        assert_eq!(
            v,
            vec![OwnershipViolation::StaleOwner {
                vip: vip(1),
                owner: 1,
                down_from: 1_000,
                seen_at: 4_250
            }]
        );
        assert!(v[0].to_string().contains("node 1"));
    }

    #[test]
    fn a_short_outage_need_not_move_anything() {
        // Node 1 is down for 2 s, under the budget, and keeps its VIP: no violation; nor when it
        // is seen owning it after it came back.
        let down = Outage {
            node: 1,
            from: 1_000,
            to: 3_000,
        };
        let s = samples(0, 8_000, &[(1, Some(1))]);
        assert!(check_ownership(&s, &[down], NODES, 3_000).is_empty());
        assert_eq!(reassignment(&s, &down), Reassignment::NotSeen);
        // A node that owned nothing has nothing to move.
        let none = Outage {
            node: 2,
            from: 1_000,
            to: 3_000,
        };
        assert_eq!(reassignment(&s, &none), Reassignment::NothingOwned);
    }

    #[test]
    fn an_ownerless_vip_is_a_violation_only_past_the_budget() {
        // 1 s without an owner: fine.
        let mut s = samples(0, 1_000, &[(1, Some(1))]);
        s.extend(samples(1_000, 2_000, &[(1, None)]));
        s.extend(samples(2_000, 4_000, &[(1, Some(2))]));
        assert!(check_ownership(&s, &[], NODES, 3_000).is_empty());

        // 5 s without one: a violation measured conservatively between the samples.
        let mut s = samples(0, 1_000, &[(1, Some(1))]);
        s.extend(samples(1_000, 6_000, &[(1, None)]));
        s.extend(samples(6_000, 7_000, &[(1, Some(2))]));
        let v = check_ownership(&s, &[], NODES, 3_000);
        assert_eq!(
            v,
            vec![OwnershipViolation::Unowned {
                vip: vip(1),
                from: 1_010,
                to: 5_750
            }]
        );

        // Still ownerless when the run ends: reported too.
        let mut s = samples(0, 1_000, &[(1, Some(1))]);
        s.extend(samples(1_000, 6_000, &[(1, None)]));
        assert_eq!(check_ownership(&s, &[], NODES, 3_000).len(), 1);

        // A VIP not yet in the pool is not ownerless.
        let mut s = samples(0, 5_000, &[(2, Some(1))]);
        s.extend(samples(5_000, 6_000, &[(1, Some(1)), (2, Some(1))]));
        assert!(check_ownership(&s, &[], NODES, 3_000).is_empty());
    }

    #[test]
    fn no_owner_is_due_while_every_node_is_down() {
        let s = samples(0, 6_000, &[(1, None)]);
        let all: Vec<Outage> = NODES
            .iter()
            .map(|&node| Outage {
                node,
                from: 0,
                to: 7_000,
            })
            .collect();
        assert!(check_ownership(&s, &all, NODES, 3_000).is_empty());
        assert_eq!(check_ownership(&s, &all[..2], NODES, 3_000).len(), 1);
    }

    #[test]
    fn owner_history_over_a_window() {
        let mut s = samples(0, 1_000, &[(1, Some(1))]);
        s.extend(samples(1_000, 2_000, &[(1, Some(2))]));
        assert!(owned_by_any(&s, vip(1), &[1], 900, 1_500));
        assert!(owned_by_any(&s, vip(1), &[2], 1_100, 1_500));
        assert!(!owned_by_any(&s, vip(1), &[1], 1_300, 1_800));
        assert!(!owned_by_any(&s, vip(1), &[3], 0, 2_000));
    }

    #[test]
    fn gaps_are_attributed_by_their_start_and_counted_by_due_time() {
        let gaps = [
            LossGap {
                start: 100,
                lost_until: 110,
                len: 12,
                lost: 5,
                resumed: true,
            },
            LossGap {
                start: 5_000,
                lost_until: 5_400,
                len: 402,
                lost: 200,
                resumed: true,
            },
        ];
        assert_eq!(largest_gap(&gaps, 0, 1_000), 12);
        assert_eq!(largest_gap(&gaps, 0, 10_000), 402);
        assert_eq!(largest_gap(&gaps, 6_000, 10_000), 0);
        assert_eq!(gaps_in(&gaps, 4_000, 6_000).count(), 1);
        // The second gap's datagrams are due every 2 ms from 5000: 50 of them before 5100.
        assert_eq!(lost_within(&gaps, 5_000, 5_100, 2.0), 50);
        assert_eq!(lost_within(&gaps, 6_000, 7_000, 2.0), 0);
        assert_eq!(lost_within(&gaps, 0, 10_000, 2.0), 205);
    }

    #[test]
    fn owner_changes_count_moves_between_nodes_only() {
        // vip 1: 1 → 2 (fault) → none → 1 (back): two changes; vip 2 stays on 3.
        let mut s = samples(0, 1_000, &[(1, Some(1)), (2, Some(3))]);
        s.extend(samples(1_000, 2_000, &[(1, Some(2)), (2, Some(3))]));
        s.extend(samples(2_000, 2_500, &[(1, None), (2, Some(3))]));
        s.extend(samples(2_500, 4_000, &[(1, Some(1)), (2, Some(3))]));
        let c = owner_changes(&s, 500, 4_000);
        assert_eq!(c[&vip(1)], 2);
        assert_eq!(c[&vip(2)], 0);
        // Counted from the owner before the window: the move at 1000 is in [900, 1500).
        assert_eq!(owner_changes(&s, 900, 1_500)[&vip(1)], 1);
        assert_eq!(owner_changes(&s, 1_500, 2_400)[&vip(1)], 0);
        // A flapping vip: one change per sample that differs.
        let mut f = Vec::new();
        for k in 0..10 {
            f.extend(samples(
                k * 500,
                k * 500 + 500,
                &[(1, Some(1 + (k as u64 % 2)))],
            ));
        }
        assert_eq!(owner_changes(&f, 0, 5_000)[&vip(1)], 9);
    }

    #[test]
    fn convergence_is_the_first_sample_answered_by_exactly_its_owners() {
        let mut log = AnsweringLog::new();
        // Nobody answers vip 1 until node 2 does from 3000; vip 2 answered by 1 throughout.
        log.observe(2, vip(1), 3_000, 9_000);
        log.observe(1, vip(2), 0, 9_000);
        let s = samples(0, 9_000, &[(1, Some(2)), (2, Some(1))]);
        let vips = [vip(1), vip(2)];
        assert_eq!(converged_at(&s, &log, &vips, 1_000, 250), Some(2_760));
        // A VIP without an owner, or answered by a second node too, has not converged.
        let s2 = samples(0, 9_000, &[(1, None), (2, Some(1))]);
        assert_eq!(converged_at(&s2, &log, &vips, 0, 250), None);
        log.observe(3, vip(2), 0, 9_000);
        assert_eq!(converged_at(&s, &log, &vips, 1_000, 250), None);
    }

    #[test]
    fn phases_cover_the_run() {
        let starts = [-1_000, 5_000, 20_000];
        assert_eq!(phase_of(&starts, -5_000), 0);
        assert_eq!(phase_of(&starts, 0), 0);
        assert_eq!(phase_of(&starts, 5_000), 1);
        assert_eq!(phase_of(&starts, 19_999), 1);
        assert_eq!(phase_of(&starts, 1_000_000), 2);
    }

    #[test]
    fn balance_and_data_plane_agreement() {
        let rows = |owners: &[Option<NodeId>]| -> Vec<VipRow> {
            owners
                .iter()
                .enumerate()
                .map(|(k, &owner)| VipRow {
                    vip: vip(k as u8 + 1),
                    owner,
                    handoff_to: None,
                })
                .collect()
        };
        let even = rows(&[Some(1), Some(2), Some(3), Some(1), Some(2), Some(3)]);
        assert!(balanced(&even, NODES));
        let skewed = rows(&[Some(1), Some(1), Some(1), Some(1), Some(2), Some(3)]);
        assert!(!balanced(&skewed, NODES));
        assert!(!balanced(&rows(&[Some(1), None, Some(2), Some(3)]), NODES));
        let mut handing = even.clone();
        handing[0].handoff_to = Some(2);
        assert!(!balanced(&handing, NODES));
        assert!(balanced(
            &rows(&[Some(1), Some(2), Some(3), Some(1)]),
            NODES
        ));

        let two = rows(&[Some(1), Some(2)]);
        assert!(
            answering_mismatches(&two, &[(1, vec![vip(1)]), (2, vec![vip(2)]), (3, vec![])])
                .is_empty()
        );
        // Nobody answering, two answering, a stranger answering.
        assert_eq!(answering_mismatches(&two, &[(1, vec![vip(1)])]).len(), 1);
        assert_eq!(
            answering_mismatches(&two, &[(1, vec![vip(1), vip(2)]), (2, vec![vip(2)])]).len(),
            1
        );
        assert_eq!(
            answering_mismatches(&two, &[(1, vec![vip(1), vip(9)]), (2, vec![vip(2)])]).len(),
            1
        );
    }

    #[test]
    fn a_vip_nobody_answers_for_past_the_budget_is_found() {
        let mut log = AnsweringLog::new();
        // vip 1: node 1 until 1000, node 2 from 1500 to the end: a 500 ms hole, fine.
        log.observe(1, vip(1), 0, 1_000);
        log.observe(2, vip(1), 1_500, 20_000);
        // vip 2: node 3 until 5000, then nobody until node 1 at 12000, then nobody from 15000.
        log.observe(3, vip(2), 0, 5_000);
        log.observe(1, vip(2), 12_000, 15_000);
        // vip 3: never answered.
        let u = unanswered(&log, &[vip(1), vip(2), vip(3)], 0, 20_000, 3_000);
        assert_eq!(
            u,
            vec![
                (vip(3), 0, 20_000),
                (vip(2), 5_000, 12_000),
                (vip(2), 15_000, 20_000)
            ]
        );
        assert!(unanswered(&log, &[vip(1)], 0, 20_000, 3_000).is_empty());
    }
}
