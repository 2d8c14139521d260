//! Flight Recorder import: round trips through both formats, compatibility with a dict pickled
//! by Python itself, bad files, and the reduction to a trace.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use yard_diagnosis::analyzer::{analyze_trace, Config};
use yard_diagnosis::event::{Coll, Dtype, Event, Op, Phase, Trace};
use yard_diagnosis::import::{
    read_dir, read_dump, to_trace, write_json, write_pickle, FrDump, FrEntry, FrPg, FrPgStatus,
    ImportError,
};
use yard_diagnosis::verdict::{Class, Subtype, Verdict};

/// The `timeout_ms` of [`entry`], in ns.
const TIMEOUT_NS: u64 = 600_000 * 1_000_000;

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
    // The watchdog's dump discovers the op in flight started, a timeout after its creation.
    let dumped_at = 500 + TIMEOUT_NS;
    let mut in_flight = entry("0", 2, "nccl:all_reduce", "started", 500);
    in_flight.time_discovered_started_ns = Some(dumped_at);
    let d0 = dump(
        0,
        &world,
        vec![
            entry("0", 1, "nccl:all_reduce", "completed", 100),
            in_flight,
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
    assert_eq!(trace.taken_ns, dumped_at);
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
            // Started some time since its creation: the dump's discovery is no progress.
            (2, Phase::Start, 500),
        ]
    );
    let c = colls(&trace)[0];
    assert_eq!(
        (c.op, c.dtype, c.count, c.bytes),
        (Op::AllReduce, Dtype::Float32, 1024, 4096)
    );
}

