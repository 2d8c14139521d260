//! `yard_gateway` under BPF_PROG_TEST_RUN: one fixture per path of the packet walk, checking the
//! verdict, the one counter that moved and, for XDP_TX, the whole rewritten frame; then every
//! truncation and a seeded fuzz run against a reference model. Needs root.

mod common;

use std::net::Ipv4Addr;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yard_ebpf::frames::{self, offsets, Arp, Inner, VxlanFrame, IP_DF, IP_MF};
use yard_ebpf::{
    ktime_now_ns, Counter, EbpfError, Endpoint, Gateway, GatewayConfig, VipMode, XdpAction,
};

#[test]
fn forwards_to_the_endpoints_host() {
    let gw = fixture();
    let input = tunnel(VIP, VNI_A, TENANT).build();
    let (out, c) = run(&gw, &input);
    assert_eq!(c, Counter::Forwarded);
    assert_eq!(out.action, XdpAction::Tx);
    assert_forwarded(&input, &out.frame, HOST_A, HOST_A_MAC, TENANT_A_MAC);
    assert_eq!(&out.frame[offsets::INNER_PAYLOAD..], PAYLOAD);
}

/// A bridge floods a frame for a MAC it has not learned to every port: the copy that reaches a
/// gateway it was not addressed to is left to the stack, so the tenant receives it once.
#[test]
fn a_flooded_copy_for_another_gateway_is_not_forwarded() {
    let gw = fixture();
    let mut input = tunnel(VIP, VNI_A, TENANT).build();
    input[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0xff, 0x02]);
    let (out, c) = run(&gw, &input);
    assert_eq!(c, Counter::PassNotVip);
    assert_eq!(out.action, XdpAction::Pass);
    assert_eq!(out.frame, input, "passed untouched");
}

#[test]
fn vni_isolation_same_ip_two_vnis_two_hosts() {
    let gw = fixture();
    let a = tunnel(VIP, VNI_A, TENANT).build();
    let b = tunnel(VIP, VNI_B, TENANT).build();
    let (out_a, ca) = run(&gw, &a);
    let (out_b, cb) = run(&gw, &b);
    assert_eq!((ca, cb), (Counter::Forwarded, Counter::Forwarded));
    assert_forwarded(&a, &out_a.frame, HOST_A, HOST_A_MAC, TENANT_A_MAC);
    assert_forwarded(&b, &out_b.frame, HOST_B, HOST_B_MAC, TENANT_B_MAC);
    assert_eq!(frames::vni_at(&out_b.frame, offsets::VXLAN), Some(VNI_B));
    // A VNI with no endpoint has no registered source either: nobody may send into it.
    let (_, c) = run(&gw, &tunnel(VIP, 7, TENANT).build());
    assert_eq!(c, Counter::DropUnknownSource);
}

/// The tie between an outer source and a VNI: a tunnel frame is taken only from a source
/// registered for its VNI. An underlay host that knows a tenant's VNI (and an endpoint's
/// address) cannot send into it, neither data nor inner ARP; a registered host can, for its
/// own VNIs only; and a withdrawn registration stops it at once.
#[test]
fn a_tunnel_frame_from_a_source_not_registered_for_its_vni_is_dropped_and_counted() {
    let mut gw = fixture();
    let intruder = Ipv4Addr::new(198, 18, 0, 66);
    let from = |src: Ipv4Addr, vni: u32, inner: Inner| {
        VxlanFrame::new(SENDER_MAC, GW_MAC, src, VIP, vni, inner).build()
    };
    let data = |src, vni| {
        from(
            src,
            vni,
            Inner::udp(TENANT_SRC_MAC, GW_MAC, TENANT_SRC, TENANT, PAYLOAD),
        )
    };
    let arp = |src, vni| {
        from(
            src,
            vni,
            Inner::arp_request(TENANT_SRC_MAC, TENANT_SRC, TENANT),
        )
    };

    // The registered sender, in its VNI: forwarded.
    let ok = data(SENDER, VNI_A);
    let (out, c) = run(&gw, &ok);
    assert_eq!(c, Counter::Forwarded);
    assert_forwarded(&ok, &out.frame, HOST_A, HOST_A_MAC, TENANT_A_MAC);

    // An unregistered underlay host, for a VNI and endpoint that exist: dropped, counted.
    let before = counter_map(&gw)[&Counter::DropUnknownSource];
    for frame in [
        data(intruder, VNI_A),
        arp(intruder, VNI_A),
        data(intruder, VNI_B),
    ] {
        let (out, c) = run(&gw, &frame);
        assert_eq!(
            (c, out.action),
            (Counter::DropUnknownSource, XdpAction::Drop)
        );
    }
    assert_eq!(
        counter_map(&gw)[&Counter::DropUnknownSource].packets,
        before.packets + 3
    );

    // A host registered for one VNI only may not send into another.
    gw.remove_source(VNI_B, SENDER).unwrap();
    let (_, c) = run(&gw, &data(SENDER, VNI_B));
    assert_eq!(c, Counter::DropUnknownSource);
    let (_, c) = run(&gw, &data(SENDER, VNI_A));
    assert_eq!(c, Counter::Forwarded);

    // Registered, the intruder's address is an ordinary source.
    gw.put_source(VNI_A, intruder).unwrap();
    let (_, c) = run(&gw, &data(intruder, VNI_A));
    assert_eq!(c, Counter::Forwarded);
    let (_, c) = run(&gw, &arp(intruder, VNI_A));
    assert_eq!(c, Counter::ArpRepliedInner);
}

