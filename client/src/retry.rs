//! When a failed attempt is tried again, and on which node.
//!
//! A call is retried only when repeating it cannot change its effect: the call is idempotent
//! (a get, a list, a delete or visibility change with a receipt handle, a create with the same
//! attributes, a send with a deduplication id), or the attempt provably never reached a node
//! (the connection could not be opened). A receive is never retried after it may have reached a
//! node: a lost reply there has already made messages invisible, and a second receive would hide
//! more. A retry goes to the next endpoint that is up (`endpoints.rs` picks it) at once, and
//! after a capped, fully jittered backoff once every endpoint has failed; retries stop at an
//! attempt cap or the call's deadline, whichever comes first. A repeated send without a
//! deduplication id could store its message twice, which is why it is never repeated after it
//! may have reached a node; at-least-once delivery allows the duplicate an application's own
//! resend after such an error may make.

use std::time::Duration;

use tonic::{Code, Status};

use crate::backoff::Backoff;
use crate::limits;

/// How often and for how long a call is tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts of one call in total, the first included (at least 1).
    pub attempts_max: u32,
    /// The budget of one call, attempts and backoff included. A single attempt may still use its
    /// whole request timeout: the budget bounds when the next attempt may start.
    pub deadline: Duration,
    /// The wait between attempts.
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts_max: limits::ATTEMPTS_DEFAULT,
            deadline: limits::CALL_DEADLINE_DEFAULT,
            backoff: Backoff::new(
                limits::RETRY_BACKOFF_BASE_DEFAULT,
                limits::RETRY_BACKOFF_CAP_DEFAULT,
            ),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn never() -> Self {
        Self {
            attempts_max: 1,
            ..Self::default()
        }
    }
}

/// Whether a call may be repeated without changing its effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idempotence {
    /// Repeating it is harmless: retried after any transient failure.
    Idempotent,
    /// Repeating it may act twice: retried only when the attempt never reached a node.
    NotIdempotent,
}

/// How an attempt ended, as far as retrying is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection could not be opened: the request never left this process.
    NotSent,
    /// The node may or may not have acted: unavailable mid-call, the connection broken
    /// mid-call, or no answer in time.
    Transient,
    /// The node answered with a refusal; asking again gets the same answer.
    Refused,
}

impl Failure {
    /// Classifies a status that ended an attempt.
    ///
    /// A status the node sent carries the response headers in its metadata; one tonic made up
    /// locally for a failed connect carries none, and its message is the connector's. Both are
    /// required before a non-idempotent call is sent again.
    pub(crate) fn of_status(status: &Status) -> Self {
        match status.code() {
            Code::Unavailable
                if status.metadata().is_empty() && is_connect_error(status.message()) =>
            {
                Self::NotSent
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Aborted => Self::Transient,
            _ if is_broken_connection(status) => Self::Transient,
            // tonic's own request timeout surfaces as CANCELLED ("Timeout expired").
            Code::Cancelled if status.metadata().is_empty() => Self::Transient,
            _ => Self::Refused,
        }
    }

    /// Whether a call with this idempotence is tried again after this failure.
    pub(crate) fn retryable(self, idempotence: Idempotence) -> bool {
        match self {
            Self::NotSent => true,
            Self::Transient => idempotence == Idempotence::Idempotent,
            Self::Refused => false,
        }
    }
}

/// Whether a status is tonic's own report of a connection that broke while a call was on it
/// (the node died or the socket was reset mid-call): no response headers, and the code tonic
/// gives an HTTP/2 or I/O failure, UNKNOWN (a closed connection, a reset, a broken pipe) or
/// INTERNAL with its "h2 protocol error" wording. The request may have reached the node.
pub(crate) fn is_broken_connection(status: &Status) -> bool {
    status.metadata().is_empty()
        && match status.code() {
            Code::Unknown => true,
            Code::Internal => status.message().starts_with("h2 protocol error"),
            _ => false,
        }
}

/// Whether a locally made status message is a connector's failure to open the connection.
/// hyper-util's connector words a refused or timed-out TCP connect "tcp connect error" and a
/// failed name lookup "dns error"; tonic passes that text on as the status message.
fn is_connect_error(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("tcp connect error") || message.contains("dns error")
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::*;

    fn from_node(code: Code, message: &str) -> Status {
        let mut status = Status::new(code, message);
        status.metadata_mut().insert(
            "content-type",
            MetadataValue::from_static("application/grpc"),
        );
        status
    }

    #[test]
    fn a_failed_connect_is_retried_even_when_not_idempotent() {
        let status = Status::unavailable("tcp connect error");
        let failure = Failure::of_status(&status);
        assert_eq!(failure, Failure::NotSent);
        assert!(failure.retryable(Idempotence::NotIdempotent));
    }

    #[test]
    fn a_failed_name_lookup_is_not_sent_either() {
        assert_eq!(
            Failure::of_status(&Status::unavailable("dns error")),
            Failure::NotSent
        );
    }

    #[test]
    fn an_unavailable_node_is_retried_only_for_idempotent_calls() {
        let failure = Failure::of_status(&from_node(Code::Unavailable, "shutting down"));
        assert_eq!(failure, Failure::Transient);
        assert!(failure.retryable(Idempotence::Idempotent));
        assert!(!failure.retryable(Idempotence::NotIdempotent));
    }

    #[test]
    fn a_connect_error_text_from_a_node_is_not_trusted_as_not_sent() {
        // The node answered (headers present), so the request reached it.
        let failure =
            Failure::of_status(&from_node(Code::Unavailable, "tcp connect error upstream"));
        assert_eq!(failure, Failure::Transient);
    }

    #[test]
    fn a_local_timeout_is_transient() {
        assert_eq!(
            Failure::of_status(&Status::cancelled("Timeout expired")),
            Failure::Transient
        );
        assert_eq!(
            Failure::of_status(&Status::deadline_exceeded("late")),
            Failure::Transient
        );
    }

    #[test]
    fn a_connection_broken_mid_call_is_transient() {
        for status in [
            Status::unknown("transport error"),
            Status::unknown("connection closed before message completed"),
            Status::unknown("h2 protocol error: stream closed because of a broken pipe"),
            Status::internal("h2 protocol error: error reading a body from connection"),
        ] {
            let failure = Failure::of_status(&status);
            assert_eq!(failure, Failure::Transient, "{status:?}");
            assert!(failure.retryable(Idempotence::Idempotent));
            assert!(!failure.retryable(Idempotence::NotIdempotent));
        }
        // A node's own INTERNAL (it has headers) and a local decoding failure are refusals.
        assert_eq!(
            Failure::of_status(&from_node(Code::Internal, "storage failed")),
            Failure::Refused
        );
        assert_eq!(
            Failure::of_status(&from_node(Code::Unknown, "h2 protocol error")),
            Failure::Refused
        );
        assert_eq!(
            Failure::of_status(&Status::internal("failed to decode Protobuf message")),
            Failure::Refused
        );
    }

    #[test]
    fn refusals_are_never_retried() {
        for code in [
            Code::NotFound,
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::AlreadyExists,
            Code::ResourceExhausted,
            Code::Unimplemented,
            Code::Internal,
        ] {
            let failure = Failure::of_status(&from_node(code, "no"));
            assert_eq!(failure, Failure::Refused, "{code:?}");
            assert!(!failure.retryable(Idempotence::Idempotent));
        }
    }

    #[test]
    fn never_makes_one_attempt() {
        assert_eq!(RetryPolicy::never().attempts_max, 1);
    }
}
