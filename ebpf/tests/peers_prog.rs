//! `yard_peers` under BPF_PROG_TEST_RUN: what is counted for which peer and direction, every
//! reason a packet is not, every truncation, a full peer map, and a seeded fuzz run against a
//! reference model; then real traffic between two network namespaces. Needs root.

mod common;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use common::{require_root, NetnsPair};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yard_ebpf::frames::{self, Arp, HostFrame, IP_DF, IP_MF};
use yard_ebpf::layout::{PEERS_MAX, PEERS_PORTS_MAX};
use yard_ebpf::{
    ktime_now_ns, CounterValue, Direction, EbpfError, PeerCounter, PeerCounters, PeerStat, TcAction,
};

/// The job's registered port (a torch.distributed-like rendezvous/data port).
const JOB_PORT: u16 = 29500;
const OTHER_JOB_PORT: u16 = 29600;
const EPHEMERAL: u16 = 41234;
const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PEER2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const PAYLOAD: &[u8] = b"all_reduce chunk: 64 bytes of gradient, give or take a few...";

fn loaded() -> PeerCounters {
    require_root();
    let mut pc = PeerCounters::load().expect("load the peers programs");
    pc.set_ports(&[JOB_PORT, OTHER_JOB_PORT]).unwrap();
    pc
}

/// Traffic from PEER to LOCAL's job port, as received.
fn udp_in() -> HostFrame {
    HostFrame::udp(PEER, EPHEMERAL, LOCAL, JOB_PORT, PAYLOAD)
}

fn counter_map(pc: &PeerCounters) -> HashMap<PeerCounter, CounterValue> {
    pc.counters().unwrap().into_iter().collect()
}

/// Whether BPF_PROG_TEST_RUN refuses `frame` before the program runs: for an skb program the
/// kernel pulls the whole IPv4 (IPv6) header of a frame whose ethertype says IPv4 (IPv6), and
/// answers EINVAL if the frame is shorter. A NIC can deliver such a frame all the same; the
/// program's answer to it is tested through VLAN-tagged frames, which the kernel does not pull.
fn kernel_refuses(frame: &[u8]) -> bool {
    match frames::u16_at(frame, 12) {
        Some(frames::ETHERTYPE_IPV4) => frame.len() < frames::ETH_LEN + frames::IPV4_LEN,
        Some(frames::ETHERTYPE_IPV6) => frame.len() < frames::ETH_LEN + 40,
        _ => false,
    }
}

/// Runs `frame` once in `dir` and returns the one reason that moved, asserting that exactly
/// one moved, by one packet and the frame's length in bytes, and that the verdict is "no
/// verdict": the program never decides a packet's fate. `None` if the kernel refused the frame,
/// asserting that it refused exactly the frames [`kernel_refuses`] predicts.
fn try_run(pc: &PeerCounters, dir: Direction, frame: &[u8]) -> Option<PeerCounter> {
    let refused = kernel_refuses(frame);
    let before = counter_map(pc);
    let action = match pc.test_run(dir, frame) {
        Err(EbpfError::Program { .. }) if refused => return None,
        Err(e) => panic!("test run of {} bytes: {e:?}", frame.len()),
        Ok(_) if refused => panic!("the kernel ran a frame it should refuse: {frame:02x?}"),
        Ok(action) => action,
    };
    let after = counter_map(pc);
    assert_eq!(action, TcAction::Unspec, "never a verdict");
    Some(common::the_one_moved(
        &PeerCounter::ALL,
        &before,
        &after,
        frame,
    ))
}

/// [`try_run`] of a frame the kernel accepts.
fn run(pc: &PeerCounters, dir: Direction, frame: &[u8]) -> PeerCounter {
    try_run(pc, dir, frame).expect("the kernel refused the frame")
}

/// The peer entries without their times, for comparisons.
fn totals(pc: &PeerCounters) -> Vec<(Ipv4Addr, Direction, u64, u64)> {
    pc.read()
        .unwrap()
        .into_iter()
        .map(|s| (s.peer, s.dir, s.bytes, s.packets))
        .collect()
}

