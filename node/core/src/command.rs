//! What goes into `Queues::apply` (`Command`) and what comes out (`Step`: the command's result
//! and the long polls answered meanwhile). Plain data; no behaviour lives here.

use std::collections::{BTreeMap, BTreeSet};

use crate::attributes::{AttributeChanges, QueueAttributes};
use crate::error::Reject;
use crate::ids::{DedupId, MessageId, Millis, QueueName, QueuePrefixes, ReceiptHandle, WaiterId};
use crate::message::{AttributeValue, SystemAttributes};

/// One action of spec/queue-core.md#actions, as the edge built it from a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Create a queue, or confirm one that exists with identical attributes.
    CreateQueue {
        name: QueueName,
        attributes: QueueAttributes,
        tags: BTreeMap<String, String>,
    },
    /// Change some attributes of a queue; applies to future actions only.
    SetQueueAttributes {
        name: QueueName,
        changes: AttributeChanges,
    },
    /// Delete a queue, its messages and its waiters; the name stays unavailable for 60 s.
    DeleteQueue { name: QueueName },
    /// Make every message of a queue gone; at most once per 60 s.
    PurgeQueue { name: QueueName },
    /// Add or replace tags.
    TagQueue {
        name: QueueName,
        tags: BTreeMap<String, String>,
    },
    /// Remove tags by key (absent keys are ignored).
    UntagQueue {
        name: QueueName,
        keys: BTreeSet<String>,
    },
    /// Store a message (or answer a duplicate within the deduplication window).
    Send {
        queue: QueueName,
        id: MessageId,
        body: String,
        attributes: BTreeMap<String, AttributeValue>,
        /// The trace header and group id the sender set, kept with the body.
        system: SystemAttributes,
        delay_s: Option<u32>,
        dedup: Option<DedupId>,
    },
    /// Receive up to `max` ready messages; with a wait, become a waiter when none is ready.
    Receive {
        queue: QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
        waiter: WaiterId,
    },
    /// The client of a waiter went away: remove it without an answer.
    CancelWaiter { waiter: WaiterId },
    /// Delete a message by its receipt handle.
    Delete {
        queue: QueueName,
        handle: ReceiptHandle,
    },
    /// Set a received message's visibility deadline to `timeout_s` from now.
    ChangeVisibility {
        queue: QueueName,
        handle: ReceiptHandle,
        timeout_s: u32,
    },
    /// Move a received message to its queue's dead-letter queue at once, by its current
    /// receipt handle (spec/queue-core.md#deadletternowq-handle): it keeps its id, receive
    /// count, first receive and send time, and its source becomes `queue`.
    DeadLetterNow {
        queue: QueueName,
        handle: ReceiptHandle,
    },
    /// Move up to `max` ready messages out of the dead-letter queue `from`, to `to` or to each
    /// message's source; with `allowed`, only into queues within it (the others stay, counted
    /// as failed).
    Redrive {
        from: QueueName,
        to: Option<QueueName>,
        max: u32,
        allowed: Option<QueuePrefixes>,
    },
}

/// A message handed to a consumer by a receive (direct or a served waiter). It carries what the
/// state holds at the moment of delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The queue it was received from.
    pub queue: QueueName,
    /// The message's id.
    pub message: MessageId,
    /// The newest receipt handle, issued by this receive.
    pub handle: ReceiptHandle,
    /// The body, as sent.
    pub body: String,
    /// The message attributes, as sent.
    pub attributes: BTreeMap<String, AttributeValue>,
    /// The system attributes, as sent.
    pub system: SystemAttributes,
    /// Receive count including this receive.
    pub receive_count: u32,
    /// When the message was originally sent.
    pub sent_at: Millis,
    /// When the first receive delivered it (this one, if it is the first).
    pub first_receive_at: Millis,
    /// The queue it was dead-lettered from, if any.
    pub source: Option<QueueName>,
}

/// What a command did when it succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `created` is false when the queue already existed with identical attributes.
    QueueCreated { created: bool },
    /// Set attributes, delete queue, purge, tag, untag, cancel waiter.
    Done,
    /// The message is stored, or `duplicate`: the deduplication window held `id` already.
    Sent { id: MessageId, duplicate: bool },
    /// Messages delivered now; empty only when the receive did not wait.
    Received(Vec<Delivery>),
    /// Nothing was ready: the receive is a waiter now, answered later by a `Wakeup`.
    Waiting { waiter: WaiterId },
    /// The message is gone; `already_gone` when it was gone before this delete.
    Deleted { already_gone: bool },
    /// The visibility deadline was changed.
    VisibilityChanged,
    /// The message moved to `dead_letter_queue` (or, already past that queue's retention, is
    /// gone `Expired` on arrival, as for every move).
    DeadLettered { dead_letter_queue: QueueName },
    /// Messages moved out of the dead-letter queue, and those whose target was missing.
    Redriven { moved: u32, failed: u32 },
}

/// The answer to a waiter, produced by whichever action ended its wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// A message became ready and the waiter received it (and possibly more).
    Served {
        waiter: WaiterId,
        deliveries: Vec<Delivery>,
    },
    /// The deadline passed, or the queue was deleted, with nothing delivered.
    Empty { waiter: WaiterId },
}

impl Wakeup {
    /// The waiter this answers.
    #[must_use]
    pub fn waiter(&self) -> WaiterId {
        match self {
            Wakeup::Served { waiter, .. } | Wakeup::Empty { waiter } => *waiter,
        }
    }
}

/// Everything one `apply` produced: the command's own result and every waiter answered by the
/// time advance before it or by the command itself, in the order they were answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The command's result. A refusal changed nothing but the time.
    pub result: Result<Outcome, Reject>,
    /// Waiters answered during this step.
    pub wakeups: Vec<Wakeup>,
}
