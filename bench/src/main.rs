//! `kv-vs-etcd`: yard's replicated KV against etcd (Debian's etcd-server) on one 3-host
//! network-namespace topology: interleaved put rounds, leader-kill recovery, idle memory.
//!
//! A benchmark, not a test: it prints figures (one JSON object on stdout, a human table on
//! stderr) and never fails on a number. It fails only when it cannot measure (a cluster does
//! not come up, a member exits on its own), and cleans up its hosts and processes either way.
//!
//! Layout: hosts 1-3 (198.18.0.1-3) each run one yard node and one etcd member; host 4
//! (198.18.0.4) is the client. The test hosts' bridge is reachable only from inside the hosts,
//! so the driver runs on a thread the harness starts in host 4's namespace
//! ([`Topology::thread_in_host`]) and builds its tokio runtime there, so every runtime thread
//! and socket lives there too: all drivers, of both systems, run in that one process with the
//! same shape (one client object, and one connection, per concurrent client). The main thread
//! stays in the root namespace, which keeps the harness's cleanup (`ip netns pids`, then
//! SIGKILL) from ever picking this process.

mod cluster;
mod etcd_cluster;
mod procfs;
mod report;
mod stats;
mod workload;
mod yard_system;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use yard_cluster_tests::Topology;

use crate::cluster::{Cluster, KvClient};
use crate::etcd_cluster::{EtcdCluster, EtcdProfile};
use crate::report::{Report, RssFigures};
use crate::workload::{CliTrial, KillSettings, KillTrial, RoundFigures};
use crate::yard_system::YardSystem;

