//! `yard bench kv`: concurrent puts against the cluster, throughput and latency percentiles.

use std::time::Instant;

use yard::client::AdminClient;
use yard::latency::PutFigures;
use yard::rpc::AdminRequest;

/// `make` builds one client per concurrent client: each has its own QUIC connection, as
/// separate client processes would.
pub async fn kv(
    make: impl Fn() -> anyhow::Result<AdminClient>,
    clients: usize,
    ops: usize,
    value_size: usize,
) -> anyhow::Result<PutFigures> {
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
    Ok(PutFigures::new(
        clients,
        ops,
        value_size,
        errors,
        start.elapsed(),
        all,
    ))
}
