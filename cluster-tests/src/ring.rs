//! Ring all-reduce jobs on a yard cluster: one `ring-rank` process per host reporting to that
//! host's node, their progress read from their logs, and what `yard diagnose` says about them.
//!
//! The processes belong to the [`Topology`], so a test that panics still has them killed; a
//! job that ends normally is stopped with [`RingJob::stop`], which also checks that every rank
//! exited cleanly (a rank exits non-zero on a wrong sum or a broken ring).

use std::borrow::Borrow;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::yard::YardCluster;
use crate::{Error, Process, Result, Topology};

/// The port ranks listen on, like torchrun's default master port: what the nodes' eBPF
/// per-peer counters are told to count.
pub const RING_PORT: u16 = 29500;

/// Starts every progress line `ring-rank` prints, so the harness can find them in its log.
const PROGRESS_PREFIX: &str = "ring-rank progress:";

/// How long a stopped rank gets to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often `yard diagnose` is asked while waiting for a verdict.
const DIAGNOSE_EVERY: Duration = Duration::from_millis(200);

/// Settings of a ring job.
#[derive(Debug, Clone)]
pub struct RingOptions {
    /// Bytes of f32 each all-reduce sums.
    pub bytes: u64,
    /// Simulated compute between two all-reduces.
    pub compute_ms: u64,
    /// The port every rank listens on (in its own host).
    pub port: u16,
    /// The NIC name ranks report to the probe.
    pub nic: String,
}

impl Default for RingOptions {
    /// 1 MiB all-reduces every 20 ms of compute on port [`RING_PORT`], NIC "eth0" (the
    /// topology's host interface).
    fn default() -> Self {
        Self {
            bytes: 1 << 20,
            compute_ms: 20,
            port: RING_PORT,
            nic: "eth0".into(),
        }
    }
}

/// A rank's progress as its latest progress line says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankProgress {
    /// All-reduces completed and verified.
    pub done: u64,
    /// Mean time of one all-reduce (collective only, no compute) since the line before, in ms.
    pub mean_ms: f64,
}

/// The progress line `ring-rank` prints (`state` is "running" or "exiting").
pub fn progress_line(done: u64, mean_ms: f64, state: &str) -> String {
    format!("{PROGRESS_PREFIX} done={done} mean_ms={mean_ms:.2} state={state}")
}

/// The last progress line in a `ring-rank` log, if any.
pub fn parse_progress(log: &str) -> Option<RankProgress> {
    parse_progress_with(PROGRESS_PREFIX, log)
}

/// The last progress line starting with `prefix` (then ` done=N mean_ms=X ...`, the format
/// of [`progress_line`]) in a rank's log, if any: for other rank programs that print the same.
pub fn parse_progress_with(prefix: &str, log: &str) -> Option<RankProgress> {
    log.lines().rev().find_map(|line| {
        let rest = line.strip_prefix(prefix)?;
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        Some(RankProgress {
            done: field("done")?.parse().ok()?,
            mean_ms: field("mean_ms")?.parse().ok()?,
        })
    })
}

/// One `ring-rank` per listed host, rank `r` on `hosts[r]`, all in one job; or any other job
/// of rank processes that print progress lines in that format ([`RingJob::from_ranks`]).
#[derive(Debug)]
pub struct RingJob {
    job: String,
    ranks: Vec<Process>,
    progress_prefix: &'static str,
}

impl RingJob {
    /// Starts rank `r` of `job` in host `hosts[r]`, listening on that host's address and
    /// reporting to that host's node. `bin` is the `ring-rank` binary (in an integration
    /// test: `env!("CARGO_BIN_EXE_ring-rank")`). Logs are `ring-<job>-<r>.log` in the run
    /// directory.
    pub fn start<T: Borrow<Topology>>(
        cluster: &YardCluster<T>,
        bin: &Path,
        job: &str,
        hosts: &[usize],
        opts: &RingOptions,
    ) -> Result<Self> {
        let topo = cluster.topology();
        for &h in hosts {
            topo.check_host(h)?;
        }
        let addr = |h: usize| format!("{}:{}", topo.addr(h), opts.port);
        let peers = hosts.iter().map(|&h| addr(h)).collect::<Vec<_>>().join(",");
        let world = hosts.len().to_string();
        let mut ranks = Vec::with_capacity(hosts.len());
        for (r, &h) in hosts.iter().enumerate() {
            let socket = cluster.probe_socket(h).display().to_string();
            let args = [
                "--job".to_owned(),
                job.to_owned(),
                "--rank".to_owned(),
                r.to_string(),
                "--world".to_owned(),
                world.clone(),
                "--peers".to_owned(),
                peers.clone(),
                "--listen".to_owned(),
                addr(h),
                "--socket".to_owned(),
                socket,
                "--bytes".to_owned(),
                opts.bytes.to_string(),
                "--compute-ms".to_owned(),
                opts.compute_ms.to_string(),
                "--nic".to_owned(),
                opts.nic.clone(),
            ];
            ranks.push(topo.spawn(h, bin, &args, &[], &format!("ring-{job}-{r}.log"))?);
        }
        Ok(Self::from_ranks(job, ranks, PROGRESS_PREFIX))
    }

