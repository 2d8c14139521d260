//! The training step, as a schedule of compute and communication on the engine.
//!
//! A simplified pipeline with one micro-batch per step: the forward pass walks the stages in
//! order (receive activations, compute, TP all-reduce, send to the next stage), the backward pass
//! walks them in reverse (receive gradients, compute, TP all-reduce, send back), and every DP
//! group all-reduces its gradients at the end. Forward is a third of a step's compute, backward
//! two thirds, as for a transformer. Every `log_every` steps the world group all-reduces the
//! loss, the only global synchronisation besides the start-up barrier.

use super::engine::Engine;
use super::topology::GroupKind;
use crate::event::Op;

/// The start-up barrier over the world group (NCCL implements it as a one-element all-reduce).
pub(super) fn start(e: &mut Engine<'_>) {
    if let Some(world) = e.topo.group("world") {
        e.collective(world, Op::AllReduce, e.spec().bytes.world);
    }
}

/// One training step.
pub(super) fn step(e: &mut Engine<'_>, step: u32) {
    let spec = e.spec();
    let bytes = &spec.bytes;
    let compute = spec.step_compute_ns;
    let (fwd, bwd) = (compute / 3, compute - compute / 3);
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
        for r in e.topo.stage_ranks(stage) {
            e.compute(r, fwd);
        }
        for g in tp_groups_of_stage(stage) {
            e.collective(g, Op::AllReduce, bytes.tp);
        }
    }
    for stage in (0..pp).rev() {
        if stage + 1 < pp {
            for r in e.topo.stage_ranks(stage) {
                let from = e.topo.in_stage(r, stage + 1);
                e.p2p(from, r, bytes.pp);
            }
        }
        for r in e.topo.stage_ranks(stage) {
            e.compute(r, bwd);
        }
        for g in tp_groups_of_stage(stage) {
            e.collective(g, Op::AllReduce, bytes.tp);
        }
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
