//! The effects of the actions of `spec/queue-core.md#actions`, as one pure transition function.
//! It owns time advance, receive, serve, delete, visibility change, dead-letter move,
//! dead-letter-now, redrive and purge, and the ghost bookkeeping the invariants read. It must
//! never check an invariant: that is `properties`' job, and a transition that checked its own
//! result could hide a planted bug.

use super::action::{Action, Delivery, InvalidReason, Outcome, Refusal, Reply, WaiterAnswer};
use super::state::{
    DedupEntry, Events, Gone, HeldHandle, Life, Message, MessageId, MessageState, QueueId,
    ReceiptHandle, Slot, State, Tick, Waiter, WorkerId,
};
use super::{Bug, DEDUP_WINDOW, MESSAGES, QueueCore, RETENTION, VISIBILITY_TOTAL_MAX};

impl QueueCore {
    /// The model's transition function: the state after `action`, or `None` when `action` is not
    /// enabled in `state` or changes nothing (stateright's `next_state`, guarded by
    /// [`QueueCore::actions`]).
    pub fn step(&self, state: &State, action: &Action) -> Option<State> {
        let (next, _reply) = self.step_with_reply(state, action)?;
        (next != *state).then_some(next)
    }

    /// Like [`QueueCore::step`], but also returns the reply, and returns the state even when the
    /// action changed nothing (a refusal). `None` only when `action` is not enabled.
    pub fn step_with_reply(&self, state: &State, action: &Action) -> Option<(State, Reply)> {
        if !self.actions(state).contains(action) {
            return None;
        }
        Some(self.apply(state, *action))
    }

    /// Applies an enabled action.
    pub(super) fn apply(&self, state: &State, action: Action) -> (State, Reply) {
        let mut transition = Transition::new(self, state.clone());
        transition.state.ghost_events = Events::default();
        let outcome = match action {
            Action::Tick => {
                transition.advance(state.now + 1);
                Outcome::Ticked
            }
            other => {
                transition.advance(state.now);
                transition.perform(other)
            }
        };
        let reply = Reply {
            outcome,
            answered: transition.answered,
        };
        (transition.state, reply)
    }

    /// `state` after advancing time to its own `now`: what any next action sees first (for
    /// example, a visibility of 0 from the previous step restored).
    pub fn advanced(&self, state: &State) -> State {
        let mut transition = Transition::new(self, state.clone());
        transition.advance(state.now);
        transition.state
    }
}

/// One step in progress: the state being changed, and what the step answered so far.
struct Transition<'m> {
    model: &'m QueueCore,
    state: State,
    /// Waiters served or answered empty during this step.
    answered: Vec<WaiterAnswer>,
    /// Messages a visibility restore made ready during this step (for the `sometimes` witness).
    restored: [bool; MESSAGES],
    /// The message this step's send made ready (for the `sometimes` witness).
    sent: Option<MessageId>,
    /// The message this step's dead-letter-now moved (for the `sometimes` witness).
    dead_lettered_now: Option<MessageId>,
}

/// How a handle classifies against a queue (`spec/queue-core.md#deletequeue-handle`).
enum Classified {
    /// The message is not in the queue any more.
    NotInQueue,
    /// The handle is the message's newest.
    Current(MessageId),
}

impl<'m> Transition<'m> {
    fn new(model: &'m QueueCore, state: State) -> Self {
        Transition {
            model,
            state,
            answered: Vec::new(),
            restored: [false; MESSAGES],
            sent: None,
            dead_lettered_now: None,
        }
    }

    fn now(&self) -> Tick {
        self.state.now
    }

    /// When the stored message `id` was sent: the key of the order receives take messages in.
    fn sent_at(&self, id: MessageId) -> Tick {
        self.state
            .message(id)
            .expect("only stored messages are ordered")
            .sent_at
    }

    fn message_mut(&mut self, id: MessageId) -> &mut Message {
        match &mut self.state.messages[id.index()] {
            Slot::Sent(message) => message,
            Slot::Unsent | Slot::Duplicate { .. } => {
                panic!("message {id:?} is not stored")
            }
        }
    }

    fn life_mut(&mut self, id: MessageId) -> &mut Life {
        self.message_mut(id)
            .life
            .as_mut()
            .expect("only stored messages are changed")
    }

    /// Advances time to `to` (`spec/queue-core.md#actions`): an earlier `to` counts as the latest
    /// time seen. Fires what is due at the current instant first (a visibility of 0 left by the
    /// previous step), then what is due at `to`.
    fn advance(&mut self, to: Tick) {
        let from = self.now();
        let to = to.max(from);
        assert!(to <= from + 1, "the model advances one tick at a time");
        self.fire(from);
        if to > from {
            self.state.now = to;
            self.fire(to);
        }
    }