fn check_inner_arp_reply(vip: Ipv4Addr) {
    let gw = fixture();
    let input = tunnel_arp(vip, VNI_A, TENANT).build();
    let (out, c) = run(&gw, &input);
    assert_eq!(c, Counter::ArpRepliedInner);
    let o = &out.frame;
    use frames::{ip_at, mac_at, u16_at};
    // Outer: back to where it came from.
    assert_eq!(mac_at(o, 0), Some(SENDER_MAC));
    assert_eq!(mac_at(o, 6), Some(GW_MAC));
    assert_eq!(ip_at(o, offsets::OUTER_IP + 12), Some(vip));
    assert_eq!(ip_at(o, offsets::OUTER_IP + 16), Some(SENDER));
    assert_eq!(o[offsets::OUTER_IP + 8], 64);
    assert!(frames::ipv4_header_valid(
        &o[offsets::OUTER_IP..offsets::OUTER_UDP]
    ));
    assert_eq!(
        u16_at(o, offsets::OUTER_UDP),
        u16_at(&input, offsets::OUTER_UDP)
    );
    assert_eq!(u16_at(o, offsets::OUTER_UDP + 2), Some(4789));
    assert_eq!(u16_at(o, offsets::OUTER_UDP + 6), Some(0));
    assert_eq!(frames::vni_at(o, offsets::VXLAN), Some(VNI_A));
    // Inner: the endpoint answers the requester.
    assert_eq!(mac_at(o, offsets::INNER_ETH), Some(TENANT_SRC_MAC));
    assert_eq!(mac_at(o, offsets::INNER_ETH + 6), Some(TENANT_A_MAC));
    assert_eq!(
        u16_at(o, offsets::INNER_ETH + 12),
        Some(frames::ETHERTYPE_ARP)
    );
    let arp = Arp::parse(&o[offsets::INNER_L3..]).unwrap();
    assert_eq!(
        arp,
        Arp {
            op: 2,
            sha: TENANT_A_MAC,
            spa: TENANT,
            tha: TENANT_SRC_MAC,
            tpa: TENANT_SRC,
            ..Arp::request(TENANT_SRC_MAC, TENANT_SRC, TENANT)
        }
    );
}

#[test]
fn inner_arp_is_answered_through_the_tunnel() {
    check_inner_arp_reply(VIP);
}

#[test]
fn inner_arp_is_answered_for_a_forward_only_vip_too() {
    check_inner_arp_reply(VIP_FWD);
}

#[test]
fn inner_arp_for_unknown_endpoint_or_not_a_request_is_dropped() {
    let gw = fixture();
    let (_, c) = run(&gw, &tunnel_arp(VIP, VNI_A, TENANT_UNKNOWN).build());
    assert_eq!(c, Counter::DropUnknownEndpoint);
    let (_, c) = run(&gw, &tunnel_arp(VIP, VNI_B, TENANT_ON_UNKNOWN_HOST).build());
    assert_eq!(c, Counter::DropUnknownEndpoint);
    for mutate in [
        (|a: &mut Arp| a.op = 2) as fn(&mut Arp),
        |a| a.htype = 6,
        |a| a.ptype = 0x86dd,
        |a| a.hlen = 8,
        |a| a.plen = 16,
    ] {
        let mut f = tunnel_arp(VIP, VNI_A, TENANT);
        if let Inner::Arp { arp, .. } = &mut f.inner {
            mutate(arp);
        }
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::DropInnerOther);
    }
}

