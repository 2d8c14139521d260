//! The split planner: an XDP forwarding function as a DAG of primitive ops, and the set of ops
//! to run on the NIC (a downward-closed set: an op runs there only if everything it depends
//! on does) that maximises the modelled sustainable packet rate within the profile's limits.
//!
//! Traffic is a mix of classes, each following one path through the DAG (the tunnel fast path,
//! ARP, traffic for another host, malformed frames). A class runs on the NIC for the longest
//! prefix of its path that the NIC holds, then, unless it finished there with TX or DROP, goes
//! to the host with what the NIC computed in a pushed shim header, and the host part resumes
//! at the first op the NIC lacks ("best effort per class", the OXDP idea as the anchors note
//! reads it).
//!
//! Every figure here is a MODEL: NIC instruction counts are BPF counts times the profile's
//! JIT expansion estimate, NIC and host speeds are the profile's and [`HostModel`]'s assumed
//! parameters. Nothing is measured; the output says so.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::check::map_fits;
use crate::elf::MapDef;
use crate::insn::{helper, map_type, xdp_action_name};
use crate::profile::Profile;

/// How an op touches a map: the NIC allows reads, helper updates and atomic adds, and the
/// placement rule cares whether anything writes it at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    Read,
    HelperWrite,
    AtomicAdd,
    DirectWrite,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapUse {
    pub map: String,
    pub access: Access,
}

