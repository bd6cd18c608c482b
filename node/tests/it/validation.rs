//! Refusals at the edge: each is a precise gRPC status whose message names the field and the
//! limit, and nothing changes.

use tonic::{Code, Status};
use trireme_proto::v1 as pb;

use crate::harness::{TestNode, redrive_to, send_request};

fn assert_refused(result: Status, code: Code, mentions: &[&str]) {
    assert_eq!(result.code(), code, "{result:?}");
    for text in mentions {
        assert!(
            result.message().contains(text),
            "{:?} does not mention {text:?}",
            result.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_names_and_attribute_ranges_are_checked() {
    let mut node = TestNode::start().await;
    let bad_name = node
        .client
        .create_queue(pb::CreateQueueRequest {
            name: "no spaces allowed".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_refused(bad_name, Code::InvalidArgument, &["name"]);
    let fifo = node
        .client
        .create_queue(pb::CreateQueueRequest {
            name: "jobs.fifo".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_refused(fifo, Code::InvalidArgument, &["FIFO"]);
    let cases: [(pb::QueueAttributes, &str, &str); 5] = [
        (
            pb::QueueAttributes {
                visibility_timeout_seconds: Some(43_201),
                ..Default::default()
            },
            "visibility_timeout_seconds",
            "43200",
        ),
        (
            pb::QueueAttributes {
                delay_seconds: Some(901),
                ..Default::default()
            },
            "delay_seconds",
            "900",
        ),
        (
            pb::QueueAttributes {
                retention_seconds: Some(59),
                ..Default::default()
            },
            "retention_seconds",
            "60",
        ),
        (
            pb::QueueAttributes {
                max_message_bytes: Some(1_023),
                ..Default::default()
            },
            "max_message_bytes",
            "1024",
        ),
        (
            pb::QueueAttributes {
                receive_wait_seconds: Some(21),
                ..Default::default()
            },
            "receive_wait_seconds",
            "20",
        ),
    ];
    for (attributes, field, limit) in cases {
        let refused = node.try_create("ranged", attributes).await.unwrap_err();
        assert_refused(refused, Code::InvalidArgument, &[field, limit]);
    }
    let listed = node
        .client
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.names.is_empty(), "a refused create made a queue");
    let page = node
        .client
        .list_queues(pb::ListQueuesRequest {
            max_results: 1_001,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_refused(page, Code::InvalidArgument, &["max_results", "1000"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_policy_must_name_an_existing_other_queue() {
    let mut node = TestNode::start().await;
    let missing = node
        .try_create("src", redrive_to("nowhere", 5))
        .await
        .unwrap_err();
    assert!(
        matches!(missing.code(), Code::InvalidArgument | Code::NotFound),
        "{missing:?}"
    );
    assert!(missing.message().contains("nowhere"), "{missing:?}");
    let count = node
        .try_create("src", redrive_to("dlq", 1_001))
        .await
        .unwrap_err();
    assert_refused(
        count,
        Code::InvalidArgument,
        &["redrive_policy.max_receive_count", "1000"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_limits_are_checked_with_field_and_limit() {
    let mut node = TestNode::start().await;
    node.create_with(
        "small",
        pb::QueueAttributes {
            max_message_bytes: Some(1_024),
            ..Default::default()
        },
    )
    .await;
    let missing = node
        .try_send(send_request("absent", "x"))
        .await
        .unwrap_err();
    assert_refused(missing, Code::NotFound, &["absent"]);
    let too_long = node
        .try_send(send_request("small", &"x".repeat(1_025)))
        .await
        .unwrap_err();
    assert_refused(too_long, Code::InvalidArgument, &["1025", "1024"]);
    let over_mib = node
        .try_send(send_request("small", &"x".repeat(1_048_577)))
        .await
        .unwrap_err();
    assert_refused(over_mib, Code::InvalidArgument, &["body", "1048576"]);
    let empty = node.try_send(send_request("small", "")).await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    let delay = node
        .client
        .send_message(pb::SendMessageRequest {
            delay_seconds: Some(901),
            ..send_request("small", "x")
        })
        .await
        .unwrap_err();
    assert_refused(delay, Code::InvalidArgument, &["delay_seconds", "900"]);
    let mut eleven = send_request("small", "x");
    for index in 0..11 {
        eleven.attributes.insert(
            format!("a{index}"),
            pb::MessageAttribute {
                data_type: "String".to_owned(),
                value: Some(pb::message_attribute::Value::StringValue("v".to_owned())),
            },
        );
    }
    let attributes = node.client.send_message(eleven).await.unwrap_err();
    assert_refused(attributes, Code::InvalidArgument, &["attributes", "10"]);
    let dedup = node
        .client
        .send_message(pb::SendMessageRequest {
            deduplication_id: Some("x".repeat(129)),
            ..send_request("small", "x")
        })
        .await
        .unwrap_err();
    assert_refused(dedup, Code::InvalidArgument, &["deduplication_id", "128"]);
    assert_eq!(
        node.stats("small").await.ready,
        0,
        "a refused send stored a message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_ranges_are_checked() {
    let mut node = TestNode::start().await;
    node.create("r").await;
    let request =
        |max: u32, visibility: Option<u32>, wait: Option<u32>| pb::ReceiveMessagesRequest {
            queue: "r".to_owned(),
            max_messages: max,
            visibility_timeout_seconds: visibility,
            wait_seconds: wait,
        };
    let max = node
        .client
        .receive_messages(request(11, None, None))
        .await
        .unwrap_err();
    assert_refused(max, Code::InvalidArgument, &["max_messages", "1–10", "11"]);
    let visibility = node
        .client
        .receive_messages(request(1, Some(43_201), None))
        .await
        .unwrap_err();
    assert_refused(
        visibility,
        Code::InvalidArgument,
        &["visibility_timeout_seconds", "43200"],
    );
    let wait = node
        .client
        .receive_messages(request(1, None, Some(21)))
        .await
        .unwrap_err();
    assert_refused(wait, Code::InvalidArgument, &["wait_seconds", "20"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_must_hold_1_to_10_distinct_legal_ids_and_fit_1_mib() {
    let mut node = TestNode::start().await;
    node.create("b").await;
    let entry = |id: &str, body: String| pb::SendMessageBatchEntry {
        id: id.to_owned(),
        body,
        ..Default::default()
    };
    let batch = |entries: Vec<pb::SendMessageBatchEntry>| pb::SendMessageBatchRequest {
        queue: "b".to_owned(),
        entries,
    };
    let empty = node
        .client
        .send_message_batch(batch(vec![]))
        .await
        .unwrap_err();
    assert_refused(empty, Code::InvalidArgument, &["entries", "1–10"]);
    let eleven = (0..11)
        .map(|i| entry(&format!("e{i}"), "x".to_owned()))
        .collect();
    let eleven = node
        .client
        .send_message_batch(batch(eleven))
        .await
        .unwrap_err();
    assert_refused(eleven, Code::InvalidArgument, &["entries", "11"]);
    let twice = node
        .client
        .send_message_batch(batch(vec![
            entry("same", "a".to_owned()),
            entry("same", "b".to_owned()),
        ]))
        .await
        .unwrap_err();
    assert_refused(twice, Code::InvalidArgument, &["entries[1].id", "distinct"]);
    let illegal = node
        .client
        .send_message_batch(batch(vec![entry("has space", "a".to_owned())]))
        .await
        .unwrap_err();
    assert_refused(illegal, Code::InvalidArgument, &["entries[0].id"]);
    let big = node
        .client
        .send_message_batch(batch(vec![
            entry("a", "x".repeat(600_000)),
            entry("b", "x".repeat(600_000)),
        ]))
        .await
        .unwrap_err();
    assert_refused(big, Code::InvalidArgument, &["entries", "1048576"]);
    assert_eq!(node.stats("b").await.ready, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_foreign_receipt_handles_are_refused() {
    let mut node = TestNode::start().await;
    node.create("one").await;
    node.create("two").await;
    node.send("one", "m").await;
    let received = node.receive("one", 1, 600).await.remove(0);
    let forged = node.delete("one", "bm90LWEtaGFuZGxl").await.unwrap_err();
    assert_refused(forged, Code::FailedPrecondition, &["receipt_handle"]);
    // One changed character breaks the MAC.
    let mut altered: Vec<char> = received.receipt_handle.chars().collect();
    let last = altered.len() - 2;
    altered[last] = if altered[last] == 'A' { 'B' } else { 'A' };
    let altered: String = altered.into_iter().collect();
    let tampered = node.delete("one", &altered).await.unwrap_err();
    assert_refused(tampered, Code::FailedPrecondition, &["receipt_handle"]);
    let foreign = node
        .delete("two", &received.receipt_handle)
        .await
        .unwrap_err();
    assert_refused(foreign, Code::FailedPrecondition, &["another queue"]);
    let cap = node
        .change_visibility("one", &received.receipt_handle, 43_201)
        .await
        .unwrap_err();
    assert_refused(
        cap,
        Code::InvalidArgument,
        &["visibility_timeout_seconds", "43200"],
    );
    assert_eq!(
        node.stats("one").await.in_flight,
        1,
        "a refusal changed the message"
    );
}
