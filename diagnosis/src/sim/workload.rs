//! The training step, as a schedule of compute and communication on the engine.
//!
//! A simplified pipeline with one micro-batch per step: the forward pass walks the stages in
//! order (receive activations, compute, TP all-reduce, send to the next stage), the backward pass
//! walks them in reverse (receive gradients, compute, TP all-reduce, send back), and every DP
//! group all-reduces its gradients at the end. Forward is a third of a step's compute, backward
//! two thirds, as for a transformer. Every `log_every` steps the world group all-reduces the
//! loss, the only global synchronisation besides the start-up barrier.

//!
//! The other [`JobKind`]s change what the groups carry: sequence parallelism turns each TP
//! all-reduce into a per-layer all-gather and reduce-scatter, HSDP gathers and scatters the
//! model per layer in its shard groups and all-reduces across replicas, DiLoCo runs inner steps
//! on the node alone and a long outer all-reduce across nodes now and then. A `Pipeline` job
//! runs the Megatron schedule; only its Flight Recorder record differs (coalesced p2p).

use super::engine::Engine;
use super::topology::GroupKind;
use super::{JobKind, SimSpec};
use crate::event::Op;

/// The start-up barrier over the world group (NCCL implements it as a one-element all-reduce).
pub(super) fn start(e: &mut Engine<'_>) {
    if let Some(world) = e.topo.group("world") {
        e.collective(world, Op::AllReduce, e.spec().bytes.world);
    }
}

/// One training step of the spec's job kind.
pub(super) fn step(e: &mut Engine<'_>, step: u32) {
    match e.spec().kind {
        JobKind::Megatron | JobKind::Pipeline | JobKind::TpSp => megatron(e, step),
        JobKind::Hsdp => hsdp(e, step),
        JobKind::Diloco => diloco(e, step),
    }
}

/// The ops of a TP group around one pass of a stage: one all-reduce after the pass, or with
/// sequence parallelism an all-gather before and a reduce-scatter after every layer.
fn tp_pass(e: &mut Engine<'_>, ranks: std::ops::Range<u32>, groups: &[usize], compute: u64) {
    let spec = e.spec();
    if spec.kind != JobKind::TpSp {
        for r in ranks {
            e.compute(r, compute);
        }
        for &g in groups {
            e.collective(g, Op::AllReduce, spec.bytes.tp);
        }
        return;
    }
    let layers = spec.layers.max(1);
    let bytes = spec.bytes.tp / u64::from(layers);
    for _ in 0..layers {
        for &g in groups {
            e.collective(g, Op::AllGather, bytes);
        }
        for r in ranks.clone() {
            e.compute(r, compute / u64::from(layers));
        }
        for &g in groups {
            e.collective(g, Op::ReduceScatter, bytes);
        }
    }
}

/// HSDP: per layer an all-gather of the parameters in each shard group before its forward and
/// its backward, a reduce-scatter of the gradients after its backward; the replicas all-reduce
/// their reduced shards at step end.
fn hsdp(e: &mut Engine<'_>, _step: u32) {
    let spec = e.spec();
    let layers = spec.layers.max(1);
    let (fwd, bwd) = split(spec);
    let shards: Vec<usize> = e.topo.groups_of(GroupKind::Tp).collect();
    let replicas: Vec<usize> = e.topo.groups_of(GroupKind::Dp).collect();
    let world = e.topo.world;
    let per_layer = spec.bytes.dp / u64::from(layers);
    for _ in 0..layers {
        for &g in &shards {
            e.collective(g, Op::AllGather, per_layer);
        }
        for r in 0..world {
            e.compute(r, fwd / u64::from(layers));
        }
    }
    for _ in 0..layers {
        for &g in &shards {
            e.collective(g, Op::AllGather, per_layer);
        }
        for r in 0..world {
            e.compute(r, bwd / u64::from(layers));
        }
        for &g in &shards {
            e.collective(g, Op::ReduceScatter, per_layer);
        }
    }
    let shard_size = u64::from(e.topo.tp.max(1));
    for g in replicas {
        e.collective(g, Op::AllReduce, spec.bytes.dp / shard_size);
    }
}

