//! Anti-entropy's pure part (spec/replication.md#read-repair-and-anti-entropy): every replica
//! pair compares per-partition digests of the records both of them replicate (tombstones
//! included), and exchanges the records of the partitions whose digests differ; both keep the
//! merge. This module owns the digest of a partition, which partitions differ, and which records
//! go which way; the driver owns the scans, the calls and the schedule.
//!
//! A digest is a sum over its records, so it does not depend on the order records are added in,
//! and a partition's digest changes when any one of its records is added, removed or changed
//! (up to a 128-bit hash collision). The hash is this module's own over the records' derived
//! `Hash`: two nodes built by different compilers could disagree on it, and then every partition
//! looks different and is exchanged; the exchange itself merges, so a disagreement costs work,
//! never a record. This module must never read a clock, a file or the network.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

use trireme_core::QueueName;

use crate::dedup::{DedupKey, DedupRecord};
use crate::ids::NodeId;
use crate::key::RecordKey;
use crate::name::NameRecord;
use crate::placement::{Placement, Ring};
use crate::planted::{Bug, planted};
use crate::record::{Record, merge_held};

/// What two replicas compare for one partition: how many records, and the sum of their hashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest {
    /// Records in the partition.
    pub records: u64,
    /// The wrapping sum of every record's 128-bit hash (key and record together).
    pub sum: u128,
}

impl Digest {
    /// Adds one record to the digest.
    pub fn add(&mut self, key: &RecordKey, record: &Record) {
        self.records += 1;
        self.sum = self.sum.wrapping_add(entry_hash(key, record));
    }

    /// Adds one queue name's record (spec/replication.md §1: its votes, tombstone, registers
    /// and watermark are all hashed, so records that differ in any of them differ here).
    pub fn add_name(&mut self, name: &QueueName, record: &NameRecord) {
        self.records += 1;
        self.sum = self.sum.wrapping_add(name_hash(name, record));
    }

    /// Adds one live deduplication record (spec/replication.md §4).
    pub fn add_dedup(&mut self, key: &DedupKey, record: &DedupRecord) {
        self.records += 1;
        self.sum = self.sum.wrapping_add(dedup_hash(key, record));
    }

    /// Whether no record was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
}

/// The digest of every partition that holds at least one of `records`. A partition absent from
/// the map is empty.
#[must_use]
pub fn digests<'a>(
    records: impl IntoIterator<Item = (&'a RecordKey, &'a Record)>,
) -> BTreeMap<u16, Digest> {
    let mut digests: BTreeMap<u16, Digest> = BTreeMap::new();
    for (key, record) in records {
        digests.entry(key.partition()).or_default().add(key, record);
    }
    digests
}

/// The partitions whose digests differ between two replicas, in partition order (an absent
/// partition counts as empty).
#[must_use]
pub fn differing(mine: &BTreeMap<u16, Digest>, theirs: &BTreeMap<u16, Digest>) -> Vec<u16> {
    let partitions: BTreeSet<u16> = mine.keys().chain(theirs.keys()).copied().collect();
    let empty = Digest::default();
    partitions
        .into_iter()
        .filter(|partition| {
            mine.get(partition).unwrap_or(&empty) != theirs.get(partition).unwrap_or(&empty)
        })
        .collect()
}

/// Whether a pair exchanges `key`: only when the key's replicas include both nodes
/// (spec/replication.md#placement: only the three replicas hold a record).
#[must_use]
pub fn shared(placement: &impl Placement, a: NodeId, b: NodeId, key: &RecordKey) -> bool {
    let replicas = placement.replicas(&key.queue, key.message);
    replicas.contains(&a) && replicas.contains(&b)
}

/// Whether a pair exchanges the deduplication record `key`: only when both nodes are among its
/// three replicas.
#[must_use]
pub fn shares_dedup(ring: &Ring, a: NodeId, b: NodeId, key: &DedupKey) -> bool {
    let replicas = key.replicas(ring);
    replicas.contains(&a) && replicas.contains(&b)
}

