//! Which hosts may aggregate a job, and which bandwidth figure the grouping uses for a worker
//! and a host: one rule for the leader's placement of flat jobs ([`super::placement`]), its
//! trees ([`super::tree`]) and every node's bandwidth probes ([`super::bandwidth::due`]).
//!
//! Each of the three used to carry its own copy of the rule, and they drifted: a `--colocate`
//! job with a worker on an aggregating host made the tree ask for the pair worker's node → its
//! own host, which the probes never measure (a node does not probe itself), so the job waited
//! for that figure for ever and was never grouped. Here the pair is local instead: the
//! worker's frames reach the aggregator without crossing a link, so no probe is needed and the
//! host's summing capacity stands for the figure.
//!
//! Reachability is not part of the rule: it is the leader's view of the moment (the probes
//! have none), and the leader applies it on top.

use std::net::Ipv4Addr;

use yard_raft_store::aggregation::{AggHost, AggJob, AggTables};
use yard_raft_store::NodeId;

/// The host `node` if it may aggregate `job`, else why not (one sentence fragment, as the
/// placement's waiting reasons list them): it is registered as an aggregating host (a removed
/// or disabled host is not), and it is not the host of one of the job's workers unless the
/// job allows it (`--colocate`), because summing where a worker runs puts the job's whole
/// traffic on that worker's link.
pub fn host_for<'t>(
    tables: &'t AggTables,
    job: &AggJob,
    node: NodeId,
) -> Result<&'t AggHost, String> {
    let host = tables
        .hosts
        .get(&node)
        .ok_or_else(|| format!("node {node} does not aggregate"))?;
    if !job.colocate && job.members.values().any(|a| *a.ip() == host.ip) {
        return Err(format!("node {node} runs a worker"));
    }
    Ok(host)
}

/// Whether `node` may aggregate `job` ([`host_for`]).
pub fn may_aggregate(tables: &AggTables, job: &AggJob, node: NodeId) -> bool {
    host_for(tables, job, node).is_ok()
}

/// Whether a worker sending from `worker_ip` reaches `host` without crossing a link: the pair
/// is never probed, and [`figure`] gives it the host's summing capacity.
pub fn local(worker_ip: Ipv4Addr, host: &AggHost) -> bool {
    worker_ip == host.ip
}

/// Bytes/s one core of an aggregating host sums, as the grouping counts a host's CPU budget.
/// Measured: the program's add path takes 452 ns for a 360-value (1440-byte) chunk under
/// BPF_PROG_TEST_RUN (`agg-paths`, median of 5), about 3.2 GB/s; the receive path around it
/// costs about as much again, so a core is given half of that.
pub const SUM_BYTES_PER_CORE: f64 = 1.5e9;

/// The bytes/s a host's CPU budget sums (`aggregator.cpu_cores` at [`SUM_BYTES_PER_CORE`]).
pub fn cpu_bytes_per_s(host: &AggHost) -> f64 {
    f64::from(host.cpu_millis) / 1000.0 * SUM_BYTES_PER_CORE
}

/// The bandwidth figure, bytes/s, the grouping uses from a worker on node `from` (sending from
/// `worker_ip`) to aggregating host `to`: its summing capacity for a local pair ([`local`]),
/// else the measured figure, `None` until `from` has measured it.
pub fn figure(tables: &AggTables, from: NodeId, worker_ip: Ipv4Addr, to: NodeId) -> Option<f64> {
    let host = tables.hosts.get(&to)?;
    if local(worker_ip, host) {
        return Some(cpu_bytes_per_s(host));
    }
    tables
        .bandwidth
        .get(&from)
        .and_then(|m| m.get(&to))
        .map(|b| *b as f64)
}

