//! Flight Recorder import: round trips through both formats, compatibility with a dict pickled
//! by Python itself, bad files, and the reduction to a trace.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use yard_diagnosis::event::{Coll, Dtype, Event, Op, Phase, Trace};
use yard_diagnosis::import::{
    read_dir, read_dump, to_trace, write_json, write_pickle, FrDump, FrEntry, FrPg, FrPgStatus,
    ImportError,
};

fn entry(pg: &str, seq: u64, name: &str, state: &str, t: u64) -> FrEntry {
    let p2p = name.contains("send") || name.contains("recv");
    FrEntry {
        record_id: seq,
        pg_id: 0,
        process_group: (pg.to_string(), "default_pg".to_string()),
        collective_seq_id: if p2p { 0 } else { seq },
        p2p_seq_id: if p2p { seq } else { 0 },
        op_id: seq,
        profiling_name: name.to_string(),
        time_created_ns: t,
        time_discovered_started_ns: (state != "scheduled").then_some(t + 10),
        time_discovered_completed_ns: (state == "completed").then_some(t + 100),
        input_sizes: vec![vec![4, 256]],
        input_dtypes: vec!["Float".to_string()],
        output_sizes: vec![vec![4, 256]],
        output_dtypes: vec!["Float".to_string()],
        state: state.to_string(),
        retired: state == "completed",
        timeout_ms: 600_000,
        duration_ms: (state == "completed").then_some(0.25),
        is_p2p: p2p,
    }
}

fn dump(rank: u32, world: &[u32], entries: Vec<FrEntry>) -> FrDump {
    let mut pg_config = BTreeMap::new();
    pg_config.insert(
        "0".to_string(),
        FrPg {
            name: "0".into(),
            desc: "default_pg".into(),
            ranks: world.to_vec(),
        },
    );
    let mut pg_status = BTreeMap::new();
    pg_status.insert(
        "0".to_string(),
        FrPgStatus {
            last_enqueued_collective: entries.len() as i64,
            last_started_collective: -1,
            last_completed_collective: -1,
        },
    );
    FrDump {
        rank,
        version: "2.10".into(),
        pg_config,
        pg_status,
        entries,
    }
}

fn sample() -> FrDump {
    dump(
        3,
        &[0, 1, 2, 3],
        vec![
            entry("0", 1, "nccl:all_reduce", "completed", 1_000),
            entry("0", 2, "nccl:_all_gather_base", "started", 2_000),
            entry("0", 1, "nccl:send 3->0", "scheduled", 3_000),
        ],
    )
}

fn message(err: &ImportError) -> String {
    err.to_string()
}

fn assert_names(err: &ImportError, path: &Path) {
    let text = message(err);
    assert!(
        text.contains(&path.display().to_string()),
        "{text:?} does not name {}",
        path.display()
    );
}

#[test]
fn pickle_and_json_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let original = sample();
    let pkl = dir.path().join("nccl_trace_rank_3");
    write_pickle(&original, &pkl).unwrap();
    assert_eq!(read_dump(&pkl).unwrap(), original);
    let json = dir.path().join("nccl_trace_rank_3.json");
    write_json(&original, &json).unwrap();
    assert_eq!(read_dump(&json).unwrap(), original);
}

#[test]
fn the_writers_produce_what_pytorch_produces() {
    let dir = tempfile::tempdir().unwrap();
    let pkl = dir.path().join("rank_3");
    write_pickle(&sample(), &pkl).unwrap();
    let bytes = std::fs::read(&pkl).unwrap();
    assert_eq!(&bytes[..2], &[0x80, 0x02], "protocol 2, as torch's pickler");
    let json = dir.path().join("rank_3.json");
    write_json(&sample(), &json).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["pg_config"]["0"]["ranks"], "[0, 1, 2, 3]");
    assert_eq!(doc["pg_status"]["0"]["last_started_collective"], "-1");
    assert_eq!(doc["entries"][2]["time_discovered_started_ns"], 0);
    assert_eq!(doc["entries"][0]["process_group"][1], "default_pg");
}

