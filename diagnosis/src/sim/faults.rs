//! The fault catalogue and the ground-truth label each fault writes. A fault is either tied to
//! one operation (a process group and a sequence number: it fires when that op comes up) or to
//! a time (it takes effect at `onset_ns`, nanoseconds after the job started). The two imbalance
//! entries are controls, not faults: a sound analyzer must stay silent on them.

use super::topology::Topology;
use super::SimError;
use crate::event::Rank;
use crate::verdict::{Class, LinkKind, Subtype};
use serde::{Deserialize, Serialize};

/// Which field of a collective a mismatching rank gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchKind {
    Type,
    Size,
    Dtype,
}

/// One injected fault (or control).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// The rank never enqueues collective `seq` of `pg`: it is stuck in host code (heartbeats go
    /// on) and every other member waits for it.
    SkipCollective { rank: Rank, pg: String, seq: u64 },
    /// Right after collective `after_seq` of `pg` the rank issues one more collective that no
    /// other member issues, and waits in it. Use a group the others will not touch again before
    /// they block on the rank (the `world` group fits), or the others' next op in that group
    /// waits too and the picture also resembles a mismatch.
    ExtraCollective {
        rank: Rank,
        pg: String,
        after_seq: u64,
    },
    /// The rank enqueues collective `seq` of `pg` with a different type, size or dtype; every
    /// member's kernel starts and none finishes.
    Mismatch {
        rank: Rank,
        pg: String,
        seq: u64,
        kind: MismatchKind,
    },
    /// SIGSTOP: from `onset_ns` the rank reports nothing, heartbeats included.
    ProcessFreeze { rank: Rank, onset_ns: u64 },
    /// The process dies at `onset_ns`: no events, no heartbeats, no Flight Recorder dump.
    ProcessCrash { rank: Rank, onset_ns: u64 },
    /// The rank's kernel for collective `seq` of `pg` starts and never ends; it sends nothing, so
    /// every member is stuck in the same op.
    GpuKernelHang { rank: Rank, pg: String, seq: u64 },
    /// From `onset_ns` the rank computes `factor` times slower (thermal throttling, CPU
    /// contention).
    SlowCompute {
        rank: Rank,
        factor: f64,
        onset_ns: u64,
    },
    /// From `onset_ns` the link between two nodes carries data `factor` times slower, both ways.
    SlowLink {
        from_node: u32,
        to_node: u32,
        factor: f64,
        onset_ns: u64,
    },
    /// From `onset_ns` every inter-node transfer through one node's NIC is `factor` times slower.
    SlowNic {
        node: u32,
        factor: f64,
        onset_ns: u64,
    },
    /// From `onset_ns` every inter-node transfer touching a node under ToR `tor` is `factor`
    /// times slower.
    Congestion {
        tor: u32,
        factor: f64,
        onset_ns: u64,
    },
    /// Control: pipeline stage `stage` computes `factor` times longer from step 0 (a badly
    /// partitioned model). Not a fault.
    ImbalanceStage { stage: u32, factor: f64 },
    /// Control: each step one random rank computes `factor` times longer (sequence-length
    /// imbalance). Not a fault.
    ImbalanceRandom { factor: f64 },
}

