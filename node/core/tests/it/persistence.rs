//! Persistence through records: a store fed only by `take_changes` mirrors the live state after
//! every step, records survive serialization, and `restore` rebuilds a node that behaves
//! exactly like the original from then on.

use std::collections::BTreeMap;

use trireme_core::{AttributeChanges, Change, Command, Millis, Queues, Record, RecordKey, Step};

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
