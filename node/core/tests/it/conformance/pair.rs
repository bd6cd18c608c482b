//! A model state and a real core stepped through the same actions, and everything either side
//! lets an observer see, translated into core values so the two can be compared with `==`.
//!
//! The translation (model value → core value):
//! - queues `Q` and `D` → two core queues, `work` and `dead-letters`, created at [`EPOCH`] with
//!   the model's redrive policy and the scale's retention (`D` sorts first by name, so the core's
//!   "sources before their dead-letter queues" order is not name order by accident);
//! - messages `m0`, `m1` → fixed `MessageId`s in the same order (receives break ties by id);
//! - workers → `WaiterId`s for their long polls; the handles a worker holds are kept here for
//!   the core side, from the deliveries the core addressed to that worker's receives and waiters;
//! - model time → core time at the scale (`Scale::at`), every action at the model's `now`,
//!   `Tick` → `advance(now + tick)`, `Settle` → `advance(now)` (the model advances to `now` too);
//! - handles → `(queue, incarnation of that queue, message, seq)`.
//!
//! After each step the core side is read back through its queries (`message`, `messages`,
//! `waiter_views`, `queue(..).counts`, `gone_in_last_step`) and compared with the model's state
//! and reply, and every invariant of `spec/queue-core.md` is checked on the model state.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use trireme_core::{
    Change, ClaimTag, Command, DedupId, DedupRecord, Delivery, GoneReason, HandleProblem,
    Incarnation, MessageCounts, MessageId, MessageRecord, MessageState, Millis, Outcome,
    QueueAttributes, QueueName, Queues, ReceiptHandle, Record, RecordKey, RedrivePolicy, Reject,
    WaiterId, WaiterView, Wakeup,
};
use trireme_spec::queue_core::{
    self as model, Action, Gone, InvalidReason, MESSAGES, MessageId as ModelMessageId, QueueCore,
    QueueId, Refusal, Reply, Slot, State, Tick, WORKERS, WorkerId, properties,
};

use super::scale::{EPOCH, Scale};

/// The model and the core, side by side.
pub struct Pair {
    pub scale: Scale,
    pub model: QueueCore,
    /// The model's state after the latest step.
    pub state: State,
    pub core: Queues,
    names: [QueueName; 2],
    incarnations: [Incarnation; 2],
    /// The core side's workers: the newest handle each received for each message, dropped when
    /// the message is gone (as the model's `Worker::held`).
    held: [[Option<ReceiptHandle>; MESSAGES]; WORKERS + 1],
    /// The queue of each open core waiter, from the `Waiting` replies.
    waiting_on: BTreeMap<WaiterId, QueueId>,
    /// Why each message left the core. The core forgets a gone message and says why only in
    /// `gone_in_last_step`, so the reason is kept here.
    gone: [Option<GoneReason>; MESSAGES],
    /// What a shell storing every `take_changes` would hold: its message records by key.
    persisted: BTreeMap<RecordKey, MessageRecord>,
    /// The same for deduplication records.
    persisted_dedup: BTreeMap<RecordKey, DedupRecord>,
    /// The tick of the latest purge of each queue on this path (for `Scale::admits`).
    pub purges: [Option<Tick>; 2],
    /// Every action stepped so far.
    pub trace: Vec<Action>,
}

/// The core and the model disagree, or one of them broke: a readable report.
#[derive(Debug)]
pub struct Mismatch(pub String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What one step showed an observer, in core values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The time after the step.
    pub now: Millis,
    /// The direct answer to the action.
    pub answer: Answer,
    /// Waiters answered during the step: those served in the order they were served (the
    /// page's serving order), then those answered empty by waiter id. The page does not order
    /// deadline answers of different queues at one instant, and the two sides do differ there:
    /// the model answers `Q`'s waiters first, the core the queues' in name order.
    pub wakeups: Vec<Answered>,
    /// Messages that became gone during the step, by id.
    pub gone_now: Vec<(MessageId, GoneReason)>,
    /// Every model message: stored (with its full state), gone (with the reason) or not stored.
    pub messages: Vec<(MessageId, Whereabouts)>,
    /// Every model message as a shell would have stored it from `take_changes` (the model's
    /// side: the message as it is stored now). A change the core does not report shows here.
    pub persisted: Vec<(MessageId, Option<Persisted>)>,
    /// The open deduplication entry of each queue as a shell would have stored it: `(queue,
    /// first message, window end)`. Only where the scale gives both sides the same window
    /// (`None` elsewhere).
    pub persisted_dedup: Option<Vec<(QueueName, MessageId, Millis)>>,
    /// Messages the core stores that the model does not know (always empty for the model).
    pub unknown_messages: Vec<MessageId>,
    /// Open waiters per queue, in serving order.
    pub waiters: Vec<(QueueName, Vec<WaiterView>)>,
    /// Ready, in-flight and delayed counts per queue.
    pub counts: Vec<(QueueName, MessageCounts)>,
    /// The handles each worker holds, per worker index.
    pub held: Vec<(u8, Vec<ReceiptHandle>)>,
}

