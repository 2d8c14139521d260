//! The simulator's outputs carry the signatures the analyzer relies on, and the simulator
//! itself is deterministic, ordered and bounded.

use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use yard_diagnosis::event::{Coll, Dir, Event, Op, Phase, Rank};
use yard_diagnosis::import::fr;
use yard_diagnosis::sim::{
    fr_dumps, simulate, simulate_into, Algo, Delivered, Fault, MismatchKind, SimError, SimSpec,
    Simulation, Topology,
};
use yard_diagnosis::verdict::{Class, LinkKind, Subtype};

/// 16 ranks: 4 nodes × 4 GPUs, tp 2, pp 2, dp 4; 2 nodes per ToR.
fn small() -> SimSpec {
    let mut spec = SimSpec::new(4, 4, 2, 2);
    spec.steps = 8;
    spec.step_compute_ns = 100_000_000;
    spec.links.nodes_per_tor = 2;
    spec.tail_ns = 5_000_000_000;
    spec
}

fn run(spec: &SimSpec) -> Simulation {
    simulate(spec).expect("spec simulates")
}

fn colls(sim: &Simulation) -> impl Iterator<Item = &Coll> {
    sim.events.iter().filter_map(|(_, ev)| match ev {
        Event::Coll(c) => Some(c),
        _ => None,
    })
}

/// (pg, seq) → rank → phase → host time, for collectives (not p2p).
type OpTable = BTreeMap<(String, u64), HashMap<Rank, HashMap<Phase, u64>>>;

fn op_table(sim: &Simulation) -> OpTable {
    let mut table = OpTable::new();
    for c in colls(sim).filter(|c| !c.op.is_p2p()) {
        table
            .entry((c.pg.to_string(), c.seq))
            .or_default()
            .entry(c.rank)
            .or_default()
            .insert(c.phase, c.t_ns);
    }
    table
}

fn group_of(spec: &SimSpec, rank: Rank, prefix: &str) -> (String, Vec<Rank>) {
    let topo = Topology::new(spec).unwrap();
    let g = topo
        .groups
        .iter()
        .find(|g| g.name.starts_with(prefix) && g.ranks.contains(&rank))
        .unwrap();
    (g.name.to_string(), g.ranks.clone())
}

#[test]
fn same_seed_same_events_other_seed_other_timing() {
    let spec = small();
    let a = run(&spec);
    let b = run(&spec);
    assert_eq!(a, b);
    let mut other = spec.clone();
    other.seed = 2;
    assert_ne!(run(&other).events, a.events);
}

#[test]
fn events_arrive_in_delivery_order_after_they_happen() {
    let mut spec = small();
    spec.fault = Some(Fault::GpuKernelHang {
        rank: 5,
        pg: group_of(&spec, 5, "dp").0,
        seq: 4,
    });
    let sim = run(&spec);
    assert!(sim.events.windows(2).all(|w| w[0].0 <= w[1].0));
    for (recv, ev) in &sim.events {
        let t = match ev {
            Event::Coll(c) => c.t_ns,
            Event::Peer(p) => p.t_ns,
            Event::Heartbeat { t_ns, .. } | Event::Exit { t_ns, .. } => *t_ns,
            _ => continue,
        };
        // No clock skew here, so host time is true time; batching delays by at most an interval.
        assert!(*recv > t && *recv <= t + spec.summary_interval_ns + 1_000_000);
    }
    assert!(sim.end_ns >= sim.events.last().unwrap().0);
}

