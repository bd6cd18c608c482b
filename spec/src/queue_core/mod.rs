//! The model of `spec/queue-core.md`: one node's queues as a state machine, translated from the
//! page (not from the code) and checked exhaustively with stateright.
//!
//! It owns the model's constants, its state, its actions and their effects, and the page's
//! invariants and liveness claim as stateright properties. It must never depend on
//! `trireme-core`: the conformance tests hold the two to each other, so neither may borrow from
//! the other.
//!
//! # Shape
//!
//! Two messages (`m0`, `m1`), two workers (`w0`, `w1`) and a fair consumer, the source queue `Q`
//! (redrive policy: `D` after [`MAX_RECEIVE_COUNT`] receives) and its dead-letter queue `D`. Time
//! runs in whole ticks `0..=t_max`. Every action but `Tick` happens at the current tick and first
//! advances time to it, which fires what is due at that instant (a visibility of 0 leaves
//! `InFlight { until: now }`, which the next action restores).
//!
//! [`QueueCore::step`] is the model's transition function and [`QueueCore::actions`] its
//! enabled actions, so a property test can drive the model and the core side by side.
//!
//! # Reductions (what the bounds leave out)
//!
//! The page's constants give a state space far beyond a CI budget (receives with a visibility
//! of 0 take no time, so even one tick is unbounded). What the default check leaves out:
//!
//! - **Receives** ([`QueueCore::receives_max`], `within_boundary`): at most 3 receives in the
//!   free phase, summed over the messages still stored and all their lives. Enough for two
//!   receives in `Q`, the dead-letter move and one receive in `D` or after a redrive; not for a
//!   second trip through `D`, nor for both messages received twice while both are stored.
//! - **Dead-letter-now** (`within_boundary`, `State::ghost_dead_letter_nows`): at most one
//!   succeeds per path, and it counts as one receive toward the receive bound for the rest of the
//!   path: enough for a receive, the move, and one receive in `D` (a waiter served by the move,
//!   or a consumer), or a redrive. The holder drops its handle once the move succeeded (its
//!   request is done); other workers keep theirs, so a retry with a handle of the old queue is
//!   still offered. At a queue without a redrive policy it is offered with that queue's own
//!   handles only (the policy is checked before the handle is read), and forged handles are
//!   offered with `seq` past the newest only.
//! - **Long polls** ([`QueueCore::long_polls`]): a waiter takes a full batch with visibility 2;
//!   long polls with `max = 1` or visibility 0 (chains of waiters served with visibility 0) are
//!   checked only by the step tests and the random walks.
//! - **Sends** go to `Q` only, so every message in `D` has a source and a redrive never fails;
//!   the random walks of the large configuration send to `D` too.
//! - Messages are sent in id order (`m1` only after `m0`); ids are otherwise interchangeable,
//!   so the id order is the send order, and it breaks a tie of `sent_at` as the code does.
//! - A worker with an open long poll does nothing else until it is served, answered empty or
//!   cancelled (a worker is one synchronous client).
//! - A worker keeps only the newest handle it received for each message, and drops its handle
//!   of a message once the message is gone (every delete with it would succeed as
//!   `already_gone`; the model offers that delete without a holder).
//! - Queues are never created, changed or deleted; attributes are fixed (`QueueAttributes`).
//!   `PURGE_INTERVAL`, queue-name reuse and message sizes are not modelled (as the page says).
//!
//! The full check also merges states through [`QueueCore::representative`] (worker symmetry,
//! the inert parts of a settled state, timestamps nothing reads again); those merges are exact.
//! The large configuration (`TRIREME_MODEL_LARGE=1`) raises the receive bound to 4 and the
//! free phase to `T_MAX_LARGE` ticks.
//!
//! # How each liveness claim is checked
//!
//! L1 and L2 are the invariants I3 and I11 (the page explains why they hold in every state).
//! L3 is `Property::eventually` over a settle phase; see [`properties`] for how stateright 0.31
//! checks it and why this model cannot make it pass vacuously.

mod action;
pub mod properties;
mod state;
mod step;

#[cfg(test)]
mod checks;