#[test]
fn udp_to_a_registered_port_counts_for_the_sender_on_ingress() {
    let pc = loaded();
    let frame = udp_in().build();
    let t0 = ktime_now_ns();
    assert_eq!(run(&pc, Direction::Ingress, &frame), PeerCounter::Counted);
    let t1 = ktime_now_ns();
    let stats = pc.read().unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    let PeerStat {
        peer,
        dir,
        bytes,
        packets,
        last_ns,
    } = stats[0];
    assert_eq!((peer, dir), (PEER, Direction::Ingress));
    assert_eq!((bytes, packets), (frame.len() as u64, 1));
    assert!((t0..=t1).contains(&last_ns), "{t0} <= {last_ns} <= {t1}");
}

#[test]
fn tcp_from_a_registered_port_counts_for_the_receiver_on_egress() {
    let pc = loaded();
    let frame = HostFrame::tcp(LOCAL, JOB_PORT, PEER, EPHEMERAL, PAYLOAD).build();
    assert_eq!(run(&pc, Direction::Egress, &frame), PeerCounter::Counted);
    assert_eq!(
        totals(&pc),
        vec![(PEER, Direction::Egress, frame.len() as u64, 1)]
    );
}

#[test]
fn the_remote_side_port_counts_too_and_direction_picks_the_peer_address() {
    let pc = loaded();
    // This host connected out to a peer's job port: remote side registered, local ephemeral.
    let out = HostFrame::tcp(LOCAL, EPHEMERAL, PEER, OTHER_JOB_PORT, PAYLOAD).build();
    let back = HostFrame::tcp(PEER, OTHER_JOB_PORT, LOCAL, EPHEMERAL, b"ack").build();
    assert_eq!(run(&pc, Direction::Egress, &out), PeerCounter::Counted);
    assert_eq!(run(&pc, Direction::Ingress, &back), PeerCounter::Counted);
    assert_eq!(run(&pc, Direction::Ingress, &back), PeerCounter::Counted);
    assert_eq!(
        totals(&pc),
        vec![
            (PEER, Direction::Ingress, 2 * back.len() as u64, 2),
            (PEER, Direction::Egress, out.len() as u64, 1),
        ]
    );
}

#[test]
fn peers_are_kept_apart_and_accumulate() {
    let mut pc = loaded();
    let a = udp_in().build();
    let b = HostFrame::udp(PEER2, EPHEMERAL, LOCAL, JOB_PORT, &PAYLOAD[..10]).build();
    for _ in 0..3 {
        assert_eq!(run(&pc, Direction::Ingress, &a), PeerCounter::Counted);
    }
    assert_eq!(run(&pc, Direction::Ingress, &b), PeerCounter::Counted);
    assert_eq!(
        totals(&pc),
        vec![
            (PEER, Direction::Ingress, 3 * a.len() as u64, 3),
            (PEER2, Direction::Ingress, b.len() as u64, 1),
        ]
    );
    // A job ends: its peers are forgotten, the reasons are not.
    pc.clear().unwrap();
    assert!(pc.read().unwrap().is_empty());
    assert_eq!(counter_map(&pc)[&PeerCounter::Counted].packets, 4);
}

#[test]
fn unregistered_ports_count_nothing_for_any_peer() {
    let pc = loaded();
    for (dir, frame) in [
        (
            Direction::Ingress,
            HostFrame::udp(PEER, 5353, LOCAL, 5353, PAYLOAD),
        ),
        (
            Direction::Egress,
            HostFrame::tcp(LOCAL, EPHEMERAL, PEER, 443, PAYLOAD),
        ),
    ] {
        assert_eq!(run(&pc, dir, &frame.build()), PeerCounter::NotJob);
    }
    assert!(pc.read().unwrap().is_empty());
}

#[test]
fn set_ports_replaces_the_set() {
    let mut pc = loaded();
    assert_eq!(pc.ports().unwrap(), vec![JOB_PORT, OTHER_JOB_PORT]);
    pc.set_ports(&[OTHER_JOB_PORT, 1, OTHER_JOB_PORT]).unwrap();
    assert_eq!(pc.ports().unwrap(), vec![1, OTHER_JOB_PORT]);
    assert_eq!(
        run(&pc, Direction::Ingress, &udp_in().build()),
        PeerCounter::NotJob,
        "a port taken out of the set stops counting"
    );
    pc.set_ports(&[]).unwrap();
    assert!(pc.ports().unwrap().is_empty());

    let all: Vec<u16> = (1..=PEERS_PORTS_MAX as u16).collect();
    pc.set_ports(&all).unwrap();
    assert_eq!(pc.ports().unwrap(), all);
    let too_many: Vec<u16> = (1..=PEERS_PORTS_MAX as u16 + 1).collect();
    let err = pc.set_ports(&too_many).unwrap_err();
    assert!(matches!(err, EbpfError::TooManyPorts { count, .. } if count == too_many.len()));
    assert_eq!(pc.ports().unwrap(), all, "a refused set changes nothing");
}

