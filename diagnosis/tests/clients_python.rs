//! The Python package (`clients/python/yard_probe`) against the Rust decoder and session, so
//! the two implementations of the wire format are proven to agree; and the package's own
//! unittest suite, so CI runs it. python3 on PATH is required: these tests fail without it.
//! The suite's `test_torch_real.py` also needs real torch at `/usr/bin/python3` (or
//! `$YARD_TORCH_PYTHON`): Debian's `python3-torch`, which `deploy/install-deps.sh` installs.

mod clients_support;

use clients_support::{count, FakeNode};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use yard_diagnosis::event::{Dir, Dtype, Event, Op, Phase};
use yard_diagnosis::wire::Message;

fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/python")
}

const SCRIPT: &str = r#"
from yard_probe import Probe, wire
probe = Probe("job-py", rank=3, world_size=4, nic="mlx5_0", switch="tor-2", ports=[29500, 29501])
pg = probe.group("0", list(range(4)), desc="default_pg")
big = probe.group("big", list(range(2000)), desc="huge")
with probe.collective(pg, "all_gather_into_tensor", 1000, dtype="bfloat16"):
    pass
with probe.collective(pg, "recv", 10, dtype="torch.int64", peer=1):
    pass
probe.peer(pg, 1, 1, wire.RECV, 80, busy_ns=7)
probe.exit()
probe.close()
assert probe.dropped == 0, probe.dropped
"#;

#[test]
fn python_client_frames_decode_in_rust() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = FakeNode::start(&dir.path().join("probe.sock"));
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .env("PYTHONPATH", python_dir())
        .env("YARD_PROBE_SOCKET", &node.path)
        .output()
        .expect("python3 must be on PATH to test the Python client");
    assert!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.wait_until(Duration::from_secs(10), |s| {
        count(s, |m| matches!(m, Message::Exit { .. })) == 1
    });

    let events = node.events();
    let Event::Member(m) = events[0] else {
        panic!("member first: {events:?}")
    };
    assert_eq!(
        (
            m.rank,
            m.world_size,
            m.host.as_str(),
            m.nic.as_str(),
            m.switch.as_str()
        ),
        (3, 4, "node1", "mlx5_0", "tor-2")
    );
    let hello = node
        .messages()
        .into_iter()
        .find_map(|m| match m {
            Message::Hello(h) => Some(h.clone()),
            _ => None,
        })
        .expect("a hello");
    assert_eq!(
        (hello.job.as_str(), hello.ports.as_slice()),
        ("job-py", &[29500, 29501][..])
    );

    let groups: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Group(g) => Some(g),
            _ => None,
        })
        .collect();
    assert_eq!((&*groups[0].name, groups[0].ranks.len()), ("0", 4));
    let last_big = groups
        .iter()
        .rev()
        .find(|g| &*g.name == "big")
        .expect("big group");
    assert_eq!(
        last_big.ranks,
        (0..2000).collect::<Vec<_>>(),
        "reassembled across frames"
    );

    let colls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c) => Some((c.seq, c.op, c.dtype, c.count, c.bytes, c.peer, c.phase)),
            _ => None,
        })
        .collect();
    let phases = [Phase::Enqueue, Phase::Start, Phase::End];
    let expected: Vec<_> = phases
        .map(|p| (1, Op::AllGather, Dtype::BFloat16, 1000, 2000, None, p))
        .into_iter()
        .chain(phases.map(|p| (1, Op::Recv, Dtype::Int64, 10, 80, Some(1), p)))
        .collect();
    assert_eq!(colls, expected);
    assert!(events.iter().any(|e| matches!(e,
        Event::Peer(p) if p.rank == 3 && p.peer == 1 && p.dir == Dir::Recv && p.bytes == 80 && p.busy_ns == 7)));
    assert!(matches!(events.last(), Some(Event::Exit { rank: 3, .. })));
}

#[test]
fn python_unit_tests_pass() {
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s"])
        .arg(python_dir().join("tests"))
        .output()
        .expect("python3 must be on PATH to test the Python client");
    assert!(
        out.status.success(),
        "python unit tests failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
