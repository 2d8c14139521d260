//! A bounded, seeded, concurrent key-value workload that records its history.
//!
//! The workload is generic over [`KvClient`] so the same code drives an in-memory model in unit
//! tests and a real Switchyard cluster in chaos runs; only the client changes. Every written value
//! is unique (`c<client>-<n>`), which is what lets the checker tell a stale read from a fresh one.
//!
//! Each client runs as its own tokio task and issues one operation at a time. When an operation's
//! outcome is unknown it may still be in flight inside the cluster, so the client continues under
//! a fresh process id (the Jepsen convention): each process id then stays strictly sequential.
//!
//! Besides the shared keys, each client increments a counter key of its own by compare-and-swap
//! from the value it knows (`<count>:<unique>`). Nobody else writes it, so every increment the
//! store reports must have applied exactly once: a swap that finds another value while no
//! outcome of this client is unknown means a reply lied (a retried write applied twice reports
//! a mismatch), and the final count must equal the increments acknowledged. See
//! [`CounterReport::check`].

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::history::{FailReason, Op, OpResult, Outcome, ProcessId, Recorder};

/// Why a client request did not return a result.
///
/// The split matters to the checker: a definite error is dropped from the history, while an
/// indefinite one must be allowed to have taken effect at any later time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The request was certainly not applied (e.g. rejected before it was proposed).
    #[error("request was not applied: {0}")]
    Definite(String),
    /// The request may or may not have been applied (e.g. the connection dropped mid-request).
    #[error("request may have been applied: {0}")]
    Indefinite(String),
}

/// A key-value client the workload can drive.
///
/// The futures are `Send` so that each client can run on its own task of a multi-thread runtime.
pub trait KvClient: Clone + Send + Sync + 'static {
    /// Reads a key; `None` means absent.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<String>, ClientError>> + Send;

    /// Sets a key unconditionally.
    fn put(&self, key: &str, value: &str) -> impl Future<Output = Result<(), ClientError>> + Send;

    /// Sets `key` to `value` if it currently holds `expect` (`None`: absent); returns whether it
    /// swapped. A mismatch is `Ok(false)`, not an error.
    fn cas(
        &self,
        key: &str,
        expect: Option<&str>,
        value: &str,
    ) -> impl Future<Output = Result<bool, ClientError>> + Send;

    /// Removes a key (absent already is success).
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), ClientError>> + Send;
}

/// Relative weights of the operations a client picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpMix {
    pub read: u32,
    pub write: u32,
    pub cas: u32,
    #[serde(default)]
    pub delete: u32,
    /// Increments of the client's own counter key.
    #[serde(default)]
    pub increment: u32,
}

impl OpMix {
    fn total(&self) -> u32 {
        self.read + self.write + self.cas + self.delete + self.increment
    }
}

impl Default for OpMix {
    fn default() -> Self {
        Self {
            read: 4,
            write: 2,
            cas: 2,
            delete: 1,
            increment: 1,
        }
    }
}

/// What to run. The run ends when every client has issued `ops_per_client` operations or
/// `max_duration` has passed, whichever is first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadConfig {
    /// The keys to operate on. The checker assumes they are absent when the run starts, so a run
    /// against a long-lived cluster should use fresh names (see [`key_set`]). Few keys mean more
    /// contention per key, which is what finds bugs.
    pub keys: Vec<String>,
    pub ops_per_client: usize,
    /// Hard bound on the run: an operation still in flight at the end is cut off as unknown.
    pub max_duration: Duration,
    /// A request that takes longer is abandoned and recorded as unknown.
    pub op_timeout: Duration,
    /// Seeds every client's choices; client `i` uses a stream derived from `(seed, i)`.
    pub seed: u64,
    pub mix: OpMix,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            keys: key_set("k", 3),
            ops_per_client: 200,
            max_duration: Duration::from_secs(60),
            op_timeout: Duration::from_secs(2),
            seed: 0,
            mix: OpMix::default(),
        }
    }
}