#[test]
fn outer_arp_for_an_owned_vip_is_answered() {
    let gw = fixture();
    let input = outer_arp(VIP);
    let (out, c) = run(&gw, &input);
    assert_eq!(c, Counter::ArpRepliedOuter);
    let o = &out.frame;
    assert_eq!(frames::mac_at(o, 0), Some(SENDER_MAC));
    assert_eq!(frames::mac_at(o, 6), Some(GW_MAC));
    assert_eq!(frames::u16_at(o, 12), Some(frames::ETHERTYPE_ARP));
    let arp = Arp::parse(&o[14..]).unwrap();
    assert_eq!(
        arp,
        Arp {
            op: 2,
            sha: GW_MAC,
            spa: VIP,
            tha: SENDER_MAC,
            tpa: SENDER,
            ..Arp::request(SENDER_MAC, SENDER, VIP)
        }
    );
    assert_eq!(&o[42..], &input[42..], "padding unchanged");
}

#[test]
fn outer_arp_the_gateway_does_not_answer_passes() {
    let gw = fixture();
    // Forward-only VIP: no ARP (another node owns it now), left to the kernel.
    let (_, c) = run(&gw, &outer_arp(VIP_FWD));
    assert_eq!(c, Counter::PassNotVip);
    // Not a VIP: the node's own address.
    let (_, c) = run(&gw, &outer_arp(NOT_VIP));
    assert_eq!(c, Counter::PassNotVip);
    // A reply, or a malformed/short ARP, is the kernel's business.
    let mut reply = Arp::request(SENDER_MAC, SENDER, VIP);
    reply.op = 2;
    let (_, c) = run(&gw, &frames::arp_frame(GW_MAC, SENDER_MAC, &reply));
    assert_eq!(c, Counter::PassNotVip);
    let short = &outer_arp(VIP)[..30];
    let (_, c) = run(&gw, short);
    assert_eq!(c, Counter::PassNotVip);
}

#[test]
fn forward_only_vip_still_forwards() {
    let gw = fixture();
    let input = tunnel(VIP_FWD, VNI_B, TENANT).build();
    let (out, c) = run(&gw, &input);
    assert_eq!(c, Counter::Forwarded);
    assert_forwarded(&input, &out.frame, HOST_B, HOST_B_MAC, TENANT_B_MAC);
    // The reply goes out from the VIP it was sent to.
    assert_eq!(
        frames::ip_at(&out.frame, offsets::OUTER_IP + 12),
        Some(VIP_FWD)
    );
}

#[test]
fn lapsed_lease_stops_arp_for_every_vip_but_not_forwarding() {
    let mut gw = fixture();
    gw.set_lease_deadline(ktime_now_ns().saturating_sub(1))
        .unwrap();
    // No ARP answered for any VIP: ownership ends with the lease.
    for frame in [outer_arp(VIP), outer_arp(VIP_FWD)] {
        let (_, c) = run(&gw, &frame);
        assert_eq!(c, Counter::DropLeaseExpired);
    }
    // Tunnel frames still arriving are forwarded with the last state (control plane down).
    for (frame, want) in [
        (tunnel(VIP, VNI_A, TENANT).build(), Counter::Forwarded),
        (tunnel(VIP_FWD, VNI_A, TENANT).build(), Counter::Forwarded),
        (
            tunnel_arp(VIP, VNI_A, TENANT).build(),
            Counter::ArpRepliedInner,
        ),
    ] {
        let (_, c) = run(&gw, &frame);
        assert_eq!(c, want);
    }
    // The node's own traffic is not fenced.
    let (_, c) = run(&gw, &tunnel(NOT_VIP, VNI_A, TENANT).build());
    assert_eq!(c, Counter::PassNotVip);
    // Deadline 0 (never renewed) fences too; renewing restores service; set_config keeps it.
    gw.set_lease_deadline(0).unwrap();
    let (_, c) = run(&gw, &outer_arp(VIP));
    assert_eq!(c, Counter::DropLeaseExpired);
    let deadline = ktime_now_ns() + HOUR_NS;
    gw.set_lease_deadline(deadline).unwrap();
    gw.set_config(&GatewayConfig {
        mac: GW_MAC,
        mtu: MTU,
    })
    .unwrap();
    assert_eq!(gw.lease_deadline().unwrap(), deadline);
    let (_, c) = run(&gw, &outer_arp(VIP));
    assert_eq!(c, Counter::ArpRepliedOuter);
}