/// A dump holding ops in flight was taken at a watchdog timeout only if one of them has been
/// in flight for its `timeout_ms` by the latest time in the dumps; a dump taken on demand
/// catches ops in flight that are young. Without any op discovered started the dump does not
/// show its time, and it is read as a timeout dump.
#[test]
fn only_an_op_in_flight_for_its_timeout_makes_a_timeout_dump() {
    let world = [0, 1];
    let with = |discovered: Option<u64>, state: &str| {
        let mut e = entry("0", 2, "nccl:all_reduce", state, 1_000);
        e.time_discovered_started_ns = discovered;
        let d0 = dump(
            0,
            &world,
            vec![entry("0", 1, "nccl:all_reduce", "completed", 100), e],
        );
        let d1 = dump(
            1,
            &world,
            vec![entry("0", 1, "nccl:all_reduce", "completed", 90)],
        );
        to_trace(&[d0, d1]).stuck
    };
    assert!(with(Some(1_000 + TIMEOUT_NS), "started"), "at the timeout");
    assert!(
        !with(Some(1_000 + 5_000_000), "started"),
        "5 ms old: on demand"
    );
    assert!(with(None, "scheduled"), "the dump does not show its time");
    let done = dump(
        0,
        &world,
        vec![entry("0", 1, "nccl:all_reduce", "completed", 100)],
    );
    assert!(!to_trace(&[done]).stuck, "nothing in flight");
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

// ---------------------------------------------------------------------------------------------
// Dumps as PyTorch writes them, analysed end to end.
//
// `dump_dict` in torch/csrc/distributed/c10d/FlightRecorderDetail.hpp builds a dict with keys
// in this order: version, pg_config, comm_lib_version, pg_status, entries; each entry holds
// frames (shared dicts), record_id, pg_id, process_group (a tuple), thread_name, thread_id (a
// string), collective_seq_id, p2p_seq_id, op_id, profiling_name, time_created_ns, duration_ms
// (a float, only with timing), input_sizes / output_sizes (lists of lists of ints),
// input_dtypes / output_dtypes (lists of C++ scalar names), state, the discovery times (ints
// or None), retired, timeout_ms and is_p2p. `pg_config` is keyed by group name with the ranks
// as a string; `pg_status` by the decimal pg_id. `pickle_str` (TraceUtils.h) writes it with
// torch's pickler at protocol 2, and the default writer names the file
// `nccl_trace_rank_<rank>`. The script below builds exactly that and pickles it with Python's
// own pickler at protocol 2.
// ---------------------------------------------------------------------------------------------

const FR_JOB_PY: &str = r#"
import pickle, sys

MS = 1_000_000
TIMEOUT_MS = 600_000
FRAMES = [{"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2806},
          {"name": "train_step", "filename": "train.py", "line": 42}]

class Rank:
    """One rank's flight recorder: its groups, its counters and its ring buffer."""
    def __init__(self, rank):
        self.rank = rank
        self.pg_config = {}
        self.pg_ids = {}
        self.status = {}
        self.entries = []
        self.coll_seq = {}
        self.p2p_seq = {}
        self.op_id = {}

    def group(self, name, desc, ranks):
        pg_id = len(self.pg_ids)
        self.pg_ids[name] = pg_id
        self.pg_config[name] = {"name": name, "desc": desc,
                                "ranks": "[" + ", ".join(str(r) for r in ranks) + "]"}
        self.status[pg_id] = [-1, -1, -1]
        self.coll_seq[name] = 0
        self.p2p_seq[name] = 0
        self.op_id[name] = 0

    def record(self, pg, profiling_name, created, end=None, started=None, in_sizes=None,
               out_sizes=None, in_dtype="Float", out_dtype=None, timed=True):
        """An op enqueued at `created` that ended at `end` (None: still in flight; then
        `started` is when the dump found its start event done, or None if not yet)."""
        p2p = profiling_name.split(":")[1].split(" ")[0] in ("send", "recv")
        if p2p:
            self.p2p_seq[pg] += 1
        else:
            self.coll_seq[pg] += 1
        self.op_id[pg] += 1
        in_sizes = in_sizes if in_sizes is not None else [[1024]]
        # Fresh lists, as `read_sizes` builds each one anew: torch's pickler memoizes a list
        # only when the same list is pushed twice (as it does the shared stack frames).
        out_sizes = [list(s) for s in (out_sizes if out_sizes is not None else in_sizes)]
        in_sizes = [list(s) for s in in_sizes]
        out_dtype = out_dtype or in_dtype
        if end is not None:
            state = "completed"
            # The watchdog retires a finished op on one of its polls, up to 100 ms late, and
            # marks start and completion discovered then.
            lag = (self.rank * 37 + len(self.entries) * 11) % 100 * MS
            t_started, t_completed = end + lag, end + lag
        else:
            state = "started" if started is not None else "scheduled"
            t_started, t_completed = started, None
        pg_id = self.pg_ids[pg]
        e = {"frames": FRAMES,
             "record_id": len(self.entries), "pg_id": pg_id,
             "process_group": (pg, self.pg_config[pg]["desc"]),
             "thread_name": "pt_main_thread", "thread_id": "139872345",
             "collective_seq_id": self.coll_seq[pg], "p2p_seq_id": self.p2p_seq[pg],
             "op_id": self.op_id[pg], "profiling_name": profiling_name,
             "time_created_ns": created}
        if end is not None and timed:
            # c10d keeps the CUDA event time as a float.
            e["duration_ms"] = (end - created) / MS
        e.update({"input_sizes": in_sizes, "input_dtypes": [in_dtype] * len(in_sizes),
                  "output_sizes": out_sizes, "output_dtypes": [out_dtype] * len(out_sizes),
                  "state": state,
                  "time_discovered_started_ns": t_started,
                  "time_discovered_completed_ns": t_completed,
                  "retired": end is not None, "timeout_ms": TIMEOUT_MS, "is_p2p": p2p})
        self.entries.append(e)
        st = self.status[pg_id]
        if not p2p:
            seq = self.coll_seq[pg]
            st[0] = seq
            if t_started is not None:
                st[1] = seq
            if end is not None:
                st[2] = seq

    def batch(self, pg, ops, created, end=None, started=None):
        """A `_coalescing_manager` block of collectives: `startCoalescing` bumps the collective
        seq once, each op in it is recorded under that seq without CUDA events (so it stays
        "scheduled" and is never retired), and `endCoalescing` records `nccl:coalesced` under
        the same seq with the batch's events."""
        self.coll_seq[pg] += 1
        seq = self.coll_seq[pg]
        for name, sizes, out in ops:
            self.op_id[pg] += 1
            self.entries.append({
                "frames": FRAMES, "record_id": len(self.entries), "pg_id": self.pg_ids[pg],
                "process_group": (pg, self.pg_config[pg]["desc"]),
                "thread_name": "pt_main_thread", "thread_id": "139872345",
                "collective_seq_id": seq, "p2p_seq_id": self.p2p_seq[pg],
                "op_id": self.op_id[pg], "profiling_name": name,
                "time_created_ns": created,
                "input_sizes": [list(x) for x in sizes], "input_dtypes": ["BFloat16"] * len(sizes),
                "output_sizes": [list(x) for x in out], "output_dtypes": ["BFloat16"] * len(out),
                "state": "scheduled", "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None, "retired": False,
                "timeout_ms": TIMEOUT_MS, "is_p2p": False})
        self.coll_seq[pg] -= 1
        op_id = self.op_id[pg]
        self.record(pg, "nccl:coalesced", created, end, started=started, in_sizes=[],
                    out_sizes=[], in_dtype="BFloat16")
        self.op_id[pg] = op_id

    def write(self, out):
        d = {"version": "2.10",
             "pg_config": self.pg_config,
             "comm_lib_version": "2.27.5",
             "pg_status": {str(i): {"last_enqueued_collective": s[0],
                                    "last_started_collective": s[1],
                                    "last_completed_collective": s[2]}
                           for i, s in self.status.items()},
             "entries": self.entries}
        with open(f"{out}/nccl_trace_rank_{self.rank}", "wb") as f:
            f.write(pickle.dumps(d, protocol=2))

def split_job(stuck):
    """World 4 built with split_group: DP groups [0, 2] and [1, 3] are both named "1", TP
    groups [0, 1] and [2, 3] both "2". The DP groups hold shards of different sizes. With
    `stuck`, rank 3 never enters DP all_reduce #10 and the dump comes at rank 1's timeout."""
    ranks = [Rank(r) for r in range(4)]
    dp = {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}
    tp = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    for r in ranks:
        r.group("0", "default_pg", [0, 1, 2, 3])
        r.group("1", "dp", dp[r.rank])
        r.group("2", "tp", tp[r.rank])
    t = 1_000 * MS
    for step in range(1, 11):
        for r in ranks:
            r.record("2", "nccl:all_reduce", t + r.rank * MS, t + 10 * MS, in_sizes=[[4096]])
        if step % 2 == 0:
            # A pipeline hand-off inside each TP group: group rank 0 sends to group rank 1.
            for r in ranks:
                name = "nccl:send 0->1" if tp[r.rank][0] == r.rank else "nccl:recv 1<-0"
                r.record("2", name, t + 11 * MS, t + 12 * MS, in_sizes=[[64]])
        for r in ranks:
            shard = [[1024]] if dp[r.rank] == [0, 2] else [[2048]]
            created = t + 20 * MS + r.rank * MS
            if stuck and step == 10 and dp[r.rank] == [1, 3]:
                if r.rank == 1:
                    r.record("1", "nccl:all_reduce", created, None,
                             started=created + TIMEOUT_MS * MS, in_sizes=shard)
                continue
            r.record("1", "nccl:all_reduce", created, t + 40 * MS, in_sizes=shard)
        t += 100 * MS
    return ranks

def completed_mismatch(kind):
    """World 4, default group only; at all_reduce #4 rank 2 (size, type) or rank 1 (dtype)
    records something else, and every rank completes every op."""
    ranks = [Rank(r) for r in range(4)]
    for r in ranks:
        r.group("0", "default_pg", [0, 1, 2, 3])
    t = 1_000 * MS
    for step in range(1, 9):
        for r in ranks:
            args = {}
            name = "nccl:all_reduce"
            if step == 4 and kind == "size" and r.rank == 2:
                args = {"in_sizes": [[1000]]}
            if step == 4 and kind == "type" and r.rank == 2:
                name = "nccl:_allgather_base"
                args = {"in_sizes": [[256]], "out_sizes": [[1024]]}
            if step == 4 and kind == "dtype" and r.rank == 1:
                args = {"in_dtype": "BFloat16"}
            if step == 4 and kind == "output":
                # An all_gather whose inputs agree; rank 2 gathers into a short buffer.
                name = "nccl:_allgather_base"
                args = {"in_sizes": [[256]], "out_sizes": [[768 if r.rank == 2 else 1024]]}
            r.record("0", name, t + r.rank * MS, t + 10 * MS, **args)
        t += 100 * MS
    return ranks

def on_demand(kind):
    """World 4, a DP group "0" of everyone: 40 steps of compute (50 ms, a little jitter) and a
    gradient all_reduce (5 ms once the last rank arrives), with a large all_gather (~1.2 s)
    every 8 steps. The dump is taken on demand while step 41's all_gather is in flight on every
    rank (started on three, not yet started on rank 2), 1 s after the last rank entered it.
    `straggler`: from step 24 on rank 2 computes 30 ms longer. `timeout`: the same in-flight
    all_gather, but the dump comes at the watchdog's timeout."""
    ranks = [Rank(r) for r in range(4)]
    for r in ranks:
        r.group("0", "default_pg", [0, 1, 2, 3])
    prev_end = 1_000 * MS
    for step in range(1, 42):
        arrive = []
        for r in ranks:
            compute = 50 * MS + ((step * 7 + r.rank * 13) % 5) * MS // 10
            if kind == "straggler" and step >= 24 and r.rank == 2:
                compute += 30 * MS
            arrive.append(prev_end + compute)
        if step % 8 == 1:
            name, sizes, out, transfer = "nccl:_allgather_base", [[1 << 20]], [[4 << 20]], 1200 * MS
        else:
            name, sizes, out, transfer = "nccl:all_reduce", [[1 << 18]], None, 5 * MS
        end = max(arrive) + transfer
        if step == 41:
            dump = max(arrive) + (TIMEOUT_MS * MS if kind == "timeout" else 1000 * MS)
            for r in ranks:
                started = None if r.rank == 2 else dump
                r.record("0", name, arrive[r.rank], None, started=started,
                         in_sizes=sizes, out_sizes=out)
        else:
            for r in ranks:
                r.record("0", name, arrive[r.rank], end, in_sizes=sizes, out_sizes=out)
        prev_end = end
    return ranks

def fsdp(stuck):
    """World 4, FSDP over the default group: each of 10 steps all-gathers three flat params in
    one coalesced block (`_allgather_base` ×3 closed by `nccl:coalesced`), then reduce-scatters
    the gradients with one `reduce_scatter_tensor_coalesced`. With `stuck`, rank 3 never enters
    step 10's block and the dump comes at rank 0's timeout."""
    ranks = [Rank(r) for r in range(4)]
    for r in ranks:
        r.group("0", "default_pg", [0, 1, 2, 3])
    shards = [([[1 << 16]], [[1 << 18]]), ([[1 << 14]], [[1 << 16]]), ([[1 << 12]], [[1 << 14]])]
    t = 1_000 * MS
    for step in range(1, 11):
        for r in ranks:
            created = t + r.rank * MS
            ops = [("nccl:_allgather_base", i, o) for i, o in shards]
            if stuck and step == 10:
                if r.rank != 3:
                    started = created + (TIMEOUT_MS + 1) * MS if r.rank == 0 else None
                    r.batch("0", ops, created, None, started=started)
                continue
            r.batch("0", ops, created, t + 20 * MS)
            r.record("0", "nccl:reduce_scatter_tensor_coalesced", t + 60 * MS + r.rank * MS,
                     t + 80 * MS, in_sizes=[o[0] for _, o in shards], out_sizes=[i[0] for i, _ in shards],
                     in_dtype="BFloat16")
        t += 100 * MS
    return ranks

scenario, out = sys.argv[1], sys.argv[2]
jobs = {
    "split_healthy": lambda: split_job(False),
    "split_stuck": lambda: split_job(True),
    "size": lambda: completed_mismatch("size"),
    "type": lambda: completed_mismatch("type"),
    "dtype": lambda: completed_mismatch("dtype"),
    "output": lambda: completed_mismatch("output"),
    "in_flight": lambda: on_demand("healthy"),
    "straggler": lambda: on_demand("straggler"),
    "timeout": lambda: on_demand("timeout"),
    "fsdp_healthy": lambda: fsdp(False),
    "fsdp_stuck": lambda: fsdp(True),
}
for r in jobs[scenario]():
    r.write(out)
"#;

/// Writes the dumps of one scenario of [`FR_JOB_PY`] into a fresh directory.
fn python_job(scenario: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("python3")
        .arg("-c")
        .arg(FR_JOB_PY)
        .arg(scenario)
        .arg(dir.path())
        .status()
        .expect("python3 must be installed to write dumps with the real pickler");
    assert!(status.success(), "the dump script failed for {scenario}");
    dir
}

fn diagnose(dir: &Path) -> Vec<Verdict> {
    let trace = read_dir(dir).unwrap();
    analyze_trace(&trace, &Config::default())
}

fn summary(vs: &[Verdict]) -> Vec<(Class, Subtype, Vec<u32>)> {
    vs.iter()
        .map(|v| (v.class, v.subtype, v.culprits.clone()))
        .collect()
}

#[test]
fn split_groups_sharing_a_name_are_told_apart_by_their_ranks() {
    let dir = python_job("split_healthy");
    let trace = read_dir(dir.path()).unwrap();
    let mut groups: Vec<(String, Vec<u32>)> = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Group(g) => Some((g.name.to_string(), g.ranks.clone())),
            _ => None,
        })
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        vec![
            ("0".into(), vec![0, 1, 2, 3]),
            ("1".into(), vec![0, 2]),
            ("1".into(), vec![1, 3]),
            ("2".into(), vec![0, 1]),
            ("2".into(), vec![2, 3]),
        ]
    );
    // Rank 2's `send 0->1` in its TP group [2, 3] goes to global rank 3, not to the group rank
    // 1 of the other group named "2".
    let peers: BTreeSet<(u32, Option<u32>)> = colls(&trace)
        .iter()
        .filter(|c| c.op == Op::Send)
        .map(|c| (c.rank, c.peer))
        .collect();
    assert_eq!(peers, [(0, Some(1)), (2, Some(3))].into_iter().collect());
    // The two DP groups all-reduce shards of different sizes: no mismatch between them.
    assert_eq!(summary(&diagnose(dir.path())), vec![]);

    let dir = python_job("split_stuck");
    let vs = diagnose(dir.path());
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::MissingParticipant, vec![3])],
        "{vs:#?}"
    );
    let pg = vs[0].pg.as_ref().unwrap();
    assert_eq!((pg.name.as_str(), pg.ranks.clone()), ("1", vec![1, 3]));
    assert_eq!(vs[0].seq, Some(10));
}

