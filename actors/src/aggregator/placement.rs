//! The leader's aggregation decisions, pure: from the replicated tables and the leader's
//! reachability view (the cluster's one failure detector) to the commands to propose.
//!
//! - A complete job with no placement, or whose host is unreachable or no longer aggregates,
//!   is placed on a reachable host that can hold its whole gradient in one contiguous range
//!   (first fit within the host; memory is the hard budget), never a worker's own host unless
//!   the job allows it: summing where a worker runs would put the job's whole traffic on that
//!   worker's link. Among those, the host whose CPU budget the job loads least: a job's load is
//!   the frames it makes a round (workers × chunks in, as many results out), and a host's is
//!   the sum of its jobs' over its `cpu_millis`. Ties go to the most free slots, then the
//!   lowest node id, so every leader decides the same.
//! - A member whose address is a node that the leader has found unreachable for a sustained
//!   time ([`Sustained`], `aggregator.worker_gone_ms`) is reported gone, once; the tables then
//!   fail the job naming the worker, or, for an elastic job, go on without it. A job's failure
//!   is final, so it waits out the probe flaps of a loaded machine (seen in the real-torch
//!   namespace test: 7 debug nodes on 2 cores flapped every few hundred ms and failed a healthy
//!   job); a move is safe and reversible, so an unreachable aggregator is left at once.
//!
//! Each decision is one command guarded by the job's epoch, so a decision made on tables that
//! have moved on is skipped when applied, never applied over a newer one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use yard_raft_store::aggregation::{
    AggCommand, AggJob, AggTables, Grouping, Placement, Seat, MAX_WORKERS,
};

use super::eligible;
use super::tree::{decide_tree, TreeDecision};
use yard_raft_store::NodeId;

/// What the leader sees of the cluster, besides the tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Members the leader's liveness probes find unreachable.
    pub unreachable: BTreeSet<NodeId>,
    /// Members unreachable for the whole of `aggregator.worker_gone_ms` (a subset of
    /// `unreachable`): their workers are gone.
    pub gone: BTreeSet<NodeId>,
    /// Each member's host address (from its advertised address).
    pub node_ips: BTreeMap<NodeId, Ipv4Addr>,
    /// Members reachable again, but unreachable within the last [`RETURN_SETTLE_MS`]: a tree
    /// keeps the seats it has on them but is not regrouped onto them yet ([`Sustained`]).
    pub settling: BTreeSet<NodeId>,
    /// Hosts drained for maintenance (the tables' `drained`): no job keeps or gets a seat on
    /// them, as on an unreachable host, but their workers are not gone (a drain moves the
    /// aggregation off a host, it does not end the job's ranks there).
    pub drained: BTreeSet<NodeId>,
}

/// How long a member that was unreachable must stay reachable before a tree is regrouped onto
/// it. Losing a host regroups at once; without this wait its return did too, so a host whose
/// control traffic was lossy (reachability flapping) regrouped the job back and forth: measured
/// in a chaos run, five regroupings in two seconds under 40% control loss.
pub const RETURN_SETTLE_MS: u64 = 5_000;

/// The commands to propose, and why each job that cannot be placed waits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub commands: Vec<AggCommand>,
    /// (job, why it has no aggregator)
    pub waiting: Vec<(String, String)>,
}

/// Decides on every job of `tables`.
pub fn decide(tables: &AggTables, view: &ClusterView) -> Decision {
    let mut out = Decision::default();
    // Slot ranges in use per host, by jobs that keep their placement.
    let mut used: BTreeMap<NodeId, Vec<(u32, u32)>> = BTreeMap::new();
    // Frames a round per host, by the same jobs.
    let mut load: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut to_place = Vec::new();
    let mut grouped = Vec::new();
    for job in tables.jobs.values() {
        if job.failed.is_some() {
            continue;
        }
        if let Some(gone) = lost_worker(job, view) {
            out.commands.push(gone);
            continue;
        }
        if !job.complete() || job.grouping == Grouping::Ring {
            // A ring job's workers all-reduce among themselves: nothing to place.
            continue;
        }
        // Every aggregator of the job (one, or a tree's) keeps its range while all are usable;
        // one lost takes the job back to one aggregator, in one command.
        let seats = job.seats();
        if !seats.is_empty()
            && seats.iter().all(|s| {
                host_usable(tables, view, job, s.placement.node)
                    && seat_fits(tables, &used, job, s.placement)
            })
        {
            for seat in &seats {
                let p = seat.placement;
                used.entry(p.node)
                    .or_default()
                    .push((p.base, p.base + job.slots()));
                *load.entry(p.node).or_default() += seat_load(job, seat);
            }
        } else if !matches!(job.grouping, Grouping::Auto | Grouping::Ps) {
            to_place.push(job);
        }
        if matches!(job.grouping, Grouping::Auto | Grouping::Ps) {
            grouped.push(job);
        }
    }
    // Grouped jobs: the planner's tree once their bandwidths are measured (flat until then).
    for job in grouped {
        let own: Vec<(NodeId, (u32, u32))> = job
            .seats()
            .iter()
            .map(|s| {
                (
                    s.placement.node,
                    (s.placement.base, s.placement.base + job.slots()),
                )
            })
            .collect();
        let mut others = used.clone();
        for (node, range) in &own {
            if let Some(r) = others.get_mut(node) {
                if let Some(i) = r.iter().position(|x| x == range) {
                    r.remove(i);
                }
            }
        }
        match decide_tree(tables, view, job, &others) {
            TreeDecision::Keep => {}
            TreeDecision::Place { root, clusters, .. } => {
                used = others;
                for p in std::iter::once(root).chain(clusters.iter().map(|c| c.placement)) {
                    used.entry(p.node)
                        .or_default()
                        .push((p.base, p.base + job.slots()));
                }
                out.commands.push(AggCommand::PlaceTree {
                    name: job.name.clone(),
                    expect_epoch: job.epoch,
                    root,
                    clusters,
                });
            }
            TreeDecision::Unmeasured(why) | TreeDecision::Cannot(why) => {
                // As a flat job: kept where it is while that is usable, else placed by CPU. A
                // job larger than one aggregator sums has no flat arrangement: it waits for its
                // tree (its figures, or hosts enough to hold it).
                let usable = !own.is_empty()
                    && job.seats().iter().all(|s| {
                        host_usable(tables, view, job, s.placement.node)
                            && seat_fits(tables, &others, job, s.placement)
                    });
                if job.members.len() > usize::from(MAX_WORKERS) {
                    out.waiting.push((
                        job.name.clone(),
                        format!(
                            "its {} workers need a tree of aggregators ({MAX_WORKERS} at most on one), and {why}",
                            job.members.len()
                        ),
                    ));
                } else if !usable {
                    to_place.push(job);
                }
            }
        }
    }
    for job in to_place {
        match choose(tables, view, &used, &load, job) {
            Ok(placement) => {
                used.entry(placement.node)
                    .or_default()
                    .push((placement.base, placement.base + job.slots()));
                *load.entry(placement.node).or_default() += cpu_load(job);
                out.commands.push(AggCommand::Place {
                    name: job.name.clone(),
                    expect_epoch: job.epoch,
                    placement,
                });
            }
            Err(why) => out.waiting.push((job.name.clone(), why)),
        }
    }
    out
}

