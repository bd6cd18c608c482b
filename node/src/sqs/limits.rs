//! The SQS endpoint's own caps, in one place; the queue limits themselves are the core's
//! (`trireme_core::limits`). Names are noun first, unit last.
#![allow(non_upper_case_globals)] // The style names caps like fields (`request_bytes_max`).

use trireme_core::limits as core_limits;

/// Largest request body read. A batch may carry 1 MiB of payload; JSON escaping and base64
/// binary attributes can make its text several times larger, so the cap leaves room for that.
pub const request_bytes_max: usize = 8 * 1024 * 1024;
/// Total payload (bodies and attributes) of one `SendMessageBatch`: the node's rule, shared
/// with gRPC.
pub use crate::limits::batch_payload_bytes_max;
/// How far a request's `X-Amz-Date` may be from the server's clock, as AWS allows.
pub const clock_skew_ms_max: u64 = 15 * 60 * 1_000;
/// Longest validity of a presigned request (`X-Amz-Expires`): 7 days, as AWS allows.
pub const presigned_expires_s_max: u64 = 7 * 24 * 3_600;
/// Longest batch entry id: the node's rule, shared with gRPC.
pub use crate::limits::batch_entry_id_chars_max;
/// Largest `MaxResults` of `ListQueues` and `ListDeadLetterSourceQueues` (the gRPC limit too).
pub use crate::limits::list_queues_results_max as list_results_max;
/// Largest `MaxResults` of `ListMessageMoveTasks` (the gRPC `ListRedrives` limit too).
pub use crate::limits::list_redrives_results_max as move_tasks_results_max;
/// Largest `MaxNumberOfMessagesPerSecond` of a move task (the redrive tasks' own cap).
pub use crate::limits::redrive_rate_per_s_max as move_task_rate_per_s_max;
/// Longest `NextToken` accepted (it holds a queue name).
pub const next_token_chars_max: usize = 512;

// A batch may carry at least one message of the largest size.
const _: () = assert!(batch_payload_bytes_max >= core_limits::message_bytes_max as u64);
// The body limit leaves room for a full batch, escaped.
const _: () = assert!(request_bytes_max as u64 >= 4 * batch_payload_bytes_max);
