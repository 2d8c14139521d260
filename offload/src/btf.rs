//! Just enough BTF (Documentation/bpf/btf.rst) to read map definitions out of a `.maps`
//! section: libbpf-style maps are zero-filled in the section and described only by BTF
//! (`__uint(type, X)` is a pointer to an array of X elements, `__type(key, T)` a pointer to
//! T), so without BTF a checker cannot know a map's type or sizes.

use crate::error::Error;

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
enum Kind {
    /// Types whose size is in the header (INT, STRUCT, UNION, ENUM, FLOAT, ENUM64).
    Sized(u32),
    Ptr,
    Array {
        elem: u32,
        nelems: u32,
    },
    /// TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG: the same type under another name.
    Alias(u32),
    Struct {
        members: Vec<(String, u32)>,
    },
    Var {
        ty: u32,
    },
    Datasec {
        vars: Vec<(u32, u32)>,
    },
    Other,
}

#[derive(Debug, Clone)]
struct Type {
    name: String,
    ptr_to: u32,
    kind: Kind,
}

/// A map definition as BTF declares it; fields the definition omits are 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BtfMapDef {
    pub name: String,
    /// Byte offset of the definition in `.maps`: the relocation's symbol value points here.
    pub offset: u32,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
}

/// Parsed type section of one object's `.BTF`.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
}

/// One `.BTF.ext` line-info record: the source line an instruction was compiled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineInfo {
    /// Instruction slot within its section.
    pub insn: usize,
    pub file: String,
    pub line: u32,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, Error> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or(Error::Btf("a type record runs past the end of the section"))
}

fn str_at(strs: &[u8], off: u32) -> String {
    let start = off as usize;
    match strs.get(start..) {
        Some(rest) => {
            let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end]).into_owned()
        }
        None => String::new(),
    }
}

impl Btf {
    pub fn parse(data: &[u8]) -> Result<Btf, Error> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            return Err(Error::Btf(
                "the .BTF section has no little-endian BTF header",
            ));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_b = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(Error::Btf("the type section lies outside .BTF"))?;
        let strs = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(Error::Btf("the string section lies outside .BTF"))?;

