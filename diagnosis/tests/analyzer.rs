//! The analyzer's rules on generated jobs: each fault is named, healthy and imbalanced jobs
//! raise nothing, and neither event order nor clock skew changes a result.

mod analyzer_support;

use analyzer_support::{analyze, summary, Fault, Kind, Sim, MS, S, T0};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::sync::Arc;
use yard_diagnosis::analyzer::{analyze_trace, Config, JobAnalyzer};
use yard_diagnosis::event::{Coll, Dtype, Event, Group, Op, Phase};
use yard_diagnosis::verdict::{Class, LinkKind, Subtype, Verdict};

fn cfg() -> Config {
    Config::default()
}

fn only(vs: &[Verdict]) -> &Verdict {
    assert_eq!(vs.len(), 1, "expected one verdict, got {vs:#?}");
    &vs[0]
}

#[test]
fn a_healthy_job_has_no_verdicts() {
    let vs = Sim::ring(8, 60).verdicts(&cfg());
    assert!(vs.is_empty(), "{vs:#?}");
}

#[test]
fn a_rank_that_never_enqueues_is_the_missing_participant() {
    let vs = Sim::ring(8, 30)
        .fault(Fault::Missing { rank: 5, seq: 12 })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!(
        (v.class, v.subtype),
        (Class::Hang, Subtype::MissingParticipant)
    );
    assert_eq!(v.culprits, vec![5]);
    assert_eq!(v.seq, Some(12));
    assert_eq!(v.op, Some(Op::AllReduce));
    assert!(
        v.evidence.iter().any(|e| e.contains(
            "rank 5 is behind: last enqueued #11 while 7 of 8 ranks are in all_reduce #12"
        )),
        "{:?}",
        v.evidence
    );
    assert!(v.confidence > 0.8);
}

#[test]
fn the_missing_participant_does_not_depend_on_event_order() {
    let sim = Sim::ring(8, 20).fault(Fault::Missing { rank: 3, seq: 15 });
    let events = sim.events();
    let expected = summary(&analyze(&events, &cfg()));
    for seed in 0..5 {
        let mut shuffled = events.clone();
        shuffled.shuffle(&mut StdRng::seed_from_u64(seed));
        assert_eq!(summary(&analyze(&shuffled, &cfg())), expected);
    }
    assert_eq!(expected[0].2, vec![3]);
}

#[test]
fn a_rank_ahead_of_the_majority_is_an_extra_participant() {
    let vs = Sim::ring(8, 30)
        .fault(Fault::Extra { rank: 6, seq: 20 })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!(v.subtype, Subtype::ExtraParticipant);
    assert_eq!(v.culprits, vec![6]);
    assert!(
        v.evidence[0].contains("rank 6 is ahead"),
        "{:?}",
        v.evidence
    );
}

#[test]
fn mismatches_name_the_minority() {
    for (kind, subtype) in [
        (Kind::Type, Subtype::TypeMismatch),
        (Kind::Dtype, Subtype::DtypeMismatch),
        (Kind::Size, Subtype::SizeMismatch),
    ] {
        let vs = Sim::ring(8, 30)
            .fault(Fault::Mismatch {
                rank: 2,
                seq: 9,
                kind,
            })
            .verdicts(&cfg());
        let v = only(&vs);
        assert_eq!((v.class, v.subtype), (Class::Mismatch, subtype));
        assert_eq!(v.culprits, vec![2]);
        assert_eq!(v.op, Some(Op::AllReduce), "the majority's op");
    }
}

/// PyTorch's analyzer compares every rank with the first one it reads and so blames the
/// others when the first is the culprit; a majority vote does not.
#[test]
fn a_culprit_read_first_is_still_the_culprit() {
    let sim = Sim::ring(4, 10).fault(Fault::Mismatch {
        rank: 0,
        seq: 5,
        kind: Kind::Type,
    });
    let mut events = sim.events();
    events.sort_by_key(|(_, e)| e.rank() != Some(0));
    let v = analyze(&events, &cfg());
    assert_eq!(
        summary(&v),
        vec![("mismatch".into(), "type_mismatch".into(), vec![0])]
    );
}

