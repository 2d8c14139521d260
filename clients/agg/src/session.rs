//! A worker's session with the aggregation agent of the `yard` node on its host
//! (docs/aggregation-protocol.md, "Workers"): it joins the job, then follows the membership the
//! node pushes, on a thread of its own. Dropping the session without [`Session::leave`] tells
//! the node the worker is gone, exactly as the kernel closing a crashed process's socket does.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddrV4;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::wire::{Dtype, Geometry};
use crate::worker::Membership;

/// Where the job stands, as the node last said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Not every rank has joined, or the job has no aggregator yet.
    Waiting,
    Running(Membership),
    /// The job failed or this worker was removed from it: why.
    Failed(String),
    /// The session ended (the node closed it, or its daemon stopped): why.
    Closed(String),
}

/// Why a session could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot reach the yard node's aggregation agent at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the node refused the join: {0}")]
    Refused(String),
    #[error("{0}")]
    Ended(String),
    #[error("job not running after {0:?}")]
    Timeout(Duration),
    #[error("aggregation agent i/o failed")]
    Io(#[from] std::io::Error),
}

#[derive(Debug)]
struct Shared {
    state: Mutex<JobState>,
    changed: Condvar,
}

/// A joined worker's session.
#[derive(Debug)]
pub struct Session {
    stream: UnixStream,
    shared: Arc<Shared>,
}

fn membership(m: &Value) -> Option<Membership> {
    let num = |k: &str| m[k].as_u64();
    Some(Membership {
        job: u32::try_from(num("job")?).ok()?,
        epoch: u32::try_from(num("epoch")?).ok()?,
        worker: u16::try_from(num("worker")?).ok()?,
        workers: u16::try_from(num("workers")?).ok()?,
        aggregator: m["aggregator"].as_str()?.parse().ok()?,
        geometry: Geometry {
            values: u32::try_from(num("values")?).ok()?,
            chunk_values: u16::try_from(num("chunk_values")?).ok()?,
        },
        dtype: m["dtype"].as_str()?.parse::<Dtype>().ok()?,
        token: u32::try_from(num("token")?).ok()?,
        result_token: u32::try_from(num("result_token")?).ok()?,
    })
}

/// The state a node's line announces, if it announces one.
fn parse_line(line: &str) -> Option<JobState> {
    let v: Value = serde_json::from_str(line).ok()?;
    if let Some(m) = v.get("membership") {
        return membership(m).map(JobState::Running);
    }
    if v.get("waiting").is_some() {
        return Some(JobState::Waiting);
    }
    if let Some(r) = v.get("ring") {
        // A ring job has no aggregator: this client sums only through one.
        let job = r["job"].as_u64().unwrap_or(0);
        return Some(JobState::Failed(format!(
            "job {job} is all-reduced by its workers in a ring (--grouping ring); the yard-agg worker sums only through an aggregator"
        )));
    }
    for key in ["failed", "gone", "error"] {
        if let Some(why) = v.get(key) {
            return Some(JobState::Failed(
                why.as_str().unwrap_or("the job ended").to_owned(),
            ));
        }
    }
    None
}

impl Session {
    /// Joins job `job` as rank `rank`, sending from `addr`, through the agent at `socket`
    /// (the node's `aggregator.socket`; `YARD_AGG_SOCKET` by convention).
    pub fn join(
        socket: &Path,
        job: &str,
        rank: u16,
        addr: SocketAddrV4,
    ) -> Result<Session, SessionError> {
        let stream = UnixStream::connect(socket).map_err(|source| SessionError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
        let mut line =
            json!({"join": {"job": job, "rank": rank, "addr": addr.to_string()}}).to_string();
        line.push('\n');
        (&stream).write_all(line.as_bytes())?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut first = String::new();
        reader.read_line(&mut first)?;
        let v: Value = serde_json::from_str(first.trim()).unwrap_or(Value::Null);
        if let Some(why) = v.get("error") {
            return Err(SessionError::Refused(
                why.as_str().unwrap_or("no reason given").to_owned(),
            ));
        }
        let initial = parse_line(first.trim())
            .ok_or_else(|| SessionError::Ended("the node closed the session at once".into()))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(initial),
            changed: Condvar::new(),
        });
        let follower = shared.clone();
        std::thread::Builder::new()
            .name(format!("yard-agg-{job}-{rank}"))
            .spawn(move || {
                let mut line = String::new();
                let why = loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) => break "the yard node closed the aggregation session".to_owned(),
                        Ok(_) => {}
                        Err(e) => break format!("the aggregation session failed: {e}"),
                    }
                    if line.contains("\"left\"") {
                        break "left the job".to_owned();
                    }
                    if let Some(state) = parse_line(line.trim()) {
                        *follower.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
                        follower.changed.notify_all();
                    }
                };
                let mut s = follower.state.lock().unwrap_or_else(|e| e.into_inner());
                if !matches!(*s, JobState::Failed(_)) {
                    *s = JobState::Closed(why);
                }
                follower.changed.notify_all();
            })?;
        Ok(Session { stream, shared })
    }

    /// The job's state as the node last said.
    pub fn state(&self) -> JobState {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until the job runs, for at most `timeout`: this worker's membership.
    pub fn wait_running(&self, timeout: Duration) -> Result<Membership, SessionError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*s {
                JobState::Running(m) => return Ok(*m),
                JobState::Failed(why) | JobState::Closed(why) => {
                    return Err(SessionError::Ended(why.clone()))
                }
                JobState::Waiting => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SessionError::Timeout(timeout));
            }
            s = self
                .shared
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Leaves the job cleanly: the node does not report this worker gone.
    pub fn leave(self) -> Result<(), SessionError> {
        (&self.stream).write_all(b"{\"leave\": true}\n")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let JobState::Closed(_) = self.state() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for Session {
    /// Closes the session for both halves: the follower thread holds a clone of the socket, so
    /// without a shutdown the node would not see the end of a session whose worker dropped it.
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_states() {
        let m = parse_line(
            r#"{"membership": {"job": 3, "epoch": 2, "worker": 1, "workers": 4, "aggregator": "198.18.0.1:7481", "values": 10, "chunk_values": 360, "dtype": "f32", "token": 4294967295, "result_token": 7}}"#,
        );
        let Some(JobState::Running(m)) = m else {
            panic!("{m:?}")
        };
        assert_eq!(
            (m.job, m.epoch, m.worker, m.workers, m.dtype),
            (3, 2, 1, 4, Dtype::F32)
        );
        assert_eq!((m.token, m.result_token), (u32::MAX, 7));
        assert_eq!(parse_line(r#"{"waiting": "x"}"#), Some(JobState::Waiting));
        assert_eq!(
            parse_line(r#"{"failed": "job t failed: worker rank 2 died (it crashed)"}"#),
            Some(JobState::Failed(
                "job t failed: worker rank 2 died (it crashed)".into()
            ))
        );
        assert_eq!(parse_line("garbage"), None);
        let Some(JobState::Failed(why)) =
            parse_line(r#"{"ring": {"job": 4, "epoch": 1, "rank": 0, "ranks": [0, 1]}}"#)
        else {
            panic!("a ring job is no job for this client");
        };
        assert!(
            why.starts_with("job 4 is all-reduced by its workers in a ring"),
            "{why}"
        );
    }
}
