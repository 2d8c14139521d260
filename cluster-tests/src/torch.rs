//! Real PyTorch jobs on a yard cluster: one gloo rank per host (`clients/python/tests/
//! torch_job.py train`, run by Debian's `/usr/bin/python3` with `python3-torch`), each wrapped
//! by `yard_probe.torch` and reporting to its host's node, all-reducing over the hosts'
//! 198.18.0.0/16 addresses.
//!
//! The ranks are [`Process`]es of the [`Topology`], so a test that panics still has them
//! killed; [`RingJob`] gives the same progress, waiting and clean stop as for `ring-rank`.

use std::borrow::Borrow;
use std::path::{Path, PathBuf};

use crate::ring::RingJob;
use crate::yard::YardCluster;
use crate::{Result, Topology};

/// The port rank 0's TCP store listens on (torchrun's default master port).
pub const MASTER_PORT: u16 = 29500;

/// What the rank script prints before each progress figure (the format of
/// [`crate::ring::progress_line`]).
pub const PROGRESS_PREFIX: &str = "torch-rank progress:";

/// The Python client's directory, the ranks' `PYTHONPATH`.
pub fn python_client_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../clients/python"))
}

/// The rank script.
pub fn rank_script() -> PathBuf {
    python_client_dir().join("tests").join("torch_job.py")
}

/// The interpreter that has torch: `$YARD_TORCH_PYTHON`, else `/usr/bin/python3` (Debian's
/// `python3-torch` installs for it, not for another python3 that may come first on PATH).
pub fn torch_python() -> PathBuf {
    std::env::var_os("YARD_TORCH_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/usr/bin/python3"), PathBuf::from)
}

/// Settings of a torch job.
#[derive(Debug, Clone)]
pub struct TorchOptions {
    /// f32 elements each all-reduce sums (one more carries the stop flag).
    pub elements: u64,
    /// Simulated compute between two all-reduces.
    pub compute_ms: u64,
    /// gloo's collective timeout: how long ranks wait for a frozen peer before failing.
    pub timeout_s: u64,
    /// The interface gloo binds to and the NIC ranks report to the probe.
    pub nic: String,
}

impl Default for TorchOptions {
    /// 256 KiB all-reduces every 20 ms of compute, gloo giving up after 60 s, on "eth0".
    fn default() -> Self {
        Self {
            elements: 64 << 10,
            compute_ms: 20,
            timeout_s: 60,
            nic: "eth0".into(),
        }
    }
}

/// A torch rank's environment: the Python clients on its path, gloo bound to `nic`, one
/// OpenMP thread (the hosts share two cores), unbuffered output for its log.
fn rank_envs(nic: &str) -> Vec<(&'static str, String)> {
    vec![
        ("PYTHONPATH", python_client_dir().display().to_string()),
        ("GLOO_SOCKET_IFNAME", nic.to_owned()),
        ("OMP_NUM_THREADS", "1".to_owned()),
        ("PYTHONUNBUFFERED", "1".to_owned()),
    ]
}

/// Starts rank `r` of `job` in host `hosts[r]` with `python` running `script` in train mode:
/// rendezvous at `hosts[0]`'s address, port [`MASTER_PORT`], gloo bound to `opts.nic`,
/// reports to that host's node. Logs are `torch-<job>-<r>.log` in the run directory.
pub fn start_job<T: Borrow<Topology>>(
    cluster: &YardCluster<T>,
    python: &Path,
    script: &Path,
    job: &str,
    hosts: &[usize],
    opts: &TorchOptions,
) -> Result<RingJob> {
    let topo = cluster.topology();
    for &h in hosts {
        topo.check_host(h)?;
    }
    let Some(&first) = hosts.first() else {
        return Ok(RingJob::from_ranks(job, Vec::new(), PROGRESS_PREFIX));
    };
    let init = format!("tcp://{}:{MASTER_PORT}", topo.addr(first));
    let owned = rank_envs(&opts.nic);
    let envs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let world = hosts.len().to_string();
    let mut ranks = Vec::with_capacity(hosts.len());
    for (r, &h) in hosts.iter().enumerate() {
        let args = [
            script.display().to_string(),
            "train".to_owned(),
            "--rank".to_owned(),
            r.to_string(),
            "--world".to_owned(),
            world.clone(),
            "--init".to_owned(),
            init.clone(),
            "--job".to_owned(),
            job.to_owned(),
            "--socket".to_owned(),
            cluster.probe_socket(h).display().to_string(),
            "--nic".to_owned(),
            opts.nic.clone(),
            "--elements".to_owned(),
            opts.elements.to_string(),
            "--compute-ms".to_owned(),
            opts.compute_ms.to_string(),
            "--timeout-s".to_owned(),
            opts.timeout_s.to_string(),
        ];
        ranks.push(topo.spawn(h, python, &args, &envs, &format!("torch-{job}-{r}.log"))?);
    }
    Ok(RingJob::from_ranks(job, ranks, PROGRESS_PREFIX))
}

