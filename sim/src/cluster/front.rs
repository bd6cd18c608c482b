//! How simulated clients reach the cluster: each member serves a small line protocol on
//! [`FRONT_PORT`] whose calls go through the node's public edge, `Backend::cluster` over
//! `ClusterEdge` with `trireme_core::Command`s (what the gRPC and SQS handlers call), so a run
//! exercises the queue lookup, the parameter checks, the clock gate and the answers' mapping
//! the real endpoints have. One connection carries one request line and one answer line, so a
//! call lost to a partition or a crash is just a connection that never answers. Only `count`
//! and `records` read the member's replica store directly: they are the harness's inspection
//! after the drain, not a client's call.
//!
//! Receipt handles travel as [`Ticket`]s: the message id and the edge's opaque receipt handle
//! (keyed by [`HANDLE_KEY`], shared by every member as a cluster secret is). The edge draws
//! message ids from the member's seeded random source. This module must never decide anything
//! the edge decides: it translates, nothing more.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use trireme_core::{
    Command, DedupId, MessageId, Outcome, QueueAttributes, QueueName, ReceiptHandle, RedrivePolicy,
};
use trireme_node::backend::Backend;
use trireme_node::clock::Clock;
use trireme_node::cluster::Cluster;
use trireme_node::cluster::edge::ClusterEdge;
use trireme_node::engine::EngineError;
use trireme_node::handle::HandleCodec;
use trireme_node::metrics::MessageCounters;
use trireme_node::redrive::RedriveError;
use trireme_replication::RecordKey;
use trireme_replication::record::{Body, Record};
use turmoil::net::{TcpListener, TcpStream};

use super::workload::QUEUE_VISIBILITY_S;

use crate::history::fnv1a;

/// The port every member serves the front on.
pub const FRONT_PORT: u16 = 7300;
/// The one queue of the run, created by the clients through the edge before anything else.
pub const QUEUE: &str = "sim-queue";
/// The run's dead-letter queue, in the seeds whose queue has a redrive policy: an ordinary queue
/// the clients create first (spec/replication.md §7).
pub const DEAD_LETTER_QUEUE: &str = "sim-dlq";
/// The queue whose creates and deletes race through two members, apart from the run's.
pub const RACE_QUEUE: &str = "sim-race";
/// The receipt handles' key, the same on every member (the cluster secret's part).
pub const HANDLE_KEY: &[u8] = b"trireme-sim-cluster-handle-key-0";
/// Longest request or answer line; a longer one is a broken peer.
const LINE_BYTES_MAX: usize = 64 * 1024;

/// A receipt handle as the front hands it out: the message id (for the history) and the edge's
/// receipt handle, as an SQS or gRPC client gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub message: MessageId,
    /// URL-safe base64: no space, comma or dot.
    pub handle: String,
}

impl Ticket {
    fn encode(&self) -> String {
        format!("{:032x}.{}", self.message.0, self.handle)
    }

    fn decode(text: &str) -> Option<Ticket> {
        let (message, handle) = text.split_once('.')?;
        let message = MessageId(u128::from_str_radix(message, 16).ok()?);
        (!handle.is_empty()).then(|| Ticket {
            message,
            handle: handle.to_owned(),
        })
    }

    /// The message id as the history names it.
    #[must_use]
    pub fn message_id(&self) -> String {
        format!("{:032x}", self.message.0)
    }

    /// The receipt handle the edge encoded, read with the cluster's handle key as a member
    /// reads it; `None` for a string no member issued.
    #[must_use]
    pub fn receipt_handle(&self) -> Option<ReceiptHandle> {
        HandleCodec::new(HANDLE_KEY)
            .expect("the key is long enough")
            .decode(&self.handle)
            .ok()
    }

    /// The generation of the message's life this handle belongs to (spec/replication.md, *The
    /// record*): what the history compares handles and deletes within. 0 for a string no
    /// member issued.
    #[must_use]
    pub fn generation(&self) -> u32 {
        self.receipt_handle()
            .map_or(0, |handle| handle.claim.generation)
    }

