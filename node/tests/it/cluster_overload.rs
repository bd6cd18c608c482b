//! A cluster member sheds load (issue 16; spec/replication.md#durability, *A replica that is
//! overloaded*): members in one process whose replica stores sit on in-memory disks with a gate
//! in front of their syncs, each store's committer on a runtime of its own so that a held sync
//! holds only that member's disk. A replica whose committer has as many batches as it sheds at
//! answers a peer's batch at once with *overloaded* and takes nothing; a coordinator hears it
//! as silence, not as a fault, and makes its quorum through the two others; with two replicas
//! overloaded an operation answers at once with the throttling refusal (`RESOURCE_EXHAUSTED`
//! `Overloaded`, SQS `RequestThrottled`), not at its deadline; and once the disks move again,
//! every acknowledged send is received, once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use redb::StorageBackend;
use redb::backends::InMemoryBackend;
use tonic::Code;
use trireme_core::{Command, Outcome, QueueAttributes, QueueName, SystemAttributes};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::cluster::edge::ClusterEdge;
use trireme_node::cluster::peers::LinkSettings;
use trireme_node::cluster::store::ReplicaStore;
use trireme_node::cluster::{Cluster, ClusterSettings, wire};
use trireme_node::engine::EngineError;
use trireme_node::handle::HandleCodec;
use trireme_node::status::REASON_KEY;
use trireme_node::tcp_incoming;
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_client::ReplicaClient;
use trireme_replication::coordinator::Request;
use trireme_replication::record::{Birth, Record};
use trireme_replication::replica::Write;
use trireme_replication::{NodeId, RecordKey};

use crate::harness::eventually_within;

/// Batches a store holds before it sheds, in this test.
const SHED_AT: usize = 4;
/// Far beyond any answer this test waits for: an operation that meets two overloaded replicas
/// answers when they said so, not at this deadline.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);
/// What "at once" allows here, on a loaded machine.
const AT_ONCE: Duration = Duration::from_secs(20);

/// Holds syncs while closed.
#[derive(Debug, Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }
    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.opened.notify_all();
    }
    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
    }
}

/// An in-memory disk whose syncs wait while its gate is closed.
#[derive(Debug)]
struct GatedDisk {
    inner: InMemoryBackend,
    gate: Arc<Gate>,
}

impl StorageBackend for GatedDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.gate.pass();
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write(offset, data)
    }
}

struct Member {
    cluster: Cluster,
    edge: ClusterEdge,
    gate: Arc<Gate>,
    address: std::net::SocketAddr,
    /// Runs this member's committer, so that a held sync holds only it.
    disk_runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.gate.open();
        if let Some(runtime) = self.disk_runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn settings(node: u16, addresses: &BTreeMap<u16, std::net::SocketAddr>) -> ClusterSettings {
    ClusterSettings {
        node: NodeId(node),
        peers: addresses
            .iter()
            .filter(|(id, _)| **id != node)
            .map(|(id, address)| (NodeId(*id), address.to_string()))
            .collect(),
        operation_timeout: OPERATION_TIMEOUT,
        link: LinkSettings {
            connect_timeout: Duration::from_millis(500),
            call_timeout: OPERATION_TIMEOUT,
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(5),
        },
        horizon_ms: 24 * 3_600_000,
        dedup_window_ms: trireme_core::limits::dedup_window_ms,
        monitor_clock: true,
    }
}

async fn start() -> Vec<Member> {
    let mut reserved = super::loopback::reserve(1..=3);
    let addresses = super::loopback::addresses(&reserved);
    let members: Vec<Member> = (1..=3)
        .map(|node| {
            let gate = Arc::new(Gate::default());
            let disk = GatedDisk {
                inner: InMemoryBackend::new(),
                gate: Arc::clone(&gate),
            };
            let disk_runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let store = {
                let _on_its_runtime = disk_runtime.enter();
                // The group log's syncs wait at the same gate as the database's.
                let log = GatedDisk {
                    inner: InMemoryBackend::new(),
                    gate: Arc::clone(&gate),
                };
                let (store, _committer) =
                    ReplicaStore::open_backend(disk, log, 4 << 20, NodeId(node), u64::from(node))
                        .expect("the store opens on memory");
                store.shedding_at(SHED_AT)
            };
            let clock = Arc::new(SystemClock);
            let (cluster, service) = Cluster::start(
                &settings(node, &addresses),
                store,
                clock.clone(),
                Some(u64::from(node)),
            )
            .expect("the cluster starts");
            let listener = super::loopback::listener(reserved.remove(&node), addresses[&node]);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service.into_server())
                    .serve_with_incoming(tcp_incoming(listener)),
            );
            let handles = HandleCodec::new(b"cluster-overload-handle-key-0001").expect("a key");
            let edge = ClusterEdge::new(cluster.clone(), handles, clock, Some(u64::from(node)));
            Member {
                cluster,
                edge,
                gate,
                address: addresses[&node],
                disk_runtime: Some(disk_runtime),
            }
        })
        .collect();
    for member in &members {
        tokio::time::timeout(Duration::from_secs(30), member.cluster.joined())
            .await
            .expect("the member joins");
    }
    members
}