/// Two ranks disagreeing one against one is no vote. A program repeats its step, so the
/// stream's earlier ops say which rank still does what the job always did there: the one
/// whose size changed is blamed, whichever rank number it has, with a confidence below a
/// real majority's.
#[test]
fn a_one_against_one_tie_is_settled_by_the_streams_own_history() {
    for rank in [0, 1] {
        let mut sim = Sim::ring(2, 10);
        sim.faults.push(Fault::Mismatch {
            rank,
            seq: 4,
            kind: Kind::Size,
        });
        let v = sim.verdicts(&cfg());
        let v = only(&v);
        assert_eq!(v.subtype, Subtype::SizeMismatch);
        assert_eq!(v.culprits, vec![rank], "{:?}", v.evidence);
        assert!(
            v.confidence > 0.45 && v.confidence < 0.9,
            "{}",
            v.confidence
        );
        assert!(
            v.evidence
                .iter()
                .any(|e| e.starts_with("no majority") && e.contains("earlier ops")),
            "{:?}",
            v.evidence
        );
    }
}

/// At a job's first collective there is no history: the tie stays a tie, reported with low
/// confidence and both camps named in the evidence.
#[test]
fn a_tie_nothing_decides_is_reported_with_low_confidence_and_both_camps() {
    let mut sim = Sim::ring(2, 10);
    sim.faults.push(Fault::Mismatch {
        rank: 1,
        seq: 0,
        kind: Kind::Size,
    });
    let v = sim.verdicts(&cfg());
    let v = only(&v);
    assert_eq!(v.subtype, Subtype::SizeMismatch);
    assert!(v.confidence < 0.45, "{}", v.confidence);
    assert!(
        v.evidence
            .iter()
            .any(|e| e.starts_with("no majority") && e.contains("rank 0") && e.contains("rank 1")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn a_silent_rank_is_dead_and_explains_the_hang() {
    let vs = Sim::ring(8, 30)
        .fault(Fault::Dead { rank: 4, seq: 10 })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Hang, Subtype::DeadProcess));
    assert_eq!(v.culprits, vec![4]);
    assert!(v.evidence[0].starts_with("rank 4 (h4) silent for"));
    assert!(v
        .evidence
        .iter()
        .any(|e| e.contains("pg 0 is stuck in all_reduce #10")));
}

#[test]
fn a_dead_rank_is_reported_before_any_group_is_stuck() {
    let cfg = Config {
        hang_floor_ns: 60 * S,
        ..cfg()
    };
    let sim = Sim::ring(4, 10).fault(Fault::Dead { rank: 1, seq: 5 });
    let events = sim.events();
    let mut a = JobAnalyzer::new("j", cfg);
    for (now, ev) in &events {
        a.ingest(ev, *now);
    }
    let end = sim.end(&events);
    let first = a.evaluate(end - 2 * S).to_vec();
    assert_eq!(
        summary(&first),
        vec![("hang".into(), "dead_process".into(), vec![1])]
    );
    let again = a.evaluate(end).to_vec();
    assert_eq!(
        again[0].detected_ns, first[0].detected_ns,
        "a holding verdict keeps its time"
    );
}

#[test]
fn ranks_that_exit_are_not_dead() {
    let vs = Sim::ring(4, 20).fault(Fault::ExitAll).verdicts(&cfg());
    assert!(vs.is_empty(), "{vs:#?}");
}

fn group(name: &str, ranks: Vec<u32>) -> Event {
    Event::Group(Group {
        name: Arc::from(name),
        desc: name.into(),
        ranks,
    })
}

fn coll(rank: u32, pg: &str, seq: u64, phase: Phase, t: u64) -> Event {
    Event::Coll(Coll {
        rank,
        pg: Arc::from(pg),
        seq,
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        count: 256,
        bytes: 1024,
        out_count: 0,
        peer: None,
        phase,
        t_ns: t,
    })
}

fn member(rank: u32, pid: u32) -> Event {
    Event::Member(yard_diagnosis::event::Member {
        rank,
        world_size: 2,
        host: format!("h{rank}"),
        addr: String::new(),
        nic: String::new(),
        switch: String::new(),
        pid,
    })
}

/// Issue 10: a node's replay re-announced the ranks of a finished job, and two seconds later
/// each was a dead process. The same process introducing itself again after its goodbye is a
/// replay; it runs again only when it heartbeats (a restarted container can reuse the pid).
#[test]
fn a_replayed_introduction_of_an_exited_rank_does_not_revive_it() {
    let mut a = JobAnalyzer::new("j", cfg());
    a.ingest(&member(0, 7), T0);
    a.ingest(&member(1, 8), T0);
    a.ingest(&group("0", vec![0, 1]), T0);
    a.ingest(&Event::Exit { rank: 0, t_ns: 0 }, T0 + S);
    a.ingest(&Event::Exit { rank: 1, t_ns: 0 }, T0 + S);
    // The replay.
    a.ingest(&member(0, 7), T0 + 2 * S);
    a.ingest(&member(1, 8), T0 + 2 * S);
    a.ingest(&group("0", vec![0, 1]), T0 + 2 * S);
    let vs = a.evaluate(T0 + 10 * S).to_vec();
    assert!(vs.is_empty(), "a finished job's ranks called dead: {vs:#?}");

    // Rank 1's container restarts with the same pid: its heartbeat says it runs, and its
    // silence afterwards is a dead process again.
    a.ingest(&member(1, 8), T0 + 10 * S);
    a.ingest(&Event::Heartbeat { rank: 1, t_ns: 0 }, T0 + 10 * S);
    let vs = a.evaluate(T0 + 20 * S).to_vec();
    assert_eq!(vs.len(), 1, "{vs:#?}");
    assert_eq!(vs[0].subtype, Subtype::DeadProcess);
    assert_eq!(vs[0].culprits, vec![1]);
}

/// Issue 10: one event with rank 1,048,575 grew a job to a million rank entries.
#[test]
fn a_rank_outside_the_declared_world_is_refused_and_counted() {
    let mut a = JobAnalyzer::new("j", cfg());
    a.ingest(&member(0, 7), T0);
    a.ingest(&member(1, 8), T0);
    let before = a.retained_records();
    a.ingest(
        &Event::Heartbeat {
            rank: 1_048_575,
            t_ns: 0,
        },
        T0,
    );
    assert_eq!(a.retained_records(), before, "the job grew");
    assert_eq!(a.rejected_events(), 1);
    let err = a
        .try_ingest(&Event::Heartbeat { rank: 2, t_ns: 0 }, T0)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 2 is outside the job's declared world size 2"
    );
    for ev in [
        group("0", vec![0, 1, 5]),
        coll(0, "0", 1, Phase::Enqueue, T0),
        Event::Peer(yard_diagnosis::event::PeerProgress {
            rank: 0,
            pg: Arc::from("0"),
            seq: 1,
            peer: 9,
            dir: yard_diagnosis::event::Dir::Send,
            bytes: 1,
            busy_ns: 1,
            t_ns: 1,
        }),
    ] {
        let ok = !matches!(ev, Event::Group(_) | Event::Peer(_));
        assert_eq!(a.try_ingest(&ev, T0).is_ok(), ok, "{ev:?}");
    }
    let Event::Coll(mut send) = coll(0, "0", 2, Phase::Enqueue, T0) else {
        unreachable!()
    };
    send.op = Op::Send;
    send.peer = Some(3);
    assert!(a.try_ingest(&Event::Coll(send), T0).is_err());
    assert_eq!(a.rejected_events(), 5);
    // A member outside the world it declares itself.
    let mut bad = JobAnalyzer::new("k", cfg());
    let Event::Member(mut m) = member(4, 1) else {
        unreachable!()
    };
    m.world_size = 4;
    assert_eq!(
        bad.try_ingest(&Event::Member(m), T0)
            .unwrap_err()
            .to_string(),
        "rank 4 is outside the job's declared world size 4"
    );
}

