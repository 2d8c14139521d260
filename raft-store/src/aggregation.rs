//! The aggregator's replicated tables: aggregation jobs (shape, members, the hosts that sum
//! them — one, or a tree of them — and the epoch of that arrangement), the hosts that can
//! aggregate, with their slot budgets, and the measured bandwidth from each node to each
//! aggregating host.
//!
//! Every change of who sums a job or who contributes to it bumps the job's epoch, in one
//! command: the aggregator and every worker act on the epoch they see, and frames of any other
//! epoch are stale, so no chunk is ever summed under two arrangements. Checks that need the
//! tables (quota, names, ranks) are made here, at apply time, so every node refuses the same
//! commands; a refused command changes nothing and answers why in one sentence.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// Bytes of aggregator memory one slot takes (`struct agg_slot`: one chunk of one round
/// parity, `AGG_VALUES_MAX` values): the unit of the memory quota.
pub const SLOT_BYTES: u64 = 3104;
/// Most members one aggregator sums for a job (the XDP program's contribution bitmap is 64
/// bits): the most workers of a flat or `ps` job, of a tree's cluster, and of a root's own
/// members plus its clusters.
pub const MAX_WORKERS: u16 = 64;
/// Most workers of a job grouped as a tree (`auto`) or a ring: 64 clusters of 63 under a root
/// with no members of its own (the grouping keeps each aggregator's members and its uplink
/// within [`MAX_WORKERS`] streams). A ring job has no aggregator; it takes the same limit.
pub const MAX_TREE_WORKERS: u16 = MAX_WORKERS * (MAX_WORKERS - 1);
/// Most values in one chunk (`AGG_VALUES_MAX`).
pub const MAX_CHUNK_VALUES: u16 = 768;

/// How a job's workers are grouped onto aggregators (`yard agg job create --grouping`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Grouping {
    /// ALEPH: a tree of aggregators, clusters sized to the measured bandwidths and the hosts'
    /// CPU (one aggregator, chosen by CPU load, until every bandwidth is measured).
    #[default]
    Auto,
    /// One aggregator for every worker, chosen by CPU load (XAgg).
    Flat,
    /// One aggregator for every worker, the host the measured bandwidths favour: a parameter
    /// server (by CPU load until they are measured).
    Ps,
    /// No aggregator: the workers all-reduce among themselves in a ring, with their framework's
    /// own collective (the DDP hook falls back to its process group's all-reduce). The job
    /// still records who is in it and the epoch, so every rank sees the same membership.
    Ring,
}

impl Grouping {
    /// The name `--grouping` takes and `yard agg job show` prints.
    pub fn name(self) -> &'static str {
        match self {
            Grouping::Auto => "auto",
            Grouping::Flat => "flat",
            Grouping::Ps => "ps",
            Grouping::Ring => "ring",
        }
    }

    /// Parses [`Grouping::name`].
    pub fn parse(s: &str) -> Result<Grouping, String> {
        [Grouping::Auto, Grouping::Flat, Grouping::Ps, Grouping::Ring]
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| format!("grouping {s:?} is not one of auto, flat, ps, ring"))
    }
}

/// A cluster of a job's tree: an aggregator below the root and the ranks that send to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cluster {
    pub placement: Placement,
    /// Ascending; the worker index of each is its position here.
    pub ranks: Vec<u16>,
}

/// One aggregator of a job as its host serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    pub placement: Placement,
    /// The ranks that send to it (ascending); their worker index is their position.
    pub ranks: Vec<u16>,
    /// The root only: the clusters' hosts, its members after its own ranks, in cluster order.
    pub children: Vec<NodeId>,
    /// A cluster aggregator only: its worker index at the root.
    pub up_index: Option<u16>,
}

/// Where a job is summed: the host and the first of its `2 x chunks` slots there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    pub base: u32,
}

/// One aggregation job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggJob {
    pub id: u32,
    pub name: String,
    /// Workers the job was created for (ranks 0..workers).
    pub workers: u16,
    /// Values of the gradient.
    pub values: u32,
    /// `enum agg_dtype`: 0 int32, 1 float32.
    pub dtype: u8,
    /// Whether the job goes on without a worker that dies (otherwise it fails, naming it).
    pub elastic: bool,
    /// Values per chunk (from the smallest MTU on the path; at most [`MAX_CHUNK_VALUES`]).
    pub chunk_values: u16,
    /// Whether the aggregator may be a worker's own host.
    pub colocate: bool,
    /// Bumped by every change of placement or membership.
    pub epoch: u32,
    /// Ranks that have joined, with the address each sends from.
    pub members: BTreeMap<u16, SocketAddrV4>,
    /// Ranks that died in an elastic job (they may not rejoin).
    pub gone: Vec<u16>,
    /// The job's aggregator, or the root of its tree.
    pub placement: Option<Placement>,
    /// Why the job stopped, if it did (a worker died in a non-elastic job).
    pub failed: Option<String>,
    pub grouping: Grouping,
    /// A tree's cluster aggregators below the root (`placement`); the ranks in none of them
    /// send to the root. Empty: one aggregator sums every worker.
    pub clusters: Vec<Cluster>,
    /// The key the job's frame tokens are drawn from (per epoch, aggregator and worker:
    /// `yard_actors::aggregator::auth`), random, from the node that proposed the job: only the
    /// cluster's nodes (and, through their agents, each worker its own tokens) ever see it, so
    /// a host on the fabric cannot make a frame a member or an aggregator takes.
    pub secret: [u8; 16],
}

