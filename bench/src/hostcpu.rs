//! CPU time of one namespace host on a machine whose hosts share the CPUs.
//!
//! /proc/stat counts the whole machine: every host, the fabric and whatever else runs there
//! (on a shared machine, other people's builds). To charge a host only for its own work, its
//! interfaces' receive processing is moved out of softirq (which runs on whichever CPU, in
//! whichever task, raised it: usually the sender's) into NAPI kernel threads of its own
//! (threaded NAPI; a veth has NAPI when GRO is on), and the host's CPU is then its NAPI threads
//! plus its own processes' threads, each read from `/proc/…/schedstat` (nanoseconds run).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The pids of kernel threads whose name starts with `prefix`.
pub fn kthreads(prefix: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(prefix) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

fn run_in(ns: &str, script: &str) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", script])
        .output()
        .context("cannot run ip netns exec")?;
    if !out.status.success() {
        bail!(
            "`{script}` in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Turns on GRO (which gives a veth NAPI) and threaded NAPI for `dev` in `ns`, and returns its
/// new NAPI thread(s). Devices of the same name in other namespaces must not be switched at the
/// same time: the threads are told apart by appearing.
pub fn thread_napi(ns: &str, dev: &str) -> Result<Vec<u32>> {
    let prefix = format!("napi/{dev}-");
    let before = kthreads(&prefix);
    run_in(
        ns,
        &format!("ethtool -K {dev} gro on && echo 1 > /sys/class/net/{dev}/threaded"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let new: Vec<u32> = kthreads(&prefix)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        if !new.is_empty() {
            return Ok(new);
        }
        if Instant::now() >= deadline {
            bail!("no NAPI thread appeared for {dev} in {ns} (threaded NAPI unsupported?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Turns TX checksum offload (and with it TSO/GSO) on or off for `dev` in `ns`.
pub fn tx_offload(ns: &str, dev: &str, on: bool) -> Result<()> {
    let v = if on { "on" } else { "off" };
    run_in(ns, &format!("ethtool -K {dev} tx {v}"))
}

/// Nanoseconds the task has run, from its schedstat file (`/proc/<pid>/schedstat` or
/// `/proc/<pid>/task/<tid>/schedstat`); `None` when the task is gone.
fn schedstat_ns(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU seconds the processes or kernel threads `pids` have run; fails naming one that is gone.
pub fn pids_s(pids: &[u32]) -> Result<f64> {
    let mut ns = 0;
    for p in pids {
        ns += schedstat_ns(&format!("/proc/{p}/schedstat"))
            .with_context(|| format!("task {p} is gone"))?;
    }
    Ok(ns as f64 / 1e9)
}

/// CPU seconds thread `tid` of this process has run.
pub fn thread_s(tid: u32) -> Result<f64> {
    let ns = schedstat_ns(&format!("/proc/self/task/{tid}/schedstat"))
        .with_context(|| format!("thread {tid} is gone"))?;
    Ok(ns as f64 / 1e9)
}

/// The calling thread's id.
pub fn this_tid() -> u32 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|l| l.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// Frames lost inside `ns` so far: every interface's receive and transmit drops plus the UDP
/// stack's input errors (receive-buffer overflows included) (`ip -s link`, /proc/net/snmp of the namespace).
pub fn drops(ns: &str) -> Result<u64> {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "sh",
            "-c",
            "ip -s -o link; cat /proc/net/snmp",
        ])
        .output()
        .context("cannot run ip netns exec")?;
    Ok(parse_drops(&String::from_utf8_lossy(&out.stdout)))
}

/// The drops in `ip -s -o link` lines (RX and TX "dropped" columns) and /proc/net/snmp's Udp
/// InErrors.
fn parse_drops(text: &str) -> u64 {
    let mut total = 0;
    let mut udp_names: Option<Vec<&str>> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Udp: ") {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            match &udp_names {
                None => udp_names = Some(fields),
                Some(names) => {
                    for (n, v) in names.iter().zip(&fields) {
                        // InErrors includes RcvbufErrors.
                        if *n == "InErrors" {
                            total += v.parse::<u64>().unwrap_or(0);
                        }
                    }
                }
            }
            continue;
        }
        // One-line form: "... RX:  bytes packets errors dropped ...\    N N N N ...".
        for part in ["RX:", "TX:"] {
            if let Some(after) = line.split(part).nth(1) {
                let nums: Vec<u64> = after
                    .split('\\')
                    .nth(1)
                    .unwrap_or("")
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                total += nums.get(3).copied().unwrap_or(0);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_link_and_udp_drops() {
        let text = "2: eth0@if3: <UP> mtu 1500\\    link/ether 02:59 brd ff\\    RX:  bytes packets errors dropped  missed   mcast           \\    100 10 0 7 0 0 \\    TX:  bytes packets errors dropped carrier collsns           \\    50 5 0 2 0 0 \n\
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
Udp: 10 0 4 9 4 0\n";
        assert_eq!(parse_drops(text), 7 + 2 + 4);
    }
}
