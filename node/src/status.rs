//! The one place that turns the node's errors into gRPC statuses and batch-entry errors, as the
//! header of `proto/trireme/v1/queue.proto` promises: INVALID_ARGUMENT names the field and its
//! limit, NOT_FOUND a missing queue, ALREADY_EXISTS a queue created with other attributes,
//! FAILED_PRECONDITION a stale or invalid receipt handle, RESOURCE_EXHAUSTED an in-flight or
//! purge limit. Batch entries carry SQS's error codes instead, read from the SQS endpoint's
//! one table (`sqs::reject_code`).
//!
//! Several refusals share a gRPC code, so every status built here also carries its [`Reason`]
//! as the ASCII metadata entry `trireme-reason`, and a refusal of one request field names it in
//! `trireme-field`. Both are part of the API (the proto's header lists the reasons): a client
//! tells refusals apart by them, never by the wording of the message, which may change.
//!
//! This module must never decide whether something is an error; it only translates.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use trireme_core::{HandleProblem, Reject};
use trireme_proto::v1::BatchEntryError;

use crate::engine::EngineError;
use crate::fault::FaultKind;
use crate::handle::HandleError;
use crate::redrive::RedriveError;

/// The metadata key of a status's [`Reason`].
pub const REASON_KEY: &str = "trireme-reason";

/// The metadata key of the request field (or queue attribute, or command parameter) a refusal
/// is about, when it is about one.
pub const FIELD_KEY: &str = "trireme-field";

/// Why a call was refused, stable across releases: the value of `trireme-reason`. The names
/// are the core's `Reject` variants where one exists; the edge, the engine and redrive add
/// their own. Several reasons may share a gRPC code; a reason never changes its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// NOT_FOUND: the queue named by the call does not exist.
    QueueNotFound,
    /// ALREADY_EXISTS: a queue of this name exists with different attributes.
    QueueNameExists,
    /// FAILED_PRECONDITION: a queue of this name was deleted less than 60 s ago.
    QueueDeletedRecently,
    /// RESOURCE_EXHAUSTED: the node holds as many queues as it may.
    QueueLimit,
    /// INVALID_ARGUMENT: a request field failed the edge's checks; `trireme-field` names it.
    InvalidField,
    /// INVALID_ARGUMENT: a queue attribute is out of range or inconsistent; `trireme-field`
    /// names the attribute.
    InvalidAttribute,
    /// INVALID_ARGUMENT: a command parameter is out of range; `trireme-field` names it.
    InvalidParameter,
    /// INVALID_ARGUMENT: the message body is empty or holds characters SQS does not allow.
    InvalidMessageContents,
    /// INVALID_ARGUMENT: body and attributes exceed the queue's maximum message size.
    MessageTooLong,
    /// INVALID_ARGUMENT: the visibility would end more than 12 h after the receive.
    VisibilityCapExceeded,
    /// FAILED_PRECONDITION: the receipt handle did not decode or authenticate.
    ReceiptHandleMalformed,
    /// FAILED_PRECONDITION: the receipt handle belongs to another queue, or to an earlier queue
    /// of this name.
    ReceiptHandleWrongQueue,
    /// FAILED_PRECONDITION: no receive issued this receipt handle.
    ReceiptHandleNeverIssued,
    /// FAILED_PRECONDITION: a later receive superseded the receipt handle.
    StaleReceiptHandle,
    /// FAILED_PRECONDITION: the message is gone or not in flight, so its visibility cannot change.
    MessageNotInFlight,
    /// FAILED_PRECONDITION: the dead-letter queue's redrive-allow policy does not admit the source.
    RedriveNotAllowed,
    /// FAILED_PRECONDITION: a dead-letter-now named a queue without a redrive policy.
    NoRedrivePolicy,
    /// FAILED_PRECONDITION: a dead-letter-now named a queue whose dead-letter queue does not
    /// exist.
    DeadLetterQueueMissing,
    /// FAILED_PRECONDITION: a redrive names a queue that is no queue's dead-letter queue, and no
    /// destination.
    NotADeadLetterQueue,
    /// FAILED_PRECONDITION: a redrive task already moves messages out of this queue.
    RedriveAlreadyRunning,
    /// FAILED_PRECONDITION: the redrive task to cancel has finished.
    RedriveNotRunning,
    /// NOT_FOUND: no redrive task has this handle.
    RedriveTaskNotFound,
    /// RESOURCE_EXHAUSTED: the queue was purged less than 60 s ago.
    PurgeInProgress,
    /// RESOURCE_EXHAUSTED: the queue has as many in-flight messages as it may.
    InflightLimit,
    /// RESOURCE_EXHAUSTED: the queue has as many open long polls as it may.
    WaiterLimit,
    /// RESOURCE_EXHAUSTED: as many redrive tasks run as the node allows.
    RedriveTaskLimit,
    /// UNAVAILABLE: the node is shutting down and takes no more commands.
    ShuttingDown,
    /// RESOURCE_EXHAUSTED: the node's engine has as many commands waiting as it may; nothing
    /// changed, and the call may be retried after a pause. In a cluster, two of the replicas
    /// the call needs answered that they are overloaded (spec/replication.md#durability): the
    /// call may have taken effect on one, as with `ReplicasUnavailable`.
    Overloaded,
    /// UNAVAILABLE: in a cluster, the replicas the call needs did not answer in time; it may
    /// still have taken effect.
    ReplicasUnavailable,
    /// UNIMPLEMENTED: in a cluster, an action this version serves only on a node running alone.
    NotServedByCluster,
    /// INTERNAL: a write or fsync of the node's storage failed; the change is not durable.
    StorageFailed,
    /// RESOURCE_EXHAUSTED: the node's disk is full; the change is not durable.
    DiskFull,
    /// DATA_LOSS: a stored record of the node is corrupt; the change is not durable.
    StorageCorrupt,
    /// INTERNAL: a message id drawn by the node collided (a bug of the node).
    MessageIdExists,
    /// INTERNAL: a waiter id drawn by the node was reused (a bug of the node).
    WaiterExists,
    /// UNAUTHENTICATED: the node requires a bearer token and the call carries none (or its
    /// `authorization` is not `Bearer <token>`).
    TokenMissing,
    /// UNAUTHENTICATED: the call's bearer token is not one the node accepts.
    TokenRefused,
}

