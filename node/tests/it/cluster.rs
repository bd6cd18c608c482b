//! The cluster on loopback: three (and five) members in one process, each on its own tokio
//! runtime with its own data directory, talking through the real internal service. Killing a
//! member drops its runtime (every task and socket of it ends at once, as in a crash of the
//! process; its records are what it had fsynced) and restarting opens the same directory again.
//! The members and their helpers are shared with `cluster_names`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::cluster::peers::LinkSettings;
use trireme_node::cluster::store::{ReplicaStore, StoreClosed};
use trireme_node::cluster::{Cluster, ClusterSettings, DeadLetter, Delivered};
use trireme_node::tcp_incoming;
use trireme_replication::NodeId;
use trireme_replication::coordinator::{DeleteAnswer, ReceivePath, SendAnswer, VisibilityAnswer};
use trireme_replication::record::Birth;

/// The default `MessageRetentionPeriod` (4 days): nothing in these tests expires.
const RETENTION_MS: u64 = 4 * 24 * 3_600_000;
const INCARNATION: Incarnation = Incarnation::local(Millis(1));

pub(super) fn queue(name: &str) -> QueueName {
    QueueName::try_from(name.to_owned()).expect("a valid queue name")
}

pub(super) fn birth(body: &str, now: Millis) -> Birth {
    Birth {
        payload: body.as_bytes().to_vec(),
        sent_at: now,
        visible_from: Millis(0),
        source_queue: None,
        dedup_id: None,
    }
}

fn settings(node: u16, addresses: &BTreeMap<u16, SocketAddr>) -> ClusterSettings {
    ClusterSettings {
        node: NodeId(node),
        peers: addresses
            .iter()
            .filter(|(id, _)| **id != node)
            .map(|(id, address)| (NodeId(*id), address.to_string()))
            .collect(),
        // Generous: the tests share a 2-core machine with builds, and an operation that times
        // out after its claim landed leaves the message invisible for its visibility timeout.
        operation_timeout: Duration::from_secs(20),
        link: LinkSettings {
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(5),
        },
        horizon_ms: 24 * 3_600_000,
        dedup_window_ms: trireme_core::limits::dedup_window_ms,
        monitor_clock: true,
    }
}

pub(super) struct Member {
    pub(super) node: u16,
    dir: PathBuf,
    address: SocketAddr,
    /// The port's listener until the first start serves on it.
    reserved: Option<std::net::TcpListener>,
    running: Option<(tokio::runtime::Runtime, Cluster, StoreClosed)>,
}

impl Member {
    fn start(
        node: u16,
        dir: PathBuf,
        reserved: std::net::TcpListener,
        addresses: &BTreeMap<u16, SocketAddr>,
    ) -> Member {
        let mut member = Member {
            node,
            dir,
            address: addresses[&node],
            reserved: Some(reserved),
            running: None,
        };
        member.restart(addresses);
        member
    }

    pub(super) fn restart(&mut self, addresses: &BTreeMap<u16, SocketAddr>) {
        assert!(self.running.is_none(), "a running member is not restarted");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (store, closed) = ReplicaStore::open(
            &self.dir,
            NodeId(self.node),
            u64::from(self.node) * 1_000 + 7,
            16 << 20,
        )
        .expect("the replica store opens");
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        // The peer links' tasks run on this member's runtime.
        let _entered = runtime.enter();
        let (cluster, service) = Cluster::start(
            &settings(self.node, addresses),
            store,
            clock,
            Some(u64::from(self.node)),
        )
        .expect("the cluster starts");
        let (address, reserved) = (self.address, self.reserved.take());
        runtime.block_on(async {
            let listener = super::loopback::listener(reserved, address);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service.into_server())
                    .serve_with_incoming(tcp_incoming(listener)),
            );
        });
        self.running = Some((runtime, cluster, closed));
    }

    /// Runs `call` on this member's runtime, as a client of this node would be served.
    pub(super) async fn call<F, T>(&self, call: impl FnOnce(Cluster) -> F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (runtime, cluster, _) = self.running.as_ref().expect("the member runs");
        runtime
            .spawn(call(cluster.clone()))
            .await
            .expect("the call does not panic")
    }

    /// A crash of the process: every task and connection ends now; fsynced records remain.
    pub(super) fn kill(&mut self) {
        let (runtime, cluster, closed) = self.running.take().expect("the member runs");
        drop(cluster);
        // Drops every task of the member (each holds what it holds of the store).
        runtime.shutdown_timeout(Duration::from_secs(10));
        closed.wait();
    }

    pub(super) fn records(&self) -> BTreeMap<Vec<u8>, String> {
        let (_, cluster, _) = self.running.as_ref().expect("the member runs");
        cluster
            .store()
            .records()
            .expect("the records read")
            .into_iter()
            .map(|(key, record)| (key.encode(), format!("{record:?}")))
            .collect()
    }
}

