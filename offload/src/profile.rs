//! Capability profiles: what an offload target accepts, as data, so that the checker and the
//! planner have one place that ties them to a real device and every rule can be traced to
//! where it came from.
//!
//! `nfp` is taken from the Netronome driver's verifier hooks and JIT. Sources, cited per field
//! below as `verifier.c:fn` / `jit.c:fn` / `offload.c:fn`: drivers/net/ethernet/netronome/nfp/bpf/
//! in Linux, mirrored by Netronome/nfp-drv-kmods src/bpf/ (read at 08e3d11b and 7728618), and
//! kernel/bpf/offload.c. Numbers the driver reads from firmware at run time (program length,
//! stack, map limits) have no upstream default; the ones here are the public third-party figures
//! (CentaurusInfra/mizar docs/design/features/offload_XDP/design_and_limitations.md) or, where
//! none was found, marked ASSUMED. A real card's values override them.
//!
//! `hxdp` has no driver to read: it is a model of the OSDI'20 hXDP paper's Sephirot core, and
//! every rule in it is marked as taken from the paper or INFERRED.
//!
//! `none` is the host alone: nothing is offloadable, which is the honest answer on this
//! machine (no SmartNIC, no netdevsim).

use serde::Serialize;

use crate::error::Error;
use crate::insn::{alu, class, helper, jmp, map_type, mode};

/// One helper the target implements, and the extra constraint the driver places on it.
#[derive(Debug, Clone, Serialize)]
pub struct HelperRule {
    pub id: i32,
    pub name: &'static str,
    /// What else must hold (firmware capability, argument kinds); shown in reports.
    pub requires: &'static str,
    /// Key (and value, for update) pointers must point into the stack at a constant,
    /// 4-byte-aligned offset (verifier.c:nfp_bpf_stack_arg_ok).
    pub stack_args: bool,
}

/// The per-instruction-class expansion from BPF instructions to target instructions. The
/// program-length limit of the nfp counts NFP machine instructions after the JIT, which no
/// tool can compute without the driver, so this is an estimate and every figure derived from
/// it is labelled one.
#[derive(Debug, Clone, Serialize)]
pub struct JitModel {
    pub alu32: f64,
    pub alu64: f64,
    pub mul: f64,
    pub div: f64,
    pub ld_imm64: f64,
    pub ld_abs_ind: f64,
    pub load: f64,
    pub store: f64,
    pub atomic: f64,
    pub jmp32: f64,
    pub jmp64: f64,
    pub helper_call: f64,
    pub bpf_call: f64,
    pub exit: f64,
    /// Multiplied into the total before comparing with the limit: the uncertainty margin.
    pub margin: f64,
}

impl JitModel {
    /// Target instructions per BPF instruction for a typical packet-parsing mix (35 % 64-bit
    /// ALU, 25 % loads, 25 % 64-bit jumps, 10 % stores, 5 % LD_IMM64), for the planner's ops
    /// whose exact instructions are not known: an estimate.
    pub fn blended(&self) -> f64 {
        0.35 * self.alu64
            + 0.25 * self.load
            + 0.25 * self.jmp64
            + 0.10 * self.store
            + 0.05 * self.ld_imm64
    }
}

