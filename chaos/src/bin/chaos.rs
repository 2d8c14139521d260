//! `chaos`: a seeded fault schedule against a real `yard` cluster in network namespaces, with a
//! concurrent KV workload recorded and checked for linearizability. Prints the seed, every fault
//! it injected, the operations checked and the verdict; exits non-zero on a violation (printing
//! the minimal history that shows it) or if the cluster does not converge afterwards.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use yard::client::AdminClient;
use yard_chaos::yard_client::YardKv;
use yard_chaos::{
    check, generate, inject, key_set, run_workload, FaultKind, OpMix, Recorder, ScheduleConfig,
    WorkloadConfig,
};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};

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
    /// Cluster size (3 or more).
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Concurrent workload clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Keys the workload contends on.
    #[arg(long, default_value_t = 8)]
    keys: usize,
    /// Pause before each client operation, in milliseconds (bounds the history's size).
    #[arg(long, default_value_t = 10)]
    pace_ms: u64,
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
    let kinds = vec![
        FaultKind::Kill9,
        FaultKind::Pause,
        FaultKind::LinkDown,
        FaultKind::Partition,
        FaultKind::Loss { pct: 30 },
    ];
    let mut config = ScheduleConfig::new(seed, args.hosts, total, kinds);
    config.min_fault = Duration::from_secs(3);
    config.max_fault = Duration::from_secs(15);
    config.min_gap = Duration::from_secs(3);
    config.max_gap = Duration::from_secs(8);
    let schedule = generate(&config)?;
    println!("chaos: seed {seed} (rerun with --seed {seed})");
    print!("{schedule}");

    let mut cluster =
        YardCluster::start(&bin, args.hosts, args.hosts + 1, &ClusterOptions::default())?;
    let client_host = args.hosts + 1;
    let endpoints: Vec<String> = (1..=args.hosts).map(|i| cluster.endpoint(i)).collect();
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
    let (clients, pace) = (args.clients, Duration::from_millis(args.pace_ms));
    let rec = recorder.clone();
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

    let start = Instant::now();
    let mut injected = 0;
    for step in &schedule.steps {
        sleep_until(start + step.start);
        inject::begin(&mut cluster, &step.fault)
            .with_context(|| format!("cannot inject {:?}", step.fault))?;
        injected += 1;
        println!(
            "chaos: t={:>6.1}s inject {:?} on host index {:?} for {:.1}s",
            start.elapsed().as_secs_f64(),
            step.fault.kind,
            step.fault.targets,
            step.duration.as_secs_f64()
        );
        sleep_until(start + step.start + step.duration);
        inject::end(&mut cluster, &step.fault)
            .with_context(|| format!("cannot end {:?}", step.fault))?;
        println!(
            "chaos: t={:>6.1}s healed {:?} on {:?}",
            start.elapsed().as_secs_f64(),
            step.fault.kind,
            step.fault.targets
        );
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

    // Invariant: with every fault healed the cluster converges to all voters reachable.
    let converged = cluster.wait_voters(1, args.hosts, Duration::from_secs(30));
    let history = recorder.history();
    let verdict = check(&history)?;
    println!(
        "chaos: faults injected {injected}; keys checked {}; operations checked {}",
        verdict.keys_checked, verdict.ops_checked
    );
    for k in &verdict.inconclusive {
        println!(
            "chaos: key {} inconclusive after {} states ({} ops)",
            k.key, k.states_explored, k.ops
        );
    }
    let mut ok = true;
    if verdict.is_violation() {
        ok = false;
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
        Ok(_) => println!("chaos: cluster converged: {} voters reachable", args.hosts),
        Err(e) => {
            ok = false;
            println!("chaos: cluster did not converge after the schedule: {e}");
        }
    }
    if summary.ok == 0 {
        ok = false;
        println!("chaos: no operation succeeded; the run proves nothing");
    }
    println!("chaos: {} passed, {} failed", u32::from(ok), u32::from(!ok));
    Ok(ok)
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}
