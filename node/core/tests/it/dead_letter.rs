//! Dead-letter moves inside receive, dead-letter-now by the holder of the current handle, and
//! redrive out of a dead-letter queue
//! (spec/queue-core.md#deadlettermovem-q--d-internal-part-of-receive, #deadletternowq-handle,
//! #redrived-to-max).

use trireme_core::{
    Command, GoneReason, HandleProblem, MessageState, Outcome, QueueAttributes, ReceiptHandle,
    Reject, Wakeup,
};

use crate::support::{Node, START, name, secs};

#[test]
fn dead_letter_move_keeps_the_count_and_sets_the_source() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 2);
    let id = node.send(&q, "poison");
    let first = node.receive_with(&q, 1, Some(0)).pop().unwrap();
    node.at(secs(1));
    node.receive_with(&q, 1, Some(0));
    node.at(secs(2));
    // Count 2 reached maxReceiveCount 2: this receive moves it and delivers nothing.
    assert!(node.receive(&q, 10).is_empty());
    assert_eq!(node.view(&q, id), None);
    let moved = node.view(&dlq, id).unwrap();
    assert_eq!(moved.receive_count, 2, "the move is not a receive");
    assert_eq!(moved.source, Some(q.clone()));
    assert_eq!(moved.handle, None, "handles are per queue");
    assert_eq!(moved.first_receive_at, Some(START));
    assert_eq!(moved.sent_at, START);
    assert_eq!(
        moved.state,
        MessageState::Ready {
            since: START.plus_ms(secs(2))
        }
    );
    // A consumer of the dead-letter queue sees how often it failed, and where it came from.
    let delivery = node.receive_one(&dlq);
    assert_eq!(delivery.receive_count, 3);
    assert_eq!(delivery.source, Some(q.clone()));
    assert_eq!(delivery.first_receive_at, START);
    // The old handle of the source queue names a message that is no longer there.
    assert_eq!(
        node.delete(&q, &first.handle),
        Ok(Outcome::Deleted { already_gone: true })
    );
}

#[test]
fn receive_delivers_the_next_message_when_one_is_moved() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let poison = node.send(&q, "poison");
    node.receive_with(&q, 1, Some(0));
    node.at(1);
    let good = node.send(&q, "good");
    let deliveries = node.receive(&q, 1);
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].message, good);
    assert!(node.view(&dlq, poison).is_some());
}

#[test]
fn missing_dead_letter_queue_makes_the_policy_inert() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    node.run(Command::DeleteQueue { name: dlq.clone() })
        .unwrap();
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    let again = node.receive_one(&q);
    assert_eq!(again.message, id);
    assert_eq!(again.receive_count, 2);
    // The policy still names the missing queue and works again once it exists.
    node.at(secs(60));
    node.create("dlq");
    node.at(secs(61));
    assert!(node.receive(&q, 1).is_empty());
    assert!(node.view(&dlq, id).is_some());
}

#[test]
fn redrive_without_destination_returns_messages_to_their_source() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let a = node.create_with_dlq("a", &dlq, 1);
    let b = node.create_with_dlq("b", &dlq, 1);
    let from_a = node.send(&a, "from a");
    let from_b = node.send(&b, "from b");
    node.receive_with(&a, 1, Some(0));
    node.receive_with(&b, 1, Some(0));
    node.at(secs(1));
    assert!(node.receive(&a, 1).is_empty());
    assert!(node.receive(&b, 1).is_empty());
    node.at(secs(2));
    assert_eq!(
        node.redrive(&dlq, None, 10),
        Ok(Outcome::Redriven {
            moved: 2,
            failed: 0
        })
    );
    for (queue, id) in [(&a, from_a), (&b, from_b)] {
        let view = node.view(queue, id).unwrap();
        assert_eq!(view.receive_count, 0);
        assert_eq!(view.first_receive_at, None);
        assert_eq!(view.handle, None);
        assert_eq!(view.source, None);
        assert_eq!(view.sent_at, START, "redrive keeps the original send time");
        assert_eq!(
            view.state,
            MessageState::Ready {
                since: START.plus_ms(secs(2))
            }
        );
    }
}

