//! BPF instructions as the kernel defines them (include/uapi/linux/bpf.h, bpf_common.h):
//! decoding, the opcode fields a capability rule talks about, and helper names, so that a
//! report can say "helper bpf_fib_lookup (69)" rather than "call 69".

use serde::Serialize;

/// Instruction classes (the low three bits of the opcode).
pub mod class {
    pub const LD: u8 = 0x00;
    pub const LDX: u8 = 0x01;
    pub const ST: u8 = 0x02;
    pub const STX: u8 = 0x03;
    pub const ALU: u8 = 0x04;
    pub const JMP: u8 = 0x05;
    pub const JMP32: u8 = 0x06;
    pub const ALU64: u8 = 0x07;
}

/// Load/store modes (bits 5-7 for the LD/LDX/ST/STX classes).
pub mod mode {
    pub const IMM: u8 = 0x00;
    pub const ABS: u8 = 0x20;
    pub const IND: u8 = 0x40;
    pub const MEM: u8 = 0x60;
    pub const MEMSX: u8 = 0x80;
    pub const ATOMIC: u8 = 0xc0;
}

/// ALU operations (bits 4-7 for the ALU classes).
pub mod alu {
    pub const ADD: u8 = 0x00;
    pub const SUB: u8 = 0x10;
    pub const MUL: u8 = 0x20;
    pub const DIV: u8 = 0x30;
    pub const OR: u8 = 0x40;
    pub const AND: u8 = 0x50;
    pub const LSH: u8 = 0x60;
    pub const RSH: u8 = 0x70;
    pub const NEG: u8 = 0x80;
    pub const MOD: u8 = 0x90;
    pub const XOR: u8 = 0xa0;
    pub const MOV: u8 = 0xb0;
    pub const ARSH: u8 = 0xc0;
    pub const END: u8 = 0xd0;
}

/// Jump operations (bits 4-7 for the JMP classes).
pub mod jmp {
    pub const JA: u8 = 0x00;
    pub const JEQ: u8 = 0x10;
    pub const JGT: u8 = 0x20;
    pub const JGE: u8 = 0x30;
    pub const JSET: u8 = 0x40;
    pub const JNE: u8 = 0x50;
    pub const JSGT: u8 = 0x60;
    pub const JSGE: u8 = 0x70;
    pub const CALL: u8 = 0x80;
    pub const EXIT: u8 = 0x90;
    pub const JLT: u8 = 0xa0;
    pub const JLE: u8 = 0xb0;
    pub const JSLT: u8 = 0xc0;
    pub const JSLE: u8 = 0xd0;
}

/// Source operand flag: register (X) rather than immediate (K).
pub const SRC_X: u8 = 0x08;

/// `src_reg` of a call: a BPF-to-BPF call (pseudo call) rather than a helper.
pub const PSEUDO_CALL: u8 = 1;
/// `src_reg` of a call: a kernel function (kfunc).
pub const PSEUDO_KFUNC_CALL: u8 = 2;

