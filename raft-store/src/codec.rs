//! One encoding for everything the store writes to disk: bincode 2 over serde, standard config.

use openraft::{ErrorSubject, ErrorVerb, StorageError, StorageIOError};
use serde::{de::DeserializeOwned, Serialize};

use crate::NodeId;

/// Encodes a value for storage.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
}

/// Decodes a value written by [`encode`]; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    if used != bytes.len() {
        return Err(bincode::error::DecodeError::OtherString(format!(
            "{} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(value)
}

/// Wraps any error as an openraft storage I/O error on `subject`.
pub fn storage_io<E: std::error::Error + 'static>(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    err: &E,
) -> StorageError<NodeId> {
    StorageError::IO {
        source: StorageIOError::new(subject, verb, openraft::AnyError::new(err)),
    }
}
