//! The static eligibility checker: which functions and instruction ranges of a compiled BPF
//! object a profile could run, and why not where it could not.
//!
//! The driver decides with the kernel verifier's full register state; this checker has a
//! small abstract interpreter instead (constants, context/stack/packet/map pointers, 8-byte
//! stack spills, the null check after a map lookup), so its answers come in three strengths:
//! *ineligible* (a rule is broken on some path, for certain), *uncertain* (a rule could not be
//! decided statically: an untraced pointer, a return code that is not constant) and *likely
//! eligible* (no rule broken as far as the checker can see). The kernel and the driver stay
//! the authority: a "likely eligible" program may still be refused at load time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::elf::{MapDef, MapOrigin, Object, Program};
use crate::insn::{self, alu, class, helper, jmp, map_type, mode, Insn};
use crate::profile::Profile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    LikelyEligible,
    Uncertain,
    Ineligible,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::LikelyEligible => "likely eligible",
            Verdict::Uncertain => "uncertain",
            Verdict::Ineligible => "ineligible",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    NoOffloadTarget,
    ProgramType,
    Opcode,
    Helper,
    HelperArg,
    BpfCall,
    Kfunc,
    CtxAccess,
    MapWrite,
    Atomic,
    MulDiv,
    ReturnCode,
    MapType,
    MapSize,
    MapFlags,
    MapCount,
    MapEntries,
    ProgramLength,
    Stack,
    PacketOffset,
    UntracedPointer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Certainty {
    /// The rule is broken on at least one path.
    Definite,
    /// The checker could not decide; the driver will.
    Possible,
}