impl AggJob {
    /// Chunks of the gradient.
    pub fn chunks(&self) -> u32 {
        self.values.div_ceil(u32::from(self.chunk_values.max(1)))
    }

    /// Slots the job takes on its aggregator.
    pub fn slots(&self) -> u32 {
        self.chunks().saturating_mul(2)
    }

    /// Aggregator memory the job takes (none for a ring: nothing aggregates it).
    pub fn bytes(&self) -> u64 {
        if self.grouping == Grouping::Ring {
            return 0;
        }
        u64::from(self.slots()) * SLOT_BYTES
    }

    /// Whether every rank that is still in the job has joined: it can be summed.
    pub fn complete(&self) -> bool {
        let expected = usize::from(self.workers) - self.gone.len();
        expected > 0 && self.members.len() == expected
    }

    /// Whether the job is running: complete, placed (a ring needs no placement) and not
    /// failed.
    pub fn running(&self) -> bool {
        self.complete()
            && (self.placement.is_some() || self.grouping == Grouping::Ring)
            && self.failed.is_none()
    }

    /// The members of this epoch in worker-index order (ranks ascending): worker index `i` is
    /// the `i`-th.
    pub fn worker_order(&self) -> Vec<(u16, SocketAddrV4)> {
        self.members.iter().map(|(r, a)| (*r, *a)).collect()
    }

    /// Every aggregator of the job with whom it sums: the root first (its own ranks, then its
    /// clusters' hosts as members), then each cluster. Empty until the job is placed.
    pub fn seats(&self) -> Vec<Seat> {
        let Some(root) = self.placement else {
            return Vec::new();
        };
        // A set, not a list: a job of thousands of workers in clusters made the old
        // `Vec::contains` scan quadratic, and this runs on every table change.
        let in_cluster: BTreeSet<u16> = self
            .clusters
            .iter()
            .flat_map(|c| c.ranks.iter().copied())
            .collect();
        let direct: Vec<u16> = self
            .members
            .keys()
            .copied()
            .filter(|r| !in_cluster.contains(r))
            .collect();
        let base = direct.len();
        let mut seats = vec![Seat {
            placement: root,
            ranks: direct,
            children: self.clusters.iter().map(|c| c.placement.node).collect(),
            up_index: None,
        }];
        for (k, c) in self.clusters.iter().enumerate() {
            seats.push(Seat {
                placement: c.placement,
                ranks: c.ranks.clone(),
                children: Vec::new(),
                up_index: u16::try_from(base + k).ok(),
            });
        }
        seats
    }

    /// The aggregator rank `rank` sends to and its worker index there. For every rank at
    /// once, [`AggJob::seat_index`] (this is linear in the members per call).
    pub fn seat_of(&self, rank: u16) -> Option<(Placement, u16)> {
        self.seats().into_iter().find_map(|s| {
            let i = s.ranks.iter().position(|r| *r == rank)?;
            Some((s.placement, u16::try_from(i).ok()?))
        })
    }

    /// [`AggJob::seat_of`] of every member, by rank, in one pass over the seats.
    pub fn seat_index(&self) -> BTreeMap<u16, (Placement, u16)> {
        self.seats()
            .into_iter()
            .flat_map(|s| {
                let placement = s.placement;
                s.ranks
                    .into_iter()
                    .enumerate()
                    .filter_map(move |(i, r)| Some((r, (placement, u16::try_from(i).ok()?))))
            })
            .collect()
    }
}

/// A host that can aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggHost {
    /// The address workers send to.
    pub ip: Ipv4Addr,
    /// Entries of its slot map.
    pub slots: u32,
    /// The CPU it gives to summing, in thousandths of a core (`aggregator.cpu_cores`).
    pub cpu_millis: u32,
}

/// The limits a job creation is checked against, carried in the command so that every node
/// checks the same numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Aggregator memory one job may take.
    pub job_bytes: u64,
    /// Aggregator memory all jobs together may take.
    pub cluster_bytes: u64,
}

