//! Messages of the largest size between the members of a cluster (spec/replication.md §13,
//! *Batching*): a receive of ten 1 MiB messages reads ten whole records from each peer in one
//! call, whose reply is over 10 MiB, and a send batch at the batch payload limit writes 1 MiB to
//! each peer (in one call or a few, as the requests meet the link). Both must go through whole,
//! with every body intact.

use std::collections::BTreeMap;
use std::time::Duration;

use trireme_core::limits::{batch_entries_max, message_bytes_max};
use trireme_node::limits::batch_payload_bytes_max;
use trireme_proto::v1 as pb;

use crate::cluster_edges::{EdgeCluster, create, stats};
use crate::harness::eventually_within;

/// How long an operation waits for its quorum: a receive of ten 1 MiB messages reads and
/// claims 10 MiB on each peer, which took 5.5 s in a debug build on a 2-core machine under a
/// load average of 13; the clusters' default of 2 s would time it out and leave its claims to
/// wait out their visibility timeout.
const OPERATION_TIMEOUT_MS: u64 = 20_000;

/// A body of `size_bytes` printable bytes that differs from every other index's at every
/// position, so a body that came back cut, shifted or mixed up with another is caught.
fn body(index: usize, size_bytes: usize) -> String {
    (0..size_bytes)
        .map(|position| char::from(b'a' + ((position * 7 + index * 3) % 26) as u8))
        .collect()
}

/// Receives through `client` until `expected` messages were received, keeping each message's
/// newest delivery, for at most `limit`.
async fn receive_all(
    client: &mut crate::harness::Client,
    queue: &str,
    expected: usize,
    visibility_s: u32,
    limit: Duration,
) -> BTreeMap<String, pb::ReceivedMessage> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut received = BTreeMap::new();
    while received.len() < expected && tokio::time::Instant::now() < deadline {
        let messages = client
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: queue.to_owned(),
                max_messages: batch_entries_max,
                visibility_timeout_seconds: Some(visibility_s),
                wait_seconds: Some(0),
            })
            .await
            .unwrap()
            .into_inner()
            .messages;
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for message in messages {
            received.insert(message.message_id.clone(), message);
        }
    }
    received
}

/// Sends `bodies` through member `from`'s view of the cluster, receives them through `through`
/// and deletes them in one batch through `deleter`, checking every body byte for byte and that
/// no member counts any of them afterwards.
async fn round_trip(
    cluster: &mut EdgeCluster,
    queue: &str,
    sent: &BTreeMap<String, String>,
    through: usize,
    deleter: usize,
) {
    // Once the receiving member's view holds them all, a receive of ten takes them in one
    // call: one read round for ten records, a reply of ten whole records from each peer.
    let client = cluster.at(through).clone();
    let count = sent.len() as u64;
    eventually_within("the messages in the view", Duration::from_secs(20), || {
        let client = client.clone();
        async move { stats(&client, queue).await.ready == count }
    })
    .await;
    // A short visibility timeout: a claim given up on the way (a split) costs a few seconds.
    let received = receive_all(
        cluster.at(through),
        queue,
        sent.len(),
        5,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        received.len(),
        sent.len(),
        "every message received through member {through}"
    );
    for (id, message) in &received {
        let expected = &sent[id];
        assert_eq!(message.body.len(), expected.len(), "message {id}'s length");
        assert!(
            message.body == *expected,
            "message {id}'s body, byte for byte"
        );
    }
    let deleted = cluster
        .at(deleter)
        .delete_message_batch(pb::DeleteMessageBatchRequest {
            queue: queue.to_owned(),
            entries: received
                .values()
                .enumerate()
                .map(|(entry, message)| pb::DeleteMessageBatchEntry {
                    id: format!("d{entry}"),
                    receipt_handle: message.receipt_handle.clone(),
                })
                .collect(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        deleted.failed,
        vec![],
        "every delete through member {deleter}"
    );
    assert_eq!(deleted.successful.len(), sent.len());
    for member in 0..cluster.len() {
        let client = cluster.at(member).clone();
        eventually_within("nothing left", Duration::from_secs(20), || {
            let client = client.clone();
            async move {
                let stats = stats(&client, queue).await;
                stats.ready == 0 && stats.in_flight == 0
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_messages_of_the_largest_size_are_received_and_deleted_whole_through_other_members() {
    let mut cluster = EdgeCluster::start_with_operation_timeout(OPERATION_TIMEOUT_MS).await;
    create(cluster.at(0), "large", pb::QueueAttributes::default()).await;
    let size_bytes = message_bytes_max as usize;
    let mut sent = BTreeMap::new();
    for index in 0..batch_entries_max as usize {
        let body = body(index, size_bytes);
        let answer = cluster
            .at(0)
            .send_message(pb::SendMessageRequest {
                queue: "large".to_owned(),
                body: body.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        sent.insert(answer.message_id, body);
    }
    round_trip(&mut cluster, "large", &sent, 1, 2).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_batch_at_the_payload_limit_goes_through_the_cluster_whole() {
    let mut cluster = EdgeCluster::start_with_operation_timeout(OPERATION_TIMEOUT_MS).await;
    create(cluster.at(0), "batched", pb::QueueAttributes::default()).await;
    // Ten bodies summing to the batch payload limit exactly: nine of the same size, the last
    // one taking the rest.
    let entries = batch_entries_max as usize;
    let total = usize::try_from(batch_payload_bytes_max).unwrap();
    let each = total / entries;
    let bodies: Vec<String> = (0..entries)
        .map(|index| {
            let size = if index + 1 == entries {
                total - each * (entries - 1)
            } else {
                each
            };
            body(index, size)
        })
        .collect();
    assert_eq!(bodies.iter().map(String::len).sum::<usize>(), total);
    let answer = cluster
        .at(0)
        .send_message_batch(pb::SendMessageBatchRequest {
            queue: "batched".to_owned(),
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
    assert_eq!(answer.failed, vec![], "the whole batch is sent");
    let sent: BTreeMap<String, String> = answer
        .successful
        .iter()
        .map(|result| {
            let entry: usize = result.id[1..].parse().unwrap();
            (result.message_id.clone(), bodies[entry].clone())
        })
        .collect();
    assert_eq!(sent.len(), entries);
    round_trip(&mut cluster, "batched", &sent, 1, 2).await;
    cluster.shutdown().await;
}
