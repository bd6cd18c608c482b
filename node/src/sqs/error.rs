//! `SqsError`: every refusal the SQS endpoint can answer, and the one place that gives each its
//! wire form: HTTP status, the `__type` shape in the JSON body, and the legacy query code in the
//! `x-amzn-query-error` header (SDKs built for the query protocol, botocore among them, map the
//! error to an exception class through that header; the JS v3 SDK fails without it).
//!
//! Core refusals (`Reject`) and engine failures (`EngineError`) are translated here and nowhere
//! else. This module never decides whether something is an error; it only says how one looks.

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use trireme_core::Reject;

use crate::engine::EngineError;

/// The namespace of SQS's own error shapes in `__type`.
const SQS_NAMESPACE: &str = "com.amazonaws.sqs#";
/// The namespace AWS uses for errors common to all services (authentication, protocol).
const COMMON_NAMESPACE: &str = "com.amazon.coral.service#";

/// The content type of every SQS JSON response.
pub const JSON_CONTENT_TYPE: &str = "application/x-amz-json-1.0";

/// A refused SQS request. Each variant is one refusal AWS gives, worded as AWS words it
/// (`Display`); [`SqsError::wire`] gives its HTTP status, shape and query code. Together they are
/// the one table of SQS refusals: the gRPC endpoint takes its batch-entry codes from here too.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SqsError {
    /// The queue named by the URL or name does not exist.
    #[error("The specified queue does not exist.")]
    QueueDoesNotExist,
    /// `CreateQueue` named an existing queue and gave `attribute` another value.
    #[error(
        "A queue already exists with the same name and a different value for attribute {attribute}"
    )]
    QueueNameExists { attribute: String },
    /// `CreateQueue` named a queue deleted less than 60 seconds ago.
    #[error(
        "You must wait 60 seconds after deleting a queue before you can create another with the same name."
    )]
    QueueDeletedRecently,
    /// A receipt handle that does not decode, is forged, names another queue or was never issued.
    #[error("The input receipt handle \"{handle}\" is not a valid receipt handle.")]
    ReceiptHandleIsInvalid { handle: String },
    /// A parameter value outside its allowed range or form.
    #[error("{0}")]
    InvalidParameterValue(Invalid),
    /// A required parameter is absent (or, for `MessageBody`, empty).
    #[error("The request must contain the parameter {parameter}.")]
    MissingParameter { parameter: &'static str },
    /// An attribute name that SQS does not know, or one that only FIFO queues have.
    #[error("{0}")]
    InvalidAttributeName(AttributeNameProblem),
    /// A queue attribute value outside its range or form; AWS gives a reason for some.
    #[error("Invalid value for the parameter {attribute}.{}", reason_suffix(.reason.as_deref()))]
    InvalidAttributeValue {
        attribute: String,
        reason: Option<String>,
    },
    /// A message body with a character SQS does not allow: the first such, as a code point.
    #[error(
        "Invalid binary character '#x{character:X}' was found in the message body, the set of allowed characters is #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]."
    )]
    InvalidMessageContents { character: u32 },
    /// A batch entry id that is too long or has characters outside `[A-Za-z0-9_-]`.
    #[error(
        "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long."
    )]
    InvalidBatchEntryId,
    /// More than 10 entries in a batch.
    #[error("Maximum number of entries per request are 10. You have sent {count}.")]
    TooManyEntriesInBatchRequest { count: usize },
    /// Two batch entries share an id.
    #[error("Id {id} repeated.")]
    BatchEntryIdsNotDistinct { id: String },
    /// A batch without entries.
    #[error("There should be at least one {entry} in the request.")]
    EmptyBatchRequest { entry: &'static str },
    /// The entries of a batch add up to more than the queue allows.
    #[error(
        "Batch requests cannot be longer than {max_bytes} bytes. You have sent {size_bytes} bytes."
    )]
    BatchRequestTooLong { size_bytes: u64, max_bytes: u64 },
    /// The queue was purged less than 60 seconds ago.
    #[error("Only one PurgeQueue operation on {name} is allowed every 60 seconds.")]
    PurgeQueueInProgress { name: String },
    /// A cap was reached (in-flight messages, open long polls, queues, tags, move tasks).
    #[error("{0}")]
    OverLimit(Limit),
    /// A FIFO queue: Trireme has standard queues only (the README's first difference).
    #[error(
        "FIFO queues are not supported: {name} would be a FIFO queue, and Trireme has standard queues only."
    )]
    FifoUnsupported { name: String },
    /// A move task parameter names a queue that does not exist.
    #[error("The resource that you specified for the {parameter} parameter doesn't exist.")]
    ResourceNotFound { parameter: &'static str },
    /// A well-formed move task handle names no task.
    #[error("Task does not exist.")]
    TaskDoesNotExist,
    /// A queue URL that is not one of this endpoint's.
    #[error("The address {url} is not valid for this endpoint.")]
    InvalidAddress { url: String },
    /// Access keys are configured and the request carries no signature.
    #[error("Request is missing Authentication Token.")]
    MissingAuthenticationToken,
    /// The `Authorization` header or the `X-Amz-Date` header is malformed.
    #[error("The request signature is incomplete: {reason}.")]
    IncompleteSignature { reason: String },
    /// The access key id is not one of the configured keys.
    #[error("The security token included in the request is invalid.")]
    InvalidClientTokenId,
    /// The signature does not match the one computed from the configured secret.
    #[error(
        "The request signature we calculated does not match the signature you provided. The canonical request was\n{canonical_request}\nand the string to sign was\n{string_to_sign}"
    )]
    SignatureDoesNotMatch {
        canonical_request: String,
        string_to_sign: String,
    },
    /// The request's `X-Amz-Date` is more than 15 minutes from the server's time.
    #[error("Signature expired: {signed_at} is more than 15 minutes from the server time {now}.")]
    RequestExpired { signed_at: String, now: String },
    /// A presigned request used after its `X-Amz-Date` plus `X-Amz-Expires`.
    #[error(
        "Request has expired: the presigned request expired at {expired_at}, and the server time is {now}."
    )]
    PresignedRequestExpired { expired_at: String, now: String },
    /// The request's access key is limited to queues by name prefix, and the request names a
    /// queue outside them.
    #[error(
        "User: {key_id} is not authorized to access queue {queue}: the key is limited to queues whose names begin with {prefixes}."
    )]
    AccessDenied {
        key_id: String,
        queue: String,
        prefixes: String,
    },
    /// `X-Amz-Target` names no SQS action.
    #[error("The action {target} is not valid for this endpoint.")]
    UnknownOperation { target: String },
    /// The body is not the JSON the action expects.
    #[error("The request body could not be read: {reason}.")]
    Serialization { reason: String },
    /// The node is shutting down.
    #[error("The node is shutting down; retry on another node.")]
    ServiceUnavailable,
    /// The node sheds load: its engine has as many commands waiting as it may. Nothing changed.
    #[error("Request is throttled: {reason}; retry after a pause.")]
    RequestThrottled { reason: String },
    /// In a cluster, the replicas the request needs did not answer in time, or this node's clock
    /// does not let it coordinate; the reason says which.
    #[error("The cluster could not serve the request: {reason}.")]
    ReplicasUnavailable { reason: String },
    /// In a cluster, an action this version serves only on a node running alone.
    #[error("{action} is not yet served by a Trireme cluster.")]
    NotServedByCluster { action: &'static str },
    /// The node failed to store or answer; an operator must look at its log.
    #[error("The node failed to process the request: {reason}.")]
    InternalFailure { reason: String },
}

