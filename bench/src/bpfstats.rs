//! The kernel's run statistics of BPF programs (run time and run count, counted only while
//! `kernel.bpf_stats_enabled` is 1): what an XDP program itself costs per frame inside a real
//! run, beside the CPU of the thread it runs in.

use anyhow::{Context, Result};

/// Enables the statistics and restores the previous setting when dropped. Counting costs every
/// program run two clock reads, so benchmarks turn it on only when asked.
pub struct Enabled(String);

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

pub fn enable() -> Result<Enabled> {
    let old = std::fs::read_to_string(SYSCTL).context("cannot read bpf_stats_enabled")?;
    std::fs::write(SYSCTL, "1").context("cannot enable bpf_stats_enabled")?;
    Ok(Enabled(old.trim().to_owned()))
}

impl Drop for Enabled {
    fn drop(&mut self) {
        let _ = std::fs::write(SYSCTL, &self.0);
    }
}

/// Ids of the loaded programs whose name is one of `names` (the kernel keeps 15 characters).
pub fn ids_named(names: &[&str]) -> Vec<u32> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.name_as_str().is_some_and(|n| names.contains(&n)))
        .map(|p| p.id())
        .collect()
}

/// `(name, run time ns, run count)` of each program of `ids` still loaded.
pub fn stats(ids: &[u32]) -> Vec<(String, u64, u64)> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| ids.contains(&p.id()))
        .map(|p| {
            (
                p.name_as_str().unwrap_or("?").to_owned(),
                u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX),
                p.run_count(),
            )
        })
        .collect()
}
