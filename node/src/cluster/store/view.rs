//! The local view: the live records this replica holds, indexed by queue, so a coordinator can
//! pick receive candidates, count a queue and find what expires without a network round or a
//! read of the database (a hint only: the quorum read decides, spec/replication.md §11).
//!
//! It holds an entry per live record for as long as the record waits, so its size per record
//! is most of what a member's memory grows by with a backlog (issue 13's bound: 200 bytes per
//! waiting message beyond the page cache). A record that entered its queue at its send, nearly
//! every one, is an entry of `seen` (by id) and of `at_send` (by entry, which is by send); a moved
//! one is an entry of `moved` and of `moved_by_sent` instead; every key and value is 24 bytes at
//! most. A record is an entry of `hidden` too while it is delayed or received (at most SQS's
//! in-flight limit per queue, and what is delayed).
//!
//! Nothing here is a scan of the whole queue: counting answers from the records that are
//! hidden or sent in the future and from the purged prefix, and the next instant something
//! becomes ready is the first entry of `hidden` past now. Counts are read on every `Candidates`
//! call, every metrics sample and every `GetQueueAttributes`, and the next ready instant on
//! every re-poll of a queue with waiters, all under the lock that every commit takes to update
//! the view: a scan of a million records there stalls every commit of the member.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_replication::RecordKey;
use trireme_replication::record::Record;

/// A message id as two words, the high one first: ordered as the id is, and aligned to 8 bytes,
/// so a `(Millis, Id)` entry is 24 bytes (a `u128`'s 16-byte alignment makes it 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Id(u64, u64);

impl Id {
    const MAX: Id = Id(u64::MAX, u64::MAX);
}

impl From<MessageId> for Id {
    fn from(id: MessageId) -> Id {
        // Truncations meant: the high and the low word.
        #[allow(clippy::cast_possible_truncation)]
        Id((id.0 >> 64) as u64, id.0 as u64)
    }
}

impl From<Id> for MessageId {
    fn from(id: Id) -> MessageId {
        MessageId((u128::from(id.0) << 64) | u128::from(id.1))
    }
}

/// The bit of [`Seen`]'s `visible` that says a receive holds the record.
const RECEIVED: u64 = 1 << 63;

/// What the local view knows of one live record, in 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    entered_at: Millis,
    /// The original send: retention counts from it (spec/replication.md §3).
    sent_at: Millis,
    /// The later of the claim's deadline and the delay's end in the low 63 bits (a later
    /// instant is kept as the last one they hold, 292 million years from the epoch: no clock
    /// reaches either, so every answer is the same); in the top bit whether a receive holds the
    /// record (so until then it is in flight, not delayed).
    visible: u64,
}

impl Seen {
    fn new(entered_at: Millis, sent_at: Millis, visible_at: Millis, received: bool) -> Seen {
        Seen {
            entered_at,
            sent_at,
            visible: visible_at.0.min(RECEIVED - 1) | if received { RECEIVED } else { 0 },
        }
    }

    fn visible_at(self) -> Millis {
        Millis(self.visible & !RECEIVED)
    }

    fn received(self) -> bool {
        self.visible & RECEIVED != 0
    }

    /// Whether the record entered the queue apart from its send (a move), so its place by
    /// entry and its place by send are two entries.
    fn moved(self) -> bool {
        self.entered_at != self.sent_at
    }

    /// Whether the record is in `hidden`: a delay or a claim keeps it from being visible from
    /// its send on. One that is not is visible at every instant from its send.
    fn hidden_after_send(self) -> bool {
        self.visible_at() > self.sent_at
    }
}

/// Where a live record stands by this replica's records, for a peek.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeekState {
    /// A receive could take it now.
    Ready,
    /// Received, invisible until its claim's deadline.
    InFlight,
    /// Its delay has not ended.
    Delayed,
}

/// The live records this replica holds, by queue (the local view).
#[derive(Debug, Default)]
pub struct LocalView {
    queues: BTreeMap<(QueueName, Incarnation), Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    seen: BTreeMap<Id, Seen>,
    /// `(entered_at, id)` of every live record that entered the queue at its send
    /// (`entered_at == sent_at`, nearly all of them): in the order of entry and of send at once.
    at_send: BTreeSet<(Millis, Id)>,
    /// `(entered_at, id)` of every other live record (moved: a dead-letter copy, a redrive).
    moved: BTreeSet<(Millis, Id)>,
    /// `(sent_at, id)` of the moved records.
    moved_by_sent: BTreeSet<(Millis, Id)>,
    /// `(visible_at, id)` of every live record visible only later than its send (delayed or
    /// received): with the records sent after an instant, every record that can be invisible
    /// at that instant.
    hidden: BTreeSet<(Millis, Id)>,
}