pub use action::{Action, Delivery, InvalidReason, Outcome, Refusal, Reply, WaiterAnswer};
pub use state::{
    DedupEntry, Events, Gone, HeldHandle, Life, Message, MessageId, MessageState, QueueId,
    QueueState, ReceiptHandle, Slot, State, Tick, Waiter, Worker, WorkerId,
};

use stateright::{Model, Property};

/// Messages in the model (`m0`, `m1`).
pub const MESSAGES: usize = 2;
/// Workers of the free phase (`w0`, `w1`); the fair consumer comes on top.
pub const WORKERS: usize = 2;
/// Last tick of the free phase in the default configuration.
pub const T_MAX: Tick = 5;
/// Last tick of the free phase in the large configuration.
pub const T_MAX_LARGE: Tick = 6;
/// Delays a send may carry.
pub const DELAYS: [Tick; 2] = [0, 1];
/// Visibility timeouts a receive or a visibility change may carry.
pub const VISIBILITIES: [Tick; 2] = [0, 2];
/// Long-poll waits a receive may carry.
pub const WAITS: [Tick; 2] = [0, 2];
/// Most messages one receive delivers.
pub const BATCH_MAX: u8 = 2;
/// `maxReceiveCount` of `Q`'s redrive policy.
pub const MAX_RECEIVE_COUNT: u8 = 2;
/// Retention period, counted from the original send.
pub const RETENTION: Tick = 4;
/// How long a deduplication id is remembered after a send.
pub const DEDUP_WINDOW: Tick = 2;
/// Latest end of visibility, counted from the latest receive (`VISIBILITY_TOTAL_MAX`).
pub const VISIBILITY_TOTAL_MAX: Tick = 3;
/// Most receives in the free phase, counted over all lives of the messages still stored,
/// default configuration: enough for two in `Q` and one more in `D` or after a redrive.
pub const RECEIVES_MAX: u8 = 3;
/// The same bound in the large configuration.
pub const RECEIVES_MAX_LARGE: u8 = 4;
/// `(max, visibility)` of long polls in the default configuration: a waiter takes a full batch
/// with a non-zero visibility.
pub const LONG_POLLS: &[(u8, Tick)] = &[(BATCH_MAX, VISIBILITIES[1])];
/// `(max, visibility)` of long polls of [`QueueCore::unbounded_options`]: every combination.
pub const LONG_POLLS_LARGE: &[(u8, Tick)] = &[
    (1, VISIBILITIES[0]),
    (1, VISIBILITIES[1]),
    (BATCH_MAX, VISIBILITIES[0]),
    (BATCH_MAX, VISIBILITIES[1]),
];
/// Visibility the fair consumer asks for: long enough to delete before anyone else receives.
pub const CONSUMER_VISIBILITY: Tick = 2;

// The fair consumer must be able to delete what it received before its visibility ends.
const _: () = assert!(CONSUMER_VISIBILITY > 0);
const _: () = assert!(CONSUMER_VISIBILITY <= VISIBILITY_TOTAL_MAX);
// Every visibility a receive may ask for respects the cap.
const _: () = assert!(VISIBILITIES[1] <= VISIBILITY_TOTAL_MAX);
// A dead-letter move needs a receive count of at least one.
const _: () = assert!(MAX_RECEIVE_COUNT >= 1);

/// A redrive policy: after `max_receive_count` receives, the next receive moves the message to
/// `dead_letter_queue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RedrivePolicy {
    /// Where messages go.
    pub dead_letter_queue: QueueId,
    /// Receives before the move.
    pub max_receive_count: u8,
}

/// The fixed attributes of a model queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueAttributes {
    /// The queue's incarnation; receipt handles carry it.
    pub incarnation: u8,
    /// Its redrive policy.
    pub redrive: Option<RedrivePolicy>,
}

