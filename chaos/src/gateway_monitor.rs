//! The gateway side of a chaos run on real namespaces: the `[gateway]` config, the VIP pool,
//! compute hosts with tenants and probe streams, and the pollers that watch every node's data
//! plane and the VIP table while the schedule runs. What they record is judged by the pure
//! checkers in [`crate::gateway`].

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, GatewayRequest, GatewayStats};
use yard_cluster_tests::overlay::{tenant_mac, Overlay, Tenant};
use yard_cluster_tests::yard::YardCluster;
use yard_cluster_tests::Topology;

use crate::gateway::{AnsweringLog, Ms, NodeId, VipRow, VipSample};
use crate::schedule::FaultKind;

/// The run clock: milliseconds since `origin` (an [`Instant`], i.e. CLOCK_MONOTONIC), and the
/// conversion from the hosts' CLOCK_MONOTONIC milliseconds, which is the same clock in every
/// namespace.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    origin: Instant,
    origin_mono_ms: f64,
}

impl RunClock {
    /// A clock whose 0 is now.
    pub fn start() -> Self {
        let origin = Instant::now();
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        Self {
            origin,
            origin_mono_ms: ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6,
        }
    }

    /// Its origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// `t` on the run clock.
    pub fn at(&self, t: Instant) -> Ms {
        if t >= self.origin {
            (t - self.origin).as_millis() as Ms
        } else {
            -((self.origin - t).as_millis() as Ms)
        }
    }

    /// Now on the run clock.
    pub fn now(&self) -> Ms {
        self.at(Instant::now())
    }

    /// A host's CLOCK_MONOTONIC milliseconds on the run clock.
    pub fn from_host_ms(&self, ms: u64) -> Ms {
        (ms as f64 - self.origin_mono_ms).floor() as Ms
    }
}

/// The first VIP of the chaos pool, `198.19.255.1`.
pub fn pool(count: u8) -> Vec<Ipv4Addr> {
    (1..=count)
        .map(|n| Ipv4Addr::new(198, 19, 255, n))
        .collect()
}

/// Sleeps until the next poll, `period` after the last one, recording in `lateness` how far
/// behind the schedule a poller fell (it then restarts from now rather than bursting).
async fn pace(next: &mut tokio::time::Instant, period: Duration, lateness: &AtomicU64) {
    *next += period;
    let now = tokio::time::Instant::now();
    if *next < now {
        lateness.fetch_max((now - *next).as_millis() as u64, Ordering::Relaxed);
        *next = now;
    }
    tokio::time::sleep_until(*next).await;
}

/// The `[gateway]` section for nodes `1..=nodes` (XDP generic mode on eth0, pins on each host's
/// private bpffs, mounted here before any node starts), for [`ClusterOptions::extra_config`].
///
/// [`ClusterOptions::extra_config`]: yard_cluster_tests::yard::ClusterOptions
pub fn gateway_config(
    topo: &Topology,
    nodes: usize,
    holddown_max_ms: u64,
) -> anyhow::Result<String> {
    for i in 1..=nodes {
        topo.bpffs(i)
            .with_context(|| format!("cannot mount a bpffs for host {i}"))?;
    }
    Ok(format!(
        "[gateway]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\npin_dir = \"{}/bpffs-{}/gateway\"\nholddown_max_ms = {holddown_max_ms}\n",
        topo.dir().display(),
        yard_cluster_tests::yard::HOST_PLACEHOLDER
    ))
}

