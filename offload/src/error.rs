//! The crate's one error type: each variant reads as one sentence after the file name, so the
//! CLI can print "FILE: <error>" and stop.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("could not read the file: {0}")]
    Read(#[from] std::io::Error),
    #[error("not an ELF object ({0})")]
    NotElf(String),
    #[error("an ELF object, but not a BPF one (machine {0})")]
    NotBpf(String),
    #[error("a BPF object with no program sections (no executable section holds code)")]
    NoPrograms,
    #[error("section {0} is not a whole number of 8-byte BPF instructions")]
    BadCode(String),
    #[error("malformed BTF: {0}")]
    Btf(&'static str),
    #[error("unknown profile {0:?} (known: nfp, hxdp, none)")]
    UnknownProfile(String),
    #[error("malformed ELF: {0}")]
    Elf(String),
}
