//! Chosen traces for the classic races around receipt handles, deletes, visibility and limits
//! changed while a message is in flight (spec/queue-core.md#delete-q-handle).

use trireme_core::{
    AttributeChanges, Command, HandleProblem, MessageState, Outcome, QueueAttributes,
    ReceiptHandle, RedrivePolicy, Reject,
};

use crate::support::{Node, START, secs};

#[test]
fn delete_with_superseded_handle_is_refused_and_the_newest_handle_deletes() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let first = node.receive_one(&q);
    // The slow worker's visibility timeout (30 s) runs out; another worker receives the message.
    node.at(secs(30));
    let second = node.receive_one(&q);
    assert_eq!(second.message, id);
    assert_eq!(second.receive_count, 2);
    // The slow worker finally deletes: refused, and the message stays in flight.
    node.at(secs(31));
    assert_eq!(
        node.delete(&q, &first.handle),
        Err(Reject::StaleReceiptHandle { message: id })
    );
    assert!(matches!(node.state(&q, id), MessageState::InFlight { .. }));
    assert_eq!(
        node.delete(&q, &second.handle),
        Ok(Outcome::Deleted {
            already_gone: false
        })
    );
    assert_eq!(node.view(&q, id), None);
}

#[test]
fn delete_after_visibility_expired_but_before_a_new_receive_succeeds() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.at(secs(45));
    node.advance();
    // Ready again, handle kept.
    let view = node.view(&q, id).unwrap();
    // It became ready when the timeout ended (30 s), not when time was next looked at (45 s).
    assert_eq!(
        view.state,
        MessageState::Ready {
            since: START.plus_ms(secs(30))
        }
    );
    assert_eq!(view.handle, Some(1));
    assert_eq!(
        node.delete(&q, &delivery.handle),
        Ok(Outcome::Deleted {
            already_gone: false
        })
    );
    assert_eq!(node.view(&q, id), None);
    assert!(node.receive(&q, 10).is_empty());
}

#[test]
fn repeated_delete_succeeds_as_already_gone() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "work");
    let delivery = node.receive_one(&q);
    assert_eq!(
        node.delete(&q, &delivery.handle),
        Ok(Outcome::Deleted {
            already_gone: false
        })
    );
    assert_eq!(
        node.delete(&q, &delivery.handle),
        Ok(Outcome::Deleted { already_gone: true })
    );
}

#[test]
fn delete_sent_to_another_queue_is_wrong_queue() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let other = node.create("other");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    assert_eq!(
        node.delete(&other, &delivery.handle),
        Err(Reject::ReceiptHandleInvalid {
            reason: HandleProblem::WrongQueue
        })
    );
    assert!(node.view(&q, id).is_some());
}

#[test]
fn delete_with_a_handle_from_before_the_queue_was_recreated_is_wrong_queue() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "work");
    let old = node.receive_one(&q);
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    node.at(secs(60));
    node.create("jobs");
    // Even a message of the new queue with the same id would not match: the incarnation differs.
    assert_ne!(
        node.queues.queue(&q).unwrap().incarnation,
        old.handle.incarnation
    );
    assert_eq!(
        node.delete(&q, &old.handle),
        Err(Reject::ReceiptHandleInvalid {
            reason: HandleProblem::WrongQueue
        })
    );
}

#[test]
fn forged_seq_is_never_issued_while_superseded_seq_is_stale() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let first = node.receive_with(&q, 1, Some(0)).pop().unwrap();
    let second = node.receive_one(&q);
    assert_eq!(second.handle.seq, 2);
    let forged = |seq| ReceiptHandle {
        seq,
        ..first.handle.clone()
    };
    for seq in [0, 3, u32::MAX] {
        assert_eq!(
            node.delete(&q, &forged(seq)),
            Err(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued
            }),
            "seq {seq}"
        );
    }
    assert_eq!(
        node.delete(&q, &first.handle),
        Err(Reject::StaleReceiptHandle { message: id })
    );
    assert!(node.view(&q, id).is_some());
}

