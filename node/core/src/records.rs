//! Persistence without I/O: the core's state as records the shell stores, which records changed
//! since the shell last asked (`take_changes`), and the rebuild of every index from stored
//! records (`restore`). Waiters are not records: their connections do not survive a restart.
//! This module never writes anything anywhere; the shell owns storage and its checksums.
//!
//! A message is two records: its state (`MessageRecord`, a few dozen bytes, rewritten by every
//! receive, restore, visibility change and move) and its body (`MessageBodyRecord`, up to
//! `message_bytes_max`, written once at send and removed when the message is gone). The body is
//! keyed by message id alone, so a move to another queue rewrites only the state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::attributes::QueueAttributes;
use crate::ids::{DedupId, Incarnation, MessageId, Millis, QueueName};
use crate::message::{AttributeValue, Message, MessageState, SystemAttributes};
use crate::queue::Queue;
use crate::queues::Queues;

/// A queue's settings and bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRecord {
    /// The queue's name (the record's key).
    pub name: QueueName,
    /// Its settings.
    pub attributes: QueueAttributes,
    /// Which creation of the name this is; receipt handles carry it.
    pub incarnation: Incarnation,
    /// When it was created.
    pub created_at: Millis,
    /// Creation or the latest attribute change.
    pub modified_at: Millis,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// When it was last purged (the purge rate limit counts from here).
    pub last_purge_at: Option<Millis>,
}

/// A stored message's state: everything about it that changes after send. Its body and
/// attributes are in the `MessageBodyRecord` with the same id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRecord {
    /// The message's id (with `queue`, the record's key).
    pub id: MessageId,
    /// The queue that holds it.
    pub queue: QueueName,
    /// Delayed, ready or in flight, with its time.
    pub state: MessageState,
    /// Deliveries in its current life (since send or redrive).
    pub receive_count: u32,
    /// Highest receipt-handle `seq` ever issued for it (never reset).
    pub last_seq: u32,
    /// First delivery in its current life.
    pub first_receive_at: Option<Millis>,
    /// Latest delivery (anchor of the 12 h visibility cap).
    pub received_at: Option<Millis>,
    /// `seq` of the newest handle issued in its current queue.
    pub handle: Option<u32>,
    /// Original send time; retention counts from it.
    pub sent_at: Millis,
    /// The queue it was dead-lettered from.
    pub source: Option<QueueName>,
}

/// What a stored message carries, immutable after send. Written once when the message is sent
/// and removed in the same change set as its `MessageRecord` when the message is gone; a move
/// between queues leaves it alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageBodyRecord {
    /// The message's id (the record's key). Ids are unique among a node's stored messages,
    /// whatever queue holds them: `Send` refuses an id that is stored in any queue.
    pub id: MessageId,
    /// The body, as sent.
    pub body: String,
    /// The message attributes, as sent.
    pub attributes: BTreeMap<String, AttributeValue>,
    /// The system attributes, as sent.
    pub system: SystemAttributes,
}

/// An open deduplication window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    /// The queue the deduplication id belongs to.
    pub queue: QueueName,
    /// The deduplication id.
    pub dedup: DedupId,
    /// The first message sent with it: the answer to every duplicate in the window.
    pub message: MessageId,
    /// When the window closes.
    pub expires_at: Millis,
}

/// A queue name that cannot be created again yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedNameRecord {
    /// The deleted queue's name.
    pub name: QueueName,
    /// When it was deleted; the name is free again `queue_name_reuse_ms` later.
    pub deleted_at: Millis,
}

/// One unit of stored state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A queue.
    Queue(QueueRecord),
    /// A stored message's state.
    Message(MessageRecord),
    /// A stored message's body and attributes.
    MessageBody(MessageBodyRecord),
    /// An open deduplication window.
    Dedup(DedupRecord),
    /// A name within its reuse window.
    DeletedName(DeletedNameRecord),
}

