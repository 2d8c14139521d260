//! Where every rank sits: nodes, ToR switches, and the Megatron-style process groups built over
//! them. Ranks are laid out as Megatron does by default (tensor-parallel index fastest, then
//! data-parallel, then pipeline stage), so a TP group is a run of consecutive ranks inside one
//! node and DP/PP groups stride across nodes.

use super::{JobKind, LinkSpec, SimError, SimSpec};
use crate::event::{Group, Member, PgName, Rank};
use std::collections::HashMap;

/// What a process group is for; decides which ops it carries and how it is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Tensor parallel: all-reduces inside a node.
    Tp,
    /// Pipeline parallel: send/recv between adjacent stages.
    Pp,
    /// Data parallel: the gradient all-reduce at step end.
    Dp,
    /// Every rank: the start-up barrier and the periodic loss all-reduce.
    World,
}

impl GroupKind {
    fn prefix(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Pp => "pp",
            GroupKind::Dp => "dp",
            GroupKind::World => "world",
        }
    }
}

/// One process group.
#[derive(Clone, Debug)]
pub struct SimGroup {
    pub name: PgName,
    pub kind: GroupKind,
    /// Global ranks in group-rank order (ring order).
    pub ranks: Vec<Rank>,
}

/// The job's layout.
#[derive(Clone, Debug)]
pub struct Topology {
    pub world: u32,
    pub gpus_per_node: u32,
    pub nodes_per_tor: u32,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub groups: Vec<SimGroup>,
    by_name: HashMap<PgName, usize>,
    /// Index of `pp0`; pipeline groups follow in order of their first rank.
    pp_base: Option<usize>,
    links: LinkSpec,
}