#[test]
fn handle_for_a_message_never_received_is_never_issued() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let handle = ReceiptHandle {
        queue: q.clone(),
        incarnation: node.queues.queue(&q).unwrap().incarnation,
        message: id,
        seq: 1,
        claim: trireme_core::ClaimTag::default(),
    };
    assert_eq!(
        node.delete(&q, &handle),
        Err(Reject::ReceiptHandleInvalid {
            reason: HandleProblem::NeverIssued
        })
    );
}

#[test]
fn deduplicated_send_after_delete_answers_the_first_id_and_stores_nothing() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let first = node.send_command(&q, "order 17", None, Some("order-17"));
    let Outcome::Sent {
        id,
        duplicate: false,
    } = node.run(first).unwrap()
    else {
        panic!("first send was not stored");
    };
    let delivery = node.receive_one(&q);
    node.delete(&q, &delivery.handle).unwrap();
    node.at(secs(299));
    let retry = node.send_command(&q, "order 17", None, Some("order-17"));
    assert_eq!(
        node.run(retry),
        Ok(Outcome::Sent {
            id,
            duplicate: true
        })
    );
    assert_eq!(node.queues.messages(&q).count(), 0);
    // At 300 s the window has closed: the same id stores a new message.
    node.at(secs(300));
    let later = node.send_command(&q, "order 17", None, Some("order-17"));
    assert!(matches!(
        node.run(later),
        Ok(Outcome::Sent {
            duplicate: false,
            ..
        })
    ));
    assert_eq!(node.queues.messages(&q).count(), 1);
}

#[test]
fn deduplication_is_per_queue() {
    let mut node = Node::new();
    let a = node.create("a");
    let b = node.create("b");
    let to_a = node.send_command(&a, "x", None, Some("k"));
    let to_b = node.send_command(&b, "x", None, Some("k"));
    assert!(matches!(
        node.run(to_a),
        Ok(Outcome::Sent {
            duplicate: false,
            ..
        })
    ));
    assert!(matches!(
        node.run(to_b),
        Ok(Outcome::Sent {
            duplicate: false,
            ..
        })
    ));
}

#[test]
fn delete_after_retention_expired_in_flight_is_already_gone() {
    let mut node = Node::new();
    let q = node.create_with(
        "short",
        QueueAttributes {
            retention_s: 60,
            visibility_timeout_s: 600,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.at(secs(60));
    assert_eq!(
        node.delete(&q, &delivery.handle),
        Ok(Outcome::Deleted { already_gone: true })
    );
    assert_eq!(node.view(&q, id), None);
}

#[test]
fn delete_after_purge_is_already_gone() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.run(Command::PurgeQueue { name: q.clone() }).unwrap();
    assert_eq!(
        node.delete(&q, &delivery.handle),
        Ok(Outcome::Deleted { already_gone: true })
    );
}

#[test]
fn change_visibility_after_delete_is_message_not_in_flight() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.delete(&q, &delivery.handle).unwrap();
    assert_eq!(
        node.change_visibility(&q, &delivery.handle, 10).result,
        Err(Reject::MessageNotInFlight { message: id })
    );
}

#[test]
fn change_visibility_with_superseded_handle_is_refused() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let first = node.receive_with(&q, 1, Some(0)).pop().unwrap();
    let second = node.receive_one(&q);
    assert_eq!(
        node.change_visibility(&q, &first.handle, 100).result,
        Err(Reject::StaleReceiptHandle { message: id })
    );
    assert_eq!(
        node.state(&q, id),
        MessageState::InFlight {
            until: node.now.plus_ms(secs(30))
        }
    );
    assert_eq!(
        node.change_visibility(&q, &second.handle, 100).result,
        Ok(Outcome::VisibilityChanged)
    );
}

#[test]
fn change_visibility_after_restore_but_before_a_new_receive_is_accepted() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    let delivery = node.receive_one(&q);
    node.at(secs(40));
    assert_eq!(
        node.change_visibility(&q, &delivery.handle, 20).result,
        Ok(Outcome::VisibilityChanged)
    );
    assert_eq!(
        node.state(&q, id),
        MessageState::InFlight {
            until: node.now.plus_ms(secs(20))
        }
    );
}

