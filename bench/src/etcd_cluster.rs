//! A 3-member etcd cluster (Debian's etcd-server) on the same test hosts, driven through its v3
//! gRPC API.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, ConnectOptions, MaintenanceClient};
use yard_cluster_tests::{Process, Topology};

use crate::cluster::{Cluster, KvClient};

/// How one etcd cluster of the benchmark is set up: its name in the report, its ports (two
/// clusters run side by side on the same hosts) and its Raft timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdProfile {
    pub name: &'static str,
    pub client_port: u16,
    pub peer_port: u16,
    /// `(--heartbeat-interval, --election-timeout)` in ms; `None`: etcd's defaults (100, 1000).
    pub timing: Option<(u64, u64)>,
}

impl EtcdProfile {
    /// etcd as installed: default timings.
    pub const DEFAULTS: EtcdProfile = EtcdProfile {
        name: "etcd",
        client_port: 2379,
        peer_port: 2380,
        timing: None,
    };

    /// etcd with timings matched to yard's defaults (heartbeat 20 ms, elections after 50-80
    /// ms of silence): etcd refuses an election timeout under 5 heartbeats, so the election
    /// timeout is yard's longest, 80 ms, with a 16 ms heartbeat.
    pub const MATCHED: EtcdProfile = EtcdProfile {
        name: "etcd-matched",
        client_port: 2479,
        peer_port: 2480,
        timing: Some((16, 80)),
    };

    /// How the report describes the timings.
    pub fn timing_text(&self) -> String {
        match self.timing {
            None => {
                "etcd's defaults: --heartbeat-interval 100 ms, --election-timeout 1000 ms".into()
            }
            Some((hb, el)) => format!(
                "matched to yard's: --heartbeat-interval {hb} ms, --election-timeout {el} ms"
            ),
        }
    }
}
/// The same as yard's status timeout, so both are polled alike while a member is starting.
const STATUS_TIMEOUT: Duration = Duration::from_millis(300);

pub struct EtcdCluster<'t> {
    topo: &'t Topology,
    profile: EtcdProfile,
    bin: PathBuf,
    /// etcdctl, beside etcd (Debian's etcd-client package installs both in /usr/bin).
    etcdctl: PathBuf,
    hosts: Vec<usize>,
    /// Index `host - 1`.
    members: Vec<Option<Process>>,
    /// One status client per host, index `host - 1`.
    status: Vec<Option<MaintenanceClient>>,
    /// etcd's member id → host, learned from each member's own status.
    ids: Vec<(u64, usize)>,
}