/// The direct answer to an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Sent {
        id: MessageId,
        duplicate: bool,
    },
    Received(Vec<Delivered>),
    Waiting {
        waiter: WaiterId,
    },
    Deleted {
        already_gone: bool,
    },
    VisibilityChanged,
    DeadLettered {
        dead_letter_queue: QueueName,
    },
    Redriven {
        moved: u32,
        failed: u32,
    },
    Purged {
        count: u32,
    },
    WaiterCancelled,
    /// `Tick` and `Settle`: time advanced, nothing else was asked.
    TimeAdvanced,
    Refused(Refused),
    /// Anything else the core answered (never expected).
    Unexpected(String),
}

/// A refusal, by kind and the message it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    ReceiptHandleInvalid(HandleProblem),
    StaleReceiptHandle {
        message: MessageId,
    },
    MessageNotInFlight {
        message: MessageId,
    },
    VisibilityCapExceeded {
        message: MessageId,
    },
    NoRedrivePolicy {
        queue: QueueName,
    },
    /// Any other refusal (never expected: the model has no other).
    Other(String),
}

/// One delivered message as its receiver sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub queue: QueueName,
    pub message: MessageId,
    pub handle: ReceiptHandle,
    pub body: String,
    pub receive_count: u32,
    pub sent_at: Millis,
    pub first_receive_at: Option<Millis>,
    pub source: Option<QueueName>,
}

/// A waiter answered during a step; `delivered` is empty when answered at its deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    pub waiter: WaiterId,
    /// The queue it waited on; `None` if the core answered a waiter it never registered.
    pub queue: Option<QueueName>,
    pub delivered: Vec<Delivered>,
}

/// Where a message is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Whereabouts {
    /// Never sent, or sent as a duplicate and not stored.
    NotStored,
    Stored(Stored),
    Gone(GoneReason),
}

/// The full state of a stored message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub queue: QueueName,
    pub state: MessageState,
    pub receive_count: u32,
    /// The model's `receive_seq`, the core's `last_seq`.
    pub last_seq: u32,
    pub handle: Option<u32>,
    pub first_receive_at: Option<Millis>,
    pub received_at: Option<Millis>,
    pub sent_at: Millis,
    pub source: Option<QueueName>,
    pub body: String,
}

/// The changing state of a stored message, as its persisted record holds it (the body is
/// written once at send and not compared here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    pub queue: QueueName,
    pub state: MessageState,
    pub receive_count: u32,
    pub last_seq: u32,
    pub handle: Option<u32>,
    pub first_receive_at: Option<Millis>,
    pub received_at: Option<Millis>,
    pub sent_at: Millis,
    pub source: Option<QueueName>,
}

impl From<&Stored> for Persisted {
    fn from(stored: &Stored) -> Persisted {
        Persisted {
            queue: stored.queue.clone(),
            state: stored.state,
            receive_count: stored.receive_count,
            last_seq: stored.last_seq,
            handle: stored.handle,
            first_receive_at: stored.first_receive_at,
            received_at: stored.received_at,
            sent_at: stored.sent_at,
            source: stored.source.clone(),
        }
    }
}

/// The core's id of model message `m`: fixed, in the model's id order.
pub fn message_id(m: ModelMessageId) -> MessageId {
    MessageId(((u128::from(m.0) + 1) << 64) | 0x5ca1_ab1e)
}

/// The body sent as model message `m`.
pub fn body(m: ModelMessageId) -> String {
    format!("body of m{}", m.0)
}

/// The waiter id of `worker`'s receives (one open long poll per worker at most, as in the
/// model).
pub fn waiter_id(worker: WorkerId) -> WaiterId {
    WaiterId(u64::from(worker.0) + 1)
}

/// The one deduplication id of the model.
fn dedup_id() -> DedupId {
    DedupId::try_from("the-dedup-id").expect("a legal dedup id")
}

fn queue_text(queue: QueueId) -> &'static str {
    match queue {
        QueueId::Q => "work",
        QueueId::D => "dead-letters",
    }
}

impl Pair {
    /// Both sides before anything happened: the model's initial state (every option of the
    /// page's action set: sends to both queues, long polls of every shape), and a core with the
    /// two queues.
    pub fn new(scale: Scale) -> Pair {
        Pair::with_model(scale, QueueCore::unbounded_options())
    }

