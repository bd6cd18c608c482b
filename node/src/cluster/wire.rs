//! The internal service's messages as the protocol's values: framing of requests and replies
//! (the node's codec), and the sender's identity. Wire types stop here.

use trireme_core::{MessageId, Millis, QueueName};
use trireme_proto::replica::v1 as pb;
use trireme_replication::NodeId;
use trireme_replication::RecordKey;
use trireme_replication::anti_entropy::Digest;
use trireme_replication::coordinator::{Reply, Request};
use trireme_replication::dedup::{DedupKey, DedupRecord, DedupReply, DedupRequest};
use trireme_replication::name::{NameRecord, NameReply, NameRequest};
use trireme_replication::record::Record;
use trireme_replication::task::{TaskKey, TaskRecord, TaskReply, TaskRequest};

use super::store::{FaultKind, StoreFault};
use crate::codec::{self, CodecError};

/// Who sends: this node, its disk, and its clock now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sender {
    /// The member.
    pub node: NodeId,
    /// Its disk.
    pub disk_id: u64,
    /// Its clock when it sent.
    pub clock: Millis,
}

impl From<Sender> for pb::Sender {
    fn from(sender: Sender) -> pb::Sender {
        pb::Sender {
            node_id: u32::from(sender.node.0),
            disk_id: sender.disk_id,
            clock_ms: sender.clock.0,
        }
    }
}

/// A malformed message from a peer.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// No sender.
    #[error("the message names no sender")]
    NoSender,
    /// A node id out of range.
    #[error("node id {0} is not a valid node id")]
    NodeId(u32),
    /// A key that is not a record key.
    #[error("entry {index} has a malformed key")]
    Key { index: usize },
    /// A message id that is not 16 bytes.
    #[error("message id {index} is malformed")]
    MessageId { index: usize },
    /// A key that is not a task record's key.
    #[error("task entry {index} has a malformed key")]
    TaskKey { index: usize },
    /// A name that is not a valid queue name.
    #[error("name entry {index} names no valid queue")]
    Name { index: usize },
    /// A request or reply that does not decode.
    #[error("entry {index} does not decode: {source}")]
    Body {
        index: usize,
        #[source]
        source: CodecError,
    },
    /// A request that decodes but no coordinator of this protocol makes (a conditional write
    /// without the claim or task it is about): refused here, before a replica's rules see it.
    #[error("entry {index} is malformed: {reason}")]
    Malformed { index: usize, reason: &'static str },
    /// A partition number out of range.
    #[error("partition {0} is out of range")]
    Partition(u32),
    /// A reply with another number of answers than the batch had requests.
    #[error("the reply has {got} answers for {sent} requests")]
    Count { sent: usize, got: usize },
}

/// The sender of a peer's message.
///
/// # Errors
/// `NoSender` or `NodeId`.
pub fn sender(sender: Option<&pb::Sender>) -> Result<Sender, WireError> {
    let sender = sender.ok_or(WireError::NoSender)?;
    let node = u16::try_from(sender.node_id).map_err(|_| WireError::NodeId(sender.node_id))?;
    Ok(Sender {
        node: NodeId(node),
        disk_id: sender.disk_id,
        clock: Millis(sender.clock_ms),
    })
}

/// One entry of a batch, encoded.
#[must_use]
pub fn entry(key: &RecordKey, request: &Request) -> pb::Entry {
    pb::Entry {
        key: key.encode(),
        request: codec::encode_framed(request),
    }
}

/// The entries of a batch, decoded.
///
/// # Errors
/// `Key` or `Body` for the first malformed entry.
pub fn entries(entries: &[pb::Entry]) -> Result<Vec<(RecordKey, Request)>, WireError> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let key = RecordKey::decode(&entry.key).ok_or(WireError::Key { index })?;
            let request: Request = codec::decode_framed(&entry.request)
                .map_err(|source| WireError::Body { index, source })?;
            if let Request::Write { write, .. } = &request
                && let Some(reason) = write.malformed()
            {
                return Err(WireError::Malformed { index, reason });
            }
            Ok((key, request))
        })
        .collect()
}

