//! Where a message's three copies live (spec/replication.md#placement): `(queue, message id)` is
//! hashed onto a ring of virtual nodes, and the first three distinct nodes clockwise from it are
//! its replicas. Only those three count toward `W` and `R`: there is no sloppy quorum.
//!
//! The hash is part of the cluster's contract (every node must place every key alike, and a
//! record's partition is in its stored key), so it is written here and never taken from a
//! library whose output could change with an upgrade.

use std::collections::BTreeSet;

use trireme_core::{MessageId, QueueName};

use crate::ids::NodeId;

/// Copies of every message.
pub const REPLICAS: usize = 3;

/// Which nodes hold a key. One trait so the driver, the simulation and tests can place alike.
pub trait Placement {
    /// The three replicas of `message` in `queue`, in ring order (distinct nodes).
    fn replicas(&self, queue: &QueueName, message: MessageId) -> [NodeId; REPLICAS];
}

/// Virtual nodes per member: enough to spread 3, 5 or 9 members evenly over the ring.
pub const VIRTUAL_NODES_PER_MEMBER: u16 = 64;

/// A ring of virtual nodes over a fixed membership.
#[derive(Clone, Debug)]
pub struct Ring {
    /// `(position, member)`, sorted by position.
    points: Vec<(u64, NodeId)>,
}

/// The ring cannot place three copies.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a ring needs at least {REPLICAS} distinct members, got {members}")]
pub struct TooFewMembers {
    /// Distinct members given.
    pub members: usize,
}

impl Ring {
    /// The ring of `members`.
    ///
    /// # Errors
    /// [`TooFewMembers`] with fewer than three distinct members.
    pub fn new(members: impl IntoIterator<Item = NodeId>) -> Result<Ring, TooFewMembers> {
        let members: BTreeSet<NodeId> = members.into_iter().collect();
        if members.len() < REPLICAS {
            return Err(TooFewMembers {
                members: members.len(),
            });
        }
        let mut points: Vec<(u64, NodeId)> = members
            .iter()
            .flat_map(|member| {
                (0..VIRTUAL_NODES_PER_MEMBER).map(move |i| {
                    let mut bytes = [0u8; 4];
                    bytes[..2].copy_from_slice(&member.0.to_le_bytes());
                    bytes[2..].copy_from_slice(&i.to_le_bytes());
                    (hash64(&bytes), *member)
                })
            })
            .collect();
        points.sort();
        Ok(Ring { points })
    }

    /// The members, in id order.
    #[must_use]
    pub fn members(&self) -> BTreeSet<NodeId> {
        self.points.iter().map(|(_, member)| *member).collect()
    }

    /// The three replicas of the queue name's own record (spec/replication.md §1), in ring
    /// order: slot `r` of the record is `name_replicas(name)[r]`.
    #[must_use]
    pub fn name_replicas(&self, name: &QueueName) -> [NodeId; REPLICAS] {
        self.clockwise_from(name_position(name))
    }

    /// The three replicas of a deduplication record (spec/replication.md §4): placed by its
    /// key like any record, so in general not its message's replicas.
    #[must_use]
    pub fn dedup_replicas(&self, queue: &QueueName, dedup_id: &str) -> [NodeId; REPLICAS] {
        self.clockwise_from(dedup_position(queue, dedup_id))
    }

    /// Every replica set the ring places keys on (each in ring order, each once): what a read
    /// of two indexes of every set must cover (spec/replication.md §9, *Re-poll*).
    #[must_use]
    pub fn replica_sets(&self) -> Vec<[NodeId; REPLICAS]> {
        let mut sets: Vec<[NodeId; REPLICAS]> = Vec::new();
        for (position, _) in &self.points {
            let set = self.clockwise_from(*position);
            let mut sorted = set;
            sorted.sort();
            if !sets.iter().any(|known| {
                let mut known = *known;
                known.sort();
                known == sorted
            }) {
                sets.push(set);
            }
        }
        sets
    }

    /// The first three distinct members clockwise from `position`.
    fn clockwise_from(&self, position: u64) -> [NodeId; REPLICAS] {
        let start = self.points.partition_point(|(point, _)| *point < position);
        let mut chosen: Vec<NodeId> = Vec::with_capacity(REPLICAS);
        for offset in 0..self.points.len() {
            let (_, member) = self.points[(start + offset) % self.points.len()];
            if !chosen.contains(&member) {
                chosen.push(member);
                if chosen.len() == REPLICAS {
                    break;
                }
            }
        }
        chosen
            .try_into()
            .expect("a ring is built with at least three distinct members")
    }
}

impl Placement for Ring {
    fn replicas(&self, queue: &QueueName, message: MessageId) -> [NodeId; REPLICAS] {
        self.clockwise_from(key_position(queue, message))
    }
}

/// The ring position of `(queue, message)`.
#[must_use]
pub fn key_position(queue: &QueueName, message: MessageId) -> u64 {
    let mut bytes = Vec::with_capacity(queue.as_str().len() + 17);
    bytes.extend_from_slice(queue.as_str().as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&message.0.to_le_bytes());
    hash64(&bytes)
}

