//! The gateway part of the main job (`deploy/demo.sh`): three `yard` gateway nodes owning six
//! VIPs, two compute hosts whose tenants talk over VXLAN through them, then the failure of the
//! host owning the tenants' VIP (its link goes down) under a 1 kpps probe stream, and a drain.
//! Every figure printed is measured from the data path. Needs root; cleans up on exit.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use yard_cluster_tests::overlay::{tenant_mac, Overlay};
use yard_cluster_tests::probe::ProbeStream;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::{Error, Result, Topology};

fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 255, n)
}

fn show(c: &YardCluster<&Topology>, i: usize, args: &[&str]) -> Result<String> {
    let out = c.cli(i, args)?;
    if !out.status.success() {
        return Err(Error::Yard(format!(
            "yard {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One row of `yard gateway vip list --json`: (vip, owner, handoff target).
type VipRow = (String, Option<u64>, Option<u64>);

/// The VIP table through node `i`.
fn owners(c: &YardCluster<&Topology>, i: usize) -> Result<Vec<VipRow>> {
    let text = show(c, i, &["gateway", "vip", "list", "--json"])?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::Yard(format!("vip list: {e}")))?;
    Ok(v.as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    (
                        r["vip"].as_str().unwrap_or("").to_owned(),
                        r["owner"].as_u64(),
                        r["handoff_to"].as_u64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

fn wait(
    c: &YardCluster<&Topology>,
    i: usize,
    what: &str,
    ok: impl Fn(&[VipRow]) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let o = owners(c, i)?;
        if o.iter().all(|r| r.1.is_some() && r.2.is_none()) && ok(&o) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(Error::Yard(format!("{what} did not happen: {o:?}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run(bin: PathBuf) -> Result<()> {
    let topo = Topology::new(5)?;
    for i in 1..=3 {
        topo.bpffs(i)?;
    }
    let config = format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\npin_dir = \"{}/bpffs-@HOST@/gateway\"\n",
        topo.dir().display()
    );
    println!("demo: gateway cluster of 3 nodes (hosts 1-3), compute hosts 4 and 5");
    let c = YardCluster::start_on(
        &topo,
        &bin,
        3,
        &ClusterOptions {
            extra_config: config,
            ..Default::default()
        },
    )?;
    let pool: Vec<String> = (1..=6).map(|n| vip(n).to_string()).collect();
    let mut args = vec!["gateway", "vip", "add"];
    args.extend(pool.iter().map(String::as_str));
    show(&c, 1, &args)?;
    wait(&c, 1, "placement", |_| true)?;
    println!("{}", show(&c, 1, &["gateway", "vip", "list"])?);

    // The tenants tunnel to a VIP of a node that does not lead Raft: a failure of the leader
    // adds an election and the new leader's takeover wait (`gateway-failover` measures both).
    let leader = c.wait_leader(1)? as u64;
    let tvip: Ipv4Addr = owners(&c, 1)?
        .into_iter()
        .find(|r| r.1 != Some(leader))
        .and_then(|r| r.0.parse().ok())
        .unwrap_or(vip(1));
    let mut ov = Overlay::new(&topo);
    let a = ov.add_tenant(
        4,
        100,
        Ipv4Addr::new(198, 19, 1, 1),
        tenant_mac(100, 1),
        tvip,
    )?;
    let b = ov.add_tenant(
        5,
        100,
        Ipv4Addr::new(198, 19, 1, 2),
        tenant_mac(100, 2),
        tvip,
    )?;
    for t in [&a, &b] {
        show(
            &c,
            1,
            &t.endpoint_add_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
    }
    let first = a.wait_reachable(b.ip(), Duration::from_secs(10))?;
    println!(
        "demo: tenant {} reaches {} through VIP {} (ARP answered in XDP) after {} ms",
        a.ip(),
        b.ip(),
        tvip,
        first.as_millis()
    );

    let owner = owners(&c, 1)?
        .into_iter()
        .find(|r| r.0 == tvip.to_string())
        .and_then(|r| r.1)
        .unwrap_or(1) as usize;
    let ask = leader as usize;
    let probe = ProbeStream::start(&a, &b, 9400, 1000)?;
    probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5),
    );
    println!(
        "demo: the link of host {owner} (owner of {tvip}) goes down under a 1 kpps probe stream"
    );
    topo.link_down(owner)?;
    wait(&c, ask, "failover", |o| {
        o.iter().all(|r| r.1 != Some(owner as u64))
    })?;
    std::thread::sleep(Duration::from_secs(1));
    let r = probe.stop();
    println!(
        "demo: loss window {:.0} ms ({} of {} probes lost, {} duplicated); its VIPs now:",
        r.max_gap_ms, r.lost, r.sent, r.duplicates
    );
    println!("{}", show(&c, ask, &["gateway", "vip", "list"])?);

    topo.link_up(owner)?;
    // Six VIPs over the two nodes that do not lead (the leader hands its VIPs away).
    wait(&c, ask, "rebalance", |o| {
        o.iter().filter(|r| r.1 == Some(owner as u64)).count() == 3
    })?;
    let drained = (1..=3)
        .find(|n| *n != owner && *n != leader as usize)
        .unwrap_or(ask);
    let probe = ProbeStream::start(&a, &b, 9401, 1000)?;
    probe.wait_flowing(
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(5),
    );
    println!("demo: host {owner} is back and took its share again; draining node {drained}");
    show(&c, ask, &["gateway", "drain", &drained.to_string()])?;
    wait(&c, ask, "drain", |o| {
        o.iter().all(|r| r.1 != Some(drained as u64))
    })?;
    std::thread::sleep(Duration::from_secs(1));
    let r = probe.stop();
    println!("demo: drain lost {} of {} probes", r.lost, r.sent);
    println!("{}", show(&c, owner, &["gateway", "stats"])?);
    Ok(())
}

fn main() -> ExitCode {
    let bin = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/release/yard"));
    let bin = match std::fs::canonicalize(&bin) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: no yard binary at {}: {e}", bin.display());
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = yard_cluster_tests::check_root().and_then(|()| run(bin)) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
