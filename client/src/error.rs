//! `Error`: every way a call can fail, and the one place a `tonic::Status` becomes one.
//!
//! Refusals the caller can act on (a missing queue, a stale receipt handle, an argument out of
//! range) are their own variants; failures of the path to a node (unreachable, timed out) are
//! separate so retry logic and callers can tell "the node said no" from "no node answered".
//! This module never decides whether to retry; `retry.rs` does, from the variant.

use std::time::Duration;

use thiserror::Error;
use tonic::{Code, Status};

use crate::types::{QueueName, TaskHandle};

/// A failed call.
#[derive(Debug, Error)]
pub enum Error {
    /// The queue does not exist.
    #[error("queue {} does not exist: {message}", display_queue(.queue))]
    QueueNotFound {
        /// The queue the call named, when it named one.
        queue: Option<QueueName>,
        /// The node's explanation.
        message: String,
    },
    /// A queue of this name exists with different attributes.
    #[error("queue {} already exists: {message}", display_queue(.queue))]
    QueueExists {
        /// The queue the call named.
        queue: Option<QueueName>,
        /// The node's explanation.
        message: String,
    },
    /// A queue of this name was deleted less than 60 s ago and cannot be created yet.
    #[error("queue {} was deleted recently: {message}", display_queue(.queue))]
    QueueDeletedRecently {
        /// The queue the call named.
        queue: Option<QueueName>,
        /// The node's explanation.
        message: String,
    },
    /// The redrive task does not exist.
    #[error("redrive task not found: {message}")]
    RedriveTaskNotFound {
        /// The task the call named, when it named one.
        task_handle: Option<TaskHandle>,
        /// The node's explanation.
        message: String,
    },
    /// An argument is out of range or malformed; sending it again fails again.
    #[error("invalid argument{}: {message}", .field.as_ref().map(|f| format!(" {f}")).unwrap_or_default())]
    InvalidArgument {
        /// The field at fault, when the node (or the client's own check) named it.
        field: Option<String>,
        /// What is wrong and what the limit is.
        message: String,
    },
    /// The receipt handle does not belong to this queue or was never issued.
    #[error("receipt handle is invalid: {message}")]
    ReceiptHandleInvalid {
        /// The node's explanation.
        message: String,
    },
    /// A later receive superseded the receipt handle: someone else holds the message now.
    #[error("receipt handle is stale: {message}")]
    StaleReceiptHandle {
        /// The node's explanation.
        message: String,
    },
    /// A redrive setting or call does not fit the queues' state: the dead-letter queue does not
    /// allow the source queue, the queue is not a dead-letter queue, a redrive task is already
    /// running (or, for a cancel, no longer running).
    #[error("redrive refused: {message}")]
    RedriveRefused {
        /// The queue the call named.
        queue: Option<QueueName>,
        /// The node's explanation.
        message: String,
    },
    /// A dead-letter-now cannot move the message: the queue has no redrive policy, or its
    /// dead-letter queue does not exist. The message stays where it is.
    #[error("no dead-letter queue: {message}")]
    NoDeadLetterQueue {
        /// The queue the call named.
        queue: Option<QueueName>,
        /// The node's explanation.
        message: String,
    },
    /// A visibility change named a message that is no longer in the queue.
    #[error("message is not in flight: {message}")]
    MessageNotInFlight {
        /// The node's explanation.
        message: String,
    },
    /// The visibility change would end more than 12 hours after the receive.
    #[error("visibility cap exceeded: {message}")]
    VisibilityCapExceeded {
        /// The node's explanation.
        message: String,
    },
    /// The queue was purged less than 60 s ago.
    #[error("purge of queue {} in progress: {message}", display_queue(.queue))]
    PurgeInProgress {
        /// The queue the call named.
        queue: Option<QueueName>,
        /// The node's explanation.
        message: String,
    },
    /// A limit of the node or the queue is reached (in-flight messages, long polls, queues).
    #[error("resource exhausted: {message}")]
    ResourceExhausted {
        /// Which limit, as the node says.
        message: String,
    },
    /// The node requires a bearer token and the call carried none, or one it does not accept
    /// (`ClientConfig::token`, the CLI's `--token`).
    #[error("node {address} refused the call: {message}")]
    Unauthenticated {
        /// The node's address.
        address: String,
        /// The node's explanation.
        message: String,
    },
    /// No node could be reached, or the one reached is shutting down.
    #[error("node {address} unavailable: {message}")]
    Unavailable {
        /// The node's address.
        address: String,
        /// The cause.
        message: String,
    },
    /// A node took longer than the call allowed.
    #[error("node {address} did not answer within {} ms", .after.as_millis())]
    Timeout {
        /// The node's address.
        address: String,
        /// How long the client waited.
        after: Duration,
    },
    /// A call tried more than one endpoint and every attempt failed on the way to a node: no
    /// endpoint was reachable, available and answering in time, as far as this call could tell.
    /// A call that may repeat its request (see `RetryPolicy`) tries every endpoint before it
    /// gives up; one that may not stops at the first attempt that may have reached a node, and
    /// that attempt may still have taken effect (a send without a deduplication id may have
    /// stored its message).
    #[error("no endpoint available: {}", display_failures(.failures))]
    NoEndpointAvailable {
        /// The last failure on each endpoint tried, in the order they were first tried: each an
        /// [`Error::Unavailable`] or [`Error::Timeout`] that names its endpoint.
        failures: Vec<Error>,
    },
    /// The node is a cluster member, and this version serves the call only on a node running
    /// alone. Every member answers the same, so it is not tried elsewhere.
    #[error("node {address} does not serve this call in a cluster: {message}")]
    NotServedByCluster {
        /// The node's address.
        address: String,
        /// The node's explanation.
        message: String,
    },
    /// An endpoint address could not be used.
    #[error("endpoint {address} is not usable: {message}")]
    InvalidEndpoint {
        /// The address as given.
        address: String,
        /// Why.
        message: String,
    },
    /// The node answered something the API does not allow (a missing field, an unknown enum).
    #[error("protocol error: {message}")]
    Protocol {
        /// What was wrong.
        message: String,
    },
    /// Any other status: a bug on the node or a status this client does not know.
    #[error("node {address} failed with {code:?}: {message}")]
    Server {
        /// The node's address.
        address: String,
        /// The gRPC status code.
        code: Code,
        /// The node's explanation.
        message: String,
    },
}