pub(super) struct Cluster3 {
    pub(super) members: Vec<Member>,
    pub(super) addresses: BTreeMap<u16, SocketAddr>,
    _dirs: Vec<TempDir>,
}

pub(super) fn start(members: u16) -> Cluster3 {
    let mut reserved = super::loopback::reserve(1..=members);
    let addresses = super::loopback::addresses(&reserved);
    let dirs: Vec<TempDir> = (1..=members)
        .map(|_| TempDir::new().expect("a temp dir"))
        .collect();
    let members = (1..=members)
        .zip(&dirs)
        .map(|(node, dir)| {
            let port = reserved.remove(&node).expect("a reserved port");
            Member::start(node, dir.path().to_path_buf(), port, &addresses)
        })
        .collect::<Vec<Member>>();
    // New databases join first: every peer must answer before any of them votes.
    for member in &members {
        let (runtime, cluster, _) = member.running.as_ref().expect("the member runs");
        runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(30), cluster.joined())
                .await
                .expect("the member joins");
        });
    }
    Cluster3 {
        members,
        addresses,
        _dirs: dirs,
    }
}

async fn send(member: &Member, name: &str, id: u128) -> SendAnswer {
    let name = queue(name);
    member
        .call(move |cluster| async move {
            let now = SystemClock.now();
            cluster
                .send(
                    &name,
                    INCARNATION,
                    MessageId(id),
                    birth(&format!("m{id}"), now),
                )
                .await
        })
        .await
}

async fn receive(member: &Member, name: &str, max: usize, visibility_ms: u64) -> Vec<Delivered> {
    let name = queue(name);
    member
        .call(move |cluster| async move {
            cluster
                .receive(&name, INCARNATION, max, visibility_ms, RETENTION_MS, None)
                .await
        })
        .await
}

async fn delete(member: &Member, delivered: &Delivered) -> DeleteAnswer {
    let (key, handle) = (delivered.key.clone(), delivered.handle);
    member
        .call(move |cluster| async move { cluster.delete(&key, handle).await })
        .await
}

/// Receives through the members in turn until `expected` messages were delivered or the
/// attempts run out; returns every delivery.
async fn drain(members: &[&Member], name: &str, expected: usize) -> Vec<Delivered> {
    drain_with(members, name, expected, 60_000).await
}

async fn drain_with(
    members: &[&Member],
    name: &str,
    expected: usize,
    visibility_ms: u64,
) -> Vec<Delivered> {
    let mut delivered = Vec::new();
    for attempt in 0..2_000 {
        if delivered.len() >= expected {
            break;
        }
        let member = members[attempt % members.len()];
        let got = receive(member, name, 10, visibility_ms).await;
        if got.is_empty() {
            // Nothing visible in this member's view yet: let the replicas' writes land.
            // The replica store commits on its own thread: give its fsync real time, bounded by
            // the attempts (10 s at most), not a count of yields that a loaded machine outruns.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        delivered.extend(got);
    }
    delivered
}

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn messages_sent_through_any_node_are_received_and_deleted_through_any_other() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        for id in 0..30u128 {
            assert_eq!(
                send(&m[id as usize % 3], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&[&m[1], &m[2], &m[0]], "jobs", 30).await;
        let ids: BTreeSet<u128> = delivered.iter().map(|d| d.key.message.0).collect();
        assert_eq!(ids.len(), 30, "every message delivered");
        assert_eq!(delivered.len(), 30, "and each once, in a quiet run");
        for (i, message) in delivered.iter().enumerate() {
            assert_eq!(
                delete(&m[(i + 2) % 3], message).await,
                DeleteAnswer::Deleted
            );
        }
        for member in m {
            assert!(
                receive(member, "jobs", 10, 0).await.is_empty(),
                "nothing comes back"
            );
        }
    });
}

