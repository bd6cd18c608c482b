//! Every cap of the node shell (the queue caps live in `trireme_core::limits`). Names are noun
//! first, unit last; `_default` marks a value the configuration may change. Relations between
//! caps are checked at compile time at the bottom.
#![allow(non_upper_case_globals)] // The style names caps like fields (`message_bytes_max`).

use trireme_core::limits as core;

/// Largest gRPC request the server decodes. A batch carries at most `batch_payload_bytes_max`
/// of messages plus framing; the rest is headroom for attribute names and ids.
pub const grpc_request_bytes_max_default: usize = 2 * 1024 * 1024;
/// Largest gRPC response the server encodes: a receive of 10 messages of 1 MiB each, plus
/// handles and metadata.
pub const grpc_response_bytes_max_default: usize = 12 * 1024 * 1024;
/// Client connections the gRPC port serves at once; beyond, the node accepts no more until one
/// closes (`connections`). Each carries up to `grpc_streams_per_connection_max` calls.
pub const grpc_connections_max_default: usize = 4_096;
/// Client connections the SQS port serves at once; beyond, the node accepts no more until one
/// closes.
pub const sqs_connections_max_default: usize = 4_096;
/// The most either connection cap may be configured to. Each served connection holds a file
/// descriptor and its buffers; a cap above the descriptors a process may open (commonly 1,024
/// to 1,048,576) caps nothing, and one above tokio's semaphore maximum (`usize::MAX >> 3`)
/// would panic at start. 65,536 is the client ports one address can take from another.
pub const connections_max_ceiling: usize = 65_536;
/// Connections the peer port serves at once: the other members' links (at most
/// `cluster_members_max - 1` of them, each a few connections), never clients, so not
/// configurable with the client caps.
pub const peer_connections_max: usize = 4_096;
/// Concurrent HTTP/2 streams per client connection: what one client's connection may hold of
/// the node's `long_polls_max`. The client crate's `CALLS_PER_CONNECTION_MAX` repeats it (its
/// bench opens enough connections for its long polls).
pub const grpc_streams_per_connection_max: u32 = 1_024;
/// HTTP/2 keepalive ping interval: finds dead peers of idle long-poll connections.
pub const grpc_keepalive_interval_s: u64 = 20;
/// How long a keepalive ping may go unanswered before the connection is closed.
pub const grpc_keepalive_timeout_s: u64 = 10;

/// Longest a request may run before the server answers `CANCELLED`. Must exceed the longest
/// long poll, or long polls would time out instead of answering empty.
pub const request_timeout_s_default: u64 = 60;

/// Payload of one send batch: the sum of all bodies and attributes (SQS's limit).
pub const batch_payload_bytes_max: u64 = 1_048_576;
/// Longest batch entry id (ids are 1 to this many of `[A-Za-z0-9_-]`), on both endpoints.
pub const batch_entry_id_chars_max: usize = 80;

/// Commands the engine applies before one group commit. Bounds the latency a commit adds to
/// the first command of a batch and the size of one write transaction.
pub const commit_batch_commands_max_default: usize = 1_024;
/// Commands waiting for the engine. A full queue makes callers wait (backpressure), it never
/// drops a command.
pub const engine_queue_commands_max_default: usize = 4_096;
/// Open long polls per node. Beyond it a receive that finds nothing and would wait is refused
/// at once with the throttling error (`LongPollsFull`: gRPC `RESOURCE_EXHAUSTED`/`Overloaded`,
/// SQS `RequestThrottled`), so clients back off instead of polling again at once; a warning is
/// logged. (The per-queue cap, `trireme_core::limits::waiters_per_queue_max`, is refused
/// `WaiterLimit` / SQS `OverLimit`; a cluster member's edge enforces both.)
pub const long_polls_max_default: usize = 10_000;
/// Queues whose decoded attributes a cluster member's edge keeps (decoding the attribute
/// registers' JSON on every request was ~6 % of a member's CPU re-opening long polls,
/// BENCHMARKS.md 6f); a new queue beyond it empties the cache.
pub const decoded_attributes_queues_max: usize = 4_096;

/// Trace ids one replica call's metadata lists (a batch of the peer links serves up to 512
/// requests); the rest are counted, not listed, so the header stays about 1 KiB.
pub const trace_ids_per_call_max: usize = 64;

