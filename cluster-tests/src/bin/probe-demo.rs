//! The probe part of the main job (`deploy/demo.sh`): three `yard` nodes in namespaces, one
//! training rank per host doing a real ring all-reduce over TCP and reporting its collectives to
//! its node; then host 2's link is rate-limited (a slow link), and later rank 1 is stopped with
//! SIGSTOP (a hang). Each time `yard diagnose --job J` is shown as an operator sees it, with the
//! time from the fault to the verdict, and the hang is drawn with `--svg`. Needs root; cleans up
//! on exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use yard_cluster_tests::ring::{self, RingJob, RingOptions, RING_PORT};
use yard_cluster_tests::yard::{ClusterOptions, YardCluster};
use yard_cluster_tests::Result;

const HOSTS: [usize; 3] = [1, 2, 3];

fn show(c: &YardCluster, args: &[&str]) -> Result<()> {
    let out = c.cli(1, args)?;
    let text = if out.status.success() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    println!("$ yard {}\n{}", args.join(" "), text.trim_end());
    Ok(())
}

fn run(yard: PathBuf, ring_bin: PathBuf, svg: PathBuf) -> Result<()> {
    let opts = ClusterOptions {
        extra_config: format!(
            "[probe]\ninterface = \"eth0\"\nports = [{RING_PORT}]\n[analyzer]\nslow_factor = 3.0\n"
        ),
        ..Default::default()
    };
    let c = YardCluster::start(&yard, 3, 3, &opts)?;
    let ring_opts = RingOptions {
        bytes: 256 << 10,
        ..RingOptions::default()
    };

    println!("probe demo: job 'llm' — 3 ranks, ring all-reduce of 256 KiB over TCP, one per host");
    let job = RingJob::start(&c, &ring_bin, "llm", &HOSTS, &ring_opts)?;
    let before = job.wait_done(40, Duration::from_secs(60))?;
    println!(
        "probe demo: {} all-reduces done, {:.1} ms each; the job is healthy:",
        before[0].done, before[0].mean_ms
    );
    show(&c, &["diagnose", "--job", "llm"])?;

    println!("probe demo: rate-limiting host 2's link to 20 mbit (TBF)");
    c.topo.rate_limit(2, 20)?;
    let (_, took) = ring::wait_verdicts(&c, 1, "llm", Duration::from_secs(30), |v| {
        v.iter().any(|v| v["class"] == "slow")
    })?;
    println!(
        "probe demo: slow verdict {:.1} s after the throttle:",
        took.as_secs_f64()
    );
    show(&c, &["diagnose", "--job", "llm"])?;
    c.topo.clear_rate_limit(2)?;
    job.stop()?;

    let job = RingJob::start(&c, &ring_bin, "llm-2", &HOSTS, &ring_opts)?;
    job.wait_done(20, Duration::from_secs(60))?;
    println!("probe demo: SIGSTOP of rank 1 (host 2) in job 'llm-2'");
    job.rank(1).stop()?;
    let (_, took) = ring::wait_verdicts(&c, 1, "llm-2", Duration::from_secs(15), |v| {
        v.first().is_some_and(|top| top["class"] == "hang")
    })?;
    println!(
        "probe demo: hang verdict {:.1} s after the SIGSTOP:",
        took.as_secs_f64()
    );
    let svg_arg = svg.display().to_string();
    show(&c, &["diagnose", "--job", "llm-2", "--svg", &svg_arg])?;
    println!("probe demo: timeline written to {svg_arg}");
    show(&c, &["diagnose", "--job", "llm-2", "--json"])?;
    job.rank(1).cont()?;
    job.stop()?;
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(yard), Some(ring_bin)) = (args.next(), args.next()) else {
        eprintln!("usage: probe-demo YARD_BIN RING_RANK_BIN [SVG_FILE]");
        return ExitCode::from(2);
    };
    let svg = args
        .next()
        .map_or_else(|| std::env::temp_dir().join("yard-hang.svg"), PathBuf::from);
    match run(PathBuf::from(yard), PathBuf::from(ring_bin), svg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("probe demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}