#[test]
fn a_superseded_handle_neither_deletes_nor_changes_visibility() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        assert_eq!(send(&m[0], "jobs", 1).await, SendAnswer::Sent);
        // Received with a visibility timeout of 0: visible again at once. (Node 2's replica may
        // not hold the message yet when the send is acknowledged, so it polls.)
        let first = drain_with(&[&m[1]], "jobs", 1, 0)
            .await
            .pop()
            .expect("received");
        let second = drain(&[&m[2]], "jobs", 1)
            .await
            .pop()
            .expect("received again");
        assert!(second.handle.claim > first.handle.claim);
        assert_eq!(delete(&m[0], &first).await, DeleteAnswer::Stale);
        let (key, handle) = (first.key.clone(), first.handle);
        let changed = m[0]
            .call(
                move |c| async move { c.change_visibility(&key, handle, 1_000, 43_200_000).await },
            )
            .await;
        assert_eq!(changed, VisibilityAnswer::Stale);
        assert_eq!(delete(&m[1], &second).await, DeleteAnswer::Deleted);
        assert_eq!(delete(&m[2], &second).await, DeleteAnswer::AlreadyGone);
    });
}

#[test]
fn with_one_node_down_sends_receives_and_deletes_keep_succeeding() {
    let mut cluster = start(3);
    let rt = runtime();
    rt.block_on(async {
        for id in 0..10u128 {
            assert_eq!(
                send(&cluster.members[id as usize % 3], "jobs", id).await,
                SendAnswer::Sent
            );
        }
    });
    cluster.members[2].kill();
    let deleted: Vec<Delivered> = rt.block_on(async {
        let m = &cluster.members;
        for id in 10..30u128 {
            assert_eq!(
                send(&m[id as usize % 2], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&[&m[0], &m[1]], "jobs", 30).await;
        let ids: BTreeSet<u128> = delivered.iter().map(|d| d.key.message.0).collect();
        assert_eq!(
            ids.len(),
            30,
            "nothing acknowledged is lost with a node down"
        );
        for (i, message) in delivered.iter().enumerate() {
            assert_eq!(delete(&m[i % 2], message).await, DeleteAnswer::Deleted);
        }
        delivered
    });
    // The third node returns with what it had: live copies of messages deleted meanwhile.
    let addresses = cluster.addresses.clone();
    cluster.members[2].restart(&addresses);
    rt.block_on(async {
        let m = &cluster.members;
        for _ in 0..5 {
            let again = receive(&m[2], "jobs", 10, 60_000).await;
            assert!(
                again.is_empty(),
                "an acknowledged delete is never delivered again: {again:?}"
            );
        }
        assert_eq!(deleted.len(), 30);
    });
}

#[test]
fn five_nodes_keep_every_message_on_its_three_replicas_and_lose_nothing_to_one_crash() {
    let mut cluster = start(5);
    let rt = runtime();
    rt.block_on(async {
        for id in 0..40u128 {
            assert_eq!(
                send(&cluster.members[id as usize % 5], "jobs", id).await,
                SendAnswer::Sent
            );
        }
    });
    let holders: BTreeMap<Vec<u8>, BTreeSet<u16>> =
        cluster
            .members
            .iter()
            .fold(BTreeMap::new(), |mut holders, member| {
                for key in member.records().into_keys() {
                    holders.entry(key).or_default().insert(member.node);
                }
                holders
            });
    assert_eq!(holders.len(), 40);
    let ring = trireme_replication::placement::Ring::new((1..=5).map(NodeId)).expect("a ring");
    for (key, nodes) in &holders {
        use trireme_replication::placement::Placement as _;
        let key = trireme_replication::RecordKey::decode(key).expect("a record key");
        let replicas: BTreeSet<u16> = ring
            .replicas(&key.queue, key.message)
            .iter()
            .map(|n| n.0)
            .collect();
        assert_eq!(replicas.len(), 3);
        assert!(
            nodes.is_subset(&replicas),
            "only replicas hold a record: {nodes:?} ⊄ {replicas:?}"
        );
        assert!(
            nodes.len() >= 2,
            "an acknowledged send is on two replicas at least"
        );
    }
    cluster.members[0].kill();
    rt.block_on(async {
        let rest: Vec<&Member> = cluster.members[1..].iter().collect();
        // Receives take candidates from each coordinator's own replica, so every survivor
        // polls; every message has two live replicas among them.
        let delivered = drain(&rest, "jobs", 40).await;
        let ids: BTreeSet<u128> = delivered.iter().map(|d| d.key.message.0).collect();
        assert_eq!(ids.len(), 40, "killing one of five loses nothing");
    });
}

#[test]
fn a_message_received_too_often_moves_to_the_dead_letter_queue_with_its_id() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        assert_eq!(send(&m[0], "jobs", 7).await, SendAnswer::Sent);
        let dead_letter = DeadLetter {
            queue: queue("jobs-dlq"),
            incarnation: INCARNATION,
            max_receive_count: 2,
        };
        // Receive through the members in turn (visibility 0: visible again at once) until the
        // source copy is gone; a member whose replica lags finds nothing and changes nothing.
        let source_gone = |member: &Member| {
            member.records().iter().any(|(key, record)| {
                trireme_replication::RecordKey::decode(key)
                    .is_some_and(|key| key.queue == queue("jobs"))
                    && record.contains("Tombstone")
            })
        };
        let mut receives = 0;
        for attempt in 0..2_000 {
            if m.iter().filter(|member| source_gone(member)).count() >= 2 {
                break;
            }
            let dl = dead_letter.clone();
            let got = m[attempt % 3]
                .call(move |c| async move {
                    c.receive(&queue("jobs"), INCARNATION, 1, 0, RETENTION_MS, Some(&dl))
                        .await
                })
                .await;
            receives += got.len();
        }
        assert_eq!(receives, 2, "received maxReceiveCount times, then moved");
        let moved = drain(&[&m[1]], "jobs-dlq", 1).await;
        assert_eq!(moved.len(), 1);
        assert_eq!(
            moved[0].key.message,
            MessageId(7),
            "the dead letter keeps its id"
        );
        let live = moved[0].record.live().unwrap();
        assert_eq!(live.receive_count, 3, "its count kept, plus this receive");
        assert_eq!(
            live.birth.source_queue.as_ref().map(|s| s.name.clone()),
            Some(queue("jobs"))
        );
    });
}

