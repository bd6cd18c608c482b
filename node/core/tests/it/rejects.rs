//! Every `Reject` variant reached through the public API, each checked to change nothing but
//! the time. (`QueueLimit`, `InflightLimit` and `WaiterLimit` need state too large to build one
//! command at a time; they are reached by unit tests in `queues.rs`.)

use std::collections::BTreeMap;

use trireme_core::{
    AttributeValue, Command, HandleProblem, MessageId, QueueAttributes, Record, Reject,
};

use crate::support::{Node, name, secs};

/// Applies `command`, expects it refused with `expected`, and checks that every stored record
/// is as before (after the time advance the command performs first).
fn refused(node: &mut Node, command: Command, expected: &Reject) {
    node.advance();
    let before: Vec<Record> = node.queues.records().collect();
    let step = node.apply(command);
    assert_eq!(step.result.as_ref(), Err(expected));
    let after: Vec<Record> = node.queues.records().collect();
    assert_eq!(before, after, "a refusal changed state");
}

#[test]
fn queue_not_found_for_every_command_naming_a_queue() {
    let mut node = Node::new();
    let missing = name("missing");
    let expected = Reject::QueueNotFound {
        name: missing.clone(),
    };
    let send = node.send_command(&missing, "x", None, None);
    let receive = node.receive_command(&missing, 1, None, None);
    let handle = trireme_core::ReceiptHandle {
        queue: missing.clone(),
        incarnation: trireme_core::Incarnation::default(),
        message: MessageId(1),
        seq: 1,
        claim: trireme_core::ClaimTag::default(),
    };
    for command in [
        send,
        receive,
        Command::SetQueueAttributes {
            name: missing.clone(),
            changes: Default::default(),
        },
        Command::DeleteQueue {
            name: missing.clone(),
        },
        Command::PurgeQueue {
            name: missing.clone(),
        },
        Command::TagQueue {
            name: missing.clone(),
            tags: BTreeMap::new(),
        },
        Command::UntagQueue {
            name: missing.clone(),
            keys: Default::default(),
        },
        Command::Delete {
            queue: missing.clone(),
            handle: handle.clone(),
        },
        Command::ChangeVisibility {
            queue: missing.clone(),
            handle,
            timeout_s: 1,
        },
        Command::Redrive {
            from: missing.clone(),
            to: None,
            max: 1,
            allowed: None,
        },
    ] {
        refused(&mut node, command, &expected);
    }
}

#[test]
fn queue_name_exists_with_other_attributes() {
    let mut node = Node::new();
    let q = node.create("jobs");
    refused(
        &mut node,
        Command::CreateQueue {
            name: q.clone(),
            attributes: QueueAttributes {
                delay_s: 1,
                ..QueueAttributes::default()
            },
            tags: BTreeMap::new(),
        },
        &Reject::QueueNameExists { name: q },
    );
}

#[test]
fn queue_deleted_recently() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    node.at(secs(30));
    refused(
        &mut node,
        Command::CreateQueue {
            name: q.clone(),
            attributes: QueueAttributes::default(),
            tags: BTreeMap::new(),
        },
        &Reject::QueueDeletedRecently { name: q },
    );
}

#[test]
fn invalid_attribute_on_create_names_attribute_and_range() {
    let mut node = Node::new();
    refused(
        &mut node,
        Command::CreateQueue {
            name: name("jobs"),
            attributes: QueueAttributes {
                retention_s: 59,
                ..QueueAttributes::default()
            },
            tags: BTreeMap::new(),
        },
        &Reject::InvalidAttribute {
            attribute: "MessageRetentionPeriod",
            reason: "must be in 60..=1209600, got 59".to_owned(),
        },
    );
    assert_eq!(node.queues.queue(&name("jobs")), None);
}

#[test]
fn invalid_parameter_for_receive_ranges() {
    let mut node = Node::new();
    let q = node.create("jobs");
    for (max, visibility_s, wait_s, parameter) in [
        (0, None, None, "MaxNumberOfMessages"),
        (11, None, None, "MaxNumberOfMessages"),
        (1, Some(43_201), None, "VisibilityTimeout"),
        (1, None, Some(21), "WaitTimeSeconds"),
    ] {
        let command = node.receive_command(&q, max, visibility_s, wait_s);
        let step = node.apply(command);
        assert!(
            matches!(step.result, Err(Reject::InvalidParameter { parameter: p, .. }) if p == parameter),
            "{parameter}: {:?}",
            step.result
        );
    }
}

#[test]
fn invalid_parameter_for_visibility_change_and_redrive() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "m");
    let delivery = node.receive_one(&q);
    let step = node.change_visibility(&q, &delivery.handle, 43_201);
    assert!(matches!(
        step.result,
        Err(Reject::InvalidParameter {
            parameter: "VisibilityTimeout",
            ..
        })
    ));
    for max in [0, 10_001] {
        assert!(matches!(
            node.redrive(&q, None, max),
            Err(Reject::InvalidParameter {
                parameter: "MaxNumberOfMessages",
                ..
            })
        ));
    }
}

#[test]
fn invalid_message_contents() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let command = node.send_command(&q, "bad \u{1} byte", None, None);
    refused(
        &mut node,
        command,
        &Reject::InvalidMessageContents {
            reason: "character U+0001 is not allowed".to_owned(),
        },
    );
}

