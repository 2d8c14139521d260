//! How requests travel between nodes: a [`Transport`] sends, a [`Handler`] answers. The QUIC
//! implementation is what runs in production; [`MemNetwork`] runs whole clusters inside one test
//! process and can drop, delay and partition traffic.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use yard_raft_store::NodeId;

use crate::frame::{self, FrameError};
use crate::metrics::METRICS;
use crate::rpc::{Reply, Request};
use crate::tls::{self, PeerRole};

/// A boxed, sendable future: what the object-safe traits below return.
pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where a request goes: an address, and the node id its certificate must carry when known.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub addr: String,
    pub id: Option<NodeId>,
}

impl Target {
    pub fn node(id: NodeId, addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            id: Some(id),
        }
    }
    pub fn any(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            id: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot reach {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("request to {addr} timed out after {ms} ms")]
    Timeout { addr: String, ms: u128 },
    #[error("exchange with {addr} failed: {source}")]
    Frame { addr: String, source: FrameError },
}

/// Sends one request and waits for its reply.
pub trait Transport: Send + Sync + 'static {
    fn call(
        &self,
        target: Target,
        req: Request,
        timeout: Duration,
    ) -> BoxFut<Result<Reply, TransportError>>;
}

/// Answers one request from a peer whose role the transport established.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, role: PeerRole, req: Request) -> BoxFut<Reply>;
}

/// The QUIC transport: one endpoint for both directions, one cached connection per target,
/// one bidirectional stream per request.
pub struct QuicTransport {
    endpoint: quinn::Endpoint,
    /// Replaced when the node's certificate is renewed or reloaded ([`Self::reload`]).
    client: Mutex<quinn::ClientConfig>,
    cluster: String,
    max_frame: u32,
    conns: Mutex<HashMap<Target, Cached>>,
    /// Handshakes in flight, one per target, each run to its end by a task of its own: callers
    /// wait for it with their own timeouts, and one that gives up leaves it running, so the
    /// connection is there for the next call. (Aborting handshakes at a short RPC timeout made
    /// a loaded host start a new handshake per call, none of which finished in time.)
    dialing: Mutex<HashMap<Target, Dial>>,
}

/// A connection kept for reuse, until its server's certificate expires: past that instant a
/// new handshake must show a valid one (a cached connection would otherwise outlive the
/// certificate that opened it by as long as it stays busy).
struct Cached {
    conn: quinn::Connection,
    expires: Option<SystemTime>,
}

impl Cached {
    fn new(conn: quinn::Connection) -> Self {
        let expires = peer_certificate(&conn).and_then(|c| tls::not_after(&c));
        Self { conn, expires }
    }

    fn usable(&self, now: SystemTime) -> bool {
        self.conn.close_reason().is_none() && self.expires.is_none_or(|at| now < at)
    }
}

/// The certificate the other end of `conn` showed in its handshake, if any.
fn peer_certificate(
    conn: &quinn::Connection,
) -> Option<rustls::pki_types::CertificateDer<'static>> {
    conn.peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?
        .into_iter()
        .next()
}

/// A handshake's outcome, once known.
type Dial = tokio::sync::watch::Receiver<Option<Result<quinn::Connection, String>>>;

/// How long a handshake may run in the background before it counts as failed.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

impl QuicTransport {
    pub fn new(
        endpoint: quinn::Endpoint,
        client: quinn::ClientConfig,
        cluster: String,
        max_frame: u32,
    ) -> Arc<Self> {
        Arc::new(Self {
            endpoint,
            client: Mutex::new(client),
            cluster,
            max_frame,
            conns: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
        })
    }

    fn cached(&self, target: &Target) -> Option<quinn::Connection> {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .get(target)
            .filter(|c| c.usable(SystemTime::now()))
            .map(|c| c.conn.clone())
    }

    /// Presents `identity` from now on: in new handshakes as a client, and as the server of
    /// the endpoint. Cached connections are dropped from the cache so that the next call dials
    /// with the new certificate; calls in flight keep theirs until they finish, and QUIC closes
    /// a connection once its last user is gone.
    pub fn reload(&self, identity: &tls::Identity) -> Result<(), tls::TlsError> {
        let client = tls::client_config(
            &self.cluster,
            tls::Trust::Ca(identity.trust.clone()),
            Some(identity),
        )?;
        let server = tls::server_config(identity)?;
        self.endpoint.set_server_config(Some(server));
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = client;
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }

