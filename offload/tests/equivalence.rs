//! Equivalence of a split and the whole program: for every cut of the gateway pipeline (all
//! 100 downward-closed op sets), the generated NIC part and then the generated host part,
//! both run through BPF_PROG_TEST_RUN, give the same verdict, the same output bytes and the
//! same counter changes as the real `yard_gateway` (ebpf/bpf/gateway.bpf.c, loaded by
//! yard-ebpf) on the fixture frames, every truncation of the main ones and a seeded fuzz
//! corpus, with the node's lease valid and lapsed. This is the emulated NIC: the NIC part runs
//! as an ordinary XDP program. Needs root (CI runs as root); it is not skipped without it.

mod common;

use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap as BpfHashMap, PerCpuArray};
use aya::programs::Xdp;
use aya::Ebpf;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yard_ebpf::frames::{self, Arp, Inner, VxlanFrame};
use yard_ebpf::layout::{
    ip_to_map, GwConfig, GwCounter, GwEp, GwEpKey, GwHost, GwVip, COUNTER_MAX, VIP_FORWARD_ONLY,
    VIP_OWNED,
};
use yard_ebpf::{run_xdp, Counter, Endpoint, Gateway, GatewayConfig, VipMode, XdpAction};
use yard_offload::gateway;
use yard_offload::gen::{self, Role, SHIM_LEN, SHIM_MAGIC};

const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xff, 0x01];
const SENDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x09];
const HOST_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x02];
const TENANT_MAC: [u8; 6] = [0x02, 0, 0, 1, 0, 0x10];
const TENANT_B_MAC: [u8; 6] = [0x02, 0, 0, 1, 0, 0x11];
const SRC_TENANT_MAC: [u8; 6] = [0x02, 0, 0, 1, 0, 0x20];
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const VIP_FWD: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
const SENDER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 9);
const HOST_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// An endpoint's host the daemon has not resolved: not in gw_hosts, so the FIB path runs.
const HOST_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const TENANT: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 10);
const TENANT_B: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 11);
const SRC_TENANT: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 20);
const VNI: u32 = 100;
const MTU: u16 = 1500;

fn tunnel(vip: Ipv4Addr, vni: u32, dst: Ipv4Addr) -> VxlanFrame {
    VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        vip,
        vni,
        Inner::udp(
            SRC_TENANT_MAC,
            [0x02, 0, 0, 0, 0, 0x77],
            SRC_TENANT,
            dst,
            b"payload!",
        ),
    )
}

/// One frame per path of the gateway's packet walk, then truncations and fuzz.
fn corpus() -> Vec<Vec<u8>> {
    let forward = tunnel(VIP, VNI, TENANT).build();
    let unresolved = tunnel(VIP, VNI, TENANT_B).build();
    let inner_arp = VxlanFrame::new(
        SENDER_MAC,
        GW_MAC,
        SENDER,
        VIP,
        VNI,
        Inner::arp_request(SRC_TENANT_MAC, SRC_TENANT, TENANT),
    )
    .build();
    let outer_arp = frames::arp_frame(
        [0xff; 6],
        SENDER_MAC,
        &Arp::request(SENDER_MAC, SENDER, VIP),
    );
    let mut fixtures = vec![
        forward.clone(),
        unresolved.clone(),
        inner_arp.clone(),
        outer_arp.clone(),
    ];
    fixtures.push(frames::arp_frame(
        [0xff; 6],
        SENDER_MAC,
        &Arp::request(SENDER_MAC, SENDER, VIP_FWD),
    ));
    fixtures.push(frames::arp_frame(
        [0xff; 6],
        SENDER_MAC,
        &Arp::request(SENDER_MAC, SENDER, HOST_A),
    ));
    fixtures.push(tunnel(VIP_FWD, VNI, TENANT).build()); // forward-only VIP still forwards
    fixtures.push(tunnel(HOST_A, VNI, TENANT).build()); // not a VIP
    fixtures.push(tunnel(VIP, 7, TENANT).build()); // the sender is not registered for VNI 7
    fixtures.push(tunnel(VIP, VNI, SRC_TENANT).build()); // unknown endpoint in the VNI
    let mut f = tunnel(VIP, VNI, TENANT);
    f.ip.src = HOST_A; // a source not registered for the VNI
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.eth_dst = [0x02, 0, 0, 0, 0xff, 0x02]; // flooded copy for another gateway
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.ip.frag = frames::IP_MF;
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.ip.options = vec![1, 1, 1, 0];
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.udp_dst = 4790;
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.vxlan_flags = 0;
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.ethertype = frames::ETHERTYPE_IPV6;
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    if let Inner::Ipv4 { ip, .. } = &mut f.inner {
        ip.ttl = 1;
    }
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.inner = Inner::Raw {
        dst_mac: TENANT_MAC,
        src_mac: SRC_TENANT_MAC,
        ethertype: frames::ETHERTYPE_IPV6,
        payload: vec![0x60; 48],
    };
    fixtures.push(f.build());
    let mut f = tunnel(VIP, VNI, TENANT);
    f.ip.protocol = frames::PROTO_TCP;
    fixtures.push(f.build());

    let mut out = fixtures.clone();
    // every truncation of the frames that reach deepest
    for base in [&forward, &unresolved, &inner_arp, &outer_arp] {
        for len in 14..base.len() {
            out.push(base[..len].to_vec());
        }
    }
    // a seeded fuzz run: a few bytes of a fixture changed, sometimes cut short
    let mut rng = StdRng::seed_from_u64(0x0ffd_0ad5);
    for _ in 0..300 {
        let mut fr = fixtures[rng.gen_range(0..fixtures.len())].clone();
        for _ in 0..rng.gen_range(1..=4) {
            let at = rng.gen_range(0..fr.len().min(100));
            fr[at] = rng.gen();
        }
        if rng.gen_bool(0.2) {
            let len = rng.gen_range(14..=fr.len());
            fr.truncate(len);
        }
        out.push(fr);
    }
    out
}