/// Throughput model of the target (planner input). Figures are modelled, never measured.
#[derive(Debug, Clone, Serialize)]
pub struct NicModel {
    /// Packet-processing cores the program runs on.
    pub cores: u32,
    pub clock_hz: f64,
    /// Target instructions retired per core per cycle on average, stalls included.
    pub efficiency: f64,
    /// Line rate in packets per second at 64-byte frames: no program goes faster.
    pub line_rate_pps: f64,
    /// A map lookup's cost in target-instruction equivalents (memory latency included).
    pub lookup_insns: f64,
    /// Where these numbers came from.
    pub source: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub name: &'static str,
    pub description: &'static str,
    /// False for `none`: nothing runs on a NIC.
    pub offload: bool,
    /// Allowed opcodes (all 256 codes; the second slot of LD_IMM64, code 0, is not checked).
    #[serde(skip)]
    pub opcodes: [bool; 256],
    /// Where the opcode table comes from.
    pub opcode_source: &'static str,
    /// The ISA v4 variants that reuse an allowed opcode with a non-zero `off` (sdiv/smod,
    /// movsx) are refused: the nfp JIT predates them and reads only the opcode.
    pub isa_v4_variants: bool,
    /// Atomic operations allowed (imm field of STX|ATOMIC); ADD without FETCH is 0x00.
    pub atomic_ops: Vec<i32>,
    pub helpers: Vec<HelperRule>,
    /// Where the helper list comes from.
    pub helper_source: &'static str,
    /// XDP return codes the target honours; others are turned into a drop.
    pub xdp_actions: Vec<u64>,
    pub map_types: Vec<u32>,
    /// Map types that may be referenced but stay on the host (perf event arrays are fed by
    /// firmware control messages).
    pub host_map_types: Vec<u32>,
    /// `map_flags` must be 0.
    pub map_flags_zero: bool,
    pub max_maps: Option<u32>,
    /// Total `max_entries` over all offloaded maps.
    pub max_total_entries: Option<u64>,
    pub max_key_size: Option<u32>,
    pub max_value_size: Option<u32>,
    /// round_up(key, 8) + round_up(value, 8) must not exceed this.
    pub max_elem_size: Option<u32>,
    /// Program length in target instructions (after [`JitModel`]).
    pub max_prog_len: u64,
    pub stack_max: u32,
    /// Largest packet offset a program may touch, where the firmware's limit is known.
    pub pkt_split_bound: Option<u32>,
    /// `xdp_md` fields (byte offsets) the program may read.
    pub ctx_reads: Vec<i16>,
    /// Whether stores straight into a map value (not through a helper) are allowed.
    pub direct_map_writes: bool,
    /// MUL operands and DIV dividends within u32, DIV divisors constant.
    pub narrow_mul_div: bool,
    pub bpf_to_bpf_calls: bool,
    pub jit: JitModel,
    pub nic: Option<NicModel>,
    /// Where the limits (lengths, sizes, stack) come from.
    pub limits_source: &'static str,
}

const ALU_CLASSES: [u8; 2] = [class::ALU, class::ALU64];

fn table(f: impl Fn(&mut [bool; 256])) -> [bool; 256] {
    let mut t = [false; 256];
    f(&mut t);
    t
}

/// The nfp's opcode table: jit.c `instr_cb[]` as `nfp_bpf_supported_opcode()` consults it
/// (verifier.c:nfp_verify_insn, "instruction %#02x not supported").
fn nfp_opcodes() -> [bool; 256] {
    table(|t| {
        // jit.c instr_cb: mov, xor, and, or, add, sub, mul, div, neg, lsh, rsh, arsh, for
        // ALU64 and ALU, register and immediate; no MOD anywhere.
        let ops = [
            alu::MOV,
            alu::XOR,
            alu::AND,
            alu::OR,
            alu::ADD,
            alu::SUB,
            alu::MUL,
            alu::DIV,
            alu::NEG,
            alu::LSH,
            alu::RSH,
            alu::ARSH,
        ];
        for c in ALU_CLASSES {
            for op in ops {
                t[(c | op) as usize] = true;
                t[(c | op | 0x08) as usize] = true;
            }
        }
        // jit.c: only BPF_ALU | BPF_END | BPF_X (to big endian); no BPF_K (to little endian)
        // and no ALU64 | END (ISA v4 bswap).
        t[(class::ALU | alu::END | 0x08) as usize] = true;
        // jit.c: LD_IMM64 and the legacy packet loads LD_ABS/LD_IND B/H/W
        t[0x18] = true;
        for sz in [0x00u8, 0x08, 0x10] {
            t[(class::LD | mode::ABS | sz) as usize] = true;
            t[(class::LD | mode::IND | sz) as usize] = true;
        }
        // jit.c: LDX|MEM, ST|MEM, STX|MEM of every size; no LDX|MEMSX (ISA v4)
        for sz in [0x00u8, 0x08, 0x10, 0x18] {
            t[(class::LDX | mode::MEM | sz) as usize] = true;
            t[(class::ST | mode::MEM | sz) as usize] = true;
            t[(class::STX | mode::MEM | sz) as usize] = true;
        }
        // jit.c: STX|ATOMIC W and DW (the old XADD encoding)
        t[(class::STX | mode::ATOMIC) as usize] = true;
        t[(class::STX | mode::ATOMIC | 0x18) as usize] = true;
        // jit.c: every conditional jump, JMP and JMP32, K and X; JA, CALL, EXIT for JMP only
        // (no JMP32 | JA, ISA v4 gotol)
        let conds = [
            jmp::JEQ,
            jmp::JGT,
            jmp::JGE,
            jmp::JSET,
            jmp::JNE,
            jmp::JSGT,
            jmp::JSGE,
            jmp::JLT,
            jmp::JLE,
            jmp::JSLT,
            jmp::JSLE,
        ];
        for c in [class::JMP, class::JMP32] {
            for op in conds {
                t[(c | op) as usize] = true;
                t[(c | op | 0x08) as usize] = true;
            }
        }
        t[(class::JMP | jmp::JA) as usize] = true;
        t[(class::JMP | jmp::CALL) as usize] = true;
        t[(class::JMP | jmp::EXIT) as usize] = true;
    })
}

