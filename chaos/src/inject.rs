//! Applies a schedule's faults to a real cluster in network namespaces, and undoes them.

use std::time::Duration;

use yard_cluster_tests::yard::{YardCluster, PORT};
use yard_cluster_tests::ControlFault;

use crate::schedule::{Fault, FaultKind};

/// Schedules number hosts from 0, topologies from 1.
fn hosts(fault: &Fault) -> Vec<usize> {
    fault.targets.iter().map(|i| i + 1).collect()
}

/// SIGSTOPs every running daemon of the cluster (a whole-machine stall).
pub fn stop_all(c: &YardCluster) -> yard_cluster_tests::Result<()> {
    (1..=c.len()).try_for_each(|i| c.process(i).map_or(Ok(()), |p| p.stop()))
}

/// SIGCONTs every daemon of the cluster.
pub fn cont_all(c: &YardCluster) -> yard_cluster_tests::Result<()> {
    (1..=c.len()).try_for_each(|i| c.process(i).map_or(Ok(()), |p| p.cont()))
}

/// Stalls every running daemon for `len`: stopped together, resumed together. Every daemon is
/// resumed even if stopping one failed.
pub fn stall(c: &YardCluster, len: Duration) -> yard_cluster_tests::Result<()> {
    let stopped = stop_all(c);
    std::thread::sleep(len);
    let resumed = cont_all(c);
    stopped.and(resumed)
}

/// Starts `fault` on the cluster.
pub fn begin(c: &mut YardCluster, fault: &Fault) -> yard_cluster_tests::Result<()> {
    let t = &hosts(fault);
    match fault.kind {
        FaultKind::Kill9 | FaultKind::Kill9Stall => t.iter().try_for_each(|i| c.kill9(*i)),
        FaultKind::Pause => t.iter().try_for_each(|i| match c.process(*i) {
            Some(p) => p.stop(),
            None => Ok(()),
        }),
        FaultKind::LinkDown | FaultKind::LinkDownStall => {
            t.iter().try_for_each(|i| c.topo.link_down(*i))
        }
        FaultKind::Partition => c.topo.partition(&[t]),
        FaultKind::Loss { pct } => t.iter().try_for_each(|i| c.topo.loss(*i, f64::from(pct))),
        FaultKind::ControlLoss { pct } => c.topo.control_fault(t, PORT, ControlFault::Loss { pct }),
        FaultKind::ControlOneway => c.topo.control_fault(t, PORT, ControlFault::OutboundOnly),
        FaultKind::Stall => stop_all(c),
    }
}

/// Ends `fault`: restarts killed nodes from their stores, resumes paused ones, heals links.
pub fn end(c: &mut YardCluster, fault: &Fault) -> yard_cluster_tests::Result<()> {
    let t = &hosts(fault);
    match fault.kind {
        FaultKind::Kill9 | FaultKind::Kill9Stall => {
            t.iter().try_for_each(|i| c.restart(*i).map(|_| ()))
        }
        FaultKind::Pause => t.iter().try_for_each(|i| match c.process(*i) {
            Some(p) => p.cont(),
            None => Ok(()),
        }),
        FaultKind::LinkDown | FaultKind::LinkDownStall => {
            t.iter().try_for_each(|i| c.topo.link_up(*i))
        }
        FaultKind::Partition => c.topo.heal(),
        FaultKind::Loss { .. } => t.iter().try_for_each(|i| c.topo.clear_loss(*i)),
        FaultKind::ControlLoss { .. } | FaultKind::ControlOneway => c.topo.clear_control_faults(),
        FaultKind::Stall => cont_all(c),
    }
}
