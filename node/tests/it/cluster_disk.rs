//! Disk faults in a three-member cluster (spec/replication.md#durability, *A store that fails*):
//! members in one process whose replica stores sit on in-memory disks that can fill up. A
//! replica whose disk is full acks nothing and answers its peers with the fault; the two others
//! keep the cluster writing; with two full disks a send is refused as unavailable, naming both
//! disks, over gRPC as `UNAVAILABLE`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redb::StorageBackend;
use redb::backends::InMemoryBackend;
use tonic::Code;
use trireme_core::{Command, MessageId, Outcome, QueueAttributes, QueueName, SystemAttributes};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::cluster::edge::ClusterEdge;
use trireme_node::cluster::peers::LinkSettings;
use trireme_node::cluster::store::{FaultKind, ReplicaStore, StoreError};
use trireme_node::cluster::{Cluster, ClusterSettings, wire};
use trireme_node::engine::EngineError;
use trireme_node::handle::HandleCodec;
use trireme_node::tcp_incoming;
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_client::ReplicaClient;
use trireme_replication::coordinator::Request;
use trireme_replication::record::{Birth, Record};
use trireme_replication::replica::Write;
use trireme_replication::{NodeId, RecordKey};

use crate::harness::eventually;

/// A disk in memory that can fill up: writes and resizes then fail with ENOSPC, as a real full
/// disk's do.
#[derive(Debug)]
struct FillingDisk {
    inner: InMemoryBackend,
    full: Arc<AtomicBool>,
}

impl FillingDisk {
    fn space(&self) -> std::io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        Ok(())
    }
}

impl StorageBackend for FillingDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.space()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.space()?;
        self.inner.write(offset, data)
    }
}

struct DiskMember {
    cluster: Cluster,
    edge: ClusterEdge,
    full: Arc<AtomicBool>,
    address: SocketAddr,
}

const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

fn settings(node: u16, addresses: &BTreeMap<u16, SocketAddr>) -> ClusterSettings {
    ClusterSettings {
        node: NodeId(node),
        peers: addresses
            .iter()
            .filter(|(id, _)| **id != node)
            .map(|(id, address)| (NodeId(*id), address.to_string()))
            .collect(),
        // Far beyond what any answer here waits: an operation that meets two failed stores
        // answers when their faults are in, not at this deadline.
        operation_timeout: OPERATION_TIMEOUT,
        link: LinkSettings {
            connect_timeout: Duration::from_millis(500),
            call_timeout: Duration::from_secs(2),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(5),
        },
        horizon_ms: 24 * 3_600_000,
        dedup_window_ms: trireme_core::limits::dedup_window_ms,
        monitor_clock: true,
    }
}

/// Three members on loopback, on this test's runtime (their stores commit on it too), once
/// they joined (their databases are new: every peer must answer before any of them serves).
async fn start() -> Vec<DiskMember> {
    let mut reserved = super::loopback::reserve(1..=3);
    let addresses = super::loopback::addresses(&reserved);
    let members: Vec<DiskMember> = (1..=3)
        .map(|node| {
            let full = Arc::new(AtomicBool::new(false));
            let disk = FillingDisk {
                inner: InMemoryBackend::new(),
                full: Arc::clone(&full),
            };
            // The group log fills up with the database.
            let log = FillingDisk {
                inner: InMemoryBackend::new(),
                full: Arc::clone(&full),
            };
            let (store, _committer) =
                ReplicaStore::open_backend(disk, log, 4 << 20, NodeId(node), u64::from(node))
                    .expect("the store opens on memory");
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
            let handles = HandleCodec::new(b"cluster-disk-shared-handle-key").expect("a key");
            let edge = ClusterEdge::new(cluster.clone(), handles, clock, Some(u64::from(node)));
            DiskMember {
                cluster,
                edge,
                full,
                address: addresses[&node],
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
    QueueName::try_from("disks".to_owned()).expect("a valid name")
}

fn send(member: &DiskMember, body: &str) -> Command {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_acks_nothing_and_two_full_disks_refuse_the_send_naming_them() {
    let members = start().await;
    members[0]
        .edge
        .execute(Command::CreateQueue {
            name: queue(),
            attributes: QueueAttributes::default(),
            tags: BTreeMap::new(),
        })
        .await
        .expect("the queue is created");
    members[2]
        .edge
        .execute(send(&members[2], "before"))
        .await
        .expect("sent on three healthy disks");

    // One full disk: the other two replicas carry the send.
    members[0].full.store(true, Ordering::SeqCst);
    let sent = members[2]
        .edge
        .execute(send(&members[2], "one disk full"))
        .await
        .expect("two healthy replicas ack");
    assert!(matches!(sent, Outcome::Sent { .. }), "{sent:?}");
    let full_store = members[0].cluster.store().clone();
    eventually("node 1's store failed on its full disk", || {
        let store = full_store.clone();
        async move { store.failure().is_some() }
    })
    .await;
    assert_eq!(
        full_store.failure().map(|fault| fault.kind),
        Some(FaultKind::DiskFull)
    );
    // It serves nothing it holds, committed or not, until it restarts.
    assert!(matches!(full_store.records(), Err(StoreError::Failed(_))));
    let coordinator = members[2].cluster.clone();
    eventually("the coordinator noted node 1's full disk", || {
        let coordinator = coordinator.clone();
        async move {
            coordinator
                .replica_faults()
                .iter()
                .any(|(node, fault)| *node == NodeId(1) && fault.kind == FaultKind::DiskFull)
        }
    })
    .await;

    // Over the wire: a peer's write to node 1 gets the fault and no ack.
    let mut peer = ReplicaClient::connect(format!("http://{}", members[0].address))
        .await
        .expect("node 1's peer service answers");
    let key = RecordKey {
        queue: queue(),
        incarnation: trireme_core::Incarnation::local(trireme_core::Millis(1)),
        message: MessageId(77),
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
    let reply = peer
        .exchange(pb::Batch {
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
        .expect("a failed store still answers")
        .into_inner();
    assert!(reply.replies.is_empty(), "no ack from a full disk");
    let fault = wire::fault(reply.fault.as_ref().expect("the reply carries the fault"));
    assert_eq!(fault.kind, FaultKind::DiskFull, "{fault}");

    // Two full disks: no quorum, and the answer says why.
    members[1].full.store(true, Ordering::SeqCst);
    let refused = tokio::time::timeout(
        OPERATION_TIMEOUT / 2,
        members[2].edge.execute(send(&members[2], "two disks full")),
    )
    .await
    .expect("answered once two replicas reported their faults, not at the deadline")
    .expect_err("one healthy replica cannot ack a send");
    let EngineError::Unavailable { reason } = &refused else {
        panic!("{refused:?}");
    };
    assert!(
        reason.contains("node 1: the disk is full") && reason.contains("node 2: the disk is full"),
        "{reason}"
    );
    let status = trireme_node::status::engine_status(&refused);
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("node 2: the disk is full"),
        "{status:?}"
    );
}
