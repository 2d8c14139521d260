//! A `yard` cluster on a [`Topology`]: the PKI, one config per host, bootstrap and peer joins,
//! and the CLI run inside a host — what the namespace tests, the chaos schedule and the
//! benchmarks all need, written once.

use std::borrow::Borrow;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::{Error, Process, Result, Topology};

/// The `yard` binary the tests run: `$YARD_BIN`, or the workspace's debug build.
///
/// # Panics
/// When it does not exist, naming how to build it.
pub fn test_yard_bin() -> PathBuf {
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

/// QUIC port every node listens on.
pub const PORT: u16 = 7480;
/// Metrics port every node listens on.
pub const METRICS_PORT: u16 = 9480;

/// Replaced by the host (= node) number in [`ClusterOptions::extra_config`].
pub const HOST_PLACEHOLDER: &str = "@HOST@";

/// The `[aggregator]` section of nodes that sum in XDP on `eth0` in generic mode (the veths of
/// test hosts), with `memory_mb` of slots; keys of the same section may follow it.
pub fn aggregator_config(memory_mb: u64) -> String {
    format!(
        "[aggregator]\nenabled = true\ninterface = \"eth0\"\nxdp_mode = \"generic\"\nmemory_mb = {memory_mb}\n"
    )
}

/// Extra `[raft]`/`[liveness]` settings for a test cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Lines appended to every node's TOML config (e.g. `"[raft]\nsnapshot_every = 50"`).
    /// Every [`HOST_PLACEHOLDER`] in it is replaced by the node's host number, for settings
    /// that differ per host (e.g. the gateway's pin directory on [`Topology::bpffs`]).
    pub extra_config: String,
    /// Hosts whose config takes these lines instead of `extra_config` (e.g. agents that run no
    /// aggregator), with the same placeholder.
    pub host_config: std::collections::BTreeMap<usize, String>,
    /// Lines for every node's `[tls]` table, which the cluster writes itself (e.g.
    /// `"cert_validity_s = 20"`).
    pub tls_config: String,
}

impl ClusterOptions {
    /// The extra lines of host `i`'s config.
    pub fn extra_for(&self, i: usize) -> &str {
        self.host_config.get(&i).unwrap_or(&self.extra_config)
    }
}

/// A cluster of `yard` processes, host i running node i.
///
/// It owns its [`Topology`] (`T = Topology`, made by [`YardCluster::start`]) or shares one
/// (`T = &Topology` or `Arc<Topology>`, see [`YardCluster::start_on`]) with whatever else runs
/// on those hosts. The topology, not the cluster, owns the processes: dropping the cluster
/// leaves them running until the topology goes.
pub struct YardCluster<T = Topology> {
    pub topo: T,
    bin: PathBuf,
    tls: PathBuf,
    /// [`ClusterOptions::tls_config`].
    tls_config: String,
    nodes: Vec<Option<Process>>,
}

