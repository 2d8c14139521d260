//! Certificates that expire, on loopback (issue 25: certificates were valid until 4096).
//!
//! - An expired client certificate opens no connection.
//! - A connection ends when its client's certificate does, so a certificate that is not
//!   renewed stops working then, however busy its connection was kept.
//! - A transport given a renewed certificate ([`QuicTransport::reload`]) goes on working past
//!   the old certificate's expiry, without a restart.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use yard::rpc::{Reply, Request};
use yard::tls::{self, CertAuthority, Identity, PeerRole, Trust};
use yard::transport::{
    bind_node_endpoint, serve, BoxFut, Handler, Quic, QuicTransport, Target, Transport,
};

const CLUSTER: &str = "lifetime";
const MAX_FRAME: u32 = 1 << 20;

/// Answers probes as node 1, counting the requests it serves.
struct Pong(Arc<AtomicUsize>);

impl Handler for Pong {
    fn handle(&self, _role: PeerRole, req: Request) -> BoxFut<Reply> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match req {
                Request::Probe => Reply::Pong { id: 1 },
                other => Reply::Error(format!("unexpected {other:?}")),
            }
        })
    }
}

/// A CA in a temporary directory, node 1 serving on loopback, and what it served.
struct Fixture {
    dir: tempfile::TempDir,
    ca: CertAuthority,
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
    rt: tokio::runtime::Runtime,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        tls::init_ca_dir(dir.path(), CLUSTER, tls::ADMIN_VALIDITY).unwrap();
        let ca = CertAuthority::load(dir.path()).unwrap();
        let addr = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = issue(&ca, dir.path(), "n1", 1, tls::NODE_VALIDITY);
        let served = Arc::new(AtomicUsize::new(0));
        let server_cfg = tls::server_config(&server).unwrap();
        let endpoint = rt
            .block_on(async { bind_node_endpoint(addr, &server, server_cfg) })
            .unwrap();
        rt.spawn(serve(
            endpoint,
            Arc::new(Pong(served.clone())),
            CLUSTER.into(),
            yard::transport::ServeLimits::with_max_frame(MAX_FRAME),
        ));
        Self {
            dir,
            ca,
            addr,
            served,
            rt,
        }
    }

    /// A transport presenting `identity`, dialling from an ephemeral port.
    fn client(&self, identity: &Identity) -> Arc<QuicTransport> {
        let cfg =
            tls::client_config(CLUSTER, Trust::Ca(identity.trust.clone()), Some(identity)).unwrap();
        self.rt.block_on(async {
            let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
            QuicTransport::new(endpoint, cfg, CLUSTER.into(), MAX_FRAME)
        })
    }

    fn probe(&self, t: &Arc<QuicTransport>) -> Result<Reply, String> {
        let target = Target::node(1, self.addr.to_string());
        self.rt
            .block_on(Quic(t.clone()).call(target, Request::Probe, Duration::from_secs(3)))
            .map_err(|e| e.to_string())
    }
}

/// Signs node `id`'s certificate `name` for `validity` and loads it.
fn issue(ca: &CertAuthority, dir: &Path, name: &str, id: u64, validity: Duration) -> Identity {
    let pem = ca
        .sign_node(CLUSTER, name, id, &["127.0.0.1".parse().unwrap()], validity)
        .unwrap();
    tls::write_cert(dir, name, &pem).unwrap();
    Identity::load(dir, name).unwrap()
}

#[test]
fn an_expired_client_certificate_opens_no_connection() {
    let f = Fixture::new();
    // Signed with the cluster's CA key, valid for an hour that ended an hour ago.
    let ca_pem = std::fs::read_to_string(f.dir.path().join("ca.crt")).unwrap();
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(f.dir.path().join("ca.key")).unwrap())
            .unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![tls::node_san(CLUSTER, 2)]).unwrap();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(2);
    params.not_after = now - time::Duration::hours(1);
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let pem = tls::CertPem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    };
    tls::write_cert(f.dir.path(), "n2", &pem).unwrap();
    let expired = Identity::load(f.dir.path(), "n2").unwrap();

    let err = f.probe(&f.client(&expired)).unwrap_err();
    assert_eq!(
        f.served.load(Ordering::SeqCst),
        0,
        "served an expired certificate"
    );
    println!("refused: {err}");
    // The same node with a valid certificate is served.
    let valid = issue(&f.ca, f.dir.path(), "n2", 2, tls::NODE_VALIDITY);
    assert!(matches!(
        f.probe(&f.client(&valid)),
        Ok(Reply::Pong { id: 1 })
    ));
}

#[test]
fn a_connection_ends_with_its_certificate_and_a_renewed_one_carries_on() {
    let f = Fixture::new();
    let validity = tls::MIN_VALIDITY;
    let short = issue(&f.ca, f.dir.path(), "n2", 2, validity);
    let expires = tls::not_after(&short.chain[0]).unwrap();
    let (kept, renewed) = (f.client(&short), f.client(&short));
    assert!(matches!(f.probe(&kept), Ok(Reply::Pong { id: 1 })));
    assert!(matches!(f.probe(&renewed), Ok(Reply::Pong { id: 1 })));

    // `renewed` gets a new certificate for its key, as a node's renewal loop does.
    let key = std::fs::read_to_string(f.dir.path().join("n2.key")).unwrap();
    let csr = tls::renewal_request(&key).unwrap();
    let cert =
        f.ca.renew_node(CLUSTER, "n2", 2, &[], tls::NODE_VALIDITY, &csr)
            .unwrap();
    tls::write_renewed_cert(f.dir.path(), "n2", &cert).unwrap();
    renewed
        .reload(&Identity::load(f.dir.path(), "n2").unwrap())
        .unwrap();

    // Both keep working while the short certificate is valid, and stay connected up to its end.
    let start = Instant::now();
    while std::time::SystemTime::now() < expires + Duration::from_millis(500) {
        assert!(matches!(f.probe(&renewed), Ok(Reply::Pong { id: 1 })));
        if std::time::SystemTime::now() + Duration::from_millis(500) < expires {
            assert!(matches!(f.probe(&kept), Ok(Reply::Pong { id: 1 })));
        }
        assert!(
            start.elapsed() < validity * 2,
            "the certificate outlived its validity"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Past its expiry the server closed the kept connection, and a new one is refused.
    let served = f.served.load(Ordering::SeqCst);
    let refused = f.probe(&kept).unwrap_err();
    println!("after expiry: {refused}");
    assert_eq!(
        f.served.load(Ordering::SeqCst),
        served,
        "served an expired certificate"
    );
    // The renewed transport goes on.
    for _ in 0..3 {
        assert!(matches!(f.probe(&renewed), Ok(Reply::Pong { id: 1 })));
    }
}