    /// Whether the handle names the dead-letter queue (a client knows which queue it received
    /// from; the handle carries it).
    #[must_use]
    pub fn dead_letter(&self) -> bool {
        self.receipt_handle()
            .is_some_and(|handle| handle.queue.as_str() == DEAD_LETTER_QUEUE)
    }
}

/// A call to the front.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `CreateQueue` of the run's queue, with the attributes every client asks for: with
    /// `max_receive_count`, a redrive policy to [`DEAD_LETTER_QUEUE`]; with `dead_letter`, that
    /// queue itself (default attributes but the visibility timeout).
    CreateQueue {
        dead_letter: bool,
        max_receive_count: Option<u32>,
    },
    /// A send; with a deduplication id, the send of spec/replication.md §4.
    Send {
        body: String,
        delay_s: u32,
        dedup: Option<String>,
    },
    /// A batch of sends (`SendMessageBatch`): each entry's body and delay.
    SendBatch {
        entries: Vec<(String, u32)>,
    },
    /// A receive of the run's queue or (`dead_letter`) its dead-letter queue; `wait_s` above 0
    /// is a long poll (spec/replication.md §9).
    Receive {
        dead_letter: bool,
        max: u32,
        visibility_s: u32,
        wait_s: u32,
    },
    Delete {
        ticket: Ticket,
    },
    /// A batch of deletes (`DeleteMessageBatch`).
    DeleteBatch {
        tickets: Vec<Ticket>,
    },
    ChangeVisibility {
        ticket: Ticket,
        timeout_s: u32,
    },
    /// Dead-letter now (`Command::DeadLetterNow`, gRPC only: the SQS endpoint has no such
    /// action) with a handle of the run's queue.
    DeadLetterNow {
        ticket: Ticket,
    },
    /// `StartMessageMoveTask` from the dead-letter queue back to its source.
    StartMoveTask,
    /// `PurgeQueue` of the run's queue.
    Purge,
    /// `CreateQueue` (`create`) or `DeleteQueue` of [`RACE_QUEUE`].
    RaceQueue {
        create: bool,
    },
    /// The member's local view of the queue: live records, visible now or not.
    Count,
    /// Every record the member's replica store holds (for the convergence check).
    Records,
}

/// One record as a replica holds it: enough to compare replicas record by record and to say
/// how two differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The queue the record is of (a dead-letter copy lives on the replicas of the dead-letter
    /// queue and the message id, spec/replication.md, *Placement*).
    pub queue: String,
    /// The message id, as the history names it.
    pub message_id: String,
    /// FNV-1a of the whole record's debug rendering: equal exactly when the records are.
    pub hash: u64,
    /// The generation, the body's kind, the claim's seq and the receive count.
    pub summary: String,
}

impl Held {
    fn of(key: &RecordKey, record: &Record) -> Held {
        let summary = match &record.body {
            Body::Live(live) => format!(
                "g{}-live-seq{}-count{}",
                record.generation.0,
                live.held.as_ref().map_or(0, |held| held.claim.seq),
                live.receive_count
            ),
            Body::Tombstone(_) => format!("g{}-tombstone", record.generation.0),
        };
        Held {
            queue: key.queue.as_str().to_owned(),
            message_id: format!("{:032x}", key.message.0),
            hash: fnv1a(format!("{record:?}").as_bytes()),
            summary,
        }
    }
}

/// One delivered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Got {
    pub ticket: Ticket,
    pub body: String,
    pub receive_count: u32,
}

/// The front's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Sent {
        message_id: String,
    },
    Received(Vec<Got>),
    /// A create, a delete or a visibility change took effect.
    Done,
    /// The coordinator refused: nothing was written.
    Refused {
        code: String,
    },
    /// No quorum by the deadline (or the replies diverged): it may have taken effect.
    Unavailable {
        reason: String,
    },
    Counts {
        ready: u64,
        in_flight: u64,
    },
    /// The member's records, or why it could not read them.
    Records(Result<Vec<Held>, String>),
    /// A batch's answer: one per entry, in entry order (`Sent`, `Done`, `Refused` or
    /// `Unavailable`).
    Batch(Vec<Answer>),
}