impl Reason {
    /// The reason as it appears in `trireme-reason`: its name, ASCII letters only.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::QueueNotFound => "QueueNotFound",
            Reason::QueueNameExists => "QueueNameExists",
            Reason::QueueDeletedRecently => "QueueDeletedRecently",
            Reason::QueueLimit => "QueueLimit",
            Reason::InvalidField => "InvalidField",
            Reason::InvalidAttribute => "InvalidAttribute",
            Reason::InvalidParameter => "InvalidParameter",
            Reason::InvalidMessageContents => "InvalidMessageContents",
            Reason::MessageTooLong => "MessageTooLong",
            Reason::VisibilityCapExceeded => "VisibilityCapExceeded",
            Reason::ReceiptHandleMalformed => "ReceiptHandleMalformed",
            Reason::ReceiptHandleWrongQueue => "ReceiptHandleWrongQueue",
            Reason::ReceiptHandleNeverIssued => "ReceiptHandleNeverIssued",
            Reason::StaleReceiptHandle => "StaleReceiptHandle",
            Reason::MessageNotInFlight => "MessageNotInFlight",
            Reason::RedriveNotAllowed => "RedriveNotAllowed",
            Reason::NoRedrivePolicy => "NoRedrivePolicy",
            Reason::DeadLetterQueueMissing => "DeadLetterQueueMissing",
            Reason::NotADeadLetterQueue => "NotADeadLetterQueue",
            Reason::RedriveAlreadyRunning => "RedriveAlreadyRunning",
            Reason::RedriveNotRunning => "RedriveNotRunning",
            Reason::RedriveTaskNotFound => "RedriveTaskNotFound",
            Reason::PurgeInProgress => "PurgeInProgress",
            Reason::InflightLimit => "InflightLimit",
            Reason::WaiterLimit => "WaiterLimit",
            Reason::RedriveTaskLimit => "RedriveTaskLimit",
            Reason::ShuttingDown => "ShuttingDown",
            Reason::Overloaded => "Overloaded",
            Reason::ReplicasUnavailable => "ReplicasUnavailable",
            Reason::NotServedByCluster => "NotServedByCluster",
            Reason::StorageFailed => "StorageFailed",
            Reason::DiskFull => "DiskFull",
            Reason::StorageCorrupt => "StorageCorrupt",
            Reason::MessageIdExists => "MessageIdExists",
            Reason::WaiterExists => "WaiterExists",
            Reason::TokenMissing => "TokenMissing",
            Reason::TokenRefused => "TokenRefused",
        }
    }

    /// The gRPC code every status with this reason has.
    #[must_use]
    pub fn code(self) -> Code {
        match self {
            Reason::QueueNotFound | Reason::RedriveTaskNotFound => Code::NotFound,
            Reason::QueueNameExists => Code::AlreadyExists,
            Reason::InvalidField
            | Reason::InvalidAttribute
            | Reason::InvalidParameter
            | Reason::InvalidMessageContents
            | Reason::MessageTooLong
            | Reason::VisibilityCapExceeded => Code::InvalidArgument,
            Reason::QueueDeletedRecently
            | Reason::ReceiptHandleMalformed
            | Reason::ReceiptHandleWrongQueue
            | Reason::ReceiptHandleNeverIssued
            | Reason::StaleReceiptHandle
            | Reason::MessageNotInFlight
            | Reason::RedriveNotAllowed
            | Reason::NoRedrivePolicy
            | Reason::DeadLetterQueueMissing
            | Reason::NotADeadLetterQueue
            | Reason::RedriveAlreadyRunning
            | Reason::RedriveNotRunning => Code::FailedPrecondition,
            Reason::QueueLimit
            | Reason::PurgeInProgress
            | Reason::InflightLimit
            | Reason::WaiterLimit
            | Reason::RedriveTaskLimit => Code::ResourceExhausted,
            Reason::ShuttingDown | Reason::ReplicasUnavailable => Code::Unavailable,
            Reason::DiskFull => Code::ResourceExhausted,
            Reason::Overloaded => Code::ResourceExhausted,
            Reason::StorageCorrupt => Code::DataLoss,
            Reason::NotServedByCluster => Code::Unimplemented,
            // Ids are drawn at random by the edge: a collision or a reused waiter id is a bug
            // here, not the caller's fault.
            Reason::StorageFailed | Reason::MessageIdExists | Reason::WaiterExists => {
                Code::Internal
            }
            Reason::TokenMissing | Reason::TokenRefused => Code::Unauthenticated,
        }
    }
}