/// A deliberate defect. Each one must turn a named property red (the tests in `checks` prove
/// it), which shows the property can fail at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A visibility restore clears the handle and the next receive restarts `seq` at 1, so a
    /// superseded handle becomes the current one again (red: I2).
    ClearHandleOnRestore,
    /// Every receive issues `seq = 1` (red: I1).
    SameHandleEveryReceive,
    /// Serving a waiter takes an in-flight message before a ready one (red: I4).
    ServeInFlightToWaiter,
    /// A receive after the first one of a life does not increment `receive_count` (red: I5).
    ReceiveCountNotIncremented,
    /// A dead-letter move drops the message from `Q` without storing it in `D` (red: I6).
    DeadLetterMoveLoses,
    /// `first_receive_at` is stored as a plain number where 0 means "none", so a first receive
    /// at time 0 looks like no receive at all (red: I10).
    ZeroMeansNone,
    /// A send does not serve the waiters of its queue (red: I3).
    SendDoesNotServe,
    /// The dead-letter move happens one receive early (red: I7).
    DeadLetterOneEarly,
    /// Deleting a message that was ready again (visibility expired, not yet received again)
    /// marks it deleted but leaves it in its queue (red: I8).
    DeleteLeavesReadyMessage,
    /// Deduplication entries last one tick instead of `DEDUP_WINDOW` (red: I9).
    DedupExpiresEarly,
    /// Retention skips in-flight messages (red: I11).
    RetentionSkipsInFlight,
    /// A visibility change ignores `VISIBILITY_TOTAL_MAX` (red: I12).
    NoVisibilityCap,
    /// Visibility timeouts never expire (red: L3, and I11).
    RestoreNeverFires,
    /// The page as written on 2026-11-29: a redrive resets the handle sequence together with the
    /// receive count, so a handle issued before the dead-letter move becomes current again after
    /// the redrive (red: I1 and I2). The model's default does not reset it; see
    /// `spec-questions.md`.
    HandleSeqResetByRedrive,
    /// Dead-letter-now skips the staleness check, so the holder of a superseded handle moves the
    /// message away from the worker that received it since (red: I2).
    DeadLetterNowAcceptsStale,
    /// Dead-letter-now takes a handle that was never issued as the current one, so a forged
    /// handle moves a message nobody received (red: I7).
    DeadLetterNowAcceptsUnissued,
    /// Dead-letter-now resets the receive count, as the harness's copy did (red: I5).
    DeadLetterNowResetsReceiveCount,
    /// Dead-letter-now does not serve the dead-letter queue's waiters (red: I3).
    DeadLetterNowDoesNotServe,
}

/// The model: its configuration. The state lives in [`State`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueCore {
    /// Last tick of the free phase.
    pub t_max: Tick,
    /// Queues a send may name.
    pub send_queues: Vec<QueueId>,
    /// Most receives in the free phase, summed over the stored messages and all their lives
    /// (`receive_seq`): receives with a visibility of 0 take no time, so without a bound one
    /// tick holds unboundedly many.
    pub receives_max: u8,
    /// `(max, visibility)` pairs a long poll (`wait > 0`) may carry; receives that answer at
    /// once (`wait = 0`) take every pair.
    pub long_polls: &'static [(u8, Tick)],
    /// A planted defect, `None` for the model of the page.
    pub bug: Option<Bug>,
}

impl Default for QueueCore {
    fn default() -> Self {
        QueueCore {
            t_max: T_MAX,
            send_queues: vec![QueueId::Q],
            receives_max: RECEIVES_MAX,
            long_polls: LONG_POLLS,
            bug: None,
        }
    }
}

impl QueueCore {
    /// The larger configuration for the exhaustive check: one more tick and one more receive.
    pub fn large() -> Self {
        QueueCore {
            t_max: T_MAX_LARGE,
            receives_max: RECEIVES_MAX_LARGE,
            ..QueueCore::default()
        }
    }

    /// Every option of the page's action set: the large configuration, with sends to the
    /// dead-letter queue (so a redrive to the source can fail) and every long-poll option. Its
    /// state space is far too large to check exhaustively; random walks use it.
    pub fn unbounded_options() -> Self {
        QueueCore {
            send_queues: vec![QueueId::Q, QueueId::D],
            long_polls: LONG_POLLS_LARGE,
            ..QueueCore::large()
        }
    }

    /// The large configuration when `TRIREME_MODEL_LARGE=1`, else the default one.
    pub fn from_env() -> Self {
        if std::env::var("TRIREME_MODEL_LARGE").is_ok_and(|v| v == "1") {
            QueueCore::large()
        } else {
            QueueCore::default()
        }
    }