/// Two ascending sequences of distinct entries as one ascending sequence.
fn merged<'a>(
    a: impl Iterator<Item = &'a (Millis, Id)>,
    b: impl Iterator<Item = &'a (Millis, Id)>,
) -> impl Iterator<Item = (Millis, Id)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if y < x => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        }
        .copied()
    })
}

/// A range of a set of `(time, id)` entries.
type Range = (Bound<(Millis, Id)>, Bound<(Millis, Id)>);

/// The entries after every one at `at`.
fn after(at: Millis) -> Range {
    (Bound::Excluded((at, Id::MAX)), Bound::Unbounded)
}

impl Queue {
    fn remove(&mut self, id: Id) {
        if let Some(old) = self.seen.remove(&id) {
            if old.moved() {
                self.moved.remove(&(old.entered_at, id));
                self.moved_by_sent.remove(&(old.sent_at, id));
            } else {
                self.at_send.remove(&(old.entered_at, id));
            }
            if old.hidden_after_send() {
                self.hidden.remove(&(old.visible_at(), id));
            }
        }
    }

    fn insert(&mut self, id: Id, seen: Seen) {
        self.seen.insert(id, seen);
        if seen.moved() {
            self.moved.insert((seen.entered_at, id));
            self.moved_by_sent.insert((seen.sent_at, id));
        } else {
            self.at_send.insert((seen.entered_at, id));
        }
        if seen.hidden_after_send() {
            self.hidden.insert((seen.visible_at(), id));
        }
    }

    fn seen(&self, id: Id) -> Seen {
        *self
            .seen
            .get(&id)
            .expect("every id of the view's sets is in `seen`")
    }

    /// `(entered_at, id)` of every live record entered after the watermark `purged_through`,
    /// the first entered first.
    fn by_entry(&self, purged_through: Option<Millis>) -> impl Iterator<Item = (Millis, Id)> {
        let range = purged_through.map_or((Bound::Unbounded, Bound::Unbounded), after);
        merged(self.at_send.range(range), self.moved.range(range))
    }

    /// `(sent_at, id)` of every live record, the first sent first.
    fn by_send(&self) -> impl Iterator<Item = (Millis, Id)> {
        merged(self.at_send.iter(), self.moved_by_sent.iter())
    }

    /// The ids of every record that may be invisible at `now`, each once: those of `hidden`
    /// visible after `now`, and those sent after `now` (a record is never visible before its
    /// send, unless a peer wrote it so, which the caller checks). Every other record is
    /// visible at `now`.
    fn maybe_invisible(&self, now: Millis) -> impl Iterator<Item = Id> + '_ {
        let sent_after = self
            .at_send
            .range(after(now))
            .chain(self.moved_by_sent.range(after(now)))
            .map(|(_, id)| *id);
        let hidden = self
            .hidden
            .range(after(now))
            .map(|(_, id)| *id)
            .filter(move |id| self.seen(*id).sent_at <= now);
        sent_after.chain(hidden)
    }

    /// Live records entered at or before the watermark `purged_through`: hidden by it.
    fn purged(&self, purged_through: Option<Millis>) -> usize {
        purged_through.map_or(0, |through| {
            let through = (Bound::Unbounded, Bound::Included((through, Id::MAX)));
            self.at_send.range(through).count() + self.moved.range(through).count()
        })
    }
}

impl LocalView {
    pub(super) fn update(&mut self, key: &RecordKey, record: Option<&Record>) {
        let id = Id::from(key.message);
        // A held or void copy (spec/replication.md §4) is neither a candidate nor counted.
        let live = record
            .filter(|r| !r.hidden(None) && r.ready())
            .and_then(Record::live);
        let queue = match self.queues.get_mut(&(key.queue.clone(), key.incarnation)) {
            Some(queue) => queue,
            None if live.is_none() => return,
            None => self
                .queues
                .entry((key.queue.clone(), key.incarnation))
                .or_default(),
        };
        queue.remove(id);
        if let Some(live) = live {
            let deadline = live.held.map_or(Millis(0), |held| held.deadline);
            queue.insert(
                id,
                Seen::new(
                    live.entered_at,
                    live.birth.sent_at,
                    deadline.max(live.birth.visible_from),
                    live.held
                        .is_some_and(|held| held.deadline > live.birth.visible_from),
                ),
            );
        }
    }

