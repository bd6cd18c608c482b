//! Fake-clock tests with real durations: every timer of the page at its edge, one millisecond
//! before and at the deadline.

use trireme_core::{Command, MessageState, Millis, Outcome, QueueAttributes, Reject, Wakeup};

use crate::support::{Node, START, secs};

const DAY_MS: u64 = 86_400_000;

#[test]
fn default_visibility_is_30_s() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    assert_eq!(delivery.message, id);
    node.at(secs(30) - 1);
    assert!(node.receive(&q, 1).is_empty(), "invisible at 29.999 s");
    node.at(secs(30));
    let again = node.receive_one(&q);
    assert_eq!(again.message, id);
    assert_eq!(again.receive_count, 2);
}

#[test]
fn receive_visibility_override_replaces_the_queue_default() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(5));
    node.at(secs(5) - 1);
    assert!(node.receive(&q, 1).is_empty());
    node.at(secs(5));
    assert_eq!(node.receive_one(&q).message, id);
}

#[test]
fn visibility_0_leaves_the_message_in_flight_until_the_next_action() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    assert_eq!(node.state(&q, id), MessageState::InFlight { until: START });
    assert_eq!(node.queues.next_deadline(), Some(START));
    // The next action, at the same time, restores it first and can receive it again.
    let again = node.receive_one(&q);
    assert_eq!(again.message, id);
    assert_eq!(again.receive_count, 2);
}

#[test]
fn delay_of_900_s_ends_at_900_s() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send_delayed(&q, "later", Some(900));
    assert_eq!(
        node.state(&q, id),
        MessageState::Delayed {
            until: START.plus_ms(secs(900))
        }
    );
    assert_eq!(node.queues.queue(&q).unwrap().counts.delayed, 1);
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(900))));
    node.at(secs(900) - 1);
    assert!(node.receive(&q, 1).is_empty());
    node.at(secs(900));
    assert_eq!(node.receive_one(&q).message, id);
}

#[test]
fn delay_over_900_s_is_refused() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let command = node.send_command(&q, "later", Some(901), None);
    assert!(matches!(
        node.run(command),
        Err(Reject::InvalidParameter {
            parameter: "DelaySeconds",
            ..
        })
    ));
    assert_eq!(node.queues.messages(&q).count(), 0);
}

#[test]
fn queue_delay_applies_unless_the_send_overrides_it() {
    let mut node = Node::new();
    let q = node.create_with(
        "slow",
        QueueAttributes {
            delay_s: 10,
            ..QueueAttributes::default()
        },
    );
    let delayed = node.send(&q, "default delay");
    let immediate = node.send_delayed(&q, "no delay", Some(0));
    assert_eq!(
        node.state(&q, delayed),
        MessageState::Delayed {
            until: START.plus_ms(secs(10))
        }
    );
    assert_eq!(
        node.state(&q, immediate),
        MessageState::Ready { since: START }
    );
}

#[test]
fn minimum_retention_of_60_s_expires_a_message_at_60_s() {
    let mut node = Node::new();
    let q = node.create_with(
        "short",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&q, "work");
    node.at(secs(60) - 1);
    node.advance();
    assert!(node.view(&q, id).is_some());
    node.at(secs(60));
    node.advance();
    assert_eq!(node.view(&q, id), None);
}

#[test]
fn default_retention_of_4_days_expires_a_message_at_4_days() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(4 * DAY_MS)));
    node.at(4 * DAY_MS - 1);
    node.advance();
    assert!(node.view(&q, id).is_some());
    node.at(4 * DAY_MS);
    node.advance();
    assert_eq!(node.view(&q, id), None);
}

#[test]
fn retention_expires_a_delayed_message() {
    let mut node = Node::new();
    let q = node.create_with(
        "short",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let id = node.send_delayed(&q, "late", Some(900));
    node.at(secs(60));
    node.advance();
    assert_eq!(node.view(&q, id), None);
    node.at(secs(900));
    assert!(node.receive(&q, 1).is_empty());
}

#[test]
fn long_poll_ends_empty_at_its_20_s_deadline() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 1, None, 20);
    assert_eq!(node.queues.waiters(&q), vec![waiter]);
    assert_eq!(
        node.queues.waiter_views(&q),
        vec![trireme_core::WaiterView {
            id: waiter,
            max: 1,
            visibility_s: 30,
            deadline: START.plus_ms(secs(20))
        }]
    );
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(20))));
    node.at(secs(20) - 1);
    assert_eq!(node.advance(), vec![]);
    node.at(secs(20));
    assert_eq!(node.advance(), vec![Wakeup::Empty { waiter }]);
    assert_eq!(node.queues.waiters(&q), vec![]);
}