/// Messages a console page shows at most (a peek, a dead-letter queue's messages).
pub const console_messages_per_page_max: usize = 50;
/// Characters of a body the console shows; the rest is cut off with `…`.
pub const console_body_chars_max: usize = 2_048;
/// Queues the console's queue list shows at most.
pub const console_queues_per_page_max: usize = 500;
/// A queue's tags the console shows at most (SQS allows 50).
pub const console_tags_shown_max: usize = 50;
/// Move tasks of a dead-letter queue the console shows, newest first.
pub const console_move_tasks_shown_max: usize = 10;
/// Time between two samples of the queues' depths for the console's charts.
pub const console_sample_period_ms: u64 = 5_000;
/// Samples the console keeps: with the period, the charts' window (10 minutes).
pub const console_samples_max: usize = 120;
/// The shortest window a console chart shows (a new node's few samples are not squeezed into
/// its right edge).
pub const console_chart_window_ms_min: u64 = 30_000;
/// Console sessions held at once; beyond it the one that ends soonest is dropped.
pub const console_sessions_max: usize = 1_024;
/// A console session's life, logged in or not.
pub const console_session_ttl_s: u64 = 8 * 3_600;
/// Largest form the console reads (a login or an action: a few short fields).
pub const console_form_bytes_max: usize = 16 * 1024;

/// redb page cache, in MiB.
pub const db_cache_mib_default: usize = 64;

/// Queue names one `ListQueues` page may hold (SQS's limit), also the default page.
pub const list_queues_results_max: u32 = 1_000;
/// Redrive tasks one `ListRedrives` answer may hold.
pub const list_redrives_results_max: u32 = 10;

/// Fastest rate a redrive task may be asked for (SQS's `MaxNumberOfMessagesPerSecond`).
pub const redrive_rate_per_s_max: u32 = 500;
/// Messages one step of a redrive task moves when the caller asked for no rate ("as fast as
/// the node allows"): each step is one group commit.
pub const redrive_step_messages_max: u32 = 100;
/// Redrive tasks remembered per node (running and finished); the oldest finished one is
/// forgotten first.
pub const redrive_tasks_kept_max: usize = 100;
/// Redrive tasks running at once per node.
pub const redrive_tasks_running_max: usize = 10;

/// How long shutdown waits for open requests to finish after long polls were answered.
pub const shutdown_grace_s_default: u64 = 10;

/// Members of one cluster. Every member keeps a link (and its tasks) to every other, and an
/// anti-entropy pass runs a round with each: the work per node grows with this.
pub const cluster_members_max: usize = 64;
/// How long a cluster operation waits for its quorum before answering unavailable. With two
/// replicas up it answers as soon as they do; this bounds only an operation that cannot reach
/// two.
pub const operation_timeout_ms_default: u64 = 5_000;
/// Longest operation timeout accepted: `horizon_ms` must exceed it by far.
pub const operation_timeout_ms_max: u64 = 600_000;
/// Connecting to a peer's replica service; a dead peer costs a request at most this (or the
/// operation's own deadline, whichever is first).
pub const peer_connect_timeout_ms: u64 = 1_000;
/// A peer link pings its connection after this long without a frame from the peer: every
/// quorum with a member down needs the link between the other two, so a connection that went
/// silent without closing (a healed partition's retransmission backoff, a peer's new address)
/// must be found in seconds, not at the public API's 20 s (spec/replication.md, *A link that
/// goes silent is closed within two seconds*).
pub const peer_keepalive_interval_ms: u64 = 1_000;
/// How long that ping may go unanswered before the link closes the connection; the next call
/// connects anew.
pub const peer_keepalive_timeout_ms: u64 = 1_000;
/// TLS handshakes in progress at once on the peer port; beyond, the node accepts no more
/// connections until one finishes (the kernel's backlog holds them).
pub const peer_tls_handshakes_max: usize = 64;
/// How long a connection to the peer port may take to finish its TLS handshake before it is
/// closed and logged.
pub const peer_tls_handshake_timeout_ms: u64 = 5_000;
/// Largest message either end of a replica call decodes or encodes: the server's requests and
/// replies, and the clients' (`cluster::peers::replica_client`) alike. An `Exchange` batch
/// (cut by `peer_batch_requests_max` and `peer_batch_bytes_max`) or an anti-entropy page (about
/// 2 MiB) fits with room to spare. tonic's default decoding limit is 4 MiB, which a batch of
/// four reads of 1 MiB messages already exceeds, so both ends set this one.
pub const peer_request_bytes_max: usize = 64 * 1024 * 1024;
/// Requests one `Exchange` call to a peer carries at most.
pub const peer_batch_requests_max: usize = 512;
/// Bytes of one replica record besides its message's body and attributes (which
/// `message_bytes_max` bounds): key, ids, stamps, claim, source queue, deduplication id, trace
/// header and the codec's framing are far below this. A queue's name record (policy, tags,
/// attributes), a move task's and a deduplication record are smaller than a message's.
pub const peer_record_overhead_bytes_max: usize = 64 * 1024;
/// What a request that a peer answers with a record (a read, a name vote, a deduplication
/// put) counts toward its call's bytes: the largest record, since the reply's size is not known
/// when the request is sent. A write counts its encoded size.
pub const peer_read_bytes: usize =
    core::message_bytes_max as usize + peer_record_overhead_bytes_max;
