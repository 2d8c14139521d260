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

//!
//! While a job runs, the aggregator's own counters update the figures too
//! ([`counter_figures`]): the program times each member's frames (`struct agg_peer` in
//! `yard.h`), and the rate they arrived at while the member was sending is the bandwidth from
//! the member's node to this host, as the job itself uses it.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use yard_raft_store::aggregation::{AggTables, Grouping};
use yard_raft_store::NodeId;

/// One member's cumulative arrival timing at this host's aggregator: the gaps between its
/// frames that came in bursts, and those frames' bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reading {
    pub job: u32,
    pub addr: SocketAddrV4,
    pub busy_ns: u64,
    pub bytes: u64,
}

/// `bytes` over `ns` in bytes/s (0 for no time at all).
pub fn bytes_per_s(bytes: u64, ns: u64) -> u64 {
    if ns == 0 {
        return 0;
    }
    u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(ns)).unwrap_or(u64::MAX)
}

/// The least sending time between two readings that gives a figure: shorter stretches (a job
/// idle, a few resends) say little about the link.
pub const MIN_BUSY_NS: u64 = 20_000_000;

/// The figures this host (`me`) measured from its aggregator's counters between two readings:
/// node → bytes/s, for the nodes of the workers of running grouped jobs (auto, ps) it
/// aggregates, not for a cluster aggregator sending partial sums up, nor for counters that
/// went back (the member was rewritten with a new address). A node with several workers here
/// gets the fastest one's figure: like the probe, it is what one stream from the node gets.
///
/// Only figures above the tables' are given: a worker's frames share this host's link with
/// every other member's, so the rate they arrived at is what the pair achieved at least, not
/// what it could. Taken as the pair's bandwidth, the share would make the host that serves
/// the most workers look slow and regroup the job away from it, and back once another host
/// served them (the figures would follow the arrangement). A link that got faster shows here
/// within seconds; one that got slower shows in the next probe, which runs alone.
pub fn counter_figures(
    tables: &AggTables,
    me: NodeId,
    node_ips: &BTreeMap<NodeId, Ipv4Addr>,
    before: &[Reading],
    now: &[Reading],
) -> BTreeMap<NodeId, u64> {
    let mut out: BTreeMap<NodeId, u64> = BTreeMap::new();
    for r in now {
        let Some(job) = tables.jobs.values().find(|j| j.id == r.job) else {
            continue;
        };
        let grouped = matches!(job.grouping, Grouping::Auto | Grouping::Ps);
        if !grouped || job.failed.is_some() || !job.members.values().any(|a| *a == r.addr) {
            continue;
        }
        let Some(b) = before.iter().find(|b| b.job == r.job && b.addr == r.addr) else {
            continue;
        };
        let (Some(busy), Some(bytes)) = (
            r.busy_ns.checked_sub(b.busy_ns),
            r.bytes.checked_sub(b.bytes),
        ) else {
            continue;
        };
        if busy < MIN_BUSY_NS {
            continue;
        }
        let Some(node) = node_ips
            .iter()
            .find(|(_, ip)| **ip == *r.addr.ip())
            .map(|(n, _)| *n)
        else {
            continue;
        };
        if node == me {
            continue;
        }
        let rate = bytes_per_s(bytes, busy);
        let known = tables.bandwidth.get(&node).and_then(|m| m.get(&me));
        if known.is_some_and(|k| rate <= *k) {
            continue;
        }
        let e = out.entry(node).or_insert(0);
        *e = (*e).max(rate);
    }
    out
}

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
    fn the_counters_give_a_worker_node_the_rate_its_frames_arrived_at_while_sending() {
        let t = tables(Grouping::Auto);
        let id = t.jobs["j"].id;
        let node_ips: BTreeMap<NodeId, Ipv4Addr> =
            (1..=5u8).map(|i| (u64::from(i), ip(i))).collect();
        let worker = SocketAddrV4::new(ip(5), 40000);
        let at = |busy_ns: u64, bytes: u64| Reading {
            job: id,
            addr: worker,
            busy_ns,
            bytes,
        };
        // 25 MB in one second of sending: 25 MB/s from node 5 to this host, node 2.
        let before = [at(1_000_000_000, 5_000_000)];
        let now = [at(2_000_000_000, 30_000_000)];
        assert_eq!(
            counter_figures(&t, 2, &node_ips, &before, &now),
            BTreeMap::from([(5, 25_000_000)])
        );
        // Too little sending between the readings, no earlier reading, counters that went back
        // (a rewritten member): no figure.
        let idle = [at(1_000_000_000 + MIN_BUSY_NS - 1, 6_000_000)];
        assert!(counter_figures(&t, 2, &node_ips, &before, &idle).is_empty());
        assert!(counter_figures(&t, 2, &node_ips, &[], &now).is_empty());
        assert!(counter_figures(&t, 2, &node_ips, &now, &before).is_empty());
        // Not a worker of the job (a cluster aggregator's partial sums), a flat job, a worker
        // whose host is no node, or this host's own worker: no figure.
        let child = Reading {
            addr: SocketAddrV4::new(ip(3), 7481),
            ..now[0]
        };
        let child_before = Reading {
            addr: child.addr,
            ..before[0]
        };
        assert!(counter_figures(&t, 2, &node_ips, &[child_before], &[child]).is_empty());
        let flat = tables(Grouping::Flat);
        assert!(counter_figures(&flat, 2, &node_ips, &before, &now).is_empty());
        let few: BTreeMap<NodeId, Ipv4Addr> = (1..=3u8).map(|i| (u64::from(i), ip(i))).collect();
        assert!(counter_figures(&t, 2, &few, &before, &now).is_empty());
        assert!(counter_figures(&t, 5, &node_ips, &before, &now).is_empty());
        // Only above the tables' figure: a share of a contended link is a lower bound.
        let mut known = t.clone();
        let m = |bytes_per_s| AggCommand::Bandwidth {
            from: 5,
            to: 2,
            bytes_per_s,
        };
        known.apply(&m(30_000_000), 2).unwrap();
        assert!(counter_figures(&known, 2, &node_ips, &before, &now).is_empty());
        let mut slower = t.clone();
        slower.apply(&m(20_000_000), 2).unwrap();
        assert_eq!(
            counter_figures(&slower, 2, &node_ips, &before, &now),
            BTreeMap::from([(5, 25_000_000)])
        );
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
