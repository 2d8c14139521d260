//! Bandwidth measurement for the grouping (ALEPH), the pure parts: which aggregating hosts a
//! node should probe now ([`due`]), and which of its pairs an aggregating host's counters say
//! have changed ([`Drift`]). The shell (`node/src/agg_bandwidth.rs`) probes and proposes what
//! it measured, which the tables smooth (`AggCommand::Bandwidth`).
//!
//! A node measures only while it runs a worker of a job whose grouping needs bandwidths (auto,
//! ps), and only to the hosts that could aggregate such a job (not another worker's host,
//! unless the job allows it): a cluster with no such job sends no probe traffic. Each host is
//! measured once at once (a new job, a new host) and again every `every_ms`. Probes from
//! several nodes to one host share its link and each sees less than the link alone; to keep
//! that rare, a node goes through the hosts starting from an offset of its own id, so that
//! nodes measuring at the same moment mostly measure different hosts.
//!
//! While a job runs, the aggregator's own counters watch the pairs it serves: the program times
//! each member's frames (`struct agg_peer` in `yard.h`), and when the rate a member's frames
//! arrive at while it is sending moves by more than [`DRIFT`] from what it was when the pair's
//! figure was last measured, the host marks the pair for measuring again
//! (`AggCommand::Remeasure`); the member's node probes it within a second and that measurement
//! replaces the figure. The counters decide *when* to measure, never the figure itself, because
//! neither reading of them is the pair's achievable bandwidth (both seen in the namespace tree
//! test): a token bucket passes a full bucket at line speed, so a round's gradient arrives
//! faster than the link (47–53 MB/s on 25 MB/s links), and members share the aggregator's link,
//! so one member slowing raises the others' rates with no change to their links. A change of
//! the rate relative to its own earlier value cancels the first; the second only costs a probe
//! that finds nothing changed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use yard_raft_store::aggregation::{AggTables, Grouping};

use super::eligible::must_probe;
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

/// The least sending time between two readings that is compared: shorter stretches (a job
/// idle, a few resends) say little about the link.
pub const MIN_BUSY_NS: u64 = 20_000_000;

/// How far a member's rate while sending may move, as a fraction of its baseline, before the
/// pair is measured again: TBF bursts and scheduling move one 5 s reading by 10–15% (the
/// namespace tree test), and a change the grouping acts on is 15% of a round time or more.
pub const DRIFT: f64 = 0.3;

/// A member's rate while sending when the pair's figure or the job's arrangement last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Baseline {
    /// The tables' figure for the pair, and the job's epoch, when it was taken.
    figure: u64,
    epoch: u32,
    rate: u64,
    /// The node of the member, whose pair a mark asks to measure again.
    node: NodeId,
    mark: Mark,
}

/// Where a pair's mark for measuring again stands ([`Drift::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    None,
    /// Returned by [`Drift::observe`]; the shell has not said whether it was committed.
    Proposed,
    /// Committed: the baseline is kept until the pair's measurement clears the mark.
    Committed,
}

/// An aggregating host's watch over the pairs it serves (kept by the shell between readings;
/// every decision is [`Drift::observe`]'s, and the shell reports each mark's fate with
/// [`Drift::settle`]).
#[derive(Debug, Clone, Default)]
pub struct Drift {
    before: Vec<Reading>,
    baselines: BTreeMap<(u32, SocketAddrV4), Baseline>,
}

