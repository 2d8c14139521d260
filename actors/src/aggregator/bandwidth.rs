//! Which aggregating hosts this node should measure its bandwidth to now, pure: the shell
//! (`node/src/agg_bandwidth.rs`) probes them one at a time and proposes what it measured, which
//! the tables smooth (`AggCommand::Bandwidth`).
//!
//! A node measures only while it runs a worker of a job whose grouping needs bandwidths (auto,
//! ps), and only to the hosts that could aggregate such a job (not another worker's host,
//! unless the job allows it): a cluster with no such job sends no probe traffic. Each host is measured once at once
//! (a new job, a new host) and again every `every_ms`, so the figures follow the links while the
//! job runs. Probes from several nodes to one host share its link and each sees less than the
//! link alone; to keep that rare, a node goes through the hosts starting from an offset of its
//! own id, so that nodes measuring at the same moment mostly measure different hosts.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use yard_raft_store::aggregation::{AggTables, Grouping};
use yard_raft_store::NodeId;

/// The hosts `me` (at `my_ip`) should probe at `now_ms`, in order, given when it last probed
/// each (`last`, ms on the same clock).
pub fn due(
    tables: &AggTables,
    me: NodeId,
    my_ip: Ipv4Addr,
    last: &BTreeMap<NodeId, u64>,
    now_ms: u64,
    every_ms: u64,
) -> Vec<NodeId> {
    // The grouped jobs with a worker here, and the hosts that could aggregate each: not a
    // worker's own host unless the job allows it (as the leader's candidates).
    let jobs: Vec<_> = tables
        .jobs
        .values()
        .filter(|j| {
            j.failed.is_none()
                && matches!(j.grouping, Grouping::Auto | Grouping::Ps)
                && j.members.values().any(|a| *a.ip() == my_ip)
        })
        .collect();
    let hosts: Vec<NodeId> = tables
        .hosts
        .iter()
        .filter(|(n, h)| **n != me && h.ip != my_ip)
        .filter(|(_, h)| {
            jobs.iter()
                .any(|j| j.colocate || j.members.values().all(|a| *a.ip() != h.ip))
        })
        .map(|(n, _)| *n)
        .collect();
    if hosts.is_empty() {
        return Vec::new();
    }
    let start = usize::try_from(me % hosts.len() as u64).unwrap_or(0);
    hosts
        .iter()
        .cycle()
        .skip(start)
        .take(hosts.len())
        .copied()
        .filter(|h| {
            let measured = tables.bandwidth.get(&me).is_some_and(|m| m.contains_key(h));
            let stale = last
                .get(h)
                .is_none_or(|t| now_ms.saturating_sub(*t) >= every_ms);
            !measured || stale
        })
        .filter(|h| {
            last.get(h)
                .is_none_or(|t| now_ms.saturating_sub(*t) >= every_ms.min(1_000))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddrV4;
    use yard_raft_store::aggregation::{AggCommand, Quota};

    fn ip(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, i)
    }

    fn tables(grouping: Grouping) -> AggTables {
        let mut t = AggTables::default();
        for node in 1..=3u8 {
            let host = AggCommand::Host {
                node: u64::from(node),
                ip: ip(node),
                slots: 100,
                cpu_millis: 1000,
            };
            t.apply(&host, 1).unwrap();
        }
        let create = AggCommand::Create {
            name: "j".into(),
            workers: 1,
            values: 10,
            dtype: 0,
            elastic: false,
            chunk_values: 10,
            colocate: false,
            quota: Quota {
                job_bytes: 1 << 30,
                cluster_bytes: 1 << 30,
            },
            grouping,
        };
        t.apply(&create, 1).unwrap();
        let join = AggCommand::Join {
            name: "j".into(),
            rank: 0,
            addr: SocketAddrV4::new(ip(5), 40000),
        };
        t.apply(&join, 1).unwrap();
        t
    }

    #[test]
    fn only_a_node_with_a_worker_of_a_grouped_job_probes_every_host_but_itself() {
        let t = tables(Grouping::Auto);
        let none = BTreeMap::new();
        assert_eq!(
            due(&t, 5, ip(5), &none, 0, 30_000),
            [3, 1, 2],
            "rotated by id"
        );
        assert!(
            due(&t, 4, ip(4), &none, 0, 30_000).is_empty(),
            "no worker here"
        );
        assert!(due(&tables(Grouping::Flat), 5, ip(5), &none, 0, 30_000).is_empty());
        // A host that runs a worker of the job is no candidate: not measured.
        let mut t2 = tables(Grouping::Auto);
        t2.jobs
            .get_mut("j")
            .unwrap()
            .members
            .insert(1, SocketAddrV4::new(ip(3), 40000));
        assert_eq!(
            due(&t2, 5, ip(5), &none, 0, 30_000),
            [2, 1],
            "rotated by id"
        );
        // An aggregating host with a worker does not measure itself.
        assert_eq!(due(&t, 2, ip(5), &none, 0, 30_000), [1, 3]);
    }

    #[test]
    fn a_measured_host_is_probed_again_only_when_its_figure_is_old() {
        let mut t = tables(Grouping::Ps);
        for to in 1..=3 {
            let m = AggCommand::Bandwidth {
                from: 5,
                to,
                bytes_per_s: 1000,
            };
            t.apply(&m, 2).unwrap();
        }
        let last: BTreeMap<NodeId, u64> = [(1, 10_000), (2, 10_000), (3, 0)].into();
        assert_eq!(due(&t, 5, ip(5), &last, 20_000, 15_000), [3]);
        assert_eq!(due(&t, 5, ip(5), &last, 26_000, 15_000), [3, 1, 2]);
        // Probed but not in the tables yet (the proposal failed): again after a second.
        let mut fresh = tables(Grouping::Auto);
        fresh.bandwidth.clear();
        let just: BTreeMap<NodeId, u64> = [(1, 20_000)].into();
        assert_eq!(due(&fresh, 5, ip(5), &just, 20_500, 30_000), [3, 2]);
        assert_eq!(due(&fresh, 5, ip(5), &just, 21_000, 30_000), [3, 1, 2]);
    }
}