/// A value one op computes and a later op uses: what must cross the NIC/host boundary.
#[derive(Debug, Clone, Serialize)]
pub struct StateVar {
    pub name: String,
    pub bytes: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Op {
    pub name: String,
    pub what: String,
    /// Ops that must run before this one (indices of earlier ops: the list is topological).
    pub deps: Vec<usize>,
    /// Estimated BPF instructions.
    pub bpf_insns: u32,
    pub stack_bytes: u32,
    pub helpers: Vec<i32>,
    pub maps: Vec<MapUse>,
    /// `xdp_md` fields read (byte offsets).
    pub ctx_reads: Vec<i16>,
    /// Largest packet offset touched, exclusive.
    pub max_pkt_offset: u32,
    pub inputs: Vec<String>,
    pub outputs: Vec<StateVar>,
    /// XDP actions this op may end a packet with.
    pub actions: Vec<u64>,
}

/// A share of the traffic and the ops it runs through, in order.
#[derive(Debug, Clone, Serialize)]
pub struct Class {
    pub name: String,
    pub share: f64,
    pub path: Vec<usize>,
    /// The action it ends with.
    pub action: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Pipeline {
    pub name: String,
    pub ops: Vec<Op>,
    pub maps: Vec<MapDef>,
    pub classes: Vec<Class>,
}

/// Host-side cost parameters (ASSUMED; calibrate with BPF_PROG_TEST_RUN per op on the host).
#[derive(Debug, Clone, Serialize)]
pub struct HostModel {
    pub cores: u32,
    /// Driver RX plus XDP entry per packet that reaches the host, without the program.
    pub rx_ns: f64,
    pub ns_per_insn: f64,
    pub hash_lookup_ns: f64,
    pub array_lookup_ns: f64,
    pub helper_ns: f64,
    pub fib_lookup_ns: f64,
    /// Reading and stripping the NIC's shim header.
    pub shim_ns: f64,
    pub source: &'static str,
}

impl Default for HostModel {
    fn default() -> Self {
        HostModel {
            cores: 1,
            rx_ns: 40.0,
            ns_per_insn: 0.25,
            hash_lookup_ns: 15.0,
            array_lookup_ns: 2.0,
            helper_ns: 20.0,
            fib_lookup_ns: 80.0,
            shim_ns: 5.0,
            source: "ASSUMED: one x86 core in native XDP mode, 40 ns RX per packet, 4 JITed \
                     instructions per ns, 15 ns per hash lookup, 80 ns per FIB lookup",
        }
    }
}

/// Fixed costs every NIC program pays (BPF instructions): the entry bounds check, the
/// counters (an ARRAY with atomic adds on the NIC: per-CPU maps are host-only) and the shim
/// push when a packet goes on to the host.
const NIC_ENTRY_INSNS: f64 = 10.0;
const NIC_COUNTER_INSNS: f64 = 8.0;
const SHIM_PUSH_INSNS: f64 = 12.0;

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Packets per second the NIC part sustains (line rate when it runs nothing).
    pub nic_pps: f64,
    /// Packets per second of *input* the host part sustains.
    pub host_pps: f64,
    /// Sustainable input rate: the smaller of the two, and the line rate.
    pub throughput_pps: f64,
    pub binding: &'static str,
    /// Share of packets that reach the host's XDP program.
    pub to_host_fraction: f64,
    /// Host nanoseconds per input packet (all cores together).
    pub host_ns_per_pkt: f64,
    /// NIC target instructions per input packet (lookups counted at their equivalent).
    pub nic_insns_per_pkt: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassCut {
    pub class: String,
    pub share: f64,
    pub on_nic: Vec<String>,
    pub on_host: Vec<String>,
    pub finishes_on_nic: bool,
    /// State the NIC hands the host in the shim.
    pub handoff: Vec<String>,
    pub handoff_bytes: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub pipeline: String,
    pub profile: String,
    /// Bit i set: op i runs on the NIC.
    pub mask: u64,
    pub nic_ops: Vec<String>,
    pub host_ops: Vec<String>,
    pub classes: Vec<ClassCut>,
    /// Read-only maps both sides use: a NIC copy and a host copy, both written by the daemon.
    pub replicated_maps: Vec<String>,
    pub nic_maps: Vec<String>,
    pub host_maps: Vec<String>,
    /// Estimated NIC program size in target instructions (margin included) and its limit.
    pub nic_prog_insns_model: u64,
    pub nic_prog_limit: u64,
    pub figures: Figures,
    /// The same traffic with everything on the host.
    pub host_only: Figures,
    pub speedup_vs_host_only: f64,
    pub handoff: &'static str,
    /// Why each op that stayed on the host could not go to the NIC, where it could not.
    pub host_reasons: BTreeMap<String, String>,
    /// The best cut that is a prefix of the op list, for comparison with the DAG cut.
    pub best_prefix_nic_ops: Vec<String>,
    pub best_prefix: Figures,
    pub label: &'static str,
}

pub const MODEL_LABEL: &str =
    "MODEL: figures computed from assumed parameters, not measured (no SmartNIC on this machine)";

/// What the planner needs precomputed from a pipeline and a profile.
struct Ctx<'a> {
    p: &'a Pipeline,
    profile: &'a Profile,
    host: &'a HostModel,
    /// Why op i cannot run on the NIC at all.
    op_bad: Vec<Option<String>>,
    /// Estimated NIC target instructions of op i (no margin).
    nic_insns: Vec<f64>,
    host_ns: Vec<f64>,
    deps_mask: Vec<u64>,
}

fn map_def<'a>(p: &'a Pipeline, name: &str) -> Option<&'a MapDef> {
    p.maps.iter().find(|m| m.name == name)
}