/// FSDP's coalesced all-gathers: the ops inside a `_coalescing_manager` block stay
/// "scheduled" for good and only the closing `nccl:coalesced` entry has events, so a healthy
/// job is quiet, and a rank that never enters a block is named.
#[test]
fn coalesced_collectives_are_judged_by_the_entry_that_closes_them() {
    let dir = python_job("fsdp_healthy");
    let trace = read_dir(dir.path()).unwrap();
    assert!(!trace.stuck, "every block completed");
    assert_eq!(summary(&diagnose(dir.path())), vec![]);

    let dir = python_job("fsdp_stuck");
    let trace = read_dir(dir.path()).unwrap();
    assert!(trace.stuck);
    let vs = analyze_trace(&trace, &Config::default());
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::MissingParticipant, vec![3])],
        "{vs:#?}"
    );
    assert_eq!(vs[0].seq, Some(19), "{vs:#?}");
}

#[test]
fn a_collective_every_rank_completed_with_different_records_is_a_mismatch() {
    for (scenario, subtype, culprit) in [
        ("size", Subtype::SizeMismatch, 2),
        ("type", Subtype::TypeMismatch, 2),
        ("dtype", Subtype::DtypeMismatch, 1),
    ] {
        let dir = python_job(scenario);
        let trace = read_dir(dir.path()).unwrap();
        assert!(!trace.stuck, "{scenario}: every op completed");
        let vs = analyze_trace(&trace, &Config::default());
        assert_eq!(
            summary(&vs),
            vec![(Class::Mismatch, subtype, vec![culprit])],
            "{scenario}: {vs:#?}"
        );
        assert_eq!(vs[0].seq, Some(4), "{scenario}");
        assert_eq!(vs[0].op, Some(Op::AllReduce), "{scenario}");
        assert!(
            vs[0].evidence.iter().any(|e| e.contains("completed #4")),
            "{scenario}: {:?}",
            vs[0].evidence
        );
    }
}