fn reason_suffix(reason: Option<&str>) -> String {
    reason
        .map(|reason| format!(" Reason: {reason}"))
        .unwrap_or_default()
}

/// What is wrong with a parameter: the messages of `InvalidParameterValue`, each in AWS's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The general form: `Value 11 for parameter MaxNumberOfMessages is invalid. Reason: ...`.
    #[error("Value {value} for parameter {parameter} is invalid. Reason: {reason}")]
    Value {
        parameter: &'static str,
        value: String,
        reason: String,
    },
    /// The form without the value, for parameters AWS does not repeat.
    #[error("Value for parameter {parameter} is invalid. Reason: {reason}")]
    Unquoted {
        parameter: &'static str,
        reason: String,
    },
    /// A move task handle that does not decode.
    #[error("Value for parameter TaskHandle is invalid.")]
    TaskHandle,
    /// A message (body and attributes) over the queue's `MaximumMessageSize`.
    #[error(
        "One or more parameters are invalid. Reason: Message must be shorter than {max_bytes} bytes."
    )]
    MessageTooLong { max_bytes: u32 },
    /// The same, for one entry of a batch (AWS words it differently there).
    #[error(
        "One or more parameters cannot be validated. Reason: Message must be shorter than {max_bytes} bytes."
    )]
    EntryTooLong { max_bytes: u32 },
    /// A message attribute without a value.
    #[error(
        "Message (user) attribute '{name}' must contain a non-empty value of type '{data_type}'."
    )]
    EmptyAttributeValue { name: String, data_type: String },
    /// A message attribute whose data type has none of SQS's three prefixes.
    #[error(
        "The type of message (user) attribute '{name}' is invalid. You must use only the following supported type prefixes: Binary, Number, String."
    )]
    AttributeType { name: String },
    /// A `Number` message attribute whose value is no number.
    #[error("Can't cast the value of message (user) attribute '{name}' to a number.")]
    AttributeNotNumber { name: String },
    /// A message attribute whose value is otherwise wrong (a refused character, bad base64).
    #[error("Message (user) attribute '{name}' is invalid. Reason: {reason}")]
    Attribute { name: String, reason: String },
    /// A message system attribute other than a `String` `AWSTraceHeader`.
    #[error("Message system attribute '{name}' is invalid. Reason: {reason}")]
    SystemAttribute { name: String, reason: String },
    /// A queue name outside `[A-Za-z0-9_-]{1,80}` (or a `.fifo` name without `FifoQueue`).
    #[error("Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length")]
    QueueName,
    /// `FifoQueue=true` with a name that does not end in `.fifo`.
    #[error(
        "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length."
    )]
    FifoQueueName,
    /// A move task from a queue that is no queue's dead-letter queue.
    #[error("Source queue must be configured as a Dead Letter Queue.")]
    NotADeadLetterQueue,
    /// A second move task from the same queue.
    #[error(
        "There is already a task running. Only one active task is allowed for a source queue arn at a given time."
    )]
    MoveTaskRunning,
    /// A move task that has finished cannot be cancelled.
    #[error("Only active tasks can be cancelled.")]
    MoveTaskNotRunning,
    /// A malformed redrive or redrive-allow policy, worded by `redrive_policy`.
    #[error("Value {value} for parameter {attribute} is invalid. Reason: {reason}")]
    Policy {
        attribute: &'static str,
        value: String,
        reason: String,
    },
    /// A request body larger than the endpoint reads.
    #[error("The request body could not be read or is longer than {max_bytes} bytes.")]
    RequestTooLong { max_bytes: usize },
}

