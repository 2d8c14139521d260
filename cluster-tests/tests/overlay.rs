//! Overlay tenants forwarded by a kernel gateway (the XDP gateway's baseline), and keepalived
//! moving the VIP when the master's link goes down. Needs root, iputils-ping and keepalived.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use yard_cluster_tests::keepalived::{Keepalived, VrrpSettings};
use yard_cluster_tests::kernel_gw::KernelGateway;
use yard_cluster_tests::overlay::{tenant_mac, Overlay, Tenant};
use yard_cluster_tests::probe::ProbeStream;
use yard_cluster_tests::{require_root, Topology};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);

/// Tenants `198.19.<vni/100>.<host>` on each compute host, for each VNI.
fn tenants(ov: &mut Overlay<'_>, hosts: &[usize], vnis: &[u32]) -> Vec<Tenant> {
    let mut out = Vec::new();
    for &vni in vnis {
        for &h in hosts {
            let ip = Ipv4Addr::new(198, 19, u8::try_from(vni / 100).unwrap(), h as u8);
            out.push(
                ov.add_tenant(h, vni, ip, tenant_mac(vni, h as u8), VIP)
                    .unwrap(),
            );
        }
    }
    out
}

#[test]
fn kernel_gateway_forwards_between_tenants_and_isolates_vnis() {
    require_root();
    let topo = Topology::new(3).unwrap();
    let mut ov = Overlay::new(&topo);
    let ts = tenants(&mut ov, &[2, 3], &[100, 200]);
    let (a100, b100, a200, b200) = (&ts[0], &ts[1], &ts[2], &ts[3]);
    let gw = KernelGateway::install(&topo, 1, VIP, &ts, true).unwrap();
    assert!(gw.has_vip().unwrap());

    // ARP for the peer goes through the tunnel and is answered by the gateway's bridge.
    a100.wait_reachable(b100.ip(), Duration::from_secs(10))
        .unwrap();
    assert!(a100.ping(b100.ip(), 3).unwrap(), "ping within VNI 100");
    assert!(b200.ping(a200.ip(), 3).unwrap(), "ping within VNI 200");
    // Same /16, other VNI: nothing gets across.
    assert_eq!(
        a100.ping_count(b200.ip(), 3).unwrap(),
        0,
        "VNI 100 reached VNI 200"
    );
    assert_eq!(
        a200.ping_count(b100.ip(), 3).unwrap(),
        0,
        "VNI 200 reached VNI 100"
    );
    let neigh = a100.exec("ip", &["neigh", "show", "dev", "eth0"]).unwrap();
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(
        neigh.contains(&format!("{} lladdr {}", b100.ip(), b100.mac_string())),
        "tenant A learned B's MAC through the gateway: {neigh}"
    );

    // UDP both ways through the gateway, sequence numbered.
    for (from, to) in [(a100, b100), (b200, a200)] {
        let s = ProbeStream::start(from, to, 9000, 500).unwrap();
        std::thread::sleep(Duration::from_secs(1));
        let r = s.stop();
        assert!(r.sent >= 400, "{r:?}");
        assert_eq!(
            r.lost,
            0,
            "UDP {} -> {}: {:?}",
            from.ip(),
            to.ip(),
            r.to_json(5)
        );
        assert_eq!(r.duplicates, 0);
    }
    // And not across VNIs.
    let s = ProbeStream::start(a100, b200, 9001, 200).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let r = s.stop();
    assert_eq!(r.received, 0, "UDP crossed VNIs: {:?}", r.to_json(1));
    assert!(gw.forwarded_packets().unwrap() > 500);

    // Tenant namespaces go with the topology.
    let names = topo.extra_namespaces();
    assert_eq!(names.len(), 4);
    drop(ov);
    drop(topo);
    for n in names {
        assert!(
            !Path::new("/run/netns").join(&n).exists(),
            "{n} left behind"
        );
    }
}

/// One failover of each keepalived setting: the master's link goes down under a 1 kpps probe
/// stream; the other host takes the VIP and the stream resumes. Prints the loss windows.
#[test]
fn keepalived_moves_the_vip_when_the_master_link_goes_down() {
    require_root();
    let topo = Topology::new(4).unwrap();
    let mut ov = Overlay::new(&topo);
    let ts = tenants(&mut ov, &[3, 4], &[100]);
    let (a, b) = (&ts[0], &ts[1]);
    for g in [1, 2] {
        KernelGateway::install(&topo, g, VIP, &ts, false).unwrap();
    }
    for settings in [VrrpSettings::fastest(), VrrpSettings::default_settings()] {
        let ka = Keepalived::start(&topo, &[1, 2], VIP, &settings).unwrap();
        ka.wait_master_is(1, Duration::from_secs(15)).unwrap();
        a.wait_reachable(b.ip(), Duration::from_secs(10)).unwrap();
        let s = ProbeStream::start(a, b, 9100, 1000).unwrap();
        assert!(
            s.wait_flowing(
                Duration::from_millis(500),
                Duration::from_millis(50),
                Duration::from_secs(10)
            ),
            "probe stream never flowed through host 1"
        );
        let fault = Instant::now();
        topo.link_down(1).unwrap();
        // `link_down` runs `ip` in the host's namespace, which can take longer than the probe
        // interval: a datagram received soon after `fault` may still have crossed host 1. Only
        // one received well after the link is known to be down came through host 2.
        let down = Instant::now();
        let deadline = fault + Duration::from_secs(15);
        // Wait for the stream to resume through host 2, then a little more.
        while Instant::now() < deadline
            && s.last_received_at()
                .is_none_or(|t| t < down + Duration::from_millis(20))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(500));
        let r = s.stop();
        // VRRP with the default timings makes host 2 master about 3.6 s after the fault; the
        // loop above ends once it does. Wait, within the fault's deadline, for host 2 to hold
        // the VIP before reading the holders.
        let _ = ka.wait_master_is(2, deadline.saturating_duration_since(Instant::now()));
        let holders = ka.holders().unwrap();
        eprintln!(
            "keepalived {}: loss window {:.1} ms, lost {}, duplicates {}, reordered {}, gaps {}, holders now {:?}",
            settings.name, r.max_gap_ms, r.lost, r.duplicates, r.reordered, r.gaps.len(), holders
        );
        assert!(
            holders.contains(&2),
            "host 2 did not take the VIP: {holders:?}"
        );
        let g = r.largest_gap().expect("a link failure loses something");
        assert!(
            g.resumed_rx_ms.is_some(),
            "the stream never resumed: {:?}",
            r.to_json(3)
        );
        assert!(r.offset_ms(fault) <= g.start_ms + 5.0);
        // Tear this setting down: the old master back up, keepalived stopped, VIP removed.
        topo.link_up(1).unwrap();
        for h in [1, 2] {
            let p = ka.process(h).unwrap();
            p.terminate().unwrap();
            p.wait_exit(Duration::from_secs(10)).unwrap();
        }
        assert!(ka.holders().unwrap().is_empty());
    }
}
