//! Deduplication ids in a three-member cluster (spec/replication.md §4): one id sent through
//! every member, one after another and all at once, is one message delivered once; after the
//! window a send of the id is a new message; batches carry ids; a deleted and recreated queue
//! starts with no ids. Every member reads one manual clock, so a test can end the window.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use trireme_core::{QueueName, limits};
use trireme_node::clock::{Clock, ManualClock, SystemClock};
use trireme_proto::v1 as pb;
use trireme_replication::NodeId;
use trireme_replication::placement::Ring;

use crate::cluster_edges::{EdgeCluster, create, delete, receive, stats};
use crate::harness::{Client, eventually};

fn send_with_id(queue: &str, body: &str, dedup: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        queue: queue.to_owned(),
        body: body.to_owned(),
        deduplication_id: Some(dedup.to_owned()),
        ..Default::default()
    }
}

async fn send(
    client: &mut Client,
    queue: &str,
    body: &str,
    dedup: &str,
) -> pb::SendMessageResponse {
    client
        .send_message(send_with_id(queue, body, dedup))
        .await
        .unwrap()
        .into_inner()
}

fn sdk(address: SocketAddr) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("AKID", "secret", None, None, "tests"))
        .endpoint_url(format!("http://{address}"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// Receives through every member in turn until `expected` distinct messages arrived (each
/// received once: a second delivery of one is a failure), then deletes them all.
async fn drain(
    cluster: &mut EdgeCluster,
    queue: &str,
    expected: usize,
) -> BTreeMap<String, String> {
    let mut received: BTreeMap<String, pb::ReceivedMessage> = BTreeMap::new();
    for attempt in 0..30 {
        if received.len() >= expected {
            break;
        }
        for message in receive(cluster.at(attempt), queue, 10, 1).await {
            assert_eq!(message.receive_count, 1, "delivered once: {message:?}");
            let id = message.message_id.clone();
            assert!(
                received.insert(id, message).is_none(),
                "a message delivered twice"
            );
        }
    }
    assert_eq!(received.len(), expected, "{received:?}");
    for (i, message) in received.values().enumerate() {
        delete(cluster.at(i + 1), queue, &message.receipt_handle)
            .await
            .unwrap();
    }
    received
        .into_iter()
        .map(|(id, message)| (id, message.body))
        .collect()
}

/// Nothing else is ever delivered, and every member's counts (which skip held and void copies)
/// reach zero once the deletes' third tombstones land.
async fn nothing_left(cluster: &mut EdgeCluster, queue: &str) {
    for index in 0..3 {
        assert!(receive(cluster.at(index), queue, 10, 1).await.is_empty());
        let client = cluster.at(index).clone();
        let queue = queue.to_owned();
        eventually(&format!("node {index} counts nothing"), || {
            let client = client.clone();
            let queue = queue.clone();
            async move {
                let stats = stats(&client, &queue).await;
                stats.ready + stats.in_flight + stats.delayed == 0
            }
        })
        .await;
    }
}

fn manual_clock() -> (ManualClock, Arc<dyn Clock>) {
    let clock = ManualClock::new(SystemClock.now());
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    (clock, shared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_sent_through_every_member_in_turn_over_grpc_and_sqs_is_one_message_delivered_once()
{
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "orders", pb::QueueAttributes::default()).await;
    let first = send(cluster.at(0), "orders", "order 17", "order-17").await;
    assert!(!first.duplicate);
    for index in [1, 2, 0] {
        let again = send(cluster.at(index), "orders", "order 17", "order-17").await;
        assert_eq!(again.message_id, first.message_id, "through node {index}");
        assert!(again.duplicate, "through node {index}");
        assert_eq!(again.md5_of_body, first.md5_of_body);
    }
    // The SQS endpoint of every member answers the duplicate as a node alone does: the first
    // message's id, status 200.
    for index in 0..3 {
        let client = sdk(cluster.members[index].sqs);
        let url = client
            .get_queue_url()
            .queue_name("orders")
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let sent = client
            .send_message()
            .queue_url(url)
            .message_body("order 17")
            .message_deduplication_id("order-17")
            .send()
            .await
            .unwrap();
        assert_eq!(sent.message_id.as_deref(), Some(first.message_id.as_str()));
    }
    let received = drain(&mut cluster, "orders", 1).await;
    assert_eq!(received.keys().collect::<Vec<_>>(), vec![&first.message_id]);
    nothing_left(&mut cluster, "orders").await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_sent_through_every_member_at_once_is_one_message_delivered_once() {
    const IDS: usize = 10;
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "races", pb::QueueAttributes::default()).await;
    let mut sends = tokio::task::JoinSet::new();
    for id in 0..IDS {
        for index in 0..3 {
            let mut client = cluster.at(index).clone();
            sends.spawn(async move {
                let body = format!("job {id} through node {index}");
                let dedup = format!("job-{id}");
                let reply = client
                    .send_message(send_with_id("races", &body, &dedup))
                    .await;
                (id, reply.map(tonic::Response::into_inner))
            });
        }
    }
    let mut answers: BTreeMap<usize, Vec<pb::SendMessageResponse>> = BTreeMap::new();
    while let Some(joined) = sends.join_next().await {
        let (id, reply) = joined.unwrap();
        answers
            .entry(id)
            .or_default()
            .push(reply.unwrap_or_else(|status| panic!("id {id}: {status:?}")));
    }
    let mut messages = BTreeSet::new();
    for (id, replies) in &answers {
        let named: BTreeSet<&str> = replies.iter().map(|r| r.message_id.as_str()).collect();
        assert_eq!(
            named.len(),
            1,
            "id {id}: every send answers one message: {replies:?}"
        );
        let originals = replies.iter().filter(|r| !r.duplicate).count();
        assert_eq!(originals, 1, "id {id}: one send stored it: {replies:?}");
        messages.extend(named.into_iter().map(str::to_owned));
    }
    let received = drain(&mut cluster, "races", IDS).await;
    assert_eq!(received.keys().cloned().collect::<BTreeSet<_>>(), messages);
    nothing_left(&mut cluster, "races").await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_window_a_send_of_the_id_is_a_new_message() {
    let (clock, shared) = manual_clock();
    let mut cluster = EdgeCluster::start_with_clock(shared).await;
    create(cluster.at(0), "windows", pb::QueueAttributes::default()).await;
    let first = send(cluster.at(0), "windows", "first", "same-id").await;
    clock.advance_ms(limits::dedup_window_ms - 1_000);
    let within = send(cluster.at(1), "windows", "within", "same-id").await;
    assert_eq!(within.message_id, first.message_id);
    assert!(within.duplicate);
    clock.advance_ms(1_000);
    let after = send(cluster.at(2), "windows", "after", "same-id").await;
    assert_ne!(after.message_id, first.message_id);
    assert!(!after.duplicate);
    // The new window counts from the new message.
    let again = send(cluster.at(0), "windows", "again", "same-id").await;
    assert_eq!(again.message_id, after.message_id);
    assert!(again.duplicate);
    let received = drain(&mut cluster, "windows", 2).await;
    assert_eq!(received[&first.message_id], "first");
    assert_eq!(received[&after.message_id], "after");
    nothing_left(&mut cluster, "windows").await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_carries_deduplication_ids_through_any_member() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "batches", pb::QueueAttributes::default()).await;
    let entry = |id: &str, body: &str, dedup: &str| pb::SendMessageBatchEntry {
        id: id.to_owned(),
        body: body.to_owned(),
        deduplication_id: Some(dedup.to_owned()),
        ..Default::default()
    };
    let batch = |entries| pb::SendMessageBatchRequest {
        queue: "batches".to_owned(),
        entries,
    };
    let first = cluster
        .at(0)
        .send_message_batch(batch(vec![
            entry("a", "alpha", "x"),
            entry("b", "beta", "y"),
            entry("c", "alpha", "x"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert!(first.failed.is_empty(), "{first:?}");
    let by_entry: BTreeMap<&str, &pb::SendMessageBatchResult> = first
        .successful
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    assert_eq!(by_entry["a"].message_id, by_entry["c"].message_id);
    assert_ne!(by_entry["a"].message_id, by_entry["b"].message_id);
    assert_eq!(
        [by_entry["a"].duplicate, by_entry["c"].duplicate]
            .iter()
            .filter(|d| **d)
            .count(),
        1,
        "one of the two sends of x is the duplicate: {first:?}"
    );
    let second = cluster
        .at(1)
        .send_message_batch(batch(vec![
            entry("x", "alpha", "x"),
            entry("y", "beta", "y"),
            entry("z", "gamma", "z"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert!(second.failed.is_empty(), "{second:?}");
    let again: BTreeMap<&str, &pb::SendMessageBatchResult> = second
        .successful
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    assert_eq!(again["x"].message_id, by_entry["a"].message_id);
    assert_eq!(again["y"].message_id, by_entry["b"].message_id);
    assert!(again["x"].duplicate && again["y"].duplicate && !again["z"].duplicate);
    let received = drain(&mut cluster, "batches", 3).await;
    let bodies: BTreeSet<&str> = received.values().map(String::as_str).collect();
    assert_eq!(bodies, BTreeSet::from(["alpha", "beta", "gamma"]));
    nothing_left(&mut cluster, "batches").await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_of_an_id_to_a_deleted_and_recreated_queue_is_new() {
    let (clock, shared) = manual_clock();
    let mut cluster = EdgeCluster::start_with_clock(shared).await;
    create(cluster.at(0), "reborn", pb::QueueAttributes::default()).await;
    let old = send(cluster.at(0), "reborn", "old life", "same-id").await;
    cluster
        .at(1)
        .delete_queue(pb::DeleteQueueRequest {
            name: "reborn".to_owned(),
        })
        .await
        .unwrap();
    // Past the name's reuse wait, well within the old message's deduplication window.
    clock.advance_ms(61_000);
    let creator = cluster.at(2).clone();
    eventually("the name is created again", || {
        let mut creator = creator.clone();
        async move {
            creator
                .create_queue(pb::CreateQueueRequest {
                    name: "reborn".to_owned(),
                    attributes: Some(pb::QueueAttributes::default()),
                    tags: Default::default(),
                })
                .await
                .is_ok()
        }
    })
    .await;
    // Through the member that created it: its view holds the new incarnation.
    let new = send(cluster.at(2), "reborn", "new life", "same-id").await;
    assert_ne!(new.message_id, old.message_id);
    assert!(!new.duplicate);
    let received = drain(&mut cluster, "reborn", 1).await;
    assert_eq!(received[&new.message_id], "new life");
    nothing_left(&mut cluster, "reborn").await;
    cluster.shutdown().await;
}

/// spec/replication.md §4, *Send* step 3: with the record's home down, a put waits `HOME_WAIT`
/// (a quarter of the operation timeout) for it, then goes to the other two, which decide the id;
/// a second send of it through the other live member is the first one's duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_records_home_down_an_id_sent_through_the_other_two_is_one_message() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "homeless", pb::QueueAttributes::default()).await;
    let ring = Ring::new([NodeId(1), NodeId(2), NodeId(3)]).unwrap();
    let queue = QueueName::try_from("homeless".to_owned()).unwrap();
    let home = usize::from(ring.dedup_replicas(&queue, "lost-home")[0].0) - 1;
    cluster.stop(home).await;
    let live: Vec<usize> = (0..3).filter(|index| *index != home).collect();
    let first = send(cluster.at(live[0]), "homeless", "once", "lost-home").await;
    assert!(!first.duplicate);
    let second = send(cluster.at(live[1]), "homeless", "once", "lost-home").await;
    assert_eq!(second.message_id, first.message_id);
    assert!(second.duplicate);
    let mut received = Vec::new();
    for attempt in 0..20 {
        if !received.is_empty() {
            break;
        }
        received.extend(receive(cluster.at(live[attempt % 2]), "homeless", 10, 1).await);
    }
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].message_id, first.message_id);
    delete(cluster.at(live[1]), "homeless", &received[0].receipt_handle)
        .await
        .unwrap();
    for index in live {
        assert!(
            receive(cluster.at(index), "homeless", 10, 1)
                .await
                .is_empty()
        );
    }
    cluster.shutdown().await;
}
