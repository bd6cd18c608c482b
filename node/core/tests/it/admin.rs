//! Queue administration: create (idempotent), attributes, redrive policy checks, delete and the
//! name reuse window, purge and its rate limit, tags, listing
//! (spec/queue-core.md#createqueueq-attributes--setattributesq-changes--deletequeueq).

use std::collections::{BTreeMap, BTreeSet};

use trireme_core::{
    AttributeChanges, Command, Outcome, QueueAttributes, RedriveAllow, RedrivePolicy, Reject,
};

use crate::support::{Node, START, name, secs};

fn create(node: &mut Node, text: &str, attributes: QueueAttributes) -> Result<Outcome, Reject> {
    node.run(Command::CreateQueue {
        name: name(text),
        attributes,
        tags: BTreeMap::new(),
    })
}

fn policy(dlq: &str, max_receive_count: u32) -> QueueAttributes {
    QueueAttributes {
        redrive: Some(RedrivePolicy {
            dead_letter_queue: name(dlq),
            max_receive_count,
        }),
        ..QueueAttributes::default()
    }
}

#[test]
fn create_with_identical_attributes_is_idempotent() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "kept");
    node.at(secs(5));
    assert_eq!(
        create(&mut node, "jobs", QueueAttributes::default()),
        Ok(Outcome::QueueCreated { created: false })
    );
    let view = node.queues.queue(&q).unwrap();
    assert_eq!(view.created_at, START);
    assert!(node.view(&q, id).is_some());
}

#[test]
fn create_with_different_attributes_is_refused() {
    let mut node = Node::new();
    node.create("jobs");
    let different = QueueAttributes {
        visibility_timeout_s: 31,
        ..QueueAttributes::default()
    };
    assert_eq!(
        create(&mut node, "jobs", different),
        Err(Reject::QueueNameExists { name: name("jobs") })
    );
}

#[test]
fn deleted_name_is_unavailable_for_60_s() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "gone with the queue");
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    assert_eq!(node.queues.queue(&q), None);
    assert_eq!(node.queues.messages(&q).count(), 0);
    node.at(secs(60) - 1);
    assert_eq!(
        create(&mut node, "jobs", QueueAttributes::default()),
        Err(Reject::QueueDeletedRecently { name: q.clone() })
    );
    node.at(secs(60));
    assert_eq!(
        create(&mut node, "jobs", QueueAttributes::default()),
        Ok(Outcome::QueueCreated { created: true })
    );
    assert_eq!(
        node.queues.messages(&q).count(),
        0,
        "a new queue starts empty"
    );
    assert_eq!(
        node.queues.queue(&q).unwrap().incarnation,
        trireme_core::Incarnation::local(START.plus_ms(secs(60)))
    );
}

#[test]
fn redrive_policy_must_name_an_existing_other_queue() {
    let mut node = Node::new();
    assert!(matches!(
        create(&mut node, "jobs", policy("missing", 3)),
        Err(Reject::InvalidAttribute {
            attribute: "RedrivePolicy",
            ..
        })
    ));
    node.create("jobs");
    let q = name("jobs");
    let step = node.apply(Command::SetQueueAttributes {
        name: q.clone(),
        changes: AttributeChanges {
            redrive: Some(policy("jobs", 3).redrive),
            ..AttributeChanges::default()
        },
    });
    assert!(matches!(
        step.result,
        Err(Reject::InvalidAttribute {
            attribute: "RedrivePolicy",
            ..
        })
    ));
    assert_eq!(node.queues.queue(&q).unwrap().attributes.redrive, None);
}

#[test]
fn redrive_policy_respects_the_dead_letter_queues_allow_policy() {
    let mut node = Node::new();
    node.create_with(
        "closed",
        QueueAttributes {
            redrive_allow: RedriveAllow::DenyAll,
            ..QueueAttributes::default()
        },
    );
    node.create_with(
        "picky",
        QueueAttributes {
            redrive_allow: RedriveAllow::ByQueue(BTreeSet::from([name("friend")])),
            ..QueueAttributes::default()
        },
    );
    assert_eq!(
        create(&mut node, "jobs", policy("closed", 3)),
        Err(Reject::RedriveNotAllowed {
            source_queue: name("jobs"),
            dead_letter_queue: name("closed")
        })
    );
    assert_eq!(
        create(&mut node, "stranger", policy("picky", 3)),
        Err(Reject::RedriveNotAllowed {
            source_queue: name("stranger"),
            dead_letter_queue: name("picky")
        })
    );
    assert_eq!(
        create(&mut node, "friend", policy("picky", 3)),
        Ok(Outcome::QueueCreated { created: true })
    );
}

#[test]
fn redrive_policies_may_not_form_a_cycle() {
    let mut node = Node::new();
    let a = node.create("a");
    node.create_with("b", policy("a", 1));
    node.create_with("c", policy("b", 1));
    // a → c would close a → c → b → a.
    let step = node.apply(Command::SetQueueAttributes {
        name: a.clone(),
        changes: AttributeChanges {
            redrive: Some(policy("c", 1).redrive),
            ..AttributeChanges::default()
        },
    });
    assert!(matches!(
        step.result,
        Err(Reject::InvalidAttribute {
            attribute: "RedrivePolicy",
            ..
        })
    ));
    // A chain without a cycle is fine.
    let d = node.create("d");
    node.set(
        &a,
        AttributeChanges {
            redrive: Some(Some(RedrivePolicy {
                dead_letter_queue: d,
                max_receive_count: 1,
            })),
            ..AttributeChanges::default()
        },
    );
}

