//! The invariants of spec/queue-core.md#invariants that the code can see, plus the consistency
//! of every index with the message map, asserted after every step in debug builds. One
//! condition per `assert!`, so a failure names exactly what broke. This module only reads.

use crate::limits;
use crate::message::MessageState;
use crate::queues::Queues;

impl Queues {
    /// Panics if any invariant is broken. O(messages + waiters + deduplication entries).
    pub(crate) fn check_invariants(&self) {
        let now = self.now;
        let mut stored = 0;
        let mut waiting = 0;
        for (name, queue) in &self.queues {
            // Indexes agree with the message map: every entry names a message of this queue in
            // exactly that state, and every message of the queue is in one state index.
            for &(since, id) in &queue.ready {
                let message = &self.messages[&id];
                assert_eq!(&message.queue, name, "ready index of {name} holds {id}");
                assert_eq!(message.state, MessageState::Ready { since });
            }
            for &(until, id) in &queue.delayed {
                let message = &self.messages[&id];
                assert_eq!(&message.queue, name, "delay index of {name} holds {id}");
                assert_eq!(message.state, MessageState::Delayed { until });
            }
            for &(until, id) in &queue.in_flight {
                let message = &self.messages[&id];
                assert_eq!(&message.queue, name, "in-flight index of {name} holds {id}");
                assert_eq!(message.state, MessageState::InFlight { until });
            }
            for &(sent_at, id) in &queue.retained {
                let message = self.messages.get(&id);
                assert!(
                    message.is_some(),
                    "retention index of {name} holds gone {id}"
                );
                let message = message.expect("asserted above");
                assert_eq!(&message.queue, name);
                assert_eq!(message.sent_at, sent_at);
            }
            // Counters are the index sizes; together they count every stored message.
            let counts = queue.counts();
            assert_eq!(
                counts.ready + counts.in_flight + counts.delayed,
                queue.retained.len() as u64
            );
            stored += queue.retained.len();

            // I3 no-idle-waiter.
            assert!(
                queue.waiters.is_empty() || queue.ready.is_empty(),
                "{name} has a waiter and a ready message"
            );
            // I11 timers-fire: nothing is overdue.
            if let Some(&(until, id)) = queue.delayed.first() {
                assert!(until > now, "{id} delayed until {until} at {now}");
            }
            if let Some(&(until, id)) = queue.in_flight.first() {
                assert!(until >= now, "{id} in flight until {until} at {now}");
            }
            if let Some((expires_at, id)) = queue.next_expiry() {
                assert!(expires_at > now, "{id} past retention at {now}");
            }
            if let Some(&(deadline, _)) = queue.waiter_deadlines.first() {
                assert!(deadline > now, "a waiter of {name} is past its deadline");
            }
            if let Some((expires_at, _)) = queue.dedup_expiry.first() {
                assert!(*expires_at > now, "a deduplication entry of {name} expired");
            }
            // Caps.
            assert!(queue.in_flight.len() as u64 <= limits::inflight_per_queue_max);
            assert!(queue.waiters.len() <= limits::waiters_per_queue_max);
            assert!(queue.tags.len() <= limits::tags_per_queue_max);

            // Waiter indexes agree.
            assert_eq!(queue.waiters.len(), queue.waiter_deadlines.len());
            for (&arrival, waiter) in &queue.waiters {
                assert!(queue.waiter_deadlines.contains(&(waiter.deadline, arrival)));
                assert_eq!(
                    self.waiter_index.get(&waiter.id),
                    Some(&(name.clone(), arrival))
                );
                assert!(waiter.max >= 1);
                assert!(waiter.max <= limits::batch_entries_max);
            }
            waiting += queue.waiters.len();

            // Deduplication indexes agree.
            assert_eq!(queue.dedup.len(), queue.dedup_expiry.len());
            for (dedup, entry) in &queue.dedup {
                assert!(
                    queue
                        .dedup_expiry
                        .contains(&(entry.expires_at, dedup.clone()))
                );
            }

            // A redrive policy never names its own queue.
            if let Some(policy) = &queue.attributes.redrive {
                assert!(&policy.dead_letter_queue != name);
            }
            // A live queue's name is not also remembered as deleted.
            assert!(!self.deleted_names.contains_key(name));
        }
        assert_eq!(
            stored,
            self.messages.len(),
            "messages outside every queue index"
        );
        assert_eq!(
            waiting,
            self.waiter_index.len(),
            "waiters outside every queue"
        );

        for (id, message) in &self.messages {
            // I10 first-receive-known.
            assert_eq!(
                message.first_receive_at.is_some(),
                message.receive_count > 0,
                "{id}: first_receive_at against receive_count {}",
                message.receive_count
            );
            if let Some(first_receive_at) = message.first_receive_at {
                let received_at = message.received_at;
                assert!(received_at.is_some(), "{id} received but no received_at");
                let received_at = received_at.expect("asserted above");
                assert!(first_receive_at <= received_at);
                assert!(received_at <= now);
            }
            // I1 handle-fresh: the handle is the newest seq ever issued.
            assert!(message.handle.is_none() || message.handle == Some(message.last_seq));
            assert!(message.receive_count <= message.last_seq);
            assert!(message.sent_at <= now);
            if let MessageState::InFlight { until } = message.state {
                // Only a receive or a visibility change puts a message in flight.
                assert!(message.handle.is_some(), "{id} in flight without a handle");
                let received_at = message.received_at.expect("a handle implies a receive");
                // I12 visibility-cap.
                assert!(until <= received_at.plus_ms(limits::visibility_total_ms_max));
            }
            if let Some(source) = &message.source {
                assert!(source != &message.queue, "{id} moved from its own queue");
            }
        }

        // Deleted names and their release times agree.
        assert_eq!(self.deleted_names.len(), self.name_releases.len());
        for (name, deleted_at) in &self.deleted_names {
            let release_at = deleted_at.plus_ms(limits::queue_name_reuse_ms);
            assert!(self.name_releases.contains(&(release_at, name.clone())));
            assert!(release_at > now, "{name} should have been released");
        }
    }
}
