//! `trireme-client`: an async Rust client for Trireme nodes, over gRPC (`trireme.v1`).
//!
//! It owns the typed API (requests, replies and errors of its own, so prost types never reach
//! callers), the choice of node and the retrying of calls that may be repeated. It must never
//! retry a call whose repetition could change its effect (a receive, a send without a
//! deduplication id) once that call may have reached a node.
//!
//! A client is given every node of a cluster (any node serves any call) and spreads over them:
//! each client has a home endpoint and stays there while it answers. An endpoint whose attempt
//! failed on the way (connection refused, node unavailable, no answer in time) is skipped for a
//! growing, jittered period and then probed again; the call moves on to the next endpoint at
//! once when it may be repeated, and fails with [`Error::NoEndpointAvailable`], naming every
//! endpoint tried, when none answers within its attempts and deadline ([`RetryPolicy`]).
//!
//! Delivery is at least once, and the client adds a way to see a message twice: a send without
//! a deduplication id whose attempt may have reached a node is never repeated, so its error may
//! hide a message that was stored, and an application that sends it again then stores it twice.
//! Give a send a deduplication id to make any repetition, the client's or yours, store it once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), trireme_client::Error> {
//! use trireme_client::{Client, QueueAttributes, QueueName, ReceiveOptions, SendMessage};
//!
//! let client = Client::connect(["http://127.0.0.1:7100"])?;
//! let queue = QueueName::new("orders")?;
//! client.create_queue(&queue, &QueueAttributes::default()).await?;
//! client.send_message(&queue, &SendMessage::new("hello")).await?;
//! let options = ReceiveOptions { max_messages: 10, wait_seconds: Some(20), ..Default::default() };
//! for message in client.receive_messages(&queue, &options).await? {
//!     client.delete_message(&queue, &message.receipt_handle).await?;
//! }
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod backoff;
mod client;
mod endpoints;
mod error;
pub mod limits;
mod retry;
mod types;
pub mod worker;

pub use backoff::Backoff;
pub use client::{Client, ClientConfig, DEFAULT_ENDPOINT, SendBatchEntry};
pub use error::Error;
pub use retry::RetryPolicy;
pub use types::{
    AttributeValue, BatchEntryError, BatchOutcome, CreatedQueue, DeleteEntry, Message,
    MessageAttribute, MessageId, QueueAttributeChanges, QueueAttributes, QueueInfo, QueueName,
    QueuePage, QueueSettings, QueueStats, ReceiptHandle, ReceiveOptions, RedriveAllowPolicy,
    RedriveChange, RedrivePolicy, RedriveStatus, RedriveTask, SendMessage, SentBatchEntry,
    SentMessage, StartRedrive, TaskHandle, VisibilityChange,
};
pub use worker::{
    HandlerError, HandlerOutcome, Job, Worker, WorkerConfig, WorkerCounters, WorkerCounts,
    WorkerMetrics,
};