/// Why an attribute name is refused: the messages of `InvalidAttributeName`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttributeNameProblem {
    /// A name SQS does not know (or, on a standard queue, `ContentBasedDeduplication` and
    /// `FifoQueue` in `SetQueueAttributes`).
    #[error("Unknown Attribute {name}.")]
    Unknown { name: String },
    /// `DeduplicationScope` or `FifoThroughputLimit` on a standard queue.
    #[error("You can specify the {name} only when FifoQueue is set to true.")]
    FifoOnly { name: &'static str },
    /// `KmsMasterKeyId` and `SqsManagedSseEnabled=true` in one request.
    #[error(
        "You can use one type of server-side encryption (SSE) at one time. You can either enable KMS SSE or SQS SSE."
    )]
    TwoKindsOfSse,
}

/// Which cap was reached: the messages of `OverLimit`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Limit {
    /// The node holds as many queues as it may.
    #[error("This node holds its maximum of {max} queues.")]
    Queues { max: usize },
    /// The queue has as many in-flight messages as it may.
    #[error("Queue {name} has its maximum of {max} in-flight messages.")]
    InFlight { name: String, max: u64 },
    /// The queue has as many open long polls as it may.
    #[error("Queue {name} has its maximum of {max} open long polls.")]
    LongPolls { name: String, max: usize },
    /// As many move tasks run as the node allows.
    #[error("{max} message move tasks are running, the most this node allows.")]
    MoveTasks { max: usize },
}

/// What a refusal of the core is about, for the wording AWS gives it: the receipt handle and
/// visibility timeout of the request, when it has them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Subject<'a> {
    /// The receipt handle as the caller sent it.
    pub handle: Option<&'a str>,
    /// The visibility timeout the caller asked for.
    pub visibility_timeout_s: Option<u32>,
    /// The message body the caller sent.
    pub body: Option<&'a str>,
}

/// The wire form of one error: what `IntoResponse` writes.
#[derive(Debug, PartialEq, Eq)]
pub struct WireError {
    /// HTTP status.
    pub status: StatusCode,
    /// `__type`, namespace included.
    pub shape: String,
    /// The legacy query code for `x-amzn-query-error`.
    pub query_code: Cow<'static, str>,
    /// `Sender` for the caller's mistakes, `Receiver` for the node's.
    pub fault: &'static str,
}

impl SqsError {
    /// The refusal of a value outside `min..=max`, as AWS words it for most ranges:
    /// `Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10,
    /// if provided.`
    #[must_use]
    pub fn out_of_range(
        parameter: &'static str,
        value: impl std::fmt::Display,
        min: u64,
        max: u64,
    ) -> Self {
        SqsError::invalid(
            parameter,
            value,
            format!("Must be between {min} and {max}, if provided."),
        )
    }

    /// The refusal of a value outside `min..=max` in AWS's other wording, that of
    /// `WaitTimeSeconds`: `Reason: Must be >= 0 and <= 20, if provided.`
    #[must_use]
    pub fn out_of_bounds(
        parameter: &'static str,
        value: impl std::fmt::Display,
        min: u64,
        max: u64,
    ) -> Self {
        SqsError::invalid(
            parameter,
            value,
            format!("Must be >= {min} and <= {max}, if provided."),
        )
    }

