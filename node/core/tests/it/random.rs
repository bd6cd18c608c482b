//! Random command sequences. Every step runs the core's own invariant checks (debug build);
//! on top, this test checks what only an observer of the outputs can: a superseded handle never
//! deletes (I2), a deleted message is never delivered again (I8), every waiter is answered at
//! most once, a store fed by `take_changes` mirrors the state, and `restore` reproduces it.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trireme_core::{
    AttributeChanges, Change, Command, DedupId, Delivery, MessageId, Outcome, QueueAttributes,
    QueueName, Queues, ReceiptHandle, Record, RecordKey, RedrivePolicy, WaiterId, Wakeup,
};

use crate::support::START;

#[derive(Clone, Debug)]
enum Op {
    Send {
        queue: usize,
        delay_s: u32,
        dedup: Option<u8>,
    },
    Receive {
        queue: usize,
        max: u32,
        visibility_s: u32,
        wait_s: u32,
    },
    Delete {
        handle: usize,
    },
    ChangeVisibility {
        handle: usize,
        timeout_s: u32,
    },
    Advance {
        ms: u64,
    },
    Redrive {
        to_source: bool,
    },
    Purge {
        queue: usize,
    },
    DeleteQueue {
        queue: usize,
    },
    CreateQueue {
        queue: usize,
    },
    SetRetention {
        queue: usize,
        retention_s: u32,
    },
    SetMaxReceiveCount {
        count: u32,
    },
    CancelWaiter {
        waiter: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, prop_oneof![Just(0u32), Just(1), Just(5)], proptest::option::of(0..3u8))
            .prop_map(|(queue, delay_s, dedup)| Op::Send { queue, delay_s, dedup }),
        4 => (0..3usize, 1..4u32, prop_oneof![Just(0u32), Just(1), Just(5), Just(30)], prop_oneof![Just(0u32), Just(3)])
            .prop_map(|(queue, max, visibility_s, wait_s)| Op::Receive { queue, max, visibility_s, wait_s }),
        3 => (0..16usize).prop_map(|handle| Op::Delete { handle }),
        2 => (0..16usize, prop_oneof![Just(0u32), Just(2), Just(43_200)])
            .prop_map(|(handle, timeout_s)| Op::ChangeVisibility { handle, timeout_s }),
        4 => prop_oneof![Just(0u64), Just(500), Just(1_000), Just(5_000), Just(61_000), Just(400_000)]
            .prop_map(|ms| Op::Advance { ms }),
        1 => any::<bool>().prop_map(|to_source| Op::Redrive { to_source }),
        1 => (0..3usize).prop_map(|queue| Op::Purge { queue }),
        1 => (0..3usize).prop_map(|queue| Op::DeleteQueue { queue }),
        1 => (0..3usize).prop_map(|queue| Op::CreateQueue { queue }),
        1 => (0..3usize, prop_oneof![Just(60u32), Just(120), Just(345_600)])
            .prop_map(|(queue, retention_s)| Op::SetRetention { queue, retention_s }),
        1 => (1..4u32).prop_map(|count| Op::SetMaxReceiveCount { count }),
        1 => (0..8usize).prop_map(|waiter| Op::CancelWaiter { waiter }),
    ]
}

const NAMES: [&str; 3] = ["q0", "q1", "dlq"];

fn queue_name(index: usize) -> QueueName {
    QueueName::try_from(NAMES[index]).unwrap()
}

fn attributes_of(index: usize) -> QueueAttributes {
    if index == 0 {
        QueueAttributes {
            redrive: Some(RedrivePolicy {
                dead_letter_queue: queue_name(2),
                max_receive_count: 2,
            }),
            ..QueueAttributes::default()
        }
    } else {
        QueueAttributes::default()
    }
}

/// What the observer remembers about the outputs.
#[derive(Default)]
struct Observer {
    handles: Vec<ReceiptHandle>,
    /// Newest seq delivered per message: a handle with a smaller seq is superseded.
    newest_seq: BTreeMap<MessageId, u32>,
    deleted: BTreeSet<MessageId>,
    open_waiters: Vec<WaiterId>,
    answered: BTreeSet<WaiterId>,
}