/// Aggregator commands, wrapped in `Command::Aggregation`. Never reorder: the index is the tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AggCommand {
    /// Creates a job, waiting for its workers to join.
    Create {
        name: String,
        workers: u16,
        values: u32,
        dtype: u8,
        elastic: bool,
        chunk_values: u16,
        colocate: bool,
        quota: Quota,
        grouping: Grouping,
        /// [`AggJob::secret`]: drawn at random by the node that proposes the command (the state
        /// machine must stay deterministic); all zeros is refused.
        secret: [u8; 16],
    },
    /// Deletes a job; its aggregator frees its slots.
    Delete { name: String },
    /// A worker of rank `rank` joins, sending from `addr` (a rejoin from a new address replaces
    /// the old one and bumps the epoch).
    Join {
        name: String,
        rank: u16,
        addr: SocketAddrV4,
    },
    /// The leader's placement: `name` is summed at `placement` from epoch `expect_epoch + 1`
    /// on. Skipped if the job's epoch is no longer `expect_epoch` (a newer decision won).
    Place {
        name: String,
        expect_epoch: u32,
        placement: Placement,
    },
    /// A worker died: an elastic job goes on without it (new epoch), any other fails.
    WorkerGone {
        name: String,
        rank: u16,
        reason: String,
    },
    /// A host can aggregate with `slots` slots (its daemon says so once its program is loaded),
    /// or can no longer (`slots` 0).
    Host {
        node: NodeId,
        ip: Ipv4Addr,
        slots: u32,
        cpu_millis: u32,
    },
    /// The leader's tree for `name` from epoch `expect_epoch + 1` on: summed at `root` and at
    /// each cluster's host (no clusters: `root` alone, as `Place`). One command, so every
    /// aggregator and worker moves to the new arrangement at the same epoch. Skipped if the
    /// job's epoch is no longer `expect_epoch`.
    PlaceTree {
        name: String,
        expect_epoch: u32,
        root: Placement,
        clusters: Vec<Cluster>,
    },
    /// A measurement of the bandwidth from node `from` to aggregating host `to`, bytes/s.
    Bandwidth {
        from: NodeId,
        to: NodeId,
        bytes_per_s: u64,
    },
    /// The aggregator at `to` saw the rate of `from`'s workers move in its counters: `from`
    /// measures the pair again, and the measurement replaces the figure. Refused for a pair
    /// with no figure yet (it is measured anyway).
    Remeasure { from: NodeId, to: NodeId },
}

/// Weight of a new bandwidth measurement in the table's moving average: 1/`BANDWIDTH_SMOOTHING`.
/// A quarter: one noisy probe moves the figure a quarter of the way, and a real change shows
/// within a few probes.
pub const BANDWIDTH_SMOOTHING: u64 = 4;

/// The aggregator's part of the replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggTables {
    pub jobs: BTreeMap<String, AggJob>,
    pub hosts: BTreeMap<NodeId, AggHost>,
    /// Measured bandwidth, bytes/s, from a node (a worker's host) to an aggregating host:
    /// `bandwidth[from][to]`, smoothed over the measurements.
    pub bandwidth: BTreeMap<NodeId, BTreeMap<NodeId, u64>>,
    /// Pairs `(from, to)` whose figure the aggregator at `to` saw change in its counters
    /// (`AggCommand::Remeasure`): `from` measures them again at once, and that measurement
    /// replaces the figure instead of entering the average.
    #[serde(default)]
    pub remeasure: BTreeSet<(NodeId, NodeId)>,
    /// The next job id (ids are never reused, so a stale frame never names a new job).
    pub next_id: u32,
    /// The revision of the last command that changed these tables.
    pub revision: u64,
}