fn nfp_helpers() -> Vec<HelperRule> {
    // verifier.c:nfp_bpf_check_helper_call: these seven ids and "unsupported function id"
    // for every other one.
    vec![
        HelperRule {
            id: helper::XDP_ADJUST_HEAD,
            name: "xdp_adjust_head",
            requires: "FW adjust_head capability with NFP_BPF_ADJUST_HEAD_NO_META",
            stack_args: false,
        },
        HelperRule {
            id: helper::XDP_ADJUST_TAIL,
            name: "xdp_adjust_tail",
            requires: "FW adjust_tail capability",
            stack_args: false,
        },
        HelperRule {
            id: helper::MAP_LOOKUP_ELEM,
            name: "map_lookup_elem",
            requires: "FW map_lookup helper; key on the stack, constant 4-byte-aligned offset",
            stack_args: true,
        },
        HelperRule {
            id: helper::MAP_UPDATE_ELEM,
            name: "map_update_elem",
            requires: "FW map_update helper; key and value on the stack",
            stack_args: true,
        },
        HelperRule {
            id: helper::MAP_DELETE_ELEM,
            name: "map_delete_elem",
            requires: "FW map_delete helper; key on the stack; not on ARRAY maps",
            stack_args: true,
        },
        HelperRule {
            id: helper::GET_PRANDOM_U32,
            name: "get_prandom_u32",
            requires: "FW random capability",
            stack_args: false,
        },
        HelperRule {
            id: helper::PERF_EVENT_OUTPUT,
            name: "perf_event_output",
            requires: "flags BPF_F_CURRENT_CPU; asynchronous on the NIC (events may be lost)",
            stack_args: false,
        },
    ]
}

/// Estimated NFP instructions per BPF instruction. ASSUMED figures, not measured: the NFP
/// datapath is 32-bit (so 64-bit ALU ops and compares take two or more), MUL is a multi-step
/// sequence and DIV a reciprocal multiplication (jit.c), memory accesses dispatch on the
/// pointer type, helper calls marshal arguments and branch into firmware.
fn nfp_jit() -> JitModel {
    JitModel {
        alu32: 1.0,
        alu64: 2.0,
        mul: 8.0,
        div: 16.0,
        ld_imm64: 2.0,
        ld_abs_ind: 6.0,
        load: 3.0,
        store: 3.0,
        atomic: 6.0,
        jmp32: 1.5,
        jmp64: 3.0,
        helper_call: 12.0,
        bpf_call: 6.0,
        exit: 2.0,
        margin: 1.25,
    }
}

