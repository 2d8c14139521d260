//! What the gateway benchmarks share: the yard gateway cluster and its CLI, the overlay layout,
//! log events for the failover phases, CPU readings and quantiles.
//!
//! Included by the `gateway-forward` and `gateway-failover` programs with `#[path]` (the bench
//! package has no library target); each uses a part of it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use yard_cluster_tests::overlay::{tenant_mac, Overlay, Tenant};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster, HOST_PLACEHOLDER};
use yard_cluster_tests::Topology;

/// The yard binary: `--yard-bin`, else `yard` beside this program (target/release/yard).
pub fn yard_bin(arg: Option<PathBuf>) -> Result<PathBuf> {
    let bin = match arg {
        Some(b) => b,
        None => std::env::current_exe()
            .context("cannot find this program's path")?
            .with_file_name("yard"),
    };
    if !bin.is_file() {
        bail!(
            "no yard binary at {}; build it with `cargo build --release -p yard` or pass --yard-bin",
            bin.display()
        );
    }
    // Absolute: the harness starts programs with the run directory as working directory.
    Ok(std::fs::canonicalize(&bin)?)
}

/// A benchmark's exit: success, or its error in one line (and how to keep the hosts' logs).
pub fn exit_code(program: &str, result: Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            if std::env::var_os("YARD_KEEP_LOGS").is_none() {
                eprintln!("{program}: run with YARD_KEEP_LOGS=1 to keep the hosts' logs");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// The gateway's liveness timings of one setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YardTimings {
    pub name: &'static str,
    pub interval_ms: u64,
    pub lease_ms: u64,
    pub lease_margin_ms: u64,
}

impl YardTimings {
    /// yard's defaults.
    pub const DEFAULT: Self = Self {
        name: "yard-default",
        interval_ms: 20,
        lease_ms: 90,
        lease_margin_ms: 10,
    };
    /// The tight setting.
    pub const TIGHT: Self = Self {
        name: "yard-tight",
        interval_ms: 10,
        lease_ms: 40,
        lease_margin_ms: 5,
    };

    /// The fastest setting, to set beside keepalived's fastest (VRRPv3 at 10 ms adverts, down
    /// after 3): renewals every 5 ms, a 20 ms lease.
    pub const FASTEST: Self = Self {
        name: "yard-fastest",
        interval_ms: 5,
        lease_ms: 20,
        lease_margin_ms: 3,
    };

    pub fn to_json(self) -> Value {
        serde_json::json!({
            "name": self.name,
            "liveness.interval_ms": self.interval_ms,
            "liveness.lease_ms": self.lease_ms,
            "liveness.lease_margin_ms": self.lease_margin_ms,
        })
    }
}

/// The TOML appended to every node's config: the gateway on `eth0`, pinned in the host's own
/// bpffs (mounted by [`start_yard`]), JSON logs for the phase breakdown.
pub fn yard_gateway_config(topo: &Topology, xdp_mode: &str, t: YardTimings) -> String {
    let pin = topo
        .dir()
        .join(format!("bpffs-{HOST_PLACEHOLDER}"))
        .join("yard/gateway");
    format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"{xdp_mode}\"\n\
         pin_dir = \"{}\"\nmtu = 1500\ngarp_repeats = 3\ngarp_interval_ms = 1100\n\
         [liveness]\ninterval_ms = {}\nlease_ms = {}\nlease_margin_ms = {}\n\
         [log]\nformat = \"json\"\n",
        pin.display(),
        t.interval_ms,
        t.lease_ms,
        t.lease_margin_ms
    )
}

