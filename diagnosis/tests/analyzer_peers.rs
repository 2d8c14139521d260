//! Ranks and paths judged against their peers in the same step, as CCL-D does, rather than
//! against the job's own history: a rank or a NIC that is slow from the job's first step, or
//! turns slow a few seconds in, is named within a couple of steps; healthy spread between
//! peers and one odd step raise nothing.
//!
//! The jobs here are built by hand: 16 ranks on 8 hosts (two a host), tensor-parallel pairs
//! `tp<h>` inside each host, and two data-parallel rings over the hosts, `dp0` in host order
//! and `dp1` in strides of two, so each host sends to two different hosts. A step is: every
//! rank computes, its TP pair all-reduces, then each ring all-reduces with per-peer progress.

use proptest::prelude::*;
use std::sync::Arc;
use yard_diagnosis::analyzer::{Config, JobAnalyzer};
use yard_diagnosis::event::{Coll, Dir, Dtype, Event, Group, Member, Op, PeerProgress, Phase};
use yard_diagnosis::verdict::{Class, LinkKind, Subtype, Verdict};

const MS: u64 = 1_000_000;
const T0: u64 = 1_000_000_000_000;
const RANKS: u32 = 16;
const HOSTS: u32 = 8;
/// Bytes each ring pair moves per step, and the healthy throughput (bytes per ns).
const RING_BYTES: u64 = 400 << 20;
const THR: f64 = 50.0;

/// One job: per step, each rank's compute (ns) and each directed path's throughput factor.
struct Job {
    steps: usize,
    /// gap[step][rank]
    gap: Vec<Vec<u64>>,
    /// slowdown of the path from host a to host b at a step (1 = healthy)
    path: Box<dyn Fn(usize, u32, u32) -> f64>,
    /// How much longer the receiver of the path from host a to host b waits than its sender
    /// at a step (1 = as long): the hop after a slow link, whose sender forwards what it
    /// received late, so its receiver waits for data while its sender's network is idle.
    waits: Box<dyn Fn(usize, u32, u32) -> f64>,
    /// The data-parallel rings run: both (the default) or only `dp0`, where each host has one
    /// path in and one out.
    rings: Vec<(&'static str, Vec<u32>)>,
}

fn host(r: u32) -> u32 {
    r / 2
}

/// The two rings: (name, ranks in ring order). dp0 takes each host's first rank in host
/// order; dp1 each host's second rank in strides of two.
fn rings() -> Vec<(&'static str, Vec<u32>)> {
    let dp0 = (0..HOSTS).map(|h| 2 * h).collect();
    let order: Vec<u32> = (0..HOSTS).step_by(2).chain((1..HOSTS).step_by(2)).collect();
    let dp1 = order.iter().map(|h| 2 * h + 1).collect();
    vec![("dp0", dp0), ("dp1", dp1)]
}

impl Job {
    fn healthy(steps: usize) -> Job {
        Job {
            steps,
            gap: vec![vec![100 * MS; RANKS as usize]; steps],
            path: Box::new(|_, _, _| 1.0),
            waits: Box::new(|_, _, _| 1.0),
            rings: rings(),
        }
    }

    /// Only the `dp0` ring: every host has one inter-host path in and one out.
    fn one_ring(steps: usize) -> Job {
        let mut job = Job::healthy(steps);
        job.rings.truncate(1);
        job
    }