#[test]
fn a_vlan_tag_is_skipped_and_ip_options_are_parsed_past() {
    let pc = loaded();
    let mut tagged = udp_in();
    tagged.vlan = Some(42);
    let tagged = tagged.build();
    assert_eq!(run(&pc, Direction::Ingress, &tagged), PeerCounter::Counted);

    // Options of NOPs (0x01): a program that read the ports at a fixed offset would see 257.
    let mut opts = HostFrame::tcp(LOCAL, JOB_PORT, PEER2, EPHEMERAL, PAYLOAD);
    opts.ip.options = vec![1, 1, 1, 1, 1, 1, 1, 1];
    let opts = opts.build();
    assert_eq!(run(&pc, Direction::Egress, &opts), PeerCounter::Counted);

    // Ethernet pads short frames to 60 bytes: the padding is counted, it is on the wire.
    let mut padded = HostFrame::udp(PEER2, EPHEMERAL, LOCAL, JOB_PORT, b"x").build();
    padded.resize(60, 0);
    assert_eq!(run(&pc, Direction::Ingress, &padded), PeerCounter::Counted);
    assert_eq!(
        totals(&pc),
        vec![
            (PEER, Direction::Ingress, tagged.len() as u64, 1),
            (PEER2, Direction::Ingress, 60, 1),
            (PEER2, Direction::Egress, opts.len() as u64, 1),
        ]
    );
}

#[test]
fn fragments_are_passed_uncounted() {
    let pc = loaded();
    for frag in [IP_MF, 1, IP_MF | 185, IP_DF | 3] {
        let mut f = udp_in();
        f.ip.frag = frag;
        assert_eq!(
            run(&pc, Direction::Ingress, &f.build()),
            PeerCounter::Fragment,
            "frag field {frag:#x}"
        );
    }
    assert!(pc.read().unwrap().is_empty());
}

#[test]
fn non_ipv4_and_other_protocols_are_passed_by_reason() {
    let pc = loaded();
    let arp = frames::arp_frame(
        [0xff; 6],
        [2, 0, 0, 0, 0, 1],
        &Arp::request([2, 0, 0, 0, 0, 1], PEER, LOCAL),
    );
    assert_eq!(run(&pc, Direction::Ingress, &arp), PeerCounter::NonIpv4);
    let mut v6 = udp_in();
    v6.ethertype = frames::ETHERTYPE_IPV6;
    assert_eq!(
        run(&pc, Direction::Ingress, &v6.build()),
        PeerCounter::NonIpv4
    );
    // Two tags (802.1ad outside 802.1Q): only one is skipped.
    let mut qinq = udp_in();
    qinq.vlan = Some(7);
    qinq.ethertype = frames::ETHERTYPE_VLAN;
    assert_eq!(
        run(&pc, Direction::Egress, &qinq.build()),
        PeerCounter::NonIpv4
    );

    let mut icmp = udp_in();
    icmp.ip.protocol = 1;
    assert_eq!(
        run(&pc, Direction::Ingress, &icmp.build()),
        PeerCounter::NotTcpUdp
    );
    assert!(pc.read().unwrap().is_empty());
}

#[test]
fn malformed_ipv4_headers_are_passed_by_reason() {
    let pc = loaded();
    for (what, mutate) in [
        (
            "version 6",
            (|f: &mut HostFrame| f.ip.version = 6) as fn(&mut HostFrame),
        ),
        ("ihl 4", |f| f.ip.ihl = Some(4)),
        ("ihl 0", |f| f.ip.ihl = Some(0)),
    ] {
        let mut f = udp_in();
        mutate(&mut f);
        assert_eq!(
            run(&pc, Direction::Ingress, &f.build()),
            PeerCounter::Malformed,
            "{what}"
        );
    }
    // Total length shorter than the IPv4 header itself.
    let mut short_total = udp_in().build();
    short_total[16..18].copy_from_slice(&19u16.to_be_bytes());
    assert_eq!(
        run(&pc, Direction::Ingress, &short_total),
        PeerCounter::Malformed
    );
    // A total length that ends inside the ports: no ports to read.
    let mut no_ports = udp_in().build();
    no_ports[16..18].copy_from_slice(&22u16.to_be_bytes());
    assert_eq!(
        run(&pc, Direction::Ingress, &no_ports),
        PeerCounter::Truncated
    );
    assert!(pc.read().unwrap().is_empty());
}

