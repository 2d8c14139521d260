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
    yard_cluster_tests::yard::test_yard_bin()
}

fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 255, n)
}

/// Where the gateway nodes run the forwarding function (`[gateway] offload`): the tests of the
/// forwarding path run both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Offload {
    /// The whole program on `eth0`.
    None,
    /// Hardware mode tried on `eth0`, refused (no SmartNIC here), the whole program instead.
    Auto,
    /// The split: the NIC part on an emulated NIC in front of `eth0`, the host part on it.
    Emulated,
}

/// A lease several renewals long: three daemons, compute hosts and probes share two cores in
/// CI, and a starved renewal would move VIPs a test does not expect to move (correctly, but
/// beside its point). The benchmarks run the default timings.
const RELAXED_LEASE: &str = "[liveness]\ninterval_ms = 25\nlease_ms = 250\n";

/// A gateway cluster on hosts `1..=gateways` of `topo`, with `vips` VIPs in its pool.
/// `leader_holds_vips`: most tests check placement arithmetic over every node, so they let the
/// Raft leader own VIPs too; by default it hands them to the others (tested on its own).
fn gateway_cluster<'t>(
    topo: &'t Topology,
    gateways: usize,
    leader_holds_vips: bool,
    extra: &str,
) -> YardCluster<&'t Topology> {
    gateway_cluster_with(topo, gateways, leader_holds_vips, extra, Offload::None)
}

/// [`gateway_cluster`] with a choice of offload; `Emulated` first puts an emulated NIC in front
/// of every gateway node's `eth0`.
fn gateway_cluster_with<'t>(
    topo: &'t Topology,
    gateways: usize,
    leader_holds_vips: bool,
    extra: &str,
    offload: Offload,
) -> YardCluster<&'t Topology> {
    let mut split = String::new();
    for i in 1..=gateways {
        topo.bpffs(i).unwrap();
        if offload == Offload::Emulated {
            // The same names on every host, so one config line serves them all.
            let (wire, port) = topo.emulate_nic(i).unwrap();
            split = format!(
                "offload = \"emulated\"\noffload_wire = \"{wire}\"\noffload_port = \"{port}\"\n"
            );
        }
    }
    if offload == Offload::Auto {
        split = "offload = \"auto\"\n".to_owned();
    }
    let config = format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\npin_dir = \"{}/bpffs-@HOST@/gateway\"\nleader_holds_vips = {leader_holds_vips}\n{split}{extra}",
        topo.dir().display()
    );
    let c = YardCluster::start_on(
        topo,
        &yard_bin(),
        gateways,
        &ClusterOptions {
            extra_config: config,
            ..Default::default()
        },
    )
    .unwrap();
    match offload {
        Offload::Emulated => (1..=gateways).for_each(|i| assert_split_runs(&c, i)),
        Offload::Auto => (1..=gateways).for_each(|i| assert_auto_fell_back(&c, i)),
        Offload::None => {}
    }
    c
}

