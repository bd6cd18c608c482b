//! The metrics listener (`/metrics`, `/health`, `/ready`): a scrape parsed as Prometheus would
//! parse it shows exactly what was done, its depth gauges are `GetQueue`'s counts, and `/ready`
//! follows storage and, for a member, joining and a reachable quorum.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use trireme_core::Millis;
use trireme_node::clock::{Clock, ManualClock};
use trireme_proto::v1 as pb;

use super::harness::{TestNode, eventually_within, redrive_to, send_request};

/// `GET path` on `address`: the status and the body.
pub(super) async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let url = format!("http://{address}{path}");
    tokio::task::spawn_blocking(move || {
        trireme_node::metrics::probe(&url, Duration::from_secs(10)).unwrap()
    })
    .await
    .unwrap()
}

/// One scrape, parsed: every sample by its series as written (`name{label="value",…}`). The
/// exposition must be well formed: each sample line has a value, the family's `# TYPE` comes
/// first, and it ends with `# EOF`.
pub(super) async fn scrape(address: SocketAddr) -> BTreeMap<String, f64> {
    let (status, text) = get(address, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.ends_with("# EOF\n"),
        "an OpenMetrics exposition ends with # EOF"
    );
    let mut typed = std::collections::BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.insert(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let name = series.split('{').next().unwrap();
        assert!(
            typed.iter().any(|family| name.starts_with(family.as_str())),
            "{name} has no # TYPE before it"
        );
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

/// The sample `series`, which must be there.
pub(super) fn sample(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no {series} in the scrape: {samples:#?}"))
}

fn queue_sample(samples: &BTreeMap<String, f64>, name: &str, queue: &str) -> f64 {
    sample(samples, &format!("{name}{{queue=\"{queue}\"}}"))
}

/// The depth gauges of `queue` equal `GetQueue`'s counts.
async fn assert_depths_match(node: &mut TestNode, samples: &BTreeMap<String, f64>, queue: &str) {
    let stats = node.stats(queue).await;
    let expected = [
        ("trireme_queue_messages_ready", stats.ready as f64),
        ("trireme_queue_messages_in_flight", stats.in_flight as f64),
        ("trireme_queue_messages_delayed", stats.delayed as f64),
    ];
    for (name, count) in expected {
        assert_eq!(
            queue_sample(samples, name, queue),
            count,
            "{name} of {queue}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_counts_exactly_what_was_done_and_its_depths_are_get_queue_counts() {
    let start = Millis(1_800_000_000_000);
    let clock = Arc::new(ManualClock::new(start));
    let dir = Arc::new(TempDir::new().unwrap());
    let mut node = TestNode::start_with(dir, Arc::clone(&clock) as Arc<dyn Clock>).await;
    assert_eq!(
        get(node.metrics, "/health").await,
        (200, "alive\n".to_owned())
    );
    assert_eq!(
        get(node.metrics, "/ready").await,
        (200, "ready\n".to_owned())
    );

    // jobs: five sends, three received, two deleted; the third made visible again and taken
    // by the next receive to the dead-letter queue (maxReceiveCount 1), which also delivers
    // the other two.
    node.create("jobs-dlq").await;
    node.create_with("jobs", redrive_to("jobs-dlq", 1)).await;
    for i in 0..5 {
        node.send("jobs", &format!("job {i}")).await;
    }
    let first = node.receive("jobs", 3, 600).await;
    assert_eq!(first.len(), 3);
    node.delete("jobs", &first[0].receipt_handle).await.unwrap();
    node.delete("jobs", &first[1].receipt_handle).await.unwrap();
    node.change_visibility("jobs", &first[2].receipt_handle, 0)
        .await
        .unwrap();
    let second = node.receive("jobs", 10, 600).await;
    assert_eq!(second.len(), 2, "the third message moved instead");

    // plain: one message received twice (a redelivery); the first handle is superseded and
    // refused, the second deletes; one more send delayed for 10 minutes.
    node.create("plain").await;
    node.send("plain", "twice").await;
    let once = node.receive("plain", 1, 600).await;
    node.change_visibility("plain", &once[0].receipt_handle, 0)
        .await
        .unwrap();
    let again = node.receive("plain", 1, 600).await;
    assert_eq!(again[0].receive_count, 2);
    let refused = node.delete("plain", &once[0].receipt_handle).await;
    assert!(refused.is_err(), "the superseded handle deletes nothing");
    node.delete("plain", &again[0].receipt_handle)
        .await
        .unwrap();
    node.try_send(pb::SendMessageRequest {
        delay_seconds: Some(600),
        ..send_request("plain", "later")
    })
    .await
    .unwrap();
    // A queue that is gone is no series at all.
    node.create("gone").await;
    node.send("gone", "x").await;
    node.client
        .delete_queue(pb::DeleteQueueRequest {
            name: "gone".to_owned(),
        })
        .await
        .unwrap();

    clock.advance_ms(5_000);
    let samples = scrape(node.metrics).await;
    let counted = [
        ("trireme_messages_sent_total", "jobs", 5.0),
        ("trireme_messages_received_total", "jobs", 5.0),
        ("trireme_messages_deleted_total", "jobs", 2.0),
        ("trireme_messages_dead_lettered_total", "jobs", 1.0),
        ("trireme_messages_dead_lettered_total", "jobs-dlq", 0.0),
        ("trireme_messages_sent_total", "plain", 2.0),
        ("trireme_messages_received_total", "plain", 2.0),
        ("trireme_messages_redelivered_total", "plain", 1.0),
        ("trireme_superseded_deletes_total", "plain", 1.0),
        ("trireme_messages_deleted_total", "plain", 1.0),
        // Depths: the dead-letter queue's depth is its ready count.
        ("trireme_queue_messages_ready", "jobs-dlq", 1.0),
        ("trireme_queue_messages_in_flight", "jobs", 2.0),
        ("trireme_queue_messages_delayed", "plain", 1.0),
        // Every message still held was sent at `start`, 5 s ago by the node's clock.
        ("trireme_queue_oldest_message_age_seconds", "jobs", 5.0),
        ("trireme_queue_oldest_message_age_seconds", "jobs-dlq", 5.0),
        ("trireme_queue_oldest_message_age_seconds", "plain", 5.0),
    ];
    for (name, queue, value) in counted {
        assert_eq!(
            queue_sample(&samples, name, queue),
            value,
            "{name} of {queue}"
        );
    }
    assert!(!samples.contains_key("trireme_messages_redelivered_total{queue=\"jobs\"}"));
    for queue in ["jobs", "jobs-dlq", "plain"] {
        assert_depths_match(&mut node, &samples, queue).await;
    }
    assert!(
        samples
            .keys()
            .all(|series| !series.contains("queue=\"gone\"")),
        "a deleted queue's series are gone"
    );

    // Requests: seven sends over gRPC, one refused delete with its reason.
    let grpc = |operation: &str| {
        format!("trireme_request_duration_seconds_count{{api=\"grpc\",operation=\"{operation}\"}}")
    };
    assert_eq!(sample(&samples, &grpc("SendMessage")), 8.0);
    assert_eq!(sample(&samples, &grpc("DeleteMessage")), 4.0);
    assert_eq!(
        sample(
            &samples,
            "trireme_request_errors_total{api=\"grpc\",operation=\"DeleteMessage\",reason=\"StaleReceiptHandle\"}"
        ),
        1.0
    );
    assert_eq!(
        samples
            .iter()
            .filter(|(series, _)| series.starts_with("trireme_request_errors_total"))
            .count(),
        1,
        "no other request was refused"
    );

    // Storage: every change was committed, and the file holds it.
    assert!(
        sample(
            &samples,
            "trireme_storage_group_commits_total{store=\"queues\"}"
        ) >= 10.0
    );
    assert_eq!(
        sample(
            &samples,
            "trireme_storage_commit_duration_seconds_count{store=\"queues\"}"
        ),
        sample(
            &samples,
            "trireme_storage_group_commits_total{store=\"queues\"}"
        )
    );
    assert!(
        sample(
            &samples,
            "trireme_storage_database_size_bytes{store=\"queues\"}"
        ) > 0.0
    );
    // The records gauge is what the database holds: read it back once the node is gone.
    let records = sample(&samples, "trireme_storage_records{store=\"queues\"}");
    let dir = node.shutdown().await;
    let storage = trireme_node::storage::Storage::open_path(dir.path(), 1 << 20).unwrap();
    let stored = storage.load().unwrap().len() as f64;
    assert_eq!(records, stored);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqs_endpoint_records_its_requests_apart_from_grpc() {
    let mut node = TestNode::start().await;
    let sqs = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sqs_address = sqs.local_addr().unwrap();
    node.serve_sqs(sqs);
    node.create("via-sqs").await;
    let post = |target: &'static str, body: String| async move {
        let request = format!(
            "POST / HTTP/1.1\r\nHost: {sqs_address}\r\nX-Amz-Target: {target}\r\n\
             Content-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(sqs_address).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
            .await
            .unwrap();
        answer
    };
    let url = "http://localhost:9324/000000000000/via-sqs";
    let sent = post(
        "AmazonSQS.SendMessage",
        format!("{{\"QueueUrl\":\"{url}\",\"MessageBody\":\"hello\"}}"),
    )
    .await;
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
    let refused = post("AmazonSQS.NoSuchAction", "{}".to_owned()).await;
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");

    let samples = scrape(node.metrics).await;
    assert_eq!(
        sample(
            &samples,
            "trireme_request_duration_seconds_count{api=\"sqs\",operation=\"SendMessage\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &samples,
            "trireme_request_duration_seconds_count{api=\"sqs\",operation=\"unknown\"}"
        ),
        1.0,
        "an action the endpoint does not serve is counted as unknown, never by its name"
    );
    let refusals: Vec<&String> = samples
        .keys()
        .filter(|series| series.starts_with("trireme_request_errors_total{api=\"sqs\""))
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(
        refusals[0].contains("operation=\"unknown\""),
        "{refusals:?}"
    );
    assert_eq!(
        queue_sample(&samples, "trireme_messages_sent_total", "via-sqs"),
        1.0,
        "a send is counted once whichever edge it came through"
    );
}

/// `trireme-node probe` exits 0 on a 200 and 1 otherwise, with no shell needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_method_the_node_does_not_serve_is_unimplemented_and_counted_as_unknown() {
    let node = TestNode::start().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", node.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    for path in [
        "/trireme.v1.QueueService/NoSuchMethod",
        "/trireme.v1.NoSuchService/GetQueue",
    ] {
        grpc.ready().await.unwrap();
        let answer = grpc
            .unary::<_, pb::GetQueueResponse, _>(
                tonic::Request::new(pb::GetQueueRequest {
                    name: "anything".to_owned(),
                }),
                path.parse().unwrap(),
                tonic_prost::ProstCodec::default(),
            )
            .await;
        let status = answer.expect_err(path);
        assert_eq!(
            status.code(),
            tonic::Code::Unimplemented,
            "{path}: {status:?}"
        );
    }

    let samples = scrape(node.metrics).await;
    assert_eq!(
        sample(
            &samples,
            "trireme_request_duration_seconds_count{api=\"grpc\",operation=\"unknown\"}"
        ),
        2.0,
        "a method the node does not serve is counted as unknown, never by its name"
    );
    assert_eq!(
        sample(
            &samples,
            "trireme_request_errors_total{api=\"grpc\",operation=\"unknown\",reason=\"Unimplemented\"}"
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_subcommand_exits_by_the_status() {
    let node = TestNode::start().await;
    let probe = |path: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_trireme-node"))
            .args(["probe", &format!("http://{}{path}", node.metrics)])
            .output()
            .unwrap()
    };
    let ready = tokio::task::block_in_place(|| probe("/ready"));
    assert!(ready.status.success(), "{ready:?}");
    assert_eq!(String::from_utf8_lossy(&ready.stdout), "ready\n");
    let missing = tokio::task::block_in_place(|| probe("/nothing-here"));
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
}

/// A member that has not joined is not ready, and says why; once its peers are up and it has
/// joined, it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_is_ready_only_once_it_has_joined_and_reaches_a_quorum() {
    use trireme_node::Node;
    use trireme_node::clock::SystemClock;
    use trireme_node::config::{ClusterConfig, Config, PeerSecurity, derive_handle_key};
    use trireme_replication::NodeId;

    let mut reserved = super::loopback::reserve(1..=3);
    let addresses = super::loopback::addresses(&reserved);
    let dirs: Vec<TempDir> = (1..=3).map(|_| TempDir::new().unwrap()).collect();
    let mut nodes = Vec::new();
    let mut metrics = Vec::new();
    let mut grpc_addresses = Vec::new();
    let mut members = Vec::new();
    for (node, dir) in (1..=3u16).zip(&dirs) {
        let mut config = Config::with_data_dir(dir.path());
        config.handle_key = Some(derive_handle_key(b"the cluster's shared secret"));
        config.cluster = Some(ClusterConfig {
            node: NodeId(node),
            peer_listen: addresses[&node],
            peers: addresses
                .iter()
                .filter(|(other, _)| **other != node)
                .map(|(other, address)| (NodeId(*other), address.to_string()))
                .collect(),
            operation_timeout_ms: 5_000,
            anti_entropy_period_s: 3_600,
            collection_period_s: 3_600,
            collection_rows_per_round_max: 1_000,
            move_task_lease_ms: 30_000,
            peer_security: PeerSecurity::Plaintext,
        });
        members.push(config);
    }
    // Node 1 alone: its peers are not up, so it cannot join (a new disk asks every peer).
    for (index, config) in members.iter().enumerate() {
        let node = u16::try_from(index + 1).unwrap();
        let storage = trireme_node::open_storage(config).unwrap();
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        grpc_addresses.push(grpc.local_addr().unwrap());
        let mut started = Node::start(
            config,
            storage,
            trireme_node::tcp_incoming(grpc),
            Arc::new(SystemClock),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        metrics.push(listener.local_addr().unwrap());
        started.serve_metrics(listener);
        let peers = super::loopback::listener(reserved.remove(&node), addresses[&node]);
        started.serve_peers(trireme_node::tcp_incoming(peers));
        nodes.push(started);
        if node == 1 {
            let (status, reason) = get(metrics[0], "/ready").await;
            assert_eq!(status, 503, "{reason}");
            assert!(reason.starts_with("not joined"), "{reason}");
            // Alive all the same.
            assert_eq!(get(metrics[0], "/health").await.0, 200);
            let samples = scrape(metrics[0]).await;
            assert_eq!(sample(&samples, "trireme_member_joined"), 0.0);
        }
    }
    for address in &metrics {
        let address = *address;
        eventually_within(
            "every member is ready",
            Duration::from_secs(30),
            || async move { get(address, "/ready").await.0 == 200 },
        )
        .await;
    }
    let samples = scrape(metrics[0]).await;
    assert_eq!(sample(&samples, "trireme_member_joined"), 1.0);
    // An offset is shown for every peer with a fresh clock sample (its value is a round trip's
    // guess). Ready needs a quorum, so one peer: the other may still wait for node 1's next
    // probe of it (its first ones failed while it was down), and shows soon after.
    let first = metrics[0];
    eventually_within(
        "node 1 shows both peers up, with their clock offsets",
        Duration::from_secs(30),
        || async move {
            let samples = scrape(first).await;
            ["2", "3"].iter().all(|peer| {
                samples.get(&format!("trireme_peer_up{{peer=\"{peer}\"}}")) == Some(&1.0)
                    && samples.contains_key(&format!(
                        "trireme_peer_clock_offset_seconds{{peer=\"{peer}\"}}"
                    ))
            })
        },
    )
    .await;
    // Through node 1: three sends, one receive. Its counters count them, and once its local
    // view holds all three its depth gauges are its GetQueue counts.
    let mut client = super::harness::connect(grpc_addresses[0]).await;
    client
        .create_queue(pb::CreateQueueRequest {
            name: "clustered".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..3 {
        client
            .send_message(send_request("clustered", &format!("m{i}")))
            .await
            .unwrap();
    }
    let received = client
        .receive_messages(pb::ReceiveMessagesRequest {
            queue: "clustered".to_owned(),
            max_messages: 1,
            visibility_timeout_seconds: Some(600),
            wait_seconds: Some(0),
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    assert_eq!(received.len(), 1);
    let stats = |mut client: super::harness::Client| async move {
        client
            .get_queue(pb::GetQueueRequest {
                name: "clustered".to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .queue
            .unwrap()
            .stats
            .unwrap()
    };
    // A peer is up once a call to it answered after its last failure: node 1's calls to its
    // peers failed while they were not started, and ready needs only a quorum, so the sends
    // (each written to all three replicas) are what brings both back up.
    let metrics_1 = metrics[0];
    eventually_within(
        "both peers up after the sends",
        Duration::from_secs(30),
        || async move {
            let samples = scrape(metrics_1).await;
            ["2", "3"]
                .iter()
                .all(|peer| sample(&samples, &format!("trireme_peer_up{{peer=\"{peer}\"}}")) == 1.0)
        },
    )
    .await;
    let watched = client.clone();
    eventually_within(
        "node 1's view holds the three",
        Duration::from_secs(30),
        || {
            let client = watched.clone();
            async move {
                let stats = stats(client).await;
                (stats.ready, stats.in_flight) == (2, 1)
            }
        },
    )
    .await;
    let samples = scrape(metrics[0]).await;
    for (name, value) in [
        ("trireme_messages_sent_total", 3.0),
        ("trireme_messages_received_total", 1.0),
        ("trireme_queue_messages_ready", 2.0),
        ("trireme_queue_messages_in_flight", 1.0),
        ("trireme_queue_messages_delayed", 0.0),
    ] {
        assert_eq!(queue_sample(&samples, name, "clustered"), value, "{name}");
    }
    assert!(
        sample(
            &samples,
            "trireme_quorum_duration_seconds_count{operation=\"SendOp\"}"
        ) >= 3.0,
        "every send is a quorum round"
    );
    assert!(
        sample(
            &samples,
            "trireme_storage_group_commits_total{store=\"replica\"}"
        ) >= 1.0
    );
    assert!(sample(&samples, "trireme_storage_records{store=\"replica\"}") >= 3.0);
    assert!(
        sample(
            &samples,
            "trireme_storage_database_size_bytes{store=\"replica\"}"
        ) > 0.0
    );
    // The group log holds the groups since the last checkpoint; none is due after so few.
    assert!(
        sample(
            &samples,
            "trireme_storage_database_size_bytes{store=\"replica_log\"}"
        ) > 0.0
    );
    assert_eq!(
        sample(
            &samples,
            "trireme_storage_checkpoints_total{store=\"replica\"}"
        ),
        0.0
    );
    assert_eq!(
        sample(
            &samples,
            "trireme_storage_checkpoints_overdue_total{store=\"replica\"}"
        ),
        0.0
    );

    // Two members stop: node 1 can no longer reach a quorum, and says so.
    let stopped: Vec<Node> = nodes.drain(1..).collect();
    for node in stopped {
        node.shutdown().await;
    }
    let first = metrics[0];
    eventually_within(
        "node 1 is not ready without its peers",
        Duration::from_secs(30),
        || async move {
            let (status, reason) = get(first, "/ready").await;
            status == 503 && reason.contains("a quorum needs")
        },
    )
    .await;
    for node in nodes {
        node.shutdown().await;
    }
}