/// Which deduplication records go which way between two replicas' live records of one key range
/// (spec/replication.md §4, *Anti-entropy*): a key live on one side only goes to the other, to be
/// stored there as a put of that value would be. A key live on both sides goes nowhere, even when
/// the two name different messages: each replica keeps its value for the window.
#[must_use]
pub fn reconcile_dedups(
    mine: &BTreeMap<DedupKey, DedupRecord>,
    theirs: &BTreeMap<DedupKey, DedupRecord>,
) -> DedupsReconciled {
    let only = |from: &BTreeMap<DedupKey, DedupRecord>, other: &BTreeMap<DedupKey, DedupRecord>| {
        from.iter()
            .filter(|(key, _)| !other.contains_key(key))
            .map(|(key, record)| (key.clone(), *record))
            .collect()
    };
    DedupsReconciled {
        to_peer: only(mine, theirs),
        to_me: only(theirs, mine),
    }
}

/// Which deduplication records go which way ([`reconcile_dedups`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DedupsReconciled {
    /// Records the peer has no live record of.
    pub to_peer: Vec<(DedupKey, DedupRecord)>,
    /// Records this replica has no live record of.
    pub to_me: Vec<(DedupKey, DedupRecord)>,
}

/// Whether a pair exchanges the record of queue name `name`: only when both nodes are among
/// the name's three replicas.
#[must_use]
pub fn shares_name(ring: &Ring, a: NodeId, b: NodeId, name: &QueueName) -> bool {
    let replicas = ring.name_replicas(name);
    replicas.contains(&a) && replicas.contains(&b)
}

/// Which records of a kind whose merge never fails (queue names' and move tasks' records) go
/// which way, given what each replica holds of one range of keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinsReconciled<K, V> {
    /// Keys the peer lacks something of: this replica's record, to be merged there.
    pub to_peer: Vec<(K, V)>,
    /// Keys this replica lacks something of: the peer's record, to be merged here.
    pub to_me: Vec<(K, V)>,
}

/// Which name records go which way.
pub type NamesReconciled = JoinsReconciled<QueueName, NameRecord>;

/// Which records go which way (the [`reconcile`] of a kind whose merge `merge` is a total
/// join): merging `to_me` into `mine` and `to_peer` into `theirs` leaves both holding the join
/// of the two.
#[must_use]
pub fn reconcile_joins<K: Ord + Clone, V: Clone + PartialEq>(
    mine: &BTreeMap<K, V>,
    theirs: &BTreeMap<K, V>,
    merge: impl Fn(&V, &V) -> V,
) -> JoinsReconciled<K, V> {
    let keys: BTreeSet<&K> = mine.keys().chain(theirs.keys()).collect();
    let mut reconciled = JoinsReconciled {
        to_peer: Vec::new(),
        to_me: Vec::new(),
    };
    for key in keys {
        let (held, peer) = (mine.get(key), theirs.get(key));
        let merged = match (held, peer) {
            (Some(held), Some(peer)) => merge(held, peer),
            (Some(only), None) | (None, Some(only)) => only.clone(),
            (None, None) => unreachable!("the key came from one of the two maps"),
        };
        if let Some(held) = held
            && Some(&merged) != peer
        {
            reconciled.to_peer.push((key.clone(), held.clone()));
        }
        if let Some(peer) = peer
            && Some(&merged) != held
        {
            reconciled.to_me.push((key.clone(), peer.clone()));
        }
    }
    reconciled
}

/// Which name records go which way (the name records' [`reconcile`]).
#[must_use]
pub fn reconcile_names(
    mine: &BTreeMap<QueueName, NameRecord>,
    theirs: &BTreeMap<QueueName, NameRecord>,
) -> NamesReconciled {
    reconcile_joins(mine, theirs, NameRecord::merge)
}

/// What one exchange of a range of records moves between two replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Records the peer lacks something of: what this replica holds, to be merged there.
    pub to_peer: Vec<(RecordKey, Record)>,
    /// Records this replica lacks something of: what the peer holds, to be merged here.
    pub to_me: Vec<(RecordKey, Record)>,
    /// Keys whose two records are of one generation with different once-fields: a writer's bug
    /// (spec/replication.md §12), shown and never spread.
    pub diverged: Vec<RecordKey>,
}