impl Record {
    /// The key this record is stored under.
    #[must_use]
    pub fn key(&self) -> RecordKey {
        match self {
            Record::Queue(record) => RecordKey::Queue(record.name.clone()),
            Record::Message(record) => RecordKey::Message(record.queue.clone(), record.id),
            Record::MessageBody(record) => RecordKey::MessageBody(record.id),
            Record::Dedup(record) => RecordKey::Dedup(record.queue.clone(), record.dedup.clone()),
            Record::DeletedName(record) => RecordKey::DeletedName(record.name.clone()),
        }
    }
}

/// Where a record is stored. A message's state key includes its queue, so a move between
/// queues is a `Remove` of the old key and a `Put` under the new one; its body key does not, so
/// the body stays where it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RecordKey {
    /// Key of a `QueueRecord`.
    Queue(QueueName),
    /// Key of a `MessageRecord`.
    Message(QueueName, MessageId),
    /// Key of a `MessageBodyRecord`.
    MessageBody(MessageId),
    /// Key of a `DedupRecord`.
    Dedup(QueueName, DedupId),
    /// Key of a `DeletedNameRecord`.
    DeletedName(QueueName),
}

/// A change the shell must make to storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Store this record under its key, replacing what is there.
    Put(Record),
    /// Remove whatever is stored under this key.
    Remove(RecordKey),
}

