//! The aggregator end to end: three `yard` nodes that aggregate in XDP (hosts 1-3) and four
//! worker hosts (4-7) summing int32 and float32 gradients through the Rust worker client, round
//! after round, every result checked against the exact sum (float32: within the fixed-point
//! bound) and bit for bit across workers; then the aggregating host's node is killed
//! mid-training and the job moves to a survivor in one Raft command (a new epoch), the round in
//! flight completes there, and the sums stay exact and identical. Needs root.

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use yard_agg::wire::Dtype;
use yard_agg::worker::{AggError, Membership, Tuning, Worker};
use yard_cluster_tests::agg::{
    exact_i32, gradient_i32, join_job, membership, run_rank, show_job, RankRun, Slot,
};
use yard_cluster_tests::require_root;
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};

const NODES: usize = 3;
const WORKERS: usize = 4;
/// 10^5 + 3 values: 278 chunks of 360 (MTU 1500), the last one short.
const VALUES: u32 = 100_003;
const ROUNDS: u32 = 12;

fn options() -> ClusterOptions {
    ClusterOptions {
        extra_config: yard_cluster_tests::yard::aggregator_config(32),
        ..Default::default()
    }
}

/// Worker `rank`'s float32 gradient in `round`: each worker at its own scale, so chunks'
/// exponents differ and the aggregator re-scales (the order-dependent part of a float sum).
fn gradient_f32(rank: usize, round: u32) -> Vec<f32> {
    (0..VALUES)
        .map(|i| {
            let x = ((i as i64 * 7919 + rank as i64 * 31 + i64::from(round)) % 2001 - 1000) as f32;
            x * 1e-3 * 2f32.powi(rank as i32 * 3 - 4)
        })
        .collect()
}

fn json(out: &std::process::Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not JSON ({e})"))
}

