//! Overload (issue 16): a node driven far past its capacity keeps answering, sheds what it
//! cannot queue with the throttling refusal (gRPC `RESOURCE_EXHAUSTED`, reason `Overloaded`),
//! and loses nothing it acknowledged.
//!
//! Capacity here is the engine's queue of commands, made small (16), and the flood is made
//! certain to exceed it without any timing: the node's disk is held in a sync (a gate in front
//! of an in-memory disk), so the engine takes nothing while the flood arrives. Then the gate
//! opens and a second, unthrottled flood of the same size runs against the working node. The
//! counts are printed; the checks are only what must hold whatever the scheduling.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tokio::net::TcpListener;
use tonic::Code;
use trireme_node::Node;
use trireme_node::clock::SystemClock;
use trireme_node::config::Config;
use trireme_node::status::REASON_KEY;
use trireme_node::storage::Storage;
use trireme_proto::v1 as pb;

use crate::harness::{connect, eventually, send_request};

/// The engine's queue of commands in this test.
const QUEUED_MAX: usize = 16;
/// Concurrent senders, each its own gRPC connection's worth of calls.
const SENDERS: usize = 64;
/// Sends each sender makes per flood.
const SENDS_PER_SENDER: usize = 40;

/// An in-memory disk whose syncs wait while the gate is closed.
#[derive(Debug)]
struct GatedDisk {
    inner: redb::backends::InMemoryBackend,
    gate: Arc<Gate>,
}

/// Holds syncs while closed; counts the syncs held.
#[derive(Debug, Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    held: AtomicU64,
}

impl Gate {
    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }
    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.opened.notify_all();
    }
    fn wait(&self) {
        let mut closed = self.closed.lock().unwrap();
        if *closed {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
    }
}

/// Opens its gate when dropped: a test that fails while the disk stalls ends instead of holding
/// the engine's thread (and the runtime's shutdown) forever.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl redb::StorageBackend for GatedDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.gate.wait();
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.inner.write(offset, data)
    }
}

/// What one flood got: the ids of acknowledged sends, and how many were shed.
#[derive(Default)]
struct Flood {
    acknowledged: BTreeSet<String>,
    shed: usize,
}

