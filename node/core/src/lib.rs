//! trireme-core: one node's queues as a pure, deterministic state machine
//! (spec/queue-core.md). It owns queue and message state, receipt-handle checks, long-poll
//! waiters, deduplication windows, dead-letter moves and redrive, and says which stored
//! records changed. It must never read a clock, draw randomness, block, log, or touch a file or
//! socket: time and ids come in as arguments, and the shell around it does all I/O.
#![forbid(unsafe_code)]

mod attributes;
mod command;
mod error;
mod ids;
#[cfg(debug_assertions)]
mod invariants;
pub mod limits;
mod message;
mod queue;
mod queues;
mod records;

pub use attributes::{
    AttributeChanges, KeptSettings, QueueAttributes, RedriveAllow, RedrivePolicy,
};
pub use command::{Command, Delivery, Outcome, Step, Wakeup};
pub use error::{HandleProblem, Reject};
pub use ids::{
    ClaimTag, DedupId, Incarnation, MessageId, Millis, QueueName, QueuePrefixes, ReceiptHandle,
    WaiterId, region_is_legal,
};
pub use message::{
    AttributeValue, MessageState, MessageView, SystemAttributes, body_char_allowed, check_message,
    check_system_attributes, message_size_bytes,
};
pub use queue::{MessageCounts, QueueStats, QueueView, WaiterView};
pub use queues::{GoneReason, Queues, check_tags, receive_parameters};
pub use records::{
    Change, DedupRecord, DeletedNameRecord, MessageBodyRecord, MessageRecord, QueueRecord, Record,
    RecordKey,
};
