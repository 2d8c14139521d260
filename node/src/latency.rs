//! Latency percentiles, computed one way for every benchmark that reports them (`yard bench kv`
//! and the yard-vs-etcd benchmark), so their figures compare.

use std::time::Duration;

use serde::Serialize;

/// The figures of one put workload: what `yard bench kv` prints and what the yard-vs-etcd
/// benchmark reports per round, for either system.
#[derive(Debug, Clone, Serialize)]
pub struct PutFigures {
    pub clients: usize,
    pub ops: usize,
    pub value_size: usize,
    pub errors: usize,
    pub duration_s: f64,
    pub throughput_ops_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl PutFigures {
    /// Figures from the latencies of the puts that succeeded (sorted here) and the run's length.
    pub fn new(
        clients: usize,
        ops: usize,
        value_size: usize,
        errors: usize,
        elapsed: Duration,
        mut samples: Vec<Duration>,
    ) -> Self {
        samples.sort_unstable();
        let secs = elapsed.as_secs_f64();
        Self {
            clients,
            ops,
            value_size,
            errors,
            duration_s: secs,
            throughput_ops_s: if secs > 0.0 {
                samples.len() as f64 / secs
            } else {
                0.0
            },
            p50_us: quantile_us(&samples, 0.50),
            p99_us: quantile_us(&samples, 0.99),
            p999_us: quantile_us(&samples, 0.999),
            max_us: samples.last().copied().map_or(0, micros),
        }
    }

    /// One line for people.
    pub fn human(&self) -> String {
        format!(
            "{} puts of {} B by {} clients in {:.2} s: {:.0} ops/s, p50 {} us, p99 {} us, p999 {} us, max {} us, {} errors",
            self.ops, self.value_size, self.clients, self.duration_s, self.throughput_ops_s, self.p50_us, self.p99_us, self.p999_us, self.max_us, self.errors
        )
    }
}

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