/// One 8-byte instruction slot. `LD_IMM64` takes two slots; the second has opcode 0 and
/// carries the upper 32 bits of the immediate, and keeps its index, so that indices match
/// the kernel's (and the verifier log's) instruction numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// Decodes one little-endian slot (BPF objects for x86 and arm64 hosts are little-endian).
    pub fn decode(b: &[u8; 8]) -> Insn {
        Insn {
            code: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    pub fn class(&self) -> u8 {
        self.code & 0x07
    }

    /// Bits 3-7 of an ALU or JMP opcode without the source flag.
    pub fn op(&self) -> u8 {
        self.code & 0xf0
    }

    pub fn mode(&self) -> u8 {
        self.code & 0xe0
    }

    /// Access width in bytes of a load or store.
    pub fn size_bytes(&self) -> u32 {
        match self.code & 0x18 {
            0x00 => 4,
            0x08 => 2,
            0x10 => 1,
            _ => 8,
        }
    }

    pub fn src_is_reg(&self) -> bool {
        self.code & SRC_X != 0
    }

    pub fn is_ld_imm64(&self) -> bool {
        self.code == (class::LD | mode::IMM | 0x18)
    }

    pub fn is_alu(&self) -> bool {
        matches!(self.class(), class::ALU | class::ALU64)
    }

    pub fn is_jmp(&self) -> bool {
        matches!(self.class(), class::JMP | class::JMP32)
    }

    pub fn is_call(&self) -> bool {
        self.code == (class::JMP | jmp::CALL)
    }

    pub fn is_exit(&self) -> bool {
        self.code == (class::JMP | jmp::EXIT)
    }

    /// A conditional jump (not JA, CALL or EXIT).
    pub fn is_cond_jmp(&self) -> bool {
        self.is_jmp() && !matches!(self.op(), jmp::JA | jmp::CALL | jmp::EXIT)
    }

    /// A short mnemonic for reports ("alu64 mul x", "ldx w", "call"), enough to say which
    /// instruction a rule refused without a full disassembler.
    pub fn mnemonic(&self) -> String {
        let x = if self.src_is_reg() { "x" } else { "k" };
        match self.class() {
            class::ALU | class::ALU64 => {
                let w = if self.class() == class::ALU64 {
                    "alu64"
                } else {
                    "alu32"
                };
                let op = match self.op() {
                    alu::ADD => "add",
                    alu::SUB => "sub",
                    alu::MUL => "mul",
                    alu::DIV if self.off == 1 => "sdiv",
                    alu::DIV => "div",
                    alu::OR => "or",
                    alu::AND => "and",
                    alu::LSH => "lsh",
                    alu::RSH => "rsh",
                    alu::NEG => "neg",
                    alu::MOD if self.off == 1 => "smod",
                    alu::MOD => "mod",
                    alu::XOR => "xor",
                    alu::MOV if self.off != 0 => "movsx",
                    alu::MOV => "mov",
                    alu::ARSH => "arsh",
                    alu::END => {
                        return match (self.class(), self.src_is_reg()) {
                            (class::ALU64, _) => format!("bswap{}", self.imm),
                            (_, true) => format!("be{}", self.imm),
                            _ => format!("le{}", self.imm),
                        }
                    }
                    _ => "?",
                };
                format!("{w} {op} {x}")
            }
            class::JMP | class::JMP32 => {
                let w = if self.class() == class::JMP {
                    "jmp"
                } else {
                    "jmp32"
                };
                let op = match self.op() {
                    jmp::JA => "ja",
                    jmp::JEQ => "jeq",
                    jmp::JGT => "jgt",
                    jmp::JGE => "jge",
                    jmp::JSET => "jset",
                    jmp::JNE => "jne",
                    jmp::JSGT => "jsgt",
                    jmp::JSGE => "jsge",
                    jmp::CALL => "call",
                    jmp::EXIT => "exit",
                    jmp::JLT => "jlt",
                    jmp::JLE => "jle",
                    jmp::JSLT => "jslt",
                    jmp::JSLE => "jsle",
                    _ => "?",
                };
                format!("{w} {op} {x}")
            }
            c => {
                let cls = match c {
                    class::LD => "ld",
                    class::LDX => "ldx",
                    class::ST => "st",
                    _ => "stx",
                };
                let m = match self.mode() {
                    mode::IMM => "imm",
                    mode::ABS => "abs",
                    mode::IND => "ind",
                    mode::MEM => "mem",
                    mode::MEMSX => "memsx",
                    mode::ATOMIC => "atomic",
                    _ => "?",
                };
                let sz = match self.code & 0x18 {
                    0x00 => "w",
                    0x08 => "h",
                    0x10 => "b",
                    _ => "dw",
                };
                format!("{cls} {m} {sz}")
            }
        }
    }
}

/// Decodes a section's bytes into slots. A trailing partial slot means the section is not
/// BPF code; the caller reports it.
pub fn decode_all(bytes: &[u8]) -> Option<Vec<Insn>> {
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| Insn::decode(c.try_into().expect("chunks of 8")))
            .collect(),
    )
}

