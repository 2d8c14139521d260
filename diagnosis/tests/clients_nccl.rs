//! The NCCL profiler plugin (`clients/nccl-profiler`): built with make/cc into a temp dir,
//! driven by the C harness the way NCCL drives it for two all_reduce ops, against the Rust
//! decoder and session; and its ABI checked against NCCL's own headers. make, cc and c++ are
//! required, and for the ABI check apt and Debian's archive once (then a cache): these tests
//! fail without them.

mod clients_support;

use clients_support::{count, FakeNode};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use yard_diagnosis::event::{Dir, Dtype, Event, Op, Phase};
use yard_diagnosis::wire::Message;

fn plugin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/nccl-profiler")
}

/// Builds the plugin and harness into `out`; returns (plugin .so, harness binary).
fn build(out: &std::path::Path) -> (PathBuf, PathBuf) {
    let status = Command::new("make")
        .arg("-C")
        .arg(plugin_dir())
        .arg(format!("OUT={}", out.display()))
        .args(["all", "harness"])
        .status()
        .expect("make must be on PATH to build the NCCL plugin");
    assert!(status.success(), "building the NCCL plugin failed");
    (out.join("libnccl-profiler-yard.so"), out.join("harness"))
}

/// Through the v5 table (NCCL 2.28 and later) and the v4 one (NCCL 2.27): the same report.
#[test]
fn plugin_reports_what_nccl_tells_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plugin, harness) = build(dir.path());
    for version in ["5", "4"] {
        reports_through(
            &plugin,
            &harness,
            version,
            &dir.path().join(format!("v{version}.sock")),
        );
    }
}

fn reports_through(plugin: &Path, harness: &Path, version: &str, sock: &Path) {
    let mut node = FakeNode::start(sock);
    let out = Command::new(harness)
        .arg(plugin)
        .arg(version)
        .env("YARD_PROBE_SOCKET", &node.path)
        .env("YARD_JOB", "job-nccl")
        .env("YARD_PORTS", "29500,29501")
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .output()
        .expect("run the harness");
    assert!(
        out.status.success(),
        "harness (v{version}) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "dropped 0",
        "nothing dropped with a node reading"
    );
    node.wait_until(Duration::from_secs(10), |s| {
        count(s, |m| matches!(m, Message::Exit { .. })) == 1
    });

    let hello = match node.messages()[0] {
        Message::Hello(h) => h.clone(),
        other => panic!("hello first, got {other:?}"),
    };
    assert_eq!(
        (
            hello.rank,
            hello.world_size,
            hello.job.as_str(),
            hello.ports.as_slice()
        ),
        (0, 2, "job-nccl", &[29500, 29501][..])
    );

    let events = node.events();
    let Event::Group(g) = events[1] else {
        panic!("then the communicator's group: {events:?}")
    };
    assert_eq!(
        &*g.name, "nccl:000000001234abcd",
        "unnamed comms are named by commId"
    );
    assert_eq!(g.ranks, [0, 1], "a world communicator lists every rank");

    let colls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c) => Some((c.seq, c.phase, c.op, c.dtype, c.count, c.bytes, c.peer)),
            _ => None,
        })
        .collect();
    let expected: Vec<_> = [1, 2]
        .into_iter()
        .flat_map(|seq| {
            [Phase::Enqueue, Phase::Start, Phase::End]
                .map(|p| (seq, p, Op::AllReduce, Dtype::Float32, 1024, 4096, None))
        })
        .collect();
    assert_eq!(
        colls, expected,
        "end comes only after kernels and proxies finish"
    );

    // The last PEER record per (seq, dir) carries the op's totals: two 2048-byte steps.
    for seq in [1, 2] {
        for dir in [Dir::Send, Dir::Recv] {
            let last = events
                .iter()
                .rev()
                .find_map(|e| match e {
                    Event::Peer(p) if p.seq == seq && p.dir == dir => Some(p),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("a PEER record for seq {seq} {dir:?}"));
            assert_eq!((last.peer, last.bytes), (1, 4096), "seq {seq} {dir:?}");
            if dir == Dir::Recv {
                assert!(last.busy_ns >= 1_000_000, "recv waits ~1 ms per step");
            }
        }
    }
    assert!(matches!(events.last(), Some(Event::Exit { rank: 0, .. })));
}

#[test]
fn plugin_without_a_node_drops_and_carries_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (plugin, harness) = build(dir.path());
    let out = Command::new(&harness)
        .arg(&plugin)
        .env("YARD_PROBE_SOCKET", dir.path().join("absent.sock"))
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run the harness");
    assert!(out.status.success(), "the plugin must not fail NCCL");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dropped: u64 = stdout
        .trim()
        .strip_prefix("dropped ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected harness output {stdout:?}"));
    assert!(
        dropped >= 7,
        "every record was dropped and counted, got {dropped}"
    );
}

/// `make check-abi`: the plugin's structs, enum values and function table against NCCL's own
/// profiler headers (from Debian's nvidia-nccl source package), and its exported symbols
/// against what NCCL's loader looks up. See clients/nccl-profiler/test/check-abi.sh.
#[test]
fn plugin_abi_matches_nccls_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("make")
        .arg("-C")
        .arg(plugin_dir())
        .arg(format!("OUT={}", dir.path().display()))
        .arg("check-abi")
        .output()
        .expect("make must be on PATH to check the NCCL plugin's ABI");
    assert!(
        out.status.success(),
        "the NCCL plugin's ABI check failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