/// Ranks that agree on an all_gather's input but not on its output (FR's analyzer compares
/// `output_sizes` too): the one with the odd output is named.
#[test]
fn an_output_size_every_other_rank_disagrees_with_is_a_mismatch() {
    let dir = python_job("output");
    let vs = diagnose(dir.path());
    assert_eq!(
        summary(&vs),
        vec![(Class::Mismatch, Subtype::SizeMismatch, vec![2])],
        "{vs:#?}"
    );
    assert_eq!((vs[0].seq, vs[0].op), (Some(4), Some(Op::AllGather)));
    assert!(
        vs[0].evidence.iter().any(|e| e.contains("output of 768")),
        "{:?}",
        vs[0].evidence
    );
}

#[test]
fn a_dump_on_demand_names_the_compute_straggler_from_durations() {
    let dir = python_job("straggler");
    let trace = read_dir(dir.path()).unwrap();
    assert!(
        !trace.stuck,
        "the op in flight is younger than its timeout: a dump on demand"
    );
    let vs = analyze_trace(&trace, &Config::default());
    assert_eq!(
        summary(&vs),
        vec![(Class::Slow, Subtype::ComputeStraggler, vec![2])],
        "{vs:#?}"
    );
    assert!(
        vs[0].evidence.iter().any(|e| e.contains("waits least")),
        "{:?}",
        vs[0].evidence
    );
}

#[test]
fn a_long_collective_in_flight_in_a_dump_on_demand_is_not_a_hang() {
    let dir = python_job("in_flight");
    let vs = diagnose(dir.path());
    assert_eq!(summary(&vs), vec![], "{vs:#?}");

    // The same op in flight for the watchdog's timeout is a hang.
    let dir = python_job("timeout");
    let vs = diagnose(dir.path());
    assert!(
        !vs.is_empty() && vs.iter().all(|v| v.class == Class::Hang),
        "{vs:#?}"
    );
}

/// Dumps of `world` ranks in one default group, each rank's entries from `entries(rank)`,
/// with the ops still in flight discovered started (or not) at a watchdog timeout: the
/// last time in the dumps lies a full `timeout_ms` after the oldest op in flight.
fn timeout_dumps(world: &[u32], entries: impl Fn(u32) -> Vec<FrEntry>) -> Vec<FrDump> {
    world
        .iter()
        .map(|&r| {
            let mut es = entries(r);
            for e in &mut es {
                if e.state == "started" {
                    e.time_discovered_started_ns = Some(e.time_created_ns + TIMEOUT_NS);
                }
            }
            dump(r, world, es)
        })
        .collect()
}

/// Every rank enqueued all_reduce #6 and none finished it, but one rank's entry is still
/// `scheduled` while the others' are `started`: its GPU stream never reached the collective
/// (FR records `started` when the op's start event fires on the stream). With no per-peer
/// data the analyzer cannot prove a cause, so the verdict stays undecided, but it ranks that
/// rank first, names it and says why.
#[test]
fn an_undecided_hang_ranks_the_rank_whose_op_never_started() {
    let world = [0, 1, 2, 3];
    let dumps = timeout_dumps(&world, |r| {
        let mut es: Vec<FrEntry> = (1..=5)
            .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * 1_000_000))
            .collect();
        let state = if r == 2 { "scheduled" } else { "started" };
        es.push(entry("0", 6, "nccl:all_reduce", state, 6_000_000));
        es
    });
    let trace = to_trace(&dumps);
    assert!(trace.stuck);
    let vs = analyze_trace(&trace, &Config::default());
    let v = &vs[0];
    assert_eq!(
        (v.class, v.subtype),
        (Class::Hang, Subtype::Undecided),
        "{vs:#?}"
    );
    assert_eq!(v.culprits, vec![2], "{vs:#?}");
    assert!(v.confidence < 0.45);
    assert!(
        v.evidence
            .iter()
            .any(|e| e.starts_with("candidate 1 of 1: rank 2") && e.contains("never started")),
        "{:?}",
        v.evidence
    );
}

/// When every rank's records look alike the undecided verdict names nobody and says so,
/// rather than guessing.
#[test]
fn an_undecided_hang_with_nothing_to_tell_ranks_apart_names_nobody() {
    let world = [0, 1, 2, 3];
    let dumps = timeout_dumps(&world, |_| {
        let mut es: Vec<FrEntry> = (1..=5)
            .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * 1_000_000))
            .collect();
        es.push(entry("0", 6, "nccl:all_reduce", "started", 6_000_000));
        es
    });
    let vs = analyze_trace(&to_trace(&dumps), &Config::default());
    let v = &vs[0];
    assert_eq!(v.subtype, Subtype::Undecided, "{vs:#?}");
    assert!(v.culprits.is_empty());
    assert!(
        v.evidence.iter().any(|e| e.contains("no candidate")),
        "{:?}",
        v.evidence
    );
}

