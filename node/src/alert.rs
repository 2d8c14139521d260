//! The alert hook: on each new verdict the leader runs an operator's command and/or POSTs the
//! verdict's JSON to a webhook, so paging, cordoning a node or killing a job can follow a
//! diagnosis without anyone polling `yard diagnose`.
//!
//! The webhook speaks `https://` (real receivers — chat, paging, Alertmanager relays — are
//! https) or plain `http://` (a local relay), through hyper and rustls on the same `ring`
//! provider as the QUIC transport. Server certificates are checked against the bundled public
//! roots plus, for a private receiver, the CAs of `analyzer.alert_webhook_ca`. The hook is best
//! effort and bounded in time, and a failing hook is logged, never retried in a loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{header, Method, Request, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::io::AsyncWriteExt;

/// Longest a hook may take before it is abandoned.
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a webhook cannot be set up or delivered.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("the webhook url must look like https://host[:port]/path or http://host[:port]/path")]
    Url,
    #[error("cannot read the webhook ca file {path}: {source}")]
    CaRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the webhook ca file {path} holds no pem certificate")]
    CaEmpty { path: PathBuf },
    #[error("the webhook ca file {path} has a certificate that cannot be trusted: {reason}")]
    CaBad { path: PathBuf, reason: String },
    #[error("cannot set up tls for the webhook: {0}")]
    Tls(#[from] rustls::Error),
    #[error("the webhook request cannot be built: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("the webhook did not answer: {0}")]
    Send(#[from] hyper_util::client::legacy::Error),
}

/// A webhook target: an `http` or `https` URL with a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub uri: Uri,
}

impl Webhook {
    pub fn is_https(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }
}

/// Parses `https://host[:port]/path` or `http://host[:port]/path` (the path defaults to `/`);
/// any other scheme, a missing host or a malformed URL is refused.
pub fn parse_webhook(url: &str) -> Result<Webhook, AlertError> {
    let uri: Uri = url.parse().map_err(|_| AlertError::Url)?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let host_ok = uri.host().is_some_and(|h| !h.is_empty());
    // Credentials in the URL would be sent in the clear to logs; receivers take a token in
    // the path instead.
    let userinfo = uri.authority().is_some_and(|a| a.as_str().contains('@'));
    if !scheme_ok || !host_ok || userinfo {
        return Err(AlertError::Url);
    }
    Ok(Webhook { uri })
}

/// Reads every PEM certificate in `path` (at least one).
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, AlertError> {
    let pem = std::fs::read(path).map_err(|source| AlertError::CaRead {
        path: path.to_owned(),
        source,
    })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(AlertError::CaEmpty {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// An HTTP(S) client for one webhook.
pub struct WebhookClient {
    webhook: Webhook,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for WebhookClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookClient")
            .field("uri", &self.webhook.uri)
            .finish_non_exhaustive()
    }
}

impl WebhookClient {
    /// A client trusting the bundled public roots plus `extra_ca` (a private receiver's CA).
    pub fn new(webhook: Webhook, extra_ca: Option<&Path>) -> Result<Self, AlertError> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Some(path) = extra_ca {
            for cert in load_ca_file(path)? {
                roots.add(cert).map_err(|e| AlertError::CaBad {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?;
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { webhook, client })
    }

    /// POSTs `body` as JSON; the receiver's status code.
    pub async fn post(&self, body: String) -> Result<u16, AlertError> {
        let host = self
            .webhook
            .uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.webhook.uri.clone())
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::USER_AGENT,
                concat!("yard/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body)))?;
        let response = self.client.request(request).await?;
        Ok(response.status().as_u16())
    }
}

/// Where new verdicts go.
#[derive(Debug, Clone, Default)]
pub struct AlertHook {
    pub command: Option<String>,
    pub webhook: Option<Arc<WebhookClient>>,
}

impl AlertHook {
    pub fn is_empty(&self) -> bool {
        self.command.is_none() && self.webhook.is_none()
    }

    /// Fires the hook for one verdict (JSON text) in the background.
    pub fn fire(&self, job: &str, verdict_json: String) {
        if let Some(cmd) = self.command.clone() {
            let (job, body) = (job.to_owned(), verdict_json.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HOOK_TIMEOUT, run_command(&cmd, &job, &body)).await {
                    Ok(Ok(status)) if status.success() => {
                        tracing::info!(job, "alert command ran")
                    }
                    Ok(Ok(status)) => {
                        tracing::warn!(job, %status, "alert command failed")
                    }
                    Ok(Err(e)) => tracing::warn!(job, error = %e, "alert command did not start"),
                    Err(_) => tracing::warn!(job, "alert command timed out"),
                }
            });
        }
        if let Some(hook) = self.webhook.clone() {
            let job = job.to_owned();
            tokio::spawn(async move {
                match tokio::time::timeout(HOOK_TIMEOUT, hook.post(verdict_json)).await {
                    Ok(Ok(status)) if (200..300).contains(&status) => {
                        tracing::info!(job, status, "alert webhook delivered")
                    }
                    Ok(Ok(status)) => tracing::warn!(job, status, "alert webhook refused"),
                    Ok(Err(e)) => tracing::warn!(job, error = %e, "alert webhook failed"),
                    Err(_) => tracing::warn!(job, "alert webhook timed out"),
                }
            });
        }
    }
}

async fn run_command(
    cmd: &str,
    job: &str,
    body: &str,
) -> std::io::Result<std::process::ExitStatus> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("YARD_VERDICT", body)
        .env("YARD_JOB", job)
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that ignores stdin closes it early; that is not an error.
        let _ = stdin.write_all(body.as_bytes()).await;
    }
    child.wait().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_parse_or_are_refused() {
        let w = parse_webhook("http://198.18.0.9:8080/hooks/yard").unwrap();
        assert_eq!(w.uri.host(), Some("198.18.0.9"));
        assert_eq!(w.uri.port_u16(), Some(8080));
        assert_eq!(w.uri.path(), "/hooks/yard");
        assert!(!w.is_https());
        let w = parse_webhook("https://alerts.example/v1/hook?token=x").unwrap();
        assert!(w.is_https());
        assert_eq!(w.uri.path_and_query().unwrap().as_str(), "/v1/hook?token=x");
        assert_eq!(parse_webhook("http://alerts").unwrap().uri.path(), "/");
        for bad in [
            "ftp://x/y",
            "alerts:80/x",
            "http://",
            "http://a:b:c/",
            "https://user:pw@alerts/x",
            "/just/a/path",
            "http://has space/x",
        ] {
            assert!(parse_webhook(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_command_gets_the_verdict_on_stdin_and_in_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got");
        let status = run_command(
            &format!(
                "cat > {}; printf %s \"$YARD_JOB\" >> {}",
                out.display(),
                out.display()
            ),
            "job-7",
            "{\"class\":\"hang\"}",
        )
        .await
        .unwrap();
        assert!(status.success());
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "{\"class\":\"hang\"}job-7"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        assert!(matches!(
            load_ca_file(&path),
            Err(AlertError::CaEmpty { .. })
        ));
        assert!(matches!(
            load_ca_file(&dir.path().join("missing.pem")),
            Err(AlertError::CaRead { .. })
        ));
    }
}
