//! The model's actions (`spec/queue-core.md#actions`) and the replies a step gives, so a
//! conformance test can compare the model's answer with the core's, action by action.

use super::state::{MessageId, QueueId, ReceiptHandle, Tick, WorkerId};

/// One action of the model. Every action but `Tick` happens at the current time; each first
/// advances time to it (which fires what is due at that instant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `Send(queue, message, delay, dedup)`; `dedup` says whether the send carries the model's one
    /// deduplication id.
    Send {
        /// Target queue.
        queue: QueueId,
        /// The new message id.
        message: MessageId,
        /// Delay in ticks.
        delay: Tick,
        /// Whether the deduplication id is set.
        dedup: bool,
    },
    /// `Receive(queue, worker, max, visibility, wait)`.
    Receive {
        /// Queue to receive from.
        queue: QueueId,
        /// Who receives (and holds the handles).
        worker: WorkerId,
        /// Most messages to deliver.
        max: u8,
        /// Visibility timeout of delivered messages.
        visibility: Tick,
        /// Long-poll wait; 0 answers at once.
        wait: Tick,
    },
    /// `Delete(queue, handle)`. `by` names the worker presenting a handle it holds (the ghost
    /// check of I2 needs it); `None` for a forged handle nobody was issued.
    Delete {
        /// The worker presenting a held handle, if any.
        by: Option<WorkerId>,
        /// The queue the request names.
        queue: QueueId,
        /// The handle presented.
        handle: ReceiptHandle,
    },
    /// `ChangeVisibility(queue, handle, timeout)` with a handle `by` holds.
    ChangeVisibility {
        /// The worker presenting the handle.
        by: WorkerId,
        /// The queue the request names.
        queue: QueueId,
        /// The handle presented.
        handle: ReceiptHandle,
        /// New visibility timeout from now.
        timeout: Tick,
    },
    /// `DeadLetterNow(queue, handle)`: the holder of the current handle moves the message to
    /// the queue's dead-letter queue at once. `by` names the worker presenting a handle it
    /// holds (the ghost check of I2 needs it); `None` for a forged handle nobody was issued.
    DeadLetterNow {
        /// The worker presenting a held handle, if any.
        by: Option<WorkerId>,
        /// The queue the request names.
        queue: QueueId,
        /// The handle presented.
        handle: ReceiptHandle,
    },
    /// Advance time by one tick.
    Tick,
    /// `Redrive(from, to, max)`: move ready messages out of a dead-letter queue.
    Redrive {
        /// The dead-letter queue.
        from: QueueId,
        /// Named target, or `None` for each message's source.
        to: Option<QueueId>,
        /// Most messages to move.
        max: u8,
    },
    /// `Purge(queue)`.
    Purge {
        /// The queue to empty.
        queue: QueueId,
    },
    /// The client of a long poll went away.
    CancelWaiter {
        /// The waiting worker.
        worker: WorkerId,
    },
    /// End the free phase; only the fair consumer acts afterwards.
    Settle,
}

/// Why `ReceiptHandleInvalid` was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The handle names another queue or another incarnation of this one.
    WrongQueue,
    /// No receive issued this handle.
    NeverIssued,
}

/// An expected refusal; nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The handle is not valid for this queue.
    ReceiptHandleInvalid {
        /// Which check refused it.
        reason: InvalidReason,
    },
    /// A later receive superseded the handle.
    StaleReceiptHandle {
        /// The message it names.
        message_id: MessageId,
    },
    /// Change visibility of a message that is no longer in the queue.
    MessageNotInFlight {
        /// The message it names.
        message_id: MessageId,
    },
    /// The new timeout would end later than the visibility cap after the latest receive.
    VisibilityCapExceeded {
        /// The message it names.
        message_id: MessageId,
    },
    /// Dead-letter now at a queue without a redrive policy: there is nowhere to move to.
    NoRedrivePolicy {
        /// The queue the request named.
        queue: QueueId,
    },
}

/// One delivered message, as the caller of a receive gets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// The message.
    pub message: MessageId,
    /// Its new receipt handle.
    pub handle: ReceiptHandle,
    /// Its receive count, this receive included.
    pub receive_count: u8,
    /// Time of the original send.
    pub sent_at: Tick,
    /// Time of the first receive of this life.
    pub first_receive_at: Option<Tick>,
    /// The queue it was moved from into a dead-letter queue.
    pub source: Option<QueueId>,
}

/// The answer a waiter got during the step: messages when served, nothing at its deadline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WaiterAnswer {
    /// The worker that was waiting.
    pub worker: WorkerId,
    /// The queue it waited on.
    pub queue: QueueId,
    /// What it got; empty when answered at its deadline.
    pub delivered: Vec<Delivery>,
}

/// The direct answer to an action.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A send; `message` is the id replied (the first message's id when `duplicate`).
    Sent {
        /// Id in the reply.
        message: MessageId,
        /// Whether the deduplication entry matched and nothing was stored.
        duplicate: bool,
    },
    /// A receive that answered at once (possibly empty).
    Received {
        /// The delivered messages.
        delivered: Vec<Delivery>,
    },
    /// A receive that became a waiter.
    Waiting,
    /// A delete that succeeded.
    Deleted {
        /// The message was no longer in the queue.
        already_gone: bool,
    },
    /// A visibility change that succeeded.
    VisibilityChanged,
    /// A dead-letter-now that moved the message.
    DeadLettered {
        /// Where it went.
        dead_letter_queue: QueueId,
    },
    /// A redrive.
    Redriven {
        /// Messages moved.
        moved: u8,
        /// Messages whose target did not exist.
        failed: u8,
    },
    /// A purge.
    Purged {
        /// Messages made gone.
        count: u8,
    },
    /// Time advanced.
    Ticked,
    /// A waiter was cancelled.
    WaiterCancelled,
    /// The free phase ended.
    Settled,
    /// An expected refusal; nothing changed.
    Refused(Refusal),
}

/// Everything a step answered: the direct outcome, and the waiters it answered on the way.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reply {
    /// The answer to the action itself.
    pub outcome: Outcome,
    /// Waiters served or answered empty during the step, in the order it happened.
    pub answered: Vec<WaiterAnswer>,
}