    fn queue(&self, queue: &QueueName, incarnation: Incarnation) -> Option<&Queue> {
        self.queues.get(&(queue.clone(), incarnation))
    }

    /// Up to `max` live records of the queue past `retention_ms` since their original send at
    /// `now` (spec/replication.md §3), the first sent first.
    #[must_use]
    pub fn expired(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        retention_ms: u64,
        now: Millis,
        max: usize,
    ) -> Vec<MessageId> {
        let Some(queue) = self.queue(queue, incarnation) else {
            return Vec::new();
        };
        queue
            .by_send()
            .take_while(|(sent_at, _)| sent_at.plus_ms(retention_ms) <= now)
            .take(max)
            .map(|(_, id)| MessageId::from(id))
            .collect()
    }

    /// Up to `max` messages of the queue that look visible at `now` by this replica's records,
    /// oldest first, leaving out what the watermark `purged_through` (this node's copy) hides. A
    /// hint only: the quorum read decides.
    #[must_use]
    pub fn candidates(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        purged_through: Option<Millis>,
        now: Millis,
        max: usize,
    ) -> Vec<MessageId> {
        let Some(queue) = self.queue(queue, incarnation) else {
            return Vec::new();
        };
        queue
            .by_entry(purged_through)
            .filter(|(_, id)| queue.seen(*id).visible_at() <= now)
            .take(max)
            .map(|(_, id)| MessageId::from(id))
            .collect()
    }

    /// The earliest instant after `now` at which one of the queue's live records here becomes
    /// ready (a delay's end, a claim's deadline): when a node with waiters on the queue
    /// receives for them without a wake-up (spec/replication.md §9, *Re-poll*).
    #[must_use]
    pub fn next_ready(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        now: Millis,
    ) -> Option<Millis> {
        let queue = self.queue(queue, incarnation)?;
        queue
            .maybe_invisible(now)
            .map(|id| queue.seen(id).visible_at())
            .filter(|at| *at > now)
            .min()
    }

    /// `(ready, in flight, delayed)` among the queue's live records at `now` by this replica's
    /// records, leaving out what the watermark `purged_through` (this node's copy) hides
    /// (spec/replication.md §11: approximate, as SQS's counts are).
    #[must_use]
    pub fn counts(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        purged_through: Option<Millis>,
        now: Millis,
    ) -> (u64, u64, u64) {
        let Some(queue) = self.queue(queue, incarnation) else {
            return (0, 0, 0);
        };
        let (mut in_flight, mut delayed) = (0_u64, 0_u64);
        for id in queue.maybe_invisible(now) {
            let seen = queue.seen(id);
            if Some(seen.entered_at) <= purged_through || seen.visible_at() <= now {
                continue;
            }
            if seen.received() {
                in_flight += 1;
            } else {
                delayed += 1;
            }
        }
        let shown = queue.seen.len() - queue.purged(purged_through);
        let ready = u64::try_from(shown).expect("a count fits in 64 bits") - in_flight - delayed;
        (ready, in_flight, delayed)
    }

    /// The original send of the oldest live record of the queue by this replica's records,
    /// leaving out what the watermark `purged_through` hides (for the node's metrics: the age
    /// of the oldest message).
    #[must_use]
    pub fn oldest_sent_at(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        purged_through: Option<Millis>,
    ) -> Option<Millis> {
        let queue = self.queue(queue, incarnation)?;
        queue
            .by_send()
            .find(|(_, id)| Some(queue.seen(*id).entered_at) > purged_through)
            .map(|(sent_at, _)| sent_at)
    }

    /// Up to `max` live records of the queue by this replica's records, the first entered
    /// first, leaving out what the watermark `purged_through` hides, each with its state at
    /// `now`: `Ready`, `InFlight` or `Delayed` (the console's peek; nothing is decided on it).
    #[must_use]
    pub fn peek(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        purged_through: Option<Millis>,
        now: Millis,
        max: usize,
    ) -> Vec<(MessageId, PeekState)> {
        let Some(queue) = self.queue(queue, incarnation) else {
            return Vec::new();
        };
        queue
            .by_entry(purged_through)
            .take(max)
            .map(|(_, id)| {
                let seen = queue.seen(id);
                let state = if seen.visible_at() <= now {
                    PeekState::Ready
                } else if seen.received() {
                    PeekState::InFlight
                } else {
                    PeekState::Delayed
                };
                (MessageId::from(id), state)
            })
            .collect()
    }