    /// `Value <value> for parameter <parameter> is invalid. Reason: <reason>`.
    #[must_use]
    pub fn invalid(
        parameter: &'static str,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        SqsError::InvalidParameterValue(Invalid::Value {
            parameter,
            value: value.to_string(),
            reason: reason.into(),
        })
    }

    /// An attribute name SQS does not know.
    #[must_use]
    pub fn unknown_attribute(name: &str) -> Self {
        SqsError::InvalidAttributeName(AttributeNameProblem::Unknown {
            name: name.to_owned(),
        })
    }

    /// The status, shape and query code of this error: the table. Every SQS refusal's HTTP
    /// status, `__type` shape and legacy query code is written here and nowhere else.
    #[must_use]
    pub fn wire(&self) -> WireError {
        use SqsError as E;
        const BAD: StatusCode = StatusCode::BAD_REQUEST;
        const FORBIDDEN: StatusCode = StatusCode::FORBIDDEN;
        const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
        // (status, namespace, shape, query code); an empty query code is the shape under SQS's
        // legacy `AWS.SimpleQueueService.` prefix.
        let (status, namespace, shape, code): (StatusCode, &str, &str, &str) = match self {
            E::QueueDoesNotExist => (
                BAD,
                SQS_NAMESPACE,
                "QueueDoesNotExist",
                "AWS.SimpleQueueService.NonExistentQueue",
            ),
            E::QueueNameExists { .. } => {
                (BAD, SQS_NAMESPACE, "QueueNameExists", "QueueAlreadyExists")
            }
            E::QueueDeletedRecently => (BAD, SQS_NAMESPACE, "QueueDeletedRecently", ""),
            // The service model says 404; AWS answers 400, and AWS's behaviour is the reference.
            E::ReceiptHandleIsInvalid { .. } => (
                BAD,
                SQS_NAMESPACE,
                "ReceiptHandleIsInvalid",
                "ReceiptHandleIsInvalid",
            ),
            E::InvalidParameterValue(_) => (
                BAD,
                SQS_NAMESPACE,
                "InvalidParameterValueException",
                "InvalidParameterValue",
            ),
            E::MissingParameter { .. } => (
                BAD,
                SQS_NAMESPACE,
                "MissingRequiredParameterException",
                "MissingParameter",
            ),
            E::InvalidAttributeName(_) => (
                BAD,
                SQS_NAMESPACE,
                "InvalidAttributeName",
                "InvalidAttributeName",
            ),
            E::InvalidAttributeValue { .. } => (
                BAD,
                SQS_NAMESPACE,
                "InvalidAttributeValue",
                "InvalidAttributeValue",
            ),
            E::InvalidMessageContents { .. } => (
                BAD,
                SQS_NAMESPACE,
                "InvalidMessageContents",
                "InvalidMessageContents",
            ),
            E::InvalidBatchEntryId => (BAD, SQS_NAMESPACE, "InvalidBatchEntryId", ""),
            E::TooManyEntriesInBatchRequest { .. } => {
                (BAD, SQS_NAMESPACE, "TooManyEntriesInBatchRequest", "")
            }
            E::BatchEntryIdsNotDistinct { .. } => {
                (BAD, SQS_NAMESPACE, "BatchEntryIdsNotDistinct", "")
            }
            E::EmptyBatchRequest { .. } => (BAD, SQS_NAMESPACE, "EmptyBatchRequest", ""),
            E::BatchRequestTooLong { .. } => (BAD, SQS_NAMESPACE, "BatchRequestTooLong", ""),
            E::PurgeQueueInProgress { .. } => (
                FORBIDDEN,
                SQS_NAMESPACE,
                "PurgeQueueInProgress",
                "AWS.SimpleQueueService.PurgeQueueInProgress",
            ),
            // 403 both, as SQS answers them: OverLimit's `httpStatusCode` in botocore's SQS model
            // while it carried one (query protocol, to 2023), and `RequestThrottled` with HTTP
            // 403 in SDK reports of real throttling.
            E::OverLimit(_) => (FORBIDDEN, SQS_NAMESPACE, "OverLimit", "OverLimit"),
            E::RequestThrottled { .. } => (
                FORBIDDEN,
                SQS_NAMESPACE,
                "RequestThrottled",
                "RequestThrottled",
            ),
            E::FifoUnsupported { .. } | E::NotServedByCluster { .. } => {
                (BAD, SQS_NAMESPACE, "UnsupportedOperation", "")
            }
            E::ResourceNotFound { .. } | E::TaskDoesNotExist => (
                NOT_FOUND,
                SQS_NAMESPACE,
                "ResourceNotFoundException",
                "ResourceNotFoundException",
            ),
            E::InvalidAddress { .. } => {
                (NOT_FOUND, SQS_NAMESPACE, "InvalidAddress", "InvalidAddress")
            }
            E::MissingAuthenticationToken => (
                FORBIDDEN,
                COMMON_NAMESPACE,
                "MissingAuthenticationTokenException",
                "MissingAuthenticationToken",
            ),
            E::IncompleteSignature { .. } => (
                BAD,
                COMMON_NAMESPACE,
                "IncompleteSignatureException",
                "IncompleteSignature",
            ),
            E::InvalidClientTokenId => (
                FORBIDDEN,
                COMMON_NAMESPACE,
                "InvalidClientTokenIdException",
                "InvalidClientTokenId",
            ),
            E::SignatureDoesNotMatch { .. } => (
                FORBIDDEN,
                COMMON_NAMESPACE,
                "SignatureDoesNotMatchException",
                "SignatureDoesNotMatch",
            ),
            E::RequestExpired { .. } | E::PresignedRequestExpired { .. } => (
                BAD,
                COMMON_NAMESPACE,
                "RequestExpiredException",
                "RequestExpired",
            ),
            // 403 as SQS answers it (`AccessDenied`, "Access to the resource ... is denied.",
            // HTTP 403 in SDK reports from 2013 to 2022), though the API reference's generic
            // Common Errors page lists `AccessDeniedException` with 400.
            E::AccessDenied { .. } => (
                FORBIDDEN,
                COMMON_NAMESPACE,
                "AccessDeniedException",
                "AccessDenied",
            ),
            E::UnknownOperation { .. } => (
                BAD,
                COMMON_NAMESPACE,
                "UnknownOperationException",
                "InvalidAction",
            ),
            E::Serialization { .. } => (
                BAD,
                COMMON_NAMESPACE,
                "SerializationException",
                "SerializationException",
            ),
            E::ServiceUnavailable | E::ReplicasUnavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                COMMON_NAMESPACE,
                "ServiceUnavailable",
                "ServiceUnavailable",
            ),
            E::InternalFailure { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                COMMON_NAMESPACE,
                "InternalFailure",
                "InternalFailure",
            ),
        };
        let query_code = if code.is_empty() {
            Cow::Owned(format!("AWS.SimpleQueueService.{shape}"))
        } else {
            Cow::Owned(code.to_owned())
        };
        WireError {
            status,
            shape: format!("{namespace}{shape}"),
            query_code,
            fault: if status.is_server_error() {
                "Receiver"
            } else {
                "Sender"
            },
        }
    }

    /// The error a batch entry reports inside a 200 response: `(Code, SenderFault)`. Batch entry
    /// failures carry the query code, as SQS's do.
    #[must_use]
    pub fn batch_entry_code(&self) -> (String, bool) {
        let wire = self.wire();
        (wire.query_code.into_owned(), wire.fault == "Sender")
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "__type")]
    shape: &'a str,
    message: &'a str,
}

