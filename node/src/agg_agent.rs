//! The node-local aggregation agent: training processes on this host join their job through a
//! Unix socket (`[aggregator] socket`), so a worker needs no cluster credentials, and follow
//! its membership without polling.
//!
//! JSON lines, one object each:
//! - worker: `{"join": {"job": NAME, "rank": R, "addr": "IP:PORT"}}` (the address its UDP socket
//!   is bound to), first and once;
//! - node: `{"waiting": WHY}` until the job runs, then `{"membership": {...}}` each time it
//!   changes (job id, epoch, worker index, workers, aggregator, values, chunk_values, dtype),
//!   `{"failed": WHY}` or `{"gone": WHY}` when it ends (and closes), `{"error": WHY}` for a
//!   refused join (and closes);
//! - worker: `{"leave": true}` when it is done: the node answers `{"left": true}` and closes.
//!
//! A session that ends without a leave is a worker that died: the node reports the rank gone,
//! and the tables fail the job naming it or, if it is elastic, go on without it at a new
//! epoch. This is the one place a worker's death is decided; the leader only commits it.

use std::path::Path;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::broadcast::error::RecvError;
use yard_actors::aggregator::core::{worker_view, WorkerView};
use yard_raft_store::Change;

use crate::rpc::{AdminRequest, AggRequest, Reply};
use crate::service::Node;

/// The longest line a worker may send.
const MAX_LINE: u64 = 4096;

/// The JSON a worker reads for `view`.
pub fn view_json(view: &WorkerView) -> Value {
    match view {
        WorkerView::Waiting => {
            json!({"waiting": "waiting for every rank to join and the leader to place the job"})
        }
        WorkerView::Running(m) => json!({"membership": {
            "job": m.job, "epoch": m.epoch, "worker": m.worker, "workers": m.workers,
            "aggregator": m.aggregator.to_string(), "values": m.geometry.values,
            "chunk_values": m.geometry.chunk_values, "dtype": m.dtype.name(),
        }}),
        WorkerView::Ring(r) => json!({"ring": {
            "job": r.job, "epoch": r.epoch, "rank": r.rank, "ranks": r.ranks,
        }}),
        WorkerView::Failed(why) => json!({"failed": why}),
        WorkerView::Gone => json!({"gone": "the job was deleted"}),
    }
}