    /// This configuration with `bug` planted.
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = Some(bug);
        self
    }

    /// Whether `bug` is planted.
    pub(crate) fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// The fixed attributes of `queue`.
    pub fn attributes(&self, queue: QueueId) -> QueueAttributes {
        match queue {
            QueueId::Q => QueueAttributes {
                incarnation: 1,
                redrive: Some(RedrivePolicy {
                    dead_letter_queue: QueueId::D,
                    max_receive_count: MAX_RECEIVE_COUNT,
                }),
            },
            QueueId::D => QueueAttributes {
                incarnation: 1,
                redrive: None,
            },
        }
    }

    /// The actions enabled in `state`, in a fixed order. In the free phase: sends of the next
    /// message, receives and long polls, deletes, visibility changes and dead-letter-nows with
    /// every handle a worker holds (superseded ones included), the same handles at the wrong
    /// queue, forged handles (`seq` never issued), `Tick` up to `t_max`, redrives, purges,
    /// cancelling a long poll, and `Settle` (the module's reductions say which dead-letter-nows
    /// are left out). In the settle phase: the one next step of the fair consumer.
    pub fn actions(&self, state: &State) -> Vec<Action> {
        if state.settled {
            return self.consumer_action(state).into_iter().collect();
        }
        let mut actions = Vec::new();
        if let Some(message) =
            MessageId::all().find(|id| state.messages[id.index()] == Slot::Unsent)
        {
            for &queue in &self.send_queues {
                for delay in DELAYS {
                    for dedup in [false, true] {
                        actions.push(Action::Send {
                            queue,
                            message,
                            delay,
                            dedup,
                        });
                    }
                }
            }
        }
        for worker in WorkerId::free() {
            if state.is_waiting(worker) {
                actions.push(Action::CancelWaiter { worker });
                continue;
            }
            for queue in QueueId::ALL {
                for max in 1..=BATCH_MAX {
                    for visibility in VISIBILITIES {
                        for wait in WAITS {
                            if wait > 0 && !self.long_polls.contains(&(max, visibility)) {
                                continue;
                            }
                            actions.push(Action::Receive {
                                queue,
                                worker,
                                max,
                                visibility,
                                wait,
                            });
                        }
                    }
                }
            }
            for held in state.workers[worker.index()].held.iter().flatten() {
                let handle = held.handle;
                for queue in [handle.queue, handle.queue.other()] {
                    actions.push(Action::Delete {
                        by: Some(worker),
                        queue,
                        handle,
                    });
                    // At a queue without a redrive policy the handle is never read (the policy
                    // is checked first), so that refusal is offered with the queue's own
                    // handles only.
                    if queue == handle.queue || self.attributes(queue).redrive.is_some() {
                        actions.push(Action::DeadLetterNow {
                            by: Some(worker),
                            queue,
                            handle,
                        });
                    }
                }
                for timeout in VISIBILITIES {
                    actions.push(Action::ChangeVisibility {
                        by: worker,
                        queue: handle.queue,
                        handle,
                        timeout,
                    });
                }
            }
        }
        for (message, queue, life) in state.stored() {
            for seq in [0, life.receive_seq + 1] {
                let handle = ReceiptHandle {
                    queue,
                    incarnation: self.attributes(queue).incarnation,
                    message,
                    seq,
                };
                actions.push(Action::Delete {
                    by: None,
                    queue,
                    handle,
                });
                // `seq = 0` and `seq` past the newest are one check of dead-letter-now's guard,
                // which a forged delete already walks both ways; one forged handle suffices.
                if seq > 0 && self.attributes(queue).redrive.is_some() {
                    actions.push(Action::DeadLetterNow {
                        by: None,
                        queue,
                        handle,
                    });
                }
            }
        }
        for message in MessageId::all() {
            let Some(gone) = state.message(message).filter(|m| m.queue.is_none()) else {
                continue;
            };
            // A worker's handle of a gone message, presented again (its copy was dropped, see
            // `Transition::make_gone`): a repeated delete succeeds as `already_gone`.
            let queue = gone.ghost_sent_to;
            actions.push(Action::Delete {
                by: None,
                queue,
                handle: ReceiptHandle {
                    queue,
                    incarnation: self.attributes(queue).incarnation,
                    message,
                    seq: 1,
                },
            });
        }
        if state.now < self.t_max {
            actions.push(Action::Tick);
        }
        for to in [None, Some(QueueId::Q)] {
            for max in 1..=BATCH_MAX {
                actions.push(Action::Redrive {
                    from: QueueId::D,
                    to,
                    max,
                });
            }
        }
        for queue in QueueId::ALL {
            actions.push(Action::Purge { queue });
        }
        actions.push(Action::Settle);
        actions
    }

    /// The fair consumer's next step (`spec/queue-core.md#liveness`, L3): delete what it
    /// received with its newest handle, else receive from `Q`, else from `D`, else let time
    /// advance while a delay or visibility timeout is still to end; `None` when nothing is left
    /// to do. It decides on the state as the next action will see it, after the advance to the
    /// current tick (a visibility of 0 from the previous step is restored by then).
    fn consumer_action(&self, state: &State) -> Option<Action> {
        let seen = self.advanced(state);
        let consumer = &seen.workers[WorkerId::CONSUMER.index()];
        for held in consumer.held.iter().flatten() {
            let handle = held.handle;
            let newest = seen
                .stored_in(handle.message, handle.queue)
                .is_some_and(|life| life.handle == Some(handle.seq));
            if newest {
                return Some(Action::Delete {
                    by: Some(WorkerId::CONSUMER),
                    queue: handle.queue,
                    handle,
                });
            }
        }
        if let Some(queue) = QueueId::ALL.into_iter().find(|&q| seen.has_ready(q)) {
            return Some(Action::Receive {
                queue,
                worker: WorkerId::CONSUMER,
                max: BATCH_MAX,
                visibility: CONSUMER_VISIBILITY,
                wait: 0,
            });
        }
        // A visibility of 0 leaves `InFlight { until: now }`, which only the next advance
        // restores: that still counts as a deadline to wait for. `Delayed { until <= now }` never
        // legitimately survives an advance (I11), so it does not.
        let waiting_for_deadline = seen.stored().any(|(_, _, life)| match life.state {
            MessageState::Delayed { until } => until > seen.now,
            MessageState::InFlight { until } => until >= seen.now,
            MessageState::Ready { .. } => false,
        });
        waiting_for_deadline.then_some(Action::Tick)
    }
}

