//! The public APIs served by a three-member cluster: three in-process nodes on loopback, each
//! with its gRPC API, its SQS endpoint and its peer service, and every call of a scenario going
//! to another member than the one before — a queue created through one node, a message sent
//! through a second, received through the third and deleted through the first, with one shared
//! receipt-handle key.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::ProvideErrorMetadata;
use tempfile::TempDir;
use tonic::Code;
use trireme_node::Node;
use trireme_node::clock::{Clock, ManualClock, SystemClock};
use trireme_node::config::{ClusterConfig, Config, PeerSecurity};
use trireme_proto::v1 as pb;
use trireme_replication::NodeId;

use crate::harness::{Client, connect, eventually, send_request};
use crate::loopback;

const MEMBERS: u16 = 3;
/// How long an operation waits for its quorum unless a test asks otherwise.
const OPERATION_TIMEOUT_MS: u64 = 2_000;
/// Move tasks' lease: short, so a takeover comes within seconds (cluster_move_tasks).
const MOVE_TASK_LEASE_MS: u64 = 2_000;

/// One member: its node, its gRPC client, its SQS address, and what it was started with.
pub(crate) struct Member {
    pub(crate) node: Option<Node>,
    client: Client,
    pub(crate) sqs: SocketAddr,
    config: Config,
    clock: Arc<dyn Clock>,
    /// The SQS endpoint's access keys (none: unauthenticated).
    access_keys: Vec<trireme_node::sqs::AccessKey>,
}

/// Members on loopback (three unless a test asks for more).
pub(crate) struct EdgeCluster {
    pub(crate) members: Vec<Member>,
    _dirs: Vec<TempDir>,
}

impl Member {
    /// Starts a member with `config`, serving its peers on `peer` (the reserved listener at the
    /// first start, `None` to bind its address again after a restart).
    async fn start(
        config: Config,
        peer: Option<std::net::TcpListener>,
        clock: Arc<dyn Clock>,
        access_keys: Vec<trireme_node::sqs::AccessKey>,
    ) -> Member {
        let peer_address = config.cluster.as_ref().unwrap().peer_listen;
        let storage = trireme_node::open_storage(&config).unwrap();
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_address = grpc.local_addr().unwrap();
        let mut node = Node::start(
            &config,
            storage,
            trireme_node::tcp_incoming(grpc),
            Arc::clone(&clock),
        )
        .unwrap();
        let peer = loopback::listener(peer, peer_address);
        node.serve_peers(trireme_node::tcp_incoming(peer));
        let sqs = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sqs_address = sqs.local_addr().unwrap();
        let settings = trireme_node::sqs::SqsSettings {
            advertised_host: "127.0.0.1".to_owned(),
            advertised_port: sqs_address.port(),
            access_keys: access_keys.clone(),
            ..trireme_node::sqs::SqsSettings::default()
        };
        node.serve_sqs(sqs, settings);
        Member {
            node: Some(node),
            client: connect(grpc_address).await,
            sqs: sqs_address,
            config,
            clock,
            access_keys,
        }
    }
}

impl EdgeCluster {
    pub(crate) async fn start() -> EdgeCluster {
        EdgeCluster::start_with_clock(Arc::new(SystemClock)).await
    }

    /// Three members that read time from `clock` (one clock for all: a test moves it past a
    /// window or a wait).
    pub(crate) async fn start_with_clock(clock: Arc<dyn Clock>) -> EdgeCluster {
        EdgeCluster::start_with_clocks(std::array::from_fn(|_| Arc::clone(&clock))).await
    }

    /// Three members, member `i` reading `clocks[i]`.
    async fn start_with_clocks(clocks: [Arc<dyn Clock>; MEMBERS as usize]) -> EdgeCluster {
        EdgeCluster::start_members(clocks.to_vec(), OPERATION_TIMEOUT_MS).await
    }