/// A reply, encoded.
#[must_use]
pub fn reply(reply: &Reply) -> Vec<u8> {
    codec::encode_framed(reply)
}

/// The replies of a batch of `sent` requests, decoded.
///
/// # Errors
/// `Count` when the number differs; `Body` for the first malformed reply.
pub fn replies(replies: &[Vec<u8>], sent: usize) -> Result<Vec<Reply>, WireError> {
    decoded_replies(replies, sent)
}

/// The `sent` replies of one kind in a batch, decoded in order.
fn decoded_replies<T: serde::de::DeserializeOwned>(
    replies: &[Vec<u8>],
    sent: usize,
) -> Result<Vec<T>, WireError> {
    if replies.len() != sent {
        return Err(WireError::Count {
            sent,
            got: replies.len(),
        });
    }
    replies
        .iter()
        .enumerate()
        .map(|(index, bytes)| {
            codec::decode_framed(bytes).map_err(|source| WireError::Body { index, source })
        })
        .collect()
}

/// One deduplication entry of a batch, encoded.
#[must_use]
pub fn dedup_entry(key: &DedupKey, request: &DedupRequest) -> pb::DedupEntry {
    pb::DedupEntry {
        key: key.encode(),
        request: codec::encode_framed(request),
    }
}

/// The deduplication entries of a batch, decoded.
///
/// # Errors
/// `Key` or `Body` for the first malformed entry.
pub fn dedup_entries(
    entries: &[pb::DedupEntry],
) -> Result<Vec<(DedupKey, DedupRequest)>, WireError> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let key = DedupKey::decode(&entry.key).ok_or(WireError::Key { index })?;
            let request = codec::decode_framed(&entry.request)
                .map_err(|source| WireError::Body { index, source })?;
            Ok((key, request))
        })
        .collect()
}

/// A deduplication reply, encoded.
#[must_use]
pub fn dedup_reply(reply: &DedupReply) -> Vec<u8> {
    codec::encode_framed(reply)
}

/// The deduplication replies of a batch of `sent` such requests, decoded.
///
/// # Errors
/// As [`replies`].
pub fn dedup_replies(replies: &[Vec<u8>], sent: usize) -> Result<Vec<DedupReply>, WireError> {
    decoded_replies(replies, sent)
}

/// One partition's anti-entropy digest, encoded.
#[must_use]
pub fn digest(partition: u16, digest: Digest) -> pb::PartitionDigest {
    pb::PartitionDigest {
        partition: u32::from(partition),
        records: digest.records,
        sum_high: (digest.sum >> 64) as u64,
        sum_low: digest.sum as u64,
    }
}

/// A peer's partition digests, decoded.
///
/// # Errors
/// `Partition` for a partition number out of range.
pub fn digests(
    digests: &[pb::PartitionDigest],
) -> Result<std::collections::BTreeMap<u16, Digest>, WireError> {
    digests
        .iter()
        .map(|digest| {
            let partition = u16::try_from(digest.partition)
                .map_err(|_| WireError::Partition(digest.partition))?;
            let sum = (u128::from(digest.sum_high) << 64) | u128::from(digest.sum_low);
            Ok((
                partition,
                Digest {
                    records: digest.records,
                    sum,
                },
            ))
        })
        .collect()
}

/// One stored record, encoded for an anti-entropy page.
#[must_use]
pub fn stored_record(key: &RecordKey, record: &Record) -> pb::StoredRecord {
    pb::StoredRecord {
        key: key.encode(),
        record: codec::encode_framed(record),
    }
}