/// Frames a round of `job` makes its aggregator handle: every worker's chunks in, and a result
/// per chunk to every worker.
fn cpu_load(job: &AggJob) -> u64 {
    2 * u64::from(job.workers) * u64::from(job.chunks())
}

/// Frames a round of `job` makes the aggregator of `seat` handle: its members' chunks in
/// (its ranks and, at a tree's root, its clusters' partial sums) and as many results out.
fn seat_load(job: &AggJob, seat: &Seat) -> u64 {
    let members = (seat.ranks.len() + seat.children.len()) as u64;
    2 * members * u64::from(job.chunks())
}

/// Whether `job` may keep its seat on `node`: the host may still aggregate it
/// ([`eligible::may_aggregate`]: a removed or disabled host no longer does) and the leader
/// reaches it.
fn host_usable(tables: &AggTables, view: &ClusterView, job: &AggJob, node: NodeId) -> bool {
    eligible::may_aggregate(tables, job, node)
        && !view.unreachable.contains(&node)
        && !view.drained.contains(&node)
}

/// Whether `job`'s range at `p` still fits its host: within the host's slots as registered
/// now (a host that came back with a smaller slot map no longer holds a range it was given)
/// and clear of the ranges `used` already keeps there. A kept range that does not fit would
/// make the host's table write fail, or two jobs sum into the same slots.
pub(super) fn seat_fits(
    tables: &AggTables,
    used: &BTreeMap<NodeId, Vec<(u32, u32)>>,
    job: &AggJob,
    p: Placement,
) -> bool {
    let Some(host) = tables.hosts.get(&p.node) else {
        return false;
    };
    let Some(end) = p.base.checked_add(job.slots()) else {
        return false;
    };
    end <= host.slots
        && used
            .get(&p.node)
            .is_none_or(|taken| taken.iter().all(|(s, e)| end <= *s || *e <= p.base))
}

/// The first member that lives on an unreachable node, as a command.
fn lost_worker(job: &AggJob, view: &ClusterView) -> Option<AggCommand> {
    job.members.iter().find_map(|(rank, addr)| {
        let node = view
            .node_ips
            .iter()
            .find(|(id, ip)| **ip == *addr.ip() && view.gone.contains(id))?
            .0;
        Some(AggCommand::WorkerGone {
            name: job.name.clone(),
            rank: *rank,
            reason: format!(
                "its host, node {node} at {}, has been unreachable too long",
                addr.ip()
            ),
        })
    })
}

/// Which nodes have been unreachable for at least `after_ms` without a break: fed the leader's
/// reachability on every tick, it answers [`ClusterView::gone`].
#[derive(Debug, Clone, Default)]
pub struct Sustained {
    after_ms: u64,
    /// Node → when it was first seen unreachable in its current stretch.
    since: BTreeMap<NodeId, u64>,
    /// Node → when it was last seen unreachable (for [`Sustained::settling`]).
    last_seen: BTreeMap<NodeId, u64>,
}

impl Sustained {
    pub fn new(after_ms: u64) -> Self {
        Self {
            after_ms,
            since: BTreeMap::new(),
            last_seen: BTreeMap::new(),
        }
    }

    /// The nodes reachable at the latest [`Sustained::update`] (at `now_ms`) that were seen
    /// unreachable less than [`RETURN_SETTLE_MS`] before it: [`ClusterView::settling`].
    pub fn settling(&mut self, now_ms: u64) -> BTreeSet<NodeId> {
        self.last_seen
            .retain(|_, t| now_ms.saturating_sub(*t) < RETURN_SETTLE_MS);
        self.last_seen
            .keys()
            .filter(|n| !self.since.contains_key(n))
            .copied()
            .collect()
    }

