//! A job larger than one aggregator sums (its contribution bitmap holds 64 workers) runs as a
//! tree: three aggregating `yard` nodes (hosts 1-3) and four worker hosts (4-7, each with its
//! node) running 20 workers each, 80 in all, of one `auto` job. Until its workers' nodes have
//! measured their bandwidth the job waits (it has no flat arrangement, and says so); then the
//! leader places a tree whose every aggregator sums at most 64 members, and every worker sums
//! every round exactly once, the exact int32 sum of all 80. Needs root.

use std::time::{Duration, Instant};

use serde_json::Value;
use yard_cluster_tests::agg::{create_i32_job, grouped_options, show_job, ExactRanks};
use yard_cluster_tests::require_root;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};

const AGGREGATORS: usize = 3;
const WORKER_HOSTS: usize = 4;
const PER_HOST: usize = 20;
const WORKERS: usize = WORKER_HOSTS * PER_HOST;
/// 2,003 values: six chunks of 360, the last one short.
const VALUES: u32 = 2_003;
const ROUNDS: u32 = 10;

fn options() -> ClusterOptions {
    grouped_options(None)
}

/// How many members each of the job's aggregators sums: (node, its ranks plus, at the root,
/// its clusters).
fn loads(job: &Value) -> Vec<(u64, usize)> {
    let tree = job["tree"].as_array().cloned().unwrap_or_default();
    let clusters = tree.iter().filter(|s| s["role"] == "cluster").count();
    tree.iter()
        .map(|s| {
            let ranks = s["ranks"].as_array().map_or(0, Vec::len);
            let extra = if s["role"] == "root" { clusters } else { 0 };
            (s["node"].as_u64().unwrap_or(0), ranks + extra)
        })
        .collect()
}

#[test]
fn a_job_of_80_workers_waits_for_its_tree_then_sums_exactly_through_it() {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let nodes = AGGREGATORS + WORKER_HOSTS;
    let cluster = YardCluster::start(&bin, nodes, nodes, &options()).unwrap();
    create_i32_job(&cluster, 1, "wide", WORKERS, VALUES, None).unwrap();

    let ranks = ExactRanks::new("wide", WORKERS, VALUES, ROUNDS);
    let threads: Vec<_> = (0..WORKERS)
        .map(|rank| ranks.start(&cluster, AGGREGATORS + 1 + rank / PER_HOST, rank))
        .collect();

    // Follow the job: what it waits for until it runs, then its memberships to the workers.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut waited: Option<String> = None;
    let mut trees: Vec<Vec<(u64, usize)>> = Vec::new();
    while ranks.finished().iter().any(|p| *p < ROUNDS) {
        assert!(
            Instant::now() < deadline,
            "training did not finish: waited {waited:?}, trees {trees:?}, rounds {:?}",
            ranks.finished()
        );
        std::thread::sleep(Duration::from_millis(200));
        let Some(job) = show_job(&cluster, 1, "wide") else {
            continue;
        };
        if job["running"] != true {
            if let Some(why) = job["waiting"].as_str() {
                waited.get_or_insert_with(|| why.to_owned());
            }
            continue;
        }
        let now = loads(&job);
        if trees.last() != Some(&now) {
            eprintln!(
                "epoch {}: aggregators (node, members) {now:?}",
                job["epoch"]
            );
            trees.push(now);
        }
        ranks.follow(&job);
    }
    // Every rank summed every round once, exactly.
    assert_eq!(ranks.finish(threads), Ok(ROUNDS));

    // It never ran flat: every arrangement was a tree of aggregators of at most 64 members
    // each, on the aggregating hosts.
    assert!(!trees.is_empty());
    for t in &trees {
        assert!(t.len() >= 2, "not a tree: {t:?}");
        for (node, members) in t {
            assert!(*members <= 64, "node {node} sums {members}: {trees:?}");
            assert!((1..=AGGREGATORS as u64).contains(node), "{trees:?}");
        }
    }
    if let Some(why) = &waited {
        eprintln!("waited: {why}");
    }
}