/// Liveness and Raft timing for a cluster of seven debug nodes and four torch ranks on a shared
/// 2-core machine: 30 missed 100 ms probes instead of 3 missed 20 ms ones. With the defaults,
/// reachability flapped every few hundred ms from the cluster's start; the leader then failed a strict job
/// on one flap (which led to `aggregator.worker_gone_ms`), and a flapping aggregator host would
/// still move the job back and forth. The real-torch test and demo are about the hook and the
/// data plane, not failure detection.
///
/// Raft's timing is relaxed the same way (a 100 ms heartbeat and elections after 300-500 ms
/// instead of 20 and 50-80): with eleven debug nodes (the tree tests) on a slow 2-core machine,
/// replication timed out at one 20 ms heartbeat so often that terms churned while the cluster
/// formed and the test's first write (the job's creation) timed out.
pub const AGG_TORCH_TIMING: &str = "[liveness]\ninterval_ms = 100\nmisses = 30\nlease_ms = 300\n\
    [raft]\nheartbeat_ms = 100\nelection_timeout_min_ms = 300\nelection_timeout_max_ms = 500\n";

/// The aggregation rank script: DDP training through `yard_agg`'s comm hook, then the same
/// training with gloo's all-reduce (`clients/python/tests/agg_torch_job.py`).
pub fn agg_rank_script() -> PathBuf {
    python_client_dir().join("tests").join("agg_torch_job.py")
}

/// The torch version `python` imports, with gloo; or a sentence saying how to get it.
pub fn torch_version(python: &Path) -> std::result::Result<String, String> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import torch, torch.distributed as d; assert d.is_gloo_available(); print(torch.__version__)",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "real torch with gloo is needed at {} (apt-get install python3-torch, or \
             deploy/install-deps.sh; another interpreter via YARD_TORCH_PYTHON): {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Trainable values of the aggregation script's model (`agg_torch_job.py size`): the job's
/// gradient is 4 bytes each.
pub fn agg_model_values(python: &Path) -> std::result::Result<u64, String> {
    let out = std::process::Command::new(python)
        .arg(agg_rank_script())
        .arg("size")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| {
            format!(
                "agg_torch_job.py size failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}

/// What [`start_agg_ranks`] runs.
#[derive(Debug, Clone)]
pub struct AggRanks<'a> {
    /// The job's name (created beforehand with the model's size).
    pub job: &'a str,
    /// Rank r runs in host `hosts[r]`; `hosts[0]` holds gloo's rendezvous.
    pub hosts: &'a [usize],
    /// The interface gloo binds to.
    pub nic: &'a str,
    /// SGD steps through the hook, then as many with gloo.
    pub steps: u32,
    /// Where rank r writes `rank<r>.json`, its report.
    pub out_dir: &'a Path,
    /// More arguments for the script, as they are.
    pub extra: &'a [&'a str],
}

/// Starts rank `r` of aggregation job `a.job` in host `a.hosts[r]`: gloo rendezvous at
/// `hosts[0]`'s address (port [`MASTER_PORT`], bound to `a.nic`), joining the job through that
/// host's node agent socket, its UDP socket on the host's address. Logs are
/// `agg-torch-<job>-<r>.log` in the run directory.
pub fn start_agg_ranks<T: Borrow<Topology>>(
    cluster: &YardCluster<T>,
    python: &Path,
    a: &AggRanks<'_>,
) -> Result<Vec<crate::Process>> {
    let topo = cluster.topology();
    for &h in a.hosts {
        topo.check_host(h)?;
    }
    let Some(&first) = a.hosts.first() else {
        return Ok(Vec::new());
    };
    let init = format!("tcp://{}:{MASTER_PORT}", topo.addr(first));
    let owned = rank_envs(a.nic);
    let envs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let world = a.hosts.len().to_string();
    let mut ranks = Vec::with_capacity(a.hosts.len());
    for (r, &h) in a.hosts.iter().enumerate() {
        let mut args = vec![
            agg_rank_script().display().to_string(),
            "train".to_owned(),
            "--rank".to_owned(),
            r.to_string(),
            "--world".to_owned(),
            world.clone(),
            "--init".to_owned(),
            init.clone(),
            "--job".to_owned(),
            a.job.to_owned(),
            "--socket".to_owned(),
            cluster.agg_socket(h).display().to_string(),
            "--addr".to_owned(),
            topo.addr(h).to_string(),
            "--out".to_owned(),
            a.out_dir
                .join(format!("rank{r}.json"))
                .display()
                .to_string(),
            "--steps".to_owned(),
            a.steps.to_string(),
            "--timeout-s".to_owned(),
            "120".to_owned(),
        ];
        args.extend(a.extra.iter().map(|x| (*x).to_owned()));
        let log = format!("agg-torch-{}-{r}.log", a.job);
        ranks.push(topo.spawn(h, python, &args, &envs, &log)?);
    }
    Ok(ranks)
}