impl<'a> Ctx<'a> {
    fn new(p: &'a Pipeline, profile: &'a Profile, host: &'a HostModel) -> Ctx<'a> {
        let blended = profile.jit.blended();
        let lookup = profile.nic.as_ref().map_or(0.0, |n| n.lookup_insns);
        let mut op_bad = Vec::new();
        let mut nic_insns = Vec::new();
        let mut host_ns = Vec::new();
        let mut deps_mask = Vec::new();
        for op in &p.ops {
            op_bad.push(op_reason(p, profile, op));
            let lookups = op.maps.len() as f64;
            nic_insns.push(
                f64::from(op.bpf_insns) * blended
                    + op.helpers.len() as f64 * profile.jit.helper_call
                    + lookups * lookup,
            );
            let mut ns = f64::from(op.bpf_insns) * host.ns_per_insn;
            for m in &op.maps {
                ns += match map_def(p, &m.map).map(|d| d.map_type) {
                    Some(map_type::ARRAY) | Some(map_type::PERCPU_ARRAY) => host.array_lookup_ns,
                    _ => host.hash_lookup_ns,
                };
            }
            for &h in &op.helpers {
                ns += if h == helper::FIB_LOOKUP {
                    host.fib_lookup_ns
                } else {
                    host.helper_ns
                };
            }
            host_ns.push(ns);
            deps_mask.push(op.deps.iter().fold(0u64, |m, &d| m | (1 << d)));
        }
        Ctx {
            p,
            profile,
            host,
            op_bad,
            nic_insns,
            host_ns,
            deps_mask,
        }
    }

    fn n(&self) -> usize {
        self.p.ops.len()
    }

    fn downward_closed(&self, mask: u64) -> bool {
        (0..self.n()).all(|i| mask & (1 << i) == 0 || self.deps_mask[i] & !mask == 0)
    }

    /// NIC program size estimate for a set (no margin): the ops plus the fixed parts.
    fn prog_insns(&self, mask: u64) -> f64 {
        if mask == 0 {
            return 0.0;
        }
        let blended = self.profile.jit.blended();
        (NIC_ENTRY_INSNS + NIC_COUNTER_INSNS + SHIM_PUSH_INSNS) * blended
            + (0..self.n())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| self.nic_insns[i])
                .sum::<f64>()
    }