// `representative` swaps the two free workers.
const _: () = assert!(WORKERS == 2);

impl QueueCore {
    /// The canonical form of `state` under which the full check merges states that behave
    /// alike (stateright's `symmetry_fn`; it only decides which states count as already seen,
    /// and exploration continues from the real state).
    ///
    /// - `w0` and `w1` are interchangeable: the form with the smaller worker order is kept.
    /// - After `Settle` only the fair consumer acts and nothing is sent, so the free workers'
    ///   handles, the deduplication entries and the event witnesses are inert and dropped.
    ///
    /// - Timestamps no transition reads again are set to 0 (see `canonical_times`).
    /// - The ghost flag of a dead-letter-now is dropped where I7 no longer reads it (see
    ///   `canonical_dead_lettered_now`).
    ///
    /// A state merged into an equivalent one is not itself checked; for the second point that
    /// means a settle-phase state differing only in the free workers' handles is checked once.
    pub fn representative(state: &State) -> State {
        let mut canonical = state.clone();
        canonical_times(&mut canonical);
        canonical_dead_lettered_now(&mut canonical);
        if canonical.settled {
            for worker in &mut canonical.workers[..WORKERS] {
                *worker = Worker::default();
            }
            for queue in &mut canonical.queues {
                queue.dedup = None;
            }
            canonical.ghost_events = Events::default();
            canonical.ghost_dead_letter_nows = 0;
        }
        let mut swapped = canonical.clone();
        swapped.workers.swap(0, 1);
        for queue in &mut swapped.queues {
            for waiter in &mut queue.waiters {
                if waiter.worker != WorkerId::CONSUMER {
                    waiter.worker = WorkerId(1 - waiter.worker.0);
                }
            }
        }
        canonical.min(swapped)
    }
}