pub fn nfp() -> Profile {
    Profile {
        name: "nfp",
        description: "Netronome Agilio (NFP-4000/6000) hardware XDP offload, from the nfp driver",
        offload: true,
        opcodes: nfp_opcodes(),
        opcode_source: "nfp/bpf/jit.c instr_cb[] via verifier.c:nfp_verify_insn",
        isa_v4_variants: false,
        // verifier.c:nfp_bpf_check_xadd / jit.c: only BPF_ADD, no BPF_FETCH
        atomic_ops: vec![0x00],
        helpers: nfp_helpers(),
        helper_source: "nfp/bpf/verifier.c:nfp_bpf_check_helper_call",
        // jit.c:nfp_outro_xdp: 0..3 honoured, anything larger (XDP_REDIRECT) is a drop
        xdp_actions: vec![0, 1, 2, 3],
        // kernel/bpf/offload.c:bpf_map_offload_map_alloc: only ARRAY and HASH become device
        // maps; PERF_EVENT_ARRAY is offload-neutral (bpf_map_offload_neutral)
        map_types: vec![map_type::ARRAY, map_type::HASH],
        host_map_types: vec![map_type::PERF_EVENT_ARRAY],
        // offload.c:nfp_bpf_map_alloc: "map_flags are not supported" unless 0
        map_flags_zero: true,
        // offload.c:nfp_bpf_map_alloc checks max_maps from the FW maps TLV; no public value
        max_maps: None,
        // Mizar: "sum of map entries on the NIC should be less than 3,072,000"
        max_total_entries: Some(3_072_000),
        max_key_size: Some(64),
        max_value_size: Some(64),
        // offload.c:nfp_bpf_map_alloc: round_up(key, 8) + round_up(value, 8) <= max_elem_sz;
        // Mizar and libkefir: 64 bytes per entry
        max_elem_size: Some(64),
        // NFP_NET_CFG_BPF_MAX_LEN (FW); Mizar: 2800 instructions
        max_prog_len: 2800,
        // NFP_NET_CFG_BPF_STACK_SZ * 64 (FW); ASSUMED 512 (the kernel's MAX_BPF_STACK)
        stack_max: 512,
        // verifier.c:nfp_bpf_finalize "beyond HW packet split boundary": INL_MTU*64-32 (FW);
        // no public default, so not enforced
        pkt_split_bound: None,
        // jit.c:mem_ldx_xdp / verifier: xdp_md.data (0) and data_end (4) only
        ctx_reads: vec![0, 4],
        // verifier.c:nfp_bpf_check_ptr "map writes not supported"
        direct_map_writes: false,
        // verifier.c:nfp_bpf_check_alu
        narrow_mul_div: true,
        // verifier.c:nfp_assign_subprog_idx_and_regs, nfp_bpf_get_stack_usage
        bpf_to_bpf_calls: true,
        jit: nfp_jit(),
        nic: Some(NicModel {
            cores: 50,
            clock_hz: 800e6,
            efficiency: 0.5,
            line_rate_pps: 59.52e6,
            lookup_insns: 60.0,
            source: "Netronome eBPF offload guide: 50 cores x 4 threads run eBPF; hXDP paper: \
                     800 MHz; 0.5 instructions/cycle/core ASSUMED (single-issue cores, threads \
                     hiding part of the memory latency); a map lookup costs as much as 60 \
                     instructions ASSUMED; 40GbE line rate at 64 B",
        }),
        limits_source: "Mizar offload_XDP design doc (2800 instructions, 3,072,000 entries, \
                        64 B per entry); stack 512 B ASSUMED; all firmware-reported on a real card",
    }
}