#[test]
fn redrive_to_a_named_queue_moves_there() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let replay = node.create("replay");
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    assert!(node.receive(&q, 1).is_empty());
    assert_eq!(
        node.redrive(&dlq, Some(&replay), 10),
        Ok(Outcome::Redriven {
            moved: 1,
            failed: 0
        })
    );
    assert_eq!(node.view(&q, id), None);
    assert_eq!(node.receive_one(&replay).message, id);
}

#[test]
fn redrive_counts_failures_when_the_target_is_missing() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    assert!(node.receive(&q, 1).is_empty());
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    assert_eq!(
        node.redrive(&dlq, None, 10),
        Ok(Outcome::Redriven {
            moved: 0,
            failed: 1
        })
    );
    assert!(node.view(&dlq, id).is_some(), "a failed message stays");
    let nowhere = trireme_core::QueueName::try_from("nowhere").unwrap();
    assert_eq!(
        node.redrive(&dlq, Some(&nowhere), 10),
        Ok(Outcome::Redriven {
            moved: 0,
            failed: 1
        })
    );
}

#[test]
fn a_restricted_redrive_leaves_messages_bound_outside_it_in_the_dead_letter_queue() {
    let mut node = Node::new();
    let dlq = node.create("orders-dlq");
    let ours = node.create_with_dlq("orders-eu", &dlq, 1);
    let theirs = node.create_with_dlq("payroll", &dlq, 1);
    let salary = node.send(&theirs, "salary");
    let order = node.send(&ours, "order");
    node.receive_with(&theirs, 1, Some(0));
    node.receive_with(&ours, 1, Some(0));
    node.at(secs(1));
    assert!(node.receive(&theirs, 1).is_empty());
    assert!(node.receive(&ours, 1).is_empty());
    // The message bound outside the prefix stays; the other one still goes.
    assert_eq!(
        node.redrive_within(&dlq, None, 10, &["orders-"]),
        Ok(Outcome::Redriven {
            moved: 1,
            failed: 1
        })
    );
    assert!(
        node.view(&dlq, salary).is_some(),
        "outside the prefix: stays"
    );
    assert_eq!(node.view(&theirs, salary), None);
    assert!(node.view(&ours, order).is_some());
    // A named destination outside the restriction is refused message by message too.
    assert_eq!(
        node.redrive_within(&dlq, Some(&theirs), 10, &["orders-", "billing-"]),
        Ok(Outcome::Redriven {
            moved: 0,
            failed: 1
        })
    );
    // Unrestricted, it goes home.
    assert_eq!(
        node.redrive(&dlq, None, 10),
        Ok(Outcome::Redriven {
            moved: 1,
            failed: 0
        })
    );
    assert!(node.view(&theirs, salary).is_some());
}

#[test]
fn redrive_of_a_message_without_source_and_without_destination_fails() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let id = node.send(&dlq, "sent straight to the dead-letter queue");
    assert_eq!(
        node.redrive(&dlq, None, 10),
        Ok(Outcome::Redriven {
            moved: 0,
            failed: 1
        })
    );
    assert!(node.view(&dlq, id).is_some());
}

#[test]
fn redrive_moves_only_ready_messages_and_at_most_max() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let replay = node.create("replay");
    let ids: Vec<_> = (0..4)
        .map(|i| {
            node.at(i);
            node.send(&dlq, "m")
        })
        .collect();
    let held = node.receive_one(&dlq);
    assert_eq!(held.message, ids[0]);
    assert_eq!(
        node.redrive(&dlq, Some(&replay), 2),
        Ok(Outcome::Redriven {
            moved: 2,
            failed: 0
        })
    );
    // The in-flight one stays (a consumer holds it); the oldest ready ones moved.
    assert!(node.view(&dlq, ids[0]).is_some());
    assert!(node.view(&replay, ids[1]).is_some());
    assert!(node.view(&replay, ids[2]).is_some());
    assert!(node.view(&dlq, ids[3]).is_some());
}