#[test]
fn traffic_not_for_a_vip_passes_untouched() {
    let gw = fixture();
    // A tunnel frame to the node's own address (run() checks the frame is unchanged).
    let (_, c) = run(&gw, &tunnel(NOT_VIP, VNI_A, TENANT).build());
    assert_eq!(c, Counter::PassNotVip);
    // QUIC control plane to the node: UDP 7480.
    let mut f = tunnel(NOT_VIP, VNI_A, TENANT);
    f.udp_dst = 7480;
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::PassNotVip);
}

#[test]
fn non_ipv4_outer_passes() {
    let gw = fixture();
    for ethertype in [frames::ETHERTYPE_IPV6, 0x8100, 0x88cc, 0x0000] {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        f.ethertype = ethertype;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::PassNonIpv4, "ethertype {ethertype:#06x}");
    }
}

#[test]
fn non_vxlan_to_a_vip_passes() {
    let gw = fixture();
    let mut f = tunnel(VIP, VNI_A, TENANT);
    f.udp_dst = 4790;
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::PassNotVxlan);
    let mut f = tunnel(VIP, VNI_A, TENANT);
    f.ip.protocol = frames::PROTO_TCP;
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::PassNotVxlan);
}

#[test]
fn bad_vxlan_flags_drop() {
    let gw = fixture();
    let mut f = tunnel(VIP, VNI_A, TENANT);
    f.vxlan_flags = 0x00;
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::DropBadVxlan);
    // Other flag bits beside I are tolerated.
    f.vxlan_flags = 0x88;
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::Forwarded);
}

#[test]
fn unknown_endpoint_drops_and_unresolved_host_passes_readdressed() {
    let gw = fixture();
    let (_, c) = run(&gw, &tunnel(VIP, VNI_A, TENANT_UNKNOWN).build());
    assert_eq!(c, Counter::DropUnknownEndpoint);
    // No MAC in the map, none in the (root namespace's, loopback-facing) kernel table: to the
    // stack, addressed to the host with the gateway's own MAC so the kernel forwards it.
    let input = tunnel(VIP, VNI_A, TENANT_ON_UNKNOWN_HOST).build();
    let (out, c) = run(&gw, &input);
    assert_eq!(c, Counter::PassUnresolvedHost);
    assert_eq!(out.action, XdpAction::Pass);
    assert_forwarded(&input, &out.frame, HOST_UNKNOWN, GW_MAC, TENANT_A_MAC);
}

/// ifindex of `dev` in namespace `ns`, from `ip -o link` ("7: yd0@yd1: ...").
fn ifindex_in(ns: &str, dev: &str) -> u32 {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", "dev", dev])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split(':').next().unwrap().trim().parse().unwrap()
}

