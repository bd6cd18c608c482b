//! Every cap and default the client applies, in one place.
//!
//! The API's own limits (batch size, wait and visibility ranges) are the server's to enforce; the
//! client repeats only those it needs to size its own buffers and timeouts. Nothing here may be
//! looser than what a node accepts, or a request the client allows would be refused anyway.

use std::time::Duration;

/// Entries in one batch call (send, delete, change visibility), as in SQS.
pub const BATCH_ENTRIES_MAX: usize = 10;

/// Messages one receive may return.
pub const RECEIVE_MESSAGES_MAX: u32 = 10;

/// The longest long poll a receive may ask for.
pub const WAIT_SECONDS_MAX: u32 = 20;

/// The longest visibility timeout, and the cap on the total extension from a receive (12 h).
pub const VISIBILITY_SECONDS_MAX: u32 = 43_200;

/// A message's body and attributes together, at most (1 MiB).
pub const MESSAGE_BYTES_MAX: usize = 1_048_576;

/// Room for field tags, attribute names and receipt handles around the payloads of a call.
const ENVELOPE_BYTES_MAX: usize = 256 * 1024;

/// The largest gRPC message the client decodes: a full receive of ten maximal messages.
pub const DECODE_MESSAGE_BYTES_MAX: usize =
    RECEIVE_MESSAGES_MAX as usize * MESSAGE_BYTES_MAX + ENVELOPE_BYTES_MAX;

/// The largest gRPC message the client encodes: a full send batch of maximal messages.
pub const ENCODE_MESSAGE_BYTES_MAX: usize =
    BATCH_ENTRIES_MAX * MESSAGE_BYTES_MAX + ENVELOPE_BYTES_MAX;

/// How long a TCP (and HTTP/2) connection to one node may take to open.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3);

/// How long one non-polling call may take on one node before it is abandoned.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// How often an idle connection is pinged, so a dead peer is noticed without a request.
pub const KEEPALIVE_INTERVAL_DEFAULT: Duration = Duration::from_secs(15);

/// How long a keepalive ping may go unanswered before the connection is dropped.
pub const KEEPALIVE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// Calls one connection to a node carries at once: the node's HTTP/2 limit on concurrent
/// streams per connection (its `grpc_streams_per_connection_max`). A client holds one
/// connection per node, so more calls than this at once to one node (long polls, which hold
/// their stream for their whole wait) queue in the client until a stream frees, and may time
/// out there: use more clients.
pub const CALLS_PER_CONNECTION_MAX: usize = 1_024;

/// Endpoints one client may be given: enough for a nine-node cluster many times over, and what
/// a call's record of the endpoints it tried holds (one bit each in a `u64`).
pub const ENDPOINTS_MAX: usize = 64;

/// First ceiling of the period a failed endpoint is skipped for; it doubles with each failure
/// in a row, and the period is drawn from the upper half of the ceiling.
pub const ENDPOINT_DOWN_BASE_DEFAULT: Duration = Duration::from_secs(1);

/// Largest ceiling of that period: a node that comes back gets traffic again within it.
pub const ENDPOINT_DOWN_CAP_DEFAULT: Duration = Duration::from_secs(30);

/// Attempts of one idempotent call, across all nodes, the first included.
pub const ATTEMPTS_DEFAULT: u32 = 4;

/// The wall-clock budget of one call, all its attempts and backoff included.
pub const CALL_DEADLINE_DEFAULT: Duration = Duration::from_secs(30);

/// First backoff ceiling between attempts of a call; it doubles each retry.
pub const RETRY_BACKOFF_BASE_DEFAULT: Duration = Duration::from_millis(50);

/// Largest backoff ceiling between attempts of a call.
pub const RETRY_BACKOFF_CAP_DEFAULT: Duration = Duration::from_secs(2);

/// Pages `list_all_queues` follows before giving up on a listing that never ends.
pub const LIST_PAGES_MAX: usize = 10_000;

/// Message attributes per message, as in SQS.
pub const MESSAGE_ATTRIBUTES_MAX: usize = 10;

/// Handlers one worker runs at once, at most.
pub const WORKER_CONCURRENCY_MAX: usize = 1_000;

/// Handlers one worker runs at once unless configured.
pub const WORKER_CONCURRENCY_DEFAULT: usize = 10;

/// The visibility timeout a worker receives with and extends by, unless configured.
pub const WORKER_VISIBILITY_SECONDS_DEFAULT: u32 = 30;

/// First ceiling of a worker's retry delay; doubles with each receive of the message.
pub const WORKER_RETRY_BACKOFF_BASE_DEFAULT: Duration = Duration::from_secs(1);

/// Largest worker retry delay: a dependency down for minutes does not burn every attempt.
pub const WORKER_RETRY_BACKOFF_CAP_DEFAULT: Duration = Duration::from_secs(900);

/// How long running handlers may finish after a worker's shutdown begins.
pub const WORKER_SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(30);

const _: () = assert!(WORKER_CONCURRENCY_DEFAULT <= WORKER_CONCURRENCY_MAX);
const _: () = assert!(WORKER_VISIBILITY_SECONDS_DEFAULT <= VISIBILITY_SECONDS_MAX);
// A retry delay is a visibility timeout, so it must fit one.
const _: () = assert!(WORKER_RETRY_BACKOFF_CAP_DEFAULT.as_secs() <= VISIBILITY_SECONDS_MAX as u64);
const _: () = assert!(DECODE_MESSAGE_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(ENCODE_MESSAGE_BYTES_MAX <= DECODE_MESSAGE_BYTES_MAX + ENVELOPE_BYTES_MAX);
// One attempt must fit in a call's budget, or an idempotent call could never be retried.
const _: () = assert!(REQUEST_TIMEOUT_DEFAULT.as_millis() < CALL_DEADLINE_DEFAULT.as_millis());
const _: () = assert!(KEEPALIVE_TIMEOUT_DEFAULT.as_secs() < KEEPALIVE_INTERVAL_DEFAULT.as_secs());
const _: () =
    assert!(RETRY_BACKOFF_BASE_DEFAULT.as_millis() <= RETRY_BACKOFF_CAP_DEFAULT.as_millis());
const _: () = assert!(ATTEMPTS_DEFAULT >= 1);
const _: () = assert!(ENDPOINTS_MAX <= u64::BITS as usize);
const _: () =
    assert!(ENDPOINT_DOWN_BASE_DEFAULT.as_millis() <= ENDPOINT_DOWN_CAP_DEFAULT.as_millis());
