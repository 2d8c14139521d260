//! The two workloads, written once and run against either system.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::sync::Notify;
use yard::latency::PutFigures;

use crate::cluster::{Cluster, KvClient};

/// Figures of one put round of one system.
#[derive(Debug, Clone, Serialize)]
pub struct RoundFigures {
    pub system: &'static str,
    pub round: usize,
    /// Computed as `yard bench kv` computes them.
    #[serde(flatten)]
    pub put: PutFigures,
    /// The first error's text, if any put failed.
    pub first_error: Option<String>,
}

/// `ops` puts of `value` split over `clients` (each client one task, one put at a time), the
/// same way `yard bench kv` does. Each client first makes one untimed put so connection set-up
/// is not counted. Returns the clients for the next round.
pub async fn put_round(
    system: &'static str,
    round: usize,
    clients: Vec<KvClient>,
    ops: usize,
    value: Arc<str>,
) -> Result<(RoundFigures, Vec<KvClient>)> {
    let n = clients.len();
    let mut warmed = Vec::with_capacity(n);
    for (c, mut client) in clients.into_iter().enumerate() {
        client
            .put(format!("bench/warmup/{c}"), &value)
            .await
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{system}: warm-up put of client {c} failed"))?;
        warmed.push(client);
    }
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for (c, mut client) in warmed.into_iter().enumerate() {
        let share = ops / n + usize::from(c < ops % n);
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(share);
            let mut errors = 0;
            let mut first_error = None;
            for i in 0..share {
                let t = Instant::now();
                match client.put(format!("bench/r{round}/{c}/{i}"), &value).await {
                    Ok(()) => lat.push(t.elapsed()),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
            (client, lat, errors, first_error)
        }));
    }
    let mut all = Vec::with_capacity(ops);
    let mut errors = 0;
    let mut first_error = None;
    let mut back = Vec::with_capacity(n);
    for t in tasks {
        let (client, lat, e, fe) = t.await.context("a client task panicked")?;
        back.push(client);
        all.extend(lat);
        errors += e;
        if first_error.is_none() {
            first_error = fe;
        }
    }
    let figures = RoundFigures {
        system,
        round,
        put: PutFigures::new(n, ops, value.len(), errors, start.elapsed(), all),
        first_error,
    };
    Ok((figures, back))
}

/// Settings of the leader-kill trials.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct KillSettings {
    /// Per-put timeout of the writers; a put that takes longer counts as failed.
    pub write_timeout_ms: u64,
    /// Each writer sends a new put this often, without waiting for the ones in flight, so the
    /// first put that can succeed after the kill is sent within this long of the moment it can:
    /// the resolution of the recovery figure. (A writer that waited for each put would measure
    /// in steps of the put timeout, since puts to a leaderless cluster hang until it.)
    pub probe_interval_ms: u64,
    /// Give up on a trial whose cluster has not acknowledged a write this long after the kill.
    pub give_up_s: u64,
    /// Pause after the killed member has caught up, before the next trial.
    pub settle_ms: u64,
}

/// Figures of one leader-kill trial.
#[derive(Debug, Clone, Serialize)]
pub struct KillTrial {
    pub system: &'static str,
    pub trial: usize,
    /// The host whose member led and was killed.
    pub killed_host: usize,
    /// When, to find the moment in the members' logs.
    pub killed_at_unix_ms: u64,
    /// Time from `kill -9` of the leader to the first acknowledged put that was sent after
    /// the kill; `None` when none came within `give_up_s`.
    pub recovery_ms: Option<f64>,
    /// Puts acknowledged in the steady phase before the kill (all writers).
    pub acks_before_kill: u64,
    /// Puts sent after the kill that failed or timed out (all writers).
    pub failed_attempts: u64,
    /// Time from restarting the killed member until it had caught up.
    pub rejoin_ms: f64,
}

/// What the writers share with the trial.
#[derive(Default)]
struct Writers {
    stop: AtomicBool,
    kill_at: OnceLock<Instant>,
    acks_before: AtomicU64,
    failed_after: AtomicU64,
    first_ack_after: Mutex<Option<Instant>>,
    recovered: Notify,
}