fn ip_in(ns: &str, args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A host the daemon has not resolved yet, on an interface where the kernel routes to it: with
/// no neighbour entry the frame goes to the stack (which resolves the neighbour and forwards
/// it); once the kernel knows the MAC the program forwards with it itself; a host the kernel
/// has an unreachable route for is dropped, as the kernel would.
#[test]
fn unresolved_host_uses_the_kernels_neighbour_table() {
    require_root();
    let ns = NetnsVeth::new("fib");
    ip_in(&ns.name, &["addr", "add", "198.18.0.1/24", "dev", "yd0"]);
    // As the daemon sets it on the gateway interface (the FIB helper requires it too).
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "sysctl", "-qw"])
        .arg("net.ipv4.conf.yd0.forwarding=1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ifindex = ifindex_in(&ns.name, "yd0");
    let input = tunnel(VIP, VNI_A, TENANT_ON_UNKNOWN_HOST).build();
    let one_run = |input: &[u8]| {
        ns.run(|| {
            let gw = fixture();
            let before = counter_map(&gw);
            let out = gw.test_run_on(input, ifindex).expect("test run");
            let after = counter_map(&gw);
            (out, the_one_moved(&Counter::ALL, &before, &after, input))
        })
    };

    let (out, c) = one_run(&input);
    assert_eq!(
        (c, out.action),
        (Counter::PassUnresolvedHost, XdpAction::Pass)
    );
    assert_forwarded(&input, &out.frame, HOST_UNKNOWN, GW_MAC, TENANT_A_MAC);

    let kernel_mac = [0x02, 0, 0, 0, 0, 0x99];
    ip_in(
        &ns.name,
        &[
            "neigh",
            "replace",
            &HOST_UNKNOWN.to_string(),
            "lladdr",
            "02:00:00:00:00:99",
            "dev",
            "yd0",
            "nud",
            "permanent",
        ],
    );
    let (out, c) = one_run(&input);
    assert_eq!((c, out.action), (Counter::Forwarded, XdpAction::Tx));
    assert_forwarded(&input, &out.frame, HOST_UNKNOWN, kernel_mac, TENANT_A_MAC);

    ip_in(
        &ns.name,
        &["neigh", "del", &HOST_UNKNOWN.to_string(), "dev", "yd0"],
    );
    ip_in(
        &ns.name,
        &["route", "add", "unreachable", &format!("{HOST_UNKNOWN}/32")],
    );
    let (out, c) = one_run(&input);
    assert_eq!((c, out.action), (Counter::DropUnknownHost, XdpAction::Drop));
}

#[test]
fn inner_ttl_expiry() {
    let gw = fixture();
    for ttl in [0u8, 1] {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        inner_ipv4(&mut f).ttl = ttl;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::DropTtl, "ttl {ttl}");
    }
    for ttl in [2u8, 255] {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        inner_ipv4(&mut f).ttl = ttl;
        let input = f.build();
        let (out, c) = run(&gw, &input);
        assert_eq!(c, Counter::Forwarded, "ttl {ttl}");
        assert_forwarded(&input, &out.frame, HOST_A, HOST_A_MAC, TENANT_A_MAC);
    }
}

#[test]
fn incremental_ttl_checksum_is_valid_for_many_headers() {
    // RFC 1624 edge cases come from the checksum value: sweep ids so the checksum covers a
    // wide range of values, including ones near 0x0000/0xffff.
    let gw = fixture();
    for id in (0u16..=0xffff)
        .step_by(97)
        .chain([0xfeff, 0xff00, 0xffff, 0x0100])
    {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        inner_ipv4(&mut f).id = id;
        let input = f.build();
        let (out, c) = run(&gw, &input);
        assert_eq!(c, Counter::Forwarded);
        assert_forwarded(&input, &out.frame, HOST_A, HOST_A_MAC, TENANT_A_MAC);
    }
}

#[test]
fn ip_options_drop_inner_and_outer() {
    let gw = fixture();
    let mut f = tunnel(VIP, VNI_A, TENANT);
    f.ip.options = vec![1, 1, 1, 0]; // NOP NOP NOP EOL
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::DropIpOptions);
    let mut f = tunnel(VIP, VNI_A, TENANT);
    inner_ipv4(&mut f).options = vec![0x94, 0x04, 0, 0]; // router alert
    let (_, c) = run(&gw, &f.build());
    assert_eq!(c, Counter::DropIpOptions);
}

#[test]
fn fragments_drop_inner_and_outer() {
    let gw = fixture();
    for frag in [IP_MF, 1, IP_MF | 10, IP_DF | 8] {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        f.ip.frag = frag;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::DropFragment, "outer frag {frag:#06x}");
        let mut f = tunnel(VIP, VNI_A, TENANT);
        inner_ipv4(&mut f).frag = frag;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::DropFragment, "inner frag {frag:#06x}");
    }
    // DF alone (or nothing) is not a fragment.
    for frag in [0, IP_DF] {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        f.ip.frag = frag;
        inner_ipv4(&mut f).frag = frag;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::Forwarded);
    }
}

fn frame_of_len(len: usize) -> Vec<u8> {
    let payload = vec![0x5a; len - offsets::INNER_PAYLOAD];
    let mut f = tunnel(VIP, VNI_A, TENANT);
    if let Inner::Ipv4 { payload: p, .. } = &mut f.inner {
        *p = payload;
    }
    let b = f.build();
    assert_eq!(b.len(), len);
    b
}