/// Which records of one key range go which way, given what each replica holds in it. Merging
/// `to_me` into `mine` and `to_peer` into `theirs` leaves both holding the merge of the two
/// (except for `diverged` keys, which stay as they are on both).
#[must_use]
pub fn reconcile(
    mine: &BTreeMap<RecordKey, Record>,
    theirs: &BTreeMap<RecordKey, Record>,
) -> Reconciled {
    let keys: BTreeSet<&RecordKey> = mine.keys().chain(theirs.keys()).collect();
    let mut reconciled = Reconciled::default();
    for key in keys {
        let (mut held, mut peer) = (mine.get(key), theirs.get(key));
        if planted(Bug::AntiEntropySkipsTombstones) {
            held = held.filter(|record| !record.is_tombstone());
            peer = peer.filter(|record| !record.is_tombstone());
        }
        match merge_held(held, peer) {
            Err(_) => reconciled.diverged.push(key.clone()),
            Ok(merged) => {
                // The merge of what both hold is more than the peer's record only where this
                // replica knows something the peer does not, and then sending this replica's
                // record is enough: the peer's merge with it is the same join.
                if merged.as_ref() != peer
                    && let Some(held) = held
                {
                    reconciled.to_peer.push((key.clone(), held.clone()));
                }
                if merged.as_ref() != held
                    && let Some(peer) = peer
                {
                    reconciled.to_me.push((key.clone(), peer.clone()));
                }
            }
        }
    }
    reconciled
}

