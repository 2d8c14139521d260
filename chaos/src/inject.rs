//! Applies a schedule's faults to a real cluster in network namespaces, and undoes them.

use yard_cluster_tests::yard::YardCluster;

use crate::schedule::{Fault, FaultKind};

/// Schedules number hosts from 0, topologies from 1.
fn hosts(fault: &Fault) -> Vec<usize> {
    fault.targets.iter().map(|i| i + 1).collect()
}

/// Starts `fault` on the cluster.
pub fn begin(c: &mut YardCluster, fault: &Fault) -> yard_cluster_tests::Result<()> {
    let t = &hosts(fault);
    match fault.kind {
        FaultKind::Kill9 => t.iter().try_for_each(|i| c.kill9(*i)),
        FaultKind::Pause => t.iter().try_for_each(|i| match c.process(*i) {
            Some(p) => p.stop(),
            None => Ok(()),
        }),
        FaultKind::LinkDown => t.iter().try_for_each(|i| c.topo.link_down(*i)),
        FaultKind::Partition => c.topo.partition(&[t]),
        FaultKind::Loss { pct } => t.iter().try_for_each(|i| c.topo.loss(*i, f64::from(pct))),
    }
}

/// Ends `fault`: restarts killed nodes from their stores, resumes paused ones, heals links.
pub fn end(c: &mut YardCluster, fault: &Fault) -> yard_cluster_tests::Result<()> {
    let t = &hosts(fault);
    match fault.kind {
        FaultKind::Kill9 => t.iter().try_for_each(|i| c.restart(*i).map(|_| ())),
        FaultKind::Pause => t.iter().try_for_each(|i| match c.process(*i) {
            Some(p) => p.cont(),
            None => Ok(()),
        }),
        FaultKind::LinkDown => t.iter().try_for_each(|i| c.topo.link_up(*i)),
        FaultKind::Partition => c.topo.heal(),
        FaultKind::Loss { .. } => t.iter().try_for_each(|i| c.topo.clear_loss(*i)),
    }
}