#[test]
fn oversize_frames_drop() {
    let gw = fixture();
    let max = usize::from(MTU) + 14;
    let (_, c) = run(&gw, &frame_of_len(max));
    assert_eq!(c, Counter::Forwarded);
    let (_, c) = run(&gw, &frame_of_len(max + 1));
    assert_eq!(c, Counter::DropOversize);
}

#[test]
fn inner_ipv6_and_other_ethertypes_drop() {
    let gw = fixture();
    let raw = |ethertype| {
        VxlanFrame::new(
            SENDER_MAC,
            GW_MAC,
            SENDER,
            VIP,
            VNI_A,
            Inner::Raw {
                dst_mac: TENANT_A_MAC,
                src_mac: TENANT_SRC_MAC,
                ethertype,
                payload: vec![0x60; 60],
            },
        )
        .build()
    };
    let (_, c) = run(&gw, &raw(frames::ETHERTYPE_IPV6));
    assert_eq!(c, Counter::DropInnerIpv6);
    for ethertype in [0x88cc, 0x8100, 0x0000] {
        let (_, c) = run(&gw, &raw(ethertype));
        assert_eq!(c, Counter::DropInnerOther);
    }
}

#[test]
fn malformed_ipv4_headers_drop_as_truncated() {
    let gw = fixture();
    for (version, ihl) in [(6u8, None), (4, Some(4u8)), (4, Some(0))] {
        let mut f = tunnel(VIP, VNI_A, TENANT);
        f.ip.version = version;
        f.ip.ihl = ihl;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::DropTruncated, "outer v{version} ihl {ihl:?}");
        let mut f = tunnel(VIP, VNI_A, TENANT);
        inner_ipv4(&mut f).version = version;
        inner_ipv4(&mut f).ihl = ihl;
        let (_, c) = run(&gw, &f.build());
        assert_eq!(c, Counter::DropTruncated, "inner v{version} ihl {ihl:?}");
    }
}

#[test]
fn every_truncation_is_handled() {
    let gw = fixture();
    let cases = [
        ("forward", tunnel(VIP, VNI_A, TENANT).build()),
        ("inner arp", tunnel_arp(VIP, VNI_A, TENANT).build()),
        ("outer arp", outer_arp(VIP)),
    ];
    for (name, full) in cases {
        for len in 0..=full.len() {
            let prefix = &full[..len];
            if len < 14 {
                assert!(
                    matches!(gw.test_run(prefix), Err(EbpfError::FrameTooShort(n)) if n == len),
                    "{name} {len}: the kernel cannot run frames below 14 bytes"
                );
                continue;
            }
            let (out, c) = run(&gw, prefix);
            let complete = if name == "outer arp" {
                len >= 14 + frames::ARP_LEN // the rest is Ethernet padding
            } else {
                len == full.len()
            };
            if out.action == XdpAction::Tx {
                assert!(complete, "{name}: a {len}-byte prefix was sent ({c})");
            } else {
                assert!(
                    !complete,
                    "{name}: a complete {len}-byte frame was not sent ({c})"
                );
            }
            let expected = model(&ModelState::fixture(), prefix);
            assert_eq!(c, expected.0, "{name} prefix {len}");
        }
    }
}

#[test]
fn unconfigured_gateway_passes_everything() {
    require_root();
    let mut gw = Gateway::load().unwrap();
    gw.put_vip(VIP, VipMode::Owned).unwrap();
    assert_eq!(gw.config().unwrap(), None);
    for frame in [
        tunnel(VIP, VNI_A, TENANT).build(),
        outer_arp(VIP),
        vec![0u8; 14],
        vec![0xff; 200],
    ] {
        let (_, c) = run(&gw, &frame);
        assert_eq!(c, Counter::PassNotConfigured);
    }
}

/// Offsets of the bytes the program decides on (ethertypes, IPv4 version/IHL, lengths,
/// fragment bits, TTL, protocol, addresses, UDP port, VXLAN flags and VNI, ARP fields).
const HEADER_FIELDS: &[usize] = &[
    12,
    13,
    14,
    16,
    17,
    20,
    21,
    22,
    23,
    29,
    30,
    33,
    36,
    37,
    42,
    46,
    48,
    62,
    63,
    64,
    66,
    67,
    70,
    71,
    72,
    80,
    83,
    14 + 1,
    14 + 4,
    14 + 7,
    14 + 27,
    64 + 1,
    64 + 5,
    64 + 7,
    64 + 27,
];