    fn evict(&self, target: &Target) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(target);
    }

    async fn connect(
        self: &Arc<Self>,
        target: &Target,
    ) -> Result<quinn::Connection, TransportError> {
        if let Some(conn) = self.cached(target) {
            return Ok(conn);
        }
        let mut dial = {
            let mut dialing = self.dialing.lock().unwrap_or_else(|e| e.into_inner());
            match dialing.get(target) {
                Some(d) => d.clone(),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    dialing.insert(target.clone(), rx.clone());
                    let (this, target) = (self.clone(), target.clone());
                    tokio::spawn(async move {
                        let result = tokio::time::timeout(HANDSHAKE_LIMIT, this.dial(&target))
                            .await
                            .unwrap_or_else(|_| {
                                Err(format!(
                                    "no handshake within {} s",
                                    HANDSHAKE_LIMIT.as_secs()
                                ))
                            });
                        if let Ok(conn) = &result {
                            this.conns
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(target.clone(), Cached::new(conn.clone()));
                        }
                        this.dialing
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&target);
                        let _ = tx.send(Some(result));
                    });
                    rx
                }
            }
        };
        let outcome = match dial.wait_for(Option::is_some).await {
            Ok(done) => done.clone(),
            Err(_) => Some(Err("the handshake task ended".to_owned())),
        };
        outcome
            .unwrap_or_else(|| Err("no handshake".to_owned()))
            .map_err(|reason| TransportError::Unreachable {
                addr: target.addr.clone(),
                reason,
            })
    }

    /// One handshake with `target`.
    async fn dial(&self, target: &Target) -> Result<quinn::Connection, String> {
        let addr = resolve(&target.addr).await?;
        let name = tls::expected_server_name(&self.cluster, target.id);
        let client = self
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.endpoint
            .connect_with(client, addr, &name)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())
    }

    async fn exchange(
        &self,
        conn: &quinn::Connection,
        target: &Target,
        req: &Request,
    ) -> Result<Reply, TransportError> {
        let frame_err = |source| TransportError::Frame {
            addr: target.addr.clone(),
            source,
        };
        let (send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| TransportError::Unreachable {
                addr: target.addr.clone(),
                reason: e.to_string(),
            })?;
        let mut request = Abandon(Some(send));
        let send = request.0.as_mut().expect("just set");
        frame::write(send, req).await.map_err(frame_err)?;
        let _ = send.finish();
        let reply = frame::read(&mut recv, self.max_frame)
            .await
            .map_err(frame_err)?;
        // Answered: the request was delivered, nothing to abandon.
        request.0 = None;
        Ok(reply)
    }

    async fn connect_within(
        self: &Arc<Self>,
        target: &Target,
        timeout: Duration,
    ) -> Result<quinn::Connection, TransportError> {
        tokio::time::timeout(timeout, self.connect(target))
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::Unreachable {
                    addr: target.addr.clone(),
                    reason: format!("no handshake within {} ms", timeout.as_millis()),
                })
            })
    }

    async fn exchange_within(
        &self,
        conn: &quinn::Connection,
        target: &Target,
        req: &Request,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        tokio::time::timeout(timeout, self.exchange(conn, target, req))
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::Timeout {
                    addr: target.addr.clone(),
                    ms: timeout.as_millis(),
                })
            })
    }

    async fn call_inner(
        self: Arc<Self>,
        target: Target,
        req: Request,
        timeout: Duration,
        handshake: Duration,
    ) -> Result<Reply, TransportError> {
        let conn = self.connect_within(&target, timeout.min(handshake)).await?;
        match self.exchange_within(&conn, &target, &req, timeout).await {
            Ok(reply) => Ok(reply),
            // A cached connection may have died since it was cached. Dial once more, but only
            // if the stream could not even be opened: once a request may have been sent, a
            // retry could apply it twice (a compare-and-swap would then report failure for a
            // write that happened), so the caller gets the error and treats it as unknown.
            Err(TransportError::Unreachable { .. }) if conn.close_reason().is_some() => {
                self.evict(&target);
                let conn = self.connect_within(&target, timeout).await?;
                self.exchange_within(&conn, &target, &req, timeout).await
            }
            // A slow answer is no reason to drop a live connection (a new handshake costs
            // more than waiting); a dead one is closed by QUIC's keep-alive and idle timeout.
            Err(e) => {
                if conn.close_reason().is_some() {
                    self.evict(&target);
                }
                Err(e)
            }
        }
    }
}