/// Whether node `me` (at `my_ip`) must probe its bandwidth to host `to` for `job`: `to` may
/// aggregate the job, and the pair is not local. [`figure`] is `Some` for every pair the
/// grouping asks about once each pair this says must be probed has been: the contract the
/// tests below hold the three users to.
pub fn must_probe(tables: &AggTables, job: &AggJob, my_ip: Ipv4Addr, to: NodeId) -> bool {
    host_for(tables, job, to).is_ok_and(|h| !local(my_ip, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::bandwidth::due;
    use crate::aggregator::placement::{decide, ClusterView};
    use crate::aggregator::tree::{decide_tree, TreeDecision};
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::SocketAddrV4;
    use yard_raft_store::aggregation::{AggCommand, Grouping, Quota};

    fn ip(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, i)
    }

    /// Hosts 1..=3 aggregate; one worker on each of nodes `workers` joins grouped job "j".
    fn world(workers: &[u8], colocate: bool, grouping: Grouping) -> AggTables {
        let mut t = AggTables::default();
        for node in 1..=3u8 {
            let host = AggCommand::Host {
                node: u64::from(node),
                ip: ip(node),
                slots: 1000,
                cpu_millis: 1000,
            };
            t.apply(&host, 1).unwrap();
        }
        let create = AggCommand::Create {
            name: "j".into(),
            workers: u16::try_from(workers.len()).unwrap(),
            values: 1000,
            dtype: 0,
            elastic: false,
            chunk_values: 100,
            colocate,
            quota: Quota {
                job_bytes: 1 << 40,
                cluster_bytes: 1 << 40,
            },
            grouping,
            secret: [7; 16],
        };
        t.apply(&create, 1).unwrap();
        for (rank, node) in workers.iter().enumerate() {
            let join = AggCommand::Join {
                name: "j".into(),
                rank: u16::try_from(rank).unwrap(),
                addr: SocketAddrV4::new(ip(*node), 40000 + u16::try_from(rank).unwrap()),
            };
            t.apply(&join, 1).unwrap();
        }
        t
    }

    fn view() -> ClusterView {
        ClusterView {
            node_ips: (1..=5u8).map(|i| (u64::from(i), ip(i))).collect(),
            ..ClusterView::default()
        }
    }

    /// Every worker node runs its probes ([`due`]) until none is due, each measurement
    /// committed as the tables would (`AggCommand::Bandwidth`); returns the pairs probed.
    fn probe_until_settled(t: &mut AggTables, workers: &[u8]) -> BTreeSet<(NodeId, NodeId)> {
        let mut probed = BTreeSet::new();
        for _ in 0..4 {
            let mut any = false;
            for node in workers.iter().copied().collect::<BTreeSet<_>>() {
                let me = u64::from(node);
                for to in due(t, me, ip(node), &BTreeMap::new(), 0, 30_000) {
                    any = true;
                    probed.insert((me, to));
                    let m = AggCommand::Bandwidth {
                        from: me,
                        to,
                        bytes_per_s: 100_000_000 + 1_000_000 * to,
                    };
                    t.apply(&m, 2).unwrap();
                }
            }
            if !any {
                break;
            }
        }
        probed
    }

    /// The contract: once every node has probed what it is told to, the tree has a figure for
    /// every pair it asks about, for colocated jobs too (workers on aggregating hosts 1 and 2,
    /// and on plain node 4), and the hosts it places on are the ones the rule allows.
    #[test]
    fn what_the_probes_measure_is_what_the_tree_asks_for_colocated_or_not() {
        for colocate in [true, false] {
            for grouping in [Grouping::Auto, Grouping::Ps] {
                let workers = [1u8, 2, 4, 4];
                let mut t = world(&workers, colocate, grouping);
                let probed = probe_until_settled(&mut t, &workers);
                let job = t.jobs["j"].clone();
                // Nobody probes itself, nor a host the job may not use.
                for (from, to) in &probed {
                    assert_ne!(from, to, "colocate {colocate}: a node probed itself");
                    assert!(
                        may_aggregate(&t, &job, *to),
                        "probed an ineligible host {to}"
                    );
                }
                let what = format!("colocate {colocate}, {grouping:?}");
                // Every pair the grouping can ask about has a figure.
                for addr in job.members.values() {
                    let from = u64::from(addr.ip().octets()[3]);
                    for to in t.hosts.keys().filter(|n| may_aggregate(&t, &job, **n)) {
                        assert!(
                            figure(&t, from, *addr.ip(), *to).is_some(),
                            "{what}: no figure from node {from} to host {to}"
                        );
                    }
                }
                match decide_tree(&t, &view(), &job, &BTreeMap::new()) {
                    TreeDecision::Place { root, clusters, .. } => {
                        for p in std::iter::once(root).chain(clusters.iter().map(|c| c.placement)) {
                            assert!(
                                may_aggregate(&t, &job, p.node),
                                "{what}: placed on {}",
                                p.node
                            );
                        }
                    }
                    other => panic!("{what}: the tree was not decided: {other:?}"),
                }
                // Without colocation only host 3 may aggregate; with it, all three.
                let allowed: Vec<NodeId> = t
                    .hosts
                    .keys()
                    .copied()
                    .filter(|n| may_aggregate(&t, &job, *n))
                    .collect();
                assert_eq!(
                    allowed,
                    if colocate { vec![1, 2, 3] } else { vec![3] },
                    "{what}"
                );
            }
        }
    }

    /// Flat placement answers from the same rule, reasons included.
    #[test]
    fn flat_placement_uses_the_rule_and_says_why_a_host_is_refused() {
        let mut t = world(&[1, 2], false, Grouping::Flat);
        t.hosts.remove(&3);
        let d = decide(&t, &view());
        assert!(d.commands.is_empty());
        assert_eq!(
            d.waiting[0].1,
            "no aggregator can take it: node 1 runs a worker, node 2 runs a worker"
        );
        let job = t.jobs["j"].clone();
        assert_eq!(
            host_for(&t, &job, 3).unwrap_err(),
            "node 3 does not aggregate"
        );
    }
}
