//! The probe and analyzer end to end: real rank processes (`ring-rank`) doing a ring
//! all-reduce over TCP on three namespace hosts, each reporting to the `yard` node on its host,
//! the nodes counting the job's traffic per peer in eBPF and the leader's analyzer judging the
//! job. A healthy job gets no verdict; a frozen rank is named; a throttled link is named, and
//! no rank is blamed for it.
//!
//! The namespace test needs root and fails without it. The loopback test needs neither root
//! nor a node: a stand-in socket decodes what the ranks send.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use serde_json::Value;
use yard_cluster_tests::require_root;
use yard_cluster_tests::ring::{self, RingJob, RingOptions, RING_PORT};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_diagnosis::event::{Dir, Dtype, Op, Phase};
use yard_diagnosis::wire::{Decoder, Message};

fn ring_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ring-rank"))
}

/// Host `i` runs node `i` and rank `i − 1`.
const HOSTS: [usize; 3] = [1, 2, 3];

/// "Slow" is this many times the job's own baseline. Debug builds of three nodes and three
/// ranks share two cores here, and a busy moment can double a collective's time for a few
/// ops; the throttled link makes it many times slower.
const SLOW_FACTOR: f64 = 3.0;

/// Host 2's egress limit in the slow-link scenario: the ring's traffic through it takes
/// several times longer, and the nodes' own traffic still fits. At 20 mbit the slowdown was
/// too close to the baseline's noise on a loaded 2-core machine: this test failed (no verdict)
/// in 2 of 4 runs of its binary, at this commit's parent and at the last landed commit alike;
/// at 10 mbit it passed 5 of 5.
const THROTTLE_MBIT: u32 = 10;

#[test]
fn probe_diagnoses_a_ring_job_on_three_hosts() {
    require_root();
    let opts = ClusterOptions {
        extra_config: format!(
            "[probe]\ninterface = \"eth0\"\nports = [{RING_PORT}]\n\
             [analyzer]\nhang_floor_ms = 2000\nheartbeat_timeout_ms = 2000\nslow_factor = {SLOW_FACTOR:.1}\n"
        ),
        ..Default::default()
    };
    let c = YardCluster::start(&yard_cluster_tests::yard::test_yard_bin(), 3, 3, &opts).unwrap();

    healthy_job_gets_no_verdict(&c);
    throttled_link_is_named_and_no_rank_blamed(&c);
    frozen_rank_is_named(&c);

    for i in HOSTS {
        let accepted = c
            .metric(i, "yard_probe_events_total{what=\"accepted\"}")
            .unwrap();
        assert!(accepted > 0.0, "node {i} took no probe events");
    }
}

fn start_job(c: &YardCluster, job: &str) -> RingJob {
    // A quarter of the default buffer: less CPU per op for the debug-build ranks, so that
    // their timings show the network rather than the scheduler.
    let opts = RingOptions {
        bytes: 256 << 10,
        ..RingOptions::default()
    };
    RingJob::start(c, &ring_bin(), job, &HOSTS, &opts).unwrap()
}