#[test]
fn members_and_groups_describe_the_layout() {
    let spec = small();
    let sim = run(&spec);
    let members: Vec<_> = sim
        .events
        .iter()
        .filter_map(|(_, ev)| match ev {
            Event::Member(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(members.len(), 16);
    let m5 = &members[5];
    assert_eq!((m5.host.as_str(), m5.switch.as_str()), ("node1", "tor0"));
    assert!(m5.addr.starts_with("198.18."));
    assert_eq!(members[12].switch, "tor1");
    let groups: Vec<String> = sim
        .events
        .iter()
        .filter_map(|(_, ev)| match ev {
            Event::Group(g) => Some(g.name.to_string()),
            _ => None,
        })
        .collect();
    // world + 8 tp + 4 dp + 8 pp
    assert_eq!(groups.len(), 21);
    for name in ["world", "tp0", "tp7", "dp0", "dp3", "pp0", "pp7"] {
        assert!(groups.iter().any(|g| g == name), "no group {name}");
    }
    assert_eq!(sim.label.class, None);
    let exits = sim
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Exit { .. }))
        .count();
    assert_eq!(exits, 16, "a healthy job says goodbye on every rank");
}

#[test]
fn seq_ids_count_per_group_like_flight_recorder() {
    let sim = run(&small());
    // Each TP group: 2 all-reduces per step; each DP group: 1; world: the start-up barrier.
    let mut last: HashMap<(Rank, String), u64> = HashMap::new();
    for c in colls(&sim).filter(|c| c.phase == Phase::Enqueue) {
        let prev = last.insert((c.rank, c.pg.to_string()), c.seq).unwrap_or(0);
        assert_eq!(c.seq, prev + 1, "rank {} pg {} seq jumps", c.rank, c.pg);
    }
    assert_eq!(last[&(0, "tp0".to_string())], 16);
    assert_eq!(last[&(0, "dp0".to_string())], 8);
    assert_eq!(last[&(0, "world".to_string())], 1);
    // Pipeline stage 0 sends forward and receives backward once per step.
    assert_eq!(last[&(0, "pp0".to_string())], 16);
}

#[test]
fn a_slow_rank_arrives_last_and_waits_least() {
    let mut spec = small();
    spec.steps = 10;
    let culprit = 6;
    spec.fault = Some(Fault::SlowCompute {
        rank: culprit,
        factor: 2.0,
        onset_ns: 500_000_000,
    });
    let sim = run(&spec);
    assert_eq!(sim.label.subtype, Some(Subtype::ComputeStraggler));
    assert_eq!(sim.label.culprits, vec![culprit]);
    let (tp, _) = group_of(&spec, culprit, "tp");
    let onset = sim.label.onset_ns;
    let (mut ops, mut last, mut shortest) = (0, 0, 0);
    for ((pg, _), ranks) in op_table(&sim) {
        if pg != tp || ranks[&culprit][&Phase::Enqueue] < onset + 300_000_000 {
            continue;
        }
        ops += 1;
        let enq = |r: &Rank| ranks[r][&Phase::Enqueue];
        let dur = |r: &Rank| ranks[r][&Phase::End] - ranks[r][&Phase::Enqueue];
        let latest = ranks.keys().max_by_key(|r| enq(r)).unwrap();
        let quickest = ranks.keys().min_by_key(|r| dur(r)).unwrap();
        last += usize::from(*latest == culprit);
        shortest += usize::from(*quickest == culprit);
    }
    assert!(ops >= 8, "only {ops} ops after onset");
    assert_eq!(
        last, ops,
        "the slow rank arrives last at every TP all-reduce"
    );
    assert_eq!(shortest, ops, "and spends the least time in it");
}

#[test]
fn a_frozen_rank_goes_silent_and_the_job_hangs() {
    let mut spec = small();
    let victim = 9;
    let onset_ns = 600_000_000;
    spec.fault = Some(Fault::ProcessFreeze {
        rank: victim,
        onset_ns,
    });
    let sim = run(&spec);
    let onset = spec.epoch_ns + onset_ns;
    assert_eq!(sim.label.onset_ns, onset);
    assert_eq!(sim.label.subtype, Some(Subtype::DeadProcess));
    let mut victim_after = 0;
    let mut others_late = 0;
    for (_, ev) in &sim.events {
        if let (Some(r), Some(t)) = (ev.rank(), event_time(ev)) {
            if r == victim && t >= onset {
                victim_after += 1;
            }
            if r != victim && matches!(ev, Event::Heartbeat { .. }) && t > onset + 3_000_000_000 {
                others_late += 1;
            }
        }
    }
    assert_eq!(victim_after, 0, "a frozen rank reports nothing");
    assert!(
        others_late > 15 * 10,
        "the others keep heartbeating while stuck"
    );
    assert!(!sim
        .events
        .iter()
        .any(|(_, e)| matches!(e, Event::Exit { .. })));
    // The crashed variant leaves no Flight Recorder dump; the frozen one does.
    let dumps = fr_dumps(&sim, &spec).unwrap();
    assert!(dumps.iter().any(|d| d.rank == victim));
    spec.fault = Some(Fault::ProcessCrash {
        rank: victim,
        onset_ns,
    });
    let crashed = run(&spec);
    let dumps = fr_dumps(&crashed, &spec).unwrap();
    assert_eq!(dumps.len(), 15);
    assert!(dumps.iter().all(|d| d.rank != victim));
}

fn event_time(ev: &Event) -> Option<u64> {
    match ev {
        Event::Coll(c) => Some(c.t_ns),
        Event::Peer(p) => Some(p.t_ns),
        Event::Heartbeat { t_ns, .. } | Event::Exit { t_ns, .. } => Some(*t_ns),
        _ => None,
    }
}

/// The last seq each member of `pg` enqueued.
fn last_enqueued(sim: &Simulation, pg: &str) -> BTreeMap<Rank, u64> {
    let mut last = BTreeMap::new();
    for c in colls(sim).filter(|c| *c.pg == *pg && c.phase == Phase::Enqueue) {
        last.insert(c.rank, c.seq);
    }
    last
}

#[test]
fn a_skipping_rank_is_one_behind_in_its_group() {
    let mut spec = small();
    let (pg, members) = group_of(&spec, 3, "dp");
    spec.fault = Some(Fault::SkipCollective {
        rank: 3,
        pg: pg.clone(),
        seq: 5,
    });
    let sim = run(&spec);
    assert_eq!(sim.label.subtype, Some(Subtype::MissingParticipant));
    let last = last_enqueued(&sim, &pg);
    for r in members {
        assert_eq!(last[&r], if r == 3 { 4 } else { 5 }, "rank {r}");
    }
    // Nobody ever started op 5.
    assert!(!colls(&sim).any(|c| *c.pg == *pg && c.seq == 5 && c.phase != Phase::Enqueue));
    // The skipping rank is alive: it heartbeats to the end.
    let last_hb = sim
        .events
        .iter()
        .filter_map(|(t, e)| matches!(e, Event::Heartbeat { rank: 3, .. }).then_some(*t))
        .max()
        .unwrap();
    assert!(last_hb + 200_000_000 >= sim.end_ns);
}

#[test]
fn an_extra_collective_puts_its_rank_ahead() {
    let mut spec = small();
    spec.log_every = 2;
    spec.fault = Some(Fault::ExtraCollective {
        rank: 7,
        pg: "world".into(),
        after_seq: 2,
    });
    let sim = run(&spec);
    assert_eq!(sim.label.subtype, Some(Subtype::ExtraParticipant));
    let last = last_enqueued(&sim, "world");
    assert_eq!(last[&7], 3);
    assert!(last.iter().filter(|(r, _)| **r != 7).all(|(_, s)| *s == 2));
}

#[test]
fn a_mismatching_rank_enqueues_a_different_op_and_nobody_finishes() {
    for (kind, subtype) in [
        (MismatchKind::Type, Subtype::TypeMismatch),
        (MismatchKind::Size, Subtype::SizeMismatch),
        (MismatchKind::Dtype, Subtype::DtypeMismatch),
    ] {
        let mut spec = small();
        let (pg, members) = group_of(&spec, 10, "tp");
        spec.fault = Some(Fault::Mismatch {
            rank: 10,
            pg: pg.clone(),
            seq: 6,
            kind,
        });
        let sim = run(&spec);
        assert_eq!(sim.label.class, Some(Class::Mismatch));
        assert_eq!(sim.label.subtype, Some(subtype));
        let at: Vec<&Coll> = colls(&sim)
            .filter(|c| *c.pg == *pg && c.seq == 6 && c.phase == Phase::Enqueue)
            .collect();
        assert_eq!(at.len(), members.len());
        let odd = at.iter().find(|c| c.rank == 10).unwrap();
        let normal = at.iter().find(|c| c.rank != 10).unwrap();
        match kind {
            MismatchKind::Type => assert_ne!(odd.op, normal.op),
            MismatchKind::Size => assert_ne!(odd.count, normal.count),
            MismatchKind::Dtype => assert_ne!(odd.dtype, normal.dtype),
        }
        assert!(!colls(&sim).any(|c| *c.pg == *pg && c.seq == 6 && c.phase == Phase::End));
    }
}

#[test]
fn a_hung_kernel_starts_everywhere_and_its_rank_sends_nothing() {
    let mut spec = small();
    let (pg, members) = group_of(&spec, 5, "dp");
    spec.fault = Some(Fault::GpuKernelHang {
        rank: 5,
        pg: pg.clone(),
        seq: 3,
    });
    let sim = run(&spec);
    assert_eq!(sim.label.subtype, Some(Subtype::DataplaneStall));
    let started = colls(&sim)
        .filter(|c| *c.pg == *pg && c.seq == 3 && c.phase == Phase::Start)
        .count();
    assert_eq!(started, members.len());
    assert!(!colls(&sim).any(|c| *c.pg == *pg && c.seq == 3 && c.phase == Phase::End));
    let mut from_victim = 0;
    for (_, ev) in &sim.events {
        let Event::Peer(p) = ev else { continue };
        if *p.pg != *pg || p.seq != 3 {
            continue;
        }
        let sender = if p.dir == Dir::Send { p.rank } else { p.peer };
        if sender == 5 {
            from_victim += 1;
            assert_eq!(p.bytes, 0);
        } else {
            assert!(p.bytes > 0);
        }
        // The victim waits for its own GPU, never on a peer; everyone else is blocked on one.
        if p.rank == 5 {
            assert_eq!(p.busy_ns, 0);
        } else {
            assert!(p.busy_ns >= 1_000_000_000);
        }
    }
    assert!(from_victim > 0);
}

#[test]
fn ring_all_reduce_moves_the_textbook_volume_at_link_speed() {
    let mut spec = small();
    spec.jitter = 0.0;
    spec.links.nic_latency_ns = 0;
    spec.links.nvlink_latency_ns = 0;
    let sim = run(&spec);
    let s = spec.bytes.dp as f64;
    let n = 4.0;
    let expect_pair = 2.0 * (n - 1.0) / n * s;
    // The DP ring crosses nodes, so it runs at NIC speed: busbw = 2(n−1)/n·S / time.
    for ((pg, _), ranks) in op_table(&sim) {
        if !pg.starts_with("dp") {
            continue;
        }
        let r = ranks.values().next().unwrap();
        let time = (r[&Phase::End] - r[&Phase::Start]) as f64;
        let busbw = expect_pair / time;
        assert!(
            (busbw - spec.links.nic_bytes_per_ns).abs() < 0.01,
            "busbw {busbw}"
        );
    }
    for (_, ev) in &sim.events {
        if let Event::Peer(p) = ev {
            if p.pg.starts_with("dp") {
                assert_eq!(p.bytes, expect_pair as u64);
            }
        }
    }
    // A tree moves each edge's bytes twice through its slowest edge: slower for a 4-ring here.
    spec.algo = Algo::Tree;
    let tree = run(&spec);
    let dur = |sim: &Simulation| {
        let t = op_table(sim);
        let r = &t[&("dp0".to_string(), 1)][&0];
        r[&Phase::End] - r[&Phase::Start]
    };
    assert!(dur(&tree) > dur(&sim));
}

#[test]
fn a_slow_link_shows_on_its_pair_only() {
    let mut spec = small();
    spec.fault = Some(Fault::SlowLink {
        from_node: 1,
        to_node: 0,
        factor: 4.0,
        onset_ns: 0,
    });
    let sim = run(&spec);
    assert_eq!(sim.label.links[0].kind, LinkKind::Pair);
    assert_eq!(sim.label.links[0].nodes, vec![1, 0]);
    let node = |r: Rank| r / 4;
    let (mut slow, mut fast) = (Vec::new(), Vec::new());
    for (_, ev) in &sim.events {
        let Event::Peer(p) = ev else { continue };
        // The DP rings of stage 0 cross between nodes 0 and 1.
        if p.dir != Dir::Recv || !p.pg.starts_with("dp") || node(p.rank) == node(p.peer) {
            continue;
        }
        let rate = p.bytes as f64 / p.busy_ns as f64;
        let pair = (
            node(p.peer).min(node(p.rank)),
            node(p.peer).max(node(p.rank)),
        );
        if pair == (0, 1) {
            slow.push(rate);
        } else {
            fast.push(rate);
        }
    }
    assert!(!slow.is_empty() && !fast.is_empty());
    let max_slow = slow.iter().cloned().fold(0.0, f64::max);
    let min_fast = fast.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(
        max_slow * 3.0 < min_fast,
        "slow {max_slow} vs fast {min_fast}"
    );
}

#[test]
fn clock_skew_is_one_offset_per_host() {
    let mut spec = small();
    spec.clock_skew_ns = 50_000_000;
    let skewed = run(&spec);
    spec.clock_skew_ns = 0;
    let true_time = run(&spec);
    // Same seed, same timeline: the skew only shifts each host's stamps.
    let mut offsets: HashMap<Rank, i64> = HashMap::new();
    for ((_, a), (_, b)) in skewed.events.iter().zip(&true_time.events) {
        if let (Some(r), Some(ta), Some(tb)) = (a.rank(), event_time(a), event_time(b)) {
            let off = ta as i64 - tb as i64;
            assert!(off.abs() <= 50_000_000);
            assert_eq!(*offsets.entry(r).or_insert(off), off, "rank {r} drifts");
        }
    }
    for r in 0..16 {
        assert_eq!(
            offsets[&r],
            offsets[&(r / 4 * 4)],
            "rank {r} differs from its host"
        );
    }
    let distinct: std::collections::BTreeSet<i64> = offsets.values().copied().collect();
    assert!(distinct.len() > 1, "hosts should disagree");
}

#[test]
fn dropped_reports_are_a_subset_of_the_clean_stream() {
    let spec = small();
    let clean = run(&spec);
    let mut noisy_spec = spec.clone();
    noisy_spec.noise.dropped_events = 0.1;
    let noisy = run(&noisy_spec);
    let lost = clean.events.len() - noisy.events.len();
    let frac = lost as f64 / clean.events.len() as f64;
    assert!((0.05..0.15).contains(&frac), "lost {frac}");
    let mut it = clean.events.iter();
    for e in &noisy.events {
        assert!(it.any(|c| c == e), "noisy event not in the clean stream");
    }
    // The Flight Recorder lives in the process: dumps do not lose entries.
    let a = fr_dumps(&clean, &spec).unwrap();
    let b = fr_dumps(&noisy, &noisy_spec).unwrap();
    assert_eq!(a, b);
}

#[test]
fn flight_recorder_dumps_wrap_and_go_missing_as_configured() {
    let mut spec = small();
    spec.fault = Some(Fault::SkipCollective {
        rank: 2,
        pg: group_of(&spec, 2, "tp").0,
        seq: 7,
    });
    spec.noise.fr_buffer = 10;
    spec.noise.missing_dumps = 2;
    let sim = run(&spec);
    let dumps = fr_dumps(&sim, &spec).unwrap();
    assert_eq!(dumps.len(), 14);
    for d in &dumps {
        assert!(d.entries.len() <= 10);
        assert!(d
            .entries
            .windows(2)
            .all(|w| w[0].record_id < w[1].record_id));
        assert!(d.pg_config.contains_key("world"));
    }
    let trace = fr::to_trace(&dumps);
    assert_eq!(trace.world.len(), 16);
    assert_eq!(trace.missing.len(), 2);
    assert!(trace.stuck);
    // In the skipping rank's TP group, its peer has enqueued op 7 and it has not.
    let tp = group_of(&spec, 2, "tp").0;
    let pg_id = Topology::new(&spec)
        .unwrap()
        .group(&tp)
        .unwrap()
        .to_string();
    for d in dumps.iter().filter(|d| d.rank == 2 || d.rank == 3) {
        let status = &d.pg_status[&pg_id];
        let expect = if d.rank == 2 { (6, 6) } else { (7, 6) };
        assert_eq!(
            (
                status.last_enqueued_collective,
                status.last_completed_collective
            ),
            expect,
            "rank {}",
            d.rank
        );
    }
}

#[test]
fn outputs_round_trip_through_the_importers() {
    let mut spec = small();
    spec.steps = 3;
    spec.fault = Some(Fault::ProcessCrash {
        rank: 4,
        onset_ns: 300_000_000,
    });
    let sim = run(&spec);
    let dir = tempfile::tempdir().unwrap();
    yard_diagnosis::sim::write_outputs(&sim, &spec, dir.path()).unwrap();
    let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
    let lines: Vec<Delivered> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), sim.events.len());
    assert_eq!(lines[20].recv_ns, sim.events[20].0);
    assert_eq!(lines[20].event, sim.events[20].1);
    let label: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("label.json")).unwrap()).unwrap();
    assert_eq!(label["subtype"], "dead_process");
    assert_eq!(label["culprits"], serde_json::json!([4]));
    let from_pickles = fr::read_dir(&dir.path().join("fr")).unwrap();
    let from_json = fr::read_dir(&dir.path().join("fr-json")).unwrap();
    assert_eq!(from_pickles.missing, vec![4]);
    assert_eq!(from_pickles.events, from_json.events);
    assert!(std::fs::metadata(dir.path().join("fr").join("rank_0")).is_ok());
    let spec_back: SimSpec =
        serde_json::from_slice(&std::fs::read(dir.path().join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec_back, spec);
}