    /// Fires, in the page's order, everything due at instant `at`: delay ends, visibility
    /// restores (serving the waiters of queues that got a ready message), retention,
    /// deduplication entries, waiter deadlines. Deliveries made while serving here keep their
    /// `InFlight { until: at }` until the next advance, as the page says of a visibility of 0.
    fn fire(&mut self, at: Tick) {
        assert_eq!(self.now(), at, "fire only at the current time");
        let mut became_ready = [false; 2];
        let due: Vec<(MessageId, QueueId, MessageState)> = self
            .state
            .stored()
            .map(|(id, queue, life)| (id, queue, life.state))
            .collect();
        for &(id, queue, state) in &due {
            if let MessageState::Delayed { until } = state
                && until <= at
            {
                self.life_mut(id).state = MessageState::Ready { since: at };
                became_ready[queue.index()] = true;
            }
        }
        if !self.model.has(Bug::RestoreNeverFires) {
            for &(id, queue, state) in &due {
                if let MessageState::InFlight { until } = state
                    && until <= at
                {
                    let clear_handle = self.model.has(Bug::ClearHandleOnRestore);
                    let life = self.life_mut(id);
                    // spec/queue-core.md#considerations: restore keeps the handle.
                    life.state = MessageState::Ready { since: at };
                    if clear_handle {
                        life.handle = None;
                    }
                    self.restored[id.index()] = true;
                    became_ready[queue.index()] = true;
                }
            }
        }
        for queue in QueueId::ALL {
            if became_ready[queue.index()] {
                self.serve(queue);
            }
        }
        let expired: Vec<MessageId> = self
            .state
            .stored()
            .filter(|(id, _, life)| {
                let sent_at = self.state.message(*id).expect("stored").sent_at;
                let skip = self.model.has(Bug::RetentionSkipsInFlight)
                    && matches!(life.state, MessageState::InFlight { .. });
                sent_at + RETENTION <= at && !skip
            })
            .map(|(id, _, _)| id)
            .collect();
        for id in expired {
            self.make_gone(id, Gone::Expired);
        }
        for queue in &mut self.state.queues {
            if queue.dedup.is_some_and(|entry| entry.expires_at <= at) {
                queue.dedup = None;
            }
        }
        for queue in QueueId::ALL {
            let waiters = &mut self.state.queues[queue.index()].waiters;
            let (past, open): (Vec<Waiter>, Vec<Waiter>) =
                waiters.iter().partition(|w| w.deadline <= at);
            *waiters = open;
            for waiter in past {
                self.answered.push(WaiterAnswer {
                    worker: waiter.worker,
                    queue,
                    delivered: Vec::new(),
                });
            }
        }
    }

    fn make_gone(&mut self, id: MessageId, reason: Gone) {
        let message = self.message_mut(id);
        message.queue = None;
        message.gone = Some(reason);
        message.life = None;
        // A handle of a gone message is inert: every delete with it succeeds as `already_gone`
        // and no receive can supersede it. Workers drop it so that who held which one does not
        // multiply the states; `QueueCore::actions` still offers deletes of gone messages.
        for worker in &mut self.state.workers {
            worker.held[id.index()] = None;
        }
    }

    fn perform(&mut self, action: Action) -> Outcome {
        match action {
            Action::Send {
                queue,
                message,
                delay,
                dedup,
            } => self.send(queue, message, delay, dedup),
            Action::Receive {
                queue,
                worker,
                max,
                visibility,
                wait,
            } => self.receive(queue, worker, max, visibility, wait),
            Action::Delete { by, queue, handle } => self.delete(by, queue, handle),
            Action::ChangeVisibility {
                by,
                queue,
                handle,
                timeout,
            } => self.change_visibility(by, queue, handle, timeout),
            Action::DeadLetterNow { by, queue, handle } => self.dead_letter_now(by, queue, handle),
            Action::Redrive { from, to, max } => self.redrive(from, to, max),
            Action::Purge { queue } => self.purge(queue),
            Action::CancelWaiter { worker } => {
                for queue in &mut self.state.queues {
                    queue.waiters.retain(|w| w.worker != worker);
                }
                Outcome::WaiterCancelled
            }
            Action::Settle => {
                self.state.settled = true;
                Outcome::Settled
            }
            Action::Tick => unreachable!("Tick advances time and does nothing else"),
        }
    }

    fn send(&mut self, queue: QueueId, message: MessageId, delay: Tick, dedup: bool) -> Outcome {
        let now = self.now();
        assert_eq!(self.state.messages[message.index()], Slot::Unsent);
        if dedup
            && let Some(entry) = self.state.queue(queue).dedup
            && entry.expires_at > now
        {
            self.state.messages[message.index()] = Slot::Duplicate { of: entry.message };
            return Outcome::Sent {
                message: entry.message,
                duplicate: true,
            };
        }
        let state = if delay > 0 {
            MessageState::Delayed { until: now + delay }
        } else {
            MessageState::Ready { since: now }
        };
        self.state.messages[message.index()] = Slot::Sent(Message {
            queue: Some(queue),
            gone: None,
            sent_at: now,
            life: Some(Life {
                state,
                receive_count: 0,
                receive_seq: 0,
                first_receive_at: None,
                received_at: None,
                handle: None,
                source: None,
                ghost_deliveries: 0,
                ghost_dead_lettered_now: false,
            }),
            ghost_sent_to: queue,
            ghost_dedup: dedup,
            ghost_deleted: false,
        });
        if dedup {
            let window = if self.model.has(Bug::DedupExpiresEarly) {
                1
            } else {
                DEDUP_WINDOW
            };
            self.state.queues[queue.index()].dedup = Some(DedupEntry {
                message,
                expires_at: now + window,
            });
        }
        if delay == 0 && !self.model.has(Bug::SendDoesNotServe) {
            self.sent = Some(message);
            self.serve(queue);
        }
        Outcome::Sent {
            message,
            duplicate: false,
        }
    }