impl Queues {
    /// Every record touched since the last call: the current record, or `Remove` when it no
    /// longer exists. In key order, so the output is deterministic. A message's body appears
    /// only in the call after its send (`Put`) and the call after it is gone (`Remove`).
    ///
    /// The shell must make one call's changes durable together (one transaction): a message's
    /// state and body records are written in the same call and removed in the same call, and
    /// `restore` refuses one without the other.
    pub fn take_changes(&mut self) -> Vec<Change> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .map(|key| match self.record(&key) {
                Some(record) => Change::Put(record),
                None => Change::Remove(key),
            })
            .collect()
    }

    /// Every record of the current state, in key order within each kind (a full snapshot).
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        let queues = self
            .queues
            .iter()
            .map(|(name, queue)| Record::Queue(queue_record(name, queue)));
        let messages = self
            .queues
            .values()
            .flat_map(|queue| queue.retained.iter())
            .map(|&(_, id)| Record::Message(self.message_record(id)));
        let bodies = self
            .messages
            .iter()
            .map(|(&id, message)| Record::MessageBody(body_record(id, message)));
        let dedups = self.queues.iter().flat_map(|(name, queue)| {
            queue.dedup.iter().map(|(dedup, entry)| {
                Record::Dedup(DedupRecord {
                    queue: name.clone(),
                    dedup: dedup.clone(),
                    message: entry.message,
                    expires_at: entry.expires_at,
                })
            })
        });
        let names = self.deleted_names.iter().map(|(name, &deleted_at)| {
            Record::DeletedName(DeletedNameRecord {
                name: name.clone(),
                deleted_at,
            })
        });
        queues
            .chain(messages)
            .chain(bodies)
            .chain(dedups)
            .chain(names)
    }

    /// Rebuilds a node's queues from stored records (in any order) and advances time to `now`
    /// (or stays at the latest time the records mention, if later: time never goes back). Every
    /// index is rebuilt; events that came due while the node was down fire now, and the records
    /// they change are reported by the next `take_changes`.
    ///
    /// # Panics
    /// When the records contradict each other (a message or deduplication entry of a queue
    /// that has no record, a message's state without its body or a body without its state,
    /// two records under one key): storage returned state the core never wrote, which the
    /// shell's checksums should have caught. Refusing to start keeps the evidence; dropping
    /// the odd record would silently lose a message. A crash cannot leave such a half, since
    /// the shell commits each `take_changes` in one transaction.
    #[must_use]
    pub fn restore(records: impl IntoIterator<Item = Record>, now: Millis) -> Queues {
        let mut queues = Queues::new();
        let mut messages = Vec::new();
        let mut bodies = BTreeMap::new();
        let mut dedups = Vec::new();
        // The latest time the records mention: the clock resumes there, so every event still
        // due fires at its own time during the advance to `now` below.
        let mut latest = Millis(0);
        for record in records {
            match record {
                Record::Queue(record) => {
                    latest = latest.max(record.modified_at);
                    let mut queue = Queue::new(record.attributes, record.created_at, record.tags);
                    queue.incarnation = record.incarnation;
                    queue.modified_at = record.modified_at;
                    queue.last_purge_at = record.last_purge_at;
                    if let Some(purged_at) = record.last_purge_at {
                        latest = latest.max(purged_at);
                    }
                    let previous = queues.queues.insert(record.name, queue);
                    assert!(previous.is_none(), "two records for one queue");
                }
                Record::Message(record) => {
                    latest = latest.max(record.sent_at);
                    if let Some(received_at) = record.received_at {
                        latest = latest.max(received_at);
                    }
                    messages.push(record);
                }
                Record::MessageBody(record) => {
                    let id = record.id;
                    let previous = bodies.insert(id, record);
                    assert!(previous.is_none(), "two body records for message {id}");
                }
                Record::Dedup(record) => dedups.push(record),
                Record::DeletedName(record) => {
                    latest = latest.max(record.deleted_at);
                    queues.release_name_at(record.name, record.deleted_at);
                }
            }
        }
        for record in messages {
            let body = bodies.remove(&record.id).unwrap_or_else(|| {
                panic!(
                    "message {} of queue {} has no body record",
                    record.id, record.queue
                )
            });
            let message = Message {
                queue: record.queue,
                state: record.state,
                receive_count: record.receive_count,
                last_seq: record.last_seq,
                first_receive_at: record.first_receive_at,
                received_at: record.received_at,
                handle: record.handle,
                sent_at: record.sent_at,
                source: record.source,
                body: body.body,
                attributes: body.attributes,
                system: body.system,
            };
            assert!(
                queues.queues.contains_key(&message.queue),
                "message {} of queue {} without a queue record",
                record.id,
                message.queue
            );
            queues.insert_message(record.id, message);
        }
        if let Some(orphan) = bodies.keys().next() {
            panic!("body record of message {orphan} has no message record");
        }
        for record in dedups {
            queues
                .queues
                .get_mut(&record.queue)
                .expect("a deduplication record's queue has a record")
                .insert_dedup(record.dedup, record.message, record.expires_at);
            queues.reschedule(&record.queue);
        }
        // Rebuilding is not a change: storage already holds exactly these records.
        queues.dirty.clear();
        // Records the core wrote have nothing due before the latest time they mention; should
        // a store hand back an older event anyway, the clock resumes there so it still fires
        // in order rather than tripping the time assertions.
        queues.now = queues
            .earliest_event(None)
            .map_or(latest, |earliest| earliest.min(latest));
        let wakeups = queues.advance(now.max(latest));
        assert!(
            wakeups.is_empty(),
            "restored queues have no waiters to wake"
        );
        queues
    }

    /// The current record under `key`, if it exists.
    fn record(&self, key: &RecordKey) -> Option<Record> {
        match key {
            RecordKey::Queue(name) => self
                .queues
                .get(name)
                .map(|queue| Record::Queue(queue_record(name, queue))),
            RecordKey::Message(queue, id) => self
                .messages
                .get(id)
                .filter(|message| &message.queue == queue)
                .map(|_| Record::Message(self.message_record(*id))),
            RecordKey::MessageBody(id) => self
                .messages
                .get(id)
                .map(|message| Record::MessageBody(body_record(*id, message))),
            RecordKey::Dedup(queue, dedup) => self
                .queues
                .get(queue)
                .and_then(|q| q.dedup.get(dedup))
                .map(|entry| {
                    Record::Dedup(DedupRecord {
                        queue: queue.clone(),
                        dedup: dedup.clone(),
                        message: entry.message,
                        expires_at: entry.expires_at,
                    })
                }),
            RecordKey::DeletedName(name) => self.deleted_names.get(name).map(|&deleted_at| {
                Record::DeletedName(DeletedNameRecord {
                    name: name.clone(),
                    deleted_at,
                })
            }),
        }
    }

    fn message_record(&self, id: MessageId) -> MessageRecord {
        let message = self
            .messages
            .get(&id)
            .expect("an indexed message is stored");
        MessageRecord {
            id,
            queue: message.queue.clone(),
            state: message.state,
            receive_count: message.receive_count,
            last_seq: message.last_seq,
            first_receive_at: message.first_receive_at,
            received_at: message.received_at,
            handle: message.handle,
            sent_at: message.sent_at,
            source: message.source.clone(),
        }
    }
}