#[test]
fn bad_specs_are_errors_not_panics() {
    let mut spec = small();
    spec.dp = 3;
    assert!(matches!(simulate(&spec), Err(SimError::Shape(_))));
    let mut spec = small();
    spec.fault = Some(Fault::SkipCollective {
        rank: 0,
        pg: "tp9".into(),
        seq: 1,
    });
    assert!(matches!(simulate(&spec), Err(SimError::Fault(_))));
    spec.fault = Some(Fault::SkipCollective {
        rank: 0,
        pg: "tp0".into(),
        seq: 1000,
    });
    assert!(matches!(simulate(&spec), Err(SimError::NeverFired(_))));
    spec.fault = Some(Fault::SlowCompute {
        rank: 0,
        factor: 0.5,
        onset_ns: 0,
    });
    assert!(simulate(&spec).is_err());
    spec.fault = None;
    spec.noise.dropped_events = 1.5;
    assert!(matches!(simulate(&spec), Err(SimError::Param(_))));
}

#[test]
fn sixteen_thousand_ranks_stream_in_bounded_memory() {
    let mut spec = SimSpec::new(2048, 8, 8, 4);
    spec.steps = 2;
    spec.tail_ns = 1_000_000_000;
    spec.fault = Some(Fault::ProcessFreeze {
        rank: 12_345,
        onset_ns: 1_500_000_000,
    });
    let mut count = 0u64;
    let mut last = 0;
    let mut in_order = true;
    let summary = simulate_into(&spec, &mut |t, _| {
        count += 1;
        in_order &= t >= last;
        last = t;
    })
    .unwrap();
    assert!(in_order);
    assert_eq!(summary.world, 16_384);
    assert_eq!(summary.events, count);
    assert!(count > 16_384 * 20);
    // About a step's worth of events per rank at most, never the whole run.
    assert!(
        summary.peak_buffered < 80 * 16_384,
        "peak {} of {count}",
        summary.peak_buffered
    );
    assert!((summary.peak_buffered as u64) < count / 2);
}