#[test]
fn every_truncation_is_passed_and_counted_as_truncated() {
    let pc = loaded();
    let mut tagged = HostFrame::tcp(LOCAL, JOB_PORT, PEER, EPHEMERAL, PAYLOAD);
    tagged.vlan = Some(5);
    for (dir, whole) in [
        (Direction::Ingress, udp_in().build()),
        (Direction::Egress, tagged.build()),
    ] {
        // BPF_PROG_TEST_RUN refuses less than an Ethernet header, and an untagged IPv4 frame
        // shorter than its IPv4 header (see kernel_refuses); the program sees all the rest.
        let mut refused = Vec::new();
        for len in frames::ETH_LEN..whole.len() {
            match try_run(&pc, dir, &whole[..len]) {
                None => refused.push(len),
                Some(c) => assert_eq!(
                    c,
                    PeerCounter::Truncated,
                    "{dir} frame cut to {len} of {} bytes",
                    whole.len()
                ),
            }
        }
        if dir == Direction::Ingress {
            assert_eq!(refused, (14..34).collect::<Vec<_>>());
        } else {
            assert!(refused.is_empty(), "a tagged frame is never refused");
        }
        assert_eq!(run(&pc, dir, &whole), PeerCounter::Counted);
    }
    assert!(matches!(
        pc.test_run(Direction::Ingress, &udp_in().build()[..13]),
        Err(EbpfError::FrameTooShort(13))
    ));
}

#[test]
fn a_full_peer_map_counts_peers_full_and_keeps_counting_known_peers() {
    let pc = loaded();
    let peer_at = |i: u32| Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 64, 0)) + i);
    let frame_from =
        |peer: Ipv4Addr| HostFrame::udp(peer, EPHEMERAL, LOCAL, JOB_PORT, b"p").build();
    for i in 0..PEERS_MAX {
        let action = pc
            .test_run(Direction::Ingress, &frame_from(peer_at(i)))
            .unwrap();
        assert_eq!(action, TcAction::Unspec);
    }
    let counters = counter_map(&pc);
    assert_eq!(
        counters[&PeerCounter::Counted].packets,
        u64::from(PEERS_MAX)
    );
    assert_eq!(counters[&PeerCounter::PeersFull].packets, 0);

    let newcomer = frame_from(peer_at(PEERS_MAX));
    assert_eq!(
        run(&pc, Direction::Ingress, &newcomer),
        PeerCounter::PeersFull
    );
    // The same peer in the other direction is a new entry too.
    let known_other_way = HostFrame::udp(LOCAL, JOB_PORT, peer_at(0), EPHEMERAL, b"p").build();
    assert_eq!(
        run(&pc, Direction::Egress, &known_other_way),
        PeerCounter::PeersFull
    );
    assert_eq!(
        run(&pc, Direction::Ingress, &frame_from(peer_at(7))),
        PeerCounter::Counted
    );

    let stats = pc.read().unwrap();
    assert_eq!(stats.len(), PEERS_MAX as usize);
    let seventh = stats.iter().find(|s| s.peer == peer_at(7)).unwrap();
    assert_eq!(seventh.packets, 2);
    assert!(stats.iter().all(|s| s.peer != peer_at(PEERS_MAX)));
}

// ---------------------------------------------------------------------------------------------
// Reference model and fuzz.

fn be16(f: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]))
}

