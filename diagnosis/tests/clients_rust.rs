//! The Rust probe client against a fake node decoding with the real wire module.

mod clients_support;

use clients_support::{count, FakeNode, Seen};
use std::time::{Duration, Instant};
use yard_diagnosis::client::{CollCall, ProbeClient};
use yard_diagnosis::event::{Dir, Dtype, Event, Op, Phase};
use yard_diagnosis::wire::{Hello, Message};

const WAIT: Duration = Duration::from_secs(10);

fn hello(rank: u32) -> Hello {
    Hello {
        rank,
        world_size: 2,
        local_rank: rank,
        pid: std::process::id(),
        job: "job-rust".into(),
        ports: vec![29500],
        ..Hello::default()
    }
}

#[test]
fn reports_hello_group_collective_phases_and_peer_progress() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = FakeNode::start(&dir.path().join("probe.sock"));
    let client = ProbeClient::connect(&node.path, hello(1));
    let pg = client.group("0", "default_pg", &[0, 1]);
    let seq = client.next_seq(pg);
    assert_eq!(seq, 1, "seq starts at 1 like collective_seq_id");
    assert_eq!(client.next_seq(pg), 2);
    assert_eq!(client.next_p2p_seq(pg), 1, "p2p ops have their own counter");
    let call = CollCall {
        group: pg,
        seq,
        op: Op::AllReduce,
        dtype: Dtype::BFloat16,
        count: 1024,
        bytes: 2048,
        peer: None,
    };
    for phase in [Phase::Enqueue, Phase::Start, Phase::End] {
        client.coll(&call, phase);
    }
    client.peer(pg, seq, 0, Dir::Recv, 2048, 500);
    client.exit();

    node.wait_until(WAIT, |s| {
        count(s, |m| matches!(m, Message::Exit { .. })) == 1
    });
    let events: Vec<_> = node.events().into_iter().cloned().collect();
    let Event::Member(m) = &events[0] else {
        panic!("first event is the member: {events:?}")
    };
    assert_eq!((m.rank, m.world_size, m.host.as_str()), (1, 2, "node1"));
    let Event::Group(g) = &events[1] else {
        panic!("then the group: {events:?}")
    };
    assert_eq!(
        (&*g.name, g.desc.as_str(), g.ranks.as_slice()),
        ("0", "default_pg", &[0, 1][..])
    );
    let phases: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Coll(c) => Some((c.seq, c.op, c.dtype, c.bytes, c.phase)),
            _ => None,
        })
        .collect();
    assert_eq!(
        phases,
        [Phase::Enqueue, Phase::Start, Phase::End].map(|p| (
            1,
            Op::AllReduce,
            Dtype::BFloat16,
            2048,
            p
        ))
    );
    assert!(events.iter().any(
        |e| matches!(e, Event::Peer(p) if p.peer == 0 && p.dir == Dir::Recv && p.bytes == 2048)
    ));
    assert!(matches!(events.last(), Some(Event::Exit { rank: 1, .. })));
    assert_eq!(client.dropped(), 0);
}

/// A rank's last frame is its EXIT: a heartbeat sent after it (the background thread may have
/// decided to beat just before `exit`; a CI run saw it) would make the node think the rank
/// alive again and then dead.
#[test]
fn nothing_follows_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = FakeNode::start(&dir.path().join("probe.sock"));
    let client = ProbeClient::connect(&node.path, hello(0));
    let pg = client.group("0", "default_pg", &[0, 1]);
    client.exit();
    client.heartbeat();
    let call = CollCall {
        group: pg,
        seq: client.next_seq(pg),
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        count: 1,
        bytes: 4,
        peer: None,
    };
    client.coll(&call, Phase::Enqueue);
    assert_eq!(client.dropped(), 2, "both frames after EXIT are dropped");
    drop(client);
    node.wait_until(WAIT, |s| {
        count(s, |m| matches!(m, Message::Exit { .. })) == 1
    });
    std::thread::sleep(Duration::from_millis(300));
    let messages = node.messages();
    assert!(
        matches!(messages.last(), Some(Message::Exit { .. })),
        "EXIT is the last frame: {messages:?}"
    );
}

#[test]
fn heartbeats_flow_without_any_activity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = FakeNode::start(&dir.path().join("probe.sock"));
    let client = ProbeClient::connect(&node.path, hello(0));
    let started = Instant::now();
    node.wait_until(WAIT, |s| {
        count(s, |m| matches!(m, Message::Heartbeat { .. })) >= 3
    });
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "three beats take about 300 ms"
    );
    let before = Instant::now();
    drop(client);
    assert!(
        before.elapsed() < Duration::from_millis(500),
        "drop stops the heartbeat thread promptly"
    );
}

#[test]
fn without_a_node_events_are_dropped_and_counted_quickly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let client = ProbeClient::connect(dir.path().join("absent.sock"), hello(0));
    let pg = client.group("0", "", &[0, 1]);
    let call = CollCall {
        group: pg,
        seq: client.next_seq(pg),
        op: Op::Barrier,
        dtype: Dtype::UInt8,
        count: 0,
        bytes: 0,
        peer: None,
    };
    let start = Instant::now();
    for _ in 0..1000 {
        client.coll(&call, Phase::Enqueue);
    }
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "sending never waits"
    );
    assert!(client.dropped() >= 1000);
    assert!(!client.is_connected());
}

#[test]
fn a_full_socket_drops_events_instead_of_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("probe.sock");
    // A node that accepts but never reads.
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let client = ProbeClient::connect(&path, hello(0));
    let (_conn, _) = listener.accept().expect("accept");
    let pg = client.group("0", "", &[0]);
    let call = CollCall {
        group: pg,
        seq: 1,
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        count: 1,
        bytes: 4,
        peer: None,
    };
    let start = Instant::now();
    for _ in 0..100_000 {
        client.coll(&call, Phase::Start);
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "sending never waits"
    );
    assert!(client.dropped() > 0, "a full socket buffer drops events");
    assert!(client.is_connected(), "a slow node is not a dead node");
}

#[test]
fn reconnects_after_a_node_restart_and_replays_hello_and_groups() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("probe.sock");
    let mut node = FakeNode::start(&path);
    let client = ProbeClient::connect(&path, hello(1));
    let pg = client.group("7", "tp", &[0, 1]);
    node.wait_until(WAIT, |s| {
        count(s, |m| matches!(m, Message::Group { .. })) == 1
    });
    node.kill();

    let mut node = FakeNode::start(&path);
    let call = CollCall {
        group: pg,
        seq: client.next_seq(pg),
        op: Op::AllGather,
        dtype: Dtype::Float32,
        count: 4,
        bytes: 16,
        peer: None,
    };
    // The heartbeat thread notices the dead connection and reconnects on its own.
    node.wait_until(WAIT, |s| {
        count(s, |m| matches!(m, Message::Heartbeat { .. })) >= 1
    });
    client.coll(&call, Phase::Enqueue);
    node.wait_until(WAIT, |s| {
        count(s, |m| matches!(m, Message::Coll { .. })) == 1
    });
    let msgs = node.messages();
    assert!(
        matches!(msgs[0], Message::Hello(h) if h.rank == 1 && h.job == "job-rust"),
        "hello first after reconnect: {msgs:?}"
    );
    assert!(
        matches!(msgs[1], Message::Group { name, ranks, .. } if name == "7" && ranks == &[0, 1]),
        "then the groups: {msgs:?}"
    );
    assert!(matches!(node.seen[0], Seen::Connected(0)));
}
