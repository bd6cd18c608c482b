//! Purge in a three-member cluster (spec/replication.md §2), through gRPC and through the SQS
//! endpoint: messages sent through every member, a purge through one, then no receive through
//! any member hands out a message sent before it, messages sent after its acknowledgement are
//! received, every member's counts fall to zero, every replica marks the purged records, and a
//! second purge within 60 s is refused as on a single node.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::QueueAttributeName;
use tonic::Code;
use trireme_proto::v1 as pb;

use crate::cluster_edges::{EdgeCluster, create, receive, stats};
use crate::harness::{Client, eventually, send_request};

/// A purge waits until its coordinator's clock is past `w + SKEW_MAX = t + 2·SKEW_MAX`.
const PURGE_MARGIN: Duration = Duration::from_millis(1_000);

async fn purge(client: &mut Client, queue: &str) -> Result<(), tonic::Status> {
    client
        .purge_queue(pb::PurgeQueueRequest {
            name: queue.to_owned(),
        })
        .await
        .map(|_| ())
}

/// The message ids of `queue` whose records on member `index` its purge mark hides, and of the
/// live ones it does not.
fn marked_and_unmarked(
    cluster: &EdgeCluster,
    index: usize,
    queue: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let store = cluster.members[index]
        .node
        .as_ref()
        .unwrap()
        .cluster()
        .expect("a member")
        .store();
    let mut marked = BTreeSet::new();
    let mut unmarked = BTreeSet::new();
    for (key, record) in store.records().unwrap() {
        if key.queue.as_str() != queue || record.live().is_none() {
            continue;
        }
        if record.hidden(None) {
            marked.insert(key.message.to_string());
        } else {
            unmarked.insert(key.message.to_string());
        }
    }
    (marked, unmarked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_through_one_member_hides_every_earlier_message_from_every_member() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "purged", pb::QueueAttributes::default()).await;
    let mut before = BTreeSet::new();
    for i in 0..9 {
        let sent = cluster
            .at(i)
            .send_message(send_request("purged", &format!("before {i}")))
            .await
            .unwrap()
            .into_inner();
        before.insert(sent.message_id);
    }
    // One of them in flight, so the in-flight count has something to lose too.
    let mut in_flight = Vec::new();
    for attempt in 0..10 {
        in_flight = receive(cluster.at(attempt), "purged", 1, 1).await;
        if !in_flight.is_empty() {
            break;
        }
    }
    assert_eq!(in_flight.len(), 1, "one message received before the purge");
    for index in 0..3 {
        let client = cluster.at(index).clone();
        eventually(&format!("member {index} counts the nine"), || {
            let client = client.clone();
            async move {
                let stats = stats(&client, "purged").await;
                stats.ready + stats.in_flight == 9
            }
        })
        .await;
    }

    let started = Instant::now();
    purge(cluster.at(2), "purged").await.unwrap();
    assert!(
        started.elapsed() >= PURGE_MARGIN,
        "answered only past the margin, after {:?}",
        started.elapsed()
    );

    // No receive through any member hands out a message sent before the purge.
    for round in 0..2 {
        for index in 0..3 {
            let got = receive(cluster.at(index), "purged", 10, u32::from(round == 0)).await;
            assert!(got.is_empty(), "member {index} received {got:?}");
        }
    }
    // Every member's counts fall to zero, and every replica marks what the purge hides.
    for index in 0..3 {
        let client = cluster.at(index).clone();
        eventually(&format!("member {index} counts nothing"), || {
            let client = client.clone();
            async move {
                let stats = stats(&client, "purged").await;
                stats.ready + stats.in_flight + stats.delayed == 0
            }
        })
        .await;
    }
    for index in 0..3 {
        let cluster = &cluster;
        let ids = &before;
        eventually(&format!("member {index} marks the nine"), || async move {
            let (marked, unmarked) = marked_and_unmarked(cluster, index, "purged");
            assert!(
                unmarked.is_empty(),
                "member {index} left {unmarked:?} unmarked"
            );
            marked == *ids
        })
        .await;
    }

    // A second purge within 60 s, through another member: refused as on a single node.
    let again = purge(cluster.at(0), "purged").await.unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted, "{again:?}");

    // Sent after the acknowledgement, through every member: each is received.
    let mut after = BTreeSet::new();
    for i in 0..3 {
        let sent = cluster
            .at(i)
            .send_message(send_request("purged", &format!("after {i}")))
            .await
            .unwrap()
            .into_inner();
        after.insert(sent.message_id);
    }
    let mut received = BTreeSet::new();
    for attempt in 0..20 {
        if received.len() == after.len() {
            break;
        }
        for message in receive(cluster.at(attempt + 1), "purged", 10, 1).await {
            assert!(
                !before.contains(&message.message_id),
                "a purged message came back: {message:?}"
            );
            received.insert(message.message_id);
        }
    }
    assert_eq!(received, after);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_now_of_a_purged_message_is_refused_and_moves_nothing() {
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "drained-dlq", pb::QueueAttributes::default()).await;
    create(
        cluster.at(1),
        "drained",
        pb::QueueAttributes {
            redrive_policy: Some(pb::RedrivePolicy {
                dead_letter_queue: "drained-dlq".to_owned(),
                max_receive_count: 5,
            }),
            ..Default::default()
        },
    )
    .await;
    cluster
        .at(2)
        .send_message(send_request("drained", "held when purged"))
        .await
        .unwrap();
    let held = receive(cluster.at(0), "drained", 1, 5).await.remove(0);
    purge(cluster.at(1), "drained").await.unwrap();
    let refused = cluster
        .at(2)
        .dead_letter_message(pb::DeadLetterMessageRequest {
            queue: "drained".to_owned(),
            receipt_handle: held.receipt_handle.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("no longer in the queue"),
        "{refused:?}"
    );
    for index in 0..3 {
        assert!(
            receive(cluster.at(index), "drained-dlq", 10, 1)
                .await
                .is_empty(),
            "member {index}: a purged message left as a live dead letter"
        );
    }
    cluster.shutdown().await;
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

async fn approximate_messages(client: &aws_sdk_sqs::Client, url: &str) -> u64 {
    let attributes = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        QueueAttributeName::ApproximateNumberOfMessagesDelayed,
    ]
    .iter()
    .map(|name| attributes[name].parse::<u64>().unwrap())
    .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_through_the_sqs_endpoint_of_one_member_holds_on_every_member() {
    let cluster = EdgeCluster::start().await;
    let clients: Vec<aws_sdk_sqs::Client> = cluster.members.iter().map(|m| sdk(m.sqs)).collect();
    clients[0]
        .create_queue()
        .queue_name("sdk-purged")
        .send()
        .await
        .unwrap();
    let mut urls = Vec::new();
    for client in &clients {
        urls.push(
            client
                .get_queue_url()
                .queue_name("sdk-purged")
                .send()
                .await
                .unwrap()
                .queue_url
                .unwrap(),
        );
    }
    let mut before = BTreeSet::new();
    for i in 0..6 {
        let sent = clients[i % 3]
            .send_message()
            .queue_url(&urls[i % 3])
            .message_body(format!("before {i}"))
            .send()
            .await
            .unwrap();
        before.insert(sent.message_id.unwrap());
    }
    for index in 0..3 {
        let (client, url) = (&clients[index], &urls[index]);
        eventually(&format!("member {index} counts the six"), || async move {
            approximate_messages(client, url).await == 6
        })
        .await;
    }

    clients[1]
        .purge_queue()
        .queue_url(&urls[1])
        .send()
        .await
        .unwrap();

    for index in 0..3 {
        let got = clients[index]
            .receive_message()
            .queue_url(&urls[index])
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        assert!(
            got.messages.unwrap_or_default().is_empty(),
            "member {index} received a purged message"
        );
    }
    for index in 0..3 {
        let (client, url) = (&clients[index], &urls[index]);
        eventually(&format!("member {index} counts nothing"), || async move {
            approximate_messages(client, url).await == 0
        })
        .await;
    }
    let again = clients[2]
        .purge_queue()
        .queue_url(&urls[2])
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(again.is_purge_queue_in_progress(), "{again:?}");

    let after = clients[2]
        .send_message()
        .queue_url(&urls[2])
        .message_body("after")
        .send()
        .await
        .unwrap()
        .message_id
        .unwrap();
    let mut received = None;
    for attempt in 0..10 {
        let index = attempt % 3;
        let got = clients[index]
            .receive_message()
            .queue_url(&urls[index])
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for message in got.messages.unwrap_or_default() {
            let id = message.message_id.unwrap();
            assert!(!before.contains(&id), "a purged message came back: {id}");
            received = Some(id);
        }
        if received.is_some() {
            break;
        }
    }
    assert_eq!(received, Some(after));
    cluster.shutdown().await;
}