/// DiLoCo: an inner step is node-local (compute and the node group's all-reduce); after every
/// `outer_every` inner steps the DP groups all-reduce the pseudo-gradient across nodes.
fn diloco(e: &mut Engine<'_>, step: u32) {
    let spec = e.spec();
    let locals: Vec<usize> = e.topo.groups_of(GroupKind::Tp).collect();
    let world = e.topo.world;
    for r in 0..world {
        e.compute(r, spec.step_compute_ns);
    }
    for &g in &locals {
        e.collective(g, Op::AllReduce, spec.bytes.tp);
    }
    let every = spec.outer_every.max(1);
    if (step + 1).is_multiple_of(every) {
        let outers: Vec<usize> = e.topo.groups_of(GroupKind::Dp).collect();
        for g in outers {
            e.collective(g, Op::AllReduce, spec.bytes.dp);
        }
    }
}

/// Forward is a third of a step's compute, backward two thirds.
fn split(spec: &SimSpec) -> (u64, u64) {
    let compute = spec.step_compute_ns;
    (compute / 3, compute - compute / 3)
}

/// The Megatron schedule (also the pipeline and sequence-parallel kinds).
fn megatron(e: &mut Engine<'_>, step: u32) {
    let spec = e.spec();
    let bytes = &spec.bytes;
    let (fwd, bwd) = split(spec);
    let pp = e.topo.pp;
    let tp_groups: Vec<usize> = e.topo.groups_of(GroupKind::Tp).collect();
    let tp_groups_of_stage = |stage: u32| -> Vec<usize> {
        let per_stage = tp_groups.len() / pp as usize;
        tp_groups[stage as usize * per_stage..(stage as usize + 1) * per_stage].to_vec()
    };

    for stage in 0..pp {
        if stage > 0 {
            for r in e.topo.stage_ranks(stage) {
                let from = e.topo.in_stage(r, stage - 1);
                e.p2p(from, r, bytes.pp);
            }
        }
        let ranks = e.topo.stage_ranks(stage);
        tp_pass(e, ranks, &tp_groups_of_stage(stage), fwd);
    }
    for stage in (0..pp).rev() {
        if stage + 1 < pp {
            for r in e.topo.stage_ranks(stage) {
                let from = e.topo.in_stage(r, stage + 1);
                e.p2p(from, r, bytes.pp);
            }
        }
        let ranks = e.topo.stage_ranks(stage);
        tp_pass(e, ranks, &tp_groups_of_stage(stage), bwd);
    }
    let dp_groups: Vec<usize> = e.topo.groups_of(GroupKind::Dp).collect();
    for g in dp_groups {
        e.collective(g, Op::AllReduce, bytes.dp);
    }
    let log_every = spec.log_every;
    if log_every > 0 && (step + 1).is_multiple_of(log_every) {
        if let Some(world) = e.topo.group("world") {
            e.collective(world, Op::AllReduce, bytes.world);
        }
    }
}

/// A job of `kind` in the shape it is usually run in, on `nodes × gpus` ranks, with the
/// defaults of [`SimSpec::new`] otherwise: pipeline stages one node each, HSDP and DiLoCo
/// sharded or local within a node and replicated across nodes, DiLoCo's replicas joined by a
/// slow wide-area link (1 GB/s) with an outer all-reduce of 2 GiB.
pub fn kind_spec(kind: JobKind, nodes: u32, gpus: u32) -> SimSpec {
    let mut spec = match kind {
        JobKind::Megatron | JobKind::TpSp => SimSpec::new(nodes, gpus, 2.min(gpus), 2),
        JobKind::Pipeline => {
            let mut s = SimSpec::new(nodes, gpus, 1, nodes);
            s.dp = gpus;
            s
        }
        JobKind::Hsdp | JobKind::Diloco => SimSpec::new(nodes, gpus, gpus, 1),
    };
    spec.kind = kind;
    if kind == JobKind::Diloco {
        spec.links.nic_bytes_per_ns = 1.0;
        spec.links.nic_latency_ns = 2_000_000;
        spec.bytes.dp = 2 << 30;
    }
    spec
}
