//! Real daemons in network namespaces: three voters and twenty agents (release daemons; needs
//! root). A recorded workload writes and reads only through agents while the leader is killed
//! with -9 (an agent is made a replica and then a voter in its place, one change at a time),
//! an agent is partitioned away and heals, and another stops reading (SIGSTOP) and resumes.
//! The history must be linearizable, every counter increment applied once, and every agent's
//! tables must reach the leader's index.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest};
use yard_chaos::workload::counter_key;
use yard_chaos::yard_client::YardKv;
use yard_chaos::{check, key_set, run_workload, OpMix, Recorder, WorkloadConfig};
use yard_cluster_tests::require_root;
use yard_cluster_tests::yard::{test_yard_bin, ClusterOptions, YardCluster};
use yard_cluster_tests::Topology;

const VOTERS: usize = 3;
const AGENTS: usize = 20;
const HOSTS: usize = VOTERS + AGENTS;
const CLIENT_HOST: usize = HOSTS + 1;

/// `yard members --json` through host `via`.
fn members(c: &YardCluster, via: usize) -> Option<Value> {
    let out = c
        .cli(via, &["members", "--json", "--timeout-ms", "3000"])
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn roles(view: &Value) -> Vec<(u64, String, bool)> {
    view["hosts"]
        .as_array()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h["id"].as_u64().unwrap_or(0),
                        h["role"].as_str().unwrap_or("").to_owned(),
                        h["alive"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `yard members` through `via` until `ok` holds, for at most `within`.
fn wait_members(
    c: &YardCluster,
    via: usize,
    within: Duration,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        if let Some(v) = members(c, via) {
            if ok(&v) {
                return v;
            }
            assert!(start.elapsed() < within, "{what} within {within:?}: {v}");
        } else {
            assert!(
                start.elapsed() < within,
                "{what}: yard members never answered"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until host `i`'s tables stand at or past `index` (its metrics).
fn wait_applied(c: &YardCluster, i: usize, index: f64, within: Duration) {
    let start = Instant::now();
    loop {
        let at = c.metric(i, "yard_tables_applied_index").unwrap_or(0.0);
        if at >= index {
            return;
        }
        assert!(
            start.elapsed() < within,
            "host {i}'s tables at {at}, not {index}, after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn client(endpoints: &[String], tls: &Path) -> AdminClient {
    AdminClient::new(endpoints, tls, "yard", Duration::from_secs(3)).unwrap()
}

#[test]
fn three_voters_and_twenty_agents_survive_a_leader_kill_a_partition_and_a_stopped_agent() {
    require_root();
    let opts = ClusterOptions {
        // No standby replica: replacing a lost voter must go through an agent.
        extra_config: "[raft]\nreplicas = 0\nvoter_grace_ms = 2000\n".into(),
        ..Default::default()
    };
    let topo = Topology::new(CLIENT_HOST).unwrap();
    let mut c = YardCluster::start_on(topo, &test_yard_bin(), HOSTS, &opts).unwrap();
    let view = wait_members(
        &c,
        HOSTS,
        Duration::from_secs(20),
        "3 voters and 20 live agents",
        |v| {
            let r = roles(v);
            r.iter().filter(|h| h.1 == "voter").count() == VOTERS
                && r.iter().filter(|h| h.1 == "agent" && h.2).count() == AGENTS
        },
    );
    let leader = view["leader"].as_u64().unwrap() as usize;
    assert!(leader <= VOTERS, "{view}");

    // The workload talks to agents only, each client in its own order.
    let agent_endpoints: Vec<String> = (VOTERS + 1..=HOSTS).map(|i| c.endpoint(i)).collect();
    let tls = c.tls_dir().to_owned();
    let recorder = Recorder::new();
    let workload = WorkloadConfig {
        keys: key_set("agents", 4),
        ops_per_client: 400,
        max_duration: Duration::from_secs(45),
        op_timeout: Duration::from_secs(3),
        seed: 24,
        mix: OpMix::default(),
    };
    let clients = 4;
    let counter_keys: Vec<String> = (0..clients)
        .map(|k| counter_key(&workload.keys, k))
        .collect();
    let (rec, eps, t) = (recorder.clone(), agent_endpoints.clone(), tls.clone());
    let worker = c
        .topo
        .thread_in_host(CLIENT_HOST, move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let kv: Vec<YardKv> = (0..clients)
                    .map(|k| {
                        let mut order = eps.clone();
                        order.rotate_left(k * 5);
                        YardKv::new(client(&order, &t), Duration::from_millis(30))
                    })
                    .collect();
                run_workload(kv, workload, rec).await.unwrap()
            })
        })
        .unwrap();

    // kill -9 of the leader: a new one is elected among the two voters left, an agent becomes
    // a replica and then a voter, and the lost voter leaves the voter set.
    std::thread::sleep(Duration::from_secs(3));
    c.kill9(leader).unwrap();
    let killed = Instant::now();
    let view = wait_members(
        &c,
        HOSTS,
        Duration::from_secs(30),
        "an agent promoted in the dead voter's place",
        |v| {
            let r = roles(v);
            let voters: Vec<u64> = r.iter().filter(|h| h.1 == "voter").map(|h| h.0).collect();
            voters.len() == VOTERS
                && !voters.contains(&(leader as u64))
                && voters.iter().any(|v| *v as usize > VOTERS)
                && r.iter().filter(|h| h.1 == "voter").all(|h| h.2)
        },
    );
    println!(
        "agents: voter replaced {:?} after the leader's kill: {view}",
        killed.elapsed()
    );

    // An agent partitioned from every host for 4 s is committed dead, comes back alive and
    // resumes from its own index.
    let cut = HOSTS - 1;
    let others: Vec<usize> = (1..=CLIENT_HOST).filter(|h| *h != cut).collect();
    c.topology().partition(&[&[cut][..], &others[..]]).unwrap();
    wait_members(
        &c,
        HOSTS,
        Duration::from_secs(10),
        "the partitioned agent committed dead",
        |v| roles(v).iter().any(|h| h.0 == cut as u64 && !h.2),
    );
    std::thread::sleep(Duration::from_secs(2));
    c.topology().heal().unwrap();

    // An agent that stops reading holds nothing at its member; it resumes when it reads again.
    let stopped = HOSTS;
    c.process(stopped).unwrap().stop().unwrap();
    wait_members(
        &c,
        HOSTS - 1,
        Duration::from_secs(10),
        "the stopped agent committed dead",
        |v| roles(v).iter().any(|h| h.0 == stopped as u64 && !h.2),
    );
    std::thread::sleep(Duration::from_secs(2));
    c.process(stopped).unwrap().cont().unwrap();

    let summary = worker.join().unwrap();
    assert!(summary.ok > 100, "{summary:?}");
    let history = recorder.history();
    let verdict = check(&history).unwrap();
    assert!(
        !verdict.is_violation(),
        "not linearizable on {:?}: {:?}",
        verdict.violating_keys,
        verdict.counterexample
    );
    // Every acknowledged increment applied exactly once, read through an agent.
    let finals = c
        .topo
        .thread_in_host(CLIENT_HOST, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let cl = client(&agent_endpoints, &tls);
                let mut out = Vec::new();
                for key in counter_keys {
                    match cl.admin(AdminRequest::KvGet { key }).await.unwrap() {
                        AdminReply::Value(v) => out.push(v.map(|e| e.value)),
                        other => panic!("unexpected {other:?}"),
                    }
                }
                out
            })
        })
        .unwrap()
        .join()
        .unwrap();
    for (report, value) in summary.counters.iter().zip(&finals) {
        report.check(value.as_deref()).unwrap();
    }

    // Both faulted agents are alive again and every live host's tables reach the leader's.
    let view = wait_members(
        &c,
        1 + VOTERS,
        Duration::from_secs(15),
        "every live agent alive again",
        |v| {
            roles(v)
                .iter()
                .filter(|h| h.0 != leader as u64)
                .all(|h| h.2)
        },
    );
    let new_leader = view["leader"].as_u64().unwrap() as usize;
    let index = c.metric(new_leader, "yard_tables_applied_index").unwrap();
    for i in (1..=HOSTS).filter(|i| *i != leader) {
        wait_applied(&c, i, index, Duration::from_secs(15));
    }
}
