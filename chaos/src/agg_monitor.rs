//! The aggregator side of a chaos run on real namespaces: one int32 job of a few workers on
//! worker hosts (never faulted, each with a yard node of its own that measures its bandwidth
//! to the aggregating hosts), summing round after round through the yard nodes' XDP
//! aggregators while the schedule runs, and a poller that follows the job's membership (its
//! aggregators, its tree and its epoch) through the cluster. With the default grouping the
//! leader regroups the job into a tree once the bandwidths are measured, and again whenever a
//! fault takes out one of its aggregators. What the workers saw is judged by
//! [`crate::aggregation::judge`].

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context};
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, AggJobRow, AggRequest};
use yard_agg::worker::{AggError, Membership, Tuning, Worker};
use yard_cluster_tests::yard::YardCluster;

use crate::aggregation::RoundDone;
use crate::gateway::{Ms, NodeId};
use crate::gateway_monitor::RunClock;

/// The job's name.
pub const JOB: &str = "chaos";
/// Values of the gradient: 56 chunks of 360 at an MTU of 1500, the last one short.
const VALUES: u32 = 20_003;
/// First UDP port of the workers (one each, on the worker host).
const FIRST_PORT: u16 = 42000;

/// The `[aggregator]` config of every node: XDP on `eth0`, generic mode (veth in namespaces);
/// bandwidth probes short and frequent, so a regrouping follows a run's faults.
///
/// The worker hosts' nodes join as agents (no replicas), and the voters stay the three hosts
/// the schedule faults (a voter grace of an hour): a seeded run in which the autopilot was free
/// to replace a paused voter with a worker host's replica ended with no leader (seed
/// 1796624961912958526), not yet understood.
pub fn aggregator_config() -> String {
    format!(
        "{}place_ms = 200\nprobe_bytes = 1048576\nprobe_every_ms = 5000\n[raft]\nreplicas = 0\nvoter_grace_ms = 3600000\n",
        yard_cluster_tests::yard::aggregator_config(16)
    )
}

/// Worker `rank`'s gradient in `round`: different per worker and round, overflowing when summed.
fn gradient(rank: usize, round: u32) -> Vec<i32> {
    (0..VALUES)
        .map(|i| {
            (u64::from(i) * 2_654_435_761 + rank as u64 * 97 + u64::from(round) * 1_000_003) as i32
        })
        .collect()
}

fn exact(workers: usize, round: u32) -> Vec<i32> {
    let mut sum = vec![0i32; VALUES as usize];
    for rank in 0..workers {
        for (s, g) in sum.iter_mut().zip(gradient(rank, round)) {
            *s = s.wrapping_add(g);
        }
    }
    sum
}

/// Where the job was summed, as the poller saw it change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub at_ms: Ms,
    pub epoch: u32,
    /// The root aggregator's node (the only one of a flat job).
    pub node: NodeId,
    /// The cluster aggregators' nodes of a tree (none: flat).
    pub clusters: Vec<NodeId>,
}

impl Placed {
    /// Every node summing the job.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::once(self.node).chain(self.clusters.iter().copied())
    }
}

/// A running aggregation workload.
pub struct AggRun {
    workers: usize,
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<RoundDone>>>,
    placed: Arc<Mutex<Vec<Placed>>>,
    threads: Vec<JoinHandle<Result<(), String>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An aggregation request: the job rows a read answers (none for a write).
async fn agg(client: &AdminClient, req: AggRequest) -> anyhow::Result<Vec<AggJobRow>> {
    match client.admin(AdminRequest::Agg(req)).await? {
        AdminReply::AggJobs(rows) => Ok(rows),
        AdminReply::Written { .. } => Ok(Vec::new()),
        other => bail!("unexpected aggregation reply {other:?}"),
    }
}

impl AggRun {
    /// Creates the job with `grouping`, joins a worker for each of `hosts` (rank `r` on
    /// `hosts[r]`; a host may take several) and starts them and the poller (on the first).
    pub fn start(
        cluster: &YardCluster,
        hosts: &[usize],
        grouping: yard::rpc::Grouping,
        clock: RunClock,
        poll: Duration,
    ) -> anyhow::Result<Self> {
        let workers = hosts.len();
        let endpoints: Vec<String> = (1..=cluster.len()).map(|i| cluster.endpoint(i)).collect();
        let tls = cluster.tls_dir().to_owned();
        let addrs: Vec<SocketAddrV4> = hosts
            .iter()
            .enumerate()
            .map(|(r, h)| SocketAddrV4::new(cluster.topology().addr(*h), FIRST_PORT + r as u16))
            .collect();
        let Some(&host) = hosts.first() else {
            bail!("an aggregation run needs at least one worker");
        };
        let setup = {
            let (endpoints, tls, addrs) = (endpoints.clone(), tls.clone(), addrs.clone());
            cluster
                .topology()
                .thread_in_host(host, move || -> anyhow::Result<()> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    rt.block_on(async move {
                        let client =
                            AdminClient::new(&endpoints, &tls, "yard", Duration::from_secs(5))?;
                        agg(
                            &client,
                            AggRequest::Create {
                                name: JOB.into(),
                                workers: addrs.len() as u16,
                                values: VALUES,
                                dtype: yard_agg::wire::Dtype::I32 as u8,
                                elastic: false,
                                mtu: 1500,
                                colocate: false,
                                grouping,
                            },
                        )
                        .await
                        .context("cannot create the aggregation job")?;
                        for (rank, addr) in addrs.iter().enumerate() {
                            agg(
                                &client,
                                AggRequest::Join {
                                    name: JOB.into(),
                                    rank: rank as u16,
                                    addr: *addr,
                                },
                            )
                            .await
                            .with_context(|| format!("cannot join rank {rank}"))?;
                        }
                        Ok(())
                    })
                })?
        };
        setup
            .join()
            .map_err(|_| anyhow::anyhow!("the aggregation setup panicked"))??;

        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Mutex::new(Vec::new()));
        let placed = Arc::new(Mutex::new(Vec::new()));
        let shared: Arc<Mutex<Vec<Option<Membership>>>> = Arc::new(Mutex::new(vec![None; workers]));
        let mut threads = Vec::new();
        {
            let (stop, placed, shared) = (stop.clone(), placed.clone(), shared.clone());
            threads.push(cluster.topology().thread_in_host(host, move || {
                poll_membership(endpoints, tls, poll, clock, stop, placed, shared)
            })?);
        }
        for (rank, addr) in addrs.into_iter().enumerate() {
            let (stop, done, shared) = (stop.clone(), done.clone(), shared.clone());
            threads.push(cluster.topology().thread_in_host(hosts[rank], move || {
                work(rank, workers, addr, clock, stop, done, shared)
            })?);
        }
        Ok(Self {
            workers,
            stop,
            done,
            placed,
            threads,
        })
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Where the job is summed, as last seen.
    pub fn placed(&self) -> Option<Placed> {
        lock(&self.placed).last().cloned()
    }

