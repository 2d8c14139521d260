//! `gateway-failover`: the loss window when the host owning a VIP fails, measured from the data
//! path: a sequence-numbered UDP probe stream (1 kpps by default) from tenant A to tenant B
//! through the VIP; the loss window is the largest gap between consecutive received datagrams
//! in send order × the interval (`cluster_tests::probe`). Settings:
//! - `yard-default`, `yard-tight`: yard's gateway on every gateway host, liveness timings
//!   20/90/10 ms and 10/40/5 ms (interval/lease/margin); the phases come from the nodes' JSON
//!   logs: detection (fault → the leader logs the lapsed lease), reassignment (→ the new owner
//!   logs the VIP taken), announcement (→ it logs its first GARP), convergence (→ the first
//!   probe delivered after the gap, from the data path);
//! - `keepalived-default`, `keepalived-fastest`: Debian's keepalived on the same number of
//!   gateway hosts, each with the kernel data path (`cluster_tests::kernel_gw`); VRRPv2
//!   `advert_int 1`, and VRRPv3 `advert_int 0.01`.
//!
//! Fault (`--fault link`, the default): the owning gateway host's link goes down, which really
//! stops its data path (killing a daemon does not stop a pinned XDP program). After each run
//! the link comes back and the system settles; the next run fails whichever host owns the VIP
//! then. `--fault kill9` (yard settings only) kills the owner's daemon instead: its pinned XDP
//! program keeps forwarding until its lease lapses in the data plane (the fencing path), and the
//! daemon is restarted after the run.
//!
//! Each setting runs on a fresh topology of the same shape (hosts 1..=G gateways, G+1 and G+2
//! compute hosts), one setting after another, so no idle cluster of another setting competes
//! for the 2 CPUs. A benchmark: it prints figures (JSON on stdout, a table on stderr), never
//! fails on a number, and bounds every wait.

#[allow(dead_code)]
#[path = "../gateway/mod.rs"]
mod gateway;
#[allow(dead_code)]
#[path = "../stats.rs"]
mod stats;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use yard_cluster_tests::keepalived::{Keepalived, VrrpSettings};
use yard_cluster_tests::kernel_gw::KernelGateway;
use yard_cluster_tests::overlay::{Overlay, Tenant};
use yard_cluster_tests::probe::{ProbeOptions, ProbeReport, ProbeStream};
use yard_cluster_tests::yard::YardCluster;
use yard_cluster_tests::Topology;

use gateway::{ms_between, quantile, YardTimings};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const VNI: u32 = 100;
const PORT: u16 = 9300;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Setting {
    YardDefault,
    /// yard's default timings with `gateway.leader_holds_vips = true`: the Raft leader owns
    /// VIPs too, so some runs fail the leader (their loss windows are reported apart).
    YardLeaderVips,
    YardTight,
    YardFastest,
    KeepalivedDefault,
    KeepalivedFastest,
}

impl Setting {
    fn name(self) -> &'static str {
        match self {
            Setting::YardDefault => "yard-default",
            Setting::YardLeaderVips => "yard-leader-vips",
            Setting::YardTight => "yard-tight",
            Setting::YardFastest => "yard-fastest",
            Setting::KeepalivedDefault => "keepalived-default",
            Setting::KeepalivedFastest => "keepalived-fastest",
        }
    }
    fn is_yard(self) -> bool {
        matches!(
            self,
            Setting::YardDefault
                | Setting::YardLeaderVips
                | Setting::YardTight
                | Setting::YardFastest
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fault {
    /// The owner's link goes down.
    Link,
    /// kill -9 of the owner's yard daemon (yard settings only).
    Kill9,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gateway-failover",
    about = "VIP failover loss window: yard's gateway vs keepalived (needs root)"
)]
struct Args {
    /// Failovers per setting.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Probe datagrams per second (the loss window's resolution is one interval).
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Settings to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Setting::YardDefault, Setting::YardTight, Setting::YardFastest, Setting::KeepalivedDefault, Setting::KeepalivedFastest])]
    settings: Vec<Setting>,
    /// How the owner fails.
    #[arg(long, value_enum, default_value_t = Fault::Link)]
    fault: Fault,
    /// Gateway hosts (each a yard node, or a keepalived host).
    #[arg(long, default_value_t = 3)]
    gateways: usize,
    /// XDP attach mode of the yard gateway.
    #[arg(long, default_value = "generic")]
    xdp_mode: String,
    /// Longest a run waits for the stream to resume after the fault, seconds.
    #[arg(long, default_value_t = 15)]
    run_timeout_secs: u64,
    /// Seconds to let the system settle after the failed host is back.
    #[arg(long, default_value_t = 3)]
    settle_secs: u64,
    /// keepalived-fastest's advert interval, seconds (VRRPv3: centiseconds, 0.01 the floor).
    #[arg(long, default_value_t = 0.01)]
    ka_fast_advert: f64,
    /// keepalived-fastest's down_timer_adverts (unset: the RFC's 3 plus skew).
    #[arg(long)]
    ka_fast_down_timer_adverts: Option<u8>,
    /// The yard binary; defaults to `yard` beside this program.
    #[arg(long)]
    yard_bin: Option<PathBuf>,
    /// Also write the JSON object to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
}

