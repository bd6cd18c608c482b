//! Long polls: a waiter is served by the very action that makes a message of its queue ready
//! (spec/queue-core.md#serveq-internal-part-of-every-action-that-makes-a-message-of-q-ready),
//! oldest waiter first, and otherwise answered empty at its deadline.

use std::collections::BTreeMap;

use trireme_core::{
    AttributeValue, Command, MessageState, Outcome, QueueAttributes, Reject, Wakeup,
};

use crate::support::{Node, START, secs, served};

#[test]
fn waiter_open_when_a_message_is_sent_receives_the_stored_message_in_the_same_step() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 5, None, 20);
    node.at(secs(3));
    let attributes = BTreeMap::from([(
        "kind".to_owned(),
        AttributeValue::String {
            data_type: "String".to_owned(),
            value: "invoice".to_owned(),
        },
    )]);
    let id = node.fresh_id();
    let step = node.apply(Command::Send {
        queue: q.clone(),
        id,
        body: "pay 17".to_owned(),
        attributes: attributes.clone(),
        system: Default::default(),
        delay_s: None,
        dedup: None,
    });
    assert_eq!(
        step.result,
        Ok(Outcome::Sent {
            id,
            duplicate: false
        })
    );
    assert_eq!(step.wakeups.len(), 1);
    let deliveries = served(&step.wakeups[0], waiter);
    assert_eq!(deliveries.len(), 1);
    let delivery = &deliveries[0];
    let stored = node.view(&q, id).unwrap();
    assert_eq!(delivery.body, stored.body);
    assert_eq!(delivery.attributes, attributes);
    assert_eq!(delivery.sent_at, stored.sent_at);
    assert_eq!(delivery.receive_count, 1);
    assert_eq!(delivery.first_receive_at, START.plus_ms(secs(3)));
    assert_eq!(delivery.handle.seq, 1);
    // In flight in the state at that moment, with the handle the waiter got.
    assert_eq!(
        stored.state,
        MessageState::InFlight {
            until: START.plus_ms(secs(33))
        }
    );
    assert_eq!(stored.handle, Some(delivery.handle.seq));
    assert_eq!(node.queues.waiters(&q), vec![]);
    assert_eq!(
        node.delete(&q, &delivery.handle),
        Ok(Outcome::Deleted {
            already_gone: false
        })
    );
}

#[test]
fn waiter_is_served_by_the_end_of_a_delay() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send_delayed(&q, "later", Some(5));
    let waiter = node.long_poll(&q, 1, None, 20);
    node.at(secs(5));
    let wakeups = node.advance();
    assert_eq!(wakeups.len(), 1);
    assert_eq!(served(&wakeups[0], waiter)[0].message, id);
    assert!(matches!(node.state(&q, id), MessageState::InFlight { .. }));
}

#[test]
fn waiter_is_served_by_a_visibility_restore() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(10));
    node.at(secs(2));
    let waiter = node.long_poll(&q, 1, None, 20);
    node.at(secs(10));
    let wakeups = node.advance();
    let deliveries = served(&wakeups[0], waiter);
    assert_eq!(deliveries[0].message, id);
    assert_eq!(deliveries[0].receive_count, 2);
    assert_eq!(deliveries[0].handle.seq, 2);
}

#[test]
fn waiter_is_served_by_a_visibility_change_to_0() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    let waiter = node.long_poll(&q, 1, None, 20);
    node.at(secs(1));
    let step = node.change_visibility(&q, &delivery.handle, 0);
    assert_eq!(step.result, Ok(Outcome::VisibilityChanged));
    let deliveries = served(&step.wakeups[0], waiter);
    assert_eq!(deliveries[0].message, id);
    assert_eq!(deliveries[0].receive_count, 2);
}

#[test]
fn visibility_change_to_0_without_waiters_makes_the_message_ready_now() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.at(secs(4));
    node.change_visibility(&q, &delivery.handle, 0);
    assert_eq!(
        node.state(&q, id),
        MessageState::Ready {
            since: START.plus_ms(secs(4))
        }
    );
}

#[test]
fn waiter_is_served_by_a_redrive_arrival() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    assert!(
        node.receive(&q, 1).is_empty(),
        "moved to the dead-letter queue"
    );
    let waiter = node.long_poll(&q, 1, None, 20);
    let step = node.apply(Command::Redrive {
        from: dlq.clone(),
        to: None,
        max: 10,
        allowed: None,
    });
    assert_eq!(
        step.result,
        Ok(Outcome::Redriven {
            moved: 1,
            failed: 0
        })
    );
    let deliveries = served(&step.wakeups[0], waiter);
    assert_eq!(deliveries[0].message, id);
    assert_eq!(deliveries[0].receive_count, 1, "redrive reset the count");
}

#[test]
fn waiter_on_a_dead_letter_queue_is_served_by_the_move() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    let waiter = node.long_poll(&dlq, 1, None, 20);
    let command = node.receive_command(&q, 1, None, Some(0));
    let step = node.apply(command);
    assert_eq!(step.result, Ok(Outcome::Received(vec![])));
    let deliveries = served(&step.wakeups[0], waiter);
    assert_eq!(deliveries[0].message, id);
    assert_eq!(deliveries[0].queue, dlq);
    assert_eq!(deliveries[0].receive_count, 2, "the move kept the count");
    assert_eq!(deliveries[0].source, Some(q.clone()));
}