    /// `members` members on loopback, on the system clock.
    pub(crate) async fn start_with(members: u16) -> EdgeCluster {
        let system: Arc<dyn Clock> = Arc::new(SystemClock);
        EdgeCluster::start_members(vec![system; usize::from(members)], OPERATION_TIMEOUT_MS).await
    }

    /// Three members on the system clock whose operations wait up to `operation_timeout_ms`
    /// for their quorums (e.g. long for records of the largest size in a debug build on a
    /// loaded machine).
    pub(crate) async fn start_with_operation_timeout(operation_timeout_ms: u64) -> EdgeCluster {
        let system: Arc<dyn Clock> = Arc::new(SystemClock);
        EdgeCluster::start_members(vec![system; usize::from(MEMBERS)], operation_timeout_ms).await
    }

    /// Three members on the system clock whose SQS endpoints take only `keys`.
    pub(crate) async fn start_with_keys(keys: Vec<trireme_node::sqs::AccessKey>) -> EdgeCluster {
        let system: Arc<dyn Clock> = Arc::new(SystemClock);
        EdgeCluster::start_keyed(
            vec![system; usize::from(MEMBERS)],
            keys,
            OPERATION_TIMEOUT_MS,
        )
        .await
    }

    /// One member per clock, member `i` reading `clocks[i]`.
    async fn start_members(clocks: Vec<Arc<dyn Clock>>, operation_timeout_ms: u64) -> EdgeCluster {
        EdgeCluster::start_keyed(clocks, Vec::new(), operation_timeout_ms).await
    }

    /// One member per clock, member `i` reading `clocks[i]`, SQS endpoints taking `keys`.
    async fn start_keyed(
        clocks: Vec<Arc<dyn Clock>>,
        keys: Vec<trireme_node::sqs::AccessKey>,
        operation_timeout_ms: u64,
    ) -> EdgeCluster {
        let count = u16::try_from(clocks.len()).expect("a few members");
        let peers = loopback::reserve(1..=count);
        let peer_addresses = loopback::addresses(&peers);
        let mut peers = peers;
        let mut members = Vec::new();
        let mut dirs = Vec::new();
        for id in 1..=count {
            let dir = TempDir::new().unwrap();
            let mut config = Config::with_data_dir(dir.path());
            config.handle_key = Some(b"cluster-edges-shared-handle-key".to_vec());
            config.cluster = Some(ClusterConfig {
                node: NodeId(id),
                peer_listen: peer_addresses[&id],
                peers: peer_addresses
                    .iter()
                    .filter(|(other, _)| **other != id)
                    .map(|(other, address)| (NodeId(*other), address.to_string()))
                    .collect(),
                operation_timeout_ms,
                anti_entropy_period_s: 1,
                collection_period_s: 3_600,
                collection_rows_per_round_max: 1_024,
                move_task_lease_ms: MOVE_TASK_LEASE_MS,
                peer_security: PeerSecurity::Plaintext,
            });
            let clock = Arc::clone(&clocks[usize::from(id - 1)]);
            members.push(Member::start(config, peers.remove(&id), clock, keys.clone()).await);
            dirs.push(dir);
        }
        // New databases join first: every peer must answer before any of them serves.
        for member in &members {
            let cluster = member
                .node
                .as_ref()
                .and_then(|node| node.cluster())
                .unwrap();
            tokio::time::timeout(std::time::Duration::from_secs(30), cluster.joined())
                .await
                .expect("the member joins");
        }
        EdgeCluster {
            members,
            _dirs: dirs,
        }
    }

    /// Starts member `index` (stopped before) again on its data directory and peer address,
    /// with a new gRPC client.
    pub(crate) async fn restart(&mut self, index: usize) {
        assert!(
            self.members[index].node.is_none(),
            "only a stopped member restarts"
        );
        let config = self.members[index].config.clone();
        let clock = Arc::clone(&self.members[index].clock);
        let keys = self.members[index].access_keys.clone();
        self.members[index] = Member::start(config, None, clock, keys).await;
    }

