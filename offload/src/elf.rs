//! A compiled BPF object as the checker needs it: its programs (one per function symbol in a
//! program section, with `.text` subprograms appended the way libbpf links them), the maps
//! they reference through relocations, and the call edges between functions.
//!
//! Maps come from `.maps` with BTF (what this project's clang/libbpf headers emit), from a
//! legacy `maps` section of `struct bpf_map_def`s, or from global data sections (`.rodata`,
//! `.data`, `.bss`), which libbpf turns into one-element ARRAY maps.

use std::collections::{BTreeMap, HashMap};

use object::{
    Architecture, Object as _, ObjectSection as _, ObjectSymbol as _, RelocationFlags,
    RelocationTarget, SectionIndex, SectionKind, SymbolKind,
};
use serde::Serialize;

use crate::btf::{Btf, LineInfo};
use crate::error::Error;
use crate::insn::{self, Insn};

/// Where a map's definition came from; a report says so, because only BTF and legacy
/// definitions state the type the program asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MapOrigin {
    Btf,
    Legacy,
    /// A global data section that libbpf loads as a one-element ARRAY.
    GlobalData,
    /// A `.maps` symbol with no BTF to describe it: type and sizes unknown.
    Undescribed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapDef {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub origin: MapOrigin,
}

/// A function symbol's instruction range inside its program's instruction vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Function {
    pub name: String,
    pub start: usize,
    pub end: usize,
}

#[derive(Debug, Clone)]
pub struct Program {
    /// ELF section, e.g. `xdp` or `xdp.frags`: libbpf derives the program type from it.
    pub section: String,
    /// Entry function's symbol name.
    pub name: String,
    /// Index of the entry instruction.
    pub entry: usize,
    /// The section's slots, then `.text`'s when the program calls into it.
    pub insns: Vec<Insn>,
    pub functions: Vec<Function>,
    /// `LD_IMM64` slot -> index into [`Object::maps`].
    pub map_refs: HashMap<usize, usize>,
    /// BPF-to-BPF call slot -> target slot.
    pub calls: HashMap<usize, usize>,
    /// Source lines from `.BTF.ext` (when compiled with -g), sorted by slot.
    pub lines: Vec<LineInfo>,
}

impl Program {
    /// The source line `idx` was compiled from: the nearest line record at or before it.
    pub fn line_at(&self, idx: usize) -> Option<&LineInfo> {
        let i = self.lines.partition_point(|l| l.insn <= idx);
        i.checked_sub(1).map(|i| &self.lines[i])
    }

    /// The function whose range holds `idx`.
    pub fn function_at(&self, idx: usize) -> Option<&Function> {
        self.functions
            .iter()
            .find(|f| f.start <= idx && idx < f.end)
    }

    pub fn is_xdp(&self) -> bool {
        self.section == "xdp"
            || self.section.starts_with("xdp.")
            || self.section.starts_with("xdp/")
    }
}

#[derive(Debug, Clone)]
pub struct Object {
    pub programs: Vec<Program>,
    pub maps: Vec<MapDef>,
}

/// bpf_map_def of the legacy `maps` section: five u32s (some loaders append more fields,
/// which the symbol's size then covers).
const LEGACY_DEF_MIN: usize = 20;
/// R_BPF_64_64: the map (or global data) an `LD_IMM64` loads.
const R_BPF_64_64: u32 = 1;
/// BPF_F_RDONLY_PROG | BPF_F_MMAPABLE: what libbpf gives `.rodata`'s map.
const RODATA_FLAGS: u32 = 0x80 | 0x400;
/// BPF_F_MMAPABLE: what libbpf gives `.data`'s and `.bss`'s maps.
const DATA_FLAGS: u32 = 0x400;

fn is_data_section(name: &str) -> bool {
    name == ".rodata"
        || name == ".data"
        || name == ".bss"
        || name.starts_with(".rodata.")
        || name.starts_with(".data.")
}