#[test]
fn dead_letter_chain_moves_a_message_twice_within_one_receive() {
    let mut node = Node::new();
    let last = node.create("last");
    let middle = node.create_with_dlq("middle", &last, 2);
    let first = node.create_with_dlq("first", &middle, 1);
    let id = node.send(&first, "poison");
    node.receive_with(&first, 1, Some(0));
    let waiter = node.long_poll(&middle, 1, Some(0), 20);
    // The receive moves it to `middle`, whose waiter receives it (count 2, visibility 0).
    let command = node.receive_command(&first, 1, None, Some(0));
    let step = node.apply(command);
    assert_eq!(step.wakeups.len(), 1);
    assert_eq!(step.wakeups[0].waiter(), waiter);
    // The next receive from `middle` finds count 2 ≥ 2 and moves it on.
    assert!(node.receive(&middle, 1).is_empty());
    let view = node.view(&last, id).unwrap();
    assert_eq!(view.source, Some(middle.clone()));
    assert_eq!(view.receive_count, 2);
}

#[test]
fn dead_letter_queue_may_be_deleted_while_sources_name_it() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 3);
    assert_eq!(
        node.run(Command::DeleteQueue { name: dlq.clone() }),
        Ok(Outcome::Done)
    );
    assert_eq!(
        node.queues
            .queue(&q)
            .unwrap()
            .attributes
            .redrive
            .unwrap()
            .dead_letter_queue,
        dlq
    );
}

#[test]
fn purge_is_allowed_once_per_60_s() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let ready = node.send(&q, "ready");
    let in_flight = node.send(&q, "in flight");
    let delayed = node.send_delayed(&q, "delayed", Some(100));
    node.receive_one(&q);
    assert_eq!(
        node.run(Command::PurgeQueue { name: q.clone() }),
        Ok(Outcome::Done)
    );
    for id in [ready, in_flight, delayed] {
        assert_eq!(node.view(&q, id), None);
    }
    node.at(secs(59));
    assert_eq!(
        node.run(Command::PurgeQueue { name: q.clone() }),
        Err(Reject::PurgeInProgress {
            name: q.clone(),
            retry_after_ms: 1_000
        })
    );
    node.at(secs(60));
    assert_eq!(
        node.run(Command::PurgeQueue { name: q.clone() }),
        Ok(Outcome::Done)
    );
    assert_eq!(
        node.queues.queue(&q).unwrap().last_purge_at,
        Some(START.plus_ms(secs(60)))
    );
}

#[test]
fn set_attributes_changes_only_what_it_names_and_stamps_the_time() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.at(secs(7));
    node.set(
        &q,
        AttributeChanges {
            delay_s: Some(3),
            ..AttributeChanges::default()
        },
    );
    let view = node.queues.queue(&q).unwrap();
    assert_eq!(view.attributes.delay_s, 3);
    assert_eq!(view.attributes.visibility_timeout_s, 30);
    assert_eq!(view.modified_at, START.plus_ms(secs(7)));
    assert_eq!(view.created_at, START);
}

#[test]
fn refused_attribute_change_changes_nothing() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let step = node.apply(Command::SetQueueAttributes {
        name: q.clone(),
        changes: AttributeChanges {
            delay_s: Some(5),
            visibility_timeout_s: Some(43_201),
            ..AttributeChanges::default()
        },
    });
    assert_eq!(
        step.result,
        Err(Reject::InvalidAttribute {
            attribute: "VisibilityTimeout",
            reason: "must be in 0..=43200, got 43201".to_owned()
        })
    );
    assert_eq!(
        node.queues.queue(&q).unwrap().attributes,
        QueueAttributes::default()
    );
}

#[test]
fn tags_are_added_replaced_and_removed() {
    let mut node = Node::new();
    let q = name("jobs");
    node.run(Command::CreateQueue {
        name: q.clone(),
        attributes: QueueAttributes::default(),
        tags: BTreeMap::from([("team".to_owned(), "billing".to_owned())]),
    })
    .unwrap();
    node.run(Command::TagQueue {
        name: q.clone(),
        tags: BTreeMap::from([
            ("team".to_owned(), "payments".to_owned()),
            ("env".to_owned(), "prod".to_owned()),
        ]),
    })
    .unwrap();
    node.run(Command::UntagQueue {
        name: q.clone(),
        keys: BTreeSet::from(["env".to_owned(), "absent".to_owned()]),
    })
    .unwrap();
    assert_eq!(
        node.queues.queue(&q).unwrap().tags,
        BTreeMap::from([("team".to_owned(), "payments".to_owned())])
    );
}

