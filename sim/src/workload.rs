//! What a client host does: a mix of sends (some delayed), long-poll receives with visibility
//! timeouts, deletes, visibility changes, messages left to time out and be delivered again, and
//! late deletes with handles that may have been superseded; then, once the harness has healed
//! everything, a drain that receives and deletes until the queue stays empty.
//!
//! Every call goes into the [`History`] before it is sent and again when it returns. A call
//! without a definite answer (its deadline passed, its connection died) is recorded as
//! [`Outcome::Unknown`], never guessed. Randomness comes from the run's seed only.
//!
//! This module must never retry a call under the same history entry: each attempt is its own op.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tonic::transport::Channel;
use tonic::{Code, Status};
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;

use crate::clock::sim_now_ms;
use crate::history::{Call, Delivery, History, OpId, Outcome, fnv1a};
use crate::net;

/// The host name of the node.
pub const NODE_HOST: &str = "node";
/// The one queue every client uses.
pub const QUEUE: &str = "sim-queue";
/// The queue's visibility timeout, used by receives that give none.
pub const QUEUE_VISIBILITY_S: u32 = 5;
/// Longest visibility a client asks for in the safety phase (receive override or change).
pub const VISIBILITY_S_MAX: u32 = 6;
/// Longest send delay a client asks for.
pub const DELAY_S_MAX: u32 = 3;
/// Entries in one batch call (SQS allows 10).
const BATCH_ENTRIES_MAX: u32 = 5;
/// Longest long poll a client asks for in the safety phase.
const WAIT_S_MAX: u32 = 3;
/// The visibility the drain asks for: long enough that a drained message is deleted before it
/// could be delivered again.
const DRAIN_VISIBILITY_S: u32 = 10;
/// The drain's long poll.
const DRAIN_WAIT_S: u32 = 2;
/// A client's deadline beyond the long poll, for every call.
const CALL_SLACK: Duration = Duration::from_millis(2_000);
/// Attempts at reading the queue's counts after the drain; none answering is reported by the
/// checker (`DrainUnconfirmed`).
const STATS_ATTEMPTS_MAX: u32 = 50;
/// Pause after a failed call before the next one.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Longest pause between two calls of one client.
const THINK_MS_MAX: u64 = 300;

/// The phases of a run, in simulated ms since its start.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    /// Faults happen before this time; clients run the random mix until then.
    pub safety_end_ms: u64,
    /// The drain ends after this long without a delivery. It must exceed every visibility
    /// timeout and delay a message can still be under when the drain starts.
    pub drain_quiet_ms: u64,
}

const _: () = assert!(DRAIN_WAIT_S < DRAIN_VISIBILITY_S);

/// The body of the `seq`-th send of `client`: a tag that makes it unique and a payload derived
/// from the tag, so the checker can tell an intact body from a damaged one.
#[must_use]
pub fn body(client: u32, seq: u64) -> String {
    let tag = format!("c{client}-s{seq}");
    let sum = fnv1a(tag.as_bytes());
    let repeat = 1 + usize::try_from(sum % 8).expect("below 8");
    format!("{tag}-{}", format!("{sum:016x}").repeat(repeat))
}

/// Whether `text` is exactly a body [`body`] makes.
#[must_use]
pub fn body_is_intact(text: &str) -> bool {
    let mut parts = text.splitn(3, '-');
    let (Some(client), Some(seq)) = (parts.next(), parts.next()) else {
        return false;
    };
    let client = client.strip_prefix('c').and_then(|c| c.parse::<u32>().ok());
    let seq = seq.strip_prefix('s').and_then(|s| s.parse::<u64>().ok());
    match (client, seq) {
        (Some(client), Some(seq)) => body(client, seq) == text,
        _ => false,
    }
}

/// One client host's setup.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub client: u32,
    pub seed: u64,
    pub phases: Phases,
    pub history: Rc<RefCell<History>>,
}

/// A message this client received and has not settled yet.
#[derive(Clone, Debug)]
struct Held {
    message_id: String,
    receive_count: u32,
    handle: String,
}

/// A handle kept on purpose past its visibility timeout, to be used for a late delete.
#[derive(Clone, Debug)]
struct Stale {
    held: Held,
    due_ms: u64,
}

struct Client {
    id: u32,
    api: QueueServiceClient<Channel>,
    rng: ChaCha8Rng,
    history: Rc<RefCell<History>>,
    phases: Phases,
    next_seq: u64,
    held: Vec<Held>,
    stale: Vec<Stale>,
}