    /// Every event with its delivery time (1 ms after it happened), in delivery order.
    fn events(&self) -> Vec<(u64, Event)> {
        let mut out: Vec<(u64, Event)> = Vec::new();
        for r in 0..RANKS {
            out.push((
                T0,
                Event::Member(Member {
                    rank: r,
                    world_size: RANKS,
                    host: format!("h{}", host(r)),
                    addr: String::new(),
                    nic: "nic0".into(),
                    switch: format!("s{}", host(r) / 4),
                    pid: 100 + r,
                }),
            ));
        }
        let mut groups: Vec<(String, Vec<u32>)> = (0..HOSTS)
            .map(|h| (format!("tp{h}"), vec![2 * h, 2 * h + 1]))
            .collect();
        groups.extend(self.rings.iter().map(|(n, r)| (n.to_string(), r.clone())));
        for (name, ranks) in &groups {
            out.push((
                T0,
                Event::Group(Group {
                    name: Arc::from(name.as_str()),
                    desc: name.clone(),
                    ranks: ranks.clone(),
                }),
            ));
        }
        let coll = |rank: u32, pg: &str, seq: u64, bytes: u64, phase: Phase, t: u64| {
            Event::Coll(Coll {
                rank,
                pg: Arc::from(pg),
                seq,
                op: Op::AllReduce,
                dtype: Dtype::BFloat16,
                count: bytes / 2,
                bytes,
                out_count: 0,
                peer: None,
                phase,
                t_ns: t,
            })
        };
        let mut ready = vec![T0 + 10 * MS; RANKS as usize];
        for step in 0..self.steps {
            let seq = step as u64 + 1;
            // Compute, then the TP all-reduce of each host.
            for h in 0..HOSTS {
                let pair = [2 * h, 2 * h + 1];
                let arrive: Vec<u64> = pair
                    .iter()
                    .map(|&r| ready[r as usize] + self.gap[step][r as usize])
                    .collect();
                let end = arrive.iter().max().copied().unwrap_or(0) + MS;
                for (i, &r) in pair.iter().enumerate() {
                    let pg = format!("tp{h}");
                    out.push((
                        arrive[i],
                        coll(r, &pg, seq, 1 << 20, Phase::Enqueue, arrive[i]),
                    ));
                    out.push((end, coll(r, &pg, seq, 1 << 20, Phase::End, end)));
                    ready[r as usize] = end;
                }
            }
            // Each ring, with every pair's progress at the end.
            for (name, ring) in self.rings.iter().cloned() {
                let start = ring.iter().map(|&r| ready[r as usize]).max().unwrap_or(0);
                let (busy, waited): (Vec<u64>, Vec<u64>) = (0..ring.len())
                    .map(|i| {
                        let (a, b) = (ring[i], ring[(i + 1) % ring.len()]);
                        let slow = (self.path)(step, host(a), host(b));
                        let busy = RING_BYTES as f64 / (THR / slow);
                        let waits = (self.waits)(step, host(a), host(b));
                        (busy as u64, (busy * waits) as u64)
                    })
                    .unzip();
                let end = start + waited.iter().max().copied().unwrap_or(0);
                for (i, &r) in ring.iter().enumerate() {
                    let next = ring[(i + 1) % ring.len()];
                    out.push((
                        ready[r as usize],
                        coll(r, name, seq, RING_BYTES, Phase::Enqueue, ready[r as usize]),
                    ));
                    out.push((end, coll(r, name, seq, RING_BYTES, Phase::End, end)));
                    for (from, to, dir, busy) in [
                        (r, next, Dir::Send, busy[i]),
                        (next, r, Dir::Recv, waited[i]),
                    ] {
                        out.push((
                            end,
                            Event::Peer(PeerProgress {
                                rank: from,
                                pg: Arc::from(name),
                                seq,
                                peer: to,
                                dir,
                                bytes: RING_BYTES,
                                busy_ns: busy,
                                t_ns: end,
                            }),
                        ));
                    }
                    ready[r as usize] = end;
                }
                // The receive side of each pair is the next rank's report.
            }
        }
        for e in &mut out {
            e.0 += MS;
        }
        out.sort_by_key(|e| e.0);
        out
    }

    /// Ingests the job, evaluating every 100 ms; returns each evaluation's verdicts.
    fn run(&self) -> Vec<(u64, Vec<Verdict>)> {
        run(self.events())
    }
}

/// Ingests `events`, evaluating every 100 ms; returns each evaluation's verdicts.
/// When rank `rank`'s op `seq` ends, if it does.
fn end_of(events: &[(u64, Event)], rank: u32, seq: u64) -> Option<u64> {
    events.iter().find_map(|(t, e)| match e {
        Event::Coll(c) if c.rank == rank && c.seq == seq && c.phase == Phase::End => Some(*t),
        _ => None,
    })
}

fn run(events: Vec<(u64, Event)>) -> Vec<(u64, Vec<Verdict>)> {
    {
        let mut a = JobAnalyzer::new("peers", Config::default());
        let mut out = Vec::new();
        let mut next = T0 + 100 * MS;
        let end = events.last().map_or(T0, |e| e.0) + 200 * MS;
        for (t, ev) in &events {
            while next <= *t {
                out.push((next, a.evaluate(next).to_vec()));
                next += 100 * MS;
            }
            // Heartbeats are every event here; no rank falls silent.
            a.ingest(ev, *t);
            for r in 0..RANKS {
                a.ingest(&Event::Heartbeat { rank: r, t_ns: *t }, *t);
            }
        }
        while next <= end {
            out.push((next, a.evaluate(next).to_vec()));
            next += 100 * MS;
        }
        out
    }
}

/// The first evaluation time at which `pred` held of the top verdict.
fn first(history: &[(u64, Vec<Verdict>)], pred: impl Fn(&Verdict) -> bool) -> Option<u64> {
    history
        .iter()
        .find(|(_, vs)| vs.first().is_some_and(&pred))
        .map(|(t, _)| *t)
}

/// Asserts that the last verdict's top names one NIC, of the host `prefix` names; returns it.
fn assert_top_is_nic<'h>(history: &'h [(u64, Vec<Verdict>)], prefix: &str) -> &'h Verdict {
    let top = &last(history)[0];
    assert_eq!(
        (top.class, top.subtype),
        (Class::Slow, Subtype::SlowLink),
        "{top:#?}"
    );
    assert_eq!(top.links.len(), 1, "{top:#?}");
    assert_eq!(top.links[0].kind, LinkKind::Nic, "{top:#?}");
    assert!(top.links[0].name.starts_with(prefix), "{top:#?}");
    top
}

