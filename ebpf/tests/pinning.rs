//! Pinning, re-adoption after a simulated daemon restart, and attachment to a veth inside a
//! network namespace made by the test. Needs root.

mod common;

use std::process::Command;

use common::*;
use yard_ebpf::{
    frames, ktime_now_ns, Counter, EbpfError, Gateway, GatewayConfig, GatewayImage, VipMode,
    XdpAction, XdpMode,
};

#[test]
fn pinned_maps_survive_a_restart_and_remove_pinned_leaves_nothing() {
    require_root();
    let dir = BpffsDir::new("maps");
    let deadline = ktime_now_ns() + HOUR_NS;
    {
        let (mut gw, adopted) = Gateway::open_pinned(&dir.path).unwrap();
        assert!(!adopted, "a fresh directory has nothing to adopt");
        program_fixture(&mut gw);
        gw.set_lease_deadline(deadline).unwrap();
        let (_, c) = run(&gw, &tunnel(VIP, VNI_A, TENANT).build());
        assert_eq!(c, Counter::Forwarded);
        for name in [
            "gw_config",
            "gw_vips",
            "gw_endpoints",
            "gw_hosts",
            "gw_counters",
            "gw_vip_stats",
        ] {
            assert!(dir.path.join(name).exists(), "{name} pinned");
        }
    } // the "daemon" exits

    // A reader that does not own the program sees the per-VIP counters through the pin.
    let stats = yard_ebpf::VipStats::open_pinned(&dir.path).unwrap();
    assert_eq!(stats.read().unwrap()[&VIP].packets, 1);
    let (gw, adopted) = Gateway::open_pinned(&dir.path).unwrap();
    assert!(adopted);
    assert_eq!(
        gw.config().unwrap(),
        Some(GatewayConfig {
            mac: GW_MAC,
            mtu: MTU
        })
    );
    assert_eq!(gw.lease_deadline().unwrap(), deadline);
    assert_eq!(
        gw.vips().unwrap(),
        vec![(VIP, VipMode::Owned), (VIP_FWD, VipMode::ForwardOnly)]
    );
    let mut eps = fixture_endpoints();
    eps.sort_by_key(|e| (e.vni, e.ip));
    assert_eq!(gw.endpoints().unwrap(), eps);
    assert_eq!(gw.hosts().unwrap().len(), 2);
    assert_eq!(
        counter_map(&gw)[&Counter::Forwarded].packets,
        1,
        "counters survive"
    );
    // The new program works on the adopted maps.
    let (_, c) = run(&gw, &tunnel(VIP, VNI_B, TENANT).build());
    assert_eq!(c, Counter::Forwarded);

    Gateway::remove_pinned(&dir.path).unwrap();
    assert!(!dir.path.exists(), "remove_pinned leaves nothing");
    Gateway::remove_pinned(&dir.path).unwrap(); // idempotent
}

#[test]
fn an_incompatible_pinned_map_is_refused() {
    require_root();
    let dir = BpffsDir::new("compat");
    drop(Gateway::open_pinned(&dir.path).unwrap());
    // Put the hosts map (value 8 bytes, 65536 entries) where the VIP map (4 bytes) belongs.
    std::fs::remove_file(dir.path.join("gw_vips")).unwrap();
    std::fs::rename(dir.path.join("gw_hosts"), dir.path.join("gw_vips")).unwrap();
    let err = Gateway::open_pinned(&dir.path).unwrap_err();
    assert!(matches!(err, EbpfError::IncompatiblePin { .. }), "{err}");
}