/// An asynchronous collective (`async_op=True`, as DDP's bucketed all-reduces and FSDP's
/// prefetches are) runs on the group's own NCCL stream while the rank goes on working in
/// other groups. Rank 2 launched all_reduce #6 in the world group and then completed a
/// collective in its pair group: that says nothing about #6, which the other three ranks
/// completed and rank 2 did not. It is the rank stuck in #6.
#[test]
fn work_completed_in_another_group_does_not_finish_an_async_collective() {
    let world = [0, 1, 2, 3];
    let mut dumps = timeout_dumps(&world, |r| {
        let mut es: Vec<FrEntry> = (1..=5)
            .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * 1_000_000))
            .collect();
        let state = if r == 2 { "started" } else { "completed" };
        es.push(entry("0", 6, "nccl:all_reduce", state, 6_000_000));
        if r == 2 || r == 3 {
            let mut later = entry("1", 1, "nccl:all_gather", "completed", 7_000_000);
            later.pg_id = 1;
            later.process_group = ("1".to_string(), "pair".to_string());
            es.push(later);
        }
        es
    });
    for d in dumps.iter_mut().filter(|d| d.rank >= 2) {
        d.pg_config.insert(
            "1".to_string(),
            FrPg {
                name: "1".into(),
                desc: "pair".into(),
                ranks: vec![2, 3],
            },
        );
    }
    let trace = to_trace(&dumps);
    assert!(trace.stuck);
    let vs = analyze_trace(&trace, &Config::default());
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::DataplaneStall, vec![2])],
        "{vs:#?}"
    );
    assert_eq!(vs[0].seq, Some(6));
}

/// A node restarted with a stale config: each of its four ranks enqueues the gradient
/// all-reduce at half the size in its own data-parallel group (`new_group` gives every DP
/// group the same name). Each pair is a 1-against-1 tie that the groups' earlier steps settle;
/// together they are one fault of one node, reported once with all four ranks rather than as
/// four verdicts in four groups.
#[test]
fn one_nodes_ranks_failing_alike_in_many_groups_are_one_verdict() {
    let world: Vec<u32> = (0..8).collect();
    let pair = |r: u32| vec![r % 4, r % 4 + 4];
    let dumps: Vec<FrDump> = world
        .iter()
        .map(|&r| {
            let mut es: Vec<FrEntry> = (1..=6)
                .map(|s| {
                    let state = if s < 6 { "completed" } else { "started" };
                    let mut e = entry("dp", s, "nccl:all_reduce", state, s * 1_000_000);
                    e.process_group = ("dp".to_string(), "dp".to_string());
                    e.pg_id = 1;
                    if s == 6 {
                        e.time_discovered_started_ns = Some(e.time_created_ns + TIMEOUT_NS);
                        if r >= 4 {
                            e.input_sizes = vec![vec![2, 256]];
                            e.output_sizes = vec![vec![2, 256]];
                        }
                    }
                    e
                })
                .collect();
            es.sort_by_key(|e| e.record_id);
            let mut d = dump(r, &world, es);
            d.pg_config.insert(
                "dp".to_string(),
                FrPg {
                    name: "dp".into(),
                    desc: "dp".into(),
                    ranks: pair(r),
                },
            );
            d
        })
        .collect();
    let trace = to_trace(&dumps);
    assert!(trace.stuck);
    let vs = analyze_trace(&trace, &Config::default());
    assert_eq!(
        summary(&vs),
        vec![(Class::Mismatch, Subtype::SizeMismatch, vec![4, 5, 6, 7])],
        "{vs:#?}"
    );
    assert!(
        vs[0].evidence[0].contains("one node-level fault")
            && vs[0].evidence[0].contains("4 groups"),
        "{:?}",
        vs[0].evidence
    );
}

/// A TP x PP x DP job's data-parallel groups of two (Megatron's layout with dp = 2) run the
/// same program: at the first gradient all_reduce of the job, one rank of one group enqueues
/// it in BFloat16 (its mixed-precision setting differs) while its peer and every other DP
/// group run Float. The two-member group is a 1-against-1 tie with no history of its own; the
/// sibling groups say which rank changed.
#[test]
fn a_one_against_one_tie_with_no_history_is_settled_by_the_sibling_groups() {
    let world: Vec<u32> = (0..8).collect();
    // DP groups {0,4} {1,5} {2,6} {3,7}, all named "5" as split_group names them
    let group_of = |r: u32| vec![r % 4, r % 4 + 4];
    let dumps: Vec<FrDump> = world
        .iter()
        .map(|&r| {
            let mut e = entry("5", 1, "nccl:all_reduce", "started", 1_000_000);
            e.process_group.1 = "DATA_PARALLEL_GROUP".into();
            if r == 6 {
                e.input_dtypes = vec!["BFloat16".into()];
                e.output_dtypes = vec!["BFloat16".into()];
                e.input_sizes = vec![vec![2, 256]];
                e.output_sizes = vec![vec![2, 256]];
            }
            if r % 4 != 2 {
                // the other groups finished it
                e.state = "completed".into();
                e.time_discovered_completed_ns = Some(1_000_100);
            } else {
                e.time_discovered_started_ns = Some(1_000_000 + TIMEOUT_NS);
            }
            let mut d = dump(r, &world, vec![e]);
            d.pg_config.insert(
                "5".into(),
                FrPg {
                    name: "5".into(),
                    desc: "DATA_PARALLEL_GROUP".into(),
                    ranks: group_of(r),
                },
            );
            d
        })
        .collect();
    let trace = to_trace(&dumps);
    assert!(trace.stuck);
    let vs = analyze_trace(&trace, &Config::default());
    let v = &vs[0];
    assert_eq!(
        (v.class, v.subtype, v.culprits.clone()),
        (Class::Mismatch, Subtype::DtypeMismatch, vec![6]),
        "{vs:#?}"
    );
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("other groups of this size")),
        "{:?}",
        v.evidence
    );
}

/// Adds process group `name` (members `ranks`) to a dump's `pg_config`.
fn with_group(mut d: FrDump, name: &str, desc: &str, ranks: &[u32]) -> FrDump {
    d.pg_config.insert(
        name.to_string(),
        FrPg {
            name: name.into(),
            desc: desc.into(),
            ranks: ranks.to_vec(),
        },
    );
    d
}