impl AggTables {
    /// Applies `cmd` at `revision`: `Ok(true)` if it changed something, `Err` with the one
    /// sentence why it was refused (nothing changed).
    pub fn apply(&mut self, cmd: &AggCommand, revision: u64) -> Result<bool, String> {
        let changed = match cmd {
            AggCommand::Create {
                name,
                workers,
                values,
                dtype,
                elastic,
                chunk_values,
                colocate,
                quota,
                grouping,
                secret,
            } => {
                if name.is_empty() || name.len() > 64 {
                    return Err("a job name has 1 to 64 characters".into());
                }
                if self.jobs.contains_key(name) {
                    return Err(format!("job {name} exists already"));
                }
                // An aggregator's job map may have to hold every job: one more would be
                // accepted here and its frames dropped there.
                if self.jobs.len() >= crate::capacity::AGG_JOBS {
                    return Err(format!(
                        "the cluster has {} aggregation jobs, as many as an aggregator's job map holds; delete one before creating {name}",
                        self.jobs.len()
                    ));
                }
                let most = match grouping {
                    Grouping::Auto | Grouping::Ring => MAX_TREE_WORKERS,
                    Grouping::Flat | Grouping::Ps => MAX_WORKERS,
                };
                if *workers == 0 || *workers > most {
                    return Err(format!(
                        "a job has 1 to {MAX_WORKERS} workers on one aggregator, or up to {MAX_TREE_WORKERS} grouped auto or ring, not {workers}"
                    ));
                }
                if *values == 0 {
                    return Err("a job sums at least one value".into());
                }
                if *dtype > 1 {
                    return Err(format!("unknown dtype {dtype}"));
                }
                if *chunk_values == 0 || *chunk_values > MAX_CHUNK_VALUES {
                    return Err(format!(
                        "a chunk holds 1 to {MAX_CHUNK_VALUES} values, not {chunk_values}"
                    ));
                }
                if *secret == [0; 16] {
                    return Err(format!(
                        "job {name} has no secret for its frame tokens; the proposing node draws one"
                    ));
                }
                let job = AggJob {
                    id: self.next_id.max(1),
                    name: name.clone(),
                    workers: *workers,
                    values: *values,
                    dtype: *dtype,
                    elastic: *elastic,
                    chunk_values: *chunk_values,
                    colocate: *colocate,
                    epoch: 0,
                    members: BTreeMap::new(),
                    gone: Vec::new(),
                    placement: None,
                    failed: None,
                    grouping: *grouping,
                    clusters: Vec::new(),
                    secret: *secret,
                };
                let bytes = job.bytes();
                if bytes > quota.job_bytes {
                    return Err(format!(
                        "job {name} needs {} MiB of aggregator memory, over the {} MiB a job may take",
                        mib(bytes),
                        mib(quota.job_bytes)
                    ));
                }
                let used = self.used_bytes();
                if used + bytes > quota.cluster_bytes {
                    return Err(format!(
                        "job {name} needs {} MiB of aggregator memory and only {} MiB of the cluster's {} MiB are free",
                        mib(bytes),
                        mib(quota.cluster_bytes.saturating_sub(used)),
                        mib(quota.cluster_bytes)
                    ));
                }
                self.next_id = job.id + 1;
                self.jobs.insert(name.clone(), job);
                true
            }
            AggCommand::Delete { name } => {
                if self.jobs.remove(name).is_none() {
                    return Err(format!("no job named {name}"));
                }
                true
            }
            AggCommand::Join { name, rank, addr } => {
                let job = self.job_mut(name)?;
                if let Some(why) = &job.failed {
                    return Err(format!("job {name} has failed: {why}"));
                }
                if *rank >= job.workers {
                    return Err(format!(
                        "job {name} has ranks 0 to {}, not {rank}",
                        job.workers - 1
                    ));
                }
                if job.gone.contains(rank) {
                    return Err(format!("rank {rank} of job {name} died and cannot rejoin"));
                }
                if let Some((other, _)) = job
                    .members
                    .iter()
                    .find(|(r, a)| **a == *addr && **r != *rank)
                {
                    return Err(format!(
                        "{addr} is already rank {other} of job {name}; each worker needs its own port"
                    ));
                }
                if job.members.get(rank) == Some(addr) {
                    false
                } else {
                    job.members.insert(*rank, *addr);
                    job.epoch += 1;
                    true
                }
            }
            AggCommand::Place {
                name,
                expect_epoch,
                placement,
            } => {
                let job = self.job_mut(name)?;
                no_ring(job)?;
                if job.members.len() > usize::from(MAX_WORKERS) {
                    return Err(format!(
                        "job {name} has {} workers, over the {MAX_WORKERS} one aggregator sums: it is placed as a tree",
                        job.members.len()
                    ));
                }
                if job.epoch != *expect_epoch
                    || (job.placement == Some(*placement) && job.clusters.is_empty())
                {
                    false
                } else {
                    job.placement = Some(*placement);
                    job.clusters.clear();
                    job.epoch += 1;
                    true
                }
            }
            AggCommand::PlaceTree {
                name,
                expect_epoch,
                root,
                clusters,
            } => {
                let job = self.job_mut(name)?;
                no_ring(job)?;
                check_tree(job, root, clusters)?;
                if job.epoch != *expect_epoch
                    || (job.placement == Some(*root) && job.clusters == *clusters)
                {
                    false
                } else {
                    job.placement = Some(*root);
                    job.clusters = clusters.clone();
                    job.epoch += 1;
                    true
                }
            }
            AggCommand::Bandwidth {
                from,
                to,
                bytes_per_s,
            } => {
                if *bytes_per_s == 0 {
                    return Err("a measured bandwidth is positive".into());
                }
                let slot = self.bandwidth.entry(*from).or_default().entry(*to);
                let old = *slot.or_insert(*bytes_per_s);
                let new = if self.remeasure.remove(&(*from, *to)) {
                    // A change the counters saw: the check's figure, not a quarter of it.
                    *bytes_per_s
                } else if old >= *bytes_per_s {
                    old - (old - bytes_per_s) / BANDWIDTH_SMOOTHING
                } else {
                    old + (bytes_per_s - old) / BANDWIDTH_SMOOTHING
                };
                self.bandwidth.entry(*from).or_default().insert(*to, new);
                true
            }
            AggCommand::Remeasure { from, to } => {
                if !self.bandwidth.get(from).is_some_and(|m| m.contains_key(to)) {
                    return Err(format!(
                        "node {from} has no bandwidth figure to node {to} to measure again"
                    ));
                }
                self.remeasure.insert((*from, *to))
            }
            AggCommand::WorkerGone { name, rank, reason } => {
                let job = self.job_mut(name)?;
                if job.failed.is_some() || !job.members.contains_key(rank) {
                    false
                } else if job.elastic {
                    job.members.remove(rank);
                    job.gone.push(*rank);
                    for c in &mut job.clusters {
                        c.ranks.retain(|r| r != rank);
                    }
                    job.clusters.retain(|c| !c.ranks.is_empty());
                    job.epoch += 1;
                    if job.members.is_empty() {
                        job.failed = Some(format!(
                            "every worker is gone, the last: rank {rank} ({reason})"
                        ));
                    }
                    true
                } else {
                    job.failed = Some(format!("worker rank {rank} died ({reason})"));
                    job.epoch += 1;
                    true
                }
            }
            AggCommand::Host {
                node,
                ip,
                slots,
                cpu_millis,
            } => {
                if *slots == 0 {
                    self.hosts.remove(node).is_some()
                } else {
                    let host = AggHost {
                        ip: *ip,
                        slots: *slots,
                        cpu_millis: *cpu_millis,
                    };
                    self.hosts.insert(*node, host) != Some(host)
                }
            }
        };
        if changed {
            self.revision = revision;
        }
        Ok(changed)
    }

