//! The grouping's bandwidth figures follow a link that changes while a job runs, through the
//! aggregator's own counters: one aggregating `yard` node (host 1) and three worker hosts
//! (2-4, each with its node) on 200 Mbit/s TBF links sum int32 rounds of a `ps` job; once every
//! member's bandwidth is measured, one worker's link is cut to 40 Mbit/s mid-training. The
//! periodic probe is set to ten minutes, so only the aggregator's drift watch (its XDP
//! program's arrival timing, `yard_actors::aggregator::bandwidth::Drift`) can have that pair
//! measured again within the test; the new figure replaces the old one instead of entering the
//! average. Every round stays the exact sum throughout. Needs root.

use std::time::{Duration, Instant};

use serde_json::Value;
use yard_cluster_tests::agg::{create_i32_job, grouped_options, show_job, ExactRanks};
use yard_cluster_tests::require_root;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};

const WORKERS: usize = 3;
/// 10^5 + 3 values: 278 chunks of 360 (MTU 1500), the last one short.
const VALUES: u32 = 100_003;
const FAST_MBIT: u32 = 200;
const SLOWED_MBIT: u32 = 40;
/// The rank whose link is cut.
const SLOWED: usize = 2;
/// Training after every figure is measured and before the cut: two of the counters' 5 s
/// readings, so the aggregating host has a baseline for every pair.
const BASELINE_FOR: Duration = Duration::from_secs(12);

/// One aggregating node plus a node per worker host; probes of 1 MiB, repeated only every ten
/// minutes (longer than the test), so a figure that changes within the test was asked for by
/// the aggregator's counters.
fn options() -> ClusterOptions {
    grouped_options(Some(600_000))
}

/// Each member's measured bandwidth to its aggregator by rank, bytes/s (0: not measured).
fn figures(job: &Value) -> Vec<u64> {
    let members = job["members"].as_array().cloned().unwrap_or_default();
    (0..WORKERS)
        .map(|rank| {
            members
                .iter()
                .find(|m| m["rank"] == rank)
                .and_then(|m| m["bandwidth_bytes_per_s"].as_u64())
                .unwrap_or(0)
        })
        .collect()
}

#[test]
fn a_link_that_slows_mid_job_is_measured_again_at_its_aggregator_s_request() {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let nodes = 1 + WORKERS;
    let cluster = YardCluster::start(&bin, nodes, nodes, &options()).unwrap();
    for h in 2..=nodes {
        cluster.topology().rate_limit(h, FAST_MBIT).unwrap();
    }
    create_i32_job(&cluster, 1, "drift", WORKERS, VALUES, Some("ps")).unwrap();

    let ranks = ExactRanks::new("drift", WORKERS, VALUES, u32::MAX);
    let threads: Vec<_> = (0..WORKERS)
        .map(|rank| ranks.start(&cluster, 2 + rank, rank))
        .collect();

    // Follow the job until every figure is measured, train on for the baselines, cut the link,
    // and wait for the slowed pair's figure to follow it.
    let began = Instant::now();
    let deadline = began + Duration::from_secs(180);
    let mut measured: Option<(Instant, Vec<u64>)> = None;
    let mut cut: Option<Instant> = None;
    let mut followed: Option<(Duration, Vec<u64>)> = None;
    while followed.is_none() {
        assert!(
            Instant::now() < deadline,
            "the slowed link's figure never followed it: measured {measured:?}, cut {:?} \
             after the start, rounds {:?}",
            cut.map(|c| c - began),
            ranks.finished()
        );
        std::thread::sleep(Duration::from_millis(200));
        let Some(job) = show_job(&cluster, 1, "drift") else {
            continue;
        };
        ranks.follow(&job);
        let now = figures(&job);
        match (&measured, cut) {
            (None, _) if now.iter().all(|f| *f > 0) => {
                eprintln!("measured: {now:?} bytes/s, rounds {:?}", ranks.finished());
                measured = Some((Instant::now(), now));
            }
            (Some((at, _)), None) if at.elapsed() >= BASELINE_FOR => {
                cluster
                    .topology()
                    .rate_limit(2 + SLOWED, SLOWED_MBIT)
                    .unwrap();
                eprintln!(
                    "rank {SLOWED}'s link cut to {SLOWED_MBIT} Mbit/s, rounds {:?}",
                    ranks.finished()
                );
                cut = Some(Instant::now());
            }
            (Some((_, before)), Some(c)) if now[SLOWED] < before[SLOWED] / 2 => {
                eprintln!(
                    "followed {:?} after the cut: {now:?} bytes/s, rounds {:?}",
                    c.elapsed(),
                    ranks.finished()
                );
                followed = Some((c.elapsed(), now));
            }
            _ => {}
        }
    }
    // Every rank summed every round once, exactly.
    ranks.finish(threads).unwrap();

    let (_, before) = measured.unwrap();
    let (took, after) = followed.unwrap();
    // Well inside the probe's ten-minute period: the counters asked for it.
    assert!(took < Duration::from_secs(60), "{took:?}");
    // The new figure is the slowed link's (40 Mbit/s = 5 MB/s), not an average with the old
    // one, which would have kept 3/4 of 25 MB/s. The probe shares the link with the job's own
    // frames, so it gets what they leave: at most the link, and
    // more than a tenth of it (1.6-2.6 MB/s in the first three runs).
    let link = u64::from(SLOWED_MBIT) * 1_000_000 / 8;
    assert!(
        after[SLOWED] <= link * 13 / 10 && after[SLOWED] >= link / 10,
        "rank {SLOWED}: {} bytes/s for a {link} bytes/s link",
        after[SLOWED]
    );
    // The others' links did not change, and neither did their figures beyond a probe's noise.
    for rank in (0..WORKERS).filter(|r| *r != SLOWED) {
        assert!(
            after[rank] >= before[rank] / 2,
            "rank {rank}: {} bytes/s, measured {} before",
            after[rank],
            before[rank]
        );
    }
}