#[test]
fn retention_counts_from_the_original_send_after_a_redrive() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let replay = node.create_with(
        "replay",
        QueueAttributes {
            retention_s: 120,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&dlq, "m");
    node.at(secs(100));
    node.redrive(&dlq, Some(&replay), 1).unwrap();
    node.at(secs(120) - 1);
    node.advance();
    assert!(node.view(&replay, id).is_some());
    node.at(secs(120));
    node.advance();
    assert_eq!(node.view(&replay, id), None);
}

#[test]
fn message_moved_into_a_queue_whose_retention_it_already_passed_is_gone() {
    let mut node = Node::new();
    let dlq = node.create_with(
        "dlq",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "old");
    node.receive_with(&q, 1, Some(0));
    node.at(secs(90));
    assert!(node.receive(&q, 1).is_empty());
    assert_eq!(node.view(&q, id), None);
    assert_eq!(node.view(&dlq, id), None);
}

#[test]
fn redrive_to_the_queue_itself_is_refused() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    assert!(matches!(
        node.redrive(&dlq, Some(&dlq), 1),
        Err(Reject::InvalidParameter {
            parameter: "DestinationArn",
            ..
        })
    ));
}

#[test]
fn dead_letter_sources_lists_the_queues_naming_it() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let b = node.create_with_dlq("b", &dlq, 3);
    let a = node.create_with_dlq("a", &dlq, 3);
    node.create("unrelated");
    assert_eq!(node.queues.dead_letter_sources(&dlq), vec![a, b]);
}

#[test]
fn dead_letter_now_moves_the_message_with_its_id_count_and_source() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let id = node.send(&q, "poison");
    node.at(secs(1));
    let delivery = node.receive_one(&q);
    node.at(secs(2));
    let step = node.dead_letter_now(&q, &delivery.handle);
    assert_eq!(
        step.result,
        Ok(Outcome::DeadLettered {
            dead_letter_queue: dlq.clone()
        })
    );
    assert_eq!(node.view(&q, id), None);
    let moved = node.view(&dlq, id).unwrap();
    assert_eq!(moved.receive_count, 1, "dead-letter-now is not a receive");
    assert_eq!(moved.last_seq, 1);
    assert_eq!(moved.source, Some(q.clone()));
    assert_eq!(moved.handle, None, "handles are per queue");
    assert_eq!(moved.first_receive_at, Some(START.plus_ms(secs(1))));
    assert_eq!(moved.sent_at, START);
    assert_eq!(
        moved.state,
        MessageState::Ready {
            since: START.plus_ms(secs(2))
        }
    );
    // The first receive in the dead-letter queue issues the next handle and counts on.
    let in_dlq = node.receive_one(&dlq);
    assert_eq!(
        (in_dlq.message, in_dlq.receive_count, in_dlq.handle.seq),
        (id, 2, 2)
    );
    assert_eq!(in_dlq.source, Some(q.clone()));
    // A retry after a lost reply finds the message gone from the source.
    assert_eq!(
        node.dead_letter_now(&q, &delivery.handle).result,
        Err(Reject::MessageNotInFlight { message: id })
    );
}

#[test]
fn dead_letter_now_serves_a_waiter_of_the_dead_letter_queue_in_the_same_step() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let id = node.send(&q, "poison");
    let waiter = node.long_poll(&dlq, 1, Some(30), 20);
    let delivery = node.receive_one(&q);
    let step = node.dead_letter_now(&q, &delivery.handle);
    assert!(step.result.is_ok());
    let [
        Wakeup::Served {
            waiter: served,
            deliveries,
        },
    ] = &step.wakeups[..]
    else {
        panic!("expected one served waiter: {:?}", step.wakeups);
    };
    assert_eq!(*served, waiter);
    assert_eq!(
        (deliveries[0].message, deliveries[0].receive_count),
        (id, 2)
    );
    assert_eq!(deliveries[0].source, Some(q));
}

