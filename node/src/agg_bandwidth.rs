//! Bandwidth measurement for the grouping (ALEPH): every aggregating host runs a sink on
//! `[aggregator] probe_port`; a node that runs a worker of a grouped job sends each host a
//! short TCP stream (`probe_bytes`), the sink times its arrival, and the node proposes the
//! rate (`AggCommand::Bandwidth`, smoothed in the tables, shown by `yard agg job show`). Which
//! hosts to measure and when is decided by `yard_actors::aggregator::bandwidth::due`.
//!
//! While a job runs, an aggregating host also watches its aggregator's counters
//! (`yard_actors::aggregator::bandwidth::Drift`): every [`COUNTERS_EVERY`] it compares the
//! rate each worker's frames arrived at while sending with its baseline, and marks a pair that
//! moved for measuring again (`AggCommand::Remeasure`), which its worker's node does within a
//! second; that measurement replaces the figure.
//!
//! The sink's clock times the stream, from its first byte to its last, so the figure is the
//! rate the bytes arrived at, not the sender's buffer filling. Frames: the sender writes the
//! 16-byte ticket the sink's node gave it over the node endpoint (`crate::sink_tickets`), a
//! u64 (little-endian) count, then that many bytes; the sink answers with two u64s, the bytes
//! it read and the nanoseconds between the first and the last. A stream without a good ticket
//! within [`TICKET_WAIT`] is closed untimed.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use yard_actors::aggregator::bandwidth::{bytes_per_s, due, Drift, Reading};
use yard_raft_store::NodeId;

use crate::agg_feed::{catch_up, Following, Inputs};
use crate::rpc::{AdminRequest, AggRequest, Reply, Request};
use crate::service::Node;
use crate::sink_tickets::{Ticket, TicketBook};
use crate::transport::Target;

/// How long the sink waits for a probe's ticket: the prober writes it first, at once.
pub const TICKET_WAIT: Duration = Duration::from_secs(1);

pub use crate::config::MAX_PROBE_BYTES;

/// Why a probe gave no figure.
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("cannot reach the bandwidth sink at {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the probe to {addr} broke off: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the probe to {addr} did not finish within {limit:?}")]
    Timeout { addr: SocketAddr, limit: Duration },
    #[error("the sink at {addr} read {got} of the {sent} bytes sent")]
    Short {
        addr: SocketAddr,
        sent: u64,
        got: u64,
    },
    #[error("node {node} gave no ticket for its bandwidth sink: {why}")]
    NoTicket { node: NodeId, why: String },
}

/// What the sink serves at most: probes at once, and how long one may take from its accept
/// to its answer.
#[derive(Debug, Clone, Copy)]
pub struct SinkLimits {
    pub connections: usize,
    pub deadline: Duration,
}

impl Default for SinkLimits {
    /// 32 probes at once: each node probes one host at a time, and nodes start from different
    /// hosts, so a host sees a few at once. 10 s: twice the prober's own limit, and the
    /// largest probe (`MAX_PROBE_BYTES`) at 50 Mbit/s.
    fn default() -> Self {
        SinkLimits {
            connections: 32,
            deadline: Duration::from_secs(10),
        }
    }
}

/// Serves the sink until the process ends: each connection's stream is read, timed and
/// answered; a bad one is dropped (and logged), never the listener. A connection past
/// `limits.connections` is closed at once, and one that has not finished within
/// `limits.deadline` as a whole is dropped (a per-read timeout let a sender that trickles a
/// byte at a time hold a connection for as long as it liked). An accept error (out of
/// descriptors, say) is logged and retried after a pause, never a busy loop.
///
/// Only a stream that opens with a ticket from `tickets` (given to a host of the cluster over
/// the node endpoint) is timed; any other is closed within [`TICKET_WAIT`], so a peer without
/// a certificate holds a slot for that long at most and never has a probe timed. The figure
/// itself is proposed by the prober, never the sink.
pub async fn serve_sink(
    listener: TcpListener,
    limits: SinkLimits,
    tickets: Arc<std::sync::Mutex<TicketBook>>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "bandwidth sink accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, limit = limits.connections, "bandwidth sink full: probe refused");
            continue;
        };
        let tickets = tickets.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(limits.deadline, sink(stream, &tickets)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "bandwidth probe dropped"),
                Err(_) => tracing::debug!(
                    %peer,
                    deadline_ms = limits.deadline.as_millis() as u64,
                    "bandwidth probe dropped: not finished within the deadline"
                ),
            }
        });
    }
}