    /// The view the placement decides on at `now_ms`, from the leader's probes
    /// (`unreachable`: the Raft members they find unreachable) and `down`, the hosts the
    /// leader committed dead (`Command::HostLiveness`, the tables' `hosts_down`). That commit
    /// is the one decision on a host that holds no vote, which the probes do not watch:
    /// without it a job stayed on a dead agent host for ever, and a worker there was never
    /// gone. A committed death counts as unreachability: a job leaves the host at once, and a
    /// worker there is gone once its node has stayed dead for `after_ms`, as a member's is (a
    /// job's failure is final); a host back from it is settling.
    pub fn view(
        &mut self,
        now_ms: u64,
        unreachable: &BTreeSet<NodeId>,
        down: &BTreeSet<NodeId>,
        node_ips: BTreeMap<NodeId, Ipv4Addr>,
    ) -> ClusterView {
        let unreachable: BTreeSet<NodeId> = unreachable.union(down).copied().collect();
        let gone = self.update(now_ms, &unreachable);
        ClusterView {
            unreachable,
            gone,
            node_ips,
            settling: self.settling(now_ms),
            drained: BTreeSet::new(),
        }
    }

    /// Takes the nodes unreachable at `now_ms` and returns those unreachable since at least
    /// `after_ms` ago; a node seen reachable starts over.
    pub fn update(&mut self, now_ms: u64, unreachable: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
        self.since.retain(|n, _| unreachable.contains(n));
        for n in unreachable {
            self.since.entry(*n).or_insert(now_ms);
            self.last_seen.insert(*n, now_ms);
        }
        self.since
            .iter()
            .filter(|(_, t)| now_ms.saturating_sub(**t) >= self.after_ms)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// The lowest base at which `need` slots fit in `slots` around the `taken` ranges.
pub(super) fn first_fit(slots: u32, taken: &[(u32, u32)], need: u32) -> Option<u32> {
    let mut ranges = taken.to_vec();
    ranges.sort_unstable();
    let mut at = 0u32;
    for (start, end) in ranges {
        if start >= at && start - at >= need {
            return Some(at);
        }
        at = at.max(end);
    }
    (slots.checked_sub(at)? >= need).then_some(at)
}

fn choose(
    tables: &AggTables,
    view: &ClusterView,
    used: &BTreeMap<NodeId, Vec<(u32, u32)>>,
    load: &BTreeMap<NodeId, u64>,
    job: &AggJob,
) -> Result<Placement, String> {
    let need = job.slots();
    let cost = cpu_load(job);
    // (load after placing, its host's cpu, free slots, node, base)
    let mut best: Option<(u64, u32, u32, NodeId, u32)> = None;
    let mut reasons = Vec::new();
    for node in tables.hosts.keys() {
        if view.unreachable.contains(node) {
            reasons.push(format!("node {node} is unreachable"));
            continue;
        }
        if view.drained.contains(node) {
            reasons.push(format!("node {node} is drained"));
            continue;
        }
        let host = match eligible::host_for(tables, job, *node) {
            Ok(h) => h,
            Err(why) => {
                reasons.push(why);
                continue;
            }
        };
        let taken = used.get(node).map(Vec::as_slice).unwrap_or(&[]);
        let free = host.slots
            - taken
                .iter()
                .map(|(s, e)| e - s)
                .sum::<u32>()
                .min(host.slots);
        let Some(base) = first_fit(host.slots, taken, need) else {
            reasons.push(format!("node {node} has {free} of the {need} slots free"));
            continue;
        };
        let after = load.get(node).copied().unwrap_or(0) + cost;
        let cpu = host.cpu_millis.max(1);
        // after / cpu below the best's, compared exactly by cross-multiplying.
        let better = best.is_none_or(|(b_after, b_cpu, b_free, _, _)| {
            let (mine, theirs) = (
                u128::from(after) * u128::from(b_cpu),
                u128::from(b_after) * u128::from(cpu),
            );
            mine < theirs || (mine == theirs && free > b_free)
        });
        if better {
            best = Some((after, cpu, free, *node, base));
        }
    }
    match best {
        Some((_, _, _, node, base)) => Ok(Placement { node, base }),
        None if tables.hosts.is_empty() => {
            Err("no node aggregates (none has aggregator.enabled)".into())
        }
        None => Err(format!("no aggregator can take it: {}", reasons.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddrV4;
    use yard_raft_store::aggregation::Quota;

    const QUOTA: Quota = Quota {
        job_bytes: 1 << 40,
        cluster_bytes: 1 << 40,
    };

    fn ip(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, i)
    }

    /// Hosts 1..=3 aggregate with `slots` each; job `name` has workers on hosts 4 and 5.
    fn world(slots: u32, jobs: &[(&str, u32, bool)]) -> AggTables {
        let mut t = AggTables::default();
        for node in 1..=3u8 {
            t.apply(
                &AggCommand::Host {
                    node: u64::from(node),
                    ip: ip(node),
                    slots,
                    cpu_millis: 1000,
                },
                1,
            )
            .unwrap();
        }
        for (name, values, colocate) in jobs {
            t.apply(
                &AggCommand::Create {
                    name: (*name).into(),
                    workers: 2,
                    values: *values,
                    dtype: 0,
                    elastic: false,
                    chunk_values: 100,
                    colocate: *colocate,
                    quota: QUOTA,
                    grouping: yard_raft_store::aggregation::Grouping::Flat,
                    secret: [7; 16],
                },
                1,
            )
            .unwrap();
            for rank in 0..2u16 {
                let addr = SocketAddrV4::new(ip(4 + u8::try_from(rank).unwrap()), 40000);
                t.apply(
                    &AggCommand::Join {
                        name: (*name).into(),
                        rank,
                        addr,
                    },
                    1,
                )
                .unwrap();
            }
        }
        t
    }

    fn view() -> ClusterView {
        ClusterView {
            node_ips: (1..=5u8).map(|i| (u64::from(i), ip(i))).collect(),
            ..ClusterView::default()
        }
    }

    fn apply_all(t: &mut AggTables, d: &Decision) {
        for c in &d.commands {
            t.apply(c, 9).unwrap();
        }
    }

    #[test]
    fn a_job_goes_where_it_loads_the_cpu_budget_least_not_where_memory_is_freest() {
        // Host 1: much memory, a quarter core; host 2: little memory, two cores; host 3 gone.
        let mut t = world(1000, &[("a", 1000, false)]);
        t.hosts.remove(&3);
        t.hosts.get_mut(&1).unwrap().cpu_millis = 250;
        let h2 = t.hosts.get_mut(&2).unwrap();
        h2.slots = 30;
        h2.cpu_millis = 2000;
        let d = decide(&t, &view());
        apply_all(&mut t, &d);
        assert_eq!(t.jobs["a"].placement.unwrap().node, 2);
        // With host 2's memory taken, the next job still fits only on host 1.
        let mut t2 = t.clone();
        t2.apply(
            &AggCommand::Create {
                name: "b".into(),
                workers: 2,
                values: 1000,
                dtype: 0,
                elastic: false,
                chunk_values: 100,
                colocate: false,
                quota: QUOTA,
                grouping: yard_raft_store::aggregation::Grouping::Flat,
                secret: [7; 16],
            },
            1,
        )
        .unwrap();
        for rank in 0..2u16 {
            let addr = SocketAddrV4::new(ip(4 + u8::try_from(rank).unwrap()), 40001);
            t2.apply(
                &AggCommand::Join {
                    name: "b".into(),
                    rank,
                    addr,
                },
                1,
            )
            .unwrap();
        }
        let d = decide(&t2, &view());
        apply_all(&mut t2, &d);
        assert_eq!(t2.jobs["b"].placement.unwrap().node, 1);
    }

    #[test]
    fn jobs_spread_to_the_freest_host_and_never_share_slots() {
        // each job: 10 chunks, 20 slots
        let mut t = world(
            50,
            &[
                ("a", 1000, false),
                ("b", 1000, false),
                ("c", 1000, false),
                ("d", 1000, false),
            ],
        );
        let d = decide(&t, &view());
        assert_eq!(d.commands.len(), 4);
        apply_all(&mut t, &d);
        let mut ranges: BTreeMap<NodeId, Vec<(u32, u32)>> = BTreeMap::new();
        for j in t.jobs.values() {
            let p = j.placement.unwrap();
            ranges
                .entry(p.node)
                .or_default()
                .push((p.base, p.base + j.slots()));
        }
        for (node, mut r) in ranges {
            r.sort_unstable();
            assert!(
                r.windows(2).all(|w| w[0].1 <= w[1].0),
                "overlap on {node}: {r:?}"
            );
            assert!(r.last().unwrap().1 <= 50);
        }
        assert!(
            decide(&t, &view()).commands.is_empty(),
            "a settled world needs nothing"
        );
    }

    /// Through the state machine, as the cluster applies it: removing the node that sums a
    /// job moves the job off it in one command, and nothing is placed there again, although
    /// the leader, which no longer probes a removed node, never finds it unreachable.
    #[test]
    fn a_removed_host_loses_its_job_and_takes_no_new_one() {
        use yard_raft_store::command::NodeMeta;
        use yard_raft_store::{Command, StateMachineData};
        let mut sm = StateMachineData::default();
        let tables = world(50, &[("a", 1000, false)]);
        for (node, host) in &tables.hosts {
            sm.apply_command(&Command::SetNode(NodeMeta {
                id: *node,
                name: format!("n{node}"),
                addr: format!("{}:7480", host.ip),
                ..NodeMeta::default()
            }));
            sm.apply_command(&Command::Aggregation(AggCommand::Host {
                node: *node,
                ip: host.ip,
                slots: host.slots,
                cpu_millis: host.cpu_millis,
            }));
        }
        sm.aggregation.jobs = tables.jobs.clone();
        let settle = |sm: &mut StateMachineData| {
            let d = decide(&sm.aggregation, &view());
            for c in &d.commands {
                sm.apply_command(&Command::Aggregation(c.clone()));
            }
            d
        };
        settle(&mut sm);
        let first = sm.aggregation.jobs["a"].placement.unwrap().node;
        sm.apply_command(&Command::RemoveNode { id: first });
        let d = settle(&mut sm);
        assert_eq!(d.commands.len(), 1, "one move: {d:?}");
        let second = sm.aggregation.jobs["a"].placement.unwrap().node;
        assert_ne!(second, first, "the job left the removed host");
        // With every other host removed too, the job waits: the removed hosts are not offered.
        for node in [1, 2, 3].into_iter().filter(|n| *n != first) {
            sm.apply_command(&Command::RemoveNode { id: node });
        }
        let d = settle(&mut sm);
        assert!(d.commands.is_empty(), "{d:?}");
        assert_eq!(
            d.waiting,
            [(
                "a".to_string(),
                "no node aggregates (none has aggregator.enabled)".to_string()
            )]
        );
    }

    /// A host that registers again with a smaller slot map (a restart with a smaller
    /// `aggregator.slots`) no longer holds the range it gave a job: the job moves, in one
    /// command, to where it fits, instead of being kept on a range the host's table write
    /// would refuse.
    #[test]
    fn a_placement_that_no_longer_fits_its_host_s_slots_is_moved() {
        let mut t = world(50, &[("a", 1000, false)]);
        let d = decide(&t, &view());
        apply_all(&mut t, &d);
        let p = t.jobs["a"].placement.unwrap();
        assert!(decide(&t, &view()).commands.is_empty(), "it fits: kept");
        let host = t.hosts[&p.node];
        let shrink = AggCommand::Host {
            node: p.node,
            ip: host.ip,
            slots: p.base + t.jobs["a"].slots() - 1,
            cpu_millis: host.cpu_millis,
        };
        t.apply(&shrink, 3).unwrap();
        let d = decide(&t, &view());
        let [AggCommand::Place { placement, .. }] = &d.commands[..] else {
            panic!("not moved: {d:?}");
        };
        assert_ne!(placement.node, p.node, "{d:?}");
        apply_all(&mut t, &d);
        assert!(decide(&t, &view()).commands.is_empty(), "and it stays");
    }

    /// The same for a tree: a cluster's range that runs past its host's slot map (a host
    /// that came back smaller, though still able to hold the job at another base) makes the
    /// leader place the tree again, though its grouping is still the best.
    #[test]
    fn a_tree_whose_seat_no_longer_fits_is_placed_again() {
        let (mut t, view) = grouped_tree();
        assert!(decide(&t, &view).commands.is_empty(), "the tree stays");
        let job = t.jobs.get_mut("t").unwrap();
        let slots = job.slots();
        let cluster = &mut job.clusters[0].placement;
        let host = t.hosts.get_mut(&cluster.node).unwrap();
        // The range [base, base + slots) now ends past the host's slots; [0, slots) is free.
        cluster.base = slots;
        host.slots = 2 * slots - 1;
        let d = decide(&t, &view);
        assert!(
            matches!(d.commands[..], [AggCommand::PlaceTree { .. }]),
            "{d:?}"
        );
        apply_all(&mut t, &d);
        let job = &t.jobs["t"];
        for s in job.seats() {
            assert!(
                s.placement.base + job.slots() <= t.hosts[&s.placement.node].slots,
                "{s:?} fits"
            );
        }
    }

    #[test]
    fn a_dead_host_moves_its_job_in_one_command_to_a_survivor() {
        let mut t = world(50, &[("a", 1000, false)]);
        let d = decide(&t, &view());
        apply_all(&mut t, &d);
        let old = t.jobs["a"].placement.unwrap().node;
        let epoch = t.jobs["a"].epoch;
        let mut v = view();
        v.unreachable.insert(old);
        let d = decide(&t, &v);
        assert_eq!(d.commands.len(), 1);
        apply_all(&mut t, &d);
        let new = t.jobs["a"].placement.unwrap().node;
        assert_ne!(new, old);
        assert_eq!(t.jobs["a"].epoch, epoch + 1);
    }

    /// `yard node drain`: the job leaves a drained host as it leaves a dead one, but the
    /// drained host's workers are not gone, and while every host is drained the job waits
    /// saying so.
    #[test]
    fn a_drained_host_moves_its_job_and_gets_no_seat() {
        let mut t = world(50, &[("a", 1000, false)]);
        let d = decide(&t, &view());
        apply_all(&mut t, &d);
        let old = t.jobs["a"].placement.unwrap().node;
        let mut v = view();
        v.drained.insert(old);
        let d = decide(&t, &v);
        // One command, the move: no worker of the drained host is reported gone.
        assert_eq!(d.commands.len(), 1, "{d:?}");
        assert!(matches!(d.commands[0], AggCommand::Place { .. }), "{d:?}");
        apply_all(&mut t, &d);
        let new = t.jobs["a"].placement.unwrap().node;
        assert_ne!(new, old);
        v.drained.extend(t.hosts.keys().copied());
        let d = decide(&t, &v);
        let (_, why) = d.waiting.iter().find(|(j, _)| j == "a").expect("a waits");
        assert!(why.contains(&format!("node {old} is drained")), "{why}");
    }

    #[test]
    fn a_worker_host_is_not_used_unless_allowed_and_full_hosts_say_why() {
        let mut t = world(50, &[("a", 1000, false)]);
        // only host 4 (a worker's) aggregates
        t.hosts.clear();
        t.apply(
            &AggCommand::Host {
                node: 4,
                ip: ip(4),
                slots: 50,
                cpu_millis: 1000,
            },
            1,
        )
        .unwrap();
        let d = decide(&t, &view());
        assert!(d.commands.is_empty());
        assert_eq!(
            d.waiting,
            [(
                "a".to_string(),
                "no aggregator can take it: node 4 runs a worker".to_string()
            )]
        );
        let mut t = world(10, &[("b", 1000, true)]);
        let d = decide(&t, &view());
        assert_eq!(d.waiting[0].1, "no aggregator can take it: node 1 has 10 of the 20 slots free, node 2 has 10 of the 20 slots free, node 3 has 10 of the 20 slots free");
        t.hosts.clear();
        assert!(decide(&t, &view()).waiting[0]
            .1
            .contains("none has aggregator.enabled"));
    }

    #[test]
    fn a_worker_on_an_unreachable_node_is_reported_once() {
        let mut t = world(50, &[("a", 1000, false)]);
        let d = decide(&t, &view());
        apply_all(&mut t, &d);
        let mut v = view();
        v.unreachable.insert(5);
        assert!(
            decide(&t, &v).commands.is_empty(),
            "unreachable for a moment is not gone"
        );
        v.gone.insert(5);
        let d = decide(&t, &v);
        assert!(matches!(
            &d.commands[..],
            [AggCommand::WorkerGone { rank: 1, .. }]
        ));
        apply_all(&mut t, &d);
        assert!(t.jobs["a"]
            .failed
            .as_deref()
            .unwrap()
            .contains("node 5 at 198.18.0.5"));
        assert!(
            decide(&t, &v).commands.is_empty(),
            "a failed job needs nothing more"
        );
    }

    #[test]
    fn only_a_stretch_of_unreachability_as_long_as_the_threshold_is_gone() {
        let mut s = Sustained::new(1000);
        let set = |n: &[NodeId]| n.iter().copied().collect::<BTreeSet<_>>();
        assert!(s.update(0, &set(&[5])).is_empty());
        assert!(s.update(900, &set(&[5, 6])).is_empty());
        // reachable once: 5 starts over
        assert!(s.update(950, &set(&[6])).is_empty());
        assert!(s.update(1000, &set(&[5, 6])).is_empty());
        assert_eq!(s.update(1900, &set(&[5, 6])), set(&[6]));
        assert_eq!(s.update(2000, &set(&[5, 6])), set(&[5, 6]));
        assert!(s.update(2100, &set(&[])).is_empty());
    }

    /// A host the leader committed dead (an agent: no probe of the leader watches it) is
    /// unreachable at once beside the probes' own findings, gone once dead for the threshold,
    /// and settling once the leader commits it alive again.
    #[test]
    fn a_host_committed_dead_is_unreachable_then_gone_and_settles_when_back() {
        let mut s = Sustained::new(1000);
        let set = |n: &[NodeId]| n.iter().copied().collect::<BTreeSet<_>>();
        let v = s.view(0, &set(&[2]), &set(&[7]), BTreeMap::new());
        assert_eq!(v.unreachable, set(&[2, 7]));
        assert!(v.gone.is_empty(), "not for the threshold yet");
        let v = s.view(500, &set(&[2]), &set(&[7, 8]), BTreeMap::new());
        assert_eq!(v.unreachable, set(&[2, 7, 8]));
        assert!(v.gone.is_empty());
        let v = s.view(1000, &set(&[2]), &set(&[7, 8]), BTreeMap::new());
        assert_eq!(v.gone, set(&[2, 7]), "8 has been dead for 500 ms only");
        let v = s.view(1100, &set(&[]), &set(&[]), BTreeMap::new());
        assert!(v.unreachable.is_empty() && v.gone.is_empty());
        assert_eq!(v.settling, set(&[2, 7, 8]));
    }

    /// A job on an aggregating host that is an agent, and a worker on another agent: the
    /// leader's probes never find them unreachable, so only the committed death moves the
    /// job (at once: one command, a new epoch) and reports the worker gone (once its node has
    /// been dead for the threshold).
    #[test]
    fn a_job_on_a_host_committed_dead_moves_and_a_worker_there_is_gone() {
        let mut t = world(50, &[("a", 1000, false)]);
        let d = decide(&t, &view());
        apply_all(&mut t, &d);
        let old = t.jobs["a"].placement.unwrap().node;
        let epoch = t.jobs["a"].epoch;
        let mut s = Sustained::new(5000);
        let none = BTreeSet::new();
        let ips = view().node_ips;
        let v = s.view(0, &none, &none, ips.clone());
        assert!(decide(&t, &v).commands.is_empty(), "nothing is down yet");
        let v = s.view(100, &none, &[old].into(), ips.clone());
        let d = decide(&t, &v);
        assert!(
            matches!(&d.commands[..], [AggCommand::Place { placement, .. }] if placement.node != old),
            "{d:?}"
        );
        apply_all(&mut t, &d);
        assert_eq!(t.jobs["a"].epoch, epoch + 1);
        // The host of rank 1's worker (node 5) is committed dead: the worker is gone once it
        // has been for the threshold.
        let v = s.view(200, &none, &[old, 5].into(), ips.clone());
        assert!(decide(&t, &v).commands.is_empty(), "dead for a moment only");
        let v = s.view(5200, &none, &[old, 5].into(), ips);
        let d = decide(&t, &v);
        assert!(
            matches!(&d.commands[..], [AggCommand::WorkerGone { rank: 1, .. }]),
            "{d:?}"
        );
    }

    #[test]
    fn a_node_seen_unreachable_is_settling_for_a_while_once_reachable() {
        let mut s = Sustained::new(1000);
        let set = |n: &[NodeId]| n.iter().copied().collect::<BTreeSet<_>>();
        s.update(0, &set(&[5]));
        assert!(s.settling(0).is_empty(), "unreachable is not settling");
        s.update(2000, &set(&[]));
        assert_eq!(s.settling(2000), set(&[5]));
        s.update(RETURN_SETTLE_MS - 1, &set(&[]));
        assert_eq!(s.settling(RETURN_SETTLE_MS - 1), set(&[5]));
        s.update(RETURN_SETTLE_MS, &set(&[]));
        assert!(s.settling(RETURN_SETTLE_MS).is_empty());
    }

    #[test]
    fn a_tree_is_regrouped_onto_a_returning_host_only_once_it_has_settled() {
        let (mut t, mut view) = grouped_tree();
        let seats = t.jobs["t"].seats();
        assert_eq!(seats.len(), 2, "a tree of two hosts: {seats:?}");
        let (root, cluster) = (seats[0].placement.node, seats[1].placement.node);
        // Both other hosts lost: the job is regrouped onto the root alone.
        let others: Vec<NodeId> = (1..=3).filter(|n| *n != root).collect();
        view.unreachable.extend(others.iter().copied());
        let d = decide(&t, &view);
        apply_all(&mut t, &d);
        assert_eq!(t.jobs["t"].seats().len(), 1);
        // The cluster host is back, the third still lost: no regrouping onto it while it
        // settles (a flapping host would have the job regrouped back and forth)...
        view.unreachable.remove(&cluster);
        view.settling.insert(cluster);
        assert!(
            decide(&t, &view).commands.is_empty(),
            "{:?}",
            decide(&t, &view)
        );
        // ... and once it has, the job is spread over it again.
        view.settling.clear();
        let d = decide(&t, &view);
        let [AggCommand::PlaceTree { clusters, .. }] = &d.commands[..] else {
            panic!("no regrouping onto the settled host: {d:?}");
        };
        assert!(clusters.iter().any(|c| c.placement.node == cluster));
    }

    #[test]
    fn a_worker_rejoining_from_another_host_keeps_its_seat_until_its_links_call_for_a_regrouping() {
        let (mut t, mut view) = grouped_tree();
        let (seat, index) = t.jobs["t"].seat_of(0).unwrap();
        // Rank 0 joins again from a new host (node 10): one command, a new epoch, the same seat
        // (its aggregator takes the new address); its unmeasured links move nothing.
        view.node_ips.insert(10, ip(10));
        let epoch = t.jobs["t"].epoch;
        let join = AggCommand::Join {
            name: "t".into(),
            rank: 0,
            addr: SocketAddrV4::new(ip(10), 40000),
        };
        assert_eq!(t.apply(&join, 5), Ok(true));
        assert_eq!(t.jobs["t"].epoch, epoch + 1);
        assert!(t.jobs["t"].running());
        assert_eq!(t.jobs["t"].seat_of(0), Some((seat, index)));
        assert!(decide(&t, &view).commands.is_empty());
        // Measured: slow to its seat's host, fast to the others. One regrouping moves it off.
        for to in 1..=3 {
            let bytes_per_s = if to == seat.node {
                10_000_000
            } else {
                100_000_000
            };
            let m = AggCommand::Bandwidth {
                from: 10,
                to,
                bytes_per_s,
            };
            t.apply(&m, 6).unwrap();
        }
        let d = decide(&t, &view);
        let [AggCommand::PlaceTree { .. }] = &d.commands[..] else {
            panic!("no regrouping for the slow link: {d:?}");
        };
        apply_all(&mut t, &d);
        let (moved, _) = t.jobs["t"].seat_of(0).unwrap();
        assert_ne!(moved.node, seat.node, "{:?}", t.jobs["t"].seats());
        assert!(decide(&t, &view).commands.is_empty(), "and it stays");
    }

    #[test]
    fn first_fit_reuses_holes() {
        assert_eq!(first_fit(100, &[], 30), Some(0));
        assert_eq!(first_fit(100, &[(0, 20), (50, 60)], 30), Some(20));
        assert_eq!(first_fit(100, &[(0, 20), (40, 60)], 30), Some(60));
        assert_eq!(first_fit(100, &[(0, 80)], 30), None);
    }

    /// Hosts 1..=3 aggregate; six workers of job `t` (grouping auto) on nodes 4..=9.
    fn grouped_world() -> (AggTables, ClusterView) {
        grouped_world_of("t", 6, 1)
    }

    /// Hosts 1..=3 aggregate; `workers` workers of job `name` (grouping auto), `per_node` on
    /// each of nodes 4.. (ports 40000 up).
    fn grouped_world_of(name: &str, workers: u16, per_node: u16) -> (AggTables, ClusterView) {
        let mut t = AggTables::default();
        for node in 1..=3u8 {
            let host = AggCommand::Host {
                node: u64::from(node),
                ip: ip(node),
                slots: 1000,
                cpu_millis: 4000,
            };
            t.apply(&host, 1).unwrap();
        }
        let create = AggCommand::Create {
            name: name.into(),
            workers,
            values: 100_000,
            dtype: 1,
            elastic: false,
            chunk_values: 360,
            colocate: false,
            quota: QUOTA,
            grouping: Grouping::Auto,
            secret: [7; 16],
        };
        t.apply(&create, 1).unwrap();
        for rank in 0..workers {
            let node = ip(4 + u8::try_from(rank / per_node).unwrap());
            let addr = SocketAddrV4::new(node, 40000 + rank % per_node);
            let join = AggCommand::Join {
                name: name.into(),
                rank,
                addr,
            };
            t.apply(&join, 1).unwrap();
        }
        let view = ClusterView {
            node_ips: (1..=9u8).map(|i| (u64::from(i), ip(i))).collect(),
            ..ClusterView::default()
        };
        (t, view)
    }

    /// [`grouped_world`] with every link measured at 100 MB/s and the job placed as the tree
    /// the leader decides for it.
    fn grouped_tree() -> (AggTables, ClusterView) {
        let (mut t, view) = grouped_world();
        let d = decide(&t, &view);
        apply_all(&mut t, &d);
        measure(&mut t, 100_000_000);
        let d = decide(&t, &view);
        apply_all(&mut t, &d);
        (t, view)
    }

    fn measure(t: &mut AggTables, bytes_per_s: u64) {
        for from in 4..=9 {
            for to in 1..=3 {
                let m = AggCommand::Bandwidth {
                    from,
                    to,
                    bytes_per_s,
                };
                t.apply(&m, 2).unwrap();
            }
        }
    }

    #[test]
    fn a_grouped_job_is_flat_until_measured_then_a_tree_that_stays_and_regroups_without_a_dead_host(
    ) {
        let (mut t, mut view) = grouped_world();
        // Unmeasured: placed as a flat job.
        let d = decide(&t, &view);
        assert!(
            matches!(d.commands[..], [AggCommand::Place { .. }]),
            "{d:?}"
        );
        apply_all(&mut t, &d);
        // Measured, equal links: a tree (six streams on one host take 6 M/b, the tree 4 M/b).
        measure(&mut t, 100_000_000);
        let d = decide(&t, &view);
        let [AggCommand::PlaceTree { root, clusters, .. }] = &d.commands[..] else {
            panic!("no tree: {d:?}");
        };
        // The fewest hosts that reach it: a root with three workers and one cluster of three
        // (four streams each).
        assert_eq!(clusters.len(), 1, "{clusters:?}");
        assert_eq!(clusters[0].ranks.len(), 3);
        assert_ne!(clusters[0].placement.node, root.node);
        apply_all(&mut t, &d);
        assert!(t.jobs["t"].running());
        assert!(decide(&t, &view).commands.is_empty(), "the tree stays");
        // A wobble of the figures moves nothing.
        for to in 1..=3 {
            let m = AggCommand::Bandwidth {
                from: 4,
                to,
                bytes_per_s: 90_000_000,
            };
            t.apply(&m, 3).unwrap();
        }
        assert!(decide(&t, &view).commands.is_empty(), "hysteresis");
        // A cluster host dies: one command regroups on the survivors.
        let dead = clusters[0].placement.node;
        view.unreachable.insert(dead);
        let d = decide(&t, &view);
        let [AggCommand::PlaceTree { root, clusters, .. }] = &d.commands[..] else {
            panic!("no regrouping: {d:?}");
        };
        assert_ne!(root.node, dead);
        assert!(clusters.iter().all(|c| c.placement.node != dead));
        apply_all(&mut t, &d);
        let seats = t.jobs["t"].seats();
        let placed: usize = seats.iter().map(|s| s.ranks.len()).sum();
        assert_eq!(placed, 6, "every rank has a seat");
    }

    /// A job of 100 workers (25 on each of nodes 4..=7, grouping auto) over hosts 1..=3.
    #[test]
    fn a_job_past_one_aggregator_s_limit_waits_for_its_tree_and_is_spread_over_clusters() {
        let (mut t, mut view) = grouped_world_of("big", 100, 25);
        // Unmeasured: no flat placement (64 at most on one aggregator), and it says why.
        let d = decide(&t, &view);
        assert!(d.commands.is_empty(), "{d:?}");
        assert_eq!(d.waiting.len(), 1, "{d:?}");
        assert!(
            d.waiting[0]
                .1
                .starts_with("its 100 workers need a tree of aggregators"),
            "{d:?}"
        );
        // Measured: a tree whose every aggregator sums at most 64 members.
        measure(&mut t, 100_000_000);
        let check = |d: &Decision| {
            let [AggCommand::PlaceTree { clusters, .. }] = &d.commands[..] else {
                panic!("no tree: {d:?}");
            };
            let seated: usize = clusters.iter().map(|c| c.ranks.len()).sum();
            let root = 100 - seated;
            assert!(clusters.iter().all(|c| c.ranks.len() < 64), "{clusters:?}");
            assert!(root + clusters.len() <= 64, "root {root}, {clusters:?}");
        };
        let d = decide(&t, &view);
        check(&d);
        apply_all(&mut t, &d);
        assert!(t.jobs["big"].running());
        let seats = t.jobs["big"].seats();
        assert_eq!(seats.iter().map(|s| s.ranks.len()).sum::<usize>(), 100);
        // A host lost: the two left hold 62 + 63; regrouped on them in one command.
        let lost = seats[1].placement.node;
        view.unreachable.insert(lost);
        let d = decide(&t, &view);
        check(&d);
        apply_all(&mut t, &d);
        // Another lost: one host holds 64, not 100: the job waits, and never goes flat.
        let left: Vec<NodeId> = (1..=3).filter(|n| !view.unreachable.contains(n)).collect();
        view.unreachable.insert(left[0]);
        let d = decide(&t, &view);
        assert!(d.commands.is_empty(), "{d:?}");
        assert!(d.waiting[0].1.contains("100 workers do not fit"), "{d:?}");
        // And a flat placement of it would be refused by the tables.
        let place = AggCommand::Place {
            name: "big".into(),
            expect_epoch: t.jobs["big"].epoch,
            placement: Placement {
                node: left[1],
                base: 0,
            },
        };
        assert_eq!(
            t.apply(&place, 10).unwrap_err(),
            "job big has 100 workers, over the 64 one aggregator sums: it is placed as a tree"
        );
    }
}