/// The gateway actor's health detail on the node answering `yard status` for node `i`, once
/// it reports where the program runs.
fn gateway_health(c: &YardCluster<&Topology>, i: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = c.status(i).unwrap();
        let detail = status["actors"]
            .as_array()
            .and_then(|a| a.iter().find(|h| h["name"] == "gateway"))
            .map(|h| h["detail"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        if detail.contains("offload") || Instant::now() >= deadline {
            return detail;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Node `i` was refused hardware mode, said why in one sentence (its log and the answering
/// node's health), and runs the whole program on `eth0`.
fn assert_auto_fell_back(c: &YardCluster<&Topology>, i: usize) {
    let detail = gateway_health(c, i);
    assert!(
        detail.contains("offload auto: hardware-mode XDP on eth0 was refused (")
            && detail.ends_with("so the whole program runs on the host (this loader does not bind programs to a device, which hardware mode needs)"),
        "node {i}: {detail}"
    );
    let log = c.process(i).unwrap().log();
    assert!(
        log.contains("gateway offload refused"),
        "node {i} logged no refusal: {}",
        c.process(i).unwrap().log_tail(20)
    );
    let out = c
        .topology()
        .exec(i, "ip", &["-d", "link", "show", "dev", "eth0"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("yard_gateway"), "node {i} eth0: {text}");
}

/// Node `i` runs the split: the answering node's health says so (status is answered by the
/// leader, which runs the split too), and the kernel has node `i`'s NIC part on the wire
/// port, the port program on the host port and the host part on `eth0`.
fn assert_split_runs(c: &YardCluster<&Topology>, i: usize) {
    let detail = gateway_health(c, i);
    assert!(
        detail.contains("offload emulated: the NIC part on nicw0"),
        "node {i}: {detail}"
    );
    for (dev, program) in [
        ("nicw0", "oxdp_nic"),
        ("nicp0", "emunic_port"),
        ("eth0", "oxdp_host"),
    ] {
        let out = c
            .topology()
            .exec(i, "ip", &["-d", "link", "show", "dev", dev])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(program), "node {i} {dev}: {text}");
    }
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
        assert!(
            start.elapsed() < timeout,
            "vip placement did not settle: {o:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn add_endpoints(c: &YardCluster<&Topology>, tenants: &[&Tenant]) {
    for t in tenants {
        let out = c
            .cli(
                1,
                &t.endpoint_add_args()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn stats(c: &YardCluster<&Topology>, i: usize) -> Value {
    cli_json(c, i, &["gateway", "stats"])
}

/// Adds the pool every test uses: VIPs 198.19.255.1 to .6.
fn add_pool(c: &YardCluster<&Topology>) {
    let pool: Vec<String> = (1..=6).map(|n| vip(n).to_string()).collect();
    let mut args = vec!["gateway", "vip", "add"];
    args.extend(pool.iter().map(String::as_str));
    cli_json(c, 1, &args);
}

fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name]["packets"].as_u64().unwrap_or(0)
}

#[test]
fn forwards_between_tenants_answers_their_arp_and_isolates_vnis() {
    forwards_between_tenants(Offload::None);
}

#[test]
fn forwards_between_tenants_with_the_split_on_an_emulated_nic() {
    forwards_between_tenants(Offload::Emulated);
}

#[test]
fn forwards_between_tenants_when_auto_offload_is_refused() {
    forwards_between_tenants(Offload::Auto);
}

fn forwards_between_tenants(offload: Offload) {
    require_root();
    // Hosts 1-3: gateway nodes; 4 and 5: compute hosts.
    let topo = Topology::new(5).unwrap();
    // The rig's lease (see `rig_with`): this test is about forwarding, and on a starved
    // machine a 90 ms lease lapsed mid-test, correctly fencing the owner it then asked.
    let c = gateway_cluster_with(&topo, 3, true, RELAXED_LEASE, offload);
    add_pool(&c);
    // Balanced once every node holds a lease: a node whose first grant came late owned
    // nothing in the first settled placement, and received its share right after.
    let placed = wait_owners(&c, 1, Duration::from_secs(10), |o| balanced(o, &[1, 2, 3]));
    let mut per_node = [0usize; 3];
    for (_, owner, _) in &placed {
        per_node[owner.unwrap() as usize - 1] += 1;
    }
    assert_eq!(per_node, [2, 2, 2], "balanced placement: {placed:?}");

    // The same tenant addresses in two VNIs, on opposite hosts.
    let mut ov = Overlay::new(&topo);
    let a = Ipv4Addr::new(198, 19, 1, 1);
    let b = Ipv4Addr::new(198, 19, 1, 2);
    let a100 = ov
        .add_tenant(4, 100, a, tenant_mac(100, 1), vip(1))
        .unwrap();
    let b100 = ov
        .add_tenant(5, 100, b, tenant_mac(100, 2), vip(1))
        .unwrap();
    let a200 = ov
        .add_tenant(5, 200, a, tenant_mac(200, 1), vip(2))
        .unwrap();
    let b200 = ov
        .add_tenant(4, 200, b, tenant_mac(200, 2), vip(2))
        .unwrap();
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
    for (from, to) in [
        (&a100, &b100),
        (&b100, &a100),
        (&a200, &b200),
        (&b200, &a200),
    ] {
        let s = ProbeStream::start(from, to, 9000, 500).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let r = s.stop();
        assert!(r.sent >= 200, "{r:?}");
        assert_eq!(
            r.lost,
            0,
            "{} -> {} in vni {}: {r:?}",
            from.ip(),
            to.ip(),
            from.vni()
        );
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

/// Three gateway nodes (hosts 1-3) owning six VIPs, two compute hosts (4, 5) with tenants A and
/// B in VNI 100 tunnelling to VIP 1, endpoints registered, A reaching B.
struct Rig<'t> {
    c: YardCluster<&'t Topology>,
    a: Tenant,
    b: Tenant,
}

fn rig(topo: &Topology) -> Rig<'_> {
    rig_with(topo, Offload::None)
}

fn rig_with(topo: &Topology, offload: Offload) -> Rig<'_> {
    let c = gateway_cluster_with(
        topo,
        3,
        true,
        &format!("{RELAXED_LEASE}[log]\nformat = \"json\"\n"),
        offload,
    );
    add_pool(&c);
    wait_owners(&c, 1, Duration::from_secs(10), |o| balanced(o, &[1, 2, 3]));
    let mut ov = Overlay::new(topo);
    let a = ov
        .add_tenant(
            4,
            100,
            Ipv4Addr::new(198, 19, 1, 1),
            tenant_mac(100, 1),
            vip(1),
        )
        .unwrap();
    let b = ov
        .add_tenant(
            5,
            100,
            Ipv4Addr::new(198, 19, 1, 2),
            tenant_mac(100, 2),
            vip(1),
        )
        .unwrap();
    add_endpoints(&c, &[&a, &b]);
    a.wait_reachable(b.ip(), Duration::from_secs(10)).unwrap();
    b.wait_reachable(a.ip(), Duration::from_secs(10)).unwrap();
    Rig { c, a, b }
}

/// Every node in `nodes` owns the same number of VIPs, give or take one, and nobody else owns any.
fn balanced(o: &[(Ipv4Addr, Option<u64>, Option<u64>)], nodes: &[u64]) -> bool {
    let loads: Vec<usize> = nodes
        .iter()
        .map(|n| o.iter().filter(|r| r.1 == Some(*n)).count())
        .collect();
    let total: usize = loads.iter().sum();
    total == o.len() && loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1
}

fn owner_of(o: &[(Ipv4Addr, Option<u64>, Option<u64>)], v: Ipv4Addr) -> u64 {
    o.iter().find(|r| r.0 == v).and_then(|r| r.1).unwrap()
}

/// A node other than `not` that is up, to ask.
fn other(not: u64) -> usize {
    if not == 1 {
        2
    } else {
        1
    }
}

/// `fields` of the node's JSON log lines whose message is `message`.
fn log_events(c: &YardCluster<&Topology>, node: usize, message: &str) -> Vec<Value> {
    c.process(node)
        .map(|p| p.log())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .map(|v| v["fields"].clone())
        .collect()
}

#[test]
fn owner_kill9_spreads_its_vips_over_the_survivors_and_a_rejoin_moves_only_what_it_must() {
    owner_kill9_and_rejoin(Offload::None);
}

#[test]
fn owner_kill9_and_rejoin_with_the_split_on_an_emulated_nic() {
    owner_kill9_and_rejoin(Offload::Emulated);
}

fn owner_kill9_and_rejoin(offload: Offload) {
    require_root();
    let topo = Topology::new(5).unwrap();
    let mut r = rig_with(&topo, offload);
    let before = owners(&r.c, 1);
    let x = owner_of(&before, vip(1));
    let ask = other(x);
    let probe = ProbeStream::start(&r.a, &r.b, 9100, 1000).unwrap();
    assert!(probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5)
    ));
    r.c.kill9(x as usize).unwrap();
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != x).collect();
    let after = wait_owners(&r.c, ask, Duration::from_secs(10), |o| {
        o.iter().all(|r| r.1 != Some(x))
    });
    std::thread::sleep(Duration::from_secs(1));
    let report = probe.stop();
    eprintln!("kill -9 of the owner: {}", report.to_json(3));
    // Its two VIPs went one to each survivor; nothing else moved.
    let moved: Vec<_> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.1 != a.1)
        .collect();
    assert_eq!(moved.len(), 2, "{before:?} -> {after:?}");
    assert!(balanced(&after, &survivors), "{after:?}");
    assert!(moved.iter().all(|(b, _)| b.1 == Some(x)));
    // The probe stream recovered, well inside a second.
    assert!(
        report.received > 0 && report.max_gap_ms < 1000.0,
        "{}",
        report.to_json(3)
    );
    assert_eq!(report.duplicates, 0);

    // Rejoin: the restarted node gets back exactly what balance needs, from the two survivors,
    // once its hold-down (3 s of healthy renewals, longer if it lapsed again on the way back)
    // is over.
    r.c.restart(x as usize).unwrap();
    let rejoined = wait_owners(&r.c, ask, Duration::from_secs(30), |o| {
        balanced(o, &[1, 2, 3])
    });
    let moved: Vec<_> = after
        .iter()
        .zip(&rejoined)
        .filter(|(b, a)| b.1 != a.1)
        .collect();
    assert_eq!(moved.len(), 2, "{after:?} -> {rejoined:?}");
    assert!(moved.iter().all(|(_, a)| a.1 == Some(x)), "{moved:?}");
    assert!(r.a.ping(r.b.ip(), 3).unwrap());
}

#[test]
fn drain_moves_vips_away_without_losing_a_packet() {
    drain_moves_vips_away(Offload::None);
}

#[test]
fn drain_moves_vips_away_without_losing_a_packet_with_the_split_on_an_emulated_nic() {
    drain_moves_vips_away(Offload::Emulated);
}

fn drain_moves_vips_away(offload: Offload) {
    require_root();
    let topo = Topology::new(5).unwrap();
    let r = rig_with(&topo, offload);
    let x = owner_of(&owners(&r.c, 1), vip(1));
    let probe = ProbeStream::start(&r.a, &r.b, 9200, 1000).unwrap();
    assert!(probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5)
    ));
    cli_json(&r.c, 1, &["gateway", "drain", &x.to_string()]);
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != x).collect();
    wait_owners(&r.c, 1, Duration::from_secs(10), |o| balanced(o, &others));
    // Past the linger time the drained node forwards nothing any more.
    std::thread::sleep(Duration::from_millis(3500));
    let report = probe.stop();
    assert_eq!(report.lost, 0, "drain lost packets: {}", report.to_json(5));
    let s = stats(&r.c, x as usize);
    assert!(s["vips"].as_array().unwrap().is_empty(), "{s}");
    // The drained node could now stop; undrained, it takes its share back.
    cli_json(&r.c, 1, &["gateway", "undrain", &x.to_string()]);
    wait_owners(&r.c, 1, Duration::from_secs(10), |o| {
        balanced(o, &[1, 2, 3])
    });
}

