//! The probe wire format: encode/decode round trips, hostile input, arbitrary chunking, and
//! the session that turns one connection's messages into events.

use proptest::prelude::*;
use yard_diagnosis::event::{Dir, Dtype, Event, Op, Phase};
use yard_diagnosis::wire::{
    group_frames, Decoder, Hello, Message, Session, WireError, MAX_GROUP_RANKS_PER_FRAME,
};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![proptest::sample::select(Op::ALL.to_vec()), Just(Op::Other)]
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![
        proptest::sample::select(Dtype::ALL.to_vec()),
        Just(Dtype::Other)
    ]
}

fn phase() -> impl Strategy<Value = Phase> {
    prop_oneof![Just(Phase::Enqueue), Just(Phase::Start), Just(Phase::End)]
}

fn dir() -> impl Strategy<Value = Dir> {
    prop_oneof![Just(Dir::Send), Just(Dir::Recv)]
}

/// Strings the encoder keeps intact: at most 255 bytes of UTF-8.
fn short_str() -> impl Strategy<Value = String> {
    "\\PC{0,60}".prop_filter("fits a wire string", |s| s.len() <= 255)
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            (short_str(), short_str(), short_str(), short_str()),
            proptest::collection::vec(any::<u16>(), 0..20),
        )
            .prop_map(|(rank, local_rank, pid, (job, host, nic, switch), ports)| {
                Message::Hello(Hello {
                    rank,
                    world_size: rank.saturating_add(1),
                    local_rank,
                    pid,
                    job,
                    host,
                    nic,
                    switch,
                    ports,
                })
            }),
        (
            any::<u32>(),
            short_str(),
            short_str(),
            proptest::collection::vec(any::<u32>(), 0..100)
        )
            .prop_map(|(handle, name, desc, ranks)| Message::Group {
                handle,
                name,
                desc,
                ranks
            }),
        (
            any::<u32>(),
            any::<u64>(),
            op(),
            dtype(),
            phase(),
            proptest::option::of(any::<u32>()),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                |(handle, seq, op, dtype, phase, peer, count, bytes, t_ns)| Message::Coll {
                    handle,
                    seq,
                    op,
                    dtype,
                    phase,
                    peer,
                    count,
                    bytes,
                    t_ns,
                }
            ),
        (
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            dir(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(handle, seq, peer, dir, bytes, busy_ns, t_ns)| {
                Message::Peer {
                    handle,
                    seq,
                    peer,
                    dir,
                    bytes,
                    busy_ns,
                    t_ns,
                }
            }),
        any::<u64>().prop_map(|t_ns| Message::Heartbeat { t_ns }),
        any::<u64>().prop_map(|t_ns| Message::Exit { t_ns }),
    ]
}

fn encode_all(msgs: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        m.encode(&mut out);
    }
    out
}