impl Object {
    pub fn parse(data: &[u8]) -> Result<Object, Error> {
        let file = object::File::parse(data).map_err(|e| Error::NotElf(e.to_string()))?;
        if !matches!(file, object::File::Elf64(_) | object::File::Elf32(_)) {
            return Err(Error::NotElf("another object format".into()));
        }
        if file.architecture() != Architecture::Bpf {
            return Err(Error::NotBpf(format!("{:?}", file.architecture())));
        }
        let sec_name = |idx: SectionIndex| -> String {
            file.section_by_index(idx)
                .ok()
                .and_then(|s| s.name().ok().map(str::to_owned))
                .unwrap_or_default()
        };

        // ---- maps ----
        let btf = file
            .section_by_name(".BTF")
            .and_then(|s| s.data().ok())
            .map(Btf::parse)
            .transpose()?;
        let btf_maps = btf.as_ref().map(Btf::maps).unwrap_or_default();
        let line_info = match (
            &btf,
            file.section_by_name(".BTF.ext").and_then(|s| s.data().ok()),
        ) {
            (Some(b), Some(ext)) => b.line_info(ext),
            _ => HashMap::new(),
        };
        let mut maps: Vec<MapDef> = Vec::new();
        // (section index, symbol value) -> map index
        let mut map_at: HashMap<(SectionIndex, u64), usize> = HashMap::new();
        let mut data_sections: HashMap<SectionIndex, usize> = HashMap::new();
        for sym in file.symbols() {
            let Some(si) = sym.section_index() else {
                continue;
            };
            let sname = sec_name(si);
            let name = sym.name().unwrap_or("").to_owned();
            if sname == ".maps" && sym.kind() == SymbolKind::Data {
                // by name: clang leaves the DATASEC offsets for libbpf to fix up
                let def = btf_maps.iter().find(|d| d.name == name);
                let m = match def {
                    Some(d) => MapDef {
                        name,
                        map_type: d.map_type,
                        key_size: d.key_size,
                        value_size: d.value_size,
                        max_entries: d.max_entries,
                        map_flags: d.map_flags,
                        origin: MapOrigin::Btf,
                    },
                    None => MapDef {
                        name,
                        map_type: 0,
                        key_size: 0,
                        value_size: 0,
                        max_entries: 0,
                        map_flags: 0,
                        origin: MapOrigin::Undescribed,
                    },
                };
                map_at.insert((si, sym.address()), maps.len());
                maps.push(m);
            } else if (sname == "maps" || sname.starts_with("maps/"))
                && sym.kind() == SymbolKind::Data
            {
                let sec = file
                    .section_by_index(si)
                    .map_err(|e| Error::Elf(e.to_string()))?;
                let bytes = sec.data().map_err(|e| Error::Elf(e.to_string()))?;
                let off = sym.address() as usize;
                let def = bytes
                    .get(off..off + LEGACY_DEF_MIN)
                    .ok_or_else(|| Error::Elf(format!("map {name} lies outside its section")))?;
                let w = |i: usize| u32::from_le_bytes(def[i * 4..i * 4 + 4].try_into().expect("4"));
                map_at.insert((si, sym.address()), maps.len());
                maps.push(MapDef {
                    name,
                    map_type: w(0),
                    key_size: w(1),
                    value_size: w(2),
                    max_entries: w(3),
                    map_flags: w(4),
                    origin: MapOrigin::Legacy,
                });
            }
        }
        for sec in file.sections() {
            let name = sec.name().unwrap_or("");
            if is_data_section(name) {
                data_sections.insert(sec.index(), maps.len());
                maps.push(MapDef {
                    name: name.to_owned(),
                    map_type: insn::map_type::ARRAY,
                    key_size: 4,
                    value_size: sec.size() as u32,
                    max_entries: 1,
                    map_flags: if name.starts_with(".rodata") {
                        RODATA_FLAGS
                    } else {
                        DATA_FLAGS
                    },
                    origin: MapOrigin::GlobalData,
                });
            }
        }

        // ---- code sections ----
        struct Code {
            index: SectionIndex,
            name: String,
            insns: Vec<Insn>,
        }
        let mut codes: Vec<Code> = Vec::new();
        for sec in file.sections() {
            let name = sec.name().unwrap_or("").to_owned();
            if sec.kind() != SectionKind::Text || sec.size() == 0 {
                continue;
            }
            let bytes = sec.data().map_err(|e| Error::Elf(e.to_string()))?;
            let insns = insn::decode_all(bytes).ok_or_else(|| Error::BadCode(name.clone()))?;
            codes.push(Code {
                index: sec.index(),
                name,
                insns,
            });
        }
        let text = codes.iter().find(|c| c.name == ".text");
        // function symbols per section, by start slot
        let mut funcs: HashMap<SectionIndex, BTreeMap<usize, (String, usize, bool)>> =
            HashMap::new();
        for sym in file.symbols() {
            if sym.kind() != SymbolKind::Text {
                continue;
            }
            let Some(si) = sym.section_index() else {
                continue;
            };
            let start = (sym.address() / 8) as usize;
            let len = (sym.size() / 8) as usize;
            funcs.entry(si).or_default().insert(
                start,
                (sym.name().unwrap_or("?").to_owned(), len, sym.is_global()),
            );
        }

        let mut programs = Vec::new();
        for code in codes.iter().filter(|c| c.name != ".text") {
            let mut insns = code.insns.clone();
            let text_base = insns.len();
            if let Some(t) = text {
                insns.extend_from_slice(&t.insns);
            }
            let mut functions = Vec::new();
            let mut add_funcs = |si: SectionIndex, base: usize, total: usize| {
                if let Some(fs) = funcs.get(&si) {
                    for (&start, (name, len, _)) in fs {
                        let end = if *len == 0 { total } else { start + len };
                        functions.push(Function {
                            name: name.clone(),
                            start: base + start,
                            end: base + end,
                        });
                    }
                }
            };
            add_funcs(code.index, 0, code.insns.len());
            if let Some(t) = text {
                add_funcs(t.index, text_base, t.insns.len());
            }
            let mut map_refs = HashMap::new();
            let mut calls = HashMap::new();
            let mut relocate = |si: SectionIndex, base: usize| -> Result<(), Error> {
                let sec = file
                    .section_by_index(si)
                    .map_err(|e| Error::Elf(e.to_string()))?;
                for (off, rel) in sec.relocations() {
                    let slot = base + (off / 8) as usize;
                    let RelocationTarget::Symbol(sym_idx) = rel.target() else {
                        continue;
                    };
                    let sym = file
                        .symbol_by_index(sym_idx)
                        .map_err(|e| Error::Elf(e.to_string()))?;
                    let Some(tsec) = sym.section_index() else {
                        continue;
                    };
                    let Some(i) = insns.get(slot).copied() else {
                        continue;
                    };
                    let r_type = match rel.flags() {
                        RelocationFlags::Elf { r_type } => r_type,
                        _ => 0,
                    };
                    if i.is_call() && i.src == insn::PSEUDO_CALL {
                        let tbase = if Some(tsec) == text.map(|t| t.index) {
                            text_base
                        } else if tsec == si {
                            base
                        } else {
                            continue;
                        };
                        let target =
                            tbase as i64 + (sym.address() / 8) as i64 + i64::from(i.imm) + 1;
                        calls.insert(slot, target.max(0) as usize);
                    } else if i.is_ld_imm64() && r_type == R_BPF_64_64 {
                        if let Some(&m) = map_at.get(&(tsec, sym.address())) {
                            map_refs.insert(slot, m);
                        } else if let Some(&m) = data_sections.get(&tsec) {
                            map_refs.insert(slot, m);
                        }
                    }
                }
                Ok(())
            };
            relocate(code.index, 0)?;
            if let Some(t) = text {
                relocate(t.index, text_base)?;
            }
            // calls without relocations: relative to the next slot
            for (idx, i) in insns.iter().enumerate() {
                if i.is_call() && i.src == insn::PSEUDO_CALL && !calls.contains_key(&idx) {
                    let target = idx as i64 + i64::from(i.imm) + 1;
                    if target >= 0 && (target as usize) < insns.len() {
                        calls.insert(idx, target as usize);
                    }
                }
            }
            // one program per global function in the section; a section without symbols is
            // one program from its first slot
            let entries: Vec<(String, usize)> = match funcs.get(&code.index) {
                Some(fs) if fs.values().any(|f| f.2) => fs
                    .iter()
                    .filter(|(_, f)| f.2)
                    .map(|(&s, (n, _, _))| (n.clone(), s))
                    .collect(),
                _ => vec![(code.name.clone(), 0)],
            };
            if functions.is_empty() {
                functions.push(Function {
                    name: code.name.clone(),
                    start: 0,
                    end: code.insns.len(),
                });
            }
            let mut lines: Vec<LineInfo> = line_info.get(&code.name).cloned().unwrap_or_default();
            if text.is_some() {
                lines.extend(
                    line_info
                        .get(".text")
                        .into_iter()
                        .flatten()
                        .map(|l| LineInfo {
                            insn: l.insn + text_base,
                            ..l.clone()
                        }),
                );
            }
            // line 0: code the compiler made up, attributed to no line
            lines.retain(|l| l.line != 0);
            lines.sort_by_key(|l| l.insn);
            for (name, entry) in entries {
                programs.push(Program {
                    section: code.name.clone(),
                    name,
                    entry,
                    insns: insns.clone(),
                    functions: functions.clone(),
                    map_refs: map_refs.clone(),
                    calls: calls.clone(),
                    lines: lines.clone(),
                });
            }
        }
        if programs.is_empty() {
            return Err(Error::NoPrograms);
        }
        Ok(Object { programs, maps })
    }
}
