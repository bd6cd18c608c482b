//! What a client host of the cluster does: creates the queue, sends (some in batches, some
//! with deduplication ids), receives with visibility timeouts (some long polls), deletes (some
//! in batches), visibility changes, messages abandoned to time out and be delivered again, late
//! deletes with handles that may have been superseded, a purge in some runs, and now and then a
//! crash of the client's process that forgets everything it holds; each call through a member
//! drawn at random, by its SQS endpoint or its front. Then,
//! once the harness has healed everything, a drain that receives and deletes until nothing
//! comes for a while, and a count of what every member's view still holds.
//!
//! Every call goes into the [`History`] before it is sent and again when it returns; a call
//! without a definite answer is [`Outcome::Unknown`], never guessed. Randomness comes from the
//! run's seed only. This module must never retry a call under the same history entry.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use trireme_core::{MessageId, QueueName};
use trireme_replication::NodeId;
use trireme_replication::placement::{Placement, Ring};

use super::front::{self, Answer, Failure, Got, Held as Stored, Request, Ticket};
use super::sqs;
use crate::clock::sim_now_ms;
use crate::history::{Call, Delivery, History, OpId, Outcome};
use crate::workload::body;

/// The run's queue's visibility timeout, which some receives ask for by name.
pub const QUEUE_VISIBILITY_S: u32 = 5;
/// Longest visibility a client asks for in the safety phase (receive or change).
pub const VISIBILITY_S_MAX: u32 = 6;
/// Longest send delay a client asks for.
pub const DELAY_S_MAX: u32 = 3;
/// Attempts at deleting one message the drain received (each an op of the history, each
/// through a member drawn anew), well inside `DRAIN_VISIBILITY_S`.
const DRAIN_DELETE_ATTEMPTS: u32 = 10;
/// The drain's visibility: a drained message is deleted long before it could come back.
const DRAIN_VISIBILITY_S: u32 = 10;
/// The share of the mix's receives that read the dead-letter queue, in the seeds with one.
const DEAD_LETTER_SHARE: f64 = 0.1;
/// The share of the mix's receives that are long polls, and their longest wait.
const LONG_POLL_SHARE: f64 = 0.3;
const WAIT_S_MAX: u32 = 3;
/// The share of sends, and of deletes of held messages, made as a batch, and a batch's most
/// entries.
const BATCH_SHARE: f64 = 0.25;
const BATCH_ENTRIES_MAX: usize = 5;
/// The share of single sends that carry a deduplication id, drawn from this many ids.
const DEDUP_SHARE: f64 = 0.15;
const DEDUP_IDS: u32 = 40;
/// The share of a client's calls that go to a member's SQS endpoint instead of its front.
const SQS_SHARE: f64 = 0.3;
/// How long a client waits for a connection to a member.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// A call's deadline: the coordinator's operation timeout with room for the network.
const CALL_DEADLINE: Duration = Duration::from_millis(4_000);
/// Pause after a failed call, and between empty drain receives.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How many times client 0 asks to start the move task: a start never sent, refused by a member
/// whose clock may not coordinate, or left without an answer is asked again through another
/// member, as a client would.
const MOVE_TASK_STARTS_MAX: u32 = 5;
/// The move task starts once a message is known to wait ready in the dead-letter queue, or,
/// failing that, this long before the safety phase ends.
const MOVE_TASK_LAST_MS: u64 = 2_000;
/// [`Focus::Waiters`](super::faults::Focus::Waiters): the member client 0 long-polls through,
/// each poll's wait, and how long a sender pauses before it looks whether it may send.
const WAITERS_MEMBER: u16 = 1;
const WAITERS_WAIT_S: u32 = 10;
/// The visibility client 0 asks for under [`Focus::Waiters`](super::faults::Focus::Waiters):
/// short, since the rule waits out every claim a poll may have left before it counts.
const WAITERS_VISIBILITY_S: u32 = 1;
const WAITERS_SEND_PAUSE_MS: std::ops::RangeInclusive<u64> = 200..=1_000;
/// Longest pause between two calls of one client.
const THINK_MS_MAX: u64 = 300;
/// Attempts at counting one member's view after the drain.
const COUNT_ATTEMPTS_MAX: u32 = 50;
/// How long the convergence check waits for every replica of every record to agree after the
/// drain (anti-entropy's period is a few seconds; a replacement disk may still be rebuilding).
const CONVERGENCE_WAIT_MS: u64 = 40_000;
/// Between two comparisons of every member's records.
const CONVERGENCE_PAUSE: Duration = Duration::from_millis(1_000);

/// The host name of member `node`.
#[must_use]
pub fn member_host(node: u16) -> String {
    format!("member{node}")
}

/// The phases of a run, in simulated ms since its start.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    /// Faults happen before this time; clients run the random mix until then.
    pub safety_end_ms: u64,
    /// The drain ends after this long without a delivery; it exceeds every visibility timeout
    /// and delay a message can still be under when the drain starts.
    pub drain_quiet_ms: u64,
}

/// What the convergence check found: how many records every replica held alike, or the
/// differences it saw last.
pub type Convergence = Result<usize, Vec<String>>;

/// One client host's setup.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub client: u32,
    pub seed: u64,
    /// Members of the cluster (node ids 1..=members).
    pub members: u16,
    /// Clients of the run: client 0 checks convergence once all have drained.
    pub clients: u32,
    pub phases: Phases,
    pub history: Rc<RefCell<History>>,
    /// Clients whose drain has ended.
    pub drained: Rc<Cell<u32>>,
    /// Client 0's finding.
    pub convergence: Rc<RefCell<Option<Convergence>>>,
    /// How a focused profile bends the mix (none for the seed's random mix).
    pub shape: Shape,
}

