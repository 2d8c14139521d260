//! A 3-node yard cluster on test hosts: CA, certificates, bootstrap, joins, status.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, Status};
use yard_cluster_tests::{Process, Topology};

use crate::cluster::{tail, Cluster, KvClient};

/// yard's QUIC port.
pub const PORT: u16 = 7480;
const METRICS_PORT: u16 = 9480;
/// The cluster name in yard's node certificates (the config default).
const CLUSTER: &str = "yard";
/// Short, so polling a member that is still starting retries soon (a QUIC handshake whose first
/// packet found no listener would otherwise be retried only after about a second).
const STATUS_TIMEOUT: Duration = Duration::from_millis(300);

pub struct YardCluster<'t> {
    topo: &'t Topology,
    bin: PathBuf,
    tls: PathBuf,
    hosts: Vec<usize>,
    /// Index `host - 1`.
    nodes: Vec<Option<Process>>,
    /// One status client per host, index `host - 1`.
    status: Vec<Option<AdminClient>>,
}

impl<'t> YardCluster<'t> {
    /// Makes the CA and certificates, bootstraps the first host, joins the others one at a
    /// time, and waits until all are voters.
    pub async fn start(
        topo: &'t Topology,
        bin: &Path,
        hosts: &[usize],
        timeout: Duration,
    ) -> Result<Self> {
        let tls = topo.dir().join("yard-tls");
        run(bin, &["ca", "init", "--dir"], &[tls.as_os_str()])?;
        let max = hosts.iter().copied().max().unwrap_or(0);
        let mut cluster = Self {
            topo,
            bin: bin.to_owned(),
            tls,
            hosts: hosts.to_vec(),
            nodes: vec![None; max],
            status: (0..max).map(|_| None).collect(),
        };
        for &h in hosts {
            let addr = topo.addr(h).to_string();
            let (name, id) = (format!("n{h}"), h.to_string());
            run(
                bin,
                &[
                    "ca", "issue", "--name", &name, "--id", &id, "--ip", &addr, "--dir",
                ],
                &[cluster.tls.as_os_str()],
            )?;
            cluster.write_config(h)?;
            cluster.status[h - 1] = Some(
                AdminClient::new(&[endpoint(topo, h)], &cluster.tls, CLUSTER, STATUS_TIMEOUT)
                    .context("cannot make a yard status client")?,
            );
        }
        let first = hosts[0];
        cluster.spawn(first, &["--bootstrap"])?;
        cluster.wait_voters(first, 1, timeout).await?;
        // One join at a time: each is a membership change, and the leader runs one at a time.
        for (k, &h) in hosts.iter().enumerate().skip(1) {
            let seed = endpoint(topo, first);
            cluster.spawn(h, &["--join", &seed])?;
            cluster.wait_voters(first, k + 1, timeout).await?;
        }
        Ok(cluster)
    }

    fn data_dir(&self, host: usize) -> PathBuf {
        self.topo.dir().join(format!("yard-n{host}"))
    }

    fn config_path(&self, host: usize) -> PathBuf {
        self.data_dir(host).join("yard.toml")
    }

