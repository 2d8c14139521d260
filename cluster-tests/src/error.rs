//! Errors of the harness.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// What can go wrong while building test hosts, running processes in them or injecting faults.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A yard cluster operation failed (see [`crate::yard`]).
    #[error("{0}")]
    Yard(String),
    /// An overlay, gateway or baseline could not be set up as asked (see [`crate::overlay`],
    /// [`crate::kernel_gw`], [`crate::keepalived`]).
    #[error("{0}")]
    Setup(String),
    /// Namespaces, veths, nftables and TC need root.
    #[error("network-namespace tests need root (effective uid is {euid}); run them as root, e.g. with sudo -E cargo test")]
    NotRoot {
        /// The effective uid the process has.
        euid: u32,
    },
    /// A host number outside `1..=hosts`.
    #[error("host {host} is not in this topology of {hosts} hosts")]
    NoSuchHost {
        /// The host asked for.
        host: usize,
        /// How many hosts the topology has.
        hosts: usize,
    },
    /// A topology size the address plan cannot hold.
    #[error("a topology needs between 1 and {max} hosts, not {hosts}")]
    HostCount {
        /// The size asked for.
        hosts: usize,
        /// The largest size supported.
        max: usize,
    },
    /// The same host listed in two groups of a partition.
    #[error("host {host} appears in more than one partition group")]
    DuplicateHost {
        /// The host listed twice.
        host: usize,
    },
    /// A loss percentage outside 0..=100.
    #[error("loss must be between 0 and 100 percent, not {percent}")]
    BadPercent {
        /// The percentage asked for.
        percent: f64,
    },
    /// A rate limit of zero.
    #[error("a rate limit must be at least 1 mbit/s")]
    BadRate,
    /// A setup command (ip, tc, nft, ethtool) exited non-zero.
    #[error("`{command}` failed with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it printed to stderr, trimmed.
        stderr: String,
    },
    /// A system call or file operation failed.
    #[error("could not {action}")]
    Io {
        /// What the harness was doing, as a verb phrase.
        action: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A command run in a host did not finish in time; it was killed.
    #[error("`{command}` did not finish within {timeout:?} and was killed")]
    Timeout {
        /// The command line.
        command: String,
        /// The time it was given.
        timeout: Duration,
    },
    /// A link did not come up in time.
    #[error("{what} did not come up within {timeout:?}")]
    LinkNotUp {
        /// The link and its namespace.
        what: String,
        /// The time it was given.
        timeout: Duration,
    },
    /// A process did not exit in time.
    #[error("process {pid} ({name}) did not exit within {timeout:?}")]
    ExitTimeout {
        /// Its pid.
        pid: u32,
        /// Its log name.
        name: String,
        /// The time it was given.
        timeout: Duration,
    },
    /// A signal to a process that has already exited (and been reaped).
    #[error("process {pid} ({name}) has already exited")]
    Exited {
        /// Its pid.
        pid: u32,
        /// Its log name.
        name: String,
    },
    /// A process that should be running has exited on its own (see [`crate::Process::check_running`]).
    #[error("process {pid} ({name}) exited ({status}); last lines of {}:\n{tail}", .log.display())]
    Died {
        /// Its pid.
        pid: u32,
        /// Its log name.
        name: String,
        /// How it exited.
        status: ExitStatus,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The compiled loss program does not look as the harness expects.
    #[error("the loss program object is unusable: {0}")]
    LossObject(String),
    /// Every run id tried was taken.
    #[error("could not find a free run id after {0} tries")]
    NoRunId(usize),
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps an I/O error with what the harness was doing.
pub(crate) fn io_err(action: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let action = action.into();
    move |source| Error::Io { action, source }
}