pub fn hxdp() -> Profile {
    Profile {
        name: "hxdp",
        description: "hXDP (OSDI'20) Sephirot VLIW core on an FPGA NIC: a model from the paper, \
                      not from a driver",
        offload: true,
        // the paper: Sephirot executes the eBPF ISA as compiled by clang (ISA v1-v3) INFERRED;
        // MOD included (ALU is complete in the paper's description)
        opcodes: table(|t| {
            for c in ALU_CLASSES {
                for op in 0..=0xc {
                    t[(c | (op << 4)) as usize] = true;
                    t[(c | (op << 4) | 0x08) as usize] = true;
                }
            }
            t[(class::ALU | alu::END) as usize] = true;
            t[(class::ALU | alu::END | 0x08) as usize] = true;
            t[0x18] = true;
            for sz in [0x00u8, 0x08, 0x10, 0x18] {
                t[(class::LDX | mode::MEM | sz) as usize] = true;
                t[(class::ST | mode::MEM | sz) as usize] = true;
                t[(class::STX | mode::MEM | sz) as usize] = true;
            }
            t[(class::STX | mode::ATOMIC) as usize] = true;
            t[(class::STX | mode::ATOMIC | 0x18) as usize] = true;
            for c in [class::JMP, class::JMP32] {
                for op in [1u8, 2, 3, 4, 5, 6, 7, 0xa, 0xb, 0xc, 0xd] {
                    t[(c | (op << 4)) as usize] = true;
                    t[(c | (op << 4) | 0x08) as usize] = true;
                }
            }
            t[(class::JMP | jmp::JA) as usize] = true;
            t[(class::JMP | jmp::CALL) as usize] = true;
            t[(class::JMP | jmp::EXIT) as usize] = true;
        }),
        opcode_source: "hXDP paper (Sephirot runs eBPF ISA v1-v3); INFERRED, no driver",
        isa_v4_variants: false,
        atomic_ops: vec![0x00],
        // INFERRED: the helpers of the programs the paper evaluates (xdp1/2, adjust_tail,
        // router_ipv4, tx_ip_tunnel, simple_firewall, Katran), which it runs in hardware
        helpers: [
            (helper::MAP_LOOKUP_ELEM, "map_lookup_elem"),
            (helper::MAP_UPDATE_ELEM, "map_update_elem"),
            (helper::MAP_DELETE_ELEM, "map_delete_elem"),
            (helper::XDP_ADJUST_HEAD, "xdp_adjust_head"),
            (helper::XDP_ADJUST_TAIL, "xdp_adjust_tail"),
            (helper::REDIRECT, "redirect"),
            (helper::REDIRECT_MAP, "redirect_map"),
            (helper::CSUM_DIFF, "csum_diff"),
            (helper::KTIME_GET_NS, "ktime_get_ns"),
        ]
        .into_iter()
        .map(|(id, name)| HelperRule {
            id,
            name,
            requires: "hardware helper (INFERRED from the paper's evaluated programs)",
            stack_args: false,
        })
        .collect(),
        helper_source: "hXDP paper's evaluated programs (INFERRED)",
        // the paper measures DROP, TX and redirect
        xdp_actions: vec![0, 1, 2, 3, 4],
        // the paper's maps module: array and hash in BRAM; devmap for redirect INFERRED
        map_types: vec![map_type::ARRAY, map_type::HASH, map_type::DEVMAP],
        host_map_types: vec![],
        map_flags_zero: false,
        max_maps: None,
        // BRAM is shared with other accelerators (paper): ASSUMED 65,536 entries in total
        max_total_entries: Some(65_536),
        max_key_size: Some(32),
        max_value_size: Some(64),
        max_elem_size: None,
        // ASSUMED instruction memory of 4096 VLIW rows
        max_prog_len: 4096,
        stack_max: 512,
        pkt_split_bound: None,
        ctx_reads: vec![0, 4, 8, 12, 16, 20],
        direct_map_writes: true,
        narrow_mul_div: false,
        bpf_to_bpf_calls: false,
        // the paper: VLIW code is 2-3x shorter than the eBPF program
        jit: JitModel {
            alu32: 0.4,
            alu64: 0.4,
            mul: 0.4,
            div: 0.4,
            ld_imm64: 0.4,
            ld_abs_ind: 0.4,
            load: 0.4,
            store: 0.4,
            atomic: 1.0,
            jmp32: 0.5,
            jmp64: 0.5,
            helper_call: 1.0,
            bpf_call: 1.0,
            exit: 0.5,
            margin: 1.25,
        },
        nic: Some(NicModel {
            cores: 1,
            clock_hz: 156.25e6,
            efficiency: 1.0,
            line_rate_pps: 59.52e6,
            lookup_insns: 2.0,
            source: "hXDP paper: one Sephirot core at 156.25 MHz, one VLIW row per cycle; \
                     NetFPGA-SUME 4x10GbE",
        }),
        limits_source: "hXDP paper; map and program limits ASSUMED",
    }
}

