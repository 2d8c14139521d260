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
/// starts an `n`-node yard cluster with the gateway on every node.
pub fn start_yard<'t>(
    topo: &'t Topology,
    bin: &Path,
    n: usize,
    xdp_mode: &str,
    t: YardTimings,
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
        extra_config: yard_gateway_config(topo, xdp_mode, t),
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
