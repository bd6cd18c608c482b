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
//! in-flight limit per queue, and what is delayed); while it is also invisible at the last
//! receive's `now` (*waiting*), its by-entry entry is in `waiting_at_send` or `waiting_moved`
//! instead of `at_send` or `moved`, so no record has two.
//!
//! Nothing here is a scan of the queue, nor of what is in flight: candidates walk the records
//! that are not waiting (a receive first moves what became visible since the last one out of
//! the waiting sets); counting starts from the waiting sets' sizes and corrects them by what
//! changed between the last receive's `now` and this one, by the purged prefix and by what was
//! sent in the future; and the next instant something becomes ready is the first entry of
//! `hidden` past now. Counts are read on every `Candidates` call, every metrics sample and
//! every `GetQueueAttributes`, candidates on every receive, and the next ready instant on every
//! re-poll of a queue with waiters, all under the lock that every commit takes to update the
//! view: a walk of a million records, or of SQS's 120,000 in flight, there stalls every commit
//! of the member.

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
    /// (`entered_at == sent_at`, nearly all of them) and is not [waiting](Queue::waiting): in the
    /// order of entry and of send at once.
    at_send: BTreeSet<(Millis, Id)>,
    /// `(entered_at, id)` of every other live record (moved: a dead-letter copy, a redrive) that
    /// is not waiting.
    moved: BTreeSet<(Millis, Id)>,
    /// `(entered_at, id)` of the waiting records that entered at their send.
    waiting_at_send: BTreeSet<(Millis, Id)>,
    /// `(entered_at, id)` of the waiting moved records.
    waiting_moved: BTreeSet<(Millis, Id)>,
    /// `(sent_at, id)` of the moved records, waiting or not.
    moved_by_sent: BTreeSet<(Millis, Id)>,
    /// `(visible_at, id)` of every live record visible only later than its send (delayed or
    /// received): with the records sent after an instant, every record that can be invisible
    /// at that instant.
    hidden: BTreeSet<(Millis, Id)>,
    /// Every record of `hidden` visible at or before this instant is in `at_send` or `moved`;
    /// the others are waiting. Raised by [`LocalView::candidates`] to its `now`, so a receive
    /// walks the records that were visible at the last receive and those that became visible
    /// since, never the records in flight or delayed at the queue's head.
    promoted: Millis,
    /// How many waiting records a receive holds (the others are delayed): the counts start
    /// from it.
    waiting_received: u64,
}
/// Two ascending sequences of distinct entries as one ascending sequence.
fn merged(
    a: impl Iterator<Item = (Millis, Id)>,
    b: impl Iterator<Item = (Millis, Id)>,
) -> impl Iterator<Item = (Millis, Id)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y < x => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

/// A range of a set of `(time, id)` entries.
type Range = (Bound<(Millis, Id)>, Bound<(Millis, Id)>);

/// The entries after every one at `at`.
fn after(at: Millis) -> Range {
    (Bound::Excluded((at, Id::MAX)), Bound::Unbounded)
}

/// The entries after every one at `at`, or all of them for `None`.
fn after_or_all(at: Option<Millis>) -> Range {
    at.map_or((Bound::Unbounded, Bound::Unbounded), after)
}

impl Queue {
    /// Whether `seen` is in the waiting sets: hidden after its send and visible only after
    /// `promoted`.
    fn waiting(&self, seen: Seen) -> bool {
        seen.hidden_after_send() && seen.visible_at() > self.promoted
    }

    /// The by-entry set `seen` of `id` belongs in.
    fn by_entry_set(&mut self, seen: Seen) -> &mut BTreeSet<(Millis, Id)> {
        match (seen.moved(), self.waiting(seen)) {
            (false, false) => &mut self.at_send,
            (true, false) => &mut self.moved,
            (false, true) => &mut self.waiting_at_send,
            (true, true) => &mut self.waiting_moved,
        }
    }