/// One op on one rank: (rank, group, seq, op).
type OpKey = (Rank, String, u64, Op);

fn arb_fault(world: u32) -> impl Strategy<Value = Option<Fault>> {
    prop_oneof![
        Just(None),
        (0..world, 1u64..8).prop_map(|(rank, seq)| Some(Fault::SkipCollective {
            rank,
            pg: format!("tp{}", rank / 2),
            seq
        })),
        (0..world, 1u64..4).prop_map(|(rank, seq)| Some(Fault::GpuKernelHang {
            rank,
            pg: format!("dp{}", (rank / 8) * 2 + rank % 2),
            seq
        })),
        (0..world, 0u64..800_000_000)
            .prop_map(|(rank, onset_ns)| Some(Fault::ProcessFreeze { rank, onset_ns })),
        (0..world, 1.0f64..4.0, 0u64..500_000_000).prop_map(|(rank, factor, onset_ns)| Some(
            Fault::SlowCompute {
                rank,
                factor,
                onset_ns
            }
        )),
        (0u32..2, 1.0f64..3.0).prop_map(|(tor, factor)| Some(Fault::Congestion {
            tor,
            factor,
            onset_ns: 0
        })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever the fault, seed or noise: delivery is ordered, every rank's op phases come in
    /// order on its own clock, and no op ends on a rank that never started it.
    #[test]
    fn every_run_is_causally_consistent(
        seed in 0u64..1000,
        fault in arb_fault(16),
        skew in 0u64..30_000_000,
        tree in any::<bool>(),
    ) {
        let mut spec = small();
        spec.steps = 4;
        spec.seed = seed;
        spec.fault = fault;
        spec.clock_skew_ns = skew;
        spec.algo = if tree { Algo::Tree } else { Algo::Ring };
        let sim = match simulate(&spec) {
            Ok(sim) => sim,
            Err(SimError::NeverFired(_)) => return Ok(()),
            Err(e) => panic!("{e}"),
        };
        prop_assert!(sim.events.windows(2).all(|w| w[0].0 <= w[1].0));
        let mut phases: HashMap<OpKey, Vec<(Phase, u64)>> = HashMap::new();
        for c in colls(&sim) {
            phases.entry((c.rank, c.pg.to_string(), c.seq, c.op)).or_default().push((c.phase, c.t_ns));
        }
        for (key, seen) in phases {
            let order: Vec<Phase> = seen.iter().map(|(p, _)| *p).collect();
            prop_assert!(
                [vec![Phase::Enqueue], vec![Phase::Enqueue, Phase::Start],
                 vec![Phase::Enqueue, Phase::Start, Phase::End]].contains(&order),
                "{key:?}: {order:?}"
            );
            prop_assert!(seen.windows(2).all(|w| w[0].1 <= w[1].1));
        }
    }
}

#[test]
fn host_counters_add_up_to_the_inter_node_transfers() {
    let spec = small();
    let sim = run(&spec);
    let node_of_addr = |addr: &str| -> u32 {
        (0..4)
            .find(|&n| Topology::addr(n) == addr)
            .expect("a node address")
    };
    let mut last: HashMap<(u32, u32), (u64, u64, u64)> = HashMap::new();
    let mut readings = 0;
    for (_, ev) in &sim.events {
        let Event::Counters(c) = ev else { continue };
        readings += 1;
        let key = (node_of_addr(&c.addr), node_of_addr(&c.peer_addr));
        let prev = last.insert(key, (c.tx_bytes, c.rx_bytes, c.t_ns));
        if let Some((tx, rx, t)) = prev {
            assert!(
                c.tx_bytes >= tx && c.rx_bytes >= rx && c.t_ns > t,
                "counters go back"
            );
        }
    }
    assert!(readings > 100);
    // What node a sent to node b is what b received from a.
    for (&(a, b), &(tx, _, _)) in &last {
        assert_eq!(tx, last[&(b, a)].1, "{a}->{b}");
    }
    let mut sent: HashMap<(u32, u32), u64> = HashMap::new();
    for (_, ev) in &sim.events {
        if let Event::Peer(p) = ev {
            if p.dir == Dir::Send && p.rank / 4 != p.peer / 4 {
                *sent.entry((p.rank / 4, p.peer / 4)).or_default() += p.bytes;
            }
        }
    }
    for (key, bytes) in sent {
        assert_eq!(last[&key].0, bytes, "{key:?}");
    }
}
