//! `chaos`: a seeded fault schedule against a real `yard` cluster in network namespaces, with a
//! concurrent KV workload recorded and checked for linearizability, and the XDP gateway on every
//! node carrying probe streams between overlay tenants on two compute hosts (never faulted), or,
//! with `--no-gateway --aggregation`, the XDP aggregators summing an int32 job's rounds for six
//! workers on worker hosts of their own (never faulted), every round checked exact and completed
//! once; by default the job is grouped into a tree (ALEPH) and regrouped by the faults. With
//! `--agents K`, K agent hosts join after the voters, the KV clients use them too, and every
//! fault of the schedule also takes a random subset of them; with the gateway they are gateway
//! nodes that own VIPs, and the voters stay fixed (no autopilot) so that every step still faults
//! a strict minority of them.
//!
//! Prints the seed, every fault it injected, each fault's gateway verdicts (one data-plane owner
//! per VIP at every instant; a down owner's VIPs moved within the budget; the probe streams'
//! loss windows closed within it), the KV verdict and the final state (one owner per VIP,
//! balanced, the probes flowing without loss), then `chaos: N passed, M failed`; exits non-zero
//! on any violation.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use yard::client::AdminClient;
use yard::rpc::{AdminReply, AdminRequest, Grouping};
use yard_chaos::agg_monitor::{aggregator_config, AggRun};
use yard_chaos::aggregation::judge;
use yard_chaos::gateway::{
    answering_mismatches, balanced, check_ownership, converged_at, gaps_in, largest_gap,
    lost_within, owned_before, owned_by_any, owner_changes, phase_of, reassignment, unanswered,
    LossGap, Ms, NodeId, Outage, Overlap, OwnershipViolation,
};
use yard_chaos::gateway_monitor::{
    add_tenants, cli_json, gateway_config, pool, vip_neighbours, wait_vips, Health, Monitor,
    Observed, ProbePair, RunClock,
};
use yard_chaos::history::{FailReason, History, Outcome};
use yard_chaos::workload::counter_key;
use yard_chaos::yard_client::YardKv;
use yard_chaos::{
    check, generate, inject, key_set, run_workload, stall_within, FaultKind, OpMix, Recorder,
    ScheduleConfig, WorkloadConfig,
};
use yard_cluster_tests::probe::{ProbeOptions, ProbeReport, ProbeStream};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::Topology;

#[derive(Debug, Parser)]
struct Args {
    /// The yard binary to run on the hosts.
    #[arg(long, default_value = "target/release/yard")]
    yard_bin: PathBuf,
    /// Length of the schedule in seconds (at most 600).
    #[arg(long, default_value_t = 240)]
    seconds: u64,
    /// Seed of the schedule and the workload; random (and printed) when absent.
    #[arg(long)]
    seed: Option<u64>,
    /// Cluster size (3 or more): the voters, the hosts a strict minority of is faulted.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Agent hosts beside the voters (their nodes join after them and hold no vote; the KV
    /// clients use them as well as the voters). Each fault of the schedule also takes a
    /// random subset of them. With the gateway, every agent is a gateway node too: its lease is
    /// granted by the voters, it owns VIPs, and the VIP checks follow it as they follow voters.
    #[arg(long, default_value_t = 0)]
    agents: usize,
    /// Concurrent workload clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Keys the workload contends on.
    #[arg(long, default_value_t = 8)]
    keys: usize,
    /// Pause before each client operation, in milliseconds (bounds the history's size).
    #[arg(long, default_value_t = 10)]
    pace_ms: u64,
    /// Run without the gateway (the KV workload and linearizability check only).
    #[arg(long)]
    no_gateway: bool,
    /// Run an aggregation job (int32, six workers on three worker hosts, each with a node of
    /// its own) through the nodes' XDP aggregators and judge its rounds; needs --no-gateway (both
    /// attach XDP to eth0).
    #[arg(long)]
    aggregation: bool,
    /// The aggregation job's grouping: `auto` (the default) waits for the leader to group it
    /// into a tree before the schedule starts, and checks it ran as one; `flat` sums on one
    /// aggregator.
    #[arg(long, default_value = "auto", value_parser = parse_agg_grouping)]
    agg_grouping: Grouping,
    /// VIPs in the gateway's pool (198.19.255.1 on).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u8).range(2..=200))]
    vips: u8,
    /// Datagrams per second of each probe stream.
    #[arg(long, default_value_t = 500)]
    probe_pps: u32,
    /// How long a VIP may stay with a down owner or none, and a probe loss window may last, ms.
    #[arg(long, default_value_t = 3000)]
    budget_ms: u64,
    /// How often the gateway pollers ask, ms.
    #[arg(long, default_value_t = 250)]
    poll_ms: u64,
    /// How many times a VIP may change owner within one phase (a fault and the calm after
    /// it): away from the faulted owner and back, for at most two lapses (a flapping owner's
    /// hold-down quadruples with each lapse, so a third return does not fit in a phase).
    #[arg(long, default_value_t = 4)]
    max_owner_changes: u32,
    /// How soon after the last fault heals every VIP must be answered by its owner, ms.
    #[arg(long, default_value_t = 5000)]
    converge_ms: u64,
    /// The nodes' longest ownership hold-down (`gateway.holddown_max_ms`), ms. A node that
    /// flapped in the schedule's last fault receives VIPs again only after it, so the final
    /// balance check waits this long plus 15 s: a schedule of many faults in a few minutes
    /// holds a node down to the cap, and the default cap (60 s) would make the run a minute
    /// longer. Between the first hold-down (3 s) and one hour, as the node's config requires.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(3_000..=3_600_000))]
    holddown_max_ms: u64,
    /// The fault kinds to draw from, by their short names (comma-separated, e.g.
    /// `kill-9,stall,ctl-loss-30%`); the CI list when absent. The same seed and kinds give the
    /// same schedule, so an old run is reproduced with the kinds it had.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    kinds: Option<Vec<FaultKind>>,
    /// Print the schedule and exit (no cluster is started).
    #[arg(long)]
    dry_run: bool,
}