/// Sends ARP for the VIP from yd1 and returns yd1's neighbour entry for it.
fn arp_for_vip(ns: &NetnsVeth) -> String {
    let _ = Command::new("ip")
        .args(["-n", &ns.name, "neigh", "flush", "dev", "yd1"])
        .output();
    let _ = Command::new("ip")
        .args([
            "netns", "exec", &ns.name, "ping", "-c", "1", "-W", "1", "-I", "yd1",
        ])
        .arg(VIP.to_string())
        .output()
        .expect("run ping");
    let out = Command::new("ip")
        .args(["-n", &ns.name, "neigh", "show", "dev", "yd1"])
        .arg(VIP.to_string())
        .output()
        .expect("run ip neigh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn gw_mac_text() -> String {
    GW_MAC
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn attach_survives_a_restart_in_generic_and_native_mode() {
    require_root();
    let ns = NetnsVeth::new("att");
    let dir = BpffsDir::new("att");
    let mac = gw_mac_text();
    for args in [
        vec!["link", "set", "yd0", "address", mac.as_str()],
        vec!["addr", "add", "198.19.0.2/16", "dev", "yd1"],
    ] {
        let st = Command::new("ip")
            .args(["-n", &ns.name])
            .args(&args)
            .status()
            .unwrap();
        assert!(st.success(), "ip {args:?}");
    }

    // First daemon: attach yd0 (generic) and yd1 (native), pin, exit.
    let first = ns.run(|| {
        let (mut gw, adopted) = Gateway::open_pinned(&dir.path).unwrap();
        assert!(!adopted);
        program_fixture(&mut gw);
        gw.attach("yd0", XdpMode::Generic).unwrap();
        gw.attach("yd1", XdpMode::Native).unwrap();
        let l0 = Gateway::pinned_link(&dir.path, "yd0").unwrap().unwrap();
        let l1 = Gateway::pinned_link(&dir.path, "yd1").unwrap().unwrap();
        assert_eq!(l0.program_id, gw.program_id().unwrap());
        (l0, l1)
    });
    assert!(
        ns.link_show("yd0").contains("xdpgeneric"),
        "{}",
        ns.link_show("yd0")
    );
    assert!(
        ns.link_show("yd1").contains("xdp"),
        "{}",
        ns.link_show("yd1")
    );
    // No daemon now: the pinned program answers ARP for the VIP on its own.
    let neigh = arp_for_vip(&ns);
    assert!(
        neigh.contains(&mac),
        "the pinned program answered ARP: {neigh:?}"
    );

    // Second daemon: re-adopt maps and links; the link stays, the new program is swapped in.
    let (gw, second) = ns.run(|| {
        let (mut gw, adopted) = Gateway::open_pinned(&dir.path).unwrap();
        assert!(adopted);
        gw.attach("yd0", XdpMode::Generic).unwrap();
        gw.attach("yd1", XdpMode::Native).unwrap();
        let l0 = Gateway::pinned_link(&dir.path, "yd0").unwrap().unwrap();
        let l1 = Gateway::pinned_link(&dir.path, "yd1").unwrap().unwrap();
        (gw, (l0, l1))
    });
    assert_eq!(second.0.link_id, first.0.link_id, "yd0: same link");
    assert_eq!(second.1.link_id, first.1.link_id, "yd1: same link");
    let new_prog = gw.program_id().unwrap();
    assert_eq!(second.0.program_id, new_prog, "yd0 runs the new program");
    assert_eq!(second.1.program_id, new_prog, "yd1 runs the new program");
    assert!(
        counter_map(&gw)[&Counter::ArpRepliedOuter].packets >= 1,
        "the adopted counters hold the first program's ARP reply"
    );
    let neigh = arp_for_vip(&ns);
    assert!(
        neigh.contains(&mac),
        "the new program answers ARP: {neigh:?}"
    );
    // And a test run of the adopted state still forwards.
    let out = gw.test_run(&tunnel(VIP, VNI_A, TENANT).build()).unwrap();
    assert_eq!(out.action, XdpAction::Tx);

    // Decommission while the Gateway is still alive: the links go at once.
    Gateway::remove_pinned(&dir.path).unwrap();
    assert!(
        !ns.link_show("yd0").contains("xdp"),
        "{}",
        ns.link_show("yd0")
    );
    assert!(
        !ns.link_show("yd1").contains("xdp"),
        "{}",
        ns.link_show("yd1")
    );
    assert!(!dir.path.exists());
    drop(gw);
    let _ = frames::ETH_LEN;
}

#[test]
fn a_stale_link_of_a_vanished_interface_is_replaced() {
    require_root();
    let ns = NetnsVeth::new("stale");
    let dir = BpffsDir::new("stale");
    let first = ns.run(|| {
        let (mut gw, _) = Gateway::open_pinned(&dir.path).unwrap();
        gw.attach("yd0", XdpMode::Generic).unwrap();
        Gateway::pinned_link(&dir.path, "yd0").unwrap().unwrap()
    });
    // The interface goes away and comes back under the same name.
    let n = ns.name.as_str();
    for args in [
        vec!["-n", n, "link", "del", "yd0"],
        vec![
            "-n", n, "link", "add", "yd0", "type", "veth", "peer", "name", "yd1",
        ],
        vec!["-n", n, "link", "set", "yd0", "up"],
    ] {
        assert!(Command::new("ip").args(&args).status().unwrap().success());
    }
    let second = ns.run(|| {
        let (mut gw, adopted) = Gateway::open_pinned(&dir.path).unwrap();
        assert!(adopted);
        gw.attach("yd0", XdpMode::Generic).unwrap();
        Gateway::pinned_link(&dir.path, "yd0").unwrap().unwrap()
    });
    assert_ne!(
        second.link_id, first.link_id,
        "a fresh link replaced the defunct one"
    );
    assert!(ns.link_show("yd0").contains("xdpgeneric"));
}

#[test]
fn a_restart_into_the_split_host_part_keeps_the_link_and_the_maps() {
    require_root();
    let ns = NetnsVeth::new("img");
    let dir = BpffsDir::new("img");
    let first = ns.run(|| {
        let (mut gw, _) = Gateway::open_pinned(&dir.path).unwrap();
        program_fixture(&mut gw);
        gw.attach("yd0", XdpMode::Generic).unwrap();
        Gateway::pinned_link(&dir.path, "yd0").unwrap().unwrap()
    });
    let (gw, second) = ns.run(|| {
        let (mut gw, adopted) =
            Gateway::open_pinned_image(&dir.path, GatewayImage::SplitHost).unwrap();
        assert!(
            adopted,
            "the host part adopts the whole program's pinned maps"
        );
        gw.attach("yd0", XdpMode::Generic).unwrap();
        let link = Gateway::pinned_link(&dir.path, "yd0").unwrap().unwrap();
        (gw, link)
    });
    assert_eq!(second.link_id, first.link_id, "same link");
    assert_eq!(second.program_id, gw.program_id().unwrap(), "new program");
    assert_ne!(second.program_id, first.program_id);
    assert_eq!(gw.image(), GatewayImage::SplitHost);
    assert!(
        ns.link_show("yd0").contains("oxdp_host"),
        "{}",
        ns.link_show("yd0")
    );
    // The adopted tables serve the host part: a tunnel frame without a shim is forwarded.
    let out = gw.test_run(&tunnel(VIP, VNI_A, TENANT).build()).unwrap();
    assert_eq!(out.action, XdpAction::Tx);
    Gateway::remove_pinned(&dir.path).unwrap();
}

#[test]
fn hardware_mode_is_refused_in_one_sentence_and_leaves_nothing_attached() {
    require_root();
    let ns = NetnsVeth::new("hw");
    let why = ns.run(|| yard_ebpf::try_hardware("yd0"));
    eprintln!("{why}");
    assert!(
        why.starts_with("hardware-mode XDP on yd0 was refused (")
            && why.ends_with("which hardware mode needs)")
            && !why.contains('\n'),
        "{why}"
    );
    assert!(
        !ns.link_show("yd0").contains("xdp"),
        "{}",
        ns.link_show("yd0")
    );
}