/// A GPU hang in one tensor-parallel group of a TP x DP job, as Megatron-LM runs it: each TP
/// pair all-reduces activations per layer, and the DP groups all-reduce gradients at step end.
/// Rank 1's GPU stops inside its own compute before TP all_reduce #6: its entry stays
/// `scheduled` while its TP peer's is `started` (with TORCH_NCCL_ENABLE_TIMING the start event
/// fires when the stream reaches the op). Every CPU runs ahead to the step's end and enqueues
/// the DP gradient all_reduce, which nobody's GPU reaches, and the other TP pair (ranks 2 and
/// 3) finishes its step and waits there too. Several streams are stuck, each undecided on its
/// own; it is one fault, so one verdict: the hang begins in the TP group, the DP streams wait
/// behind it, and rank 1 is the candidate.
#[test]
fn one_gpu_hang_seen_in_many_groups_is_one_verdict_naming_its_rank() {
    let world = [0, 1, 2, 3];
    let ms = 1_000_000;
    let dumps: Vec<FrDump> = world
        .iter()
        .map(|&r| {
            let tp = if r < 2 { "tp_a" } else { "tp_b" };
            let dp = if r % 2 == 0 { "dp_a" } else { "dp_b" };
            let mut es: Vec<FrEntry> = (1..=5)
                .map(|s| entry(tp, s, "nccl:all_reduce", "completed", s * ms))
                .collect();
            let (tp_state, dp_state) = match r {
                0 => ("started", "scheduled"),
                1 => ("scheduled", "scheduled"),
                _ => ("completed", "started"),
            };
            es.push(entry(tp, 6, "nccl:all_reduce", tp_state, 6 * ms));
            es.push(entry(dp, 1, "nccl:all_reduce", dp_state, 8 * ms));
            for e in &mut es {
                if e.state == "started" {
                    e.time_discovered_started_ns = Some(e.time_created_ns + TIMEOUT_NS);
                }
            }
            let d = dump(r, &world, es);
            let d = with_group(
                d,
                tp,
                "TENSOR_MODEL_PARALLEL_GROUP",
                if r < 2 { &[0, 1] } else { &[2, 3] },
            );
            with_group(
                d,
                dp,
                "DATA_PARALLEL_GROUP",
                if r % 2 == 0 { &[0, 2] } else { &[1, 3] },
            )
        })
        .collect();
    let vs = analyze_trace(&to_trace(&dumps), &Config::default());
    assert_eq!(vs.len(), 1, "one fault, one verdict: {vs:#?}");
    let v = &vs[0];
    assert_eq!((v.class, v.subtype), (Class::Hang, Subtype::Undecided));
    assert_eq!(v.culprits, vec![1], "{vs:#?}");
    assert!(v.confidence < 0.45);
    assert_eq!(v.pg.as_ref().map(|p| p.ranks.clone()), Some(vec![0, 1]));
    assert!(
        v.evidence.iter().any(|e| e.contains("wait behind")),
        "{:?}",
        v.evidence
    );
}

/// The same hang without TORCH_NCCL_ENABLE_TIMING: no work has a start event, so every entry
/// of the stuck TP all_reduce is `scheduled` on both ranks and the records cannot tell the
/// hung GPU from its waiting peer (PyTorch's `WorkNCCL` allocates start events only with
/// timing on, so the recorder's `time_discovered_started_ns` and `pg_status`'s
/// `last_started_collective` stay empty for both). The verdict says where the hang begins,
/// says it is undecidable from these records, and ranks both members as tied candidates, each
/// with what its records show; it names no culprit.
#[test]
fn a_tp_hang_without_timing_names_its_group_and_no_culprit() {
    let world = [0, 1, 2, 3];
    let ms = 1_000_000;
    let dumps: Vec<FrDump> = world
        .iter()
        .map(|&r| {
            let tp = if r < 2 { "tp_a" } else { "tp_b" };
            let dp = if r % 2 == 0 { "dp_a" } else { "dp_b" };
            let mut es: Vec<FrEntry> = (1..=5)
                .map(|s| entry(tp, s, "nccl:all_reduce", "completed", s * ms))
                .collect();
            es.push(entry(
                tp,
                6,
                "nccl:all_reduce",
                if r < 2 { "scheduled" } else { "completed" },
                6 * ms,
            ));
            es.push(entry(dp, 1, "nccl:all_reduce", "scheduled", 8 * ms));
            for e in &mut es {
                e.time_discovered_started_ns = None;
                e.duration_ms = None;
            }
            let d = dump(r, &world, es);
            let d = with_group(
                d,
                tp,
                "TENSOR_MODEL_PARALLEL_GROUP",
                if r < 2 { &[0, 1] } else { &[2, 3] },
            );
            with_group(
                d,
                dp,
                "DATA_PARALLEL_GROUP",
                if r % 2 == 0 { &[0, 2] } else { &[1, 3] },
            )
        })
        .collect();
    // Nothing in such dumps shows when they were taken: the user says the watchdog wrote
    // them, a timeout after the stuck op.
    let mut trace = to_trace(&dumps);
    trace.stuck = true;
    trace.taken_ns = 6 * ms + TIMEOUT_NS;
    let vs = analyze_trace(&trace, &Config::default());
    assert_eq!(vs.len(), 1, "{vs:#?}");
    let v = &vs[0];
    assert_eq!(v.subtype, Subtype::Undecided);
    assert!(v.culprits.is_empty(), "{vs:#?}");
    assert_eq!(v.pg.as_ref().map(|p| p.ranks.clone()), Some(vec![0, 1]));
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("ranks 0 and 1") && e.contains("TORCH_NCCL_ENABLE_TIMING")),
        "{:?}",
        v.evidence
    );
    assert!(
        v.evidence
            .iter()
            .any(|e| e.starts_with("undecidable from these records")),
        "{:?}",
        v.evidence
    );
    assert_eq!(yard_diagnosis::timeline::candidates(v), vec![0, 1]);
    let lines: Vec<&String> = v
        .evidence
        .iter()
        .filter(|e| e.starts_with("candidate "))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines.iter().all(|e| e.contains("tied")
            && e.contains("all_reduce #6")
            && e.contains("as its peers' are")
            && e.contains("the last op it finished there is #5")),
        "{lines:?}"
    );
}