/// A peer's anti-entropy page, decoded.
///
/// # Errors
/// `Key` or `Body` for the first malformed record.
pub fn stored_records(records: &[pb::StoredRecord]) -> Result<Vec<(RecordKey, Record)>, WireError> {
    records
        .iter()
        .enumerate()
        .map(|(index, stored)| {
            let key = RecordKey::decode(&stored.key).ok_or(WireError::Key { index })?;
            let record = codec::decode_framed(&stored.record)
                .map_err(|source| WireError::Body { index, source })?;
            Ok((key, record))
        })
        .collect()
}

/// One name request of a batch, encoded.
#[must_use]
pub fn name_entry(name: &QueueName, request: &NameRequest) -> pb::NameEntry {
    pb::NameEntry {
        name: name.as_str().to_owned(),
        request: codec::encode_framed(request),
    }
}

fn queue_name(name: &str, index: usize) -> Result<QueueName, WireError> {
    QueueName::try_from(name.to_owned()).map_err(|_| WireError::Name { index })
}

/// The name requests of a batch, decoded.
///
/// # Errors
/// `Name` or `Body` for the first malformed entry.
pub fn name_entries(entries: &[pb::NameEntry]) -> Result<Vec<(QueueName, NameRequest)>, WireError> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let name = queue_name(&entry.name, index)?;
            let request = codec::decode_framed(&entry.request)
                .map_err(|source| WireError::Body { index, source })?;
            Ok((name, request))
        })
        .collect()
}

/// A name reply, encoded.
#[must_use]
pub fn name_reply(reply: &NameReply) -> Vec<u8> {
    codec::encode_framed(reply)
}

/// The name replies of a batch of `sent` name requests, decoded.
///
/// # Errors
/// `Count` when the number differs; `Body` for the first malformed reply.
pub fn name_replies(replies: &[Vec<u8>], sent: usize) -> Result<Vec<NameReply>, WireError> {
    decoded_replies(replies, sent)
}

/// The digest of the name records a pair shares, encoded.
#[must_use]
pub fn name_digest(sender: Sender, digest: Digest) -> pb::NameDigestReply {
    pb::NameDigestReply {
        sender: Some(sender.into()),
        records: digest.records,
        sum_high: (digest.sum >> 64) as u64,
        sum_low: digest.sum as u64,
    }
}

/// A peer's name digest, decoded.
#[must_use]
pub fn name_digest_of(reply: &pb::NameDigestReply) -> Digest {
    Digest {
        records: reply.records,
        sum: (u128::from(reply.sum_high) << 64) | u128::from(reply.sum_low),
    }
}

/// One name record, encoded for an anti-entropy page.
#[must_use]
pub fn stored_name(name: &QueueName, record: &NameRecord) -> pb::StoredName {
    pb::StoredName {
        name: name.as_str().to_owned(),
        record: codec::encode_framed(record),
    }
}

/// A peer's page of name records, decoded.
///
/// # Errors
/// `Name` or `Body` for the first malformed record.
pub fn stored_names(records: &[pb::StoredName]) -> Result<Vec<(QueueName, NameRecord)>, WireError> {
    records
        .iter()
        .enumerate()
        .map(|(index, stored)| {
            let name = queue_name(&stored.name, index)?;
            let record = codec::decode_framed(&stored.record)
                .map_err(|source| WireError::Body { index, source })?;
            Ok((name, record))
        })
        .collect()
}

/// The digest of live deduplication records, encoded.
#[must_use]
pub fn dedup_digest(sender: Sender, digest: Digest) -> pb::DedupDigestReply {
    pb::DedupDigestReply {
        sender: Some(sender.into()),
        records: digest.records,
        sum_high: (digest.sum >> 64) as u64,
        sum_low: digest.sum as u64,
    }
}

/// A peer's digest of live deduplication records, decoded.
#[must_use]
pub fn dedup_digest_of(reply: &pb::DedupDigestReply) -> Digest {
    Digest {
        records: reply.records,
        sum: (u128::from(reply.sum_high) << 64) | u128::from(reply.sum_low),
    }
}