#[test]
fn dead_letter_now_with_the_current_handle_works_after_the_visibility_timeout() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let id = node.send(&q, "slow");
    let delivery = node.receive_with(&q, 1, Some(10)).pop().unwrap();
    node.at(secs(11));
    assert!(node.advance().is_empty());
    assert!(matches!(node.state(&q, id), MessageState::Ready { .. }));
    assert!(node.dead_letter_now(&q, &delivery.handle).result.is_ok());
    assert_eq!(node.view(&dlq, id).unwrap().receive_count, 1);
}

#[test]
fn dead_letter_now_refuses_what_a_visibility_change_refuses() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let other = node.create_with_dlq("other", &dlq, 5);
    let id = node.send(&q, "m");
    let first = node.receive_with(&q, 1, Some(0)).pop().unwrap();
    let second = node.receive_one(&q);
    assert_eq!(
        node.dead_letter_now(&q, &first.handle).result,
        Err(Reject::StaleReceiptHandle { message: id })
    );
    assert_eq!(
        node.dead_letter_now(&other, &second.handle).result,
        Err(Reject::ReceiptHandleInvalid {
            reason: HandleProblem::WrongQueue
        })
    );
    let never = ReceiptHandle {
        seq: 3,
        ..second.handle.clone()
    };
    assert_eq!(
        node.dead_letter_now(&q, &never).result,
        Err(Reject::ReceiptHandleInvalid {
            reason: HandleProblem::NeverIssued
        })
    );
    assert_eq!(
        node.dead_letter_now(&name("missing"), &second.handle)
            .result,
        Err(Reject::QueueNotFound {
            name: name("missing")
        })
    );
    // Every refusal changed nothing: the newest handle still moves it.
    assert_eq!(node.view(&q, id).unwrap().handle, Some(2));
    assert!(node.dead_letter_now(&q, &second.handle).result.is_ok());
}

#[test]
fn dead_letter_now_needs_a_redrive_policy_naming_an_existing_queue() {
    let mut node = Node::new();
    let plain = node.create("plain");
    let id = node.send(&plain, "m");
    let delivery = node.receive_one(&plain);
    assert_eq!(
        node.dead_letter_now(&plain, &delivery.handle).result,
        Err(Reject::NoRedrivePolicy {
            name: plain.clone()
        })
    );
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    node.run(Command::DeleteQueue { name: dlq.clone() })
        .unwrap();
    node.send(&q, "n");
    let held = node.receive_one(&q);
    assert_eq!(
        node.dead_letter_now(&q, &held.handle).result,
        Err(Reject::DeadLetterQueueMissing {
            name: q.clone(),
            dead_letter_queue: dlq,
        })
    );
    // Nothing moved: both messages are still in flight where they were received.
    assert!(matches!(
        node.state(&plain, id),
        MessageState::InFlight { .. }
    ));
    assert!(matches!(
        node.state(&q, held.message),
        MessageState::InFlight { .. }
    ));
}

#[test]
fn dead_letter_now_into_a_queue_whose_retention_it_already_passed_is_gone() {
    let mut node = Node::new();
    let dlq = node.create_with(
        "dlq",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let id = node.send(&q, "old");
    node.at(secs(90));
    let delivery = node.receive_one(&q);
    let step = node.dead_letter_now(&q, &delivery.handle);
    assert_eq!(
        step.result,
        Ok(Outcome::DeadLettered {
            dead_letter_queue: dlq.clone()
        })
    );
    assert_eq!(
        node.queues.gone_in_last_step(),
        &[(id, GoneReason::Expired)]
    );
    assert_eq!(node.view(&dlq, id), None);
}