    /// A job of rank processes already started (rank `r` is `ranks[r]`) whose logs carry
    /// progress lines beginning with `progress_prefix` in [`progress_line`]'s format, and
    /// which stop cleanly on SIGTERM.
    pub fn from_ranks(job: &str, ranks: Vec<Process>, progress_prefix: &'static str) -> Self {
        Self {
            job: job.to_owned(),
            ranks,
            progress_prefix,
        }
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Rank `r`'s process.
    ///
    /// # Panics
    /// When the job has no rank `r` (a bug in the test).
    pub fn rank(&self, r: usize) -> &Process {
        &self.ranks[r]
    }

    /// Fails with [`Error::Died`] if a rank has exited.
    pub fn check_running(&self) -> Result<()> {
        self.ranks.iter().try_for_each(Process::check_running)
    }

    /// Rank `r`'s latest progress line, if it printed one yet.
    pub fn progress(&self, r: usize) -> Option<RankProgress> {
        parse_progress_with(self.progress_prefix, &self.ranks[r].log())
    }

    /// Waits until every rank has completed at least `n` all-reduces (failing at once if one
    /// exits) and returns their progress.
    pub fn wait_done(&self, n: u64, timeout: Duration) -> Result<Vec<RankProgress>> {
        let start = Instant::now();
        loop {
            self.check_running()?;
            let now: Vec<Option<RankProgress>> =
                (0..self.ranks.len()).map(|r| self.progress(r)).collect();
            if now.iter().all(|p| p.is_some_and(|p| p.done >= n)) {
                return Ok(now.into_iter().flatten().collect());
            }
            if start.elapsed() > timeout {
                return Err(Error::Yard(format!(
                    "job {} did not complete {n} all-reduces on every rank within {timeout:?}: {now:?}",
                    self.job
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the job as a launcher would: SIGCONT (a rank may be frozen) and SIGTERM to every
    /// rank, then waits for all of them; fails unless each exited with status 0.
    pub fn stop(self) -> Result<()> {
        for p in &self.ranks {
            let _ = p.cont();
            p.terminate()?;
        }
        let mut failed = Vec::new();
        for (r, p) in self.ranks.iter().enumerate() {
            let status = p.wait_exit(EXIT_TIMEOUT)?;
            if !status.success() {
                failed.push(format!("rank {r} exited with {status}:\n{}", p.log_tail(5)));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Error::Yard(format!(
                "job {} did not stop cleanly: {}",
                self.job,
                failed.join("\n")
            )))
        }
    }
}

/// The verdicts about `job`, as `yard diagnose --job J --json` prints them when run in host
/// `from` against every node; `None` while no probe has reported the job.
pub fn diagnose<T: Borrow<Topology>>(
    cluster: &YardCluster<T>,
    from: usize,
    job: &str,
) -> Result<Option<Vec<Value>>> {
    let out = cluster.cli_to(
        from,
        &cluster.all_endpoints(),
        &["diagnose", "--job", job, "--json"],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stderr.contains("job not found") {
            return Ok(None);
        }
        return Err(Error::Yard(format!(
            "yard diagnose --job {job} failed ({}): {}",
            out.status,
            stderr.trim()
        )));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        Error::Yard(format!(
            "yard diagnose --job {job} printed unparseable output: {e}"
        ))
    })?;
    match v["verdicts"].as_array() {
        Some(list) => Ok(Some(list.clone())),
        None => Err(Error::Yard(format!(
            "yard diagnose --job {job} printed no verdict list: {v}"
        ))),
    }
}

/// Asks [`diagnose`] until `done` accepts the job's verdicts; returns them and how long that
/// took. On timeout the error carries the last verdicts seen.
pub fn wait_verdicts<T: Borrow<Topology>>(
    cluster: &YardCluster<T>,
    from: usize,
    job: &str,
    timeout: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Result<(Vec<Value>, Duration)> {
    let start = Instant::now();
    let mut last = None;
    loop {
        // A node busy with an election may fail one call; the next one counts.
        if let Ok(Some(v)) = diagnose(cluster, from, job) {
            if done(&v) {
                return Ok((v, start.elapsed()));
            }
            last = Some(v);
        }
        if start.elapsed() > timeout {
            return Err(Error::Yard(format!(
                "job {job} did not get the expected verdicts within {timeout:?}; last seen: {}",
                last.map_or("none (job unknown)".into(), |v| Value::Array(v).to_string())
            )));
        }
        std::thread::sleep(DIAGNOSE_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_round_trip_and_the_last_one_wins() {
        let log = format!(
            "rank 0 of 3: connected\n{}\nnoise\n{}\n",
            progress_line(10, 3.5, "running"),
            progress_line(52, 41.25, "exiting")
        );
        assert_eq!(
            parse_progress(&log),
            Some(RankProgress {
                done: 52,
                mean_ms: 41.25
            })
        );
        assert_eq!(parse_progress("no progress yet\n"), None);
        assert_eq!(parse_progress(&format!("{PROGRESS_PREFIX} done=x")), None);
    }
}