/// Thousands of random frames and random mutations of valid ones: never ABORTED, exactly one
/// counter each, and verdict, counter and output frame exactly as the reference model says
/// (so XDP_TX only for valid, forwardable frames, rewritten consistently with the maps).
#[test]
fn fuzz_against_the_reference_model() {
    let gw = fixture();
    let state = ModelState::fixture();
    let mut rng = StdRng::seed_from_u64(0x5717_c4a7d);
    let mut ttl2 = tunnel(VIP, VNI_A, TENANT);
    inner_ipv4(&mut ttl2).ttl = 2;
    let seeds = [
        tunnel(VIP, VNI_A, TENANT).build(),
        ttl2.build(),
        tunnel(VIP_FWD, VNI_B, TENANT).build(),
        tunnel(VIP, VNI_A, TENANT_ON_UNKNOWN_HOST).build(),
        tunnel_arp(VIP, VNI_A, TENANT).build(),
        outer_arp(VIP),
    ];
    let mut seen = std::collections::BTreeMap::<Counter, u32>::new();
    for i in 0..6000 {
        let frame: Vec<u8> = if i % 6 == 0 {
            let len = rng.gen_range(14..160);
            (0..len).map(|_| rng.gen()).collect()
        } else {
            let mut f = seeds[rng.gen_range(0..seeds.len())].clone();
            for _ in 0..rng.gen_range(1..4) {
                // Half the time hit a header field the program reads.
                let at = if rng.gen_bool(0.5) {
                    HEADER_FIELDS[rng.gen_range(0..HEADER_FIELDS.len())].min(f.len() - 1)
                } else {
                    rng.gen_range(0..f.len())
                };
                // Small deltas hit boundaries (IHL, TTL, flags) more often than random bytes.
                f[at] = match rng.gen_range(0..3) {
                    0 => rng.gen(),
                    1 => f[at].wrapping_add(1),
                    _ => f[at].wrapping_sub(1),
                };
            }
            if rng.gen_ratio(1, 8) {
                let len = rng.gen_range(14..=f.len());
                f.truncate(len);
            }
            f
        };
        let (out, c) = run(&gw, &frame);
        let (expected, expected_frame) = model(&state, &frame);
        assert_eq!(c, expected, "frame {i}: {frame:02x?}");
        if let Some(expected_frame) = expected_frame {
            assert_eq!(out.frame, expected_frame, "frame {i} output");
        }
        *seen.entry(c).or_default() += 1;
    }
    // The mutations must reach the deep paths, or the test proves little.
    for c in [
        Counter::Forwarded,
        Counter::ArpRepliedInner,
        Counter::ArpRepliedOuter,
        Counter::DropTruncated,
        Counter::DropTtl,
        Counter::DropUnknownEndpoint,
        Counter::DropUnknownSource,
        Counter::PassNotVip,
    ] {
        assert!(
            seen.get(&c).copied().unwrap_or(0) > 0,
            "fuzz never reached {c}: {seen:?}"
        );
    }
}