/// A grouping the aggregation run can judge: `auto` or `flat`.
fn parse_agg_grouping(s: &str) -> Result<Grouping, String> {
    match Grouping::parse(s)? {
        g @ (Grouping::Auto | Grouping::Flat) => Ok(g),
        g => Err(format!(
            "the chaos run takes --agg-grouping auto or flat, not {}",
            g.name()
        )),
    }
}

/// A fault kind from its short name (`FaultKind`'s `Display`).
fn parse_kind(s: &str) -> Result<FaultKind, String> {
    let pct = |rest: &str| -> Result<u8, String> {
        rest.strip_suffix('%')
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("bad percentage in fault kind {s}"))
    };
    Ok(match s {
        "kill-9" => FaultKind::Kill9,
        "pause" => FaultKind::Pause,
        "link-down" => FaultKind::LinkDown,
        "partition" => FaultKind::Partition,
        "ctl-oneway" => FaultKind::ControlOneway,
        "stall" => FaultKind::Stall,
        "kill-9+stall" => FaultKind::Kill9Stall,
        "link-down+stall" => FaultKind::LinkDownStall,
        _ => {
            if let Some(rest) = s.strip_prefix("ctl-loss-") {
                FaultKind::ControlLoss { pct: pct(rest)? }
            } else if let Some(rest) = s.strip_prefix("loss-") {
                FaultKind::Loss { pct: pct(rest)? }
            } else {
                return Err(format!("unknown fault kind {s}"));
            }
        }
    })
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Named pass/fail verdicts; the last line counts them.
#[derive(Default)]
/// Named verdicts; a failed one may carry why, repeated at the end of the output (CI shows only
/// its tail).
struct Checks(Vec<(String, bool, Option<String>)>);

impl Checks {
    fn add(&mut self, name: impl Into<String>, ok: bool) -> bool {
        self.0.push((name.into(), ok, None));
        ok
    }
    /// A verdict with the reason it failed, if it did.
    fn add_why(&mut self, name: impl Into<String>, outcome: Result<(), String>) -> bool {
        let ok = outcome.is_ok();
        self.0.push((name.into(), ok, outcome.err()));
        ok
    }
    fn passed(&self) -> usize {
        self.0.iter().filter(|c| c.1).count()
    }
    fn failed(&self) -> usize {
        self.0.len() - self.passed()
    }
}

/// A fault as it was injected, on the run clock.
#[derive(Debug, Clone)]
struct Injected {
    kind: FaultKind,
    /// Yard nodes (= topology hosts), 1-based.
    nodes: Vec<usize>,
    injected: Ms,
    healed: Ms,
}

impl Injected {
    /// Whether the fault takes its nodes down, from the cluster's point of view.
    fn is_outage(&self) -> bool {
        !matches!(
            self.kind,
            FaultKind::Loss { .. } | FaultKind::ControlLoss { .. }
        )
    }
}

/// The gateway's part of the run while the schedule runs.
struct GatewayRun {
    vips: Vec<Ipv4Addr>,
    pairs: Vec<ProbePair>,
    streams: Vec<ProbeStream>,
    monitor: Monitor,
}

fn secs(ms: Ms) -> f64 {
    ms as f64 / 1e3
}