/// The same tables for every program: the whole gateway and both parts.
fn fill(e: &mut Ebpf, lease: u64) {
    let mut cfg: Array<_, GwConfig> =
        Array::try_from(e.map_mut("gw_config").expect("gw_config")).expect("array");
    cfg.set(
        0,
        GwConfig {
            mac: GW_MAC,
            mtu: MTU,
            lease_deadline_ns: lease,
        },
        0,
    )
    .expect("set");
    let mut vips: BpfHashMap<_, u32, GwVip> =
        BpfHashMap::try_from(e.map_mut("gw_vips").expect("gw_vips")).expect("hash");
    vips.insert(ip_to_map(VIP), GwVip { mode: VIP_OWNED }, 0)
        .expect("vip");
    vips.insert(
        ip_to_map(VIP_FWD),
        GwVip {
            mode: VIP_FORWARD_ONLY,
        },
        0,
    )
    .expect("vip");
    let mut eps: BpfHashMap<_, GwEpKey, GwEp> =
        BpfHashMap::try_from(e.map_mut("gw_endpoints").expect("gw_endpoints")).expect("hash");
    for (ip, mac, host) in [
        (TENANT, TENANT_MAC, HOST_A),
        (TENANT_B, TENANT_B_MAC, HOST_B),
    ] {
        eps.insert(
            GwEpKey {
                vni: VNI,
                ip: ip_to_map(ip),
            },
            GwEp {
                mac,
                pad: 0,
                host: ip_to_map(host),
            },
            0,
        )
        .expect("endpoint");
    }
    let mut hosts: BpfHashMap<_, u32, GwHost> =
        BpfHashMap::try_from(e.map_mut("gw_hosts").expect("gw_hosts")).expect("hash");
    hosts
        .insert(
            ip_to_map(HOST_A),
            GwHost {
                mac: HOST_A_MAC,
                pad: 0,
            },
            0,
        )
        .expect("host");
    let mut sources: BpfHashMap<_, GwEpKey, u32> =
        BpfHashMap::try_from(e.map_mut("gw_sources").expect("gw_sources")).expect("hash");
    sources
        .insert(
            GwEpKey {
                vni: VNI,
                ip: ip_to_map(SENDER),
            },
            1,
            0,
        )
        .expect("source");
}

