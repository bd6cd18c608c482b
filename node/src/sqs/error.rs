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
use trireme_core::{HandleProblem, Reject};

use crate::engine::EngineError;

/// The namespace of SQS's own error shapes in `__type`.
const SQS_NAMESPACE: &str = "com.amazonaws.sqs#";
/// The namespace AWS uses for errors common to all services (authentication, protocol).
const COMMON_NAMESPACE: &str = "com.amazon.coral.service#";

/// The content type of every SQS JSON response.
pub const JSON_CONTENT_TYPE: &str = "application/x-amz-json-1.0";

/// A refused SQS request, with what the caller needs to know to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SqsError {
    /// The queue named by the URL or name does not exist.
    #[error("The specified queue does not exist.")]
    QueueDoesNotExist,
    /// `CreateQueue` named an existing queue with different attributes.
    #[error(
        "A queue named {name} already exists with different attributes; delete it or create it with the same attributes."
    )]
    QueueNameExists { name: String },
    /// `CreateQueue` named a queue deleted less than 60 seconds ago.
    #[error("Queue {name} was deleted less than 60 seconds ago; wait before creating it again.")]
    QueueDeletedRecently { name: String },
    /// A receipt handle that does not decode, is forged, names another queue, was never issued or
    /// was superseded by a later receive.
    #[error("The receipt handle is not valid for this queue: {reason}.")]
    ReceiptHandleIsInvalid { reason: String },
    /// A parameter value outside its allowed range or form.
    #[error("{message}")]
    InvalidParameterValue { message: String },
    /// A required parameter is absent.
    #[error("The request must contain the parameter {parameter}.")]
    MissingParameter { parameter: &'static str },
    /// An attribute name that SQS does not know.
    #[error("Unknown Attribute {name}.")]
    InvalidAttributeName { name: String },
    /// A queue attribute value outside its range or form.
    #[error("{message}")]
    InvalidAttributeValue { message: String },
    /// A message body with characters SQS does not allow.
    #[error("Invalid characters found in the message body: {reason}.")]
    InvalidMessageContents { reason: String },
    /// A batch entry id that is too long or has characters outside `[A-Za-z0-9_-]`.
    #[error(
        "Id {id} is invalid. A batch entry id can only contain alphanumeric characters, hyphens and underscores, and can be at most 80 characters long."
    )]
    InvalidBatchEntryId { id: String },
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
    #[error("{message}")]
    OverLimit { message: String },
    /// Something SQS offers that Trireme does not (FIFO queues, permissions).
    #[error("{message}")]
    UnsupportedOperation { message: String },
    /// A move task or its source that does not exist.
    #[error("{message}")]
    ResourceNotFound { message: String },
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
    /// `X-Amz-Target` names no SQS action.
    #[error("The action {target} is not valid for this endpoint.")]
    UnknownOperation { target: String },
    /// The body is not the JSON the action expects.
    #[error("The request body could not be read: {reason}.")]
    Serialization { reason: String },
    /// The node is shutting down.
    #[error("The node is shutting down; retry on another node.")]
    ServiceUnavailable,
    /// The node failed to store or answer; an operator must look at its log.
    #[error("The node failed to process the request: {reason}.")]
    InternalFailure { reason: String },
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
    /// Shorthand for the validation error SQS gives for a value outside its range, in SQS's
    /// wording: `Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1
    /// and 10, if provided.`
    #[must_use]
    pub fn out_of_range(
        parameter: &str,
        value: impl std::fmt::Display,
        min: u64,
        max: u64,
    ) -> Self {
        SqsError::InvalidParameterValue {
            message: format!(
                "Value {value} for parameter {parameter} is invalid. Reason: Must be between {min} and {max}, if provided."
            ),
        }
    }

    /// Shorthand for a parameter refused for a stated reason.
    #[must_use]
    pub fn invalid(parameter: &str, value: impl std::fmt::Display, reason: &str) -> Self {
        SqsError::InvalidParameterValue {
            message: format!(
                "Value {value} for parameter {parameter} is invalid. Reason: {reason}"
            ),
        }
    }

    /// Shorthand for the refusal of a FIFO queue name: Trireme has standard queues only.
    #[must_use]
    pub fn fifo_unsupported(name: &str) -> Self {
        SqsError::UnsupportedOperation {
            message: format!(
                "Queue {name} is a FIFO queue name; Trireme supports standard queues only. Use a name without the .fifo suffix."
            ),
        }
    }

    /// The status, shape and query code of this error.
    #[must_use]
    pub fn wire(&self) -> WireError {
        use SqsError as E;
        let sender = |status: StatusCode, shape: &'static str, code: &'static str| {
            (status, SQS_NAMESPACE, shape, code)
        };
        let prefixed = |shape: &'static str| (StatusCode::BAD_REQUEST, SQS_NAMESPACE, shape, "");
        let (status, namespace, shape, code): (StatusCode, &str, &str, &str) = match self {
            E::QueueDoesNotExist => sender(
                StatusCode::BAD_REQUEST,
                "QueueDoesNotExist",
                "AWS.SimpleQueueService.NonExistentQueue",
            ),
            E::QueueNameExists { .. } => sender(
                StatusCode::BAD_REQUEST,
                "QueueNameExists",
                "QueueAlreadyExists",
            ),
            E::QueueDeletedRecently { .. } => prefixed("QueueDeletedRecently"),
            E::ReceiptHandleIsInvalid { .. } => sender(
                StatusCode::NOT_FOUND,
                "ReceiptHandleIsInvalid",
                "ReceiptHandleIsInvalid",
            ),
            E::InvalidParameterValue { .. } => sender(
                StatusCode::BAD_REQUEST,
                "InvalidParameterValueException",
                "InvalidParameterValue",
            ),
            E::MissingParameter { .. } => sender(
                StatusCode::BAD_REQUEST,
                "MissingRequiredParameterException",
                "MissingParameter",
            ),
            E::InvalidAttributeName { .. } => sender(
                StatusCode::BAD_REQUEST,
                "InvalidAttributeName",
                "InvalidAttributeName",
            ),
            E::InvalidAttributeValue { .. } => sender(
                StatusCode::BAD_REQUEST,
                "InvalidAttributeValue",
                "InvalidAttributeValue",
            ),
            E::InvalidMessageContents { .. } => sender(
                StatusCode::BAD_REQUEST,
                "InvalidMessageContents",
                "InvalidMessageContents",
            ),
            E::InvalidBatchEntryId { .. } => prefixed("InvalidBatchEntryId"),
            E::TooManyEntriesInBatchRequest { .. } => prefixed("TooManyEntriesInBatchRequest"),
            E::BatchEntryIdsNotDistinct { .. } => prefixed("BatchEntryIdsNotDistinct"),
            E::EmptyBatchRequest { .. } => prefixed("EmptyBatchRequest"),
            E::BatchRequestTooLong { .. } => prefixed("BatchRequestTooLong"),
            E::PurgeQueueInProgress { .. } => sender(
                StatusCode::FORBIDDEN,
                "PurgeQueueInProgress",
                "AWS.SimpleQueueService.PurgeQueueInProgress",
            ),
            E::OverLimit { .. } => sender(StatusCode::FORBIDDEN, "OverLimit", "OverLimit"),
            E::UnsupportedOperation { .. } => prefixed("UnsupportedOperation"),
            E::ResourceNotFound { .. } => sender(
                StatusCode::NOT_FOUND,
                "ResourceNotFoundException",
                "ResourceNotFoundException",
            ),
            E::InvalidAddress { .. } => {
                sender(StatusCode::NOT_FOUND, "InvalidAddress", "InvalidAddress")
            }
            E::MissingAuthenticationToken => (
                StatusCode::FORBIDDEN,
                COMMON_NAMESPACE,
                "MissingAuthenticationTokenException",
                "MissingAuthenticationToken",
            ),
            E::IncompleteSignature { .. } => (
                StatusCode::BAD_REQUEST,
                COMMON_NAMESPACE,
                "IncompleteSignatureException",
                "IncompleteSignature",
            ),
            E::InvalidClientTokenId => (
                StatusCode::FORBIDDEN,
                COMMON_NAMESPACE,
                "InvalidClientTokenIdException",
                "InvalidClientTokenId",
            ),
            E::SignatureDoesNotMatch { .. } => (
                StatusCode::FORBIDDEN,
                COMMON_NAMESPACE,
                "SignatureDoesNotMatchException",
                "SignatureDoesNotMatch",
            ),
            E::RequestExpired { .. } => (
                StatusCode::BAD_REQUEST,
                COMMON_NAMESPACE,
                "RequestExpiredException",
                "RequestExpired",
            ),
            E::UnknownOperation { .. } => (
                StatusCode::BAD_REQUEST,
                COMMON_NAMESPACE,
                "UnknownOperationException",
                "InvalidAction",
            ),
            E::Serialization { .. } => (
                StatusCode::BAD_REQUEST,
                COMMON_NAMESPACE,
                "SerializationException",
                "SerializationException",
            ),
            E::ServiceUnavailable => (
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
        // Shapes whose query code is the shape name under SQS's legacy prefix.
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

impl From<Reject> for SqsError {
    fn from(reject: Reject) -> Self {
        match reject {
            Reject::QueueNotFound { .. } => SqsError::QueueDoesNotExist,
            Reject::QueueNameExists { name } => SqsError::QueueNameExists {
                name: name.to_string(),
            },
            Reject::QueueDeletedRecently { name } => SqsError::QueueDeletedRecently {
                name: name.to_string(),
            },
            Reject::QueueLimit { max } => SqsError::OverLimit {
                message: format!("This node holds its maximum of {max} queues."),
            },
            // SQS reports a bad redrive policy (a missing dead-letter queue, say) as a parameter
            // error, and any other attribute as an attribute error.
            Reject::InvalidAttribute { attribute, reason }
                if attribute == "RedrivePolicy" || attribute == "RedriveAllowPolicy" =>
            {
                SqsError::InvalidParameterValue {
                    message: format!(
                        "Value for parameter {attribute} is invalid. Reason: {reason}."
                    ),
                }
            }
            Reject::InvalidAttribute { attribute, reason } => SqsError::InvalidAttributeValue {
                message: format!("Invalid value for the parameter {attribute}. Reason: {reason}."),
            },
            Reject::InvalidParameter { parameter, reason } => {
                if parameter == "QueueName" && reason.contains("FIFO") {
                    return SqsError::UnsupportedOperation {
                        message: format!(
                            "FIFO queues are not supported; Trireme supports standard queues only ({reason})."
                        ),
                    };
                }
                SqsError::InvalidParameterValue {
                    message: format!(
                        "Invalid value for the parameter {parameter}. Reason: {reason}."
                    ),
                }
            }
            Reject::InvalidMessageContents { reason } => {
                SqsError::InvalidMessageContents { reason }
            }
            Reject::MessageTooLong {
                size_bytes,
                max_bytes,
            } => SqsError::InvalidParameterValue {
                message: format!(
                    "One or more parameters are invalid. Reason: Message must be shorter than {max_bytes} bytes; it is {size_bytes} bytes."
                ),
            },
            Reject::MessageIdExists { message } => SqsError::InternalFailure {
                reason: format!("message id {message} was drawn twice"),
            },
            Reject::ReceiptHandleInvalid { reason } => SqsError::ReceiptHandleIsInvalid {
                reason: match reason {
                    HandleProblem::WrongQueue => {
                        "it was issued by another queue, or by an earlier queue of the same name"
                    }
                    HandleProblem::NeverIssued => "no receive of the message issued it",
                }
                .to_owned(),
            },
            Reject::StaleReceiptHandle { message } => SqsError::ReceiptHandleIsInvalid {
                reason: format!(
                    "a later receive of message {message} superseded it; use the newest receipt handle"
                ),
            },
            Reject::MessageNotInFlight { message } => SqsError::InvalidParameterValue {
                message: format!(
                    "Value for parameter ReceiptHandle is invalid. Reason: Message {message} does not exist or is not available for visibility timeout change."
                ),
            },
            Reject::VisibilityCapExceeded { message, .. } => SqsError::InvalidParameterValue {
                message: format!(
                    "Value for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for message {message} would exceed the limit of 43200 seconds from its receive."
                ),
            },
            Reject::PurgeInProgress { name, .. } => SqsError::PurgeQueueInProgress {
                name: name.to_string(),
            },
            Reject::RedriveNotAllowed {
                dead_letter_queue, ..
            } => SqsError::InvalidParameterValue {
                message: format!(
                    "Value for parameter RedrivePolicy is invalid. Reason: The RedriveAllowPolicy of {dead_letter_queue} does not allow this queue as a source queue."
                ),
            },
            Reject::InflightLimit { name, max } => SqsError::OverLimit {
                message: format!("Queue {name} has its maximum of {max} in-flight messages."),
            },
            Reject::WaiterLimit { name, max } => SqsError::OverLimit {
                message: format!("Queue {name} has its maximum of {max} open long polls."),
            },
            Reject::WaiterExists { waiter } => SqsError::InternalFailure {
                reason: format!("{waiter} was opened twice"),
            },
        }
    }
}

impl From<EngineError> for SqsError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Rejected(reject) => reject.into(),
            EngineError::ShuttingDown => SqsError::ServiceUnavailable,
            other => SqsError::InternalFailure {
                reason: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

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
    async fn each_listed_shape_has_its_status_and_query_code() {
        let cases: Vec<(SqsError, u16, &str, &str)> = vec![
            (
                SqsError::QueueNameExists { name: "q".into() },
                400,
                "com.amazonaws.sqs#QueueNameExists",
                "QueueAlreadyExists",
            ),
            (
                SqsError::QueueDeletedRecently { name: "q".into() },
                400,
                "com.amazonaws.sqs#QueueDeletedRecently",
                "AWS.SimpleQueueService.QueueDeletedRecently",
            ),
            (
                SqsError::ReceiptHandleIsInvalid { reason: "x".into() },
                404,
                "com.amazonaws.sqs#ReceiptHandleIsInvalid",
                "ReceiptHandleIsInvalid",
            ),
            (
                SqsError::out_of_range("MaxNumberOfMessages", 11, 1, 10),
                400,
                "com.amazonaws.sqs#InvalidParameterValueException",
                "InvalidParameterValue",
            ),
            (
                SqsError::MissingParameter {
                    parameter: "QueueUrl",
                },
                400,
                "com.amazonaws.sqs#MissingRequiredParameterException",
                "MissingParameter",
            ),
            (
                SqsError::TooManyEntriesInBatchRequest { count: 11 },
                400,
                "com.amazonaws.sqs#TooManyEntriesInBatchRequest",
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            ),
            (
                SqsError::BatchEntryIdsNotDistinct { id: "a".into() },
                400,
                "com.amazonaws.sqs#BatchEntryIdsNotDistinct",
                "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            ),
            (
                SqsError::EmptyBatchRequest {
                    entry: "SendMessageBatchRequestEntry",
                },
                400,
                "com.amazonaws.sqs#EmptyBatchRequest",
                "AWS.SimpleQueueService.EmptyBatchRequest",
            ),
            (
                SqsError::InvalidBatchEntryId { id: "a b".into() },
                400,
                "com.amazonaws.sqs#InvalidBatchEntryId",
                "AWS.SimpleQueueService.InvalidBatchEntryId",
            ),
            (
                SqsError::BatchRequestTooLong {
                    size_bytes: 2,
                    max_bytes: 1,
                },
                400,
                "com.amazonaws.sqs#BatchRequestTooLong",
                "AWS.SimpleQueueService.BatchRequestTooLong",
            ),
            (
                SqsError::PurgeQueueInProgress { name: "q".into() },
                403,
                "com.amazonaws.sqs#PurgeQueueInProgress",
                "AWS.SimpleQueueService.PurgeQueueInProgress",
            ),
            (
                SqsError::OverLimit {
                    message: "m".into(),
                },
                403,
                "com.amazonaws.sqs#OverLimit",
                "OverLimit",
            ),
            (
                SqsError::fifo_unsupported("jobs.fifo"),
                400,
                "com.amazonaws.sqs#UnsupportedOperation",
                "AWS.SimpleQueueService.UnsupportedOperation",
            ),
            (
                SqsError::ResourceNotFound {
                    message: "m".into(),
                },
                404,
                "com.amazonaws.sqs#ResourceNotFoundException",
                "ResourceNotFoundException",
            ),
            (
                SqsError::InvalidClientTokenId,
                403,
                "com.amazon.coral.service#InvalidClientTokenIdException",
                "InvalidClientTokenId",
            ),
        ];
        for (error, status, shape, code) in cases {
            let (got_status, query, body) = parts(error.clone()).await;
            assert_eq!(got_status.as_u16(), status, "{error:?}");
            assert_eq!(query, format!("{code};Sender"), "{error:?}");
            assert_eq!(body["__type"], shape, "{error:?}");
            assert!(!body["message"].as_str().unwrap().is_empty());
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

    #[test]
    fn validation_message_names_parameter_value_and_range() {
        assert_eq!(
            SqsError::out_of_range("MaxNumberOfMessages", 11, 1, 10).to_string(),
            "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."
        );
    }

    #[test]
    fn fifo_refusal_says_standard_queues_only() {
        let message = SqsError::fifo_unsupported("jobs.fifo").to_string();
        assert!(message.contains("standard queues only"), "{message}");
        assert!(message.contains("jobs.fifo"), "{message}");
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

    #[test]
    fn core_refusals_translate_to_their_sqs_shapes() {
        let name = trireme_core::QueueName::try_from("q").unwrap();
        assert_eq!(
            SqsError::from(Reject::QueueNotFound { name: name.clone() }),
            SqsError::QueueDoesNotExist
        );
        assert!(matches!(
            SqsError::from(Reject::StaleReceiptHandle {
                message: trireme_core::MessageId(1)
            }),
            SqsError::ReceiptHandleIsInvalid { .. }
        ));
        assert!(matches!(
            SqsError::from(Reject::MessageNotInFlight {
                message: trireme_core::MessageId(1)
            }),
            SqsError::InvalidParameterValue { .. }
        ));
        assert!(matches!(
            SqsError::from(Reject::PurgeInProgress {
                name,
                retry_after_ms: 5
            }),
            SqsError::PurgeQueueInProgress { .. }
        ));
    }
}
