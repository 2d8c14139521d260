//! A node killed and started again on the same address: its peers' cached connections to the
//! dead process must not hold up their calls until QUIC's idle timeout. The restarted node
//! resets them (its stateless-reset key comes from its identity), so a peer reaches the new
//! process within a few calls.
//!
//! Each incarnation of the server runs on a runtime of its own, shut down without closing
//! anything: as after `kill -9`, no CONNECTION_CLOSE reaches the client.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use yard::rpc::{Reply, Request};
use yard::tls::{self, CertAuthority, Identity, PeerRole, Trust};
use yard::transport::{
    bind_node_endpoint, serve, BoxFut, Handler, Quic, QuicTransport, Target, Transport,
};

const CLUSTER: &str = "restart";
const MAX_FRAME: u32 = 1 << 20;

struct Pong(u64);

impl Handler for Pong {
    fn handle(&self, _role: PeerRole, req: Request) -> BoxFut<Reply> {
        let id = self.0;
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
        .sign_node(CLUSTER, name, id, &["127.0.0.1".parse().unwrap()])
        .unwrap();
    tls::write_cert(dir, name, &pem).unwrap();
    Identity::load(dir, name).unwrap()
}

/// One incarnation of node 1 serving on `addr`, on a runtime of its own.
fn start_server(identity: &Identity, addr: SocketAddr) -> tokio::runtime::Runtime {
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
        Arc::new(Pong(1)),
        CLUSTER.into(),
        MAX_FRAME,
    ));
    rt
}

#[test]
fn a_restarted_node_is_reached_again_well_before_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::generate(CLUSTER).unwrap();
    let server_id = identity(&ca, dir.path(), "n1", 1);
    let client_id = identity(&ca, dir.path(), "n2", 2);
    let addr = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();

    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let client = client_rt.block_on(async {
        let client_cfg =
            tls::client_config(CLUSTER, Trust::Ca(client_id.ca.clone()), Some(&client_id)).unwrap();
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        Quic(QuicTransport::new(
            endpoint,
            client_cfg,
            CLUSTER.into(),
            MAX_FRAME,
        ))
    });
    let target = Target::node(1, addr.to_string());
    let probe = |timeout: Duration| {
        client_rt.block_on(client.call(target.clone(), Request::Probe, timeout))
    };

    let first = start_server(&server_id, addr);
    assert!(matches!(
        probe(Duration::from_secs(5)),
        Ok(Reply::Pong { id: 1 })
    ));
    // kill -9: the process's sockets vanish and nothing is said to the peers.
    first.shutdown_background();
    std::thread::sleep(Duration::from_millis(200));

    let _second = start_server(&server_id, addr);
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