#[test]
fn queue_receive_wait_applies_when_the_receive_does_not_say() {
    let mut node = Node::new();
    let q = node.create_with(
        "polled",
        QueueAttributes {
            receive_wait_s: 20,
            ..QueueAttributes::default()
        },
    );
    let command = node.receive_command(&q, 1, None, None);
    assert!(matches!(node.run(command), Ok(Outcome::Waiting { .. })));
}

#[test]
fn visibility_may_be_extended_to_12_h_after_the_receive_and_no_further() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.at(secs(3_600));
    // 1 h after the receive, 11 h more is the most allowed.
    assert_eq!(
        node.change_visibility(&q, &delivery.handle, 39_601).result,
        Err(Reject::VisibilityCapExceeded {
            message: id,
            requested_until_ms: START.plus_ms(secs(3_600 + 39_601)).0,
            cap_ms: START.plus_ms(secs(43_200)).0,
        })
    );
    assert_eq!(
        node.change_visibility(&q, &delivery.handle, 39_600).result,
        Ok(Outcome::VisibilityChanged)
    );
    node.at(secs(43_200) - 1);
    assert!(node.receive(&q, 1).is_empty());
    node.at(secs(43_200));
    assert_eq!(node.receive_one(&q).message, id);
}

#[test]
fn receive_with_12_h_visibility_is_allowed_and_more_is_refused() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "work");
    let command = node.receive_command(&q, 1, Some(43_201), Some(0));
    assert!(matches!(
        node.run(command),
        Err(Reject::InvalidParameter {
            parameter: "VisibilityTimeout",
            ..
        })
    ));
    let delivery = node.receive_with(&q, 1, Some(43_200)).pop().unwrap();
    assert_eq!(
        node.state(&q, delivery.message),
        MessageState::InFlight {
            until: START.plus_ms(secs(43_200))
        }
    );
}

#[test]
fn a_clock_stepping_back_is_treated_as_no_time_passing() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    node.receive_one(&q);
    node.at(secs(10));
    node.advance();
    // The clock steps back 10 s: time inside the core stays at 10 s, so the deadline stays
    // 20 s away (late, never early).
    node.at(0);
    node.advance();
    assert_eq!(node.queues.now(), START.plus_ms(secs(10)));
    node.at(secs(29));
    assert!(node.receive(&q, 1).is_empty());
    node.at(secs(30));
    assert_eq!(node.receive_one(&q).message, id);
}

#[test]
fn one_long_advance_fires_events_at_their_own_times() {
    let mut node = Node::new();
    let q = node.create_with(
        "short",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&q, "work");
    node.receive_one(&q);
    // The restore at 30 s happens before the expiry at 60 s: a waiter opened at 25 s with a
    // 20 s wait is served by the restore at 30 s even though time jumps straight to 100 s.
    node.at(secs(25));
    let waiter = node.long_poll(&q, 1, Some(10), 20);
    node.at(secs(100));
    let wakeups = node.advance();
    assert_eq!(wakeups.len(), 1);
    let Wakeup::Served { deliveries, .. } = &wakeups[0] else {
        panic!("{waiter} not served: {wakeups:?}");
    };
    assert_eq!(deliveries[0].message, id);
    assert_eq!(deliveries[0].receive_count, 2);
    assert_eq!(node.view(&q, id), None, "expired at 60 s");
}

#[test]
fn next_deadline_is_the_earliest_event() {
    let mut node = Node::new();
    assert_eq!(node.queues.next_deadline(), None);
    let q = node.create("jobs");
    assert_eq!(node.queues.next_deadline(), None);
    node.send_delayed(&q, "a", Some(100));
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(100))));
    node.send(&q, "b");
    node.receive_with(&q, 1, Some(50));
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(50))));
    let command = node.send_command(&q, "c", None, Some("d"));
    node.run(command).unwrap();
    node.receive_with(&q, 1, Some(200));
    node.at(secs(1));
    node.long_poll(&q, 1, None, 5);
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(6))));
    // Nothing is due before the deadline; at it, something changes.
    node.at(secs(6));
    assert_eq!(node.advance().len(), 1);
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(50))));
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    // Only the name's reuse window is left.
    assert_eq!(node.queues.next_deadline(), Some(START.plus_ms(secs(66))));
    node.at(secs(66));
    node.advance();
    assert_eq!(node.queues.next_deadline(), None);
    assert_eq!(node.queues.now(), Millis(START.0 + secs(66)));
}

#[test]
fn receives_follow_the_send_order_not_the_moment_a_message_became_ready() {
    // spec/queue-core.md#receive: a message whose visibility expired comes back before a
    // message sent after it, though that one has been ready longer.
    let mut node = Node::new();
    let q = node.create("jobs");
    let first = node.send(&q, "first");
    node.receive_with(&q, 1, Some(5));
    node.at(1_000);
    let second = node.send(&q, "second");
    node.at(secs(5));
    let order: Vec<_> = node
        .receive(&q, 10)
        .iter()
        .map(|delivery| delivery.message)
        .collect();
    assert_eq!(order, [first, second]);
}