    fn maps_of(&self, mask: u64) -> BTreeSet<&'a str> {
        (0..self.n())
            .filter(|i| mask & (1 << i) != 0)
            .flat_map(|i| self.p.ops[i].maps.iter().map(|m| m.map.as_str()))
            .collect()
    }

    /// The limits that only grow with the set (program length, stack, map budget): a set
    /// that breaks one has no feasible superset, so the search prunes there.
    fn monotone_ok(&self, mask: u64) -> Result<(), String> {
        if mask == 0 {
            return Ok(());
        }
        let len = (self.prog_insns(mask) * self.profile.jit.margin).ceil() as u64;
        if len > self.profile.max_prog_len {
            return Err(format!(
                "program length: ~{len} target instructions (model) over {}",
                self.profile.max_prog_len
            ));
        }
        let stack: u32 = (0..self.n())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| self.p.ops[i].stack_bytes)
            .sum();
        if stack > self.profile.stack_max {
            return Err(format!(
                "stack: {stack} bytes over {}",
                self.profile.stack_max
            ));
        }
        let maps = self.maps_of(mask);
        let on_nic: Vec<&MapDef> = maps
            .iter()
            .filter_map(|m| map_def(self.p, m))
            .filter(|d| !self.profile.host_map_types.contains(&d.map_type))
            .collect();
        if let Some(t) = self.profile.max_total_entries {
            let total: u64 = on_nic.iter().map(|d| u64::from(d.max_entries)).sum();
            if total > t {
                return Err(format!("map entries: {total} over {t}"));
            }
        }
        if let Some(mx) = self.profile.max_maps {
            if on_nic.len() as u32 > mx {
                return Err(format!("maps: {} over {mx}", on_nic.len()));
            }
        }
        Ok(())
    }

    /// Everything: each op allowed, downward closed, limits, and state placement (a map
    /// something writes must have all its accessors on one side: an offloaded map is not
    /// reachable from a host program).
    fn feasible(&self, mask: u64) -> bool {
        if !self.downward_closed(mask) {
            return false;
        }
        if (0..self.n()).any(|i| mask & (1 << i) != 0 && self.op_bad[i].is_some()) {
            return false;
        }
        if self.monotone_ok(mask).is_err() {
            return false;
        }
        self.placement_ok(mask)
    }

    fn placement_ok(&self, mask: u64) -> bool {
        for m in &self.p.maps {
            let users: Vec<usize> = (0..self.n())
                .filter(|&i| self.p.ops[i].maps.iter().any(|u| u.map == m.name))
                .collect();
            let written = users.iter().any(|&i| {
                self.p.ops[i]
                    .maps
                    .iter()
                    .any(|u| u.map == m.name && u.access != Access::Read)
            });
            if written {
                let on = users.iter().filter(|&&i| mask & (1 << i) != 0).count();
                if on != 0 && on != users.len() {
                    return false;
                }
            }
        }
        true
    }

    fn class_cut(&self, c: &Class, mask: u64) -> (usize, bool, u32, Vec<String>) {
        let k = c.path.iter().take_while(|&&i| mask & (1 << i) != 0).count();
        let finished = k == c.path.len();
        let mut handoff = Vec::new();
        let mut bytes = 0;
        if !finished && k > 0 {
            let rest: BTreeSet<&str> = c.path[k..]
                .iter()
                .flat_map(|&i| self.p.ops[i].inputs.iter().map(String::as_str))
                .collect();
            for &i in &c.path[..k] {
                for o in &self.p.ops[i].outputs {
                    if rest.contains(o.name.as_str()) && !handoff.contains(&o.name) {
                        handoff.push(o.name.clone());
                        bytes += o.bytes;
                    }
                }
            }
        }
        (k, finished, bytes, handoff)
    }

    fn figures(&self, mask: u64) -> Figures {
        let mut nic = 0.0;
        let mut host = 0.0;
        let mut to_host = 0.0;
        let blended = self.profile.jit.blended();
        for c in &self.p.classes {
            let (k, finished, bytes, _) = self.class_cut(c, mask);
            if mask != 0 {
                let mut cn = (NIC_ENTRY_INSNS + NIC_COUNTER_INSNS) * blended;
                cn += c.path[..k].iter().map(|&i| self.nic_insns[i]).sum::<f64>();
                if !finished {
                    cn += (SHIM_PUSH_INSNS + f64::from(bytes) / 4.0) * blended;
                }
                nic += c.share * cn;
            }
            let reaches_host = mask == 0 || !finished || c.action == 2;
            if reaches_host {
                to_host += c.share;
                let mut h = self.host.rx_ns;
                if mask != 0 {
                    h += self.host.shim_ns;
                }
                if !finished {
                    h += c.path[k..].iter().map(|&i| self.host_ns[i]).sum::<f64>();
                }
                host += c.share * h;
            }
        }
        let line = self
            .profile
            .nic
            .as_ref()
            .map_or(f64::INFINITY, |n| n.line_rate_pps);
        let nic_pps = match (&self.profile.nic, nic > 0.0) {
            (Some(n), true) => (f64::from(n.cores) * n.clock_hz * n.efficiency / nic).min(line),
            _ => line,
        };
        let host_pps = if host > 0.0 {
            f64::from(self.host.cores) * 1e9 / host
        } else {
            f64::INFINITY
        };
        let throughput = nic_pps.min(host_pps).min(line);
        let binding = if throughput >= line {
            "line rate"
        } else if nic_pps <= host_pps {
            "nic"
        } else {
            "host"
        };
        Figures {
            nic_pps,
            host_pps,
            throughput_pps: throughput,
            binding,
            to_host_fraction: to_host,
            host_ns_per_pkt: host,
            nic_insns_per_pkt: nic,
        }
    }

    /// The order plans are ranked in: throughput, then less host CPU, then less NIC work,
    /// then the smaller mask (so that ties resolve the same way in every search).
    fn better(&self, a: (u64, &Figures), b: (u64, &Figures)) -> bool {
        let (ma, fa) = a;
        let (mb, fb) = b;
        let key = |f: &Figures| (f.throughput_pps, -f.host_ns_per_pkt, -f.nic_insns_per_pkt);
        let (ka, kb) = (key(fa), key(fb));
        match ka.partial_cmp(&kb) {
            Some(std::cmp::Ordering::Greater) => true,
            Some(std::cmp::Ordering::Less) => false,
            _ => ma < mb,
        }
    }
}