    /// The same with another configuration of the model (a planted bug, for the self-test).
    pub fn with_model(scale: Scale, model: QueueCore) -> Pair {
        let names = QueueId::ALL.map(|q| QueueName::try_from(queue_text(q)).expect("legal"));
        assert!(names[QueueId::D.index()] < names[QueueId::Q.index()]);
        let mut core = Queues::new();
        // The dead-letter queue first: a redrive policy must name an existing queue.
        for queue in [QueueId::D, QueueId::Q] {
            let redrive = model.attributes(queue).redrive.map(|policy| RedrivePolicy {
                dead_letter_queue: names[policy.dead_letter_queue.index()].clone(),
                max_receive_count: u32::from(policy.max_receive_count),
            });
            let attributes = QueueAttributes {
                retention_s: scale.retention_s(),
                redrive,
                ..QueueAttributes::default()
            };
            let step = core.apply(
                EPOCH,
                Command::CreateQueue {
                    name: names[queue.index()].clone(),
                    attributes,
                    tags: BTreeMap::new(),
                },
            );
            assert_eq!(step.result, Ok(Outcome::QueueCreated { created: true }));
        }
        let incarnations = names
            .clone()
            .map(|name| core.queue(&name).expect("created").incarnation);
        Pair {
            scale,
            model,
            state: State::initial(),
            core,
            names,
            incarnations,
            held: Default::default(),
            waiting_on: BTreeMap::new(),
            gone: [None; MESSAGES],
            persisted: BTreeMap::new(),
            persisted_dedup: BTreeMap::new(),
            purges: [None; 2],
            trace: Vec::new(),
        }
    }

    fn name(&self, queue: QueueId) -> QueueName {
        self.names[queue.index()].clone()
    }

    fn model_message(&self, id: MessageId) -> Option<ModelMessageId> {
        ModelMessageId::all().find(|&m| message_id(m) == id)
    }

    fn worker_of(waiter: WaiterId) -> Option<WorkerId> {
        (0..=WORKERS as u8)
            .map(WorkerId)
            .find(|&worker| waiter_id(worker) == waiter)
    }

    /// The core's receipt handle for a model handle.
    pub fn handle(&self, handle: model::ReceiptHandle) -> ReceiptHandle {
        let incarnation = if handle.incarnation == self.model.attributes(handle.queue).incarnation {
            self.incarnations[handle.queue.index()]
        } else {
            Incarnation::local(Millis(u64::from(handle.incarnation)))
        };
        ReceiptHandle {
            queue: self.name(handle.queue),
            incarnation,
            message: message_id(handle.message),
            seq: u32::from(handle.seq),
            claim: ClaimTag::default(),
        }
    }

    /// The core command for `action`; `None` for the actions that only advance time.
    pub fn command(&self, action: &Action) -> Option<Command> {
        let scale = self.scale;
        Some(match *action {
            Action::Send {
                queue,
                message,
                delay,
                dedup,
            } => Command::Send {
                queue: self.name(queue),
                id: message_id(message),
                body: body(message),
                attributes: BTreeMap::new(),
                system: Default::default(),
                delay_s: Some(scale.seconds(delay)),
                dedup: dedup.then(dedup_id),
            },
            Action::Receive {
                queue,
                worker,
                max,
                visibility,
                wait,
            } => Command::Receive {
                queue: self.name(queue),
                max: u32::from(max),
                visibility_s: Some(scale.seconds(visibility)),
                wait_s: Some(scale.seconds(wait)),
                waiter: waiter_id(worker),
            },
            Action::Delete { queue, handle, .. } => Command::Delete {
                queue: self.name(queue),
                handle: self.handle(handle),
            },
            Action::ChangeVisibility {
                queue,
                handle,
                timeout,
                ..
            } => Command::ChangeVisibility {
                queue: self.name(queue),
                handle: self.handle(handle),
                timeout_s: scale.seconds(timeout),
            },
            Action::DeadLetterNow { queue, handle, .. } => Command::DeadLetterNow {
                queue: self.name(queue),
                handle: self.handle(handle),
            },
            Action::Redrive { from, to, max } => Command::Redrive {
                from: self.name(from),
                to: to.map(|q| self.name(q)),
                max: u32::from(max),
                // The model has no restriction: the filter only routes a message to the
                // branch of one without a target (spec/queue-core.md, Considerations).
                allowed: None,
            },
            Action::Purge { queue } => Command::PurgeQueue {
                name: self.name(queue),
            },
            Action::CancelWaiter { worker } => Command::CancelWaiter {
                waiter: waiter_id(worker),
            },
            Action::Tick | Action::Settle => return None,
        })
    }

