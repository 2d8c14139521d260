//! The leader's tree for a grouped job (`--grouping auto|ps`), pure: from the tables' measured
//! bandwidths and the hosts' CPU budgets to the planner's grouping (`yard_planner::grouping`,
//! ALEPH), and whether it is worth a regrouping.
//!
//! - Candidates: every host that may aggregate the job ([`super::eligible`], the rule the
//!   probes and the flat placement use too) that the leader can reach and that has a free
//!   contiguous range for the whole gradient (the job's own ranges count as free: a new epoch
//!   makes them so).
//! - Bandwidth from worker `w` to host `h`: [`super::eligible::figure`], the tables' figure
//!   from `w`'s node to `h`, or for a worker on `h` itself (a colocated job) the host's summing
//!   capacity, since its frames cross no link and nobody probes that pair. A job is grouped
//!   only once every worker's node has measured every candidate; until then it is placed as a
//!   flat job (by CPU load), and regrouped when the figures arrive.
//! - A host's capacity: the smaller of its link (the fastest stream measured into it: one
//!   stream of a faster sender fills it) and its CPU budget at
//!   [`SUM_BYTES_PER_CORE`](super::eligible::SUM_BYTES_PER_CORE).
//! - `ps` takes the best single host; `auto` the best tree.
//! - Hysteresis: a running job whose arrangement is still usable is regrouped only when the
//!   planner's round time beats its current one by [`MIN_GAIN`] (`yard_planner::grouping::regroup`),
//!   so figures that wobble around a boundary do not move it back and forth; a lost host
//!   regroups at once (in one command, `AggCommand::PlaceTree`).

use std::collections::{BTreeMap, BTreeSet};

use yard_planner::grouping::{
    self as planner, Cluster as PlannedCluster, Grouping as Planned, GroupingInput,
};
use yard_raft_store::aggregation::{AggJob, AggTables, Cluster, Grouping, Placement, MAX_WORKERS};
use yard_raft_store::NodeId;

use super::eligible::{cpu_bytes_per_s, figure, may_aggregate};
use super::placement::{first_fit, seat_fits, ClusterView};

/// The least drop of the round time worth a regrouping (a fraction of the current one).
pub const MIN_GAIN: f64 = 0.15;

/// What the leader does with a grouped job's arrangement.
#[derive(Debug, Clone, PartialEq)]
pub enum TreeDecision {
    /// Not every bandwidth is measured yet: treat the job as flat for now (why).
    Unmeasured(String),
    /// The current arrangement stays.
    Keep,
    /// Move to this arrangement (one `PlaceTree`).
    Place {
        root: Placement,
        clusters: Vec<Cluster>,
        /// The planner's round time for it, s.
        round_s: f64,
    },
    /// No candidate host, or the planner found no grouping: why.
    Cannot(String),
}