    fn receive(
        &mut self,
        queue: QueueId,
        worker: WorkerId,
        max: u8,
        visibility: Tick,
        wait: Tick,
    ) -> Outcome {
        let delivered = self.take(queue, worker, max, visibility, false);
        if delivered.is_empty() && wait > 0 {
            let deadline = self.now() + wait;
            self.state.queues[queue.index()].waiters.push(Waiter {
                worker,
                max,
                visibility,
                deadline,
            });
            Outcome::Waiting
        } else {
            Outcome::Received { delivered }
        }
    }

    /// The next message a receive of `queue` takes: the ready one sent first (oldest `sent_at`),
    /// ties by id.
    fn candidate(&self, queue: QueueId, serving: bool) -> Option<MessageId> {
        if serving && self.model.has(Bug::ServeInFlightToWaiter) {
            let in_flight = self.state.stored().find(|(_, q, life)| {
                *q == queue && matches!(life.state, MessageState::InFlight { .. })
            });
            if let Some((id, _, _)) = in_flight {
                return Some(id);
            }
        }
        self.state
            .stored()
            .filter(|(_, q, _)| *q == queue)
            .filter_map(|(id, _, life)| match life.state {
                MessageState::Ready { .. } => Some((self.sent_at(id), id)),
                MessageState::Delayed { .. } | MessageState::InFlight { .. } => None,
            })
            .min()
            .map(|(_, id)| id)
    }

    /// The *Receive* effect: takes candidates until `max` are delivered or none is left, moving
    /// those past the redrive policy's `maxReceiveCount` to the dead-letter queue instead.
    fn take(
        &mut self,
        queue: QueueId,
        worker: WorkerId,
        max: u8,
        visibility: Tick,
        serving: bool,
    ) -> Vec<Delivery> {
        let mut delivered = Vec::new();
        while delivered.len() < usize::from(max) {
            let Some(id) = self.candidate(queue, serving) else {
                break;
            };
            if let Some(policy) = self.model.attributes(queue).redrive {
                let threshold = if self.model.has(Bug::DeadLetterOneEarly) {
                    policy.max_receive_count - 1
                } else {
                    policy.max_receive_count
                };
                let receive_count = self
                    .state
                    .stored_in(id, queue)
                    .expect("candidate is stored")
                    .receive_count;
                if receive_count >= threshold {
                    self.dead_letter_move(id, queue, policy.dead_letter_queue, false);
                    continue;
                }
            }
            delivered.push(self.deliver(id, queue, worker, visibility));
        }
        delivered
    }

    fn deliver(
        &mut self,
        id: MessageId,
        queue: QueueId,
        worker: WorkerId,
        visibility: Tick,
    ) -> Delivery {
        let now = self.now();
        let model = self.model;
        let incarnation = model.attributes(queue).incarnation;
        let sent_at = self
            .state
            .message(id)
            .expect("delivered messages are stored")
            .sent_at;
        let life = self.life_mut(id);
        let was_ready = matches!(life.state, MessageState::Ready { .. });
        if !(model.has(Bug::ReceiveCountNotIncremented) && life.receive_count > 0) {
            life.receive_count += 1;
        }
        life.receive_seq = if model.has(Bug::ClearHandleOnRestore) {
            // The defect's numbering: the next seq follows the handle, which restore cleared.
            life.handle.map_or(1, |seq| seq + 1)
        } else {
            life.receive_seq + 1
        };
        let seq = if model.has(Bug::SameHandleEveryReceive) {
            1
        } else {
            life.receive_seq
        };
        life.handle = Some(seq);
        life.received_at = Some(now);
        if life.first_receive_at.is_none() {
            life.first_receive_at = if model.has(Bug::ZeroMeansNone) && now == 0 {
                // The defect: 0 is the "none" sentinel, so a receive at time 0 is not recorded.
                None
            } else {
                Some(now)
            };
        }
        life.state = MessageState::InFlight {
            until: now + visibility,
        };
        life.ghost_deliveries += 1;
        let delivery = Delivery {
            message: id,
            handle: ReceiptHandle {
                queue,
                incarnation,
                message: id,
                seq,
            },
            receive_count: life.receive_count,
            sent_at,
            first_receive_at: life.first_receive_at,
            source: life.source,
        };
        if !was_ready {
            self.state.ghost_served_in_flight = true;
        }
        for held in &mut self.state.workers {
            if let Some(handle) = &mut held.held[id.index()] {
                handle.ghost_superseded = true;
            }
        }
        self.state.workers[worker.index()].held[id.index()] = Some(HeldHandle {
            handle: delivery.handle,
            ghost_superseded: false,
        });
        delivery
    }

