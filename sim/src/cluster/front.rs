//! How simulated clients reach the cluster: each member serves a small line protocol on
//! [`FRONT_PORT`] that calls its `Cluster` coordinator directly (the public gRPC and SQS APIs
//! are not wired to the cluster yet). One connection carries one request line and one answer
//! line, so a call lost to a partition or a crash is just a connection that never answers.
//!
//! Receipt handles travel as [`Ticket`]s: the message id and the replicas' handle in text. The
//! front draws message ids from the member's seeded random source. This module must never
//! decide anything the coordinator decides: it translates, nothing more.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_node::clock::Clock;
use trireme_node::cluster::Cluster;
use trireme_replication::coordinator::{DeleteAnswer, Handle, SendAnswer, VisibilityAnswer};
use trireme_replication::record::{Birth, Body, Record};
use trireme_replication::{Claim, Generation, NodeId, RecordKey};
use turmoil::net::{TcpListener, TcpStream};

use crate::history::fnv1a;

/// The port every member serves the front on.
pub const FRONT_PORT: u16 = 7300;
/// The one queue of the run, in its first incarnation.
pub const QUEUE: &str = "sim-queue";
pub const INCARNATION: Incarnation = Incarnation::local(Millis(1));
/// The cap on a visibility change, counted from the receive (SQS: 12 hours).
const VISIBILITY_CAP_MS: u64 = 12 * 3_600_000;
/// Longest request or answer line; a longer one is a broken peer.
const LINE_BYTES_MAX: usize = 64 * 1024;

/// A receipt handle as the front hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub message: MessageId,
    pub handle: Handle,
}

impl Ticket {
    fn encode(&self) -> String {
        let claim = self.handle.claim;
        format!(
            "{:032x}.{}.{}.{}.{}",
            self.message.0, self.handle.generation.0, claim.seq, claim.coordinator.0, claim.nonce
        )
    }

    fn decode(text: &str) -> Option<Ticket> {
        let mut parts = text.split('.');
        let message = MessageId(u128::from_str_radix(parts.next()?, 16).ok()?);
        let generation = Generation(parts.next()?.parse().ok()?);
        let seq = parts.next()?.parse().ok()?;
        let coordinator = NodeId(parts.next()?.parse().ok()?);
        let nonce = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some(Ticket {
            message,
            handle: Handle {
                generation,
                claim: Claim {
                    seq,
                    coordinator,
                    nonce,
                },
            },
        })
    }

    /// The message id as the history names it.
    #[must_use]
    pub fn message_id(&self) -> String {
        format!("{:032x}", self.message.0)
    }
}

/// A call to the front.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Send {
        body: String,
        delay_s: u32,
    },
    Receive {
        max: u32,
        visibility_s: u32,
    },
    Delete {
        ticket: Ticket,
    },
    ChangeVisibility {
        ticket: Ticket,
        timeout_s: u32,
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
    /// A delete or a visibility change took effect.
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
}

fn encode_request(request: &Request) -> String {
    match request {
        Request::Send { body, delay_s } => format!("send {delay_s} {body}"),
        Request::Receive { max, visibility_s } => format!("receive {max} {visibility_s}"),
        Request::Delete { ticket } => format!("delete {}", ticket.encode()),
        Request::ChangeVisibility { ticket, timeout_s } => {
            format!("visibility {} {timeout_s}", ticket.encode())
        }
        Request::Count => "count".to_owned(),
        Request::Records => "records".to_owned(),
    }
}

fn decode_request(line: &str) -> Option<Request> {
    let words: Vec<&str> = line.split_whitespace().collect();
    Some(match words.as_slice() {
        ["send", delay_s, body] => Request::Send {
            body: (*body).to_owned(),
            delay_s: delay_s.parse().ok()?,
        },
        ["receive", max, visibility_s] => Request::Receive {
            max: max.parse().ok()?,
            visibility_s: visibility_s.parse().ok()?,
        },
        ["delete", ticket] => Request::Delete {
            ticket: Ticket::decode(ticket)?,
        },
        ["visibility", ticket, timeout_s] => Request::ChangeVisibility {
            ticket: Ticket::decode(ticket)?,
            timeout_s: timeout_s.parse().ok()?,
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
                    " {},{:016x},{}",
                    held.message_id, held.hash, held.summary
                ));
            }
            line
        }
        Answer::Records(Err(error)) => format!("unreadable {}", error.replace(' ', "_")),
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
                let mut parts = item.splitn(3, ',');
                Some(Held {
                    message_id: parts.next()?.to_owned(),
                    hash: u64::from_str_radix(parts.next()?, 16).ok()?,
                    summary: parts.next()?.to_owned(),
                })
            })
            .collect::<Option<Vec<Held>>>()?)),
        ["unreadable", error] => Answer::Records(Err((*error).to_owned())),
        _ => return None,
    })
}

/// A member's front: its coordinator, the member's clock and the source of its message ids.
#[derive(Clone)]
pub struct Front {
    pub cluster: Cluster,
    /// The member's own clock: a send's time is its coordinator's.
    pub clock: Arc<dyn Clock>,
    /// Seeded per boot, so two boots never draw the same ids.
    pub ids: Arc<Mutex<ChaCha8Rng>>,
}