    fn remove(&mut self, id: Id) {
        if let Some(old) = self.seen.remove(&id) {
            if self.waiting(old) && old.received() {
                self.waiting_received -= 1;
            }
            self.by_entry_set(old).remove(&(old.entered_at, id));
            if old.moved() {
                self.moved_by_sent.remove(&(old.sent_at, id));
            }
            if old.hidden_after_send() {
                self.hidden.remove(&(old.visible_at(), id));
            }
        }
    }

    fn insert(&mut self, id: Id, seen: Seen) {
        self.seen.insert(id, seen);
        if self.waiting(seen) && seen.received() {
            self.waiting_received += 1;
        }
        self.by_entry_set(seen).insert((seen.entered_at, id));
        if seen.moved() {
            self.moved_by_sent.insert((seen.sent_at, id));
        }
        if seen.hidden_after_send() {
            self.hidden.insert((seen.visible_at(), id));
        }
    }

    /// Moves every waiting record visible at `now` to `at_send` or `moved`, and makes `now` the
    /// instant promoted through. Each record moves once per claim or delay: the walk is of
    /// `hidden` between the last promotion and `now` only.
    fn promote(&mut self, now: Millis) {
        if now <= self.promoted {
            return;
        }
        let range = (
            Bound::Excluded((self.promoted, Id::MAX)),
            Bound::Included((now, Id::MAX)),
        );
        let due: Vec<Id> = self.hidden.range(range).map(|(_, id)| *id).collect();
        for id in due {
            let seen = self.seen(id);
            let (from, to) = if seen.moved() {
                (&mut self.waiting_moved, &mut self.moved)
            } else {
                (&mut self.waiting_at_send, &mut self.at_send)
            };
            from.remove(&(seen.entered_at, id));
            to.insert((seen.entered_at, id));
            if seen.received() {
                self.waiting_received -= 1;
            }
        }
        self.promoted = now;
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
        let range = after_or_all(purged_through);
        merged(
            merged(
                self.at_send.range(range).copied(),
                self.moved.range(range).copied(),
            ),
            merged(
                self.waiting_at_send.range(range).copied(),
                self.waiting_moved.range(range).copied(),
            ),
        )
    }

    /// `(entered_at, id)` of the live records that are not waiting, entered after the
    /// watermark `purged_through`, the first entered first: after [`Queue::promote`] to `now`,
    /// every record visible at `now` is among them.
    fn not_waiting_by_entry(
        &self,
        purged_through: Option<Millis>,
    ) -> impl Iterator<Item = (Millis, Id)> {
        let range = after_or_all(purged_through);
        merged(
            self.at_send.range(range).copied(),
            self.moved.range(range).copied(),
        )
    }

    /// `(sent_at, id)` of every live record sent after `from` (`None`: all), the first sent
    /// first.
    fn by_send(&self, from: Option<Millis>) -> impl Iterator<Item = (Millis, Id)> {
        let range = after_or_all(from);
        merged(
            merged(
                self.at_send.range(range).copied(),
                self.waiting_at_send.range(range).copied(),
            ),
            self.moved_by_sent.range(range).copied(),
        )
    }

    /// `(visible_at, id)` of the records of `hidden` visible after `now` and sent at or before
    /// it, the first visible first.
    fn hidden_sent_by(&self, now: Millis) -> impl Iterator<Item = (Millis, Id)> + '_ {
        self.hidden
            .range(after(now))
            .copied()
            .filter(move |(_, id)| self.seen(*id).sent_at <= now)
    }

    /// Live records entered at or before the watermark `purged_through`: hidden by it.
    fn purged(&self, purged_through: Option<Millis>) -> usize {
        purged_through.map_or(0, |through| {
            let through = (Bound::Unbounded, Bound::Included((through, Id::MAX)));
            [
                &self.at_send,
                &self.moved,
                &self.waiting_at_send,
                &self.waiting_moved,
            ]
            .iter()
            .map(|set| set.range(through).count())
            .sum()
        })
    }
}

impl LocalView {
    pub fn update(&mut self, key: &RecordKey, record: Option<&Record>) {
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
            .by_send(None)
            .take_while(|(sent_at, _)| sent_at.plus_ms(retention_ms) <= now)
            .take(max)
            .map(|(_, id)| MessageId::from(id))
            .collect()
    }