fn main() -> ExitCode {
    gateway::exit_code("gateway-failover", run(&Args::parse()))
}

fn progress(msg: &str) {
    eprintln!("gateway-failover: {msg}");
}

/// One failover's figures.
#[derive(Debug, Clone, Default)]
struct RunFigures {
    run: usize,
    failed_host: usize,
    /// yard: whether the failed host was the Raft leader too (then detection waits for an
    /// election first).
    failed_was_leader: Option<bool>,
    new_owner: Option<usize>,
    loss_window_ms: Option<f64>,
    lost: u64,
    duplicates: u64,
    reordered: u64,
    /// Fault → first datagram delivered after the gap (convergence), ms.
    resumed_after_fault_ms: Option<f64>,
    detection_ms: Option<f64>,
    reassignment_ms: Option<f64>,
    announced_ms: Option<f64>,
    probe: Value,
    error: Option<String>,
}

impl RunFigures {
    fn to_json(&self) -> Value {
        json!({
            "run": self.run,
            "failed_host": self.failed_host,
            "failed_was_leader": self.failed_was_leader,
            "new_owner": self.new_owner,
            "loss_window_ms": self.loss_window_ms,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "phases_ms": {
                "detection": self.detection_ms,
                "reassignment": self.reassignment_ms,
                "announcement": self.announced_ms,
                "convergence": self.resumed_after_fault_ms,
            },
            "probe": self.probe,
            "error": self.error,
        })
    }
}

struct SettingResult {
    setting: Setting,
    config: Value,
    runs: Vec<RunFigures>,
    error: Option<String>,
}

impl SettingResult {
    fn summary(&self) -> Value {
        let ok: Vec<&RunFigures> = self.runs.iter().filter(|r| r.error.is_none()).collect();
        let windows: Vec<f64> = ok.iter().filter_map(|r| r.loss_window_ms).collect();
        let q = |v: &[f64]| {
            json!({
                "p50": quantile(v, 0.5).map(gateway::round1),
                "p95": quantile(v, 0.95).map(gateway::round1),
                "max": quantile(v, 1.0).map(gateway::round1),
                "n": v.len(),
            })
        };
        let phase = |f: fn(&RunFigures) -> Option<f64>| {
            let v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
            q(&v)
        };
        json!({
            "setting": self.setting.name(),
            "runs": self.runs.len(),
            "runs_with_errors": self.runs.len() - ok.len(),
            "lossless_runs": ok.iter().filter(|r| r.lost == 0).count(),
            "runs_failing_the_raft_leader": ok.iter().filter(|r| r.failed_was_leader == Some(true)).count(),
            "loss_window_ms_owner_not_leader": q(&ok.iter().filter(|r| r.failed_was_leader == Some(false)).filter_map(|r| r.loss_window_ms).collect::<Vec<_>>()),
            "loss_window_ms_owner_leader": q(&ok.iter().filter(|r| r.failed_was_leader == Some(true)).filter_map(|r| r.loss_window_ms).collect::<Vec<_>>()),
            "loss_window_ms": q(&windows),
            "lost_total": ok.iter().map(|r| r.lost).sum::<u64>(),
            "duplicates_total": ok.iter().map(|r| r.duplicates).sum::<u64>(),
            "reordered_total": ok.iter().map(|r| r.reordered).sum::<u64>(),
            "phases_ms": {
                "detection": phase(|r| r.detection_ms),
                "reassignment": phase(|r| r.reassignment_ms),
                "announcement": phase(|r| r.announced_ms),
                "convergence": phase(|r| r.resumed_after_fault_ms),
            },
        })
    }
}

