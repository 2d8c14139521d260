//! The QUIC transport across faults, on loopback.
//!
//! - A node killed and started again on the same address: its peers' cached connections to the
//!   dead process must not hold up their calls until QUIC's idle timeout. The restarted node
//!   resets them (its stateless-reset key comes from its identity), so a peer reaches the new
//!   process within a few calls. Each incarnation of the server runs on a runtime of its own,
//!   shut down without closing anything: as after `kill -9`, no CONNECTION_CLOSE reaches the
//!   client.
//! - A partition (a relay that drops every datagram) during a call: the call times out, and the
//!   request must never reach the server once the partition heals.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use yard::rpc::{Reply, Request};
use yard::tls::{self, CertAuthority, Identity, PeerRole, Trust};
use yard::transport::{
    bind_node_endpoint, serve, BoxFut, Handler, Quic, QuicTransport, Target, Transport,
    TransportError,
};

const CLUSTER: &str = "restart";
const MAX_FRAME: u32 = 1 << 20;

/// Answers probes as node `id`, counting every request it gets.
struct Pong(u64, Arc<AtomicUsize>);

impl Handler for Pong {
    fn handle(&self, _role: PeerRole, req: Request) -> BoxFut<Reply> {
        let id = self.0;
        self.1.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match req {
                Request::Probe => Reply::Pong { id },
                other => Reply::Error(format!("unexpected {other:?}")),
            }
        })
    }
}

fn identity(ca: &CertAuthority, dir: &Path, name: &str, id: u64) -> Identity {
    tls::write_ca_cert(dir, &ca.cert_pem).unwrap();
    let pem = ca
        .sign_node(
            CLUSTER,
            name,
            id,
            &["127.0.0.1".parse().unwrap()],
            tls::NODE_VALIDITY,
        )
        .unwrap();
    tls::write_cert(dir, name, &pem).unwrap();
    Identity::load(dir, name).unwrap()
}

/// One incarnation of node 1 serving on `addr`, on a runtime of its own.
fn start_server(identity: &Identity, addr: SocketAddr) -> tokio::runtime::Runtime {
    start_counting_server(identity, addr, Arc::default())
}

/// [`start_server`], counting the requests it gets in `served`.
fn start_counting_server(
    identity: &Identity,
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
) -> tokio::runtime::Runtime {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server_cfg = tls::server_config(identity).unwrap();
    let endpoint = rt
        .block_on(async { bind_node_endpoint(addr, identity, server_cfg) })
        .unwrap();
    rt.spawn(serve(
        endpoint,
        Arc::new(Pong(1, served)),
        CLUSTER.into(),
        yard::transport::ServeLimits::with_max_frame(MAX_FRAME),
    ));
    rt
}

/// Node 2's transport, dialling from an ephemeral port.
fn client(identity: &Identity) -> Quic {
    let client_cfg =
        tls::client_config(CLUSTER, Trust::Ca(identity.trust.clone()), Some(identity)).unwrap();
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    Quic(QuicTransport::new(
        endpoint,
        client_cfg,
        CLUSTER.into(),
        MAX_FRAME,
    ))
}

/// Node 1's and node 2's identities from one CA, and a free loopback port for node 1.
struct Fixture {
    _dir: tempfile::TempDir,
    server_id: Identity,
    client_id: Identity,
    addr: SocketAddr,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertAuthority::generate(CLUSTER).unwrap();
        let server_id = identity(&ca, dir.path(), "n1", 1);
        let client_id = identity(&ca, dir.path(), "n2", 2);
        let addr = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        Self {
            _dir: dir,
            server_id,
            client_id,
            addr,
        }
    }
}