/// Parses the join line: (job, rank, addr), or why not.
pub fn parse_join(line: &str) -> Result<(String, u16, std::net::SocketAddrV4), String> {
    let v: Value = serde_json::from_str(line)
        .map_err(|e| format!("the first line must be a JSON join request: {e}"))?;
    let j = v
        .get("join")
        .ok_or("the first line must be {\"join\": {\"job\": ..., \"rank\": ..., \"addr\": ...}}")?;
    let job = j["job"]
        .as_str()
        .ok_or("join.job must be a string")?
        .to_owned();
    let rank = j["rank"]
        .as_u64()
        .and_then(|r| u16::try_from(r).ok())
        .ok_or("join.rank must be an integer from 0 to 65535")?;
    let addr = j["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .ok_or("join.addr must be the worker's IPv4 address and port, like \"198.18.0.4:40000\"")?;
    Ok((job, rank, addr))
}

/// Binds the agent's socket.
pub fn bind(
    path: &Path,
    access: yard_actors::probe::socket::SocketAccess,
) -> std::io::Result<UnixListener> {
    yard_actors::probe::socket::bind(path, access)
}

/// Accepts sessions until the listener fails.
pub async fn serve(listener: UnixListener, node: Node) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let node = node.clone();
                tokio::spawn(async move { session(stream, node).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, "aggregation agent accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, v: &Value) -> std::io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    w.write_all(line.as_bytes()).await
}

/// Reads one line of at most MAX_LINE bytes: `None` at the end of the stream.
async fn read_line(
    r: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = {
        let mut limited = tokio::io::AsyncReadExt::take(&mut *r, MAX_LINE);
        limited.read_until(b'\n', &mut buf).await?
    };
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && n as u64 >= MAX_LINE {
        return Err(std::io::Error::other(format!(
            "a line is longer than {MAX_LINE} bytes"
        )));
    }
    Ok(Some(String::from_utf8_lossy(&buf).trim().to_owned()))
}

async fn session(stream: UnixStream, node: Node) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let first = match read_line(&mut r).await {
        Ok(Some(line)) => line,
        _ => return,
    };
    let (job, rank, addr) = match parse_join(&first) {
        Ok(j) => j,
        Err(why) => {
            let _ = send(&mut w, &json!({"error": why})).await;
            return;
        }
    };
    let join = AdminRequest::Agg(AggRequest::Join {
        name: job.clone(),
        rank,
        addr,
    });
    if let Reply::Error(why) | Reply::Indefinite(why) = node.serve_admin(join).await {
        let _ = send(&mut w, &json!({"error": why})).await;
        return;
    }
    tracing::info!(job = %job, rank, %addr, "worker joined through the agent");
    let (data, mut rx) = node.feed().subscribe();
    let mut last = worker_view(&data.aggregation, &job, rank);
    let mut left = false;
    let mut ended = false;
    if send(&mut w, &view_json(&last)).await.is_err() {
        ended = true;
    }
    while !ended {
        tokio::select! {
            line = read_line(&mut r) => match line {
                Ok(Some(l)) if serde_json::from_str::<Value>(&l).is_ok_and(|v| v["leave"] == true) => {
                    left = true;
                    let _ = send(&mut w, &json!({"left": true})).await;
                    break;
                }
                Ok(Some(_)) => {
                    let _ = send(&mut w, &json!({"error": "after the join, a worker only sends {\"leave\": true}"})).await;
                }
                Ok(None) | Err(_) => break,
            },
            change = rx.recv() => {
                let view = match change {
                    Ok(Change::Aggregation { tables, .. }) => worker_view(&tables, &job, rank),
                    Ok(Change::Reset { .. }) | Err(RecvError::Lagged(_)) => {
                        let (data, fresh) = node.feed().subscribe();
                        rx = fresh;
                        worker_view(&data.aggregation, &job, rank)
                    }
                    Ok(_) => continue,
                    Err(RecvError::Closed) => break,
                };
                if view != last {
                    ended = matches!(view, WorkerView::Failed(_) | WorkerView::Gone);
                    if send(&mut w, &view_json(&view)).await.is_err() {
                        break;
                    }
                    last = view;
                }
            }
        }
    }
    if left || ended {
        return;
    }
    let reason = format!(
        "its session with node {} ended without a goodbye: the worker exited or crashed",
        node.id()
    );
    tracing::warn!(job = %job, rank, "worker gone: {reason}");
    let gone = AdminRequest::Agg(AggRequest::WorkerGone {
        name: job.clone(),
        rank,
        reason,
    });
    if let Reply::Error(why) = node.serve_admin(gone).await {
        tracing::warn!(job = %job, rank, error = %why, "could not report the worker gone");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_line_is_parsed_or_refused_in_one_sentence() {
        let (job, rank, addr) =
            parse_join(r#"{"join": {"job": "train", "rank": 3, "addr": "198.18.0.4:40000"}}"#)
                .unwrap();
        assert_eq!(
            (job.as_str(), rank, addr.to_string().as_str()),
            ("train", 3, "198.18.0.4:40000")
        );
        assert!(parse_join("hello")
            .unwrap_err()
            .starts_with("the first line must be a JSON join request"));
        assert_eq!(
            parse_join(r#"{"join": {"job": "t", "rank": 1, "addr": "nope"}}"#).unwrap_err(),
            "join.addr must be the worker's IPv4 address and port, like \"198.18.0.4:40000\""
        );
        assert_eq!(
            parse_join(r#"{"join": {"job": "t", "rank": -1, "addr": "198.18.0.4:1"}}"#)
                .unwrap_err(),
            "join.rank must be an integer from 0 to 65535"
        );
    }
}