/// A request stream that is reset unless its reply arrived: when the caller gives up (its
/// timeout, or it was dropped), QUIC abandons the request instead of retransmitting it.
///
/// Why: behind a partition, QUIC keeps a request's bytes and retransmits them until the
/// connection idles out (3 s), so a request whose caller had long given up reached the peer
/// when the partition healed: a write its client was told had failed applied seconds later,
/// after newer writes (seen as a minority-side `kv put` overwriting the majority's value in the
/// namespace suite). A reset discards the unsent and unacknowledged data; a request the peer
/// already received in full is not recalled, which is why a timed-out write stays "unknown".
struct Abandon(Option<quinn::SendStream>);

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(send) = &mut self.0 {
            let _ = send.reset(quinn::VarInt::from_u32(0));
        }
    }
}

impl QuicTransport {
    /// Closes every connection and waits (briefly) until the peers were told: a process about
    /// to exit calls this, so that requests it gave up on are dropped by the nodes at once
    /// (see `serve_stream`) rather than when QUIC's idle timeout notices it is gone.
    pub async fn close(&self) {
        self.endpoint.close(0u32.into(), b"done");
        let _ = tokio::time::timeout(Duration::from_millis(250), self.endpoint.wait_idle()).await;
    }
}

/// Arc wrapper so the transport can hand out `'static` futures.
#[derive(Clone)]
pub struct Quic(pub Arc<QuicTransport>);

impl Transport for Quic {
    /// `timeout` bounds the handshake and the exchange separately. A handshake that does not
    /// finish in time counts as unreachable (a dead host answers nothing), so callers with
    /// several endpoints move on to the next one; a request that does not finish in time is a
    /// timeout, whose outcome is unknown.
    fn call(
        &self,
        target: Target,
        req: Request,
        timeout: Duration,
    ) -> BoxFut<Result<Reply, TransportError>> {
        Box::pin(self.clone().call_bounded(target, req, timeout, timeout))
    }
}