/// One deduplication record, encoded for an anti-entropy page.
#[must_use]
pub fn stored_dedup(key: &DedupKey, record: &DedupRecord) -> pb::StoredDedup {
    pb::StoredDedup {
        key: key.encode(),
        record: codec::encode_framed(record),
    }
}

/// A peer's page of deduplication records, decoded.
///
/// # Errors
/// `Key` or `Body` for the first malformed record.
pub fn stored_dedups(
    records: &[pb::StoredDedup],
) -> Result<Vec<(DedupKey, DedupRecord)>, WireError> {
    records
        .iter()
        .enumerate()
        .map(|(index, stored)| {
            let key = DedupKey::decode(&stored.key).ok_or(WireError::Key { index })?;
            let record = codec::decode_framed(&stored.record)
                .map_err(|source| WireError::Body { index, source })?;
            Ok((key, record))
        })
        .collect()
}

/// One task request of a batch, encoded.
#[must_use]
pub fn task_entry(key: &TaskKey, request: &TaskRequest) -> pb::TaskEntry {
    pb::TaskEntry {
        key: key.encode(),
        request: codec::encode_framed(request),
    }
}

/// The task requests of a batch, decoded.
///
/// # Errors
/// `TaskKey` or `Body` for the first malformed entry.
pub fn task_entries(entries: &[pb::TaskEntry]) -> Result<Vec<(TaskKey, TaskRequest)>, WireError> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let key = TaskKey::decode(&entry.key).ok_or(WireError::TaskKey { index })?;
            let request: TaskRequest = codec::decode_framed(&entry.request)
                .map_err(|source| WireError::Body { index, source })?;
            if let TaskRequest::Write { write, .. } = &request
                && let Some(reason) = write.malformed()
            {
                return Err(WireError::Malformed { index, reason });
            }
            Ok((key, request))
        })
        .collect()
}

/// A task reply, encoded.
#[must_use]
pub fn task_reply(reply: &TaskReply) -> Vec<u8> {
    codec::encode_framed(reply)
}

/// The task replies of a batch of `sent` task requests, decoded.
///
/// # Errors
/// `Count` when the number differs; `Body` for the first malformed reply.
pub fn task_replies(replies: &[Vec<u8>], sent: usize) -> Result<Vec<TaskReply>, WireError> {
    decoded_replies(replies, sent)
}

/// One task record, encoded for an anti-entropy page.
#[must_use]
pub fn stored_task(key: &TaskKey, record: &TaskRecord) -> pb::StoredTask {
    pb::StoredTask {
        key: key.encode(),
        record: codec::encode_framed(record),
    }
}

/// A peer's page of task records, decoded.
///
/// # Errors
/// `TaskKey` or `Body` for the first malformed record.
pub fn stored_tasks(records: &[pb::StoredTask]) -> Result<Vec<(TaskKey, TaskRecord)>, WireError> {
    records
        .iter()
        .enumerate()
        .map(|(index, stored)| {
            let key = TaskKey::decode(&stored.key).ok_or(WireError::TaskKey { index })?;
            let record = codec::decode_framed(&stored.record)
                .map_err(|source| WireError::Body { index, source })?;
            Ok((key, record))
        })
        .collect()
}

/// A message id as a candidates reply carries it: 16 bytes, big-endian.
#[must_use]
pub fn candidate(id: MessageId) -> Vec<u8> {
    id.0.to_be_bytes().to_vec()
}

/// A candidates reply's message ids, decoded.
///
/// # Errors
/// `MessageId` for the first id that is not 16 bytes.
pub fn candidates(messages: &[Vec<u8>]) -> Result<Vec<MessageId>, WireError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, bytes)| {
            let bytes: [u8; 16] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| WireError::MessageId { index })?;
            Ok(MessageId(u128::from_be_bytes(bytes)))
        })
        .collect()
}

