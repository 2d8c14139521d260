//! Driving an aggregation job's workers from a test: joining ranks through the CLI, reading
//! their memberships from `yard agg job show`, and a thread per rank that sums rounds and
//! follows the job through regroupings, as a training loop would.

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use yard_agg::wire::{Dtype, Geometry};
use yard_agg::worker::{AggError, Membership, Tuning, Worker};

use crate::yard::YardCluster;

/// Where a rank's thread finds its newest membership: the test's loop fills it from
/// [`show_job`] and [`membership`].
pub type Slot = Arc<Mutex<Option<Membership>>>;

/// `yard agg job show NAME --json` through node `from` (any node answering), if it answers.
pub fn show_job(cluster: &YardCluster, from: usize, name: &str) -> Option<Value> {
    let out = cluster
        .cli_to(
            from,
            &cluster.all_endpoints(),
            &["agg", "job", "show", name, "--json"],
        )
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

/// Rank `rank`'s membership from a job's row once the job runs: its own aggregator (in a tree,
/// its cluster's) and its index there.
pub fn membership(job: &Value, rank: usize, dtype: Dtype) -> Option<Membership> {
    if job["running"] != true {
        return None;
    }
    let members = job["members"].as_array()?;
    let me = members.iter().find(|m| m["rank"] == rank)?;
    let aggregator = me["aggregator"]
        .as_str()
        .or_else(|| job["aggregator"].as_str())?;
    Some(Membership {
        job: u32::try_from(job["id"].as_u64()?).ok()?,
        epoch: u32::try_from(job["epoch"].as_u64()?).ok()?,
        worker: u16::try_from(me["worker"].as_u64()?).ok()?,
        workers: u16::try_from(members.len()).ok()?,
        aggregator: aggregator.parse().ok()?,
        geometry: Geometry {
            values: u32::try_from(job["values"].as_u64()?).ok()?,
            chunk_values: u16::try_from(job["chunk_values"].as_u64()?).ok()?,
        },
        dtype,
        token: u32::try_from(me["token"].as_u64()?).ok()?,
        result_token: u32::try_from(me["result_token"].as_u64()?).ok()?,
    })
}

/// `yard agg job join NAME --rank RANK --addr ADDR`, run on `host`; its JSON answer, or why
/// it was refused.
pub fn join_job(
    cluster: &YardCluster,
    host: usize,
    name: &str,
    rank: usize,
    addr: SocketAddrV4,
) -> Result<Value, String> {
    let out = cluster
        .cli_to(
            host,
            &cluster.all_endpoints(),
            &[
                "agg",
                "job",
                "join",
                name,
                "--rank",
                &rank.to_string(),
                "--addr",
                &addr.to_string(),
                "--json",
            ],
        )
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "rank {rank} of {name} from host {host}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("yard agg job join: not JSON ({e})"))
}

/// One rank's part in a test's training loop.
pub struct RankRun {
    /// The test host the rank runs on, and the address it sums from (as it joined).
    pub host: usize,
    pub rank: usize,
    pub addr: SocketAddrV4,
    /// Rounds `first..rounds`; a worker joining a running job starts at the job's round.
    pub first: u32,
    pub rounds: u32,
    /// The rank leaves before this round (`u32::MAX`: never), as a worker moving elsewhere.
    pub stop: Arc<AtomicU32>,
    /// Memberships older than this epoch are not used (a re-joined worker's old row).
    pub min_epoch: u32,
    /// How long one round may keep failing (the job regrouping) before the rank gives up.
    pub retry_for: Duration,
}

impl RankRun {
    /// Rank `rank` on `host` from `addr`, for rounds `0..rounds`, never leaving.
    pub fn new(host: usize, rank: usize, addr: SocketAddrV4, rounds: u32) -> Self {
        Self {
            host,
            rank,
            addr,
            first: 0,
            rounds,
            stop: Arc::new(AtomicU32::new(u32::MAX)),
            min_epoch: 0,
            retry_for: Duration::from_secs(60),
        }
    }
}

/// Runs `run` in its host's namespace: waits for a membership in `slot`, then sums each round
/// with `sum` (which gets the worker and the round). A timeout means the job was regrouped:
/// the round is summed again, whole, under the newest membership. Each finished round is
/// reported in `progress[rank]`; the thread returns every round's result by round.
pub fn run_rank<T, F>(
    cluster: &YardCluster,
    run: RankRun,
    slot: Slot,
    progress: Arc<Mutex<Vec<u32>>>,
    mut sum: F,
) -> JoinHandle<Result<Vec<(u32, T)>, String>>
where
    T: Send + 'static,
    F: FnMut(&mut Worker, u32) -> Result<T, AggError> + Send + 'static,
{
    let RankRun {
        host,
        rank,
        addr,
        first,
        rounds,
        stop,
        min_epoch,
        retry_for,
    } = run;
    cluster
        .topology()
        .thread_in_host(host, move || {
            let socket = UdpSocket::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
            let newest = || (*slot.lock().unwrap()).filter(|m| m.epoch >= min_epoch);
            let began = Instant::now();
            let membership = loop {
                if let Some(m) = newest() {
                    break m;
                }
                if began.elapsed() > Duration::from_secs(60) {
                    return Err(format!(
                        "rank {rank}: the job never ran at epoch {min_epoch}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            // A short give-up, so a moved aggregator is noticed fast.
            let tuning = Tuning {
                give_up: Duration::from_millis(700),
                ..Tuning::default()
            };
            let mut w = Worker::new(socket, membership, tuning);
            w.set_round(first);
            let mut out = Vec::new();
            for round in first..rounds {
                if round >= stop.load(Ordering::SeqCst) {
                    break;
                }
                let started = Instant::now();
                let result = loop {
                    match sum(&mut w, round) {
                        Ok(r) => break r,
                        Err(AggError::Timeout { .. }) if started.elapsed() < retry_for => {
                            if let Some(m) = newest() {
                                w.set_membership(m);
                            }
                        }
                        Err(e) => return Err(format!("rank {rank} round {round}: {e}")),
                    }
                };
                out.push((round, result));
                progress.lock().unwrap()[rank] = round + 1;
            }
            Ok(out)
        })
        .expect("a thread in a test host")
}

/// Worker `rank`'s int32 gradient of `values` values in round `round`: deterministic,
/// different per worker and round, with values that overflow int32 when summed (the sum wraps,
/// as int32 adds do).
pub fn gradient_i32(rank: usize, round: u32, values: u32) -> Vec<i32> {
    (0..values)
        .map(|i| {
            (i as i64 * 2_654_435_761 + rank as i64 * 97 + i64::from(round) * 1_000_003) as u32
                as i32
        })
        .collect()
}

/// The exact (wrapping) sum of round `round`'s [`gradient_i32`] over `workers` workers.
pub fn exact_i32(workers: usize, round: u32, values: u32) -> Vec<i32> {
    let mut sum = vec![0i32; values as usize];
    for rank in 0..workers {
        for (s, g) in sum.iter_mut().zip(gradient_i32(rank, round, values)) {
            *s = s.wrapping_add(g);
        }
    }
    sum
}

/// A [`run_rank`] round for rank `rank` of `workers`: sums its [`gradient_i32`] and says
/// whether the result was the exact sum.
pub fn sum_exact_i32(
    rank: usize,
    workers: usize,
    values: u32,
) -> impl FnMut(&mut Worker, u32) -> Result<bool, AggError> {
    move |w, round| {
        let mut g = gradient_i32(rank, round, values);
        w.all_reduce_i32(&mut g)?;
        Ok(g == exact_i32(workers, round, values))
    }
}

/// `yard agg job create NAME --workers N --size 4*VALUES --dtype i32 [--grouping G] --json`
/// through node `from`; its JSON answer, or why it was refused.
pub fn create_i32_job(
    cluster: &YardCluster,
    from: usize,
    name: &str,
    workers: usize,
    values: u32,
    grouping: Option<&str>,
) -> Result<Value, String> {
    let (workers, size) = (workers.to_string(), (u64::from(values) * 4).to_string());
    let mut args = vec![
        "agg",
        "job",
        "create",
        name,
        "--workers",
        &workers,
        "--size",
        &size,
        "--dtype",
        "i32",
        "--json",
    ];
    if let Some(g) = grouping {
        args.extend(["--grouping", g]);
    }
    let out = cluster.cli(from, &args).map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "creating {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("yard agg job create: not JSON ({e})"))
}

/// A rank thread of [`ExactRanks`]: each round it summed, and whether the sum was exact.
pub type ExactRank = JoinHandle<Result<Vec<(u32, bool)>, String>>;

/// The ranks of a test's int32 job and what they share with the test's loop: each rank's
/// membership slot, the rounds each has finished, and the round every rank stops before.
pub struct ExactRanks {
    pub name: String,
    pub workers: usize,
    pub values: u32,
    /// Rounds `0..rounds` at most.
    pub rounds: u32,
    pub slots: Vec<Slot>,
    pub progress: Arc<Mutex<Vec<u32>>>,
    pub stop: Arc<AtomicU32>,
}

impl ExactRanks {
    /// `workers` ranks of job `name` of `values` values, for at most `rounds` rounds, none
    /// started.
    pub fn new(name: &str, workers: usize, values: u32, rounds: u32) -> Self {
        Self {
            name: name.to_owned(),
            workers,
            values,
            rounds,
            slots: (0..workers).map(|_| Arc::new(Mutex::new(None))).collect(),
            progress: Arc::new(Mutex::new(vec![0; workers])),
            stop: Arc::new(AtomicU32::new(u32::MAX)),
        }
    }

    /// Joins rank `rank` from `host` (port 40000 + rank) and starts it summing its rounds
    /// ([`sum_exact_i32`]) until [`ExactRanks::stop`].
    pub fn start(&self, cluster: &YardCluster, host: usize, rank: usize) -> ExactRank {
        let port = 40000 + u16::try_from(rank).expect("a rank under 25536");
        let addr = SocketAddrV4::new(cluster.topology().addr(host), port);
        join_job(cluster, host, &self.name, rank, addr).unwrap();
        let mut run = RankRun::new(host, rank, addr, self.rounds);
        run.stop = self.stop.clone();
        run_rank(
            cluster,
            run,
            self.slots[rank].clone(),
            self.progress.clone(),
            sum_exact_i32(rank, self.workers, self.values),
        )
    }

    /// Gives every rank its membership from `job` (a `yard agg job show` row), if it runs.
    pub fn follow(&self, job: &Value) {
        for (rank, s) in self.slots.iter().enumerate() {
            if let Some(m) = membership(job, rank, Dtype::I32) {
                *s.lock().unwrap() = Some(m);
            }
        }
    }

    /// The rounds each rank has finished.
    pub fn finished(&self) -> Vec<u32> {
        self.progress.lock().unwrap().clone()
    }

    /// Stops every rank before the round after the fastest one's, joins them, and checks that
    /// each summed every round from 0 to there once, exactly; returns that round count.
    pub fn finish(&self, threads: Vec<ExactRank>) -> Result<u32, String> {
        let fastest = self.finished().into_iter().max().unwrap_or(0);
        self.stop.fetch_min(fastest + 1, Ordering::SeqCst);
        let end = self.stop.load(Ordering::SeqCst).min(self.rounds);
        for (rank, t) in threads.into_iter().enumerate() {
            let r = t.join().map_err(|_| format!("rank {rank} panicked"))??;
            let rounds: Vec<u32> = r.iter().map(|(round, _)| *round).collect();
            if rounds != (0..end).collect::<Vec<_>>() {
                return Err(format!(
                    "rank {rank} summed rounds {rounds:?}, not 0..{end}"
                ));
            }
            if let Some((round, _)) = r.iter().find(|(_, ok)| !ok) {
                return Err(format!("rank {rank} round {round}: not the exact sum"));
            }
        }
        Ok(end)
    }
}

/// A grouped-aggregation test cluster's options: every node aggregates in XDP (32 MiB), Raft
/// and liveness relaxed for many nodes on two cores ([`crate::torch::AGG_TORCH_TIMING`]), and
/// bandwidth probes of 1 MiB repeated every `probe_every_ms` (`None`: the default period).
pub fn grouped_options(probe_every_ms: Option<u64>) -> crate::yard::ClusterOptions {
    let every = probe_every_ms.map_or(String::new(), |ms| format!("probe_every_ms = {ms}\n"));
    crate::yard::ClusterOptions {
        extra_config: format!(
            "{}probe_bytes = 1048576\n{every}{}",
            crate::yard::aggregator_config(32),
            crate::torch::AGG_TORCH_TIMING
        ),
        ..Default::default()
    }
}