/// `n` key names `<prefix>0 .. <prefix>n-1`; give each run its own prefix.
pub fn key_set(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Client `client`'s counter key: named after the run's first key, so fresh in every run.
pub fn counter_key(keys: &[String], client: usize) -> String {
    format!(
        "{}-counter-c{client}",
        keys.first().map_or("k", String::as_str)
    )
}

/// The count a counter value (`<count>:<unique>`) holds; absent is 0.
pub fn counter_count(value: Option<&str>) -> Option<u64> {
    match value {
        None => Some(0),
        Some(v) => v.split(':').next()?.parse().ok(),
    }
}

/// What one client knows of its counter at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterReport {
    pub key: String,
    /// The count the client knows the key holds.
    pub count: u64,
    /// Increments acknowledged as applied.
    pub acked: u64,
    /// Increments whose outcome was unknown.
    pub unknown: u64,
    /// An increment of unknown outcome may still land (no acknowledged one came after it).
    pub pending_unknown: bool,
    /// Swaps that found another value while no outcome was unknown: a reply that lied.
    pub lies: Vec<String>,
}

impl CounterReport {
    /// Checks the counter's final value as read back after the run: every acknowledged
    /// increment applied exactly once, nothing else did (but the one pending unknown).
    pub fn check(&self, final_value: Option<&str>) -> Result<(), String> {
        if let Some(lie) = self.lies.first() {
            return Err(format!("{}: {lie}", self.key));
        }
        let Some(v) = counter_count(final_value) else {
            return Err(format!("{}: unreadable value {final_value:?}", self.key));
        };
        if v == self.count || (self.pending_unknown && v == self.count + 1) {
            Ok(())
        } else {
            Err(format!(
                "{}: holds {v} increments, the client knows of {} ({} acknowledged)",
                self.key, self.count, self.acked
            ))
        }
    }
}

/// Why a workload could not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("the workload needs at least one client")]
    NoClients,
    #[error("the workload needs at least one key")]
    NoKeys,
    #[error("the operation mix has no weight")]
    EmptyMix,
    #[error("client task {client} panicked: {message}")]
    ClientPanicked { client: usize, message: String },
}

/// Counts of how a run's operations ended; the history itself is in the recorder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    pub invoked: usize,
    pub ok: usize,
    /// Definite failures, including compare-and-swap mismatches.
    pub failed: usize,
    pub unknown: usize,
    pub elapsed: Duration,
    /// Each client's counter.
    pub counters: Vec<CounterReport>,
}

impl WorkloadSummary {
    fn add(&mut self, other: &WorkloadSummary) {
        self.invoked += other.invoked;
        self.ok += other.ok;
        self.failed += other.failed;
        self.unknown += other.unknown;
        self.counters.extend(other.counters.iter().cloned());
    }
}

/// Runs one task per client until the operation count or the time bound is reached, recording
/// every operation into `recorder`. Client `i` starts as process `i`.
pub async fn run_workload<C: KvClient>(
    clients: Vec<C>,
    config: WorkloadConfig,
    recorder: Recorder,
) -> Result<WorkloadSummary, WorkloadError> {
    if clients.is_empty() {
        return Err(WorkloadError::NoClients);
    }
    if config.keys.is_empty() {
        return Err(WorkloadError::NoKeys);
    }
    if config.mix.total() == 0 {
        return Err(WorkloadError::EmptyMix);
    }
    let start = Instant::now();
    let deadline = start + config.max_duration;
    let n = clients.len();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let worker = Worker {
                client,
                index: i,
                clients: n,
                config: config.clone(),
                recorder: recorder.clone(),
                deadline,
            };
            tokio::spawn(worker.run())
        })
        .collect();

    let mut summary = WorkloadSummary::default();
    let mut first_error = None;
    for (client, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(part) => summary.add(&part),
            Err(e) => {
                first_error.get_or_insert(WorkloadError::ClientPanicked {
                    client,
                    message: e.to_string(),
                });
            }
        }
    }
    summary.elapsed = start.elapsed();
    match first_error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// One client's task.
struct Worker<C> {
    client: C,
    index: usize,
    clients: usize,
    config: WorkloadConfig,
    recorder: Recorder,
    deadline: Instant,
}