fn whole(lease: u64) -> Gateway {
    let mut gw = Gateway::load().expect("load yard_gateway (root needed)");
    gw.set_config(&GatewayConfig {
        mac: GW_MAC,
        mtu: MTU,
    })
    .expect("config");
    gw.set_lease_deadline(lease).expect("lease");
    gw.put_vip(VIP, VipMode::Owned).expect("vip");
    gw.put_vip(VIP_FWD, VipMode::ForwardOnly).expect("vip");
    for (ip, mac, host) in [
        (TENANT, TENANT_MAC, HOST_A),
        (TENANT_B, TENANT_B_MAC, HOST_B),
    ] {
        gw.put_endpoint(&Endpoint {
            vni: VNI,
            ip,
            mac,
            host,
        })
        .expect("endpoint");
    }
    gw.put_host(HOST_A, HOST_A_MAC).expect("host");
    gw.put_source(VNI, SENDER).expect("source");
    gw
}

fn load_part(obj: &[u8], role: Role, lease: u64) -> Ebpf {
    let mut e = Ebpf::load(obj).expect("parse the generated object");
    {
        let prog: &mut Xdp = e
            .program_mut(role.program_name())
            .expect("program")
            .try_into()
            .expect("an XDP program");
        prog.load()
            .unwrap_or_else(|err| panic!("the verifier refused {}: {err:?}", role.program_name()));
    }
    fill(&mut e, lease);
    e
}

fn run(e: &Ebpf, role: Role, frame: &[u8]) -> (XdpAction, Vec<u8>) {
    let prog: &Xdp = e
        .program(role.program_name())
        .expect("program")
        .try_into()
        .expect("XDP");
    let o = run_xdp(prog, role.program_name(), frame).expect("test run");
    (o.action, o.frame)
}

fn has_shim(frame: &[u8]) -> bool {
    frame.len() >= SHIM_LEN && u32::from_ne_bytes(frame[0..4].try_into().expect("4")) == SHIM_MAGIC
}

/// Counters of both parts, summed: (packets, bytes) per reason.
fn split_counters(nic: &mut Ebpf, host: &mut Ebpf) -> Vec<(u64, u64)> {
    let n: Array<_, GwCounter> =
        Array::try_from(nic.map_mut("oxdp_nic_counters").expect("nic counters")).expect("array");
    let h: PerCpuArray<_, GwCounter> =
        PerCpuArray::try_from(host.map_mut("gw_counters").expect("host counters")).expect("percpu");
    (0..COUNTER_MAX)
        .map(|i| {
            let a = n.get(&i, 0).expect("read");
            let (mut p, mut b) = (a.packets, a.bytes);
            for v in h.get(&i, 0).expect("read").iter() {
                p += v.packets;
                b += v.bytes;
            }
            (p, b)
        })
        .collect()
}

#[test]
fn every_cut_equals_the_whole_program() {
    let p = gateway::pipeline();
    let dir = tempfile::tempdir().expect("tempdir");
    let host_src = gen::generate(&p, 0, Role::Host).expect("host part");
    let host_obj = std::fs::read(common::compile_str(
        "oxdp_host",
        &host_src,
        dir.path(),
        &["-Wall", "-Werror"],
    ))
    .expect("read");
    let cuts = common::ideals(&p);
    assert_eq!(cuts.len(), 100);
    let nic_objs: Vec<(u64, Vec<u8>)> = cuts
        .iter()
        .map(|&m| {
            let src = gen::generate(&p, m, Role::Nic).expect("NIC part");
            let o = common::compile_str(
                &format!("oxdp_nic_{m:x}"),
                &src,
                dir.path(),
                &["-Wall", "-Werror"],
            );
            (m, std::fs::read(o).expect("read"))
        })
        .collect();
    let frames = corpus();
    // which counters the corpus reaches, so the test is known to cover the paths
    let mut reached = std::collections::BTreeSet::new();
    // where the host parts resumed (0xff: the NIC decided XDP_PASS)
    let mut resumed = std::collections::BTreeSet::new();
    for lease in [u64::MAX, 0] {
        let gw = whole(lease);
        let want: Vec<(XdpAction, Vec<u8>)> = frames
            .iter()
            .map(|f| {
                let o = gw.test_run(f).expect("whole test run");
                (o.action, o.frame)
            })
            .collect();
        let want_counters: Vec<(u64, u64)> = gw
            .counters()
            .expect("counters")
            .iter()
            .map(|(_, v)| (v.packets, v.bytes))
            .collect();
        for (c, (pk, _)) in Counter::ALL.iter().zip(&want_counters) {
            if *pk > 0 {
                reached.insert(c.index());
            }
        }
        for (mask, obj) in &nic_objs {
            let mut nic = load_part(obj, Role::Nic, lease);
            let mut host = load_part(&host_obj, Role::Host, lease);
            for (i, f) in frames.iter().enumerate() {
                let (a, out) = run(&nic, Role::Nic, f);
                let got = if a == XdpAction::Pass {
                    assert!(
                        has_shim(&out),
                        "cut {mask:#x}, frame {i}: the NIC passed a frame without a shim"
                    );
                    resumed.insert(out[4]);
                    run(&host, Role::Host, &out)
                } else {
                    (a, out)
                };
                assert_eq!(
                    got.0, want[i].0,
                    "cut {mask:#x}, lease {lease}, frame {i} ({:02x?}): verdict",
                    f
                );
                assert_eq!(
                    got.1, want[i].1,
                    "cut {mask:#x}, lease {lease}, frame {i}: output bytes"
                );
            }
            assert_eq!(
                split_counters(&mut nic, &mut host),
                want_counters,
                "cut {mask:#x}, lease {lease}: counters"
            );
        }
    }
    // the corpus exercises every exit but the unconfigured one (the tables are always set)
    assert!(
        reached.len() >= 16,
        "only counters {reached:?} were reached"
    );
    // and the handoff was exercised at every op, and for NIC-decided passes
    let want_resumes: std::collections::BTreeSet<u8> =
        (0..p.ops.len() as u8).chain([0xff]).collect();
    assert_eq!(resumed, want_resumes);
}