#[test]
fn a_restarted_node_is_reached_again_well_before_the_idle_timeout() {
    let f = Fixture::new();
    let addr = f.addr;

    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let client = client_rt.block_on(async { client(&f.client_id) });
    let target = Target::node(1, addr.to_string());
    let probe = |timeout: Duration| {
        client_rt.block_on(client.call(target.clone(), Request::Probe, timeout))
    };

    let first = start_server(&f.server_id, addr);
    assert!(matches!(
        probe(Duration::from_secs(5)),
        Ok(Reply::Pong { id: 1 })
    ));
    // kill -9: the process's sockets vanish and nothing is said to the peers.
    first.shutdown_background();
    std::thread::sleep(Duration::from_millis(200));

    let _second = start_server(&f.server_id, addr);
    let restarted = Instant::now();
    let mut outcomes = Vec::new();
    loop {
        let reply = probe(Duration::from_millis(300));
        let ok = matches!(reply, Ok(Reply::Pong { id: 1 }));
        outcomes.push(format!("{:?}: {reply:?}", restarted.elapsed()));
        if ok {
            break;
        }
        // QUIC's idle timeout (3 s) would end the dead connection by itself: the reset must
        // come well before it.
        assert!(
            restarted.elapsed() < Duration::from_millis(1500),
            "the restarted node was not reached: {outcomes:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("reached again: {outcomes:#?}");
}

/// A UDP relay between one client and `server` that drops every datagram while `cut` is set.
struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(server: SocketAddr) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let (cut, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (c, s) = (cut.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 65_536];
            let mut client = None;
            while !s.load(Ordering::SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let to = if from == server {
                    client
                } else {
                    client = Some(from);
                    Some(server)
                };
                if let (Some(to), false) = (to, c.load(Ordering::SeqCst)) {
                    let _ = socket.send_to(&buf[..n], to);
                }
            }
        });
        Self { addr, cut, stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_request_whose_caller_gave_up_behind_a_partition_never_arrives() {
    let f = Fixture::new();
    let addr = f.addr;
    let served = Arc::new(AtomicUsize::new(0));
    let _server = start_counting_server(&f.server_id, addr, served.clone());
    let relay = Relay::start(addr);

    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let client = client_rt.block_on(async { client(&f.client_id) });
    let target = Target::node(1, relay.addr.to_string());
    let probe = |timeout: Duration| {
        client_rt.block_on(client.call(target.clone(), Request::Probe, timeout))
    };
    assert!(matches!(
        probe(Duration::from_secs(5)),
        Ok(Reply::Pong { id: 1 })
    ));
    assert_eq!(served.load(Ordering::SeqCst), 1);

    relay.cut.store(true, Ordering::SeqCst);
    let lost = probe(Duration::from_millis(300));
    assert!(
        lost.is_err(),
        "a call through a cut link answered: {lost:?}"
    );
    std::thread::sleep(Duration::from_millis(700));
    relay.cut.store(false, Ordering::SeqCst);
    // Well inside QUIC's idle timeout (3 s): the connection lives on, and without the reset
    // its loss recovery would deliver the request now.
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(
        served.load(Ordering::SeqCst),
        1,
        "the request whose caller gave up reached the server after the partition healed"
    );
    assert!(matches!(
        probe(Duration::from_secs(5)),
        Ok(Reply::Pong { id: 1 })
    ));
    assert_eq!(served.load(Ordering::SeqCst), 2);
}

/// Never answers; counts the requests it started and the ones whose work was dropped.
struct Stall {
    started: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

struct CountDrop(Arc<AtomicUsize>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler for Stall {
    fn handle(&self, _role: PeerRole, _req: Request) -> BoxFut<Reply> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let guard = CountDrop(self.dropped.clone());
        Box::pin(async move {
            let _guard = guard;
            std::future::pending().await
        })
    }
}

/// Waits up to 5 s for `counter` to reach `n`.
fn reaches(counter: &AtomicUsize, n: usize) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if counter.load(Ordering::SeqCst) >= n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A request whose caller gave up is dropped by the server, not carried out later: when the
/// caller's timeout abandons the stream, and when a client process closes its connections on
/// the way out (the CLI does). A write held up on a node behind a partition was otherwise
/// forwarded to the new leader once the partition healed, after its client had been told it
/// failed.
#[test]
fn a_request_its_caller_gave_up_on_is_dropped_by_the_server() {
    let f = Fixture::new();
    let (started, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let endpoint = server_rt
        .block_on(async {
            bind_node_endpoint(
                f.addr,
                &f.server_id,
                tls::server_config(&f.server_id).unwrap(),
            )
        })
        .unwrap();
    server_rt.spawn(serve(
        endpoint,
        Arc::new(Stall {
            started: started.clone(),
            dropped: dropped.clone(),
        }),
        CLUSTER.into(),
        yard::transport::ServeLimits::with_max_frame(MAX_FRAME),
    ));

    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let client = client_rt.block_on(async { client(&f.client_id) });
    let target = Target::node(1, f.addr.to_string());

    // The caller's timeout.
    let reply =
        client_rt.block_on(client.call(target.clone(), Request::Probe, Duration::from_millis(300)));
    assert!(
        matches!(reply, Err(TransportError::Timeout { .. })),
        "{reply:?}"
    );
    assert!(reaches(&started, 1));
    assert!(
        reaches(&dropped, 1),
        "the server kept working on a request its caller had abandoned"
    );

    // The client closing while its request is still in flight.
    let pending = client_rt.spawn(client.call(target, Request::Probe, Duration::from_secs(60)));
    assert!(reaches(&started, 2));
    client_rt.block_on(client.0.close());
    assert!(
        reaches(&dropped, 2),
        "the server kept working on a request of a client that closed"
    );
    pending.abort();
}
