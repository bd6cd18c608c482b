//! Every cap of the queue core, in one place: SQS's documented ranges and Trireme's own bounds on
//! anything that grows with input. Names are noun first, unit last. Relations between caps are
//! checked at compile time at the bottom of the file. Nothing else in the crate writes a limit
//! as a literal.
#![allow(non_upper_case_globals)] // The style names caps like fields (`message_bytes_max`).

/// Shortest legal queue name.
pub const queue_name_chars_min: usize = 1;
/// Longest legal queue name.
pub const queue_name_chars_max: usize = 80;
/// Longest region in a queue name scoped to a region (`name@region`); AWS's longest region
/// names are about 15 characters.
pub const region_chars_max: usize = 32;

/// Smallest `MaximumMessageSize` a queue may set.
pub const message_bytes_min: u32 = 1_024;
/// Largest message (body + attribute names, data types and values), and the default
/// `MaximumMessageSize`.
pub const message_bytes_max: u32 = 1_048_576;

/// Messages per receive, and entries per batch request.
pub const batch_entries_max: u32 = 10;

/// Longest delay, per queue (`DelaySeconds`) or per message.
pub const delay_s_max: u32 = 900;
/// Default queue delay.
pub const delay_s_default: u32 = 0;

/// Longest visibility timeout, and the total visibility of one receive (the 12 h cap).
pub const visibility_timeout_s_max: u32 = 43_200;
/// Default visibility timeout of a queue.
pub const visibility_timeout_s_default: u32 = 30;
/// The 12 h cap in ms: an in-flight message's deadline is at most this long after its receive.
pub const visibility_total_ms_max: u64 = visibility_timeout_s_max as u64 * 1_000;

/// Longest long poll (`WaitTimeSeconds`, `ReceiveMessageWaitTimeSeconds`).
pub const wait_s_max: u32 = 20;
/// Default queue long-poll time.
pub const wait_s_default: u32 = 0;

/// Shortest `MessageRetentionPeriod`.
pub const retention_s_min: u32 = 60;
/// Longest `MessageRetentionPeriod` (14 days).
pub const retention_s_max: u32 = 1_209_600;
/// Default `MessageRetentionPeriod` (4 days).
pub const retention_s_default: u32 = 345_600;

/// Message attributes per message.
pub const message_attributes_max: usize = 10;
/// Longest message attribute name.
pub const message_attribute_name_chars_max: usize = 256;
/// Longest message attribute data type (`Number.java.lang.Long` and the like).
pub const message_attribute_type_chars_max: usize = 256;

/// Smallest `maxReceiveCount` of a redrive policy.
pub const max_receive_count_min: u32 = 1;
/// Largest `maxReceiveCount` of a redrive policy.
pub const max_receive_count_max: u32 = 1_000;
/// Source queues a `RedriveAllowPolicy` of kind `byQueue` may name.
pub const redrive_allow_sources_max: usize = 10;

/// Longest `AWSTraceHeader` a message keeps (Trireme's bound; X-Ray headers are far shorter).
pub const trace_header_chars_max: usize = 1_024;
/// Longest `MessageGroupId` (SQS's).
pub const group_id_chars_max: usize = 128;

/// Longest access `Policy` a queue keeps (Trireme's bound: the policy is stored in the queue's
/// record, which is read whole).
pub const queue_policy_bytes_max: usize = 20 * 1_024;
/// Longest `KmsMasterKeyId` a queue keeps (Trireme's bound; real key ids and ARNs are far shorter).
pub const kms_key_id_chars_max: usize = 2_048;
/// Shortest `KmsDataKeyReusePeriodSeconds`.
pub const kms_data_key_reuse_s_min: u32 = 60;
/// Longest `KmsDataKeyReusePeriodSeconds` (24 h).
pub const kms_data_key_reuse_s_max: u32 = 86_400;
/// The default `KmsDataKeyReusePeriodSeconds` (5 minutes).
pub const kms_data_key_reuse_s_default: u32 = 300;
/// Queues in one chain of redrive policies (a source, its dead-letter queue, that queue's
/// dead-letter queue, ...). A receive that moves a message serves the dead-letter queue at once,
/// and that serve may move it on, so the chain bounds the depth of that recursion.
pub const redrive_chain_queues_max: usize = 8;
/// Messages one redrive command may move (the shell drives a move task in steps of at most
/// this many, which bounds the work of one action).
pub const redrive_messages_max: u32 = 10_000;

/// How long a deduplication id is remembered after the send that stored it.
pub const dedup_window_ms: u64 = 300_000;
/// Longest deduplication id.
pub const dedup_id_chars_max: usize = 128;

/// Shortest time between two purges of one queue.
pub const purge_interval_ms: u64 = 60_000;
/// How long a deleted queue's name stays unavailable.
pub const queue_name_reuse_ms: u64 = 60_000;

/// In-flight messages per queue; a receive beyond it is refused (SQS: OverLimit).
pub const inflight_per_queue_max: u64 = 120_000;
/// Open long polls per queue; one more is refused.
pub const waiters_per_queue_max: usize = 10_000;
/// Queues per node.
pub const queues_max: usize = 100_000;

/// Tags per queue.
pub const tags_per_queue_max: usize = 50;
/// Longest tag key.
pub const tag_key_chars_max: usize = 128;
/// Longest tag value.
pub const tag_value_chars_max: usize = 256;

// A queue's size limit must lie inside the hard cap.
const _: () = assert!(message_bytes_min <= message_bytes_max);
// A receive can always deliver at least one message.
const _: () = assert!(batch_entries_max >= 1);
// The 12 h cap must allow the longest single visibility timeout.
const _: () = assert!(visibility_timeout_s_max as u64 * 1_000 <= visibility_total_ms_max);
// Defaults lie inside their ranges.
const _: () = assert!(visibility_timeout_s_default <= visibility_timeout_s_max);
const _: () = assert!(retention_s_min <= retention_s_default);
const _: () = assert!(retention_s_default <= retention_s_max);
const _: () = assert!(kms_data_key_reuse_s_min <= kms_data_key_reuse_s_default);
const _: () = assert!(kms_data_key_reuse_s_default <= kms_data_key_reuse_s_max);
const _: () = assert!(max_receive_count_min >= 1);
const _: () = assert!(max_receive_count_min <= max_receive_count_max);
// A purge and a resend within the deduplication window are still deduplicated: the window
// outlasts the purge interval, so a client that retries across a purge cannot double-send.
const _: () = assert!(dedup_window_ms >= purge_interval_ms);
// A source and its dead-letter queue form the shortest chain.
const _: () = assert!(redrive_chain_queues_max >= 2);
// A redrive command must be able to move at least a batch.
const _: () = assert!(redrive_messages_max >= batch_entries_max);
// The in-flight cap must allow at least one full receive.
const _: () = assert!(inflight_per_queue_max >= batch_entries_max as u64);
// The longest queue name fits in the SQS limit of 80 characters.
const _: () = assert!(queue_name_chars_max <= 80);