/// How a focused profile (`faults::Focus`) bends the random mix toward its race. The default
/// is the mix itself, whose draws it leaves as they were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// [`Focus::StaleDeletes`](super::faults::Focus::StaleDeletes): late deletes go through
    /// this member, the one the plan keeps cutting from its peers, and a held message is more
    /// often kept for a late delete or abandoned than deleted (`Client::settle_stale_focus`),
    /// so that superseded handles meet a replica that missed the newer claim and their new
    /// holders leave them to time out.
    pub late_deletes_through: Option<u16>,
    /// [`Focus::Waiters`](super::faults::Focus::Waiters): client 0 only long-polls, through
    /// this member, and deletes what it gets; the other clients only send, one delayed message
    /// at a time, through the other members (`Client::step_waiters`).
    pub long_polls_through: Option<u16>,
    /// [`Focus::DeleteAtDeadline`](super::faults::Focus::DeleteAtDeadline): clients 0 and 1
    /// receive through member 1 and delete at their visibility's end through member 2 or 3,
    /// client 2 long-polls through member 1 and abandons, client 3 sends
    /// (`Client::step_deadline`).
    pub deletes_at_deadline: bool,
    /// [`Focus::StaleLeases`](super::faults::Focus::StaleLeases): clients receive through this
    /// member, the one the plan keeps cutting from its peers, and extend what they get through
    /// the others (`Client::step_stale_leases`).
    pub leases_through: Option<u16>,
}

impl Shape {
    /// The shape of a run under `focus` with `plan`.
    #[must_use]
    pub fn of(focus: Option<super::faults::Focus>, plan: &super::faults::Plan) -> Shape {
        match focus {
            Some(super::faults::Focus::StaleDeletes) => Shape {
                late_deletes_through: super::faults::focused_member(plan),
                ..Shape::default()
            },
            Some(super::faults::Focus::StaleLeases) => Shape {
                leases_through: super::faults::focused_member(plan),
                ..Shape::default()
            },
            Some(super::faults::Focus::DeleteAtDeadline) => Shape {
                deletes_at_deadline: true,
                ..Shape::default()
            },
            Some(super::faults::Focus::Waiters) => Shape {
                long_polls_through: Some(WAITERS_MEMBER),
                ..Shape::default()
            },
            None | Some(_) => Shape::default(),
        }
    }
}

#[derive(Clone, Debug)]
struct Held {
    ticket: Ticket,
    receive_count: u32,
    /// The life of the message the handle is of (from the handle, [`Ticket::generation`]).
    generation: u32,
    /// Received from the dead-letter queue.
    dead_letter: bool,
}

impl Held {
    fn of(got: Got, dead_letter: bool) -> Held {
        Held {
            generation: got.ticket.generation(),
            ticket: got.ticket,
            receive_count: got.receive_count,
            dead_letter,
        }
    }
}

struct Client {
    id: u32,
    members: u16,
    rng: ChaCha8Rng,
    history: Rc<RefCell<History>>,
    phases: Phases,
    next_seq: u64,
    held: Vec<Held>,
    /// Handles kept past their timeout for a late delete, with when to use them.
    stale: Vec<(Held, u64)>,
    /// When this client purges the run's queue, if it does (client 0 in half the seeds).
    purge_at_ms: Option<u64>,
    /// When this client races a create and a delete of the race queue (client 1).
    race_at_ms: Vec<u64>,
    /// The run's queue's `maxReceiveCount`, in the seeds whose queue has a dead-letter queue.
    max_receive_count: Option<u32>,
    /// When this client starts a move task from the dead-letter queue back to the run's queue
    /// (client 0, in the seeds with a dead-letter queue).
    move_task_at_ms: Option<u64>,
    shape: Shape,
}

/// Runs one client: the random mix until the safety phase ends, then the drain.
///
/// # Errors
/// Never: every failure of a call is recorded in the history. The signature is turmoil's.
pub async fn run_client(setup: ClientSetup) -> turmoil::Result {
    let mut client = Client {
        id: setup.client,
        members: setup.members,
        rng: ChaCha8Rng::seed_from_u64(setup.seed ^ (u64::from(setup.client) << 40) ^ 0x0c1a_57e2),
        history: setup.history,
        phases: setup.phases,
        next_seq: 1,
        held: Vec::new(),
        stale: Vec::new(),
        purge_at_ms: purge_at_ms(setup.seed, setup.client, setup.phases.safety_end_ms),
        race_at_ms: race_at_ms(setup.seed, setup.client, setup.phases.safety_end_ms),
        max_receive_count: max_receive_count(setup.seed),
        move_task_at_ms: move_task_at_ms(setup.seed, setup.client, setup.phases.safety_end_ms),
        shape: setup.shape,
    };
    client.create_queue().await;
    while sim_now_ms() < client.phases.safety_end_ms {
        client.step().await;
    }
    client.drain().await;
    setup.drained.set(setup.drained.get() + 1);
    if setup.client == 0 {
        // Every client's drain first: a delete still under way is no divergence.
        while setup.drained.get() < setup.clients {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        let found = client.converge().await;
        *setup.convergence.borrow_mut() = Some(found);
    }
    Ok(())
}

/// When client `client` purges the queue in a run of `seed`: client 0, in half the seeds, once,
/// a third to two thirds into the safety phase (drawn apart from the clients' own streams, so
/// the purge moves no other draw).
fn purge_at_ms(seed: u64, client: u32, safety_end_ms: u64) -> Option<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7075_7267_6521);
    (client == 0 && rng.random_bool(0.5))
        .then(|| rng.random_range(safety_end_ms / 3..safety_end_ms * 2 / 3))
}

/// The run's queue's `maxReceiveCount` in a run of `seed`: in half the seeds the queue has a
/// redrive policy to [`front::DEAD_LETTER_QUEUE`] with a maximum of 1 to 3 (drawn apart from the
/// clients' own streams, so a seed without one keeps its draws).
#[must_use]
pub fn max_receive_count(seed: u64) -> Option<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0064_6c71_5f6d_6178);
    rng.random_bool(0.5).then(|| rng.random_range(1..=3))
}