fn run(args: Args) -> anyhow::Result<bool> {
    yard_cluster_tests::check_root()?;
    if args.seconds > 600 {
        bail!("--seconds must be at most 600");
    }
    let bin = args
        .yard_bin
        .canonicalize()
        .with_context(|| format!("yard binary {} not found", args.yard_bin.display()))?;
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let total = Duration::from_secs(args.seconds);
    let kinds = args.kinds.clone().unwrap_or_else(FaultKind::every);
    // Only the yard nodes are scheduled: the client and compute hosts are never faulted.
    let mut config = ScheduleConfig::new(seed, args.hosts, total, kinds);
    config.agents = args.agents;
    config.min_fault = Duration::from_secs(3);
    config.max_fault = Duration::from_secs(15);
    config.min_gap = Duration::from_secs(3);
    config.max_gap = Duration::from_secs(8);
    let mut schedule = generate(&config)?;
    println!("chaos: seed {seed} (rerun with --seed {seed})");
    print!("{schedule}");
    if args.dry_run {
        return Ok(true);
    }

    let n = args.hosts;
    let gateway = !args.no_gateway;
    if gateway && args.aggregation {
        bail!("--aggregation needs --no-gateway: the aggregator and the gateway would both attach XDP to eth0");
    }
    let agents = args.agents;
    // Hosts 1..=n: the voters the schedule faults; n+1..=n+agents the agents it faults too;
    // with --aggregation, the aggregation workers' hosts, each with a node too (never
    // faulted); then the KV clients' and VIP-table poller's host; then, with the gateway, two
    // compute hosts with overlay tenants.
    let worker_hosts: Vec<usize> = if args.aggregation {
        (n + agents + 1..=n + agents + AGG_WORKER_HOSTS).collect()
    } else {
        Vec::new()
    };
    let nodes_total = n + agents + worker_hosts.len();
    // Rank r's host (none without --aggregation).
    let rank_hosts: Vec<usize> = if worker_hosts.is_empty() {
        Vec::new()
    } else {
        (0..AGG_WORKERS)
            .map(|r| worker_hosts[r % worker_hosts.len()])
            .collect()
    };
    let client_host = nodes_total + 1;
    let topo = Topology::new(if gateway {
        client_host + 2
    } else {
        client_host
    })?;
    let extra_config = if gateway {
        let mut config = gateway_config(&topo, n + agents, args.holddown_max_ms)?;
        if agents > 0 {
            // The agents are gateway nodes only: were one promoted in a faulted voter's place,
            // a later step's "strict minority of hosts 1..=n" could take a majority of the
            // voters and every lease with it (the autopilot under faults is the KV run's).
            config.push_str(FIXED_VOTERS_CONFIG);
        }
        config
    } else if args.aggregation {
        aggregator_config()
    } else if agents > 0 {
        // Voters and agents only: the autopilot may replace a voter faulted for longer than
        // its grace with an agent.
        "[raft]\nreplicas = 0\n".to_owned()
    } else {
        String::new()
    };
    // In the aggregation run the agents aggregate nothing (the job's grouping stays a matter
    // of the voters' rate-limited links) and never replace a voter, as the worker hosts.
    let host_config = if args.aggregation {
        (n + 1..=n + agents)
            .map(|h| (h, FIXED_VOTERS_CONFIG.to_owned()))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut cluster = YardCluster::start_on(
        topo,
        &bin,
        nodes_total,
        &ClusterOptions {
            extra_config,
            host_config,
            ..Default::default()
        },
    )?;
    if args.aggregation {
        // The aggregating hosts' links at AGG_MBIT both ways, so bandwidth decides the
        // grouping: one aggregator's link carries all six workers' chunks, a tree splits them
        // (the worker hosts' links are left fast: each carries two workers).
        for h in 1..=n {
            cluster.topology().rate_limit(h, AGG_MBIT)?;
            cluster.topology().rate_limit_toward(h, AGG_MBIT)?;
        }
    }
    // Every daemon the schedule faults: the voters and the agents (with the gateway, each one
    // a gateway node).
    let nodes: Vec<NodeId> = (1..=(n + agents) as NodeId).collect();
    let budget = args.budget_ms as Ms;
    let health = Health::new(nodes.len());
    let gw = if gateway {
        Some(setup_gateway(&cluster, &args, total, &nodes)?)
    } else {
        None
    };
    // The run clock's 0 is the schedule's start.
    let clock = RunClock::start();
    let gw = match gw {
        Some((vips, pairs, streams)) => {
            let monitor = Monitor::start(
                &cluster,
                nodes.len(),
                client_host,
                health.clone(),
                clock,
                Duration::from_millis(args.poll_ms),
                total + Duration::from_secs(300),
            )?;
            Some(GatewayRun {
                vips,
                pairs,
                streams,
                monitor,
            })
        }
        None => None,
    };
    let agg = if args.aggregation {
        let run = AggRun::start(
            &cluster,
            &rank_hosts,
            args.agg_grouping,
            clock,
            Duration::from_millis(200),
        )?;
        let began = Instant::now();
        while run.rounds_after(Ms::MIN) < 2 {
            if began.elapsed() > Duration::from_secs(30) {
                let (_, _, errors) = run.stop();
                bail!("the aggregation job summed no round before the schedule: {errors:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "chaos: aggregation job {} ({}) with {AGG_WORKERS} workers on hosts {worker_hosts:?} summing",
            yard_chaos::agg_monitor::JOB,
            args.agg_grouping.name()
        );
        if args.agg_grouping == Grouping::Auto {
            // The job starts flat; the leader groups it once every worker's node has measured
            // its bandwidths (a probe each at start).
            while run.placed().is_none_or(|p| p.clusters.is_empty()) {
                if began.elapsed() > Duration::from_secs(AGG_TREE_WAIT_S) {
                    let (_, placed, errors) = run.stop();
                    bail!(
                        "the aggregation job was not grouped into a tree within {AGG_TREE_WAIT_S} s (placements {placed:?}, worker errors {errors:?})"
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // The seeded schedule names host indices; aim it so that its first outage takes out
        // a node summing the job (which the leader places deterministically): a tree's first
        // cluster aggregator, so its first fault is a regrouping, or a flat job's aggregator.
        if let Some(p) = run.placed() {
            println!(
                "chaos: aggregation job summed at root node {} with cluster nodes {:?} (epoch {})",
                p.node, p.clusters, p.epoch
            );
            let node = p.clusters.first().copied().unwrap_or(p.node);
            let (aimed, k) = schedule.aimed_at(node as usize - 1);
            schedule = aimed;
            println!(
                "chaos: host indices shifted by {k} so the first outage hits node {node}, an aggregator:"
            );
            print!("{schedule}");
        }
        Some(run)
    } else {
        None
    };

    // Through agents as well as voters: an agent forwards writes and serves linearizable reads
    // at the leader's read index.
    let endpoints: Vec<String> = (1..=n + agents).map(|i| cluster.endpoint(i)).collect();
    let tls = cluster.tls_dir().to_owned();
    let recorder = Recorder::new();
    let workload = WorkloadConfig {
        keys: key_set(&format!("chaos{seed}-"), args.keys),
        ops_per_client: usize::MAX,
        max_duration: total,
        op_timeout: Duration::from_secs(3),
        seed,
        mix: OpMix::default(),
    };
    let counter_keys: Vec<String> = (0..args.clients)
        .map(|c| counter_key(&workload.keys, c))
        .collect();
    let (clients, pace) = (args.clients, Duration::from_millis(args.pace_ms));
    let rec = recorder.clone();
    let (read_endpoints, read_tls) = (endpoints.clone(), tls.clone());
    let worker = cluster
        .topo
        .thread_in_host(client_host, move || -> anyhow::Result<_> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let mut kv = Vec::new();
                for c in 0..clients {
                    // Each client tries the nodes in its own order, so a dead node costs each one a
                    // different amount.
                    let mut order = endpoints.clone();
                    order.rotate_left(c % endpoints.len());
                    kv.push(YardKv::new(
                        AdminClient::new(&order, &tls, "yard", Duration::from_secs(2))?,
                        pace,
                    ));
                }
                Ok(run_workload(kv, workload, rec).await?)
            })
        })?;

    // The schedule starts now: the aggregation job's setup (grouping it into a tree) may have
    // taken a while since the run clock started.
    let start = if args.aggregation {
        Instant::now()
    } else {
        clock.origin()
    };
    let mut faults = Vec::new();
    for step in &schedule.steps {
        sleep_until(start + step.start);
        let targets: Vec<usize> = step.fault.targets.iter().map(|i| i + 1).collect();
        // Marked first, so no poller asks a node that is about to be killed or paused.
        health.set(&targets, Some(step.fault.kind));
        inject::begin(&mut cluster, &step.fault)
            .with_context(|| format!("cannot inject {:?}", step.fault))?;
        let injected = clock.now();
        println!(
            "chaos: t={:>6.1}s inject {:?} on host index {:?} for {:.1}s",
            secs(injected),
            step.fault.kind,
            step.fault.targets,
            step.duration.as_secs_f64()
        );
        // A stall inside the fault: every daemon stopped together for a while.
        let mut stalled = None;
        if let Some((offset, len)) = stall_within(step) {
            sleep_until(start + step.start + offset);
            let others: Vec<usize> = nodes
                .iter()
                .map(|n| *n as usize)
                .filter(|n| !targets.contains(n))
                .collect();
            health.set(&others, Some(FaultKind::Stall));
            let from = clock.now();
            println!(
                "chaos: t={:>6.1}s stall every daemon for {:.1}s",
                secs(from),
                len.as_secs_f64()
            );
            inject::stall(&cluster, len).context("cannot stall the daemons")?;
            let to = clock.now();
            health.set(&others, None);
            println!("chaos: t={:>6.1}s stall over", secs(to));
            stalled = Some(Injected {
                kind: FaultKind::Stall,
                nodes: nodes.iter().map(|n| *n as usize).collect(),
                injected: from,
                healed: to,
            });
        }
        sleep_until(start + step.start + step.duration);
        let healed = clock.now();
        inject::end(&mut cluster, &step.fault)
            .with_context(|| format!("cannot end {:?}", step.fault))?;
        health.set(&targets, None);
        println!(
            "chaos: t={:>6.1}s healed {:?} on {:?}",
            secs(clock.now()),
            step.fault.kind,
            step.fault.targets
        );
        faults.push(Injected {
            kind: step.fault.kind,
            nodes: targets,
            injected,
            healed,
        });
        faults.extend(stalled);
    }
    let summary = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the workload thread panicked"))??;
    println!(
        "chaos: workload {} ops: {} ok, {} failed, {} unknown in {:.1}s",
        summary.invoked,
        summary.ok,
        summary.failed,
        summary.unknown,
        summary.elapsed.as_secs_f64()
    );

    // Invariant: with every fault healed the cluster converges to every host reachable.
    let converged = cluster.wait_hosts(1, nodes_total, Duration::from_secs(30));
    let history = recorder.history();
    let offset_ms = clock.at(recorder.origin());
    for line in failures_by_fault(&history, offset_ms, &faults) {
        println!("chaos: {line}");
    }
    let verdict = check(&history)?;
    println!(
        "chaos: faults injected {}; keys checked {}; operations checked {}",
        faults.len(),
        verdict.keys_checked,
        verdict.ops_checked
    );
    for k in &verdict.inconclusive {
        println!(
            "chaos: key {} inconclusive after {} states ({} ops)",
            k.key, k.states_explored, k.ops
        );
    }
    let mut checks = Checks::default();
    if !checks.add("kv linearizable", !verdict.is_violation()) {
        println!(
            "chaos: verdict NOT LINEARIZABLE on {:?}",
            verdict.violating_keys
        );
        if let Some(cx) = &verdict.counterexample {
            println!("{cx}");
        }
    } else {
        println!("chaos: verdict linearizable");
    }
    match converged {
        Ok(_) => {
            checks.add("cluster converged", true);
            println!("chaos: cluster converged: {nodes_total} hosts reachable");
        }
        Err(e) => {
            checks.add("cluster converged", false);
            println!("chaos: cluster did not converge after the schedule: {e}");
        }
    }
    if !checks.add("kv workload made progress", summary.ok > 0) {
        println!("chaos: no operation succeeded; the run proves nothing");
    }
    // Invariant: every increment of each client's counter applied exactly once.
    let finals = cluster
        .topo
        .thread_in_host(
            client_host,
            move || -> anyhow::Result<Vec<Option<String>>> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let client = AdminClient::new(
                        &read_endpoints,
                        &read_tls,
                        "yard",
                        Duration::from_secs(5),
                    )?;
                    let mut values = Vec::new();
                    for key in counter_keys {
                        match client.admin(AdminRequest::KvGet { key }).await? {
                            AdminReply::Value(v) => values.push(v.map(|e| e.value)),
                            other => bail!("unexpected reply {other:?}"),
                        }
                    }
                    Ok(values)
                })
            },
        )?
        .join()
        .map_err(|_| anyhow::anyhow!("the counter reader panicked"))?
        .unwrap_or_else(|e| {
            println!("chaos: cannot read the counters back: {e:#}");
            Vec::new()
        });
    let acked: u64 = summary.counters.iter().map(|c| c.acked).sum();
    let wrong: Vec<String> = summary
        .counters
        .iter()
        .zip(&finals)
        .filter_map(|(c, v)| c.check(v.as_deref()).err())
        .collect();
    println!(
        "chaos: counters: {} increments acknowledged, {} of unknown outcome over {} clients",
        acked,
        summary.counters.iter().map(|c| c.unknown).sum::<u64>(),
        summary.counters.len()
    );
    for w in &wrong {
        println!("chaos: counter wrong: {w}");
    }
    checks.add(
        "every counter increment applied exactly once",
        wrong.is_empty() && acked > 0 && finals.len() == summary.counters.len(),
    );

    if let Some(gw) = gw {
        let ctx = Judge {
            nodes: &nodes,
            budget,
            clock,
            faults: &faults,
            poll: args.poll_ms as Ms,
            max_owner_changes: args.max_owner_changes,
            converge: args.converge_ms as Ms,
            settle: Duration::from_millis(2 * args.holddown_max_ms) + Duration::from_secs(15),
        };
        ctx.gateway_verdicts(&cluster, gw, &mut checks)?;
    }

    if let Some(run) = agg {
        agg_verdicts(run, args.agg_grouping, &faults, &mut checks);
    }

    for (name, _, why) in checks.0.iter().filter(|c| !c.1) {
        match why {
            Some(why) => println!("chaos: FAILED: {name}: {why}"),
            None => println!("chaos: FAILED: {name}"),
        }
    }
    println!("chaos: seed {seed} (rerun with --seed {seed})");
    let ok = checks.failed() == 0;
    println!(
        "chaos: {} passed, {} failed",
        checks.passed(),
        checks.failed()
    );
    Ok(ok)
}

/// Workers of the chaos aggregation job, over its worker hosts. Six: an aggregator's link
/// carries a gradient per member and one for its uplink, so a tree of three aggregators serves
/// six workers with at most four on a link (4/6 of one aggregator's round time), while three
/// workers it would serve no faster than one aggregator (the job would stay flat).
const AGG_WORKERS: usize = 6;
const AGG_WORKER_HOSTS: usize = 3;
/// The voters stay hosts `1..=n`: no replica is kept and no voter is replaced, so a schedule
/// step's strict minority of those hosts stays a strict minority of the voters.
const FIXED_VOTERS_CONFIG: &str = "[raft]\nreplicas = 0\nvoter_grace_ms = 3600000\n";
/// Egress limit of the aggregation run's hosts, Mbit/s.
const AGG_MBIT: u32 = 200;
/// How long an `auto` job may take to be grouped into a tree before the schedule, s.
const AGG_TREE_WAIT_S: u64 = 60;

/// Waits for the aggregation job to sum again after the last fault healed, stops it, and adds
/// its checks: every round exact and completed once, progress after the faults, and for an
/// `auto` job, rounds summed through a tree.
fn agg_verdicts(run: AggRun, grouping: Grouping, faults: &[Injected], checks: &mut Checks) {
    let healed = faults.iter().map(|f| f.healed).max().unwrap_or(0);
    let began = Instant::now();
    while run.rounds_after(healed) < 3 && began.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let workers = run.workers();
    let (done, placed, errors) = run.stop();
    let v = judge(&done, workers, healed);
    // Which faults hit a host summing the job when they began.
    let at = |t: Ms| placed.iter().take_while(|p| p.at_ms <= t).last();
    let hit = faults
        .iter()
        .filter(|f| {
            at(f.injected).is_some_and(|p| p.nodes().any(|n| f.nodes.contains(&(n as usize))))
        })
        .count();
    println!(
        "chaos: aggregation: {} rounds on every worker, epochs {:?}, aggregators (t, root, clusters) {:?}; {hit} of {} faults hit an aggregating node; last heal at t={:.1}s",
        v.rounds,
        v.epochs,
        placed
            .iter()
            .map(|p| (secs(p.at_ms), p.node, p.clusters.clone()))
            .collect::<Vec<_>>(),
        faults.len(),
        secs(healed),
    );
    for e in &errors {
        println!("chaos: aggregation worker error: {e}");
    }
    if !v.safe() {
        println!(
            "chaos: aggregation: inexact {:?}, out of order {:?}, conflicting chunk results {}",
            v.inexact, v.out_of_order, v.conflicting
        );
    }
    checks.add(
        "aggregation: every completed round exact and completed once",
        v.safe(),
    );
    if !v.live() {
        println!(
            "chaos: aggregation: workers {:?} summed nothing after the last heal",
            v.stuck
        );
    }
    checks.add(
        "aggregation: rounds complete after the faults healed",
        v.live() && errors.is_empty(),
    );
    if grouping == Grouping::Auto {
        // Epochs the job was a tree in, and rounds completed in them.
        let tree_epochs: Vec<u32> = placed
            .iter()
            .filter(|p| !p.clusters.is_empty())
            .map(|p| p.epoch)
            .collect();
        let in_tree = done
            .iter()
            .filter(|d| tree_epochs.contains(&d.epoch))
            .count();
        println!(
            "chaos: aggregation: {in_tree} worker rounds summed through a tree, in epochs {tree_epochs:?}"
        );
        checks.add(
            "aggregation: rounds summed through a tree of aggregators",
            in_tree > 0,
        );
    }
}

/// The workload's operations by the fault in force when each was invoked (`none`: between
/// faults): how many failed outright (refused, or of unknown outcome) under each kind.
fn failures_by_fault(history: &History, offset_ms: Ms, faults: &[Injected]) -> Vec<String> {
    let mut by_kind: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for e in &history.entries {
        let t = offset_ms + (e.invoke_ns / 1_000_000) as Ms;
        let kind = faults
            .iter()
            .find(|f| f.injected <= t && t < f.healed)
            .map_or_else(|| "none".to_string(), |f| f.kind.to_string());
        let row = by_kind.entry(kind).or_default();
        row.0 += 1;
        match e.outcome {
            Outcome::Fail(FailReason::NotApplied(_)) => row.1 += 1,
            Outcome::Unknown(_) => row.2 += 1,
            _ => {}
        }
    }
    let pct = |n: usize, of: usize| 100.0 * n as f64 / of.max(1) as f64;
    by_kind
        .into_iter()
        .map(|(kind, (n, failed, unknown))| {
            format!(
                "ops under {kind}: {n}, failed outright {} ({:.2}%: {failed} refused, {unknown} unknown)",
                failed + unknown,
                pct(failed + unknown, n)
            )
        })
        .collect()
}

/// VIP pool, placement, tenants and probe streams, up and flowing before the schedule starts.
fn setup_gateway(
    cluster: &YardCluster,
    args: &Args,
    total: Duration,
    nodes: &[NodeId],
) -> anyhow::Result<(Vec<Ipv4Addr>, Vec<ProbePair>, Vec<ProbeStream>)> {
    // The client host follows the nodes, the two compute hosts follow it.
    let n = nodes.len();
    let vips = pool(args.vips);
    let mut add = vec!["gateway".to_owned(), "vip".into(), "add".into()];
    add.extend(vips.iter().map(ToString::to_string));
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    cli_json(cluster, 1, &add)?;
    let placed = wait_vips(cluster, 1, Duration::from_secs(20), |rows| {
        rows.len() == vips.len() && balanced_without_leader(cluster, rows, nodes)
    })
    .context("the vip pool was not placed")?;
    // The second stream goes through a VIP of another owner, so that more faults hit one.
    let owner = |v: Ipv4Addr| placed.iter().find(|r| r.vip == v).and_then(|r| r.owner);
    let second = vips[1..]
        .iter()
        .copied()
        .find(|v| owner(*v) != owner(vips[0]))
        .unwrap_or(vips[1]);
    let pairs = add_tenants(cluster, n + 2, n + 3, [vips[0], second])?;
    let mut streams = Vec::new();
    for p in &pairs {
        let opts = ProbeOptions {
            port: p.port,
            rate_pps: args.probe_pps,
            // Setup, the schedule and the final checks, with room to spare.
            max_duration: total + Duration::from_secs(240),
        };
        let s = ProbeStream::start_with(&p.from, &p.to, opts)?;
        if !s.wait_flowing(
            Duration::from_millis(300),
            Duration::from_secs(1),
            Duration::from_secs(10),
        ) {
            bail!("probe stream {} is not flowing before the schedule", p.name);
        }
        streams.push(s);
    }
    let placement: Vec<String> = placed
        .iter()
        .map(|r| format!("{}→{}", r.vip, r.owner.unwrap_or(0)))
        .collect();
    println!(
        "chaos: gateway on nodes 1..={n}, vips {}; probe streams {} at {} pps each",
        placement.join(" "),
        pairs
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.probe_pps
    );
    Ok((vips, pairs, streams))
}

/// What the gateway verdicts are judged against.
struct Judge<'a> {
    nodes: &'a [NodeId],
    budget: Ms,
    clock: RunClock,
    faults: &'a [Injected],
    /// The pollers' period: the slack when matching the table with the data plane.
    poll: Ms,
    max_owner_changes: u32,
    converge: Ms,
    /// How long after the last fault healed the final placement may take to settle: the
    /// longest hold-down twice (one that starts as the node's lease is restored after the heal,
    /// and one more should it lapse once while its renewals catch up) and then some. The wait
    /// ends as soon as the placement is balanced.
    settle: Duration,
}

