//! `Reject`: every expected refusal of a command, as a value the caller can act on. A refused
//! command changes nothing (time still advances). A broken invariant is not a `Reject`: it is a
//! bug and the code asserts it. The edge translates each variant to its SQS code and gRPC status
//! once; this module knows nothing of either.

use thiserror::Error;

use crate::ids::{MessageId, QueueName, WaiterId};

/// Why a receipt handle was refused although it decoded and authenticated at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleProblem {
    /// The handle names another queue, or another creation of this queue's name.
    WrongQueue,
    /// No receive ever issued this handle: `seq` is 0, beyond the message's receive count, or
    /// the message has not been received in its current queue.
    NeverIssued,
}

/// A command refused, saying what was wrong for the caller.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Reject {
    /// The queue named by the command does not exist.
    #[error("queue {name} does not exist")]
    QueueNotFound { name: QueueName },
    /// A queue of this name exists with different attributes.
    #[error("queue {name} already exists with different attributes")]
    QueueNameExists { name: QueueName },
    /// A queue of this name was deleted less than 60 s ago.
    #[error("queue {name} was deleted less than 60 s ago")]
    QueueDeletedRecently { name: QueueName },
    /// The node holds as many queues as it may.
    #[error("no more than {max} queues")]
    QueueLimit { max: usize },
    /// A queue attribute is out of its range or inconsistent with the other queues.
    #[error("attribute {attribute}: {reason}")]
    InvalidAttribute {
        attribute: &'static str,
        reason: String,
    },
    /// A command parameter is out of its range.
    #[error("parameter {parameter}: {reason}")]
    InvalidParameter {
        parameter: &'static str,
        reason: String,
    },
    /// The message body holds characters SQS does not allow, or is empty.
    #[error("message body: {reason}")]
    InvalidMessageContents { reason: String },
    /// Body and attributes together exceed the queue's `MaximumMessageSize`.
    #[error("message is {size_bytes} bytes, the queue allows {max_bytes}")]
    MessageTooLong { size_bytes: u64, max_bytes: u32 },
    /// A message with this id is stored already (ids are the caller's and must be unique).
    #[error("message id {message} is already stored")]
    MessageIdExists { message: MessageId },
    /// The receipt handle cannot refer to a receive of a message of this queue.
    #[error("receipt handle is invalid: {reason:?}")]
    ReceiptHandleInvalid { reason: HandleProblem },
    /// A later receive superseded this receipt handle.
    #[error("receipt handle of message {message} was superseded by a later receive")]
    StaleReceiptHandle { message: MessageId },
    /// A visibility change or a dead-letter-now named a message that is no longer in the queue.
    #[error("message {message} is no longer in the queue (deleted, expired, purged or moved)")]
    MessageNotInFlight { message: MessageId },
    /// A dead-letter-now named a queue without a redrive policy: there is nowhere to move to.
    #[error("queue {name} has no redrive policy, so no dead-letter queue")]
    NoRedrivePolicy { name: QueueName },
    /// A dead-letter-now named a queue whose redrive policy names a queue that does not exist
    /// (the policy is inert until it exists again).
    #[error("the dead-letter queue {dead_letter_queue} of queue {name} does not exist")]
    DeadLetterQueueMissing {
        name: QueueName,
        dead_letter_queue: QueueName,
    },
    /// The new visibility deadline would lie more than 12 h after the receive.
    #[error(
        "visibility of message {message} would end {requested_until_ms} ms, after the 12 h cap at {cap_ms} ms"
    )]
    VisibilityCapExceeded {
        message: MessageId,
        requested_until_ms: u64,
        cap_ms: u64,
    },
    /// The queue was purged less than 60 s ago.
    #[error("queue {name} was purged recently; retry in {retry_after_ms} ms")]
    PurgeInProgress {
        name: QueueName,
        retry_after_ms: u64,
    },
    /// The dead-letter queue's redrive-allow policy does not admit this source queue.
    #[error("queue {dead_letter_queue} does not allow {source_queue} as a dead-letter source")]
    RedriveNotAllowed {
        source_queue: QueueName,
        dead_letter_queue: QueueName,
    },
    /// The queue has as many in-flight messages as it may.
    #[error("queue {name} has {max} messages in flight")]
    InflightLimit { name: QueueName, max: u64 },
    /// The queue has as many open long polls as it may.
    #[error("queue {name} has {max} open long polls")]
    WaiterLimit { name: QueueName, max: usize },
    /// A waiter with this id is already open.
    #[error("{waiter} is already waiting")]
    WaiterExists { waiter: WaiterId },
}