/// Clears the ghost flag of a message that dead-letter-now moved once its receive count reached
/// `maxReceiveCount`: I7 reads the flag only below it, the count never goes down within a life,
/// and a redrive, which starts a new life, clears the flag anyway.
fn canonical_dead_lettered_now(state: &mut State) {
    for slot in &mut state.messages {
        let Slot::Sent(message) = slot else { continue };
        if let Some(life) = &mut message.life
            && life.receive_count >= MAX_RECEIVE_COUNT
        {
            life.ghost_dead_lettered_now = false;
        }
    }
}

/// Rewrites timestamps whose exact value no future transition and no property can tell apart,
/// keeping every relation that one can:
///
/// - `Ready { since }` before `now` only orders ready messages of one queue among themselves
///   (later ones get `since >= now`): replaced by its rank among them.
/// - `first_receive_at` is read only by I10 (`first <= received_at <= now`), which, once true,
///   stays true as `received_at` only grows: replaced by 0 when I10 holds for the message.
/// - `received_at` is read by the visibility cap while the handle is current, and by I10, I12:
///   replaced by 0 when the message has no current handle and is not in flight, or when the cap
///   already refuses every change (`received_at + VISIBILITY_TOTAL_MAX < now`) and it is not in
///   flight; in both cases only when I10 holds, so a violation is never merged away.
/// - `sent_at` of a gone message without a deduplication id is read by nothing.
fn canonical_times(state: &mut State) {
    let now = state.now;
    for queue in QueueId::ALL {
        let mut before_now: Vec<Tick> = state
            .stored()
            .filter(|(_, q, _)| *q == queue)
            .filter_map(|(_, _, life)| match life.state {
                MessageState::Ready { since } if since < now => Some(since),
                _ => None,
            })
            .collect();
        before_now.sort_unstable();
        before_now.dedup();
        for slot in &mut state.messages {
            let Slot::Sent(message) = slot else { continue };
            if message.queue != Some(queue) {
                continue;
            }
            if let Some(Life {
                state: MessageState::Ready { since },
                ..
            }) = &mut message.life
                && *since < now
            {
                let rank = before_now
                    .iter()
                    .position(|t| t == since)
                    .expect("collected above");
                *since = Tick::try_from(rank).expect("few messages");
            }
        }
    }
    for slot in &mut state.messages {
        let Slot::Sent(message) = slot else { continue };
        let Some(life) = &mut message.life else {
            if !message.ghost_dedup {
                message.sent_at = 0;
            }
            continue;
        };
        let i10_holds = match (life.first_receive_at, life.received_at) {
            (Some(first), Some(latest)) => first <= latest && latest <= now,
            (None, Some(latest)) => latest <= now,
            (Some(_), None) => false,
            (None, None) => true,
        };
        if !i10_holds {
            continue;
        }
        if life.first_receive_at.is_some() {
            life.first_receive_at = Some(0);
        }
        let in_flight = matches!(life.state, MessageState::InFlight { .. });
        let cap_inert = life.handle.is_none()
            || life
                .received_at
                .is_some_and(|latest| latest + VISIBILITY_TOTAL_MAX < now);
        if life.received_at.is_some() && cap_inert && !in_flight {
            life.received_at = Some(0);
        }
    }
}

impl Model for QueueCore {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.extend(QueueCore::actions(self, state));
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let (next, _reply) = self.apply(state, action);
        if state.settled && self.bug.is_none() {
            // L3 is exact only if the settle phase has no cycle (see `properties`).
            assert!(
                properties::settle_progress(&next) > properties::settle_progress(state),
                "settle step {action:?} made no progress from {state:?}"
            );
        }
        (next != *state).then_some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }

    /// Bounds the free phase only: a settle-phase state outside a boundary would look terminal
    /// to the checker and fail L3 for the bound's sake, and the settle phase is finite anyway.
    /// A dead-letter-now counts as a receive, and only one may succeed (see the module's
    /// reductions).
    fn within_boundary(&self, state: &State) -> bool {
        let receives: u8 = state.stored().map(|(_, _, life)| life.receive_seq).sum();
        state.settled
            || (receives + state.ghost_dead_letter_nows <= self.receives_max
                && state.ghost_dead_letter_nows <= 1)
    }
}