    /// Up to `max` messages of the queue that look visible at `now` by this replica's records,
    /// oldest first, leaving out what the watermark `purged_through` (this node's copy) hides. A
    /// hint only: the quorum read decides.
    ///
    /// It first promotes what became visible since the last call (`&mut` for that), so it walks
    /// only records that were visible then or became visible since: messages in flight or
    /// delayed at the queue's head cost nothing, however many. When `now` is earlier than an
    /// earlier call's (the clock stepped back) the records visible only between the two are
    /// skipped one by one.
    #[must_use]
    pub fn candidates(
        &mut self,
        queue: &QueueName,
        incarnation: Incarnation,
        purged_through: Option<Millis>,
        now: Millis,
        max: usize,
    ) -> Vec<MessageId> {
        let Some(queue) = self.queues.get_mut(&(queue.clone(), incarnation)) else {
            return Vec::new();
        };
        queue.promote(now);
        queue
            .not_waiting_by_entry(purged_through)
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
        // The first of `hidden` past now, and any record sent after now that becomes visible
        // after it (sent in this clock's future by a peer's): not a walk of what is in flight.
        let hidden = queue.hidden_sent_by(now).next().map(|(at, _)| at);
        let sent_after = queue
            .by_send(Some(now))
            .map(|(_, id)| queue.seen(id).visible_at())
            .filter(|at| *at > now)
            .min();
        hidden.into_iter().chain(sent_after).min()
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
        // Signed tallies: the corrections below may subtract before they add.
        let (mut in_flight, mut delayed) = (0_i64, 0_i64);
        let mut tally = |seen: Seen, by: i64| {
            if seen.received() {
                in_flight += by;
            } else {
                delayed += by;
            }
        };
        // Between `promoted` and `now`, the records of `hidden` that the waiting sets count and
        // `now` does not (what became visible since the last receive), or the other way round
        // (what a clock that stepped back sees hidden again).
        let between = |a: Millis, b: Millis| {
            queue
                .hidden
                .range((Bound::Excluded((a, Id::MAX)), Bound::Included((b, Id::MAX))))
                .map(|(_, id)| queue.seen(*id))
        };
        if now > queue.promoted {
            for seen in between(queue.promoted, now) {
                tally(seen, -1);
            }
        } else {
            for seen in between(now, queue.promoted) {
                tally(seen, 1);
            }
        }
        // With the waiting sets, every record of `hidden` visible after `now` is tallied; the
        // purged prefix's are not shown.
        if let Some(through) = purged_through {
            let prefix = (Bound::Unbounded, Bound::Included((through, Id::MAX)));
            for set in [
                &queue.at_send,
                &queue.moved,
                &queue.waiting_at_send,
                &queue.waiting_moved,
            ] {
                for (_, id) in set.range(prefix) {
                    let seen = queue.seen(*id);
                    if seen.hidden_after_send() && seen.visible_at() > now {
                        tally(seen, -1);
                    }
                }
            }
        }
        // And a record visible from its send is invisible only before it: one sent in this
        // clock's future by a peer's.
        for (_, id) in queue.by_send(Some(now)) {
            let seen = queue.seen(id);
            if !seen.hidden_after_send()
                && seen.visible_at() > now
                && Some(seen.entered_at) > purged_through
            {
                tally(seen, 1);
            }
        }
        // The waiting records: those of `hidden` visible after `promoted`.
        let count = |n: i64| u64::try_from(n).expect("a count is never negative");
        let waiting = queue.waiting_at_send.len() + queue.waiting_moved.len();
        let (waiting, waiting_received) = (
            i64::try_from(waiting).expect("a count fits in 64 bits"),
            i64::try_from(queue.waiting_received).expect("a count fits in 64 bits"),
        );
        let in_flight = count(in_flight + waiting_received);
        let delayed = count(delayed + waiting - waiting_received);
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
            .by_send(None)
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