/// Runs one client: the random mix until the safety phase ends, then the drain.
///
/// # Errors
/// Never: every failure of a call is recorded in the history instead. The signature is
/// turmoil's.
pub async fn run_client(setup: ClientSetup) -> turmoil::Result {
    let mut client = Client {
        id: setup.client,
        api: QueueServiceClient::new(net::channel(NODE_HOST, net::GRPC_PORT)),
        rng: ChaCha8Rng::seed_from_u64(setup.seed ^ (u64::from(setup.client) << 40) ^ 0x00c1_1e47),
        history: setup.history,
        phases: setup.phases,
        next_seq: 1,
        held: Vec::new(),
        stale: Vec::new(),
    };
    client.ensure_queue(setup.phases.safety_end_ms).await;
    while sim_now_ms() < client.phases.safety_end_ms {
        client.step().await;
    }
    client.drain().await;
    Ok(())
}

/// Whether a refusal is definite: the node looked at the call and changed nothing.
fn outcome_of_failure(status: &Status) -> Outcome {
    match status.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::ResourceExhausted
        | Code::OutOfRange
        | Code::PermissionDenied
        | Code::Unauthenticated => Outcome::Refused {
            code: format!("{:?}", status.code()),
        },
        // Unavailable, Cancelled, Internal, Unknown, DeadlineExceeded: the call may have been
        // applied before its answer was lost.
        code => Outcome::Unknown {
            reason: format!("{code:?}: {}", status.message()),
        },
    }
}

/// The outcome of a batch entry the node did not report as successful.
fn batch_entry_outcome(failed: Option<&pb::BatchEntryError>) -> Outcome {
    match failed {
        // An entry the answer does not mention: nothing is known about it.
        None => Outcome::Unknown {
            reason: "entry missing from the batch answer".to_owned(),
        },
        // The node could not apply it (shutting down, storage failure): it may or may not
        // have been applied before the failure.
        Some(entry) if entry.code == "ServiceUnavailable" || entry.code == "InternalError" => {
            Outcome::Unknown {
                reason: entry.code.clone(),
            }
        }
        Some(entry) => Outcome::Refused {
            code: entry.code.clone(),
        },
    }
}

impl Client {
    fn invoke(&self, call: Call) -> OpId {
        self.history
            .borrow_mut()
            .invoke(self.id, call, sim_now_ms())
    }

    fn complete(&self, op: OpId, outcome: Outcome) {
        self.history
            .borrow_mut()
            .complete(op, outcome, sim_now_ms());
    }