impl Quic {
    /// [`Transport::call`] with the handshake bounded by `handshake` (clients with several
    /// endpoints: a dead one must not use up the whole request budget before the next is tried).
    pub async fn call_bounded(
        self,
        target: Target,
        req: Request,
        timeout: Duration,
        handshake: Duration,
    ) -> Result<Reply, TransportError> {
        let this = self.0;
        METRICS.rpc_sent.inc();
        let result = this
            .clone()
            .call_inner(target.clone(), req, timeout, handshake)
            .await;
        if result.is_err() {
            METRICS.rpc_failed.inc();
        }
        result
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(sa) = addr.parse() {
        return Ok(sa);
    }
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

/// Binds this node's QUIC endpoint on `addr`, serving with `server`, with the node's own
/// stateless-reset key ([`crate::tls::endpoint_config`]) so that after a restart its peers'
/// connections to the previous process are reset instead of timing out.
pub fn bind_node_endpoint(
    addr: SocketAddr,
    identity: &crate::tls::Identity,
    server: quinn::ServerConfig,
) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(addr)?;
    quinn::Endpoint::new(
        crate::tls::endpoint_config(identity),
        Some(server),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// What the endpoint lets a peer hold: how large a frame and how long to send it, how many
/// connections and streams. Every limit is there so that a peer, and above all one without a
/// certificate, cannot make the node buffer more than a bounded amount (issue 25: an
/// anonymous client could open 1,024 streams per connection and start a 16 MiB frame on each,
/// read into memory before its role was checked, with no deadline and no connection cap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeLimits {
    /// The largest frame a peer with a certificate may send.
    pub max_frame: u32,
    /// The largest frame a peer without one may send (a token redemption).
    pub anonymous_max_frame: u32,
    /// How long a peer has to send a whole request frame.
    pub read_timeout: Duration,
    /// Connections, handshakes included.
    pub max_connections: usize,
    /// Connections, handshakes included, from one source address.
    pub max_connections_per_ip: usize,
    /// Connections from peers without a certificate.
    pub anonymous_max_connections: usize,
    /// Concurrent streams a peer with a certificate may open on one connection (one without
    /// keeps [`tls::UNAUTHENTICATED_STREAMS`]).
    pub max_streams: u32,
}

impl ServeLimits {
    /// The defaults of the `[transport]` section with `max_frame` as the frame limit.
    pub fn with_max_frame(max_frame: u32) -> Self {
        let t = crate::config::TransportSection::default();
        Self {
            max_frame,
            anonymous_max_frame: t.anonymous_max_frame_bytes.min(max_frame),
            ..Self::from(&t)
        }
    }

    /// The frame limit for a peer of `role`.
    fn frame_for(&self, role: PeerRole) -> u32 {
        match role {
            PeerRole::Anonymous => self.anonymous_max_frame,
            _ => self.max_frame,
        }
    }
}

impl From<&crate::config::TransportSection> for ServeLimits {
    fn from(t: &crate::config::TransportSection) -> Self {
        Self {
            max_frame: t.max_frame_bytes,
            anonymous_max_frame: t.anonymous_max_frame_bytes,
            read_timeout: Duration::from_millis(t.read_timeout_ms),
            max_connections: t.max_connections,
            max_connections_per_ip: t.max_connections_per_ip,
            anonymous_max_connections: t.anonymous_max_connections,
            max_streams: t.max_streams_per_connection,
        }
    }
}

/// The connections the endpoint holds, by source address and role.
#[derive(Default)]
struct ConnCounts {
    total: usize,
    anonymous: usize,
    per_ip: HashMap<std::net::IpAddr, usize>,
}

/// One connection's place in [`ConnCounts`], given back when it is dropped.
struct ConnSlot {
    counts: Arc<Mutex<ConnCounts>>,
    ip: std::net::IpAddr,
    anonymous: bool,
}

impl ConnSlot {
    /// Takes a place for a connection from `ip`, or says in one sentence which cap is full.
    fn take(
        counts: &Arc<Mutex<ConnCounts>>,
        ip: std::net::IpAddr,
        limits: &ServeLimits,
    ) -> Result<Self, String> {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.total >= limits.max_connections {
            return Err(format!(
                "the node holds its limit of {} connections",
                limits.max_connections
            ));
        }
        let from_ip = c.per_ip.entry(ip).or_default();
        if *from_ip >= limits.max_connections_per_ip {
            return Err(format!(
                "{ip} holds its limit of {} connections",
                limits.max_connections_per_ip
            ));
        }
        *from_ip += 1;
        c.total += 1;
        Ok(Self {
            counts: counts.clone(),
            ip,
            anonymous: false,
        })
    }

    /// Counts this connection as one without a certificate, or says why it may not be.
    fn anonymous(&mut self, limits: &ServeLimits) -> Result<(), String> {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.anonymous >= limits.anonymous_max_connections {
            return Err(format!(
                "the node holds its limit of {} connections without a certificate",
                limits.anonymous_max_connections
            ));
        }
        c.anonymous += 1;
        self.anonymous = true;
        Ok(())
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
        if self.anonymous {
            c.anonymous -= 1;
        }
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
    }
}

/// The application close code of a connection refused for a limit.
const CLOSE_LIMIT: u32 = 1;

/// The application close code of a connection whose client certificate expired.
const CLOSE_EXPIRED: u32 = 2;

/// Accepts connections on `endpoint` until it closes, answering each stream with `handler`,
/// within `limits`.
pub async fn serve(
    endpoint: quinn::Endpoint,
    handler: Arc<dyn Handler>,
    cluster: String,
    limits: ServeLimits,
) {
    let limits = Arc::new(limits);
    let counts = Arc::new(Mutex::new(ConnCounts::default()));
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        // Counted before the handshake: a handshake costs memory and CPU too.
        let mut slot = match ConnSlot::take(&counts, remote.ip(), &limits) {
            Ok(slot) => slot,
            Err(reason) => {
                METRICS.requests_refused.inc();
                tracing::warn!(%remote, %reason, "refused connection");
                incoming.refuse();
                continue;
            }
        };
        let handler = handler.clone();
        let cluster = cluster.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => {
                    // The client only sees "connection lost"; the reason is logged here.
                    METRICS.handshake_failed.inc();
                    tracing::warn!(%remote, error = %e, "refused connection");
                    return;
                }
            };
            let cert = peer_certificate(&conn);
            let role = cert
                .as_ref()
                .map_or(PeerRole::Anonymous, |c| tls::role_of(&cluster, c));
            if role == PeerRole::Anonymous {
                if let Err(reason) = slot.anonymous(&limits) {
                    METRICS.requests_refused.inc();
                    tracing::warn!(%remote, ?role, %reason, "refused connection");
                    conn.close(CLOSE_LIMIT.into(), reason.as_bytes());
                    return;
                }
            } else {
                // A certificate's holder gets the streams and the flow-control credit it was
                // denied while its role was unknown (`tls::UNAUTHENTICATED_WINDOW`).
                conn.set_max_concurrent_bi_streams(limits.max_streams.into());
                conn.set_receive_window(quinn::VarInt::MAX);
            }
            tracing::debug!(%remote, ?role, "accepted connection");
            // The handshake checked the certificate's validity once, to the second (webpki
            // still takes a certificate during the second it expires in); the connection ends
            // when it runs out, and no stream is served at or past that instant, so a
            // certificate that expires (is not renewed) stops being served then, not when the
            // peer happens to reconnect.
            let expiry = cert.as_ref().and_then(|c| tls::not_after(c));
            let past = |at: SystemTime| SystemTime::now() >= at;
            let expired = async {
                match expiry.and_then(|at| at.duration_since(SystemTime::now()).ok()) {
                    Some(left) => tokio::time::sleep(left).await,
                    None if expiry.is_some() => {}
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(expired);
            loop {
                let next = tokio::select! {
                    biased;
                    () = &mut expired => None,
                    next = conn.accept_bi() => match next {
                        Ok(streams) => Some(streams),
                        Err(_) => break,
                    },
                };
                let Some((send, recv)) = next.filter(|_| !expiry.is_some_and(past)) else {
                    tracing::info!(%remote, ?role, "closed a connection whose client certificate expired");
                    conn.close(CLOSE_EXPIRED.into(), b"your certificate expired");
                    break;
                };
                let handler = handler.clone();
                tokio::spawn(serve_stream(
                    send,
                    recv,
                    handler,
                    role,
                    limits.clone(),
                    remote,
                ));
            }
            drop(slot);
        });
    }
}

