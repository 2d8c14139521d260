//! End to end: a workload with many unknown outcomes against a store that turns stale only late
//! in the run. This is the hard case for a linearizability checker (Knossos and Porcupine
//! searches blow up on it): the search must rule out every ordering of a long prefix before it
//! can call the history non-linearizable, and the shrinker must find the few operations that
//! show it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use yard_chaos::{
    check, key_set, run_workload, ClientError, KvClient, OpMix, Recorder, WorkloadConfig,
};

/// An in-memory store that injects slow requests and lost replies, and, when `stale_after` is
/// set, serves reads from a replica that lags the primary once that many requests have run.
#[derive(Clone, Default)]
struct Store {
    primary: Arc<Mutex<HashMap<String, String>>>,
    replica: Arc<Mutex<HashMap<String, String>>>,
    requests: Arc<AtomicU64>,
    stale_after: Option<u64>,
}

fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Store {
    async fn run<T>(
        &self,
        read: bool,
        f: impl FnOnce(&mut HashMap<String, String>) -> T,
    ) -> Result<T, ClientError> {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        let r = mix64(n);
        tokio::time::sleep(Duration::from_micros(r % 300)).await;
        if r % 10 == 1 {
            // Longer than the workload's timeout: the effect lands, the reply never does.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stale = self.stale_after.is_some_and(|after| n >= after);
        let out = if read && stale {
            f(&mut self.replica.lock().unwrap())
        } else {
            f(&mut self.primary.lock().unwrap())
        };
        if !stale || r.is_multiple_of(5) {
            let snapshot = self.primary.lock().unwrap().clone();
            *self.replica.lock().unwrap() = snapshot;
        }
        if r % 10 == 2 {
            return Err(ClientError::Indefinite("connection reset".into()));
        }
        Ok(out)
    }
}

impl KvClient for Store {
    async fn get(&self, key: &str) -> Result<Option<String>, ClientError> {
        self.run(true, |m| m.get(key).cloned()).await
    }
    async fn put(&self, key: &str, value: &str) -> Result<(), ClientError> {
        self.run(false, |m| {
            m.insert(key.into(), value.into());
        })
        .await
    }
    async fn cas(&self, key: &str, expect: Option<&str>, value: &str) -> Result<bool, ClientError> {
        self.run(false, |m| {
            let swap = m.get(key).map(String::as_str) == expect;
            if swap {
                m.insert(key.into(), value.into());
            }
            swap
        })
        .await
    }
    async fn delete(&self, key: &str) -> Result<(), ClientError> {
        self.run(false, |m| {
            m.remove(key);
        })
        .await
    }
}

fn config() -> WorkloadConfig {
    WorkloadConfig {
        keys: key_set("late-", 3),
        ops_per_client: 250,
        op_timeout: Duration::from_millis(50),
        seed: 5,
        // Reads, writes and swaps only: the shrinker's budget was sized on such histories.
        mix: OpMix {
            read: 2,
            write: 1,
            cas: 1,
            delete: 0,
            increment: 0,
        },
        ..WorkloadConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_unknowns_correct_store_is_linearizable() {
    let recorder = Recorder::new();
    let summary = run_workload(vec![Store::default(); 8], config(), recorder.clone())
        .await
        .unwrap();
    assert!(summary.unknown * 10 > summary.invoked, "{summary:?}");
    let verdict = check(&recorder.history()).unwrap();
    assert!(verdict.linearizable, "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn late_stale_reads_are_found_and_shrunk() {
    let store = Store {
        stale_after: Some(1200),
        ..Store::default()
    };
    let recorder = Recorder::new();
    run_workload(vec![store; 8], config(), recorder.clone())
        .await
        .unwrap();
    let started = Instant::now();
    let verdict = check(&recorder.history()).unwrap();
    assert!(verdict.is_violation(), "{verdict}");
    let c = verdict.counterexample.as_ref().unwrap();
    assert!(c.minimal && c.entries.len() <= 8, "{verdict}");
    assert!(c.violated_by_ns.is_some());
    assert!(started.elapsed() < Duration::from_secs(30), "{verdict}");
    eprintln!("{verdict}");
}
