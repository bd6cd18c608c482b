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
            for &(sent_at, id) in &queue.ready {
                let message = &self.messages[&id];
                assert_eq!(&message.queue, name, "ready index of {name} holds {id}");
                assert!(
                    matches!(message.state, MessageState::Ready { .. }),
                    "ready index of {name} holds {id} in another state"
                );
                assert_eq!(
                    message.sent_at, sent_at,
                    "ready index of {name} holds {id} out of send order"
                );
            }
            for &(until, id) in &queue.delayed {
                let message = &self.messages[&id];
                assert_eq!(&message.queue, name, "delay index of {name} holds {id}");
                assert_eq!(
                    message.state,
                    MessageState::Delayed { until },
                    "delay index of {name} holds {id} in another state"
                );
            }
            for &(until, id) in &queue.in_flight {
                let message = &self.messages[&id];
                assert_eq!(&message.queue, name, "in-flight index of {name} holds {id}");
                assert_eq!(
                    message.state,
                    MessageState::InFlight { until },
                    "in-flight index of {name} holds {id} in another state"
                );
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
                queue.retained.len() as u64,
                "state indexes of {name} do not count every stored message"
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

            // The agenda holds this queue at the time of its next event, and only there.
            assert_eq!(
                queue.scheduled,
                queue.next_event(),
                "{name} is scheduled wrongly"
            );
            if let Some(scheduled) = queue.scheduled {
                assert!(self.agenda.contains(&(scheduled, name.clone())));
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

#[cfg(test)]
mod tests {
    //! Each invariant broken on purpose: the check must catch it. The state is built through
    //! `apply`, then one field is corrupted behind the state machine's back.

    use std::collections::BTreeMap;

    use crate::command::Command;
    use crate::ids::{MessageId, Millis, QueueName, WaiterId};
    use crate::message::MessageState;
    use crate::queue::Waiter;
    use crate::queues::Queues;
    use crate::{QueueAttributes, limits};

    const T0: Millis = Millis(1_000_000);

    fn jobs() -> QueueName {
        QueueName::try_from("jobs").unwrap()
    }

    /// One queue `jobs` with message 1 in flight (received at T0) and message 2 ready.
    fn busy() -> Queues {
        let mut queues = Queues::new();
        let commands = [
            Command::CreateQueue {
                name: jobs(),
                attributes: QueueAttributes::default(),
                tags: BTreeMap::new(),
            },
            send(1),
            Command::Receive {
                queue: jobs(),
                max: 1,
                visibility_s: None,
                wait_s: None,
                waiter: WaiterId(0),
            },
            send(2),
        ];
        for command in commands {
            queues.apply(T0, command).result.unwrap();
        }
        queues.check_invariants();
        queues
    }

    fn send(id: u128) -> Command {
        Command::Send {
            queue: jobs(),
            id: MessageId(id),
            body: "m".to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
            delay_s: None,
            dedup: None,
        }
    }

    #[test]
    fn the_untouched_state_passes() {
        busy().check_invariants();
    }

    #[test]
    #[should_panic(expected = "jobs is scheduled wrongly")]
    fn stale_agenda_entry_is_caught() {
        let mut queues = busy();
        let queue = queues.queues.get_mut(&jobs()).unwrap();
        queue.in_flight.clear();
        queue.ready.insert((T0, MessageId(1)));
        queues.messages.get_mut(&MessageId(1)).unwrap().state = MessageState::Ready { since: T0 };
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "has a waiter and a ready message")]
    fn idle_waiter_beside_a_ready_message_is_caught() {
        let mut queues = busy();
        let waiter = Waiter {
            id: WaiterId(9),
            max: 1,
            visibility_s: 30,
            deadline: T0.plus_s(20),
        };
        queues
            .queues
            .get_mut(&jobs())
            .unwrap()
            .push_waiter(99, waiter);
        queues.waiter_index.insert(WaiterId(9), (jobs(), 99));
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "first_receive_at against receive_count")]
    fn received_message_without_first_receive_time_is_caught() {
        let mut queues = busy();
        queues
            .messages
            .get_mut(&MessageId(1))
            .unwrap()
            .first_receive_at = None;
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "first_receive_at <= received_at")]
    fn first_receive_after_latest_receive_is_caught() {
        let mut queues = busy();
        queues
            .messages
            .get_mut(&MessageId(1))
            .unwrap()
            .first_receive_at = Some(T0.plus_ms(1));
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "message.handle == Some(message.last_seq)")]
    fn handle_older_than_the_newest_receive_is_caught() {
        let mut queues = busy();
        queues.messages.get_mut(&MessageId(1)).unwrap().last_seq = 2;
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "visibility_total_ms_max")]
    fn in_flight_deadline_past_the_12_h_cap_is_caught() {
        let mut queues = busy();
        let until = T0.plus_ms(limits::visibility_total_ms_max + 1);
        move_state(&mut queues, 1, MessageState::InFlight { until });
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "delayed until")]
    fn overdue_delay_is_caught() {
        let mut queues = busy();
        move_state(&mut queues, 2, MessageState::Delayed { until: T0 });
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "in flight until")]
    fn overdue_visibility_is_caught() {
        let mut queues = busy();
        queues.now = T0.plus_s(31);
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "past retention")]
    fn message_past_retention_is_caught() {
        let mut queues = busy();
        queues
            .queues
            .get_mut(&jobs())
            .unwrap()
            .attributes
            .retention_s = 0;
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "ready index of jobs holds")]
    fn index_entry_for_a_message_of_another_state_is_caught() {
        let mut queues = busy();
        let queue = queues.queues.get_mut(&jobs()).unwrap();
        queue.ready.insert((T0, MessageId(1)));
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "do not count every stored message")]
    fn message_missing_from_its_state_index_is_caught() {
        let mut queues = busy();
        let queue = queues.queues.get_mut(&jobs()).unwrap();
        queue.ready.clear();
        queues.check_invariants();
    }

    #[test]
    #[should_panic(expected = "messages outside every queue index")]
    fn message_outside_every_index_is_caught() {
        let mut queues = busy();
        let mut stray = queues.messages[&MessageId(2)].clone();
        stray.sent_at = T0;
        queues.messages.insert(MessageId(3), stray);
        queues.check_invariants();
    }

    /// Changes a message's state and its index entry together, bypassing the transitions.
    fn move_state(queues: &mut Queues, id: u128, state: MessageState) {
        let id = MessageId(id);
        let message = queues.messages.get_mut(&id).unwrap();
        let queue = queues.queues.get_mut(&message.queue).unwrap();
        queue.unindex_state(id, message.state, message.sent_at);
        queue.index_state(id, state, message.sent_at);
        message.state = state;
        queues.reschedule(&jobs());
    }
}
