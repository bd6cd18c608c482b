//! Persistence through records: a store fed only by `take_changes` mirrors the live state after
//! every step, records survive serialization, and `restore` rebuilds a node that behaves
//! exactly like the original from then on.

use std::collections::BTreeMap;

use trireme_core::{
    AttributeChanges, AttributeValue, Change, Command, MessageBodyRecord, MessageId, Millis,
    QueueAttributes, Queues, Record, RecordKey, Step,
};

use crate::support::{Node, START, secs};

/// Applies changes to a key-value store the way the shell does.
fn apply_changes(store: &mut BTreeMap<RecordKey, Record>, changes: Vec<Change>) {
    for change in changes {
        match change {
            Change::Put(record) => {
                store.insert(record.key(), record);
            }
            Change::Remove(key) => {
                store.remove(&key);
            }
        }
    }
}

fn snapshot(queues: &Queues) -> BTreeMap<RecordKey, Record> {
    queues
        .records()
        .map(|record| (record.key(), record))
        .collect()
}

/// A busy trace: queues with a dead-letter queue, messages in every state, deduplication,
/// moves, redrive, purge, a deleted queue. Returns the commands in order with their times.
fn busy_trace(node: &mut Node) -> Vec<(Millis, Command)> {
    let mut trace = Vec::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 2);
    let doomed = node.create("doomed");
    for i in 0..6u64 {
        node.at(secs(i));
        let dedup = (i % 2 == 0).then_some("k");
        let delay = (i == 5).then_some(600);
        trace.push((
            node.now,
            node.send_command(&q, &format!("m{i}"), delay, dedup),
        ));
    }
    trace.push((
        START.plus_ms(secs(6)),
        node.receive_command(&q, 3, Some(0), Some(0)),
    ));
    trace.push((
        START.plus_ms(secs(7)),
        node.receive_command(&q, 3, Some(0), Some(0)),
    ));
    trace.push((
        START.plus_ms(secs(8)),
        node.receive_command(&q, 10, Some(100), Some(0)),
    ));
    trace.push((
        START.plus_ms(secs(9)),
        node.send_command(&doomed, "x", None, None),
    ));
    trace.push((
        START.plus_ms(secs(10)),
        Command::PurgeQueue {
            name: doomed.clone(),
        },
    ));
    trace.push((
        START.plus_ms(secs(11)),
        Command::DeleteQueue { name: doomed },
    ));
    trace.push((
        START.plus_ms(secs(12)),
        Command::Redrive {
            from: dlq.clone(),
            to: None,
            max: 1,
            allowed: None,
        },
    ));
    trace.push((
        START.plus_ms(secs(13)),
        Command::SetQueueAttributes {
            name: q.clone(),
            changes: AttributeChanges {
                visibility_timeout_s: Some(45),
                ..AttributeChanges::default()
            },
        },
    ));
    trace.push((
        START.plus_ms(secs(14)),
        node.send_command(&dlq, "direct", None, None),
    ));
    trace
}

#[test]
fn store_fed_by_take_changes_mirrors_the_state_after_every_step() {
    let mut node = Node::new();
    let mut store = BTreeMap::new();
    apply_changes(&mut store, node.queues.take_changes());
    assert_eq!(store, snapshot(&node.queues));
    let trace = busy_trace(&mut node);
    apply_changes(&mut store, node.queues.take_changes());
    for (at, command) in trace {
        node.queues.apply(at, command);
        apply_changes(&mut store, node.queues.take_changes());
        assert_eq!(store, snapshot(&node.queues), "after a step at {at}");
    }
    // Time alone (visibility restores, retention, deduplication expiry, name release).
    for offset in [secs(120), secs(400), 5 * 86_400_000] {
        node.queues.advance(START.plus_ms(offset));
        apply_changes(&mut store, node.queues.take_changes());
        assert_eq!(
            store,
            snapshot(&node.queues),
            "after advancing to {offset} ms"
        );
    }
    assert_eq!(node.queues.take_changes(), vec![], "nothing changed since");
}

