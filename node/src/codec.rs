//! The one place that names bincode (pinned `=2.0.1`): how values become bytes on disk.
//!
//! Every stored value is framed as `[format: u8][crc32: u32 LE][bincode payload]`. The checksum
//! is computed before the bytes go to disk and checked after they are read back, so a torn or
//! corrupted record is refused instead of decoded into nonsense. The format byte lets a later
//! version change the payload encoding (postcard is the planned replacement) while still reading
//! old records. Keys are plain bincode (deterministic, so equal keys give equal bytes).
//!
//! This module must never hold policy: it knows nothing of queues or records.

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

/// The payload encoding this build writes: bincode 2.0.1, standard config (varint integers,
/// little-endian).
pub const FORMAT_BINCODE_V1: u8 = 1;

/// Bytes of the frame before the payload: format byte and checksum.
const HEADER_BYTES: usize = 1 + 4;

/// The largest payload bincode may decode. A record holds at most one message (1 MiB of body and
/// attributes), so anything near this size is corruption, and the cap keeps a corrupted length
/// prefix from allocating gigabytes.
const PAYLOAD_BYTES_MAX: usize = 4 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<PAYLOAD_BYTES_MAX>()
}

/// Why stored bytes could not be turned back into a value.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodecError {
    /// Fewer bytes than the frame header.
    #[error("record is {len_bytes} bytes, shorter than its {HEADER_BYTES}-byte header")]
    Truncated { len_bytes: usize },
    /// A format byte this build does not know (written by a newer version, or corruption).
    #[error("record has unknown format {format}")]
    UnknownFormat { format: u8 },
    /// The payload does not match its checksum.
    #[error("record checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    /// The payload passed its checksum but does not decode as the expected type.
    #[error("record payload does not decode: {reason}")]
    Malformed { reason: String },
    /// The payload decoded but left bytes over.
    #[error("record payload has {extra_bytes} bytes after the value")]
    TrailingBytes { extra_bytes: usize },
}

/// Encodes `value` in a checksummed frame.
///
/// # Panics
/// If `value` cannot be encoded (it exceeds the payload cap): the node never builds such a value.
#[must_use]
pub fn encode_framed<T: Serialize>(value: &T) -> Vec<u8> {
    let payload = bincode::serde::encode_to_vec(value, config())
        .expect("every stored value is a record of at most one message, well under the cap");
    let mut framed = Vec::with_capacity(HEADER_BYTES + payload.len());
    framed.push(FORMAT_BINCODE_V1);
    framed.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    framed.extend_from_slice(&payload);
    framed
}

/// Decodes a frame written by [`encode_framed`], checking format and checksum first.
///
/// # Errors
/// Any [`CodecError`]: the bytes are not an intact frame holding a `T`.
pub fn decode_framed<T: DeserializeOwned>(framed: &[u8]) -> Result<T, CodecError> {
    if framed.len() < HEADER_BYTES {
        return Err(CodecError::Truncated {
            len_bytes: framed.len(),
        });
    }
    let format = framed[0];
    if format != FORMAT_BINCODE_V1 {
        return Err(CodecError::UnknownFormat { format });
    }
    let stored = u32::from_le_bytes(framed[1..HEADER_BYTES].try_into().expect("4 bytes"));
    let payload = &framed[HEADER_BYTES..];
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(CodecError::ChecksumMismatch { stored, computed });
    }
    decode_exact(payload)
}

/// Encodes a key: plain bincode, deterministic, no frame (keys are compared, not decoded).
///
/// # Panics
/// If `key` cannot be encoded: keys are names and ids, far below the cap.
#[must_use]
pub fn encode_key<T: Serialize>(key: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(key, config()).expect("keys are small")
}

/// Decodes a key written by [`encode_key`].
///
/// # Errors
/// `Malformed` or `TrailingBytes` when the bytes are not exactly one `T`.
pub fn decode_key<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_exact(bytes)
}

fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, read_bytes) =
        bincode::serde::decode_from_slice(bytes, config()).map_err(|error| {
            CodecError::Malformed {
                reason: error.to_string(),
            }
        })?;
    if read_bytes != bytes.len() {
        return Err(CodecError::TrailingBytes {
            extra_bytes: bytes.len() - read_bytes,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        name: String,
        count: u64,
        bytes: Vec<u8>,
    }

    fn sample() -> Sample {
        Sample {
            name: "orders".to_owned(),
            count: 7,
            bytes: vec![1, 2, 3],
        }
    }

    /// `Birth` as it was stored before its payload was serialized as bytes: a plain `Vec<u8>`,
    /// which serde writes as a sequence of `u8`.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct BirthAsSequence {
        payload: Vec<u8>,
        sent_at: trireme_core::Millis,
        visible_from: trireme_core::Millis,
        source_queue: Option<Box<trireme_replication::record::SourceQueue>>,
        dedup_id: Option<String>,
    }

    #[test]
    fn a_payload_as_bytes_is_stored_as_it_was_as_a_sequence() {
        use trireme_core::Millis;
        use trireme_replication::record::Birth;
        // Long enough for a multi-byte length, with every byte value.
        let payload: Vec<u8> = (0..1_000u32).map(|i| (i % 256) as u8).collect();
        let birth = Birth {
            payload: payload.clone(),
            sent_at: Millis(1_700_000_000_123),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: Some("order-7".to_owned()),
        };
        let old = BirthAsSequence {
            payload,
            sent_at: birth.sent_at,
            visible_from: birth.visible_from,
            source_queue: None,
            dedup_id: birth.dedup_id.clone(),
        };
        assert_eq!(encode_framed(&birth), encode_framed(&old));
        assert_eq!(decode_framed::<Birth>(&encode_framed(&old)).unwrap(), birth);
        assert_eq!(
            decode_framed::<BirthAsSequence>(&encode_framed(&birth)).unwrap(),
            old
        );
    }

    #[test]
    fn framed_value_round_trips() {
        let framed = encode_framed(&sample());
        assert_eq!(framed[0], FORMAT_BINCODE_V1);
        assert_eq!(decode_framed::<Sample>(&framed).unwrap(), sample());
    }

    #[test]
    fn flipped_payload_bit_is_refused_by_the_checksum() {
        let mut framed = encode_framed(&sample());
        let last = framed.len() - 1;
        framed[last] ^= 0x01;
        assert!(matches!(
            decode_framed::<Sample>(&framed),
            Err(CodecError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn truncated_and_unknown_format_are_refused() {
        let framed = encode_framed(&sample());
        assert_eq!(
            decode_framed::<Sample>(&framed[..3]),
            Err(CodecError::Truncated { len_bytes: 3 })
        );
        let mut newer = framed.clone();
        newer[0] = 9;
        assert_eq!(
            decode_framed::<Sample>(&newer),
            Err(CodecError::UnknownFormat { format: 9 })
        );
        // A frame cut short inside the payload fails its checksum.
        assert!(decode_framed::<Sample>(&framed[..framed.len() - 1]).is_err());
    }

    #[test]
    fn keys_are_deterministic_and_decode_exactly() {
        let key = ("orders".to_owned(), 42_u128);
        assert_eq!(encode_key(&key), encode_key(&key));
        assert_eq!(
            decode_key::<(String, u128)>(&encode_key(&key)).unwrap(),
            key
        );
        let mut longer = encode_key(&key);
        longer.push(0);
        assert_eq!(
            decode_key::<(String, u128)>(&longer),
            Err(CodecError::TrailingBytes { extra_bytes: 1 })
        );
    }
}
