//! The one error type of every importer. Each variant names the file it is about, because an
//! operator feeding a directory of hundreds of dumps needs to know which one to look at.

use crate::event::Rank;
use std::io;
use std::path::PathBuf;

/// Why a dump or a RAS report could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },

    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },

    #[error("{}: neither a pickle nor a JSON document", path.display())]
    UnknownFormat { path: PathBuf },

    #[error("{}: truncated pickle (the data ends before the pickle's stop mark)", path.display())]
    TruncatedPickle { path: PathBuf },

    #[error("{}: bad pickle: {detail}", path.display())]
    Pickle { path: PathBuf, detail: String },

    #[error("{}: bad JSON: {detail}", path.display())]
    Json { path: PathBuf, detail: String },

    #[error("{}: the dump holds {found}, not a dict", path.display())]
    NotADict { path: PathBuf, found: &'static str },

    #[error("{}: missing key {key}", path.display())]
    MissingKey { path: PathBuf, key: String },

    #[error("{}: unsupported flight recorder version {version} (only major version 2 is known)", path.display())]
    UnsupportedVersion { path: PathBuf, version: String },

    /// A value of the wrong type or out of range; `detail` says where, e.g. "entry 3 field
    /// time_created_ns is not an integer".
    #[error("{}: {detail}", path.display())]
    Invalid { path: PathBuf, detail: String },

    #[error("{}: cannot tell the rank, as the file name does not end in digits and the dump has no rank key", path.display())]
    NoRank { path: PathBuf },

    #[error("{}: rank {rank} was already read from {}", second.display(), first.display())]
    DuplicateRank {
        rank: Rank,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("{}: the directory holds no flight recorder dumps", path.display())]
    EmptyDir { path: PathBuf },

    /// A RAS report line (1-based) that does not have the documented shape.
    #[error("{}: line {line}: {detail}", path.display())]
    RasLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },
}

impl ImportError {
    /// Shorthand for [`ImportError::Invalid`].
    pub(crate) fn invalid(path: &std::path::Path, detail: impl Into<String>) -> Self {
        ImportError::Invalid {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}
