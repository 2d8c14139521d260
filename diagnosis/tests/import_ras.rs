//! NCCL RAS import: fixtures in the text and JSON shapes `ncclras` prints.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use yard_diagnosis::event::{Event, Group, Op, Phase, Trace};
use yard_diagnosis::import::{read_ras, ImportError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ras")
        .join(name)
}

/// Per (group name, rank): the seqs enqueued and ended.
fn phases(trace: &Trace) -> BTreeMap<(String, u32), (Vec<u64>, Vec<u64>)> {
    let mut out: BTreeMap<(String, u32), (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for e in &trace.events {
        if let Event::Coll(c) = e {
            let slot = out.entry((c.pg.to_string(), c.rank)).or_default();
            match c.phase {
                Phase::Enqueue => slot.0.push(c.seq),
                Phase::End => slot.1.push(c.seq),
                Phase::Start => panic!("RAS knows no start times"),
            }
        }
    }
    out
}

fn groups(trace: &Trace) -> Vec<&Group> {
    trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Group(g) => Some(g),
            _ => None,
        })
        .collect()
}

fn ops(trace: &Trace) -> Vec<Op> {
    let mut ops: Vec<Op> = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c) => Some(c.op),
            _ => None,
        })
        .collect();
    ops.dedup();
    ops
}

#[test]
fn text_mismatch_puts_the_outlier_one_behind() {
    let trace = read_ras(&fixture("mismatch.txt")).unwrap();
    assert_eq!(trace.world, (0..8).collect::<Vec<_>>());
    assert!(trace.missing.is_empty());
    assert!(trace.stuck, "a single snapshot is taken as stuck");
    let g = groups(&trace);
    assert_eq!(g.len(), 1);
    assert_eq!(
        (&*g[0].name, g[0].desc.as_str()),
        ("5c1e2a7799d0b4f3", "#0-0")
    );
    assert_eq!(ops(&trace), vec![Op::AllReduce]);
    let p = phases(&trace);
    for rank in 0..8 {
        let got = &p[&("5c1e2a7799d0b4f3".to_string(), rank)];
        let expected = if rank == 6 {
            (vec![411], vec![410])
        } else {
            (vec![412], vec![411])
        };
        assert_eq!(got, &expected, "rank {rank}");
    }
    let host6 = trace.events.iter().find_map(|e| match e {
        Event::Member(m) if m.rank == 6 => Some(m.host.clone()),
        _ => None,
    });
    assert_eq!(host6.as_deref(), Some("198.18.0.12"));
}

#[test]
fn text_dead_process_and_missing_rank_are_missing() {
    let trace = read_ras(&fixture("dead.txt")).unwrap();
    assert_eq!(trace.missing, vec![5]);
    assert_eq!(trace.world, (0..8).collect::<Vec<_>>());
    assert_eq!(ops(&trace), vec![Op::ReduceScatter]);
    let p = phases(&trace);
    let name = "0b77e3c1a4f2d960".to_string();
    assert!(!p.contains_key(&(name.clone(), 5)));
    for rank in [1, 2] {
        assert_eq!(p[&(name.clone(), rank)].0, vec![95], "rank {rank}");
    }
    for rank in [0, 3, 4, 6, 7] {
        assert_eq!(p[&(name.clone(), rank)].0, vec![96], "rank {rank}");
    }
    assert!(!trace
        .events
        .iter()
        .any(|e| matches!(e, Event::Member(m) if m.rank == 5)));
}

#[test]
fn json_counts_sum_over_op_types_and_map_to_global_ranks() {
    let trace = read_ras(&fixture("status.json")).unwrap();
    assert_eq!(trace.world, vec![0, 1, 2, 3]);
    assert_eq!(trace.missing, vec![3]);
    assert!(trace.stuck);
    // 2026-03-02 08:15:30 UTC.
    assert_eq!(trace.taken_ns, 1_772_439_330_000_000_000);
    let g = groups(&trace);
    assert_eq!(g[0].ranks, vec![0, 1, 2, 3]);
    // The second communicator's ranks 0 and 1 are processes 5101 and 6100: global 1 and 2.
    assert_eq!(&*g[1].name, "0x4410be9c03d2f7a1");
    assert_eq!(g[1].ranks, vec![1, 2]);

    let p = phases(&trace);
    let world = "0x9f31c2d0aa17be45".to_string();
    assert_eq!(p[&(world.clone(), 0)], (vec![321], vec![320]));
    assert_eq!(p[&(world.clone(), 1)], (vec![321], vec![320]));
    assert_eq!(p[&(world.clone(), 2)], (vec![320], vec![319]));
    assert!(!p.contains_key(&(world, 3)));
    let pair = "0x4410be9c03d2f7a1".to_string();
    assert_eq!(p[&(pair.clone(), 1)].0, vec![50]);
    assert_eq!(p[&(pair, 2)].0, vec![50]);
    // The world communicator's op is the one whose counts differ; all_reduce in both here.
    assert!(trace.events.iter().all(|e| match e {
        Event::Coll(c) => c.op == Op::AllReduce && c.t_ns == trace.taken_ns,
        _ => true,
    }));
}

#[test]
fn bad_reports_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.json");
    std::fs::write(&p, br#"{"communicators": [{"hash": 5}]}"#).unwrap();
    let err = read_ras(&p).unwrap_err();
    assert!(matches!(err, ImportError::Json { .. }), "{err}");
    assert!(err.to_string().contains("broken.json"));

    let p = dir.path().join("notes.txt");
    std::fs::write(&p, "nothing to see here\n").unwrap();
    let err = read_ras(&p).unwrap_err();
    assert!(matches!(err, ImportError::UnknownFormat { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"));

    let p = dir.path().join("label.txt");
    std::fs::write(&p, "#0-0 MISMATCH\n").unwrap();
    let err = read_ras(&p).unwrap_err();
    assert!(err.to_string().contains("label.txt: line 1"), "{err}");
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(lines in proptest::collection::vec(
        prop_oneof![
            Just("#0-0 (abc) MISMATCH".to_string()),
            Just("  Communicator ranks have different AllReduce operation counts".to_string()),
            Just("  3 ranks have launched up to operation 9".to_string()),
            Just("  Rank 4 has launched up to operation 8 -- GPU 1 managed by process 2 on node h".to_string()),
            Just("  Rank 2 -- GPU 0 managed by process 3 on node h".to_string()),
            Just("    0         1         2         4         8         8   RUNNING  MISMATCH".to_string()),
            Just("DEAD".to_string()),
            Just("The missing rank: 3".to_string()),
            Just(String::new()),
            "[ -~]{0,40}",
        ], 0..30)) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fuzz.txt");
        std::fs::write(&p, lines.join("\n")).unwrap();
        if let Ok(trace) = read_ras(&p) {
            prop_assert!(trace.missing.iter().all(|r| trace.world.contains(r)));
        }
    }
}