fn entry_hash(key: &RecordKey, record: &Record) -> u128 {
    let mut low = Fnv::new(0xcbf2_9ce4_8422_2325);
    let mut high = Fnv::new(0x8422_2325_cbf2_9ce4);
    key.hash(&mut low);
    record.hash(&mut low);
    key.hash(&mut high);
    record.hash(&mut high);
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

fn dedup_hash(key: &DedupKey, record: &DedupRecord) -> u128 {
    let mut low = Fnv::new(0xcbf2_9ce4_8422_2325);
    let mut high = Fnv::new(0x8422_2325_cbf2_9ce4);
    // A tag keeps a deduplication record's hash apart from other records of the same bytes.
    for hasher in [&mut low, &mut high] {
        hasher.write(b"dedup");
        key.hash(hasher);
        record.hash(hasher);
    }
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

fn name_hash(name: &QueueName, record: &NameRecord) -> u128 {
    let mut low = Fnv::new(0xcbf2_9ce4_8422_2325);
    let mut high = Fnv::new(0x8422_2325_cbf2_9ce4);
    // A tag keeps a name's hash apart from a message key's of the same bytes.
    for hasher in [&mut low, &mut high] {
        hasher.write(b"name");
        name.hash(hasher);
        record.hash(hasher);
    }
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

/// FNV-1a with the splitmix64 finaliser: fixed, so every node computes the same digest.
struct Fnv {
    state: u64,
}

impl Fnv {
    fn new(offset: u64) -> Fnv {
        Fnv { state: offset }
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        for byte in bytes {
            self.state ^= u64::from(*byte);
            self.state = self.state.wrapping_mul(PRIME);
        }
    }

    fn finish(&self) -> u64 {
        let mut hash = self.state;
        hash ^= hash >> 30;
        hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        hash ^= hash >> 27;
        hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
        hash ^ (hash >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Generation;
    use crate::placement::Ring;
    use crate::record::{Birth, Body, Claim, Held, TombstoneReason};
    use proptest::prelude::*;
    use trireme_core::{Incarnation, MessageId, Millis, QueueName};

    fn key(queue: u8, message: u8) -> RecordKey {
        RecordKey {
            queue: QueueName::try_from(format!("q{queue}")).unwrap(),
            incarnation: Incarnation::local(Millis(1)),
            message: MessageId(u128::from(message)),
        }
    }

    /// A record of one message, its once-fields derived from the message and generation alone,
    /// as every correct writer derives them.
    fn record(message: u8, generation: u32, state: u8, count: u32) -> Record {
        let mut record = Record::sent(Birth {
            payload: vec![message, generation as u8],
            sent_at: Millis(1_000),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: None,
        });
        record.generation = Generation(generation);
        match state % 3 {
            0 => {}
            1 => {
                if let Body::Live(live) = &mut record.body {
                    live.held = Some(Held {
                        claim: Claim {
                            seq: count + 1,
                            coordinator: NodeId(1),
                            nonce: 7,
                        },
                        change_counter: 0,
                        deadline: Millis(5_000),
                        received_at: Millis(2_000),
                    });
                    live.receive_count = count + 1;
                }
            }
            _ => {
                record = Record::tombstone(
                    Generation(generation),
                    TombstoneReason::Deleted,
                    Millis(3_000),
                );
            }
        }
        record
    }

    /// A replica's records: up to 12 keys over 3 queues, each in one of a few states.
    fn store() -> impl Strategy<Value = BTreeMap<RecordKey, Record>> {
        proptest::collection::btree_map((0u8..3, 0u8..4), (0u32..2, 0u8..3, 0u32..3), 0..12)
            .prop_map(|entries| {
                entries
                    .into_iter()
                    .map(|((queue, message), (generation, state, count))| {
                        (
                            key(queue, message),
                            record(message, generation, state, count),
                        )
                    })
                    .collect()
            })
    }

    fn apply(store: &mut BTreeMap<RecordKey, Record>, incoming: &[(RecordKey, Record)]) {
        for (key, record) in incoming {
            let merged = merge_held(store.get(key), Some(record))
                .unwrap()
                .expect("a merge with a record is a record");
            store.insert(key.clone(), merged);
        }
    }

    proptest! {
        #[test]
        fn equal_stores_give_equal_digests_in_any_order(store in store(), seed: u64) {
            let mut shuffled: Vec<(&RecordKey, &Record)> = store.iter().collect();
            // A deterministic permutation from the seed.
            shuffled.sort_by_key(|(key, _)| entry_hash(key, &store[*key]) ^ u128::from(seed));
            prop_assert_eq!(digests(&store), digests(shuffled));
            prop_assert!(differing(&digests(&store), &digests(&store.clone())).is_empty());
        }

        #[test]
        fn any_differing_record_changes_its_partition_and_only_it(
            store in store(),
            queue in 0u8..3, message in 0u8..4,
            change in (0u32..2, 0u8..4, 0u32..3),
        ) {
            let target = key(queue, message);
            let mut other = store.clone();
            let (generation, state, count) = change;
            if state == 3 {
                other.remove(&target);
            } else {
                other.insert(target.clone(), record(message, generation, state, count));
            }
            let expected: Vec<u16> = if other == store { vec![] } else { vec![target.partition()] };
            prop_assert_eq!(differing(&digests(&store), &digests(&other)), expected);
        }

        #[test]
        fn merging_the_exchanged_records_makes_two_stores_equal(
            mine in store(), theirs in store()
        ) {
            let reconciled = reconcile(&mine, &theirs);
            prop_assert!(reconciled.diverged.is_empty());
            let (mut a, mut b) = (mine.clone(), theirs.clone());
            apply(&mut a, &reconciled.to_me);
            apply(&mut b, &reconciled.to_peer);
            prop_assert_eq!(&a, &b);
            prop_assert!(differing(&digests(&a), &digests(&b)).is_empty());
            // Nothing is sent that the other side already covers.
            for (key, record) in &reconciled.to_peer {
                prop_assert!(!crate::record::covers(theirs.get(key), Some(record)));
            }
            for (key, record) in &reconciled.to_me {
                prop_assert!(!crate::record::covers(mine.get(key), Some(record)));
            }
            // A second exchange finds nothing.
            prop_assert_eq!(reconcile(&a, &b), Reconciled::default());
        }
    }

    #[test]
    fn a_divergence_is_reported_and_neither_record_moves() {
        let mut bad = record(1, 0, 0, 0);
        if let Body::Live(live) = &mut bad.body {
            live.birth.payload.push(9);
        }
        let mine = BTreeMap::from([(key(0, 1), record(1, 0, 0, 0))]);
        let theirs = BTreeMap::from([(key(0, 1), bad)]);
        let reconciled = reconcile(&mine, &theirs);
        assert_eq!(reconciled.diverged, vec![key(0, 1)]);
        assert!(reconciled.to_me.is_empty() && reconciled.to_peer.is_empty());
    }

    #[test]
    fn a_pair_shares_only_keys_both_replicate() {
        let ring = Ring::new((1..=5).map(NodeId)).unwrap();
        let mut shared_keys = 0;
        for message in 0..=255u8 {
            let key = key(0, message);
            let replicas = ring.replicas(&key.queue, key.message);
            assert_eq!(
                shared(&ring, NodeId(1), NodeId(2), &key),
                replicas.contains(&NodeId(1)) && replicas.contains(&NodeId(2))
            );
            assert!(shared(&ring, replicas[0], replicas[2], &key));
            shared_keys += usize::from(shared(&ring, NodeId(1), NodeId(2), &key));
        }
        assert!(
            shared_keys > 0 && shared_keys < 256,
            "five members: some keys, not all"
        );
    }

    fn voted(slots: &[usize]) -> NameRecord {
        let proposal = crate::name::Proposal {
            incarnation: crate::name::QueueIncarnation {
                hlc_ms: 7,
                node: 1,
                nonce: 3,
            },
            ..crate::name::Proposal::default()
        };
        slots.iter().fold(NameRecord::default(), |held, slot| {
            held.merge(&crate::name::vote(&held, *slot, 0, &proposal).0)
        })
    }

    #[test]
    fn name_records_that_differ_only_in_votes_have_different_digests_and_exchange_to_the_join() {
        let name = QueueName::try_from("jobs".to_owned()).unwrap();
        let (one, two) = (voted(&[0]), voted(&[0, 1]));
        let digest = |record: &NameRecord| {
            let mut digest = Digest::default();
            digest.add_name(&name, record);
            digest
        };
        assert_ne!(digest(&one), digest(&two));
        assert_eq!(digest(&two), digest(&voted(&[1, 0])));
        let mine = BTreeMap::from([(name.clone(), one.clone())]);
        let theirs = BTreeMap::from([(name.clone(), two.clone())]);
        let reconciled = reconcile_names(&mine, &theirs);
        assert!(
            reconciled.to_peer.is_empty(),
            "the peer holds the join already"
        );
        assert_eq!(reconciled.to_me, vec![(name.clone(), two.clone())]);
        let only_mine = reconcile_names(&mine, &BTreeMap::new());
        assert_eq!(only_mine.to_peer, vec![(name, one)]);
        assert!(only_mine.to_me.is_empty());
    }

    #[test]
    fn live_dedup_records_go_only_where_none_is_live_and_a_split_stays() {
        use crate::dedup::{DedupKey, DedupRecord, DedupValue};
        let key = |id: &str| DedupKey {
            queue: QueueName::try_from("q".to_owned()).unwrap(),
            incarnation: Incarnation::local(Millis(1)),
            id: trireme_core::DedupId::try_from(id).unwrap(),
        };
        let named = |message: u128| {
            DedupRecord::opened(
                DedupValue {
                    message: MessageId(message),
                    sent_at: Millis(10),
                },
                300_000,
            )
        };
        let mine = BTreeMap::from([(key("a"), named(1)), (key("split"), named(2))]);
        let theirs = BTreeMap::from([(key("b"), named(3)), (key("split"), named(4))]);
        let reconciled = reconcile_dedups(&mine, &theirs);
        assert_eq!(reconciled.to_peer, vec![(key("a"), named(1))]);
        assert_eq!(reconciled.to_me, vec![(key("b"), named(3))]);
        let mut a = Digest::default();
        a.add_dedup(&key("a"), &named(1));
        let mut b = Digest::default();
        b.add_dedup(&key("a"), &named(2));
        assert_ne!(a, b, "a different value is a different digest");
    }
}