/// Server hosts (the harness runs yard node i on host i); the client is the next one.
const SERVERS: [usize; 3] = [1, 2, 3];
const CLIENT_HOST: usize = 4;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "kv-vs-etcd",
    about = "yard's Raft KV against etcd on one 3-host namespace topology (needs root)"
)]
pub struct Args {
    /// Put rounds per system, interleaved yard, etcd, yard, etcd, ...
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Concurrent clients per round (each its own client object and connection).
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Puts per round, split over the clients.
    #[arg(long, default_value_t = 5000)]
    pub ops: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Per-put timeout of the put rounds, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub put_timeout_ms: u64,
    /// Leader-kill trials per system, interleaved; 0 skips them.
    #[arg(long, default_value_t = 5)]
    pub kill_trials: usize,
    /// Leader-kill trials per system driven through the CLI at its defaults (a fresh `yard kv
    /// put` / `etcdctl put` per attempt against a survivor), interleaved; 0 skips them.
    #[arg(long, default_value_t = 20)]
    pub cli_trials: usize,
    /// Per-put timeout of the leader-kill writers, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub write_timeout_ms: u64,
    /// How often each leader-kill writer sends a new put (ms): the recovery figure's resolution.
    #[arg(long, default_value_t = 10)]
    pub probe_interval_ms: u64,
    /// Seconds the clusters idle before each memory reading.
    #[arg(long, default_value_t = 5)]
    pub idle_secs: u64,
    /// The yard binary; defaults to `yard` beside this program (target/release/yard).
    #[arg(long)]
    pub yard_bin: Option<PathBuf>,
    /// The etcd binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    pub etcd_bin: PathBuf,
    /// Also write the JSON object to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv-vs-etcd: {e:#}");
            if std::env::var_os("YARD_KEEP_LOGS").is_none() {
                eprintln!("kv-vs-etcd: run with YARD_KEEP_LOGS=1 to keep the members' logs");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(mut args: Args) -> Result<()> {
    if args.rounds == 0 || args.clients == 0 || args.ops < args.clients {
        bail!("--rounds and --clients must be at least 1 and --ops at least --clients");
    }
    yard_cluster_tests::check_root()
        .context("kv-vs-etcd makes network namespaces; run it as root")?;
    let yard_bin = match args.yard_bin.take() {
        Some(b) => b,
        None => std::env::current_exe()
            .context("cannot find this program's path")?
            .with_file_name("yard"),
    };
    if !yard_bin.is_file() {
        bail!(
            "no yard binary at {}; build it with `cargo build --release -p yard` or pass --yard-bin",
            yard_bin.display()
        );
    }
    if !args.etcd_bin.is_file() {
        bail!(
            "no etcd binary at {}; install Debian's etcd-server or pass --etcd-bin",
            args.etcd_bin.display()
        );
    }
    // Absolute: the harness starts programs with the run directory as working directory.
    args.yard_bin = Some(std::fs::canonicalize(&yard_bin)?);
    args.etcd_bin = std::fs::canonicalize(&args.etcd_bin)?;

    // Dropped last, on every path out of here (errors and driver panics included): kills every
    // process it started and deletes the namespaces. A run killed outright is swept by the next.
    // Shared with the driver thread, whose clone is gone by the time it has been joined.
    let topo = Arc::new(Topology::new(SERVERS.len() + 1).context("cannot make the test hosts")?);
    progress(&format!(
        "test hosts yd{}-1..4 up; servers on {}-{}, driver on {}",
        topo.run_id(),
        topo.addr(1),
        topo.addr(3),
        topo.addr(CLIENT_HOST)
    ));
    let driver = {
        let (topo, args) = (Arc::clone(&topo), args.clone());
        move || drive(&topo, &args)
    };
    let driver = topo
        .thread_in_host(CLIENT_HOST, driver)
        .context("cannot start the driver in the client host")?;
    let report = match driver.join() {
        Ok(r) => r?,
        Err(_) => bail!("the benchmark driver panicked; the hosts were cleaned up"),
    };
    drop(topo);

    let json = serde_json::to_string_pretty(&report.to_json())?;
    println!("{json}");
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!("\n{}", report.table());
    Ok(())
}

/// The driver thread, in the client host: the benchmark on a runtime of its own, cut short by
/// SIGINT or SIGTERM.
fn drive(topo: &Arc<Topology>, args: &Args) -> Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")?;
    let result = rt.block_on(async {
        tokio::select! {
            r = bench(topo, args) => r,
            s = interrupted() => bail!("stopped by {s}; cleaning up"),
        }
    });
    // Dropping the runtime cancels the tasks and waits for the blocking ones (the harness
    // forming the yard cluster, reaping a killed member), each bounded by its own timeouts:
    // they hold the topology, which must be free for the main thread to clean up.
    drop(rt);
    result
}

/// Waits for SIGINT or SIGTERM and names it.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

fn progress(msg: &str) {
    eprintln!("kv-vs-etcd: {msg}");
}

async fn bench(topo: &Arc<Topology>, args: &Args) -> Result<Report> {
    let started = Instant::now();
    let yard_bin = args.yard_bin.clone().unwrap_or_default();
    progress("starting a 3-node yard cluster (bootstrap n1, join n2, n3)");
    let mut yard = YardSystem::start(topo, &yard_bin, SERVERS.len()).await?;
    let start_etcd = |profile, timings: &str| {
        progress(&format!("starting a 3-member etcd cluster ({timings})"));
        EtcdCluster::start(
            topo,
            &args.etcd_bin,
            &SERVERS,
            profile,
            Duration::from_secs(60),
        )
    };
    let mut etcd = start_etcd(EtcdProfile::DEFAULTS, "default timings").await?;
    let mut matched = start_etcd(EtcdProfile::MATCHED, "timings matched to yard's").await?;

    progress(&format!("idling {} s for memory readings", args.idle_secs));
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let rss_fresh = (read_rss(&yard)?, read_rss(&etcd)?);

    let value: Arc<str> = "x".repeat(args.value_size).into();
    let put_timeout = Duration::from_millis(args.put_timeout_ms);
    let mut yard_clients = clients(&yard, args.clients, put_timeout).await?;
    let mut etcd_clients = clients(&etcd, args.clients, put_timeout).await?;
    let mut matched_clients = clients(&matched, args.clients, put_timeout).await?;
    let mut rounds: Vec<RoundFigures> = Vec::new();
    for r in 1..=args.rounds {
        for system in ["yard", "etcd", "etcd-matched"] {
            let (cs, cluster_ok) = match system {
                "yard" => (std::mem::take(&mut yard_clients), yard.check_running()),
                "etcd" => (std::mem::take(&mut etcd_clients), etcd.check_running()),
                _ => (
                    std::mem::take(&mut matched_clients),
                    matched.check_running(),
                ),
            };
            cluster_ok?;
            let (fig, back) = workload::put_round(system, r, cs, args.ops, value.clone()).await?;
            progress(&format!(
                "round {r}/{} {system}: {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
                args.rounds,
                fig.put.throughput_ops_s,
                fig.put.p50_us as f64 / 1e3,
                fig.put.p99_us as f64 / 1e3,
                fig.put.errors
            ));
            rounds.push(fig);
            match system {
                "yard" => yard_clients = back,
                "etcd" => etcd_clients = back,
                _ => matched_clients = back,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    drop((yard_clients, etcd_clients, matched_clients));

    progress(&format!(
        "idling {} s for memory readings after load",
        args.idle_secs
    ));
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let rss_loaded = (read_rss(&yard)?, read_rss(&etcd)?);

    let kill = KillSettings {
        write_timeout_ms: args.write_timeout_ms,
        probe_interval_ms: args.probe_interval_ms,
        give_up_s: 30,
        settle_ms: 1000,
    };
    let mut trials: Vec<KillTrial> = Vec::new();
    for t in 1..=args.kill_trials {
        let y = workload::leader_kill_trial(&mut yard, t, kill, value.clone()).await?;
        progress(&trial_line(&y, args.kill_trials));
        trials.push(y);
        let e = workload::leader_kill_trial(&mut etcd, t, kill, value.clone()).await?;
        progress(&trial_line(&e, args.kill_trials));
        trials.push(e);
        let m = workload::leader_kill_trial(&mut matched, t, kill, value.clone()).await?;
        progress(&trial_line(&m, args.kill_trials));
        trials.push(m);
    }
    let mut cli_trials: Vec<CliTrial> = Vec::new();
    for t in 1..=args.cli_trials {
        for trial in [
            workload::cli_kill_trial(&mut yard, t, kill).await?,
            workload::cli_kill_trial(&mut etcd, t, kill).await?,
            workload::cli_kill_trial(&mut matched, t, kill).await?,
        ] {
            progress(&cli_trial_line(&trial, args.cli_trials));
            cli_trials.push(trial);
        }
    }

    Ok(Report {
        args: args.clone(),
        run_id: topo.run_id().to_owned(),
        servers: SERVERS.iter().map(|&h| topo.addr(h).to_string()).collect(),
        client: topo.addr(CLIENT_HOST).to_string(),
        data_dir: topo.dir().display().to_string(),
        etcd_version: EtcdCluster::version(&args.etcd_bin),
        etcd_flags: [EtcdProfile::DEFAULTS, EtcdProfile::MATCHED]
            .iter()
            .map(|p| {
                let dir = EtcdCluster::data_dir_of(topo, p, 1);
                (p.name, EtcdCluster::args(topo, &SERVERS, 1, &dir, p))
            })
            .collect(),
        yard_timings: YardSystem::timings(),
        rounds,
        kill,
        trials,
        cli_trials,
        rss_yard: RssFigures {
            fresh_kib: rss_fresh.0,
            after_load_kib: rss_loaded.0,
        },
        rss_etcd: RssFigures {
            fresh_kib: rss_fresh.1,
            after_load_kib: rss_loaded.1,
        },
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Client `c` talks to server `c % 3`: load spread over all members, followers forward to the
/// leader (both systems do).
async fn clients<C: Cluster>(cluster: &C, n: usize, timeout: Duration) -> Result<Vec<KvClient>> {
    let hosts = cluster.hosts();
    let mut out = Vec::with_capacity(n);
    for c in 0..n {
        out.push(cluster.client(hosts[c % hosts.len()], timeout).await?);
    }
    Ok(out)
}

/// VmRSS of each member, host order.
fn read_rss<C: Cluster>(cluster: &C) -> Result<Vec<u64>> {
    cluster.check_running()?;
    cluster
        .hosts()
        .iter()
        .map(|&h| procfs::rss_kib(cluster.process(h).pid()))
        .collect()
}

fn cli_trial_line(t: &CliTrial, of: usize) -> String {
    format!(
        "cli leader-kill {}/{of} {}: killed host {}, asked host {}, acknowledged {}, {} errors shown",
        t.trial,
        t.system,
        t.killed_host,
        t.asked_host,
        t.recovery_ms.map_or_else(
            || "never within the limit".to_owned(),
            |ms| format!("after {ms:.0} ms")
        ),
        t.errors
    )
}

fn trial_line(t: &KillTrial, of: usize) -> String {
    format!(
        "leader-kill {}/{of} {}: killed host {}, recovery {}, rejoin {:.0} ms",
        t.trial,
        t.system,
        t.killed_host,
        t.recovery_ms.map_or_else(
            || "none within the limit".to_owned(),
            |ms| format!("{ms:.0} ms")
        ),
        t.rejoin_ms
    )
}