fn display_failures(failures: &[Error]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn display_queue(queue: &Option<QueueName>) -> String {
    queue
        .as_ref()
        .map_or_else(|| "(unnamed)".to_owned(), ToString::to_string)
}

/// What a call was about, so a refusal can name it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Subject {
    pub(crate) queue: Option<QueueName>,
    pub(crate) task_handle: Option<TaskHandle>,
}

impl Subject {
    pub(crate) fn queue(queue: &QueueName) -> Self {
        Self {
            queue: Some(queue.clone()),
            task_handle: None,
        }
    }

    pub(crate) fn task(task_handle: &crate::types::TaskHandle) -> Self {
        Self {
            queue: None,
            task_handle: Some(task_handle.clone()),
        }
    }
}

/// The metadata key under which a node states why it refused a call (see the header of
/// `proto/trireme/v1/queue.proto` for the reasons and their codes).
const REASON_KEY: &str = "trireme-reason";

/// The metadata key under which a node names the field, attribute or parameter at fault.
const FIELD_KEY: &str = "trireme-field";

impl Error {
    /// The variant's name (`"Timeout"`, `"QueueNotFound"`, ...): a stable key for counting
    /// failures by kind, as `trireme bench` does.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Error::QueueNotFound { .. } => "QueueNotFound",
            Error::QueueExists { .. } => "QueueExists",
            Error::QueueDeletedRecently { .. } => "QueueDeletedRecently",
            Error::RedriveTaskNotFound { .. } => "RedriveTaskNotFound",
            Error::InvalidArgument { .. } => "InvalidArgument",
            Error::ReceiptHandleInvalid { .. } => "ReceiptHandleInvalid",
            Error::StaleReceiptHandle { .. } => "StaleReceiptHandle",
            Error::RedriveRefused { .. } => "RedriveRefused",
            Error::NoDeadLetterQueue { .. } => "NoDeadLetterQueue",
            Error::MessageNotInFlight { .. } => "MessageNotInFlight",
            Error::VisibilityCapExceeded { .. } => "VisibilityCapExceeded",
            Error::PurgeInProgress { .. } => "PurgeInProgress",
            Error::ResourceExhausted { .. } => "ResourceExhausted",
            Error::Unauthenticated { .. } => "Unauthenticated",
            Error::Unavailable { .. } => "Unavailable",
            Error::Timeout { .. } => "Timeout",
            Error::NoEndpointAvailable { .. } => "NoEndpointAvailable",
            Error::NotServedByCluster { .. } => "NotServedByCluster",
            Error::InvalidEndpoint { .. } => "InvalidEndpoint",
            Error::Protocol { .. } => "Protocol",
            Error::Server { .. } => "Server",
        }
    }

    /// Turns a status from the node at `address` into an error about `subject`.
    ///
    /// A node's status carries its reason in `trireme-reason`, and the reason decides the
    /// variant. A status without one did not come from a node (a proxy, tonic itself) and is
    /// mapped by its code and wording instead.
    pub(crate) fn from_status(status: &Status, address: &str, subject: &Subject) -> Self {
        match metadata_text(status, REASON_KEY) {
            Some(reason) => Self::from_reason(reason, status, address, subject),
            None => Self::from_code_and_wording(status, address, subject),
        }
    }

    /// The variant for a status with the node's `reason`. A reason newer than this client is
    /// known by its code alone, as the proto asks, never guessed from the wording.
    fn from_reason(reason: &str, status: &Status, address: &str, subject: &Subject) -> Self {
        let message = status.message().to_owned();
        let queue = subject.queue.clone();
        match reason {
            "QueueNotFound" => Self::QueueNotFound { queue, message },
            "QueueNameExists" => Self::QueueExists { queue, message },
            "QueueDeletedRecently" => Self::QueueDeletedRecently { queue, message },
            "InvalidField"
            | "InvalidAttribute"
            | "InvalidParameter"
            | "InvalidMessageContents"
            | "MessageTooLong" => Self::InvalidArgument {
                field: metadata_text(status, FIELD_KEY).map(str::to_owned),
                message,
            },
            "VisibilityCapExceeded" => Self::VisibilityCapExceeded { message },
            "ReceiptHandleMalformed" | "ReceiptHandleWrongQueue" | "ReceiptHandleNeverIssued" => {
                Self::ReceiptHandleInvalid { message }
            }
            "StaleReceiptHandle" => Self::StaleReceiptHandle { message },
            "MessageNotInFlight" => Self::MessageNotInFlight { message },
            "RedriveNotAllowed"
            | "NotADeadLetterQueue"
            | "RedriveAlreadyRunning"
            | "RedriveNotRunning" => Self::RedriveRefused { queue, message },
            "NoRedrivePolicy" | "DeadLetterQueueMissing" => {
                Self::NoDeadLetterQueue { queue, message }
            }
            "RedriveTaskNotFound" => Self::RedriveTaskNotFound {
                task_handle: subject.task_handle.clone(),
                message,
            },
            "PurgeInProgress" => Self::PurgeInProgress { queue, message },
            // Overloaded: a node alone shed the call before it did anything; a cluster member
            // whose call met two overloaded replicas may have written to one (never retried).
            "QueueLimit" | "InflightLimit" | "WaiterLimit" | "RedriveTaskLimit" | "Overloaded" => {
                Self::ResourceExhausted { message }
            }
            // A cluster member without a quorum of replicas in time: the call may still have
            // taken effect, as after any failure on the way (retry.rs treats it so).
            "ShuttingDown" | "ReplicasUnavailable" => Self::Unavailable {
                address: address.to_owned(),
                message,
            },
            "NotServedByCluster" => Self::NotServedByCluster {
                address: address.to_owned(),
                message,
            },
            // The node's storage failed (its disk is full, a write or fsync failed, or a record
            // is corrupt): a fault of that node, whatever the code says of the kind.
            "StorageFailed" | "DiskFull" | "StorageCorrupt" => Self::Server {
                address: address.to_owned(),
                code: status.code(),
                message,
            },
            "TokenMissing" | "TokenRefused" => Self::Unauthenticated {
                address: address.to_owned(),
                message,
            },
            // MessageIdExists, WaiterExists (the node's faults) and any reason this client does
            // not know.
            _ => Self::from_code(status, address, subject),
        }
    }

    /// The most general variant of the status's code: what a reason this client does not know
    /// can safely be taken for.
    fn from_code(status: &Status, address: &str, subject: &Subject) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::NotFound if subject.task_handle.is_some() => Self::RedriveTaskNotFound {
                task_handle: subject.task_handle.clone(),
                message,
            },
            Code::NotFound => Self::QueueNotFound {
                queue: subject.queue.clone(),
                message,
            },
            Code::AlreadyExists => Self::QueueExists {
                queue: subject.queue.clone(),
                message,
            },
            Code::InvalidArgument => Self::InvalidArgument {
                field: metadata_text(status, FIELD_KEY).map(str::to_owned),
                message,
            },
            Code::ResourceExhausted => Self::ResourceExhausted { message },
            Code::Unavailable => Self::Unavailable {
                address: address.to_owned(),
                message,
            },
            Code::Unauthenticated => Self::Unauthenticated {
                address: address.to_owned(),
                message,
            },
            code => Self::Server {
                address: address.to_owned(),
                code,
                message,
            },
        }
    }

    /// The variant for a status without a reason, told apart by the wording `node/src/status.rs`
    /// gives refusals that share a code (the core's `Reject` messages and the edge's
    /// `field: reason` form). A wording this does not know falls to the most general variant of
    /// its code, never to a wrong specific one.
    fn from_code_and_wording(status: &Status, address: &str, subject: &Subject) -> Self {
        let message = status.message().to_owned();
        let text = message.to_ascii_lowercase();
        let says = |words: &[&str]| words.iter().any(|w| text.contains(w));
        let queue = subject.queue.clone();
        match status.code() {
            Code::NotFound if subject.task_handle.is_some() || says(&["redrive task"]) => {
                Self::RedriveTaskNotFound {
                    task_handle: subject.task_handle.clone(),
                    message,
                }
            }
            Code::NotFound => Self::QueueNotFound { queue, message },
            Code::AlreadyExists => Self::QueueExists { queue, message },
            Code::InvalidArgument if says(&["12 h cap"]) => Self::VisibilityCapExceeded { message },
            Code::InvalidArgument => Self::InvalidArgument {
                field: field_named_in(&message),
                message,
            },
            Code::FailedPrecondition if says(&["superseded"]) => {
                Self::StaleReceiptHandle { message }
            }
            Code::FailedPrecondition if says(&["not available for a visibility change"]) => {
                Self::MessageNotInFlight { message }
            }
            Code::FailedPrecondition if says(&["deleted less than", "deleted recently"]) => {
                Self::QueueDeletedRecently { queue, message }
            }
            Code::FailedPrecondition
                if says(&["receipthandleisinvalid", "receipt_handle", "receipt handle"]) =>
            {
                Self::ReceiptHandleInvalid { message }
            }
            // What is left of FAILED_PRECONDITION is about redrive: the dead-letter queue does not
            // allow the source, the queue is no dead-letter queue, a task is (not) running.
            Code::FailedPrecondition => Self::RedriveRefused { queue, message },
            Code::ResourceExhausted if says(&["purged recently"]) => {
                Self::PurgeInProgress { queue, message }
            }
            Code::ResourceExhausted => Self::ResourceExhausted { message },
            Code::Unavailable => Self::Unavailable {
                address: address.to_owned(),
                message,
            },
            // tonic's report of a connection that broke mid-call: the node went away.
            Code::Unknown | Code::Internal if crate::retry::is_broken_connection(status) => {
                Self::Unavailable {
                    address: address.to_owned(),
                    message,
                }
            }
            // tonic reports its own request timeout as CANCELLED ("Timeout expired"), made up
            // locally and so without the response headers a node's status carries. The caller
            // knows how long it waited and fills in `after`.
            Code::DeadlineExceeded => Self::Timeout {
                address: address.to_owned(),
                after: Duration::ZERO,
            },
            Code::Cancelled if status.metadata().is_empty() && is_local_timeout(status) => {
                Self::Timeout {
                    address: address.to_owned(),
                    after: Duration::ZERO,
                }
            }
            // Any other CANCELLED without response headers is the node (or a proxy before it)
            // resetting the stream, as a node that is shutting down does with the calls it
            // drops: the node is going away, it did not time out.
            Code::Cancelled if status.metadata().is_empty() => Self::Unavailable {
                address: address.to_owned(),
                message,
            },
            Code::Unauthenticated => Self::Unauthenticated {
                address: address.to_owned(),
                message,
            },
            code => Self::Server {
                address: address.to_owned(),
                code,
                message,
            },
        }
    }
}