    /// Live records of the queue this replica holds (visible or not).
    #[must_use]
    pub fn live(&self, queue: &QueueName, incarnation: Incarnation) -> usize {
        self.queue(queue, incarnation)
            .map_or(0, |queue| queue.seen.len())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use trireme_replication::NodeId;
    use trireme_replication::record::{Birth, Body, Claim, Held, Record, Settle};

    use super::*;

    /// What the view knew of a record before its indexes: every answer was a scan of this.
    #[derive(Clone, Copy, Debug)]
    struct Plain {
        entered_at: Millis,
        sent_at: Millis,
        visible_at: Millis,
        received: bool,
    }

    /// The view as a plain map, every query a scan of the whole queue.
    #[derive(Default)]
    struct Scan(BTreeMap<MessageId, Plain>);

    impl Scan {
        fn update(&mut self, id: MessageId, record: Option<&Record>) {
            self.0.remove(&id);
            if let Some(live) = record
                .filter(|r| !r.hidden(None) && r.ready())
                .and_then(Record::live)
            {
                let deadline = live.held.map_or(Millis(0), |held| held.deadline);
                self.0.insert(
                    id,
                    Plain {
                        entered_at: live.entered_at,
                        sent_at: live.birth.sent_at,
                        visible_at: deadline.max(live.birth.visible_from),
                        received: live
                            .held
                            .is_some_and(|held| held.deadline > live.birth.visible_from),
                    },
                );
            }
        }

        fn shown(
            &self,
            purged_through: Option<Millis>,
        ) -> impl Iterator<Item = (MessageId, Plain)> {
            self.0
                .iter()
                .filter(move |(_, plain)| Some(plain.entered_at) > purged_through)
                .map(|(id, plain)| (*id, *plain))
        }

        fn counts(&self, purged_through: Option<Millis>, now: Millis) -> (u64, u64, u64) {
            let mut counts = (0, 0, 0);
            for (_, plain) in self.shown(purged_through) {
                if plain.visible_at <= now {
                    counts.0 += 1;
                } else if plain.received {
                    counts.1 += 1;
                } else {
                    counts.2 += 1;
                }
            }
            counts
        }

        fn next_ready(&self, now: Millis) -> Option<Millis> {
            self.0
                .values()
                .map(|plain| Millis(plain.visible_at.0.min(RECEIVED - 1)))
                .filter(|at| *at > now)
                .min()
        }

        fn candidates(
            &self,
            purged_through: Option<Millis>,
            now: Millis,
            max: usize,
        ) -> Vec<MessageId> {
            let mut visible: Vec<(Millis, MessageId)> = self
                .shown(purged_through)
                .filter(|(_, plain)| plain.visible_at <= now)
                .map(|(id, plain)| (plain.entered_at, id))
                .collect();
            visible.sort_unstable();
            visible.into_iter().take(max).map(|(_, id)| id).collect()
        }

        fn expired(&self, retention_ms: u64, now: Millis, max: usize) -> Vec<MessageId> {
            let mut expired: Vec<(Millis, MessageId)> = self
                .0
                .iter()
                .filter(|(_, plain)| plain.sent_at.plus_ms(retention_ms) <= now)
                .map(|(id, plain)| (plain.sent_at, *id))
                .collect();
            expired.sort_unstable();
            expired.into_iter().take(max).map(|(_, id)| id).collect()
        }

        fn oldest_sent_at(&self, purged_through: Option<Millis>) -> Option<Millis> {
            self.shown(purged_through)
                .map(|(_, plain)| plain.sent_at)
                .min()
        }

        fn peek(
            &self,
            purged_through: Option<Millis>,
            now: Millis,
            max: usize,
        ) -> Vec<(MessageId, PeekState)> {
            let mut shown: Vec<(Millis, MessageId, Plain)> = self
                .shown(purged_through)
                .map(|(id, plain)| (plain.entered_at, id, plain))
                .collect();
            shown.sort_unstable_by_key(|(entered_at, id, _)| (*entered_at, *id));
            shown
                .into_iter()
                .take(max)
                .map(|(_, id, plain)| {
                    let state = if plain.visible_at <= now {
                        PeekState::Ready
                    } else if plain.received {
                        PeekState::InFlight
                    } else {
                        PeekState::Delayed
                    };
                    (id, state)
                })
                .collect()
        }
    }

    fn queue() -> (QueueName, Incarnation) {
        (
            QueueName::try_from("orders".to_owned()).unwrap(),
            Incarnation {
                hlc_ms: 7,
                node: 1,
                nonce: 9,
            },
        )
    }

    /// Ids whose high and low words both matter to the order.
    fn id(n: u8) -> MessageId {
        MessageId((u128::from(n % 3) << 100) | u128::from(n))
    }

    /// A record as the view may meet it: sent at `sent_at` with a delay, entered later (a
    /// move), received with a deadline or not, or a copy held for its deduplication id.
    fn record(
        sent_at: u64,
        delay: u64,
        entered_after: i64,
        deadline: Option<u64>,
        held_copy: bool,
    ) -> Record {
        let mut record = Record::sent(Birth {
            payload: Vec::new(),
            sent_at: Millis(sent_at),
            visible_from: if delay == 0 {
                Millis(0)
            } else {
                Millis(sent_at + delay)
            },
            source_queue: None,
            dedup_id: None,
        });
        if let Body::Live(live) = &mut record.body {
            live.entered_at = Millis(sent_at.saturating_add_signed(entered_after));
            live.held = deadline.map(|deadline| Held {
                claim: Claim {
                    seq: 1,
                    coordinator: NodeId(1),
                    nonce: 3,
                },
                change_counter: 0,
                deadline: Millis(if deadline == 99 { u64::MAX } else { deadline }),
                received_at: Millis(sent_at),
            });
            if held_copy {
                live.settle = Settle::Held;
            }
        }
        record
    }

    #[derive(Clone, Debug)]
    enum Step {
        Put(u8, u64, u64, i64, Option<u64>, bool),
        Gone(u8),
        Ask(u64, Option<u64>, usize, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0_u8..12, 0_u64..40, prop_oneof![Just(0_u64), 1_u64..20], prop_oneof![2 => Just(0_i64), 1 => -5_i64..10], proptest::option::of(0_u64..100), proptest::bool::weighted(0.1))
                .prop_map(|(n, sent, delay, entered, deadline, held)| Step::Put(n, sent, delay, entered, deadline, held)),
            1 => (0_u8..12).prop_map(Step::Gone),
            2 => (0_u64..80, proptest::option::of(0_u64..60), 1_usize..6, 0_u64..40)
                .prop_map(|(now, purged, max, retention)| Step::Ask(now, purged, max, retention)),
        ]
    }