    /// How many members the cluster has (running or not).
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Member `index` (0-based)'s node, while it runs.
    pub(crate) fn node(&self, index: usize) -> &Node {
        self.members[index].node.as_ref().expect("the member runs")
    }

    /// Member `index` (0-based)'s gRPC client.
    pub(crate) fn at(&mut self, index: usize) -> &mut Client {
        let members = self.members.len();
        &mut self.members[index % members].client
    }

    /// Stops member `index` (its replicas stop answering) until it is restarted, if ever.
    pub(crate) async fn stop(&mut self, index: usize) {
        if let Some(node) = self.members[index].node.take() {
            node.shutdown().await;
        }
    }

    pub(crate) async fn shutdown(mut self) {
        for index in 0..self.members.len() {
            self.stop(index).await;
        }
    }
}

pub(crate) async fn create(client: &mut Client, name: &str, attributes: pb::QueueAttributes) {
    client
        .create_queue(pb::CreateQueueRequest {
            name: name.to_owned(),
            attributes: Some(attributes),
            tags: Default::default(),
        })
        .await
        .unwrap();
}

pub(crate) async fn receive(
    client: &mut Client,
    queue: &str,
    max: u32,
    wait_s: u32,
) -> Vec<pb::ReceivedMessage> {
    client
        .receive_messages(pb::ReceiveMessagesRequest {
            queue: queue.to_owned(),
            max_messages: max,
            visibility_timeout_seconds: Some(30),
            wait_seconds: Some(wait_s),
        })
        .await
        .unwrap()
        .into_inner()
        .messages
}