    /// Forgets node `id`, removed from the cluster (`Command::RemoveNode`): it aggregates no
    /// more, and its bandwidth figures, from it and to it, go. Nothing else would deregister
    /// it: a removed node is no longer probed by the leader, so a host left here looked
    /// reachable and took new jobs for ever. Jobs seated on it are the leader's to move: its
    /// placement core leaves a host that is no longer registered, in one command per job.
    /// `Ok(true)`-like: whether anything changed (the revision is then `revision`).
    pub fn forget_node(&mut self, id: NodeId, revision: u64) -> bool {
        let mut changed = self.hosts.remove(&id).is_some();
        changed |= self.bandwidth.remove(&id).is_some();
        for to in self.bandwidth.values_mut() {
            changed |= to.remove(&id).is_some();
        }
        self.bandwidth.retain(|_, to| !to.is_empty());
        let marked = self.remeasure.len();
        self.remeasure.retain(|(from, to)| *from != id && *to != id);
        changed |= self.remeasure.len() != marked;
        if changed {
            self.revision = revision;
        }
        changed
    }

    fn job_mut(&mut self, name: &str) -> Result<&mut AggJob, String> {
        self.jobs
            .get_mut(name)
            .ok_or_else(|| format!("no job named {name}"))
    }

    /// Aggregator memory all jobs take.
    pub fn used_bytes(&self) -> u64 {
        self.jobs.values().map(AggJob::bytes).sum()
    }

    /// The job with id `id`.
    pub fn by_id(&self, id: u32) -> Option<&AggJob> {
        self.jobs.values().find(|j| j.id == id)
    }
}

/// A ring job has no aggregator to place.
fn no_ring(job: &AggJob) -> Result<(), String> {
    if job.grouping == Grouping::Ring {
        return Err(format!(
            "job {} is all-reduced by its workers in a ring: it has no aggregator",
            job.name
        ));
    }
    Ok(())
}