impl Fault {
    /// The snake-case name used in labels and scenario names.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::SkipCollective { .. } => "skip_collective",
            Fault::ExtraCollective { .. } => "extra_collective",
            Fault::Mismatch { .. } => "mismatch",
            Fault::ProcessFreeze { .. } => "process_freeze",
            Fault::ProcessCrash { .. } => "process_crash",
            Fault::GpuKernelHang { .. } => "gpu_kernel_hang",
            Fault::SlowCompute { .. } => "slow_compute",
            Fault::SlowLink { .. } => "slow_link",
            Fault::SlowNic { .. } => "slow_nic",
            Fault::Congestion { .. } => "congestion",
            Fault::ImbalanceStage { .. } => "imbalance_stage",
            Fault::ImbalanceRandom { .. } => "imbalance_random",
        }
    }

    /// Controls describe healthy-but-uneven jobs; no verdict is expected.
    pub fn is_control(&self) -> bool {
        matches!(
            self,
            Fault::ImbalanceStage { .. } | Fault::ImbalanceRandom { .. }
        )
    }

    /// The onset of a time-triggered fault, relative to the job's start; `None` for faults tied
    /// to an op (their onset is when the op comes up) and for controls.
    pub fn onset_offset(&self) -> Option<u64> {
        match self {
            Fault::ProcessFreeze { onset_ns, .. }
            | Fault::ProcessCrash { onset_ns, .. }
            | Fault::SlowCompute { onset_ns, .. }
            | Fault::SlowLink { onset_ns, .. }
            | Fault::SlowNic { onset_ns, .. }
            | Fault::Congestion { onset_ns, .. } => Some(*onset_ns),
            _ => None,
        }
    }

    /// The rank a fault is about, if it is about one.
    pub fn rank(&self) -> Option<Rank> {
        match self {
            Fault::SkipCollective { rank, .. }
            | Fault::ExtraCollective { rank, .. }
            | Fault::Mismatch { rank, .. }
            | Fault::ProcessFreeze { rank, .. }
            | Fault::ProcessCrash { rank, .. }
            | Fault::GpuKernelHang { rank, .. }
            | Fault::SlowCompute { rank, .. } => Some(*rank),
            _ => None,
        }
    }

    /// The process group named by an op-tied fault.
    pub fn pg(&self) -> Option<&str> {
        match self {
            Fault::SkipCollective { pg, .. }
            | Fault::ExtraCollective { pg, .. }
            | Fault::Mismatch { pg, .. }
            | Fault::GpuKernelHang { pg, .. } => Some(pg),
            _ => None,
        }
    }

    /// Checks the fault against the job's layout.
    pub fn validate(&self, topo: &Topology) -> Result<(), SimError> {
        let bad = |why: String| Err(SimError::Fault(why));
        if let Some(rank) = self.rank() {
            if rank >= topo.world {
                return bad(format!(
                    "rank {rank} is outside the world of {}",
                    topo.world
                ));
            }
        }
        if let Some(pg) = self.pg() {
            let Some(g) = topo.group(pg) else {
                return bad(format!("no process group named {pg:?}"));
            };
            if let Some(rank) = self.rank() {
                if !topo.groups[g].ranks.contains(&rank) {
                    return bad(format!("rank {rank} is not a member of {pg:?}"));
                }
            }
        }
        let nodes = topo.world / topo.gpus_per_node;
        match self {
            Fault::SlowLink {
                from_node, to_node, ..
            } if *from_node >= nodes || *to_node >= nodes || from_node == to_node => bad(format!(
                "slow link {from_node}-{to_node} is not a link between two of {nodes} nodes"
            )),
            Fault::SlowNic { node, .. } if *node >= nodes => {
                bad(format!("node {node} is outside the {nodes} nodes"))
            }
            Fault::Congestion { tor, .. } if tor * topo.nodes_per_tor >= nodes => {
                bad(format!("no ToR switch {tor}"))
            }
            Fault::ImbalanceStage { stage, .. } if *stage >= topo.pp => {
                bad(format!("no pipeline stage {stage}"))
            }
            _ => Ok(()),
        }?;
        let factor = match self {
            Fault::SlowCompute { factor, .. }
            | Fault::SlowLink { factor, .. }
            | Fault::SlowNic { factor, .. }
            | Fault::Congestion { factor, .. }
            | Fault::ImbalanceStage { factor, .. }
            | Fault::ImbalanceRandom { factor } => *factor,
            _ => 1.0,
        };
        if !(factor.is_finite() && factor >= 1.0) {
            return bad(format!(
                "slowdown factor {factor} must be finite and at least 1"
            ));
        }
        Ok(())
    }

    /// The ground truth this fault writes; `onset_ns` is on the analyzer's clock.
    pub fn label(&self, onset_ns: u64) -> Label {
        let culprit = self.rank().into_iter().collect::<Vec<_>>();
        let (class, subtype, culprits, links) = match self {
            Fault::SkipCollective { .. } => {
                (Class::Hang, Subtype::MissingParticipant, culprit, vec![])
            }
            Fault::ExtraCollective { .. } => {
                (Class::Hang, Subtype::ExtraParticipant, culprit, vec![])
            }
            Fault::Mismatch { kind, .. } => {
                let subtype = match kind {
                    MismatchKind::Type => Subtype::TypeMismatch,
                    MismatchKind::Size => Subtype::SizeMismatch,
                    MismatchKind::Dtype => Subtype::DtypeMismatch,
                };
                (Class::Mismatch, subtype, culprit, vec![])
            }
            Fault::ProcessFreeze { .. } | Fault::ProcessCrash { .. } => {
                (Class::Hang, Subtype::DeadProcess, culprit, vec![])
            }
            Fault::GpuKernelHang { .. } => (Class::Hang, Subtype::DataplaneStall, culprit, vec![]),
            Fault::SlowCompute { .. } => (Class::Slow, Subtype::ComputeStraggler, culprit, vec![]),
            Fault::SlowLink {
                from_node, to_node, ..
            } => (
                Class::Slow,
                Subtype::SlowLink,
                vec![],
                vec![LabelLink {
                    kind: LinkKind::Pair,
                    name: format!(
                        "{} <-> {}",
                        Topology::host(*from_node),
                        Topology::host(*to_node)
                    ),
                    nodes: vec![*from_node, *to_node],
                    tor: None,
                }],
            ),
            Fault::SlowNic { node, .. } => (
                Class::Slow,
                Subtype::SlowLink,
                vec![],
                vec![LabelLink {
                    kind: LinkKind::Nic,
                    name: format!("{}/nic0", Topology::host(*node)),
                    nodes: vec![*node],
                    tor: None,
                }],
            ),
            Fault::Congestion { tor, .. } => (
                Class::Slow,
                Subtype::Congestion,
                vec![],
                vec![LabelLink {
                    kind: LinkKind::Switch,
                    name: Topology::tor_name(*tor),
                    nodes: vec![],
                    tor: Some(*tor),
                }],
            ),
            Fault::ImbalanceStage { .. } | Fault::ImbalanceRandom { .. } => {
                return Label {
                    fault: Some(self.name().into()),
                    onset_ns,
                    ..Label::default()
                }
            }
        };
        Label {
            fault: Some(self.name().into()),
            class: Some(class),
            subtype: Some(subtype),
            culprits,
            links,
            onset_ns,
        }
    }
}