fn encode_request(request: &Request) -> String {
    match request {
        Request::CreateQueue {
            dead_letter: true, ..
        } => "create dlq".to_owned(),
        Request::CreateQueue {
            dead_letter: false,
            max_receive_count,
        } => format!(
            "create queue {}",
            max_receive_count.map_or("-".to_owned(), |max| max.to_string())
        ),
        Request::Send {
            body,
            delay_s,
            dedup,
        } => format!("send {delay_s} {body} {}", dedup.as_deref().unwrap_or("-")),
        Request::SendBatch { entries } => {
            let mut line = "sendbatch".to_owned();
            for (body, delay_s) in entries {
                line.push_str(&format!(" {delay_s},{body}"));
            }
            line
        }
        Request::DeleteBatch { tickets } => {
            let mut line = "deletebatch".to_owned();
            for ticket in tickets {
                line.push(' ');
                line.push_str(&ticket.encode());
            }
            line
        }
        Request::Receive {
            dead_letter,
            max,
            visibility_s,
            wait_s,
        } => format!("receive {dead_letter} {max} {visibility_s} {wait_s}"),
        Request::Delete { ticket } => format!("delete {}", ticket.encode()),
        Request::ChangeVisibility { ticket, timeout_s } => {
            format!("visibility {} {timeout_s}", ticket.encode())
        }
        Request::DeadLetterNow { ticket } => format!("deadletternow {}", ticket.encode()),
        Request::StartMoveTask => "movetask".to_owned(),
        Request::Purge => "purge".to_owned(),
        Request::RaceQueue { create } => format!("race {create}"),
        Request::Count => "count".to_owned(),
        Request::Records => "records".to_owned(),
    }
}

fn decode_request(line: &str) -> Option<Request> {
    let words: Vec<&str> = line.split_whitespace().collect();
    Some(match words.as_slice() {
        ["create", "dlq"] => Request::CreateQueue {
            dead_letter: true,
            max_receive_count: None,
        },
        ["create", "queue", max] => Request::CreateQueue {
            dead_letter: false,
            max_receive_count: match *max {
                "-" => None,
                max => Some(max.parse().ok()?),
            },
        },
        ["send", delay_s, body, dedup] => Request::Send {
            body: (*body).to_owned(),
            delay_s: delay_s.parse().ok()?,
            dedup: (*dedup != "-").then(|| (*dedup).to_owned()),
        },
        ["sendbatch", entries @ ..] => Request::SendBatch {
            entries: entries
                .iter()
                .map(|entry| {
                    let (delay_s, body) = entry.split_once(',')?;
                    Some((body.to_owned(), delay_s.parse().ok()?))
                })
                .collect::<Option<Vec<_>>>()?,
        },
        ["deletebatch", tickets @ ..] => Request::DeleteBatch {
            tickets: tickets
                .iter()
                .map(|ticket| Ticket::decode(ticket))
                .collect::<Option<Vec<_>>>()?,
        },
        ["receive", dead_letter, max, visibility_s, wait_s] => Request::Receive {
            dead_letter: dead_letter.parse().ok()?,
            max: max.parse().ok()?,
            visibility_s: visibility_s.parse().ok()?,
            wait_s: wait_s.parse().ok()?,
        },
        ["delete", ticket] => Request::Delete {
            ticket: Ticket::decode(ticket)?,
        },
        ["visibility", ticket, timeout_s] => Request::ChangeVisibility {
            ticket: Ticket::decode(ticket)?,
            timeout_s: timeout_s.parse().ok()?,
        },
        ["deadletternow", ticket] => Request::DeadLetterNow {
            ticket: Ticket::decode(ticket)?,
        },
        ["movetask"] => Request::StartMoveTask,
        ["purge"] => Request::Purge,
        ["race", create] => Request::RaceQueue {
            create: create.parse().ok()?,
        },
        ["count"] => Request::Count,
        ["records"] => Request::Records,
        _ => return None,
    })
}