impl<C: KvClient> Worker<C> {
    async fn run(self) -> WorkloadSummary {
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed);
        // A separate stream per client, so adding clients does not change existing ones' choices.
        rng.set_stream(self.index as u64);
        let mut process = self.index as ProcessId;
        let mut written = 0u64;
        // What this client last saw per key: a plausible `expect` for its next compare-and-swap.
        let mut last_seen: HashMap<String, Option<String>> = HashMap::new();
        let mut summary = WorkloadSummary::default();
        let mix = self.config.mix;
        let total = mix.total();
        let mut counter = CounterReport {
            key: counter_key(&self.config.keys, self.index),
            ..Default::default()
        };
        // The counter's value as this client knows it; `None` once an outcome was unknown and
        // until a read told it again.
        let mut counter_value: Option<Option<String>> = Some(None);

        for _ in 0..self.config.ops_per_client {
            let now = Instant::now();
            if now >= self.deadline {
                break;
            }
            let op_deadline = (now + self.config.op_timeout).min(self.deadline);
            let key = self.config.keys[rng.gen_range(0..self.config.keys.len())].clone();
            let roll = rng.gen_range(0..total);
            let incrementing = roll >= total - mix.increment;
            let op = if incrementing {
                match &counter_value {
                    // Learn the value again first.
                    None => Op::Read {
                        key: counter.key.clone(),
                    },
                    Some(current) => {
                        written += 1;
                        let next = counter_count(current.as_deref()).unwrap_or(0) + 1;
                        Op::Cas {
                            key: counter.key.clone(),
                            expect: current.clone(),
                            new: format!("{next}:c{}-{written}", self.index),
                        }
                    }
                }
            } else if roll >= mix.read + mix.write + mix.cas {
                Op::Delete { key }
            } else if roll < mix.read {
                Op::Read { key }
            } else {
                written += 1;
                let value = format!("c{}-{written}", self.index);
                if roll < mix.read + mix.write {
                    Op::Write { key, value }
                } else {
                    // Mostly what we last saw (likely to swap), sometimes "absent".
                    let expect = match last_seen.get(&key) {
                        Some(seen) if rng.gen_bool(0.8) => seen.clone(),
                        _ => None,
                    };
                    Op::Cas {
                        key,
                        expect,
                        new: value,
                    }
                }
            };

            let handle = self.recorder.invoke(process, op.clone());
            let outcome = self.execute(&op, op_deadline).await;
            summary.invoked += 1;
            if incrementing {
                match (&op, &outcome) {
                    (Op::Read { .. }, Outcome::Ok(OpResult::Read(v))) => {
                        counter.count = counter_count(v.as_deref()).unwrap_or(counter.count);
                        counter_value = Some(v.clone());
                    }
                    (Op::Cas { new, .. }, Outcome::Ok(_)) => {
                        counter.acked += 1;
                        counter.count += 1;
                        counter.pending_unknown = false;
                        counter_value = Some(Some(new.clone()));
                    }
                    (Op::Cas { expect, .. }, Outcome::Fail(FailReason::CasMismatch)) => {
                        if !counter.pending_unknown {
                            counter.lies.push(format!(
                                "a swap from {expect:?} found another value although every earlier increment's outcome was reported"
                            ));
                        }
                        counter_value = None;
                    }
                    (Op::Cas { .. }, Outcome::Unknown(_)) => {
                        counter.unknown += 1;
                        counter.pending_unknown = true;
                        counter_value = None;
                    }
                    _ => {}
                }
            }
            match &outcome {
                Outcome::Ok(result) => {
                    summary.ok += 1;
                    match (&op, result) {
                        (Op::Read { key }, OpResult::Read(v)) => {
                            last_seen.insert(key.clone(), v.clone());
                        }
                        (Op::Write { key, value: v, .. } | Op::Cas { key, new: v, .. }, _) => {
                            last_seen.insert(key.clone(), Some(v.clone()));
                        }
                        (Op::Delete { key }, _) => {
                            last_seen.insert(key.clone(), None);
                        }
                        _ => {}
                    }
                }
                Outcome::Fail(_) => summary.failed += 1,
                Outcome::Unknown(_) => {
                    summary.unknown += 1;
                    process += self.clients as ProcessId;
                }
            }
            handle.complete(outcome);
        }
        summary.counters.push(counter);
        summary
    }

    /// Sends one operation and classifies how it ended.
    async fn execute(&self, op: &Op, deadline: Instant) -> Outcome {
        let c = &self.client;
        let result = match op {
            Op::Read { key } => tokio::time::timeout_at(deadline, c.get(key))
                .await
                .map(|r| r.map(|v| Outcome::Ok(OpResult::Read(v)))),
            Op::Write { key, value } => tokio::time::timeout_at(deadline, c.put(key, value))
                .await
                .map(|r| r.map(|()| Outcome::Ok(OpResult::Applied))),
            Op::Cas { key, expect, new } => {
                tokio::time::timeout_at(deadline, c.cas(key, expect.as_deref(), new))
                    .await
                    .map(|r| {
                        r.map(|swapped| match swapped {
                            true => Outcome::Ok(OpResult::Applied),
                            false => Outcome::Fail(FailReason::CasMismatch),
                        })
                    })
            }
            Op::Delete { key } => tokio::time::timeout_at(deadline, c.delete(key))
                .await
                .map(|r| r.map(|()| Outcome::Ok(OpResult::Applied))),
        };
        match result {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(ClientError::Definite(why))) => Outcome::Fail(FailReason::NotApplied(why)),
            Ok(Err(ClientError::Indefinite(why))) => Outcome::Unknown(why),
            Err(_elapsed) => Outcome::Unknown("timed out".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::linearizability::check;

    /// A cheap deterministic hash for client-side jitter and fault injection.
    fn mix64(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// A linearizable store: one mutex, with random delays on both sides of the critical
    /// section and injected failures of every kind.
    #[derive(Clone, Default)]
    struct Atomic {
        map: Arc<Mutex<HashMap<String, String>>>,
        counter: Arc<AtomicU64>,
    }

    enum Fault {
        None,
        /// Not applied, and the client is told so.
        Definite,
        /// Applied, but the answer is lost.
        LostReply,
        /// Hangs past the timeout; `before` says whether the effect lands before the hang.
        Hang {
            before: bool,
        },
    }

    impl Atomic {
        async fn apply<T>(
            &self,
            f: impl FnOnce(&mut HashMap<String, String>) -> T,
        ) -> Result<T, ClientError> {
            let r = mix64(self.counter.fetch_add(1, Ordering::Relaxed));
            let fault = match r % 40 {
                0 => Fault::Definite,
                1 => Fault::LostReply,
                2 => Fault::Hang { before: true },
                3 => Fault::Hang { before: false },
                _ => Fault::None,
            };
            tokio::time::sleep(Duration::from_micros((r >> 8) % 400)).await;
            if matches!(fault, Fault::Definite) {
                return Err(ClientError::Definite("rejected".into()));
            }
            if let Fault::Hang { before: false } = fault {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            let out = f(&mut self.map.lock().unwrap());
            tokio::time::sleep(Duration::from_micros((r >> 20) % 400)).await;
            match fault {
                Fault::LostReply => Err(ClientError::Indefinite("connection reset".into())),
                Fault::Hang { .. } => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(out)
                }
                _ => Ok(out),
            }
        }
    }

    impl KvClient for Atomic {
        async fn get(&self, key: &str) -> Result<Option<String>, ClientError> {
            self.apply(|m| m.get(key).cloned()).await
        }
        async fn put(&self, key: &str, value: &str) -> Result<(), ClientError> {
            self.apply(|m| {
                m.insert(key.to_string(), value.to_string());
            })
            .await
        }
        async fn cas(
            &self,
            key: &str,
            expect: Option<&str>,
            value: &str,
        ) -> Result<bool, ClientError> {
            self.apply(|m| {
                if m.get(key).map(String::as_str) == expect {
                    m.insert(key.to_string(), value.to_string());
                    true
                } else {
                    false
                }
            })
            .await
        }
        async fn delete(&self, key: &str) -> Result<(), ClientError> {
            self.apply(|m| {
                m.remove(key);
            })
            .await
        }
    }

    /// A broken store: writes go to the primary, reads are served by a replica that only
    /// catches up on every third write.
    #[derive(Clone, Default)]
    struct LaggingReplica {
        primary: Arc<Mutex<HashMap<String, String>>>,
        replica: Arc<Mutex<HashMap<String, String>>>,
        writes: Arc<AtomicU64>,
    }

    impl LaggingReplica {
        fn wrote(&self) {
            if self.writes.fetch_add(1, Ordering::Relaxed) % 3 == 2 {
                let snapshot = self.primary.lock().unwrap().clone();
                *self.replica.lock().unwrap() = snapshot;
            }
        }
    }

    impl KvClient for LaggingReplica {
        async fn get(&self, key: &str) -> Result<Option<String>, ClientError> {
            tokio::task::yield_now().await;
            Ok(self.replica.lock().unwrap().get(key).cloned())
        }
        async fn put(&self, key: &str, value: &str) -> Result<(), ClientError> {
            tokio::task::yield_now().await;
            self.primary
                .lock()
                .unwrap()
                .insert(key.to_string(), value.to_string());
            self.wrote();
            Ok(())
        }
        async fn cas(
            &self,
            key: &str,
            expect: Option<&str>,
            value: &str,
        ) -> Result<bool, ClientError> {
            tokio::task::yield_now().await;
            let swapped = {
                let mut m = self.primary.lock().unwrap();
                let ok = m.get(key).map(String::as_str) == expect;
                if ok {
                    m.insert(key.to_string(), value.to_string());
                }
                ok
            };
            if swapped {
                self.wrote();
            }
            Ok(swapped)
        }
        async fn delete(&self, key: &str) -> Result<(), ClientError> {
            tokio::task::yield_now().await;
            self.primary.lock().unwrap().remove(key);
            self.wrote();
            Ok(())
        }
    }

    fn config(seed: u64) -> WorkloadConfig {
        WorkloadConfig {
            keys: key_set("k", 3),
            ops_per_client: 150,
            max_duration: Duration::from_secs(20),
            op_timeout: Duration::from_millis(50),
            seed,
            mix: OpMix::default(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn atomic_store_is_linearizable() {
        let store = Atomic::default();
        let recorder = Recorder::new();
        let clients = vec![store.clone(); 5];
        let summary = run_workload(clients, config(7), recorder.clone())
            .await
            .unwrap();
        assert_eq!(summary.invoked, 5 * 150);
        assert_eq!(
            summary.ok + summary.failed + summary.unknown,
            summary.invoked
        );
        assert!(summary.unknown > 0 && summary.failed > 0, "{summary:?}");

        let history = recorder.history();
        assert_eq!(history.entries.len(), summary.invoked);
        let verdict = check(&history).unwrap();
        assert!(verdict.linearizable, "{verdict}");
        // The three shared keys and each client's counter.
        assert_eq!(verdict.keys_checked, 3 + 5);
        // Every increment applied exactly once, although some replies were lost.
        assert_eq!(summary.counters.len(), 5);
        assert!(summary.counters.iter().any(|c| c.acked > 0), "{summary:?}");
        for c in &summary.counters {
            let value = store.map.lock().unwrap().get(&c.key).cloned();
            c.check(value.as_deref()).unwrap();
        }
    }

    /// A store that sometimes applies a compare-and-swap and then answers "mismatch", as a
    /// store without client sessions does when a retried swap meets its own first copy.
    #[derive(Clone, Default)]
    struct RetriesApplyTwice {
        inner: Atomic,
        calls: Arc<AtomicU64>,
    }

    impl KvClient for RetriesApplyTwice {
        async fn get(&self, key: &str) -> Result<Option<String>, ClientError> {
            Ok(self.inner.map.lock().unwrap().get(key).cloned())
        }
        async fn put(&self, key: &str, value: &str) -> Result<(), ClientError> {
            self.inner
                .map
                .lock()
                .unwrap()
                .insert(key.into(), value.into());
            Ok(())
        }
        async fn cas(
            &self,
            key: &str,
            expect: Option<&str>,
            value: &str,
        ) -> Result<bool, ClientError> {
            let mut m = self.inner.map.lock().unwrap();
            if m.get(key).map(String::as_str) != expect {
                return Ok(false);
            }
            m.insert(key.into(), value.into());
            // Every seventh swap: the reply was lost and the retry found the swapped value.
            Ok(self.calls.fetch_add(1, Ordering::Relaxed) % 7 != 6)
        }
        async fn delete(&self, key: &str) -> Result<(), ClientError> {
            self.inner.map.lock().unwrap().remove(key);
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retried_write_that_applied_twice_is_caught_by_the_counters() {
        let store = RetriesApplyTwice::default();
        let recorder = Recorder::new();
        let summary = run_workload(vec![store.clone(); 3], config(11), recorder)
            .await
            .unwrap();
        let failures: Vec<String> = summary
            .counters
            .iter()
            .filter_map(|c| {
                let value = store.inner.map.lock().unwrap().get(&c.key).cloned();
                c.check(value.as_deref()).err()
            })
            .collect();
        assert!(!failures.is_empty(), "{summary:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn lagging_replica_is_caught() {
        let store = LaggingReplica::default();
        let recorder = Recorder::new();
        let summary = run_workload(vec![store; 4], config(11), recorder.clone())
            .await
            .unwrap();
        assert_eq!(summary.unknown, 0);
        let verdict = check(&recorder.history()).unwrap();
        assert!(verdict.is_violation(), "{verdict}");
        let c = verdict.counterexample.as_ref().unwrap();
        assert!(c.entries.len() < c.original_ops, "{verdict}");
        assert!(
            c.entries.iter().any(|e| matches!(e.op, Op::Read { .. })),
            "{verdict}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn time_bound_cuts_the_run_short() {
        #[derive(Clone)]
        struct Slow;
        impl KvClient for Slow {
            async fn get(&self, _: &str) -> Result<Option<String>, ClientError> {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(None)
            }
            async fn put(&self, _: &str, _: &str) -> Result<(), ClientError> {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(())
            }
            async fn cas(&self, _: &str, _: Option<&str>, _: &str) -> Result<bool, ClientError> {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(false)
            }
            async fn delete(&self, _: &str) -> Result<(), ClientError> {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(())
            }
        }
        let recorder = Recorder::new();
        let config = WorkloadConfig {
            ops_per_client: 1_000_000,
            max_duration: Duration::from_millis(200),
            op_timeout: Duration::from_secs(10),
            ..WorkloadConfig::default()
        };
        let summary = run_workload(vec![Slow, Slow], config, recorder.clone())
            .await
            .unwrap();
        assert!(summary.elapsed < Duration::from_secs(2), "{summary:?}");
        assert!(summary.invoked > 0 && summary.invoked < 100, "{summary:?}");
        assert_eq!(recorder.len(), summary.invoked);
    }

    #[tokio::test]
    async fn same_seed_same_choices() {
        #[derive(Clone)]
        struct Null;
        impl KvClient for Null {
            async fn get(&self, _: &str) -> Result<Option<String>, ClientError> {
                Ok(None)
            }
            async fn put(&self, _: &str, _: &str) -> Result<(), ClientError> {
                Ok(())
            }
            async fn cas(&self, _: &str, _: Option<&str>, _: &str) -> Result<bool, ClientError> {
                Ok(true)
            }
            async fn delete(&self, _: &str) -> Result<(), ClientError> {
                Ok(())
            }
        }
        let mut runs = Vec::new();
        for _ in 0..2 {
            let recorder = Recorder::new();
            run_workload(vec![Null], config(3), recorder.clone())
                .await
                .unwrap();
            let ops: Vec<Op> = recorder
                .history()
                .entries
                .into_iter()
                .map(|e| e.op)
                .collect();
            runs.push(ops);
        }
        assert_eq!(runs[0], runs[1]);
    }

    #[tokio::test]
    async fn rejects_empty_inputs() {
        let r = run_workload(Vec::<Atomic>::new(), config(0), Recorder::new()).await;
        assert!(matches!(r, Err(WorkloadError::NoClients)));
        let mut c = config(0);
        c.keys.clear();
        let r = run_workload(vec![Atomic::default()], c, Recorder::new()).await;
        assert!(matches!(r, Err(WorkloadError::NoKeys)));
    }
}