impl Writers {
    fn record_ack(&self, sent: Instant, acked: Instant) {
        match self.kill_at.get() {
            None => {
                self.acks_before.fetch_add(1, Ordering::Relaxed);
            }
            Some(&kill) if sent >= kill => {
                let mut first = self
                    .first_ack_after
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if first.is_none_or(|f| acked < f) {
                    *first = Some(acked);
                }
                drop(first);
                self.recovered.notify_one();
            }
            // Sent before the kill: says nothing about recovery.
            Some(_) => {}
        }
    }

    fn first_ack(&self) -> Option<Instant> {
        *self
            .first_ack_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One trial: writers put through every member at once (one client per member, a new put every
/// `probe_interval_ms`), the leader is killed with SIGKILL, and the time to the first put that
/// was sent after the kill and acknowledged is the recovery. Then the killed member is restarted
/// and the trial waits until it has caught up.
pub async fn leader_kill_trial<C: Cluster>(
    cluster: &mut C,
    trial: usize,
    settings: KillSettings,
    value: Arc<str>,
) -> Result<KillTrial> {
    let system = cluster.name();
    let leader = cluster.wait_leader(Duration::from_secs(60)).await?;
    let shared = Arc::new(Writers::default());
    let timeout = Duration::from_millis(settings.write_timeout_ms);
    let interval = Duration::from_millis(settings.probe_interval_ms.max(1));
    let mut writers = Vec::new();
    for h in cluster.hosts() {
        let client = cluster.client(h, timeout).await?;
        let shared = shared.clone();
        let value = value.clone();
        writers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Dropped (aborting what is still in flight) when the writer is stopped.
            let mut in_flight = tokio::task::JoinSet::new();
            let mut i = 0u64;
            while !shared.stop.load(Ordering::Relaxed) {
                tick.tick().await;
                while in_flight.try_join_next().is_some() {}
                let key = format!("killtest/t{trial}/w{h}/{i}");
                i += 1;
                let mut client = client.clone();
                let shared = shared.clone();
                let value = value.clone();
                in_flight.spawn(async move {
                    let sent = Instant::now();
                    let ok = matches!(
                        tokio::time::timeout(timeout, client.put(key, &value)).await,
                        Ok(Ok(()))
                    );
                    if ok {
                        shared.record_ack(sent, Instant::now());
                    } else if shared.kill_at.get().is_some() {
                        shared.failed_after.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }));
    }
    // Steady state first: writes flowing for a while through the live leader.
    let steady_deadline = Instant::now() + Duration::from_secs(20);
    let steady_from = Instant::now();
    while shared.acks_before.load(Ordering::Relaxed) < 20
        || steady_from.elapsed() < Duration::from_millis(500)
    {
        if Instant::now() >= steady_deadline {
            shared.stop.store(true, Ordering::Relaxed);
            anyhow::bail!(
                "{system}: writers got only {} acknowledgements in 20 s before the kill",
                shared.acks_before.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let Killed {
        victim,
        at: killed_at,
        at_unix_ms: killed_at_unix_ms,
    } = kill_leader(cluster, leader)?;
    let _ = shared.kill_at.set(killed_at);

    let give_up = killed_at + Duration::from_secs(settings.give_up_s);
    while shared.first_ack().is_none() && Instant::now() < give_up {
        let _ = tokio::time::timeout_at(give_up.into(), shared.recovered.notified()).await;
    }
    let recovery_ms = shared
        .first_ack()
        .map(|t| t.duration_since(killed_at).as_secs_f64() * 1e3);
    shared.stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }

    let rejoin_ms = rejoin(cluster, leader, victim, settings).await?;
    Ok(KillTrial {
        system,
        trial,
        killed_host: leader,
        killed_at_unix_ms,
        recovery_ms,
        acks_before_kill: shared.acks_before.load(Ordering::Relaxed),
        failed_attempts: shared.failed_after.load(Ordering::Relaxed),
        rejoin_ms,
    })
}

/// The leader's process, killed with SIGKILL, and when.
struct Killed {
    victim: yard_cluster_tests::Process,
    at: Instant,
    at_unix_ms: u64,
}

/// Kills the member on host `leader` with SIGKILL: both kill trials start this way.
fn kill_leader<C: Cluster>(cluster: &C, leader: usize) -> Result<Killed> {
    let victim = cluster.process(leader).clone();
    victim.kill9().with_context(|| {
        format!(
            "{}: cannot kill the leader on host {leader}",
            cluster.name()
        )
    })?;
    Ok(Killed {
        victim,
        at: Instant::now(),
        at_unix_ms: unix_ms(),
    })
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Figures of one leader-kill trial driven through the system's own CLI.
#[derive(Debug, Clone, Serialize)]
pub struct CliTrial {
    pub system: &'static str,
    pub trial: usize,
    /// The host whose member led and was killed.
    pub killed_host: usize,
    /// The surviving member the CLI was pointed at.
    pub asked_host: usize,
    pub killed_at_unix_ms: u64,
    /// From `kill -9` of the leader to the exit of the first CLI put that succeeded; `None`
    /// when none did within the give-up time (the trial stays in the table as failed).
    pub recovery_ms: Option<f64>,
    /// CLI invocations that ended in an error before that: errors a user saw.
    pub errors: usize,
    /// The first error's message, as the CLI printed it.
    pub first_error: Option<String>,
    /// Time from restarting the killed member until it had caught up.
    pub rejoin_ms: f64,
}

/// One trial as a user lives it: the leader is killed with SIGKILL and, at once, the CLI (a
/// fresh process per attempt, default settings) puts a key through a surviving member, again
/// after every error, until one put succeeds. Then the killed member is restarted and the trial
/// waits until it has caught up.
pub async fn cli_kill_trial<C: Cluster>(
    cluster: &mut C,
    trial: usize,
    settings: KillSettings,
) -> Result<CliTrial> {
    let system = cluster.name();
    let leader = cluster.wait_leader(Duration::from_secs(60)).await?;
    let asked = cluster
        .hosts()
        .into_iter()
        .find(|h| *h != leader)
        .context("a cluster of one member has no survivor to ask")?;
    // The CLI works before the kill (and its binary is in the page cache).
    let warm = cluster
        .cli_put(asked, &format!("clitest/t{trial}/warm"), "w")
        .output()
        .await
        .with_context(|| format!("{system}: cannot run the CLI"))?;
    if !warm.status.success() {
        anyhow::bail!(
            "{system}: the CLI fails before any fault: {}",
            String::from_utf8_lossy(&warm.stderr).trim()
        );
    }
    let Killed {
        victim,
        at: killed_at,
        at_unix_ms: killed_at_unix_ms,
    } = kill_leader(cluster, leader)?;
    let give_up = killed_at + Duration::from_secs(settings.give_up_s);
    let (mut errors, mut first_error, mut recovery_ms) = (0, None, None);
    let mut attempt = 0;
    while Instant::now() < give_up {
        attempt += 1;
        let out = cluster
            .cli_put(asked, &format!("clitest/t{trial}/{attempt}"), "v")
            .output()
            .await
            .with_context(|| format!("{system}: cannot run the CLI"))?;
        if out.status.success() {
            recovery_ms = Some(killed_at.elapsed().as_secs_f64() * 1e3);
            break;
        }
        errors += 1;
        first_error.get_or_insert_with(|| String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let rejoin_ms = rejoin(cluster, leader, victim, settings).await?;
    Ok(CliTrial {
        system,
        trial,
        killed_host: leader,
        asked_host: asked,
        killed_at_unix_ms,
        recovery_ms,
        errors,
        first_error,
        rejoin_ms,
    })
}

/// Reaps the killed member, brings it back from its data and waits until it has caught up;
/// returns how long that took (then pauses `settle_ms` before the next trial).
async fn rejoin<C: Cluster>(
    cluster: &mut C,
    host: usize,
    victim: yard_cluster_tests::Process,
    settings: KillSettings,
) -> Result<f64> {
    let system = cluster.name();
    tokio::task::spawn_blocking(move || victim.wait_exit(Duration::from_secs(10)))
        .await
        .context("reaper task panicked")?
        .with_context(|| format!("{system}: the killed leader did not exit"))?;
    let restarted = Instant::now();
    cluster.restart(host).await?;
    cluster
        .wait_caught_up(host, Duration::from_secs(60))
        .await?;
    let rejoin_ms = restarted.elapsed().as_secs_f64() * 1e3;
    tokio::time::sleep(Duration::from_millis(settings.settle_ms)).await;
    Ok(rejoin_ms)
}