    /// Steps both sides through `action` (enabled in the model) and compares what they show.
    /// Returns the model's reply.
    pub fn step(&mut self, action: Action) -> Result<Reply, Mismatch> {
        let before = self.state.clone();
        let Some((after, reply)) = self.model.step_with_reply(&before, &action) else {
            panic!("{action:?} is not enabled in the model at {before:#?}");
        };
        self.trace.push(action);
        self.state = after;
        if let Action::Purge { queue } = action {
            self.purges[queue.index()] = Some(before.now);
        }
        let now = match action {
            Action::Tick => self.scale.at(before.now + 1),
            _ => self.scale.at(before.now),
        };
        let command = self.command(&action);
        let core = &mut self.core;
        let stepped = catch_unwind(AssertUnwindSafe(|| match command {
            Some(command) => {
                let step = core.apply(now, command);
                (Some(step.result), step.wakeups)
            }
            None => (None, core.advance(now)),
        }));
        let (result, wakeups) = match stepped {
            Ok(stepped) => stepped,
            Err(panic) => {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                return Err(self.report(&format!("the core panicked: {text}"), None));
            }
        };
        let core_seen = self.observe_core(&action, result, wakeups);
        let model_seen = self.observe_model(&before, &action, &reply);
        if core_seen != model_seen {
            return Err(self.report(
                "the core and the model disagree",
                Some((&model_seen, &core_seen)),
            ));
        }
        if let Some(due) = self.model_next_event() {
            let next = self.core.next_deadline();
            if next.is_none_or(|next| next > self.scale.at(due)) {
                return Err(self.report(
                    &format!(
                        "the core's next_deadline {next:?} is later than the model's next event \
                         at tick {due} ({:?}): a shell sleeping until it would fire late",
                        self.scale.at(due)
                    ),
                    None,
                ));
            }
        }
        if let Some(broken) = self.broken_invariant() {
            return Err(self.report(&format!("the model breaks {broken}"), None));
        }
        Ok(reply)
    }

    /// The model's next timed event whose duration the core shares at this scale: a delay end,
    /// a visibility restore, a waiter deadline, and retention and dedup expiry where exact.
    /// The core's `next_deadline` may be earlier (it has events of its own, such as a dedup
    /// entry of another length), never later.
    fn model_next_event(&self) -> Option<Tick> {
        let s = &self.state;
        let messages = s.stored().flat_map(|(id, _, life)| {
            let timer = match life.state {
                model::MessageState::Delayed { until }
                | model::MessageState::InFlight { until } => Some(until),
                model::MessageState::Ready { .. } => None,
            };
            let sent_at = s.message(id).expect("stored").sent_at;
            let retention = self
                .scale
                .retention_exact()
                .then_some(sent_at + model::RETENTION);
            [timer, retention]
        });
        let waiters = s
            .queues
            .iter()
            .flat_map(|queue| queue.waiters.iter().map(|waiter| Some(waiter.deadline)));
        let dedup = s.queues.iter().map(|queue| {
            queue
                .dedup
                .filter(|_| self.scale.dedup_window_exact())
                .map(|entry| entry.expires_at)
        });
        messages.chain(waiters).chain(dedup).flatten().min()
    }

