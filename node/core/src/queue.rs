//! One queue's settings, open waiters, deduplication window and the indexes over its messages.
//! The indexes are what make receive O(log n + k) and time advance O(log n) per event: ready
//! messages in send order `(sent_at, id)`, delayed and in-flight messages by deadline, every
//! stored message by `(sent_at, id)` for retention. This module keeps an index entry in step with a state; it
//! never decides a transition (that is `Queues`).

use std::collections::{BTreeMap, BTreeSet};

use crate::attributes::QueueAttributes;
use crate::ids::{DedupId, Incarnation, MessageId, Millis, QueueName, WaiterId};
use crate::message::MessageState;

/// An open long poll (spec/queue-core.md#receive): served in arrival order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Waiter {
    pub(crate) id: WaiterId,
    pub(crate) max: u32,
    pub(crate) visibility_s: u32,
    pub(crate) deadline: Millis,
}

/// What a deduplication id maps to while its window is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DedupEntry {
    /// The first message sent with this id; the answer to every duplicate, even once it is gone.
    pub(crate) message: MessageId,
    pub(crate) expires_at: Millis,
}

/// One queue. Messages live in `Queues::messages`; the queue holds their ids in its indexes.
#[derive(Clone, Debug)]
pub(crate) struct Queue {
    pub(crate) attributes: QueueAttributes,
    pub(crate) incarnation: Incarnation,
    pub(crate) created_at: Millis,
    pub(crate) modified_at: Millis,
    pub(crate) tags: BTreeMap<String, String>,
    pub(crate) last_purge_at: Option<Millis>,
    /// Ready messages in send order, oldest `sent_at` first, ties by id: the order receive
    /// takes them in (spec/queue-core.md#receive).
    pub(crate) ready: BTreeSet<(Millis, MessageId)>,
    /// Delayed messages by the end of their delay.
    pub(crate) delayed: BTreeSet<(Millis, MessageId)>,
    /// In-flight messages by the end of their visibility timeout.
    pub(crate) in_flight: BTreeSet<(Millis, MessageId)>,
    /// Every stored message of the queue by `(sent_at, id)`. Retention is the same for all of
    /// them, so the first entry is always the next to expire, and a retention change needs no
    /// re-indexing.
    pub(crate) retained: BTreeSet<(Millis, MessageId)>,
    pub(crate) dedup: BTreeMap<DedupId, DedupEntry>,
    /// Deduplication entries by expiry.
    pub(crate) dedup_expiry: BTreeSet<(Millis, DedupId)>,
    /// Open waiters by arrival number: the first entry is the oldest.
    pub(crate) waiters: BTreeMap<u64, Waiter>,
    /// Open waiters by deadline.
    pub(crate) waiter_deadlines: BTreeSet<(Millis, u64)>,
    /// This queue's entry in `Queues::agenda`: the time of its next event when it was last
    /// scheduled. Always equal to `next_event()` between steps.
    pub(crate) scheduled: Option<Millis>,
    /// Messages moved out of this queue to its dead-letter queue (by a receive past
    /// `maxReceiveCount` or by dead-letter now) since the queues were built or restored. An
    /// operator's figure only: not stored, not part of the state the spec models, and no
    /// transition reads it.
    pub(crate) dead_letter_moves: u64,
}

impl Queue {
    pub(crate) fn new(
        attributes: QueueAttributes,
        created_at: Millis,
        tags: BTreeMap<String, String>,
    ) -> Queue {
        Queue {
            attributes,
            incarnation: Incarnation::local(created_at),
            created_at,
            modified_at: created_at,
            tags,
            last_purge_at: None,
            ready: BTreeSet::new(),
            delayed: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            retained: BTreeSet::new(),
            dedup: BTreeMap::new(),
            dedup_expiry: BTreeSet::new(),
            waiters: BTreeMap::new(),
            waiter_deadlines: BTreeSet::new(),
            scheduled: None,
            dead_letter_moves: 0,
        }
    }

    /// Adds `id`, sent at `sent_at`, to the index of `state`. The entry must not be there yet.
    pub(crate) fn index_state(&mut self, id: MessageId, state: MessageState, sent_at: Millis) {
        let inserted = match state {
            MessageState::Delayed { until } => self.delayed.insert((until, id)),
            MessageState::Ready { .. } => self.ready.insert((sent_at, id)),
            MessageState::InFlight { until } => self.in_flight.insert((until, id)),
        };
        assert!(inserted, "message {id} indexed twice in state {state:?}");
    }

    /// Removes `id`, sent at `sent_at`, from the index of `state`. The entry must be there.
    pub(crate) fn unindex_state(&mut self, id: MessageId, state: MessageState, sent_at: Millis) {
        let removed = match state {
            MessageState::Delayed { until } => self.delayed.remove(&(until, id)),
            MessageState::Ready { .. } => self.ready.remove(&(sent_at, id)),
            MessageState::InFlight { until } => self.in_flight.remove(&(until, id)),
        };
        assert!(removed, "message {id} missing from the index of {state:?}");
    }

    /// Adds a waiter at the back of the line.
    pub(crate) fn push_waiter(&mut self, arrival: u64, waiter: Waiter) {
        let inserted = self.waiter_deadlines.insert((waiter.deadline, arrival));
        assert!(inserted, "waiter arrival number {arrival} reused");
        let previous = self.waiters.insert(arrival, waiter);
        assert!(previous.is_none(), "waiter arrival number {arrival} reused");
    }