impl Drift {
    /// The nodes whose pair to this host (`me`) should be measured again, given the
    /// aggregator's readings `now`: those of a worker of a running grouped job (auto, ps) that
    /// this host aggregates (not a cluster aggregator sending partial sums up) whose rate while
    /// sending since the previous readings moved by more than [`DRIFT`] from its baseline, and
    /// whose pair is measured and not already marked. A baseline is taken from the first
    /// reading after the pair's figure or the job's epoch changed (a new measurement, or new
    /// members sharing this host's link); counters that went back (a member rewritten with a
    /// new address) start over.
    pub fn observe(
        &mut self,
        tables: &AggTables,
        me: NodeId,
        node_ips: &BTreeMap<NodeId, Ipv4Addr>,
        now: Vec<Reading>,
    ) -> BTreeSet<NodeId> {
        let mut out = BTreeSet::new();
        let mut live = BTreeSet::new();
        for r in &now {
            let Some(job) = tables.jobs.values().find(|j| j.id == r.job) else {
                continue;
            };
            let grouped = matches!(job.grouping, Grouping::Auto | Grouping::Ps);
            if !grouped || job.failed.is_some() || !job.members.values().any(|a| *a == r.addr) {
                continue;
            }
            let Some(node) = node_ips
                .iter()
                .find(|(_, ip)| **ip == *r.addr.ip())
                .map(|(n, _)| *n)
                .filter(|n| *n != me)
            else {
                continue;
            };
            let Some(&figure) = tables.bandwidth.get(&node).and_then(|m| m.get(&me)) else {
                continue;
            };
            let key = (r.job, r.addr);
            live.insert(key);
            let Some(b) = self
                .before
                .iter()
                .find(|b| b.job == r.job && b.addr == r.addr)
            else {
                continue;
            };
            let (Some(busy), Some(bytes)) = (
                r.busy_ns.checked_sub(b.busy_ns),
                r.bytes.checked_sub(b.bytes),
            ) else {
                self.baselines.remove(&key);
                continue;
            };
            if busy < MIN_BUSY_NS {
                continue;
            }
            let rate = bytes_per_s(bytes, busy);
            let fresh = Baseline {
                figure,
                epoch: job.epoch,
                rate,
                node,
                mark: Mark::None,
            };
            let base = *self.baselines.entry(key).or_insert(fresh);
            if base.figure != figure || base.epoch != job.epoch || base.rate == 0 {
                self.baselines.insert(key, fresh);
                continue;
            }
            match base.mark {
                Mark::Proposed => continue,
                // The measurement cleared the mark with the same figure: the rate it keeps now
                // is the new baseline (a pair is not marked again at every reading).
                Mark::Committed if !tables.remeasure.contains(&(node, me)) => {
                    self.baselines.insert(key, fresh);
                    continue;
                }
                Mark::Committed => continue,
                Mark::None => {}
            }
            let ratio = rate as f64 / base.rate as f64;
            let moved = !(1.0 / (1.0 + DRIFT)..=1.0 + DRIFT).contains(&ratio);
            if moved && !tables.remeasure.contains(&(node, me)) {
                // The baseline stays until the mark is committed: a mark that is lost is made
                // again at the next reading, against the rate before the change.
                if let Some(b) = self.baselines.get_mut(&key) {
                    b.mark = Mark::Proposed;
                }
                out.insert(node);
            }
        }
        self.baselines.retain(|k, _| live.contains(k));
        self.before = now;
        out
    }

    /// The shell's answer for a node [`Drift::observe`] returned: whether its `Remeasure` was
    /// committed. Committed, the pair's baseline waits for the measurement; not (an error, an
    /// unknown outcome), the mark is dropped and the next reading compares with the same
    /// baseline again, so the change is not forgotten.
    pub fn settle(&mut self, node: NodeId, committed: bool) {
        for b in self
            .baselines
            .values_mut()
            .filter(|b| b.node == node && b.mark == Mark::Proposed)
        {
            b.mark = if committed {
                Mark::Committed
            } else {
                Mark::None
            };
        }
    }
}