/// `yard <args> --json` run inside host `host` against its own node.
pub fn cli_json(c: &YardCluster, host: usize, args: &[&str]) -> anyhow::Result<Value> {
    let mut full = args.to_vec();
    full.push("--json");
    let out = c.cli(host, &full)?;
    if !out.status.success() {
        bail!(
            "yard {} via node {host} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("yard {} printed unparseable output", args.join(" ")))
}

/// The rows of `yard gateway vip list --json`.
pub fn parse_vip_list(v: &Value) -> anyhow::Result<Vec<VipRow>> {
    let rows = v.as_array().context("vip list is not an array")?;
    rows.iter()
        .map(|r| {
            Ok(VipRow {
                vip: r["vip"]
                    .as_str()
                    .context("vip list row without a vip")?
                    .parse()?,
                owner: r["owner"].as_u64(),
                handoff_to: r["handoff_to"].as_u64(),
            })
        })
        .collect()
}

/// Polls `vip list` through node `host` until `ok` holds, for up to `timeout`; returns the rows.
pub fn wait_vips(
    c: &YardCluster,
    host: usize,
    timeout: Duration,
    ok: impl Fn(&[VipRow]) -> bool,
) -> anyhow::Result<Vec<VipRow>> {
    let start = Instant::now();
    let mut last = Err(anyhow::anyhow!("no answer"));
    while start.elapsed() < timeout {
        last = cli_json(c, host, &["gateway", "vip", "list"]).and_then(|v| parse_vip_list(&v));
        if let Ok(rows) = &last {
            if ok(rows) {
                return last;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    match last {
        Ok(rows) => bail!("vip placement did not settle within {timeout:?}: {rows:?}"),
        Err(e) => Err(e.context(format!("vip list did not answer within {timeout:?}"))),
    }
}

/// A probe stream's two tenants and the VIP their tunnels use.
#[derive(Debug, Clone)]
pub struct ProbePair {
    pub name: String,
    pub from: Tenant,
    pub to: Tenant,
    pub vip: Ipv4Addr,
    pub port: u16,
}

/// Tenants on compute hosts `a` and `b`: one pair in VNI 100 tunnelling to `vips[0]` (A on `a`
/// sending to B on `b`), one in VNI 200 tunnelling to `vips[1]` (sending from `b` to `a`), each
/// registered as an endpoint through node 1 and reachable both ways.
pub fn add_tenants(
    c: &YardCluster,
    a: usize,
    b: usize,
    vips: [Ipv4Addr; 2],
) -> anyhow::Result<Vec<ProbePair>> {
    let mut ov = Overlay::new(&c.topo);
    let ip = |n: u8| Ipv4Addr::new(198, 19, 1, n);
    let a100 = ov.add_tenant(a, 100, ip(1), tenant_mac(100, 1), vips[0])?;
    let b100 = ov.add_tenant(b, 100, ip(2), tenant_mac(100, 2), vips[0])?;
    let a200 = ov.add_tenant(b, 200, ip(1), tenant_mac(200, 1), vips[1])?;
    let b200 = ov.add_tenant(a, 200, ip(2), tenant_mac(200, 2), vips[1])?;
    for t in [&a100, &b100, &a200, &b200] {
        cli_json(
            c,
            1,
            &t.endpoint_add_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
    }
    for (x, y) in [(&a100, &b100), (&a200, &b200)] {
        x.wait_reachable(y.ip(), Duration::from_secs(10))
            .with_context(|| {
                format!(
                    "tenant {} in vni {} cannot reach {}",
                    x.ip(),
                    x.vni(),
                    y.ip()
                )
            })?;
        y.wait_reachable(x.ip(), Duration::from_secs(10))
            .with_context(|| {
                format!(
                    "tenant {} in vni {} cannot reach {}",
                    y.ip(),
                    y.vni(),
                    x.ip()
                )
            })?;
    }
    Ok(vec![
        ProbePair {
            name: format!("vni100 via {}", vips[0]),
            from: a100,
            to: b100,
            vip: vips[0],
            port: 9000,
        },
        ProbePair {
            name: format!("vni200 via {}", vips[1]),
            from: a200,
            to: b200,
            vip: vips[1],
            port: 9001,
        },
    ])
}

/// Which nodes are faulted right now and how (index `node - 1`); the pollers consult it.
#[derive(Debug, Clone)]
pub struct Health(Arc<Mutex<Vec<Option<FaultKind>>>>);

impl Health {
    pub fn new(nodes: usize) -> Self {
        Self(Arc::new(Mutex::new(vec![None; nodes])))
    }

    /// Marks `nodes` (1-based) as faulted by `kind`, or healthy with `None`.
    pub fn set(&self, nodes: &[usize], kind: Option<FaultKind>) {
        let mut h = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for &n in nodes {
            if let Some(slot) = h.get_mut(n - 1) {
                *slot = kind;
            }
        }
    }

    fn get(&self) -> Vec<Option<FaultKind>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Whether a node's own daemon can answer a poll: not killed and not paused.
fn daemon_alive(kind: Option<FaultKind>) -> bool {
    !matches!(
        kind,
        Some(FaultKind::Kill9 | FaultKind::Pause | FaultKind::Stall | FaultKind::Kill9Stall)
    )
}

/// The latest data-plane stats of each node: when they were received and what they said.
type Latest = Arc<Mutex<Vec<Option<(Ms, GatewayStats)>>>>;

/// What the pollers saw.
#[derive(Debug, Default)]
pub struct Observed {
    pub answering: AnsweringLog,
    pub samples: Vec<VipSample>,
    /// Per node: stats polls answered and failed.
    pub stats_ok: Vec<u64>,
    pub stats_failed: Vec<u64>,
    pub list_failed: u64,
    /// The most any poller fell behind its schedule, ms (a stall of the test machine).
    pub max_poll_lateness_ms: u64,
    /// When the last stats poll was answered.
    pub last_stats: Ms,
}

/// The pollers: one thread in each node's host asking its own node for `gateway stats` (which
/// is answered locally, never forwarded) while the daemon is alive, and one in the client host
/// asking a healthy node for the VIP table, each every `period`.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    answering: Arc<Mutex<AnsweringLog>>,
    samples: Arc<Mutex<Vec<VipSample>>>,
    latest: Latest,
    stats_ok: Arc<Vec<AtomicU64>>,
    stats_failed: Arc<Vec<AtomicU64>>,
    list_failed: Arc<AtomicU64>,
    /// The most any poller fell behind its schedule, ms: a stall of the harness itself.
    max_lateness_ms: Arc<AtomicU64>,
    threads: Vec<JoinHandle<anyhow::Result<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Monitor {
    /// Starts the pollers; they stop on [`Monitor::finish`] or after `max_duration` at the latest.
    pub fn start(
        c: &YardCluster,
        nodes: usize,
        client_host: usize,
        health: Health,
        clock: RunClock,
        period: Duration,
        max_duration: Duration,
    ) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let answering = Arc::new(Mutex::new(AnsweringLog::new()));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let latest: Latest = Arc::new(Mutex::new(vec![None; nodes]));
        let stats_ok = Arc::new((0..nodes).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
        let stats_failed = Arc::new((0..nodes).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
        let list_failed = Arc::new(AtomicU64::new(0));
        let max_lateness_ms = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + max_duration;
        let tls = c.tls_dir().to_owned();
        let endpoints: Vec<String> = (1..=nodes).map(|i| c.endpoint(i)).collect();
        let mut threads = Vec::new();

        for node in 1..=nodes {
            let (stop, answering, latest, health) = (
                Arc::clone(&stop),
                Arc::clone(&answering),
                Arc::clone(&latest),
                health.clone(),
            );
            let (ok, failed) = (Arc::clone(&stats_ok), Arc::clone(&stats_failed));
            let lateness = Arc::clone(&max_lateness_ms);
            let (tls, endpoint) = (tls.clone(), endpoints[node - 1].clone());
            threads.push(c.topo.thread_in_host(node, move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let client = AdminClient::new(&[endpoint], &tls, "yard", period * 4)?;
                    let mut next = tokio::time::Instant::now();
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        if daemon_alive(health.get()[node - 1]) {
                            let req = AdminRequest::Gateway(GatewayRequest::Stats);
                            let reply = tokio::time::timeout(period * 4, client.admin(req)).await;
                            let received = clock.now();
                            match reply {
                                Ok(Ok(AdminReply::GatewayStats(s))) if s.enabled => {
                                    let now = clock.from_host_ms(s.now_ms);
                                    let mut log = lock(&answering);
                                    for (vip, since) in &s.owned_since {
                                        log.observe(
                                            node as NodeId,
                                            *vip,
                                            clock.from_host_ms(*since),
                                            now,
                                        );
                                    }
                                    drop(log);
                                    lock(&latest)[node - 1] = Some((received, s));
                                    ok[node - 1].fetch_add(1, Ordering::Relaxed);
                                }
                                _ => {
                                    failed[node - 1].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        pace(&mut next, period, &lateness).await;
                    }
                    Ok(())
                })
            })?);
        }

        {
            let (stop, samples, failed) = (
                Arc::clone(&stop),
                Arc::clone(&samples),
                Arc::clone(&list_failed),
            );
            let lateness = Arc::clone(&max_lateness_ms);
            threads.push(c.topo.thread_in_host(client_host, move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let clients = endpoints
                        .iter()
                        .map(|e| {
                            AdminClient::new(std::slice::from_ref(e), &tls, "yard", period * 8)
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut prefer = 0usize;
                    let mut next = tokio::time::Instant::now();
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let h = health.get();
                        // The first healthy node from the preferred one on: a faulted node may
                        // be cut off from the client host or hold a stale view.
                        let target = (0..nodes)
                            .map(|k| (prefer + k) % nodes)
                            .find(|&i| h[i].is_none());
                        if let Some(i) = target {
                            let sent = clock.now();
                            let req = AdminRequest::Gateway(GatewayRequest::ListVips);
                            let reply =
                                tokio::time::timeout(period * 8, clients[i].admin(req)).await;
                            let received = clock.now();
                            match reply {
                                Ok(Ok(AdminReply::Vips(rows))) => {
                                    let rows = rows
                                        .into_iter()
                                        .map(|r| VipRow {
                                            vip: r.vip,
                                            owner: r.owner,
                                            handoff_to: r.handoff_to,
                                        })
                                        .collect();
                                    lock(&samples).push(VipSample {
                                        sent,
                                        received,
                                        rows,
                                    });
                                    prefer = i;
                                }
                                _ => {
                                    failed.fetch_add(1, Ordering::Relaxed);
                                    prefer = i + 1;
                                }
                            }
                        }
                        pace(&mut next, period, &lateness).await;
                    }
                    Ok(())
                })
            })?);
        }
        Ok(Self {
            stop,
            answering,
            samples,
            latest,
            stats_ok,
            stats_failed,
            list_failed,
            max_lateness_ms,
            threads,
        })
    }

    /// The latest VIP table sample, if any.
    pub fn latest_sample(&self) -> Option<VipSample> {
        lock(&self.samples).last().cloned()
    }

    /// The latest stats of every node received after `after`: (node, VIPs it answers for), or
    /// `None` if some node has none that recent.
    pub fn answering_after(&self, after: Ms) -> Option<Vec<(NodeId, Vec<Ipv4Addr>)>> {
        lock(&self.latest)
            .iter()
            .enumerate()
            .map(|(k, l)| match l {
                Some((at, s)) if *at > after => Some((
                    k as NodeId + 1,
                    s.owned_since.iter().map(|(v, _)| *v).collect(),
                )),
                _ => None,
            })
            .collect()
    }

    /// Each node's latest stats in one line (for explaining a failed check): when they were
    /// received, the data-plane clock they carry, the lease and every VIP's mode.
    pub fn describe_latest(&self, clock: &RunClock) -> Vec<String> {
        lock(&self.latest)
            .iter()
            .enumerate()
            .map(|(k, l)| match l {
                None => format!("node {}: no stats received", k + 1),
                Some((at, s)) => {
                    let vips: Vec<String> = s
                        .vips
                        .iter()
                        .map(|(v, mode)| {
                            let since = s.owned_since.iter().find(|o| o.0 == *v).map(|o| o.1);
                            match since {
                                Some(t) => format!("{v} {mode} answering since t={:.3}s", clock.from_host_ms(t) as f64 / 1e3),
                                None => format!("{v} {mode} not answering"),
                            }
                        })
                        .collect();
                    format!(
                        "node {}: stats received t={:.3}s carry now t={:.3}s, fenced {}, lease {} ms left, vips [{}]",
                        k + 1,
                        *at as f64 / 1e3,
                        clock.from_host_ms(s.now_ms) as f64 / 1e3,
                        s.fenced,
                        s.lease_remaining_ms,
                        vips.join("; ")
                    )
                }
            })
            .collect()
    }

    /// Each node's forwarded-packet counter in its latest stats (refreshed every few ticks).
    pub fn forwarded(&self) -> Vec<Option<u64>> {
        lock(&self.latest)
            .iter()
            .map(|l| {
                l.as_ref()
                    .and_then(|(_, s)| s.counters.iter().find(|c| c.0 == "forwarded").map(|c| c.1))
            })
            .collect()
    }

    /// Stops the pollers and returns what they saw.
    pub fn finish(self) -> anyhow::Result<Observed> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a gateway poller panicked"))?
                .context("a gateway poller failed")?;
        }
        let last_stats = lock(&self.latest)
            .iter()
            .flatten()
            .map(|(at, _)| *at)
            .max()
            .unwrap_or(0);
        let answering = std::mem::take(&mut *lock(&self.answering));
        let samples = std::mem::take(&mut *lock(&self.samples));
        Ok(Observed {
            answering,
            samples,
            stats_ok: self
                .stats_ok
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect(),
            stats_failed: self
                .stats_failed
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect(),
            list_failed: self.list_failed.load(Ordering::Relaxed),
            max_poll_lateness_ms: self.max_lateness_ms.load(Ordering::Relaxed),
            last_stats,
        })
    }
}

/// Host `host`'s neighbour entries for the VIPs, each with the yard node whose MAC it holds:
/// where that compute host actually sends tunnel traffic.
pub fn vip_neighbours(c: &YardCluster, host: usize, nodes: usize) -> Vec<String> {
    let out = match c
        .topo
        .exec(host, "ip", &["-4", "neigh", "show", "dev", "eth0"])
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return vec![format!("host {host}: ip neigh failed: {e}")],
    };
    out.lines()
        .filter(|l| l.starts_with("198.19."))
        .map(|l| {
            let node = (1..=nodes).find(|i| l.contains(&c.topo.mac(*i)));
            format!(
                "host {host}: {l}{}",
                node.map_or(String::new(), |n| format!(" (node {n})"))
            )
        })
        .collect()
}