fn cmd_err(what: String, out: &Output) -> Error {
    Error::Yard(format!(
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Yard(format!("cannot {context}: {e}"))
}

impl YardCluster {
    /// Makes the PKI and configs for `n` nodes on a fresh topology of `hosts ≥ n` hosts,
    /// bootstraps node 1 and joins the others one at a time, each waited for as a voter.
    pub fn start(bin: &Path, n: usize, hosts: usize, opts: &ClusterOptions) -> Result<Self> {
        Self::start_on(Topology::new(hosts.max(n))?, bin, n, opts)
    }
}

impl<T: Borrow<Topology>> YardCluster<T> {
    /// [`YardCluster::start`] on a topology the caller made (and may share with other
    /// clusters, or drivers on its remaining hosts): `n` nodes on hosts `1..=n`. The cluster's
    /// files go under the topology's run directory (`tls/`, `n<i>/`), its logs are `n<i>.log`.
    /// Fails early, with the end of its log, if a node exits while the cluster is forming.
    pub fn start_on(topo: T, bin: &Path, n: usize, opts: &ClusterOptions) -> Result<Self> {
        topo.borrow().check_host(n)?;
        let tls = topo.borrow().dir().join("tls");
        let mut cluster = Self {
            bin: bin.to_owned(),
            tls,
            tls_config: opts.tls_config.clone(),
            nodes: vec![None; n],
            topo,
        };
        cluster.local(&["ca", "init", "--dir", &cluster.tls_str()])?;
        for i in 1..=n {
            let ip = cluster.topology().addr(i).to_string();
            cluster.local(&[
                "ca",
                "issue",
                "--dir",
                &cluster.tls_str(),
                "--name",
                &format!("n{i}"),
                "--id",
                &i.to_string(),
                "--ip",
                &ip,
            ])?;
            let tls = cluster.tls.clone();
            cluster.write_config(i, &tls, opts.extra_for(i))?;
        }
        cluster.spawn(1, &["--bootstrap"])?;
        cluster.wait_voters_checking(1, 1, Duration::from_secs(20), Self::check_running)?;
        for i in 2..=n {
            let seed = cluster.endpoint(1);
            cluster.spawn(i, &["--join", &seed])?;
            cluster.wait_hosts_checking(i, i, Duration::from_secs(30), Self::check_running)?;
        }
        Ok(cluster)
    }

    /// The topology the cluster runs on, however it is held.
    pub fn topology(&self) -> &Topology {
        self.topo.borrow()
    }

    /// Fails with [`Error::Died`] if a node that should be running has exited (nodes ended by
    /// [`YardCluster::kill9`] are not counted until restarted).
    pub fn check_running(&self) -> Result<()> {
        self.nodes
            .iter()
            .flatten()
            .try_for_each(Process::check_running)
    }

    fn write_config(&self, i: usize, tls: &Path, extra: &str) -> Result<()> {
        let ip = self.topology().addr(i);
        let dir = self.node_dir(i);
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        let config = format!(
            "[node]\nid = {i}\nname = \"n{i}\"\nlisten = \"{ip}:{PORT}\"\ndata_dir = \"{}\"\n[tls]\ndir = \"{}\"\n{}\n[metrics]\nlisten = \"{ip}:{METRICS_PORT}\"\n{extra}\n",
            dir.join("data").display(),
            tls.display(),
            self.tls_config,
            extra = extra.replace(HOST_PLACEHOLDER, &i.to_string()),
        );
        let path = self.config_path(i);
        std::fs::write(&path, config).map_err(io(format!("write {}", path.display())))
    }

    /// Starts node `i` (a host beyond the current nodes) with no certificate at all: it must
    /// redeem `token` through node 1 and then join. Its TLS directory starts empty.
    pub fn join_with_token(&mut self, i: usize, token: &str) -> Result<Process> {
        let tls = self.node_dir(i).join("tls");
        self.write_config(i, &tls, "")?;
        if self.nodes.len() < i {
            self.nodes.resize(i, None);
        }
        let seed = self.endpoint(1);
        self.spawn(i, &["--join", &seed, "--token", token])
    }

    /// Rewrites node `i`'s config with `extra` in place of the cluster's extra lines; the
    /// node reads it at its next (re)start.
    pub fn reconfigure(&self, i: usize, extra: &str) -> Result<()> {
        self.write_config(i, &self.tls, extra)
    }

    fn tls_str(&self) -> String {
        self.tls.display().to_string()
    }

    /// The directory holding ca.crt and admin.crt/admin.key.
    pub fn tls_dir(&self) -> &Path {
        &self.tls
    }

    fn node_dir(&self, i: usize) -> PathBuf {
        self.topology().dir().join(format!("n{i}"))
    }

    /// Node `i`'s probe socket, where ranks on its host report: `<data_dir>/probe.sock`, the
    /// node's default (unless `extra_config` sets `[probe] socket`).
    pub fn probe_socket(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("data").join("probe.sock")
    }

    /// Node `i`'s aggregation agent socket, where workers on its host join their jobs.
    pub fn agg_socket(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("data").join("agg.sock")
    }

    fn config_path(&self, i: usize) -> PathBuf {
        self.node_dir(i).join("yard.toml")
    }

    /// Node `i`'s QUIC address.
    pub fn endpoint(&self, i: usize) -> String {
        format!("{}:{PORT}", self.topology().addr(i))
    }

    /// Every node's address, comma-separated (the CLI tries them in order).
    pub fn all_endpoints(&self) -> String {
        (1..=self.nodes.len())
            .map(|i| self.endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn local(&self, args: &[&str]) -> Result<()> {
        let out = std::process::Command::new(&self.bin)
            .args(args)
            .output()
            .map_err(io(format!("run {}", self.bin.display())))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(cmd_err(format!("yard {}", args.join(" ")), &out))
        }
    }

    /// Starts node `i` (its config plus `extra` flags) and records its process.
    pub fn spawn(&mut self, i: usize, extra: &[&str]) -> Result<Process> {
        let bin = self.bin.clone();
        self.spawn_with(i, &bin, extra)
    }

    /// [`YardCluster::spawn`] with another `yard` binary (another release).
    fn spawn_with(&mut self, i: usize, bin: &Path, extra: &[&str]) -> Result<Process> {
        let config = self.config_path(i).display().to_string();
        let mut args = vec!["node", "start", "--config", &config];
        args.extend_from_slice(extra);
        let p = self
            .topology()
            .spawn(i, bin, &args, &[], &format!("n{i}.log"))?;
        if self.nodes.len() < i {
            self.nodes.resize(i, None);
        }
        self.nodes[i - 1] = Some(p.clone());
        Ok(p)
    }

    /// Restarts node `i` from its store (no bootstrap, no join).
    pub fn restart(&mut self, i: usize) -> Result<Process> {
        self.spawn(i, &[])
    }

    /// Restarts node `i` from its store on binary `bin`: an upgrade or a downgrade in place.
    pub fn restart_with(&mut self, i: usize, bin: &Path) -> Result<Process> {
        self.spawn_with(i, bin, &[])
    }

    /// Node `i`'s process, if started.
    pub fn process(&self, i: usize) -> Option<&Process> {
        self.nodes.get(i - 1).and_then(Option::as_ref)
    }

    /// `kill -9` of node `i`, waiting until it is gone.
    pub fn kill9(&mut self, i: usize) -> Result<()> {
        if let Some(p) = self.nodes[i - 1].take() {
            p.kill9()?;
            let _ = p.wait_exit(Duration::from_secs(5));
        }
        Ok(())
    }

    /// Runs the CLI inside host `from` against `endpoints` with the admin credentials.
    pub fn cli_to(&self, from: usize, endpoints: &str, args: &[&str]) -> Result<Output> {
        let mut full = vec!["--endpoint", endpoints, "--tls-dir"];
        let tls = self.tls_str();
        full.push(&tls);
        full.extend_from_slice(args);
        self.topology()
            .exec_with(from, &self.bin, &full, &[], Duration::from_secs(20))
    }

    /// Runs the CLI inside host `i` against node `i`.
    pub fn cli(&self, i: usize, args: &[&str]) -> Result<Output> {
        self.cli_to(i, &self.endpoint(i), args)
    }

    /// `yard status --json` as answered through node `i`.
    pub fn status(&self, i: usize) -> Result<serde_json::Value> {
        let out = self.cli(i, &["status", "--json", "--timeout-ms", "2000"])?;
        if !out.status.success() {
            return Err(cmd_err(format!("yard status via node {i}"), &out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            Error::Yard(format!(
                "yard status via node {i} printed unparseable output: {e}"
            ))
        })
    }

    /// The leader as node `i` reports it.
    pub fn leader(&self, i: usize) -> Option<usize> {
        self.status(i)
            .ok()?
            .get("leader")?
            .as_u64()
            .map(|l| l as usize)
    }

    /// The leader as node `i` reports it, waiting out an election in progress (up to 10 s).
    pub fn wait_leader(&self, i: usize) -> Result<usize> {
        let start = Instant::now();
        loop {
            if let Some(l) = self.leader(i) {
                return Ok(l);
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(Error::Yard(format!("node {i} knew no leader for 10 s")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until node `i` reports `n` voters, all reachable, and a leader.
    pub fn wait_voters(&self, i: usize, n: usize, timeout: Duration) -> Result<serde_json::Value> {
        self.wait_voters_checking(i, n, timeout, |_| Ok(()))
    }

    /// Waits until node `i` (a voter, replica or agent) answers a status with a leader and `n`
    /// hosts of any role, all reachable: past `raft.voters` voters and `raft.replicas`
    /// replicas, hosts join as agents.
    pub fn wait_hosts(&self, i: usize, n: usize, timeout: Duration) -> Result<serde_json::Value> {
        self.wait_hosts_checking(i, n, timeout, |_| Ok(()))
    }

    fn wait_hosts_checking(
        &self,
        i: usize,
        n: usize,
        timeout: Duration,
        check: impl Fn(&Self) -> Result<()>,
    ) -> Result<serde_json::Value> {
        self.wait_status(
            i,
            timeout,
            check,
            &format!("{n} reachable hosts"),
            |members| {
                let up = members.iter().filter(|m| m["reachable"] == true).count();
                up == n && members.len() == n
            },
        )
    }

    /// Polls `yard status` through node `i` until it names a leader and `ok` holds of its
    /// members, giving up as soon as `check` fails or after `timeout` (the error says it
    /// waited for `what`).
    fn wait_status(
        &self,
        i: usize,
        timeout: Duration,
        check: impl Fn(&Self) -> Result<()>,
        what: &str,
        ok: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Result<serde_json::Value> {
        let start = Instant::now();
        loop {
            check(self)?;
            if let Ok(s) = self.status(i) {
                let members = s["members"].as_array().cloned().unwrap_or_default();
                if ok(&members) && s["leader"].is_u64() {
                    return Ok(s);
                }
            }
            if start.elapsed() > timeout {
                return Err(Error::Yard(format!(
                    "node {i} did not see {what} and a leader within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// [`YardCluster::wait_voters`], giving up as soon as `check` fails.
    fn wait_voters_checking(
        &self,
        i: usize,
        n: usize,
        timeout: Duration,
        check: impl Fn(&Self) -> Result<()>,
    ) -> Result<serde_json::Value> {
        self.wait_status(
            i,
            timeout,
            check,
            &format!("{n} reachable voters"),
            |members| {
                let voters = members
                    .iter()
                    .filter(|m| m["role"] == "voter" && m["reachable"] == true)
                    .count();
                voters == n
            },
        )
    }

    /// Scrapes node `i`'s metrics from inside its host.
    pub fn metrics(&self, i: usize) -> Result<String> {
        let url = format!("http://{}:{METRICS_PORT}/metrics", self.topology().addr(i));
        let out = self
            .topology()
            .exec(i, "curl", &["-sf", "--max-time", "3", &url])?;
        if !out.status.success() {
            return Err(cmd_err(format!("curl {url}"), &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One gauge or counter from node `i`'s metrics.
    pub fn metric(&self, i: usize, name: &str) -> Result<f64> {
        let body = self.metrics(i)?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .ok_or_else(|| Error::Yard(format!("node {i} exports no metric {name}")))
    }
}
