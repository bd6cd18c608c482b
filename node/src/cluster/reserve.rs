//! The candidates this coordinator's receives are claiming right now (spec/replication.md,
//! Considerations, *Candidate order*): a receive reserves the messages it tries, from choosing
//! them until its claims have all answered, and the node's other receives skip them. Local and in
//! memory; a hint like the rest of candidate choice, never a safety question.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use trireme_core::{Incarnation, MessageId, QueueName};

type Reserved = HashMap<(QueueName, Incarnation), HashSet<MessageId>>;

/// The reservations of one coordinator. Cheap to clone (shared).
#[derive(Clone, Default)]
pub(super) struct Claiming {
    reserved: Arc<Mutex<Reserved>>,
}

/// A receive's reservation: its messages are skipped by the node's other receives until this is
/// dropped (its claims answered, or the receive cancelled).
#[must_use = "the messages are reserved only while this lives"]
pub(super) struct Reservation {
    reserved: Arc<Mutex<Reserved>>,
    queue: (QueueName, Incarnation),
    messages: Vec<MessageId>,
}

impl Claiming {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reserved> {
        // A panic while holding the lock leaves a consistent map (every change is one insert or
        // remove): go on with it.
        self.reserved.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many of the queue's messages are reserved now: how many more candidates a receive
    /// reads from the view so that it still finds enough once they are left out.
    pub(super) fn count(&self, queue: &QueueName, incarnation: Incarnation) -> usize {
        self.lock()
            .get(&(queue.clone(), incarnation))
            .map_or(0, HashSet::len)
    }

    /// `candidates` without those reserved now, in their order.
    pub(super) fn unreserved(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        mut candidates: Vec<MessageId>,
    ) -> Vec<MessageId> {
        if let Some(reserved) = self.lock().get(&(queue.clone(), incarnation)) {
            candidates.retain(|id| !reserved.contains(id));
        }
        candidates
    }

    /// Reserves the first `max` of `candidates` that no other receive holds, in their order,
    /// and returns them with their reservation. Checking and reserving are one step, so two
    /// receives never hold one message.
    pub(super) fn reserve(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        candidates: Vec<MessageId>,
        max: usize,
    ) -> (Vec<MessageId>, Reservation) {
        let key = (queue.clone(), incarnation);
        let mut chosen = Vec::with_capacity(max.min(candidates.len()));
        {
            let mut reserved = self.lock();
            let held = reserved.entry(key.clone()).or_default();
            for id in candidates {
                if chosen.len() == max {
                    break;
                }
                if held.insert(id) {
                    chosen.push(id);
                }
            }
            if held.is_empty() {
                reserved.remove(&key);
            }
        }
        let reservation = Reservation {
            reserved: Arc::clone(&self.reserved),
            queue: key,
            messages: chosen.clone(),
        };
        (chosen, reservation)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.messages.is_empty() {
            return;
        }
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = reserved.get_mut(&self.queue) {
            for id in &self.messages {
                held.remove(id);
            }
            if held.is_empty() {
                reserved.remove(&self.queue);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str) -> QueueName {
        QueueName::try_from(name).expect("a valid name")
    }

    fn ids(range: std::ops::Range<u128>) -> Vec<MessageId> {
        range.map(MessageId).collect()
    }

    const INCARNATION: Incarnation = Incarnation {
        hlc_ms: 1,
        node: 1,
        nonce: 1,
    };

    #[test]
    fn a_second_receive_skips_what_the_first_holds_and_takes_the_next_oldest() {
        let claiming = Claiming::default();
        let q = queue("q");
        let (first, _held) = claiming.reserve(&q, INCARNATION, ids(0..30), 10);
        assert_eq!(first, ids(0..10));
        let (second, _also) = claiming.reserve(&q, INCARNATION, ids(0..30), 10);
        assert_eq!(second, ids(10..20));
        assert_eq!(claiming.count(&q, INCARNATION), 20);
        assert_eq!(
            claiming.unreserved(&q, INCARNATION, ids(5..25)),
            ids(20..25)
        );
    }

    #[test]
    fn dropping_a_reservation_frees_its_messages_and_no_others() {
        let claiming = Claiming::default();
        let q = queue("q");
        let (_, first) = claiming.reserve(&q, INCARNATION, ids(0..10), 10);
        let (_, second) = claiming.reserve(&q, INCARNATION, ids(0..20), 10);
        drop(first);
        assert_eq!(claiming.count(&q, INCARNATION), 10);
        let (again, _third) = claiming.reserve(&q, INCARNATION, ids(0..20), 10);
        assert_eq!(again, ids(0..10));
        drop(second);
        assert_eq!(
            claiming.unreserved(&q, INCARNATION, ids(0..20)),
            ids(10..20)
        );
    }

    #[test]
    fn nothing_is_left_behind_once_every_reservation_is_dropped() {
        let claiming = Claiming::default();
        let q = queue("q");
        let (_, a) = claiming.reserve(&q, INCARNATION, ids(0..3), 10);
        // Everything it offers is held: it reserves nothing and leaves no entry of its own.
        let (none, b) = claiming.reserve(&q, INCARNATION, ids(0..3), 10);
        assert!(none.is_empty());
        drop(a);
        drop(b);
        assert!(claiming.lock().is_empty());
    }

    #[test]
    fn queues_and_incarnations_are_reserved_apart() {
        let claiming = Claiming::default();
        let q = queue("q");
        let other = Incarnation {
            nonce: 2,
            ..INCARNATION
        };
        let (_, _held) = claiming.reserve(&q, INCARNATION, ids(0..10), 10);
        let (same_ids, _b) = claiming.reserve(&q, other, ids(0..10), 10);
        assert_eq!(same_ids, ids(0..10));
        let (other_queue, _c) = claiming.reserve(&queue("r"), INCARNATION, ids(0..10), 10);
        assert_eq!(other_queue, ids(0..10));
    }
}