async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    handler: Arc<dyn Handler>,
    role: PeerRole,
    limits: Arc<ServeLimits>,
    remote: SocketAddr,
) {
    METRICS.rpc_served.inc();
    let max_frame = limits.frame_for(role);
    // The whole frame within the deadline: a peer that stalls mid-frame holds its buffer
    // (up to its frame limit) and this task only that long.
    let read = tokio::time::timeout(
        limits.read_timeout,
        frame::read::<Request, _>(&mut recv, max_frame),
    )
    .await;
    let Ok(read) = read else {
        let ms = limits.read_timeout.as_millis();
        METRICS.requests_refused.inc();
        tracing::warn!(%remote, ?role, timeout_ms = %ms, "refused a request not sent within the read deadline");
        let _ = recv.stop(0u32.into());
        let reply = Reply::Error(format!("no whole request arrived within {ms} ms"));
        let _ = frame::write(&mut send, &reply).await;
        let _ = send.finish();
        return;
    };
    let reply = match read {
        // A requester that gave up (its timeout reset the stream, or its connection closed)
        // stops the request here too. Why: a write held up on this node (behind a partition,
        // or queued for a proposal) was otherwise carried out after its client had been told
        // it failed, e.g. forwarded to the majority's new leader once a partition healed, where
        // it overwrote newer writes.
        Ok(req) => {
            let stopped = send.stopped();
            tokio::select! {
                reply = handler.handle(role, req) => reply,
                _ = stopped => {
                    tracing::debug!(%remote, "the requester gave up; request dropped");
                    return;
                }
            }
        }
        // Reset before its request was read: a requester that gave up (an agent's nudged
        // poll answered on its other stream), not a malformed frame.
        Err(frame::FrameError::Truncated(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            tracing::debug!(%remote, "the requester reset its stream before the request arrived");
            return;
        }
        Err(e) => {
            METRICS.frame_errors.inc();
            if matches!(e, FrameError::TooLarge { .. }) {
                METRICS.requests_refused.inc();
            }
            tracing::warn!(%remote, ?role, max_frame, error = %e, "bad frame");
            let _ = recv.stop(0u32.into());
            Reply::Error(e.to_string())
        }
    };
    if let Err(e) = frame::write(&mut send, &reply).await {
        tracing::debug!(%remote, error = %e, "could not send reply");
    }
    let _ = send.finish();
}

/// An in-process network for cluster tests: handlers registered by address, requests
/// round-tripped through the real frame codec, and faults injected per link.
#[derive(Clone, Default)]
pub struct MemNetwork {
    inner: Arc<Mutex<MemState>>,
}

#[derive(Default)]
struct MemState {
    handlers: HashMap<String, Arc<dyn Handler>>,
    /// Directed links (from, to) that drop everything.
    cut: HashSet<(String, String)>,
    /// Directed links (caller, callee) whose answers arrive this much late.
    late_answers: HashMap<(String, String), Duration>,
    delay: Duration,
    /// The frame limit both ends apply, as QUIC's do (`None`: the default limit).
    max_frame: Option<u32>,
}

impl MemNetwork {
    pub fn register(&self, addr: &str, handler: Arc<dyn Handler>) {
        self.lock().handlers.insert(addr.to_owned(), handler);
    }

    pub fn unregister(&self, addr: &str) {
        self.lock().handlers.remove(addr);
    }

    /// A transport whose requests come from `from` with `role`.
    pub fn transport(&self, from: &str, role: PeerRole) -> Arc<dyn Transport> {
        Arc::new(MemTransport {
            net: self.clone(),
            from: from.to_owned(),
            role,
        })
    }

    /// Cuts every link between the two sides, both directions.
    pub fn partition(&self, a: &[&str], b: &[&str]) {
        let mut st = self.lock();
        for x in a {
            for y in b {
                st.cut.insert((x.to_string(), y.to_string()));
                st.cut.insert((y.to_string(), x.to_string()));
            }
        }
    }

    /// Cuts the link from `from` to `to` only: `from`'s calls to `to` fail, while `to`'s calls
    /// to `from` and their answers still go through (a one-way control fault).
    pub fn cut_one_way(&self, from: &str, to: &str) {
        self.lock().cut.insert((from.to_owned(), to.to_owned()));
    }

    /// Answers that `callee` sends to calls from `caller` arrive `by` late, after `callee`
    /// acted on the call: a congested link out of `callee`, which still hears everything.
    pub fn delay_answers(&self, caller: &str, callee: &str, by: Duration) {
        self.lock()
            .late_answers
            .insert((caller.to_owned(), callee.to_owned()), by);
    }

    /// Lifts every cut and every late answer.
    pub fn heal(&self) {
        let mut st = self.lock();
        st.cut.clear();
        st.late_answers.clear();
    }

    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Sets the frame limit (default [`frame::DEFAULT_MAX_FRAME`]), which the network enforces
    /// as the QUIC transport does: a request above it is answered with the receiver's refusal,
    /// a reply above it fails the call. Why: without it a message no QUIC peer would accept
    /// (an oversize Raft entry) passed every in-memory test.
    pub fn set_max_frame(&self, max: u32) {
        self.lock().max_frame = Some(max);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct MemTransport {
    net: MemNetwork,
    from: String,
    role: PeerRole,
}

impl Transport for MemTransport {
    fn call(
        &self,
        target: Target,
        req: Request,
        timeout: Duration,
    ) -> BoxFut<Result<Reply, TransportError>> {
        let (handler, cut, delay, late, max) = {
            let st = self.net.lock();
            let link = (self.from.clone(), target.addr.clone());
            (
                st.handlers.get(&target.addr).cloned(),
                st.cut.contains(&link),
                st.delay,
                st.late_answers.get(&link).copied().unwrap_or_default(),
                st.max_frame.unwrap_or(frame::DEFAULT_MAX_FRAME),
            )
        };
        let role = self.role;
        let from = self.from.clone();
        Box::pin(async move {
            let addr = target.addr.clone();
            let unreachable = |reason: &str| TransportError::Unreachable {
                addr: addr.clone(),
                reason: reason.into(),
            };
            let Some(handler) = handler else {
                return Err(unreachable("no node listens there"));
            };
            if cut {
                // A cut cable is silent: the caller learns only by timing out.
                tokio::time::sleep(timeout).await;
                return Err(TransportError::Timeout {
                    addr,
                    ms: timeout.as_millis(),
                });
            }
            let frame_err = |source| TransportError::Frame {
                addr: addr.clone(),
                source,
            };
            let bytes = frame::encode(&req).map_err(frame_err)?;
            if let Err(e) = within(&bytes, max) {
                // What `serve_stream` answers to a frame above its limit.
                METRICS.frame_errors.inc();
                tracing::warn!(remote = %from, error = %e, "bad frame");
                return Ok(Reply::Error(e.to_string()));
            }
            let req: Request = frame::decode_body(&bytes[4..]).map_err(frame_err)?;
            let exchange = async {
                tokio::time::sleep(delay).await;
                let reply = handler.handle(role, req).await;
                tokio::time::sleep(late).await;
                reply
            };
            let reply = tokio::time::timeout(timeout, exchange).await.map_err(|_| {
                TransportError::Timeout {
                    addr: addr.clone(),
                    ms: timeout.as_millis(),
                }
            })?;
            let bytes = frame::encode(&reply).map_err(frame_err)?;
            within(&bytes, max).map_err(frame_err)?;
            frame::decode_body(&bytes[4..]).map_err(frame_err)
        })
    }
}

/// Whether an encoded frame's body is within `max`, as [`frame::read`] checks it.
fn within(frame: &[u8], max: u32) -> Result<(), FrameError> {
    let len = u32::try_from(frame.len() - 4).unwrap_or(u32::MAX);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_caps_refuse_in_one_sentence_and_free_on_drop() {
        let limits = ServeLimits {
            max_connections: 3,
            max_connections_per_ip: 2,
            anonymous_max_connections: 1,
            ..ServeLimits::with_max_frame(frame::DEFAULT_MAX_FRAME)
        };
        let counts = Arc::new(Mutex::new(ConnCounts::default()));
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap());
        let mut first = ConnSlot::take(&counts, a, &limits).unwrap();
        let second = ConnSlot::take(&counts, a, &limits).unwrap();
        let err = ConnSlot::take(&counts, a, &limits).err().unwrap();
        assert_eq!(err, "198.18.0.1 holds its limit of 2 connections");
        let mut third = ConnSlot::take(&counts, b, &limits).unwrap();
        let err = ConnSlot::take(&counts, b, &limits).err().unwrap();
        assert_eq!(err, "the node holds its limit of 3 connections");
        first.anonymous(&limits).unwrap();
        let err = third.anonymous(&limits).unwrap_err();
        assert!(err.contains("1 connections without a certificate"), "{err}");
        drop(first);
        third.anonymous(&limits).unwrap();
        drop((second, third));
        let c = counts.lock().unwrap();
        assert_eq!((c.total, c.anonymous, c.per_ip.len()), (0, 0, 0));
    }

    #[test]
    fn anonymous_peers_get_the_small_frame_limit() {
        let limits = ServeLimits::with_max_frame(frame::DEFAULT_MAX_FRAME);
        assert_eq!(limits.frame_for(PeerRole::Anonymous), 8 * 1024);
        assert_eq!(limits.frame_for(PeerRole::Admin), frame::DEFAULT_MAX_FRAME);
    }
}