/// A link or component the ground truth blames, in the simulator's terms (nodes and switches),
/// so a scorer can match it against a verdict's rank pair, NIC or switch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelLink {
    pub kind: LinkKind,
    /// "node3 <-> node5", "node3/nic0", "tor1".
    pub name: String,
    /// The two ends of a pair, the node behind a NIC, nothing for a switch.
    pub nodes: Vec<u32>,
    pub tor: Option<u32>,
}

/// Ground truth of one simulation. `class` is `None` for healthy jobs and controls.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Label {
    /// The injected fault's name (`Fault::name`), `None` for a healthy job.
    pub fault: Option<String>,
    pub class: Option<Class>,
    pub subtype: Option<Subtype>,
    /// Ranks at fault, sorted.
    pub culprits: Vec<Rank>,
    pub links: Vec<LabelLink>,
    /// When the fault took effect, on the analyzer's clock (0 for healthy jobs; the job's start
    /// for controls).
    pub onset_ns: u64,
}

impl Label {
    /// Whether a verdict is expected at all.
    pub fn is_fault(&self) -> bool {
        self.class.is_some()
    }

    /// A short category for score tables: "hang/missing_participant", "healthy",
    /// "control/imbalance_stage".
    pub fn category(&self) -> String {
        match (self.class, self.subtype, &self.fault) {
            (Some(c), Some(s), _) => format!("{c}/{s}"),
            (Some(c), None, _) => c.to_string(),
            (None, _, Some(fault)) => format!("control/{fault}"),
            (None, _, None) => "healthy".into(),
        }
    }
}