/// The ring position of a queue name's own record: the hash of the name behind a two-byte tag
/// (`0xff`, `n`) that no queue name starts with, so names spread over the ring as keys do.
#[must_use]
pub fn name_position(name: &QueueName) -> u64 {
    let mut bytes = Vec::with_capacity(name.as_str().len() + 2);
    bytes.extend_from_slice(b"\xffn");
    bytes.extend_from_slice(name.as_str().as_bytes());
    hash64(&bytes)
}

/// The ring position of a deduplication record: the hash of the queue name and the id behind a
/// two-byte tag (`0xff`, `d`) that neither a queue name nor a name record's tag starts with.
#[must_use]
pub fn dedup_position(queue: &QueueName, dedup_id: &str) -> u64 {
    let mut bytes = Vec::with_capacity(queue.as_str().len() + dedup_id.len() + 3);
    bytes.extend_from_slice(b"\xffd");
    bytes.extend_from_slice(queue.as_str().as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(dedup_id.as_bytes());
    hash64(&bytes)
}

/// The partition of a key (spec/replication.md §12): the first 16 bits of its ring position.
#[must_use]
pub fn partition(queue: &QueueName, message: MessageId) -> u16 {
    (key_position(queue, message) >> 48) as u16
}

/// FNV-1a over the bytes, then the splitmix64 finaliser so nearby inputs land far apart.
fn hash64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn queue() -> QueueName {
        QueueName::try_from("jobs".to_string()).unwrap()
    }

    #[test]
    fn three_members_hold_every_message() {
        let ring = Ring::new([NodeId(1), NodeId(2), NodeId(3)]).unwrap();
        for id in 0..100u128 {
            let mut replicas = ring.replicas(&queue(), MessageId(id)).to_vec();
            replicas.sort();
            assert_eq!(replicas, vec![NodeId(1), NodeId(2), NodeId(3)]);
        }
    }

    #[test]
    fn every_key_is_placed_on_one_of_the_replica_sets() {
        let three = Ring::new((1..=3).map(NodeId)).unwrap();
        assert_eq!(three.replica_sets().len(), 1);
        let five = Ring::new((1..=5).map(NodeId)).unwrap();
        let sets: Vec<BTreeSet<NodeId>> = five
            .replica_sets()
            .iter()
            .map(|set| set.iter().copied().collect())
            .collect();
        assert!(sets.len() > 1 && sets.len() <= 10, "{} sets", sets.len());
        for id in 0..10_000u128 {
            let placed: BTreeSet<NodeId> = five
                .replicas(&queue(), MessageId(id * 7_919))
                .into_iter()
                .collect();
            assert!(sets.contains(&placed), "{placed:?} is one of the sets");
        }
    }

    #[test]
    fn five_members_share_the_copies_evenly() {
        let ring = Ring::new((1..=5).map(NodeId)).unwrap();
        let mut held: BTreeMap<NodeId, u32> = BTreeMap::new();
        let messages = 10_000u32;
        for id in 0..messages {
            let replicas = ring.replicas(&queue(), MessageId(u128::from(id) * 7_919));
            let distinct: BTreeSet<NodeId> = replicas.iter().copied().collect();
            assert_eq!(distinct.len(), REPLICAS, "three distinct nodes");
            for node in replicas {
                *held.entry(node).or_default() += 1;
            }
        }
        // Each of five members should hold about 3/5 of the messages.
        for (node, count) in held {
            let share = f64::from(count) / f64::from(messages);
            assert!((0.45..0.75).contains(&share), "{node} holds {share:.2}");
        }
    }

    #[test]
    fn placement_is_the_same_on_every_node() {
        let a = Ring::new([NodeId(3), NodeId(1), NodeId(2), NodeId(4)]).unwrap();
        let b = Ring::new([NodeId(4), NodeId(2), NodeId(3), NodeId(1)]).unwrap();
        for id in 0..200u128 {
            assert_eq!(
                a.replicas(&queue(), MessageId(id)),
                b.replicas(&queue(), MessageId(id))
            );
        }
    }

    #[test]
    fn a_name_has_three_distinct_replicas_placed_alike_on_every_node() {
        let a = Ring::new((1..=5).map(NodeId)).unwrap();
        let b = Ring::new([5, 3, 1, 4, 2].map(NodeId)).unwrap();
        let mut first: BTreeSet<NodeId> = BTreeSet::new();
        for i in 0..100 {
            let name = QueueName::try_from(format!("queue-{i}")).unwrap();
            let replicas = a.name_replicas(&name);
            assert_eq!(replicas, b.name_replicas(&name));
            let distinct: BTreeSet<NodeId> = replicas.iter().copied().collect();
            assert_eq!(distinct.len(), REPLICAS);
            first.insert(replicas[0]);
        }
        assert_eq!(first.len(), 5, "names spread over every member");
    }

    #[test]
    fn a_ring_of_two_is_refused() {
        assert_eq!(
            Ring::new([NodeId(1), NodeId(2)]).unwrap_err(),
            TooFewMembers { members: 2 }
        );
    }
}