async fn sink(
    mut stream: TcpStream,
    tickets: &std::sync::Mutex<TicketBook>,
) -> std::io::Result<()> {
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let mut ticket: Ticket = [0; 16];
    tokio::time::timeout(TICKET_WAIT, stream.read_exact(&mut ticket))
        .await
        .map_err(|_| refused("no ticket within the wait"))??;
    let host = tickets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take(&ticket, Instant::now())
        .ok_or_else(|| refused("not a ticket this node gave, or used or expired"))?;
    tracing::debug!(host, "timing a bandwidth probe");
    let count = stream.read_u64_le().await?;
    if count == 0 || count > MAX_PROBE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a probe of {count} bytes is not between 1 and {MAX_PROBE_BYTES}"),
        ));
    }
    let mut buf = vec![0u8; 64 << 10];
    let (mut got, mut first, mut last) = (0u64, None, Instant::now());
    while got < count {
        let want = usize::try_from((count - got).min(buf.len() as u64)).unwrap_or(buf.len());
        let n = stream.read(&mut buf[..want]).await?;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        got += n as u64;
    }
    let ns = first.map_or(0, |f| last.duration_since(f).as_nanos() as u64);
    stream.write_u64_le(got).await?;
    stream.write_u64_le(ns).await?;
    stream.flush().await
}

/// Sends `bytes` to the sink at `addr`, opening with `ticket`, and returns the rate they
/// arrived at, bytes/s.
pub async fn probe(
    addr: SocketAddr,
    ticket: Ticket,
    bytes: u64,
    limit: Duration,
) -> Result<u64, ProbeError> {
    let run = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|source| ProbeError::Connect { addr, source })?;
        let io = |source| ProbeError::Io { addr, source };
        s.write_all(&ticket).await.map_err(io)?;
        s.write_u64_le(bytes).await.map_err(io)?;
        let block = vec![0u8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(block.len() as u64)).unwrap_or(block.len());
            s.write_all(&block[..n]).await.map_err(io)?;
            left -= n as u64;
        }
        s.flush().await.map_err(io)?;
        let got = s.read_u64_le().await.map_err(io)?;
        let ns = s.read_u64_le().await.map_err(io)?;
        Ok::<_, ProbeError>((got, ns))
    };
    let (got, ns) = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| ProbeError::Timeout { addr, limit })??;
    if got != bytes {
        return Err(ProbeError::Short {
            addr,
            sent: bytes,
            got,
        });
    }
    Ok(rate(bytes, ns))
}

/// Bytes/s of `bytes` that arrived over `ns` (at least a microsecond, so a loopback burst
/// gives a large figure rather than a division by zero). The clock starts with the first read,
/// so its bytes (at most 64 KiB of the stream) are counted as if instant: for the default
/// 4 MiB probe the figure is at most 1.6% high.
fn rate(bytes: u64, ns: u64) -> u64 {
    bytes_per_s(bytes, ns.max(1_000))
}

/// How often an aggregating host compares its counters with their baselines (`Drift`): long
/// enough for a reading to average over many rounds, short enough to follow a link that
/// changes.
pub const COUNTERS_EVERY: Duration = Duration::from_secs(5);

/// Asks node `host` (at its node address `addr`) for a ticket to its bandwidth sink.
async fn ticket(node: &Node, host: NodeId, addr: String) -> Result<Ticket, ProbeError> {
    let no = |why: String| ProbeError::NoTicket { node: host, why };
    match node
        .transport()
        .call(
            Target::node(host, addr),
            Request::BandwidthTicket,
            node.rpc_timeout(),
        )
        .await
    {
        Ok(Reply::BandwidthTicket { ticket }) => Ok(ticket),
        Ok(Reply::Error(why)) => Err(no(why)),
        Ok(other) => Err(no(format!("unexpected {other:?}"))),
        Err(e) => Err(no(e.to_string())),
    }
}