/// Waits until `member`'s own view counts `ready` messages of the queue ready (its replica has
/// every write), for at most 10 s.
async fn until_ready_here(member: &Member, name: &str, ready: u64) {
    let name = queue(name);
    for _ in 0..2_000 {
        let name = name.clone();
        let here = member
            .call(move |cluster| async move {
                let now = SystemClock.now();
                cluster
                    .store()
                    .view(|view| view.counts(&name, INCARNATION, None, now).0)
            })
            .await;
        if here == ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("member {} never saw {ready} ready", member.node);
}

/// Sends messages `0..count` through `member` and waits until its own view counts them ready.
async fn sent_and_ready_here(member: &Member, name: &str, count: u64) {
    for id in 0..u128::from(count) {
        assert_eq!(send(member, name, id).await, SendAnswer::Sent);
    }
    until_ready_here(member, name, count).await;
}

/// spec/replication.md §13, *A claim without the read*: a member that holds the messages claims
/// each from its own record, without the read round, and counts it by path; a second receive
/// finds them invisible on its own replica and claims nothing.
#[test]
fn a_member_that_holds_the_messages_claims_them_without_the_read() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        sent_and_ready_here(&m[0], "jobs", 10).await;
        let got = receive(&m[0], "jobs", 10, 60_000).await;
        assert_eq!(got.len(), 10, "every message delivered");
        let paths = m[0]
            .call(|cluster| async move {
                [ReceivePath::Fast, ReceivePath::FellBack, ReceivePath::Read]
                    .map(|path| cluster.metrics().receive_claims(path))
            })
            .await;
        assert_eq!(paths, [(10, 10), (0, 0), (0, 0)], "fast, fell back, read");
        assert!(receive(&m[0], "jobs", 10, 60_000).await.is_empty());
        for message in &got {
            assert_eq!(delete(&m[1], message).await, DeleteAnswer::Deleted);
        }
    });
}

/// spec/replication.md, *Candidate order*: a coordinator's concurrent receives all read one
/// view, and each reserves what it tries, so three at once through one member take three
/// different tens instead of racing for the same ten (which would deliver about ten in all).
#[test]
fn concurrent_receives_through_one_member_claim_different_messages() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        sent_and_ready_here(&m[0], "jobs", 30).await;
        let name = queue("jobs");
        let (delivered, claiming) = m[0]
            .call(move |cluster| async move {
                let receive = || {
                    let (cluster, name) = (cluster.clone(), name.clone());
                    tokio::spawn(async move {
                        cluster
                            .receive(&name, INCARNATION, 10, 60_000, RETENTION_MS, None)
                            .await
                    })
                };
                let (a, b, c) = tokio::join!(receive(), receive(), receive());
                let delivered: Vec<Delivered> = [a, b, c]
                    .into_iter()
                    .flat_map(|got| got.expect("a receive does not panic"))
                    .collect();
                (delivered, cluster.claiming(&name, INCARNATION))
            })
            .await;
        let ids: BTreeSet<u128> = delivered.iter().map(|d| d.key.message.0).collect();
        assert_eq!(ids.len(), 30, "three receives, thirty different messages");
        assert_eq!(delivered.len(), 30);
        assert_eq!(claiming, 0, "every reservation ended with its receive");
    });
}