/// A store fault as the wire carries it.
#[must_use]
pub fn store_fault(fault: &StoreFault) -> pb::StoreFault {
    let kind = match fault.kind {
        FaultKind::DiskFull => pb::store_fault::Kind::DiskFull,
        FaultKind::Io => pb::store_fault::Kind::Io,
        FaultKind::Corrupt => pb::store_fault::Kind::Corrupt,
        FaultKind::Closed => pb::store_fault::Kind::Closed,
    };
    pb::StoreFault {
        kind: kind.into(),
        detail: fault.detail.clone(),
    }
}

/// The store fault a peer reported; a kind this build does not know is an I/O fault.
#[must_use]
pub fn fault(fault: &pb::StoreFault) -> StoreFault {
    let kind = match pb::store_fault::Kind::try_from(fault.kind) {
        Ok(pb::store_fault::Kind::DiskFull) => FaultKind::DiskFull,
        Ok(pb::store_fault::Kind::Corrupt) => FaultKind::Corrupt,
        Ok(pb::store_fault::Kind::Closed) => FaultKind::Closed,
        Ok(pb::store_fault::Kind::Io | pb::store_fault::Kind::Unspecified) | Err(_) => {
            FaultKind::Io
        }
    };
    StoreFault {
        kind,
        detail: fault.detail.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_core::Incarnation;

    /// `payload` in an intact frame, as the fuzz target `replica_record` makes its inputs.
    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![codec::FORMAT_BINCODE_V1];
        frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    fn task_key() -> Vec<u8> {
        TaskKey {
            queue: QueueName::try_from("dlq").unwrap(),
            incarnation: Incarnation {
                hlc_ms: 1,
                node: 1,
                nonce: 1,
            },
        }
        .encode()
    }

    /// Found by `cargo fuzz run replica_record` (crash-8a55cc5a…, input `30 00 01 01 00 01`):
    /// a conditional task write (`Start`) of a record without tasks decoded, and the replica's
    /// rule asserted that it carries its task; a peer could stop a member with it.
    #[test]
    fn a_conditional_task_write_without_its_task_is_refused_at_the_wire() {
        let payload = [0x01, 0x01, 0x00, 0x01];
        let decoded: TaskRequest = codec::decode_framed(&framed(&payload)).unwrap();
        assert!(
            matches!(&decoded, TaskRequest::Write { write, .. } if write.malformed().is_some()),
            "{decoded:?}"
        );
        let entry = pb::TaskEntry {
            key: task_key(),
            request: framed(&payload),
        };
        assert!(matches!(
            task_entries(&[entry]),
            Err(WireError::Malformed { index: 0, .. })
        ));
    }

    /// The same for a record's conditional claim: a `Claim` whose record holds no claim.
    #[test]
    fn a_conditional_claim_without_its_claim_is_refused_at_the_wire() {
        let key = RecordKey {
            queue: QueueName::try_from("q").unwrap(),
            incarnation: Incarnation {
                hlc_ms: 1,
                node: 1,
                nonce: 1,
            },
            message: MessageId(7),
        };
        // A tombstone holds no claim: what a forged `Claim` could carry.
        let unclaimed = Record {
            generation: trireme_replication::Generation(0),
            body: trireme_replication::record::Body::Tombstone(
                trireme_replication::record::Tombstone {
                    reason: trireme_replication::record::TombstoneReason::Deleted,
                    at: Millis(1),
                },
            ),
        };
        for write in [
            trireme_replication::replica::Write::Claim {
                record: unclaimed.clone(),
                now: Millis(1),
                max_receive_count: None,
            },
            trireme_replication::replica::Write::Visibility(unclaimed),
        ] {
            let request = Request::Write {
                write: Box::new(write),
                ack: true,
            };
            let entry = entry(&key, &request);
            assert!(matches!(
                entries(&[entry]),
                Err(WireError::Malformed { index: 0, .. })
            ));
        }
    }
}