    /// *Serve(q)*: while `queue` has a waiter and a ready message, the oldest waiter receives; it
    /// leaves if it got something, else (everything it took moved to the dead-letter queue) it
    /// stays.
    fn serve(&mut self, queue: QueueId) {
        while let Some(&waiter) = self.state.queue(queue).waiters.first() {
            if self.candidate(queue, true).is_none() {
                break;
            }
            let delivered = self.take(queue, waiter.worker, waiter.max, waiter.visibility, true);
            if delivered.is_empty() {
                continue;
            }
            self.state.queues[queue.index()].waiters.remove(0);
            for delivery in &delivered {
                if self.restored[delivery.message.index()] {
                    self.state
                        .ghost_events
                        .insert(Events::WAITER_SERVED_BY_RESTORE);
                }
                if self.sent == Some(delivery.message) {
                    self.state
                        .ghost_events
                        .insert(Events::WAITER_SERVED_BY_SEND);
                }
                if self.dead_lettered_now == Some(delivery.message) {
                    self.state
                        .ghost_events
                        .insert(Events::WAITER_SERVED_BY_DEAD_LETTER_NOW);
                }
            }
            self.answered.push(WaiterAnswer {
                worker: waiter.worker,
                queue,
                delivered,
            });
        }
    }

    /// *DeadLetterMove*: atomic, keeps the receive count, drops the handle, then serves the
    /// dead-letter queue. Also the effect of *DeadLetterNow* (`asked`: the holder of the current
    /// handle asked, which the ghost flag of I7 records).
    fn dead_letter_move(&mut self, id: MessageId, from: QueueId, to: QueueId, asked: bool) {
        let now = self.now();
        if self.model.has(Bug::DeadLetterMoveLoses) {
            let message = self.message_mut(id);
            message.queue = None;
            message.life = None;
            return;
        }
        let message = self.message_mut(id);
        message.queue = Some(to);
        let life = message.life.as_mut().expect("moved messages are stored");
        life.source = Some(from);
        life.state = MessageState::Ready { since: now };
        life.handle = None;
        life.ghost_dead_lettered_now = asked;
        if asked {
            self.dead_lettered_now = Some(id);
            if self.model.has(Bug::DeadLetterNowDoesNotServe) {
                return;
            }
        }
        self.serve(to);
    }

    /// Classifies `handle` presented at `queue`, in the page's order (Delete 1–5). `gone_refusal`
    /// answers step 2 for a visibility change; a delete passes `None` (a repeated delete
    /// succeeds).
    fn classify(
        &self,
        queue: QueueId,
        handle: ReceiptHandle,
        gone_refusal: Option<Refusal>,
    ) -> Result<Classified, Refusal> {
        let id = handle.message;
        if handle.queue != queue || handle.incarnation != self.model.attributes(queue).incarnation {
            return Err(Refusal::ReceiptHandleInvalid {
                reason: InvalidReason::WrongQueue,
            });
        }
        let Some(life) = self.state.stored_in(id, queue) else {
            return match gone_refusal {
                Some(refusal) => Err(refusal),
                None => Ok(Classified::NotInQueue),
            };
        };
        let never_issued = Err(Refusal::ReceiptHandleInvalid {
            reason: InvalidReason::NeverIssued,
        });
        let Some(newest) = life.handle else {
            return never_issued;
        };
        if handle.seq == 0 || handle.seq > life.receive_seq {
            return never_issued;
        }
        if handle.seq < newest {
            return Err(Refusal::StaleReceiptHandle { message_id: id });
        }
        if handle.seq > newest {
            // Issued, yet newer than the newest: impossible while `handle` follows `receive_seq`
            // (I1). A planted bug can get here; refuse rather than delete.
            return never_issued;
        }
        Ok(Classified::Current(id))
    }

    /// Whether `by` presents a handle its own copy marks as superseded.
    fn presents_superseded(&self, by: Option<WorkerId>, handle: ReceiptHandle) -> bool {
        by.and_then(|worker| self.state.workers[worker.index()].held[handle.message.index()])
            .is_some_and(|held| held.handle == handle && held.ghost_superseded)
    }

    fn delete(&mut self, by: Option<WorkerId>, queue: QueueId, handle: ReceiptHandle) -> Outcome {
        match self.classify(queue, handle, None) {
            Err(refusal) => Outcome::Refused(refusal),
            Ok(Classified::NotInQueue) => Outcome::Deleted { already_gone: true },
            Ok(Classified::Current(id)) => {
                if self.presents_superseded(by, handle) {
                    self.state.ghost_deleted_with_stale = true;
                }
                let ready = matches!(
                    self.state.stored_in(id, queue).expect("current").state,
                    MessageState::Ready { .. }
                );
                if ready {
                    self.state
                        .ghost_events
                        .insert(Events::DELETED_AFTER_TIMEOUT);
                }
                if ready && self.model.has(Bug::DeleteLeavesReadyMessage) {
                    self.message_mut(id).gone = Some(Gone::Deleted);
                } else {
                    self.make_gone(id, Gone::Deleted);
                }
                self.message_mut(id).ghost_deleted = true;
                Outcome::Deleted {
                    already_gone: false,
                }
            }
        }
    }

