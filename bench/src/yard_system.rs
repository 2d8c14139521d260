//! yard as a system under test: the harness's [`YardCluster`] (PKI, configs, bootstrap and
//! joins, processes) with the benchmark's own status clients, which poll the nodes from the
//! driver's runtime the way the etcd side polls its members.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, Status};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::{Process, Topology};

use crate::cluster::{Cluster, KvClient};

/// The cluster name in yard's node certificates (the config default).
const CLUSTER: &str = "yard";
/// Short, so polling a member that is still starting retries soon (a QUIC handshake whose first
/// packet found no listener would otherwise be retried only after about a second).
const STATUS_TIMEOUT: Duration = Duration::from_millis(300);

pub struct YardSystem {
    cluster: YardCluster<Arc<Topology>>,
    /// The yard binary, which is also the CLI.
    bin: std::path::PathBuf,
    /// One status client per node, index `host - 1`.
    status: Vec<AdminClient>,
}

impl YardSystem {
    /// Starts `nodes` yard nodes on hosts `1..=nodes` of `topo` with yard's default settings
    /// (the harness bootstraps node 1, joins the others one at a time and waits until all are
    /// voters).
    pub async fn start(topo: &Arc<Topology>, bin: &Path, nodes: usize) -> Result<Self> {
        let (topo, bin, cli) = (topo.clone(), bin.to_owned(), bin.to_owned());
        // The harness blocks while the cluster forms; off the runtime's threads, so a SIGINT
        // is seen at once. (The driver drops its runtime only after this task has finished,
        // and with it its hold on the topology.)
        let cluster = tokio::task::spawn_blocking(move || {
            YardCluster::start_on(topo, &bin, nodes, &ClusterOptions::default())
        })
        .await
        .context("the yard start-up task panicked")?
        .context("cannot start the yard cluster")?;
        let status = (1..=nodes)
            .map(|h| admin_client(&cluster, h, STATUS_TIMEOUT))
            .collect::<Result<_>>()?;
        Ok(Self {
            cluster,
            bin: cli,
            status,
        })
    }

    async fn status_of(&self, host: usize) -> Result<Status> {
        let client = self
            .status
            .get(host - 1)
            .with_context(|| format!("host {host} runs no yard node"))?;
        match client.admin(AdminRequest::Status).await {
            Ok(AdminReply::Status(s)) => Ok(s),
            Ok(other) => bail!("n{host} answered status with {other:?}"),
            Err(e) => bail!("n{host} status: {e}"),
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

/// An admin client (the admin credentials) of node `host` only.
fn admin_client(
    cluster: &YardCluster<Arc<Topology>>,
    host: usize,
    timeout: Duration,
) -> Result<AdminClient> {
    AdminClient::new(
        &[cluster.endpoint(host)],
        cluster.tls_dir(),
        CLUSTER,
        timeout,
    )
    .with_context(|| format!("cannot make a yard client for n{host}"))
}

impl Cluster for YardSystem {
    fn name(&self) -> &'static str {
        "yard"
    }

    fn hosts(&self) -> Vec<usize> {
        (1..=self.cluster.len()).collect()
    }

    fn process(&self, host: usize) -> &Process {
        self.cluster
            .process(host)
            .expect("every host of the cluster runs a node")
    }

    async fn client(&self, host: usize, timeout: Duration) -> Result<KvClient> {
        admin_client(&self.cluster, host, timeout).map(KvClient::Yard)
    }

    async fn agreed_leader(&self) -> Result<Option<usize>> {
        let mut leader = None;
        for h in self.hosts() {
            let s = self.status_of(h).await?;
            match (s.leader, leader) {
                (None, _) => return Ok(None),
                (Some(l), Some(prev)) if l != prev => return Ok(None),
                (Some(l), _) => leader = Some(l),
            }
        }
        let leader = leader.and_then(|l| usize::try_from(l).ok());
        Ok(leader.filter(|l| self.hosts().contains(l)))
    }

    async fn indexes(&self, leader: usize, host: usize) -> Result<(u64, Option<u64>)> {
        let l = self.status_of(leader).await?.commit_index;
        let mine = match self.status_of(host).await {
            Ok(s) if s.leader.is_some() => Some(s.commit_index),
            _ => None,
        };
        Ok((l, mine))
    }

    fn cli_put(&self, host: usize, key: &str, value: &str) -> tokio::process::Command {
        // The CLI at its defaults (5 s timeout), one endpoint: the survivor the user asks.
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(["kv", "put", key, value])
            .arg("--endpoint")
            .arg(self.cluster.endpoint(host))
            .arg("--tls-dir")
            .arg(self.cluster.tls_dir());
        cmd
    }

    async fn restart(&mut self, host: usize) -> Result<()> {
        self.status[host - 1] = admin_client(&self.cluster, host, STATUS_TIMEOUT)?;
        // Neither --bootstrap nor --join: the node resumes from its store.
        self.cluster
            .restart(host)
            .with_context(|| format!("cannot restart yard on host {host}"))?;
        Ok(())
    }
}