#[test]
fn before_a_world_is_declared_ranks_have_a_fixed_cap() {
    let mut a = JobAnalyzer::new("j", cfg());
    let last = yard_diagnosis::analyzer::UNDECLARED_MAX_RANKS;
    assert!(a
        .try_ingest(
            &Event::Heartbeat {
                rank: last - 1,
                t_ns: 0
            },
            T0
        )
        .is_ok());
    let err = a
        .try_ingest(
            &Event::Heartbeat {
                rank: 1_048_575,
                t_ns: 0,
            },
            T0,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 1048575 is beyond the 65536 ranks a job may use before it declares its world size"
    );
    assert!(a.retained_records() <= last as usize);
    // A declared world lifts the cap.
    let Event::Member(mut m) = member(0, 1) else {
        unreachable!()
    };
    m.world_size = 100_000;
    a.ingest(&Event::Member(m), T0);
    assert!(a
        .try_ingest(
            &Event::Heartbeat {
                rank: 99_999,
                t_ns: 0
            },
            T0
        )
        .is_ok());
    assert_eq!(a.rejected_events(), 1);
}

/// A summary can carry a rank's last heartbeat after its EXIT; that is not a sign of life, and
/// only a new introduction (a restarted process) revives the rank.
#[test]
fn a_heartbeat_after_exit_does_not_revive_a_rank_but_a_new_member_does() {
    let mut a = JobAnalyzer::new("j", cfg());
    a.ingest(&member(0, 1), T0);
    a.ingest(&member(1, 1), T0);
    a.ingest(&Event::Exit { rank: 1, t_ns: 0 }, T0 + S);
    a.ingest(&Event::Heartbeat { rank: 1, t_ns: 0 }, T0 + S);
    a.ingest(&Event::Heartbeat { rank: 0, t_ns: 0 }, T0 + 10 * S);
    assert!(
        a.evaluate(T0 + 10 * S).is_empty(),
        "an exited rank is not dead"
    );
    // The restarted process (another pid).
    a.ingest(&member(1, 2), T0 + 10 * S);
    a.ingest(&Event::Heartbeat { rank: 0, t_ns: 0 }, T0 + 20 * S);
    let vs = a.evaluate(T0 + 20 * S).to_vec();
    assert_eq!(vs.len(), 1, "{vs:#?}");
    assert_eq!(vs[0].subtype, Subtype::DeadProcess);
    assert_eq!(vs[0].culprits, vec![1], "the restarted rank went silent");
}