/// Bytes of requests (and of the records their replies may carry) one `Exchange` call counts at
/// most (spec/replication.md §13, *Batching*): with `peer_read_bytes` per read, 52 reads.
pub const peer_batch_bytes_max: usize = 56 * 1024 * 1024;
/// Protobuf framing of one entry of a batch or its reply (tags and lengths), at most.
pub const peer_entry_framing_bytes_max: usize = 64;
/// The rest of a call's message besides its entries (request id, sender, trace metadata is a
/// header), at most.
pub const peer_call_framing_bytes_max: usize = 64 * 1024;
/// Batches a cluster member's replica store holds waiting for (or inside) its committer before
/// it sheds: from this many on, a peer's batch is answered *overloaded* at once and the member's
/// own clients' writes skip its replica (spec/replication.md#durability, *A replica that is
/// overloaded*). Background work (anti-entropy, collection, move tasks) waits for room instead.
pub const replica_batches_queued_max: usize = 512;
/// The tombstone horizon, `HORIZON` (spec/replication.md, constants): a replica refuses a
/// request older than this by its sender's clock, and collection waits it out.
pub const horizon_ms: u64 = 24 * 3_600_000;

const _: () = assert!(console_sessions_max > 0 && console_samples_max > 1);
const _: () = assert!(console_messages_per_page_max <= 1_000);
const _: () = assert!(request_timeout_s_default > core::wait_s_max as u64 + 5);
const _: () = assert!(batch_payload_bytes_max >= core::message_bytes_max as u64);
const _: () = assert!(grpc_request_bytes_max_default as u64 > batch_payload_bytes_max + 64 * 1024);
const _: () = assert!(
    grpc_response_bytes_max_default as u64
        > core::batch_entries_max as u64 * core::message_bytes_max as u64 + 256 * 1024
);
const _: () = assert!(redrive_step_messages_max <= core::redrive_messages_max);
const _: () = assert!(redrive_rate_per_s_max <= core::redrive_messages_max);
const _: () = assert!(commit_batch_commands_max_default <= engine_queue_commands_max_default);
const _: () = assert!(redrive_tasks_running_max <= redrive_tasks_kept_max);
const _: () = assert!(operation_timeout_ms_default < request_timeout_s_default * 1_000);
// HORIZON is at least SKEW_MAX (500 ms) + the longest operation timeout + the longest delay.
const _: () = assert!(horizon_ms > 500 + operation_timeout_ms_max * 2);
const _: () = assert!(operation_timeout_ms_default <= operation_timeout_ms_max);
const _: () = assert!(cluster_members_max <= u16::MAX as usize);
const _: () = assert!(grpc_connections_max_default >= 1);
const _: () = assert!(sqs_connections_max_default >= 1);
const _: () = assert!(grpc_connections_max_default <= connections_max_ceiling);
const _: () = assert!(sqs_connections_max_default <= connections_max_ceiling);
const _: () = assert!(connections_max_ceiling <= usize::MAX >> 3);
const _: () = assert!(peer_connections_max >= cluster_members_max * 4);
// A batch cut by count and bytes fits the message limit at both ends: its request (writes at
// their encoded size, reads' keys) and its reply (reads' records at most `peer_read_bytes`
// each, writes' acks within the framing).
const _: () = assert!(
    peer_batch_bytes_max
        + peer_batch_requests_max * peer_entry_framing_bytes_max
        + peer_call_framing_bytes_max
        <= peer_request_bytes_max
);
// One read alone always fits a call, and so does one send batch's writes (each record is its
// message plus less than `peer_record_overhead_bytes_max`).
const _: () = assert!(peer_read_bytes <= peer_batch_bytes_max);
const _: () = assert!(
    batch_payload_bytes_max as usize
        + core::batch_entries_max as usize * peer_record_overhead_bytes_max
        <= peer_batch_bytes_max
);
// A receive's reads of `batch_entries_max` messages of the largest size go in one call.
const _: () = assert!(core::batch_entries_max as usize * peer_read_bytes <= peer_batch_bytes_max);