    /// The first invariant of the page the model state breaks, if any.
    fn broken_invariant(&self) -> Option<&'static str> {
        let s = &self.state;
        let holds = [
            properties::handle_fresh(s),
            properties::stale_never_deletes(s),
            properties::no_idle_waiter(s),
            properties::exclusive_delivery(s),
            properties::receive_count(s),
            properties::conservation(s),
            properties::dead_letter_only_past_max(&self.model, s),
            properties::deleted_stays_deleted(s),
            properties::dedup(s),
            properties::first_receive_known(s),
            properties::timers_fire(s),
            properties::visibility_cap(s),
        ];
        properties::INVARIANTS
            .into_iter()
            .zip(holds)
            .find(|(_, holds)| !holds)
            .map(|(name, _)| name)
    }

    /// Reads the core after a step: updates the core side's workers from the deliveries and
    /// the gone list, then observes every query.
    fn observe_core(
        &mut self,
        action: &Action,
        result: Option<Result<Outcome, Reject>>,
        wakeups: Vec<Wakeup>,
    ) -> Observed {
        let gone_now: Vec<(MessageId, GoneReason)> = {
            let mut gone = self.core.gone_in_last_step().to_vec();
            gone.sort();
            gone
        };
        let answer = match result {
            None => Answer::TimeAdvanced,
            Some(Ok(outcome)) => self.core_answer(action, outcome, &gone_now),
            Some(Err(reject)) => Answer::Refused(refused(reject)),
        };
        let answered: Vec<Answered> = wakeups
            .into_iter()
            .map(|wakeup| {
                let waiter = wakeup.waiter();
                let queue = self.waiting_on.remove(&waiter).map(|q| self.name(q));
                let delivered = match wakeup {
                    Wakeup::Served { deliveries, .. } => {
                        if let Some(worker) = Self::worker_of(waiter) {
                            self.hold(worker, &deliveries);
                        }
                        deliveries.into_iter().map(delivered).collect()
                    }
                    Wakeup::Empty { .. } => Vec::new(),
                };
                Answered {
                    waiter,
                    queue,
                    delivered,
                }
            })
            .collect();
        let answered = served_then_empty(answered);
        // After the wakeups: the advance before the cancel may have served the waiter.
        if let Action::CancelWaiter { worker } = *action {
            self.waiting_on.remove(&waiter_id(worker));
        }
        let mut unknown_messages = Vec::new();
        for &(id, reason) in &gone_now {
            match self.model_message(id) {
                Some(m) => {
                    self.gone[m.index()] = Some(reason);
                    for worker in &mut self.held {
                        worker[m.index()] = None;
                    }
                }
                None => unknown_messages.push(id),
            }
        }
        let messages = ModelMessageId::all()
            .map(|m| {
                let id = message_id(m);
                let stored = QueueId::ALL
                    .into_iter()
                    .find_map(|q| self.core.message(&self.name(q), id));
                let whereabouts = match (stored, self.gone[m.index()]) {
                    (Some(view), _) => Whereabouts::Stored(Stored {
                        queue: view.queue,
                        state: view.state,
                        receive_count: view.receive_count,
                        last_seq: view.last_seq,
                        handle: view.handle,
                        first_receive_at: view.first_receive_at,
                        received_at: view.received_at,
                        sent_at: view.sent_at,
                        source: view.source,
                        body: view.body,
                    }),
                    (None, Some(reason)) => Whereabouts::Gone(reason),
                    (None, None) => Whereabouts::NotStored,
                };
                (id, whereabouts)
            })
            .collect();
        for change in self.core.take_changes() {
            match change {
                Change::Put(Record::Message(record)) => {
                    self.persisted.insert(record_key(&record), record);
                }
                Change::Remove(key @ RecordKey::Message(..)) => {
                    self.persisted.remove(&key);
                }
                Change::Put(Record::Dedup(record)) => {
                    let key = RecordKey::Dedup(record.queue.clone(), record.dedup.clone());
                    self.persisted_dedup.insert(key, record);
                }
                Change::Remove(key @ RecordKey::Dedup(..)) => {
                    self.persisted_dedup.remove(&key);
                }
                Change::Put(_) | Change::Remove(_) => {}
            }
        }
        let persisted = ModelMessageId::all()
            .map(|m| {
                let id = message_id(m);
                let mut records = self.persisted.values().filter(|record| record.id == id);
                let first = records.next().map(|record| Persisted {
                    queue: record.queue.clone(),
                    state: record.state,
                    receive_count: record.receive_count,
                    last_seq: record.last_seq,
                    handle: record.handle,
                    first_receive_at: record.first_receive_at,
                    received_at: record.received_at,
                    sent_at: record.sent_at,
                    source: record.source.clone(),
                });
                if records.next().is_some() {
                    // Stored under two keys: a move whose `Remove` was not reported.
                    unknown_messages.push(id);
                }
                (id, first)
            })
            .collect();
        for q in QueueId::ALL {
            for view in self.core.messages(&self.name(q)) {
                if self.model_message(view.id).is_none() {
                    unknown_messages.push(view.id);
                }
            }
        }
        Observed {
            now: self.core.now(),
            answer,
            wakeups: answered,
            gone_now,
            messages,
            persisted,
            persisted_dedup: self.scale.dedup_window_exact().then(|| {
                let mut entries: Vec<_> = self
                    .persisted_dedup
                    .values()
                    .map(|record| (record.queue.clone(), record.message, record.expires_at))
                    .collect();
                entries.sort();
                entries
            }),
            unknown_messages,
            waiters: QueueId::ALL
                .map(|q| (self.name(q), self.core.waiter_views(&self.name(q))))
                .to_vec(),
            counts: QueueId::ALL
                .map(|q| {
                    let view = self
                        .core
                        .queue(&self.name(q))
                        .expect("queues are not deleted");
                    (self.name(q), view.counts)
                })
                .to_vec(),
            held: self.held_view(|pair, worker, m| pair.held[worker][m].clone()),
        }
    }

    fn core_answer(
        &mut self,
        action: &Action,
        outcome: Outcome,
        gone_now: &[(MessageId, GoneReason)],
    ) -> Answer {
        match (outcome, action) {
            (Outcome::Sent { id, duplicate }, _) => Answer::Sent { id, duplicate },
            (Outcome::Received(deliveries), Action::Receive { worker, .. }) => {
                self.hold(*worker, &deliveries);
                Answer::Received(deliveries.into_iter().map(delivered).collect())
            }
            (Outcome::Waiting { waiter }, Action::Receive { queue, .. }) => {
                self.waiting_on.insert(waiter, *queue);
                Answer::Waiting { waiter }
            }
            (Outcome::Deleted { already_gone }, _) => Answer::Deleted { already_gone },
            (Outcome::VisibilityChanged, _) => Answer::VisibilityChanged,
            (
                Outcome::DeadLettered { dead_letter_queue },
                Action::DeadLetterNow { by, handle, .. },
            ) => {
                // The model's holder drops its handle once the move succeeded.
                if let Some(worker) = by {
                    self.held[worker.index()][handle.message.index()] = None;
                }
                Answer::DeadLettered { dead_letter_queue }
            }
            (Outcome::Redriven { moved, failed }, _) => Answer::Redriven { moved, failed },
            (Outcome::Done, Action::Purge { .. }) => Answer::Purged {
                count: gone_now
                    .iter()
                    .filter(|(_, reason)| *reason == GoneReason::Purged)
                    .count() as u32,
            },
            (Outcome::Done, Action::CancelWaiter { .. }) => Answer::WaiterCancelled,
            (other, _) => Answer::Unexpected(format!("{other:?}")),
        }
    }

    /// Records deliveries to `worker` as the newest handles it holds.
    fn hold(&mut self, worker: WorkerId, deliveries: &[Delivery]) {
        for delivery in deliveries {
            if let Some(m) = self.model_message(delivery.message) {
                self.held[worker.index()][m.index()] = Some(delivery.handle.clone());
            }
        }
    }

    fn held_view(
        &self,
        handle_of: impl Fn(&Pair, usize, usize) -> Option<ReceiptHandle>,
    ) -> Vec<(u8, Vec<ReceiptHandle>)> {
        (0..=WORKERS)
            .map(|worker| {
                let handles = (0..MESSAGES)
                    .filter_map(|m| handle_of(self, worker, m))
                    .collect();
                (worker as u8, handles)
            })
            .collect()
    }

    /// The model's state and reply after a step, translated into core values.
    fn observe_model(&self, before: &State, action: &Action, reply: &Reply) -> Observed {
        let s = &self.state;
        let scale = self.scale;
        let answer = match &reply.outcome {
            model::Outcome::Sent { message, duplicate } => Answer::Sent {
                id: message_id(*message),
                duplicate: *duplicate,
            },
            model::Outcome::Received { delivered } => {
                Answer::Received(delivered.iter().map(|d| self.delivered(d)).collect())
            }
            model::Outcome::Waiting => match action {
                Action::Receive { worker, .. } => Answer::Waiting {
                    waiter: waiter_id(*worker),
                },
                other => Answer::Unexpected(format!("the model waits on {other:?}")),
            },
            model::Outcome::Deleted { already_gone } => Answer::Deleted {
                already_gone: *already_gone,
            },
            model::Outcome::VisibilityChanged => Answer::VisibilityChanged,
            model::Outcome::DeadLettered { dead_letter_queue } => Answer::DeadLettered {
                dead_letter_queue: self.name(*dead_letter_queue),
            },
            model::Outcome::Redriven { moved, failed } => Answer::Redriven {
                moved: u32::from(*moved),
                failed: u32::from(*failed),
            },
            model::Outcome::Purged { count } => Answer::Purged {
                count: u32::from(*count),
            },
            model::Outcome::Ticked | model::Outcome::Settled => Answer::TimeAdvanced,
            model::Outcome::WaiterCancelled => Answer::WaiterCancelled,
            model::Outcome::Refused(refusal) => Answer::Refused(match *refusal {
                Refusal::ReceiptHandleInvalid { reason } => {
                    Refused::ReceiptHandleInvalid(match reason {
                        InvalidReason::WrongQueue => HandleProblem::WrongQueue,
                        InvalidReason::NeverIssued => HandleProblem::NeverIssued,
                    })
                }
                Refusal::StaleReceiptHandle { message_id: m } => Refused::StaleReceiptHandle {
                    message: message_id(m),
                },
                Refusal::MessageNotInFlight { message_id: m } => Refused::MessageNotInFlight {
                    message: message_id(m),
                },
                Refusal::VisibilityCapExceeded { message_id: m } => {
                    Refused::VisibilityCapExceeded {
                        message: message_id(m),
                    }
                }
                Refusal::NoRedrivePolicy { queue } => Refused::NoRedrivePolicy {
                    queue: self.name(queue),
                },
            }),
        };
        let wakeups: Vec<Answered> = reply
            .answered
            .iter()
            .map(|answer| Answered {
                waiter: waiter_id(answer.worker),
                queue: Some(self.name(answer.queue)),
                delivered: answer.delivered.iter().map(|d| self.delivered(d)).collect(),
            })
            .collect();
        let wakeups = served_then_empty(wakeups);
        let gone_reason = |gone: Gone| match gone {
            Gone::Deleted => GoneReason::Deleted,
            Gone::Expired => GoneReason::Expired,
            Gone::Purged => GoneReason::Purged,
        };
        let mut gone_now: Vec<(MessageId, GoneReason)> = ModelMessageId::all()
            .filter_map(|m| {
                let was_gone = before.message(m).and_then(|message| message.gone);
                let is_gone = s.message(m).and_then(|message| message.gone);
                match (was_gone, is_gone) {
                    (None, Some(gone)) => Some((message_id(m), gone_reason(gone))),
                    _ => None,
                }
            })
            .collect();
        gone_now.sort();
        let messages: Vec<(MessageId, Whereabouts)> = ModelMessageId::all()
            .map(|m| {
                let whereabouts = match &s.messages[m.index()] {
                    Slot::Unsent | Slot::Duplicate { .. } => Whereabouts::NotStored,
                    Slot::Sent(message) => match (message.queue, message.life, message.gone) {
                        (Some(queue), Some(life), _) => Whereabouts::Stored(Stored {
                            queue: self.name(queue),
                            state: match life.state {
                                model::MessageState::Delayed { until } => MessageState::Delayed {
                                    until: scale.at(until),
                                },
                                model::MessageState::Ready { since } => MessageState::Ready {
                                    since: scale.at(since),
                                },
                                model::MessageState::InFlight { until } => MessageState::InFlight {
                                    until: scale.at(until),
                                },
                            },
                            receive_count: u32::from(life.receive_count),
                            last_seq: u32::from(life.receive_seq),
                            handle: life.handle.map(u32::from),
                            first_receive_at: life.first_receive_at.map(|t| scale.at(t)),
                            received_at: life.received_at.map(|t| scale.at(t)),
                            sent_at: scale.at(message.sent_at),
                            source: life.source.map(|q| self.name(q)),
                            body: body(m),
                        }),
                        (_, _, Some(gone)) => Whereabouts::Gone(gone_reason(gone)),
                        // Neither stored nor gone: I6 is broken, which `broken_invariant`
                        // reports; show it as not stored meanwhile.
                        (_, _, None) => Whereabouts::NotStored,
                    },
                };
                (message_id(m), whereabouts)
            })
            .collect();
        let ready_in_flight_delayed = |q: QueueId| {
            let mut counts = MessageCounts::default();
            for (_, queue, life) in s.stored() {
                if queue != q {
                    continue;
                }
                match life.state {
                    model::MessageState::Ready { .. } => counts.ready += 1,
                    model::MessageState::InFlight { .. } => counts.in_flight += 1,
                    model::MessageState::Delayed { .. } => counts.delayed += 1,
                }
            }
            counts
        };
        let persisted = messages
            .iter()
            .map(|(id, whereabouts)| match whereabouts {
                Whereabouts::Stored(stored) => (*id, Some(Persisted::from(stored))),
                Whereabouts::NotStored | Whereabouts::Gone(_) => (*id, None),
            })
            .collect();
        Observed {
            now: scale.at(s.now),
            answer,
            wakeups,
            gone_now,
            messages,
            persisted,
            persisted_dedup: scale.dedup_window_exact().then(|| {
                let mut entries: Vec<_> = QueueId::ALL
                    .into_iter()
                    .filter_map(|q| {
                        s.queue(q).dedup.map(|entry| {
                            (
                                self.name(q),
                                message_id(entry.message),
                                scale.at(entry.expires_at),
                            )
                        })
                    })
                    .collect();
                entries.sort();
                entries
            }),
            unknown_messages: Vec::new(),
            waiters: QueueId::ALL
                .map(|q| {
                    let waiters = s
                        .queue(q)
                        .waiters
                        .iter()
                        .map(|w| WaiterView {
                            id: waiter_id(w.worker),
                            max: u32::from(w.max),
                            visibility_s: scale.seconds(w.visibility),
                            deadline: scale.at(w.deadline),
                        })
                        .collect();
                    (self.name(q), waiters)
                })
                .to_vec(),
            counts: QueueId::ALL
                .map(|q| (self.name(q), ready_in_flight_delayed(q)))
                .to_vec(),
            held: self.held_view(|pair, worker, m| {
                pair.state.workers[worker].held[m].map(|held| pair.handle(held.handle))
            }),
        }
    }

    fn delivered(&self, d: &model::Delivery) -> Delivered {
        Delivered {
            queue: self.name(d.handle.queue),
            message: message_id(d.message),
            handle: self.handle(d.handle),
            body: body(d.message),
            receive_count: u32::from(d.receive_count),
            sent_at: self.scale.at(d.sent_at),
            first_receive_at: d.first_receive_at.map(|t| self.scale.at(t)),
            source: d.source.map(|q| self.name(q)),
        }
    }

    /// A failure report: the trace so far, the parts that differ, and both sides in full.
    fn report(&self, what: &str, seen: Option<(&Observed, &Observed)>) -> Mismatch {
        let mut text = format!(
            "{what} at step {} (scale: {}; model tick t is core time {} + t × {} ms)\n\ntrace:\n",
            self.trace.len() - 1,
            self.scale.name,
            EPOCH.0,
            self.scale.tick_ms
        );
        for (i, action) in self.trace.iter().enumerate() {
            text += &format!("  {i:>3}: {action:?}\n");
        }
        if let Some((model_seen, core_seen)) = seen {
            text += &format!(
                "\ndiffering: {}\n",
                differing(model_seen, core_seen).join(", ")
            );
            text += &format!("\nmodel shows: {model_seen:#?}\n\ncore shows: {core_seen:#?}\n");
        }
        text += &format!("\nmodel state after the step: {:#?}\n", self.state);
        Mismatch(text)
    }
}

