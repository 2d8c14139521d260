//! What the workloads need from a system under test, so yard and etcd are driven by the same
//! code: clients, the current leader, kill and restart of one member, and its catching up.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use yard_cluster_tests::Process;

/// One client connection of either system. Each concurrent client of a workload owns one, so
/// both systems see the same process shape: N connections from one tokio process.
#[derive(Clone)]
pub enum KvClient {
    /// yard's admin client: its own QUIC endpoint and connection, mutual TLS.
    Yard(yard::client::AdminClient),
    /// etcd's gRPC KV client: its own HTTP/2 connection.
    Etcd(etcd_client::KvClient),
}

impl KvClient {
    /// One acknowledged put, or the error as a sentence.
    pub async fn put(&mut self, key: String, value: &str) -> Result<(), String> {
        match self {
            KvClient::Yard(c) => c
                .admin(yard::rpc::AdminRequest::KvPut {
                    key,
                    value: value.to_owned(),
                })
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            KvClient::Etcd(c) => c
                .put(key, value, None)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }
}

/// A running 3-member cluster of one system on the test hosts.
pub trait Cluster {
    /// "yard" or "etcd".
    fn name(&self) -> &'static str;

    /// The hosts (1-based) that run a member.
    fn hosts(&self) -> Vec<usize>;

    /// The member process on `host`.
    fn process(&self, host: usize) -> &Process;

    /// A new client that talks to `host`'s member only, with this per-request timeout.
    async fn client(&self, host: usize, timeout: Duration) -> Result<KvClient>;

    /// The host whose member leads, if every member answers and names that same leader.
    async fn agreed_leader(&self) -> Result<Option<usize>>;

    /// The leader's commit index and `host`'s own, for catch-up checks; `None` for `host`'s
    /// while it does not answer or knows no leader.
    async fn indexes(&self, leader: usize, host: usize) -> Result<(u64, Option<u64>)>;

    /// The command a user runs to put `key` through `host`'s member: the system's own CLI at
    /// its default settings (a fresh process per attempt).
    fn cli_put(&self, host: usize, key: &str, value: &str) -> tokio::process::Command;

    /// Starts `host`'s member again, from its data, after it was killed, with a fresh status
    /// client (a QUIC client would otherwise wait out its timeout on the dead connection).
    async fn restart(&mut self, host: usize) -> Result<()>;

    /// Waits until every member answers and names the same leader; returns that leader's host.
    async fn wait_leader(&self, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            let last = match self.agreed_leader().await {
                Ok(Some(l)) => return Ok(l),
                Ok(None) => "the members do not agree on one leader yet".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{}: no leader that all members agree on after {:?} ({last})",
                    self.name(),
                    timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `host`'s member, restarted, has caught up with the leader's commit index as
    /// it stood when the wait began, and all members agree on a leader again.
    async fn wait_caught_up(&self, host: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut target = None;
        loop {
            self.check_running()?;
            let state = match self.agreed_leader().await {
                Ok(Some(leader)) => match self.indexes(leader, host).await {
                    Ok((leader_commit, mine)) => {
                        let want = *target.get_or_insert(leader_commit);
                        if mine.is_some_and(|m| m >= want) {
                            return Ok(());
                        }
                        format!("leader n{leader} at {want}, this member at {mine:?}")
                    }
                    Err(e) => format!("{e:#}"),
                },
                Ok(None) => "the members do not agree on one leader".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{}: member on host {host} did not catch up within {:?} ({state})",
                    self.name(),
                    timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails, with the end of its log, if a member has exited on its own.
    fn check_running(&self) -> Result<()> {
        for h in self.hosts() {
            self.process(h)
                .check_running()
                .with_context(|| format!("{} member on host {h}", self.name()))?;
        }
        Ok(())
    }
}
