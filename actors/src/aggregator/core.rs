//! What one host serves: the running jobs placed on it (as their only aggregator, or as the
//! root or a cluster aggregator of their tree), as `yard_agg` table entries, and the effects
//! that bring the program's tables from what they hold to that.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use yard_agg::wire::{Dtype, Geometry};
use yard_agg::worker::Membership;
use yard_ebpf::{AggJobEntry, AggParent};
use yard_raft_store::aggregation::{AggJob, AggTables, Grouping, Seat};
use yard_raft_store::NodeId;

use super::auth;

/// A change to make to the program's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Serve this job (new, or a new epoch, membership or slot range).
    Set(AggJobEntry),
    /// Stop serving the job with this id.
    Remove(u32),
}

/// The entry the program needs for `seat` of `job`, summed on this host at `self_ip`: the
/// seat's ranks in worker-index order, then (the root of a tree) its clusters' hosts; a cluster
/// aggregator's parent with its MAC unknown (the shell resolves it). `None` if an aggregator
/// the seat needs is no longer registered (the leader regroups the job).
pub fn entry(
    tables: &AggTables,
    job: &AggJob,
    seat: &Seat,
    self_ip: Ipv4Addr,
) -> Option<AggJobEntry> {
    let agg_addr = |node: &NodeId| {
        tables
            .hosts
            .get(node)
            .map(|h| SocketAddrV4::new(h.ip, yard_agg::wire::PORT))
    };
    let mut members: Vec<SocketAddrV4> = seat
        .ranks
        .iter()
        .map(|r| job.members.get(r).copied())
        .collect::<Option<_>>()?;
    for child in &seat.children {
        members.push(agg_addr(child)?);
    }
    let me = seat.placement.node;
    let tokens = (0..members.len())
        .map(|i| auth::data_token(job, me, u16::try_from(i).unwrap_or(u16::MAX)))
        .collect();
    let parent = match seat.up_index {
        Some(worker) => {
            let root = job.placement?.node;
            Some(AggParent {
                addr: agg_addr(&root)?,
                worker,
                mac: [0; 6],
                token: auth::data_token(job, root, worker),
                result_token: auth::result_token(job, root),
            })
        }
        None => None,
    };
    Some(AggJobEntry {
        id: job.id,
        epoch: job.epoch,
        base: seat.placement.base,
        geometry: Geometry {
            values: job.values,
            chunk_values: job.chunk_values,
        },
        dtype: Dtype::from_raw(job.dtype).unwrap_or(Dtype::I32),
        members,
        tokens,
        result_token: auth::result_token(job, me),
        self_ip,
        parent,
    })
}

/// The jobs `me` must serve, by id: running jobs with an aggregator on it. A host not
/// registered as an aggregator serves nothing.
pub fn desired(tables: &AggTables, me: NodeId) -> BTreeMap<u32, AggJobEntry> {
    let Some(host) = tables.hosts.get(&me) else {
        return BTreeMap::new();
    };
    tables
        .jobs
        .values()
        .filter(|j| j.running())
        .filter_map(|j| {
            let seat = j.seats().into_iter().find(|s| s.placement.node == me)?;
            Some((j.id, entry(tables, j, &seat, host.ip)?))
        })
        .collect()
}

/// What a worker of rank `rank` must know of its job: where and as whom it sums, or why it
/// cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerView {
    /// Not every rank has joined yet, or the job has no aggregator yet.
    Waiting,
    /// The job runs: this worker's membership in the current epoch.
    Running(Membership),
    /// The job runs as a ring (`--grouping ring`): no aggregator; the workers all-reduce
    /// among themselves.
    Ring(RingMembership),
    /// The job failed (a worker died), or this rank is no longer in it.
    Failed(String),
    /// There is no such job (deleted).
    Gone,
}

/// A ring job's membership: the job, its epoch, and the ranks in it (ascending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingMembership {
    pub job: u32,
    pub epoch: u32,
    pub rank: u16,
    pub ranks: Vec<u16>,
}

/// Rank `rank`'s view of job `name` in `tables`.
pub fn worker_view(tables: &AggTables, name: &str, rank: u16) -> WorkerView {
    let Some(job) = tables.jobs.get(name) else {
        return WorkerView::Gone;
    };
    if let Some(why) = &job.failed {
        return WorkerView::Failed(format!("job {name} failed: {why}"));
    }
    if job.gone.contains(&rank) {
        return WorkerView::Failed(format!("rank {rank} was removed from job {name}"));
    }
    if job.grouping == Grouping::Ring {
        if !job.running() || !job.members.contains_key(&rank) {
            return WorkerView::Waiting;
        }
        return WorkerView::Ring(RingMembership {
            job: job.id,
            epoch: job.epoch,
            rank,
            ranks: job.members.keys().copied().collect(),
        });
    }
    let ips = aggregator_ips(tables, job);
    membership(job, &ips, rank).map_or(WorkerView::Waiting, WorkerView::Running)
}

