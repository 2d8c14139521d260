//! Wire frames: a u32 big-endian length, then a bincode-2 (serde) body. The length is checked
//! against the limit before anything is allocated, so a peer cannot make a node allocate more
//! than the limit by lying about it.

use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Default largest frame body: above openraft's 3 MiB snapshot chunks with room to spare.
pub const DEFAULT_MAX_FRAME: u32 = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    #[error("frame is truncated: {0}")]
    Truncated(std::io::Error),
    #[error("frame does not decode: {0}")]
    Decode(String),
    #[error("frame does not encode: {0}")]
    Encode(String),
    #[error("stream write failed: {0}")]
    Write(std::io::Error),
}

/// Whether `error`, a peer's answer, is the refusal of a frame it could not decode: what a node
/// of an earlier release answers to a request variant added since (the sender may then fall
/// back to the form that release knows; nothing of the request was served).
pub fn is_undecodable(error: &str) -> bool {
    let probe = FrameError::Decode(String::new()).to_string();
    error.starts_with(probe.trim_end())
}

/// Encodes `msg` as one frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = bincode::serde::encode_to_vec(msg, bincode::config::standard())
        .map_err(|e| FrameError::Encode(e.to_string()))?;
    let len =
        u32::try_from(body.len()).map_err(|_| FrameError::Encode("body exceeds 4 GiB".into()))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes one frame body; trailing bytes are an error (a frame is exactly one message).
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, used) = bincode::serde::decode_from_slice(body, bincode::config::standard())
        .map_err(|e| FrameError::Decode(e.to_string()))?;
    if used != body.len() {
        return Err(FrameError::Decode(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    Ok(msg)
}

/// Reads one frame of at most `max` body bytes.
pub async fn read<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .await
        .map_err(FrameError::Truncated)?;
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .await
        .map_err(FrameError::Truncated)?;
    decode_body(&body)
}

/// Writes one frame.
pub async fn write<T: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &T,
) -> Result<(), FrameError> {
    let bytes = encode(msg)?;
    w.write_all(&bytes).await.map_err(FrameError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[tokio::test]
    async fn oversize_length_is_refused_before_reading_the_body() {
        let mut bytes: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let err = read::<String, _>(&mut bytes, 1024).await.unwrap_err();
        assert!(matches!(
            err,
            FrameError::TooLarge {
                len: u32::MAX,
                max: 1024
            }
        ));
    }

    #[tokio::test]
    async fn round_trip() {
        let bytes = encode(&("hello".to_string(), 7u64)).unwrap();
        let got: (String, u64) = read(&mut bytes.as_slice(), 1024).await.unwrap();
        assert_eq!(got, ("hello".to_string(), 7));
    }

    proptest! {
        /// Garbage never panics the decoder: it is a clean error or some value.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let _ = rt.block_on(read::<crate::rpc::Request, _>(&mut bytes.as_slice(), 1 << 20));
        }
    }
}
