//! Latency percentiles, computed one way for every benchmark that reports them (`yard bench kv`
//! and the yard-vs-etcd benchmark), so their figures compare.

use std::time::Duration;

/// A duration in whole microseconds, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The `q`-quantile of sorted samples by nearest rank, in µs; 0 for no samples.
pub fn quantile_us(sorted: &[Duration], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    micros(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile_us(&v, 0.5), 50);
        assert_eq!(quantile_us(&v, 0.99), 99);
        assert_eq!(quantile_us(&v, 0.999), 100);
        assert_eq!(quantile_us(&[], 0.5), 0);
    }
}