/// A worker on `socket` once `shared` holds its membership (the test's poller fills it from
/// `yard agg job show`), with a short give-up so a moved aggregator is noticed fast.
fn worker_when_running(
    socket: UdpSocket,
    shared: &Mutex<Option<Membership>>,
) -> Result<Worker, String> {
    let began = Instant::now();
    let first = loop {
        if let Some(m) = *shared.lock().unwrap() {
            break m;
        }
        if began.elapsed() > Duration::from_secs(30) {
            return Err("the job never ran".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let tuning = Tuning {
        give_up: Duration::from_millis(700),
        ..Tuning::default()
    };
    Ok(Worker::new(socket, first, tuning))
}

fn show(cluster: &YardCluster, from: usize) -> Option<Value> {
    show_job(cluster, from, "train")
}

#[test]
fn workers_sum_exactly_through_xdp_and_survive_the_aggregator_s_death() {
    failover(Dtype::I32);
}

#[test]
fn float_sums_stay_identical_on_every_worker_across_the_aggregator_s_death() {
    failover(Dtype::F32);
}

/// One round's result as bits: int32 values, or float32 values' bit patterns.
fn round_bits(rank: usize, round: u32, w: &mut Worker, dtype: Dtype) -> Result<Vec<u32>, AggError> {
    match dtype {
        Dtype::I32 => {
            let mut g = gradient_i32(rank, round, VALUES);
            w.all_reduce_i32(&mut g)?;
            Ok(g.into_iter().map(|v| v as u32).collect())
        }
        Dtype::F32 => {
            let mut g = gradient_f32(rank, round);
            w.all_reduce_f32(&mut g)?;
            Ok(g.into_iter().map(f32::to_bits).collect())
        }
    }
}

/// Checks round `round` of every worker: int32 the exact sum; float32 the same bits on every
/// worker and, chunk by chunk, within the fixed-point bound of the exact sum.
fn check_round(results: &[Vec<Vec<u32>>], round: u32, dtype: Dtype, chunk_values: usize) {
    match dtype {
        Dtype::I32 => {
            let want: Vec<u32> = exact_i32(WORKERS, round, VALUES)
                .into_iter()
                .map(|v| v as u32)
                .collect();
            for (rank, r) in results.iter().enumerate() {
                assert!(
                    r[round as usize] == want,
                    "rank {rank} round {round}: not the exact sum"
                );
            }
        }
        Dtype::F32 => {
            for (rank, r) in results.iter().enumerate() {
                assert!(
                    r[round as usize] == results[0][round as usize],
                    "rank {rank} round {round}: not the bits rank 0 has"
                );
            }
            let inputs: Vec<Vec<f32>> = (0..WORKERS).map(|w| gradient_f32(w, round)).collect();
            let n = WORKERS as u16;
            for (c, got) in results[0][round as usize].chunks(chunk_values).enumerate() {
                let start = c * chunk_values;
                let exp = inputs
                    .iter()
                    .map(|x| yard_agg::fixed::block_exp(&x[start..start + got.len()]))
                    .max()
                    .unwrap();
                let bound = yard_agg::fixed::error_bound(n, exp);
                for (j, bits) in got.iter().enumerate() {
                    let got = f32::from_bits(*bits);
                    let exact: f64 = inputs.iter().map(|x| f64::from(x[start + j])).sum();
                    let slack = bound + f64::from(got.abs()) * f64::from(f32::EPSILON);
                    assert!(
                        (f64::from(got) - exact).abs() <= slack,
                        "round {round} element {}: {got} against {exact}",
                        start + j
                    );
                }
            }
        }
    }
}

fn failover(dtype: Dtype) {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let mut cluster = YardCluster::start(&bin, NODES, NODES + WORKERS, &options()).unwrap();
    let created = cluster
        .cli(
            1,
            &[
                "agg",
                "job",
                "create",
                "train",
                "--grouping",
                "flat",
                "--workers",
                "4",
                "--size",
                &(u64::from(VALUES) * 4).to_string(),
                "--dtype",
                dtype.name(),
                "--json",
            ],
        )
        .unwrap();
    json(&created, "yard agg job create");
    // A bad request is refused in one sentence, and changes nothing. (Asked again while the
    // young cluster has no leader for a moment: that refusal is about availability, not the job.)
    let began = Instant::now();
    let why = loop {
        let refused = cluster
            .cli(
                1,
                &[
                    "agg",
                    "job",
                    "create",
                    "train",
                    "--grouping",
                    "flat",
                    "--workers",
                    "4",
                    "--size",
                    "400",
                ],
            )
            .unwrap();
        assert!(!refused.status.success());
        let why = String::from_utf8_lossy(&refused.stderr).into_owned();
        if !why.contains("no leader answered") || began.elapsed() > Duration::from_secs(15) {
            break why;
        }
    };
    assert!(why.contains("job train exists already"), "{why}");

    let shared: Vec<Slot> = (0..WORKERS).map(|_| Arc::new(Mutex::new(None))).collect();
    let progress: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(vec![0; WORKERS]));
    let mut threads = Vec::new();
    for (rank, slot) in shared.iter().enumerate() {
        let host = NODES + 1 + rank;
        let addr = SocketAddrV4::new(cluster.topology().addr(host), 40000 + rank as u16);
        join_job(&cluster, host, "train", rank, addr).unwrap();
        threads.push(run_rank(
            &cluster,
            RankRun::new(host, rank, addr, ROUNDS),
            slot.clone(),
            progress.clone(),
            move |w, round| round_bits(rank, round, w, dtype),
        ));
    }

    // Refresh every worker's membership from the cluster until they are done; kill the
    // aggregator's node once every worker is past round 4.
    let mut killed: Option<(usize, u32)> = None;
    let deadline = Instant::now() + Duration::from_secs(240);
    while progress.lock().unwrap().iter().any(|p| *p < ROUNDS) {
        assert!(
            Instant::now() < deadline,
            "training did not finish: {:?}",
            progress.lock().unwrap()
        );
        let from = killed.map_or(1, |(n, _)| if n == 1 { 2 } else { 1 });
        if let Some(job) = show(&cluster, from) {
            for (rank, s) in shared.iter().enumerate() {
                if let Some(m) = membership(&job, rank, dtype) {
                    *s.lock().unwrap() = Some(m);
                }
            }
            let min_round = *progress.lock().unwrap().iter().min().unwrap();
            if killed.is_none() && min_round >= 4 {
                let node = job["aggregator_node"].as_u64().unwrap() as usize;
                let epoch = job["epoch"].as_u64().unwrap() as u32;
                eprintln!(
                    "killing node {node}, the aggregator, at epoch {epoch} (rounds {:?})",
                    progress.lock().unwrap()
                );
                cluster.kill9(node).unwrap();
                killed = Some((node, epoch));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let results: Vec<Vec<Vec<u32>>> = threads
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap()
                .unwrap()
                .into_iter()
                .map(|(_, g)| g)
                .collect()
        })
        .collect();
    for round in 0..ROUNDS {
        check_round(&results, round, dtype, 360);
    }
    // The job moved in one command: a survivor aggregates it at a later epoch.
    let (dead, epoch) = killed.expect("the aggregator was killed");
    let job = show(&cluster, if dead == 1 { 2 } else { 1 }).unwrap();
    let now = job["aggregator_node"].as_u64().unwrap() as usize;
    assert_ne!(now, dead);
    assert!(job["epoch"].as_u64().unwrap() as u32 > epoch);
    let stats = json(
        &cluster.cli(now, &["agg", "stats", "--json"]).unwrap(),
        "yard agg stats",
    );
    let counters = &stats["jobs"][0]["counters"];
    assert!(counters["completed"]["packets"].as_u64().unwrap() > 0);
    assert_eq!(counters["foreign"]["packets"].as_u64().unwrap_or(0), 0);
}

/// Sums `rounds` rounds as `rank` of `job` through node 1's agent, following the membership
/// the session pushes; `die_after`: drop the session without leaving after that many rounds
/// (what a crashed worker's closed socket looks like to its node). Returns each round's sum.
fn agent_worker(
    socket: std::path::PathBuf,
    job: &'static str,
    rank: usize,
    addr: SocketAddrV4,
    rounds: u32,
    die_after: Option<u32>,
) -> Result<Vec<Vec<i32>>, String> {
    use yard_agg::session::{JobState, Session};
    let sock = UdpSocket::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    let session = Session::join(&socket, job, rank as u16, addr).map_err(|e| e.to_string())?;
    let m = session
        .wait_running(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let tuning = Tuning {
        give_up: Duration::from_millis(700),
        ..Tuning::default()
    };
    let mut w = Worker::new(sock, m, tuning);
    let mut out = Vec::new();
    for round in 0..rounds {
        if die_after == Some(round) {
            drop(session);
            return Ok(out);
        }
        let started = Instant::now();
        loop {
            let mut g = small_gradient(rank, round);
            match w.all_reduce_i32(&mut g) {
                Ok(_) => {
                    out.push(g);
                    break;
                }
                Err(AggError::Timeout { .. }) if started.elapsed() < Duration::from_secs(30) => {
                    match session.state() {
                        JobState::Running(m) => w.set_membership(m),
                        JobState::Failed(why) | JobState::Closed(why) => return Err(why),
                        JobState::Waiting => {}
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    session.leave().map_err(|e| e.to_string())?;
    Ok(out)
}

const SMALL: u32 = 10_000;

fn small_gradient(rank: usize, round: u32) -> Vec<i32> {
    (0..SMALL)
        .map(|i| (i as i32).wrapping_mul(31) ^ (rank as i32 * 1000 + round as i32))
        .collect()
}

fn small_sum(ranks: &[usize], round: u32) -> Vec<i32> {
    let mut s = vec![0i32; SMALL as usize];
    for &r in ranks {
        for (a, b) in s.iter_mut().zip(small_gradient(r, round)) {
            *a = a.wrapping_add(b);
        }
    }
    s
}

#[test]
fn a_worker_that_dies_fails_its_job_and_an_elastic_job_goes_on_without_it() {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let cluster = YardCluster::start(&bin, NODES, NODES, &options()).unwrap();
    let size = (u64::from(SMALL) * 4).to_string();
    for (job, elastic) in [("strict", false), ("elastic", true)] {
        let mut args = vec![
            "agg",
            "job",
            "create",
            job,
            "--grouping",
            "flat",
            "--workers",
            "3",
            "--size",
            &size,
            "--dtype",
            "i32",
        ];
        if elastic {
            args.push("--elastic");
        }
        json(
            &cluster.cli(1, &[&args[..], &["--json"]].concat()).unwrap(),
            "yard agg job create",
        );
    }
    // The workers run on node 1's host and join through its agent, which takes only this
    // host's addresses (so node 1 sums neither job: it runs their workers).
    let socket = cluster.agg_socket(1);
    let mut threads = Vec::new();
    for (j, job) in ["strict", "elastic"].into_iter().enumerate() {
        for rank in 0..3 {
            let host = 1;
            let addr = SocketAddrV4::new(
                cluster.topology().addr(host),
                41000 + (j * 10 + rank) as u16,
            );
            let socket = socket.clone();
            let die = (rank == 2).then_some(2);
            threads.push((
                job,
                rank,
                cluster
                    .topology()
                    .thread_in_host(host, move || agent_worker(socket, job, rank, addr, 5, die))
                    .unwrap(),
            ));
        }
    }
    for (job, rank, t) in threads {
        let result = t.join().unwrap();
        match (job, rank) {
            (_, 2) => assert_eq!(
                result.unwrap().len(),
                2,
                "rank 2 summed two rounds, then died"
            ),
            ("strict", _) => {
                let why = result.expect_err("a strict job must fail when a worker dies");
                assert!(
                    why.contains("worker rank 2 died") && why.contains("without a goodbye"),
                    "rank {rank}: {why}"
                );
            }
            _ => {
                let sums = result.unwrap_or_else(|e| panic!("elastic rank {rank}: {e}"));
                assert_eq!(sums.len(), 5);
                for (round, s) in sums.iter().enumerate() {
                    let round = round as u32;
                    let want = if round < 2 {
                        small_sum(&[0, 1, 2], round)
                    } else {
                        small_sum(&[0, 1], round)
                    };
                    assert!(
                        *s == want,
                        "elastic rank {rank} round {round}: not the exact sum"
                    );
                }
            }
        }
    }
    let shown = json(
        &cluster
            .cli(1, &["agg", "job", "show", "strict", "--json"])
            .unwrap(),
        "show",
    );
    assert!(shown["failed"]
        .as_str()
        .unwrap()
        .contains("worker rank 2 died"));
    let shown = json(
        &cluster
            .cli(1, &["agg", "job", "show", "elastic", "--json"])
            .unwrap(),
        "show",
    );
    assert_eq!(shown["gone"], serde_json::json!([2]));
    assert_eq!(shown["running"], true);
}

/// Two jobs at once, 10% loss on every host's egress (the TC loss program: contributions lost
/// on the workers' links, results on the aggregators', whose fan-out passes TC egress), and a
/// worker of one job forging frames into the other job (its job id, epoch, a worker index, a
/// chunk of the right length) from its own registered address: both jobs' sums stay exact, the
/// forged frames are dropped and counted as foreign by the other job's aggregator.
#[test]
fn two_jobs_sum_exactly_under_loss_both_ways_and_forged_frames_are_dropped() {
    use std::collections::BTreeMap;
    use yard_agg::wire::{Header, Kind};
    require_root();
    const JOBS: [&str; 2] = ["blue", "green"];
    const ROUNDS: u32 = 8;
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let cluster = YardCluster::start(&bin, NODES, NODES + 4, &options()).unwrap();
    let size = (u64::from(SMALL) * 4).to_string();
    for job in JOBS {
        json(
            &cluster
                .cli(
                    1,
                    &[
                        "agg",
                        "job",
                        "create",
                        job,
                        "--grouping",
                        "flat",
                        "--workers",
                        "2",
                        "--size",
                        &size,
                        "--dtype",
                        "i32",
                        "--json",
                    ],
                )
                .unwrap(),
            "yard agg job create",
        );
    }
    for h in 1..=NODES + 4 {
        cluster.topology().loss(h, 10.0).unwrap();
    }
    // Job j's rank r runs on host NODES + 1 + 2j + r, with gradient "rank" 10j + r.
    type Shared = Arc<Mutex<Option<Membership>>>;
    let shared: BTreeMap<(usize, usize), Shared> = (0..2)
        .flat_map(|j| (0..2).map(move |r| ((j, r), Arc::new(Mutex::new(None)))))
        .collect();
    let mut threads = Vec::new();
    for ((j, rank), mine) in &shared {
        let (j, rank) = (*j, *rank);
        let host = NODES + 1 + 2 * j + rank;
        let addr = SocketAddrV4::new(
            cluster.topology().addr(host),
            43000 + (10 * j + rank) as u16,
        );
        join_job(&cluster, host, JOBS[j], rank, addr).unwrap();
        let mine = mine.clone();
        // Blue's rank 0 forges into green, as green's worker 0.
        let victim = (j == 0 && rank == 0).then(|| shared[&(1, 0)].clone());
        threads.push(
            cluster
                .topology()
                .thread_in_host(
                    host,
                    move || -> Result<(Vec<Vec<i32>>, u64, u64), String> {
                        let socket =
                            UdpSocket::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
                        let forger = socket.try_clone().map_err(|e| e.to_string())?;
                        let mut w = worker_when_running(socket, &mine)?;
                        let (mut out, mut resent, mut forged) = (Vec::new(), 0, 0);
                        for round in 0..ROUNDS {
                            let started = Instant::now();
                            loop {
                                let mut g = small_gradient(10 * j + rank, round);
                                match w.all_reduce_i32(&mut g) {
                                    Ok(stats) => {
                                        resent += stats.resent;
                                        out.push(g);
                                        break;
                                    }
                                    Err(AggError::Timeout { .. })
                                        if started.elapsed() < Duration::from_secs(60) =>
                                    {
                                        if let Some(m) = *mine.lock().unwrap() {
                                            w.set_membership(m);
                                        }
                                    }
                                    Err(e) => return Err(format!("{j}/{rank} round {round}: {e}")),
                                }
                            }
                            let Some(v) = victim.as_ref().and_then(|v| *v.lock().unwrap()) else {
                                continue;
                            };
                            for chunk in 0..5u32 {
                                let len = v.geometry.chunk_len(chunk);
                                let frame = yard_agg::wire::encode(
                                    &Header {
                                        kind: Kind::Data,
                                        flags: 0,
                                        exp: 0,
                                        job: v.job,
                                        epoch: v.epoch,
                                        round,
                                        chunk,
                                        worker: 0,
                                        count: 0,
                                        contributors: 0,
                                        token: 0, // it has no token of the other job
                                    },
                                    &vec![1; len],
                                );
                                forger
                                    .send_to(&frame, v.aggregator)
                                    .map_err(|e| e.to_string())?;
                                forged += 1;
                            }
                        }
                        Ok((out, resent, forged))
                    },
                )
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while !threads.iter().all(|t| t.is_finished()) {
        assert!(Instant::now() < deadline, "the two jobs did not finish");
        for (j, job) in JOBS.iter().enumerate() {
            if let Some(v) = show_job(&cluster, 1, job) {
                for r in 0..2 {
                    if let Some(m) = membership(&v, r, Dtype::I32) {
                        *shared[&(j, r)].lock().unwrap() = Some(m);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut resent, mut forged) = (0, 0);
    for (((j, rank), _), t) in shared.iter().zip(threads) {
        let (sums, r, f) = t
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("job {j} rank {rank}: {e}"));
        resent += r;
        forged += f;
        for (round, s) in sums.iter().enumerate() {
            assert!(
                *s == small_sum(&[10 * j, 10 * j + 1], round as u32),
                "job {} rank {rank} round {round}: not the exact sum",
                JOBS[*j]
            );
        }
    }
    assert!(resent > 0, "10% loss both ways made no worker resend");
    // Blue's rank 0 forges from the first round it knows green's membership in.
    assert!(forged > 0, "no frame was forged");
    // Every node's own count (over all its jobs: only forged frames are foreign here): 10% loss
    // both ways makes the liveness probes miss now and then, and green may have moved between
    // aggregators meanwhile; a job's own counters leave with it.
    // `yard agg stats` answers from the counters a node last read (every `stats_ms`, 1 s): a
    // short run can end before the aggregator's next read, so wait for it.
    let began = Instant::now();
    let (stats, foreign) = loop {
        let stats: Vec<Value> = (1..=NODES)
            .map(|node| {
                json(
                    &cluster.cli(node, &["agg", "stats", "--json"]).unwrap(),
                    "yard agg stats",
                )
            })
            .collect();
        let foreign: u64 = stats
            .iter()
            .map(|s| s["counters"]["foreign"]["packets"].as_u64().unwrap_or(0))
            .sum();
        if foreign > 0 || began.elapsed() > Duration::from_secs(3) {
            break (stats, foreign);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Some forged frames are lost on the way, as any frame is; every one that arrived was
    // dropped as foreign (green's sums are exact).
    assert!(
        foreign > 0 && foreign <= forged,
        "green's aggregator counted {foreign} foreign frames of {forged} forged; nodes' counters: {:#}",
        Value::Array(stats.iter().map(|s| s["counters"].clone()).collect())
    );
}

/// A node restarted with `[aggregator] enabled = false` deregisters its host: afterwards a job
/// whose workers run on the other two aggregating hosts (so only node 3 could sum it) waits,
/// naming those two, instead of being placed on node 3, which is reachable again but runs no
/// aggregator. Before the fix nothing deregistered a host and the job went to node 3.
#[test]
fn a_node_restarted_with_its_aggregator_disabled_is_no_longer_placeable() {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    let mut cluster = YardCluster::start(&bin, NODES, NODES, &options()).unwrap();
    cluster
        .wait_voters(1, NODES, Duration::from_secs(30))
        .unwrap();
    cluster.kill9(3).unwrap();
    cluster
        .reconfigure(3, "[aggregator]\nenabled = false\n")
        .unwrap();
    cluster.restart(3).unwrap();
    cluster
        .wait_voters(1, NODES, Duration::from_secs(60))
        .unwrap();
    let size = (u64::from(SMALL) * 4).to_string();
    let create = [
        "agg",
        "job",
        "create",
        "only3",
        "--grouping",
        "flat",
        "--workers",
        "2",
        "--size",
        &size,
        "--dtype",
        "i32",
        "--json",
    ];
    json(&cluster.cli(1, &create).unwrap(), "yard agg job create");
    for (rank, host) in [(0usize, 1usize), (1, 2)] {
        let addr = SocketAddrV4::new(cluster.topology().addr(host), 42000);
        join_job(&cluster, host, "only3", rank, addr).unwrap();
    }
    let want = "no aggregator can take it: node 1 runs a worker, node 2 runs a worker";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let job = show_job(&cluster, 1, "only3");
        let waiting = job
            .as_ref()
            .and_then(|j| j["waiting"].as_str().map(str::to_owned));
        if waiting.as_deref() == Some(want) {
            assert_eq!(job.unwrap()["running"], false);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job was not left waiting for want of a host: {job:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An aggregating host that is an agent (no vote, so the leader's liveness probes do not watch
/// it) is killed: the leader commits it dead (`HostLiveness`), and that commit, the one decision
/// on such a host, moves the job to the other agent host in one command (epoch + 1). Before,
/// the placement read only the probes' view, and the job stayed on the dead host for ever.
#[test]
fn a_job_on_an_agent_host_moves_when_the_leader_commits_the_host_dead() {
    require_root();
    let bin = yard_cluster_tests::yard::test_yard_bin();
    // Three voters, no replicas: hosts 4 and 5 are agents, the only ones the job may use
    // (its three workers are on the voters' hosts).
    let opts = ClusterOptions {
        extra_config: format!(
            "{}[raft]\nvoters = 3\nreplicas = 0\n",
            yard_cluster_tests::yard::aggregator_config(32)
        ),
        ..Default::default()
    };
    let mut cluster = YardCluster::start(&bin, 5, 5, &opts).unwrap();
    cluster.wait_hosts(1, 5, Duration::from_secs(60)).unwrap();
    let size = (u64::from(SMALL) * 4).to_string();
    let create = [
        "agg",
        "job",
        "create",
        "on-agent",
        "--grouping",
        "flat",
        "--workers",
        "3",
        "--size",
        &size,
        "--dtype",
        "i32",
        "--json",
    ];
    json(&cluster.cli(1, &create).unwrap(), "yard agg job create");
    for host in 1..=3usize {
        let addr = SocketAddrV4::new(cluster.topology().addr(host), 42000);
        join_job(&cluster, host, "on-agent", host - 1, addr).unwrap();
    }
    let placed = |cluster: &YardCluster| {
        show_job(cluster, 1, "on-agent").and_then(|j| {
            let node = j["aggregator_node"].as_u64()?;
            (j["running"] == true).then_some((node, j["epoch"].as_u64()?))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (first, epoch) = loop {
        if let Some(p) = placed(&cluster) {
            break p;
        }
        assert!(Instant::now() < deadline, "the job was never placed");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        first == 4 || first == 5,
        "placed on node {first}, a worker's host"
    );
    cluster.kill9(first as usize).unwrap();
    let killed = Instant::now();
    let other = 9 - first;
    loop {
        let now = placed(&cluster);
        if now == Some((other, epoch + 1)) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "the job did not move off dead agent host {first} to {other} in one command: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "the job moved off agent host {first} to {other} (epoch {}) {:.1} s after the kill",
        epoch + 1,
        killed.elapsed().as_secs_f64()
    );
}
