//! Prometheus metrics: process-wide counters plus gauges read from openraft at scrape time,
//! served as text on a plain HTTP port.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Every counter the node keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    pub rpc_sent: Counter,
    pub rpc_failed: Counter,
    pub rpc_served: Counter,
    pub frame_errors: Counter,
    pub handshake_failed: Counter,
    pub requests_refused: Counter,
    pub kv_writes: Counter,
    pub kv_reads: Counter,
    pub forwarded: Counter,
    pub forward_retries: Counter,
    pub liveness_probes: Counter,
    pub liveness_probe_failures: Counter,
    pub gateway_renewals: Counter,
    pub gateway_placements: Counter,
}

/// The process's counters.
pub static METRICS: Metrics = Metrics {
    rpc_sent: Counter(AtomicU64::new(0)),
    rpc_failed: Counter(AtomicU64::new(0)),
    rpc_served: Counter(AtomicU64::new(0)),
    frame_errors: Counter(AtomicU64::new(0)),
    handshake_failed: Counter(AtomicU64::new(0)),
    requests_refused: Counter(AtomicU64::new(0)),
    kv_writes: Counter(AtomicU64::new(0)),
    kv_reads: Counter(AtomicU64::new(0)),
    forwarded: Counter(AtomicU64::new(0)),
    forward_retries: Counter(AtomicU64::new(0)),
    liveness_probes: Counter(AtomicU64::new(0)),
    liveness_probe_failures: Counter(AtomicU64::new(0)),
    gateway_renewals: Counter(AtomicU64::new(0)),
    gateway_placements: Counter(AtomicU64::new(0)),
};

/// Gauges that a scrape reads from live state.
pub trait GaugeSource: Send + Sync + 'static {
    /// `(name, help, value)` triples.
    fn gauges(&self) -> Vec<(&'static str, &'static str, f64)>;

    /// Labelled families (e.g. one XDP counter per reason); none by default.
    fn families(&self) -> Vec<Family> {
        Vec::new()
    }
}

/// A metric family with labelled samples.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// (label set without braces, e.g. `reason="forwarded"`, value)
    pub samples: Vec<(String, f64)>,
}

/// Renders the Prometheus text exposition.
pub fn render(gauges: &dyn GaugeSource) -> String {
    let m = &METRICS;
    let counters: [(&str, &str, &Counter); 14] = [
        (
            "yard_transport_rpc_sent_total",
            "requests sent to peers",
            &m.rpc_sent,
        ),
        (
            "yard_transport_rpc_failed_total",
            "requests to peers that failed or timed out",
            &m.rpc_failed,
        ),
        (
            "yard_transport_rpc_served_total",
            "request streams served",
            &m.rpc_served,
        ),
        (
            "yard_transport_frame_errors_total",
            "malformed, truncated or oversize frames refused",
            &m.frame_errors,
        ),
        (
            "yard_transport_handshake_failed_total",
            "connections refused during the TLS handshake",
            &m.handshake_failed,
        ),
        (
            "yard_requests_refused_total",
            "requests refused for the peer's role",
            &m.requests_refused,
        ),
        (
            "yard_kv_writes_total",
            "kv writes accepted by this node",
            &m.kv_writes,
        ),
        (
            "yard_kv_reads_total",
            "kv reads served by this node",
            &m.kv_reads,
        ),
        (
            "yard_forwarded_total",
            "requests forwarded to the leader",
            &m.forwarded,
        ),
        (
            "yard_forward_retries_total",
            "forwarded reads and session-tagged writes sent again after a leader change or an unknown outcome",
            &m.forward_retries,
        ),
        (
            "yard_liveness_probes_total",
            "liveness probes sent",
            &m.liveness_probes,
        ),
        (
            "yard_liveness_probe_failures_total",
            "liveness probes that failed",
            &m.liveness_probe_failures,
        ),
        (
            "yard_gateway_lease_renewals_total",
            "gateway lease renewals granted by this node as leader",
            &m.gateway_renewals,
        ),
        (
            "yard_gateway_placements_total",
            "gateway placement commands committed by this node as leader",
            &m.gateway_placements,
        ),
    ];
    let mut out = String::new();
    for (name, help, c) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            c.get()
        );
    }
    for (name, help, v) in gauges.gauges() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    for f in gauges.families() {
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} {}",
            f.name, f.help, f.name, f.kind
        );
        for (labels, v) in f.samples {
            let _ = writeln!(out, "{}{{{labels}}} {v}", f.name);
        }
    }
    out
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, gauges: Arc<dyn GaugeSource>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let gauges = gauges.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = match tokio::time::timeout(
                std::time::Duration::from_secs(5),
                stream.read(&mut buf),
            )
            .await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if head.starts_with("GET /metrics") {
                ("200 OK", render(gauges.as_ref()))
            } else {
                ("404 Not Found", "only /metrics is served here\n".to_owned())
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(resp.as_bytes()).await;
        });
    }
}