/// What yard_peers must make of `f` in `dir` with `ports` registered: the reason, and for a
/// counted frame the peer.
fn model(f: &[u8], dir: Direction, ports: &[u16]) -> (PeerCounter, Option<Ipv4Addr>) {
    use PeerCounter::*;
    let Some(mut proto) = be16(f, 12) else {
        return (Truncated, None);
    };
    let mut l3 = 14;
    if proto == 0x8100 || proto == 0x88a8 {
        let Some(inner) = be16(f, 16) else {
            return (Truncated, None);
        };
        proto = inner;
        l3 += 4;
    }
    if proto != 0x0800 {
        return (NonIpv4, None);
    }
    let Some(ip) = f.get(l3..l3 + 20) else {
        return (Truncated, None);
    };
    let ihl = usize::from(ip[0] & 0xf) * 4;
    if ip[0] >> 4 != 4 || ihl < 20 {
        return (Malformed, None);
    }
    let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if tot < ihl {
        return (Malformed, None);
    }
    if tot > f.len() - l3 {
        return (Truncated, None);
    }
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return (Fragment, None);
    }
    if ip[9] != 6 && ip[9] != 17 {
        return (NotTcpUdp, None);
    }
    if tot < ihl + 4 {
        return (Truncated, None);
    }
    let (Some(src), Some(dst)) = (be16(f, l3 + ihl), be16(f, l3 + ihl + 2)) else {
        return (Truncated, None);
    };
    if !ports.contains(&src) && !ports.contains(&dst) {
        return (NotJob, None);
    }
    let at = if dir == Direction::Ingress { 12 } else { 16 };
    let peer = Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    (Counted, Some(peer))
}