/// Rank 3 never enters tp group "tp" {2, 3}; rank 2 waits there, so the dp group {0, 1, 2, 4}
/// is stuck too, missing rank 2. Rank 2 is a victim: only the tp verdict names a culprit.
#[test]
fn a_victim_blocked_in_another_group_is_not_blamed() {
    let mut a = JobAnalyzer::new("j", cfg());
    a.ingest(&group("tp", vec![2, 3]), T0);
    a.ingest(&group("dp", vec![0, 1, 2, 4]), T0);
    let mut t = T0;
    for seq in 0..5 {
        for (pg, ranks) in [("tp", vec![2, 3]), ("dp", vec![0, 1, 2, 4])] {
            for &r in &ranks {
                a.ingest(&coll(r, pg, seq, Phase::Enqueue, t), t);
                a.ingest(&coll(r, pg, seq, Phase::End, t + MS), t + MS);
            }
            t += 2 * MS;
        }
    }
    a.ingest(&coll(2, "tp", 5, Phase::Enqueue, t), t);
    for r in [0, 1, 4] {
        a.ingest(&coll(r, "dp", 5, Phase::Enqueue, t), t);
    }
    for k in 0..50 {
        for r in 0..5 {
            a.ingest(
                &Event::Heartbeat {
                    rank: r,
                    t_ns: t + k * 100 * MS,
                },
                t + k * 100 * MS,
            );
        }
    }
    let vs = a.evaluate(t + 5 * S).to_vec();
    let v = only(&vs);
    assert_eq!(v.subtype, Subtype::MissingParticipant);
    assert_eq!(v.culprits, vec![3]);
    assert_eq!(v.pg.as_ref().map(|p| p.name.as_str()), Some("tp"));
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("pg dp is also stuck because rank 2 is blocked here")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn a_rank_that_sends_nothing_is_a_dataplane_stall() {
    let vs = Sim::ring(8, 20)
        .fault(Fault::GpuHang { rank: 6, seq: 14 })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Hang, Subtype::DataplaneStall));
    assert_eq!(v.culprits, vec![6]);
}

#[test]
fn every_rank_stuck_without_peer_data_is_undecided() {
    let mut sim = Sim::ring(4, 20).fault(Fault::GpuHang { rank: 1, seq: 10 });
    sim.peers = false;
    let events: Vec<_> = sim
        .events()
        .into_iter()
        .filter(|e| !matches!(e.1, Event::Peer(_)))
        .collect();
    let vs = analyze(&events, &cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Hang, Subtype::Undecided));
    assert!(v.culprits.is_empty());
}