/// FSDP1-style gradient reduction: `reduce_scatter_tensor_coalesced` takes one tensor per
/// parameter, and every member must pass the same shapes. One rank built its last parameter
/// with another shape (a stale checkpoint), so the op never completes anywhere, while the
/// asynchronous reduction's rank goes on and later collectives of the group complete. The rank
/// whose sizes differ is the culprit, found from all the tensors of the entry, not its first.
#[test]
fn a_coalesced_reduce_scatter_whose_last_tensor_differs_on_one_rank_names_it() {
    let world = [0, 1, 2, 3];
    let ms = 1_000_000;
    let dumps = timeout_dumps(&world, |r| {
        let mut es: Vec<FrEntry> = (1..=4)
            .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * ms))
            .collect();
        let mut rs = entry(
            "0",
            5,
            "nccl:reduce_scatter_tensor_coalesced",
            "started",
            5 * ms,
        );
        let last = if r == 2 { 1032 } else { 1024 };
        rs.input_sizes = vec![vec![4096], vec![4096], vec![last]];
        rs.output_sizes = vec![vec![1024], vec![1024], vec![last / 4]];
        rs.input_dtypes = vec!["Float".into(); 3];
        rs.output_dtypes = vec!["Float".into(); 3];
        es.push(rs);
        es.push(entry("0", 6, "nccl:all_reduce", "completed", 7 * ms));
        es.push(entry("0", 7, "nccl:all_reduce", "scheduled", 8 * ms));
        es
    });
    let vs = analyze_trace(&to_trace(&dumps), &Config::default());
    let v = &vs[0];
    assert_eq!(
        (v.class, v.subtype),
        (Class::Mismatch, Subtype::SizeMismatch),
        "{vs:#?}"
    );
    assert_eq!(v.culprits, vec![2]);
    assert_eq!(v.seq, Some(5));
}

/// The watchdog's dump comes a timeout after the stuck op, and by then every host has run on
/// to the step's host sync: 40 more all-reduces of the group were enqueued behind #6 (a
/// tensor-parallel group runs several per layer). The stuck op's records are still there to
/// judge: rank 2's #6 never started while the others' did.
#[test]
fn a_stuck_op_is_judged_however_far_the_hosts_ran_ahead_of_it() {
    let world = [0, 1, 2, 3];
    let ms = 1_000_000;
    let dumps = timeout_dumps(&world, |r| {
        let mut es: Vec<FrEntry> = (1..=5)
            .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * ms))
            .collect();
        let state = if r == 2 { "scheduled" } else { "started" };
        es.push(entry("0", 6, "nccl:all_reduce", state, 6 * ms));
        es.extend(
            (7..=46).map(|s| entry("0", s, "nccl:all_reduce", "scheduled", 6 * ms + s * 10_000)),
        );
        es
    });
    let vs = analyze_trace(&to_trace(&dumps), &Config::default());
    let v = &vs[0];
    assert_eq!(
        (v.subtype, v.culprits.clone(), v.seq),
        (Subtype::Undecided, vec![2], Some(6)),
        "{vs:#?}"
    );
    assert!(
        v.evidence.iter().any(|e| e.contains("never started")),
        "{:?}",
        v.evidence
    );
}

/// Without TORCH_NCCL_ENABLE_TIMING no op in flight carries a start time, so nothing in the
/// dumps says when they were taken: their latest time is the last op's creation. An op every
/// rank entered just before that time is not therefore young, and a dump that does not show
/// its time is read as a timeout dump (which is why PyTorch writes one): a hang, not an op
/// caught in flight.
#[test]
fn a_dump_without_start_times_does_not_say_how_young_its_ops_are() {
    let world = [0, 1, 2, 3];
    let ms = 1_000_000;
    let dumps: Vec<FrDump> = world
        .iter()
        .map(|&r| {
            let mut es: Vec<FrEntry> = (1..=5)
                .map(|s| entry("0", s, "nccl:all_reduce", "completed", s * ms))
                .collect();
            es.push(entry("0", 6, "nccl:all_reduce", "scheduled", 6 * ms));
            for e in &mut es {
                e.duration_ms = None;
            }
            dump(r, &world, es)
        })
        .collect();
    let trace = to_trace(&dumps);
    assert!(trace.stuck && !trace.timed);
    let vs = analyze_trace(&trace, &Config::default());
    assert!(
        !vs.is_empty() && vs.iter().all(|v| v.class == Class::Hang),
        "{vs:#?}"
    );
    assert_eq!(vs[0].seq, Some(6), "{vs:#?}");
}

/// DiLoCo with two replicas of two ranks: each step runs two all-reduces in the replica
/// group (desc "replica"), then launches the outer all-reduce of each shard across replicas
/// (desc "outer") asynchronously and goes on. Rank 1 never launched its second outer
/// all-reduce: its shard's outer group [1, 3] is one rank against one (rank 3 entered #2,
/// rank 1 did not), and every rank now waits for another in a cycle (3 for 1 in the outer
/// group, 1 for 0 in their replica, 0 for 2 in the other outer group, 2 for 3 in theirs).
/// The sibling outer group says which one left the program: ranks 0, 2 and 3 entered outer #2
/// after replica op #4, and rank 1 has gone on to replica op #9 without it.
#[test]
fn an_outer_all_reduce_one_rank_never_launched_is_named_though_the_waits_form_a_cycle() {
    let world = [0, 1, 2, 3];
    let ms = 1_000_000;
    let replica = |r: u32| {
        if r < 2 {
            ("r0", [0, 1])
        } else {
            ("r1", [2, 3])
        }
    };
    let outer = |r: u32| {
        if r.is_multiple_of(2) {
            ("o0", [0, 2])
        } else {
            ("o1", [1, 3])
        }
    };
    let dumps = timeout_dumps(&world, |r| {
        let (rg, _) = replica(r);
        let (og, _) = outer(r);
        let t = |s: u64| s * 10 * ms + u64::from(r) * 10_000;
        let last_replica = match r {
            0 | 1 => 8,
            _ => 6,
        };
        let mut es = Vec::new();
        for s in 1..=last_replica {
            es.push(entry(rg, s, "nccl:all_reduce", "completed", t(s)));
            // Outer #k after replica op #2k.
            if s % 2 == 0 {
                let k = s / 2;
                let state = match (r, k) {
                    (1, 2..) => continue,
                    (3, 2) | (0, 3) => "started",
                    (_, 1) | (0 | 2, 2) => "completed",
                    _ => continue,
                };
                es.push(entry(og, k, "nccl:all_reduce", state, t(s) + 5 * ms));
            }
        }
        match r {
            1 => es.push(entry(rg, 9, "nccl:all_reduce", "started", t(9))),
            2 => es.push(entry(rg, 7, "nccl:all_reduce", "started", t(7))),
            _ => {}
        }
        es
    });
    let dumps: Vec<FrDump> = dumps
        .into_iter()
        .map(|d| {
            let r = d.rank;
            let (rg, rr) = replica(r);
            let (og, or) = outer(r);
            with_group(with_group(d, rg, "replica", &rr), og, "outer", &or)
        })
        .collect();
    let vs = analyze_trace(&to_trace(&dumps), &Config::default());
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::MissingParticipant, vec![1])],
        "{vs:#?}"
    );
    let v = &vs[0];
    assert_eq!(v.pg.as_ref().map(|p| p.ranks.clone()), Some(vec![1, 3]));
    assert_eq!(v.seq, Some(2));
    // One against one, settled by the other groups: lower than a majority's confidence.
    assert!((0.45..0.7).contains(&v.confidence), "{}", v.confidence);
    assert!(
        v.evidence.iter().any(|e| e.contains("rank 1 skipped")),
        "{:?}",
        v.evidence
    );
}