/// When client `client` starts the move task in a run of `seed`: client 0, in the seeds with a
/// dead-letter queue, once, 40% to 80% into the safety phase.
fn move_task_at_ms(seed: u64, client: u32, safety_end_ms: u64) -> Option<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d6f_7665);
    (client == 0 && max_receive_count(seed).is_some())
        .then(|| rng.random_range(safety_end_ms * 2 / 5..safety_end_ms * 4 / 5))
}

/// When client `client` races creates and deletes of the race queue: client 1, four times in
/// the safety phase (drawn apart from the clients' own streams).
fn race_at_ms(seed: u64, client: u32, safety_end_ms: u64) -> Vec<u64> {
    if client != 1 {
        return Vec::new();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7261_6365);
    let mut at: Vec<u64> = (0..4)
        .map(|_| rng.random_range(1_000..safety_end_ms.max(1_001)))
        .collect();
    at.sort_unstable();
    at
}

/// Compares every member's records: each record on each of its replicas (by the ring of
/// `members`) identical, and on no other member. `Ok` with the records compared, or the
/// differences.
fn compare(members: u16, snapshots: &BTreeMap<u16, Vec<Stored>>) -> Convergence {
    let ring = Ring::new((1..=members).map(NodeId)).expect("three or five members");
    // A record is a queue's and a message's: a dead-letter copy lives on the replicas of the
    // dead-letter queue and the id (spec/replication.md, *Placement*).
    let by_member: BTreeMap<u16, BTreeMap<(&str, &str), &Stored>> = snapshots
        .iter()
        .map(|(node, held)| {
            let map = held
                .iter()
                .map(|h| ((h.queue.as_str(), h.message_id.as_str()), h))
                .collect();
            (*node, map)
        })
        .collect();
    let ids: BTreeSet<(&str, &str)> = by_member.values().flat_map(|m| m.keys().copied()).collect();
    let mut differences = Vec::new();
    for id in &ids {
        let (name, message) = id;
        let message = MessageId(u128::from_str_radix(message, 16).expect("ids are hex"));
        let name = QueueName::try_from((*name).to_owned()).expect("a stored queue's name");
        let replicas = ring.replicas(&name, message);
        let held: Vec<(u16, Option<&Stored>)> = (1..=members)
            .map(|node| (node, by_member[&node].get(id).copied()))
            .collect();
        let strays = held
            .iter()
            .any(|(node, h)| h.is_some() && !replicas.contains(&NodeId(*node)));
        let hashes: BTreeSet<Option<u64>> = held
            .iter()
            .filter(|(node, _)| replicas.contains(&NodeId(*node)))
            .map(|(_, h)| h.map(|h| h.hash))
            .collect();
        if strays || hashes.len() > 1 {
            let on: Vec<String> = held
                .iter()
                .map(|(node, h)| {
                    let role = if replicas.contains(&NodeId(*node)) {
                        "replica"
                    } else {
                        "not a replica"
                    };
                    format!(
                        "member{node} ({role}): {}",
                        h.map_or("absent".to_owned(), |h| format!(
                            "{} #{:016x}",
                            h.summary, h.hash
                        ))
                    )
                })
                .collect();
            differences.push(format!("{}/{}: {}", id.0, id.1, on.join(", ")));
        }
    }
    if differences.is_empty() {
        Ok(ids.len())
    } else {
        Err(differences)
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

    /// Calls a member drawn at random, through its SQS endpoint or its front.
    async fn call(&mut self, request: &Request) -> Result<Answer, Outcome> {
        let member = member_host(self.rng.random_range(1..=self.members));
        let via_sqs = self.rng.random_bool(SQS_SHARE);
        self.call_member(&member, request, via_sqs).await
    }

    async fn call_member(
        &self,
        host: &str,
        request: &Request,
        via_sqs: bool,
    ) -> Result<Answer, Outcome> {
        // A long poll's deadline starts after its wait.
        let deadline = match request {
            Request::Receive { wait_s, .. } => {
                CALL_DEADLINE + Duration::from_secs(u64::from(*wait_s))
            }
            _ => CALL_DEADLINE,
        };
        let answer = if via_sqs {
            sqs::call(host, request, CONNECT_TIMEOUT, deadline).await
        } else {
            front::call(host, request, CONNECT_TIMEOUT, deadline).await
        };
        match answer {
            Ok(Answer::Refused { code }) => Err(Outcome::Refused { code }),
            Ok(Answer::Unavailable { reason }) => Err(Outcome::Unknown { reason }),
            Ok(answer) => Ok(answer),
            // Nothing left this host: the call changed nothing.
            Err(Failure::NotSent(reason)) => Err(Outcome::Refused {
                code: format!("not sent: {reason}"),
            }),
            Err(Failure::NoAnswer(reason)) => Err(Outcome::Unknown { reason }),
        }
    }

    async fn step(&mut self) {
        if let Some(member) = self.shape.long_polls_through {
            self.step_waiters(member).await;
            return;
        }
        if self.shape.deletes_at_deadline {
            self.step_deadline().await;
            return;
        }
        if let Some(member) = self.shape.leases_through {
            self.step_stale_leases(member).await;
            return;
        }
        let pause = self.rng.random_range(0..=THINK_MS_MAX);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let now = sim_now_ms();
        if self.rng.random_bool(0.01) {
            // The client's process crashes and starts again: every handle it held is gone, its
            // messages come back when their timeouts end.
            self.held.clear();
            self.stale.clear();
            self.history
                .borrow_mut()
                .fault(now, format!("client{} restarted", self.id));
        } else if self.purge_at_ms.is_some_and(|at| at <= now) {
            self.purge_at_ms = None;
            let op = self.invoke(Call::Purge);
            let result = self.call(&Request::Purge).await;
            self.complete(op, settled(result));
        } else if self.move_task_at_ms.is_some_and(|at| at <= now)
            && (self.dead_letter_ready(now) || now + MOVE_TASK_LAST_MS >= self.phases.safety_end_ms)
        {
            self.move_task_at_ms = None;
            self.start_move_task().await;
        } else if self.race_at_ms.first().is_some_and(|at| *at <= now) {
            self.race_at_ms.remove(0);
            self.race_queue().await;
        } else if self.stale.first().is_some_and(|(_, due)| *due <= now) {
            let (held, _) = self.stale.remove(0);
            if let Some(member) = self.shape.late_deletes_through {
                self.delete_through(held, member).await;
            } else {
                self.delete(held).await;
            }
        } else if !self.held.is_empty() && self.rng.random_bool(0.5) {
            if self.held.len() >= 2 && self.rng.random_bool(BATCH_SHARE) {
                let count = self
                    .rng
                    .random_range(2..=BATCH_ENTRIES_MAX)
                    .min(self.held.len());
                // A batch names one queue: the first held's, and the handles of it that follow.
                let first = self.held[0].dead_letter;
                let count = self
                    .held
                    .iter()
                    .take(count)
                    .take_while(|held| held.dead_letter == first)
                    .count();
                let batch: Vec<Held> = self.held.drain(..count).collect();
                self.delete_batch(batch).await;
            } else {
                let held = self.held.remove(0);
                self.settle(held).await;
            }
        } else if self.rng.random_bool(0.45) {
            if self.rng.random_bool(BATCH_SHARE) {
                let count = self.rng.random_range(2..=BATCH_ENTRIES_MAX);
                self.send_batch(count).await;
            } else {
                self.send().await;
            }
        } else {
            let max = self.rng.random_range(1..=10);
            let visibility_s = if self.rng.random_bool(0.7) {
                self.rng.random_range(1..=VISIBILITY_S_MAX)
            } else {
                QUEUE_VISIBILITY_S
            };
            // Some receives are long polls, which a member serves as one of its waiters from
            // every replica's index (spec/replication.md §9).
            let wait_s = if self.rng.random_bool(LONG_POLL_SHARE) {
                self.rng.random_range(1..=WAIT_S_MAX)
            } else {
                0
            };
            // With a dead-letter queue, some receives read it (drawn only then, so a seed
            // without one keeps its draws).
            let dead_letter =
                self.max_receive_count.is_some() && self.rng.random_bool(DEAD_LETTER_SHARE);
            if let Some(got) = self.receive(dead_letter, max, visibility_s, wait_s).await {
                self.held.extend(got);
            }
        }
    }

    /// [`Focus::Waiters`](super::faults::Focus::Waiters)'s step. Client 0: a long poll of
    /// [`WAITERS_WAIT_S`] for up to 10 messages through `member` (visibility
    /// [`WAITERS_VISIBILITY_S`]), then a delete of each message it got, through a member drawn
    /// at random. The others: a pause, then, when the history shows no send that may have
    /// happened and was not delivered yet, one send with a delay of 1 to [`DELAY_S_MAX`] s
    /// through a member other than `member`. Nothing else, so that no write wakes `member`'s
    /// waiters and no other receive could claim what they wait for; and one message at a time
    /// (two when two senders look at once), so that no receive `member` starts for a message
    /// it holds, sampling a peer's index, finds one it does not hold in passing.
    async fn step_waiters(&mut self, member: u16) {
        if self.id == 0 {
            let via_sqs = self.rng.random_bool(SQS_SHARE);
            let got = self
                .receive_through(
                    &member_host(member),
                    via_sqs,
                    false,
                    10,
                    WAITERS_VISIBILITY_S,
                    WAITERS_WAIT_S,
                )
                .await;
            for held in got.unwrap_or_default() {
                self.delete(held).await;
            }
            return;
        }
        let pause = self.rng.random_range(WAITERS_SEND_PAUSE_MS);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if sim_now_ms() >= self.phases.safety_end_ms || self.undelivered_send() {
            return;
        }
        let delay_s = self.rng.random_range(1..=DELAY_S_MAX);
        // Another member than the waiters': the next of the others, drawn.
        let through = (member - 1 + self.rng.random_range(1..self.members)) % self.members + 1;
        self.send_through(through, Some(delay_s)).await;
    }

    /// [`Focus::DeleteAtDeadline`](super::faults::Focus::DeleteAtDeadline)'s step. Clients 0
    /// and 1: a receive of 1-3 messages through member 1 (a wait of 1 s, a visibility of 1-2
    /// s), then a delete of each, through the front of member 2 or 3, sent when its visibility
    /// ends (give or take a few ms). Client 2: a long poll of 3 s through member 1, whose deliveries it leaves
    /// to time out (visibility 3-5 s). Client 3: a send through member 2 or 3 every 200-600 ms.
    async fn step_deadline(&mut self) {
        match self.id {
            0 | 1 => {
                let max = self.rng.random_range(1..=3);
                let visibility_s = self.rng.random_range(1..=2);
                let via_sqs = self.rng.random_bool(SQS_SHARE);
                let got = self
                    .receive_through(&member_host(1), via_sqs, false, max, visibility_s, 1)
                    .await
                    .unwrap_or_default();
                let ends = sim_now_ms() + u64::from(visibility_s) * 1_000;
                for held in got {
                    let at = ends.saturating_add_signed(self.rng.random_range(-30..=10));
                    let now = sim_now_ms();
                    if at > now {
                        tokio::time::sleep(Duration::from_millis(at - now)).await;
                    }
                    let member = self.rng.random_range(2..=3);
                    self.delete_by_front(held, member).await;
                }
            }
            2 => {
                let visibility_s = self.rng.random_range(3..=5);
                let via_sqs = self.rng.random_bool(SQS_SHARE);
                // Abandoned: each comes back when its timeout ends.
                let _ = self
                    .receive_through(&member_host(1), via_sqs, false, 10, visibility_s, 3)
                    .await;
            }
            _ => {
                let pause = self.rng.random_range(200..=600);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let member = self.rng.random_range(2..=3);
                self.send_through(member, None).await;
            }
        }
    }

    /// [`Focus::StaleLeases`](super::faults::Focus::StaleLeases)'s step. Every client but
    /// client 0: a receive of 1-3 messages through `member` (no wait, a visibility of 2 s), then,
    /// 0.2-1.2 s later, an extension of each to 4-6 s through one of the other members; the messages are
    /// left to time out, or deleted through another member in one case of four. Client 0 sends
    /// through the other members every 100-300 ms.
    async fn step_stale_leases(&mut self, member: u16) {
        let other = |rng: &mut ChaCha8Rng, members: u16| {
            (member - 1 + rng.random_range(1..members)) % members + 1
        };
        if self.id > 0 {
            let max = self.rng.random_range(1..=3);
            let via_sqs = self.rng.random_bool(SQS_SHARE);
            let got = self
                .receive_through(&member_host(member), via_sqs, false, max, 2, 0)
                .await
                .unwrap_or_default();
            // Late enough that "behind" may have been cut from its peers meanwhile.
            let pause = self.rng.random_range(200..=1_200);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            for held in got {
                let timeout_s = self.rng.random_range(4..=6);
                let through = other(&mut self.rng, self.members);
                if self
                    .change_visibility_through(held.clone(), through, timeout_s)
                    .await
                    && self.rng.random_bool(0.25)
                {
                    let through = other(&mut self.rng, self.members);
                    self.delete_by_front(held, through).await;
                }
            }
            let pause = self.rng.random_range(50..=200);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        } else {
            let pause = self.rng.random_range(100..=300);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let through = other(&mut self.rng, self.members);
            self.send_through(through, None).await;
        }
    }

    /// Deletes with `held`'s handle through `member`'s front, whose answer says whether the
    /// delete wrote (the SQS endpoint answers a superseded handle with success).
    async fn delete_by_front(&mut self, held: Held, member: u16) {
        let op = self.invoke(Call::Delete {
            message_id: held.ticket.message_id(),
            generation: held.generation,
            receive_count: held.receive_count,
        });
        let request = Request::Delete {
            ticket: held.ticket,
        };
        let result = self
            .call_member(&member_host(member), &request, false)
            .await;
        self.complete(op, settled(result));
    }

    /// One send of a new body, with `delay_s` or none, through `member`.
    async fn send_through(&mut self, member: u16, delay_s: Option<u32>) {
        let body = body(self.id, self.next_seq);
        self.next_seq += 1;
        let op = self.invoke(Call::Send {
            body: body.clone(),
            delay_s,
            dedup_id: None,
        });
        let request = Request::Send {
            body,
            delay_s: delay_s.unwrap_or(0),
            dedup: None,
        };
        let via_sqs = self.rng.random_bool(SQS_SHARE);
        let outcome = match self
            .call_member(&member_host(member), &request, via_sqs)
            .await
        {
            Ok(Answer::Sent { message_id }) => Outcome::Sent { message_id },
            Ok(other) => Outcome::Unknown {
                reason: format!("a send answered {other:?}"),
            },
            Err(outcome) => outcome,
        };
        self.complete(op, outcome);
    }

    /// Whether the history shows a send that may have happened (or is still under way) whose
    /// body no receive has delivered.
    fn undelivered_send(&self) -> bool {
        let history = self.history.borrow();
        let delivered: BTreeSet<&str> = history
            .ops
            .iter()
            .filter_map(|op| match &op.completed {
                Some((_, Outcome::Received(got))) => Some(got),
                _ => None,
            })
            .flatten()
            .map(|delivery| delivery.body.as_str())
            .collect();
        history.ops.iter().any(|op| {
            matches!(&op.call, Call::Send { body, .. } if !delivered.contains(body.as_str()))
                && op.outcome().may_have_happened()
        })
    }

    /// Whether the history shows a message waiting ready in the dead-letter queue now: one
    /// delivered from it whose visibility timeout has ended, with no delete of that life that
    /// may have happened and no later delivery from it (what a client would read in the queue's
    /// `ApproximateNumberOfMessages`, without a call that could move the run's draws).
    fn dead_letter_ready(&self, now: u64) -> bool {
        let history = self.history.borrow();
        let mut visible_at: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for op in &history.ops {
            match (&op.call, &op.completed) {
                (
                    Call::Receive {
                        dead_letter: true,
                        visibility_s,
                        ..
                    },
                    Some((at, Outcome::Received(got))),
                ) => {
                    for delivery in got {
                        visible_at.insert(
                            (delivery.message_id.as_str(), delivery.generation),
                            at + u64::from(*visibility_s) * 1_000,
                        );
                    }
                }
                (
                    Call::Delete {
                        message_id,
                        generation,
                        ..
                    },
                    _,
                ) if op.outcome().may_have_happened() => {
                    visible_at.remove(&(message_id.as_str(), *generation));
                }
                _ => {}
            }
        }
        visible_at.values().any(|at| *at <= now)
    }

    /// Starts the move task: through a member drawn at random, and again through another one
    /// while the start was never sent, was refused by the clock gate or got no answer, up to [`MOVE_TASK_STARTS_MAX`] times within the
    /// safety phase. Each start is an op of its own. A start answered, or refused otherwise
    /// (a task already running: an unanswered start took effect), ends it.
    async fn start_move_task(&mut self) {
        let mut member = self.rng.random_range(1..=self.members);
        for start in 1..=MOVE_TASK_STARTS_MAX {
            let via_sqs = self.rng.random_bool(SQS_SHARE);
            let op = self.invoke(Call::StartMoveTask);
            let result = self
                .call_member(&member_host(member), &Request::StartMoveTask, via_sqs)
                .await;
            let outcome = settled(result);
            let again = match &outcome {
                Outcome::Unknown { .. } => true,
                Outcome::Refused { code } => {
                    code.starts_with("not sent") || code == front::NOT_COORDINATING
                }
                _ => false,
            };
            self.complete(op, outcome);
            if !again || start == MOVE_TASK_STARTS_MAX || sim_now_ms() >= self.phases.safety_end_ms
            {
                return;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
            // Another member: the next of the others, drawn.
            let step = self.rng.random_range(1..self.members);
            member = (member - 1 + step) % self.members + 1;
        }
    }

    /// Deletes a held message, changes its visibility, abandons it, or keeps its handle for a
    /// late delete.
    async fn settle(&mut self, held: Held) {
        if self.shape.late_deletes_through.is_some() {
            self.settle_stale_focus(held).await;
            return;
        }
        let roll: f64 = self.rng.random();
        if roll < 0.55 {
            self.delete(held).await;
        } else if roll < 0.70 {
            let timeout_s = self.rng.random_range(0..=VISIBILITY_S_MAX);
            if self.change_visibility(held.clone(), timeout_s).await && timeout_s > 0 {
                self.held.push(held);
            }
        } else if roll < 0.75 && self.max_receive_count.is_some() && !held.dead_letter {
            // Its holder gives up on it: dead-letter now, through a member's front (the SQS
            // endpoint has no such action).
            self.dead_letter_now(held).await;
        } else if roll < 0.90 {
            // Abandoned: the message becomes visible again when its timeout ends (and, in the
            // run's queue, moves to the dead-letter queue after `maxReceiveCount` receives).
        } else {
            let due_ms = sim_now_ms() + self.rng.random_range(7_000..=12_000);
            self.stale.push((held, due_ms));
        }
    }

    /// [`Focus::StaleDeletes`](super::faults::Focus::StaleDeletes)'s settle: a fifth deleted,
    /// two fifths abandoned (so a later receive supersedes the handle and its own holder may
    /// leave it too), two fifths kept for a late delete 7-12 s on, when the message has mostly
    /// been received again.
    async fn settle_stale_focus(&mut self, held: Held) {
        let roll: f64 = self.rng.random();
        if roll < 0.2 {
            self.delete(held).await;
        } else if roll >= 0.6 {
            let due_ms = sim_now_ms() + self.rng.random_range(7_000..=12_000);
            self.stale.push((held, due_ms));
        }
    }

    /// Deletes with `held`'s handle through `member` (its SQS endpoint or its front).
    async fn delete_through(&mut self, held: Held, member: u16) {
        let op = self.invoke(Call::Delete {
            message_id: held.ticket.message_id(),
            generation: held.generation,
            receive_count: held.receive_count,
        });
        let via_sqs = self.rng.random_bool(SQS_SHARE);
        let result = self
            .call_member(
                &member_host(member),
                &Request::Delete {
                    ticket: held.ticket.clone(),
                },
                via_sqs,
            )
            .await;
        self.complete(op, settled(result));
    }

    /// Creates the run's queue through members drawn at random until one acknowledges it
    /// (every client asks with the same attributes, so concurrent creates agree), or the safety
    /// phase ends; each attempt is an op of the history.
    async fn create_queue(&mut self) {
        if self.max_receive_count.is_some() {
            // The dead-letter queue first: a redrive policy must name an existing queue.
            let mut created = false;
            while !created && sim_now_ms() < self.phases.safety_end_ms {
                let op = self.invoke(Call::CreateDeadLetterQueue);
                let result = self
                    .call(&Request::CreateQueue {
                        dead_letter: true,
                        max_receive_count: None,
                    })
                    .await;
                created = matches!(result, Ok(Answer::Done));
                self.complete(op, settled(result));
                if !created {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
        let request = Request::CreateQueue {
            dead_letter: false,
            max_receive_count: self.max_receive_count,
        };
        while sim_now_ms() < self.phases.safety_end_ms {
            let op = self.invoke(Call::CreateQueue);
            let result = self.call(&request).await;
            let done = matches!(result, Ok(Answer::Done));
            self.complete(op, settled(result));
            if done {
                return;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// The next body and a delay drawn for it.
    fn next_message(&mut self) -> (String, Option<u32>) {
        let body = body(self.id, self.next_seq);
        self.next_seq += 1;
        let delay_s = self
            .rng
            .random_bool(0.2)
            .then(|| self.rng.random_range(1..=DELAY_S_MAX));
        (body, delay_s)
    }

    /// A batch of `count` sends: each entry an op of the history, invoked and completed
    /// together.
    async fn send_batch(&mut self, count: usize) {
        let entries: Vec<(String, Option<u32>)> = (0..count).map(|_| self.next_message()).collect();
        let ops: Vec<OpId> = entries
            .iter()
            .map(|(body, delay_s)| {
                self.invoke(Call::Send {
                    body: body.clone(),
                    delay_s: *delay_s,
                    dedup_id: None,
                })
            })
            .collect();
        let request = Request::SendBatch {
            entries: entries
                .into_iter()
                .map(|(body, delay_s)| (body, delay_s.unwrap_or(0)))
                .collect(),
        };
        let outcomes = batch_outcomes(
            self.call(&request).await,
            ops.len(),
            |answer| match answer {
                Answer::Sent { message_id } => Outcome::Sent { message_id },
                other => Outcome::Unknown {
                    reason: format!("a send answered {other:?}"),
                },
            },
        );
        for (op, outcome) in ops.into_iter().zip(outcomes) {
            self.complete(op, outcome);
        }
    }

    /// Deletes every held message of `batch` in one batch.
    async fn delete_batch(&mut self, batch: Vec<Held>) {
        let ops: Vec<OpId> = batch
            .iter()
            .map(|held| {
                self.invoke(Call::Delete {
                    message_id: held.ticket.message_id(),
                    generation: held.generation,
                    receive_count: held.receive_count,
                })
            })
            .collect();
        let request = Request::DeleteBatch {
            tickets: batch.into_iter().map(|held| held.ticket).collect(),
        };
        let outcomes = batch_outcomes(self.call(&request).await, ops.len(), |answer| {
            settled(Ok(answer))
        });
        for (op, outcome) in ops.into_iter().zip(outcomes) {
            self.complete(op, outcome);
        }
    }

    /// A create and a delete of the race queue at once, through two different members (spec/
    /// replication.md §1: the name's record decides between them), each an op of the history.
    async fn race_queue(&mut self) {
        let first = self.rng.random_range(1..=self.members);
        let second = first % self.members + 1;
        let via_sqs = (
            self.rng.random_bool(SQS_SHARE),
            self.rng.random_bool(SQS_SHARE),
        );
        let queue = front::RACE_QUEUE.to_owned();
        let create = self.invoke(Call::RaceQueue {
            queue: queue.clone(),
            create: true,
        });
        let delete = self.invoke(Call::RaceQueue {
            queue,
            create: false,
        });
        let (first, second) = (member_host(first), member_host(second));
        let (create_request, delete_request) = (
            Request::RaceQueue { create: true },
            Request::RaceQueue { create: false },
        );
        let (created, deleted) = tokio::join!(
            self.call_member(&first, &create_request, via_sqs.0),
            self.call_member(&second, &delete_request, via_sqs.1),
        );
        self.complete(create, settled(created));
        self.complete(delete, settled(deleted));
    }

    /// A send; some carry a deduplication id from a small pool every client draws from (so
    /// two clients may send one id at once), and one of those whose outcome is unknown is sent
    /// again at once, same body and id, as a client retries it (spec/replication.md §4).
    async fn send(&mut self) {
        let (body, delay_s) = self.next_message();
        let dedup_id = self
            .rng
            .random_bool(DEDUP_SHARE)
            .then(|| format!("k{}", self.rng.random_range(0..DEDUP_IDS)));
        let mut attempts = if dedup_id.is_some() { 2 } else { 1 };
        while attempts > 0 {
            attempts -= 1;
            let op = self.invoke(Call::Send {
                body: body.clone(),
                delay_s,
                dedup_id: dedup_id.clone(),
            });
            let request = Request::Send {
                body: body.clone(),
                delay_s: delay_s.unwrap_or(0),
                dedup: dedup_id.clone(),
            };
            let outcome = match self.call(&request).await {
                Ok(Answer::Sent { message_id }) => Outcome::Sent { message_id },
                Ok(other) => Outcome::Unknown {
                    reason: format!("a send answered {other:?}"),
                },
                Err(outcome) => outcome,
            };
            let unknown = matches!(outcome, Outcome::Unknown { .. });
            self.complete(op, outcome);
            if !unknown {
                break;
            }
        }
    }

    /// A receive of the run's queue or (`dead_letter`) its dead-letter queue, through a member
    /// drawn at random as [`Client::call`] draws it; `None` when it failed.
    async fn receive(
        &mut self,
        dead_letter: bool,
        max: u32,
        visibility_s: u32,
        wait_s: u32,
    ) -> Option<Vec<Held>> {
        let member = member_host(self.rng.random_range(1..=self.members));
        let via_sqs = self.rng.random_bool(SQS_SHARE);
        self.receive_through(&member, via_sqs, dead_letter, max, visibility_s, wait_s)
            .await
    }

    /// A receive of the run's queue or (`dead_letter`) its dead-letter queue through `host`;
    /// `None` when it failed.
    async fn receive_through(
        &mut self,
        host: &str,
        via_sqs: bool,
        dead_letter: bool,
        max: u32,
        visibility_s: u32,
        wait_s: u32,
    ) -> Option<Vec<Held>> {
        let op = self.invoke(Call::Receive {
            dead_letter,
            max,
            wait_s,
            visibility_s,
        });
        let request = Request::Receive {
            dead_letter,
            max,
            visibility_s,
            wait_s,
        };
        let result = self.call_member(host, &request, via_sqs).await;
        self.received(op, result, dead_letter)
    }

    /// Completes the receive `op` with `result`: what it delivered, or `None` when it failed.
    fn received(
        &mut self,
        op: OpId,
        result: Result<Answer, Outcome>,
        dead_letter: bool,
    ) -> Option<Vec<Held>> {
        match result {
            Ok(Answer::Received(got)) => {
                let deliveries = got
                    .iter()
                    .map(|g: &Got| Delivery {
                        message_id: g.ticket.message_id(),
                        body: g.body.clone(),
                        receive_count: g.receive_count,
                        generation: g.ticket.generation(),
                    })
                    .collect();
                self.complete(op, Outcome::Received(deliveries));
                Some(got.into_iter().map(|g| Held::of(g, dead_letter)).collect())
            }
            Ok(other) => {
                self.complete(
                    op,
                    Outcome::Unknown {
                        reason: format!("a receive answered {other:?}"),
                    },
                );
                None
            }
            Err(outcome) => {
                self.complete(op, outcome);
                None
            }
        }
    }

    /// Deletes with `held`'s handle; true when a member acknowledged it.
    async fn delete(&mut self, held: Held) -> bool {
        let op = self.invoke(Call::Delete {
            message_id: held.ticket.message_id(),
            generation: held.generation,
            receive_count: held.receive_count,
        });
        let result = self
            .call(&Request::Delete {
                ticket: held.ticket.clone(),
            })
            .await;
        let done = matches!(result, Ok(Answer::Done));
        self.complete(op, settled(result));
        done
    }

    /// Dead-letter now with `held`'s handle of the run's queue, through a member's front.
    async fn dead_letter_now(&mut self, held: Held) {
        let op = self.invoke(Call::DeadLetterNow {
            message_id: held.ticket.message_id(),
            generation: held.generation,
            receive_count: held.receive_count,
        });
        let member = member_host(self.rng.random_range(1..=self.members));
        let result = self
            .call_member(
                &member,
                &Request::DeadLetterNow {
                    ticket: held.ticket,
                },
                false,
            )
            .await;
        self.complete(op, settled(result));
    }

    /// Changes `held`'s visibility to `timeout_s` through `member`: whether it was done.
    async fn change_visibility_through(&mut self, held: Held, member: u16, timeout_s: u32) -> bool {
        let op = self.invoke(Call::ChangeVisibility {
            message_id: held.ticket.message_id(),
            generation: held.generation,
            receive_count: held.receive_count,
            timeout_s,
        });
        let request = Request::ChangeVisibility {
            ticket: held.ticket.clone(),
            timeout_s,
        };
        let via_sqs = self.rng.random_bool(SQS_SHARE);
        let result = self
            .call_member(&member_host(member), &request, via_sqs)
            .await;
        let done = matches!(result, Ok(Answer::Done));
        self.complete(op, settled(result));
        done
    }

    async fn change_visibility(&mut self, held: Held, timeout_s: u32) -> bool {
        let op = self.invoke(Call::ChangeVisibility {
            message_id: held.ticket.message_id(),
            generation: held.generation,
            receive_count: held.receive_count,
            timeout_s,
        });
        let result = self
            .call(&Request::ChangeVisibility {
                ticket: held.ticket.clone(),
                timeout_s,
            })
            .await;
        let done = matches!(result, Ok(Answer::Done));
        self.complete(op, settled(result));
        done
    }

    /// After the heal: receive and delete until nothing was delivered for `drain_quiet_ms`,
    /// then count what every member's view still holds (one `Stats` op, the sum).
    async fn drain(&mut self) {
        self.held.clear();
        self.stale.clear();
        let mut last_delivery_ms = sim_now_ms();
        // With a dead-letter queue, the drain reads both queues in turn.
        let mut dead_letter = false;
        loop {
            if self.max_receive_count.is_some() {
                dead_letter = !dead_letter;
            }
            match self.receive(dead_letter, 10, DRAIN_VISIBILITY_S, 0).await {
                Some(got) if !got.is_empty() => {
                    for held in got {
                        // Through other members until one deletes, as a client fails over: in a
                        // seed whose clocks leave one coordinator of five (the others' gates
                        // answer "did nothing"), a delete through a member drawn once fails four
                        // times in five, the message comes back after DRAIN_VISIBILITY_S, and
                        // the drain could go quiet with it still there (seed 777009).
                        for _ in 0..DRAIN_DELETE_ATTEMPTS {
                            if self.delete(held.clone()).await {
                                break;
                            }
                            tokio::time::sleep(RETRY_PAUSE).await;
                        }
                    }
                    last_delivery_ms = sim_now_ms();
                }
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
            if sim_now_ms() >= last_delivery_ms + self.phases.drain_quiet_ms {
                break;
            }
        }
        let op = self.invoke(Call::Stats);
        let (mut ready, mut in_flight) = (0, 0);
        for node in 1..=self.members {
            let host = member_host(node);
            let mut counted = false;
            for _ in 0..COUNT_ATTEMPTS_MAX {
                if let Ok(Answer::Counts {
                    ready: r,
                    in_flight: f,
                }) = self.call_member(&host, &Request::Count, false).await
                {
                    ready += r;
                    in_flight += f;
                    counted = true;
                    break;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            if !counted {
                self.complete(
                    op,
                    Outcome::Unknown {
                        reason: format!("{host} never counted"),
                    },
                );
                return;
            }
        }
        self.complete(
            op,
            Outcome::Stats {
                ready,
                in_flight,
                delayed: 0,
            },
        );
    }
}

impl Client {
    /// After every drain: reads every member's records until every replica of every record
    /// holds it alike (spec/replication.md, *Liveness*, L1), for at most
    /// `CONVERGENCE_WAIT_MS`.
    async fn converge(&self) -> Convergence {
        let until_ms = sim_now_ms() + CONVERGENCE_WAIT_MS;
        loop {
            let mut snapshots = BTreeMap::new();
            let mut unread = Vec::new();
            for node in 1..=self.members {
                match self
                    .call_member(&member_host(node), &Request::Records, false)
                    .await
                {
                    Ok(Answer::Records(Ok(held))) => {
                        snapshots.insert(node, held);
                    }
                    other => unread.push(format!("member{node} unread: {other:?}")),
                }
            }
            let found = if unread.is_empty() {
                compare(self.members, &snapshots)
            } else {
                Err(unread)
            };
            if found.is_ok() || sim_now_ms() >= until_ms {
                return found;
            }
            tokio::time::sleep(CONVERGENCE_PAUSE).await;
        }
    }
}

/// Each entry's outcome of a batch of `entries` answered `result`: a refusal or an unknown of
/// the whole call is every entry's; an entry's refusal or unavailability is its own; `entry`
/// reads an entry's other answers.
fn batch_outcomes(
    result: Result<Answer, Outcome>,
    entries: usize,
    entry: impl Fn(Answer) -> Outcome,
) -> Vec<Outcome> {
    match result {
        Ok(Answer::Batch(answers)) if answers.len() == entries => answers
            .into_iter()
            .map(|answer| match answer {
                Answer::Refused { code } => Outcome::Refused { code },
                Answer::Unavailable { reason } => Outcome::Unknown { reason },
                other => entry(other),
            })
            .collect(),
        Ok(other) => vec![
            Outcome::Unknown {
                reason: format!("a batch answered {other:?}"),
            };
            entries
        ],
        Err(outcome) => vec![outcome; entries],
    }
}

/// The outcome of a delete or a visibility change.
fn settled(result: Result<Answer, Outcome>) -> Outcome {
    match result {
        Ok(Answer::Done) => Outcome::Ok,
        Ok(other) => Outcome::Unknown {
            reason: format!("answered {other:?}"),
        },
        Err(outcome) => outcome,
    }
}