/// One reason, with the instruction ranges (inclusive slot indices) where it applies; empty
/// for program-wide reasons (length, stack, map budget).
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub rule: Rule,
    pub certainty: Certainty,
    pub detail: String,
    /// Where the rule comes from (driver file and function, or the model).
    pub source: String,
    pub ranges: Vec<[usize; 2]>,
    /// Source lines of the instructions (`file:line`, from BTF line info), where known.
    pub lines: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionReport {
    pub name: String,
    pub start: usize,
    pub end: usize,
    pub verdict: Verdict,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapReport {
    pub name: String,
    pub map_type: u32,
    pub type_name: &'static str,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub origin: MapOrigin,
    /// Whether the profile can hold this map on the NIC (or keep it on the host, for
    /// offload-neutral types), and if not why.
    pub offloadable: bool,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProgramReport {
    pub section: String,
    pub name: String,
    pub verdict: Verdict,
    /// BPF instruction slots reachable from the entry (subprograms included).
    pub bpf_insns: usize,
    /// Estimated target instructions after the JIT, margin included: a MODEL figure.
    pub est_target_insns_model: u64,
    pub target_insn_limit: u64,
    pub stack_bytes: u32,
    /// Largest packet byte offset touched at a statically known offset, exclusive.
    pub max_pkt_offset: u32,
    /// Some packet access has an offset the checker cannot bound.
    pub variable_pkt_offset: bool,
    /// Constant return codes reaching the entry's EXITs.
    pub return_codes: Vec<u64>,
    pub return_code_unknown: bool,
    pub maps: Vec<String>,
    /// Reasons that belong to the whole program.
    pub findings: Vec<Finding>,
    pub functions: Vec<FunctionReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: String,
    pub programs: Vec<ProgramReport>,
    pub maps: Vec<MapReport>,
    /// Always said: the checker approximates, the kernel and the driver decide.
    pub authority: &'static str,
}

const AUTHORITY: &str = "static check: the kernel verifier and the NIC driver decide at load time";

// ------------------------------------------------------------------------------------------
// abstract values

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val {
    Unknown,
    Const(u64),
    /// One of several small constants (bit n set: the value n may be held), so that a return
    /// code chosen on many paths and returned from one EXIT stays known.
    Small(u64),
    /// A scalar known to fit in 32 bits (a narrow load, a 32-bit ALU result): what the
    /// driver's MUL and DIV rules need to know.
    U32,
    Ctx,
    Stack(i64),
    Pkt(i64),
    PktVar,
    PktEnd,
    Map(usize),
    /// A pointer into a map's value (or null, before the null check), at an offset if known.
    MapValue(usize, Option<i64>),
}

impl Val {
    fn join(self, other: Val) -> Val {
        if self == other {
            return self;
        }
        let small = |v: Val| match v {
            Val::Const(c) if c < 64 => Some(1u64 << c),
            Val::Small(b) => Some(b),
            _ => None,
        };
        if let (Some(a), Some(b)) = (small(self), small(other)) {
            return Val::Small(a | b);
        }
        if self.fits_u32() && other.fits_u32() {
            return Val::U32;
        }
        match (self, other) {
            (Val::Pkt(_) | Val::PktVar, Val::Pkt(_) | Val::PktVar) => Val::PktVar,
            (Val::MapValue(a, _), Val::MapValue(b, _)) if a == b => Val::MapValue(a, None),
            _ => Val::Unknown,
        }
    }

    fn is_pointer(self) -> bool {
        !matches!(
            self,
            Val::Unknown | Val::Const(_) | Val::Small(_) | Val::U32
        )
    }

    fn fits_u32(self) -> bool {
        match self {
            Val::Const(c) => c <= u64::from(u32::MAX),
            Val::Small(_) | Val::U32 => true,
            _ => false,
        }
    }

    fn offset(self, by: i64) -> Val {
        match self {
            Val::Stack(o) => Val::Stack(o + by),
            Val::Pkt(o) => Val::Pkt(o + by),
            Val::MapValue(m, o) => Val::MapValue(m, o.map(|o| o + by)),
            Val::Ctx if by == 0 => Val::Ctx,
            Val::PktVar => Val::PktVar,
            _ => Val::Unknown,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Val::Unknown => "an untraced value",
            Val::Const(_) | Val::Small(_) | Val::U32 => "a scalar",
            Val::Ctx => "the context",
            Val::Stack(_) => "the stack",
            Val::Pkt(_) | Val::PktVar => "the packet",
            Val::PktEnd => "the packet end",
            Val::Map(_) => "a map",
            Val::MapValue(..) => "a map value",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    regs: [Val; 11],
    /// 8-byte spills by stack offset (relative to r10).
    slots: BTreeMap<i64, Val>,
}

impl State {
    fn entry() -> State {
        let mut regs = [Val::Unknown; 11];
        regs[1] = Val::Ctx;
        regs[10] = Val::Stack(0);
        State {
            regs,
            slots: BTreeMap::new(),
        }
    }

    fn subprog() -> State {
        let mut s = State::entry();
        s.regs[1] = Val::Unknown;
        s
    }

    fn join(&self, other: &State) -> State {
        let mut regs = [Val::Unknown; 11];
        for (i, r) in regs.iter_mut().enumerate() {
            *r = self.regs[i].join(other.regs[i]);
        }
        let mut slots = BTreeMap::new();
        for (k, v) in &self.slots {
            if let Some(w) = other.slots.get(k) {
                let j = v.join(*w);
                if j != Val::Unknown {
                    slots.insert(*k, j);
                }
            }
        }
        State { regs, slots }
    }

    fn clobber(&mut self, at: i64, size: i64) {
        self.slots.retain(|&k, _| k + 8 <= at || k >= at + size);
    }
}

fn ctx_field(off: i64) -> &'static str {
    match off {
        0 => "data",
        4 => "data_end",
        8 => "data_meta",
        12 => "ingress_ifindex",
        16 => "rx_queue_index",
        20 => "egress_ifindex",
        _ => "an unknown field",
    }
}

fn alu_eval(op: u8, is64: bool, a: u64, b: u64) -> Option<u64> {
    let (a, b) = if is64 {
        (a, b)
    } else {
        (a & 0xffff_ffff, b & 0xffff_ffff)
    };
    let bits = if is64 { 63 } else { 31 };
    let r = match op {
        alu::ADD => a.wrapping_add(b),
        alu::SUB => a.wrapping_sub(b),
        alu::MUL => a.wrapping_mul(b),
        alu::DIV => a.checked_div(b).unwrap_or(0),
        alu::MOD => a.checked_rem(b).unwrap_or(a),
        alu::OR => a | b,
        alu::AND => a & b,
        alu::XOR => a ^ b,
        alu::LSH => a.wrapping_shl((b & bits) as u32),
        alu::RSH => a.wrapping_shr((b & bits) as u32),
        alu::ARSH if is64 => ((a as i64) >> (b & bits)) as u64,
        alu::ARSH => (((a as u32) as i32) >> (b & bits)) as u32 as u64,
        alu::NEG => a.wrapping_neg(),
        alu::MOV => b,
        _ => return None,
    };
    Some(if is64 { r } else { r & 0xffff_ffff })
}

// ------------------------------------------------------------------------------------------
// the walk

struct Raw {
    slot: Option<usize>,
    rule: Rule,
    certainty: Certainty,
    detail: String,
    source: String,
}

struct Walk<'a> {
    prog: &'a Program,
    maps: &'a [MapDef],
    profile: &'a Profile,
    raw: Vec<Raw>,
    reachable: BTreeSet<usize>,
    returns: BTreeSet<u64>,
    return_unknown: bool,
    max_pkt: u32,
    var_pkt: bool,
    /// Function entry -> deepest stack offset seen (positive bytes).
    depth: HashMap<usize, u32>,
    /// Function entry -> callee entries.
    callees: HashMap<usize, BTreeSet<usize>>,
}

impl<'a> Walk<'a> {
    fn find(
        &mut self,
        slot: usize,
        rule: Rule,
        certainty: Certainty,
        detail: String,
        source: &str,
    ) {
        self.raw.push(Raw {
            slot: Some(slot),
            rule,
            certainty,
            detail,
            source: source.to_owned(),
        });
    }

    fn map_name(&self, m: usize) -> String {
        self.maps
            .get(m)
            .map_or_else(|| format!("map #{m}"), |d| d.name.clone())
    }

    /// Abstract interpretation from one function entry; BPF-to-BPF calls are stepped over
    /// and their callees walked on their own with untraced arguments.
    fn function(&mut self, entry: usize, is_main: bool) {
        let n = self.prog.insns.len();
        let mut states: Vec<Option<State>> = vec![None; n];
        let mut work: Vec<usize> = vec![entry];
        states[entry] = Some(if is_main {
            State::entry()
        } else {
            State::subprog()
        });
        let mut depth = 0u32;
        let mut callees = BTreeSet::new();
        let mut steps = 0usize;
        while let Some(i) = work.pop() {
            steps += 1;
            if steps > 200_000 {
                break; // lattice is finite; this only guards against a malformed object
            }
            let Some(st) = states[i].clone() else {
                continue;
            };
            self.reachable.insert(i);
            let succ = self.step(i, st, is_main, &mut depth, &mut callees);
            for (j, s) in succ {
                if j >= n {
                    continue;
                }
                let merged = match &states[j] {
                    None => s,
                    Some(old) => {
                        let m = old.join(&s);
                        if &m == old {
                            continue;
                        }
                        m
                    }
                };
                states[j] = Some(merged);
                work.push(j);
            }
        }
        let d = self.depth.entry(entry).or_insert(0);
        *d = (*d).max(depth);
        self.callees.entry(entry).or_default().extend(callees);
    }

    fn mem_access(
        &mut self,
        i: usize,
        base: Val,
        off: i64,
        size: u32,
        store: bool,
        depth: &mut u32,
    ) {
        let p = self.profile;
        match base.offset(off) {
            Val::Stack(o) if o < 0 => *depth = (*depth).max((-o) as u32),
            Val::Pkt(o) => {
                let end = (o.max(0) as u64 + u64::from(size)) as u32;
                self.max_pkt = self.max_pkt.max(end);
            }
            Val::PktVar => self.var_pkt = true,
            Val::Ctx | Val::Unknown if matches!(base, Val::Ctx) => {
                if store {
                    if off == 16 {
                        self.find(
                            i,
                            Rule::CtxAccess,
                            Certainty::Possible,
                            "writes xdp_md.rx_queue_index: needs the FW queue-select capability"
                                .into(),
                            "nfp/bpf/verifier.c:nfp_bpf_check_store",
                        );
                    } else {
                        self.find(
                            i,
                            Rule::CtxAccess,
                            Certainty::Definite,
                            format!("writes xdp_md.{} (offset {off})", ctx_field(off)),
                            "nfp/bpf/verifier.c:nfp_bpf_check_store",
                        );
                    }
                } else if !p.ctx_reads.contains(&(off as i16)) {
                    self.find(
                        i,
                        Rule::CtxAccess,
                        Certainty::Definite,
                        format!(
                            "reads xdp_md.{} (offset {off}); only data and data_end are readable",
                            ctx_field(off)
                        ),
                        "nfp/bpf/jit.c:mem_ldx_xdp",
                    );
                }
            }
            Val::MapValue(m, _) if store && !p.direct_map_writes => {
                let name = self.map_name(m);
                self.find(
                    i,
                    Rule::MapWrite,
                    Certainty::Definite,
                    format!("stores straight into a value of map {name} (only map_update_elem or atomic add may change map state)"),
                    "nfp/bpf/verifier.c:nfp_bpf_check_ptr \"map writes not supported\"",
                );
            }
            Val::Unknown if store && !p.direct_map_writes => {
                self.find(
                    i,
                    Rule::UntracedPointer,
                    Certainty::Possible,
                    "stores through a pointer the checker cannot trace (stores into map values are refused)".into(),
                    "nfp/bpf/verifier.c:nfp_bpf_check_ptr",
                );
            }
            _ => {}
        }
    }

    fn step(
        &mut self,
        i: usize,
        mut st: State,
        is_main: bool,
        depth: &mut u32,
        callees: &mut BTreeSet<usize>,
    ) -> Vec<(usize, State)> {
        let p = self.profile;
        let ins: Insn = self.prog.insns[i];
        let d = ins.dst as usize;
        let s = ins.src as usize;
        if d > 10 || s > 10 {
            self.find(
                i,
                Rule::Opcode,
                Certainty::Definite,
                "uses a register beyond r10 (JIT hardening?)".into(),
                "nfp/bpf/verifier.c:nfp_verify_insn",
            );
            return vec![];
        }
        if !p.opcode_allowed(ins.code) {
            self.find(
                i,
                Rule::Opcode,
                Certainty::Definite,
                format!(
                    "opcode {:#04x} ({}) is not implemented",
                    ins.code,
                    ins.mnemonic()
                ),
                p.opcode_source,
            );
        } else if !p.isa_v4_variants
            && ins.is_alu()
            && ins.off != 0
            && matches!(ins.op(), alu::DIV | alu::MOD | alu::MOV)
        {
            self.find(
                i,
                Rule::Opcode,
                Certainty::Definite,
                format!(
                    "{} is an ISA v4 signed variant the JIT does not know",
                    ins.mnemonic()
                ),
                p.opcode_source,
            );
        }
        let next = i + 1;
        match ins.class() {
            class::LD => {
                if ins.is_ld_imm64() {
                    let hi = self.prog.insns.get(i + 1).map_or(0, |x| x.imm as u32);
                    let v = match self.prog.map_refs.get(&i) {
                        Some(&m)
                            if self.maps.get(m).map(|d| d.origin)
                                == Some(MapOrigin::GlobalData) =>
                        {
                            Val::MapValue(m, Some(i64::from(ins.imm)))
                        }
                        Some(&m) => Val::Map(m),
                        None => Val::Const(u64::from(ins.imm as u32) | (u64::from(hi) << 32)),
                    };
                    st.regs[d] = v;
                    return vec![(i + 2, st)];
                }
                // LD_ABS / LD_IND: legacy packet loads, r0 = result, r1-r5 clobbered
                if ins.mode() == mode::ABS {
                    let end = (ins.imm.max(0) as u32).saturating_add(ins.size_bytes());
                    self.max_pkt = self.max_pkt.max(end);
                } else {
                    self.var_pkt = true;
                }
                for r in 1..=5 {
                    st.regs[r] = Val::Unknown;
                }
                st.regs[0] = Val::U32;
                vec![(next, st)]
            }
            class::LDX => {
                let base = st.regs[s];
                let off = i64::from(ins.off);
                self.mem_access(i, base, off, ins.size_bytes(), false, depth);
                let v = match base.offset(off) {
                    Val::Ctx if matches!(base, Val::Ctx) => Val::Unknown,
                    Val::Stack(o) if ins.size_bytes() == 8 => {
                        st.slots.get(&o).copied().unwrap_or(Val::Unknown)
                    }
                    _ if ins.size_bytes() <= 4 => Val::U32,
                    _ => Val::Unknown,
                };
                let v = if matches!(base, Val::Ctx) {
                    match ins.off {
                        0 => Val::Pkt(0),
                        4 => Val::PktEnd,
                        _ => Val::Unknown,
                    }
                } else {
                    v
                };
                st.regs[d] = v;
                vec![(next, st)]
            }
            class::ST | class::STX => {
                let base = st.regs[d];
                let off = i64::from(ins.off);
                if ins.mode() == mode::ATOMIC {
                    self.atomic(i, &ins, base, st.regs[s]);
                    self.mem_access(i, base, off, ins.size_bytes(), false, depth);
                    if let Val::Stack(o) = base.offset(off) {
                        st.clobber(o, i64::from(ins.size_bytes()));
                    }
                    if ins.imm & 0x01 != 0 {
                        st.regs[s] = Val::Unknown;
                    }
                    if ins.imm == 0xf1 {
                        st.regs[0] = Val::Unknown;
                    }
                    return vec![(next, st)];
                }
                self.mem_access(i, base, off, ins.size_bytes(), true, depth);
                if let Val::Stack(o) = base.offset(off) {
                    let size = i64::from(ins.size_bytes());
                    st.clobber(o, size);
                    if size == 8 {
                        let v = if ins.class() == class::STX {
                            st.regs[s]
                        } else {
                            Val::Const(i64::from(ins.imm) as u64)
                        };
                        if v != Val::Unknown {
                            st.slots.insert(o, v);
                        }
                    }
                }
                vec![(next, st)]
            }
            class::ALU | class::ALU64 => {
                self.alu(i, &ins, &mut st);
                vec![(next, st)]
            }
            _ => self.jump(i, &ins, st, is_main, callees),
        }
    }

    fn atomic(&mut self, i: usize, ins: &Insn, base: Val, src: Val) {
        let p = self.profile;
        if !p.atomic_ops.contains(&ins.imm) {
            self.find(
                i,
                Rule::Atomic,
                Certainty::Definite,
                format!(
                    "atomic operation {:#x} (only add without fetch is implemented)",
                    ins.imm
                ),
                "nfp/bpf/jit.c, verifier.c:nfp_bpf_check_xadd",
            );
        }
        match base {
            Val::MapValue(..) => {}
            Val::Unknown => self.find(
                i,
                Rule::Atomic,
                Certainty::Possible,
                "atomic add through a pointer the checker cannot trace (it must be a map value)"
                    .into(),
                "nfp/bpf/verifier.c:nfp_bpf_check_xadd",
            ),
            other => self.find(
                i,
                Rule::Atomic,
                Certainty::Definite,
                format!("atomic add into {} (it must be a map value)", other.kind()),
                "nfp/bpf/verifier.c:nfp_bpf_check_xadd",
            ),
        }
        if !matches!(src, Val::Unknown | Val::Const(_) | Val::Small(_) | Val::U32) {
            self.find(
                i,
                Rule::Atomic,
                Certainty::Definite,
                format!("atomic add of {} (it must be a scalar)", src.kind()),
                "nfp/bpf/verifier.c:nfp_bpf_check_xadd",
            );
        }
    }

    fn alu(&mut self, i: usize, ins: &Insn, st: &mut State) {
        let p = self.profile;
        let d = ins.dst as usize;
        let is64 = ins.class() == class::ALU64;
        let op = ins.op();
        let srcv = if ins.src_is_reg() {
            st.regs[ins.src as usize]
        } else if is64 {
            Val::Const(i64::from(ins.imm) as u64)
        } else {
            Val::Const(u64::from(ins.imm as u32))
        };
        let dstv = st.regs[d];
        if p.narrow_mul_div && p.offload {
            let src = "nfp/bpf/verifier.c:nfp_bpf_check_alu";
            if op == alu::MUL {
                if is64 && !ins.src_is_reg() && ins.imm < 0 {
                    self.find(
                        i,
                        Rule::MulDiv,
                        Certainty::Definite,
                        "64-bit multiply by a negative immediate (sign-extended beyond u32)".into(),
                        src,
                    );
                }
                if is64 {
                    for (what, v) in [("multiplier", dstv), ("multiplicand", srcv)] {
                        match v {
                            _ if v.fits_u32() => {}
                            Val::Const(_) => self.find(
                                i,
                                Rule::MulDiv,
                                Certainty::Definite,
                                format!("64-bit multiply whose {what} exceeds u32"),
                                src,
                            ),
                            _ => self.find(
                                i,
                                Rule::MulDiv,
                                Certainty::Possible,
                                format!(
                                    "64-bit multiply whose {what} the checker cannot bound to u32"
                                ),
                                src,
                            ),
                        }
                    }
                }
            }
            if op == alu::DIV {
                if !ins.src_is_reg() && ins.imm < 0 {
                    self.find(
                        i,
                        Rule::MulDiv,
                        Certainty::Definite,
                        "divide by a negative constant".into(),
                        src,
                    );
                }
                if ins.src_is_reg() {
                    match srcv {
                        Val::Const(c) if c > u64::from(u32::MAX) => self.find(i, Rule::MulDiv,
                            Certainty::Definite, "divisor exceeds u32".into(), src),
                        Val::Const(_) => {}
                        _ => self.find(i, Rule::MulDiv, Certainty::Definite,
                            "divides by a register that is not a constant (the NFP divides only by constants, by reciprocal multiplication)".into(), src),
                    }
                }
                if is64 {
                    match dstv {
                        _ if dstv.fits_u32() => {}
                        Val::Const(_) => self.find(
                            i,
                            Rule::MulDiv,
                            Certainty::Definite,
                            "dividend exceeds u32".into(),
                            src,
                        ),
                        _ => self.find(
                            i,
                            Rule::MulDiv,
                            Certainty::Possible,
                            "64-bit divide whose dividend the checker cannot bound to u32".into(),
                            src,
                        ),
                    }
                }
            }
        }
        let out = match (op, dstv, srcv) {
            (alu::END, Val::Const(c), _) => {
                let bits = ins.imm as u32;
                let swapped = match (bits, ins.src_is_reg() || is64) {
                    (16, true) => u64::from((c as u16).swap_bytes()),
                    (32, true) => u64::from((c as u32).swap_bytes()),
                    (64, true) => c.swap_bytes(),
                    (16, false) => c & 0xffff,
                    (32, false) => c & 0xffff_ffff,
                    _ => c,
                };
                Val::Const(swapped)
            }
            (alu::END, _, _) => Val::Unknown,
            (alu::MOV, _, v) if ins.off == 0 => {
                if is64 {
                    v
                } else {
                    match v {
                        Val::Const(c) => Val::Const(c & 0xffff_ffff),
                        _ => Val::Unknown,
                    }
                }
            }
            (_, Val::Const(a), Val::Const(b)) => {
                alu_eval(op, is64, a, b).map_or(Val::Unknown, Val::Const)
            }
            // a 32-bit ALU result is zero-extended
            (_, x, y) if !is64 && !x.is_pointer() && !y.is_pointer() => Val::U32,
            (alu::AND, x, y) if x.fits_u32() || y.fits_u32() => Val::U32,
            (alu::RSH, x, Val::Const(c)) if x.fits_u32() || c >= 32 => Val::U32,
            (alu::ADD, ptr, Val::Const(c)) if is64 => ptr.offset(c as i64),
            (alu::SUB, ptr, Val::Const(c)) if is64 => ptr.offset((c as i64).wrapping_neg()),
            (alu::ADD, Val::Pkt(_) | Val::PktVar, _) if is64 => Val::PktVar,
            (alu::ADD, Val::MapValue(m, _), _) if is64 => Val::MapValue(m, None),
            _ => Val::Unknown,
        };
        st.regs[d] = out;
    }

    fn jump(
        &mut self,
        i: usize,
        ins: &Insn,
        mut st: State,
        is_main: bool,
        callees: &mut BTreeSet<usize>,
    ) -> Vec<(usize, State)> {
        let p = self.profile;
        let next = i + 1;
        if ins.is_exit() {
            if is_main {
                match st.regs[0] {
                    Val::Const(_) | Val::Small(_) => {
                        let codes: Vec<u64> = match st.regs[0] {
                            Val::Const(c) => vec![c & 0xffff_ffff],
                            Val::Small(b) => (0..64).filter(|n| b & (1 << n) != 0).collect(),
                            _ => vec![],
                        };
                        for c in codes {
                            self.returns.insert(c);
                            if p.offload && !p.xdp_actions.contains(&c) {
                                self.find(
                                    i,
                                    Rule::ReturnCode,
                                    Certainty::Definite,
                                    format!(
                                        "returns {} ({c}), which the NIC turns into a drop",
                                        insn::xdp_action_name(c)
                                    ),
                                    "nfp/bpf/jit.c:nfp_outro_xdp",
                                );
                            }
                        }
                    }
                    _ => {
                        self.return_unknown = true;
                        if p.offload {
                            self.find(
                                i,
                                Rule::ReturnCode,
                                Certainty::Possible,
                                "returns a value the checker cannot determine (codes the NIC does not honour become a drop)".into(),
                                "nfp/bpf/jit.c:nfp_outro_xdp",
                            );
                        }
                    }
                }
            }
            return vec![];
        }
        if ins.is_call() {
            match ins.src {
                insn::PSEUDO_CALL => {
                    if let Some(&t) = self.prog.calls.get(&i) {
                        callees.insert(t);
                    }
                    if !p.bpf_to_bpf_calls {
                        self.find(
                            i,
                            Rule::BpfCall,
                            Certainty::Definite,
                            "calls a BPF subprogram; the target runs one function only".into(),
                            p.opcode_source,
                        );
                    }
                }
                insn::PSEUDO_KFUNC_CALL => self.find(
                    i,
                    Rule::Kfunc,
                    Certainty::Definite,
                    "calls a kernel function (kfunc)".into(),
                    p.helper_source,
                ),
                _ => self.helper(i, ins.imm, &st),
            }
            let ret = if ins.src == 0 && ins.imm == helper::MAP_LOOKUP_ELEM {
                match st.regs[1] {
                    Val::Map(m) => Val::MapValue(m, Some(0)),
                    _ => Val::Unknown,
                }
            } else {
                Val::Unknown
            };
            for r in 1..=5 {
                st.regs[r] = Val::Unknown;
            }
            st.regs[0] = ret;
            return vec![(next, st)];
        }
        if ins.op() == jmp::JA {
            let off = if ins.class() == class::JMP32 {
                i64::from(ins.imm)
            } else {
                i64::from(ins.off)
            };
            return vec![((next as i64 + off).max(0) as usize, st)];
        }
        let target = (next as i64 + i64::from(ins.off)).max(0) as usize;
        let d = ins.dst as usize;
        // the null check after a lookup: on the "is null" edge the register is 0
        if !ins.src_is_reg() && ins.imm == 0 && matches!(st.regs[d], Val::MapValue(..)) {
            let mut null = st.clone();
            null.regs[d] = Val::Const(0);
            match ins.op() {
                jmp::JEQ => return vec![(target, null), (next, st)],
                jmp::JNE => return vec![(target, st), (next, null)],
                _ => {}
            }
        }
        vec![(target, st.clone()), (next, st)]
    }

    fn helper(&mut self, i: usize, id: i32, st: &State) {
        let p = self.profile;
        let Some(rule) = p.helper(id) else {
            let why = match id {
                helper::REDIRECT | helper::REDIRECT_MAP => {
                    " (the NIC cannot forward to another port: pass to the host instead)"
                }
                helper::TAIL_CALL => " (no tail calls on the NIC)",
                _ => "",
            };
            self.find(
                i,
                Rule::Helper,
                Certainty::Definite,
                format!("calls helper {}{why}", helper::describe(id)),
                p.helper_source,
            );
            return;
        };
        if rule.stack_args {
            let mut args = vec![(2usize, "key")];
            if id == helper::MAP_UPDATE_ELEM {
                args.push((3, "value"));
            }
            for (r, what) in args {
                match st.regs[r] {
                    Val::Stack(o) if o % 4 == 0 => {}
                    Val::Stack(o) => self.find(
                        i,
                        Rule::HelperArg,
                        Certainty::Definite,
                        format!("{} {what} at unaligned stack offset {o}", rule.name),
                        "nfp/bpf/verifier.c:nfp_bpf_stack_arg_ok",
                    ),
                    Val::Unknown => self.find(
                        i,
                        Rule::HelperArg,
                        Certainty::Possible,
                        format!(
                            "{} {what} pointer the checker cannot trace (it must be on the stack)",
                            rule.name
                        ),
                        "nfp/bpf/verifier.c:nfp_bpf_stack_arg_ok",
                    ),
                    other => self.find(
                        i,
                        Rule::HelperArg,
                        Certainty::Definite,
                        format!(
                            "{} {what} points into {} (it must be on the stack)",
                            rule.name,
                            other.kind()
                        ),
                        "nfp/bpf/verifier.c:nfp_bpf_stack_arg_ok",
                    ),
                }
            }
        }
        if id == helper::MAP_DELETE_ELEM {
            if let Val::Map(m) = st.regs[1] {
                if self.maps.get(m).map(|d| d.map_type) == Some(map_type::ARRAY) {
                    let name = self.map_name(m);
                    self.find(
                        i,
                        Rule::HelperArg,
                        Certainty::Definite,
                        format!("map_delete_elem on ARRAY map {name}"),
                        "kernel/bpf/arraymap.c (delete is -EINVAL); nfp offload.c",
                    );
                }
            }
        }
        if id == helper::PERF_EVENT_OUTPUT {
            match st.regs[3] {
                Val::Const(c) if c & 0xffff_ffff == 0xffff_ffff => {}
                Val::Const(c) => self.find(
                    i,
                    Rule::HelperArg,
                    Certainty::Definite,
                    format!("perf_event_output flags {c:#x}, not BPF_F_CURRENT_CPU"),
                    "nfp/bpf/verifier.c:nfp_bpf_check_helper_call",
                ),
                _ => self.find(
                    i,
                    Rule::HelperArg,
                    Certainty::Possible,
                    "perf_event_output flags the checker cannot determine (must be BPF_F_CURRENT_CPU)".into(),
                    "nfp/bpf/verifier.c:nfp_bpf_check_helper_call",
                ),
            }
        }
    }
}

fn est_target(profile: &Profile, ins: &Insn) -> f64 {
    let j = &profile.jit;
    match ins.class() {
        class::ALU | class::ALU64 => match ins.op() {
            alu::MUL => j.mul,
            alu::DIV | alu::MOD => j.div,
            _ if ins.class() == class::ALU64 => j.alu64,
            _ => j.alu32,
        },
        class::LD if ins.is_ld_imm64() => j.ld_imm64,
        class::LD => j.ld_abs_ind,
        class::LDX => j.load,
        class::ST => j.store,
        class::STX if ins.mode() == mode::ATOMIC => j.atomic,
        class::STX => j.store,
        _ if ins.is_call() && ins.src == insn::PSEUDO_CALL => j.bpf_call,
        _ if ins.is_call() => j.helper_call,
        _ if ins.is_exit() => j.exit,
        class::JMP32 => j.jmp32,
        _ => j.jmp64,
    }
}

/// Whether one map fits the profile, and why not.
pub fn map_fits(p: &Profile, m: &MapDef) -> Result<(), (Rule, Certainty, String)> {
    let round8 = |x: u32| x.div_ceil(8) * 8;
    if !p.offload {
        return Err((Rule::NoOffloadTarget, Certainty::Definite, "no NIC".into()));
    }
    if p.host_map_types.contains(&m.map_type) {
        return Ok(());
    }
    if m.origin == MapOrigin::Undescribed {
        return Err((
            Rule::MapType,
            Certainty::Possible,
            format!(
                "map {} has no BTF description: type and sizes unknown",
                m.name
            ),
        ));
    }
    if !p.map_types.contains(&m.map_type) {
        return Err((
            Rule::MapType,
            Certainty::Definite,
            format!(
                "map {} is {} (type {}); the NIC holds only {}",
                m.name,
                map_type::name(m.map_type),
                m.map_type,
                p.map_types
                    .iter()
                    .map(|t| map_type::name(*t))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        ));
    }
    if p.map_flags_zero && m.map_flags != 0 {
        return Err((
            Rule::MapFlags,
            Certainty::Definite,
            format!(
                "map {} has flags {:#x}; offloaded maps take none",
                m.name, m.map_flags
            ),
        ));
    }
    if let Some(k) = p.max_key_size {
        if m.key_size > k {
            return Err((
                Rule::MapSize,
                Certainty::Definite,
                format!("map {} key is {} bytes, more than {k}", m.name, m.key_size),
            ));
        }
    }
    if let Some(v) = p.max_value_size {
        if m.value_size > v {
            return Err((
                Rule::MapSize,
                Certainty::Definite,
                format!(
                    "map {} value is {} bytes, more than {v}",
                    m.name, m.value_size
                ),
            ));
        }
    }
    if let Some(e) = p.max_elem_size {
        let elem = round8(m.key_size) + round8(m.value_size);
        if elem > e {
            return Err((
                Rule::MapSize,
                Certainty::Definite,
                format!(
                    "map {} element is {elem} bytes (key and value rounded up to 8), more than {e}",
                    m.name
                ),
            ));
        }
    }
    if let Some(t) = p.max_total_entries {
        if u64::from(m.max_entries) > t {
            return Err((
                Rule::MapEntries,
                Certainty::Definite,
                format!(
                    "map {} has {} entries, more than the NIC's {t}",
                    m.name, m.max_entries
                ),
            ));
        }
    }
    Ok(())
}

fn group(raw: Vec<Raw>, prog: &Program) -> Vec<Finding> {
    let mut by: BTreeMap<(Certainty, Rule, String, String), BTreeSet<usize>> = BTreeMap::new();
    for r in raw {
        let e = by
            .entry((r.certainty, r.rule, r.detail, r.source))
            .or_default();
        if let Some(s) = r.slot {
            e.insert(s);
        }
    }
    let mut out: Vec<Finding> = by
        .into_iter()
        .map(|((certainty, rule, detail, source), slots)| {
            let mut lines: Vec<String> = Vec::new();
            for &s in &slots {
                if let Some(l) = prog.line_at(s) {
                    let at = format!("{}:{}", l.file, l.line);
                    if !lines.contains(&at) {
                        lines.push(at);
                    }
                }
            }
            let mut ranges: Vec<[usize; 2]> = Vec::new();
            for s in slots {
                match ranges.last_mut() {
                    // LD_IMM64 takes two slots: a gap of one still joins a range
                    Some(r) if s <= r[1] + 2 => r[1] = s,
                    _ => ranges.push([s, s]),
                }
            }
            Finding {
                rule,
                certainty,
                detail,
                source,
                ranges,
                lines,
            }
        })
        .collect();
    out.sort_by_key(|f| (f.certainty, f.ranges.first().map_or(0, |r| r[0])));
    out
}

fn verdict_of(fs: &[Finding]) -> Verdict {
    if fs.iter().any(|f| f.certainty == Certainty::Definite) {
        Verdict::Ineligible
    } else if fs.is_empty() {
        Verdict::LikelyEligible
    } else {
        Verdict::Uncertain
    }
}

/// Checks one program of an object against a profile.
pub fn check_program(obj: &Object, prog: &Program, profile: &Profile) -> ProgramReport {
    let mut w = Walk {
        prog,
        maps: &obj.maps,
        profile,
        raw: Vec::new(),
        reachable: BTreeSet::new(),
        returns: BTreeSet::new(),
        return_unknown: false,
        max_pkt: 0,
        var_pkt: false,
        depth: HashMap::new(),
        callees: HashMap::new(),
    };
    w.function(prog.entry, true);
    // walk every callee once
    let mut done: BTreeSet<usize> = BTreeSet::from([prog.entry]);
    let mut todo: Vec<usize> = w
        .callees
        .get(&prog.entry)
        .into_iter()
        .flatten()
        .copied()
        .collect();
    while let Some(f) = todo.pop() {
        if !done.insert(f) {
            continue;
        }
        w.function(f, false);
        todo.extend(w.callees.get(&f).into_iter().flatten().copied());
    }
    // stack: a frame plus its deepest callee chain (recursion is refused by the kernel)
    fn chain(f: usize, w: &Walk<'_>, seen: &mut BTreeSet<usize>) -> u32 {
        if !seen.insert(f) {
            return 0;
        }
        let own = w.depth.get(&f).copied().unwrap_or(0).div_ceil(8) * 8;
        let deepest = w
            .callees
            .get(&f)
            .into_iter()
            .flatten()
            .map(|&c| chain(c, w, seen))
            .max()
            .unwrap_or(0);
        seen.remove(&f);
        own + deepest
    }
    let stack = chain(prog.entry, &w, &mut BTreeSet::new());

    // maps this program references
    let mut used: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (&slot, &m) in &prog.map_refs {
        if w.reachable.contains(&slot) {
            used.entry(m).or_default().push(slot);
        }
    }
    let mut program_raw: Vec<Raw> = Vec::new();
    if profile.offload {
        let mut total_entries = 0u64;
        let mut on_nic = 0u32;
        for (&m, slots) in &used {
            let def = &obj.maps[m];
            match map_fits(profile, def) {
                Ok(()) => {
                    if !profile.host_map_types.contains(&def.map_type) {
                        total_entries += u64::from(def.max_entries);
                        on_nic += 1;
                    }
                }
                Err((rule, certainty, detail)) => {
                    for &s in slots {
                        w.raw.push(Raw {
                            slot: Some(s),
                            rule,
                            certainty,
                            detail: detail.clone(),
                            source: "kernel/bpf/offload.c:bpf_map_offload_map_alloc, nfp/bpf/offload.c:nfp_bpf_map_alloc".into(),
                        });
                    }
                }
            }
        }
        if let Some(t) = profile.max_total_entries {
            if total_entries > t {
                program_raw.push(Raw {
                    slot: None,
                    rule: Rule::MapEntries,
                    certainty: Certainty::Definite,
                    detail: format!("maps total {total_entries} entries, more than the NIC's {t}"),
                    source: format!(
                        "nfp/bpf/offload.c:nfp_bpf_map_alloc (max_elems); {}",
                        profile.limits_source
                    ),
                });
            }
        }
        if let Some(mx) = profile.max_maps {
            if on_nic > mx {
                program_raw.push(Raw {
                    slot: None,
                    rule: Rule::MapCount,
                    certainty: Certainty::Definite,
                    detail: format!("{on_nic} maps, more than the NIC's {mx}"),
                    source: "nfp/bpf/offload.c:nfp_bpf_map_alloc (max_maps)".into(),
                });
            }
        }
    }
    let est: f64 = w
        .reachable
        .iter()
        .map(|&i| est_target(profile, &prog.insns[i]))
        .sum();
    let est_margin = (est * profile.jit.margin).ceil() as u64;
    // every BPF instruction becomes at least this many target instructions
    let j = &profile.jit;
    let floor = [
        j.alu32,
        j.alu64,
        j.mul,
        j.div,
        j.ld_imm64,
        j.ld_abs_ind,
        j.load,
        j.store,
        j.atomic,
        j.jmp32,
        j.jmp64,
        j.helper_call,
        j.bpf_call,
        j.exit,
    ]
    .into_iter()
    .fold(f64::INFINITY, f64::min);
    if profile.offload {
        if w.reachable.len() as f64 * floor > profile.max_prog_len as f64 {
            program_raw.push(Raw {
                slot: None,
                rule: Rule::ProgramLength,
                certainty: Certainty::Definite,
                detail: format!(
                    "{} BPF instructions already exceed the limit of {} target instructions",
                    w.reachable.len(),
                    profile.max_prog_len
                ),
                source: format!("NFP_NET_CFG_BPF_MAX_LEN; {}", profile.limits_source),
            });
        } else if est_margin > profile.max_prog_len {
            program_raw.push(Raw {
                slot: None,
                rule: Rule::ProgramLength,
                certainty: Certainty::Possible,
                detail: format!(
                    "about {est_margin} target instructions after the JIT (model estimate, margin included), more than the limit of {}",
                    profile.max_prog_len
                ),
                source: format!("NFP_NET_CFG_BPF_MAX_LEN; {}; JIT expansion modelled", profile.limits_source),
            });
        }
        if stack > profile.stack_max {
            program_raw.push(Raw {
                slot: None,
                rule: Rule::Stack,
                certainty: Certainty::Definite,
                detail: format!("{stack} bytes of stack, more than {}", profile.stack_max),
                source: format!(
                    "NFP_NET_CFG_BPF_STACK_SZ; nfp/bpf/verifier.c:nfp_bpf_get_stack_usage; {}",
                    profile.limits_source
                ),
            });
        }
        if let Some(b) = profile.pkt_split_bound {
            if w.max_pkt > b {
                program_raw.push(Raw {
                    slot: None,
                    rule: Rule::PacketOffset,
                    certainty: Certainty::Definite,
                    detail: format!(
                        "reads packet offset {} beyond the split boundary {b}",
                        w.max_pkt
                    ),
                    source: "nfp/bpf/verifier.c:nfp_bpf_finalize".into(),
                });
            }
        }
        if !prog.is_xdp() {
            program_raw.push(Raw {
                slot: None,
                rule: Rule::ProgramType,
                certainty: Certainty::Possible,
                detail: format!(
                    "section {} is not an XDP program; the checker models XDP offload only",
                    prog.section
                ),
                source: "libbpf section naming".into(),
            });
        }
    } else {
        w.raw.clear();
        program_raw.push(Raw {
            slot: None,
            rule: Rule::NoOffloadTarget,
            certainty: Certainty::Definite,
            detail: "profile none has no NIC: every function runs on the host".into(),
            source: "profile none".into(),
        });
    }

    // split instruction findings by function
    let mut per_fn: BTreeMap<usize, Vec<Raw>> = BTreeMap::new();
    for r in w.raw {
        let f = r
            .slot
            .and_then(|s| {
                prog.functions
                    .iter()
                    .position(|f| f.start <= s && s < f.end)
            })
            .unwrap_or(usize::MAX);
        per_fn.entry(f).or_default().push(r);
    }
    let mut functions = Vec::new();
    for (idx, f) in prog.functions.iter().enumerate() {
        // only functions this program reaches
        if !w.reachable.iter().any(|&s| f.start <= s && s < f.end) {
            continue;
        }
        let findings = group(per_fn.remove(&idx).unwrap_or_default(), prog);
        functions.push(FunctionReport {
            name: f.name.clone(),
            start: f.start,
            end: f.end,
            verdict: if profile.offload {
                verdict_of(&findings)
            } else {
                Verdict::Ineligible
            },
            findings,
        });
    }
    // findings outside any symbol's range belong to the program
    program_raw.extend(per_fn.into_values().flatten());
    let findings = group(program_raw, prog);
    let verdict = functions
        .iter()
        .map(|f| f.verdict)
        .chain(std::iter::once(verdict_of(&findings)))
        .max()
        .unwrap_or(Verdict::LikelyEligible);
    ProgramReport {
        section: prog.section.clone(),
        name: prog.name.clone(),
        verdict,
        bpf_insns: w.reachable.len(),
        est_target_insns_model: est_margin,
        target_insn_limit: profile.max_prog_len,
        stack_bytes: stack,
        max_pkt_offset: w.max_pkt,
        variable_pkt_offset: w.var_pkt,
        return_codes: w.returns.into_iter().collect(),
        return_code_unknown: w.return_unknown,
        maps: used.keys().map(|&m| obj.maps[m].name.clone()).collect(),
        findings,
        functions,
    }
}

/// Checks every program of an object.
pub fn check(obj: &Object, profile: &Profile) -> Report {
    let programs = obj
        .programs
        .iter()
        .map(|p| check_program(obj, p, profile))
        .collect();
    let maps = obj
        .maps
        .iter()
        .map(|m| {
            let fit = map_fits(profile, m);
            MapReport {
                name: m.name.clone(),
                map_type: m.map_type,
                type_name: map_type::name(m.map_type),
                key_size: m.key_size,
                value_size: m.value_size,
                max_entries: m.max_entries,
                map_flags: m.map_flags,
                origin: m.origin,
                offloadable: fit.is_ok(),
                reason: fit.err().map(|e| e.2),
            }
        })
        .collect();
    Report {
        profile: profile.name.to_owned(),
        programs,
        maps,
        authority: AUTHORITY,
    }
}

impl Report {
    /// The report as text for a terminal: a verdict per program and function, each reason
    /// with its instruction ranges and its source.
    pub fn human(&self) -> String {
        let mut t = String::new();
        for p in &self.programs {
            t.push_str(&format!(
                "program {} (section {}): {} for profile {}\n",
                p.name,
                p.section,
                p.verdict.as_str(),
                self.profile
            ));
            t.push_str(&format!(
                "  {} BPF instructions, ~{} target instructions after JIT (model estimate; limit {}), {} B stack, packet offsets up to {}{}\n",
                p.bpf_insns,
                p.est_target_insns_model,
                p.target_insn_limit,
                p.stack_bytes,
                p.max_pkt_offset,
                if p.variable_pkt_offset { " plus variable ones" } else { "" }
            ));
            let codes: Vec<String> = p
                .return_codes
                .iter()
                .map(|c| insn::xdp_action_name(*c).to_owned())
                .collect();
            t.push_str(&format!(
                "  returns {}{}; maps: {}\n",
                if codes.is_empty() {
                    "nothing constant".to_owned()
                } else {
                    codes.join(", ")
                },
                if p.return_code_unknown {
                    " and values not known statically"
                } else {
                    ""
                },
                if p.maps.is_empty() {
                    "none".to_owned()
                } else {
                    p.maps.join(", ")
                }
            ));
            for f in &p.findings {
                t.push_str(&format!("  {}\n", line(f)));
            }
            for f in &p.functions {
                t.push_str(&format!(
                    "  function {} [insns {}..{}]: {}\n",
                    f.name,
                    f.start,
                    f.end.saturating_sub(1),
                    f.verdict.as_str()
                ));
                for x in &f.findings {
                    t.push_str(&format!("    {}\n", line(x)));
                }
            }
        }
        for m in &self.maps {
            t.push_str(&format!(
                "map {}: {} key {} value {} entries {}{}\n",
                m.name,
                m.type_name,
                m.key_size,
                m.value_size,
                m.max_entries,
                match &m.reason {
                    None => " (fits the profile)".to_owned(),
                    Some(r) => format!(" ({r})"),
                }
            ));
        }
        t.push_str(&format!("note: {}\n", self.authority));
        t
    }
}

fn line(f: &Finding) -> String {
    let what = match f.certainty {
        Certainty::Definite => "ineligible because",
        Certainty::Possible => "uncertain:",
    };
    let ranges: Vec<String> = f
        .ranges
        .iter()
        .map(|r| {
            if r[0] == r[1] {
                format!("{}", r[0])
            } else {
                format!("{}-{}", r[0], r[1])
            }
        })
        .collect();
    let at = if ranges.is_empty() {
        String::new()
    } else {
        format!(" at insn {}", ranges.join(","))
    };
    let at = if f.lines.is_empty() {
        at
    } else {
        let mut l = f
            .lines
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if f.lines.len() > 6 {
            l.push_str(", ...");
        }
        format!("{at} ({l})")
    };
    format!("{what} {}{at} [{}]", f.detail, f.source)
}