#[test]
fn with_no_nic_the_host_part_is_the_whole_program() {
    // mask 0 through the host part alone (no shim in front): what a host without a NIC runs
    let p = gateway::pipeline();
    let dir = tempfile::tempdir().expect("tempdir");
    let host_src = gen::generate(&p, 0, Role::Host).expect("host part");
    let host_obj = std::fs::read(common::compile_str(
        "oxdp_host",
        &host_src,
        dir.path(),
        &["-Wall", "-Werror"],
    ))
    .expect("read");
    let gw = whole(u64::MAX);
    let host = load_part(&host_obj, Role::Host, u64::MAX);
    for (i, f) in corpus().iter().enumerate() {
        let o = gw.test_run(f).expect("whole");
        let got = run(&host, Role::Host, f);
        assert_eq!((got.0, &got.1), (o.action, &o.frame), "frame {i}");
    }
}

#[test]
fn the_built_in_parts_with_the_redirect_handoff_equal_the_whole_program() {
    // What the daemon runs on the emulated NIC: ebpf/bpf's checked-in parts (the default cut),
    // the NIC part handing over by redirect. Under BPF_PROG_TEST_RUN its devmap slot is empty,
    // so a handoff is XDP_PASS with the shim, as on a real NIC.
    let bpf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf");
    let dir = tempfile::tempdir().expect("tempdir");
    let read = |name: &str| {
        std::fs::read(common::compile(
            &bpf.join(name),
            dir.path(),
            &["-Wall", "-Werror"],
        ))
        .expect("read")
    };
    let (nic_obj, host_obj) = (read("oxdp_nic_emu.bpf.c"), read("oxdp_host.bpf.c"));
    let frames = corpus();
    for lease in [u64::MAX, 0] {
        let gw = whole(lease);
        let mut nic = load_part(&nic_obj, Role::Nic, lease);
        let mut host = load_part(&host_obj, Role::Host, lease);
        let mut handed_over = 0;
        for (i, f) in frames.iter().enumerate() {
            let want = gw.test_run(f).expect("whole test run");
            let (a, out) = run(&nic, Role::Nic, f);
            let got = if a == XdpAction::Pass {
                assert!(has_shim(&out), "frame {i}: passed without a shim");
                handed_over += 1;
                run(&host, Role::Host, &out)
            } else {
                (a, out)
            };
            assert_eq!((got.0, &got.1), (want.action, &want.frame), "frame {i}");
        }
        assert!(handed_over > 0, "no frame went to the host part");
        let want: Vec<(u64, u64)> = gw
            .counters()
            .expect("counters")
            .iter()
            .map(|(_, v)| (v.packets, v.bytes))
            .collect();
        assert_eq!(split_counters(&mut nic, &mut host), want, "lease {lease}");
    }
}
