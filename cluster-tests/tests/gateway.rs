//! The gateway on real namespaces: a `yard` cluster whose nodes run the XDP gateway on their
//! underlay interface, compute hosts with Linux VXLAN devices tunnelling to VIPs, and tenants
//! exchanging real traffic through it. Needs root.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use yard_cluster_tests::overlay::{tenant_mac, Overlay, Tenant};
use yard_cluster_tests::probe::ProbeStream;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::{require_root, Topology};

fn yard_bin() -> PathBuf {
    let bin = std::env::var_os("YARD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/yard"))
        });
    assert!(
        bin.exists(),
        "yard binary {} not found; build it with `cargo build -p yard` or set YARD_BIN",
        bin.display()
    );
    bin
}

fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 255, n)
}

/// A gateway cluster on hosts `1..=gateways` of `topo`, with `vips` VIPs in its pool.
fn gateway_cluster<'t>(topo: &'t Topology, gateways: usize, extra: &str) -> YardCluster<&'t Topology> {
    for i in 1..=gateways {
        topo.bpffs(i).unwrap();
    }
    let config = format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\npin_dir = \"{}/bpffs-@HOST@/gateway\"\n{extra}",
        topo.dir().display()
    );
    YardCluster::start_on(
        topo,
        &yard_bin(),
        gateways,
        &ClusterOptions {
            extra_config: config,
        },
    )
    .unwrap()
}

fn cli_json(c: &YardCluster<&Topology>, i: usize, args: &[&str]) -> Value {
    let mut full = args.to_vec();
    full.push("--json");
    let out = c.cli(i, &full).unwrap();
    assert!(
        out.status.success(),
        "yard {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// VIP → owner, as the cluster reports it through node `i`.
fn owners(c: &YardCluster<&Topology>, i: usize) -> Vec<(Ipv4Addr, Option<u64>, Option<u64>)> {
    cli_json(c, i, &["gateway", "vip", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["vip"].as_str().unwrap().parse().unwrap(),
                r["owner"].as_u64(),
                r["handoff_to"].as_u64(),
            )
        })
        .collect()
}

/// Waits until every VIP has an owner satisfying `ok` and no handoff is in flight.
fn wait_owners(
    c: &YardCluster<&Topology>,
    i: usize,
    timeout: Duration,
    ok: impl Fn(&[(Ipv4Addr, Option<u64>, Option<u64>)]) -> bool,
) -> Vec<(Ipv4Addr, Option<u64>, Option<u64>)> {
    let start = Instant::now();
    loop {
        let o = owners(c, i);
        if o.iter().all(|(_, owner, h)| owner.is_some() && h.is_none()) && ok(&o) {
            return o;
        }
        assert!(start.elapsed() < timeout, "vip placement did not settle: {o:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn add_endpoints(c: &YardCluster<&Topology>, tenants: &[&Tenant]) {
    for t in tenants {
        let out = c
            .cli(
                1,
                &[
                    "gateway",
                    "endpoint",
                    "add",
                    "--vni",
                    &t.vni().to_string(),
                    "--ip",
                    &t.ip().to_string(),
                    "--mac",
                    &t.mac_string(),
                    "--host",
                    &t.host_addr().to_string(),
                ],
            )
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

fn stats(c: &YardCluster<&Topology>, i: usize) -> Value {
    cli_json(c, i, &["gateway", "stats"])
}

fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name]["packets"].as_u64().unwrap_or(0)
}

#[test]
fn forwards_between_tenants_answers_their_arp_and_isolates_vnis() {
    require_root();
    // Hosts 1-3: gateway nodes; 4 and 5: compute hosts.
    let topo = Topology::new(5).unwrap();
    let c = gateway_cluster(&topo, 3, "");
    let pool: Vec<String> = (1..=6).map(|n| vip(n).to_string()).collect();
    let mut args = vec!["gateway", "vip", "add"];
    args.extend(pool.iter().map(String::as_str));
    cli_json(&c, 1, &args);
    let placed = wait_owners(&c, 1, Duration::from_secs(10), |_| true);
    let mut per_node = [0usize; 3];
    for (_, owner, _) in &placed {
        per_node[owner.unwrap() as usize - 1] += 1;
    }
    assert_eq!(per_node, [2, 2, 2], "balanced placement: {placed:?}");

    // The same tenant addresses in two VNIs, on opposite hosts.
    let mut ov = Overlay::new(&topo);
    let a = Ipv4Addr::new(198, 19, 1, 1);
    let b = Ipv4Addr::new(198, 19, 1, 2);
    let a100 = ov.add_tenant(4, 100, a, tenant_mac(100, 1), vip(1)).unwrap();
    let b100 = ov.add_tenant(5, 100, b, tenant_mac(100, 2), vip(1)).unwrap();
    let a200 = ov.add_tenant(5, 200, a, tenant_mac(200, 1), vip(2)).unwrap();
    let b200 = ov.add_tenant(4, 200, b, tenant_mac(200, 2), vip(2)).unwrap();
    add_endpoints(&c, &[&a100, &b100, &a200, &b200]);

    a100.wait_reachable(b, Duration::from_secs(10)).unwrap();
    a200.wait_reachable(b, Duration::from_secs(10)).unwrap();
    // Proxy ARP through the tunnel answered with the right VNI's MAC.
    for (t, peer) in [(&a100, &b100), (&a200, &b200)] {
        let neigh = t.exec("ip", &["neigh", "show", "dev", "eth0"]).unwrap();
        let neigh = String::from_utf8_lossy(&neigh.stdout);
        assert!(
            neigh.contains(&format!("{} lladdr {}", peer.ip(), peer.mac_string())),
            "tenant {} in vni {} resolved {}: {neigh}",
            t.ip(),
            t.vni(),
            peer.ip()
        );
    }
    // UDP both ways in both VNIs, none lost, each datagram to its own VNI's tenant.
    for (from, to) in [(&a100, &b100), (&b100, &a100), (&a200, &b200), (&b200, &a200)] {
        let s = ProbeStream::start(from, to, 9000, 500).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let r = s.stop();
        assert!(r.sent >= 200, "{r:?}");
        assert_eq!(r.lost, 0, "{} -> {} in vni {}: {r:?}", from.ip(), to.ip(), from.vni());
    }
    // The owners of VIPs 1 and 2 counted what they forwarded and answered.
    let owner_of = |v: Ipv4Addr| placed.iter().find(|p| p.0 == v).unwrap().1.unwrap() as usize;
    for v in [vip(1), vip(2)] {
        let s = stats(&c, owner_of(v));
        assert!(counter(&s, "forwarded") >= 400, "{s}");
        assert!(counter(&s, "arp_replied_inner") >= 1, "{s}");
        assert!(counter(&s, "arp_replied_outer") >= 1, "{s}");
        assert_eq!(s["fenced"], false, "{s}");
    }
}
