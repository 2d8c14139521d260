//! Network-namespace test hosts running real yard processes.
//!
//! Multi-host tests need real processes on real (virtual) networks so that QUIC, Raft timers,
//! kernel sockets and XDP all behave as they will in production. A [`Topology`] makes one
//! namespace per host on a private bridge (198.18.0.0/16, nothing in the root namespace is
//! touched), starts processes inside the hosts, injects faults between them, and removes
//! everything it made when it is dropped — also when a test panics.

pub mod agg;
mod cmd;
mod error;
mod faults;
pub mod keepalived;
pub mod kernel_gw;
mod loss;
pub mod overlay;
pub mod probe;
mod process;
pub mod ring;
mod topology;
pub mod torch;
pub mod yard;

pub use error::{Error, Result};
pub use faults::ControlFault;
pub use process::Process;
pub use topology::{sweep_stale, thread_in_namespace, Topology, EXEC_TIMEOUT, MAX_HOSTS};

/// Fails the calling test unless it runs as root.
///
/// Namespace tests must never skip silently when they cannot run: a skipped test reads as a
/// passed one in CI. Call this first in every test that makes a [`Topology`].
///
/// # Panics
/// When the effective user is not root, with a message saying how to run the test.
pub fn require_root() {
    if let Err(e) = check_root() {
        panic!("{e}");
    }
}

/// Returns [`Error::NotRoot`] unless the effective user is root.
///
/// Library calls use this rather than [`require_root`] so that callers get an error, not a panic.
pub fn check_root() -> Result<()> {
    let euid = rustix::process::geteuid();
    if euid.is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot {
            euid: euid.as_raw(),
        })
    }
}
