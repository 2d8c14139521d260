//! Processes started inside test hosts.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

use crate::error::{io_err, Error, Result};

/// How much of a dead process's log [`Process::check_running`] quotes.
const LOG_TAIL_LINES: usize = 20;

/// A process the [`Topology`](crate::Topology) started in a host; cheap to clone.
///
/// The topology keeps a clone and kills the process when it is dropped, so a test may let its
/// handles go at any time. The child is reaped only through this handle, which is what makes
/// signalling by pid safe: an unreaped child keeps its pid, so a signal can never reach an
/// unrelated process that reused it.
#[derive(Clone, Debug)]
pub struct Process {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pid: u32,
    host: usize,
    name: String,
    log: PathBuf,
    child: Mutex<Child>,
}

impl Process {
    pub(crate) fn new(child: Child, host: usize, name: String, log: PathBuf) -> Self {
        Self {
            inner: Arc::new(Inner {
                pid: child.id(),
                host,
                name,
                log,
                child: Mutex::new(child),
            }),
        }
    }

    /// The program's own pid: `ip netns exec` execs the program in place, so this is not the pid
    /// of a wrapper.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// The host (1-based) the process runs in.
    pub fn host(&self) -> usize {
        self.inner.host
    }

    /// The name its log was given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The file holding its stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.inner.log
    }

    /// Its stdout and stderr so far (lossy UTF-8); empty if the log cannot be read.
    pub fn log(&self) -> String {
        std::fs::read(&self.inner.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Fails with [`Error::Died`], which carries its exit status and the end of its log, if it
    /// has exited: for a process that must not stop on its own (a cluster member) while a
    /// caller waits on it.
    pub fn check_running(&self) -> Result<()> {
        match self.try_exit_status()? {
            None => Ok(()),
            Some(status) => Err(Error::Died {
                pid: self.pid(),
                name: self.name().to_owned(),
                status,
                log: self.log_path().to_owned(),
                tail: self.log_tail(LOG_TAIL_LINES),
            }),
        }
    }

    /// Kills it with SIGKILL, as a crash or power cut would; it is not an error if it has
    /// already exited. Does not wait: use [`Process::wait_exit`].
    pub fn kill9(&self) -> Result<()> {
        match self.signal(Signal::KILL) {
            Err(Error::Exited { .. }) => Ok(()),
            other => other,
        }
    }

    /// Sends SIGTERM, the graceful stop systemd and Kubernetes use.
    pub fn terminate(&self) -> Result<()> {
        self.signal(Signal::TERM)
    }

    /// Freezes it with SIGSTOP: it holds its sockets and state but answers nothing, like a hung
    /// or long-paused (GC, swap) node.
    pub fn stop(&self) -> Result<()> {
        self.signal(Signal::STOP)
    }

    /// Sends SIGUSR1, which the test programs take as a switch (`torch_job.py train`: this
    /// rank computes slower from then on).
    pub fn usr1(&self) -> Result<()> {
        self.signal(Signal::USR1)
    }

    /// Sends SIGHUP, which the daemon takes as "re-read your certificate files".
    pub fn hup(&self) -> Result<()> {
        self.signal(Signal::HUP)
    }

    /// Resumes it after [`Process::stop`] with SIGCONT.
    pub fn cont(&self) -> Result<()> {
        self.signal(Signal::CONT)
    }

    /// Whether it has not exited yet (a stopped process is still running).
    pub fn is_running(&self) -> bool {
        matches!(self.lock().try_wait(), Ok(None))
    }

    /// Its exit status, if it has exited.
    pub fn try_exit_status(&self) -> Result<Option<ExitStatus>> {
        self.lock().try_wait().map_err(io_err(format!(
            "check whether process {} exited",
            self.pid()
        )))
    }

    /// Waits up to `timeout` for it to exit and returns how it exited.
    pub fn wait_exit(&self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(Error::ExitTimeout {
                    pid: self.pid(),
                    name: self.name().to_owned(),
                    timeout,
                });
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGCONT then SIGKILL, then reap it; used by cleanup, so it never fails or panics.
    pub(crate) fn force_kill(&self) {
        let _ = self.signal(Signal::CONT);
        let _ = self.signal(Signal::KILL);
        let _ = self.wait_exit(Duration::from_secs(5));
    }

    /// Signals the process while holding the lock that guards reaping, so the pid cannot be
    /// reaped and reused between the check and the signal.
    fn signal(&self, sig: Signal) -> Result<()> {
        let mut child = self.lock();
        if matches!(child.try_wait(), Ok(Some(_))) {
            return Err(Error::Exited {
                pid: self.pid(),
                name: self.name().to_owned(),
            });
        }
        let pid = i32::try_from(self.pid())
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| Error::Io {
                action: format!("signal process {}", self.pid()),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })?;
        kill_process(pid, sig)
            .map_err(|e| io_err(format!("signal process {}", self.pid()))(e.into()))
    }

    /// Locks the child; a panic elsewhere while it was held leaves it usable.
    fn lock(&self) -> MutexGuard<'_, Child> {
        self.inner
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