/// Why `root` and `clusters` cannot be `job`'s tree, if they cannot: every cluster a non-empty
/// ascending set of the job's members, no rank in two, every aggregator on its own host, and no
/// aggregator summing more than the program's bitmap holds.
fn check_tree(job: &AggJob, root: &Placement, clusters: &[Cluster]) -> Result<(), String> {
    let name = &job.name;
    let mut seen: Vec<u16> = Vec::new();
    let mut hosts = vec![root.node];
    for c in clusters {
        if c.ranks.is_empty() {
            return Err(format!("a cluster of job {name}'s tree has no rank"));
        }
        if c.ranks.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("the ranks of a cluster of job {name} must ascend"));
        }
        if c.ranks.len() > usize::from(MAX_WORKERS) {
            return Err(format!(
                "a cluster of job {name} has {} ranks, over the {MAX_WORKERS} an aggregator sums",
                c.ranks.len()
            ));
        }
        if hosts.contains(&c.placement.node) {
            return Err(format!(
                "node {} serves two aggregators of job {name}'s tree",
                c.placement.node
            ));
        }
        hosts.push(c.placement.node);
        for r in &c.ranks {
            if !job.members.contains_key(r) {
                return Err(format!("rank {r} is not a member of job {name}"));
            }
            if seen.contains(r) {
                return Err(format!("rank {r} is in two clusters of job {name}"));
            }
            seen.push(*r);
        }
    }
    let at_root = job.members.len() - seen.len() + clusters.len();
    if at_root > usize::from(MAX_WORKERS) {
        return Err(format!(
            "the root of job {name} would sum {at_root} members, over the {MAX_WORKERS} an aggregator sums"
        ));
    }
    Ok(())
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUOTA: Quota = Quota {
        job_bytes: 96 << 20,
        cluster_bytes: 100 << 20,
    };

    fn create(name: &str, workers: u16, values: u32, elastic: bool) -> AggCommand {
        AggCommand::Create {
            name: name.into(),
            workers,
            values,
            dtype: 1,
            elastic,
            chunk_values: 360,
            colocate: false,
            quota: QUOTA,
            grouping: Grouping::Auto,
            secret: [7; 16],
        }
    }

    fn addr(i: u8) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, i), 40000)
    }

    fn join(t: &mut AggTables, name: &str, rank: u16) {
        let cmd = AggCommand::Join {
            name: name.into(),
            rank,
            addr: addr(u8::try_from(rank).unwrap() + 1),
        };
        assert_eq!(t.apply(&cmd, 1), Ok(true));
    }

    #[test]
    fn a_job_runs_once_every_rank_joined_and_it_is_placed() {
        let mut t = AggTables::default();
        assert_eq!(t.apply(&create("resnet", 2, 1000, false), 1), Ok(true));
        assert_eq!(t.jobs["resnet"].id, 1);
        join(&mut t, "resnet", 0);
        assert!(!t.jobs["resnet"].complete());
        join(&mut t, "resnet", 1);
        let job = &t.jobs["resnet"];
        assert!(job.complete() && !job.running());
        let epoch = job.epoch;
        let place = |e| AggCommand::Place {
            name: "resnet".into(),
            expect_epoch: e,
            placement: Placement { node: 3, base: 0 },
        };
        assert_eq!(
            t.apply(&place(epoch - 1), 2),
            Ok(false),
            "a stale decision is skipped"
        );
        assert_eq!(t.apply(&place(epoch), 2), Ok(true));
        assert!(t.jobs["resnet"].running());
        assert_eq!(t.jobs["resnet"].epoch, epoch + 1);
    }

    #[test]
    fn quotas_names_and_ranks_are_refused_in_one_sentence() {
        let mut t = AggTables::default();
        // 10M values: 27778 chunks x 2 slots x 3104 B = 164 MiB
        assert_eq!(
            t.apply(&create("big", 2, 10_000_000, false), 1),
            Err(
                "job big needs 165 MiB of aggregator memory, over the 96 MiB a job may take".into()
            )
        );
        assert_eq!(t.apply(&create("a", 2, 5_000_000, false), 1), Ok(true));
        assert_eq!(
            t.apply(&create("b", 2, 5_000_000, false), 1),
            Err("job b needs 83 MiB of aggregator memory and only 18 MiB of the cluster's 100 MiB are free".into())
        );
        assert_eq!(
            t.apply(&create("a", 2, 10, false), 1),
            Err("job a exists already".into())
        );
        let bad_rank = AggCommand::Join {
            name: "a".into(),
            rank: 2,
            addr: addr(1),
        };
        assert_eq!(
            t.apply(&bad_rank, 1),
            Err("job a has ranks 0 to 1, not 2".into())
        );
        join(&mut t, "a", 0);
        let same_port = AggCommand::Join {
            name: "a".into(),
            rank: 1,
            addr: addr(1),
        };
        assert!(t
            .apply(&same_port, 1)
            .unwrap_err()
            .contains("each worker needs its own port"));
        assert_eq!(t.jobs.len(), 1, "refusals change nothing");
    }

    #[test]
    fn past_one_aggregator_s_64_workers_only_a_tree_or_a_ring_takes_a_job() {
        let mut t = AggTables::default();
        let with = |name: &str, workers: u16, g: Grouping| {
            let mut c = create(name, workers, 10, false);
            if let AggCommand::Create { grouping, .. } = &mut c {
                *grouping = g;
            }
            c
        };
        let refusal = |n: u16| {
            format!("a job has 1 to 64 workers on one aggregator, or up to 4032 grouped auto or ring, not {n}")
        };
        assert_eq!(t.apply(&with("f", 65, Grouping::Flat), 1), Err(refusal(65)));
        assert_eq!(t.apply(&with("p", 65, Grouping::Ps), 1), Err(refusal(65)));
        assert_eq!(
            t.apply(&with("a", 4033, Grouping::Auto), 1),
            Err(refusal(4033))
        );
        assert_eq!(t.apply(&with("z", 0, Grouping::Auto), 1), Err(refusal(0)));
        assert_eq!(t.apply(&with("f", 64, Grouping::Flat), 1), Ok(true));
        assert_eq!(t.apply(&with("a", 4032, Grouping::Auto), 1), Ok(true));
        assert_eq!(t.apply(&with("r", 4032, Grouping::Ring), 1), Ok(true));
        assert_eq!(t.jobs.len(), 3);
    }

    #[test]
    fn a_dead_worker_fails_a_job_or_leaves_an_elastic_one() {
        let mut t = AggTables::default();
        t.apply(&create("strict", 2, 10, false), 1).unwrap();
        t.apply(&create("elastic", 3, 10, true), 1).unwrap();
        for r in 0..2 {
            join(&mut t, "strict", r);
        }
        for r in 0..3 {
            join(&mut t, "elastic", r);
        }
        let gone = |name: &str| AggCommand::WorkerGone {
            name: name.into(),
            rank: 1,
            reason: "host 198.18.0.2 is down".into(),
        };
        t.apply(&gone("strict"), 2).unwrap();
        assert_eq!(
            t.jobs["strict"].failed.as_deref(),
            Some("worker rank 1 died (host 198.18.0.2 is down)")
        );
        let before = t.jobs["elastic"].epoch;
        t.apply(&gone("elastic"), 2).unwrap();
        let e = &t.jobs["elastic"];
        assert!(e.failed.is_none() && e.complete());
        assert_eq!(e.epoch, before + 1);
        assert_eq!(
            e.worker_order().iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            [0, 2]
        );
        let rejoin = AggCommand::Join {
            name: "elastic".into(),
            rank: 1,
            addr: addr(9),
        };
        assert!(t.apply(&rejoin, 3).is_err());
    }

    fn tree_job(t: &mut AggTables) -> u32 {
        t.apply(&create("tree", 5, 1000, true), 1).unwrap();
        for r in 0..5 {
            join(t, "tree", r);
        }
        t.jobs["tree"].epoch
    }

    fn cluster(node: NodeId, ranks: &[u16]) -> Cluster {
        Cluster {
            placement: Placement { node, base: 0 },
            ranks: ranks.to_vec(),
        }
    }

    #[test]
    fn a_tree_is_placed_in_one_command_and_every_rank_has_one_seat() {
        let mut t = AggTables::default();
        let epoch = tree_job(&mut t);
        let root = Placement { node: 1, base: 0 };
        let place = |clusters: Vec<Cluster>, e| AggCommand::PlaceTree {
            name: "tree".into(),
            expect_epoch: e,
            root,
            clusters,
        };
        let tree = vec![cluster(2, &[0, 1]), cluster(3, &[3, 4])];
        assert_eq!(t.apply(&place(tree.clone(), epoch), 2), Ok(true));
        let job = &t.jobs["tree"];
        assert!(job.running());
        assert_eq!(job.epoch, epoch + 1);
        let seats = job.seats();
        assert_eq!(seats.len(), 3);
        assert_eq!(
            (seats[0].ranks.clone(), seats[0].children.clone()),
            (vec![2], vec![2, 3])
        );
        assert_eq!((seats[1].up_index, seats[2].up_index), (Some(1), Some(2)));
        assert_eq!(job.seat_of(2), Some((root, 0)));
        assert_eq!(job.seat_of(4), Some((tree[1].placement, 1)));
        assert_eq!(
            t.apply(&place(tree.clone(), epoch + 1), 3),
            Ok(false),
            "the same tree"
        );
        // An elastic job that loses a rank keeps its tree without it; a cluster left empty goes.
        let gone = |rank| AggCommand::WorkerGone {
            name: "tree".into(),
            rank,
            reason: "down".into(),
        };
        t.apply(&gone(3), 4).unwrap();
        t.apply(&gone(4), 5).unwrap();
        assert_eq!(t.jobs["tree"].clusters, vec![cluster(2, &[0, 1])]);
        // A flat placement clears the tree.
        let flat = AggCommand::Place {
            name: "tree".into(),
            expect_epoch: t.jobs["tree"].epoch,
            placement: root,
        };
        assert_eq!(t.apply(&flat, 6), Ok(true));
        assert!(t.jobs["tree"].clusters.is_empty());
        assert_eq!(t.jobs["tree"].seat_of(0), Some((root, 0)));
    }

    #[test]
    fn a_malformed_tree_is_refused_in_one_sentence_and_changes_nothing() {
        let mut t = AggTables::default();
        let epoch = tree_job(&mut t);
        let before = t.clone();
        let root = Placement { node: 1, base: 0 };
        for (clusters, why) in [
            (
                vec![cluster(2, &[])],
                "a cluster of job tree's tree has no rank",
            ),
            (
                vec![cluster(2, &[1, 0])],
                "the ranks of a cluster of job tree must ascend",
            ),
            (
                vec![cluster(1, &[0])],
                "node 1 serves two aggregators of job tree's tree",
            ),
            (
                vec![cluster(2, &[0]), cluster(2, &[1])],
                "node 2 serves two aggregators of job tree's tree",
            ),
            (
                vec![cluster(2, &[0, 9])],
                "rank 9 is not a member of job tree",
            ),
            (
                vec![cluster(2, &[0, 1]), cluster(3, &[1])],
                "rank 1 is in two clusters of job tree",
            ),
        ] {
            let cmd = AggCommand::PlaceTree {
                name: "tree".into(),
                expect_epoch: epoch,
                root,
                clusters,
            };
            assert_eq!(t.apply(&cmd, 2), Err(why.to_string()));
            assert_eq!(t, before);
        }
    }

    #[test]
    fn bandwidth_is_a_moving_average_of_the_measurements() {
        let mut t = AggTables::default();
        let m = |b| AggCommand::Bandwidth {
            from: 4,
            to: 1,
            bytes_per_s: b,
        };
        t.apply(&m(1000), 1).unwrap();
        assert_eq!(t.bandwidth[&4][&1], 1000, "the first is taken as it is");
        t.apply(&m(2000), 2).unwrap();
        assert_eq!(t.bandwidth[&4][&1], 1250);
        t.apply(&m(250), 3).unwrap();
        assert_eq!(t.bandwidth[&4][&1], 1000);
        assert!(t.apply(&m(0), 4).is_err());
        assert_eq!(
            Grouping::parse("tree"),
            Err("grouping \"tree\" is not one of auto, flat, ps, ring".into())
        );
        assert_eq!(Grouping::parse("ring"), Ok(Grouping::Ring));
        assert_eq!(Grouping::parse("ps"), Ok(Grouping::Ps));
    }

    #[test]
    fn a_job_without_a_secret_is_refused() {
        let mut t = AggTables::default();
        let mut cmd = create("s", 2, 10, false);
        if let AggCommand::Create { secret, .. } = &mut cmd {
            *secret = [0; 16];
        }
        assert_eq!(
            t.apply(&cmd, 1),
            Err("job s has no secret for its frame tokens; the proposing node draws one".into())
        );
        assert!(t.jobs.is_empty());
        assert_eq!(t.apply(&create("s", 2, 10, false), 2), Ok(true));
        assert_eq!(t.jobs["s"].secret, [7; 16]);
    }

    #[test]
    fn a_ring_job_runs_once_complete_takes_no_memory_and_is_never_placed() {
        let mut t = AggTables::default();
        let cmd = AggCommand::Create {
            name: "r".into(),
            workers: 2,
            values: 1 << 30,
            dtype: 1,
            elastic: false,
            chunk_values: 360,
            colocate: false,
            quota: QUOTA,
            grouping: Grouping::Ring,
            secret: [7; 16],
        };
        assert_eq!(t.apply(&cmd, 1), Ok(true), "no aggregator memory: no quota");
        join(&mut t, "r", 0);
        assert!(!t.jobs["r"].running());
        join(&mut t, "r", 1);
        assert!(t.jobs["r"].running() && t.jobs["r"].placement.is_none());
        assert_eq!(t.used_bytes(), 0);
        let place = AggCommand::Place {
            name: "r".into(),
            expect_epoch: t.jobs["r"].epoch,
            placement: Placement { node: 1, base: 0 },
        };
        assert_eq!(
            t.apply(&place, 2),
            Err("job r is all-reduced by its workers in a ring: it has no aggregator".into())
        );
    }
}