/// Mounts hosts `1..=n`'s bpffs (checking they sit where [`yard_gateway_config`] says) and
/// starts an `n`-node yard cluster with the gateway on every node; `gateway_extra` is appended
/// to the `[gateway]` section (e.g. `leader_holds_vips = true`).
pub fn start_yard<'t>(
    topo: &'t Topology,
    bin: &Path,
    n: usize,
    xdp_mode: &str,
    t: YardTimings,
    gateway_extra: &str,
) -> Result<YardCluster<&'t Topology>> {
    for i in 1..=n {
        let fs = topo.bpffs(i)?;
        let expected = topo.dir().join(format!("bpffs-{i}"));
        if fs != expected {
            bail!(
                "host {i}'s bpffs is at {}, not {}",
                fs.display(),
                expected.display()
            );
        }
        std::fs::create_dir_all(fs.join("yard"))
            .with_context(|| format!("cannot create {}/yard", fs.display()))?;
    }
    let opts = ClusterOptions {
        extra_config: yard_gateway_config(topo, xdp_mode, t).replacen(
            "[liveness]",
            &format!("{gateway_extra}[liveness]"),
            1,
        ),
        ..Default::default()
    };
    YardCluster::start_on(topo, bin, n, &opts).context("the yard gateway cluster did not form")
}