impl IntoResponse for SqsError {
    fn into_response(self) -> Response {
        let wire = self.wire();
        let message = self.to_string();
        let body = serde_json::to_vec(&ErrorBody {
            shape: &wire.shape,
            message: &message,
        })
        .expect("a struct of two strings always serializes");
        let mut response = (wire.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(JSON_CONTENT_TYPE),
        );
        headers.insert(
            "x-amzn-query-error",
            HeaderValue::from_str(&format!("{};{}", wire.query_code, wire.fault))
                .expect("query codes are ASCII without control characters"),
        );
        response
    }
}

impl SqsError {
    /// The error as the older query protocol answers it (an XML `ErrorResponse`), for clients
    /// that post form-encoded requests: they cannot read JSON, and the message tells them to
    /// upgrade.
    #[must_use]
    pub fn into_query_response(self, request_id: &str) -> Response {
        let wire = self.wire();
        let escape = |text: &str| {
            text.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;")
        };
        let body = format!(
            "<?xml version=\"1.0\"?><ErrorResponse><Error><Type>{}</Type><Code>{}</Code><Message>{}</Message><Detail/></Error><RequestId>{}</RequestId></ErrorResponse>",
            wire.fault,
            escape(&wire.query_code),
            escape(&self.to_string()),
            escape(request_id)
        );
        let mut response = (wire.status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
        response
    }
}

impl SqsError {
    /// The SQS refusal for a refusal of the core, worded with what the request was about.
    #[must_use]
    pub fn from_reject(reject: Reject, subject: Subject<'_>) -> Self {
        let handle = subject.handle.unwrap_or_default();
        match reject {
            Reject::QueueNotFound { .. } => SqsError::QueueDoesNotExist,
            // The edge compares attributes before it creates, and names the attribute; a race
            // with another create can still reach the core's refusal.
            Reject::QueueNameExists { .. } => SqsError::QueueNameExists {
                attribute: "Attributes".to_owned(),
            },
            Reject::QueueDeletedRecently { .. } => SqsError::QueueDeletedRecently,
            Reject::QueueLimit { max } => SqsError::OverLimit(Limit::Queues { max }),
            // SQS reports a redrive policy the other queues refuse (a missing dead-letter queue,
            // say) as a parameter error, and other attributes without a reason.
            Reject::InvalidAttribute {
                attribute: attribute @ ("RedrivePolicy" | "RedriveAllowPolicy"),
                reason,
            } => SqsError::InvalidParameterValue(Invalid::Unquoted {
                parameter: attribute,
                reason,
            }),
            Reject::InvalidAttribute { attribute, .. } => SqsError::InvalidAttributeValue {
                attribute: attribute.to_owned(),
                reason: None,
            },
            Reject::InvalidParameter {
                parameter: "QueueName",
                ..
            } => SqsError::InvalidParameterValue(Invalid::QueueName),
            Reject::InvalidParameter { parameter, reason } => {
                SqsError::InvalidParameterValue(Invalid::Unquoted { parameter, reason })
            }
            Reject::InvalidMessageContents { .. } => SqsError::InvalidMessageContents {
                character: subject
                    .body
                    .and_then(|body| body.chars().find(|c| !trireme_core::body_char_allowed(*c)))
                    .map_or(0, u32::from),
            },
            Reject::MessageTooLong { max_bytes, .. } => {
                SqsError::InvalidParameterValue(Invalid::MessageTooLong { max_bytes })
            }
            Reject::MessageIdExists { message } => SqsError::InternalFailure {
                reason: format!("message id {message} was drawn twice"),
            },
            Reject::ReceiptHandleInvalid { .. } => SqsError::ReceiptHandleIsInvalid {
                handle: handle.to_owned(),
            },
            // Only a visibility change reaches this: the SQS endpoint answers a delete with a
            // superseded handle with success, as AWS does (see the README).
            Reject::StaleReceiptHandle { .. } => {
                SqsError::invalid("ReceiptHandle", handle, "The receipt handle has expired.")
            }
            Reject::MessageNotInFlight { .. } => SqsError::invalid(
                "ReceiptHandle",
                handle,
                "Message does not exist or is not available for visibility timeout change.",
            ),
            Reject::VisibilityCapExceeded { .. } => SqsError::invalid(
                "VisibilityTimeout",
                subject
                    .visibility_timeout_s
                    .map(|timeout| timeout.to_string())
                    .unwrap_or_default(),
                "Total VisibilityTimeout for the message is beyond the limit [43200 seconds]",
            ),
            Reject::PurgeInProgress { name, .. } => SqsError::PurgeQueueInProgress {
                name: name.to_string(),
            },
            Reject::RedriveNotAllowed { source_queue, .. } => {
                SqsError::InvalidParameterValue(Invalid::Unquoted {
                    parameter: "RedrivePolicy",
                    reason: format!(
                        "Queue {source_queue} is not allowed as a source queue by the dead-letter queue's RedriveAllowPolicy."
                    ),
                })
            }
            // Dead-letter-now is Trireme's own action (gRPC only): no SQS request produces these
            // refusals; were one to, the parameter at fault is the receipt handle's queue.
            Reject::NoRedrivePolicy { name } => {
                SqsError::InvalidParameterValue(Invalid::Unquoted {
                    parameter: "QueueUrl",
                    reason: format!("Queue {name} has no RedrivePolicy, so no dead-letter queue."),
                })
            }
            Reject::DeadLetterQueueMissing {
                name,
                dead_letter_queue,
            } => SqsError::InvalidParameterValue(Invalid::Unquoted {
                parameter: "QueueUrl",
                reason: format!(
                    "The dead-letter queue {dead_letter_queue} of queue {name} does not exist."
                ),
            }),
            Reject::InflightLimit { name, max } => SqsError::OverLimit(Limit::InFlight {
                name: name.to_string(),
                max,
            }),
            Reject::WaiterLimit { name, max } => SqsError::OverLimit(Limit::LongPolls {
                name: name.to_string(),
                max,
            }),
            Reject::WaiterExists { waiter } => SqsError::InternalFailure {
                reason: format!("{waiter} was opened twice"),
            },
        }
    }