/// A receive's reservation ends with it, whether it answered or was cancelled mid-claim (a long
/// poll whose client went away): what it tried is a candidate again.
#[test]
fn a_receive_answered_or_cancelled_reserves_nothing_afterwards() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        sent_and_ready_here(&m[0], "jobs", 5).await;
        // Visibility 0: what it delivers is visible again at once, so the next receive finds
        // the same five unless a reservation outlived the first.
        for _ in 0..2 {
            assert_eq!(receive(&m[0], "jobs", 10, 0).await.len(), 5);
        }
        let name = queue("jobs");
        let (reserved_while_claiming, after) = m[0]
            .call(move |cluster| async move {
                // Boxed, so that dropping it drops the receive (a pin on the stack would not).
                let mut claim = {
                    let (cluster, name) = (cluster.clone(), name.clone());
                    Box::pin(async move {
                        // Five: its own view offers them all, so it samples no peer and
                        // claims at its first poll.
                        cluster
                            .receive(&name, INCARNATION, 5, 0, RETENTION_MS, None)
                            .await
                    })
                };
                // One poll (a timeout polls what it wraps before its own deadline) takes the
                // candidates and starts the reads; no replica has answered yet.
                assert!(
                    tokio::time::timeout(Duration::ZERO, claim.as_mut())
                        .await
                        .is_err()
                );
                let during = cluster.claiming(&name, INCARNATION);
                drop(claim);
                (during, cluster.claiming(&name, INCARNATION))
            })
            .await;
        assert_eq!(
            reserved_while_claiming, 5,
            "a claim in progress holds its candidates"
        );
        assert_eq!(after, 0, "cancelling it releases them");
        assert_eq!(receive(&m[0], "jobs", 10, 0).await.len(), 5);
    });
}

/// Nodes as the binary starts them — `Node::start` with a cluster configured, peers served by
/// `Node::serve_peers` — in one runtime: a send coordinated by one is durable on two replicas
/// or more, and after a graceful shutdown every replica store is closed (its directory opens
/// again, as its node) and holds what it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_nodes_replicate_and_close_their_replica_stores_on_shutdown() {
    use trireme_node::Node;
    use trireme_node::config::{ClusterConfig, Config, PeerSecurity, derive_handle_key};

    let mut reserved = super::loopback::reserve(1..=3);
    let addresses = super::loopback::addresses(&reserved);
    let dirs: Vec<TempDir> = (1..=3).map(|_| TempDir::new().unwrap()).collect();
    let mut nodes = Vec::new();
    for (node, dir) in (1..=3).zip(&dirs) {
        let mut config = Config::with_data_dir(dir.path());
        config.handle_key = Some(derive_handle_key(b"the cluster's shared secret"));
        config.cluster = Some(ClusterConfig {
            node: NodeId(node),
            peer_listen: addresses[&node],
            peers: settings(node, &addresses).peers,
            operation_timeout_ms: 20_000,
            anti_entropy_period_s: 3_600,
            collection_period_s: 3_600,
            collection_rows_per_round_max: 1_000,
            move_task_lease_ms: 30_000,
            peer_security: PeerSecurity::Plaintext,
        });
        let storage = trireme_node::open_storage(&config).unwrap();
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let clock = Arc::new(SystemClock);
        let mut started = Node::start(&config, storage, tcp_incoming(grpc), clock).unwrap();
        let peers = super::loopback::listener(reserved.remove(&node), addresses[&node]);
        started.serve_peers(tcp_incoming(peers));
        nodes.push(started);
    }
    for node in &nodes {
        let joining = node.cluster().expect("a member").clone();
        tokio::time::timeout(std::time::Duration::from_secs(30), joining.joined())
            .await
            .expect("the node joins");
    }
    let cluster = nodes[0].cluster().expect("node 1 is a member").clone();
    assert_eq!(cluster.node(), NodeId(1));
    let answer = cluster
        .send(
            &queue("wired"),
            INCARNATION,
            MessageId(5),
            birth("m5", SystemClock.now()),
        )
        .await;
    assert_eq!(answer, SendAnswer::Sent);
    // A clone held past the shutdown would keep node 1's store open.
    drop(cluster);
    for node in nodes {
        node.shutdown().await;
    }
    let mut holding = 0;
    for (node, dir) in (1..=3).zip(&dirs) {
        let (store, closed) = ReplicaStore::open(dir.path(), NodeId(node), 0, 16 << 20)
            .expect("the shutdown closed the replica store");
        let records = store.records().unwrap();
        holding += usize::from(records.iter().any(|(key, _)| key.message == MessageId(5)));
        drop(store);
        closed.wait();
    }
    assert!(holding >= 2, "the sent message is on {holding} replicas");
}