    proptest! {
        /// Every answer of the indexed view equals the scan's, after every change.
        #[test]
        fn the_indexed_view_answers_as_a_scan_of_every_record(steps in proptest::collection::vec(step(), 1..80)) {
            let (name, incarnation) = queue();
            let key = |n: u8| RecordKey { queue: name.clone(), incarnation, message: id(n) };
            let mut view = LocalView::default();
            let mut scan = Scan::default();
            for step in steps {
                match step {
                    Step::Put(n, sent, delay, entered, deadline, held) => {
                        let record = record(sent, delay, entered, deadline, held);
                        view.update(&key(n), Some(&record));
                        scan.update(id(n), Some(&record));
                    }
                    Step::Gone(n) => {
                        view.update(&key(n), None);
                        scan.update(id(n), None);
                    }
                    Step::Ask(now, purged, max, retention) => {
                        let (now, purged) = (Millis(now), purged.map(Millis));
                        prop_assert_eq!(view.counts(&name, incarnation, purged, now), scan.counts(purged, now));
                        prop_assert_eq!(view.next_ready(&name, incarnation, now), scan.next_ready(now));
                        prop_assert_eq!(view.candidates(&name, incarnation, purged, now, max), scan.candidates(purged, now, max));
                        prop_assert_eq!(view.expired(&name, incarnation, retention, now, max), scan.expired(retention, now, max));
                        prop_assert_eq!(view.oldest_sent_at(&name, incarnation, purged), scan.oldest_sent_at(purged));
                        prop_assert_eq!(view.peek(&name, incarnation, purged, now, max), scan.peek(purged, now, max));
                        prop_assert_eq!(view.live(&name, incarnation), scan.0.len());
                    }
                }
            }
        }
    }

    #[test]
    fn an_entry_of_the_views_sets_is_24_bytes() {
        assert_eq!(std::mem::size_of::<(Millis, Id)>(), 24);
        assert_eq!(std::mem::size_of::<Seen>(), 24);
        assert_eq!(std::mem::size_of::<Id>(), 16);
    }

    #[test]
    fn an_id_keeps_its_value_and_its_order_in_two_words() {
        let ids = [
            0_u128,
            1,
            u128::from(u64::MAX),
            1 << 64,
            (1 << 64) + 1,
            u128::MAX - 1,
            u128::MAX,
        ];
        for pair in ids.windows(2) {
            assert!(Id::from(MessageId(pair[0])) < Id::from(MessageId(pair[1])));
        }
        for id in ids {
            assert_eq!(MessageId::from(Id::from(MessageId(id))), MessageId(id));
        }
    }
}