fn encode_answer(answer: &Answer) -> String {
    match answer {
        Answer::Sent { message_id } => format!("sent {message_id}"),
        Answer::Received(got) => {
            let mut line = "received".to_owned();
            for got in got {
                line.push_str(&format!(
                    " {},{},{}",
                    got.ticket.encode(),
                    got.receive_count,
                    got.body
                ));
            }
            line
        }
        Answer::Done => "done".to_owned(),
        Answer::Refused { code } => format!("refused {code}"),
        Answer::Unavailable { reason } => format!("unavailable {reason}"),
        Answer::Counts { ready, in_flight } => format!("counts {ready} {in_flight}"),
        Answer::Records(Ok(held)) => {
            let mut line = "records".to_owned();
            for held in held {
                line.push_str(&format!(
                    " {},{},{:016x},{}",
                    held.queue, held.message_id, held.hash, held.summary
                ));
            }
            line
        }
        Answer::Records(Err(error)) => format!("unreadable {}", error.replace(' ', "_")),
        Answer::Batch(entries) => {
            let mut line = "batch".to_owned();
            for entry in entries {
                line.push(' ');
                line.push_str(&match entry {
                    Answer::Sent { message_id } => format!("sent:{message_id}"),
                    Answer::Done => "done:".to_owned(),
                    Answer::Refused { code } => format!("refused:{code}"),
                    Answer::Unavailable { reason } => format!("unavailable:{reason}"),
                    other => unreachable!("a batch entry never answers {other:?}"),
                });
            }
            line
        }
    }
}

fn decode_answer(line: &str) -> Option<Answer> {
    let words: Vec<&str> = line.split_whitespace().collect();
    Some(match words.as_slice() {
        ["sent", id] => Answer::Sent {
            message_id: (*id).to_owned(),
        },
        ["received", got @ ..] => Answer::Received(
            got.iter()
                .map(|item| {
                    let mut parts = item.splitn(3, ',');
                    let ticket = Ticket::decode(parts.next()?)?;
                    let receive_count = parts.next()?.parse().ok()?;
                    let body = parts.next()?.to_owned();
                    Some(Got {
                        ticket,
                        body,
                        receive_count,
                    })
                })
                .collect::<Option<Vec<Got>>>()?,
        ),
        ["done"] => Answer::Done,
        ["refused", code] => Answer::Refused {
            code: (*code).to_owned(),
        },
        ["unavailable", reason] => Answer::Unavailable {
            reason: (*reason).to_owned(),
        },
        ["counts", ready, in_flight] => Answer::Counts {
            ready: ready.parse().ok()?,
            in_flight: in_flight.parse().ok()?,
        },
        ["records", held @ ..] => Answer::Records(Ok(held
            .iter()
            .map(|item| {
                let mut parts = item.splitn(4, ',');
                Some(Held {
                    queue: parts.next()?.to_owned(),
                    message_id: parts.next()?.to_owned(),
                    hash: u64::from_str_radix(parts.next()?, 16).ok()?,
                    summary: parts.next()?.to_owned(),
                })
            })
            .collect::<Option<Vec<Held>>>()?)),
        ["unreadable", error] => Answer::Records(Err((*error).to_owned())),
        ["batch", entries @ ..] => Answer::Batch(
            entries
                .iter()
                .map(|entry| {
                    let (kind, value) = entry.split_once(':')?;
                    let value = value.to_owned();
                    Some(match kind {
                        "sent" => Answer::Sent { message_id: value },
                        "done" => Answer::Done,
                        "refused" => Answer::Refused { code: value },
                        "unavailable" => Answer::Unavailable { reason: value },
                        _ => return None,
                    })
                })
                .collect::<Option<Vec<_>>>()?,
        ),
        _ => return None,
    })
}

/// A member's front: the public edge over its cluster, and the cluster and clock for the
/// harness's inspection.
#[derive(Clone)]
pub struct Front {
    /// What the gRPC and SQS handlers call on a member.
    pub backend: Backend,
    pub cluster: Cluster,
    pub clock: Arc<dyn Clock>,
}

impl Front {
    /// The front of `cluster` on `clock`, its edge drawing message ids from `seed` (a seed per
    /// boot, so two boots never draw the same ids).
    #[must_use]
    pub fn new(cluster: Cluster, clock: Arc<dyn Clock>, seed: u64) -> Front {
        let handles = HandleCodec::new(HANDLE_KEY).expect("the key is long enough");
        let edge = ClusterEdge::new(cluster.clone(), handles, Arc::clone(&clock), Some(seed));
        Front {
            backend: Backend::cluster(edge, MessageCounters::default()),
            cluster,
            clock,
        }
    }