/// The hosts `me` (at `my_ip`) should probe at `now_ms`, in order, given when it last probed
/// each (`last`, ms on the same clock): those not measured yet, those measured `every_ms` ago,
/// and those whose pair an aggregator marked for measuring again ([`Drift`]); none probed
/// within the last second.
pub fn due(
    tables: &AggTables,
    me: NodeId,
    my_ip: Ipv4Addr,
    last: &BTreeMap<NodeId, u64>,
    now_ms: u64,
    every_ms: u64,
) -> Vec<NodeId> {
    // The grouped jobs with a worker here, and the hosts the leader's tree will ask about for
    // each: the one rule of `eligible`, less the pairs it needs no probe for (this host
    // itself, which a colocated job may use).
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
        .keys()
        .filter(|n| **n != me)
        .filter(|n| jobs.iter().any(|j| must_probe(tables, j, my_ip, **n)))
        .copied()
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
            !measured || stale || tables.remeasure.contains(&(me, *h))
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
            secret: [7; 16],
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

    /// Node 5's worker of job `j` at host 2, its figure 25 MB/s, and readings for it.
    fn watched() -> (
        AggTables,
        BTreeMap<NodeId, Ipv4Addr>,
        impl Fn(u64, u64) -> Reading,
    ) {
        let mut t = tables(Grouping::Auto);
        let m = AggCommand::Bandwidth {
            from: 5,
            to: 2,
            bytes_per_s: 25_000_000,
        };
        t.apply(&m, 2).unwrap();
        let id = t.jobs["j"].id;
        let ips = (1..=5u8).map(|i| (u64::from(i), ip(i))).collect();
        let at = move |busy_ms: u64, bytes: u64| Reading {
            job: id,
            addr: SocketAddrV4::new(ip(5), 40000),
            busy_ns: busy_ms * 1_000_000,
            bytes,
        };
        (t, ips, at)
    }

    /// Readings `per_s` bytes a second of sending apart, one second each, from `start`.
    fn readings(at: &impl Fn(u64, u64) -> Reading, start: u64, rates: &[u64]) -> Vec<Reading> {
        let mut bytes = 0;
        let mut out = vec![at(start * 1000, bytes)];
        for (i, r) in rates.iter().enumerate() {
            bytes += r;
            out.push(at((start + i as u64 + 1) * 1000, bytes));
        }
        out
    }

    #[test]
    fn a_rate_that_moves_from_its_baseline_marks_the_pair_and_a_steady_one_does_not() {
        let (t, ips, at) = watched();
        // Rates above the link (a token bucket's bursts) but steady: nothing to measure.
        let mut d = Drift::default();
        for r in readings(&at, 0, &[50_000_000, 48_000_000, 53_000_000, 47_000_000]) {
            assert!(d.observe(&t, 2, &ips, vec![r]).is_empty());
        }
        // The link slows: the rate falls by more than DRIFT from the baseline of 50 MB/s.
        let mut d = Drift::default();
        let seen: Vec<BTreeSet<NodeId>> = readings(&at, 0, &[50_000_000, 49_000_000, 20_000_000])
            .into_iter()
            .map(|r| d.observe(&t, 2, &ips, vec![r]))
            .collect();
        assert_eq!(
            seen[..3],
            [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()]
        );
        assert_eq!(seen[3], BTreeSet::from([5]));
        // Measured again to the same figure, the slow rate it then keeps is the new baseline:
        // marked once, not at every reading.
        let mut d = Drift::default();
        let marks = readings(
            &at,
            0,
            &[50_000_000, 49_000_000, 20_000_000, 20_000_000, 21_000_000],
        )
        .into_iter()
        .filter(|r| {
            let marked = d.observe(&t, 2, &ips, vec![*r]);
            for n in &marked {
                d.settle(*n, true);
            }
            !marked.is_empty()
        })
        .count();
        assert_eq!(marks, 1);
        // And when it speeds up.
        let mut d = Drift::default();
        let last = readings(&at, 0, &[20_000_000, 20_000_000, 40_000_000])
            .into_iter()
            .map(|r| d.observe(&t, 2, &ips, vec![r]))
            .last();
        assert_eq!(last, Some(BTreeSet::from([5])));
    }

    #[test]
    fn a_new_figure_or_epoch_takes_a_new_baseline_and_a_marked_pair_is_not_marked_twice() {
        let (t, ips, at) = watched();
        let r = readings(&at, 0, &[50_000_000, 20_000_000, 20_000_000]);
        // The figure changed between the baseline and the slow reading (the pair was measured
        // again): the slow rate is the new baseline.
        let mut d = Drift::default();
        d.observe(&t, 2, &ips, vec![r[0]]);
        d.observe(&t, 2, &ips, vec![r[1]]);
        let mut measured = t.clone();
        let m = AggCommand::Bandwidth {
            from: 5,
            to: 2,
            bytes_per_s: 10_000_000,
        };
        measured.apply(&m, 3).unwrap();
        assert!(d.observe(&measured, 2, &ips, vec![r[2]]).is_empty());
        assert!(d.observe(&measured, 2, &ips, vec![r[3]]).is_empty());
        // A regrouping (new epoch) changes who shares the link: a new baseline too.
        let mut d = Drift::default();
        d.observe(&t, 2, &ips, vec![r[0]]);
        d.observe(&t, 2, &ips, vec![r[1]]);
        let mut moved = t.clone();
        moved.jobs.get_mut("j").unwrap().epoch += 1;
        assert!(d.observe(&moved, 2, &ips, vec![r[2]]).is_empty());
        // A pair already marked is not marked again.
        let mut d = Drift::default();
        d.observe(&t, 2, &ips, vec![r[0]]);
        d.observe(&t, 2, &ips, vec![r[1]]);
        let mut marked = t.clone();
        marked
            .apply(&AggCommand::Remeasure { from: 5, to: 2 }, 3)
            .unwrap();
        assert!(d.observe(&marked, 2, &ips, vec![r[2]]).is_empty());
    }

    /// A mark whose `Remeasure` was not committed keeps its baseline: the next reading, still
    /// slow, marks the pair again. A committed one is not marked again while the tables hold
    /// the mark.
    #[test]
    fn a_mark_that_was_not_committed_is_made_again_at_the_next_reading() {
        let (t, ips, at) = watched();
        let r = readings(&at, 0, &[50_000_000, 20_000_000, 20_000_000, 20_000_000]);
        let mut d = Drift::default();
        d.observe(&t, 2, &ips, vec![r[0]]);
        d.observe(&t, 2, &ips, vec![r[1]]);
        assert_eq!(d.observe(&t, 2, &ips, vec![r[2]]), BTreeSet::from([5]));
        d.settle(5, false);
        assert_eq!(
            d.observe(&t, 2, &ips, vec![r[3]]),
            BTreeSet::from([5]),
            "the lost mark is made again"
        );
        d.settle(5, true);
        let mut marked = t.clone();
        marked
            .apply(&AggCommand::Remeasure { from: 5, to: 2 }, 3)
            .unwrap();
        assert!(
            d.observe(&marked, 2, &ips, vec![r[4]]).is_empty(),
            "committed and pending: not again"
        );
    }

    #[test]
    fn only_a_measured_grouped_worker_s_steady_sending_is_watched() {
        let (t, ips, at) = watched();
        let slow = readings(&at, 0, &[50_000_000, 50_000_000, 10_000_000]);
        let marks =
            |t: &AggTables, ips: &BTreeMap<NodeId, Ipv4Addr>, me: NodeId, rs: &[Reading]| {
                let mut d = Drift::default();
                rs.iter()
                    .map(|r| d.observe(t, me, ips, vec![*r]))
                    .fold(BTreeSet::new(), |a, b| &a | &b)
            };
        assert_eq!(marks(&t, &ips, 2, &slow), BTreeSet::from([5]));
        // A flat job, this host's own worker, a worker whose host is no node, a pair with no
        // figure: never marked.
        assert!(marks(&tables(Grouping::Flat), &ips, 2, &slow).is_empty());
        assert!(marks(&t, &ips, 5, &slow).is_empty());
        let few: BTreeMap<NodeId, Ipv4Addr> = (1..=3u8).map(|i| (u64::from(i), ip(i))).collect();
        assert!(marks(&t, &few, 2, &slow).is_empty());
        assert!(marks(&t, &ips, 3, &slow).is_empty(), "no figure 5 -> 3");
        // A cluster aggregator's partial sums (an address that is no member).
        let child: Vec<Reading> = slow
            .iter()
            .map(|r| Reading {
                addr: SocketAddrV4::new(ip(3), 7481),
                ..*r
            })
            .collect();
        assert!(marks(&t, &ips, 2, &child).is_empty());
        // Too little sending between readings: not compared; counters that went back (a
        // rewritten member) start over.
        let idle = [at(0, 0), at(1000, 50_000_000), at(1000 + 19, 50_100_000)];
        assert!(marks(&t, &ips, 2, &idle).is_empty());
        let back = [
            at(0, 0),
            at(1000, 50_000_000),
            at(10, 0),
            at(1010, 10_000_000),
        ];
        assert!(marks(&t, &ips, 2, &back).is_empty());
    }

    #[test]
    fn a_marked_pair_is_due_at_once_and_its_measurement_replaces_the_figure() {
        let (mut t, _, _) = watched();
        let last: BTreeMap<NodeId, u64> = [(1, 10_000), (2, 10_000), (3, 10_000)].into();
        for to in [1, 3] {
            let m = AggCommand::Bandwidth {
                from: 5,
                to,
                bytes_per_s: 25_000_000,
            };
            t.apply(&m, 2).unwrap();
        }
        assert!(due(&t, 5, ip(5), &last, 12_000, 30_000).is_empty());
        assert!(t
            .apply(&AggCommand::Remeasure { from: 5, to: 2 }, 3)
            .unwrap());
        assert!(
            !t.apply(&AggCommand::Remeasure { from: 5, to: 2 }, 4)
                .unwrap(),
            "marked once"
        );
        assert_eq!(due(&t, 5, ip(5), &last, 12_000, 30_000), [2]);
        assert!(
            due(&t, 5, ip(5), &last, 10_500, 30_000).is_empty(),
            "not twice a second"
        );
        let m = AggCommand::Bandwidth {
            from: 5,
            to: 2,
            bytes_per_s: 6_000_000,
        };
        t.apply(&m, 5).unwrap();
        assert_eq!(t.bandwidth[&5][&2], 6_000_000, "replaced, not averaged");
        assert!(t.remeasure.is_empty());
        assert!(due(&t, 5, ip(5), &last, 12_000, 30_000).is_empty());
        // The next one is averaged again.
        t.apply(&m, 6).unwrap();
        let m = AggCommand::Bandwidth {
            from: 5,
            to: 2,
            bytes_per_s: 10_000_000,
        };
        t.apply(&m, 7).unwrap();
        assert_eq!(t.bandwidth[&5][&2], 7_000_000);
        // A pair with no figure is not marked: it is measured anyway.
        let err = t
            .apply(&AggCommand::Remeasure { from: 4, to: 2 }, 8)
            .unwrap_err();
        assert_eq!(
            err,
            "node 4 has no bandwidth figure to node 2 to measure again"
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