#[test]
fn take_changes_reports_a_moved_message_under_both_keys() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "m");
    node.receive_with(&q, 1, Some(0));
    node.queues.take_changes();
    node.receive(&q, 1);
    let changes = node.queues.take_changes();
    assert!(changes.contains(&Change::Remove(RecordKey::Message(q.clone(), id))));
    assert!(changes.iter().any(|change| matches!(
        change,
        Change::Put(Record::Message(record)) if record.id == id && record.queue == dlq
    )));
}

#[test]
fn take_changes_reports_a_dead_lettered_now_message_under_both_keys() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 5);
    let id = node.send(&q, "m");
    let delivery = node.receive_one(&q);
    let mut store = BTreeMap::new();
    apply_changes(&mut store, node.queues.take_changes());
    assert!(node.dead_letter_now(&q, &delivery.handle).result.is_ok());
    let changes = node.queues.take_changes();
    assert!(changes.contains(&Change::Remove(RecordKey::Message(q.clone(), id))));
    assert!(changes.iter().any(|change| matches!(
        change,
        Change::Put(Record::Message(record))
            if record.id == id && record.queue == dlq && record.receive_count == 1
    )));
    apply_changes(&mut store, changes);
    assert_eq!(store, snapshot(&node.queues));
}

#[test]
fn records_survive_serialization() {
    let mut node = Node::new();
    for (at, command) in busy_trace(&mut node) {
        node.queues.apply(at, command);
    }
    let records: Vec<Record> = node.queues.records().collect();
    let text = serde_json::to_string(&records).unwrap();
    let back: Vec<Record> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, records);
}

#[test]
fn restored_node_behaves_like_the_original() {
    let mut node = Node::new();
    let trace = busy_trace(&mut node);
    let (head, tail) = trace.split_at(10);
    for (at, command) in head.iter().cloned() {
        node.queues.apply(at, command);
    }
    let mut store = BTreeMap::new();
    apply_changes(&mut store, node.queues.take_changes());
    let mut restored = Queues::restore(store.into_values(), node.queues.now());
    assert_eq!(snapshot(&restored), snapshot(&node.queues));
    assert_eq!(restored.next_deadline(), node.queues.next_deadline());
    // Both go on with the same commands and must answer identically.
    for (at, command) in tail.iter().cloned() {
        let original: Step = node.queues.apply(at, command.clone());
        let copy: Step = restored.apply(at, command);
        assert_eq!(copy, original);
    }
    for offset in [secs(100), secs(1_000), 5 * 86_400_000] {
        let at = START.plus_ms(offset);
        assert_eq!(restored.advance(at), node.queues.advance(at));
        assert_eq!(snapshot(&restored), snapshot(&node.queues));
    }
}

#[test]
fn restore_after_downtime_fires_what_came_due_and_reports_it() {
    let mut node = Node::new();
    let q = node.create("jobs");
    let id = node.send(&q, "m");
    node.receive_one(&q);
    node.send_delayed(&q, "late", Some(60));
    let records: Vec<Record> = node.queues.records().collect();
    let mut restored = Queues::restore(records, START.plus_ms(secs(90)));
    assert_eq!(restored.now(), START.plus_ms(secs(90)));
    let view = restored.message(&q, id).unwrap();
    assert_eq!(
        view.state,
        trireme_core::MessageState::Ready {
            since: START.plus_ms(secs(30))
        }
    );
    assert_eq!(view.handle, Some(1), "restore keeps the handle");
    let changes = restored.take_changes();
    assert_eq!(changes.len(), 2, "both messages changed state: {changes:?}");
}