/// Helper function ids of include/uapi/linux/bpf.h (`___BPF_FUNC_MAPPER`) that reports name;
/// the numbers are ABI and never change.
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const TRACE_PRINTK: i32 = 6;
    pub const GET_PRANDOM_U32: i32 = 7;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const L3_CSUM_REPLACE: i32 = 10;
    pub const L4_CSUM_REPLACE: i32 = 11;
    pub const TAIL_CALL: i32 = 12;
    pub const REDIRECT: i32 = 23;
    pub const PERF_EVENT_OUTPUT: i32 = 25;
    pub const CSUM_DIFF: i32 = 28;
    pub const XDP_ADJUST_HEAD: i32 = 44;
    pub const REDIRECT_MAP: i32 = 51;
    pub const XDP_ADJUST_META: i32 = 54;
    pub const FIB_LOOKUP: i32 = 69;
    pub const XDP_ADJUST_TAIL: i32 = 65;
    pub const SPIN_LOCK: i32 = 93;
    pub const KTIME_GET_BOOT_NS: i32 = 125;
    pub const RINGBUF_OUTPUT: i32 = 130;
    pub const KTIME_GET_COARSE_NS: i32 = 160;

    /// The helper's name without the `bpf_` prefix, where the report knows it.
    pub fn name(id: i32) -> Option<&'static str> {
        Some(match id {
            1 => "map_lookup_elem",
            2 => "map_update_elem",
            3 => "map_delete_elem",
            4 => "probe_read",
            5 => "ktime_get_ns",
            6 => "trace_printk",
            7 => "get_prandom_u32",
            8 => "get_smp_processor_id",
            9 => "skb_store_bytes",
            10 => "l3_csum_replace",
            11 => "l4_csum_replace",
            12 => "tail_call",
            13 => "clone_redirect",
            14 => "get_current_pid_tgid",
            23 => "redirect",
            25 => "perf_event_output",
            28 => "csum_diff",
            44 => "xdp_adjust_head",
            51 => "redirect_map",
            54 => "xdp_adjust_meta",
            65 => "xdp_adjust_tail",
            69 => "fib_lookup",
            93 => "spin_lock",
            94 => "spin_unlock",
            125 => "ktime_get_boot_ns",
            130 => "ringbuf_output",
            131 => "ringbuf_reserve",
            132 => "ringbuf_submit",
            160 => "ktime_get_coarse_ns",
            _ => return None,
        })
    }

    /// "bpf_fib_lookup (69)" or "helper 200" for one the table does not name.
    pub fn describe(id: i32) -> String {
        match name(id) {
            Some(n) => format!("bpf_{n} ({id})"),
            None => format!("helper {id}"),
        }
    }
}

/// Map types of include/uapi/linux/bpf.h (`enum bpf_map_type`), ABI numbers.
pub mod map_type {
    pub const HASH: u32 = 1;
    pub const ARRAY: u32 = 2;
    pub const PROG_ARRAY: u32 = 3;
    pub const PERF_EVENT_ARRAY: u32 = 4;
    pub const PERCPU_HASH: u32 = 5;
    pub const PERCPU_ARRAY: u32 = 6;
    pub const LRU_HASH: u32 = 9;
    pub const LPM_TRIE: u32 = 11;
    pub const DEVMAP: u32 = 14;
    pub const CPUMAP: u32 = 16;
    pub const XSKMAP: u32 = 17;
    pub const RINGBUF: u32 = 27;

    pub fn name(t: u32) -> &'static str {
        match t {
            0 => "unspec",
            1 => "hash",
            2 => "array",
            3 => "prog_array",
            4 => "perf_event_array",
            5 => "percpu_hash",
            6 => "percpu_array",
            7 => "stack_trace",
            8 => "cgroup_array",
            9 => "lru_hash",
            10 => "lru_percpu_hash",
            11 => "lpm_trie",
            12 => "array_of_maps",
            13 => "hash_of_maps",
            14 => "devmap",
            15 => "sockmap",
            16 => "cpumap",
            17 => "xskmap",
            18 => "sockhash",
            25 => "devmap_hash",
            27 => "ringbuf",
            _ => "other",
        }
    }
}

/// XDP return codes (`enum xdp_action`).
pub fn xdp_action_name(code: u64) -> &'static str {
    match code {
        0 => "XDP_ABORTED",
        1 => "XDP_DROP",
        2 => "XDP_PASS",
        3 => "XDP_TX",
        4 => "XDP_REDIRECT",
        _ => "not an XDP action",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_fields_little_endian() {
        // r1 = *(u32 *)(r2 + 4): ldx w, dst 1, src 2, off 4
        let i = Insn::decode(&[0x61, 0x21, 4, 0, 0, 0, 0, 0]);
        assert_eq!((i.class(), i.dst, i.src, i.off), (class::LDX, 1, 2, 4));
        assert_eq!(i.size_bytes(), 4);
        assert_eq!(i.mnemonic(), "ldx mem w");
        let call = Insn::decode(&[0x85, 0, 0, 0, 69, 0, 0, 0]);
        assert!(call.is_call());
        assert_eq!(helper::describe(call.imm), "bpf_fib_lookup (69)");
        assert_eq!(
            Insn::decode(&[0x97, 1, 0, 0, 3, 0, 0, 0]).mnemonic(),
            "alu64 mod k"
        );
    }

    #[test]
    fn partial_slot_is_not_code() {
        assert!(decode_all(&[0; 12]).is_none());
        assert_eq!(decode_all(&[0; 16]).map(|v| v.len()), Some(2));
    }
}