/// Whether a CANCELLED status is tonic's report of the channel's own request timeout
/// (`TimeoutExpired`, whose text is "Timeout expired"), not a stream the node reset.
fn is_local_timeout(status: &Status) -> bool {
    status.message() == "Timeout expired"
}

/// The value of the ASCII metadata entry `key`, when the status has a readable one.
fn metadata_text<'a>(status: &'a Status, key: &str) -> Option<&'a str> {
    status.metadata().get(key)?.to_str().ok()
}

/// The field an INVALID_ARGUMENT message names, when it follows the node's form
/// "attribute <name>: ..." or "parameter <name>: ..." (or "<name>: ...").
fn field_named_in(message: &str) -> Option<String> {
    let (head, _) = message.split_once(':')?;
    let name = head
        .strip_prefix("attribute ")
        .or_else(|| head.strip_prefix("parameter "))
        .or_else(|| head.strip_prefix("field "))
        .unwrap_or(head)
        .trim();
    // Field paths such as `entries[3].id` are names too.
    let identifier = |c: char| c.is_ascii_alphanumeric() || "_.[]".contains(c);
    (!name.is_empty() && name.chars().all(identifier)).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status without a reason, as a proxy or an older node sends it.
    fn map(code: Code, message: &str) -> Error {
        let subject = Subject::queue(&QueueName::new("orders").unwrap());
        Error::from_status(&Status::new(code, message), "http://n1:7100", &subject)
    }

    #[test]
    fn not_found_names_the_queue_of_the_call() {
        match map(Code::NotFound, "queue orders does not exist") {
            Error::QueueNotFound { queue: Some(q), .. } => assert_eq!(q.as_str(), "orders"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn not_found_on_a_task_call_is_a_missing_task() {
        let subject = Subject::task(&TaskHandle::new("t1"));
        let err = Error::from_status(&Status::not_found("no such task"), "a", &subject);
        assert!(
            matches!(err, Error::RedriveTaskNotFound { task_handle: Some(t), .. } if t.as_str() == "t1")
        );
    }

    #[test]
    fn already_exists_is_queue_exists() {
        assert!(matches!(
            map(Code::AlreadyExists, "x"),
            Error::QueueExists { .. }
        ));
    }

    #[test]
    fn invalid_argument_names_its_field() {
        match map(
            Code::InvalidArgument,
            "parameter wait_seconds: must be 0-20, got 21",
        ) {
            Error::InvalidArgument { field, message } => {
                assert_eq!(field.as_deref(), Some("wait_seconds"));
                assert!(message.contains("0-20"));
            }
            other => panic!("{other:?}"),
        }
        match map(
            Code::InvalidArgument,
            "attribute VisibilityTimeout: must be 0-43200",
        ) {
            Error::InvalidArgument { field, .. } => {
                assert_eq!(field.as_deref(), Some("VisibilityTimeout"))
            }
            other => panic!("{other:?}"),
        }
        match map(
            Code::InvalidArgument,
            "entries[3].id: must be 1-80 of [A-Za-z0-9_-]",
        ) {
            Error::InvalidArgument { field, .. } => {
                assert_eq!(field.as_deref(), Some("entries[3].id"))
            }
            other => panic!("{other:?}"),
        }
        match map(Code::InvalidArgument, "message body: is empty") {
            Error::InvalidArgument { field, .. } => assert_eq!(field, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failed_precondition_tells_stale_from_invalid_handles() {
        assert!(matches!(
            map(
                Code::FailedPrecondition,
                "receipt handle of message m1 was superseded by a later receive"
            ),
            Error::StaleReceiptHandle { .. }
        ));
        assert!(matches!(
            map(
                Code::FailedPrecondition,
                "receipt_handle: ReceiptHandleIsInvalid: no receive issued this handle"
            ),
            Error::ReceiptHandleInvalid { .. }
        ));
        assert!(matches!(
            map(
                Code::FailedPrecondition,
                "queue dlq does not allow orders as a dead-letter source"
            ),
            Error::RedriveRefused { .. }
        ));
    }

    #[test]
    fn resource_exhausted_tells_purge_from_limits() {
        assert!(matches!(
            map(
                Code::ResourceExhausted,
                "queue orders was purged recently; retry in 100 ms"
            ),
            Error::PurgeInProgress { .. }
        ));
        assert!(matches!(
            map(
                Code::ResourceExhausted,
                "queue orders has 120000 messages in flight"
            ),
            Error::ResourceExhausted { .. }
        ));
    }

    /// A status as a node sends it: with its reason, and the field when there is one.
    fn from_node(code: Code, reason: &str, field: Option<&str>, message: &str) -> Status {
        let mut status = Status::new(code, message);
        let metadata = status.metadata_mut();
        metadata.insert(REASON_KEY, reason.parse().unwrap());
        if let Some(field) = field {
            metadata.insert(FIELD_KEY, field.parse().unwrap());
        }
        status
    }

    fn map_node(code: Code, reason: &str, message: &str) -> Error {
        let subject = Subject::queue(&QueueName::new("orders").unwrap());
        Error::from_status(
            &from_node(code, reason, None, message),
            "http://n1:7100",
            &subject,
        )
    }

    /// Every reason a node sends, the code it comes with, and the variant it becomes.
    const REASONS: [(&str, Code, &str); 37] = [
        ("QueueNotFound", Code::NotFound, "QueueNotFound"),
        ("QueueNameExists", Code::AlreadyExists, "QueueExists"),
        (
            "QueueDeletedRecently",
            Code::FailedPrecondition,
            "QueueDeletedRecently",
        ),
        ("QueueLimit", Code::ResourceExhausted, "ResourceExhausted"),
        ("InvalidField", Code::InvalidArgument, "InvalidArgument"),
        ("InvalidAttribute", Code::InvalidArgument, "InvalidArgument"),
        ("InvalidParameter", Code::InvalidArgument, "InvalidArgument"),
        (
            "InvalidMessageContents",
            Code::InvalidArgument,
            "InvalidArgument",
        ),
        ("MessageTooLong", Code::InvalidArgument, "InvalidArgument"),
        (
            "VisibilityCapExceeded",
            Code::InvalidArgument,
            "VisibilityCapExceeded",
        ),
        (
            "ReceiptHandleMalformed",
            Code::FailedPrecondition,
            "ReceiptHandleInvalid",
        ),
        (
            "ReceiptHandleWrongQueue",
            Code::FailedPrecondition,
            "ReceiptHandleInvalid",
        ),
        (
            "ReceiptHandleNeverIssued",
            Code::FailedPrecondition,
            "ReceiptHandleInvalid",
        ),
        (
            "StaleReceiptHandle",
            Code::FailedPrecondition,
            "StaleReceiptHandle",
        ),
        (
            "MessageNotInFlight",
            Code::FailedPrecondition,
            "MessageNotInFlight",
        ),
        (
            "RedriveNotAllowed",
            Code::FailedPrecondition,
            "RedriveRefused",
        ),
        (
            "NoRedrivePolicy",
            Code::FailedPrecondition,
            "NoDeadLetterQueue",
        ),
        (
            "DeadLetterQueueMissing",
            Code::FailedPrecondition,
            "NoDeadLetterQueue",
        ),
        (
            "NotADeadLetterQueue",
            Code::FailedPrecondition,
            "RedriveRefused",
        ),
        (
            "RedriveAlreadyRunning",
            Code::FailedPrecondition,
            "RedriveRefused",
        ),
        (
            "RedriveNotRunning",
            Code::FailedPrecondition,
            "RedriveRefused",
        ),
        ("RedriveTaskNotFound", Code::NotFound, "RedriveTaskNotFound"),
        (
            "PurgeInProgress",
            Code::ResourceExhausted,
            "PurgeInProgress",
        ),
        (
            "InflightLimit",
            Code::ResourceExhausted,
            "ResourceExhausted",
        ),
        ("WaiterLimit", Code::ResourceExhausted, "ResourceExhausted"),
        (
            "RedriveTaskLimit",
            Code::ResourceExhausted,
            "ResourceExhausted",
        ),
        ("Overloaded", Code::ResourceExhausted, "ResourceExhausted"),
        ("ShuttingDown", Code::Unavailable, "Unavailable"),
        ("ReplicasUnavailable", Code::Unavailable, "Unavailable"),
        (
            "NotServedByCluster",
            Code::Unimplemented,
            "NotServedByCluster",
        ),
        ("StorageFailed", Code::Internal, "Server"),
        ("DiskFull", Code::ResourceExhausted, "Server"),
        ("StorageCorrupt", Code::DataLoss, "Server"),
        ("MessageIdExists", Code::Internal, "Server"),
        ("WaiterExists", Code::Internal, "Server"),
        ("TokenMissing", Code::Unauthenticated, "Unauthenticated"),
        ("TokenRefused", Code::Unauthenticated, "Unauthenticated"),
    ];

    #[test]
    fn each_reason_maps_to_its_variant_whatever_the_wording() {
        // Wording that, read on its own, would point at another variant of the same code.
        let misleading = |code: Code| match code {
            Code::FailedPrecondition => "receipt handle was superseded; deleted recently",
            Code::ResourceExhausted => "queue orders was purged recently",
            Code::InvalidArgument => "visibility would pass the 12 h cap",
            _ => "redrive task",
        };
        for (reason, code, expected) in REASONS {
            let error = map_node(code, reason, misleading(code));
            assert_eq!(error.kind(), expected, "{reason}: {error:?}");
        }
    }

    #[test]
    fn the_client_knows_exactly_the_reasons_the_proto_lists() {
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
        // The proto's table: lines whose second word is a gRPC code name.
        let listed: Vec<(&str, &str)> = header
            .lines()
            .filter_map(|line| {
                let mut words = line.trim_start_matches("//").split_whitespace();
                let reason = words.next()?;
                let code = words.next()?;
                let is_code =
                    code.len() > 3 && code.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                is_code.then_some((reason, code))
            })
            .collect();
        let known: Vec<(&str, &str)> = REASONS
            .iter()
            .map(|(reason, code, _)| (*reason, code_name(*code)))
            .collect();
        assert_eq!(listed, known);
    }

    #[test]
    fn the_field_comes_from_the_node_not_the_message() {
        let subject = Subject::queue(&QueueName::new("orders").unwrap());
        let named = from_node(
            Code::InvalidArgument,
            "InvalidField",
            Some("entries[3].id"),
            "must be 1-80 characters: got 81",
        );
        match Error::from_status(&named, "a", &subject) {
            Error::InvalidArgument { field, .. } => {
                assert_eq!(field.as_deref(), Some("entries[3].id"))
            }
            other => panic!("{other:?}"),
        }
        let unnamed = from_node(
            Code::InvalidArgument,
            "MessageTooLong",
            None,
            "parameter body: is 300000 bytes",
        );
        match Error::from_status(&unnamed, "a", &subject) {
            Error::InvalidArgument { field, .. } => assert_eq!(field, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reason_names_the_queue_or_task_of_the_call() {
        match map_node(Code::FailedPrecondition, "QueueDeletedRecently", "x") {
            Error::QueueDeletedRecently { queue: Some(q), .. } => assert_eq!(q.as_str(), "orders"),
            other => panic!("{other:?}"),
        }
        let subject = Subject::task(&TaskHandle::new("t1"));
        let status = from_node(Code::NotFound, "RedriveTaskNotFound", None, "x");
        assert!(matches!(
            Error::from_status(&status, "a", &subject),
            Error::RedriveTaskNotFound { task_handle: Some(t), .. } if t.as_str() == "t1"
        ));
    }

    #[test]
    fn an_unknown_reason_is_known_by_its_code_alone() {
        // The wording would say "stale"; a newer node's reason must not be guessed from it.
        assert!(matches!(
            map_node(
                Code::FailedPrecondition,
                "SomethingNewer",
                "receipt handle was superseded by a later receive"
            ),
            Error::Server {
                code: Code::FailedPrecondition,
                ..
            }
        ));
        assert!(matches!(
            map_node(
                Code::ResourceExhausted,
                "SomethingNewer",
                "queue orders was purged recently"
            ),
            Error::ResourceExhausted { .. }
        ));
        assert!(matches!(
            map_node(Code::NotFound, "SomethingNewer", "x"),
            Error::QueueNotFound { queue: Some(_), .. }
        ));
    }

    #[test]
    fn a_connection_broken_mid_call_is_unavailable() {
        match map(Code::Unknown, "connection closed before message completed") {
            Error::Unavailable { address, .. } => assert_eq!(address, "http://n1:7100"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            map(Code::Internal, "failed to decode Protobuf message"),
            Error::Server { .. }
        ));
    }

    #[test]
    fn no_endpoint_available_names_every_endpoint_tried() {
        let error = Error::NoEndpointAvailable {
            failures: vec![
                Error::Unavailable {
                    address: "http://n1:7100".to_owned(),
                    message: "tcp connect error".to_owned(),
                },
                Error::Timeout {
                    address: "http://n2:7100".to_owned(),
                    after: Duration::from_millis(500),
                },
            ],
        };
        let text = error.to_string();
        assert!(
            text.contains("http://n1:7100") && text.contains("tcp connect error"),
            "{text}"
        );
        assert!(
            text.contains("http://n2:7100") && text.contains("500 ms"),
            "{text}"
        );
        assert_eq!(error.kind(), "NoEndpointAvailable");
    }

    #[test]
    fn transport_codes_keep_the_address() {
        match map(Code::Unavailable, "tcp connect error") {
            Error::Unavailable { address, .. } => assert_eq!(address, "http://n1:7100"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            map(Code::DeadlineExceeded, ""),
            Error::Timeout { .. }
        ));
        // tonic's own request timeout, and a stream the node reset while it shut down.
        assert!(matches!(
            map(Code::Cancelled, "Timeout expired"),
            Error::Timeout { .. }
        ));
        match map(
            Code::Cancelled,
            "h2 protocol error: stream error received: operation was canceled",
        ) {
            Error::Unavailable { address, message } => {
                assert_eq!(address, "http://n1:7100");
                assert!(message.contains("canceled"), "{message}");
            }
            other => panic!("a reset stream is no timeout: {other:?}"),
        }
        assert!(matches!(
            map(Code::Internal, "boom"),
            Error::Server {
                code: Code::Internal,
                ..
            }
        ));
    }
}