fn run(args: &Args) -> Result<()> {
    if args.runs == 0 || args.rate == 0 || args.rate > 100_000 {
        bail!("--runs must be at least 1 and --rate 1..=100000");
    }
    if !(2..=8).contains(&args.gateways) {
        bail!("--gateways must be 2..=8");
    }
    yard_cluster_tests::check_root()
        .context("gateway-failover makes network namespaces; run it as root")?;
    let settings: Vec<Setting> = args
        .settings
        .iter()
        .copied()
        .filter(|s| {
            let keep = args.fault == Fault::Link || s.is_yard();
            if !keep {
                progress(&format!(
                    "{}: skipped, --fault kill9 applies to yard only",
                    s.name()
                ));
            }
            keep
        })
        .collect();
    let yard_bin = if settings.iter().any(|s| s.is_yard()) {
        Some(gateway::yard_bin(args.yard_bin.clone())?)
    } else {
        None
    };
    let started = Instant::now();
    let mut results = Vec::new();
    for &setting in &settings {
        progress(&format!("=== {} ({} runs)", setting.name(), args.runs));
        let r = run_setting(args, setting, yard_bin.as_deref());
        if let Some(e) = &r.error {
            progress(&format!("{}: {e}", setting.name()));
        }
        results.push(r);
    }

    let report = json!({
        "benchmark": "gateway-failover",
        "cpus": gateway::cpus(),
        "args": {
            "runs": args.runs, "rate_pps": args.rate, "fault": format!("{:?}", args.fault).to_lowercase(),
            "gateways": args.gateways, "xdp_mode": args.xdp_mode,
            "run_timeout_secs": args.run_timeout_secs, "settle_secs": args.settle_secs,
        },
        "method": "loss window = largest gap between consecutive received probes in send order x interval; convergence = fault -> first probe delivered after the gap; detection/reassignment/announcement from the nodes' JSON logs (wall clock, same machine)",
        "settings": results.iter().map(|r| json!({
            "setting": r.setting.name(),
            "config": r.config,
            "error": r.error,
            "summary": r.summary(),
            "runs": r.runs.iter().map(RunFigures::to_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(p) = &args.json_out {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    eprintln!();
    eprintln!(
        "{:<20} {:>5} {:>9} {:>9} {:>9} {:>8} {:>5} {:>9} {:>9} {:>9}",
        "setting",
        "runs",
        "p50 ms",
        "p95 ms",
        "max ms",
        "lost",
        "dup",
        "detect",
        "reassign",
        "converge"
    );
    for r in &results {
        let s = r.summary();
        let f = |v: &Value| {
            v.as_f64()
                .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
        };
        eprintln!(
            "{:<20} {:>5} {:>9} {:>9} {:>9} {:>8} {:>5} {:>9} {:>9} {:>9}",
            r.setting.name(),
            s["runs"].to_string(),
            f(&s["loss_window_ms"]["p50"]),
            f(&s["loss_window_ms"]["p95"]),
            f(&s["loss_window_ms"]["max"]),
            s["lost_total"].to_string(),
            s["duplicates_total"].to_string(),
            f(&s["phases_ms"]["detection"]["p50"]),
            f(&s["phases_ms"]["reassignment"]["p50"]),
            f(&s["phases_ms"]["convergence"]["p50"]),
        );
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.setting.name())
        .collect();
    if !failed.is_empty() {
        bail!("could not measure: {}", failed.join(", "));
    }
    Ok(())
}

/// One setting on a fresh topology; errors end up in the result.
fn run_setting(args: &Args, setting: Setting, yard_bin: Option<&std::path::Path>) -> SettingResult {
    let mut result = SettingResult {
        setting,
        config: Value::Null,
        runs: Vec::new(),
        error: None,
    };
    if let Err(e) = run_setting_inner(args, setting, yard_bin, &mut result) {
        result.error = Some(format!("{e:#}"));
    }
    result
}

fn run_setting_inner(
    args: &Args,
    setting: Setting,
    yard_bin: Option<&std::path::Path>,
    result: &mut SettingResult,
) -> Result<()> {
    let g = args.gateways;
    let (host_a, host_b) = (g + 1, g + 2);
    let topo = Topology::new(g + 2).context("cannot make the test hosts")?;
    progress(&format!(
        "test hosts yd{}-1..{}: gateways 1..={g}, tenants on {host_a} and {host_b}",
        topo.run_id(),
        g + 2
    ));
    let mut ov = Overlay::new(&topo);
    let (a, b) = gateway::tenant_pair(&mut ov, (host_a, host_b), VNI, VIP)?;
    let mut sys = match setting {
        Setting::YardDefault
        | Setting::YardLeaderVips
        | Setting::YardTight
        | Setting::YardFastest => {
            let t = match setting {
                Setting::YardDefault | Setting::YardLeaderVips => YardTimings::DEFAULT,
                Setting::YardTight => YardTimings::TIGHT,
                _ => YardTimings::FASTEST,
            };
            result.config = t.to_json();
            if setting == Setting::YardLeaderVips {
                result.config["gateway.leader_holds_vips"] = json!(true);
            }
            let bin = yard_bin.context("no yard binary")?;
            let extra = if setting == Setting::YardLeaderVips {
                "leader_holds_vips = true\n"
            } else {
                ""
            };
            let c = gateway::start_yard(&topo, bin, g, &args.xdp_mode, t, extra)?;
            gateway::configure_yard_gateway(&c, host_a, VIP, &[a.clone(), b.clone()])?;
            let owner = gateway::wait_vip_owner(&c, host_a, None, VIP, Duration::from_secs(30))?;
            progress(&format!("VIP {VIP} owned by node {owner}"));
            System::Yard(c)
        }
        Setting::KeepalivedDefault | Setting::KeepalivedFastest => {
            let vrrp = if setting == Setting::KeepalivedDefault {
                VrrpSettings::default_settings()
            } else {
                VrrpSettings {
                    advert_int_s: args.ka_fast_advert,
                    down_timer_adverts: args.ka_fast_down_timer_adverts,
                    ..VrrpSettings::fastest()
                }
            };
            result.config = vrrp.to_json();
            for h in 1..=g {
                KernelGateway::install(&topo, h, VIP, &[a.clone(), b.clone()], false)?;
            }
            let hosts: Vec<usize> = (1..=g).collect();
            let ka = Keepalived::start(&topo, &hosts, VIP, &vrrp)?;
            let owner = ka.wait_master(Duration::from_secs(20))?;
            progress(&format!("VIP {VIP} held by host {owner} (keepalived)"));
            System::Keepalived(ka)
        }
    };
    a.wait_reachable(b.ip(), Duration::from_secs(15))
        .context("tenant A cannot reach B through the VIP")?;
    for run in 1..=args.runs {
        let fig = match one_run(args, &topo, &mut sys, &a, &b, run) {
            Ok(f) => f,
            Err(e) => {
                // A run that could not be measured or recovered: record it; stop the setting if
                // the system cannot be brought back.
                let msg = format!("{e:#}");
                progress(&format!("{} run {run}: {msg}", setting.name()));
                result.runs.push(RunFigures {
                    run,
                    error: Some(msg.clone()),
                    ..RunFigures::default()
                });
                if let Err(e2) = recover_ready(args, &topo, &mut sys, &a, &b, None) {
                    bail!("run {run} failed ({msg}) and the system did not recover: {e2:#}");
                }
                continue;
            }
        };
        progress(&format!(
            "{} run {run}/{}: host {}{} failed, new owner {}, loss window {}, lost {}, dup {}, reord {}, detect {}, reassign {}, announce {}, converge {}",
            setting.name(),
            args.runs,
            fig.failed_host,
            if fig.failed_was_leader == Some(true) { " (the Raft leader)" } else { "" },
            fig.new_owner.map_or_else(|| "?".into(), |o| o.to_string()),
            opt_ms(fig.loss_window_ms),
            fig.lost,
            fig.duplicates,
            fig.reordered,
            opt_ms(fig.detection_ms),
            opt_ms(fig.reassignment_ms),
            opt_ms(fig.announced_ms),
            opt_ms(fig.resumed_after_fault_ms),
        ));
        result.runs.push(fig);
    }
    drop(sys);
    drop(ov);
    drop(topo);
    Ok(())
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.1} ms"))
}

enum System<'t> {
    Yard(YardCluster<&'t Topology>),
    Keepalived(Keepalived),
}

/// The VIP's current owner.
fn current_owner(sys: &System<'_>, from: usize) -> Result<usize> {
    match sys {
        System::Yard(c) => gateway::wait_vip_owner(c, from, None, VIP, Duration::from_secs(20)),
        System::Keepalived(ka) => Ok(ka.wait_master(Duration::from_secs(20))?),
    }
}

fn one_run(
    args: &Args,
    topo: &Topology,
    sys: &mut System<'_>,
    a: &Tenant,
    b: &Tenant,
    run: usize,
) -> Result<RunFigures> {
    let owner = current_owner(sys, a.host())?;
    let timeout = Duration::from_secs(args.run_timeout_secs);
    let probe = ProbeStream::start_with(
        a,
        b,
        ProbeOptions {
            port: PORT,
            rate_pps: args.rate,
            max_duration: timeout + Duration::from_secs(30),
        },
    )?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    if !probe.wait_flowing(
        Duration::from_millis(500),
        (interval * 20).max(Duration::from_millis(20)),
        Duration::from_secs(10),
    ) {
        bail!("the probe stream did not flow steadily through host {owner} before the fault");
    }
    let leader = match sys {
        System::Yard(c) => (1..=c.len())
            .find(|&h| h != owner)
            .and_then(|h| c.leader(h)),
        System::Keepalived(_) => None,
    };
    let fault_wall = SystemTime::now();
    let fault = Instant::now();
    match (args.fault, &mut *sys) {
        (Fault::Kill9, System::Yard(c)) => c.kill9(owner)?,
        _ => topo.link_down(owner)?,
    }
    wait_resumed(&probe, fault, interval, timeout);
    std::thread::sleep(Duration::from_secs(1));
    let report = probe.stop();

    let mut fig = figures_from_probe(&report, fault, run, owner);
    fig.failed_was_leader = leader.map(|l| l == owner);
    match sys {
        System::Yard(c) => yard_phases(topo, c.len(), owner, fault_wall, &mut fig),
        // keepalived logs no ms timestamps: only who holds the VIP now, before recovery.
        System::Keepalived(ka) => {
            fig.new_owner = ka
                .holders()
                .ok()
                .and_then(|h| h.into_iter().find(|&x| x != owner));
        }
    }
    recover_ready(args, topo, sys, a, b, Some(owner))?;
    Ok(fig)
}

/// Waits until the stream has gone quiet after the fault and then delivered again, or the
/// timeout; returns early if it never went quiet within 2 s (a lossless failover).
fn wait_resumed(probe: &ProbeStream, fault: Instant, interval: Duration, timeout: Duration) {
    let quiet = (interval * 5).max(Duration::from_millis(20));
    let mut quiet_seen: Option<Instant> = None;
    while fault.elapsed() < timeout {
        let now = Instant::now();
        let last = probe.last_received_at();
        match quiet_seen {
            None => {
                if last.is_none_or(|t| now.saturating_duration_since(t) > quiet) {
                    quiet_seen = Some(now);
                } else if fault.elapsed() > Duration::from_secs(2) {
                    return;
                }
            }
            Some(q) => {
                if last.is_some_and(|t| t > q) {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn figures_from_probe(r: &ProbeReport, fault: Instant, run: usize, owner: usize) -> RunFigures {
    let fault_ms = r.offset_ms(fault);
    // The gap the fault opened: the largest one that ends after the fault.
    let gap = r
        .gaps
        .iter()
        .filter(|g| g.start_ms + g.len_ms >= fault_ms)
        .max_by(|x, y| x.len_ms.total_cmp(&y.len_ms));
    RunFigures {
        run,
        failed_host: owner,
        loss_window_ms: Some(gap.map_or(0.0, |g| g.len_ms)),
        lost: r.lost,
        duplicates: r.duplicates,
        reordered: r.reordered,
        resumed_after_fault_ms: gap.and_then(|g| g.resumed_rx_ms).map(|t| t - fault_ms),
        probe: r.to_json(3),
        error: gap
            .is_some_and(|g| g.resumed_rx_ms.is_none())
            .then(|| "the stream did not resume before the run timeout".to_owned()),
        ..RunFigures::default()
    }
}

/// Detection, reassignment and announcement from the nodes' JSON logs.
fn yard_phases(
    topo: &Topology,
    nodes: usize,
    owner: usize,
    fault: SystemTime,
    fig: &mut RunFigures,
) {
    const LAPSED: &str = "gateway lease lapsed";
    const TAKEN: &str = "gateway vip taken";
    const ANNOUNCED: &str = "gateway announced";
    let vip = VIP.to_string();
    let mut events = Vec::new();
    for h in 1..=nodes {
        events.extend(
            gateway::log_events(topo, h, &[LAPSED, TAKEN, ANNOUNCED])
                .into_iter()
                .filter(|e| e.at >= fault),
        );
    }
    events.sort_by_key(|e| e.at);
    let is_owner =
        |v: &Value| v.as_u64() == Some(owner as u64) || v.as_str() == Some(&owner.to_string());
    let first = |msg: &str, pred: &dyn Fn(&gateway::LogEvent) -> bool| {
        events.iter().find(|e| e.message == msg && pred(e)).cloned()
    };
    fig.detection_ms =
        first(LAPSED, &|e| is_owner(&e.fields["node"])).map(|e| ms_between(fault, e.at));
    let taken = first(TAKEN, &|e| {
        e.host != owner && e.fields["vip"].as_str() == Some(&vip)
    });
    fig.reassignment_ms = taken.as_ref().map(|e| ms_between(fault, e.at));
    fig.new_owner = taken.as_ref().map(|e| e.host);
    fig.announced_ms = first(ANNOUNCED, &|e| {
        e.host != owner && e.fields["vip"].as_str() == Some(&vip)
    })
    .map(|e| ms_between(fault, e.at));
}

/// Brings the failed host back (link up, or the daemon restarted) and waits until the VIP has
/// one owner and tenant A reaches B again, then lets things settle.
fn recover_ready(
    args: &Args,
    topo: &Topology,
    sys: &mut System<'_>,
    a: &Tenant,
    b: &Tenant,
    failed: Option<usize>,
) -> Result<()> {
    let hosts: Vec<usize> = match sys {
        System::Yard(c) => (1..=c.len()).collect(),
        System::Keepalived(ka) => ka.hosts(),
    };
    for h in failed.into_iter().chain(hosts.iter().copied()) {
        // Links that are down come up (all of them when recovering from an unknown state).
        let out = topo.exec(h, "ip", &["-o", "link", "show", "dev", "eth0"])?;
        if !String::from_utf8_lossy(&out.stdout).contains("state UP") {
            topo.link_up(h)?;
        }
    }
    match sys {
        System::Yard(c) => {
            if let Some(h) = failed {
                if c.process(h).is_none() {
                    c.restart(h)?;
                }
            }
            let probe_node = hosts
                .iter()
                .copied()
                .find(|&h| Some(h) != failed)
                .unwrap_or(1);
            c.wait_voters(probe_node, c.len(), Duration::from_secs(30))?;
            gateway::wait_vip_owner(c, a.host(), None, VIP, Duration::from_secs(30))?;
        }
        System::Keepalived(ka) => {
            // Preemption is on and the first host has the highest priority: it takes the VIP
            // back once its master-down timer runs out after its link returns. Settled means
            // it holds the VIP alone again (otherwise the next run would race the preemption).
            let first = ka.hosts()[0];
            ka.wait_master_is(first, Duration::from_secs(30))?;
        }
    }
    std::thread::sleep(Duration::from_secs(args.settle_secs));
    a.wait_reachable(b.ip(), Duration::from_secs(15))
        .context("tenant A cannot reach B after recovery")?;
    Ok(())
}