#[cfg(test)]
mod seat_tests {
    use super::*;

    /// A job of every rank (65,535 workers), half of them in 255 clusters of 128: its seats
    /// hold each rank once, in ascending order within each seat, and a rank's worker index is
    /// its position in its seat. Computing them is linear in the members (a sorted set), so
    /// this takes milliseconds; the quadratic scan it replaced took 8.7 s here in
    /// a debug build, which the bound below catches without being a benchmark.
    #[test]
    fn the_seats_of_a_very_large_job_are_right_and_computed_without_a_quadratic_scan() {
        let at = |r: u16| SocketAddrV4::new(Ipv4Addr::new(198, 18, (r >> 8) as u8, r as u8), 1);
        let members: BTreeMap<u16, SocketAddrV4> = (0..u16::MAX).map(|r| (r, at(r))).collect();
        let clusters: Vec<Cluster> = (0..255u16)
            .map(|k| Cluster {
                placement: Placement {
                    node: u64::from(k) + 2,
                    base: 0,
                },
                ranks: (0..128u16).map(|i| 2 * (k * 128 + i) + 1).collect(),
            })
            .collect();
        let job = AggJob {
            id: 1,
            name: "huge".into(),
            workers: u16::MAX,
            values: 1000,
            dtype: 1,
            elastic: false,
            chunk_values: 360,
            colocate: false,
            epoch: 1,
            members,
            gone: Vec::new(),
            placement: Some(Placement { node: 1, base: 0 }),
            failed: None,
            grouping: Grouping::Auto,
            clusters,
            secret: [7; 16],
        };
        let started = std::time::Instant::now();
        let seats = job.seats();
        let index = job.seat_index();
        let took = started.elapsed();
        assert_eq!(seats.len(), 256);
        let direct = &seats[0];
        assert_eq!(direct.ranks.len(), usize::from(u16::MAX) - 255 * 128);
        assert_eq!(direct.children.len(), 255);
        assert!(direct.ranks.windows(2).all(|w| w[0] < w[1]));
        let mut seen: Vec<u16> = seats.iter().flat_map(|s| s.ranks.clone()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..u16::MAX).collect::<Vec<_>>(), "each rank once");
        assert_eq!(index.len(), usize::from(u16::MAX));
        assert_eq!(index[&3], (Placement { node: 2, base: 0 }, 1));
        assert_eq!(job.seat_of(3), Some(index[&3]));
        assert_eq!(index[&0], (Placement { node: 1, base: 0 }, 0));
        assert_eq!(
            seats[255].up_index,
            u16::try_from(direct.ranks.len() + 254).ok()
        );
        assert!(
            took < std::time::Duration::from_secs(2),
            "seats of 65,535 workers took {took:?}"
        );
    }
}