/// Every node's endpoint except `skip`'s, comma-separated (the CLI tries them in order, so a
/// dead node listed first would cost a timeout).
pub fn endpoints_except(c: &YardCluster<&Topology>, skip: Option<usize>) -> String {
    (1..=c.len())
        .filter(|&i| Some(i) != skip)
        .map(|i| c.endpoint(i))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs the yard CLI from host `from` (a compute host: it reaches every node) and returns its
/// stdout, or an error with its stderr.
pub fn cli_ok(
    c: &YardCluster<&Topology>,
    from: usize,
    skip: Option<usize>,
    args: &[&str],
) -> Result<String> {
    let out = c.cli_to(from, &endpoints_except(c, skip), args)?;
    if !out.status.success() {
        bail!(
            "`yard {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The VIP's owner per `yard gateway vip list --json` (`None` while unplaced).
pub fn vip_owner(
    c: &YardCluster<&Topology>,
    from: usize,
    skip: Option<usize>,
    vip: Ipv4Addr,
) -> Result<Option<usize>> {
    let text = cli_ok(c, from, skip, &["gateway", "vip", "list", "--json"])?;
    let list: Value = serde_json::from_str(&text)
        .with_context(|| format!("`yard gateway vip list --json` printed {text:?}"))?;
    let entry = list
        .as_array()
        .and_then(|l| l.iter().find(|e| e["vip"] == vip.to_string()))
        .with_context(|| format!("`yard gateway vip list` does not list {vip}: {text}"))?;
    Ok(entry["owner"].as_u64().map(|o| o as usize))
}

/// Waits until the VIP has an owner (not `skip`), for up to `timeout`.
pub fn wait_vip_owner(
    c: &YardCluster<&Topology>,
    from: usize,
    skip: Option<usize>,
    vip: Ipv4Addr,
    timeout: Duration,
) -> Result<usize> {
    let start = Instant::now();
    loop {
        let last = match vip_owner(c, from, skip, vip) {
            Ok(Some(o)) if Some(o) != skip => return Ok(o),
            Ok(o) => format!("owner {o:?}"),
            Err(e) => format!("{e:#}"),
        };
        if start.elapsed() >= timeout {
            bail!("VIP {vip} got no owner within {timeout:?} ({last})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `yard gateway vip add`, then one `endpoint add` per tenant.
pub fn configure_yard_gateway(
    c: &YardCluster<&Topology>,
    from: usize,
    vip: Ipv4Addr,
    tenants: &[Tenant],
) -> Result<()> {
    cli_ok(c, from, None, &["gateway", "vip", "add", &vip.to_string()])?;
    for t in tenants {
        cli_ok(
            c,
            from,
            None,
            &t.endpoint_add_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
    }
    Ok(())
}

/// The forwarded-packets counter of node `i`'s XDP program (`yard gateway stats --json`
/// through node `i`).
pub fn yard_forwarded(c: &YardCluster<&Topology>, i: usize) -> Result<u64> {
    let out = c.cli(i, &["gateway", "stats", "--json"])?;
    if !out.status.success() {
        bail!(
            "`yard gateway stats` via node {i} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    v["counters"]["forwarded"]["packets"]
        .as_u64()
        .context("`yard gateway stats --json` has no counters.forwarded.packets")
}

/// Tenants A (`198.19.<vni/100>.<host a>`) and B on two compute hosts, one pair per VNI, each
/// VNI tunnelled to its own VIP.
pub fn tenant_pair(
    ov: &mut Overlay<'_>,
    hosts: (usize, usize),
    vni: u32,
    vip: Ipv4Addr,
) -> Result<(Tenant, Tenant)> {
    let mk = |ov: &mut Overlay<'_>, h: usize| {
        let ip = Ipv4Addr::new(198, 19, (vni / 100) as u8, h as u8);
        ov.add_tenant(h, vni, ip, tenant_mac(vni, h as u8), vip)
    };
    let a = mk(ov, hosts.0)?;
    let b = mk(ov, hosts.1)?;
    Ok((a, b))
}

/// One JSON log line of a node.
#[derive(Debug, Clone)]
pub struct LogEvent {
    pub host: usize,
    pub at: SystemTime,
    pub message: String,
    pub fields: Value,
}

/// The JSON log events of node `host` (`n<host>.log` in the run directory) whose message is
/// one of `messages`; other lines (human ones, the harness's headers) are skipped.
pub fn log_events(topo: &Topology, host: usize, messages: &[&str]) -> Vec<LogEvent> {
    let Ok(text) = std::fs::read_to_string(topo.dir().join(format!("n{host}.log"))) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.starts_with('{') && messages.iter().any(|m| l.contains(m)))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let message = v["fields"]["message"].as_str()?.to_owned();
            if !messages.contains(&message.as_str()) {
                return None;
            }
            let at = humantime::parse_rfc3339_weak(v["timestamp"].as_str()?).ok()?;
            Some(LogEvent {
                host,
                at,
                message,
                fields: v["fields"].clone(),
            })
        })
        .collect()
}

/// ms from `from` to `to` (negative if earlier).
pub fn ms_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// Aggregate CPU time from /proc/stat, in clock ticks.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTimes {
    total: u64,
    idle: u64,
    softirq: u64,
    steal: u64,
}

impl CpuTimes {
    pub fn now() -> Self {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
            return Self::default();
        };
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal (guest is inside user)
        Self {
            total: (0..8).map(get).sum(),
            idle: get(3) + get(4),
            softirq: get(6),
            steal: get(7),
        }
    }

    /// Busy CPU time of all CPUs since `earlier` (everything but idle and iowait, softirq and
    /// steal included), seconds (USER_HZ ticks of 10 ms).
    pub fn busy_s_since(&self, earlier: &Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        let idle = self.idle.saturating_sub(earlier.idle);
        total.saturating_sub(idle) as f64 / 100.0
    }

    /// Busy, softirq and steal shares (percent of all CPUs) since `earlier`.
    pub fn since(&self, earlier: &Self) -> CpuShare {
        let total = self.total.saturating_sub(earlier.total).max(1) as f64;
        let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 * 100.0 / total;
        CpuShare {
            busy_pct: 100.0 - pct(self.idle, earlier.idle),
            softirq_pct: pct(self.softirq, earlier.softirq),
            steal_pct: pct(self.steal, earlier.steal),
        }
    }
}

/// CPU use over an interval, percent of all CPUs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuShare {
    pub busy_pct: f64,
    pub softirq_pct: f64,
    pub steal_pct: f64,
}

impl CpuShare {
    pub fn to_json(self) -> Value {
        serde_json::json!({
            "busy_pct": round1(self.busy_pct),
            "softirq_pct": round1(self.softirq_pct),
            "steal_pct": round1(self.steal_pct),
        })
    }
}

/// One CPU's times from /proc/stat, in USER_HZ ticks (1/100 s as /proc/stat reports them).
///
/// On this kernel (no IRQ_TIME_ACCOUNTING, NO_HZ_IDLE) idle and iowait come from the nohz idle
/// clock and are exact to the reporting unit, while user, system, irq and softirq are sampled
/// at each scheduler tick: busy time is therefore taken as wall time minus idle, iowait and
/// steal, and the softirq figure is a tick sample (good to a few percent over seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTicks {
    pub user: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

/// Per-CPU /proc/stat and /proc/softirqs readings at one instant.
#[derive(Debug, Clone)]
pub struct PerCpuSnapshot {
    at: Instant,
    cpus: Vec<CpuTicks>,
    net_rx: Vec<u64>,
    call_ipis: Vec<u64>,
}

/// What one CPU did over an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuWork {
    pub cpu: usize,
    /// Wall time minus idle, iowait and steal, seconds (exact to 10 ms).
    pub busy_s: f64,
    /// Tick-sampled softirq plus hardirq time, seconds.
    pub softirq_s: f64,
    /// Tick-sampled user and system time, seconds.
    pub user_s: f64,
    pub system_s: f64,
    pub steal_s: f64,
    /// Busy minus tick-sampled user and system time: interrupt and softirq work, including the
    /// softirqs run from idle that the tick never samples (it is stopped while idle), seconds.
    pub kernel_s: f64,
    /// NET_RX softirq runs (from /proc/softirqs): where the receive processing happened.
    pub net_rx_softirqs: u64,
    /// Function-call IPIs received (/proc/interrupts CAL): RPS hands packets over with these.
    pub call_ipis: u64,
}

impl CpuWork {
    pub fn to_json(self, secs: f64) -> Value {
        serde_json::json!({
            "cpu": self.cpu,
            "busy_s": round3(self.busy_s),
            "busy_pct": round1(self.busy_s * 100.0 / secs.max(1e-9)),
            "softirq_s": round3(self.softirq_s),
            "user_s": round3(self.user_s),
            "system_s": round3(self.system_s),
            "steal_s": round3(self.steal_s),
            "irq_softirq_s": round3(self.kernel_s),
            "net_rx_softirqs": self.net_rx_softirqs,
            "call_ipis": self.call_ipis,
        })
    }
}

/// USER_HZ: /proc/stat's unit. 100 on every Linux architecture that matters here.
const USER_HZ: f64 = 100.0;

impl PerCpuSnapshot {
    pub fn now() -> Self {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let mut cpus = Vec::new();
        for line in text.lines() {
            // "cpuN ..." lines only, not the aggregate "cpu  ..." line.
            let Some(rest) = line
                .strip_prefix("cpu")
                .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let Some(Ok(idx)) = it.next().map(str::parse::<usize>) else {
                continue; // the aggregate "cpu " line
            };
            let v: Vec<u64> = it.filter_map(|x| x.parse().ok()).collect();
            let get = |i: usize| v.get(i).copied().unwrap_or(0);
            if cpus.len() <= idx {
                cpus.resize(idx + 1, CpuTicks::default());
            }
            cpus[idx] = CpuTicks {
                user: get(0) + get(1),
                system: get(2),
                idle: get(3),
                iowait: get(4),
                irq: get(5),
                softirq: get(6),
                steal: get(7),
            };
        }
        let softirqs = std::fs::read_to_string("/proc/softirqs").unwrap_or_default();
        let net_rx = softirqs
            .lines()
            .find(|l| l.trim_start().starts_with("NET_RX:"))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let interrupts = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
        let ncpu = cpus.len();
        let call_ipis = interrupts
            .lines()
            .find(|l| l.trim_start().starts_with("CAL:"))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(ncpu)
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            at: Instant::now(),
            cpus,
            net_rx,
            call_ipis,
        }
    }

    /// Each CPU's work since `earlier`.
    pub fn since(&self, earlier: &Self) -> Vec<CpuWork> {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        let s = |a: u64, b: u64| a.saturating_sub(b) as f64 / USER_HZ;
        self.cpus
            .iter()
            .zip(earlier.cpus.iter())
            .enumerate()
            .map(|(cpu, (n, e))| {
                let idle = s(n.idle, e.idle) + s(n.iowait, e.iowait);
                let steal = s(n.steal, e.steal);
                let busy = (wall - idle - steal).max(0.0);
                let tasks = s(n.user, e.user) + s(n.system, e.system);
                CpuWork {
                    cpu,
                    busy_s: busy,
                    kernel_s: (busy - tasks).max(0.0),
                    softirq_s: s(n.softirq, e.softirq) + s(n.irq, e.irq),
                    user_s: s(n.user, e.user),
                    system_s: s(n.system, e.system),
                    steal_s: steal,
                    net_rx_softirqs: self
                        .net_rx
                        .get(cpu)
                        .zip(earlier.net_rx.get(cpu))
                        .map_or(0, |(a, b)| a.saturating_sub(*b)),
                    call_ipis: self
                        .call_ipis
                        .get(cpu)
                        .zip(earlier.call_ipis.get(cpu))
                        .map_or(0, |(a, b)| a.saturating_sub(*b)),
                }
            })
            .collect()
    }
}

/// This process's user plus system CPU time so far (all its threads, finished ones too),
/// seconds; tick-sampled like /proc/stat.
pub fn self_cpu_s() -> f64 {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the ")" that closes the command name: state is field 3, utime 14, stime 15.
    let Some(rest) = text.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    (get(11) + get(12)) as f64 / USER_HZ
}

/// Pins the calling thread to one CPU with `taskset -p` (the bench crate has no libc binding;
/// `taskset` takes a thread id as well as a process id).
pub fn pin_this_thread(cpu: usize) -> Result<()> {
    let link = std::fs::read_link("/proc/thread-self").context("cannot read /proc/thread-self")?;
    let tid = link
        .file_name()
        .and_then(|t| t.to_str())
        .context("/proc/thread-self has no thread id")?
        .to_owned();
    let out = std::process::Command::new("taskset")
        .args(["-p", "-c", &cpu.to_string(), &tid])
        .stdout(std::process::Stdio::null())
        .output()
        .context("cannot run taskset")?;
    if !out.status.success() {
        bail!(
            "taskset -p -c {cpu} {tid} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// RPS settings made inside test namespaces, put back when dropped (the namespaces vanish with
/// the topology anyway).
#[derive(Debug, Default)]
pub struct RpsSteering {
    /// (namespace, device, previous mask, new mask)
    changed: Vec<(String, String, String, String)>,
}

fn rps_path(dev: &str) -> String {
    format!("/sys/class/net/{dev}/queues/rx-0/rps_cpus")
}

fn ns_sh(ns: &str, script: &str) -> Result<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", script])
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{script}` in {ns}"))?;
    if !out.status.success() {
        bail!(
            "`{script}` in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl RpsSteering {
    /// Steers receive processing of `dev` in namespace `ns` to the CPUs of `mask` (hex).
    /// `ip netns exec` mounts the namespace's own /sys, so the path names its device.
    pub fn set(&mut self, ns: &str, dev: &str, mask: &str) -> Result<()> {
        let path = rps_path(dev);
        let old = ns_sh(ns, &format!("cat {path}"))?;
        ns_sh(ns, &format!("echo {mask} > {path}"))?;
        let now = ns_sh(ns, &format!("cat {path}"))?;
        self.changed
            .push((ns.to_owned(), dev.to_owned(), old, now.clone()));
        Ok(())
    }

    pub fn to_json(&self) -> Value {
        Value::Array(
            self.changed
                .iter()
                .map(|(ns, dev, old, new)| {
                    serde_json::json!({"ns": ns, "dev": dev, "rps_cpus_before": old, "rps_cpus": new})
                })
                .collect(),
        )
    }

    /// Puts every mask back, newest first; best effort.
    pub fn restore(&mut self) {
        while let Some((ns, dev, old, _)) = self.changed.pop() {
            let old = if old.trim_matches(|c| c == '0' || c == ',').is_empty() {
                "0".to_owned()
            } else {
                old
            };
            let _ = ns_sh(&ns, &format!("echo {old} > {}", rps_path(&dev)));
        }
    }
}

impl Drop for RpsSteering {
    fn drop(&mut self) {
        self.restore();
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Nearest-rank quantile `q` in 0..=1; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(10.0));
        assert_eq!(quantile(&v, 0.95), Some(19.0));
        assert_eq!(quantile(&v, 1.0), Some(20.0));
        assert_eq!(quantile(&[3.0], 0.95), Some(3.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn time_differences_are_signed() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(ms_between(t, t + Duration::from_millis(5)), 5.0);
        assert_eq!(ms_between(t + Duration::from_millis(5), t), -5.0);
        let at = humantime::parse_rfc3339_weak("2025-01-01T00:00:00.250000Z").unwrap();
        let base = humantime::parse_rfc3339_weak("2025-01-01T00:00:00Z").unwrap();
        assert_eq!(ms_between(base, at), 250.0);
    }
}