fn queue() -> QueueName {
    QueueName::try_from("flood".to_owned()).expect("a valid name")
}

fn send(member: &Member, body: &str) -> Command {
    Command::Send {
        queue: queue(),
        id: member.edge.new_message_id(),
        body: body.to_owned(),
        attributes: BTreeMap::new(),
        system: SystemAttributes::default(),
        delay_s: None,
        dedup: None,
    }
}

/// A peer's batch of one acknowledged write, straight to `member`'s replica service.
async fn exchange_one(member: &Member) -> pb::BatchReply {
    let mut peer = ReplicaClient::connect(format!("http://{}", member.address))
        .await
        .expect("the peer service answers");
    let key = RecordKey {
        queue: queue(),
        incarnation: trireme_core::Incarnation::local(trireme_core::Millis(1)),
        message: trireme_core::MessageId(77),
    };
    let write = Request::Write {
        write: Box::new(Write::Merge(Record::sent(Birth {
            payload: b"direct".to_vec(),
            sent_at: SystemClock.now(),
            visible_from: trireme_core::Millis(0),
            source_queue: None,
            dedup_id: None,
        }))),
        ack: true,
    };
    peer.exchange(pb::Batch {
        request_id: 1,
        sender: Some(pb::Sender {
            node_id: 2,
            disk_id: 2,
            clock_ms: SystemClock.now().0,
        }),
        entries: vec![wire::entry(&key, &write)],
        ..pb::Batch::default()
    })
    .await
    .expect("an overloaded replica still answers")
    .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_member_sheds_with_a_typed_refusal_and_loses_nothing_acknowledged() {
    let members = start().await;
    members[1]
        .edge
        .execute(Command::CreateQueue {
            name: queue(),
            attributes: QueueAttributes::default(),
            tags: BTreeMap::new(),
        })
        .await
        .expect("the queue is created");
    let mut acknowledged = BTreeSet::new();
    let mut sent = |outcome: Result<Outcome, EngineError>, body: String| match outcome {
        Ok(Outcome::Sent { .. }) => {
            acknowledged.insert(body);
        }
        other => panic!("{body}: {other:?}"),
    };

    // Node 1's disk stops. Sends through node 2 are acknowledged by nodes 2 and 3, and their
    // writes pile up at node 1 until its store holds SHED_AT batches.
    members[0].gate.close();
    let mut n = 0;
    while !members[0].cluster.store().overloaded() {
        assert!(n < 100, "node 1's store never filled");
        let body = format!("fill-{n}");
        sent(
            members[1].edge.execute(send(&members[1], &body)).await,
            body,
        );
        n += 1;
    }
    println!("node 1 overloaded after {n} sends through node 2");

    // A peer's batch is answered at once, overloaded, with nothing taken.
    let reply = tokio::time::timeout(AT_ONCE, exchange_one(&members[0]))
        .await
        .expect("an overloaded replica answers at once, it does not queue the batch");
    assert!(reply.overloaded, "{reply:?}");
    assert!(
        reply.replies.is_empty() && reply.fault.is_none(),
        "{reply:?}"
    );

    // A coordinator hears it as silence and makes its quorum through the others; node 1 is
    // noted overloaded, not faulted.
    let body = "past an overloaded replica".to_owned();
    sent(
        members[1].edge.execute(send(&members[1], &body)).await,
        body,
    );
    // The quorum of nodes 2 and 3 may answer before node 1's overloaded reply reaches node 2's
    // link (found by .ci/run on a clean clone): the mark follows that reply, at once but not
    // necessarily before the answer.
    eventually_within(
        "node 2 notes node 1 overloaded",
        Duration::from_secs(5),
        || async { members[1].cluster.overloaded_replicas() == [NodeId(1)] },
    )
    .await;
    assert!(members[1].cluster.replica_faults().is_empty());
    // Node 1 coordinates too: its own replica is skipped, its peers carry the send.
    let body = "through the overloaded member".to_owned();
    sent(
        tokio::time::timeout(AT_ONCE, members[0].edge.execute(send(&members[0], &body)))
            .await
            .expect("node 1's own replica does not hold up its operation"),
        body,
    );
    assert!(
        members[0]
            .cluster
            .overloaded_replicas()
            .contains(&NodeId(1))
    );

    // Node 3's disk stops too, under sends that then wait for it (each its own call to it),
    // until its store fills.
    members[2].gate.close();
    let mut waiting = Vec::new();
    while !members[2].cluster.store().overloaded() {
        assert!(waiting.len() < 100, "node 3's store never filled");
        let edge = members[1].edge.clone();
        let body = format!("waiting-{}", waiting.len());
        let command = send(&members[1], &body);
        waiting.push(tokio::spawn(
            async move { (body, edge.execute(command).await) },
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "node 3 overloaded after {} sends left waiting",
        waiting.len()
    );

    // Two overloaded replicas: the send cannot make its quorum now, and says so at once.
    let refused = tokio::time::timeout(
        AT_ONCE,
        members[1]
            .edge
            .execute(send(&members[1], "two replicas overloaded")),
    )
    .await
    .expect("answered once two replicas said they are overloaded, not at the deadline")
    .expect_err("one replica cannot ack a send");
    let EngineError::ReplicasOverloaded { reason } = &refused else {
        panic!("{refused:?}");
    };
    assert!(
        reason.contains("node 1") && reason.contains("node 3"),
        "{reason}"
    );
    let status = trireme_node::status::engine_status(&refused);
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.metadata().get(REASON_KEY).unwrap(), "Overloaded");

    // The disks move again: the waiting sends are acknowledged, and everything acknowledged is
    // there, once.
    members[0].gate.open();
    members[2].gate.open();
    let mut shed = 0;
    for waiter in waiting {
        // A waiting send that heard two replicas overloaded was refused so too.
        match waiter.await.unwrap() {
            (_, Err(EngineError::ReplicasOverloaded { .. })) => shed += 1,
            (body, outcome) => sent(outcome, body),
        }
    }
    let mut received = BTreeSet::new();
    for _ in 0..200 {
        let page = members[1]
            .edge
            .receive(queue(), 10, Some(600), Some(0))
            .await
            .expect("received");
        if page.is_empty() && received.is_superset(&acknowledged) {
            break;
        }
        for delivery in page {
            assert!(
                received.insert(delivery.body.clone()),
                "{} received twice",
                delivery.body
            );
        }
    }
    let lost: Vec<&String> = acknowledged.difference(&received).collect();
    assert!(lost.is_empty(), "acknowledged and not received: {lost:?}");
    println!(
        "{} sends acknowledged, all received once; {shed} waiting sends refused overloaded; \
         the refused one {}",
        acknowledged.len(),
        if received.contains("two replicas overloaded") {
            "was stored on one replica and received"
        } else {
            "was not received"
        }
    );
}

/// A member's long polls have the node's cap (`long_polls_max`): beyond it a receive that would
/// wait is refused at once with the throttling refusal (`LongPollsFull`: `RESOURCE_EXHAUSTED`
/// `Overloaded`), a short poll is still served, and the place frees when a wait ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_long_polls_beyond_the_cap_are_throttled() {
    let members = start().await;
    let handles = HandleCodec::new(b"cluster-overload-handle-key-0001").expect("a key");
    let edge = ClusterEdge::new(
        members[0].cluster.clone(),
        handles,
        Arc::new(SystemClock),
        Some(11),
    )
    .with_long_polls_max(1);
    edge.execute(Command::CreateQueue {
        name: queue(),
        attributes: QueueAttributes::default(),
        tags: BTreeMap::new(),
    })
    .await
    .expect("the queue is created");

    let waiting = {
        let edge = edge.clone();
        tokio::spawn(async move { edge.receive(queue(), 1, Some(600), Some(20)).await })
    };
    // The first wait holds the one place from its start.
    tokio::time::timeout(AT_ONCE, async {
        while edge.long_polls() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the first long poll waits");
    let refused = tokio::time::timeout(AT_ONCE, edge.receive(queue(), 1, Some(600), Some(20)))
        .await
        .expect("refused at once")
        .expect_err("a second long poll is over the cap");
    assert!(
        matches!(refused, EngineError::LongPollsFull { max: 1 }),
        "{refused:?}"
    );
    let status = trireme_node::status::engine_status(&refused);
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.metadata().get(REASON_KEY).unwrap(), "Overloaded");
    assert!(
        edge.receive(queue(), 1, Some(600), Some(0))
            .await
            .expect("a short poll takes no place")
            .is_empty()
    );

    // A send ends the first wait, and its place is free again.
    edge.execute(send(&members[0], "for the waiter"))
        .await
        .expect("sent");
    let delivered = tokio::time::timeout(AT_ONCE, waiting)
        .await
        .expect("the waiter is answered")
        .unwrap()
        .expect("received");
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].body, "for the waiter");
    edge.execute(send(&members[0], "for the next"))
        .await
        .expect("sent");
    let next = tokio::time::timeout(AT_ONCE, edge.receive(queue(), 1, Some(600), Some(20)))
        .await
        .expect("answered")
        .expect("a long poll has a place again");
    assert_eq!(next.len(), 1);
}