pub fn none() -> Profile {
    Profile {
        name: "none",
        description: "no offload target: everything runs on the host",
        offload: false,
        opcodes: [false; 256],
        opcode_source: "no NIC",
        isa_v4_variants: false,
        atomic_ops: vec![],
        helpers: vec![],
        helper_source: "no NIC",
        xdp_actions: vec![],
        map_types: vec![],
        host_map_types: vec![],
        map_flags_zero: true,
        max_maps: Some(0),
        max_total_entries: Some(0),
        max_key_size: Some(0),
        max_value_size: Some(0),
        max_elem_size: Some(0),
        max_prog_len: 0,
        stack_max: 0,
        pkt_split_bound: None,
        ctx_reads: vec![],
        direct_map_writes: false,
        narrow_mul_div: true,
        bpf_to_bpf_calls: false,
        jit: nfp_jit(),
        nic: None,
        limits_source: "no NIC",
    }
}

impl Profile {
    pub fn by_name(name: &str) -> Result<Profile, Error> {
        match name {
            "nfp" => Ok(nfp()),
            "hxdp" => Ok(hxdp()),
            "none" => Ok(none()),
            other => Err(Error::UnknownProfile(other.to_owned())),
        }
    }

    pub fn helper(&self, id: i32) -> Option<&HelperRule> {
        self.helpers.iter().find(|h| h.id == id)
    }

    pub fn opcode_allowed(&self, code: u8) -> bool {
        self.opcodes[code as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfp_opcode_table_matches_the_jit() {
        let p = nfp();
        // jit.c has no MOD, no END|K, no ALU64|END, no MEMSX, no JMP32|JA
        assert!(!p.opcode_allowed(class::ALU64 | alu::MOD));
        assert!(!p.opcode_allowed(class::ALU | alu::MOD | 0x08));
        assert!(!p.opcode_allowed(class::ALU | alu::END));
        assert!(!p.opcode_allowed(class::ALU64 | alu::END));
        assert!(!p.opcode_allowed(class::LDX | mode::MEMSX));
        assert!(!p.opcode_allowed(class::JMP32 | jmp::JA));
        assert!(!p.opcode_allowed(class::JMP32 | jmp::CALL));
        // and has these
        assert!(p.opcode_allowed(class::ALU64 | alu::DIV));
        assert!(p.opcode_allowed(class::ALU | alu::END | 0x08));
        assert!(p.opcode_allowed(class::STX | mode::ATOMIC | 0x18));
        assert!(p.opcode_allowed(class::JMP32 | jmp::JSET | 0x08));
        assert!(p.opcode_allowed(class::LD | mode::ABS | 0x08));
        assert!(p.opcode_allowed(0x18));
    }

    #[test]
    fn nfp_helpers_are_the_drivers_seven() {
        let p = nfp();
        let mut ids: Vec<i32> = p.helpers.iter().map(|h| h.id).collect();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3, 7, 25, 44, 65]);
        for missing in [
            helper::TAIL_CALL,
            helper::REDIRECT,
            helper::REDIRECT_MAP,
            helper::FIB_LOOKUP,
            helper::CSUM_DIFF,
            helper::KTIME_GET_NS,
            helper::XDP_ADJUST_META,
        ] {
            assert!(p.helper(missing).is_none(), "helper {missing}");
        }
    }

    #[test]
    fn nfp_maps_actions_and_limits() {
        let p = nfp();
        assert_eq!(p.map_types, vec![map_type::ARRAY, map_type::HASH]);
        assert_eq!(p.xdp_actions, vec![0, 1, 2, 3]);
        assert_eq!(p.ctx_reads, vec![0, 4]);
        assert!(!p.direct_map_writes);
        assert_eq!(p.max_elem_size, Some(64));
        assert_eq!(p.max_prog_len, 2800);
    }

    #[test]
    fn profiles_by_name() {
        for n in ["nfp", "hxdp", "none"] {
            assert_eq!(Profile::by_name(n).expect("known").name, n);
        }
        let e = Profile::by_name("bluefield").expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "unknown profile \"bluefield\" (known: nfp, hxdp, none)"
        );
        assert!(!none().offload);
    }
}
