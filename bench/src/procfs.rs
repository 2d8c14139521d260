//! Resident memory of a process, from `/proc/<pid>/status`.

use anyhow::{Context, Result};

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_vm_rss(&text).with_context(|| format!("{path} has no VmRSS line"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_kib() {
        let status = "Name:\tyard\nVmPeak:\t  100 kB\nVmRSS:\t   24576 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(status), Some(24576));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn reads_our_own_rss() {
        assert!(rss_kib(std::process::id()).unwrap() > 0);
    }
}