/// The status for a refusal: the reason's code, the message for people, and the reason (and
/// the field at fault, if any) for programs.
fn refusal(reason: Reason, field: Option<&str>, message: String) -> Status {
    let mut status = Status::new(reason.code(), message);
    let metadata = status.metadata_mut();
    metadata.insert(REASON_KEY, MetadataValue::from_static(reason.as_str()));
    // Field names are the proto's, SQS's or the core's, all ASCII; one that could not travel
    // as a header still reaches the caller in the message.
    if let Some(value) = field.and_then(|field| MetadataValue::try_from(field).ok()) {
        metadata.insert(FIELD_KEY, value);
    }
    status
}

/// A refusal of the caller's input found at the edge, before the engine: the field (as named in
/// the proto) and what is wrong with it, limit included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// The request field, e.g. `max_messages` or `entries[3].id`.
    pub field: String,
    /// What is wrong, with the legal range.
    pub reason: String,
}

impl FieldError {
    /// A refusal of `field` because of `reason`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The status for a call without the bearer token the node requires (`auth::ApiAuth`).
#[must_use]
pub fn token_missing(message: &str) -> Status {
    refusal(Reason::TokenMissing, None, message.to_owned())
}

/// The status for a call whose bearer token the node does not accept (`auth::ApiAuth`).
#[must_use]
pub fn token_refused(message: &str) -> Status {
    refusal(Reason::TokenRefused, None, message.to_owned())
}

/// The status for an edge refusal: always INVALID_ARGUMENT, reason `InvalidField`.
#[must_use]
pub fn field_status(error: &FieldError) -> Status {
    refusal(Reason::InvalidField, Some(&error.field), error.to_string())
}

/// The status for a receipt handle that did not decode or authenticate: FAILED_PRECONDITION,
/// reason `ReceiptHandleMalformed`.
#[must_use]
pub fn handle_status(field: &str, error: &HandleError) -> Status {
    refusal(
        Reason::ReceiptHandleMalformed,
        Some(field),
        format!("{field}: ReceiptHandleIsInvalid: {error}"),
    )
}

/// The reason for a core refusal, and the field (attribute or parameter) it is about.
fn reject_reason(reject: &Reject) -> (Reason, Option<&'static str>) {
    match reject {
        Reject::QueueNotFound { .. } => (Reason::QueueNotFound, None),
        Reject::QueueNameExists { .. } => (Reason::QueueNameExists, None),
        Reject::QueueDeletedRecently { .. } => (Reason::QueueDeletedRecently, None),
        Reject::QueueLimit { .. } => (Reason::QueueLimit, None),
        Reject::InvalidAttribute { attribute, .. } => (Reason::InvalidAttribute, Some(*attribute)),
        Reject::InvalidParameter { parameter, .. } => (Reason::InvalidParameter, Some(*parameter)),
        Reject::InvalidMessageContents { .. } => (Reason::InvalidMessageContents, None),
        Reject::MessageTooLong { .. } => (Reason::MessageTooLong, None),
        Reject::MessageIdExists { .. } => (Reason::MessageIdExists, None),
        Reject::ReceiptHandleInvalid {
            reason: HandleProblem::WrongQueue,
        } => (Reason::ReceiptHandleWrongQueue, Some("receipt_handle")),
        Reject::ReceiptHandleInvalid {
            reason: HandleProblem::NeverIssued,
        } => (Reason::ReceiptHandleNeverIssued, Some("receipt_handle")),
        Reject::StaleReceiptHandle { .. } => (Reason::StaleReceiptHandle, Some("receipt_handle")),
        Reject::MessageNotInFlight { .. } => (Reason::MessageNotInFlight, None),
        Reject::VisibilityCapExceeded { .. } => (Reason::VisibilityCapExceeded, None),
        Reject::PurgeInProgress { .. } => (Reason::PurgeInProgress, None),
        Reject::RedriveNotAllowed { .. } => (Reason::RedriveNotAllowed, None),
        Reject::NoRedrivePolicy { .. } => (Reason::NoRedrivePolicy, None),
        Reject::DeadLetterQueueMissing { .. } => (Reason::DeadLetterQueueMissing, None),
        Reject::InflightLimit { .. } => (Reason::InflightLimit, None),
        Reject::WaiterLimit { .. } => (Reason::WaiterLimit, None),
        Reject::WaiterExists { .. } => (Reason::WaiterExists, None),
    }
}

fn reject_message(reject: &Reject) -> String {
    match reject {
        Reject::ReceiptHandleInvalid { reason } => match reason {
            HandleProblem::WrongQueue => {
                "receipt_handle: ReceiptHandleIsInvalid: the handle belongs to another queue or an earlier queue of this name".to_owned()
            }
            HandleProblem::NeverIssued => {
                "receipt_handle: ReceiptHandleIsInvalid: no receive issued this handle".to_owned()
            }
        },
        Reject::StaleReceiptHandle { .. } => format!("receipt_handle: {reject}"),
        other => other.to_string(),
    }
}

/// The status for an engine error, with the reason of its `Reject` (or `ShuttingDown`,
/// `StorageFailed`).
#[must_use]
pub fn engine_status(error: &EngineError) -> Status {
    match error {
        EngineError::Rejected(reject) => {
            let (reason, field) = reject_reason(reject);
            refusal(reason, field, reject_message(reject))
        }
        EngineError::ShuttingDown => refusal(
            Reason::ShuttingDown,
            None,
            "the node is shutting down".to_owned(),
        ),
        EngineError::Storage(fault) => refusal(
            match fault.kind {
                FaultKind::DiskFull => Reason::DiskFull,
                FaultKind::Corrupt => Reason::StorageCorrupt,
                FaultKind::Io | FaultKind::Closed => Reason::StorageFailed,
            },
            None,
            format!("storage failed, the change is not durable: {fault}"),
        ),
        EngineError::Unavailable { .. } => {
            refusal(Reason::ReplicasUnavailable, None, error.to_string())
        }
        EngineError::Unsupported { .. } => {
            refusal(Reason::NotServedByCluster, None, error.to_string())
        }
        EngineError::Overloaded { .. }
        | EngineError::ReplicasOverloaded { .. }
        | EngineError::LongPollsFull { .. } => refusal(Reason::Overloaded, None, error.to_string()),
    }
}

/// The batch-entry error for an engine error.
#[must_use]
pub fn engine_entry_error(id: &str, error: &EngineError) -> BatchEntryError {
    // SQS's codes come from the SQS endpoint's table, the one place that keeps them.
    let (code, sender_fault) = match error {
        EngineError::Rejected(reject) => crate::sqs::reject_code(reject),
        EngineError::ShuttingDown | EngineError::Unavailable { .. } => {
            ("ServiceUnavailable".to_owned(), false)
        }
        EngineError::Storage { .. } => ("InternalError".to_owned(), false),
        EngineError::Unsupported { .. } => ("UnsupportedOperation".to_owned(), true),
        EngineError::Overloaded { .. }
        | EngineError::ReplicasOverloaded { .. }
        | EngineError::LongPollsFull { .. } => crate::sqs::throttled_code(),
    };
    let message = match error {
        EngineError::Rejected(reject) => reject_message(reject),
        other => other.to_string(),
    };
    BatchEntryError {
        id: id.to_owned(),
        code,
        message,
        sender_fault,
    }
}

/// The batch-entry error for an edge refusal.
#[must_use]
pub fn field_entry_error(id: &str, error: &FieldError) -> BatchEntryError {
    BatchEntryError {
        id: id.to_owned(),
        code: "InvalidParameterValue".to_owned(),
        message: error.to_string(),
        sender_fault: true,
    }
}

/// The batch-entry error for a receipt handle that did not decode or authenticate.
#[must_use]
pub fn handle_entry_error(id: &str, error: &HandleError) -> BatchEntryError {
    BatchEntryError {
        id: id.to_owned(),
        code: "ReceiptHandleIsInvalid".to_owned(),
        message: format!("receipt_handle: {error}"),
        sender_fault: true,
    }
}

/// The status for a redrive-task error.
#[must_use]
pub fn redrive_status(error: &RedriveError) -> Status {
    let reason = match error {
        RedriveError::QueueNotFound { .. } => Reason::QueueNotFound,
        RedriveError::TaskNotFound { .. } => Reason::RedriveTaskNotFound,
        RedriveError::NotADeadLetterQueue { .. } => Reason::NotADeadLetterQueue,
        RedriveError::AlreadyRunning { .. } => Reason::RedriveAlreadyRunning,
        RedriveError::NotRunning { .. } => Reason::RedriveNotRunning,
        RedriveError::TooManyRunning { .. } => Reason::RedriveTaskLimit,
        RedriveError::RateOutOfRange { .. } => {
            let field = "max_messages_per_second";
            return refusal(
                Reason::InvalidField,
                Some(field),
                format!("{field}: {error}"),
            );
        }
        RedriveError::Engine(engine) => return engine_status(engine),
    };
    refusal(reason, None, error.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::fault::StoreFault;
    use trireme_core::{MessageId, QueueName, WaiterId};

    /// Every reason, for the checks that each is produced, named once and documented.
    const ALL: [Reason; 37] = [
        Reason::QueueNotFound,
        Reason::QueueNameExists,
        Reason::QueueDeletedRecently,
        Reason::QueueLimit,
        Reason::InvalidField,
        Reason::InvalidAttribute,
        Reason::InvalidParameter,
        Reason::InvalidMessageContents,
        Reason::MessageTooLong,
        Reason::VisibilityCapExceeded,
        Reason::ReceiptHandleMalformed,
        Reason::ReceiptHandleWrongQueue,
        Reason::ReceiptHandleNeverIssued,
        Reason::StaleReceiptHandle,
        Reason::MessageNotInFlight,
        Reason::RedriveNotAllowed,
        Reason::NoRedrivePolicy,
        Reason::DeadLetterQueueMissing,
        Reason::NotADeadLetterQueue,
        Reason::RedriveAlreadyRunning,
        Reason::RedriveNotRunning,
        Reason::RedriveTaskNotFound,
        Reason::PurgeInProgress,
        Reason::InflightLimit,
        Reason::WaiterLimit,
        Reason::RedriveTaskLimit,
        Reason::ShuttingDown,
        Reason::Overloaded,
        Reason::ReplicasUnavailable,
        Reason::NotServedByCluster,
        Reason::StorageFailed,
        Reason::DiskFull,
        Reason::StorageCorrupt,
        Reason::MessageIdExists,
        Reason::WaiterExists,
        Reason::TokenMissing,
        Reason::TokenRefused,
    ];

    fn name(text: &str) -> QueueName {
        QueueName::try_from(text).unwrap()
    }

    /// One refusal of every kind the core has.
    fn every_reject() -> Vec<Reject> {
        vec![
            Reject::QueueNotFound { name: name("jobs") },
            Reject::QueueNameExists { name: name("jobs") },
            Reject::QueueDeletedRecently { name: name("jobs") },
            Reject::QueueLimit { max: 3 },
            Reject::InvalidAttribute {
                attribute: "VisibilityTimeout",
                reason: "must be 0-43200".to_owned(),
            },
            Reject::InvalidParameter {
                parameter: "QueueName",
                reason: "too long".to_owned(),
            },
            Reject::InvalidMessageContents {
                reason: "is empty".to_owned(),
            },
            Reject::MessageTooLong {
                size_bytes: 2_000,
                max_bytes: 1_024,
            },
            Reject::MessageIdExists {
                message: MessageId(1),
            },
            Reject::ReceiptHandleInvalid {
                reason: HandleProblem::WrongQueue,
            },
            Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued,
            },
            Reject::StaleReceiptHandle {
                message: MessageId(1),
            },
            Reject::MessageNotInFlight {
                message: MessageId(1),
            },
            Reject::VisibilityCapExceeded {
                message: MessageId(1),
                requested_until_ms: 50_000_000,
                cap_ms: 43_200_000,
            },
            Reject::PurgeInProgress {
                name: name("jobs"),
                retry_after_ms: 5,
            },
            Reject::RedriveNotAllowed {
                source_queue: name("jobs"),
                dead_letter_queue: name("dlq"),
            },
            Reject::NoRedrivePolicy { name: name("jobs") },
            Reject::DeadLetterQueueMissing {
                name: name("jobs"),
                dead_letter_queue: name("dlq"),
            },
            Reject::InflightLimit {
                name: name("jobs"),
                max: 120_000,
            },
            Reject::WaiterLimit {
                name: name("jobs"),
                max: 10,
            },
            Reject::WaiterExists {
                waiter: WaiterId(7),
            },
        ]
    }

    /// What the proto's header promises for each refusal of the core: no wildcard, so a new
    /// `Reject` variant does not compile here until its promise is written down.
    fn promised(reject: &Reject) -> (Code, &'static str) {
        match reject {
            Reject::QueueNotFound { .. } => (Code::NotFound, "QueueNotFound"),
            Reject::QueueNameExists { .. } => (Code::AlreadyExists, "QueueNameExists"),
            Reject::QueueDeletedRecently { .. } => {
                (Code::FailedPrecondition, "QueueDeletedRecently")
            }
            Reject::QueueLimit { .. } => (Code::ResourceExhausted, "QueueLimit"),
            Reject::InvalidAttribute { .. } => (Code::InvalidArgument, "InvalidAttribute"),
            Reject::InvalidParameter { .. } => (Code::InvalidArgument, "InvalidParameter"),
            Reject::InvalidMessageContents { .. } => {
                (Code::InvalidArgument, "InvalidMessageContents")
            }
            Reject::MessageTooLong { .. } => (Code::InvalidArgument, "MessageTooLong"),
            Reject::MessageIdExists { .. } => (Code::Internal, "MessageIdExists"),
            Reject::ReceiptHandleInvalid {
                reason: HandleProblem::WrongQueue,
            } => (Code::FailedPrecondition, "ReceiptHandleWrongQueue"),
            Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued,
            } => (Code::FailedPrecondition, "ReceiptHandleNeverIssued"),
            Reject::StaleReceiptHandle { .. } => (Code::FailedPrecondition, "StaleReceiptHandle"),
            Reject::MessageNotInFlight { .. } => (Code::FailedPrecondition, "MessageNotInFlight"),
            Reject::VisibilityCapExceeded { .. } => {
                (Code::InvalidArgument, "VisibilityCapExceeded")
            }
            Reject::PurgeInProgress { .. } => (Code::ResourceExhausted, "PurgeInProgress"),
            Reject::RedriveNotAllowed { .. } => (Code::FailedPrecondition, "RedriveNotAllowed"),
            Reject::NoRedrivePolicy { .. } => (Code::FailedPrecondition, "NoRedrivePolicy"),
            Reject::DeadLetterQueueMissing { .. } => {
                (Code::FailedPrecondition, "DeadLetterQueueMissing")
            }
            Reject::InflightLimit { .. } => (Code::ResourceExhausted, "InflightLimit"),
            Reject::WaiterLimit { .. } => (Code::ResourceExhausted, "WaiterLimit"),
            Reject::WaiterExists { .. } => (Code::Internal, "WaiterExists"),
        }
    }