/// Served answers in the order given, then empty answers by waiter id.
fn served_then_empty(answers: Vec<Answered>) -> Vec<Answered> {
    let (served, mut empty): (Vec<Answered>, Vec<Answered>) = answers
        .into_iter()
        .partition(|answer| !answer.delivered.is_empty());
    empty.sort_by_key(|answer| answer.waiter);
    served.into_iter().chain(empty).collect()
}

/// The names of the parts of two observations that differ.
fn differing(model_seen: &Observed, core_seen: &Observed) -> Vec<String> {
    let mut parts = Vec::new();
    let mut check = |name: String, same: bool| {
        if !same {
            parts.push(name);
        }
    };
    check("now".into(), model_seen.now == core_seen.now);
    check("answer".into(), model_seen.answer == core_seen.answer);
    check("wakeups".into(), model_seen.wakeups == core_seen.wakeups);
    check("gone_now".into(), model_seen.gone_now == core_seen.gone_now);
    for ((id, a), (_, b)) in model_seen.messages.iter().zip(&core_seen.messages) {
        check(format!("messages[{id}]"), a == b);
    }
    for ((id, a), (_, b)) in model_seen.persisted.iter().zip(&core_seen.persisted) {
        check(format!("persisted[{id}]"), a == b);
    }
    check(
        "persisted_dedup".into(),
        model_seen.persisted_dedup == core_seen.persisted_dedup,
    );
    check(
        "unknown_messages".into(),
        model_seen.unknown_messages == core_seen.unknown_messages,
    );
    check("waiters".into(), model_seen.waiters == core_seen.waiters);
    check("counts".into(), model_seen.counts == core_seen.counts);
    check("held".into(), model_seen.held == core_seen.held);
    parts
}

fn record_key(record: &MessageRecord) -> RecordKey {
    RecordKey::Message(record.queue.clone(), record.id)
}

fn delivered(d: Delivery) -> Delivered {
    Delivered {
        queue: d.queue,
        message: d.message,
        handle: d.handle,
        body: d.body,
        receive_count: d.receive_count,
        sent_at: d.sent_at,
        first_receive_at: Some(d.first_receive_at),
        source: d.source,
    }
}

fn refused(reject: Reject) -> Refused {
    match reject {
        Reject::ReceiptHandleInvalid { reason } => Refused::ReceiptHandleInvalid(reason),
        Reject::StaleReceiptHandle { message } => Refused::StaleReceiptHandle { message },
        Reject::MessageNotInFlight { message } => Refused::MessageNotInFlight { message },
        Reject::VisibilityCapExceeded { message, .. } => Refused::VisibilityCapExceeded { message },
        Reject::NoRedrivePolicy { name } => Refused::NoRedrivePolicy { queue: name },
        other => Refused::Other(format!("{other:?}")),
    }
}