/// One probe stream's loss windows on the run clock.
struct Stream {
    name: String,
    vip: Ipv4Addr,
    interval_ms: f64,
    gaps: Vec<LossGap>,
    report: ProbeReport,
}

impl Judge<'_> {
    fn gateway_verdicts(
        &self,
        cluster: &YardCluster,
        gw: GatewayRun,
        checks: &mut Checks,
    ) -> anyhow::Result<()> {
        let GatewayRun {
            vips,
            pairs,
            streams,
            monitor,
        } = gw;
        // (d) The end state, all healed: one owner per VIP, balanced, answered for by exactly
        // that owner, and the probes flowing without loss over a quiet second.
        let final_start = self.clock.now();
        let last_heal = self
            .faults
            .iter()
            .map(|f| f.healed)
            .max()
            .unwrap_or(final_start);
        let settle = (self.settle + Duration::from_millis(last_heal.max(0) as u64))
            .saturating_sub(Duration::from_millis(final_start.max(0) as u64))
            .max(Duration::from_secs(15));
        let placed = wait_vips(cluster, 1, settle, |rows| {
            rows.len() == vips.len() && balanced_without_leader(cluster, rows, self.nodes)
        });
        let placement = match &placed {
            Ok(rows) => {
                let loads: Vec<usize> = self
                    .nodes
                    .iter()
                    .map(|n| rows.iter().filter(|r| r.owner == Some(*n)).count())
                    .collect();
                println!(
                    "chaos: final vip placement settled {:.1}s after the schedule: vips per node {loads:?}",
                    secs(self.clock.now() - final_start)
                );
                Ok(())
            }
            Err(e) => {
                let leaders: Vec<Option<usize>> =
                    (1..=self.nodes.len()).map(|i| cluster.leader(i)).collect();
                println!(
                    "chaos: final vip placement: {e:#}; leader as nodes 1.. see it: {leaders:?}"
                );
                Err(format!("{e:#}; leader as nodes 1.. see it: {leaders:?}"))
            }
        };
        checks.add_why(
            "gateway final: one owner per vip, balanced within 1 over the non-leaders",
            placement,
        );
        let mut mismatches = vec!["no placement to compare with".to_owned()];
        if let Ok(rows) = &placed {
            let since = self.clock.now();
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                mismatches = match monitor.answering_after(since) {
                    Some(ans) => answering_mismatches(rows, &ans),
                    None => vec!["not every node answered a stats poll".to_owned()],
                };
                if mismatches.is_empty() || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for m in &mismatches {
            println!("chaos: final data plane: {m}");
        }
        if !mismatches.is_empty() {
            for d in monitor.describe_latest(&self.clock) {
                println!("chaos: final data plane: {d}");
            }
            println!(
                "chaos: final data plane: forwarded counters per node {:?}",
                monitor.forwarded()
            );
            let n = self.nodes.len();
            for host in [n + 2, n + 3] {
                for line in vip_neighbours(cluster, host, n) {
                    println!("chaos: final data plane: {line}");
                }
            }
        }
        checks.add_why(
            "gateway final: each vip answered by exactly its owner",
            if mismatches.is_empty() {
                Ok(())
            } else {
                Err(mismatches.join("; "))
            },
        );
        let quiet_from = self.clock.now();
        let sent_before: Vec<u64> = streams.iter().map(ProbeStream::sent).collect();
        std::thread::sleep(Duration::from_millis(1000));
        let quiet_to = self.clock.now();
        let sent_after: Vec<u64> = streams.iter().map(ProbeStream::sent).collect();
        let observed = monitor.finish()?;
        let streams: Vec<Stream> = streams
            .into_iter()
            .zip(&pairs)
            .map(|(s, p)| {
                let report = s.stop();
                let base = self.clock.at(report.epoch);
                let gaps = report
                    .gaps
                    .iter()
                    .map(|g| {
                        let start = base + g.start_ms.floor() as Ms;
                        LossGap {
                            start,
                            lost_until: start + (g.lost as f64 * report.interval_ms).ceil() as Ms,
                            len: g.len_ms.ceil() as Ms,
                            lost: g.lost,
                            resumed: g.resumed_rx_ms.is_some(),
                        }
                    })
                    .collect();
                Stream {
                    name: p.name.clone(),
                    vip: p.vip,
                    interval_ms: report.interval_ms,
                    gaps,
                    report,
                }
            })
            .collect();
        for (k, s) in streams.iter().enumerate() {
            let lost = lost_within(&s.gaps, quiet_from, quiet_to, s.interval_ms);
            let flowed = sent_after[k].saturating_sub(sent_before[k]);
            println!(
                "chaos: final quiet second: probe {}: {flowed} sent, {lost} lost",
                s.name
            );
            checks.add(
                format!(
                    "gateway final: probe {} flows without loss for a second",
                    s.name
                ),
                lost == 0 && flowed > 0,
            );
        }

        self.judge_run(&observed, &vips, &streams, final_start, checks);
        Ok(())
    }

    /// Invariants (a)-(c) over the whole run, reported per phase: before the first fault, each
    /// fault with the calm after it, and the final checks.
    fn judge_run(
        &self,
        observed: &Observed,
        vips: &[Ipv4Addr],
        streams: &[Stream],
        final_start: Ms,
        checks: &mut Checks,
    ) {
        let budget = self.budget;
        let mut starts = vec![Ms::MIN];
        starts.extend(self.faults.iter().map(|f| f.injected));
        starts.push(final_start);
        let phases = starts.len();
        let label = |p: usize| -> String {
            if p == 0 {
                "before the first fault".to_owned()
            } else if p == phases - 1 {
                "after the schedule".to_owned()
            } else {
                let f = &self.faults[p - 1];
                format!("fault {p} ({} on nodes {:?})", f.kind, f.nodes)
            }
        };

        // (a) One data-plane owner per VIP at every instant.
        let overlaps = observed.answering.overlaps();
        let mut overlaps_by: BTreeMap<usize, Vec<&Overlap>> = BTreeMap::new();
        for o in &overlaps {
            overlaps_by
                .entry(phase_of(&starts, o.from))
                .or_default()
                .push(o);
        }
        // (b) A live owner for every VIP within the budget.
        let outages: Vec<Outage> = self
            .faults
            .iter()
            .filter(|f| f.is_outage())
            .flat_map(|f| {
                f.nodes.iter().map(|&node| Outage {
                    node: node as NodeId,
                    from: f.injected,
                    to: f.healed,
                })
            })
            .collect();
        let ownership = check_ownership(&observed.samples, &outages, self.nodes, budget);
        let mut ownership_by: BTreeMap<usize, Vec<&OwnershipViolation>> = BTreeMap::new();
        for v in &ownership {
            ownership_by
                .entry(phase_of(&starts, v.at()))
                .or_default()
                .push(v);
        }

        // (b') ...and some node actually answering for it: a VIP whose owner fenced itself but
        // keeps renewing is owned in the table and answered by nobody.
        // While every daemon is stopped nobody can renew, so every data plane fences itself:
        // that silence is the design, and only what lasts beyond a stall counts.
        let stalls: Vec<(Ms, Ms)> = self
            .faults
            .iter()
            .filter(|f| f.kind.is_stall())
            .map(|f| (f.injected, f.healed))
            .collect();
        let silent: Vec<(Ipv4Addr, Ms, Ms)> =
            unanswered(&observed.answering, vips, 0, observed.last_stats, budget)
                .into_iter()
                .filter(|(_, a, b)| (b - a) - stalled_within(&stalls, *a, *b) > budget)
                .collect();
        let mut silent_by: BTreeMap<usize, Vec<&(Ipv4Addr, Ms, Ms)>> = BTreeMap::new();
        for u in &silent {
            silent_by.entry(phase_of(&starts, u.1)).or_default().push(u);
        }

        // (e) Convergence: after the last fault heals, every VIP answered by exactly its owner
        // within seconds, whatever state the faults left the cluster in.
        let last_heal = self.faults.iter().map(|f| f.healed).max().unwrap_or(0);
        let converged = converged_at(
            &observed.samples,
            &observed.answering,
            vips,
            last_heal,
            self.poll,
        );
        match converged {
            Some(t) => println!(
                "chaos: converged {} ms after the last fault healed (t={:.1}s): every vip answered by its owner",
                t - last_heal,
                secs(t)
            ),
            None => println!(
                "chaos: NOT CONVERGED: after the last fault healed (t={:.1}s) the vips were never all answered by their owners",
                secs(last_heal)
            ),
        }
        checks.add(
            format!(
                "gateway: converged within {} ms of the last heal",
                self.converge
            ),
            converged.is_some_and(|t| t - last_heal <= self.converge),
        );

        println!(
            "chaos: gateway observations: {} data-plane polls answered per node {:?} (failed {:?}), {} answering intervals, {} vip-table samples ({} failed); pollers fell behind by {} ms at most",
            observed.answering.observations(),
            observed.stats_ok,
            observed.stats_failed,
            observed.answering.intervals().len(),
            observed.samples.len(),
            observed.list_failed,
            observed.max_poll_lateness_ms
        );
        checks.add(
            "gateway: every node's data plane and the vip table were observed",
            observed.stats_ok.iter().all(|n| *n > 0) && !observed.samples.is_empty(),
        );

        // Largest loss window per fault kind, over every stream, during and after the fault.
        let mut by_kind: BTreeMap<String, (Ms, Ms)> = BTreeMap::new();
        let mut total_changes = 0u32;
        for p in 0..phases {
            let from = starts[p];
            let to = starts.get(p + 1).copied().unwrap_or(Ms::MAX);
            let fault = (1..phases - 1).contains(&p).then(|| &self.faults[p - 1]);
            let mut line = format!("chaos: [{}] {}", p, label(p));
            if let Some(f) = fault {
                let _ = write!(line, " t={:.1}s..{:.1}s", secs(f.injected), secs(f.healed));
                for &node in &f.nodes {
                    let owned = owned_before(&observed.samples, node as NodeId, f.injected);
                    let moved = Outage {
                        node: node as NodeId,
                        from: f.injected,
                        to: f.healed,
                    };
                    let _ = write!(
                        line,
                        "; node {node} owned {}",
                        if owned.is_empty() {
                            "nothing".to_owned()
                        } else {
                            owned
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(",")
                        }
                    );
                    if f.is_outage() && !owned.is_empty() {
                        let _ = write!(line, ", {}", reassignment(&observed.samples, &moved));
                    }
                }
            }
            println!("{line}");

            let o = overlaps_by.get(&p).map_or(&[][..], Vec::as_slice);
            println!(
                "chaos:     single owner: {}",
                if o.is_empty() {
                    "ok".to_owned()
                } else {
                    format!("{} VIOLATIONS", o.len())
                }
            );
            for v in o.iter().take(10) {
                println!("chaos:       {v}");
            }
            checks.add(format!("gateway [{p}] single owner per vip"), o.is_empty());

            let w = ownership_by.get(&p).map_or(&[][..], Vec::as_slice);
            println!(
                "chaos:     live owner within {budget} ms: {}",
                if w.is_empty() {
                    "ok".to_owned()
                } else {
                    format!("{} VIOLATIONS", w.len())
                }
            );
            for v in w.iter().take(10) {
                println!("chaos:       {v}");
            }
            checks.add(
                format!("gateway [{p}] every vip has a live owner"),
                w.is_empty(),
            );

            let u = silent_by.get(&p).map_or(&[][..], Vec::as_slice);
            println!(
                "chaos:     answered by some node within {budget} ms: {}",
                if u.is_empty() {
                    "ok".to_owned()
                } else {
                    format!("{} VIOLATIONS", u.len())
                }
            );
            for (vip, a, b) in u.iter().take(10) {
                println!(
                    "chaos:       nobody answered ARP for {vip} over t={:.3}s..{:.3}s ({} ms)",
                    secs(*a),
                    secs(*b),
                    b - a
                );
            }
            checks.add(
                format!("gateway [{p}] every vip answered in the data plane"),
                u.is_empty(),
            );

            // (f) Stable ownership: each VIP changes owner a bounded number of times per phase.
            let changes = owner_changes(&observed.samples, from, to);
            let total: u32 = changes.values().sum();
            let worst = changes.values().copied().max().unwrap_or(0);
            total_changes += total;
            println!(
                "chaos:     owner changes: {total} ({}){}",
                changes
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(v, n)| format!("{v}×{n}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                if worst > self.max_owner_changes {
                    format!(
                        " VIOLATION: a vip changed owner {worst} times, more than {}",
                        self.max_owner_changes
                    )
                } else {
                    String::new()
                }
            );
            checks.add(
                format!(
                    "gateway [{p}] each vip changes owner at most {} times",
                    self.max_owner_changes
                ),
                worst <= self.max_owner_changes,
            );

            // (c) Probe loss windows close within the budget.
            let mut probe_ok = true;
            let mut parts = Vec::new();
            for s in streams {
                let (during, after) = match fault {
                    Some(f) => (
                        largest_gap(&s.gaps, f.injected, f.healed),
                        largest_gap(&s.gaps, f.healed, to),
                    ),
                    None => (0, largest_gap(&s.gaps, from, to)),
                };
                // Random loss on the stream's gateway drops probes at random: not judged.
                let excused = fault.is_some_and(|f| {
                    matches!(f.kind, FaultKind::Loss { .. })
                        && owned_by_any(
                            &observed.samples,
                            s.vip,
                            &f.nodes.iter().map(|n| *n as NodeId).collect::<Vec<_>>(),
                            f.injected,
                            f.healed,
                        )
                });
                let bad: Vec<&LossGap> = gaps_in(&s.gaps, from, to)
                    .filter(|g| g.len > budget || !g.resumed)
                    .filter(|g| {
                        !(excused
                            && fault.is_some_and(|f| g.start >= f.injected && g.start < f.healed))
                    })
                    .collect();
                probe_ok &= bad.is_empty();
                let lost: u64 = gaps_in(&s.gaps, from, to).map(|g| g.lost).sum();
                parts.push(match fault {
                    Some(_) => {
                        format!(
                        "{}: largest gap {during} ms during{}, {after} ms after heal ({lost} lost)",
                        s.name,
                        if excused { " (loss on its gateway: not judged)" } else { "" }
                    )
                    }
                    None => format!("{}: largest gap {after} ms ({lost} lost)", s.name),
                });
                for g in bad.iter().take(5) {
                    parts.push(format!(
                        "VIOLATION: {} lost {} datagrams from t={:.3}s, a {} ms window{}",
                        s.name,
                        g.lost,
                        secs(g.start),
                        g.len,
                        if g.resumed { "" } else { " that never closed" }
                    ));
                }
                if let Some(f) = fault {
                    let e = by_kind.entry(f.kind.to_string()).or_default();
                    if !excused {
                        e.0 = e.0.max(during);
                    }
                    e.1 = e.1.max(after);
                }
            }
            println!(
                "chaos:     probe within {budget} ms: {}",
                if probe_ok { "ok" } else { "VIOLATION" }
            );
            for part in parts {
                println!("chaos:       {part}");
            }
            checks.add(
                format!("gateway [{p}] probe loss windows close within budget"),
                probe_ok,
            );
        }
        println!("chaos: vip owner changes over the run: {total_changes}");
        for (kind, (during, after)) in &by_kind {
            println!(
                "chaos: loss window by fault kind: {kind:<10} largest {during} ms during, {after} ms after heal"
            );
        }
        for s in streams {
            println!(
                "chaos: probe {}: {} sent, {} received, {} lost, {} duplicates, {} reordered, {} gaps, largest {:.0} ms; sender fell behind by {:.0} ms at most",
                s.name,
                s.report.sent,
                s.report.received,
                s.report.lost,
                s.report.duplicates,
                s.report.reordered,
                s.report.gaps.len(),
                s.report.max_gap_ms,
                s.report.max_send_lateness_ms
            );
            checks.add(
                format!("gateway: probe {} never duplicated (one forwarder)", s.name),
                s.report.duplicates == 0,
            );
        }
    }
}