    fn reason_of(status: &Status) -> &str {
        status
            .metadata()
            .get(REASON_KEY)
            .unwrap_or_else(|| panic!("no {REASON_KEY} on {status:?}"))
            .to_str()
            .unwrap()
    }

    fn field_of(status: &Status) -> Option<&str> {
        status
            .metadata()
            .get(FIELD_KEY)
            .map(|value| value.to_str().unwrap())
    }

    /// Every status this module builds, one per kind of error it translates.
    fn every_status() -> Vec<Status> {
        let mut statuses: Vec<Status> = every_reject()
            .into_iter()
            .map(|reject| engine_status(&EngineError::Rejected(reject)))
            .collect();
        statuses.push(engine_status(&EngineError::ShuttingDown));
        statuses.push(engine_status(&EngineError::Overloaded { queued_max: 16 }));
        statuses.push(engine_status(&EngineError::ReplicasOverloaded {
            reason: "nodes 1 and 2".to_owned(),
        }));
        statuses.push(engine_status(&EngineError::Unavailable {
            reason: "one of three replicas answered".to_owned(),
        }));
        statuses.push(engine_status(&EngineError::Unsupported {
            action: "Redrive",
        }));
        for kind in [
            FaultKind::DiskFull,
            FaultKind::Io,
            FaultKind::Corrupt,
            FaultKind::Closed,
        ] {
            statuses.push(engine_status(&EngineError::Storage(StoreFault {
                kind,
                detail: "the test's words".to_owned(),
            })));
        }
        statuses.push(field_status(&FieldError::new(
            "max_messages",
            "must be 1–10",
        )));
        statuses.push(handle_status("receipt_handle", &HandleError::BadMac));
        statuses.extend(
            [
                RedriveError::QueueNotFound { name: name("dlq") },
                RedriveError::TaskNotFound {
                    handle: "t1".to_owned(),
                },
                RedriveError::NotADeadLetterQueue { name: name("dlq") },
                RedriveError::AlreadyRunning {
                    name: name("dlq"),
                    handle: "t1".to_owned(),
                },
                RedriveError::NotRunning {
                    handle: "t1".to_owned(),
                },
                RedriveError::TooManyRunning { max: 4 },
                RedriveError::RateOutOfRange {
                    rate: 900,
                    max: 500,
                },
                RedriveError::Engine(EngineError::ShuttingDown),
            ]
            .iter()
            .map(redrive_status),
        );
        statuses.push(token_missing("no token"));
        statuses.push(token_refused("not this token"));
        statuses
    }