/// The queue's counts as member `client` reports them.
pub(crate) async fn stats(client: &Client, queue: &str) -> pb::QueueStats {
    client
        .clone()
        .get_queue(pb::GetQueueRequest {
            name: queue.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .queue
        .unwrap()
        .stats
        .unwrap()
}

pub(crate) async fn delete(
    client: &mut Client,
    queue: &str,
    handle: &str,
) -> Result<(), tonic::Status> {
    client
        .delete_message(pb::DeleteMessageRequest {
            queue: queue.to_owned(),
            receipt_handle: handle.to_owned(),
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_through_one_node_is_received_through_another_and_deleted_through_a_third() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "orders", pb::QueueAttributes::default()).await;
    let mut sent = BTreeSet::new();
    for i in 0..12 {
        let reply = cluster
            .at(i)
            .send_message(send_request("orders", &format!("order {i}")))
            .await
            .unwrap()
            .into_inner();
        sent.insert(reply.message_id);
    }
    let mut received = BTreeMap::new();
    for attempt in 0..20 {
        if received.len() == sent.len() {
            break;
        }
        for message in receive(cluster.at(attempt + 1), "orders", 10, 1).await {
            assert_eq!(message.receive_count, 1, "received once: {message:?}");
            received.insert(message.message_id.clone(), message);
        }
    }
    assert_eq!(received.keys().cloned().collect::<BTreeSet<_>>(), sent);
    for (i, message) in received.values().enumerate() {
        delete(cluster.at(i + 2), "orders", &message.receipt_handle)
            .await
            .unwrap();
    }
    // Deleted through whichever node: none comes back through any node, and every node's
    // counts (its local view, approximate as SQS's are) reach zero once the third replica of
    // each delete has its tombstone.
    for index in 0..3 {
        assert!(receive(cluster.at(index), "orders", 10, 0).await.is_empty());
        let client = cluster.at(index).clone();
        eventually(&format!("node {index} counts nothing left"), || {
            let client = client.clone();
            async move {
                let stats = stats(&client, "orders").await;
                stats.ready + stats.in_flight + stats.delayed == 0
            }
        })
        .await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_is_refused_once_superseded_and_a_visibility_change_works_through_any_node() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(1), "jobs", pb::QueueAttributes::default()).await;
    cluster
        .at(2)
        .send_message(send_request("jobs", "job"))
        .await
        .unwrap();
    let first = receive(cluster.at(0), "jobs", 1, 2).await.remove(0);
    // Visible again at once through another node, received again through a third.
    cluster
        .at(1)
        .change_visibility(pb::ChangeVisibilityRequest {
            queue: "jobs".to_owned(),
            receipt_handle: first.receipt_handle.clone(),
            visibility_timeout_seconds: 0,
        })
        .await
        .unwrap();
    let second = receive(cluster.at(2), "jobs", 1, 2).await.remove(0);
    assert_eq!(second.message_id, first.message_id);
    assert_eq!(second.receive_count, 2);
    let stale = delete(cluster.at(0), "jobs", &first.receipt_handle)
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    delete(cluster.at(1), "jobs", &second.receipt_handle)
        .await
        .unwrap();
    // Deleting again with the newest handle: already gone, success, as SQS answers.
    delete(cluster.at(2), "jobs", &second.receipt_handle)
        .await
        .unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_one_node_is_served_by_a_send_through_another() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "waits", pb::QueueAttributes::default()).await;
    let mut poller = cluster.at(1).clone();
    let poll = tokio::spawn(async move { receive(&mut poller, "waits", 1, 10).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster
        .at(2)
        .send_message(send_request("waits", "woken"))
        .await
        .unwrap();
    let got = poll.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, "woken");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_are_created_changed_listed_and_deleted_through_different_nodes() {
    let mut cluster = EdgeCluster::start().await;
    create(
        cluster.at(0),
        "settings",
        pb::QueueAttributes {
            visibility_timeout_seconds: Some(45),
            ..Default::default()
        },
    )
    .await;
    let read = |info: pb::GetQueueResponse| info.queue.unwrap().attributes.unwrap();
    let attributes = read(
        cluster
            .at(1)
            .get_queue(pb::GetQueueRequest {
                name: "settings".to_owned(),
            })
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(attributes.visibility_timeout_seconds, Some(45));
    // Creating again with other attributes through a third node: the name exists.
    let exists = cluster
        .at(2)
        .create_queue(pb::CreateQueueRequest {
            name: "settings".to_owned(),
            attributes: Some(pb::QueueAttributes {
                visibility_timeout_seconds: Some(46),
                ..Default::default()
            }),
            tags: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(exists.code(), Code::AlreadyExists, "{exists:?}");
    let names = cluster
        .at(2)
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(names.names.contains(&"settings".to_owned()), "{names:?}");
    cluster
        .at(1)
        .delete_queue(pb::DeleteQueueRequest {
            name: "settings".to_owned(),
        })
        .await
        .unwrap();
    // The delete's push to the other views is not acknowledged (spec/replication.md §1, *A send
    // racing a delete*): a send through another node may still be taken into the deleted
    // queue for a moment, and dies with it; soon every node answers that the queue is gone.
    let client = cluster.at(0).clone();
    eventually("a send through another node finds the queue gone", || {
        let mut client = client.clone();
        async move {
            match client.send_message(send_request("settings", "late")).await {
                Err(status) => {
                    assert_eq!(status.code(), Code::NotFound, "{status:?}");
                    true
                }
                Ok(_) => false,
            }
        }
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_member_down_the_other_two_send_receive_and_delete() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "survives", pb::QueueAttributes::default()).await;
    cluster.stop(2).await;
    for i in 0..6 {
        cluster
            .at(i % 2)
            .send_message(send_request("survives", &format!("m{i}")))
            .await
            .unwrap();
    }
    let mut seen = BTreeSet::new();
    for attempt in 0..20 {
        if seen.len() == 6 {
            break;
        }
        // Received through one live member, deleted through the other (member 3 is down).
        for message in receive(cluster.at(attempt % 2), "survives", 10, 1).await {
            delete(
                cluster.at((attempt + 1) % 2),
                "survives",
                &message.receipt_handle,
            )
            .await
            .unwrap();
            seen.insert(message.body);
        }
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    cluster.shutdown().await;
}

/// An SDK client of the SQS endpoint at `address`.
fn sdk(address: SocketAddr) -> aws_sdk_sqs::Client {
    sdk_in(address, "us-east-1")
}

/// An SDK client of the SQS endpoint at `address` that signs for `region`.
fn sdk_in(address: SocketAddr, region: &'static str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region))
        .credentials_provider(Credentials::new("AKID", "secret", None, None, "tests"))
        .endpoint_url(format!("http://{address}"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_received_whole_through_another_member_comes_back_in_entry_order() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "ordered", pb::QueueAttributes::default()).await;
    for round in 0..3 {
        let bodies: Vec<String> = (0..10).map(|entry| format!("r{round}-e{entry}")).collect();
        let sent = cluster
            .at(round % 3)
            .send_message_batch(pb::SendMessageBatchRequest {
                queue: "ordered".to_owned(),
                entries: bodies
                    .iter()
                    .enumerate()
                    .map(|(entry, body)| pb::SendMessageBatchEntry {
                        id: format!("e{entry}"),
                        body: body.clone(),
                        ..Default::default()
                    })
                    .collect(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(sent.successful.len(), 10, "{sent:?}");
        // Once the receiving member's view holds all ten, one receive takes them all.
        let through = (round + 1) % 3;
        let client = cluster.at(through).clone();
        crate::harness::eventually_within("the batch in the view", Duration::from_secs(10), || {
            let client = client.clone();
            async move { stats(&client, "ordered").await.ready == 10 }
        })
        .await;
        let received = receive(cluster.at(through), "ordered", 10, 0).await;
        let got: Vec<&str> = received.iter().map(|m| m.body.as_str()).collect();
        assert_eq!(got, bodies, "round {round}");
        for message in &received {
            delete(cluster.at(through), "ordered", &message.receipt_handle)
                .await
                .unwrap();
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_another_region_is_served_by_every_member_and_only_in_its_region() {
    let cluster = EdgeCluster::start().await;
    let away: Vec<aws_sdk_sqs::Client> = cluster
        .members
        .iter()
        .map(|m| sdk_in(m.sqs, "eu-west-1"))
        .collect();
    let url = away[0]
        .create_queue()
        .queue_name("regional")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    away[1]
        .send_message()
        .queue_url(&url)
        .message_body("in eu-west-1")
        .send()
        .await
        .unwrap();
    let received = away[2]
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages()[0].body(), Some("in eu-west-1"));
    // The node's own region has no such queue, on any member.
    for member in &cluster.members {
        let home = sdk(member.sqs);
        let missing = home
            .get_queue_url()
            .queue_name("regional")
            .send()
            .await
            .unwrap_err()
            .into_service_error();
        assert!(missing.is_queue_does_not_exist(), "{missing:?}");
        let listed = home.list_queues().send().await.unwrap();
        assert!(listed.queue_urls().is_empty(), "{listed:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_sdk_works_against_every_member() {
    let cluster = EdgeCluster::start().await;
    let clients: Vec<aws_sdk_sqs::Client> = cluster.members.iter().map(|m| sdk(m.sqs)).collect();
    let url = clients[0]
        .create_queue()
        .queue_name("sdk-queue")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    // Each node answers for the queue under its own address.
    let url_at = |index: usize| {
        clients[index]
            .get_queue_url()
            .queue_name("sdk-queue")
            .send()
    };
    let second_url = url_at(1).await.unwrap().queue_url.unwrap();
    assert!(second_url.ends_with("/sdk-queue"), "{second_url}");
    clients[1]
        .send_message()
        .queue_url(&second_url)
        .message_body("through the sdk")
        .send()
        .await
        .unwrap();
    let third_url = url_at(2).await.unwrap().queue_url.unwrap();
    let received = clients[2]
        .receive_message()
        .queue_url(&third_url)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    let message = received.messages.unwrap().remove(0);
    assert_eq!(message.body.as_deref(), Some("through the sdk"));
    clients[0]
        .delete_message()
        .queue_url(&url)
        .receipt_handle(message.receipt_handle.unwrap())
        .send()
        .await
        .unwrap();
    let attributes = clients[1]
        .get_queue_attributes()
        .queue_url(&second_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .unwrap();
    assert!(
        attributes
            .attributes
            .unwrap()
            .contains_key(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
    );
    let missing = clients[2]
        .get_queue_url()
        .queue_name("no-such-queue")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        missing.code(),
        Some("AWS.SimpleQueueService.NonExistentQueue"),
        "{missing:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_now_through_another_node_moves_the_message_with_its_history() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "work-dlq", pb::QueueAttributes::default()).await;
    create(
        cluster.at(1),
        "work",
        pb::QueueAttributes {
            redrive_policy: Some(pb::RedrivePolicy {
                dead_letter_queue: "work-dlq".to_owned(),
                max_receive_count: 5,
            }),
            ..Default::default()
        },
    )
    .await;
    create(cluster.at(2), "plain", pb::QueueAttributes::default()).await;
    let dead_letter = |client: &mut Client, queue: &str, handle: &str| {
        let request = pb::DeadLetterMessageRequest {
            queue: queue.to_owned(),
            receipt_handle: handle.to_owned(),
        };
        let mut client = client.clone();
        async move { client.dead_letter_message(request).await }
    };
    cluster
        .at(2)
        .send_message(send_request("work", "gave up on"))
        .await
        .unwrap();
    let first = receive(cluster.at(0), "work", 1, 5).await.remove(0);
    cluster
        .at(1)
        .change_visibility(pb::ChangeVisibilityRequest {
            queue: "work".to_owned(),
            receipt_handle: first.receipt_handle.clone(),
            visibility_timeout_seconds: 0,
        })
        .await
        .unwrap();
    let second = receive(cluster.at(2), "work", 1, 5).await.remove(0);
    // The superseded handle moves nothing.
    let stale = dead_letter(cluster.at(1), "work", &first.receipt_handle)
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    let moved = dead_letter(cluster.at(0), "work", &second.receipt_handle)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.dead_letter_queue, "work-dlq");
    let arrived = receive(cluster.at(1), "work-dlq", 1, 5).await.remove(0);
    assert_eq!(arrived.message_id, second.message_id);
    assert_eq!(arrived.body, "gave up on");
    assert_eq!(arrived.dead_letter_source.as_deref(), Some("work"));
    assert_eq!(arrived.receive_count, 3, "two receives in work, one here");
    assert!(receive(cluster.at(2), "work", 1, 0).await.is_empty());
    // Again with the same handle: the message left the queue.
    let gone = dead_letter(cluster.at(2), "work", &second.receipt_handle)
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::FailedPrecondition, "{gone:?}");
    // A queue without a redrive policy has nowhere to move to.
    cluster
        .at(0)
        .send_message(send_request("plain", "p"))
        .await
        .unwrap();
    let plain = receive(cluster.at(1), "plain", 1, 5).await.remove(0);
    let nowhere = dead_letter(cluster.at(2), "plain", &plain.receipt_handle)
        .await
        .unwrap_err();
    assert_eq!(nowhere.code(), Code::FailedPrecondition, "{nowhere:?}");
    assert!(
        nowhere.message().contains("no redrive policy"),
        "{nowhere:?}"
    );
    cluster.shutdown().await;
}

/// spec/replication.md#clock-monitoring: a member whose clock is set 10 s ahead of the other two
/// refuses every client call, over gRPC and SQS, with an error that names its measured skew and
/// the bound, and skips collection; the other two keep serving, and the skewed member still
/// stores their writes as a replica; once its clock is back it serves again. The clocks are
/// manual, so nothing depends on the wall clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_clock_is_beyond_skew_max_refuses_to_coordinate_until_it_is_back() {
    let start = trireme_core::Millis(1_800_000_000_000);
    let right = ManualClock::new(start);
    let wrong = ManualClock::new(start);
    let clocks: [Arc<dyn Clock>; 3] = [
        Arc::new(right.clone()),
        Arc::new(right.clone()),
        Arc::new(wrong.clone()),
    ];
    let mut cluster = EdgeCluster::start_with_clocks(clocks).await;
    create(cluster.at(2), "clocks", pb::QueueAttributes::default()).await;
    cluster
        .at(2)
        .send_message(send_request("clocks", "before"))
        .await
        .unwrap();

    wrong.set(trireme_core::Millis(start.0 + 10_000));
    // Refused at once; the measured skew is exact once a probe has gone out after the jump (one
    // under way at the jump brackets it only between 0 and 10 s).
    let client = cluster.at(2).clone();
    eventually("member 3 refuses, naming its skew and the bound", || {
        let mut client = client.clone();
        async move {
            let refused = client
                .send_message(send_request("clocks", "refused"))
                .await
                .expect_err("a member 10 s ahead coordinated a send");
            assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
            let said = refused.message();
            assert!(
                said.contains("ms ahead of the cluster's median clock")
                    && said.contains("SKEW_MAX 500 ms"),
                "{said}"
            );
            said.contains("10000 ms ahead of the cluster's median clock (± 0 ms")
        }
    })
    .await;
    let read = cluster
        .at(2)
        .get_queue(pb::GetQueueRequest {
            name: "clocks".to_owned(),
        })
        .await
        .expect_err("a member 10 s ahead served a queue");
    assert_eq!(read.code(), Code::Unavailable, "{read:?}");
    let over_sqs = sdk(cluster.members[2].sqs)
        .get_queue_url()
        .queue_name("clocks")
        .send()
        .await
        .expect_err("a member 10 s ahead served SQS");
    assert_eq!(over_sqs.code(), Some("ServiceUnavailable"), "{over_sqs:?}");
    assert!(
        over_sqs
            .message()
            .is_some_and(|m| m.contains("10000 ms ahead")),
        "{over_sqs:?}"
    );
    let collection = trireme_node::cluster::collection::CollectionSettings::default();
    let skewed = cluster.members[2]
        .node
        .as_ref()
        .unwrap()
        .cluster()
        .unwrap()
        .clone();
    assert!(
        skewed
            .collection_round(&collection)
            .await
            .unwrap()
            .skipped_for_clock
    );
    let fine = cluster.members[0]
        .node
        .as_ref()
        .unwrap()
        .cluster()
        .unwrap()
        .clone();
    assert!(
        !fine
            .collection_round(&collection)
            .await
            .unwrap()
            .skipped_for_clock
    );

    // The other two coordinate as before, and the skewed member stores their writes.
    for i in 0..4 {
        cluster
            .at(i % 2)
            .send_message(send_request("clocks", &format!("while skewed {i}")))
            .await
            .unwrap();
    }
    let store = skewed.store().clone();
    eventually("the skewed member stores every send", || {
        let store = store.clone();
        async move { store.records().unwrap().len() == 5 }
    })
    .await;
    let mut bodies = BTreeSet::new();
    for attempt in 0..20 {
        if bodies.len() == 5 {
            break;
        }
        for message in receive(cluster.at(attempt % 2), "clocks", 10, 1).await {
            bodies.insert(message.body);
        }
    }
    assert_eq!(bodies.len(), 5, "{bodies:?}");
    // A member's replica store closes once no clone of it is left.
    drop((skewed, fine, store));

    // Back in step: it coordinates again.
    wrong.set(right.now());
    cluster
        .at(2)
        .send_message(send_request("clocks", "after"))
        .await
        .unwrap();
    assert_eq!(
        receive(cluster.at(2), "clocks", 10, 1).await.len(),
        1,
        "the send after the clock came back"
    );
    cluster.shutdown().await;
}