#[test]
fn restore_with_an_earlier_clock_keeps_the_latest_time_recorded() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.at(secs(50));
    node.send(&q, "m");
    let records: Vec<Record> = node.queues.records().collect();
    let restored = Queues::restore(records, START);
    assert_eq!(restored.now(), START.plus_ms(secs(50)));
}

/// The changes that touch a body record.
fn body_changes(changes: &[Change]) -> Vec<&Change> {
    changes
        .iter()
        .filter(|change| match change {
            Change::Put(record) => matches!(record, Record::MessageBody(_)),
            Change::Remove(key) => matches!(key, RecordKey::MessageBody(_)),
        })
        .collect()
}

/// The ids of the state records among `records`, and of the body records.
fn split_ids(records: &[Record]) -> (Vec<MessageId>, Vec<MessageId>) {
    let mut states: Vec<MessageId> = records
        .iter()
        .filter_map(|record| match record {
            Record::Message(message) => Some(message.id),
            _ => None,
        })
        .collect();
    let mut bodies: Vec<MessageId> = records
        .iter()
        .filter_map(|record| match record {
            Record::MessageBody(body) => Some(body.id),
            _ => None,
        })
        .collect();
    states.sort();
    bodies.sort();
    (states, bodies)
}

#[test]
fn send_puts_the_body_once_and_receive_and_restore_put_only_the_state() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.queues.take_changes();
    let id = node.send(&q, "a large body");
    let changes = node.queues.take_changes();
    assert_eq!(
        body_changes(&changes),
        vec![&Change::Put(Record::MessageBody(MessageBodyRecord {
            id,
            body: "a large body".to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
        }))]
    );
    assert_eq!(changes.len(), 2, "the state and the body: {changes:?}");
    let delivery = node.receive_one(&q);
    let changes = node.queues.take_changes();
    assert!(
        matches!(&changes[..], [Change::Put(Record::Message(record))] if record.id == id),
        "a receive rewrites the state alone: {changes:?}"
    );
    node.change_visibility(&q, &delivery.handle, 10)
        .result
        .unwrap();
    let changes = node.queues.take_changes();
    assert!(
        matches!(&changes[..], [Change::Put(Record::Message(_))]),
        "{changes:?}"
    );
    // The visibility timeout expires: a restore by time alone.
    node.at(secs(10));
    node.advance();
    let changes = node.queues.take_changes();
    assert!(
        matches!(&changes[..], [Change::Put(Record::Message(record))] if record.handle == Some(1)),
        "{changes:?}"
    );
}

#[test]
fn dead_letter_move_and_redrive_leave_the_body_record_alone() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let id = node.send(&q, "poison");
    node.receive_with(&q, 1, Some(0));
    node.queues.take_changes();
    assert_eq!(node.receive(&q, 1), vec![], "the message moved instead");
    let changes = node.queues.take_changes();
    assert_eq!(body_changes(&changes), Vec::<&Change>::new(), "{changes:?}");
    assert!(changes.contains(&Change::Remove(RecordKey::Message(q.clone(), id))));
    assert!(changes.iter().any(|change| matches!(
        change,
        Change::Put(Record::Message(record)) if record.id == id && record.queue == dlq
    )));
    node.redrive(&dlq, None, 10).unwrap();
    let changes = node.queues.take_changes();
    assert_eq!(body_changes(&changes), Vec::<&Change>::new(), "{changes:?}");
    assert!(changes.contains(&Change::Remove(RecordKey::Message(dlq.clone(), id))));
    assert_eq!(node.view(&q, id).unwrap().body, "poison");
}

