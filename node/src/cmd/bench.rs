//! `yard bench kv`: concurrent puts against the cluster, throughput and latency percentiles.

use std::time::Instant;

use serde::Serialize;
use yard::client::AdminClient;
use yard::latency::{micros, quantile_us};
use yard::rpc::AdminRequest;

#[derive(Debug, Serialize)]
pub struct KvReport {
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

impl KvReport {
    pub fn human(&self) -> String {
        format!(
            "{} puts of {} B by {} clients in {:.2} s: {:.0} ops/s, p50 {} us, p99 {} us, p999 {} us, max {} us, {} errors",
            self.ops, self.value_size, self.clients, self.duration_s, self.throughput_ops_s, self.p50_us, self.p99_us, self.p999_us, self.max_us, self.errors
        )
    }
}

/// `make` builds one client per concurrent client: each has its own QUIC connection, as
/// separate client processes would.
pub async fn kv(
    make: impl Fn() -> anyhow::Result<AdminClient>,
    clients: usize,
    ops: usize,
    value_size: usize,
) -> anyhow::Result<KvReport> {
    let value = "x".repeat(value_size);
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let client = make()?;
        // Warm the connection so the handshake is not counted as a put.
        client.admin(AdminRequest::Status).await?;
        conns.push(client);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in conns.into_iter().enumerate() {
        let value = value.clone();
        let share = ops / clients + usize::from(c < ops % clients);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(share);
            let mut errors = 0;
            for i in 0..share {
                let t = Instant::now();
                let req = AdminRequest::KvPut {
                    key: format!("bench/{c}/{i}"),
                    value: value.clone(),
                };
                match client.admin(req).await {
                    Ok(_) => lat.push(t.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::with_capacity(ops);
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await?;
        all.extend(lat);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Ok(KvReport {
        clients,
        ops,
        value_size,
        errors,
        duration_s: elapsed,
        throughput_ops_s: all.len() as f64 / elapsed,
        p50_us: quantile_us(&all, 0.50),
        p99_us: quantile_us(&all, 0.99),
        p999_us: quantile_us(&all, 0.999),
        max_us: all.last().copied().map_or(0, micros),
    })
}