/// Why an op can never run on the NIC under a profile, if it cannot.
fn op_reason(p: &Pipeline, profile: &Profile, op: &Op) -> Option<String> {
    if !profile.offload {
        return Some("profile none has no NIC".into());
    }
    for &h in &op.helpers {
        if profile.helper(h).is_none() {
            return Some(format!(
                "helper {} ({})",
                helper::describe(h),
                profile.helper_source
            ));
        }
    }
    for &c in &op.ctx_reads {
        if !profile.ctx_reads.contains(&c) {
            return Some(format!("reads xdp_md offset {c}"));
        }
    }
    for &a in &op.actions {
        if !profile.xdp_actions.contains(&a) {
            return Some(format!("ends with {}", xdp_action_name(a)));
        }
    }
    for u in &op.maps {
        let Some(def) = map_def(p, &u.map) else {
            return Some(format!("map {} is not declared", u.map));
        };
        if let Err((_, _, why)) = map_fits(profile, def) {
            return Some(why);
        }
        if u.access == Access::DirectWrite && !profile.direct_map_writes {
            return Some(format!("stores straight into map {}", u.map));
        }
    }
    if let Some(b) = profile.pkt_split_bound {
        if op.max_pkt_offset > b {
            return Some(format!("packet offset {} beyond {b}", op.max_pkt_offset));
        }
    }
    None
}

/// Checks that a pipeline is well formed: deps point backwards, class paths respect deps.
pub fn validate(p: &Pipeline) -> Result<(), String> {
    if p.ops.len() > 63 {
        return Err("at most 63 ops".into());
    }
    for (i, op) in p.ops.iter().enumerate() {
        if op.deps.iter().any(|&d| d >= i) {
            return Err(format!("op {} depends on a later op", op.name));
        }
    }
    for c in &p.classes {
        let mut seen = 0u64;
        for &i in &c.path {
            if i >= p.ops.len() {
                return Err(format!(
                    "class {} names op {i}, which does not exist",
                    c.name
                ));
            }
            if p.ops[i].deps.iter().any(|&d| seen & (1 << d) == 0) {
                return Err(format!(
                    "class {} runs {} before what it depends on",
                    c.name, p.ops[i].name
                ));
            }
            seen |= 1 << i;
        }
    }
    Ok(())
}

/// The best downward-closed set by exhaustive search over all 2^n subsets: the oracle the
/// planner is tested against. Only for small pipelines.
pub fn best_exhaustive(p: &Pipeline, profile: &Profile, host: &HostModel) -> (u64, Figures) {
    let cx = Ctx::new(p, profile, host);
    assert!(cx.n() <= 20, "exhaustive search is for small pipelines");
    let mut best = (0u64, cx.figures(0));
    for mask in 1u64..(1 << cx.n()) {
        if !cx.feasible(mask) {
            continue;
        }
        let f = cx.figures(mask);
        if cx.better((mask, &f), (best.0, &best.1)) {
            best = (mask, f);
        }
    }
    best
}

/// The best downward-closed set by depth-first enumeration of the ideals only, pruning a
/// branch as soon as a limit that only grows (length, stack, map budget) is broken.
pub fn best_ideal(p: &Pipeline, profile: &Profile, host: &HostModel) -> (u64, Figures) {
    let cx = Ctx::new(p, profile, host);
    let mut best = (0u64, cx.figures(0));
    fn go(cx: &Ctx<'_>, i: usize, mask: u64, best: &mut (u64, Figures)) {
        if i == cx.n() {
            if mask != 0 && cx.placement_ok(mask) {
                let f = cx.figures(mask);
                if cx.better((mask, &f), (best.0, &best.1)) {
                    *best = (mask, f);
                }
            }
            return;
        }
        // without op i
        go(cx, i + 1, mask, best);
        // with op i, if everything it needs is there and it may run on the NIC
        if cx.op_bad[i].is_none() && cx.deps_mask[i] & !mask == 0 {
            let with = mask | (1 << i);
            if cx.monotone_ok(with).is_ok() {
                go(cx, i + 1, with, best);
            }
        }
    }
    go(&cx, 0, 0, &mut best);
    best
}