/// Python's own pickler writing a dict shaped exactly like `FlightRecorderDetail.hpp`'s
/// `dump_dict` (tuples, `None` times, ranks as a string, no rank key): proves the reader takes
/// real dumps, not just our writer's.
#[test]
fn reads_a_dump_pickled_by_python() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import pickle, sys
# Like torch's pickler: a fresh (name, desc) tuple per entry, but the stack-frame dicts
# shared between entries (torch memoizes them by pointer).
frame = {"name": "train_step", "filename": "train.py", "line": 42}
def entry(i, seq, name, state, t, p2p_seq=0, is_p2p=False, pg="0", desc="default_pg"):
    done = state == "completed"
    return {
        "frames": [frame, {"name": "main", "filename": "train.py", "line": 7}],
        "record_id": i, "pg_id": 0, "process_group": (pg, desc),
        "thread_name": "pt_main_thread", "thread_id": "140",
        "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op_id": i + 1,
        "profiling_name": name, "time_created_ns": t,
        "input_sizes": [[1024]], "input_dtypes": ["BFloat16"],
        "output_sizes": [[1024]], "output_dtypes": ["BFloat16"],
        "state": state,
        "time_discovered_started_ns": t + 5 if state != "scheduled" else None,
        "time_discovered_completed_ns": t + 50 if done else None,
        "retired": done, "timeout_ms": 600000, "is_p2p": is_p2p,
        **({"duration_ms": 0.5} if done else {}),
    }
d = {
    "version": "2.10",
    "comm_lib_version": "2.27.3",
    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
    "pg_status": {"0": {"last_enqueued_collective": 2, "last_started_collective": 2,
                        "last_completed_collective": 1}},
    "entries": [entry(0, 1, "nccl:all_reduce", "completed", 100),
                entry(1, 2, "nccl:all_reduce", "started", 200),
                entry(2, 0, "nccl:recv 2<-1", "scheduled", 300, p2p_seq=1, is_p2p=True)],
}
for proto, name in ((4, "nccl_trace_rank_2"), (5, "other_prefix_7")):
    with open(sys.argv[1] + "/" + name, "wb") as f:
        pickle.dump(d, f, protocol=proto)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir.path())
        .status()
        .expect("python3 must be installed to check compatibility with the real pickler");
    assert!(status.success());

    for (name, rank) in [("nccl_trace_rank_2", 2), ("other_prefix_7", 7)] {
        let d = read_dump(&dir.path().join(name)).unwrap();
        assert_eq!(d.rank, rank);
        assert_eq!(d.version, "2.10");
        assert_eq!(d.pg_config["0"].ranks, vec![0, 1, 2]);
        assert_eq!(d.pg_status["0"].last_completed_collective, 1);
        assert_eq!(d.entries.len(), 3);
        let e = &d.entries[0];
        assert_eq!(e.process_group, ("0".to_string(), "default_pg".to_string()));
        assert_eq!(e.time_discovered_completed_ns, Some(150));
        assert_eq!(e.duration_ms, Some(0.5));
        assert_eq!(d.entries[1].time_discovered_completed_ns, None);
        assert_eq!(d.entries[2].time_discovered_started_ns, None);
        assert!(d.entries[2].is_p2p);
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good_0");
    write_pickle(&sample(), &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    let p = write(dir.path(), "truncated_1", &bytes[..bytes.len() / 2]);
    let err = read_dump(&p).unwrap_err();
    assert!(matches!(err, ImportError::TruncatedPickle { .. }), "{err}");
    assert_names(&err, &p);

    let p = write(dir.path(), "notdump_2.json", br#"{"hello": "world"}"#);
    let err = read_dump(&p).unwrap_err();
    assert!(
        matches!(&err, ImportError::MissingKey { key, .. } if key == "version"),
        "{err}"
    );
    assert_names(&err, &p);

    let list = serde_pickle::to_vec(&vec![1, 2, 3], serde_pickle::SerOptions::new()).unwrap();
    let p = write(dir.path(), "list_3", &list);
    let err = read_dump(&p).unwrap_err();
    assert!(matches!(err, ImportError::NotADict { .. }), "{err}");
    assert!(message(&err).contains("a list"));
    assert_names(&err, &p);

    let json = dir.path().join("good_4.json");
    write_json(&sample(), &json).unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    doc["entries"][1]["time_created_ns"] = serde_json::json!("yesterday");
    doc.as_object_mut().unwrap().remove("rank");
    let p = write(
        dir.path(),
        "typed_5.json",
        &serde_json::to_vec(&doc).unwrap(),
    );
    let err = read_dump(&p).unwrap_err();
    assert!(
        message(&err).ends_with("entry 1 field time_created_ns is not an integer"),
        "{err}"
    );
    assert_names(&err, &p);

    let p = write(dir.path(), "noversion_6.json", br#"{"entries": []}"#);
    let err = read_dump(&p).unwrap_err();
    assert!(message(&err).ends_with("missing key version"), "{err}");

    doc["version"] = serde_json::json!("3.0");
    let p = write(
        dir.path(),
        "future_7.json",
        &serde_json::to_vec(&doc).unwrap(),
    );
    let err = read_dump(&p).unwrap_err();
    assert!(
        matches!(err, ImportError::UnsupportedVersion { .. }),
        "{err}"
    );

    let p = write(dir.path(), "garbage_8", b"\x7fELF\x02\x01\x01\0\0\0binary");
    let err = read_dump(&p).unwrap_err();
    assert!(matches!(err, ImportError::UnknownFormat { .. }), "{err}");
    assert_names(&err, &p);

    let p = write(dir.path(), "badjson_9.json", b"{\"version\": ");
    let err = read_dump(&p).unwrap_err();
    assert!(matches!(err, ImportError::Json { .. }), "{err}");

    let mut no_entries = serde_pickle::Value::Dict(Default::default());
    if let serde_pickle::Value::Dict(m) = &mut no_entries {
        m.insert(
            serde_pickle::HashableValue::String("version".into()),
            serde_pickle::Value::String("2.4".into()),
        );
    }
    let bytes = serde_pickle::value_to_vec(&no_entries, Default::default()).unwrap();
    let p = write(dir.path(), "noentries_10", &bytes);
    let err = read_dump(&p).unwrap_err();
    assert!(message(&err).ends_with("missing key entries"), "{err}");

    let err = read_dump(&dir.path().join("absent_11")).unwrap_err();
    assert!(matches!(err, ImportError::Read { .. }), "{err}");
}

#[test]
fn rank_key_and_file_name_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rank_5.json");
    write_json(&sample(), &p).unwrap(); // the dump says rank 3
    let err = read_dump(&p).unwrap_err();
    assert!(message(&err).contains("rank 5"), "{err}");
    let p = dir.path().join("dump.json");
    write_json(&sample(), &p).unwrap();
    assert_eq!(
        read_dump(&p).unwrap().rank,
        3,
        "the rank key is used without digits"
    );
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512),
                                lead in prop_oneof![Just(None), Just(Some(0x80u8)), Just(Some(b'{'))]) {
        let dir = tempfile::tempdir().unwrap();
        let mut data = Vec::new();
        data.extend(lead);
        data.extend(bytes);
        let p = write(dir.path(), "fuzz_0", &data);
        if let Err(e) = read_dump(&p) {
            prop_assert!(e.to_string().contains(&p.display().to_string()));
        }
    }

    #[test]
    fn corrupted_pickles_never_panic(pos in 0usize..4096, byte in any::<u8>(), cut in 0usize..4096) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rank_3");
        write_pickle(&sample(), &p).unwrap();
        let mut data = std::fs::read(&p).unwrap();
        let at = pos % data.len();
        data[at] = byte;
        data.truncate(cut.max(1).min(data.len()));
        std::fs::write(&p, &data).unwrap();
        let _ = read_dump(&p);
    }
}