#[test]
fn a_partitioned_owner_fences_itself_before_anyone_takes_its_vips() {
    require_root();
    let topo = Topology::new(5).unwrap();
    let r = rig(&topo);
    let before = owners(&r.c, 1);
    let x = owner_of(&before, vip(1));
    let ask = other(x);
    topo.isolate(x as usize).unwrap();
    let after = wait_owners(&r.c, ask, Duration::from_secs(10), |o| {
        o.iter().all(|r| r.1 != Some(x))
    });
    // The isolated node's data plane stopped answering (its lease deadline) before any new
    // owner took one of its VIPs (both in the hosts' shared monotonic clock).
    let fenced = log_events(
        &r.c,
        x as usize,
        "gateway fenced: the lease lapsed, no vip is answered for",
    );
    assert!(!fenced.is_empty(), "node {x} never fenced itself");
    let deadline = fenced.last().unwrap()["deadline_ms"].as_u64().unwrap();
    let mut taken = 0;
    for n in [1u64, 2, 3].into_iter().filter(|n| *n != x) {
        for ev in log_events(&r.c, n as usize, "gateway vip taken") {
            let v: Ipv4Addr = ev["vip"].as_str().unwrap().parse().unwrap();
            if owner_of(&before, v) == x {
                let at = ev["now_ms"].as_u64().unwrap();
                assert!(
                    at > deadline,
                    "node {n} took {v} at {at} ms, node {x} served until {deadline} ms"
                );
                taken += 1;
            }
        }
    }
    assert_eq!(taken, 2, "{after:?}");
    assert!(
        r.a.ping(r.b.ip(), 3).unwrap(),
        "traffic resumed through the new owner"
    );

    // Healed: one owner per VIP, the old owner serves none of what it lost, balance returns.
    topo.heal().unwrap();
    let healed = wait_owners(&r.c, ask, Duration::from_secs(20), |o| {
        balanced(o, &[1, 2, 3])
    });
    // The old owner catches up (it may lag the leader by a few entries) to answer for exactly
    // the VIPs the table gives it.
    let start = Instant::now();
    loop {
        let s = stats(&r.c, x as usize);
        let answering: Vec<Ipv4Addr> = s["vips"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| row["mode"] == "owned")
            .map(|row| row["vip"].as_str().unwrap().parse().unwrap())
            .collect();
        let want: Vec<Ipv4Addr> = healed
            .iter()
            .filter(|r| r.1 == Some(x))
            .map(|r| r.0)
            .collect();
        if answering == want {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "node {x} answers for {answering:?}, owns {want:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(r.a.ping(r.b.ip(), 3).unwrap());
}

#[test]
fn forwarding_goes_on_through_a_control_plane_outage_and_restarts_readopt_the_pinned_state() {
    outage_and_restarts(Offload::None);
}

#[test]
fn the_split_on_an_emulated_nic_forwards_through_an_outage_and_restarts_readopt_it() {
    outage_and_restarts(Offload::Emulated);
}

fn outage_and_restarts(offload: Offload) {
    require_root();
    let topo = Topology::new(5).unwrap();
    let mut r = rig_with(&topo, offload);
    let probe = ProbeStream::start(&r.a, &r.b, 9300, 1000).unwrap();
    assert!(probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5)
    ));
    // Every daemon dies: the pinned programs forward on with the last state.
    for i in 1..=3 {
        r.c.kill9(i).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    let outage = probe.stop();
    assert_eq!(outage.lost, 0, "control plane down: {}", outage.to_json(5));
    // Back up: each daemon re-adopts its pinned maps; nothing is lost meanwhile.
    let probe = ProbeStream::start(&r.a, &r.b, 9301, 1000).unwrap();
    for i in 1..=3 {
        r.c.restart(i).unwrap();
    }
    for i in 1..=3 {
        let start = Instant::now();
        while !r
            .c
            .process(i)
            .unwrap()
            .log()
            .contains("gateway adopting pinned state")
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "node {i} did not adopt its pinned state: {}",
                r.c.process(i).unwrap().log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    wait_owners(&r.c, 1, Duration::from_secs(20), |o| {
        balanced(o, &[1, 2, 3])
    });
    // A planned restart of the owner (SIGTERM, start again) loses nothing either, and with its
    // restart grace no VIP moves at all.
    let before = owners(&r.c, 1);
    let x = owner_of(&before, vip(1)) as usize;
    r.c.process(x).unwrap().terminate().unwrap();
    let _ = r.c.process(x).unwrap().wait_exit(Duration::from_secs(10));
    let granted = log_events(&r.c, x, "gateway keeps its vips through the restart");
    assert!(!granted.is_empty(), "node {x} got no restart grace");
    r.c.restart(x).unwrap();
    let start = Instant::now();
    while log_events(&r.c, x, "gateway following the tables").is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "node {x} did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = owners(&r.c, if x == 1 { 2 } else { 1 });
    assert_eq!(before, after, "a planned restart of node {x} moved vips");
    let restarts = probe.stop();
    assert_eq!(restarts.lost, 0, "restarts: {}", restarts.to_json(5));
    if offload == Offload::Emulated {
        // Still the split after every restart: the pinned links kept their places.
        for i in 1..=3 {
            assert_split_runs(&r.c, i);
        }
    }
}

#[test]
fn by_default_the_leader_holds_no_vip_so_losing_it_loses_no_packet() {
    require_root();
    let topo = Topology::new(5).unwrap();
    // "By default" is `leader_holds_vips`; the lease is relaxed as in the forwarding tests.
    let c = gateway_cluster(&topo, 3, false, RELAXED_LEASE);
    add_pool(&c);
    let leader = c.wait_leader(1).unwrap() as u64;
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != leader).collect();
    let placed = wait_owners(&c, 1, Duration::from_secs(10), |o| balanced(o, &others));
    let mut ov = Overlay::new(&topo);
    let a = ov
        .add_tenant(
            4,
            100,
            Ipv4Addr::new(198, 19, 1, 1),
            tenant_mac(100, 1),
            placed[0].0,
        )
        .unwrap();
    let b = ov
        .add_tenant(
            5,
            100,
            Ipv4Addr::new(198, 19, 1, 2),
            tenant_mac(100, 2),
            placed[0].0,
        )
        .unwrap();
    add_endpoints(&c, &[&a, &b]);
    a.wait_reachable(b.ip(), Duration::from_secs(10)).unwrap();
    let probe = ProbeStream::start(&a, &b, 9500, 1000).unwrap();
    assert!(probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5)
    ));
    // The premise, checked again just before the fault: on a loaded machine leadership can
    // move during setup (seen in a CI-like run: the downed node then owned the stream's VIP), so
    // take the leader as it is now, once the VIPs are balanced over the others again.
    let (leader, others) = {
        let mut attempt = 0;
        loop {
            let l = c.wait_leader(1).unwrap() as u64;
            let o: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != l).collect();
            wait_owners(&c, 1, Duration::from_secs(15), |x| balanced(x, &o));
            attempt += 1;
            if c.leader(1).map(|x| x as u64) == Some(l) || attempt == 3 {
                break (l, o);
            }
        }
    };
    // The leader's host dies: an election, every lease lapses meanwhile (no ARP is answered),
    // but no VIP was on the leader and the owners forward on: nothing is lost.
    topo.link_down(leader as usize).unwrap();
    let ask = others[0] as usize;
    let new_leader = {
        let start = Instant::now();
        loop {
            match c.leader(ask) {
                Some(l) if l as u64 != leader => break l as u64,
                _ => assert!(start.elapsed() < Duration::from_secs(10), "no new leader"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The new leader hands its VIPs to the remaining node (handoff: nothing lost either).
    wait_owners(&c, ask, Duration::from_secs(15), |o| {
        o.iter()
            .all(|r| r.1 != Some(new_leader) && r.1 != Some(leader))
    });
    std::thread::sleep(Duration::from_secs(1));
    let report = probe.stop();
    assert_eq!(report.lost, 0, "losing the leader: {}", report.to_json(5));
    assert_eq!(report.duplicates, 0);
}

/// `ping -c 1` from `from` to `to`: the reply's round-trip time, or `None` if none came back
/// within `wait`.
fn first_reply_ms(from: &Tenant, to: Ipv4Addr, wait: Duration) -> Option<f64> {
    let out = from
        .exec(
            "ping",
            &[
                "-n",
                "-c",
                "1",
                "-W",
                &wait.as_secs().max(1).to_string(),
                &to.to_string(),
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find("time=")?;
    text[at + 5..]
        .split(|c: char| c != '.' && !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Static neighbour entries both ways between two tenants, so their traffic needs no ARP
/// through the tunnel and the first frame is the measured one.
fn pin_neighbours(x: &Tenant, y: &Tenant) {
    for (from, to) in [(x, y), (y, x)] {
        let out = from
            .exec(
                "ip",
                &[
                    "neigh",
                    "replace",
                    &to.ip().to_string(),
                    "lladdr",
                    &to.mac_string(),
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ],
            )
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

/// Waits until node `i`'s data plane holds `n` endpoints.
fn wait_endpoints(c: &YardCluster<&Topology>, i: usize, n: u64) {
    let start = Instant::now();
    while stats(c, i)["endpoints"].as_u64() != Some(n) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "node {i} never programmed {n} endpoints"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A new tenant on a compute host no gateway has ever sent to: the owner has not resolved the
/// host's MAC when the first frames arrive. They used to be dropped (`drop_unknown_host`) until
/// the daemon read the neighbour table, and a first ping or TCP SYN then waited a 1 s
/// retransmission; now the program uses the kernel's neighbour or hands the frame to the
/// kernel, which resolves the host and forwards it. Hosts 1-3: gateways; 4: tenant A; 5 and 6:
/// brand-new hosts for tenants C and D.
#[test]
fn first_frames_to_a_new_endpoint_on_an_unresolved_host_get_through() {
    require_root();
    let topo = Topology::new(6).unwrap();
    let c = gateway_cluster(&topo, 3, true, RELAXED_LEASE);
    add_pool(&c);
    let placed = wait_owners(&c, 1, Duration::from_secs(10), |o| balanced(o, &[1, 2, 3]));
    let owner = owner_of(&placed, vip(1)) as usize;
    let mut ov = Overlay::new(&topo);
    let tenant = |ov: &mut Overlay, host: usize, n: u8| {
        ov.add_tenant(
            host,
            100,
            Ipv4Addr::new(198, 19, 1, n),
            tenant_mac(100, n),
            vip(1),
        )
        .unwrap()
    };
    let a = tenant(&mut ov, 4, 1);
    let cc = tenant(&mut ov, 5, 3);
    let d = tenant(&mut ov, 6, 4);
    pin_neighbours(&a, &cc);
    pin_neighbours(&a, &d);
    add_endpoints(&c, &[&a]);
    wait_endpoints(&c, owner, 1);

    // (1) A stream already running when C's endpoint appears: no frame may be dropped for an
    // unknown host between the endpoint's programming and the host's resolution.
    let s = ProbeStream::start(&a, &cc, 9000, 1000).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = stats(&c, owner);
    add_endpoints(&c, &[&cc]);
    wait_endpoints(&c, owner, 2);
    std::thread::sleep(Duration::from_millis(700));
    let r = s.stop();
    std::thread::sleep(Duration::from_secs(1));
    let after = stats(&c, owner);
    let delta = |name: &str| counter(&after, name) - counter(&before, name);
    println!(
        "new endpoint under a 1000 pps stream: pass_unresolved_host +{}, drop_unknown_host +{}, forwarded +{}, {} received",
        delta("pass_unresolved_host"),
        delta("drop_unknown_host"),
        delta("forwarded"),
        r.received
    );
    assert!(r.received > 300, "{r:?}");
    assert_eq!(delta("drop_unknown_host"), 0, "{after}");

    // (2) The first ping to a brand-new endpoint on another new host, sent as soon as the
    // owner has programmed it: answered, without a retransmission. The owner's daemon makes
    // the kernel resolve a new host by sending it one datagram to the discard port; that is
    // dropped here (nftables output hook, before neighbour resolution), so neither the daemon
    // nor the kernel knows host 6's MAC when the ping arrives and the frame must take the
    // kernel path (pass_unresolved_host), which the kernel must complete.
    for args in [
        &["add", "table", "inet", "yard_test"][..],
        &[
            "add",
            "chain",
            "inet",
            "yard_test",
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ],
        &[
            "add",
            "rule",
            "inet",
            "yard_test",
            "out",
            "udp",
            "dport",
            "9",
            "drop",
        ],
    ] {
        let out = topo.exec(owner, "nft", args).unwrap();
        assert!(out.status.success(), "nft {args:?}: {out:?}");
    }
    let before = stats(&c, owner);
    add_endpoints(&c, &[&d]);
    wait_endpoints(&c, owner, 3);
    let rtt = first_reply_ms(&a, d.ip(), Duration::from_secs(2));
    // The published counters are refreshed every tenth tick.
    std::thread::sleep(Duration::from_secs(1));
    let after = stats(&c, owner);
    let delta = |name: &str| counter(&after, name) - counter(&before, name);
    println!(
        "first ping to a brand-new endpoint: {rtt:?} ms; pass_unresolved_host +{}, drop_unknown_host +{}",
        delta("pass_unresolved_host"),
        delta("drop_unknown_host")
    );
    let rtt = rtt.expect("the first ping to a new endpoint was lost");
    assert!(rtt < 100.0, "time to first reply {rtt} ms");
    assert_eq!(delta("pass_unresolved_host"), 1, "{after}");
    assert_eq!(delta("drop_unknown_host"), 0, "{after}");
}

/// An underlay host cannot inject overlay traffic into a tenant's network by knowing its VNI:
/// the gateway takes a VNI's tunnel frames only from hosts with an endpoint in it. Hosts 1-3:
/// gateways; 4 and 5: tenants A and B of VNI 100; 6: a compute host with a registered tenant
/// of VNI 200 (a legitimate source, for that VNI) and an unregistered one, X, in VNI 100,
/// which knows B's address and MAC and sends to it. Nothing of X's reaches B (the owner counts
/// it as `drop_unknown_source`) while A's does; once X is registered, host 6 is a source for
/// VNI 100 too and X reaches B.
#[test]
fn an_underlay_host_without_an_endpoint_in_a_vni_cannot_send_into_it() {
    require_root();
    let topo = Topology::new(6).unwrap();
    let c = gateway_cluster(&topo, 3, true, RELAXED_LEASE);
    add_pool(&c);
    let placed = wait_owners(&c, 1, Duration::from_secs(10), |o| balanced(o, &[1, 2, 3]));
    let owner = owner_of(&placed, vip(1)) as usize;
    let mut ov = Overlay::new(&topo);
    let tenant = |ov: &mut Overlay, host: usize, vni: u32, n: u8, v: u8| {
        ov.add_tenant(
            host,
            vni,
            Ipv4Addr::new(198, 19, 1, n),
            tenant_mac(vni, n),
            vip(v),
        )
        .unwrap()
    };
    let a = tenant(&mut ov, 4, 100, 1, 1);
    let b = tenant(&mut ov, 5, 100, 2, 1);
    let other = tenant(&mut ov, 6, 200, 3, 2);
    let x = tenant(&mut ov, 6, 100, 4, 1);
    add_endpoints(&c, &[&a, &b, &other]);
    wait_endpoints(&c, owner, 3);
    a.wait_reachable(b.ip(), Duration::from_secs(10)).unwrap();
    // X needs no ARP through the tunnel (the gateway would not answer it either): its frames
    // to B leave host 6 encapsulated, to the VIP, like any tenant's.
    pin_neighbours(&x, &b);

    let before = stats(&c, owner);
    let injected = ProbeStream::start(&x, &b, 9000, 500).unwrap();
    let control = ProbeStream::start(&a, &b, 9001, 500).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let (r, ok) = (injected.stop(), control.stop());
    // The published counters are refreshed every tenth tick.
    std::thread::sleep(Duration::from_secs(1));
    let after = stats(&c, owner);
    let delta = |name: &str| counter(&after, name) - counter(&before, name);
    println!(
        "unregistered source: sent {}, received {}; drop_unknown_source +{}; registered: sent {}, received {}",
        r.sent,
        r.received,
        delta("drop_unknown_source"),
        ok.sent,
        ok.received
    );
    assert!(r.sent >= 200, "{r:?}");
    assert_eq!(
        r.received, 0,
        "an unregistered host injected into vni 100: {r:?}"
    );
    assert!(
        delta("drop_unknown_source") >= r.sent - r.send_errors,
        "every injected frame is dropped and counted: {after}"
    );
    assert!(ok.sent >= 200 && ok.lost == 0, "{ok:?}");

    // Registered, host 6 may send for VNI 100 as well.
    add_endpoints(&c, &[&x]);
    wait_endpoints(&c, owner, 4);
    let s = ProbeStream::start(&x, &b, 9002, 500).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let r = s.stop();
    assert!(r.sent >= 200 && r.received > 0, "{r:?}");
}

/// One UDP datagram sent from host `from` with a forged IPv4 source (a raw socket).
fn send_forged_udp(topo: &Topology, from: usize, src: Ipv4Addr, dst: Ipv4Addr, port: u16) {
    let script = format!(
        "import socket,struct\n\
         def csum(b):\n s=sum(struct.unpack('!10H',b)); s=(s>>16)+(s&0xffff); s+=s>>16; return ~s&0xffff\n\
         udp=struct.pack('!HHHH',5555,{port},12,0)+b'yard'\n\
         ip=struct.pack('!BBHHHBBH4s4s',0x45,0,32,1,0,64,17,0,socket.inet_aton('{src}'),socket.inet_aton('{dst}'))\n\
         ip=ip[:10]+struct.pack('!H',csum(ip))+ip[12:]\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_RAW)\n\
         [s.sendto(ip+udp,('{dst}',0)) for _ in range(5)]\n"
    );
    let out = topo.exec(from, "python3", &["-c", &script]).unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// The sum of host `i`'s kernel counters `names`, absolute (`nstat`'s history file is per
/// user, shared by every namespace, so its deltas would mix hosts).
fn nstat(topo: &Topology, i: usize, names: &[&str]) -> u64 {
    let mut args = vec!["-asz"];
    args.extend_from_slice(names);
    let out = topo.exec(i, "nstat", &args).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The gateway turns on `forwarding` and `accept_local` on its interface for the kernel path
/// to unresolved hosts; on their own they would make the node a router for the fabric and let
/// the fabric speak to its sockets as the node itself. Host 1: the gateway, with a second
/// network (a veth pair) behind it; hosts 2 and 3 on the fabric. Host 2 routes through
/// the gateway to that network and to host 3, and sends datagrams to the gateway under the
/// gateway's own address: none of it gets through. The kernel path itself still works: the
/// unresolved-host test below forwards through it.
#[test]
fn the_gateway_interfaces_forwarding_is_confined_to_the_kernel_path() {
    require_root();
    let topo = Topology::new(3).unwrap();
    let c = gateway_cluster(&topo, 1, true, RELAXED_LEASE);
    c.wait_leader(1).unwrap();
    let sysctl = |key: &str| {
        let out = topo
            .exec(1, "sysctl", &["-n", &format!("net.ipv4.conf.eth0.{key}")])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let start = Instant::now();
    while sysctl("forwarding") != "1" || sysctl("accept_local") != "1" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the gateway never enabled its kernel path"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let run = |i: usize, args: &[&str]| {
        let out = topo.exec(i, "ip", args).unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    };
    // A network behind the gateway that the fabric has no business reaching: a veth pair in
    // host 1, with a permanent neighbour so that whatever is routed there is transmitted.
    run(
        1,
        &[
            "link", "add", "ydpriv", "type", "veth", "peer", "name", "ydpriv1",
        ],
    );
    run(1, &["addr", "add", "198.18.200.1/24", "dev", "ydpriv"]);
    // No IPv6 on it: its own router solicitations would count as transmitted.
    for dev in ["ydpriv", "ydpriv1"] {
        let out = topo
            .exec(
                1,
                "sysctl",
                &["-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")],
            )
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    run(1, &["link", "set", "ydpriv", "up"]);
    run(1, &["link", "set", "ydpriv1", "up"]);
    run(
        1,
        &[
            "neigh",
            "replace",
            "198.18.200.2",
            "lladdr",
            "02:59:44:00:c8:02",
            "dev",
            "ydpriv",
            "nud",
            "permanent",
        ],
    );
    let gw = topo.addr(1).to_string();
    // Host 2 keeps using the gateway as its next hop: the kernel sends a redirect for a packet
    // it would forward back out of the interface it came in on (before any filter sees it),
    // and a host that took it would go to host 3 directly.
    for key in ["all", "eth0"] {
        let out = topo
            .exec(
                2,
                "sysctl",
                &["-qw", &format!("net.ipv4.conf.{key}.accept_redirects=0")],
            )
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    run(2, &["route", "add", "198.18.200.0/24", "via", &gw]);
    run(
        2,
        &["route", "add", &format!("{}/32", topo.addr(3)), "via", &gw],
    );
    let tx_private = || {
        let out = topo
            .exec(1, "cat", &["/sys/class/net/ydpriv/statistics/tx_packets"])
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let private_before = tx_private();
    let echos_before = nstat(&topo, 3, &["IcmpInEchos"]);

    // Routed through the gateway: into the network behind it, and back onto the fabric.
    for dst in ["198.18.200.2".to_owned(), topo.addr(3).to_string()] {
        topo.exec(2, "ping", &["-n", "-c", "3", "-i", "0.2", "-W", "1", &dst])
            .unwrap();
    }
    send_forged_udp(&topo, 2, topo.addr(3), "198.18.200.2".parse().unwrap(), 9);
    // The gateway's own address as the source, to a port of the gateway a socket listens on.
    let got = std::thread::scope(|scope| {
        let listener = scope.spawn(|| {
            let out = topo
                .exec(
                    1,
                    "python3",
                    &[
                        "-c",
                        "import socket\n\
                         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
                         s.bind(('0.0.0.0',7777)); s.settimeout(1.5); n=0\n\
                         try:\n while True: s.recv(100); n+=1\n\
                         except socket.timeout: pass\n\
                         print(n)\n",
                    ],
                )
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(400));
        send_forged_udp(&topo, 2, topo.addr(1), topo.addr(1), 7777);
        listener.join().unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));

    assert_eq!(
        tx_private() - private_before,
        0,
        "the fabric routed into the network behind the gateway"
    );
    assert_eq!(
        nstat(&topo, 3, &["IcmpInEchos"]) - echos_before,
        0,
        "the gateway routed pings between fabric hosts"
    );
    assert_eq!(
        got, 0,
        "a datagram with the gateway's own address as its source reached a socket of the gateway"
    );
    let table = topo
        .exec(1, "nft", &["list", "table", "ip", "yard_gateway"])
        .unwrap();
    assert!(table.status.success(), "{table:?}");
}

/// Owner changes per VIP over a run of `vip list` samples (a failed poll is skipped; a change
/// to or from "no owner" counts).
/// One `vip list`: (vip, owner, handoff target) rows.
type VipTable = Vec<(Ipv4Addr, Option<u64>, Option<u64>)>;

fn owner_changes(samples: &[VipTable]) -> Vec<(Ipv4Addr, u32)> {
    let mut last: std::collections::BTreeMap<Ipv4Addr, Option<u64>> = Default::default();
    let mut changes: std::collections::BTreeMap<Ipv4Addr, u32> = Default::default();
    for s in samples {
        for (v, owner, _) in s {
            let n = changes.entry(*v).or_default();
            if let Some(prev) = last.insert(*v, *owner) {
                if prev != *owner {
                    *n += 1;
                }
            }
        }
    }
    changes.into_iter().collect()
}

/// One gateway owner's control traffic (QUIC, UDP 7480) 40% lossy both ways for 15 s, the data
/// plane untouched: the VIP table must not flap. Each VIP may change owner at most four times
/// over the fault and the 5 s after it: away and back for at most two lapses, since the
/// hold-down (3 s after a first lapse) quadruples with each further one. Without damping a lossy
/// owner's VIPs bounced on every lapse: 13 to 25 owner changes per VIP in this test.
#[test]
fn a_lossy_control_link_moves_each_vip_at_most_four_times() {
    require_root();
    let topo = Topology::new(3).unwrap();
    let c = gateway_cluster(&topo, 3, false, RELAXED_LEASE);
    add_pool(&c);
    let leader = c.wait_leader(1).unwrap();
    let others: Vec<u64> = (1..=3).filter(|n| *n != leader as u64).collect();
    let placed = wait_owners(&c, leader, Duration::from_secs(15), |o| {
        balanced(o, &others)
    });
    let faulted = owner_of(&placed, vip(1)) as usize;
    let observer = (1..=3).find(|i| *i != faulted).unwrap();
    topo.control_fault(
        &[faulted],
        yard_cluster_tests::yard::PORT,
        yard_cluster_tests::ControlFault::Loss { pct: 40 },
    )
    .unwrap();
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut healed = false;
    while start.elapsed() < Duration::from_secs(20) {
        if !healed && start.elapsed() >= Duration::from_secs(15) {
            topo.clear_control_faults().unwrap();
            healed = true;
        }
        if let Ok(out) = c.cli(observer, &["gateway", "vip", "list", "--json"]) {
            if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                if let Some(rows) = v.as_array() {
                    samples.push(
                        rows.iter()
                            .map(|r| {
                                (
                                    r["vip"].as_str().unwrap().parse().unwrap(),
                                    r["owner"].as_u64(),
                                    r["handoff_to"].as_u64(),
                                )
                            })
                            .collect::<Vec<_>>(),
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    topo.clear_control_faults().unwrap();
    let changes = owner_changes(&samples);
    let total: u32 = changes.iter().map(|c| c.1).sum();
    println!(
        "control loss 40% on node {faulted} for 15 s (+5 s healed), {} samples: owner changes per vip {changes:?}, {total} in all",
        samples.len()
    );
    assert!(samples.len() > 50, "too few samples: {}", samples.len());
    for (v, n) in &changes {
        assert!(*n <= 4, "{v} changed owner {n} times: {changes:?}");
    }
}

/// Busy loops on every core for a bounded time, in this process: stopped and joined when
/// dropped, so a failing test leaves nothing spinning.
struct CpuHogs {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuHogs {
    fn start(threads: usize, at_most: Duration) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let end = Instant::now() + at_most;
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < end {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

const FENCED: &str = "gateway fenced: the lease lapsed, no vip is answered for";

/// The leader is killed while busy loops contend for both cores, so the election
/// takes long (hundreds of ms to over a second here). The other nodes' leases are held by the
/// remaining voters: the VIPs on them stay answered and a probe through one loses nothing.
#[test]
fn killing_the_leader_while_the_cpu_is_contended_interrupts_no_other_node() {
    require_root();
    let topo = Topology::new(5).unwrap();
    let mut c = gateway_cluster(&topo, 3, false, "[log]\nformat = \"json\"\n");
    add_pool(&c);
    let leader = c.wait_leader(1).unwrap() as u64;
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != leader).collect();
    let placed = wait_owners(&c, others[0] as usize, Duration::from_secs(10), |o| {
        balanced(o, &others)
    });
    let mut ov = Overlay::new(&topo);
    let a = ov
        .add_tenant(
            4,
            100,
            Ipv4Addr::new(198, 19, 1, 1),
            tenant_mac(100, 1),
            placed[0].0,
        )
        .unwrap();
    let b = ov
        .add_tenant(
            5,
            100,
            Ipv4Addr::new(198, 19, 1, 2),
            tenant_mac(100, 2),
            placed[0].0,
        )
        .unwrap();
    add_endpoints(&c, &[&a, &b]);
    a.wait_reachable(b.ip(), Duration::from_secs(10)).unwrap();
    let probe = ProbeStream::start(&a, &b, 9600, 1000).unwrap();
    assert!(probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5)
    ));
    let fences_before: Vec<usize> = others
        .iter()
        .map(|n| log_events(&c, *n as usize, FENCED).len())
        .collect();
    // A busy loop per core for 4 s: the daemons, the tenants and the probe get a fraction of
    // a core each, and the election after the kill takes long.
    let hogs = CpuHogs::start(2, Duration::from_secs(4));
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    c.kill9(leader as usize).unwrap();
    let ask = others[0] as usize;
    let new_leader = loop {
        match c.leader(ask) {
            Some(l) if l as u64 != leader => break l as u64,
            _ => assert!(killed.elapsed() < Duration::from_secs(15), "no new leader"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "new leader {new_leader} seen {} ms after the kill, under contention",
        killed.elapsed().as_millis()
    );
    drop(hogs);
    std::thread::sleep(Duration::from_secs(1));
    let report = probe.stop();
    eprintln!("killing the leader under contention: {}", report.to_json(5));
    // Shown, not asserted: a node starved of CPU long enough still misses its own renewals
    // (its lease doing its job, not the election's doing); what must not happen is that the
    // VIPs on the other nodes stop being answered, which the probe measures.
    let fenced: Vec<(u64, Vec<Value>)> = others
        .iter()
        .zip(&fences_before)
        .map(|(n, before)| {
            let fences = log_events(&c, *n as usize, FENCED);
            (*n, fences[(*before).min(fences.len())..].to_vec())
        })
        .collect();
    eprintln!("fences after the kill: {fenced:?}");
    assert_eq!(
        report.lost,
        0,
        "killing the leader: {} (fences after the kill: {fenced:?})",
        report.to_json(5)
    );
    assert_eq!(report.duplicates, 0);
}

/// `yard plan show --json` through node `i`.
fn plan_show(c: &YardCluster<&Topology>, i: usize) -> Value {
    cli_json(c, i, &["plan", "show"])
}

/// The latest re-plan's nodes as (node, measured load) when it moved nothing, else `None`.
fn settled_plan(plan: &Value) -> Option<Vec<(u64, f64)>> {
    let report = &plan["latest"]["report"];
    if !report["moves"].as_array()?.is_empty() {
        return None;
    }
    report["nodes"]
        .as_array()?
        .iter()
        .map(|n| Some((n["node"].as_u64()?, n["measured"].as_f64()?)))
        .collect()
}

/// The namespace test: three gateways, two 1000 packets/s streams through two VIPs that
/// the count spread put on one node (capacity 1500 packets/s: overloaded). The leader's planner,
/// driven by the nodes' measured per-VIP counters, moves one away by handoff without losing a
/// packet. Then a node carrying a heavy VIP is killed: its VIPs move at once by counts, the
/// re-plan after it leaves no survivor over capacity, and the stream through the VIP that was
/// not on the dead node loses nothing through the failure and the re-plan.
#[test]
fn the_planner_places_vips_by_measured_traffic_and_no_survivor_of_a_kill_is_overloaded() {
    require_root();
    let topo = Topology::new(5).unwrap();
    let planner = "[planner]\nenabled = true\ninterval_ms = 1000\nreport_ms = 250\nsmoothing = 0.5\nmax_moves = 1\ncapacity_bps = 1e9\ncapacity_pps = 1500.0\n";
    let c = gateway_cluster(
        &topo,
        3,
        true,
        // Raft's timing relaxed (the gateway's own leases are not): the test picks the heavy
        // VIPs' node as one that is not the leader. In a local CI run on a slow machine an
        // election happened during the test (term 2, another leader) and one heavy VIP had
        // left the node by the time the planner looked, with no planner move recorded.
        &format!(
            "{RELAXED_LEASE}[raft]\nheartbeat_ms = 100\nelection_timeout_min_ms = 300\nelection_timeout_max_ms = 500\n[log]\nformat = \"json\"\n{planner}"
        ),
    );
    add_pool(&c);
    let placed = wait_owners(&c, 1, Duration::from_secs(10), |o| balanced(o, &[1, 2, 3]));
    let leader = c.wait_leader(1).unwrap() as u64;
    // Two VIPs the count spread put on one node other than the leader.
    let x = if leader == 2 { 3 } else { 2 };
    let heavy: Vec<Ipv4Addr> = placed
        .iter()
        .filter(|r| r.1 == Some(x))
        .map(|r| r.0)
        .collect();
    assert_eq!(heavy.len(), 2, "{placed:?}");
    let (h1, h2) = (heavy[0], heavy[1]);
    let plan = plan_show(&c, 1);
    assert_eq!(plan["enabled"], true, "{plan}");
    let mut ov = Overlay::new(&topo);
    let a = ov
        .add_tenant(4, 100, Ipv4Addr::new(198, 19, 1, 1), tenant_mac(100, 1), h1)
        .unwrap();
    let b = ov
        .add_tenant(5, 100, Ipv4Addr::new(198, 19, 1, 2), tenant_mac(100, 2), h2)
        .unwrap();
    add_endpoints(&c, &[&a, &b]);
    a.wait_reachable(b.ip(), Duration::from_secs(10)).unwrap();
    b.wait_reachable(a.ip(), Duration::from_secs(10)).unwrap();
    let flowing = |p: &ProbeStream| {
        p.wait_flowing(
            Duration::from_millis(300),
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
    };

    // Phase 1: the measured skew is re-planned, make-before-break.
    let s1 = ProbeStream::start(&a, &b, 9600, 1000).unwrap();
    let s2 = ProbeStream::start(&b, &a, 9601, 1000).unwrap();
    assert!(flowing(&s1) && flowing(&s2));
    wait_owners(&c, 1, Duration::from_secs(30), |o| {
        owner_of(o, h1) != owner_of(o, h2)
    });
    let start = Instant::now();
    let loads = loop {
        let plan = plan_show(&c, 1);
        if let Some(l) = settled_plan(&plan) {
            if l.len() == 3 && l.iter().all(|(_, m)| *m <= 1.0) {
                break l;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the plan did not settle under capacity: {plan}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let plan = plan_show(&c, 1);
    eprintln!("after the re-plan: loads {loads:?}, plan {plan}");
    let moved = &plan["last_moved"]["report"]["moves"];
    assert!(
        moved
            .as_array()
            .is_some_and(|m| m.len() == 1 && m[0]["from"] == x),
        "one heavy vip left node {x}: {plan}"
    );
    // Past the linger time, so that the old owner's forwarding is over too.
    std::thread::sleep(Duration::from_millis(3500));
    for (name, r) in [("h1", s1.stop()), ("h2", s2.stop())] {
        eprintln!("re-plan, stream through {name}: {}", r.to_json(3));
        assert_eq!(r.lost, 0, "the re-plan lost packets: {}", r.to_json(5));
        assert_eq!(r.duplicates, 0);
    }

    // Phase 2: a node carrying a heavy VIP dies.
    let s1 = ProbeStream::start(&a, &b, 9602, 1000).unwrap();
    let s2 = ProbeStream::start(&b, &a, 9603, 1000).unwrap();
    assert!(flowing(&s1) && flowing(&s2));
    let now = owners(&c, leader as usize);
    let k = [owner_of(&now, h1), owner_of(&now, h2)]
        .into_iter()
        .find(|n| *n != leader)
        .expect("the heavy vips are on two nodes, one not the leader");
    let on_dead_is_h1 = owner_of(&now, h1) == k;
    let mut c = c;
    c.kill9(k as usize).unwrap();
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != k).collect();
    wait_owners(&c, leader as usize, Duration::from_secs(15), |o| {
        o.iter().all(|r| r.1 != Some(k))
    });
    let start = Instant::now();
    let after = loop {
        let plan = plan_show(&c, leader as usize);
        let o = owners(&c, leader as usize);
        if let Some(l) = settled_plan(&plan) {
            let nodes: Vec<u64> = l.iter().map(|(n, _)| *n).collect();
            if nodes == survivors
                && l.iter().all(|(_, m)| *m <= 1.0)
                && owner_of(&o, h1) != owner_of(&o, h2)
                && o.iter().all(|r| r.2.is_none())
            {
                break plan;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no re-plan left the survivors under capacity: {plan}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!("after the kill of node {k}: {after}");
    std::thread::sleep(Duration::from_millis(3500));
    let (r_dead, r_kept) = if on_dead_is_h1 {
        (s1.stop(), s2.stop())
    } else {
        (s2.stop(), s1.stop())
    };
    eprintln!(
        "kill, stream through the dead node's vip: {}",
        r_dead.to_json(3)
    );
    eprintln!(
        "kill, stream through the survivor's vip: {}",
        r_kept.to_json(3)
    );
    assert_eq!(
        r_kept.lost,
        0,
        "the failure and re-plan lost packets of a vip not on the dead node: {}",
        r_kept.to_json(5)
    );
    assert!(
        r_dead.received > 0 && r_dead.max_gap_ms < 3000.0,
        "{}",
        r_dead.to_json(5)
    );
    assert_eq!(r_kept.duplicates + r_dead.duplicates, 0);
}