/// A frame for the fuzz run: a valid job frame (TCP or UDP, tagged or not, with or without
/// options) with a few bytes of its headers overwritten and perhaps cut short, or pure noise.
fn fuzz_frame(rng: &mut StdRng) -> Vec<u8> {
    if rng.gen_ratio(1, 8) {
        let len = rng.gen_range(frames::ETH_LEN..200);
        return (0..len).map(|_| rng.gen()).collect();
    }
    let peer = Ipv4Addr::new(198, 18, rng.gen_range(0..4), rng.gen_range(1..8));
    let ports = [JOB_PORT, OTHER_JOB_PORT, EPHEMERAL, 443];
    let (sp, dp) = (ports[rng.gen_range(0..4)], ports[rng.gen_range(0..4)]);
    let payload: Vec<u8> = (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect();
    let mut f = if rng.gen() {
        HostFrame::udp(peer, sp, LOCAL, dp, &payload)
    } else {
        HostFrame::tcp(peer, sp, LOCAL, dp, &payload)
    };
    if rng.gen_ratio(1, 4) {
        f.vlan = Some(rng.gen_range(1..4095));
    }
    if rng.gen_ratio(1, 4) {
        f.ip.options = vec![1; rng.gen_range(1..=40)];
    }
    let mut bytes = f.build();
    for _ in 0..rng.gen_range(0..4) {
        // Mostly inside the headers, where every decision is made.
        let at = rng.gen_range(0..bytes.len().min(80));
        bytes[at] = rng.gen();
    }
    if rng.gen_ratio(1, 4) {
        bytes.truncate(rng.gen_range(frames::ETH_LEN..=bytes.len()));
    }
    bytes
}

#[test]
fn seeded_fuzz_never_decides_and_matches_the_model() {
    let pc = loaded();
    let ports = [JOB_PORT, OTHER_JOB_PORT];
    let mut rng = StdRng::seed_from_u64(0x9eed_5eed);
    let mut expected: HashMap<(Ipv4Addr, Direction), (u64, u64)> = HashMap::new();
    let mut reasons: HashMap<PeerCounter, u64> = HashMap::new();
    for i in 0..3000 {
        let frame = fuzz_frame(&mut rng);
        let dir = if rng.gen() {
            Direction::Ingress
        } else {
            Direction::Egress
        };
        let (want, peer) = model(&frame, dir, &ports);
        let Some(got) = try_run(&pc, dir, &frame) else {
            continue;
        };
        assert_eq!(got, want, "case {i} ({dir}): {frame:02x?}");
        *reasons.entry(got).or_default() += 1;
        if let Some(peer) = peer {
            let e = expected.entry((peer, dir)).or_default();
            e.0 += frame.len() as u64;
            e.1 += 1;
        }
    }
    let got: HashMap<(Ipv4Addr, Direction), (u64, u64)> = pc
        .read()
        .unwrap()
        .into_iter()
        .map(|s| ((s.peer, s.dir), (s.bytes, s.packets)))
        .collect();
    assert_eq!(got, expected);
    // The generator reaches every reason but a full map.
    for c in PeerCounter::ALL {
        if c != PeerCounter::PeersFull {
            assert!(
                reasons.get(&c).copied().unwrap_or(0) > 0,
                "fuzz never hit {c}"
            );
        }
    }
}

#[test]
fn bench_run_measures_a_counted_frame_without_changing_its_path() {
    let pc = loaded();
    let frame = udp_in().build();
    let ns = pc.bench_run(Direction::Ingress, &frame, 1000).unwrap();
    assert!(
        ns < 1_000_000,
        "{ns} ns per packet is not a measurement of this program"
    );
    assert_eq!(
        totals(&pc),
        vec![(PEER, Direction::Ingress, 1000 * frame.len() as u64, 1000)],
        "every repeat took the counted path"
    );
}

// ---------------------------------------------------------------------------------------------
// Real traffic between two namespaces.

const NS_A: Ipv4Addr = Ipv4Addr::new(198, 18, 77, 1);
const NS_B: Ipv4Addr = Ipv4Addr::new(198, 18, 77, 2);
/// Ethernet + IPv4 + UDP headers of a datagram on a veth.
const UDP_FRAME_OVERHEAD: u64 = (frames::ETH_LEN + frames::IPV4_LEN + frames::UDP_LEN) as u64;

fn bind(addr: Ipv4Addr, port: u16) -> UdpSocket {
    let s = UdpSocket::bind(SocketAddrV4::new(addr, port)).expect("bind");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Receives `n` datagrams of `size` bytes; returns the sender of the last.
fn receive(sock: &UdpSocket, n: usize, size: usize) -> std::net::SocketAddr {
    let mut buf = vec![0u8; 65536];
    let mut from = None;
    for i in 0..n {
        let (len, addr) = sock
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("datagram {i}: {e}"));
        assert_eq!(len, size);
        from = Some(addr);
    }
    from.expect("n > 0")
}

#[test]
fn counts_real_udp_between_two_namespaces_in_both_directions() {
    require_root();
    let pair = NetnsPair::new("ydp", "udp", NS_A, NS_B);
    const N: usize = 25;
    const SIZE: usize = 1000;
    const M: usize = 7;
    const REPLY: usize = 300;

    // Host A: the counters, attached to its end of the veth, and the job's socket.
    let (mut pc, server) = pair.run_a(|| {
        let mut pc = PeerCounters::load().unwrap();
        pc.set_ports(&[JOB_PORT]).unwrap();
        pc.attach(NetnsPair::IF_A).unwrap();
        pc.attach(NetnsPair::IF_A).unwrap(); // a second attach is a no-op
        (pc, bind(NS_A, JOB_PORT))
    });
    assert_eq!(pc.attached(), vec![NetnsPair::IF_A]);
    let t0 = ktime_now_ns();

    // Host B sends N datagrams to the job port; A answers M from it.
    let client = pair.run_b(|| bind(NS_B, 0));
    let client_port = client.local_addr().unwrap().port();
    let data = vec![0x5au8; SIZE];
    for _ in 0..N {
        client
            .send_to(&data, SocketAddrV4::new(NS_A, JOB_PORT))
            .unwrap();
    }
    let from = receive(&server, N, SIZE);
    assert_eq!(from.port(), client_port);
    for _ in 0..M {
        server.send_to(&data[..REPLY], from).unwrap();
    }
    receive(&client, M, REPLY);
    let t1 = ktime_now_ns();

    let stats = pc.read().unwrap();
    let want = [
        (
            Direction::Ingress,
            N as u64,
            N as u64 * (UDP_FRAME_OVERHEAD + SIZE as u64),
        ),
        (
            Direction::Egress,
            M as u64,
            M as u64 * (UDP_FRAME_OVERHEAD + REPLY as u64),
        ),
    ];
    assert_eq!(
        stats.len(),
        2,
        "only B, both ways (ARP and IPv6 are not counted): {stats:?}"
    );
    for (stat, (dir, packets, bytes)) in stats.iter().zip(want) {
        assert_eq!((stat.peer, stat.dir), (NS_B, dir));
        assert_eq!((stat.packets, stat.bytes), (packets, bytes), "{dir}");
        assert!(
            (t0..=t1).contains(&stat.last_ns),
            "{dir}: {t0} <= {} <= {t1}",
            stat.last_ns
        );
    }

    // Detached: the same traffic is no longer seen.
    pair.run_a(|| pc.detach(NetnsPair::IF_A)).unwrap();
    assert!(pc.attached().is_empty());
    pc.detach(NetnsPair::IF_A).unwrap(); // idempotent
    for _ in 0..N {
        client
            .send_to(&data, SocketAddrV4::new(NS_A, JOB_PORT))
            .unwrap();
    }
    receive(&server, N, SIZE);
    assert_eq!(pc.read().unwrap(), stats, "nothing counted after detach");
}
