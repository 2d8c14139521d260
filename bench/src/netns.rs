//! Moving the calling thread into a test host's network namespace.
//!
//! The test hosts sit on a bridge in their own fabric namespace, which the root namespace cannot
//! reach. The benchmark's driver runs as an extra host: its thread enters that host's namespace
//! *before* it builds the tokio runtime, so every runtime thread (spawned from it) and every
//! socket they open live there too. The process's main thread stays in the root namespace, which
//! keeps the harness's cleanup (`ip netns pids`, then SIGKILL) from ever picking this process.

use std::fs::File;
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

/// Moves the calling thread (only) into the named namespace made by `ip netns add`.
pub fn enter(ns: &str) -> Result<()> {
    let path = format!("/run/netns/{ns}");
    let file = File::open(&path).with_context(|| format!("cannot open namespace {path}"))?;
    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
        .with_context(|| format!("cannot enter network namespace {ns}"))?;
    Ok(())
}