    /// The edge's answer to `command`: `Ok` with its outcome, or the refusal or the
    /// unavailability as the front answers them.
    async fn command(&self, command: Command) -> Result<Outcome, Answer> {
        self.backend.execute(command).await.map_err(failed)
    }

    /// A send of `body` to the run's queue, with a fresh id from the edge.
    fn send_command(&self, body: String, delay_s: u32) -> Command {
        Command::Send {
            queue: queue(),
            id: self.backend.new_message_id(),
            body,
            attributes: BTreeMap::new(),
            system: trireme_core::SystemAttributes::default(),
            delay_s: Some(delay_s),
            dedup: None,
        }
    }

    async fn execute(&self, request: Request) -> Answer {
        match request {
            Request::CreateQueue {
                dead_letter,
                max_receive_count,
            } => {
                let attributes = QueueAttributes {
                    visibility_timeout_s: QUEUE_VISIBILITY_S,
                    redrive: max_receive_count.map(|max_receive_count| RedrivePolicy {
                        dead_letter_queue: dead_letter_queue(),
                        max_receive_count,
                    }),
                    ..QueueAttributes::default()
                };
                let command = Command::CreateQueue {
                    name: if dead_letter {
                        dead_letter_queue()
                    } else {
                        queue()
                    },
                    attributes,
                    tags: BTreeMap::new(),
                };
                match self.command(command).await {
                    Ok(Outcome::QueueCreated { .. }) => Answer::Done,
                    Ok(other) => unexpected(&other),
                    Err(answer) => answer,
                }
            }
            Request::Send {
                body,
                delay_s,
                dedup,
            } => {
                let mut command = self.send_command(body, delay_s);
                if let (Command::Send { dedup: slot, .. }, Some(dedup)) = (&mut command, dedup) {
                    match DedupId::try_from(dedup.as_str()) {
                        Ok(dedup) => *slot = Some(dedup),
                        Err(_) => return refused("InvalidDeduplicationId"),
                    }
                }
                let result = self.command(command).await;
                sent(result)
            }
            Request::SendBatch { entries } => {
                // The edge's batch: one instant for every entry, ids drawn in entry order.
                let commands = entries
                    .into_iter()
                    .map(|(body, delay_s)| self.send_command(body, delay_s))
                    .collect();
                let results = self.backend.execute_all(commands).await;
                Answer::Batch(
                    results
                        .into_iter()
                        .map(|result| sent(result.map_err(failed)))
                        .collect(),
                )
            }
            Request::DeleteBatch { tickets } => {
                let mut answers: Vec<Option<Answer>> = Vec::new();
                let mut commands = Vec::new();
                for ticket in &tickets {
                    match self.backend.handles().decode(&ticket.handle) {
                        Ok(handle) => {
                            answers.push(None);
                            // The queue that issued the handle, as its client knows it.
                            commands.push(Command::Delete {
                                queue: handle.queue.clone(),
                                handle,
                            });
                        }
                        Err(_) => answers.push(Some(refused("ReceiptHandleUndecodable"))),
                    }
                }
                let mut results = self.backend.execute_all(commands).await.into_iter();
                Answer::Batch(
                    answers
                        .into_iter()
                        .map(|answer| {
                            answer.unwrap_or_else(|| {
                                deleted(results.next().expect("one per command").map_err(failed))
                            })
                        })
                        .collect(),
                )
            }
            Request::Receive {
                dead_letter,
                max,
                visibility_s,
                wait_s,
            } => {
                let name = if dead_letter {
                    dead_letter_queue()
                } else {
                    queue()
                };
                match self
                    .backend
                    .receive(name, max, Some(visibility_s), Some(wait_s))
                    .await
                {
                    Ok(delivered) => Answer::Received(
                        delivered
                            .into_iter()
                            .map(|d| Got {
                                ticket: Ticket {
                                    message: d.message,
                                    handle: self.backend.handles().encode(&d.handle),
                                },
                                body: d.body,
                                receive_count: d.receive_count,
                            })
                            .collect(),
                    ),
                    Err(error) => failed(error),
                }
            }
            Request::Delete { ticket } => {
                let Ok(handle) = self.backend.handles().decode(&ticket.handle) else {
                    return refused("ReceiptHandleUndecodable");
                };
                let result = self
                    .command(Command::Delete {
                        queue: handle.queue.clone(),
                        handle,
                    })
                    .await;
                deleted(result)
            }
            Request::DeadLetterNow { ticket } => {
                let Ok(handle) = self.backend.handles().decode(&ticket.handle) else {
                    return refused("ReceiptHandleUndecodable");
                };
                match self
                    .command(Command::DeadLetterNow {
                        queue: handle.queue.clone(),
                        handle,
                    })
                    .await
                {
                    Ok(Outcome::DeadLettered { .. }) => Answer::Done,
                    Ok(other) => unexpected(&other),
                    Err(answer) => answer,
                }
            }
            Request::StartMoveTask => {
                // What the SQS endpoint's StartMessageMoveTask calls, without a destination:
                // each message back to its source.
                match self
                    .backend
                    .start_move_task(dead_letter_queue(), None, None, None)
                    .await
                {
                    Ok(_) => Answer::Done,
                    Err(RedriveError::Engine(error)) => failed(error),
                    Err(other) => {
                        let text = format!("{other:?}");
                        refused(
                            text.split(|c: char| !c.is_ascii_alphanumeric())
                                .next()
                                .unwrap_or("Refused"),
                        )
                    }
                }
            }
            Request::ChangeVisibility { ticket, timeout_s } => {
                let Ok(handle) = self.backend.handles().decode(&ticket.handle) else {
                    return refused("ReceiptHandleUndecodable");
                };
                match self
                    .command(Command::ChangeVisibility {
                        queue: handle.queue.clone(),
                        handle,
                        timeout_s,
                    })
                    .await
                {
                    Ok(Outcome::VisibilityChanged) => Answer::Done,
                    Ok(other) => unexpected(&other),
                    Err(answer) => answer,
                }
            }
            Request::RaceQueue { create } => {
                let name = QueueName::try_from(RACE_QUEUE.to_owned()).expect("a valid queue name");
                let command = if create {
                    Command::CreateQueue {
                        name,
                        attributes: QueueAttributes::default(),
                        tags: BTreeMap::new(),
                    }
                } else {
                    Command::DeleteQueue { name }
                };
                match self.command(command).await {
                    Ok(Outcome::QueueCreated { .. } | Outcome::Done) => Answer::Done,
                    Ok(other) => unexpected(&other),
                    Err(answer) => answer,
                }
            }
            Request::Purge => match self.command(Command::PurgeQueue { name: queue() }).await {
                Ok(Outcome::Done) => Answer::Done,
                Ok(other) => unexpected(&other),
                Err(answer) => answer,
            },
            Request::Count => {
                // Each queue's incarnation and watermark as this member knows them (a settled
                // read when its view is not fresh); no queue is no message. The run's queue and
                // its dead-letter queue together: a drained run leaves both empty.
                let (mut ready, mut in_flight) = (0, 0);
                for name in [queue(), dead_letter_queue()] {
                    let state = match self.cluster.queue(&name).await {
                        Ok(state) => state,
                        Err(_) => return unavailable("count"),
                    };
                    let now = self.clock.now();
                    let (r, f, d) = state.map_or((0, 0, 0), |state| {
                        self.cluster.store().view(|view| {
                            view.counts(&name, state.incarnation, state.purge_watermark, now)
                        })
                    });
                    ready += r;
                    in_flight += f + d;
                }
                Answer::Counts { ready, in_flight }
            }
            Request::Records => Answer::Records(
                self.cluster
                    .store()
                    .records()
                    .map(|records| {
                        records
                            .iter()
                            .map(|(key, record)| Held::of(key, record))
                            .collect()
                    })
                    .map_err(|error| error.to_string()),
            ),
        }
    }
}