#[test]
fn more_than_50_tags_are_refused() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let tags: BTreeMap<String, String> =
        (0..51).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    assert!(matches!(
        node.run(Command::TagQueue {
            name: q.clone(),
            tags
        }),
        Err(Reject::InvalidParameter {
            parameter: "Tags",
            ..
        })
    ));
    assert!(node.queues.queue(&q).unwrap().tags.is_empty());
}

#[test]
fn list_queues_filters_by_prefix_and_pages_by_name() {
    let mut node = Node::new();
    for text in ["orders-eu", "orders-us", "billing", "orders-ap"] {
        node.create(text);
    }
    assert_eq!(
        node.queues.list_queues("orders", None, 10),
        vec![name("orders-ap"), name("orders-eu"), name("orders-us")]
    );
    assert_eq!(
        node.queues.list_queues("orders", None, 2),
        vec![name("orders-ap"), name("orders-eu")]
    );
    assert_eq!(
        node.queues
            .list_queues("orders", Some(&name("orders-eu")), 10),
        vec![name("orders-us")]
    );
    assert_eq!(node.queues.list_queues("", None, 10).len(), 4);
    assert_eq!(
        node.queues.list_queues("orders", Some(&name("billing")), 1),
        vec![name("orders-ap")],
        "a cursor before the prefix starts at the prefix"
    );
    assert_eq!(
        node.queues.list_queues("", Some(&name("orders-eu")), 10),
        vec![name("orders-us")]
    );
    assert_eq!(
        node.queues.list_queues("orders-eu", None, 10),
        vec![name("orders-eu")]
    );
    assert_eq!(node.queues.list_queues("orders.", None, 10), vec![]);
    assert_eq!(node.queues.list_queues("zzz", None, 10), vec![]);
}

#[test]
fn counts_follow_message_states() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "a");
    node.send(&q, "b");
    node.send_delayed(&q, "c", Some(10));
    node.receive_one(&q);
    let counts = node.queues.queue(&q).unwrap().counts;
    assert_eq!((counts.ready, counts.in_flight, counts.delayed), (1, 1, 1));
}

#[test]
fn receive_takes_the_oldest_ready_first() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let mut sent = Vec::new();
    for i in 0..5 {
        node.at(i);
        sent.push(node.send(&q, "m"));
    }
    let ids: Vec<_> = node.receive(&q, 3).iter().map(|d| d.message).collect();
    assert_eq!(ids, sent[..3]);
    let ids: Vec<_> = node.receive(&q, 10).iter().map(|d| d.message).collect();
    assert_eq!(ids, sent[3..]);
}

#[test]
fn each_way_of_going_is_reported_with_its_reason() {
    use trireme_core::GoneReason;
    let mut node = Node::new();
    let dlq = node.create_with(
        "dlq",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let deleted = node.send(&q, "deleted");
    let delivery = node.receive_one(&q);
    node.delete(&q, &delivery.handle).unwrap();
    assert_eq!(
        node.queues.gone_in_last_step(),
        &[(deleted, GoneReason::Deleted)]
    );
    let purged = node.send(&q, "purged");
    node.run(Command::PurgeQueue { name: q.clone() }).unwrap();
    assert_eq!(
        node.queues.gone_in_last_step(),
        &[(purged, GoneReason::Purged)]
    );
    // Too old for the dead-letter queue's retention when it moves there.
    let too_old = node.send(&q, "too old");
    node.receive_with(&q, 1, Some(0));
    node.at(secs(61));
    node.receive(&q, 1);
    assert_eq!(
        node.queues.gone_in_last_step(),
        &[(too_old, GoneReason::Expired)]
    );
    let in_deleted_queue = node.send(&q, "queue deleted");
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    assert_eq!(
        node.queues.gone_in_last_step(),
        &[(in_deleted_queue, GoneReason::QueueDeleted)]
    );
    let expired = node.send(&dlq, "expires");
    node.at(secs(121));
    node.advance();
    assert_eq!(
        node.queues.gone_in_last_step(),
        &[(expired, GoneReason::Expired)]
    );
    node.advance();
    assert_eq!(node.queues.gone_in_last_step(), &[]);
}

#[test]
fn purge_keeps_deduplication_windows_open() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let send = node.send_command(&q, "m", None, Some("k"));
    let Ok(Outcome::Sent { id, .. }) = node.run(send) else {
        panic!("send refused");
    };
    node.run(Command::PurgeQueue { name: q.clone() }).unwrap();
    let retry = node.send_command(&q, "m", None, Some("k"));
    assert_eq!(
        node.run(retry),
        Ok(Outcome::Sent {
            id,
            duplicate: true
        })
    );
    assert_eq!(node.queues.messages(&q).count(), 0);
}

#[test]
fn recreated_queue_starts_with_no_deduplication_windows() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let send = node.send_command(&q, "m", None, Some("k"));
    node.run(send).unwrap();
    node.run(Command::DeleteQueue { name: q.clone() }).unwrap();
    node.at(secs(60));
    node.create("jobs");
    let again = node.send_command(&q, "m", None, Some("k"));
    assert!(matches!(
        node.run(again),
        Ok(Outcome::Sent {
            duplicate: false,
            ..
        })
    ));
}