#[test]
fn visibility_timeout_change_does_not_move_an_in_flight_deadline() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "work");
    node.receive_one(&q);
    node.at(secs(1));
    node.set(
        &q,
        AttributeChanges {
            visibility_timeout_s: Some(600),
            ..AttributeChanges::default()
        },
    );
    assert_eq!(
        node.state(&q, id),
        MessageState::InFlight {
            until: START.plus_ms(secs(30))
        }
    );
    node.at(secs(30));
    let again = node.receive_one(&q);
    assert_eq!(again.message, id);
    // The next receive uses the new timeout.
    assert_eq!(
        node.state(&q, id),
        MessageState::InFlight {
            until: node.now.plus_ms(secs(600))
        }
    );
}

#[test]
fn lowered_max_receive_count_applies_at_the_next_receive() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let id = node.send(&q, "work");
    node.receive_with(&q, 1, Some(0));
    node.receive_with(&q, 1, Some(0));
    // In flight (visibility 0 leaves it in flight until the next action) with count 2.
    node.set(
        &q,
        AttributeChanges {
            redrive: Some(Some(RedrivePolicy {
                dead_letter_queue: dlq.clone(),
                max_receive_count: 2,
            })),
            ..AttributeChanges::default()
        },
    );
    assert!(
        node.view(&q, id).is_some(),
        "the change moved nothing by itself"
    );
    assert!(
        node.receive(&q, 1).is_empty(),
        "the next receive moves it instead"
    );
    let moved = node.view(&dlq, id).unwrap();
    assert_eq!(moved.receive_count, 2);
}

#[test]
fn shortened_retention_removes_stored_messages_past_it() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let old = node.send(&q, "old");
    node.receive_one(&q);
    node.at(secs(100));
    let young = node.send(&q, "young");
    node.at(secs(130));
    node.set(
        &q,
        AttributeChanges {
            retention_s: Some(60),
            ..AttributeChanges::default()
        },
    );
    // `old` (sent 130 s ago, in flight) is gone; `young` (30 s old) stays until 160 s.
    assert_eq!(node.view(&q, old), None);
    assert!(node.view(&q, young).is_some());
    node.at(secs(159) + 999);
    node.advance();
    assert!(node.view(&q, young).is_some());
    node.at(secs(160));
    node.advance();
    assert_eq!(node.view(&q, young), None);
}

#[test]
fn lengthened_retention_keeps_messages_longer() {
    let mut node = Node::new();
    let q = node.create_with(
        "jobs",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&q, "work");
    node.at(secs(30));
    node.set(
        &q,
        AttributeChanges {
            retention_s: Some(120),
            ..AttributeChanges::default()
        },
    );
    node.at(secs(100));
    node.advance();
    assert!(node.view(&q, id).is_some());
    node.at(secs(120));
    node.advance();
    assert_eq!(node.view(&q, id), None);
}

#[test]
fn lowered_message_size_does_not_touch_stored_messages() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let big = "x".repeat(5_000);
    let id = node.send(&q, &big);
    node.set(
        &q,
        AttributeChanges {
            message_bytes_max: Some(1_024),
            ..AttributeChanges::default()
        },
    );
    assert_eq!(node.receive_one(&q).body, big);
    assert!(node.view(&q, id).is_some());
    let command = node.send_command(&q, &big, None, None);
    assert_eq!(
        node.run(command),
        Err(Reject::MessageTooLong {
            size_bytes: 5_000,
            max_bytes: 1_024
        })
    );
}

#[test]
fn handle_from_before_a_redrive_never_matches_a_handle_issued_after_it() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "work");
    let before = node.receive_with(&q, 1, Some(0)).pop().unwrap();
    assert_eq!(before.handle.seq, 1);
    // The next receive moves it (count 1 ≥ 1); redrive brings it back with count 0.
    assert!(node.receive(&q, 1).is_empty());
    assert_eq!(
        node.redrive(&dlq, None, 10),
        Ok(Outcome::Redriven {
            moved: 1,
            failed: 0
        })
    );
    let after = node.receive_one(&q);
    assert_eq!(after.receive_count, 1);
    assert_ne!(
        after.handle, before.handle,
        "a new receive issues a new handle"
    );
    assert_eq!(
        node.delete(&q, &before.handle),
        Err(Reject::StaleReceiptHandle { message: id })
    );
    assert_eq!(
        node.delete(&q, &after.handle),
        Ok(Outcome::Deleted {
            already_gone: false
        })
    );
}