/// The refusal code of the clock gate's answer (`trireme_node::cluster::edge::NOT_COORDINATING`,
/// spec/replication.md#clock-monitoring): the member coordinated nothing of the call, which did
/// nothing, so the history records a refusal.
pub const NOT_COORDINATING: &str = "NotCoordinating";

/// Whether an unavailable answer's reason is the clock gate's refusal, which did nothing.
#[must_use]
pub fn not_coordinating(reason: &str) -> bool {
    reason.contains(trireme_node::cluster::edge::NOT_COORDINATING)
}

/// The front's answer to the edge's error: a core refusal changed nothing, nor did the clock
/// gate's refusal; every other error (no quorum, overloaded replicas) may have taken effect.
fn failed(error: EngineError) -> Answer {
    match error {
        EngineError::Unavailable { reason } if not_coordinating(&reason) => {
            refused(NOT_COORDINATING)
        }
        EngineError::Rejected(reject) => {
            // The refusal's variant name: one word on the line.
            let text = format!("{reject:?}");
            let code = text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .next()
                .unwrap_or("Rejected");
            refused(code)
        }
        other => unavailable(&other.to_string().replace(char::is_whitespace, "_")),
    }
}

/// The answer to a send.
fn sent(result: Result<Outcome, Answer>) -> Answer {
    match result {
        Ok(Outcome::Sent { id, .. }) => Answer::Sent {
            message_id: format!("{:032x}", id.0),
        },
        Ok(other) => unexpected(&other),
        Err(answer) => answer,
    }
}