    /// The SQS refusal for an engine error about `subject`.
    #[must_use]
    pub fn from_engine(error: EngineError, subject: Subject<'_>) -> Self {
        match error {
            EngineError::Rejected(reject) => SqsError::from_reject(reject, subject),
            EngineError::ShuttingDown => SqsError::ServiceUnavailable,
            EngineError::Unavailable { reason } => SqsError::ReplicasUnavailable { reason },
            EngineError::Unsupported { action } => SqsError::NotServedByCluster { action },
            overloaded @ (EngineError::Overloaded { .. }
            | EngineError::ReplicasOverloaded { .. }
            | EngineError::LongPollsFull { .. }) => SqsError::RequestThrottled {
                reason: overloaded.to_string(),
            },
            other => SqsError::InternalFailure {
                reason: other.to_string(),
            },
        }
    }
}

/// SQS's batch-entry code for a shed command (`RequestThrottled`), for the gRPC endpoint's batch
/// entries.
#[must_use]
pub fn throttled_code() -> (String, bool) {
    SqsError::RequestThrottled {
        reason: String::new(),
    }
    .batch_entry_code()
}

/// SQS's batch-entry code for a refusal of the core, and whether the sender is at fault: the
/// gRPC endpoint's batch entries carry these, read from the same table as the SQS endpoint's.
#[must_use]
pub fn reject_code(reject: &Reject) -> (String, bool) {
    SqsError::from_reject(reject.clone(), Subject::default()).batch_entry_code()
}

impl From<Reject> for SqsError {
    fn from(reject: Reject) -> Self {
        SqsError::from_reject(reject, Subject::default())
    }
}

impl From<EngineError> for SqsError {
    fn from(error: EngineError) -> Self {
        SqsError::from_engine(error, Subject::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;
    use trireme_core::{HandleProblem, MessageId, QueueName};

    async fn parts(error: SqsError) -> (StatusCode, String, serde_json::Value) {
        let response = error.into_response();
        let status = response.status();
        let query = response.headers()["x-amzn-query-error"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(response.headers()[header::CONTENT_TYPE], JSON_CONTENT_TYPE);
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, query, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn queue_does_not_exist_has_the_legacy_query_code() {
        let (status, query, body) = parts(SqsError::QueueDoesNotExist).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(query, "AWS.SimpleQueueService.NonExistentQueue;Sender");
        assert_eq!(body["__type"], "com.amazonaws.sqs#QueueDoesNotExist");
        assert_eq!(body["message"], "The specified queue does not exist.");
    }

    #[tokio::test]
    async fn each_listed_shape_has_its_status_query_code_and_wording() {
        let cases: Vec<(SqsError, u16, &str, &str, &str)> = vec![
            (
                SqsError::QueueNameExists {
                    attribute: "DelaySeconds".into(),
                },
                400,
                "com.amazonaws.sqs#QueueNameExists",
                "QueueAlreadyExists",
                "A queue already exists with the same name and a different value for attribute DelaySeconds",
            ),
            (
                SqsError::ReceiptHandleIsInvalid {
                    handle: "garbage".into(),
                },
                400,
                "com.amazonaws.sqs#ReceiptHandleIsInvalid",
                "ReceiptHandleIsInvalid",
                "The input receipt handle \"garbage\" is not a valid receipt handle.",
            ),
            (
                SqsError::out_of_range("MaxNumberOfMessages", 11, 1, 10),
                400,
                "com.amazonaws.sqs#InvalidParameterValueException",
                "InvalidParameterValue",
                "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided.",
            ),
            (
                SqsError::out_of_bounds("WaitTimeSeconds", 21, 0, 20),
                400,
                "com.amazonaws.sqs#InvalidParameterValueException",
                "InvalidParameterValue",
                "Value 21 for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, if provided.",
            ),
            (
                SqsError::MissingParameter {
                    parameter: "MessageBody",
                },
                400,
                "com.amazonaws.sqs#MissingRequiredParameterException",
                "MissingParameter",
                "The request must contain the parameter MessageBody.",
            ),
            (
                SqsError::TooManyEntriesInBatchRequest { count: 20 },
                400,
                "com.amazonaws.sqs#TooManyEntriesInBatchRequest",
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                "Maximum number of entries per request are 10. You have sent 20.",
            ),
            (
                SqsError::InvalidBatchEntryId,
                400,
                "com.amazonaws.sqs#InvalidBatchEntryId",
                "AWS.SimpleQueueService.InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long.",
            ),
            (
                SqsError::BatchRequestTooLong {
                    size_bytes: 1_048_577,
                    max_bytes: 1_048_576,
                },
                400,
                "com.amazonaws.sqs#BatchRequestTooLong",
                "AWS.SimpleQueueService.BatchRequestTooLong",
                "Batch requests cannot be longer than 1048576 bytes. You have sent 1048577 bytes.",
            ),
            (
                SqsError::PurgeQueueInProgress { name: "q".into() },
                403,
                "com.amazonaws.sqs#PurgeQueueInProgress",
                "AWS.SimpleQueueService.PurgeQueueInProgress",
                "Only one PurgeQueue operation on q is allowed every 60 seconds.",
            ),
            (
                SqsError::InvalidParameterValue(Invalid::MessageTooLong { max_bytes: 1_024 }),
                400,
                "com.amazonaws.sqs#InvalidParameterValueException",
                "InvalidParameterValue",
                "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
            ),
            (
                SqsError::InvalidAttributeName(AttributeNameProblem::FifoOnly {
                    name: "DeduplicationScope",
                }),
                400,
                "com.amazonaws.sqs#InvalidAttributeName",
                "InvalidAttributeName",
                "You can specify the DeduplicationScope only when FifoQueue is set to true.",
            ),
            (
                SqsError::FifoUnsupported {
                    name: "jobs.fifo".into(),
                },
                400,
                "com.amazonaws.sqs#UnsupportedOperation",
                "AWS.SimpleQueueService.UnsupportedOperation",
                "FIFO queues are not supported: jobs.fifo would be a FIFO queue, and Trireme has standard queues only.",
            ),
            (
                SqsError::ResourceNotFound {
                    parameter: "DestinationArn",
                },
                404,
                "com.amazonaws.sqs#ResourceNotFoundException",
                "ResourceNotFoundException",
                "The resource that you specified for the DestinationArn parameter doesn't exist.",
            ),
            (
                SqsError::TaskDoesNotExist,
                404,
                "com.amazonaws.sqs#ResourceNotFoundException",
                "ResourceNotFoundException",
                "Task does not exist.",
            ),
            (
                SqsError::InvalidClientTokenId,
                403,
                "com.amazon.coral.service#InvalidClientTokenIdException",
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            ),
        ];
        for (error, status, shape, code, message) in cases {
            let (got_status, query, body) = parts(error.clone()).await;
            assert_eq!(got_status.as_u16(), status, "{error:?}");
            assert_eq!(query, format!("{code};Sender"), "{error:?}");
            assert_eq!(body["__type"], shape, "{error:?}");
            assert_eq!(body["message"], message, "{error:?}");
        }
    }

    #[tokio::test]
    async fn query_protocol_clients_get_an_xml_error() {
        let response = SqsError::Serialization {
            reason: "JSON only <here>".into(),
        }
        .into_query_response("r-1");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("<Code>SerializationException</Code>"),
            "{text}"
        );
        assert!(text.contains("JSON only &lt;here&gt;"), "{text}");
        assert!(text.contains("<RequestId>r-1</RequestId>"), "{text}");
    }

    #[tokio::test]
    async fn node_failures_are_the_receivers_fault() {
        let (status, query, _) = parts(SqsError::ServiceUnavailable).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(query, "ServiceUnavailable;Receiver");
        let (code, sender_fault) =
            SqsError::InternalFailure { reason: "x".into() }.batch_entry_code();
        assert_eq!(code, "InternalFailure");
        assert!(!sender_fault);
    }

    /// spec/replication.md#durability: replicas whose disks failed make the cluster unavailable
    /// (503, the receiver's fault), and the message names them.
    #[tokio::test]
    async fn an_unavailable_cluster_is_a_503_that_names_its_failed_disks() {
        let error = EngineError::Unavailable {
            reason: "sending the message: fewer than two replicas answered in time; replica \
                     stores failed: node 2: the disk is full (No space left on device)"
                .to_owned(),
        };
        let (status, query, body) = parts(SqsError::from_engine(error, Subject::default())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(query, "ServiceUnavailable;Receiver");
        assert!(
            body.to_string().contains("node 2: the disk is full"),
            "{body}"
        );
    }

    #[test]
    fn handle_refusals_of_the_core_quote_the_handle_as_aws_does() {
        let subject = Subject {
            handle: Some("AQEB"),
            visibility_timeout_s: Some(43_000),
            body: None,
        };
        let message = MessageId(1);
        let worded = |reject: Reject| SqsError::from_reject(reject, subject).to_string();
        assert_eq!(
            worded(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued
            }),
            "The input receipt handle \"AQEB\" is not a valid receipt handle."
        );
        assert_eq!(
            worded(Reject::MessageNotInFlight { message }),
            "Value AQEB for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for visibility timeout change."
        );
        assert_eq!(
            worded(Reject::StaleReceiptHandle { message }),
            "Value AQEB for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
        );
        assert_eq!(
            worded(Reject::VisibilityCapExceeded {
                message,
                requested_until_ms: 1,
                cap_ms: 0
            }),
            "Value 43000 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is beyond the limit [43200 seconds]"
        );
    }

    #[test]
    fn a_bad_body_names_its_first_refused_character() {
        let subject = Subject {
            body: Some("ok \u{1} then \u{2}"),
            ..Subject::default()
        };
        let error = SqsError::from_reject(
            Reject::InvalidMessageContents {
                reason: "whatever the core says".into(),
            },
            subject,
        );
        assert_eq!(error, SqsError::InvalidMessageContents { character: 1 });
        assert!(
            error
                .to_string()
                .starts_with("Invalid binary character '#x1' was found")
        );
    }

    #[test]
    fn the_grpc_batch_codes_come_from_this_table() {
        let name = QueueName::try_from("q").unwrap();
        let message = MessageId(1);
        // The two tables used to disagree here: AWS answers InvalidParameterValue.
        assert_eq!(
            reject_code(&Reject::MessageNotInFlight { message }),
            ("InvalidParameterValue".to_owned(), true)
        );
        assert_eq!(
            reject_code(&Reject::QueueNotFound { name: name.clone() }),
            ("AWS.SimpleQueueService.NonExistentQueue".to_owned(), true)
        );
        assert_eq!(
            reject_code(&Reject::InflightLimit { name, max: 1 }),
            ("OverLimit".to_owned(), true)
        );
    }

    /// AWS answers these three with 403, not the 400 of the API reference's generic Common
    /// Errors page: SDKs retry or give up by the status, so ours must be AWS's.
    #[tokio::test]
    async fn throttling_limits_and_denials_are_403_as_sqs_answers_them() {
        let cases = [
            (
                SqsError::RequestThrottled {
                    reason: "the engine's queue is full".into(),
                },
                "RequestThrottled;Sender",
                "com.amazonaws.sqs#RequestThrottled",
            ),
            (
                SqsError::OverLimit(Limit::InFlight {
                    name: "q".into(),
                    max: 120_000,
                }),
                "OverLimit;Sender",
                "com.amazonaws.sqs#OverLimit",
            ),
            (
                SqsError::AccessDenied {
                    key_id: "AKID".into(),
                    queue: "payroll".into(),
                    prefixes: "orders-".into(),
                },
                "AccessDenied;Sender",
                "com.amazon.coral.service#AccessDeniedException",
            ),
        ];
        for (error, query_code, shape) in cases {
            let (status, query, body) = parts(error.clone()).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{error:?}");
            assert_eq!(query, query_code, "{error:?}");
            assert_eq!(body["__type"], shape, "{error:?}");
        }
    }
}
