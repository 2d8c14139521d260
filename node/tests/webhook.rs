//! The alert webhook against real receivers on 127.0.0.1: an https receiver whose certificate a
//! CA made in the test signed (trusted through the CA file, refused without it) and a plain
//! http one.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use yard::alert::{parse_webhook, AlertHook, WebhookClient};

/// A test CA's PEM and a server certificate chain and key for 127.0.0.1 that it signed.
fn test_pki() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "webhook test ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (
        ca_cert.pem(),
        vec![cert.der().clone(), ca_cert.der().clone()],
        PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
}

/// Reads one HTTP request (head and a Content-Length body) and answers 204; returns the
/// request as text, or the error that ended the exchange.
fn receive_one(stream: &mut (impl Read + Write)) -> std::io::Result<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                break;
            }
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client closed before a whole request arrived",
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
    stream
        .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")?;
    stream.flush()?;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// An https receiver for one connection on 127.0.0.1; its port and what it received.
fn https_receiver(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> (u16, JoinHandle<std::io::Result<String>>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (tcp, _) = listener.accept()?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let conn =
            rustls::ServerConnection::new(Arc::new(config)).map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        receive_one(&mut tls)
    });
    (port, handle)
}

fn body_of(request: &str) -> &str {
    request.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

#[tokio::test]
async fn an_https_receiver_signed_by_the_configured_ca_gets_the_verdict() {
    let (ca_pem, chain, key) = test_pki();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("receiver-ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let (port, receiver) = https_receiver(chain, key);

    let webhook = parse_webhook(&format!("https://127.0.0.1:{port}/hooks/yard?team=ml")).unwrap();
    let client = WebhookClient::new(webhook, Some(&ca_file)).unwrap();
    let hook = AlertHook {
        command: None,
        webhook: Some(Arc::new(client)),
    };
    let verdict = r#"{"job":"job-7","verdict":{"class":"hang"}}"#;
    // The daemon's path: fire and forget, delivered in the background.
    hook.fire("job-7", verdict.to_owned());
    let request = tokio::task::spawn_blocking(move || receiver.join().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(
        request.starts_with("POST /hooks/yard?team=ml HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(
        request
            .to_ascii_lowercase()
            .contains("content-type: application/json\r\n"),
        "{request}"
    );
    assert_eq!(body_of(&request), verdict);
}

#[tokio::test]
async fn an_https_receiver_from_an_unknown_ca_is_refused() {
    let (_, chain, key) = test_pki();
    let (port, receiver) = https_receiver(chain, key);
    let webhook = parse_webhook(&format!("https://127.0.0.1:{port}/hooks/yard")).unwrap();
    // Only the public roots: the test CA is nobody's.
    let client = WebhookClient::new(webhook, None).unwrap();
    let err = client
        .post("{}".to_owned())
        .await
        .expect_err("an untrusted receiver was accepted");
    let chain = format!("{:?}", error_chain(&err));
    assert!(chain.contains("UnknownIssuer"), "{chain}");
    let got = tokio::task::spawn_blocking(move || receiver.join().unwrap())
        .await
        .unwrap();
    assert!(got.is_err(), "the receiver got a request: {got:?}");
}

#[tokio::test]
async fn a_plain_http_receiver_gets_the_post() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let receiver = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept()?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        receive_one(&mut tcp)
    });
    let client = WebhookClient::new(
        parse_webhook(&format!("http://127.0.0.1:{port}/v")).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(
        client
            .post("{\"class\":\"slow\"}".to_owned())
            .await
            .unwrap(),
        204
    );
    let request = tokio::task::spawn_blocking(move || receiver.join().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(request.starts_with("POST /v HTTP/1.1\r\n"), "{request}");
    assert_eq!(body_of(&request), "{\"class\":\"slow\"}");
}

/// The error and its sources, outermost first.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![format!("{err:?}")];
    let mut source = err.source();
    while let Some(s) = source {
        out.push(format!("{s:?}"));
        source = s.source();
    }
    out
}