    fn change_visibility(
        &mut self,
        by: WorkerId,
        queue: QueueId,
        handle: ReceiptHandle,
        timeout: Tick,
    ) -> Outcome {
        let not_in_flight = Refusal::MessageNotInFlight {
            message_id: handle.message,
        };
        let id = match self.classify(queue, handle, Some(not_in_flight)) {
            Err(refusal) => return Outcome::Refused(refusal),
            Ok(Classified::NotInQueue) => unreachable!("a visibility change refuses it"),
            Ok(Classified::Current(id)) => id,
        };
        let now = self.now();
        let received_at = self
            .state
            .stored_in(id, queue)
            .and_then(|life| life.received_at)
            .expect("a message with a current handle was received");
        if now + timeout > received_at + VISIBILITY_TOTAL_MAX
            && !self.model.has(Bug::NoVisibilityCap)
        {
            return Outcome::Refused(Refusal::VisibilityCapExceeded { message_id: id });
        }
        if self.presents_superseded(Some(by), handle) {
            self.state.ghost_deleted_with_stale = true;
        }
        if timeout == 0 {
            self.life_mut(id).state = MessageState::Ready { since: now };
            self.serve(queue);
        } else {
            self.life_mut(id).state = MessageState::InFlight {
                until: now + timeout,
            };
        }
        Outcome::VisibilityChanged
    }

    /// *DeadLetterNow*: the redrive policy first, then the handle as a visibility change
    /// classifies it; a current handle moves the message as *DeadLetterMove* does.
    fn dead_letter_now(
        &mut self,
        by: Option<WorkerId>,
        queue: QueueId,
        handle: ReceiptHandle,
    ) -> Outcome {
        // The model's queues always exist, so `DeadLetterQueueMissing` of the page cannot arise.
        let Some(policy) = self.model.attributes(queue).redrive else {
            return Outcome::Refused(Refusal::NoRedrivePolicy { queue });
        };
        let not_in_flight = Refusal::MessageNotInFlight {
            message_id: handle.message,
        };
        let id = match self.classify(queue, handle, Some(not_in_flight)) {
            Ok(Classified::Current(id)) => id,
            Ok(Classified::NotInQueue) => unreachable!("dead-letter-now refuses it"),
            Err(Refusal::StaleReceiptHandle { message_id })
                if self.model.has(Bug::DeadLetterNowAcceptsStale) =>
            {
                message_id
            }
            Err(Refusal::ReceiptHandleInvalid {
                reason: InvalidReason::NeverIssued,
            }) if self.model.has(Bug::DeadLetterNowAcceptsUnissued) => handle.message,
            Err(refusal) => return Outcome::Refused(refusal),
        };
        if self.presents_superseded(by, handle) {
            self.state.ghost_deleted_with_stale = true;
        }
        let ready = matches!(
            self.state.stored_in(id, queue).expect("current").state,
            MessageState::Ready { .. }
        );
        if ready {
            self.state
                .ghost_events
                .insert(Events::DEAD_LETTERED_NOW_AFTER_TIMEOUT);
        }
        if self.model.has(Bug::DeadLetterNowResetsReceiveCount) {
            self.life_mut(id).receive_count = 0;
        }
        self.dead_letter_move(id, queue, policy.dead_letter_queue, true);
        self.state.ghost_dead_letter_nows = self.state.ghost_dead_letter_nows.saturating_add(1);
        // The holder is done with the message. (Other workers keep their superseded handles, as
        // after an automatic move, so a retry with a handle of the old queue is still offered.)
        if let Some(worker) = by {
            self.state.workers[worker.index()].held[id.index()] = None;
        }
        Outcome::DeadLettered {
            dead_letter_queue: policy.dead_letter_queue,
        }
    }