/// How much of `[from, to]` the stalls cover.
fn stalled_within(stalls: &[(Ms, Ms)], from: Ms, to: Ms) -> Ms {
    stalls
        .iter()
        .map(|(a, b)| (to.min(*b) - from.max(*a)).max(0))
        .sum()
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Balanced over every node but the Raft leader, which by default hands its VIPs to the others
/// (`gateway.leader_holds_vips = false`), so losing it strands none.
fn balanced_without_leader(
    cluster: &YardCluster,
    rows: &[yard_chaos::gateway::VipRow],
    nodes: &[NodeId],
) -> bool {
    let Some(leader) = cluster.leader(1) else {
        return false;
    };
    let others: Vec<NodeId> = nodes
        .iter()
        .copied()
        .filter(|n| *n as usize != leader)
        .collect();
    balanced(rows, &others)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_kinds_parse_from_their_short_names() {
        for k in FaultKind::every() {
            assert_eq!(parse_kind(&k.to_string()), Ok(k));
        }
        assert!(parse_kind("loss-x%").is_err());
        assert!(parse_kind("meteor").is_err());
    }

    #[test]
    fn stalls_excuse_only_the_time_they_cover() {
        let stalls = [(1_000, 4_000), (10_000, 11_000)];
        assert_eq!(stalled_within(&stalls, 0, 20_000), 4_000);
        assert_eq!(stalled_within(&stalls, 3_000, 10_500), 1_500);
        assert_eq!(stalled_within(&stalls, 5_000, 9_000), 0);
    }
}