    /// Awaits `call` under `deadline`; `Err` carries the outcome to record for a failure.
    async fn answer<T>(
        call: impl Future<Output = Result<tonic::Response<T>, Status>>,
        deadline: Duration,
    ) -> Result<T, Outcome> {
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(outcome_of_failure(&status)),
            Err(_) => Err(Outcome::Unknown {
                reason: "client deadline".to_owned(),
            }),
        }
    }

    async fn pause(&mut self, max_ms: u64) {
        let ms = self.rng.random_range(0..=max_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Creates the queue (idempotent), retrying until it exists or `until_ms` passes.
    async fn ensure_queue(&mut self, until_ms: u64) -> bool {
        loop {
            let op = self.invoke(Call::CreateQueue);
            let request = pb::CreateQueueRequest {
                name: QUEUE.to_owned(),
                attributes: Some(pb::QueueAttributes {
                    visibility_timeout_seconds: Some(QUEUE_VISIBILITY_S),
                    ..pb::QueueAttributes::default()
                }),
                tags: Default::default(),
            };
            let result = Self::answer(self.api.create_queue(request), CALL_SLACK).await;
            let created = result.is_ok();
            self.complete(op, result.map_or_else(|outcome| outcome, |_| Outcome::Ok));
            if created {
                return true;
            }
            if sim_now_ms() >= until_ms {
                return false;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// One step of the safety phase.
    async fn step(&mut self) {
        self.pause(THINK_MS_MAX).await;
        let now = sim_now_ms();
        if self.stale.first().is_some_and(|stale| stale.due_ms <= now) {
            let stale = self.stale.remove(0);
            self.delete(&stale.held).await;
        } else if !self.held.is_empty() && self.rng.random_bool(0.5) {
            let held = self.held.remove(0);
            self.settle(held).await;
        } else if self.rng.random_bool(0.45) {
            if self.rng.random_bool(0.2) {
                let count = self.rng.random_range(2..=BATCH_ENTRIES_MAX);
                self.send_batch(count).await;
            } else {
                self.send().await;
            }
        } else {
            let max = self.rng.random_range(1..=10);
            let wait_s = if self.rng.random_bool(0.3) {
                0
            } else {
                self.rng.random_range(1..=WAIT_S_MAX)
            };
            let visibility_s = self
                .rng
                .random_bool(0.7)
                .then(|| self.rng.random_range(1..=VISIBILITY_S_MAX));
            if let Some(got) = self.receive(max, wait_s, visibility_s).await {
                self.held.extend(got);
            }
        }
    }

    /// Does something with a held message: delete it (alone, or in a batch with the next held
    /// ones), change its visibility, abandon it (it comes back after its timeout), or keep its
    /// handle for a late delete.
    async fn settle(&mut self, held: Held) {
        let roll: f64 = self.rng.random();
        if roll < 0.10 && !self.held.is_empty() {
            let more = self.held.len().min(BATCH_ENTRIES_MAX as usize - 1);
            let mut batch: Vec<Held> = self.held.drain(..more).collect();
            batch.insert(0, held);
            self.delete_batch(&batch).await;
        } else if roll < 0.55 {
            self.delete(&held).await;
        } else if roll < 0.70 {
            let timeout_s = self.rng.random_range(0..=VISIBILITY_S_MAX);
            let changed = self.change_visibility(&held, timeout_s).await;
            if changed && timeout_s > 0 {
                self.held.push(held);
            }
        } else if roll < 0.90 {
            // Abandoned: the message becomes visible again when its timeout expires.
        } else {
            let due_ms = sim_now_ms() + self.rng.random_range(7_000..=12_000);
            self.stale.push(Stale { held, due_ms });
        }
    }

    async fn send(&mut self) {
        let body = body(self.id, self.next_seq);
        self.next_seq += 1;
        let delay_s = self
            .rng
            .random_bool(0.2)
            .then(|| self.rng.random_range(1..=DELAY_S_MAX));
        let op = self.invoke(Call::Send {
            body: body.clone(),
            delay_s,
            dedup_id: None,
        });
        let request = pb::SendMessageRequest {
            queue: QUEUE.to_owned(),
            body,
            attributes: Default::default(),
            delay_seconds: delay_s,
            deduplication_id: None,
        };
        let outcome = match Self::answer(self.api.send_message(request), CALL_SLACK).await {
            Ok(sent) => Outcome::Sent {
                message_id: sent.message_id,
            },
            Err(outcome) => outcome,
        };
        self.complete(op, outcome);
    }

    /// One `SendMessageBatch` of `count` new bodies; each entry is its own op in the history.
    async fn send_batch(&mut self, count: u32) {
        let mut entries = Vec::new();
        let mut ops = Vec::new();
        for index in 0..count {
            let body = body(self.id, self.next_seq);
            self.next_seq += 1;
            ops.push(self.invoke(Call::Send {
                body: body.clone(),
                delay_s: None,
                dedup_id: None,
            }));
            entries.push(pb::SendMessageBatchEntry {
                id: format!("e{index}"),
                body,
                attributes: Default::default(),
                delay_seconds: None,
                deduplication_id: None,
            });
        }
        let request = pb::SendMessageBatchRequest {
            queue: QUEUE.to_owned(),
            entries,
        };
        let answer = Self::answer(self.api.send_message_batch(request), CALL_SLACK).await;
        for (index, op) in ops.into_iter().enumerate() {
            let id = format!("e{index}");
            let outcome = match &answer {
                Err(outcome) => outcome.clone(),
                Ok(response) => {
                    if let Some(sent) = response.successful.iter().find(|r| r.id == id) {
                        Outcome::Sent {
                            message_id: sent.message_id.clone(),
                        }
                    } else {
                        batch_entry_outcome(response.failed.iter().find(|f| f.id == id))
                    }
                }
            };
            self.complete(op, outcome);
        }
    }

    /// One `DeleteMessageBatch` of `batch`'s handles; each entry is its own op in the history.
    async fn delete_batch(&mut self, batch: &[Held]) {
        let ops: Vec<OpId> = batch
            .iter()
            .map(|held| {
                self.invoke(Call::Delete {
                    message_id: held.message_id.clone(),
                    generation: 0,
                    receive_count: held.receive_count,
                })
            })
            .collect();
        let request = pb::DeleteMessageBatchRequest {
            queue: QUEUE.to_owned(),
            entries: batch
                .iter()
                .enumerate()
                .map(|(index, held)| pb::DeleteMessageBatchEntry {
                    id: format!("e{index}"),
                    receipt_handle: held.handle.clone(),
                })
                .collect(),
        };
        let answer = Self::answer(self.api.delete_message_batch(request), CALL_SLACK).await;
        for (index, op) in ops.into_iter().enumerate() {
            let id = format!("e{index}");
            let outcome = match &answer {
                Err(outcome) => outcome.clone(),
                Ok(response) if response.successful.contains(&id) => Outcome::Ok,
                Ok(response) => batch_entry_outcome(response.failed.iter().find(|f| f.id == id)),
            };
            self.complete(op, outcome);
        }
    }

    /// A receive; `None` when it failed (recorded as refused or unknown).
    async fn receive(
        &mut self,
        max: u32,
        wait_s: u32,
        visibility_s: Option<u32>,
    ) -> Option<Vec<Held>> {
        let op = self.invoke(Call::Receive {
            dead_letter: false,
            max,
            wait_s,
            visibility_s: visibility_s.unwrap_or(QUEUE_VISIBILITY_S),
        });
        let request = pb::ReceiveMessagesRequest {
            queue: QUEUE.to_owned(),
            max_messages: max,
            visibility_timeout_seconds: visibility_s,
            wait_seconds: Some(wait_s),
        };
        let deadline = Duration::from_secs(u64::from(wait_s)) + CALL_SLACK;
        match Self::answer(self.api.receive_messages(request), deadline).await {
            Ok(response) => {
                let deliveries = response
                    .messages
                    .iter()
                    .map(|m| Delivery {
                        message_id: m.message_id.clone(),
                        body: m.body.clone(),
                        receive_count: m.receive_count,
                        // One node: no moves between lives (the run has no dead-letter queue).
                        generation: 0,
                    })
                    .collect();
                self.complete(op, Outcome::Received(deliveries));
                Some(
                    response
                        .messages
                        .into_iter()
                        .map(|m| Held {
                            message_id: m.message_id,
                            receive_count: m.receive_count,
                            handle: m.receipt_handle,
                        })
                        .collect(),
                )
            }
            Err(outcome) => {
                self.complete(op, outcome);
                None
            }
        }
    }

    /// Deletes with `held`'s handle; true when the node acknowledged it.
    async fn delete(&mut self, held: &Held) -> bool {
        let op = self.invoke(Call::Delete {
            message_id: held.message_id.clone(),
            generation: 0,
            receive_count: held.receive_count,
        });
        let request = pb::DeleteMessageRequest {
            queue: QUEUE.to_owned(),
            receipt_handle: held.handle.clone(),
        };
        let result = Self::answer(self.api.delete_message(request), CALL_SLACK).await;
        let deleted = result.is_ok();
        self.complete(op, result.map_or_else(|outcome| outcome, |_| Outcome::Ok));
        deleted
    }

    /// Changes the visibility of `held`'s message; true when the node acknowledged it.
    async fn change_visibility(&mut self, held: &Held, timeout_s: u32) -> bool {
        let op = self.invoke(Call::ChangeVisibility {
            message_id: held.message_id.clone(),
            generation: 0,
            receive_count: held.receive_count,
            timeout_s,
        });
        let request = pb::ChangeVisibilityRequest {
            queue: QUEUE.to_owned(),
            receipt_handle: held.handle.clone(),
            visibility_timeout_seconds: timeout_s,
        };
        let result = Self::answer(self.api.change_visibility(request), CALL_SLACK).await;
        let changed = result.is_ok();
        self.complete(op, result.map_or_else(|outcome| outcome, |_| Outcome::Ok));
        changed
    }

    /// The healing phase: receive and delete until nothing was delivered for
    /// `drain_quiet_ms`, then read the queue's counts.
    async fn drain(&mut self) {
        // What this client still holds comes back after its timeout and is drained then.
        self.held.clear();
        self.stale.clear();
        let start_ms = sim_now_ms();
        self.ensure_queue(start_ms + self.phases.drain_quiet_ms)
            .await;
        let mut last_delivery_ms = sim_now_ms();
        loop {
            match self
                .receive(10, DRAIN_WAIT_S, Some(DRAIN_VISIBILITY_S))
                .await
            {
                Some(got) if !got.is_empty() => {
                    for held in got {
                        self.delete(&held).await;
                    }
                    last_delivery_ms = sim_now_ms();
                }
                Some(_) => {}
                None => tokio::time::sleep(RETRY_PAUSE).await,
            }
            if sim_now_ms() >= last_delivery_ms + self.phases.drain_quiet_ms {
                break;
            }
        }
        for _ in 0..STATS_ATTEMPTS_MAX {
            let op = self.invoke(Call::Stats);
            let request = pb::GetQueueRequest {
                name: QUEUE.to_owned(),
            };
            match Self::answer(self.api.get_queue(request), CALL_SLACK).await {
                Ok(response) => {
                    let stats = response
                        .queue
                        .and_then(|queue| queue.stats)
                        .unwrap_or_default();
                    self.complete(
                        op,
                        Outcome::Stats {
                            ready: stats.ready,
                            in_flight: stats.in_flight,
                            delayed: stats.delayed,
                        },
                    );
                    return;
                }
                Err(outcome) => {
                    let definite = matches!(outcome, Outcome::Refused { .. });
                    self.complete(op, outcome);
                    if definite {
                        return;
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}
