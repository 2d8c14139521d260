//! The alert hook: on each new verdict the leader runs an operator's command and/or POSTs the
//! verdict's JSON to a webhook, so paging, cordoning a node or killing a job can follow a
//! diagnosis without anyone polling `yard diagnose`.
//!
//! Plain `http://` only (a local relay or an in-cluster receiver); the hook is best effort and
//! bounded in time, and a failing hook is logged, never retried in a loop.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest a hook may take before it is abandoned.
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// A webhook target: `host:port` and the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub authority: String,
    pub path: String,
}

/// Parses `http://host:port/path` (port defaults to 80, path to `/`); anything else is `None`.
pub fn parse_webhook(url: &str) -> Option<Webhook> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains(char::is_whitespace) || path.contains(' ') {
        return None;
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else if authority.contains(':') {
        return None;
    } else {
        format!("{authority}:80")
    };
    Some(Webhook {
        authority,
        path: path.to_owned(),
    })
}

/// Where new verdicts go.
#[derive(Debug, Clone, Default)]
pub struct AlertHook {
    pub command: Option<String>,
    pub webhook: Option<Webhook>,
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
                match tokio::time::timeout(HOOK_TIMEOUT, post(&hook, &verdict_json)).await {
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

/// One HTTP/1.1 POST; returns the status code.
async fn post(hook: &Webhook, body: &str) -> std::io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(&hook.authority).await?;
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        hook.path,
        hook.authority,
        body.len(),
        body
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = vec![0u8; 64];
    let n = stream.read(&mut head).await?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("the webhook did not answer with an http status line"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_parse_or_are_refused() {
        assert_eq!(
            parse_webhook("http://198.18.0.9:8080/hooks/yard"),
            Some(Webhook {
                authority: "198.18.0.9:8080".into(),
                path: "/hooks/yard".into()
            })
        );
        assert_eq!(
            parse_webhook("http://alerts").unwrap().authority,
            "alerts:80"
        );
        assert_eq!(parse_webhook("http://alerts").unwrap().path, "/");
        assert!(parse_webhook("https://alerts/x").is_none());
        assert!(parse_webhook("http://").is_none());
        assert!(parse_webhook("http://a:b:c/").is_none());
        assert!(parse_webhook("ftp://x").is_none());
    }

    #[tokio::test]
    async fn the_command_gets_the_verdict_and_the_webhook_gets_a_post() {
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

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while !String::from_utf8_lossy(&got).contains("\"slow\"}") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(got).unwrap()
        });
        let hook = parse_webhook(&format!("http://{addr}/v")).unwrap();
        assert_eq!(post(&hook, "{\"class\":\"slow\"}").await.unwrap(), 204);
        let request = server.await.unwrap();
        assert!(request.starts_with("POST /v HTTP/1.1\r\n"), "{request}");
        assert!(request.ends_with("{\"class\":\"slow\"}"), "{request}");
    }
}