fn last(history: &[(u64, Vec<Verdict>)]) -> &[Verdict] {
    history.last().map_or(&[][..], |(_, v)| v)
}

fn straggler(v: &Verdict, rank: u32) -> bool {
    v.class == Class::Slow && v.subtype == Subtype::ComputeStraggler && v.culprits == [rank]
}

#[test]
fn a_healthy_job_raises_nothing() {
    let h = Job::healthy(8).run();
    assert!(h.iter().all(|(_, v)| v.is_empty()), "{:#?}", last(&h));
}

/// A rank slow from the job's very first step has no healthy history; against its TP
/// partner (a group of two) it is six times slower, which names it at its first op.
#[test]
fn a_rank_slow_from_the_first_step_is_named_against_its_partner() {
    let mut job = Job::healthy(6);
    for step in &mut job.gap {
        step[3] = 600 * MS;
    }
    // A rank's first op has no compute gap (nothing ended before it): the second is the
    // first that can be compared, and names it.
    let second_op_end = end_of(&job.events(), 3, 2).expect("the second op ends");
    let h = job.run();
    let at = first(&h, |v| straggler(v, 3)).expect("rank 3 named");
    assert!(
        at <= second_op_end + 200 * MS,
        "named {} ms in",
        (at - T0) / MS
    );
    assert!(straggler(&last(&h)[0], 3), "{:#?}", last(&h));
    assert!(h
        .iter()
        .flat_map(|(_, v)| v)
        .all(|v| v.culprits.iter().all(|&c| c == 3)));
}

/// Twice as slow is not a strong outlier: it needs two ops in a row, and one odd step
/// (a garbage-collection pause) raises nothing.
#[test]
fn a_moderate_slowdown_needs_two_steps_and_one_odd_step_is_nothing() {
    let mut once = Job::healthy(8);
    once.gap[3][5] = 200 * MS;
    let h = once.run();
    assert!(
        h.iter().all(|(_, v)| v.is_empty()),
        "{:#?}",
        h.iter().find(|x| !x.1.is_empty())
    );

    let mut from_step_two = Job::healthy(8);
    for step in &mut from_step_two.gap[2..] {
        step[5] = 200 * MS;
    }
    let h = from_step_two.run();
    assert!(straggler(&last(&h)[0], 5), "{:#?}", last(&h));
}

/// A probe report lost on the way: a rank's end of its ring all-reduce (here a long one, every
/// path equally slow) never arrives, so its next compute gap is measured from the op before and
/// looks four times its partner's. Its partner did not wait for it, so it is no straggler.
#[test]
fn a_lost_end_report_makes_no_straggler() {
    let mut job = Job::healthy(8);
    job.path = Box::new(|_, _, _| 40.0);
    let events: Vec<(u64, Event)> = job
        .events()
        .into_iter()
        .filter(|(_, e)| {
            !matches!(e, Event::Coll(c) if c.rank == 5 && &*c.pg == "dp1" && c.seq == 4 && c.phase == Phase::End)
        })
        .collect();
    let h = run(events);
    assert!(
        h.iter().all(|(_, v)| v.is_empty()),
        "{:#?}",
        h.iter().find(|x| !x.1.is_empty())
    );
}

/// A 20x straggler's next op is two seconds away; while its partner already waits in their
/// TP op, the rank still computing long past the group's usual gap is named before the op
/// ends.
#[test]
fn a_rank_still_computing_while_its_partner_waits_is_named_before_its_op_ends() {
    let mut job = Job::healthy(6);
    for step in &mut job.gap[3..] {
        step[6] = 2_000 * MS;
    }
    let end_of_slow_op = end_of(&job.events(), 6, 4).expect("the slowed op ends");
    let h = job.run();
    let at = first(&h, |v| straggler(v, 6)).expect("rank 6 named");
    assert!(
        at < end_of_slow_op,
        "named at {at}, its op ended at {end_of_slow_op}"
    );
    assert!(at < end_of_slow_op - 1_000 * MS);
}

/// One host's NIC slow from the first step: every path through it is eight times below its
/// peers' pace, while the other paths of the same size keep it; the NIC is named.
#[test]
fn a_nic_slow_from_the_first_step_is_named_against_the_other_paths() {
    let mut job = Job::healthy(5);
    job.path = Box::new(|_, a, b| if a == 5 || b == 5 { 8.0 } else { 1.0 });
    let h = job.run();
    let top = assert_top_is_nic(&h, "h5/");
    assert!(top.culprits.is_empty());
}

