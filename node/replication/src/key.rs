//! The key a replica stores a message's record under (spec/replication.md §12, *Key*):
//! `(partition, queue name, incarnation, message id)`, encoded so that byte order is key order,
//! so anti-entropy's per-partition digests are range scans.

use serde::{Deserialize, Serialize};
use trireme_core::{Incarnation, MessageId, QueueName};

use crate::placement::partition;

/// Bytes of an incarnation in a key: `hlc_ms`, `node`, `nonce`.
const INCARNATION_BYTES: usize = 8 + 2 + 8;

/// Which record: one message in one creation of one queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RecordKey {
    /// The queue's name.
    pub queue: QueueName,
    /// Which creation of the name (spec/replication.md §1): nothing of a deleted queue is seen
    /// by its successor.
    pub incarnation: Incarnation,
    /// The message.
    pub message: MessageId,
}

impl RecordKey {
    /// The stored form: partition (u16 BE), name length (u8) and name, incarnation (`hlc_ms` u64,
    /// `node` u16 and `nonce` u64, each BE),
    /// message id (u128 BE). Byte order equals `(partition, name length, name, incarnation,
    /// id)` order, so one partition is one contiguous range.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let name = self.queue.as_str().as_bytes();
        let name_len = u8::try_from(name.len()).expect("queue names are at most 80 bytes");
        let mut bytes = Vec::with_capacity(2 + 1 + name.len() + INCARNATION_BYTES + 16);
        bytes.extend_from_slice(&partition(&self.queue, self.message).to_be_bytes());
        bytes.push(name_len);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&self.incarnation.hlc_ms.to_be_bytes());
        bytes.extend_from_slice(&self.incarnation.node.to_be_bytes());
        bytes.extend_from_slice(&self.incarnation.nonce.to_be_bytes());
        bytes.extend_from_slice(&self.message.0.to_be_bytes());
        bytes
    }

    /// The key of stored bytes, `None` if they are not a key's encoding.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<RecordKey> {
        let (_partition, rest) = bytes.split_at_checked(2)?;
        let (&name_len, rest) = rest.split_first()?;
        let (name, rest) = rest.split_at_checked(usize::from(name_len))?;
        let (hlc_ms, rest) = rest.split_at_checked(8)?;
        let (node, rest) = rest.split_at_checked(2)?;
        let (nonce, rest) = rest.split_at_checked(8)?;
        let message: [u8; 16] = rest.try_into().ok()?;
        let queue = QueueName::try_from(String::from_utf8(name.to_vec()).ok()?).ok()?;
        let key = RecordKey {
            queue,
            incarnation: Incarnation {
                hlc_ms: u64::from_be_bytes(hlc_ms.try_into().ok()?),
                node: u16::from_be_bytes(node.try_into().ok()?),
                nonce: u64::from_be_bytes(nonce.try_into().ok()?),
            },
            message: MessageId(u128::from_be_bytes(message)),
        };
        (key.encode() == bytes).then_some(key)
    }

    /// The partition this key belongs to.
    #[must_use]
    pub fn partition(&self) -> u16 {
        partition(&self.queue, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(name: &str, incarnation: u64, message: u128) -> RecordKey {
        RecordKey {
            queue: QueueName::try_from(name.to_string()).unwrap(),
            incarnation: Incarnation {
                hlc_ms: incarnation,
                node: (incarnation % 7) as u16,
                nonce: incarnation.rotate_left(17),
            },
            message: MessageId(message),
        }
    }

    proptest! {
        #[test]
        fn keys_round_trip(name in "[a-zA-Z0-9_-]{1,80}", incarnation: u64, message: u128) {
            let key = key(&name, incarnation, message);
            prop_assert_eq!(RecordKey::decode(&key.encode()), Some(key));
        }

        #[test]
        fn byte_order_is_key_order(
            a in "[a-z]{1,4}", b in "[a-z]{1,4}", i: u64, j: u64, m: u128, n: u128
        ) {
            let (x, y) = (key(&a, i, m), key(&b, j, n));
            let by_fields = (x.partition(), x.queue.as_str().len(), x.queue.as_str(), i, m)
                .cmp(&(y.partition(), y.queue.as_str().len(), y.queue.as_str(), j, n));
            prop_assert_eq!(x.encode().cmp(&y.encode()), by_fields);
        }
    }

    #[test]
    fn garbage_is_not_a_key() {
        assert_eq!(RecordKey::decode(&[0, 1, 200, 1]), None);
        let mut bytes = key("jobs", 1, 2).encode();
        bytes.push(0);
        assert_eq!(RecordKey::decode(&bytes), None);
    }
}