/// Proposes the figure from `from` to `to`; a failed write is logged and left to the next
/// measurement.
async fn propose(node: &Node, from: NodeId, to: NodeId, bytes_per_s: u64) {
    let req = AdminRequest::Agg(AggRequest::Bandwidth {
        from,
        to,
        bytes_per_s,
    });
    if let Reply::Error(why) | Reply::Indefinite(why) = node.serve_admin(req).await {
        tracing::warn!(from, to, %why, "bandwidth figure not recorded");
    }
}

/// The aggregator's readings now (none if this node runs no aggregator).
fn readings(node: &Node) -> Vec<Reading> {
    node.agg_view().map_or_else(Vec::new, |v| {
        v.snapshot()
            .jobs
            .into_iter()
            .flat_map(|j| j.links)
            .collect()
    })
}

/// What the measuring loop needs from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub me: NodeId,
    pub my_ip: Ipv4Addr,
    pub port: u16,
    pub bytes: u64,
    pub every: Duration,
}

/// Runs until the process ends: every [`COUNTERS_EVERY`], marks the pairs whose rate moved in
/// this host's counters; every second, probes the hosts `due` names, one at a time, and
/// proposes each figure.
pub async fn run(node: Node, s: Settings) {
    let began = Instant::now();
    let mut last: BTreeMap<NodeId, u64> = BTreeMap::new();
    let every_ms = u64::try_from(s.every.as_millis()).unwrap_or(u64::MAX);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut drift = Drift::default();
    let mut counters_at = Instant::now();
    // The tables and node addresses, followed through the change feed: the due-list and the
    // drift search below run on them off the state machine's lock.
    let mut following: Following = None;
    loop {
        tick.tick().await;
        if !catch_up(|| node.feed().subscribe_with(Inputs::of), &mut following) {
            return;
        }
        let Some((inputs, _)) = following.as_ref() else {
            continue;
        };
        let (tables, node_ips) = (Arc::clone(&inputs.tables), inputs.node_ips.clone());
        let node_addrs = &inputs.node_addrs;
        if counters_at.elapsed() >= COUNTERS_EVERY {
            counters_at = Instant::now();
            let now = readings(&node);
            let moved = drift.observe(&tables, s.me, &node_ips, now);
            for from in moved {
                tracing::info!(
                    from,
                    "a worker's rate moved in the counters: measuring again"
                );
                let req = AdminRequest::Agg(AggRequest::Remeasure { from, to: s.me });
                let committed = match node.serve_admin(req).await {
                    Reply::Error(why) | Reply::Indefinite(why) => {
                        tracing::warn!(from, %why, "measuring again not recorded; marking again at the next reading");
                        false
                    }
                    _ => true,
                };
                drift.settle(from, committed);
            }
        }
        let now_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let todo = due(&tables, s.me, s.my_ip, &last, now_ms, every_ms);
        for host in todo {
            let (Some(ip), Some(node_addr)) = (
                tables.hosts.get(&host).map(|h| h.ip),
                node_addrs.get(&host).cloned(),
            ) else {
                continue;
            };
            let now_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
            last.insert(host, now_ms);
            let addr = SocketAddr::V4(SocketAddrV4::new(ip, s.port));
            let measured = match ticket(&node, host, node_addr).await {
                Ok(t) => probe(addr, t, s.bytes, Duration::from_secs(5)).await,
                Err(e) => Err(e),
            };
            match measured {
                Ok(bytes_per_s) => {
                    tracing::info!(to = host, bytes_per_s, "bandwidth measured");
                    propose(&node, s.me, host, bytes_per_s).await;
                }
                Err(e) => tracing::warn!(to = host, error = %e, "bandwidth probe failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink on loopback with `limits`, and its ticket book.
    fn sink_on(listener: TcpListener, limits: SinkLimits) -> Arc<std::sync::Mutex<TicketBook>> {
        let book = Arc::new(std::sync::Mutex::new(TicketBook::default()));
        tokio::spawn(serve_sink(listener, limits, book.clone()));
        book
    }

    /// A ticket given to host 2, as the sink's node does over the node endpoint.
    fn given(book: &std::sync::Mutex<TicketBook>) -> Ticket {
        let ticket: Ticket = rand::random();
        book.lock().unwrap().give(ticket, 2, Instant::now());
        ticket
    }

    #[tokio::test]
    async fn a_probe_over_loopback_arrives_whole_and_gives_a_rate() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let book = sink_on(listener, SinkLimits::default());
        let bps = probe(addr, given(&book), 4 << 20, Duration::from_secs(5))
            .await
            .unwrap();
        // Loopback moves gigabytes a second; anything under 10 MB/s would be a broken clock.
        assert!(bps > 10 << 20, "{bps} bytes/s");
        let err = probe(
            addr,
            given(&book),
            MAX_PROBE_BYTES + 1,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ProbeError::Io { .. }), "{err}");
    }

    /// Issue 25: the sink authenticated nobody. A probe with a ticket the node never gave, one
    /// used already, or none at all is closed untimed; a silent connection within the ticket
    /// wait, not the 10 s deadline.
    #[tokio::test]
    async fn only_a_probe_with_a_ticket_the_node_gave_is_timed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let book = sink_on(listener, SinkLimits::default());
        let forged: Ticket = rand::random();
        let err = probe(addr, forged, 1 << 20, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ProbeError::Io { .. }), "{err}");
        let ticket = given(&book);
        assert!(probe(addr, ticket, 1 << 20, Duration::from_secs(5))
            .await
            .is_ok());
        let err = probe(addr, ticket, 1 << 20, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ProbeError::Io { .. }), "reused: {err}");
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let took = closed_after(&mut silent, Duration::from_secs(5))
            .await
            .expect("a connection without a ticket stayed open");
        assert!(took < TICKET_WAIT + Duration::from_millis(500), "{took:?}");
    }

    /// Reads from `s` until the sink closes it; how long that took (at most `within`).
    async fn closed_after(s: &mut TcpStream, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        let mut buf = [0u8; 64];
        tokio::time::timeout(within, async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return start.elapsed(),
                    Ok(_) => {}
                }
            }
        })
        .await
        .ok()
    }

    /// A sender that trickles a byte every 50 ms (each read well within any per-read
    /// timeout) is dropped at the whole transfer's deadline.
    #[tokio::test]
    async fn a_slow_sender_is_dropped_at_the_whole_transfer_s_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = SinkLimits {
            connections: 4,
            deadline: Duration::from_millis(500),
        };
        let book = sink_on(listener, limits);
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut r, mut w) = s.into_split();
        w.write_all(&given(&book)).await.unwrap();
        w.write_u64_le(1 << 20).await.unwrap();
        let trickle = tokio::spawn(async move {
            while w.write_all(&[0]).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let start = Instant::now();
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(5), r.read(&mut buf)).await;
        trickle.abort();
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "the trickling probe was still open after 5 s: {closed:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    /// Past the cap, a connection is closed at once; those within it are served.
    #[tokio::test]
    async fn connections_past_the_cap_are_closed_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = SinkLimits {
            connections: 2,
            deadline: Duration::from_secs(30),
        };
        let book = sink_on(listener, limits);
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        let took = closed_after(&mut third, Duration::from_secs(3)).await;
        assert!(
            took.is_some(),
            "a third connection was held past a cap of 2"
        );
        for s in &mut held {
            assert_eq!(
                closed_after(s, Duration::from_millis(200)).await,
                None,
                "the two within the cap stay open"
            );
        }
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let bps = probe(addr, given(&book), 1 << 20, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(bps > 0, "a probe is served once the others are gone");
    }

    #[test]
    fn a_rate_is_bytes_over_the_arrival_time() {
        assert_eq!(rate(1_000_000, 1_000_000_000), 1_000_000);
        assert_eq!(rate(1000, 0), 1_000_000_000, "at least a microsecond");
    }
}
