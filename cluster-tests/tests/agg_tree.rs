//! Aggregation trees (ALEPH) end to end: three aggregating `yard` nodes (hosts 1-3) and eight
//! worker hosts (4-11, each with its node) on TBF links of mixed speeds, two workers at a
//! quarter of the others. The job is created with the default grouping (auto): it starts flat,
//! every worker's node measures its bandwidth to each aggregating host, and the leader regroups
//! the job into a tree mid-training (one Raft command, a new epoch); then a cluster
//! aggregator's node is killed and the job is regrouped on the survivors; then rank 0 joins
//! again from another host while the others are in a round without it. Every round of every
//! worker must be the exact int32 sum, summed once, throughout. Needs root.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use yard_agg::wire::Dtype;
use yard_cluster_tests::agg::{
    create_i32_job, grouped_options, join_job, membership, run_rank, show_job, sum_exact_i32,
    RankRun, Slot,
};
use yard_cluster_tests::require_root;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};

const AGGREGATORS: usize = 3;
const WORKERS: usize = 8;
/// 10^5 + 3 values: 278 chunks of 360 (MTU 1500), the last one short.
const VALUES: u32 = 100_003;
/// At most this many rounds: the test ends training three rounds after its last event (the
/// move), whenever that comes (a fixed count let a fast run finish before the tree formed).
const MAX_ROUNDS: u32 = 1000;
/// Rounds every phase runs at least before the next event.
const SETTLE_ROUNDS: u32 = 3;
/// Egress limits, Mbit/s: aggregating hosts, fast workers, the two slow ones.
const HOST_MBIT: u32 = 200;
const FAST_MBIT: u32 = 200;
const SLOW_MBIT: u32 = 50;

/// Every node can aggregate (the job stays off its workers' hosts); liveness relaxed for
/// eleven debug nodes on two cores; probes short and frequent so the test sees them.
fn options() -> ClusterOptions {
    grouped_options(Some(5_000))
}

fn show(cluster: &YardCluster, from: usize) -> Option<Value> {
    show_job(cluster, from, "tree")
}

/// The tree's aggregators: (root, cluster nodes).
fn tree_of(job: &Value) -> (u64, Vec<u64>) {
    let tree = job["tree"].as_array().cloned().unwrap_or_default();
    let root = tree
        .iter()
        .find(|s| s["role"] == "root")
        .and_then(|s| s["node"].as_u64())
        .unwrap_or(0);
    let clusters = tree
        .iter()
        .filter(|s| s["role"] == "cluster")
        .filter_map(|s| s["node"].as_u64())
        .collect();
    (root, clusters)
}

/// Whether each round a rank summed was exact, by round.
type Sums = Vec<(u32, bool)>;

