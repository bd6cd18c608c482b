//! What the fuzz targets share: a node running alone on an in-memory disk, with the SQS router
//! and the gRPC service over it, on a current-thread runtime whose time is paused (a long poll
//! in an input ends at once instead of holding the fuzzer for 20 s).
//!
//! The node is rebuilt every [`INPUTS_PER_NODE`] inputs, so that what earlier inputs stored
//! cannot grow without bound over a long run (the fuzzer would report that as a leak or an
//! out-of-memory crash of its own making). This crate must never hide a failure: every panic,
//! in the target or in a task it spawned, aborts the process (libfuzzer-sys's panic hook) and is
//! a finding.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use trireme_node::backend::Backend;
use trireme_node::clock::SystemClock;
use trireme_node::engine::{Engine, EngineSettings};
use trireme_node::grpc::GrpcService;
use trireme_node::handle::HandleCodec;
use trireme_node::metrics::MessageCounters;
use trireme_node::sqs::{self, SqsSettings};
use trireme_node::storage::Storage;

/// Inputs one node serves before a fresh one replaces it.
pub const INPUTS_PER_NODE: u32 = 5_000;

/// The queue the seeds name (`"QueueUrl": "fuzz"`); created on every fresh node.
pub const QUEUE: &str = "fuzz";

/// Longest a single input may run, in paused time: long polls and retries end here.
const INPUT_TIME_MAX: Duration = Duration::from_secs(30);

/// One node and the runtime that drives it.
pub struct Node {
    runtime: tokio::runtime::Runtime,
    backend: Backend,
    router: axum::Router,
    served: u32,
}

impl Node {
    fn start() -> Node {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime builds");
        let backend = runtime.block_on(async {
            let storage = Storage::open_backend(redb::backends::InMemoryBackend::new(), 1 << 20)
                .expect("an in-memory database opens");
            let handles =
                HandleCodec::new(b"fuzz-handle-key-0123456789abcdef").expect("a 32-byte key");
            let engine = Engine::start(
                storage,
                Arc::new(SystemClock),
                handles,
                EngineSettings::default(),
                Some(16),
            )
            .expect("an empty database restores");
            let backend = Backend::alone(engine, MessageCounters::default());
            let service = GrpcService::new(backend.clone());
            let create = trireme_proto::v1::CreateQueueRequest {
                name: QUEUE.to_owned(),
                ..Default::default()
            };
            use trireme_proto::v1::queue_service_server::QueueService;
            service
                .create_queue(tonic::Request::new(create))
                .await
                .expect("the fuzz queue is created");
            backend
        });
        let router = sqs::router(backend.clone(), SqsSettings::default());
        Node {
            runtime,
            backend,
            router,
            served: 0,
        }
    }

    /// Runs `work` against this thread's node (a fresh one after [`INPUTS_PER_NODE`] inputs),
    /// for at most [`INPUT_TIME_MAX`] of paused time.
    pub fn with<F, Fut>(work: F)
    where
        F: FnOnce(Backend, axum::Router) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        thread_local! {
            static NODE: RefCell<Option<Node>> = const { RefCell::new(None) };
        }
        NODE.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot
                .as_ref()
                .is_none_or(|node| node.served >= INPUTS_PER_NODE)
            {
                *slot = None;
                *slot = Some(Node::start());
            }
            let node = slot.as_mut().expect("set above");
            node.served += 1;
            let future = work(node.backend.clone(), node.router.clone());
            node.runtime.block_on(async {
                // An input that outlives its time is cut off, as a client would give up; the
                // node must still answer the next one.
                let _ = tokio::time::timeout(INPUT_TIME_MAX, future).await;
            });
        });
    }
}