/// The best prefix of the op list (ops 0..k on the NIC): the simpler cut, for comparison.
pub fn best_prefix(p: &Pipeline, profile: &Profile, host: &HostModel) -> (u64, Figures) {
    let cx = Ctx::new(p, profile, host);
    let mut best = (0u64, cx.figures(0));
    for k in 1..=cx.n() {
        let mask = (1u64 << k) - 1;
        if !cx.feasible(mask) {
            continue;
        }
        let f = cx.figures(mask);
        if cx.better((mask, &f), (best.0, &best.1)) {
            best = (mask, f);
        }
    }
    best
}

/// Plans a pipeline: the best DAG cut, with its per-class handoff and the model's figures.
pub fn plan(p: &Pipeline, profile: &Profile, host: &HostModel) -> Result<Plan, String> {
    validate(p)?;
    let (mask, figures) = best_ideal(p, profile, host);
    Ok(describe(p, profile, host, mask, figures))
}

/// The plan for a given set.
pub fn describe(
    p: &Pipeline,
    profile: &Profile,
    host: &HostModel,
    mask: u64,
    figures: Figures,
) -> Plan {
    let cx = Ctx::new(p, profile, host);
    let on = |i: usize| mask & (1 << i) != 0;
    let names = |f: &dyn Fn(usize) -> bool| -> Vec<String> {
        (0..cx.n())
            .filter(|&i| f(i))
            .map(|i| p.ops[i].name.clone())
            .collect()
    };
    let classes = p
        .classes
        .iter()
        .map(|c| {
            let (k, finished, bytes, handoff) = cx.class_cut(c, mask);
            ClassCut {
                class: c.name.clone(),
                share: c.share,
                on_nic: c.path[..k].iter().map(|&i| p.ops[i].name.clone()).collect(),
                on_host: c.path[k..].iter().map(|&i| p.ops[i].name.clone()).collect(),
                finishes_on_nic: finished,
                handoff,
                handoff_bytes: bytes,
            }
        })
        .collect();
    let nic_maps = cx.maps_of(mask);
    let host_mask = !mask & ((1u64 << cx.n()) - 1);
    let host_maps = cx.maps_of(host_mask);
    let replicated = nic_maps
        .intersection(&host_maps)
        .map(|s| (*s).to_owned())
        .collect();
    let mut host_reasons = BTreeMap::new();
    for i in 0..cx.n() {
        if on(i) {
            continue;
        }
        let why = if let Some(r) = &cx.op_bad[i] {
            r.clone()
        } else if cx.deps_mask[i] & !mask != 0 {
            "depends on an op that stays on the host".to_owned()
        } else if let Err(e) = cx.monotone_ok(mask | (1 << i)) {
            e
        } else if !cx.placement_ok(mask | (1 << i)) {
            "a map it uses is written on the host side (an offloaded map is not reachable from a host program)".to_owned()
        } else {
            let alt = cx.figures(mask | (1 << i));
            format!(
                "moving it alone would change the modelled rate to {} ({} bound)",
                mpps(alt.throughput_pps),
                alt.binding
            )
        };
        host_reasons.insert(p.ops[i].name.clone(), why);
    }
    let host_only = cx.figures(0);
    let (pmask, best_prefix) = best_prefix(p, profile, host);
    Plan {
        pipeline: p.name.clone(),
        profile: profile.name.to_owned(),
        mask,
        nic_ops: names(&on),
        host_ops: names(&|i| !on(i)),
        classes,
        replicated_maps: replicated,
        nic_maps: nic_maps.iter().map(|s| (*s).to_owned()).collect(),
        host_maps: host_maps.iter().map(|s| (*s).to_owned()).collect(),
        nic_prog_insns_model: (cx.prog_insns(mask) * profile.jit.margin).ceil() as u64,
        nic_prog_limit: profile.max_prog_len,
        speedup_vs_host_only: figures.throughput_pps / host_only.throughput_pps,
        figures,
        host_only,
        handoff: "a shim header pushed with bpf_xdp_adjust_head and stripped by the host part \
                  (the nfp cannot call bpf_xdp_adjust_meta nor read data_meta)",
        host_reasons,
        best_prefix_nic_ops: names(&|i| pmask & (1 << i) != 0),
        best_prefix,
        label: MODEL_LABEL,
    }
}