#[test]
fn a_job_regroups_into_a_tree_mid_training_then_without_a_dead_host_and_for_a_moved_worker() {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let nodes = AGGREGATORS + WORKERS;
    let mut cluster = YardCluster::start(&bin, nodes, nodes, &options()).unwrap();
    for h in 1..=AGGREGATORS {
        cluster.topology().rate_limit(h, HOST_MBIT).unwrap();
    }
    for r in 0..WORKERS {
        let mbit = if r >= WORKERS - 2 {
            SLOW_MBIT
        } else {
            FAST_MBIT
        };
        cluster
            .topology()
            .rate_limit(AGGREGATORS + 1 + r, mbit)
            .unwrap();
    }
    create_i32_job(&cluster, 1, "tree", WORKERS, VALUES, None).unwrap();

    let shared: Vec<Slot> = (0..WORKERS).map(|_| Arc::new(Mutex::new(None))).collect();
    let progress: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(vec![0; WORKERS]));
    // Rank 0 leaves before this round, once the job has been regrouped without the dead node.
    let stop0 = Arc::new(AtomicU32::new(u32::MAX));
    // Everyone stops before this round, once the last event is a few rounds behind.
    let stop_all = Arc::new(AtomicU32::new(u32::MAX));
    let mut threads: Vec<Option<JoinHandle<Result<Sums, String>>>> = Vec::new();
    for (rank, slot) in shared.iter().enumerate() {
        let host = AGGREGATORS + 1 + rank;
        let addr = SocketAddrV4::new(cluster.topology().addr(host), 40000 + rank as u16);
        join_job(&cluster, host, "tree", rank, addr).unwrap();
        let mut run = RankRun::new(host, rank, addr, MAX_ROUNDS);
        run.retry_for = Duration::from_secs(90);
        run.stop = if rank == 0 {
            stop0.clone()
        } else {
            stop_all.clone()
        };
        threads.push(Some(run_rank(
            &cluster,
            run,
            slot.clone(),
            progress.clone(),
            sum_exact_i32(rank, WORKERS, VALUES),
        )));
    }

    // Follow the job: memberships to the workers; once it is a tree and every worker is past
    // a few rounds of it, kill a cluster aggregator's node.
    let mut tree: Option<(u64, Vec<u64>, u64)> = None;
    let mut killed: Option<u64> = None;
    let mut regrouped_after_kill: Option<(u64, Vec<u64>)> = None;
    let mut rounds_at_tree = 0;
    let mut rounds_at_regroup = 0;
    // Rank 0's move: the round it leaves before, the epoch it was last seen at, then the
    // epoch of its join from rank 1's host.
    let moved_host = AGGREGATORS + 2;
    let moved_addr = SocketAddrV4::new(cluster.topology().addr(moved_host), 40100);
    let mut leaving: Option<(u32, u32)> = None;
    let mut moved: Option<u32> = None;
    let mut before_move: Sums = Vec::new();
    let mut last_epoch = u64::MAX;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut end: Option<u32> = None;
    while end.is_none_or(|e| progress.lock().unwrap().iter().any(|p| *p < e)) {
        assert!(
            Instant::now() < deadline,
            "training did not finish: {:?}, tree {tree:?}, killed {killed:?}",
            progress.lock().unwrap()
        );
        let from = match killed {
            Some(1) => 2,
            _ => 1,
        };
        if let Some(job) = show(&cluster, from) {
            for (rank, s) in shared.iter().enumerate() {
                if let Some(m) = membership(&job, rank, Dtype::I32) {
                    *s.lock().unwrap() = Some(m);
                }
            }
            let (root, clusters) = tree_of(&job);
            let epoch = job["epoch"].as_u64().unwrap_or(0);
            if epoch != last_epoch {
                eprintln!(
                    "epoch {epoch}: tree {:?}, rounds {:?}",
                    tree_of(&job),
                    progress.lock().unwrap()
                );
                last_epoch = epoch;
            }
            let min_round = *progress.lock().unwrap().iter().min().unwrap();
            if tree.is_none() && !clusters.is_empty() {
                eprintln!("tree at epoch {epoch}: root {root}, clusters {clusters:?}:\n{job:#}");
                tree = Some((root, clusters.clone(), epoch));
                rounds_at_tree = min_round;
            }
            if let (Some((_, c, _)), None) = (&tree, killed) {
                if min_round >= rounds_at_tree + SETTLE_ROUNDS {
                    let victim = c[0];
                    eprintln!(
                        "killing node {victim}, a cluster aggregator (rounds {:?})",
                        progress.lock().unwrap()
                    );
                    cluster.kill9(victim as usize).unwrap();
                    killed = Some(victim);
                }
            }
            if let Some(dead) = killed {
                let all: Vec<u64> = std::iter::once(root)
                    .chain(clusters.iter().copied())
                    .collect();
                if root != 0 && !all.contains(&dead) && regrouped_after_kill.is_none() {
                    regrouped_after_kill = Some((root, clusters));
                    rounds_at_regroup = min_round;
                }
            }
            // Regrouped without the dead node and a few rounds on: rank 0 leaves before its
            // next round; the others go on into that round and wait in it for rank 0.
            if regrouped_after_kill.is_some()
                && leaving.is_none()
                && min_round >= rounds_at_regroup + SETTLE_ROUNDS
            {
                let at = progress.lock().unwrap()[0] + 1;
                stop0.store(at, Ordering::SeqCst);
                eprintln!("rank 0 leaves before round {at} (epoch {epoch})");
                leaving = Some((at, epoch as u32));
            }
            if let (Some((at, old_epoch)), None) = (leaving, moved) {
                let others_in_it = progress.lock().unwrap()[1..].iter().all(|p| *p >= at);
                if threads[0].as_ref().is_some_and(|t| t.is_finished()) && others_in_it {
                    // The others are in round `at`, waiting for rank 0: it joins again from
                    // another host (one command, a new epoch) and sums that round there.
                    let gone = threads[0].take().unwrap();
                    before_move = gone.join().unwrap().unwrap();
                    join_job(&cluster, moved_host, "tree", 0, moved_addr).unwrap();
                    eprintln!(
                        "rank 0 joined from host {moved_host} in round {at} (rounds {:?})",
                        progress.lock().unwrap()
                    );
                    let mut run = RankRun::new(moved_host, 0, moved_addr, MAX_ROUNDS);
                    (run.first, run.min_epoch) = (at, old_epoch + 1);
                    run.stop = stop_all.clone();
                    run.retry_for = Duration::from_secs(90);
                    threads[0] = Some(run_rank(
                        &cluster,
                        run,
                        shared[0].clone(),
                        progress.clone(),
                        sum_exact_i32(0, WORKERS, VALUES),
                    ));
                    moved = Some(at);
                }
            }
            // Three rounds after the move, everyone stops before the round after the fastest's.
            if let (Some(at), None) = (moved, end) {
                let p = progress.lock().unwrap().clone();
                if p.iter().min().is_some_and(|m| *m >= at + SETTLE_ROUNDS) {
                    let e = p.iter().max().unwrap() + 1;
                    stop_all.store(e, Ordering::SeqCst);
                    end = Some(e);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut results: Vec<Sums> = threads
        .into_iter()
        .map(|t| t.expect("every rank runs").join().unwrap().unwrap())
        .collect();
    results[0].splice(0..0, before_move);
    // Every rank summed every round once, exactly; rank 0 from two hosts.
    for (rank, r) in results.iter().enumerate() {
        let rounds: Vec<u32> = r.iter().map(|(round, _)| *round).collect();
        assert_eq!(rounds, (0..end.unwrap()).collect::<Vec<_>>(), "rank {rank}");
        for (round, ok) in r {
            assert!(ok, "rank {rank} round {round}: not the exact sum");
        }
    }
    let at = moved.expect("rank 0 never moved");
    assert!(at < end.unwrap());
    let (_, left_at_epoch) = leaving.unwrap();
    let (root, clusters, epoch) = tree.expect("the job was never grouped into a tree");
    assert!(
        (1..=AGGREGATORS as u64).contains(&root)
            && clusters
                .iter()
                .all(|c| (1..=AGGREGATORS as u64).contains(c)),
        "aggregators on worker hosts: root {root}, clusters {clusters:?}"
    );
    assert!(epoch > 0);
    let dead = killed.expect("a cluster aggregator was killed");
    let (root2, clusters2) =
        regrouped_after_kill.expect("the job was not regrouped without the dead node");
    assert!(root2 != dead && !clusters2.contains(&dead));
    // Every member's bandwidth was measured and is shown; the move took a new epoch.
    let job = show(&cluster, if dead == 1 { 2 } else { 1 }).unwrap();
    assert!(
        job["epoch"].as_u64().unwrap() > u64::from(left_at_epoch),
        "{job:#}"
    );
    let row0 = job["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["rank"] == 0)
        .unwrap();
    assert_eq!(
        row0["addr"],
        moved_addr.to_string(),
        "rank 0's row: {job:#}"
    );
    for m in job["members"].as_array().unwrap() {
        assert!(m["bandwidth_bytes_per_s"].as_u64().unwrap_or(0) > 0, "{m}");
    }
}