/// The answer to a delete: a repeated delete of a gone message succeeds
/// (spec/queue-core.md#delete).
fn deleted(result: Result<Outcome, Answer>) -> Answer {
    match result {
        Ok(Outcome::Deleted { .. }) => Answer::Done,
        Ok(other) => unexpected(&other),
        Err(answer) => answer,
    }
}

/// An outcome the command never answers: a broken edge, recorded as unknown.
fn unexpected(outcome: &Outcome) -> Answer {
    unavailable(&format!("unexpected_{outcome:?}").replace(char::is_whitespace, "_"))
}

fn refused(code: &str) -> Answer {
    Answer::Refused {
        code: code.to_owned(),
    }
}

fn unavailable(reason: &str) -> Answer {
    Answer::Unavailable {
        reason: reason.to_owned(),
    }
}

/// The run's queue name.
#[must_use]
pub fn queue() -> QueueName {
    QueueName::try_from(QUEUE.to_owned()).expect("a valid queue name")
}

/// The run's dead-letter queue's name.
#[must_use]
pub fn dead_letter_queue() -> QueueName {
    QueueName::try_from(DEAD_LETTER_QUEUE.to_owned()).expect("a valid queue name")
}

/// Serves `front` on `listener` until the host goes down: each connection one request.
pub async fn serve(listener: TcpListener, front: Front) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let front = front.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(tcp);
            let mut line = String::new();
            if reader.read_line(&mut line).await.is_err() || line.len() > LINE_BYTES_MAX {
                return;
            }
            let answer = match decode_request(&line) {
                Some(request) => front.execute(request).await,
                None => refused("Malformed"),
            };
            let mut text = encode_answer(&answer);
            text.push('\n');
            let _ = reader.get_mut().write_all(text.as_bytes()).await;
            let _ = reader.get_mut().flush().await;
        });
    }
}

/// Why a call has no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The request never left: no connection within the connect timeout.
    NotSent(String),
    /// The request may have arrived: its answer did not by the deadline.
    NoAnswer(String),
}