impl Observer {
    fn delivered(&mut self, deliveries: &[Delivery]) {
        for delivery in deliveries {
            assert!(
                !self.deleted.contains(&delivery.message),
                "I8: deleted {} delivered again",
                delivery.message
            );
            let newest = self.newest_seq.entry(delivery.message).or_insert(0);
            assert!(delivery.handle.seq > *newest, "I1: a handle seq was reused");
            *newest = delivery.handle.seq;
            self.handles.push(delivery.handle.clone());
        }
    }

    fn wakeups(&mut self, wakeups: &[Wakeup]) {
        for wakeup in wakeups {
            assert!(
                self.answered.insert(wakeup.waiter()),
                "a waiter answered twice"
            );
            if let Wakeup::Served { deliveries, .. } = wakeup {
                assert!(!deliveries.is_empty());
                self.delivered(deliveries);
            }
        }
    }
}

fn stored_ids(queues: &Queues) -> BTreeSet<MessageId> {
    queues
        .records()
        .filter_map(|record| match record {
            Record::Message(message) => Some(message.id),
            _ => None,
        })
        .collect()
}

/// Every message stored before a step and not after it is reported gone exactly once, and
/// nothing still stored is reported gone.
fn check_gone(queues: &Queues, stored_before: &BTreeSet<MessageId>) {
    let stored_after = stored_ids(queues);
    let reported: Vec<MessageId> = queues
        .gone_in_last_step()
        .iter()
        .map(|(id, _)| *id)
        .collect();
    let reported_set: BTreeSet<MessageId> = reported.iter().copied().collect();
    assert_eq!(
        reported.len(),
        reported_set.len(),
        "a message reported gone twice"
    );
    let vanished: BTreeSet<MessageId> = stored_before.difference(&stored_after).copied().collect();
    assert_eq!(reported_set, vanished, "gone messages and reports disagree");
}

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