#[test]
fn waiters_are_served_first_come_first_served() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let first = node.long_poll(&q, 1, None, 20);
    node.at(1);
    let second = node.long_poll(&q, 1, None, 20);
    assert_eq!(node.queues.waiters(&q), vec![first, second]);
    let send = node.send_command(&q, "one", None, None);
    let step = node.apply(send);
    served(&step.wakeups[0], first);
    assert_eq!(node.queues.waiters(&q), vec![second]);
    let send = node.send_command(&q, "two", None, None);
    let step = node.apply(send);
    served(&step.wakeups[0], second);
}

#[test]
fn one_restore_of_several_messages_serves_several_waiters_in_order() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let a = node.send(&q, "a");
    let b = node.send(&q, "b");
    node.receive_with(&q, 2, Some(10));
    let first = node.long_poll(&q, 1, None, 20);
    let second = node.long_poll(&q, 1, None, 20);
    node.at(secs(10));
    let wakeups = node.advance();
    assert_eq!(wakeups.len(), 2);
    assert_eq!(served(&wakeups[0], first)[0].message, a);
    assert_eq!(served(&wakeups[1], second)[0].message, b);
}

#[test]
fn waiter_whose_messages_all_moved_to_the_dead_letter_queue_keeps_waiting() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(10));
    let waiter = node.long_poll(&q, 1, None, 20);
    node.at(secs(10));
    // The restore makes it ready; the waiter's receive moves it instead of delivering it.
    assert_eq!(node.advance(), vec![]);
    assert_eq!(node.queues.waiters(&q), vec![waiter]);
    assert!(node.view(&dlq, id).is_some());
    node.at(secs(20));
    assert_eq!(node.advance(), vec![Wakeup::Empty { waiter }]);
}

#[test]
fn cancelled_waiter_is_removed_without_an_answer() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 1, None, 20);
    assert_eq!(
        node.run(Command::CancelWaiter { waiter }),
        Ok(Outcome::Done)
    );
    assert_eq!(node.queues.waiters(&q), vec![]);
    let id = node.send(&q, "work");
    assert_eq!(node.state(&q, id), MessageState::Ready { since: START });
    node.at(secs(20));
    assert_eq!(node.advance(), vec![]);
}

#[test]
fn deleting_a_queue_answers_its_waiters_empty() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 1, None, 20);
    let step = node.apply(Command::DeleteQueue { name: q.clone() });
    assert_eq!(step.result, Ok(Outcome::Done));
    assert_eq!(step.wakeups, vec![Wakeup::Empty { waiter }]);
    assert_eq!(node.queues.waiters(&q), vec![]);
}

#[test]
fn purge_leaves_waiters_waiting() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 1, None, 20);
    assert_eq!(
        node.run(Command::PurgeQueue { name: q.clone() }),
        Ok(Outcome::Done)
    );
    assert_eq!(node.queues.waiters(&q), vec![waiter]);
}

#[test]
fn second_open_waiter_with_the_same_id_is_refused() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 1, None, 20);
    let step = node.apply(Command::Receive {
        queue: q.clone(),
        max: 1,
        visibility_s: None,
        wait_s: Some(5),
        waiter,
    });
    assert_eq!(step.result, Err(Reject::WaiterExists { waiter }));
    // A short poll may reuse the id: it never becomes a waiter.
    let step = node.apply(Command::Receive {
        queue: q.clone(),
        max: 1,
        visibility_s: None,
        wait_s: Some(0),
        waiter,
    });
    assert_eq!(step.result, Ok(Outcome::Received(vec![])));
}

#[test]
fn long_poll_with_a_ready_message_returns_at_once() {
    let mut node = Node::new();
    let q = node.create_with(
        "polled",
        QueueAttributes {
            receive_wait_s: 20,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&q, "work");
    let command = node.receive_command(&q, 10, None, None);
    let Ok(Outcome::Received(deliveries)) = node.run(command) else {
        panic!("a long poll with a ready message waited");
    };
    assert_eq!(deliveries[0].message, id);
}

#[test]
fn cancel_arriving_after_the_waiter_was_served_finds_nothing_to_cancel() {
    // Found by the random test: the cancel's own time advance restores a message left
    // in flight with visibility 0 and serves the waiter before the cancel runs.
    let mut node = Node::new();
    let q = node.create("jobs");
    let first = node.long_poll(&q, 1, Some(0), 3);
    let second = node.long_poll(&q, 1, Some(0), 3);
    let send = node.send_command(&q, "m", None, None);
    let step = node.apply(send);
    served(&step.wakeups[0], first);
    let step = node.apply(Command::CancelWaiter { waiter: second });
    assert_eq!(step.result, Ok(Outcome::Done));
    assert_eq!(step.wakeups.len(), 1);
    served(&step.wakeups[0], second);
}