/// Decodes everything in `chunks`, stopping at the first error.
fn decode_chunks<'a>(
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> (Vec<Message>, Option<WireError>) {
    let mut dec = Decoder::new();
    let mut out = Vec::new();
    for chunk in chunks {
        dec.feed(chunk);
        loop {
            match dec.next_message() {
                Ok(Some(m)) => out.push(m),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

fn one_error(bytes: &[u8]) -> WireError {
    let (msgs, err) = decode_chunks([bytes]);
    assert!(msgs.is_empty(), "decoded {msgs:?} before the error");
    err.expect("an error")
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

proptest! {
    #[test]
    fn every_message_round_trips(msgs in proptest::collection::vec(message(), 1..20)) {
        let bytes = encode_all(&msgs);
        let (decoded, err) = decode_chunks([bytes.as_slice()]);
        prop_assert_eq!(err, None);
        prop_assert_eq!(decoded, msgs);
    }

    #[test]
    fn arbitrary_chunking_gives_the_same_messages(
        msgs in proptest::collection::vec(message(), 1..10),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let bytes = encode_all(&msgs);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut prev = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            chunks.push(&bytes[prev..c]);
            prev = c;
        }
        let (decoded, err) = decode_chunks(chunks);
        prop_assert_eq!(err, None);
        prop_assert_eq!(decoded, msgs);
    }

    #[test]
    fn garbage_never_panics_and_never_yields_more_than_it_was_given(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let (msgs, _err) = decode_chunks([bytes.as_slice()]);
        // Every message costs at least a 4-byte length and a type byte.
        prop_assert!(msgs.len() * 5 <= bytes.len());
    }

    #[test]
    fn any_truncation_of_a_valid_frame_is_incomplete_not_wrong(msg in message(), cut in any::<prop::sample::Index>()) {
        let bytes = encode_all(std::slice::from_ref(&msg));
        let cut = cut.index(bytes.len());
        let mut dec = Decoder::new();
        dec.feed(&bytes[..cut]);
        prop_assert_eq!(dec.next_message(), Ok(None));
        dec.feed(&bytes[cut..]);
        prop_assert_eq!(dec.next_message(), Ok(Some(msg)));
        prop_assert_eq!(dec.pending(), 0);
    }

    #[test]
    fn a_body_cut_short_is_a_truncated_frame(msg in message(), cut in any::<prop::sample::Index>()) {
        let bytes = encode_all(std::slice::from_ref(&msg));
        let body = &bytes[4..];
        let cut = 1 + cut.index(body.len() - 1);
        let err = one_error(&framed(&body[..cut]));
        prop_assert!(matches!(err, WireError::Truncated(_)), "{err}");
    }
}

#[test]
fn feeding_one_byte_at_a_time_gives_the_same_messages() {
    let msgs = vec![
        Message::Hello(Hello {
            rank: 3,
            world_size: 8,
            job: "llama".into(),
            ports: vec![29500, 29501],
            ..Hello::default()
        }),
        Message::Group {
            handle: 0,
            name: "0".into(),
            desc: "default_pg".into(),
            ranks: (0..8).collect(),
        },
        Message::Coll {
            handle: 0,
            seq: 1,
            op: Op::Send,
            dtype: Dtype::BFloat16,
            phase: Phase::Start,
            peer: Some(4),
            count: 10,
            bytes: 20,
            t_ns: 99,
        },
        Message::Exit { t_ns: 100 },
    ];
    let bytes = encode_all(&msgs);
    let (decoded, err) = decode_chunks(bytes.chunks(1));
    assert_eq!(err, None);
    assert_eq!(decoded, msgs);
}

#[test]
fn oversize_and_empty_frames_are_rejected_by_their_length() {
    let err = one_error(&70000u32.to_le_bytes());
    assert_eq!(err, WireError::FrameTooLarge(70000));
    assert_eq!(
        err.to_string(),
        "frame length 70000 exceeds the 4096-byte limit"
    );
    assert_eq!(one_error(&0u32.to_le_bytes()), WireError::EmptyFrame);
    // 4096 is allowed: the decoder waits for the body rather than rejecting it.
    let mut dec = Decoder::new();
    dec.feed(&4096u32.to_le_bytes());
    assert_eq!(dec.next_message(), Ok(None));
}

#[test]
fn bad_codes_are_named() {
    assert_eq!(
        one_error(&framed(&[9])).to_string(),
        "unknown message type 9"
    );

    let mut coll = Vec::new();
    Message::Coll {
        handle: 0,
        seq: 1,
        op: Op::AllReduce,
        dtype: Dtype::Float32,
        phase: Phase::End,
        peer: None,
        count: 1,
        bytes: 4,
        t_ns: 5,
    }
    .encode(&mut coll);
    let op_at = 4 + 1 + 4 + 8;
    let mut bad = coll.clone();
    bad[op_at] = 77;
    assert_eq!(one_error(&bad).to_string(), "unknown op code 77");
    let mut bad = coll.clone();
    bad[op_at + 1] = 200;
    assert_eq!(one_error(&bad), WireError::UnknownDtype(200));
    let mut bad = coll.clone();
    bad[op_at + 2] = 3;
    assert_eq!(one_error(&bad), WireError::UnknownPhase(3));
    assert_eq!(
        one_error(&framed(&coll[4..coll.len() - 1])).to_string(),
        "truncated COLL frame"
    );
    let mut long = coll[4..].to_vec();
    long.push(0);
    assert_eq!(
        one_error(&framed(&long)),
        WireError::TrailingBytes {
            kind: "COLL",
            extra: 1
        }
    );
}

#[test]
fn bad_strings_and_versions_in_hello_are_named() {
    let mut hello = Vec::new();
    Message::Hello(Hello {
        world_size: 1,
        job: "ab".into(),
        ..Hello::default()
    })
    .encode(&mut hello);
    let job_at = 4 + 1 + 2 + 16 + 2;
    let mut bad = hello.clone();
    bad[job_at] = 0xff;
    assert_eq!(one_error(&bad).to_string(), "invalid utf-8 in job name");
    let mut bad = hello.clone();
    bad[5] = 2;
    assert_eq!(one_error(&bad), WireError::UnsupportedVersion(2));
    let mut bad = hello.clone();
    bad[job_at - 2..job_at].copy_from_slice(&300u16.to_le_bytes());
    assert_eq!(
        one_error(&bad).to_string(),
        "job name is 300 bytes, over the 255-byte limit"
    );
}

#[test]
fn errors_are_sticky() {
    let mut dec = Decoder::new();
    dec.feed(&framed(&[9]));
    assert_eq!(dec.next_message(), Err(WireError::UnknownType(9)));
    let mut ok = Vec::new();
    Message::Heartbeat { t_ns: 1 }.encode(&mut ok);
    dec.feed(&ok);
    assert_eq!(dec.next_message(), Err(WireError::UnknownType(9)));
}

fn hello(rank: u32, host: &str) -> Message {
    Message::Hello(Hello {
        rank,
        world_size: 4,
        local_rank: rank,
        pid: 1234,
        job: "job-a".into(),
        host: host.into(),
        nic: "eth0".into(),
        switch: "tor1".into(),
        ports: vec![29500],
    })
}

fn coll(handle: u32) -> Message {
    Message::Coll {
        handle,
        seq: 7,
        op: Op::AllReduce,
        dtype: Dtype::Float16,
        phase: Phase::Enqueue,
        peer: None,
        count: 8,
        bytes: 16,
        t_ns: 42,
    }
}

#[test]
fn session_requires_hello_first_and_once() {
    let mut s = Session::new("node1", "198.18.0.1");
    let err = s.accept(coll(0)).expect_err("coll before hello");
    assert_eq!(err.to_string(), "first frame must be HELLO");
    assert_eq!(
        s.accept(Message::Heartbeat { t_ns: 1 }),
        Err(WireError::HelloFirst)
    );
    s.accept(hello(1, "")).expect("hello");
    assert_eq!(s.accept(hello(1, "")), Err(WireError::DuplicateHello));
}

#[test]
fn session_rejects_a_rank_outside_the_world() {
    let mut s = Session::new("node1", "198.18.0.1");
    let err = s.accept(hello(4, "")).expect_err("rank 4 of 4");
    assert_eq!(err.to_string(), "rank 4 is outside world size 4");
    assert!(s.job().is_none());
}

#[test]
fn session_turns_messages_into_events() {
    let mut s = Session::new("node1", "198.18.0.1");
    let Some(Event::Member(m)) = s.accept(hello(2, "")).expect("hello") else {
        panic!("hello makes a member");
    };
    assert_eq!(
        (m.rank, m.world_size, m.pid),
        (2, 4, 1234),
        "member fields from hello"
    );
    assert_eq!(m.host, "node1", "empty host is filled by the node");
    assert_eq!(m.addr, "198.18.0.1");
    assert_eq!((m.nic.as_str(), m.switch.as_str()), ("eth0", "tor1"));
    assert_eq!(s.job(), Some("job-a"));
    assert_eq!(s.rank(), Some(2));
    assert_eq!(s.ports(), &[29500]);

    let err = s.accept(coll(5)).expect_err("unknown handle");
    assert_eq!(err.to_string(), "unknown group handle 5");

    let Some(Event::Group(g)) = s
        .accept(Message::Group {
            handle: 5,
            name: "tp".into(),
            desc: "tensor parallel".into(),
            ranks: vec![2, 3],
        })
        .expect("group")
    else {
        panic!("group makes a group");
    };
    assert_eq!((&*g.name, g.ranks.as_slice()), ("tp", &[2, 3][..]));

    let Some(Event::Coll(c)) = s.accept(coll(5)).expect("coll") else {
        panic!("coll makes a coll");
    };
    assert_eq!((c.rank, &*c.pg, c.seq, c.op), (2, "tp", 7, Op::AllReduce));
    assert!(
        std::sync::Arc::ptr_eq(&c.pg, &g.name),
        "pg names are interned per session"
    );

    let peer = Message::Peer {
        handle: 5,
        seq: 7,
        peer: 3,
        dir: Dir::Send,
        bytes: 100,
        busy_ns: 5,
        t_ns: 50,
    };
    let Some(Event::Peer(p)) = s.accept(peer).expect("peer") else {
        panic!("peer makes a peer");
    };
    assert_eq!((p.rank, p.peer, p.bytes, &*p.pg), (2, 3, 100, "tp"));
    assert_eq!(
        s.accept(Message::Heartbeat { t_ns: 9 }),
        Ok(Some(Event::Heartbeat { rank: 2, t_ns: 9 }))
    );
    assert_eq!(
        s.accept(Message::Exit { t_ns: 10 }),
        Ok(Some(Event::Exit { rank: 2, t_ns: 10 }))
    );
}

#[test]
fn session_keeps_a_client_supplied_host() {
    let mut s = Session::new("node1", "198.18.0.1");
    let Ok(Some(Event::Member(m))) = s.accept(hello(0, "gpu-17")) else {
        panic!("hello makes a member");
    };
    assert_eq!(m.host, "gpu-17");
}

#[test]
fn a_large_group_spans_frames_and_is_reassembled() {
    let ranks: Vec<u32> = (0..2500).collect();
    let frames = group_frames(1, "0", "default_pg", &ranks);
    assert_eq!(frames.len(), 2500_usize.div_ceil(MAX_GROUP_RANKS_PER_FRAME));
    let bytes = encode_all(&frames);
    let (decoded, err) = decode_chunks([bytes.as_slice()]);
    assert_eq!(err, None);

    let mut s = Session::new("node1", "198.18.0.1");
    s.accept(Message::Hello(Hello {
        world_size: 2500,
        ..Hello::default()
    }))
    .expect("hello");
    let mut last = None;
    for m in decoded {
        last = s.accept(m).expect("group frame");
    }
    let Some(Event::Group(g)) = last else {
        panic!("group frames make groups");
    };
    assert_eq!(g.ranks, ranks);

    let renamed = Message::Group {
        handle: 1,
        name: "other".into(),
        desc: String::new(),
        ranks: vec![],
    };
    assert!(matches!(
        s.accept(renamed),
        Err(WireError::GroupRenamed { handle: 1, .. })
    ));
}

#[test]
fn an_empty_group_is_one_frame() {
    assert_eq!(group_frames(0, "x", "", &[]).len(), 1);
}

/// Issue 25: a GROUP frame repeated on one connection appended its ranks again each time,
/// and every repeat produced an event carrying the whole, ever longer, list.
#[test]
fn a_repeated_group_frame_does_not_grow_the_session() {
    let mut s = Session::new("node1", "198.18.0.1");
    s.accept(hello(0, "")).expect("hello");
    let frame = Message::Group {
        handle: 1,
        name: "0".into(),
        desc: String::new(),
        ranks: vec![0, 1, 2, 3, 1],
    };
    let Ok(Some(Event::Group(g))) = s.accept(frame.clone()) else {
        panic!("the first frame declares the group");
    };
    assert_eq!(g.ranks, [0, 1, 2, 3], "a rank listed twice is one member");
    for _ in 0..1000 {
        assert_eq!(
            s.accept(frame.clone()),
            Ok(None),
            "a repeat changes nothing"
        );
    }
}

#[test]
fn a_connection_binds_a_bounded_number_of_groups() {
    let mut s = Session::new("node1", "198.18.0.1");
    s.accept(hello(0, "")).expect("hello");
    let group = |handle| Message::Group {
        handle,
        name: format!("g{handle}"),
        desc: String::new(),
        ranks: vec![0],
    };
    for h in 0..yard_diagnosis::wire::MAX_SESSION_GROUPS as u32 {
        s.accept(group(h)).expect("within the bound");
    }
    assert_eq!(
        s.accept(group(u32::MAX)),
        Err(WireError::TooManyGroups),
        "one handle past the bound"
    );
}