fn mpps(x: f64) -> String {
    if x.is_infinite() {
        "no limit".into()
    } else {
        format!("{:.2} Mpps", x / 1e6)
    }
}

impl Plan {
    pub fn human(&self) -> String {
        let f = &self.figures;
        let b = &self.host_only;
        let mut t = format!(
            "plan for {} on profile {} ({})\n",
            self.pipeline, self.profile, self.label
        );
        t.push_str(&format!(
            "  NIC part: {}\n",
            if self.nic_ops.is_empty() {
                "nothing".into()
            } else {
                self.nic_ops.join(", ")
            }
        ));
        t.push_str(&format!("  host part: {}\n", self.host_ops.join(", ")));
        t.push_str(&format!(
            "  NIC program ~{} target instructions (model estimate, limit {}); NIC maps: {}; replicated read-only maps: {}\n",
            self.nic_prog_insns_model,
            self.nic_prog_limit,
            if self.nic_maps.is_empty() { "none".into() } else { self.nic_maps.join(", ") },
            if self.replicated_maps.is_empty() { "none".into() } else { self.replicated_maps.join(", ") }
        ));
        for c in &self.classes {
            t.push_str(&format!(
                "  class {} ({:.1}% of packets): {}{}\n",
                c.class,
                c.share * 100.0,
                if c.finishes_on_nic {
                    "finishes on the NIC".to_owned()
                } else if c.on_nic.is_empty() {
                    "all on the host".to_owned()
                } else {
                    format!(
                        "NIC to {}, host from {}",
                        c.on_nic.last().map_or("", |s| s),
                        c.on_host[0]
                    )
                },
                if c.handoff_bytes > 0 {
                    format!(
                        ", hands over {} ({} B)",
                        c.handoff.join(", "),
                        c.handoff_bytes
                    )
                } else {
                    String::new()
                }
            ));
        }
        for (op, why) in &self.host_reasons {
            t.push_str(&format!("  {op} stays on the host: {why}\n"));
        }
        t.push_str(&format!(
            "  model: split sustains {} (NIC {}, host {}, bound by {}); {:.1}% of packets reach the host, {:.1} host ns per packet\n",
            mpps(f.throughput_pps),
            mpps(f.nic_pps),
            mpps(f.host_pps),
            f.binding,
            f.to_host_fraction * 100.0,
            f.host_ns_per_pkt
        ));
        t.push_str(&format!(
            "  model: host only sustains {} ({:.1} host ns per packet); split / host only = {:.1}x\n",
            mpps(b.throughput_pps),
            b.host_ns_per_pkt,
            self.speedup_vs_host_only
        ));
        t.push_str(&format!(
            "  model: the best prefix cut ({} ops on the NIC) sustains {}\n",
            self.best_prefix_nic_ops.len(),
            mpps(self.best_prefix.throughput_pps)
        ));
        t.push_str("  reference (published, not comparable hardware): OXDP 18.7 Mpps, 30x one software XDP core\n");
        t
    }
}