#[test]
fn a_rank_computing_slower_is_a_compute_straggler() {
    let vs = Sim::ring(8, 60)
        .fault(Fault::SlowCompute {
            rank: 2,
            factor: 2.0,
            from: 30,
        })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!(
        (v.class, v.subtype),
        (Class::Slow, Subtype::ComputeStraggler)
    );
    assert_eq!(v.culprits, vec![2]);
    assert!(
        v.evidence.iter().any(|e| e.contains("rank 2 waits least")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn a_slow_pair_names_the_pair_and_no_rank() {
    let vs = Sim::ring(8, 60)
        .fault(Fault::SlowLink {
            from: 1,
            to: 2,
            factor: 3.0,
            at: 30,
        })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Slow, Subtype::SlowLink));
    assert!(v.culprits.is_empty());
    assert_eq!(v.links.len(), 1, "{:?}", v.links);
    assert_eq!(v.links[0].kind, LinkKind::Pair);
    assert_eq!(v.links[0].name, "rank 1 (h1) -> rank 2 (h2)");
    assert!(
        v.evidence
            .iter()
            .any(|e| e.starts_with("rank 1 (h1) -> rank 2 (h2) throughput")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn pairs_slowing_under_one_switch_are_congestion() {
    let vs = Sim::ring(8, 60)
        .fault(Fault::Congestion {
            switch: 1,
            factor: 3.0,
            at: 30,
        })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Slow, Subtype::Congestion));
    assert!(v.culprits.is_empty());
    assert_eq!(v.links[0].kind, LinkKind::Switch);
    assert_eq!(v.links[0].name, "tor-1");
}

#[test]
fn persistent_imbalance_from_the_start_is_not_a_fault() {
    let vs = Sim::ring(8, 80)
        .fault(Fault::SlowCompute {
            rank: 3,
            factor: 2.0,
            from: 0,
        })
        .verdicts(&cfg());
    assert!(vs.is_empty(), "{vs:#?}");
}

#[test]
fn one_slow_step_is_not_a_fault() {
    let vs = Sim::ring(8, 60)
        .fault(Fault::SlowStep {
            rank: 5,
            factor: 4.0,
            seq: 40,
        })
        .verdicts(&cfg());
    assert!(vs.is_empty(), "{vs:#?}");
}

#[test]
fn clock_skew_of_seconds_changes_nothing() {
    let faults = [
        None,
        Some(Fault::Missing { rank: 2, seq: 30 }),
        Some(Fault::SlowCompute {
            rank: 2,
            factor: 2.0,
            from: 30,
        }),
        Some(Fault::SlowLink {
            from: 4,
            to: 5,
            factor: 3.0,
            at: 30,
        }),
        Some(Fault::GpuHang { rank: 1, seq: 40 }),
    ];
    for fault in faults {
        let mut sim = Sim::ring(8, 60);
        sim.faults.extend(fault.clone());
        let plain = summary(&sim.verdicts(&cfg()));
        sim.skew = vec![
            5 * S as i64,
            -5 * S as i64,
            0,
            3 * S as i64,
            -4 * S as i64,
            5 * S as i64,
            -5 * S as i64,
            1,
        ];
        let skewed = summary(&sim.verdicts(&cfg()));
        assert_eq!(plain, skewed, "{fault:?}");
        assert_eq!(plain.is_empty(), fault.is_none());
    }
}

#[test]
fn offline_a_stuck_record_is_analysed_whatever_its_age() {
    let sim = Sim::ring(8, 20).fault(Fault::Missing { rank: 7, seq: 10 });
    let mut trace = sim.trace(true);
    // Taken right after the last collective event: no time has passed, but it timed out.
    trace.taken_ns = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c) => Some(c.t_ns),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let vs = analyze_trace(&trace, &cfg());
    assert_eq!(
        summary(&vs),
        vec![("hang".into(), "missing_participant".into(), vec![7])]
    );
    assert_eq!(vs[0].detected_ns, 0);
    // Not taken at a timeout: nothing is stuck yet.
    trace.stuck = false;
    assert!(analyze_trace(&trace, &cfg()).is_empty());
}

#[test]
fn offline_a_missing_dump_is_a_dead_process() {
    let sim = Sim::ring(8, 20).fault(Fault::Dead { rank: 3, seq: 10 });
    let mut trace = sim.trace(true);
    trace.events.retain(|e| e.rank() != Some(3));
    trace.missing = vec![3];
    let vs = analyze_trace(&trace, &cfg());
    let v = only(&vs);
    assert_eq!(
        (v.subtype, v.culprits.clone()),
        (Subtype::DeadProcess, vec![3])
    );
    assert!(v
        .evidence
        .iter()
        .any(|e| e == "no flight recorder dump from rank 3"));
}

#[test]
fn the_window_shows_the_culprit_and_a_few_neighbours_around_the_seq() {
    let sim = Sim::ring(32, 30).fault(Fault::Missing { rank: 20, seq: 12 });
    let events = sim.events();
    let mut a = JobAnalyzer::new("j", cfg());
    for (now, ev) in &events {
        a.ingest(ev, *now);
    }
    let v = a.evaluate(sim.end(&events)).to_vec();
    let w = a.window(&v[0]);
    let mut ranks: Vec<u32> = w.iter().map(|c| c.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    assert!(
        ranks.contains(&20) && ranks.len() <= 16 && ranks.len() > 1,
        "{ranks:?}"
    );
    assert!(w.iter().all(|c| (9..=14).contains(&c.seq)));
    assert!(w
        .iter()
        .any(|c| c.seq == 12 && c.rank == 19 && c.phase == Phase::Enqueue));
    assert!(!w.iter().any(|c| c.seq == 12 && c.rank == 20));
}

/// Retained state depends on the job's shape, not its length or the number of events: a run
/// four times as long retains exactly as much, and a group 16 times as large retains 16 times
/// as many member records. (Counts, not time: per-event work is bounded by what is retained.)
#[test]
fn retained_state_is_linear_in_ranks_and_constant_in_time() {
    let retained = |n: u32, steps: u64| {
        let mut sim = Sim::ring(n, steps);
        sim.tail_ns = 0;
        let mut a = JobAnalyzer::new("j", cfg());
        for (now, ev) in sim.events() {
            a.ingest(&ev, now);
        }
        a.retained_records()
    };
    assert_eq!(retained(16, 100), retained(16, 400));
    let small = retained(64, 40);
    let large = retained(1024, 40);
    assert!(large <= small * 17, "{small} vs {large}");
}

#[test]
fn a_large_job_evaluates_without_verdicts() {
    let mut sim = Sim::ring(16_384, 3);
    sim.peers = false;
    sim.tail_ns = 0;
    let mut a = JobAnalyzer::new("j", cfg());
    let events = sim.events();
    for (now, ev) in &events {
        a.ingest(ev, *now);
    }
    let end = sim.end(&events);
    assert!(a.evaluate(end).is_empty());
    assert!(a.evaluate(end + 10 * MS).is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn healthy_jobs_with_jitter_raise_nothing(
        n in 2u32..12, steps in 30u64..80, jitter in 0.0f64..0.15, seed in 0u64..1000,
    ) {
        let mut sim = Sim::ring(n, steps);
        sim.jitter = jitter;
        sim.seed = seed;
        let vs = sim.verdicts(&cfg());
        prop_assert!(vs.is_empty(), "{:#?}", vs);
    }

    #[test]
    fn one_missing_participant_is_found_and_is_the_only_culprit(
        n in 3u32..16, rank in 0u32..16, seq in 0u64..40, seed in 0u64..1000,
    ) {
        let rank = rank % n;
        let mut sim = Sim::ring(n, 50).fault(Fault::Missing { rank, seq });
        sim.jitter = 0.05;
        sim.seed = seed;
        let mut events = sim.events();
        events.shuffle(&mut StdRng::seed_from_u64(seed));
        let vs = analyze(&events, &cfg());
        prop_assert_eq!(summary(&vs), vec![("hang".into(), "missing_participant".into(), vec![rank])]);
    }

    #[test]
    fn retained_records_stay_bounded_over_long_runs(n in 2u32..10, extra in 1u64..6) {
        let retained = |steps: u64| {
            let mut sim = Sim::ring(n, steps);
            sim.tail_ns = 0;
            let mut a = JobAnalyzer::new("j", cfg());
            for (now, ev) in sim.events() {
                a.ingest(&ev, now);
            }
            a.retained_records()
        };
        prop_assert_eq!(retained(64), retained(64 * (1 + extra)));
    }
}

#[test]
fn counters_that_agree_add_evidence_and_confidence() {
    use yard_diagnosis::event::LinkCounters;
    let sim = Sim::ring(8, 60).fault(Fault::SlowLink {
        from: 1,
        to: 2,
        factor: 3.0,
        at: 30,
    });
    let mut events = sim.events();
    let without = analyze(&events, &cfg());
    // h1 -> h2 counters every 100 ms from 3 s before the job: 4 GB/s, then 1 GB/s once the
    // link slows.
    let slow_from = events
        .iter()
        .find_map(|(now, e)| match e {
            Event::Coll(c) if c.seq == 30 => Some(*now),
            _ => None,
        })
        .unwrap_or(T0);
    let end = sim.end(&events);
    let (mut t, mut tx) = (T0 - 3 * S, 0u64);
    while t < end {
        tx += if t < slow_from {
            400_000_000
        } else {
            100_000_000
        };
        let c = LinkCounters {
            addr: "198.18.0.2".into(),
            peer_addr: "198.18.0.3".into(),
            tx_bytes: tx,
            rx_bytes: 0,
            tx_packets: 0,
            rx_packets: 0,
            last_rx_ns: t,
            t_ns: t,
        };
        events.push((t, Event::Counters(c)));
        t += 100 * MS;
    }
    events.sort_by_key(|e| e.0);
    let with = analyze(&events, &cfg());
    assert_eq!(summary(&with), summary(&without));
    assert!(
        with[0]
            .evidence
            .iter()
            .any(|e| e.starts_with("counters: h1 -> h2 tx rate 1.00 GB/s vs 4.00 GB/s before")),
        "{:?}",
        with[0].evidence
    );
    assert!(with[0].confidence > without[0].confidence);
}

// ---- rules that need more than one group or a noisy record ------------------------------------

#[test]
fn a_straggler_is_found_when_ops_of_one_kind_follow_different_compute() {
    // Forward and backward all-reduces share (op, size) but follow 10 and 20 ms of compute.
    let mut sim = Sim::ring(8, 60).fault(Fault::SlowCompute {
        rank: 2,
        factor: 1.8,
        from: 30,
    });
    sim.odd_compute_ns = Some(20 * MS);
    sim.jitter = 0.02;
    let vs = sim.verdicts(&cfg());
    let v = only(&vs);
    assert_eq!(
        (v.class, v.subtype),
        (Class::Slow, Subtype::ComputeStraggler)
    );
    assert_eq!(v.culprits, vec![2]);
}

#[test]
fn an_alternating_imbalance_from_the_start_and_one_slow_step_raise_nothing() {
    for fault in [
        Fault::SlowCompute {
            rank: 3,
            factor: 2.0,
            from: 0,
        },
        Fault::SlowStep {
            rank: 3,
            factor: 4.0,
            seq: 41,
        },
    ] {
        let mut sim = Sim::ring(8, 80).fault(fault.clone());
        sim.odd_compute_ns = Some(30 * MS);
        let vs = sim.verdicts(&cfg());
        assert!(vs.is_empty(), "{fault:?}: {vs:#?}");
    }
}

#[test]
fn slow_paths_in_and_out_of_one_host_are_named_as_paths_not_congestion() {
    // h0 and h1 share tor-0: the old reading was "two senders, two receivers under one
    // switch"; but both slow paths touch h1. With one slow path in and one out, h1's NIC and
    // two slow links fit equally, so the paths are named (a NIC needs slow paths to two peers
    // in one direction).
    let vs = Sim::ring(8, 60)
        .fault(Fault::SlowLink {
            from: 0,
            to: 1,
            factor: 3.0,
            at: 30,
        })
        .fault(Fault::SlowLink {
            from: 1,
            to: 2,
            factor: 3.0,
            at: 30,
        })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Slow, Subtype::SlowLink));
    let names: Vec<&str> = v.links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["rank 0 (h0) -> rank 1 (h1)", "rank 1 (h1) -> rank 2 (h2)"],
        "{:?}",
        v.links
    );
    assert!(v.links.iter().all(|l| l.kind == LinkKind::Pair));
}