    #[test]
    fn each_core_refusal_gets_its_promised_code_and_reason() {
        for reject in every_reject() {
            let status = engine_status(&EngineError::Rejected(reject.clone()));
            let (code, reason) = promised(&reject);
            assert_eq!(status.code(), code, "{reject:?}");
            assert_eq!(reason_of(&status), reason, "{reject:?}");
            // The wording is for people and stays as it was.
            assert_eq!(status.message(), reject_message(&reject));
        }
    }

    #[test]
    fn attribute_parameter_and_handle_refusals_name_their_field() {
        let status = |reject: Reject| engine_status(&EngineError::Rejected(reject));
        let attribute = status(Reject::InvalidAttribute {
            attribute: "DelaySeconds",
            reason: "must be 0-900".to_owned(),
        });
        assert_eq!(field_of(&attribute), Some("DelaySeconds"));
        let parameter = status(Reject::InvalidParameter {
            parameter: "MessageId",
            reason: "not a message id".to_owned(),
        });
        assert_eq!(field_of(&parameter), Some("MessageId"));
        let stale = status(Reject::StaleReceiptHandle {
            message: MessageId(9),
        });
        assert_eq!(field_of(&stale), Some("receipt_handle"));
        let too_long = status(Reject::MessageTooLong {
            size_bytes: 2,
            max_bytes: 1,
        });
        assert_eq!(field_of(&too_long), None);
    }