        // id 0 is void
        let mut types = vec![Type {
            name: String::new(),
            ptr_to: 0,
            kind: Kind::Other,
        }];
        let mut p = 0usize;
        while p < types_b.len() {
            let name = str_at(strs, u32_at(types_b, p)?);
            let info = u32_at(types_b, p + 4)?;
            let size_or_type = u32_at(types_b, p + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            p += 12;
            let k = match kind {
                KIND_INT => {
                    p += 4;
                    Kind::Sized(size_or_type)
                }
                KIND_PTR => Kind::Ptr,
                KIND_ARRAY => {
                    let elem = u32_at(types_b, p)?;
                    let nelems = u32_at(types_b, p + 8)?;
                    p += 12;
                    Kind::Array { elem, nelems }
                }
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let mname = str_at(strs, u32_at(types_b, p)?);
                        let mty = u32_at(types_b, p + 4)?;
                        members.push((mname, mty));
                        p += 12;
                    }
                    if kind == KIND_STRUCT {
                        Kind::Struct { members }
                    } else {
                        Kind::Sized(size_or_type)
                    }
                }
                KIND_ENUM => {
                    p += 8 * vlen;
                    Kind::Sized(size_or_type)
                }
                KIND_ENUM64 => {
                    p += 12 * vlen;
                    Kind::Sized(size_or_type)
                }
                KIND_FLOAT => Kind::Sized(size_or_type),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Kind::Alias(size_or_type)
                }
                KIND_FUNC_PROTO => {
                    p += 8 * vlen;
                    Kind::Other
                }
                KIND_VAR => {
                    p += 4;
                    Kind::Var { ty: size_or_type }
                }
                KIND_DATASEC => {
                    let mut vars = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        vars.push((u32_at(types_b, p)?, u32_at(types_b, p + 4)?));
                        p += 12;
                    }
                    Kind::Datasec { vars }
                }
                KIND_DECL_TAG => {
                    p += 4;
                    Kind::Other
                }
                // FWD (7) and FUNC (12) have no trailing data
                7 | 12 => Kind::Other,
                _ => return Err(Error::Btf("a BTF type of an unknown kind")),
            };
            types.push(Type {
                name,
                ptr_to: size_or_type,
                kind: k,
            });
        }
        Ok(Btf {
            types,
            strings: strs.to_vec(),
        })
    }

    /// Line info of `.BTF.ext` (Documentation/bpf/btf.rst, "BTF.ext section"), per code
    /// section name, sorted by instruction. A malformed or absent table gives nothing: line
    /// numbers only decorate a report.
    pub fn line_info(&self, ext: &[u8]) -> std::collections::HashMap<String, Vec<LineInfo>> {
        let mut out = std::collections::HashMap::new();
        if ext.len() < 32 || u16::from_le_bytes([ext[0], ext[1]]) != MAGIC {
            return out;
        }
        let Ok(hdr_len) = u32_at(ext, 4) else {
            return out;
        };
        let (Ok(off), Ok(len)) = (u32_at(ext, 16), u32_at(ext, 20)) else {
            return out;
        };
        let start = hdr_len as usize + off as usize;
        let Some(sec) = ext.get(start..start + len as usize) else {
            return out;
        };
        let Ok(rec) = u32_at(sec, 0) else { return out };
        let rec = rec as usize;
        if rec < 16 {
            return out;
        }
        let mut p = 4usize;
        while p + 8 <= sec.len() {
            let (Ok(name), Ok(n)) = (u32_at(sec, p), u32_at(sec, p + 4)) else {
                break;
            };
            p += 8;
            let name = str_at(&self.strings, name);
            let mut v: Vec<LineInfo> = Vec::new();
            for _ in 0..n {
                let (Ok(insn_off), Ok(file), Ok(lc)) =
                    (u32_at(sec, p), u32_at(sec, p + 4), u32_at(sec, p + 12))
                else {
                    return out;
                };
                let file = str_at(&self.strings, file);
                let file = file.rsplit('/').next().unwrap_or("").to_owned();
                v.push(LineInfo {
                    insn: insn_off as usize / 8,
                    file,
                    line: lc >> 10,
                });
                p += rec;
            }
            v.sort_by_key(|l| l.insn);
            out.insert(name, v);
        }
        out
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get(id as usize)
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.get(id).map(|t| &t.kind) {
                Some(Kind::Alias(next)) => id = *next,
                _ => break,
            }
        }
        id
    }

    /// The size in bytes of a type, where it has one.
    pub fn size_of(&self, id: u32) -> Option<u32> {
        let id = self.resolve(id);
        match &self.get(id)?.kind {
            Kind::Sized(n) => Some(*n),
            Kind::Ptr => Some(8),
            Kind::Array { elem, nelems } => self.size_of(*elem).map(|s| s * nelems),
            // a struct's size is in the header word kept as ptr_to
            Kind::Struct { .. } => self.types.get(id as usize).map(|t| t.ptr_to),
            _ => None,
        }
    }

    /// The map definitions of the `.maps` DATASEC, in section order.
    pub fn maps(&self) -> Vec<BtfMapDef> {
        let mut out = Vec::new();
        for t in &self.types {
            let Kind::Datasec { vars } = &t.kind else {
                continue;
            };
            if t.name != ".maps" {
                continue;
            }
            for &(var_id, offset) in vars {
                let Some(var) = self.get(var_id) else {
                    continue;
                };
                let Kind::Var { ty } = var.kind else { continue };
                let sid = self.resolve(ty);
                let Some(Kind::Struct { members }) = self.get(sid).map(|t| &t.kind) else {
                    continue;
                };
                let mut def = BtfMapDef {
                    name: var.name.clone(),
                    offset,
                    ..BtfMapDef::default()
                };
                for (mname, mty) in members {
                    // every member is a pointer: to an array whose length is the number
                    // (__uint) or to the key/value type (__type)
                    let Some(m) = self.get(self.resolve(*mty)) else {
                        continue;
                    };
                    if !matches!(m.kind, Kind::Ptr) {
                        continue;
                    }
                    let target = self.resolve(m.ptr_to);
                    let number = match self.get(target).map(|t| &t.kind) {
                        Some(Kind::Array { nelems, .. }) => Some(*nelems),
                        _ => None,
                    };
                    match (mname.as_str(), number) {
                        ("type", Some(n)) => def.map_type = n,
                        ("max_entries", Some(n)) => def.max_entries = n,
                        ("key_size", Some(n)) => def.key_size = n,
                        ("value_size", Some(n)) => def.value_size = n,
                        ("map_flags", Some(n)) => def.map_flags = n,
                        ("key", _) => def.key_size = self.size_of(target).unwrap_or(0),
                        ("value", _) => def.value_size = self.size_of(target).unwrap_or(0),
                        _ => {}
                    }
                }
                out.push(def);
            }
        }
        out.sort_by_key(|d| d.offset);
        out
    }
}