/// `SENDERS` concurrent senders of `SENDS_PER_SENDER` messages each to `queue`. Every answer is
/// an acknowledgement or the throttling refusal; anything else fails the test.
/// `shed_so_far` counts the refusals as they come.
async fn flood(
    address: std::net::SocketAddr,
    queue: &str,
    round: &str,
    shed_so_far: Arc<AtomicUsize>,
) -> Flood {
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let mut client = connect(address).await;
        let queue = queue.to_owned();
        let round = round.to_owned();
        let shed_so_far = shed_so_far.clone();
        senders.push(tokio::spawn(async move {
            let mut got = Flood::default();
            for n in 0..SENDS_PER_SENDER {
                let body = format!("{round}-{sender}-{n}");
                match client.send_message(send_request(&queue, &body)).await {
                    Ok(sent) => {
                        got.acknowledged.insert(sent.into_inner().message_id);
                    }
                    Err(status) => {
                        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                        assert_eq!(
                            status.metadata().get(REASON_KEY).unwrap(),
                            "Overloaded",
                            "{status:?}"
                        );
                        got.shed += 1;
                        shed_so_far.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            got
        }));
    }
    let mut total = Flood::default();
    for sender in senders {
        let got = sender.await.unwrap();
        total.acknowledged.extend(got.acknowledged);
        total.shed += got.shed;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flooded_node_sheds_with_throttling_and_loses_nothing_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::with_data_dir(dir.path());
    config.engine_queue_commands_max = QUEUED_MAX;
    config.commit_batch_commands_max = QUEUED_MAX;
    let gate = Arc::new(Gate::default());
    let disk = GatedDisk {
        inner: redb::backends::InMemoryBackend::new(),
        gate: gate.clone(),
    };
    let storage = Storage::open_backend(disk, 4 << 20).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut node = Node::start(
        &config,
        storage,
        trireme_node::tcp_incoming(listener),
        Arc::new(SystemClock),
    )
    .unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = metrics_listener.local_addr().unwrap();
    node.serve_metrics(metrics_listener);
    let mut client = connect(address).await;
    client
        .create_queue(pb::CreateQueueRequest {
            name: "flood".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();

    // The disk stalls: the engine is held in the commit of this one send.
    gate.close();
    let _open_at_the_end = OpenOnDrop(gate.clone());
    let stalled = {
        let mut client = client.clone();
        tokio::spawn(async move { client.send_message(send_request("flood", "first")).await })
    };
    eventually("the engine is held in a sync", || {
        let gate = gate.clone();
        async move { gate.held.load(Ordering::SeqCst) > 0 }
    })
    .await;

    // Flood 1, against the stalled engine. A sender whose send was queued waits for the gate;
    // the others' sends are shed at once. Once one send was shed the queue is full, and stays
    // full while the disk stalls: from then on every new call is refused, certainly.
    let shed_so_far = Arc::new(AtomicUsize::new(0));
    let flooding = tokio::spawn(flood(address, "flood", "stalled", shed_so_far.clone()));
    eventually("the stalled node sheds a send", || {
        let shed_so_far = shed_so_far.clone();
        async move { shed_so_far.load(Ordering::SeqCst) > 0 }
    })
    .await;
    let mut probe = connect(address).await;
    let refused = probe
        .send_message(send_request("flood", "probe"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // The node's other ports answer too.
    let health = get_health(metrics).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    gate.open();
    let stalled_flood = flooding.await.unwrap();
    let first = stalled.await.unwrap().unwrap().into_inner().message_id;

    // Flood 2, against the working node.
    let working_flood = flood(address, "flood", "working", Arc::new(AtomicUsize::new(0))).await;

    let offered = 2 * SENDERS * SENDS_PER_SENDER;
    println!(
        "flood: {offered} sends offered by {SENDERS} senders to a node with {QUEUED_MAX} queued \
         commands; stalled disk: {} acknowledged, {} shed; working disk: {} acknowledged, {} shed",
        stalled_flood.acknowledged.len(),
        stalled_flood.shed,
        working_flood.acknowledged.len(),
        working_flood.shed
    );
    // Every sender's call was answered, one way or the other.
    assert_eq!(
        stalled_flood.acknowledged.len() + stalled_flood.shed,
        SENDERS * SENDS_PER_SENDER
    );
    assert_eq!(
        working_flood.acknowledged.len() + working_flood.shed,
        SENDERS * SENDS_PER_SENDER
    );
    // (How many of the first flood were shed depends on how far its senders got before the
    // gate opened; that some were, and that a call was refused while the engine took nothing,
    // is checked above.)

    // Every acknowledged send is there, exactly once; nothing shed was stored.
    let mut acknowledged: BTreeSet<String> = BTreeSet::new();
    acknowledged.insert(first);
    acknowledged.extend(stalled_flood.acknowledged);
    acknowledged.extend(working_flood.acknowledged);
    let mut received = BTreeSet::new();
    for _ in 0..(acknowledged.len() + 10) {
        let page = client
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: "flood".to_owned(),
                max_messages: 10,
                visibility_timeout_seconds: Some(600),
                wait_seconds: Some(0),
            })
            .await
            .unwrap()
            .into_inner();
        if page.messages.is_empty() {
            break;
        }
        for message in page.messages {
            assert!(received.insert(message.message_id), "received twice");
        }
    }
    assert_eq!(received, acknowledged);
    node.shutdown().await;
}

/// `GET /health` on the metrics port, as raw HTTP/1.1: the status line and the rest.
async fn get_health(metrics: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(metrics).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}