    #[test]
    fn engine_failures_get_reasons_too() {
        let down = engine_status(&EngineError::ShuttingDown);
        assert_eq!(down.code(), Code::Unavailable);
        assert_eq!(reason_of(&down), "ShuttingDown");
        let storage = |kind| {
            engine_status(&EngineError::Storage(StoreFault {
                kind,
                detail: "redb's words".to_owned(),
            }))
        };
        let failed = storage(FaultKind::Io);
        assert_eq!(failed.code(), Code::Internal);
        assert_eq!(reason_of(&failed), "StorageFailed");
        let full = storage(FaultKind::DiskFull);
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert_eq!(reason_of(&full), "DiskFull");
        assert!(
            full.message().contains("the disk is full"),
            "{}",
            full.message()
        );
        let corrupt = storage(FaultKind::Corrupt);
        assert_eq!(corrupt.code(), Code::DataLoss);
        assert_eq!(reason_of(&corrupt), "StorageCorrupt");
    }

    #[test]
    fn field_errors_name_the_field() {
        let status = field_status(&FieldError::new("entries[3].id", "must be 1-80 characters"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "entries[3].id: must be 1-80 characters");
        assert_eq!(reason_of(&status), "InvalidField");
        assert_eq!(field_of(&status), Some("entries[3].id"));
    }

    #[test]
    fn an_unreadable_handle_is_malformed_not_stale() {
        let status = handle_status("receipt_handle", &HandleError::NotBase64);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(reason_of(&status), "ReceiptHandleMalformed");
        assert_eq!(field_of(&status), Some("receipt_handle"));
    }

    #[test]
    fn redrive_refusals_get_their_code_and_reason() {
        let cases = [
            (
                RedriveError::QueueNotFound { name: name("dlq") },
                Code::NotFound,
                "QueueNotFound",
            ),
            (
                RedriveError::TaskNotFound {
                    handle: "t1".to_owned(),
                },
                Code::NotFound,
                "RedriveTaskNotFound",
            ),
            (
                RedriveError::NotADeadLetterQueue { name: name("dlq") },
                Code::FailedPrecondition,
                "NotADeadLetterQueue",
            ),
            (
                RedriveError::AlreadyRunning {
                    name: name("dlq"),
                    handle: "t1".to_owned(),
                },
                Code::FailedPrecondition,
                "RedriveAlreadyRunning",
            ),
            (
                RedriveError::NotRunning {
                    handle: "t1".to_owned(),
                },
                Code::FailedPrecondition,
                "RedriveNotRunning",
            ),
            (
                RedriveError::TooManyRunning { max: 4 },
                Code::ResourceExhausted,
                "RedriveTaskLimit",
            ),
            (
                RedriveError::RateOutOfRange {
                    rate: 900,
                    max: 500,
                },
                Code::InvalidArgument,
                "InvalidField",
            ),
            (
                RedriveError::Engine(EngineError::Rejected(Reject::PurgeInProgress {
                    name: name("dlq"),
                    retry_after_ms: 1,
                })),
                Code::ResourceExhausted,
                "PurgeInProgress",
            ),
        ];
        for (error, code, reason) in cases {
            let status = redrive_status(&error);
            assert_eq!(status.code(), code, "{error:?}");
            assert_eq!(reason_of(&status), reason, "{error:?}");
        }
        let rate = redrive_status(&RedriveError::RateOutOfRange { rate: 0, max: 500 });
        assert_eq!(field_of(&rate), Some("max_messages_per_second"));
    }

    #[test]
    fn every_status_carries_a_reason_and_every_reason_is_used() {
        let mut produced = BTreeSet::new();
        for status in every_status() {
            let reason = ALL
                .into_iter()
                .find(|reason| reason.as_str() == reason_of(&status))
                .unwrap_or_else(|| panic!("unknown reason on {status:?}"));
            produced.insert(reason);
        }
        // A reason nothing produces is dead API.
        assert_eq!(produced, ALL.into_iter().collect::<BTreeSet<_>>());
    }

    #[test]
    fn reason_names_are_distinct_ascii_words() {
        let names: BTreeSet<&str> = ALL.iter().map(|reason| reason.as_str()).collect();
        assert_eq!(names.len(), ALL.len());
        for name in names {
            assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic()));
        }
    }

    #[test]
    fn the_proto_header_documents_every_reason_with_its_code() {
        let proto = include_str!("../../proto/trireme/v1/queue.proto");
        let header = &proto[..proto.find("syntax =").unwrap()];
        let code_name = |code: Code| match code {
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
            other => panic!("no reason has code {other:?}"),
        };
        assert!(header.contains(REASON_KEY) && header.contains(FIELD_KEY));
        for reason in ALL {
            let documented = header.lines().any(|line| {
                let mut words = line.trim_start_matches("//").split_whitespace();
                words.next() == Some(reason.as_str())
                    && words.next() == Some(code_name(reason.code()))
            });
            assert!(
                documented,
                "{} is not listed with its code",
                reason.as_str()
            );
        }
    }
}