/// One host's NIC slow from the first step where the host has one inter-host path in and one
/// out (a ring through it): both paths are slow at the host's own end, its ranks' receive
/// and their send, against the other paths' pace, and nothing else is slow; the NIC is named.
/// (A ring over 16,384 ranks starts with such a barrier, which a slow NIC stretches to
/// seconds before any other traffic flows.)
#[test]
fn a_nic_slow_from_the_first_step_with_one_path_in_and_one_out_is_named() {
    let mut job = Job::one_ring(5);
    job.path = Box::new(|_, a, b| if a == 5 || b == 5 { 8.0 } else { 1.0 });
    let h = job.run();
    assert_top_is_nic(&h, "h5/");
    // Named against its peers from the first slow transfer on, not after a history.
    let at = first(&h, |v| v.links.iter().any(|l| l.kind == LinkKind::Nic)).expect("named");
    let second = end_of(&job.events(), 10, 2).expect("the second step ends");
    assert!(
        at <= second,
        "named at {at}, the second step ended at {second}"
    );
}

/// A slow link into a host on a ring, with its knock-on: the host forwards late what it
/// received late, so the next hop's receiver waits as long, but the host's own send is not
/// slow. One path in and one out again, yet not the host's NIC: the paths are named.
#[test]
fn a_slow_link_and_its_knock_on_through_a_host_is_not_its_nic() {
    let mut job = Job::one_ring(5);
    job.path = Box::new(|_, a, b| if (a, b) == (4, 5) { 8.0 } else { 1.0 });
    job.waits = Box::new(|_, a, b| if (a, b) == (5, 6) { 8.0 } else { 1.0 });
    let h = job.run();
    let top = &last(&h)[0];
    assert_eq!(
        (top.class, top.subtype),
        (Class::Slow, Subtype::SlowLink),
        "{top:#?}"
    );
    assert!(
        top.links.iter().all(|l| l.kind == LinkKind::Pair),
        "{top:#?}"
    );
    assert!(
        h.iter()
            .flat_map(|(_, v)| v)
            .all(|v| v.links.iter().all(|l| l.kind != LinkKind::Nic)),
        "a NIC was named at some point"
    );
}

/// The link between two hosts turning slow three steps in: the path over it is named (only
/// `dp0` crosses it, from h2 to h3), and nothing is raised before.
#[test]
fn a_link_turning_slow_mid_job_is_named_from_its_second_slow_transfer() {
    let mut job = Job::healthy(8);
    job.path = Box::new(|step, a, b| {
        let pair = (a.min(b), a.max(b));
        if step >= 3 && pair == (2, 3) {
            10.0
        } else {
            1.0
        }
    });
    let h = job.run();
    let top = &last(&h)[0];
    assert_eq!(
        (top.class, top.subtype),
        (Class::Slow, Subtype::SlowLink),
        "{top:#?}"
    );
    assert!(
        top.links.iter().all(|l| l.kind == LinkKind::Pair),
        "{top:#?}"
    );
    let hosts: Vec<(u32, u32)> = top
        .links
        .iter()
        .map(|l| (host(l.from.unwrap()), host(l.to.unwrap())))
        .collect();
    assert!(
        hosts.iter().all(|&(a, b)| (a.min(b), a.max(b)) == (2, 3)),
        "{hosts:?}"
    );
    // Nothing before the slowdown began.
    let onset = h
        .iter()
        .position(|(_, v)| !v.is_empty())
        .expect("named at some point");
    assert!(h[..onset].iter().all(|(_, v)| v.is_empty()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Ranks computing within ±15% of each other (TP partners run the same layer's work) and
    /// paths within ±25% of each other's pace, differently every step, are a healthy job: the
    /// peer comparison names nobody.
    #[test]
    fn healthy_spread_between_peers_names_nobody(
        gaps in proptest::collection::vec(87u64..115, (RANKS as usize) * 6),
        paths in proptest::collection::vec(0.8f64..1.25, 64 * 6),
    ) {
        let mut job = Job::healthy(6);
        for (step, row) in job.gap.iter_mut().enumerate() {
            for (r, g) in row.iter_mut().enumerate() {
                *g = gaps[step * RANKS as usize + r] * MS;
            }
        }
        job.path = Box::new(move |step, a, b| paths[(step * 64 + (a * 8 + b) as usize) % paths.len()]);
        let h = job.run();
        let raised: Vec<&Verdict> = h.iter().flat_map(|(_, v)| v).collect();
        prop_assert!(raised.is_empty(), "{:#?}", raised);
    }
}