fn colls(trace: &Trace) -> Vec<&Coll> {
    trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn to_trace_reports_missing_dumps_and_phases() {
    let world = [0, 1, 2, 3];
    let d0 = dump(
        0,
        &world,
        vec![
            entry("0", 1, "nccl:all_reduce", "completed", 100),
            entry("0", 2, "nccl:all_reduce", "started", 500),
        ],
    );
    let d1 = dump(
        1,
        &world,
        vec![entry("0", 1, "nccl:all_reduce", "completed", 90)],
    );
    let trace = to_trace(&[d1, d0]);
    assert_eq!(trace.world, vec![0, 1, 2, 3]);
    assert_eq!(trace.missing, vec![2, 3]);
    assert!(trace.stuck);
    assert_eq!(trace.taken_ns, 510);
    assert_eq!(trace.job, "fr");
    let members: Vec<u32> = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Member(m) => Some(m.rank),
            _ => None,
        })
        .collect();
    assert_eq!(members, vec![0, 1]);
    assert!(trace
        .events
        .iter()
        .any(|e| matches!(e, Event::Group(g) if g.ranks == world)));

    let r0: Vec<(u64, Phase, u64)> = colls(&trace)
        .into_iter()
        .filter(|c| c.rank == 0)
        .map(|c| (c.seq, c.phase, c.t_ns))
        .collect();
    assert_eq!(
        r0,
        vec![
            (1, Phase::Enqueue, 100),
            (1, Phase::Start, 110),
            (1, Phase::End, 200),
            (2, Phase::Enqueue, 500),
            (2, Phase::Start, 510),
        ]
    );
    let c = colls(&trace)[0];
    assert_eq!(
        (c.op, c.dtype, c.count, c.bytes),
        (Op::AllReduce, Dtype::Float32, 1024, 4096)
    );
}