fn run(ops: Vec<Op>) {
    let mut queues = Queues::new();
    let mut now = START;
    let mut observer = Observer::default();
    let mut store = BTreeMap::new();
    let mut next_message = 1u128;
    let mut next_waiter = 1u64;
    for index in [2, 0, 1] {
        let step = queues.apply(
            now,
            Command::CreateQueue {
                name: queue_name(index),
                attributes: attributes_of(index),
                tags: BTreeMap::new(),
            },
        );
        assert!(step.result.is_ok());
    }
    for op in ops {
        let command = match op {
            Op::Send {
                queue,
                delay_s,
                dedup,
            } => {
                next_message += 1;
                Command::Send {
                    queue: queue_name(queue),
                    id: MessageId(next_message),
                    body: format!("m{next_message}"),
                    attributes: BTreeMap::new(),
                    system: Default::default(),
                    delay_s: Some(delay_s),
                    dedup: dedup.map(|d| DedupId::try_from(format!("k{d}")).unwrap()),
                }
            }
            Op::Receive {
                queue,
                max,
                visibility_s,
                wait_s,
            } => {
                next_waiter += 1;
                Command::Receive {
                    queue: queue_name(queue),
                    max,
                    visibility_s: Some(visibility_s),
                    wait_s: Some(wait_s),
                    waiter: WaiterId(next_waiter),
                }
            }
            Op::Delete { handle } | Op::ChangeVisibility { handle, .. }
                if observer.handles.is_empty() =>
            {
                let _ = handle;
                continue;
            }
            Op::Delete { handle } => {
                let handle = observer.handles[handle % observer.handles.len()].clone();
                Command::Delete {
                    queue: handle.queue.clone(),
                    handle,
                }
            }
            Op::ChangeVisibility { handle, timeout_s } => {
                let handle = observer.handles[handle % observer.handles.len()].clone();
                Command::ChangeVisibility {
                    queue: handle.queue.clone(),
                    handle,
                    timeout_s,
                }
            }
            Op::Advance { ms } => {
                now = now.plus_ms(ms);
                let stored_before = stored_ids(&queues);
                let wakeups = queues.advance(now);
                check_gone(&queues, &stored_before);
                observer.wakeups(&wakeups);
                apply_changes(&mut store, queues.take_changes());
                continue;
            }
            Op::Redrive { to_source } => Command::Redrive {
                from: queue_name(2),
                to: (!to_source).then(|| queue_name(1)),
                max: 5,
                allowed: None,
            },
            Op::Purge { queue } => Command::PurgeQueue {
                name: queue_name(queue),
            },
            Op::DeleteQueue { queue } => Command::DeleteQueue {
                name: queue_name(queue),
            },
            Op::CreateQueue { queue } => Command::CreateQueue {
                name: queue_name(queue),
                attributes: attributes_of(queue),
                tags: BTreeMap::new(),
            },
            Op::SetRetention { queue, retention_s } => Command::SetQueueAttributes {
                name: queue_name(queue),
                changes: AttributeChanges {
                    retention_s: Some(retention_s),
                    ..AttributeChanges::default()
                },
            },
            Op::SetMaxReceiveCount { count } => Command::SetQueueAttributes {
                name: queue_name(0),
                changes: AttributeChanges {
                    redrive: Some(Some(RedrivePolicy {
                        dead_letter_queue: queue_name(2),
                        max_receive_count: count,
                    })),
                    ..AttributeChanges::default()
                },
            },
            Op::CancelWaiter { waiter } if observer.open_waiters.is_empty() => {
                let _ = waiter;
                continue;
            }
            Op::CancelWaiter { waiter } => {
                let waiter = observer.open_waiters[waiter % observer.open_waiters.len()];
                Command::CancelWaiter { waiter }
            }
        };
        // Whether the handle about to be used is superseded, before the step runs.
        let superseded = match &command {
            Command::Delete { handle, .. } | Command::ChangeVisibility { handle, .. } => {
                observer
                    .newest_seq
                    .get(&handle.message)
                    .copied()
                    .unwrap_or(0)
                    > handle.seq
            }
            _ => false,
        };
        let stored_before = stored_ids(&queues);
        let step = queues.apply(now, command.clone());
        check_gone(&queues, &stored_before);
        observer.wakeups(&step.wakeups);
        if let Command::CancelWaiter { waiter } = &command {
            // Unless the time advance before the cancel served it, it is gone unanswered now.
            observer.answered.insert(*waiter);
        }
        match (&command, &step.result) {
            (_, Ok(Outcome::Received(deliveries))) => observer.delivered(deliveries),
            (_, Ok(Outcome::Waiting { waiter })) => observer.open_waiters.push(*waiter),
            (
                Command::Delete { handle, .. },
                Ok(Outcome::Deleted {
                    already_gone: false,
                }),
            ) => {
                assert!(!superseded, "I2: a superseded handle deleted");
                observer.deleted.insert(handle.message);
            }
            (Command::ChangeVisibility { .. }, Ok(Outcome::VisibilityChanged)) => {
                assert!(!superseded, "I2: a superseded handle changed visibility");
            }
            _ => {}
        }
        observer
            .open_waiters
            .retain(|waiter| !observer.answered.contains(waiter));
        apply_changes(&mut store, queues.take_changes());
        let snapshot: BTreeMap<RecordKey, Record> = queues
            .records()
            .map(|record| (record.key(), record))
            .collect();
        assert_eq!(store, snapshot, "the store diverged from the state");
    }
    // Let every waiter end (waits are at most 3 s) and no message sit at `InFlight{now}`:
    // waiters are not records, so only then does the stored state say everything.
    now = now.plus_ms(25_000);
    let wakeups = queues.advance(now);
    observer.wakeups(&wakeups);
    apply_changes(&mut store, queues.take_changes());
    for name in NAMES.map(|text| QueueName::try_from(text).unwrap()) {
        assert_eq!(queues.waiters(&name), vec![]);
    }
    let restored = Queues::restore(store.into_values(), now);
    let original: Vec<Record> = queues.records().collect();
    let copy: Vec<Record> = restored.records().collect();
    assert_eq!(copy, original);
    assert_eq!(restored.now(), queues.now());
    assert_eq!(restored.next_deadline(), queues.next_deadline());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_commands_keep_every_invariant(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops);
    }
}
