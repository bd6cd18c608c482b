//! Receipt handles on the wire: the core's [`ReceiptHandle`] as an opaque, authenticated string.
//!
//! Layout before encoding (all integers little-endian):
//! `[version: u8 = 2][incarnation: hlc_ms u64, node u16, nonce u64][message: u128][seq: u32]`
//! `[claim: generation u32, coordinator u16, nonce u64][queue name: 1–80 bytes][mac: 16]`,
//! where `mac` is HMAC-SHA256 over everything before it, truncated to 16 bytes, keyed by the
//! cluster's handle key. The whole is URL-safe base64 without padding (at most 168 characters).
//!
//! A handle that does not decode, has the wrong length, or fails its MAC is refused here, so a
//! garbage or forged string never reaches the core (spec/queue-core.md#deleteq-handle). This module
//! must never decide whether a well-formed handle is stale: that is the core's job.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;
use trireme_core::{ClaimTag, Incarnation, MessageId, QueueName, ReceiptHandle};

type HmacSha256 = Hmac<Sha256>;

/// The layout version this build writes and reads. 1 carried the incarnation as one u64 and no
/// claim; its handles named data of a database layout this build refuses, so they are refused.
const HANDLE_VERSION: u8 = 2;
/// Bytes of the truncated MAC: 128 bits make forgery by guessing hopeless.
const MAC_BYTES: usize = 16;
/// Bytes before the queue name: version, incarnation, message id, seq, claim.
const FIXED_BYTES: usize = 1 + (8 + 2 + 8) + 16 + 4 + (4 + 2 + 8);
/// Longest queue name (core limit), so the longest handle.
const QUEUE_NAME_BYTES_MAX: usize = 80;
/// Longest encoded handle this codec produces; longer input is refused before decoding.
pub const HANDLE_CHARS_MAX: usize =
    (FIXED_BYTES + QUEUE_NAME_BYTES_MAX + MAC_BYTES).div_ceil(3) * 4;
/// Shortest key accepted: 128 bits.
pub const HANDLE_KEY_BYTES_MIN: usize = 16;

/// Why a receipt-handle string was refused. Every variant means the same to a caller
/// (SQS `ReceiptHandleIsInvalid`); the variants say why for logs and tests.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HandleError {
    /// The string is empty or longer than any handle this node issues.
    #[error("receipt handle is {len_chars} characters, expected 1–{HANDLE_CHARS_MAX}")]
    Length { len_chars: usize },
    /// The string is not URL-safe base64.
    #[error("receipt handle is not URL-safe base64")]
    NotBase64,
    /// The decoded bytes are too short, or of an unknown layout version.
    #[error("receipt handle has an unknown layout")]
    Layout,
    /// The MAC does not match: forged, altered, or issued under another key.
    #[error("receipt handle failed authentication")]
    BadMac,
    /// Authenticated, yet the queue name inside is not legal (a key leak or a bug).
    #[error("receipt handle names an illegal queue")]
    QueueName,
}

/// Why a handle key was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HandleKeyError {
    /// Fewer bytes than [`HANDLE_KEY_BYTES_MIN`].
    #[error("handle key is {len_bytes} bytes, at least {HANDLE_KEY_BYTES_MIN} are required")]
    TooShort { len_bytes: usize },
}

/// Encodes and authenticates receipt handles with one key. Cheap to clone.
#[derive(Clone)]
pub struct HandleCodec {
    /// The MAC keyed once; cloned per use, which copies the precomputed key state.
    mac: HmacSha256,
}

impl std::fmt::Debug for HandleCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never printed.
        f.write_str("HandleCodec { .. }")
    }
}

impl HandleCodec {
    /// A codec keyed by `key` (shared by every node of a cluster).
    ///
    /// # Errors
    /// `HandleKeyError::TooShort` for a key under 16 bytes.
    pub fn new(key: &[u8]) -> Result<Self, HandleKeyError> {
        if key.len() < HANDLE_KEY_BYTES_MIN {
            return Err(HandleKeyError::TooShort {
                len_bytes: key.len(),
            });
        }
        let mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
        Ok(HandleCodec { mac })
    }

    /// The opaque string for `handle`.
    #[must_use]
    pub fn encode(&self, handle: &ReceiptHandle) -> String {
        let name = handle.queue.as_str().as_bytes();
        assert!(!name.is_empty() && name.len() <= QUEUE_NAME_BYTES_MAX);
        let mut bytes = Vec::with_capacity(FIXED_BYTES + name.len() + MAC_BYTES);
        bytes.push(HANDLE_VERSION);
        bytes.extend_from_slice(&handle.incarnation.hlc_ms.to_le_bytes());
        bytes.extend_from_slice(&handle.incarnation.node.to_le_bytes());
        bytes.extend_from_slice(&handle.incarnation.nonce.to_le_bytes());
        bytes.extend_from_slice(&handle.message.0.to_le_bytes());
        bytes.extend_from_slice(&handle.seq.to_le_bytes());
        bytes.extend_from_slice(&handle.claim.generation.to_le_bytes());
        bytes.extend_from_slice(&handle.claim.coordinator.to_le_bytes());
        bytes.extend_from_slice(&handle.claim.nonce.to_le_bytes());
        debug_assert_eq!(bytes.len(), FIXED_BYTES);
        bytes.extend_from_slice(name);
        let mut mac = self.mac.clone();
        mac.update(&bytes);
        let tag = mac.finalize().into_bytes();
        bytes.extend_from_slice(&tag[..MAC_BYTES]);
        let text = URL_SAFE_NO_PAD.encode(&bytes);
        assert!(text.len() <= HANDLE_CHARS_MAX);
        text
    }