impl<'t> EtcdCluster<'t> {
    /// Starts every member with one `--initial-cluster` and waits until all answer and agree
    /// on a leader.
    pub async fn start(
        topo: &'t Topology,
        bin: &Path,
        hosts: &[usize],
        profile: EtcdProfile,
        timeout: Duration,
    ) -> Result<Self> {
        let max = hosts.iter().copied().max().unwrap_or(0);
        let mut cluster = Self {
            topo,
            profile,
            bin: bin.to_owned(),
            etcdctl: bin.with_file_name("etcdctl"),
            hosts: hosts.to_vec(),
            members: vec![None; max],
            status: (0..max).map(|_| None).collect(),
            ids: Vec::new(),
        };
        for &h in hosts {
            cluster.spawn(h)?;
        }
        for &h in hosts {
            let c = connect(&client_url(topo, h, &profile), STATUS_TIMEOUT).await?;
            cluster.status[h - 1] = Some(c.maintenance_client());
        }
        // Each member's own id, which status answers name the leader by.
        let deadline = Instant::now() + timeout;
        for &h in hosts {
            loop {
                cluster.check_running()?;
                match cluster.status_of(h).await {
                    Ok((_, id, _)) => {
                        cluster.ids.push((id, h));
                        break;
                    }
                    Err(e) if Instant::now() >= deadline => {
                        bail!("etcd member on host {h} gives no status after {timeout:?}: {e:#}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        cluster
            .wait_leader(deadline.saturating_duration_since(Instant::now()))
            .await?;
        Ok(cluster)
    }

    /// The flags every member gets; timings as the profile says.
    pub fn args(
        topo: &Topology,
        hosts: &[usize],
        host: usize,
        data_dir: &Path,
        profile: &EtcdProfile,
    ) -> Vec<String> {
        let peer_port = profile.peer_port;
        let initial: Vec<String> = hosts
            .iter()
            .map(|&h| format!("e{h}=http://{}:{peer_port}", topo.addr(h)))
            .collect();
        let client = client_url(topo, host, profile);
        let peer = format!("http://{}:{peer_port}", topo.addr(host));
        let timing = profile
            .timing
            .map(|(hb, el)| {
                vec![
                    "--heartbeat-interval".to_owned(),
                    hb.to_string(),
                    "--election-timeout".to_owned(),
                    el.to_string(),
                ]
            })
            .unwrap_or_default();
        let token = format!("yard-bench-{}", profile.name);
        [
            "--name",
            &format!("e{host}"),
            "--data-dir",
            &data_dir.display().to_string(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &initial.join(","),
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            &token,
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(timing)
        .collect()
    }

    fn data_dir(&self, host: usize) -> PathBuf {
        self.topo
            .dir()
            .join(format!("{}-e{host}", self.profile.name))
    }

    /// The data directory of `host`'s member under `profile` (for the report's flags).
    pub fn data_dir_of(topo: &Topology, profile: &EtcdProfile, host: usize) -> PathBuf {
        topo.dir().join(format!("{}-e{host}", profile.name))
    }

    /// Starts (or, with its data dir in place, restarts: etcd then ignores the initial-cluster
    /// flags) the member on `host`.
    fn spawn(&mut self, host: usize) -> Result<()> {
        let args = Self::args(
            self.topo,
            &self.hosts,
            host,
            &self.data_dir(host),
            &self.profile,
        );
        let log = format!("{}-e{host}.log", self.profile.name);
        let p = self
            .topo
            .spawn(host, &self.bin, &args, &[], &log)
            .with_context(|| format!("cannot start etcd on host {host}"))?;
        self.members[host - 1] = Some(p);
        Ok(())
    }

    fn status_client(&self, host: usize) -> Result<MaintenanceClient> {
        self.status[host - 1]
            .clone()
            .with_context(|| format!("host {host} runs no etcd member"))
    }

    fn host_of(&self, id: u64) -> Option<usize> {
        self.ids.iter().find(|(i, _)| *i == id).map(|(_, h)| *h)
    }

    /// (leader id, member's own id, raft index) from `host`'s member.
    async fn status_of(&self, host: usize) -> Result<(u64, u64, u64)> {
        let s = self
            .status_client(host)?
            .status()
            .await
            .with_context(|| format!("etcd e{host} status"))?;
        let me = s.header().map(|h| h.member_id()).unwrap_or_default();
        Ok((s.leader(), me, s.raft_index()))
    }

    /// The version `etcd --version` names on its first line (`etcd Version: 3.4.23`).
    pub fn version(bin: &Path) -> String {
        std::process::Command::new(bin)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(|l| l.trim_start_matches("etcd Version:").trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

impl Cluster for EtcdCluster<'_> {
    fn name(&self) -> &'static str {
        self.profile.name
    }

    fn hosts(&self) -> Vec<usize> {
        self.hosts.clone()
    }

    fn process(&self, host: usize) -> &Process {
        self.members[host - 1]
            .as_ref()
            .expect("every host of the cluster runs a member")
    }

    async fn client(&self, host: usize, timeout: Duration) -> Result<KvClient> {
        let c = connect(&client_url(self.topo, host, &self.profile), timeout).await?;
        Ok(KvClient::Etcd(c.kv_client()))
    }

    async fn agreed_leader(&self) -> Result<Option<usize>> {
        let mut leader = None;
        for &h in &self.hosts {
            let (l, _, _) = self.status_of(h).await?;
            if l == 0 || leader.is_some_and(|prev| prev != l) {
                return Ok(None);
            }
            leader = Some(l);
        }
        Ok(leader.and_then(|l| self.host_of(l)))
    }

    async fn indexes(&self, leader: usize, host: usize) -> Result<(u64, Option<u64>)> {
        let (_, _, l) = self.status_of(leader).await?;
        let mine = match self.status_of(host).await {
            Ok((lead, _, idx)) if lead != 0 => Some(idx),
            _ => None,
        };
        Ok((l, mine))
    }

    async fn restart(&mut self, host: usize) -> Result<()> {
        let c = connect(&client_url(self.topo, host, &self.profile), STATUS_TIMEOUT).await?;
        self.status[host - 1] = Some(c.maintenance_client());
        self.spawn(host)
    }

    fn cli_put(&self, host: usize, key: &str, value: &str) -> tokio::process::Command {
        // etcdctl at its defaults (API v3, 5 s command timeout, 2 s dial timeout), as a user
        // runs it: one process per attempt.
        let mut cmd = tokio::process::Command::new(&self.etcdctl);
        cmd.env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(client_url(self.topo, host, &self.profile))
            .args(["put", key, value]);
        cmd
    }
}

pub fn client_url(topo: &Topology, host: usize, profile: &EtcdProfile) -> String {
    format!("http://{}:{}", topo.addr(host), profile.client_port)
}

/// A client of one member only (the balanced channel holds just this endpoint), with a
/// per-request and a connect timeout; connects lazily.
async fn connect(url: &str, timeout: Duration) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout);
    Client::connect([url], Some(opts))
        .await
        .with_context(|| format!("cannot make an etcd client for {url}"))
}