    /// *Redrive*: moves up to `max` ready messages of `from`, in send order (as a receive takes
    /// them), to `to` or to their source, as new lives (receive count reset, `sent_at` kept),
    /// then serves the targets.
    fn redrive(&mut self, from: QueueId, to: Option<QueueId>, max: u8) -> Outcome {
        let now = self.now();
        let mut ready: Vec<(Tick, MessageId, Option<QueueId>)> = self
            .state
            .stored()
            .filter(|(_, q, _)| *q == from)
            .filter_map(|(id, _, life)| match life.state {
                MessageState::Ready { .. } => Some((self.sent_at(id), id, life.source)),
                MessageState::Delayed { .. } | MessageState::InFlight { .. } => None,
            })
            .collect();
        ready.sort();
        let mut moved = 0;
        let mut failed = 0;
        let mut targets = [false; 2];
        for (_, id, source) in ready.into_iter().take(usize::from(max)) {
            let Some(target) = to.or(source) else {
                failed += 1;
                continue;
            };
            let reset_seq = self.model.has(Bug::HandleSeqResetByRedrive);
            let message = self.message_mut(id);
            message.queue = Some(target);
            let life = message.life.as_mut().expect("redriven messages are stored");
            *life = Life {
                state: MessageState::Ready { since: now },
                receive_count: 0,
                // spec-questions.md: the handle sequence survives the redrive, so no handle
                // issued before it can become current again.
                receive_seq: if reset_seq { 0 } else { life.receive_seq },
                first_receive_at: None,
                received_at: life.received_at,
                handle: None,
                source: None,
                ghost_deliveries: 0,
                ghost_dead_lettered_now: false,
            };
            moved += 1;
            targets[target.index()] = true;
            self.state.ghost_events.insert(Events::REDRIVEN);
        }
        for queue in QueueId::ALL {
            if targets[queue.index()] {
                self.serve(queue);
            }
        }
        Outcome::Redriven { moved, failed }
    }

    fn purge(&mut self, queue: QueueId) -> Outcome {
        let purged: Vec<MessageId> = self
            .state
            .stored()
            .filter(|(_, q, _)| *q == queue)
            .map(|(id, _, _)| id)
            .collect();
        let count = u8::try_from(purged.len()).expect("the model has few messages");
        for id in purged {
            self.make_gone(id, Gone::Purged);
        }
        Outcome::Purged { count }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        Action, Delivery, Gone, InvalidReason, MessageId, MessageState, Outcome, QueueCore,
        QueueId, ReceiptHandle, Refusal, Reply, Slot, State, WorkerId,
    };

    const M0: MessageId = MessageId(0);
    const M1: MessageId = MessageId(1);
    const W0: WorkerId = WorkerId(0);
    const W1: WorkerId = WorkerId(1);

    /// Applies `actions` in order, each of which must be enabled, and returns the last state and
    /// every reply.
    fn run(model: &QueueCore, actions: &[Action]) -> (State, Vec<Reply>) {
        let mut state = State::initial();
        let mut replies = Vec::new();
        for action in actions {
            let (next, reply) = model
                .step_with_reply(&state, action)
                .unwrap_or_else(|| panic!("{action:?} is not enabled in {state:?}"));
            state = next;
            replies.push(reply);
        }
        (state, replies)
    }

    fn send(message: MessageId, dedup: bool) -> Action {
        Action::Send {
            queue: QueueId::Q,
            message,
            delay: 0,
            dedup,
        }
    }

    fn receive(worker: WorkerId, visibility: u8) -> Action {
        Action::Receive {
            queue: QueueId::Q,
            worker,
            max: 1,
            visibility,
            wait: 0,
        }
    }

    fn handle(queue: QueueId, message: MessageId, seq: u8) -> ReceiptHandle {
        ReceiptHandle {
            queue,
            incarnation: 1,
            message,
            seq,
        }
    }

    fn delete(by: WorkerId, seq: u8) -> Action {
        Action::Delete {
            by: Some(by),
            queue: QueueId::Q,
            handle: handle(QueueId::Q, M0, seq),
        }
    }

    fn delivered(reply: &Reply) -> &[Delivery] {
        match &reply.outcome {
            Outcome::Received { delivered } => delivered,
            other => panic!("not a receive: {other:?}"),
        }
    }

