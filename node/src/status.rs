//! The one place that turns the node's errors into gRPC statuses and batch-entry errors, as the
//! header of `proto/trireme/v1/queue.proto` promises: INVALID_ARGUMENT names the field and its
//! limit, NOT_FOUND a missing queue, ALREADY_EXISTS a queue created with other attributes,
//! FAILED_PRECONDITION a stale or invalid receipt handle, RESOURCE_EXHAUSTED an in-flight or
//! purge limit. Batch entries carry SQS's error codes instead.
//!
//! This module must never decide whether something is an error; it only translates.

use tonic::{Code, Status};
use trireme_core::{HandleProblem, Reject};
use trireme_proto::v1::BatchEntryError;

use crate::engine::EngineError;
use crate::handle::HandleError;
use crate::redrive::RedriveError;

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

/// The status for an edge refusal: always INVALID_ARGUMENT.
#[must_use]
pub fn field_status(error: &FieldError) -> Status {
    Status::invalid_argument(error.to_string())
}

/// The status for a receipt handle that did not decode or authenticate.
#[must_use]
pub fn handle_status(field: &str, error: &HandleError) -> Status {
    Status::failed_precondition(format!("{field}: ReceiptHandleIsInvalid: {error}"))
}

fn reject_code(reject: &Reject) -> Code {
    match reject {
        Reject::QueueNotFound { .. } => Code::NotFound,
        Reject::QueueNameExists { .. } => Code::AlreadyExists,
        Reject::InvalidAttribute { .. }
        | Reject::InvalidParameter { .. }
        | Reject::InvalidMessageContents { .. }
        | Reject::MessageTooLong { .. }
        | Reject::VisibilityCapExceeded { .. } => Code::InvalidArgument,
        Reject::QueueDeletedRecently { .. }
        | Reject::ReceiptHandleInvalid { .. }
        | Reject::StaleReceiptHandle { .. }
        | Reject::MessageNotInFlight { .. }
        | Reject::RedriveNotAllowed { .. } => Code::FailedPrecondition,
        Reject::QueueLimit { .. }
        | Reject::PurgeInProgress { .. }
        | Reject::InflightLimit { .. }
        | Reject::WaiterLimit { .. } => Code::ResourceExhausted,
        // Ids are drawn at random by the edge: a collision or a reused waiter id is a bug here,
        // not the caller's fault.
        Reject::MessageIdExists { .. } | Reject::WaiterExists { .. } => Code::Internal,
    }
}

/// SQS's error code for a refusal, and whether the sender is at fault (retrying the same input
/// fails again).
#[must_use]
pub fn reject_sqs_code(reject: &Reject) -> (&'static str, bool) {
    match reject {
        Reject::QueueNotFound { .. } => ("AWS.SimpleQueueService.NonExistentQueue", true),
        Reject::QueueNameExists { .. } => ("QueueAlreadyExists", true),
        Reject::QueueDeletedRecently { .. } => {
            ("AWS.SimpleQueueService.QueueDeletedRecently", true)
        }
        Reject::QueueLimit { .. } => ("OverLimit", true),
        Reject::InvalidAttribute { .. } => ("InvalidAttributeValue", true),
        Reject::InvalidParameter { .. } | Reject::VisibilityCapExceeded { .. } => {
            ("InvalidParameterValue", true)
        }
        Reject::InvalidMessageContents { .. } => ("InvalidMessageContents", true),
        Reject::MessageTooLong { .. } => ("MessageTooLong", true),
        Reject::ReceiptHandleInvalid { .. } => ("ReceiptHandleIsInvalid", true),
        Reject::StaleReceiptHandle { .. } => ("ReceiptHandleIsInvalid", true),
        Reject::MessageNotInFlight { .. } => ("MessageNotInflight", true),
        Reject::PurgeInProgress { .. } => ("AWS.SimpleQueueService.PurgeQueueInProgress", true),
        Reject::RedriveNotAllowed { .. } => ("InvalidParameterValue", true),
        Reject::InflightLimit { .. } | Reject::WaiterLimit { .. } => ("OverLimit", false),
        Reject::MessageIdExists { .. } | Reject::WaiterExists { .. } => ("InternalError", false),
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

/// The status for an engine error.
#[must_use]
pub fn engine_status(error: &EngineError) -> Status {
    match error {
        EngineError::Rejected(reject) => Status::new(reject_code(reject), reject_message(reject)),
        EngineError::ShuttingDown => Status::unavailable("the node is shutting down"),
        EngineError::Storage { reason } => Status::internal(format!(
            "storage failed, the change is not durable: {reason}"
        )),
    }
}

/// The batch-entry error for an engine error.
#[must_use]
pub fn engine_entry_error(id: &str, error: &EngineError) -> BatchEntryError {
    let (code, sender_fault) = match error {
        EngineError::Rejected(reject) => reject_sqs_code(reject),
        EngineError::ShuttingDown => ("ServiceUnavailable", false),
        EngineError::Storage { .. } => ("InternalError", false),
    };
    let message = match error {
        EngineError::Rejected(reject) => reject_message(reject),
        other => other.to_string(),
    };
    BatchEntryError {
        id: id.to_owned(),
        code: code.to_owned(),
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
    match error {
        RedriveError::QueueNotFound { .. } | RedriveError::TaskNotFound { .. } => {
            Status::not_found(error.to_string())
        }
        RedriveError::NotADeadLetterQueue { .. }
        | RedriveError::AlreadyRunning { .. }
        | RedriveError::NotRunning { .. } => Status::failed_precondition(error.to_string()),
        RedriveError::TooManyRunning { .. } => Status::resource_exhausted(error.to_string()),
        RedriveError::RateOutOfRange { .. } => {
            Status::invalid_argument(format!("max_messages_per_second: {error}"))
        }
        RedriveError::Engine(engine) => engine_status(engine),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_core::{MessageId, QueueName};

    #[test]
    fn each_refusal_kind_gets_the_status_the_proto_promises() {
        let name = QueueName::try_from("jobs").unwrap();
        let status = |reject: Reject| engine_status(&EngineError::Rejected(reject)).code();
        assert_eq!(
            status(Reject::QueueNotFound { name: name.clone() }),
            Code::NotFound
        );
        assert_eq!(
            status(Reject::QueueNameExists { name: name.clone() }),
            Code::AlreadyExists
        );
        assert_eq!(
            status(Reject::MessageTooLong {
                size_bytes: 2_000,
                max_bytes: 1_024
            }),
            Code::InvalidArgument
        );
        assert_eq!(
            status(Reject::StaleReceiptHandle {
                message: MessageId(1)
            }),
            Code::FailedPrecondition
        );
        assert_eq!(
            status(Reject::PurgeInProgress {
                name,
                retry_after_ms: 5
            }),
            Code::ResourceExhausted
        );
        assert_eq!(
            engine_status(&EngineError::ShuttingDown).code(),
            Code::Unavailable
        );
    }

    #[test]
    fn field_errors_name_the_field() {
        let status = field_status(&FieldError::new("max_messages", "must be 1–10, got 11"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "max_messages: must be 1–10, got 11");
    }
}