#[test]
fn a_gone_message_takes_its_body_record_with_it() {
    let mut node = Node::new();
    let q = node.create_with(
        "jobs",
        QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        },
    );
    let purged = node.create("purged");
    let doomed = node.create("doomed");
    let deleted = node.send(&q, "deleted");
    let handle = node.receive_one(&q).handle;
    node.queues.take_changes();
    node.delete(&q, &handle).unwrap();
    let changes = node.queues.take_changes();
    assert!(changes.contains(&Change::Remove(RecordKey::MessageBody(deleted))));

    let in_purged = node.send(&purged, "purged");
    node.run(Command::PurgeQueue {
        name: purged.clone(),
    })
    .unwrap();
    let in_doomed = node.send(&doomed, "doomed");
    node.run(Command::DeleteQueue { name: doomed }).unwrap();
    let expired = node.send(&q, "expired");
    node.at(secs(60));
    node.advance();
    let changes = node.queues.take_changes();
    for id in [in_purged, in_doomed, expired] {
        assert!(
            changes.contains(&Change::Remove(RecordKey::MessageBody(id))),
            "{id}: {changes:?}"
        );
    }
    let (states, bodies) = split_ids(&node.queues.records().collect::<Vec<_>>());
    assert_eq!((states.len(), bodies.len()), (0, 0));
}

#[test]
fn restore_of_the_split_records_equals_the_original_state() {
    let mut node = Node::new();
    let dlq = node.create("dlq");
    let q = node.create_with_dlq("jobs", &dlq, 1);
    let attributes = BTreeMap::from([
        (
            "trace".to_owned(),
            AttributeValue::String {
                data_type: "String".to_owned(),
                value: "abc".to_owned(),
            },
        ),
        (
            "raw".to_owned(),
            AttributeValue::Binary {
                data_type: "Binary".to_owned(),
                value: vec![0, 1, 2, 255],
            },
        ),
    ]);
    let with_attributes = node.fresh_id();
    node.run(Command::Send {
        queue: q.clone(),
        id: with_attributes,
        body: "x".repeat(10_000),
        attributes: attributes.clone(),
        system: Default::default(),
        delay_s: None,
        dedup: None,
    })
    .unwrap();
    // Moved to the dead-letter queue: its state is keyed by `dlq`, its body by id alone.
    node.receive_with(&q, 1, Some(0));
    assert_eq!(node.receive(&q, 1), vec![]);
    let in_flight = node.send(&q, "in flight");
    node.receive_one(&q);
    let delayed = node.send_delayed(&q, "delayed", Some(60));
    let mut store = BTreeMap::new();
    apply_changes(&mut store, node.queues.take_changes());
    let records: Vec<Record> = store.into_values().collect();
    let (states, bodies) = split_ids(&records);
    assert_eq!(states, vec![with_attributes, in_flight, delayed]);
    assert_eq!(bodies, states, "one body record per message");
    let restored = Queues::restore(records, node.now);
    assert_eq!(snapshot(&restored), snapshot(&node.queues));
    for queue in [&q, &dlq] {
        let original: Vec<_> = node.queues.messages(queue).collect();
        let copy: Vec<_> = restored.messages(queue).collect();
        assert_eq!(copy, original);
    }
    let moved = restored.message(&dlq, with_attributes).unwrap();
    assert_eq!(moved.body.len(), 10_000);
    assert_eq!(moved.attributes, attributes);
    assert_eq!(moved.source, Some(q));
}

#[test]
#[should_panic(expected = "has no body record")]
fn restore_refuses_a_message_record_without_its_body() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "m");
    node.send(&q, "headless");
    let mut records: Vec<Record> = node.queues.records().collect();
    let last_body = records
        .iter()
        .rposition(|record| matches!(record, Record::MessageBody(_)))
        .unwrap();
    records.remove(last_body);
    let _ = Queues::restore(records, node.now);
}

#[test]
#[should_panic(expected = "has no message record")]
fn restore_refuses_a_body_record_without_its_message() {
    let mut node = Node::new();
    let q = node.create("jobs");
    node.send(&q, "m");
    let orphan = node.send(&q, "orphan");
    let records: Vec<Record> = node
        .queues
        .records()
        .filter(|record| !matches!(record, Record::Message(message) if message.id == orphan))
        .collect();
    let _ = Queues::restore(records, node.now);
}
