//! The clock of `bpf_ktime_get_ns()`.

use rustix::time::{clock_gettime, ClockId};

/// CLOCK_MONOTONIC now, in ns: the clock `bpf_ktime_get_ns()` reads, so the daemon can turn
/// "lease valid for D" into the absolute deadline the XDP program compares with
/// (`ktime_now_ns() + D`). Not wall time: it does not jump with NTP and stops during suspend.
pub fn ktime_now_ns() -> u64 {
    let ts = clock_gettime(ClockId::Monotonic);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_and_nonzero() {
        let a = super::ktime_now_ns();
        let b = super::ktime_now_ns();
        assert!(a > 0 && b >= a);
    }
}