/// Calls `host`'s front with `request`; `connect_timeout` bounds the connection, `deadline`
/// the request and its answer.
///
/// # Errors
/// `NotSent` when no connection was made; `NoAnswer` when the answer did not arrive in time,
/// the connection broke, or the answer does not decode.
pub async fn call(
    host: &str,
    request: &Request,
    connect_timeout: Duration,
    deadline: Duration,
) -> Result<Answer, Failure> {
    let tcp =
        match tokio::time::timeout(connect_timeout, TcpStream::connect((host, FRONT_PORT))).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(error)) => return Err(Failure::NotSent(error.kind().to_string())),
            Err(_) => return Err(Failure::NotSent("connect timeout".to_owned())),
        };
    let exchange = async move {
        let mut reader = BufReader::new(tcp);
        let mut text = encode_request(request);
        text.push('\n');
        reader.get_mut().write_all(text.as_bytes()).await?;
        reader.get_mut().flush().await?;
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        Ok::<String, std::io::Error>(line)
    };
    match tokio::time::timeout(deadline, exchange).await {
        Ok(Ok(line)) => decode_answer(&line)
            .ok_or_else(|| Failure::NoAnswer(format!("undecodable answer {line:?}"))),
        Ok(Err(error)) => Err(Failure::NoAnswer(error.kind().to_string())),
        Err(_) => Err(Failure::NoAnswer("deadline".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock gate's refusal did nothing (spec/replication.md#clock-monitoring): a refusal;
    /// every other unavailable answer may have taken effect.
    #[test]
    fn the_clock_gates_refusal_is_a_refusal() {
        let gate = EngineError::Unavailable {
            reason: format!(
                "node 2 {}: 700 ms from the cluster's clock",
                trireme_node::cluster::edge::NOT_COORDINATING
            ),
        };
        assert_eq!(failed(gate), refused(NOT_COORDINATING));
        let quorum = EngineError::Unavailable {
            reason: "too few replicas answered".to_owned(),
        };
        assert!(matches!(failed(quorum), Answer::Unavailable { .. }));
    }

    #[test]
    fn requests_and_answers_read_back_as_written() {
        let ticket = Ticket {
            message: MessageId(0xabc),
            handle: "AQID-_xyz".to_owned(),
        };
        for request in [
            Request::CreateQueue {
                dead_letter: false,
                max_receive_count: None,
            },
            Request::CreateQueue {
                dead_letter: false,
                max_receive_count: Some(2),
            },
            Request::CreateQueue {
                dead_letter: true,
                max_receive_count: None,
            },
            Request::DeadLetterNow {
                ticket: ticket.clone(),
            },
            Request::StartMoveTask,
            Request::Send {
                body: "c1-s2-00ff".to_owned(),
                delay_s: 3,
                dedup: None,
            },
            Request::Send {
                body: "c1-s3-00ff".to_owned(),
                delay_s: 0,
                dedup: Some("k7".to_owned()),
            },
            Request::Receive {
                dead_letter: true,
                max: 10,
                visibility_s: 5,
                wait_s: 2,
            },
            Request::Delete {
                ticket: ticket.clone(),
            },
            Request::ChangeVisibility {
                ticket: ticket.clone(),
                timeout_s: 0,
            },
            Request::SendBatch {
                entries: vec![("c0-s1-12".to_owned(), 0), ("c0-s2-34".to_owned(), 2)],
            },
            Request::DeleteBatch {
                tickets: vec![ticket.clone(), ticket.clone()],
            },
            Request::Purge,
            Request::RaceQueue { create: true },
            Request::Count,
            Request::Records,
        ] {
            assert_eq!(
                decode_request(&encode_request(&request)),
                Some(request.clone())
            );
        }
        for answer in [
            Answer::Sent {
                message_id: ticket.message_id(),
            },
            Answer::Received(vec![]),
            Answer::Received(vec![Got {
                ticket: ticket.clone(),
                body: "c0-s1-12".to_owned(),
                receive_count: 4,
            }]),
            Answer::Done,
            Answer::Refused {
                code: "Stale".to_owned(),
            },
            Answer::Unavailable {
                reason: "send".to_owned(),
            },
            Answer::Counts {
                ready: 1,
                in_flight: 2,
            },
            Answer::Records(Ok(vec![])),
            Answer::Records(Ok(vec![Held {
                queue: QUEUE.to_owned(),
                message_id: ticket.message_id(),
                hash: u64::MAX,
                summary: "g1-live-seq2-count3".to_owned(),
            }])),
            Answer::Records(Err("not_open".to_owned())),
            Answer::Batch(vec![
                Answer::Sent {
                    message_id: ticket.message_id(),
                },
                Answer::Done,
                Answer::Refused {
                    code: "Stale".to_owned(),
                },
                Answer::Unavailable {
                    reason: "a:b".to_owned(),
                },
            ]),
        ] {
            assert_eq!(decode_answer(&encode_answer(&answer)), Some(answer.clone()));
        }
    }
}