/// The addresses of `job`'s aggregators (the root and every cluster's host) that are registered.
pub fn aggregator_ips(tables: &AggTables, job: &AggJob) -> BTreeMap<NodeId, Ipv4Addr> {
    job.seats()
        .iter()
        .filter_map(|s| {
            let node = s.placement.node;
            Some((node, tables.hosts.get(&node)?.ip))
        })
        .collect()
}

/// What rank `rank` of `job` sums as: its aggregator (the job's, or its cluster's in a tree,
/// at its address in `ips`) and its index among the ranks that send there, if the job runs and
/// the rank is a member. `workers` is the job's N whichever aggregator sums the rank: every
/// worker scales for the whole job, so partial sums fit too. The one place a membership is made
/// from the tables: the agent pushes it, and an operator's worker (`yard agg job show`) reads
/// it from the job's row.
pub fn membership(job: &AggJob, ips: &BTreeMap<NodeId, Ipv4Addr>, rank: u16) -> Option<Membership> {
    if !job.running() {
        return None;
    }
    let (placement, worker) = job.seat_of(rank)?;
    let aggregator = SocketAddrV4::new(*ips.get(&placement.node)?, yard_agg::wire::PORT);
    Some(Membership {
        job: job.id,
        epoch: job.epoch,
        worker,
        workers: u16::try_from(job.members.len()).ok()?,
        aggregator,
        geometry: Geometry {
            values: job.values,
            chunk_values: job.chunk_values,
        },
        dtype: Dtype::from_raw(job.dtype)?,
        token: auth::data_token(job, placement.node, worker),
        result_token: auth::result_token(job, placement.node),
    })
}

/// How long to wait before trying again after `failures` failed attempts in a row: 100 ms,
/// doubling, at most 5 s. The shell's table writes use it (a failed write is retried on its
/// own, not only when the tables next change, which may be never for a running job), and so
/// does the node agent's report of a worker gone.
pub fn retry_after(failures: u32) -> std::time::Duration {
    let ms = 100u64.saturating_mul(1 << failures.saturating_sub(1).min(6));
    std::time::Duration::from_millis(ms.min(5_000))
}

/// The parents' MACs to use: for each parent in `parents`, the kernel's entry if it has a
/// complete one (so a parent whose MAC changed, a replaced host or NIC, is followed), else the
/// one last resolved (the partial sums bypass the neighbour table, so the kernel's entry
/// comes and goes while the MAC stays right). Addresses no longer a parent are forgotten: if
/// one becomes a parent again it is resolved afresh.
pub fn parent_macs(
    cached: &BTreeMap<Ipv4Addr, [u8; 6]>,
    parents: &std::collections::BTreeSet<Ipv4Addr>,
    kernel: &BTreeMap<Ipv4Addr, [u8; 6]>,
) -> BTreeMap<Ipv4Addr, [u8; 6]> {
    parents
        .iter()
        .filter_map(|ip| Some((*ip, *kernel.get(ip).or_else(|| cached.get(ip))?)))
        .collect()
}

/// The jobs whose per-job counters the kernel holds (`counted`) that this host no longer
/// serves: their counters are to be deleted, or the table fills over a host's life and new
/// jobs' counters are silently missing.
pub fn stale_counters(
    counted: &std::collections::BTreeSet<u32>,
    served: &BTreeMap<u32, AggJobEntry>,
) -> Vec<u32> {
    counted
        .iter()
        .filter(|id| !served.contains_key(id))
        .copied()
        .collect()
}