/// Decides on `job` (complete, grouped) given the slot ranges `taken` by other jobs.
pub fn decide_tree(
    tables: &AggTables,
    view: &ClusterView,
    job: &AggJob,
    taken: &BTreeMap<NodeId, Vec<(u32, u32)>>,
) -> TreeDecision {
    let ranks: Vec<u16> = job.members.keys().copied().collect();
    let need = job.slots();
    // Hosts the job has seats on now (a settling one keeps its seat).
    let seated: BTreeSet<NodeId> = job.seats().iter().map(|s| s.placement.node).collect();
    // Candidate hosts with the base their range would take.
    let hosts: Vec<(NodeId, u32)> = tables
        .hosts
        .iter()
        .filter(|(n, _)| {
            !view.unreachable.contains(n)
                && !view.drained.contains(n)
                && (!view.settling.contains(n) || seated.contains(n))
                && may_aggregate(tables, job, **n)
        })
        .filter_map(|(n, h)| {
            let t = taken.get(n).map(Vec::as_slice).unwrap_or(&[]);
            Some((*n, first_fit(h.slots, t, need)?))
        })
        .collect();
    if hosts.is_empty() {
        return TreeDecision::Cannot("no aggregating host can take it".into());
    }
    // Each rank's node, by its address.
    let node_of = |rank: &u16| -> Option<NodeId> {
        let ip = *job.members.get(rank)?.ip();
        view.node_ips
            .iter()
            .find(|(_, a)| **a == ip)
            .map(|(n, _)| *n)
    };
    let mut bandwidth = Vec::with_capacity(ranks.len());
    for rank in &ranks {
        let Some(node) = node_of(rank) else {
            return TreeDecision::Unmeasured(format!("rank {rank}'s host is not a node"));
        };
        let worker_ip = *job.members[rank].ip();
        let mut row = Vec::with_capacity(hosts.len());
        for (h, _) in &hosts {
            match figure(tables, node, worker_ip, *h) {
                Some(b) => row.push(b),
                None => {
                    return TreeDecision::Unmeasured(format!(
                        "node {node} has not measured its bandwidth to node {h}"
                    ))
                }
            }
        }
        bandwidth.push(row);
    }
    // A candidate has a measurement into it (checked above) unless every worker is on it; its
    // link is then not what bounds it.
    let capacity: Vec<f64> = hosts
        .iter()
        .map(|(h, _)| {
            let cpu = cpu_bytes_per_s(&tables.hosts[h]);
            let link = tables
                .bandwidth
                .values()
                .filter_map(|m| m.get(h))
                .max()
                .map_or(cpu, |b| *b as f64);
            link.min(cpu)
        })
        .collect();
    let input = GroupingInput {
        gradient_bytes: u64::from(job.values) * 4,
        workers: ranks.len(),
        capacity_bps: capacity,
        bandwidth,
        max_load: Some(usize::from(MAX_WORKERS)),
    };
    let best = match job.grouping {
        Grouping::Ps => planner::flat(&input),
        _ => planner::group(&input),
    };
    let best = match best {
        Ok(g) => g,
        Err(e) => return TreeDecision::Cannot(e.to_string()),
    };
    // The current arrangement in the planner's terms, if every host of it is a candidate.
    let index_of = |n: NodeId| hosts.iter().position(|(h, _)| *h == n);
    // Kept only while each of its ranges still fits its host (`seat_fits`): otherwise the
    // job is placed again even if its grouping is still the best.
    let fits = job
        .seats()
        .iter()
        .all(|s| seat_fits(tables, taken, job, s.placement));
    let current = current_grouping(job, &ranks, index_of).filter(|_| fits);
    if let Some(cur) = &current {
        let policy = planner::RegroupPolicy { min_gain: MIN_GAIN };
        if planner::regroup(&input, cur, &policy).is_none() {
            return TreeDecision::Keep;
        }
    }
    let place = |k: usize| Placement {
        node: hosts[k].0,
        base: hosts[k].1,
    };
    let clusters = best
        .clusters
        .iter()
        .filter(|c| c.host != best.root && !c.members.is_empty())
        .map(|c| Cluster {
            placement: place(c.host),
            ranks: c.members.iter().map(|w| ranks[*w]).collect(),
        })
        .collect();
    TreeDecision::Place {
        root: place(best.root),
        clusters,
        round_s: best.round_time_s,
    }
}

/// `job`'s arrangement as the planner sees it (host indices from `index_of`), if it has one
/// and every host of it is a candidate.
fn current_grouping(
    job: &AggJob,
    ranks: &[u16],
    index_of: impl Fn(NodeId) -> Option<usize>,
) -> Option<Planned> {
    let seats = job.seats();
    let root = index_of(seats.first()?.placement.node)?;
    // By rank, not a scan per rank: a job of thousands of workers would make this quadratic.
    let position: BTreeMap<u16, usize> = ranks.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    let mut clusters = Vec::new();
    for s in &seats {
        let host = index_of(s.placement.node)?;
        let members = s
            .ranks
            .iter()
            .map(|r| position.get(r).copied())
            .collect::<Option<Vec<usize>>>()?;
        clusters.push(PlannedCluster { host, members });
    }
    Some(Planned {
        root,
        clusters,
        round_time_s: 0.0,
    })
}