impl Front {
    /// The front of `cluster` on `clock`, drawing ids from `seed`.
    #[must_use]
    pub fn new(cluster: Cluster, clock: Arc<dyn Clock>, seed: u64) -> Front {
        Front {
            cluster,
            clock,
            ids: Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(seed))),
        }
    }

    fn key(message: MessageId) -> RecordKey {
        RecordKey {
            queue: queue(),
            incarnation: INCARNATION,
            message,
        }
    }

    async fn execute(&self, request: Request) -> Answer {
        let now = self.clock.now();
        match request {
            Request::Send { body, delay_s } => {
                let id = MessageId(self.ids.lock().expect("never poisoned").random());
                let birth = Birth {
                    payload: body.into_bytes(),
                    sent_at: now,
                    visible_from: if delay_s == 0 {
                        Millis(0)
                    } else {
                        now.plus_ms(u64::from(delay_s) * 1_000)
                    },
                    source_queue: None,
                    dedup_id: None,
                };
                match self.cluster.send(&queue(), INCARNATION, id, birth).await {
                    SendAnswer::Sent => Answer::Sent {
                        message_id: format!("{:032x}", id.0),
                    },
                    SendAnswer::Unavailable => Answer::Unavailable {
                        reason: "send".to_owned(),
                    },
                }
            }
            Request::Receive { max, visibility_s } => {
                let delivered = self
                    .cluster
                    .receive(
                        &queue(),
                        INCARNATION,
                        usize::try_from(max).expect("a small max"),
                        u64::from(visibility_s) * 1_000,
                        u64::from(trireme_core::limits::retention_s_default) * 1_000,
                        None,
                    )
                    .await;
                Answer::Received(
                    delivered
                        .into_iter()
                        .map(|d| {
                            let live = d.record.live().expect("a delivery is live");
                            Got {
                                ticket: Ticket {
                                    message: d.key.message,
                                    handle: d.handle,
                                },
                                body: String::from_utf8_lossy(&live.birth.payload).into_owned(),
                                receive_count: live.receive_count,
                            }
                        })
                        .collect(),
                )
            }
            Request::Delete { ticket } => {
                let key = Front::key(ticket.message);
                match self.cluster.delete(&key, ticket.handle).await {
                    // A repeated delete of a gone message succeeds (spec/queue-core.md#delete).
                    DeleteAnswer::Deleted | DeleteAnswer::AlreadyGone => Answer::Done,
                    DeleteAnswer::Moved => refused("Moved"),
                    DeleteAnswer::Stale => refused("Stale"),
                    DeleteAnswer::NotFound => refused("NotFound"),
                    DeleteAnswer::Unavailable => unavailable("delete"),
                    DeleteAnswer::Diverged(_) => unavailable("diverged"),
                }
            }
            Request::ChangeVisibility { ticket, timeout_s } => {
                let key = Front::key(ticket.message);
                let timeout_ms = u64::from(timeout_s) * 1_000;
                match self
                    .cluster
                    .change_visibility(&key, ticket.handle, timeout_ms, VISIBILITY_CAP_MS)
                    .await
                {
                    VisibilityAnswer::Changed => Answer::Done,
                    VisibilityAnswer::Stale => refused("Stale"),
                    VisibilityAnswer::NotInFlight => refused("NotInFlight"),
                    VisibilityAnswer::ExceedsCap => refused("ExceedsCap"),
                    VisibilityAnswer::Unavailable => unavailable("visibility"),
                    VisibilityAnswer::Diverged(_) => unavailable("diverged"),
                }
            }
            Request::Count => {
                let (ready, live) = self.cluster.store().view(|view| {
                    (
                        view.candidates(&queue(), INCARNATION, None, now, usize::MAX)
                            .len(),
                        view.live(&queue(), INCARNATION),
                    )
                });
                let ready = u64::try_from(ready).expect("fits");
                let live = u64::try_from(live).expect("fits");
                Answer::Counts {
                    ready,
                    in_flight: live - ready,
                }
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

    #[test]
    fn requests_and_answers_read_back_as_written() {
        let ticket = Ticket {
            message: MessageId(0xabc),
            handle: Handle {
                generation: Generation(2),
                claim: Claim {
                    seq: 3,
                    coordinator: NodeId(1),
                    nonce: u64::MAX,
                },
            },
        };
        for request in [
            Request::Send {
                body: "c1-s2-00ff".to_owned(),
                delay_s: 3,
            },
            Request::Receive {
                max: 10,
                visibility_s: 5,
            },
            Request::Delete { ticket },
            Request::ChangeVisibility {
                ticket,
                timeout_s: 0,
            },
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
                ticket,
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
                message_id: ticket.message_id(),
                hash: u64::MAX,
                summary: "g1-live-seq2-count3".to_owned(),
            }])),
            Answer::Records(Err("not_open".to_owned())),
        ] {
            assert_eq!(decode_answer(&encode_answer(&answer)), Some(answer.clone()));
        }
    }
}