#[test]
fn ring_wrap_drops_what_some_rank_has_forgotten() {
    let world = [0, 1];
    // Rank 0's buffer still holds seq 1..=5; rank 1's wrapped and keeps only 4..=5.
    let r0 = (1..=5)
        .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * 100))
        .collect();
    let r1 = (4..=5)
        .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * 100))
        .collect();
    let trace = to_trace(&[dump(0, &world, r0), dump(1, &world, r1)]);
    let seqs: std::collections::BTreeSet<(u32, u64)> =
        colls(&trace).iter().map(|c| (c.rank, c.seq)).collect();
    let expected: std::collections::BTreeSet<(u32, u64)> =
        [(0, 4), (0, 5), (1, 4), (1, 5)].into_iter().collect();
    assert_eq!(seqs, expected);
    assert!(!trace.stuck);
    assert!(trace.missing.is_empty());
}

#[test]
fn p2p_peers_are_global_ranks_and_use_the_p2p_seq() {
    // A pipeline group of global ranks 4 and 6: group rank 1 is global rank 6.
    let mut d = dump(4, &[4, 5, 6, 7], vec![]);
    d.pg_config.insert(
        "pp".into(),
        FrPg {
            name: "pp".into(),
            desc: "pipeline".into(),
            ranks: vec![4, 6],
        },
    );
    d.entries = vec![
        entry("pp", 7, "nccl:send 0->1", "completed", 10),
        entry("pp", 8, "nccl:recv 0<-1", "scheduled", 20),
    ];
    let trace = to_trace(&[d]);
    let got: Vec<(Op, u64, Option<u32>)> = colls(&trace)
        .iter()
        .filter(|c| c.phase == Phase::Enqueue)
        .map(|c| (c.op, c.seq, c.peer))
        .collect();
    assert_eq!(got, vec![(Op::Send, 7, Some(6)), (Op::Recv, 8, Some(6))]);
    assert!(colls(&trace).iter().all(|c| &*c.pg == "pp"));
}

#[test]
fn read_dir_reads_every_dump_and_rejects_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job42");
    std::fs::create_dir(&job).unwrap();
    let world = [0, 1, 2];
    write_pickle(
        &dump(
            0,
            &world,
            vec![entry("0", 1, "nccl:all_reduce", "started", 5)],
        ),
        &job.join("nccl_trace_rank_0"),
    )
    .unwrap();
    write_json(
        &dump(
            1,
            &world,
            vec![entry("0", 1, "nccl:all_reduce", "started", 6)],
        ),
        &job.join("nccl_trace_rank_1.json"),
    )
    .unwrap();
    write(&job, ".nccl_trace_rank_9.swp", b"editor junk");
    write(&job, "README", b"dumps of job 42");
    std::fs::create_dir(job.join("sub")).unwrap();
    let trace = read_dir(&job).unwrap();
    assert_eq!(trace.job, "job42");
    assert_eq!(trace.missing, vec![2]);
    assert_eq!(colls(&trace).len(), 4);

    write_json(&dump(1, &world, vec![]), &job.join("copy_of_rank_1.json")).unwrap();
    let err = read_dir(&job).unwrap_err();
    assert!(
        matches!(err, ImportError::DuplicateRank { rank: 1, .. }),
        "{err}"
    );
    std::fs::remove_file(job.join("copy_of_rank_1.json")).unwrap();

    let bad = write(&job, "nccl_trace_rank_2", b"\x80\x02}q\x00(X");
    let err = read_dir(&job).unwrap_err();
    assert_names(&err, &bad);

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = read_dir(&empty).unwrap_err();
    assert!(matches!(err, ImportError::EmptyDir { .. }), "{err}");
    assert_names(&err, &empty);
}