fn body_record(id: MessageId, message: &Message) -> MessageBodyRecord {
    MessageBodyRecord {
        id,
        body: message.body.clone(),
        attributes: message.attributes.clone(),
        system: message.system.clone(),
    }
}

fn queue_record(name: &QueueName, queue: &Queue) -> QueueRecord {
    QueueRecord {
        name: name.clone(),
        attributes: queue.attributes.clone(),
        incarnation: queue.incarnation,
        created_at: queue.created_at,
        modified_at: queue.modified_at,
        tags: queue.tags.clone(),
        last_purge_at: queue.last_purge_at,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::attributes::RedrivePolicy;
    use crate::command::{Command, Outcome};
    use crate::ids::{DedupId, WaiterId};

    const T0: Millis = Millis(1_000_000);

    fn name(text: &str) -> QueueName {
        QueueName::try_from(text).unwrap()
    }

    fn send(queue: &str, id: u128, delay_s: Option<u32>, dedup: Option<&str>) -> Command {
        Command::Send {
            queue: name(queue),
            id: MessageId(id),
            body: format!("body {id}"),
            attributes: BTreeMap::from([(
                "n".to_owned(),
                AttributeValue::String {
                    data_type: "Number".to_owned(),
                    value: id.to_string(),
                },
            )]),
            system: Default::default(),
            delay_s,
            dedup: dedup.map(|d| DedupId::try_from(d).unwrap()),
        }
    }

    fn receive(queue: &str, visibility_s: u32) -> Command {
        Command::Receive {
            queue: name(queue),
            max: 10,
            visibility_s: Some(visibility_s),
            wait_s: Some(0),
            waiter: WaiterId(0),
        }
    }

    /// Every observable query of `queues`, gathered in one comparable value.
    fn body(id: u128) -> Record {
        Record::MessageBody(MessageBodyRecord {
            id: MessageId(id),
            body: format!("body of {id}"),
            attributes: BTreeMap::new(),
            system: SystemAttributes::default(),
        })
    }

    fn observable(queues: &Queues) -> String {
        let mut out = format!(
            "now {:?}\nnext {:?}\n",
            queues.now(),
            queues.next_deadline()
        );
        for name in queues.list_queues("", None, usize::MAX) {
            out += &format!("{:?}\n", queues.queue(&name));
            out += &format!("{:?}\n", queues.dead_letter_sources(&name));
            for message in queues.messages(&name) {
                out += &format!("{message:?}\n");
            }
        }
        out += &format!("{:?}\n", queues.records().collect::<Vec<_>>());
        out
    }

    #[test]
    fn restore_of_every_change_equals_the_original() {
        let mut queues = Queues::new();
        let steps = [
            Command::CreateQueue {
                name: name("dlq"),
                attributes: Default::default(),
                tags: BTreeMap::new(),
            },
            Command::CreateQueue {
                name: name("jobs"),
                attributes: crate::QueueAttributes {
                    redrive: Some(RedrivePolicy {
                        dead_letter_queue: name("dlq"),
                        max_receive_count: 1,
                    }),
                    ..Default::default()
                },
                tags: BTreeMap::from([("team".to_owned(), "core".to_owned())]),
            },
            Command::CreateQueue {
                name: name("old"),
                attributes: Default::default(),
                tags: BTreeMap::new(),
            },
            Command::PurgeQueue { name: name("dlq") },
            send("jobs", 1, None, Some("a")),
            send("jobs", 2, None, None),
            send("jobs", 3, Some(600), Some("b")),
            receive("jobs", 0),
            send("jobs", 4, None, None),
            receive("jobs", 100),
            send("jobs", 5, None, None),
            Command::DeleteQueue { name: name("old") },
        ];
        for (n, command) in steps.into_iter().enumerate() {
            let step = queues.apply(T0.plus_s(n as u32), command);
            assert!(step.result.is_ok(), "step {n}: {:?}", step.result);
        }
        // The receive with visibility 0 left messages for the dead-letter queue.
        assert!(queues.messages(&name("dlq")).count() > 0);
        let records: Vec<Record> = queues
            .take_changes()
            .into_iter()
            .filter_map(|change| match change {
                Change::Put(record) => Some(record),
                Change::Remove(_) => None,
            })
            .collect();
        let restored = Queues::restore(records, queues.now());
        assert_eq!(observable(&restored), observable(&queues));
        // And both answer the next command alike.
        let mut original = queues;
        let mut copy = restored;
        let next = send("jobs", 3, None, Some("b"));
        let a = original.apply(T0.plus_s(20), next.clone());
        let b = copy.apply(T0.plus_s(20), next);
        assert_eq!(
            a.result,
            Ok(Outcome::Sent {
                id: MessageId(3),
                duplicate: true
            })
        );
        assert_eq!(a, b);
    }

    #[test]
    fn restore_of_records_from_different_moments_fires_overdue_events_in_order() {
        // Message 1's record says it is in flight until T0 + 30 s, message 2 was sent at
        // T0 + 60 s: no single state of the core looked like this, but restore copes.
        let jobs = name("jobs");
        let message = |id: u128, state, sent_at: Millis, received: bool| {
            Record::Message(MessageRecord {
                id: MessageId(id),
                queue: jobs.clone(),
                state,
                receive_count: u32::from(received),
                last_seq: u32::from(received),
                first_receive_at: received.then_some(sent_at),
                received_at: received.then_some(sent_at),
                handle: received.then_some(1),
                sent_at,
                source: None,
            })
        };
        let records = vec![
            Record::Queue(QueueRecord {
                name: jobs.clone(),
                attributes: Default::default(),
                incarnation: Incarnation::local(T0),
                created_at: T0,
                modified_at: T0,
                tags: BTreeMap::new(),
                last_purge_at: None,
            }),
            body(1),
            body(2),
            message(
                1,
                MessageState::InFlight {
                    until: T0.plus_s(30),
                },
                T0,
                true,
            ),
            message(
                2,
                MessageState::Ready {
                    since: T0.plus_s(60),
                },
                T0.plus_s(60),
                false,
            ),
        ];
        let restored = Queues::restore(records, T0);
        assert_eq!(restored.now(), T0.plus_s(60));
        assert_eq!(
            restored.message(&jobs, MessageId(1)).unwrap().state,
            MessageState::Ready {
                since: T0.plus_s(30)
            }
        );
    }

    #[test]
    fn take_changes_is_empty_when_nothing_changed() {
        let mut queues = Queues::new();
        assert_eq!(queues.take_changes(), vec![]);
        queues.apply(
            T0,
            Command::CreateQueue {
                name: name("jobs"),
                attributes: Default::default(),
                tags: BTreeMap::new(),
            },
        );
        assert_eq!(queues.take_changes().len(), 1);
        queues.advance(T0.plus_s(5));
        assert_eq!(queues.take_changes(), vec![]);
    }
}