    /// The handle a string of [`HandleCodec::encode`] stands for.
    ///
    /// # Errors
    /// A [`HandleError`] for anything this codec did not issue under this key.
    pub fn decode(&self, text: &str) -> Result<ReceiptHandle, HandleError> {
        if text.is_empty() || text.len() > HANDLE_CHARS_MAX {
            return Err(HandleError::Length {
                len_chars: text.chars().count(),
            });
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| HandleError::NotBase64)?;
        if bytes.len() <= FIXED_BYTES + MAC_BYTES || bytes[0] != HANDLE_VERSION {
            return Err(HandleError::Layout);
        }
        let (signed, tag) = bytes.split_at(bytes.len() - MAC_BYTES);
        let mut mac = self.mac.clone();
        mac.update(signed);
        // Constant-time comparison of the truncated tag.
        mac.verify_truncated_left(tag)
            .map_err(|_| HandleError::BadMac)?;
        let mut fields = Fields(&signed[1..FIXED_BYTES]);
        let incarnation = Incarnation {
            hlc_ms: u64::from_le_bytes(fields.take()),
            node: u16::from_le_bytes(fields.take()),
            nonce: u64::from_le_bytes(fields.take()),
        };
        let message = u128::from_le_bytes(fields.take());
        let seq = u32::from_le_bytes(fields.take());
        let claim = ClaimTag {
            generation: u32::from_le_bytes(fields.take()),
            coordinator: u16::from_le_bytes(fields.take()),
            nonce: u64::from_le_bytes(fields.take()),
        };
        let name =
            std::str::from_utf8(&signed[FIXED_BYTES..]).map_err(|_| HandleError::QueueName)?;
        let queue = QueueName::try_from(name).map_err(|_| HandleError::QueueName)?;
        Ok(ReceiptHandle {
            queue,
            incarnation,
            message: MessageId(message),
            seq,
            claim,
        })
    }
}

/// The fixed fields of an authenticated handle, taken in order.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (field, rest) = self.0.split_at(N);
        self.0 = rest;
        field.try_into().expect("split_at gave N bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> HandleCodec {
        HandleCodec::new(b"0123456789abcdef-test-key").unwrap()
    }

    fn handle(name: &str) -> ReceiptHandle {
        ReceiptHandle {
            queue: QueueName::try_from(name).unwrap(),
            incarnation: Incarnation {
                hlc_ms: 1_700_000_000_123,
                node: 2,
                nonce: 0xfeed_f00d_dead_beef,
            },
            message: MessageId(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            seq: 3,
            claim: ClaimTag {
                generation: 4,
                coordinator: 3,
                nonce: 0x0bad_cafe_1234_5678,
            },
        }
    }

    #[test]
    fn handle_round_trips_for_short_and_longest_names() {
        for name in ["q", &"n".repeat(80)] {
            let text = codec().encode(&handle(name));
            assert!(text.len() <= HANDLE_CHARS_MAX);
            assert_eq!(codec().decode(&text).unwrap(), handle(name));
        }
    }

    #[test]
    fn every_single_character_change_is_refused() {
        let text = codec().encode(&handle("orders"));
        for position in 0..text.len() {
            let mut altered: Vec<char> = text.chars().collect();
            altered[position] = if altered[position] == 'A' { 'B' } else { 'A' };
            let altered: String = altered.into_iter().collect();
            assert!(codec().decode(&altered).is_err(), "position {position}");
        }
    }

    #[test]
    fn handle_from_another_key_is_refused() {
        let other = HandleCodec::new(b"another-key-of-16-bytes").unwrap();
        let text = other.encode(&handle("orders"));
        assert_eq!(codec().decode(&text), Err(HandleError::BadMac));
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        assert!(matches!(
            codec().decode(""),
            Err(HandleError::Length { .. })
        ));
        assert_eq!(codec().decode("not base64!"), Err(HandleError::NotBase64));
        assert_eq!(codec().decode("AAAA"), Err(HandleError::Layout));
        let long = "A".repeat(HANDLE_CHARS_MAX + 1);
        assert!(matches!(
            codec().decode(&long),
            Err(HandleError::Length { .. })
        ));
    }

    #[test]
    fn short_key_is_refused() {
        assert_eq!(
            HandleCodec::new(b"short").unwrap_err(),
            HandleKeyError::TooShort { len_bytes: 5 }
        );
    }
}