    /// Removes the waiter that arrived as `arrival`; it must be open.
    pub(crate) fn remove_waiter(&mut self, arrival: u64) -> Waiter {
        let waiter = self
            .waiters
            .remove(&arrival)
            .expect("an open waiter's arrival number is in its queue");
        let removed = self.waiter_deadlines.remove(&(waiter.deadline, arrival));
        assert!(
            removed,
            "waiter {} missing from the deadline index",
            waiter.id
        );
        waiter
    }

    /// Records a deduplication id for `message` until `expires_at`.
    pub(crate) fn insert_dedup(&mut self, dedup: DedupId, message: MessageId, expires_at: Millis) {
        let inserted = self.dedup_expiry.insert((expires_at, dedup.clone()));
        assert!(inserted, "deduplication id {dedup} indexed twice");
        let previous = self.dedup.insert(
            dedup,
            DedupEntry {
                message,
                expires_at,
            },
        );
        assert!(previous.is_none(), "deduplication id stored twice");
    }

    /// Drops a deduplication entry; it must exist.
    pub(crate) fn remove_dedup(&mut self, dedup: &DedupId) {
        let entry = self
            .dedup
            .remove(dedup)
            .expect("a deduplication id named by the expiry index is stored");
        let removed = self.dedup_expiry.remove(&(entry.expires_at, dedup.clone()));
        assert!(
            removed,
            "deduplication id {dedup} missing from the expiry index"
        );
    }

    /// When the first stored message of the queue reaches its retention, if any is stored.
    pub(crate) fn next_expiry(&self) -> Option<(Millis, MessageId)> {
        self.retained
            .first()
            .map(|&(sent_at, id)| (sent_at.plus_ms(self.attributes.retention_ms()), id))
    }

    /// The earliest time anything of this queue is due: a delay end, a visibility restore,
    /// a retention, a deduplication expiry or a waiter deadline. O(log n).
    pub(crate) fn next_event(&self) -> Option<Millis> {
        self.next_event_after(None)
    }

    /// As `next_event`, skipping in-flight deadlines at or before `after` (after an instant is
    /// fired, those are deliveries with visibility 0 made at that instant).
    pub(crate) fn next_event_after(&self, after: Option<Millis>) -> Option<Millis> {
        let in_flight = match after {
            None => self.in_flight.first(),
            Some(after) => self
                .in_flight
                .range((after.plus_ms(1), MessageId(0))..)
                .next(),
        };
        [
            self.delayed.first().map(|&(until, _)| until),
            in_flight.map(|&(until, _)| until),
            self.next_expiry().map(|(expires_at, _)| expires_at),
            self.dedup_expiry.first().map(|(expires_at, _)| *expires_at),
            self.waiter_deadlines.first().map(|&(deadline, _)| deadline),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Counts of ready, in-flight and delayed messages (maintained by the indexes).
    pub(crate) fn counts(&self) -> MessageCounts {
        MessageCounts {
            ready: self.ready.len() as u64,
            in_flight: self.in_flight.len() as u64,
            delayed: self.delayed.len() as u64,
        }
    }
}

/// What an operator's scrape reads of one queue (the node's `/metrics`): computed from the
/// indexes when asked, never kept beside them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue's name.
    pub name: QueueName,
    /// Message counts per state, as `GetQueueAttributes` reports them.
    pub counts: MessageCounts,
    /// The original send of the oldest stored message (any state), if the queue holds one:
    /// SQS's `ApproximateAgeOfOldestMessage` is the time since.
    pub oldest_sent_at: Option<Millis>,
    /// Messages moved out of this queue to its dead-letter queue since the queues were built or
    /// restored (not stored: a restart starts it at 0, as a Prometheus counter may).
    pub dead_letter_moves: u64,
}

/// An open long poll, for inspection and the conformance tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaiterView {
    /// The caller's id for it.
    pub id: WaiterId,
    /// How many messages it takes when served.
    pub max: u32,
    /// The visibility timeout its deliveries get.
    pub visibility_s: u32,
    /// When it is answered empty if nothing was delivered.
    pub deadline: Millis,
}

/// How many messages of a queue are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageCounts {
    /// `ApproximateNumberOfMessages`.
    pub ready: u64,
    /// `ApproximateNumberOfMessagesNotVisible`.
    pub in_flight: u64,
    /// `ApproximateNumberOfMessagesDelayed`.
    pub delayed: u64,
}

/// A queue as `GetQueueAttributes` and `ListQueueTags` see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueView {
    /// The queue's name.
    pub name: QueueName,
    /// Its settings.
    pub attributes: QueueAttributes,
    /// Which creation of the name this is.
    pub incarnation: Incarnation,
    /// `CreatedTimestamp`.
    pub created_at: Millis,
    /// `LastModifiedTimestamp`: creation or the latest attribute change.
    pub modified_at: Millis,
    /// The queue's tags.
    pub tags: BTreeMap<String, String>,
    /// Message counts per state.
    pub counts: MessageCounts,
    /// When it was last purged.
    pub last_purge_at: Option<Millis>,
}