/// ~8 s of steady all-reduces: the job is known, and not once is there a verdict.
fn healthy_job_gets_no_verdict(c: &YardCluster) {
    let job = start_job(c, "healthy");
    job.wait_done(1, Duration::from_secs(30)).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(8) {
        job.check_running().unwrap();
        if let Some(verdicts) = ring::diagnose(c, 1, job.job()).unwrap() {
            assert!(
                verdicts.is_empty(),
                "a healthy job got verdicts: {}",
                pretty(&verdicts)
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
    let verdicts = ring::diagnose(c, 1, job.job())
        .unwrap()
        .expect("the analyzer knows the healthy job");
    assert!(verdicts.is_empty(), "{}", pretty(&verdicts));
    let done = job.wait_done(50, Duration::from_secs(5)).unwrap();
    println!("healthy: no verdict over 8 s; progress {done:?}");
    job.stop().unwrap();
}

/// TBF on host 2's egress slows rank 1 -> rank 2 (and everything host 2 sends): the verdict
/// is a slow link through host 2, with no rank to blame.
fn throttled_link_is_named_and_no_rank_blamed(c: &YardCluster) {
    let job = start_job(c, "slowlink");
    // Baselines: the analyzer learns each op's and each pair's usual times first.
    let before = job.wait_done(40, Duration::from_secs(60)).unwrap();
    c.topo.rate_limit(2, THROTTLE_MBIT).unwrap();
    let (verdicts, took) = ring::wait_verdicts(c, 1, job.job(), Duration::from_secs(30), |v| {
        v.iter().any(|v| v["subtype"] == "slow_link")
    })
    .unwrap();
    let v = verdicts
        .iter()
        .find(|v| v["subtype"] == "slow_link")
        .cloned()
        .unwrap_or_default();
    let after = job.progress(0);
    println!(
        "slow link: verdict {:.1} s after TBF {THROTTLE_MBIT} mbit on host 2 (all-reduce {:.1} ms before, {:.1} ms after):\n{}",
        took.as_secs_f64(),
        before[0].mean_ms,
        after.map_or(0.0, |p| p.mean_ms),
        pretty(&verdicts)
    );
    assert_eq!(v["class"], "slow", "{v:#}");
    assert_eq!(
        v["culprits"],
        Value::Array(Vec::new()),
        "no rank is at fault: {v:#}"
    );
    let links = v["links"].as_array().cloned().unwrap_or_default();
    let through_host2 = |l: &Value| match l["kind"].as_str() {
        Some("pair") => l["from"] == 1 && l["to"] == 2,
        Some("nic") => l["from"] == 1 || l["name"].as_str().is_some_and(|n| n.starts_with("n2/")),
        _ => false,
    };
    assert!(
        links.iter().any(through_host2),
        "the links name neither rank 1 -> rank 2 nor host 2's NIC: {v:#}"
    );
    let evidence = v["evidence"].to_string();
    assert!(
        evidence.contains("counters"),
        "the verdict rests on no eBPF counter: {v:#}"
    );
    c.topo.clear_rate_limit(2).unwrap();
    job.stop().unwrap();
}

/// SIGSTOP of rank 1 mid-job: the top verdict is a hang whose only culprit is rank 1.
fn frozen_rank_is_named(c: &YardCluster) {
    let job = start_job(c, "hang");
    job.wait_done(20, Duration::from_secs(60)).unwrap();
    job.rank(1).stop().unwrap();
    let (verdicts, took) = ring::wait_verdicts(c, 1, job.job(), Duration::from_secs(15), |v| {
        v.first().is_some_and(|top| top["class"] == "hang")
    })
    .unwrap();
    let top = &verdicts[0];
    println!(
        "hang: verdict {:.1} s after SIGSTOP of rank 1:\n{}",
        took.as_secs_f64(),
        pretty(&verdicts)
    );
    assert_eq!(top["culprits"], serde_json::json!([1]), "{top:#}");
    assert!(
        top["subtype"] == "dead_process" || top["subtype"] == "missing_participant",
        "{top:#}"
    );
    job.rank(1).cont().unwrap();
    job.stop().unwrap();
}

fn pretty(verdicts: &[Value]) -> String {
    serde_json::to_string_pretty(verdicts).unwrap_or_default()
}

/// Children killed on drop, so a failing loopback test leaves no rank behind.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one connection to the stand-in node socket carried, in order.
type Stream = Arc<Mutex<Vec<Message>>>;

/// Accepts `n` connections on `path` and decodes each into its own message list; the
/// receiver gets one `()` per connection once its peer has closed it and every frame is read.
fn stand_in_node(path: &Path, n: usize) -> (Vec<Stream>, mpsc::Receiver<()>) {
    let listener = UnixListener::bind(path).unwrap();
    let streams: Vec<Stream> = (0..n).map(|_| Stream::default()).collect();
    let sinks = streams.clone();
    let (closed_tx, closed) = mpsc::channel();
    thread::spawn(move || {
        for sink in sinks {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let closed_tx = closed_tx.clone();
            thread::spawn(move || {
                let mut dec = Decoder::new();
                let mut buf = [0u8; 4096];
                while let Ok(k) = conn.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                    dec.feed(&buf[..k]);
                    while let Ok(Some(m)) = dec.next_message() {
                        sink.lock().unwrap().push(m);
                    }
                }
                let _ = closed_tx.send(());
            });
        }
    });
    (streams, closed)
}

fn ends(stream: &Stream) -> usize {
    stream
        .lock()
        .unwrap()
        .iter()
        .filter(|m| {
            matches!(
                m,
                Message::Coll {
                    phase: Phase::End,
                    ..
                }
            )
        })
        .count()
}

/// Three `ring-rank` processes on loopback: each says hello with its port and announces the
/// default group, reports enqueue/start/end of every all-reduce with per-peer progress to its
/// two neighbours, and on SIGTERM says goodbye and exits 0. Needs no root.
#[test]
fn ring_ranks_report_every_all_reduce_and_exit_cleanly_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("ring-rank-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("probe.sock");
    let _ = std::fs::remove_file(&sock);
    let (streams, closed) = stand_in_node(&sock, 3);
    let base = 30_000 + (std::process::id() % 20_000) as u16;
    let port = |r: u16| base + r;
    let peers: Vec<String> = (0..3).map(|r| format!("127.0.0.1:{}", port(r))).collect();
    let bytes: u64 = 3 * 4 * 1000;
    let mut ranks = Ranks(Vec::new());
    for r in 0..3u16 {
        let child = Command::new(ring_bin())
            .args(["--job", "loop", "--rank", &r.to_string(), "--world", "3"])
            .args([
                "--peers",
                &peers.join(","),
                "--listen",
                &peers[usize::from(r)],
            ])
            .arg("--socket")
            .arg(&sock)
            .args(["--bytes", &bytes.to_string(), "--compute-ms", "5"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        ranks.0.push(child);
    }
    let start = Instant::now();
    while !streams.iter().all(|s| ends(s) >= 5) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "ranks did not complete 5 all-reduces each"
        );
        thread::sleep(Duration::from_millis(20));
    }
    for child in &ranks.0 {
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        kill_process(pid, Signal::TERM).unwrap();
    }
    for (r, child) in ranks.0.iter_mut().enumerate() {
        let status = child.wait().unwrap();
        assert!(status.success(), "rank {r} exited with {status}");
    }
    for _ in 0..3 {
        closed
            .recv_timeout(Duration::from_secs(10))
            .expect("a rank's connection stayed open after it exited");
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Which connection is which rank: the HELLO says.
    let mut by_rank: Vec<Vec<Message>> = vec![Vec::new(); 3];
    for s in &streams {
        let msgs = s.lock().unwrap().clone();
        let Some(Message::Hello(h)) = msgs.first() else {
            panic!("a connection did not start with HELLO: {:?}", msgs.first());
        };
        assert_eq!((h.world_size, h.job.as_str()), (3, "loop"));
        assert_eq!(h.ports, vec![port(h.rank as u16)]);
        let rank = h.rank as usize;
        by_rank[rank] = msgs;
    }
    for (r, msgs) in by_rank.iter().enumerate() {
        let r = r as u32;
        assert!(
            matches!(&msgs[1], Message::Group { name, desc, ranks, .. }
                if name == "0" && desc == "default_pg" && ranks == &[0, 1, 2]),
            "rank {r}: {:?}",
            msgs[1]
        );
        assert!(
            matches!(msgs.last(), Some(Message::Exit { .. })),
            "rank {r} did not say goodbye: {:?}",
            msgs.last()
        );
        // Phases in order for every seq, and the final per-peer totals of each finished op.
        let mut phases: Vec<(u64, Phase)> = Vec::new();
        let mut sent = std::collections::BTreeMap::new();
        let mut received = std::collections::BTreeMap::new();
        for m in msgs {
            match m {
                Message::Coll {
                    seq,
                    op,
                    dtype,
                    phase,
                    count,
                    bytes: b,
                    peer,
                    ..
                } => {
                    assert_eq!(
                        (*op, *dtype, *count, *b, *peer),
                        (Op::AllReduce, Dtype::Float32, bytes / 4, bytes, None)
                    );
                    phases.push((*seq, *phase));
                }
                Message::Peer {
                    seq,
                    peer,
                    dir,
                    bytes: b,
                    ..
                } => match dir {
                    Dir::Send => {
                        assert_eq!(*peer, (r + 1) % 3, "rank {r} sends to its successor");
                        sent.insert(*seq, *b);
                    }
                    Dir::Recv => {
                        assert_eq!(*peer, (r + 2) % 3, "rank {r} receives from its predecessor");
                        received.insert(*seq, *b);
                    }
                },
                _ => {}
            }
        }
        let done: Vec<u64> = phases
            .iter()
            .filter(|p| p.1 == Phase::End)
            .map(|p| p.0)
            .collect();
        assert!(done.len() >= 5, "rank {r}: {phases:?}");
        for &seq in &done {
            let of: Vec<Phase> = phases.iter().filter(|p| p.0 == seq).map(|p| p.1).collect();
            assert_eq!(
                of,
                [Phase::Enqueue, Phase::Start, Phase::End],
                "rank {r} seq {seq}"
            );
            // 2(n−1) chunks of a third of the buffer each way.
            assert_eq!(sent[&seq], bytes * 4 / 3, "rank {r} seq {seq}");
            assert_eq!(received[&seq], bytes * 4 / 3, "rank {r} seq {seq}");
        }
        assert_eq!(
            done,
            (1..=done.len() as u64).collect::<Vec<_>>(),
            "rank {r}"
        );
    }
}