#[test]
fn message_too_long_counts_attributes() {
    let mut node = Node::new();
    let q = node.create_with(
        "small",
        QueueAttributes {
            message_bytes_max: 1_024,
            ..QueueAttributes::default()
        },
    );
    let attributes = BTreeMap::from([(
        "blob".to_owned(),
        AttributeValue::Binary {
            data_type: "Binary".to_owned(),
            value: vec![0; 1_000],
        },
    )]);
    let command = Command::Send {
        queue: q.clone(),
        id: node.fresh_id(),
        body: "x".repeat(15),
        attributes,
        system: Default::default(),
        delay_s: None,
        dedup: None,
    };
    refused(
        &mut node,
        command,
        &Reject::MessageTooLong {
            size_bytes: 15 + 4 + 6 + 1_000,
            max_bytes: 1_024,
        },
    );
}

#[test]
fn eleven_message_attributes_are_refused() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let attributes: BTreeMap<String, AttributeValue> = (0..11)
        .map(|i| {
            (
                format!("a{i}"),
                AttributeValue::String {
                    data_type: "String".to_owned(),
                    value: "v".to_owned(),
                },
            )
        })
        .collect();
    let command = Command::Send {
        queue: q,
        id: node.fresh_id(),
        body: "x".to_owned(),
        attributes,
        system: Default::default(),
        delay_s: None,
        dedup: None,
    };
    let step = node.apply(command);
    assert!(matches!(
        step.result,
        Err(Reject::InvalidParameter {
            parameter: "MessageAttributes",
            ..
        })
    ));
}

#[test]
fn message_id_exists() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "first");
    let command = Command::Send {
        queue: q,
        id,
        body: "second".to_owned(),
        attributes: BTreeMap::new(),
        system: Default::default(),
        delay_s: None,
        dedup: None,
    };
    refused(&mut node, command, &Reject::MessageIdExists { message: id });
}

#[test]
fn receipt_handle_invalid_and_stale_refusals_change_nothing() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let other = node.create("other");
    node.send(&q, "m");
    let old = node.receive_with(&q, 1, Some(0)).pop().unwrap();
    node.receive_one(&q);
    refused(
        &mut node,
        Command::Delete {
            queue: other,
            handle: old.handle.clone(),
        },
        &Reject::ReceiptHandleInvalid {
            reason: HandleProblem::WrongQueue,
        },
    );
    refused(
        &mut node,
        Command::Delete {
            queue: q.clone(),
            handle: trireme_core::ReceiptHandle {
                seq: 9,
                ..old.handle.clone()
            },
        },
        &Reject::ReceiptHandleInvalid {
            reason: HandleProblem::NeverIssued,
        },
    );
    refused(
        &mut node,
        Command::ChangeVisibility {
            queue: q.clone(),
            handle: old.handle.clone(),
            timeout_s: 5,
        },
        &Reject::StaleReceiptHandle {
            message: old.message,
        },
    );
}

#[test]
fn message_not_in_flight_after_expiry() {
    let mut node = Node::new();
    let q = node.create_with(
        "short",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let id = node.send(&q, "m");
    let delivery = node.receive_one(&q);
    node.at(secs(60));
    refused(
        &mut node,
        Command::ChangeVisibility {
            queue: q,
            handle: delivery.handle,
            timeout_s: 5,
        },
        &Reject::MessageNotInFlight { message: id },
    );
}

#[test]
fn visibility_cap_exceeded_at_once() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "m");
    let delivery = node.receive_one(&q);
    node.at(1);
    let step = node.change_visibility(&q, &delivery.handle, 43_200);
    assert!(matches!(
        step.result,
        Err(Reject::VisibilityCapExceeded { message, .. }) if message == id
    ));
}

#[test]
fn purge_in_progress() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.run(Command::PurgeQueue { name: q.clone() }).unwrap();
    node.at(secs(10));
    refused(
        &mut node,
        Command::PurgeQueue { name: q.clone() },
        &Reject::PurgeInProgress {
            name: q,
            retry_after_ms: secs(50),
        },
    );
}

#[test]
fn redrive_not_allowed() {
    let mut node = Node::new();
    node.create_with(
        "closed",
        QueueAttributes {
            redrive_allow: trireme_core::RedriveAllow::DenyAll,
            ..QueueAttributes::default()
        },
    );
    let q = node.create("jobs");
    refused(
        &mut node,
        Command::SetQueueAttributes {
            name: q.clone(),
            changes: trireme_core::AttributeChanges {
                redrive: Some(Some(trireme_core::RedrivePolicy {
                    dead_letter_queue: name("closed"),
                    max_receive_count: 5,
                })),
                ..Default::default()
            },
        },
        &Reject::RedriveNotAllowed {
            source_queue: q,
            dead_letter_queue: name("closed"),
        },
    );
}

#[test]
fn waiter_exists() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let waiter = node.long_poll(&q, 1, None, 20);
    refused(
        &mut node,
        Command::Receive {
            queue: q,
            max: 1,
            visibility_s: None,
            wait_s: Some(20),
            waiter,
        },
        &Reject::WaiterExists { waiter },
    );
}

#[test]
fn invalid_queue_and_dedup_ids_are_refused_at_parse() {
    assert!(matches!(
        trireme_core::QueueName::try_from("jobs.fifo"),
        Err(Reject::InvalidParameter {
            parameter: "QueueName",
            ..
        })
    ));
    assert!(matches!(
        trireme_core::DedupId::try_from(""),
        Err(Reject::InvalidParameter {
            parameter: "MessageDeduplicationId",
            ..
        })
    ));
}