impl Topology {
    /// Builds the layout, rejecting shapes that do not tile the machine.
    pub fn new(spec: &SimSpec) -> Result<Topology, SimError> {
        let world = spec
            .nodes
            .checked_mul(spec.gpus_per_node)
            .ok_or(SimError::Shape("nodes × gpus_per_node overflows".into()))?;
        let parallel = u64::from(spec.tp) * u64::from(spec.pp) * u64::from(spec.dp);
        if world == 0 || parallel != u64::from(world) {
            return Err(SimError::Shape(format!(
                "tp {} × pp {} × dp {} must equal nodes {} × gpus_per_node {}",
                spec.tp, spec.pp, spec.dp, spec.nodes, spec.gpus_per_node
            )));
        }
        if !spec.gpus_per_node.is_multiple_of(spec.tp) {
            return Err(SimError::Shape(format!(
                "tp {} must divide gpus_per_node {} so tensor-parallel groups stay inside a node",
                spec.tp, spec.gpus_per_node
            )));
        }
        if spec.links.nodes_per_tor == 0 {
            return Err(SimError::Shape("nodes_per_tor must be at least 1".into()));
        }
        let (tp, pp, dp) = (spec.tp, spec.pp, spec.dp);
        let rank = |p: u32, d: u32, t: u32| t + tp * (d + dp * p);
        let mut groups = Vec::new();
        // HSDP names its node-local groups after what they hold (a shard of the model) and
        // its cross-node groups after what they join (replicas), as FSDP's device mesh does.
        let prefix = |kind: GroupKind| match (spec.kind, kind) {
            (JobKind::Hsdp, GroupKind::Tp) => "shard",
            (JobKind::Hsdp, GroupKind::Dp) => "replica",
            _ => kind.prefix(),
        };
        let mut push = |kind: GroupKind, index: u32, ranks: Vec<Rank>| {
            if ranks.len() > 1 {
                let name: PgName = if kind == GroupKind::World {
                    "world".into()
                } else {
                    format!("{}{index}", prefix(kind)).into()
                };
                groups.push(SimGroup { name, kind, ranks });
            }
        };
        push(GroupKind::World, 0, (0..world).collect());
        for p in 0..pp {
            for d in 0..dp {
                let ranks = (0..tp).map(|t| rank(p, d, t)).collect();
                push(GroupKind::Tp, p * dp + d, ranks);
            }
        }
        for p in 0..pp {
            for t in 0..tp {
                let ranks = (0..dp).map(|d| rank(p, d, t)).collect();
                push(GroupKind::Dp, p * tp + t, ranks);
            }
        }
        for d in 0..dp {
            for t in 0..tp {
                let ranks = (0..pp).map(|p| rank(p, d, t)).collect();
                push(GroupKind::Pp, d * tp + t, ranks);
            }
        }
        let by_name: HashMap<PgName, usize> = groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.clone(), i))
            .collect();
        let pp_base = groups.iter().position(|g| g.kind == GroupKind::Pp);
        Ok(Topology {
            world,
            gpus_per_node: spec.gpus_per_node,
            nodes_per_tor: spec.links.nodes_per_tor,
            tp,
            pp,
            dp,
            groups,
            by_name,
            pp_base,
            links: spec.links.clone(),
        })
    }

    /// The group index for a name.
    pub fn group(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Groups of one kind, by index.
    pub fn groups_of(&self, kind: GroupKind) -> impl Iterator<Item = usize> + '_ {
        self.groups
            .iter()
            .enumerate()
            .filter(move |(_, g)| g.kind == kind)
            .map(|(i, _)| i)
    }

    pub fn node_of(&self, rank: Rank) -> u32 {
        rank / self.gpus_per_node
    }

    pub fn tor_of_node(&self, node: u32) -> u32 {
        node / self.nodes_per_tor
    }

    pub fn stage_of(&self, rank: Rank) -> u32 {
        rank / (self.tp * self.dp)
    }

    /// Ranks of one pipeline stage.
    pub fn stage_ranks(&self, stage: u32) -> std::ops::Range<Rank> {
        let per_stage = self.tp * self.dp;
        stage * per_stage..(stage + 1) * per_stage
    }

    /// The rank at the same (dp, tp) position in another stage.
    pub fn in_stage(&self, rank: Rank, stage: u32) -> Rank {
        let per_stage = self.tp * self.dp;
        rank % per_stage + stage * per_stage
    }

    /// The pipeline group holding a rank.
    pub fn pp_group_of(&self, rank: Rank) -> Option<usize> {
        let per_stage = self.tp * self.dp;
        self.pp_base.map(|base| base + (rank % per_stage) as usize)
    }

    pub fn host(node: u32) -> String {
        format!("node{node}")
    }

    pub fn tor_name(tor: u32) -> String {
        format!("tor{tor}")
    }

    /// A node's underlay address, in the benchmarking range 198.18.0.0/16.
    pub fn addr(node: u32) -> String {
        format!("198.18.{}.{}", 1 + node / 254, 1 + node % 254)
    }

    /// The `Member` record a rank's probe client sends on start-up.
    pub fn member(&self, rank: Rank) -> Member {
        let node = self.node_of(rank);
        Member {
            rank,
            world_size: self.world,
            host: Self::host(node),
            addr: Self::addr(node),
            nic: "nic0".into(),
            switch: Self::tor_name(self.tor_of_node(node)),
            pid: 10_000 + rank % self.gpus_per_node,
        }
    }

    /// The `Group` record for a group index.
    pub fn group_event(&self, g: usize) -> Group {
        let group = &self.groups[g];
        Group {
            name: group.name.clone(),
            desc: group
                .name
                .trim_end_matches(|c: char| c.is_ascii_digit())
                .to_string(),
            ranks: group.ranks.clone(),
        }
    }

    /// Nominal bandwidth (bytes/ns) and latency (ns) of the path from `a` to `b`: NVLink inside a
    /// node, the node NICs between nodes.
    pub fn base_link(&self, a: Rank, b: Rank) -> (f64, u64) {
        if self.node_of(a) == self.node_of(b) {
            (self.links.nvlink_bytes_per_ns, self.links.nvlink_latency_ns)
        } else {
            (self.links.nic_bytes_per_ns, self.links.nic_latency_ns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_layout_puts_tp_in_a_node_and_strides_dp_and_pp() {
        let spec = SimSpec::new(4, 4, 2, 2);
        let topo = Topology::new(&spec).unwrap();
        assert_eq!(topo.dp, 4);
        let tp0 = &topo.groups[topo.group("tp0").unwrap()];
        assert_eq!(tp0.ranks, vec![0, 1]);
        let dp1 = &topo.groups[topo.group("dp1").unwrap()];
        assert_eq!(dp1.ranks, vec![1, 3, 5, 7]);
        let pp3 = &topo.groups[topo.group("pp3").unwrap()];
        assert_eq!(pp3.ranks, vec![3, 11]);
        assert_eq!(topo.pp_group_of(11), topo.group("pp3"));
        assert_eq!(topo.in_stage(3, 1), 11);
        assert_eq!(topo.stage_of(11), 1);
        for g in &topo.groups {
            if g.kind == GroupKind::Tp {
                let node = topo.node_of(g.ranks[0]);
                assert!(g.ranks.iter().all(|&r| topo.node_of(r) == node));
            }
        }
    }

    #[test]
    fn shapes_that_do_not_tile_are_rejected() {
        let mut spec = SimSpec::new(4, 4, 2, 2);
        spec.dp = 3;
        assert!(matches!(Topology::new(&spec), Err(SimError::Shape(_))));
        let mut spec = SimSpec::new(4, 4, 2, 2);
        spec.tp = 8;
        spec.dp = 1;
        assert!(Topology::new(&spec).is_err());
    }
}