/// Three pipelines of two stages (ranks 0-2 send, ranks 3-5 receive, one op a step). Rank 4
/// dropped its receive at p2p op #3 and went on to the send that follows it in the schedule,
/// while its peer, rank 1, sends as usual: both ends of [1, 4] have an op pending and nobody is
/// "behind". The same stage of the other pipelines posted a receive at #3, so rank 4 left the
/// schedule. `name(stage0)` is the name of the pipeline group whose first stage is `stage0`.
fn dropped_receive(name: fn(u32) -> &'static str) -> Vec<Verdict> {
    let world = [0, 1, 2, 3, 4, 5];
    let ms = 1_000_000;
    let dumps = timeout_dumps(&world, |r| {
        let first = r < 3;
        (1..=5u64)
            .filter_map(|s| {
                let stuck_pipeline = r == 1 || r == 4;
                if stuck_pipeline && s > 3 {
                    return None;
                }
                let op = match (first, r == 4 && s == 3) {
                    (true, _) => "nccl:send 0->1",
                    (false, false) => "nccl:recv 1<-0",
                    (false, true) => "nccl:send 1->0",
                };
                let state = if stuck_pipeline && s == 3 {
                    "started"
                } else {
                    "completed"
                };
                Some(entry(name(r % 3), s, op, state, s * 10 * ms))
            })
            .collect()
    });
    let dumps: Vec<FrDump> = dumps
        .into_iter()
        .map(|d| {
            let stage0 = d.rank % 3;
            with_group(
                d,
                name(stage0),
                "PIPELINE_MODEL_PARALLEL_GROUP",
                &[stage0, stage0 + 3],
            )
        })
        .collect();
    analyze_trace(&to_trace(&dumps), &Config::default())
}

#[test]
fn a_pipeline_stage_whose_op_differs_from_the_same_stage_elsewhere_is_named() {
    // `split_group` and Megatron's shared names: every pipeline group is called "pp".
    let vs = dropped_receive(|_| "pp");
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::MissingParticipant, vec![4])],
        "{vs:#?}"
    );
    assert!(
        vs[0]
            .evidence
            .iter()
            .any(|e| e.contains("a send to rank 1") && e.contains("a receive from rank 1")),
        "{:?}",
        vs[0].evidence
    );
}

/// `new_group` per pipeline gives each pipeline group a name of its own ("3", "4", "5"): the
/// pipelines are still one program's siblings, by the description their groups share, and
/// their point-to-point streams are compared as the shared-name ones are.
#[test]
fn pipelines_whose_groups_each_have_their_own_name_are_still_siblings() {
    let vs = dropped_receive(|stage0| ["3", "4", "5"][stage0 as usize]);
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::MissingParticipant, vec![4])],
        "{vs:#?}"
    );
}

/// The same with three replicas: rank 1 never launched its second outer all-reduce, which
/// ranks 3 and 5 entered (a majority of its shard's outer group). Its replica mate, rank 0,
/// was held by nothing and went on to launch outer #3 alone, so it is "ahead" in its own outer
/// group [0, 2, 4], where ranks 2 and 4 are still at #2: that is the skip's doing, one
/// sentence of rank 1's verdict, not a second verdict naming rank 0.
#[test]
fn the_ranks_a_skipped_op_let_run_ahead_are_not_named_beside_it() {
    let world = [0, 1, 2, 3, 4, 5];
    let ms = 1_000_000;
    let replica = |r: u32| {
        (
            ["r0", "r1", "r2"][r as usize / 2],
            [r / 2 * 2, r / 2 * 2 + 1],
        )
    };
    let outer = |r: u32| {
        if r.is_multiple_of(2) {
            ("o0", [0, 2, 4])
        } else {
            ("o1", [1, 3, 5])
        }
    };
    let dumps = timeout_dumps(&world, |r| {
        let (rg, _) = replica(r);
        let (og, _) = outer(r);
        let t = |s: u64| s * 10 * ms + u64::from(r) * 10_000;
        let last_replica = if r < 2 { 8 } else { 6 };
        let mut es = Vec::new();
        for s in 1..=last_replica {
            es.push(entry(rg, s, "nccl:all_reduce", "completed", t(s)));
            if !s.is_multiple_of(2) {
                continue;
            }
            let k = s / 2;
            let state = match (r, k) {
                (1, 2..) => continue,
                (3 | 5, 2) | (0, 3) => "started",
                (_, 1) | (0 | 2 | 4, 2) => "completed",
                _ => continue,
            };
            es.push(entry(og, k, "nccl:all_reduce", state, t(s) + 5 * ms));
        }
        match r {
            1 => es.push(entry(rg, 9, "nccl:all_reduce", "started", t(9))),
            2 | 4 => es.push(entry(rg, 7, "nccl:all_reduce", "started", t(7))),
            _ => {}
        }
        es
    });
    let dumps: Vec<FrDump> = dumps
        .into_iter()
        .map(|d| {
            let r = d.rank;
            let (rg, rr) = replica(r);
            let (og, or) = outer(r);
            with_group(with_group(d, rg, "replica", &rr), og, "outer", &or)
        })
        .collect();
    let vs = analyze_trace(&to_trace(&dumps), &Config::default());
    assert_eq!(
        summary(&vs),
        vec![(Class::Hang, Subtype::MissingParticipant, vec![1])],
        "{vs:#?}"
    );
    assert!(
        vs[0]
            .evidence
            .iter()
            .any(|e| e.starts_with("rank 0 is ahead of the majority")),
        "{:?}",
        vs[0].evidence
    );
}