#[test]
fn a_hung_kernel_in_a_group_of_two_is_named_from_each_sides_records() {
    let vs = Sim::ring(2, 20)
        .fault(Fault::GpuHang { rank: 1, seq: 12 })
        .verdicts(&cfg());
    let v = only(&vs);
    assert_eq!((v.class, v.subtype), (Class::Hang, Subtype::DataplaneStall));
    assert_eq!(v.culprits, vec![1]);
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("rank 1 sent 0 bytes") && e.contains("own GPU")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn a_lost_end_report_does_not_make_a_rank_look_stuck() {
    let events: Vec<(u64, Event)> = Sim::ring(8, 30)
        .fault(Fault::Missing { rank: 5, seq: 12 })
        .events()
        .into_iter()
        .filter(|(_, e)| {
            !matches!(e, Event::Coll(c) if c.rank == 2 && c.seq == 11 && c.phase == Phase::End)
        })
        .collect();
    let vs = analyze(&events, &cfg());
    assert_eq!(
        summary(&vs),
        vec![("hang".into(), "missing_participant".into(), vec![5])]
    );
}

#[test]
fn a_rank_shown_by_its_peer_records_is_not_missing() {
    // Rank 4's enqueue of #12 is lost, but its per-peer record of #12 shows it inside.
    let sim = Sim::ring(8, 30).fault(Fault::Missing { rank: 5, seq: 12 });
    let mut events: Vec<(u64, Event)> = sim
        .events()
        .into_iter()
        .filter(|(_, e)| !matches!(e, Event::Coll(c) if c.rank == 4 && c.seq == 12))
        .collect();
    let t = events.iter().map(|e| e.0).max().unwrap_or(T0) - S;
    events.push((
        t,
        Event::Peer(yard_diagnosis::event::PeerProgress {
            rank: 4,
            pg: Arc::from("0"),
            seq: 12,
            peer: 5,
            dir: yard_diagnosis::event::Dir::Send,
            bytes: 0,
            busy_ns: 0,
            t_ns: t,
        }),
    ));
    events.sort_by_key(|e| e.0);
    let vs = analyze(&events, &cfg());
    assert_eq!(vs[0].subtype, Subtype::MissingParticipant);
    assert_eq!(vs[0].culprits, vec![5]);
}

#[test]
fn offline_a_lost_dump_does_not_hide_the_culprit_the_others_name() {
    let sim = Sim::ring(8, 20).fault(Fault::Missing { rank: 5, seq: 10 });
    let mut trace = sim.trace(true);
    trace.events.retain(|e| e.rank() != Some(3));
    trace.missing = vec![3];
    let vs = analyze_trace(&trace, &cfg());
    assert_eq!(
        (vs[0].subtype, vs[0].culprits.clone()),
        (Subtype::MissingParticipant, vec![5])
    );
    let last = vs.last().expect("a verdict about the lost dump");
    assert_eq!(
        (last.subtype, last.culprits.clone()),
        (Subtype::Undecided, vec![3])
    );
    assert!(last.confidence < 0.5);
    assert!(last
        .evidence
        .iter()
        .any(|e| e == "no flight recorder dump from rank 3"));
}

/// `split_group` names every DP group alike: groups "1" = [0, 2] and "1" = [1, 3] are two
/// groups, told apart by their ranks, whose shards (and so sizes) may differ.
#[test]
fn groups_sharing_a_name_are_kept_apart_by_their_ranks() {
    let sized = |rank: u32, seq: u64, phase: Phase, t: u64| {
        let Event::Coll(mut c) = coll(rank, "1", seq, phase, t) else {
            unreachable!()
        };
        if rank % 2 == 1 {
            c.count = 512;
            c.bytes = 2048;
        }
        Event::Coll(c)
    };
    let mut a = JobAnalyzer::new("j", cfg());
    for rank in 0..4 {
        a.ingest(
            &Event::Member(yard_diagnosis::event::Member {
                rank,
                world_size: 4,
                host: format!("h{rank}"),
                addr: String::new(),
                nic: String::new(),
                switch: String::new(),
                pid: 10 + rank,
            }),
            T0,
        );
    }
    a.ingest(&group("1", vec![0, 2]), T0);
    a.ingest(&group("1", vec![1, 3]), T0);
    for seq in 1..=3 {
        let t = T0 + seq * 100 * MS;
        for rank in 0..4 {
            a.ingest(&sized(rank, seq, Phase::Enqueue, t), t);
            a.ingest(&sized(rank, seq, Phase::End, t + 10 * MS), t + 10 * MS);
        }
    }
    let beat = |a: &mut JobAnalyzer, t: u64| {
        for rank in 0..4 {
            a.ingest(&Event::Heartbeat { rank, t_ns: t }, t);
        }
    };
    beat(&mut a, T0 + S);
    assert!(
        a.evaluate(T0 + S).is_empty(),
        "different groups, different sizes"
    );

    // Seq 4: [0, 2] completes it; in [1, 3] rank 3 never enters it.
    let t = T0 + S;
    for rank in [0, 2] {
        a.ingest(&sized(rank, 4, Phase::Enqueue, t), t);
        a.ingest(&sized(rank, 4, Phase::End, t + 10 * MS), t + 10 * MS);
    }
    a.ingest(&sized(1, 4, Phase::Enqueue, t), t);
    beat(&mut a, T0 + 10 * S);
    let vs = a.evaluate(T0 + 10 * S).to_vec();
    let v = only(&vs);
    assert_eq!(
        (v.class, v.subtype, v.culprits.clone()),
        (Class::Hang, Subtype::MissingParticipant, vec![3])
    );
    let pg = v.pg.as_ref().unwrap();
    assert_eq!((pg.name.as_str(), pg.ranks.clone()), ("1", vec![1, 3]));
}