    #[test]
    fn a_message_whose_visibility_expired_comes_back_before_one_sent_after_it() {
        let model = QueueCore::default();
        // M0 is sent at 0 and received until 2; M1 is sent at 1 and ready since then, M0 ready
        // again since 2. Receives follow the send order, not the order messages became ready.
        let (_, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 2),
                Action::Tick,
                send(M1, false),
                Action::Tick,
                Action::Receive {
                    queue: QueueId::Q,
                    worker: W1,
                    max: 2,
                    visibility: 2,
                    wait: 0,
                },
            ],
        );
        let order: Vec<MessageId> = delivered(&replies[5]).iter().map(|d| d.message).collect();
        assert_eq!(order, [M0, M1]);
    }

    #[test]
    fn visibility_zero_is_restored_by_the_next_action_in_the_same_tick() {
        let model = QueueCore::default();
        let (state, replies) = run(&model, &[send(M0, false), receive(W0, 0), receive(W1, 2)]);
        assert_eq!(delivered(&replies[2])[0].handle, handle(QueueId::Q, M0, 2));
        assert_eq!(state.now, 0);
    }

    #[test]
    fn newest_handle_deletes_after_the_visibility_timeout_expired() {
        let model = QueueCore::default();
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 2),
                Action::Tick,
                Action::Tick,
                delete(W0, 1),
            ],
        );
        assert_eq!(
            replies[4].outcome,
            Outcome::Deleted {
                already_gone: false
            }
        );
        assert_eq!(state.message(M0).unwrap().gone, Some(Gone::Deleted));
    }

    #[test]
    fn delete_with_superseded_handle_is_refused() {
        let model = QueueCore::default();
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 0),
                receive(W1, 2),
                delete(W0, 1),
                delete(W1, 2),
            ],
        );
        assert_eq!(
            replies[3].outcome,
            Outcome::Refused(Refusal::StaleReceiptHandle { message_id: M0 })
        );
        assert_eq!(
            replies[4].outcome,
            Outcome::Deleted {
                already_gone: false
            }
        );
        assert!(!state.ghost_deleted_with_stale);
    }

    #[test]
    fn repeated_delete_succeeds_as_already_gone() {
        let model = QueueCore::default();
        let (_, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 2),
                delete(W0, 1),
                Action::Delete {
                    by: None,
                    queue: QueueId::Q,
                    handle: handle(QueueId::Q, M0, 1),
                },
            ],
        );
        assert_eq!(replies[3].outcome, Outcome::Deleted { already_gone: true });
    }

    #[test]
    fn never_issued_and_wrong_queue_handles_are_refused() {
        let model = QueueCore::default();
        let forged = |seq| Action::Delete {
            by: None,
            queue: QueueId::Q,
            handle: handle(QueueId::Q, M0, seq),
        };
        let (_, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 2),
                forged(0),
                forged(2),
                Action::Delete {
                    by: Some(W0),
                    queue: QueueId::D,
                    handle: handle(QueueId::Q, M0, 1),
                },
            ],
        );
        let never_issued = Outcome::Refused(Refusal::ReceiptHandleInvalid {
            reason: InvalidReason::NeverIssued,
        });
        assert_eq!(replies[2].outcome, never_issued);
        assert_eq!(replies[3].outcome, never_issued);
        assert_eq!(
            replies[4].outcome,
            Outcome::Refused(Refusal::ReceiptHandleInvalid {
                reason: InvalidReason::WrongQueue
            })
        );
    }

    #[test]
    fn a_send_within_the_dedup_window_replies_with_the_first_message() {
        let model = QueueCore::default();
        let (state, replies) = run(&model, &[send(M0, true), Action::Tick, send(M1, true)]);
        assert_eq!(
            replies[2].outcome,
            Outcome::Sent {
                message: M0,
                duplicate: true
            }
        );
        assert_eq!(state.messages[1], Slot::Duplicate { of: M0 });
    }

    #[test]
    fn a_send_after_the_dedup_window_is_stored() {
        let model = QueueCore::default();
        let (state, _) = run(
            &model,
            &[send(M0, true), Action::Tick, Action::Tick, send(M1, true)],
        );
        assert_eq!(state.message(M1).unwrap().queue, Some(QueueId::Q));
    }

    #[test]
    fn dead_letter_move_keeps_the_receive_count_and_drops_the_handle() {
        let model = QueueCore::default();
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 0),
                receive(W1, 0),
                receive(W0, 0),
            ],
        );
        assert!(delivered(&replies[3]).is_empty());
        let moved = state.message(M0).unwrap();
        assert_eq!(moved.queue, Some(QueueId::D));
        let life = moved.life.unwrap();
        assert_eq!(life.receive_count, 2);
        assert_eq!(life.handle, None);
        assert_eq!(life.source, Some(QueueId::Q));
    }

    #[test]
    fn redrive_resets_the_receive_count_but_not_the_handle_sequence() {
        let model = QueueCore::default();
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 0),
                receive(W1, 0),
                receive(W0, 0),
                Action::Redrive {
                    from: QueueId::D,
                    to: None,
                    max: 2,
                },
                receive(W1, 2),
                delete(W0, 1),
            ],
        );
        assert_eq!(
            replies[4].outcome,
            Outcome::Redriven {
                moved: 1,
                failed: 0
            }
        );
        let delivery = delivered(&replies[5])[0];
        assert_eq!(delivery.receive_count, 1);
        assert_eq!(delivery.handle.seq, 3);
        assert_eq!(
            replies[6].outcome,
            Outcome::Refused(Refusal::StaleReceiptHandle { message_id: M0 })
        );
        assert_eq!(state.message(M0).unwrap().queue, Some(QueueId::Q));
    }

    #[test]
    fn a_waiter_is_served_by_the_send_that_makes_a_message_ready() {
        let model = QueueCore::default();
        let long_poll = Action::Receive {
            queue: QueueId::Q,
            worker: W0,
            max: 2,
            visibility: 2,
            wait: 2,
        };
        let (state, replies) = run(&model, &[long_poll, send(M0, false)]);
        assert_eq!(replies[0].outcome, Outcome::Waiting);
        assert_eq!(replies[1].answered.len(), 1);
        assert_eq!(replies[1].answered[0].worker, W0);
        assert_eq!(replies[1].answered[0].delivered[0].message, M0);
        assert!(!state.is_waiting(W0));
    }

    #[test]
    fn a_waiter_past_its_deadline_is_answered_empty() {
        let model = QueueCore::default();
        let long_poll = Action::Receive {
            queue: QueueId::Q,
            worker: W0,
            max: 2,
            visibility: 2,
            wait: 2,
        };
        let (state, replies) = run(&model, &[long_poll, Action::Tick, Action::Tick]);
        assert!(replies[1].answered.is_empty());
        assert_eq!(replies[2].answered.len(), 1);
        assert!(replies[2].answered[0].delivered.is_empty());
        assert!(!state.is_waiting(W0));
    }

    #[test]
    fn a_visibility_change_past_the_cap_is_refused() {
        let model = QueueCore::default();
        let change = |timeout| Action::ChangeVisibility {
            by: W0,
            queue: QueueId::Q,
            handle: handle(QueueId::Q, M0, 1),
            timeout,
        };
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 2),
                Action::Tick,
                change(2),
                Action::Tick,
                change(2),
            ],
        );
        assert_eq!(replies[3].outcome, Outcome::VisibilityChanged);
        assert_eq!(
            replies[5].outcome,
            Outcome::Refused(Refusal::VisibilityCapExceeded { message_id: M0 })
        );
        let life = state.message(M0).unwrap().life.unwrap();
        assert_eq!(life.state, MessageState::InFlight { until: 3 });
    }

    #[test]
    fn retention_expires_an_in_flight_message() {
        let model = QueueCore::default();
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                Action::Tick,
                Action::Tick,
                Action::Tick,
                receive(W0, 2),
                Action::Tick,
                // The worker's copy of a gone message's handle is dropped; the model offers the
                // repeated delete without a holder.
                Action::Delete {
                    by: None,
                    queue: QueueId::Q,
                    handle: handle(QueueId::Q, M0, 1),
                },
            ],
        );
        assert_eq!(state.message(M0).unwrap().gone, Some(Gone::Expired));
        assert_eq!(replies[6].outcome, Outcome::Deleted { already_gone: true });
    }

    fn dead_letter_now(by: WorkerId, queue: QueueId, handle: ReceiptHandle) -> Action {
        Action::DeadLetterNow {
            by: Some(by),
            queue,
            handle,
        }
    }

    #[test]
    fn dead_letter_now_moves_the_message_with_its_receive_count_and_serves_a_waiter() {
        let model = QueueCore::default();
        let long_poll = Action::Receive {
            queue: QueueId::D,
            worker: W1,
            max: 2,
            visibility: 2,
            wait: 2,
        };
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                long_poll,
                receive(W0, 2),
                dead_letter_now(W0, QueueId::Q, handle(QueueId::Q, M0, 1)),
            ],
        );
        assert_eq!(
            replies[3].outcome,
            Outcome::DeadLettered {
                dead_letter_queue: QueueId::D
            }
        );
        let served = &replies[3].answered;
        assert_eq!((served[0].worker, served[0].queue), (W1, QueueId::D));
        let delivery = served[0].delivered[0];
        assert_eq!(
            (
                delivery.message,
                delivery.receive_count,
                delivery.handle.seq,
                delivery.source
            ),
            (M0, 2, 2, Some(QueueId::Q))
        );
        let life = state.message(M0).unwrap().life.unwrap();
        assert_eq!(life.first_receive_at, Some(0));
        assert!(life.ghost_dead_lettered_now);
        assert_eq!(state.workers[W0.index()].held[M0.index()], None);
    }

    #[test]
    fn dead_letter_now_refuses_stale_moved_and_policy_less_handles() {
        let model = QueueCore::default();
        let first = handle(QueueId::Q, M0, 1);
        let (state, replies) = run(
            &model,
            &[
                send(M0, false),
                receive(W0, 0),
                receive(W1, 2),
                dead_letter_now(W0, QueueId::Q, first),
                dead_letter_now(W1, QueueId::Q, handle(QueueId::Q, M0, 2)),
                Action::Receive {
                    queue: QueueId::D,
                    worker: W1,
                    max: 1,
                    visibility: 2,
                    wait: 0,
                },
                dead_letter_now(W1, QueueId::D, handle(QueueId::D, M0, 3)),
                change_visibility_to_zero(W0, first),
            ],
        );
        assert_eq!(
            replies[3].outcome,
            Outcome::Refused(Refusal::StaleReceiptHandle { message_id: M0 })
        );
        assert_eq!(
            replies[6].outcome,
            Outcome::Refused(Refusal::NoRedrivePolicy { queue: QueueId::D })
        );
        assert_eq!(
            replies[7].outcome,
            Outcome::Refused(Refusal::MessageNotInFlight { message_id: M0 })
        );
        assert!(!state.ghost_deleted_with_stale);
        assert_eq!(state.message(M0).unwrap().queue, Some(QueueId::D));
    }

    fn change_visibility_to_zero(by: WorkerId, handle: ReceiptHandle) -> Action {
        Action::ChangeVisibility {
            by,
            queue: handle.queue,
            handle,
            timeout: 0,
        }
    }

    #[test]
    fn an_action_that_is_not_enabled_is_not_a_step() {
        let model = QueueCore::default();
        let (state, _) = run(&model, &[send(M0, false)]);
        assert_eq!(model.step(&state, &send(M0, false)), None);
        assert_eq!(model.step_with_reply(&state, &delete(W0, 1)), None);
    }
}