    /// The node's configuration: only the keys a multi-host node needs; Raft and liveness
    /// timings stay at yard's defaults.
    fn write_config(&self, host: usize) -> Result<()> {
        let dir = self.data_dir(host);
        std::fs::create_dir_all(dir.join("data"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let addr = self.topo.addr(host);
        let text = format!(
            "# Written by yard-bench (kv-vs-etcd) for node {host}.\n\
             [node]\nid = {host}\nname = \"n{host}\"\nlisten = \"{addr}:{PORT}\"\ndata_dir = \"{}\"\n\n\
             [tls]\ndir = \"{}\"\n\n[metrics]\nlisten = \"{addr}:{METRICS_PORT}\"\n",
            dir.join("data").display(),
            self.tls.display()
        );
        let path = self.config_path(host);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    fn spawn(&mut self, host: usize, extra: &[&str]) -> Result<()> {
        let config = self.config_path(host);
        let mut args = vec![
            "node".to_owned(),
            "start".to_owned(),
            "--config".to_owned(),
            config.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let p = self
            .topo
            .spawn(host, &self.bin, &args, &[], &format!("yard-n{host}.log"))
            .with_context(|| format!("cannot start yard on host {host}"))?;
        self.nodes[host - 1] = Some(p);
        Ok(())
    }

    async fn status_of(&self, host: usize) -> Result<Status> {
        let client = self.status[host - 1]
            .as_ref()
            .with_context(|| format!("host {host} runs no yard node"))?;
        match client.admin(AdminRequest::Status).await {
            Ok(AdminReply::Status(s)) => Ok(s),
            Ok(other) => bail!("n{host} answered status with {other:?}"),
            Err(e) => bail!("n{host} status: {e}"),
        }
    }

    async fn wait_voters(&self, via: usize, want: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            // Only the nodes started so far.
            for (i, p) in self.nodes.iter().enumerate() {
                if let Some(p) = p {
                    if !p.is_running() {
                        bail!(
                            "yard n{} exited while waiting for {want} voters; last lines of {}:\n{}",
                            i + 1,
                            p.log_path().display(),
                            tail(&p.log(), 20)
                        );
                    }
                }
            }
            let last = match self.status_of(via).await {
                Ok(s) => {
                    let voters = s.members.iter().filter(|m| m.role == "voter").count();
                    if voters >= want && s.leader.is_some() {
                        return Ok(());
                    }
                    format!("{voters} voters, leader {:?}", s.leader)
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!("yard: not {want} voters after {timeout:?} ({last})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The raft timings this run's nodes use (yard's defaults), for the report.
    pub fn timings() -> serde_json::Value {
        let raft = yard::config::Config::default().raft;
        serde_json::json!({
            "heartbeat_ms": raft.heartbeat_ms,
            "election_timeout_min_ms": raft.election_timeout_min_ms,
            "election_timeout_max_ms": raft.election_timeout_max_ms,
            "source": "yard's defaults (no [raft] section in the node configs)",
        })
    }
}

impl Cluster for YardCluster<'_> {
    fn name(&self) -> &'static str {
        "yard"
    }

    fn hosts(&self) -> Vec<usize> {
        self.hosts.clone()
    }

    fn process(&self, host: usize) -> &Process {
        self.nodes[host - 1]
            .as_ref()
            .expect("every host of the cluster runs a node")
    }

    async fn client(&self, host: usize, timeout: Duration) -> Result<KvClient> {
        let c = AdminClient::new(&[endpoint(self.topo, host)], &self.tls, CLUSTER, timeout)
            .context("cannot make a yard client")?;
        Ok(KvClient::Yard(c))
    }

    async fn agreed_leader(&self) -> Result<Option<usize>> {
        let mut leader = None;
        for &h in &self.hosts {
            let s = self.status_of(h).await?;
            match (s.leader, leader) {
                (None, _) => return Ok(None),
                (Some(l), Some(prev)) if l != prev => return Ok(None),
                (Some(l), _) => leader = Some(l),
            }
        }
        let leader = leader.and_then(|l| usize::try_from(l).ok());
        Ok(leader.filter(|l| self.hosts.contains(l)))
    }

    async fn indexes(&self, leader: usize, host: usize) -> Result<(u64, Option<u64>)> {
        let l = self.status_of(leader).await?.commit_index;
        let mine = match self.status_of(host).await {
            Ok(s) if s.leader.is_some() => Some(s.commit_index),
            _ => None,
        };
        Ok((l, mine))
    }

    async fn restart(&mut self, host: usize) -> Result<()> {
        self.status[host - 1] = Some(
            AdminClient::new(
                &[endpoint(self.topo, host)],
                &self.tls,
                CLUSTER,
                STATUS_TIMEOUT,
            )
            .context("cannot make a yard status client")?,
        );
        // Neither --bootstrap nor --join: the node resumes from its store.
        self.spawn(host, &[])
    }
}

/// `198.18.0.<host>:7480`.
pub fn endpoint(topo: &Topology, host: usize) -> String {
    format!("{}:{PORT}", topo.addr(host))
}

/// Runs the yard CLI (no network involved) and fails with its stderr.
fn run(bin: &Path, args: &[&str], tail_args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(bin)
        .args(args)
        .args(tail_args)
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "`yard {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