/// Effects from `current` to `wanted`: removals first (they free slot ranges a new job may
/// have been given), then the jobs that are new or changed.
pub fn diff(
    current: &BTreeMap<u32, AggJobEntry>,
    wanted: &BTreeMap<u32, AggJobEntry>,
) -> Vec<Effect> {
    let mut out: Vec<Effect> = current
        .keys()
        .filter(|id| !wanted.contains_key(id))
        .map(|id| Effect::Remove(*id))
        .collect();
    out.extend(
        wanted
            .iter()
            .filter(|(id, e)| current.get(id) != Some(e))
            .map(|(_, e)| Effect::Set(e.clone())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use yard_raft_store::aggregation::{AggCommand, Placement, Quota};

    /// Creates job `name` of two workers with `grouping`, and joins ranks `0..joined` from
    /// 198.18.0.10.
    fn joined_job(t: &mut AggTables, name: &str, grouping: Grouping, joined: u16) {
        let quota = Quota {
            job_bytes: 1 << 30,
            cluster_bytes: 1 << 30,
        };
        let create = AggCommand::Create {
            name: name.into(),
            workers: 2,
            values: 1000,
            dtype: 1,
            elastic: false,
            chunk_values: 360,
            colocate: false,
            quota,
            grouping,
            secret: [7; 16],
        };
        t.apply(&create, 1).unwrap();
        for rank in 0..joined {
            let addr = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000 + rank);
            let name = name.to_string();
            t.apply(&AggCommand::Join { name, rank, addr }, 1).unwrap();
        }
    }

    fn tables() -> AggTables {
        let mut t = AggTables::default();
        for name in ["a", "b"] {
            joined_job(&mut t, name, Grouping::Flat, 2);
        }
        t.apply(
            &AggCommand::Host {
                node: 1,
                ip: Ipv4Addr::new(198, 18, 0, 1),
                slots: 100,
                cpu_millis: 1000,
            },
            1,
        )
        .unwrap();
        t
    }

    fn place(t: &mut AggTables, name: &str, node: NodeId, base: u32) {
        let expect_epoch = t.jobs[name].epoch;
        let name = name.into();
        let placement = Placement { node, base };
        t.apply(
            &AggCommand::Place {
                name,
                expect_epoch,
                placement,
            },
            2,
        )
        .unwrap();
    }

    #[test]
    fn a_host_serves_exactly_the_running_jobs_placed_on_it() {
        let mut t = tables();
        assert!(desired(&t, 1).is_empty(), "nothing placed yet");
        place(&mut t, "a", 1, 0);
        place(&mut t, "b", 2, 0);
        let d = desired(&t, 1);
        assert_eq!(d.keys().copied().collect::<Vec<_>>(), [t.jobs["a"].id]);
        let e = &d[&t.jobs["a"].id];
        assert_eq!(e.epoch, t.jobs["a"].epoch);
        assert_eq!(e.members.len(), 2);
        assert_eq!(e.self_ip, Ipv4Addr::new(198, 18, 0, 1));
        assert!(
            desired(&t, 3).is_empty(),
            "an unregistered host serves nothing"
        );
    }

    #[test]
    fn a_worker_sees_its_index_and_aggregator_once_the_job_runs() {
        let mut t = tables();
        assert_eq!(worker_view(&t, "a", 1), WorkerView::Waiting);
        place(&mut t, "a", 1, 0);
        let WorkerView::Running(Membership {
            worker,
            workers,
            aggregator,
            epoch,
            ..
        }) = worker_view(&t, "a", 1)
        else {
            panic!("not running");
        };
        assert_eq!((worker, workers, epoch), (1, 2, t.jobs["a"].epoch));
        assert_eq!(
            aggregator,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 7481)
        );
        assert_eq!(worker_view(&t, "nope", 0), WorkerView::Gone);
        t.apply(
            &AggCommand::WorkerGone {
                name: "a".into(),
                rank: 0,
                reason: "it exited".into(),
            },
            3,
        )
        .unwrap();
        assert_eq!(
            worker_view(&t, "a", 1),
            WorkerView::Failed("job a failed: worker rank 0 died (it exited)".into())
        );
    }

    #[test]
    fn counters_of_jobs_no_longer_served_are_stale() {
        let mut t = tables();
        place(&mut t, "a", 1, 0);
        let served = desired(&t, 1);
        let a = t.jobs["a"].id;
        let counted = [a, 77, 78].into_iter().collect();
        assert_eq!(stale_counters(&counted, &served), [77, 78]);
        assert!(stale_counters(&[a].into_iter().collect(), &served).is_empty());
    }

    #[test]
    fn a_failed_write_is_retried_soon_then_less_often() {
        let ms = |n| retry_after(n).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3)], [100, 100, 200, 400]);
        assert_eq!(ms(7), 5_000);
        assert_eq!(ms(u32::MAX), 5_000, "capped, never overflows");
    }

    #[test]
    fn a_parent_mac_follows_the_kernel_is_kept_while_it_has_none_and_is_forgotten_unused() {
        let (a, b, c) = (
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            Ipv4Addr::new(198, 18, 0, 3),
        );
        let cached = BTreeMap::from([(a, [2, 0, 0, 0, 0, 1]), (b, [2, 0, 0, 0, 0, 2])]);
        let kernel = BTreeMap::from([(a, [2, 0, 0, 0, 0, 9]), (c, [2, 0, 0, 0, 0, 3])]);
        let parents = [a, b].into_iter().collect();
        assert_eq!(
            parent_macs(&cached, &parents, &kernel),
            BTreeMap::from([
                (a, [2, 0, 0, 0, 0, 9]), // the kernel's new MAC replaces the cached one
                (b, [2, 0, 0, 0, 0, 2]), // no kernel entry: the cached MAC stays
            ])
        );
        let only_c = [c].into_iter().collect();
        assert_eq!(
            parent_macs(&cached, &only_c, &BTreeMap::new()),
            BTreeMap::new(),
            "a and b are no longer parents: forgotten; c is not resolved yet"
        );
    }

    #[test]
    fn a_move_removes_here_and_a_new_epoch_re_sets() {
        let mut t = tables();
        place(&mut t, "a", 1, 0);
        let before = desired(&t, 1);
        assert_eq!(diff(&BTreeMap::new(), &before).len(), 1);
        assert!(diff(&before, &before).is_empty());
        place(&mut t, "a", 2, 0);
        let after = desired(&t, 1);
        assert_eq!(diff(&before, &after), [Effect::Remove(t.jobs["a"].id)]);
    }

    #[test]
    fn each_aggregator_of_a_tree_serves_its_cluster_and_workers_send_to_theirs() {
        use yard_raft_store::aggregation::Cluster;
        let mut t = tables();
        for (node, last) in [(2u64, 2u8), (3, 3)] {
            let host = AggCommand::Host {
                node,
                ip: Ipv4Addr::new(198, 18, 0, last),
                slots: 100,
                cpu_millis: 1000,
            };
            t.apply(&host, 1).unwrap();
        }
        let expect_epoch = t.jobs["a"].epoch;
        t.apply(
            &AggCommand::PlaceTree {
                name: "a".into(),
                expect_epoch,
                root: Placement { node: 1, base: 0 },
                clusters: vec![Cluster {
                    placement: Placement { node: 3, base: 10 },
                    ranks: vec![1],
                }],
            },
            2,
        )
        .unwrap();
        let job = &t.jobs["a"];
        let agg = |i| SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, i), 7481);
        // The root: rank 0, then the cluster's host; no parent.
        let root = &desired(&t, 1)[&job.id];
        assert_eq!(root.members, [job.members[&0], agg(3)]);
        assert_eq!(root.parent, None);
        // The cluster aggregator: rank 1, and the root as its parent, as member 1 there.
        let leaf = &desired(&t, 3)[&job.id];
        assert_eq!(
            (leaf.members.clone(), leaf.base),
            (vec![job.members[&1]], 10)
        );
        let parent = leaf.parent.unwrap();
        assert_eq!(
            (parent.addr, parent.worker, parent.mac),
            (agg(1), 1, [0; 6])
        );
        assert!(desired(&t, 2).is_empty(), "not in the tree");
        // Rank 1 sends to its cluster as its worker 0, scaled for both workers.
        let WorkerView::Running(m) = worker_view(&t, "a", 1) else {
            panic!("not running");
        };
        assert_eq!((m.aggregator, m.worker, m.workers), (agg(3), 0, 2));
        // Each sender's token is the one its aggregator expects, and each result token the one
        // its receivers check: rank 1 at the cluster, the cluster at the root.
        assert_eq!(
            (m.token, m.result_token),
            (leaf.tokens[0], leaf.result_token)
        );
        assert_eq!(
            (parent.token, parent.result_token),
            (root.tokens[1], root.result_token)
        );
        let WorkerView::Running(m) = worker_view(&t, "a", 0) else {
            panic!("not running");
        };
        assert_eq!((m.aggregator, m.worker, m.workers), (agg(1), 0, 2));
        assert_eq!(
            (m.token, m.result_token),
            (root.tokens[0], root.result_token)
        );
        // Distinct everywhere: no member's token opens another's door or makes a result.
        let all: std::collections::BTreeSet<u32> = [
            root.tokens[0],
            root.tokens[1],
            root.result_token,
            leaf.tokens[0],
            leaf.result_token,
        ]
        .into();
        assert_eq!(all.len(), 5);
    }

    #[test]
    fn a_ring_job_s_workers_see_the_ring_and_no_host_serves_it() {
        let mut t = tables();
        joined_job(&mut t, "r", Grouping::Ring, 1);
        assert_eq!(
            worker_view(&t, "r", 0),
            WorkerView::Waiting,
            "rank 1 has not joined"
        );
        let addr = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 41001);
        t.apply(
            &AggCommand::Join {
                name: "r".into(),
                rank: 1,
                addr,
            },
            1,
        )
        .unwrap();
        let WorkerView::Ring(r) = worker_view(&t, "r", 1) else {
            panic!("not a ring");
        };
        assert_eq!((r.job, r.rank, r.ranks), (t.jobs["r"].id, 1, vec![0, 1]));
        assert!(desired(&t, 1).values().all(|e| e.id != t.jobs["r"].id));
    }
}