#[test]
fn map_api_round_trips() {
    let mut gw = fixture();
    assert_eq!(
        gw.vips().unwrap(),
        vec![(VIP, VipMode::Owned), (VIP_FWD, VipMode::ForwardOnly)]
    );
    gw.put_vip(VIP, VipMode::ForwardOnly).unwrap();
    gw.remove_vip(VIP_FWD).unwrap();
    gw.remove_vip(VIP_FWD).unwrap(); // absent: fine
    assert_eq!(gw.vips().unwrap(), vec![(VIP, VipMode::ForwardOnly)]);

    let mut eps = fixture_endpoints();
    eps.sort_by_key(|e| (e.vni, e.ip));
    assert_eq!(gw.endpoints().unwrap(), eps);
    gw.remove_endpoint(VNI_B, TENANT).unwrap();
    gw.remove_endpoint(VNI_B, TENANT).unwrap();
    assert_eq!(gw.endpoints().unwrap().len(), 2);
    let bad = Endpoint {
        vni: 1 << 24,
        ip: TENANT,
        mac: TENANT_A_MAC,
        host: HOST_A,
    };
    assert!(matches!(
        gw.put_endpoint(&bad),
        Err(EbpfError::InvalidVni(_))
    ));

    assert_eq!(
        gw.hosts().unwrap(),
        vec![(HOST_A, HOST_A_MAC), (HOST_B, HOST_B_MAC)]
    );
    gw.remove_host(HOST_B).unwrap();
    gw.remove_host(HOST_B).unwrap();
    assert_eq!(gw.hosts().unwrap(), vec![(HOST_A, HOST_A_MAC)]);

    let mut sources = fixture_sources();
    sources.sort();
    assert_eq!(gw.sources().unwrap(), sources);
    gw.remove_source(VNI_B, SENDER).unwrap();
    gw.remove_source(VNI_B, SENDER).unwrap(); // absent: fine
    assert_eq!(gw.sources().unwrap(), vec![(VNI_A, SENDER)]);
    assert!(matches!(
        gw.put_source(1 << 24, SENDER),
        Err(EbpfError::InvalidVni(_))
    ));

    assert_eq!(
        gw.config().unwrap(),
        Some(GatewayConfig {
            mac: GW_MAC,
            mtu: MTU
        })
    );
    let counters = gw.counters().unwrap();
    assert_eq!(counters.len(), Counter::ALL.len());
    assert!(counters.iter().all(|(_, v)| v.packets == 0));
    let mem = gw.map_memory();
    assert_eq!(mem.len(), 7);
    assert!(mem.iter().any(|(name, _)| *name == "gw_sources"));
    assert!(mem.iter().any(|(name, _)| *name == "gw_vip_stats"));
}

#[test]
fn bench_run_measures_in_the_kernel() {
    let gw = fixture();
    let frame = tunnel(NOT_VIP, VNI_A, TENANT).build();
    let ns = gw.bench_run(&frame, 10_000).unwrap();
    assert!(ns < 1_000_000, "{ns} ns per run is not a measurement");
    let pass = counter_map(&gw)[&Counter::PassNotVip].packets;
    assert_eq!(pass, 10_000, "every repeat ran the program");
    let bounce = yard_ebpf::Bounce::load().unwrap();
    let out = bounce.test_run(&frame).unwrap();
    assert_eq!(out.action, XdpAction::Tx);
    assert_eq!(&out.frame[0..6], &frame[6..12]);
    assert_eq!(&out.frame[6..12], &frame[0..6]);
    assert_eq!(&out.frame[12..], &frame[12..]);
    assert!(bounce.bench_run(&frame, 10_000).unwrap() < 1_000_000);
}

/// Per-VIP counters: every frame addressed to this gateway for a VIP counts once for that VIP
/// with its whole length, whatever its fate; a flooded copy for another gateway and traffic for
/// no VIP count for none.
#[test]
fn per_vip_counters_count_each_frame_for_this_gateway_once() {
    let gw = fixture();
    assert!(gw.vip_counters().unwrap().is_empty());
    let a = tunnel(VIP, VNI_A, TENANT).build();
    for _ in 0..3 {
        assert_eq!(run(&gw, &a).1, Counter::Forwarded);
    }
    let fwd = tunnel(VIP_FWD, VNI_A, TENANT).build();
    assert_eq!(run(&gw, &fwd).1, Counter::Forwarded);
    // Dropped frames for a VIP still loaded this gateway.
    let unknown = tunnel(VIP, VNI_A, TENANT_UNKNOWN).build();
    assert_eq!(run(&gw, &unknown).1, Counter::DropUnknownEndpoint);
    let mut flooded = tunnel(VIP, VNI_A, TENANT).build();
    flooded[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0xff, 0x02]);
    assert_eq!(run(&gw, &flooded).1, Counter::PassNotVip);
    assert_eq!(
        run(&gw, &tunnel(NOT_VIP, VNI_A, TENANT).build()).1,
        Counter::PassNotVip
    );
    let got = gw.vip_counters().unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[&VIP].packets, 4);
    assert_eq!(got[&VIP].bytes, (3 * a.len() + unknown.len()) as u64);
    assert_eq!(got[&VIP_FWD].packets, 1);
    assert_eq!(got[&VIP_FWD].bytes, fwd.len() as u64);
}