    /// Rounds completed so far by the slowest worker after `after_ms`.
    pub fn rounds_after(&self, after_ms: Ms) -> usize {
        let done = lock(&self.done);
        (0..self.workers)
            .map(|w| {
                done.iter()
                    .filter(|d| d.worker == w && d.at_ms > after_ms)
                    .count()
            })
            .min()
            .unwrap_or(0)
    }

    /// Stops the workers and the poller; returns what they recorded and any worker's error.
    pub fn stop(self) -> (Vec<RoundDone>, Vec<Placed>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self
            .threads
            .into_iter()
            .filter_map(|t| match t.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("an aggregation thread panicked".into()),
            })
            .collect();
        let done = std::mem::take(&mut *lock(&self.done));
        let placed = std::mem::take(&mut *lock(&self.placed));
        (done, placed, errors)
    }
}

/// Follows the job through the cluster: each rank's membership for its worker, and every change
/// of aggregator or epoch.
fn poll_membership(
    endpoints: Vec<String>,
    tls: std::path::PathBuf,
    poll: Duration,
    clock: RunClock,
    stop: Arc<AtomicBool>,
    placed: Arc<Mutex<Vec<Placed>>>,
    shared: Arc<Mutex<Vec<Option<Membership>>>>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the poller's runtime: {e}"))?;
    rt.block_on(async move {
        let client = AdminClient::new(&endpoints, &tls, "yard", Duration::from_secs(2))
            .map_err(|e| format!("cannot make the poller's client: {e}"))?;
        while !stop.load(Ordering::Relaxed) {
            // A failed read (no leader during a fault) is retried at the next poll.
            if let Ok(rows) = agg(&client, AggRequest::Show { name: JOB.into() }).await {
                if let Some(row) = rows.first() {
                    if let Some(f) = &row.job.failed {
                        return Err(format!("the aggregation job failed: {f}"));
                    }
                    let mut s = lock(&shared);
                    for (rank, m) in s.iter_mut().enumerate() {
                        if let Some(new) = row.membership(rank as u16) {
                            *m = Some(new);
                        }
                    }
                    if let Some(p) = row.job.placement {
                        let now = Placed {
                            at_ms: clock.now(),
                            epoch: row.job.epoch,
                            node: p.node,
                            clusters: row.job.clusters.iter().map(|c| c.placement.node).collect(),
                        };
                        let mut placed = lock(&placed);
                        if placed.last().is_none_or(|l| {
                            (l.epoch, l.node, &l.clusters) != (now.epoch, now.node, &now.clusters)
                        }) {
                            placed.push(now);
                        }
                    }
                }
            }
            tokio::time::sleep(poll).await;
        }
        Ok(())
    })
}

/// One worker: sums round after round until stopped, taking the newest membership whenever a
/// round times out, and records each completed round.
fn work(
    rank: usize,
    workers: usize,
    addr: SocketAddrV4,
    clock: RunClock,
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<RoundDone>>>,
    shared: Arc<Mutex<Vec<Option<Membership>>>>,
) -> Result<(), String> {
    let socket = UdpSocket::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    let first = loop {
        if let Some(m) = lock(&shared)[rank] {
            break m;
        }
        if stop.load(Ordering::Relaxed) {
            return Err(format!("rank {rank}: the job never ran"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let tuning = Tuning {
        give_up: Duration::from_millis(700),
        ..Tuning::default()
    };
    let mut w = Worker::new(socket, first, tuning);
    while !stop.load(Ordering::Relaxed) {
        let round = w.round();
        let mut g = gradient(rank, round);
        match w.all_reduce_i32(&mut g) {
            Ok(stats) => {
                let d = RoundDone {
                    worker: rank,
                    round,
                    epoch: w.membership().epoch,
                    exact: g == exact(workers, round),
                    conflicting: stats.conflicting,
                    at_ms: clock.now(),
                };
                lock(&done).push(d);
                // Paced, so the workload does not starve the daemons of the two cores.
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(AggError::Timeout { .. }) => {
                // The aggregator may have moved, or a fault is in force: take the newest
                // membership and sum the round again.
                if let Some(m) = lock(&shared)[rank] {
                    w.set_membership(m);
                }
            }
            Err(e) => return Err(format!("rank {rank} round {round}: {e}")),
        }
    }
    Ok(())
}
