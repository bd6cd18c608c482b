//! Message RPCs: send (single, batch, deduplicated, delayed), receive, delete (single, batch),
//! change visibility (single, batch), receipt-handle freshness.

use tonic::Code;
use trireme_proto::v1 as pb;

use crate::harness::{TestNode, redrive_to, send_request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_receive_delete_round_trip_reports_counts_times_and_md5() {
    let mut node = TestNode::start().await;
    node.create("inbox").await;
    let mut request = send_request("inbox", "hello");
    request.attributes.insert(
        "kind".to_owned(),
        pb::MessageAttribute {
            data_type: "String".to_owned(),
            value: Some(pb::message_attribute::Value::StringValue(
                "greeting".to_owned(),
            )),
        },
    );
    let sent = node.try_send(request).await.unwrap();
    assert_eq!(sent.md5_of_body, "5d41402abc4b2a76b9719d911017c592");
    assert!(!sent.duplicate);

    let received = node.receive("inbox", 10, 600).await;
    assert_eq!(received.len(), 1);
    let message = &received[0];
    assert_eq!(message.message_id, sent.message_id);
    assert_eq!(message.body, "hello");
    assert_eq!(message.receive_count, 1);
    assert_eq!(message.md5_of_body, sent.md5_of_body);
    assert!(message.sent_at_ms > 0 && message.first_receive_at_ms >= message.sent_at_ms);
    assert_eq!(
        message.attributes["kind"].value,
        Some(pb::message_attribute::Value::StringValue(
            "greeting".to_owned()
        ))
    );
    assert!(node.receive("inbox", 10, 600).await.is_empty());
    let stats = node.stats("inbox").await;
    assert_eq!((stats.ready, stats.in_flight), (0, 1));

    node.delete("inbox", &message.receipt_handle).await.unwrap();
    // A repeated delete succeeds: the message is gone, which is what the caller wanted.
    node.delete("inbox", &message.receipt_handle).await.unwrap();
    let stats = node.stats("inbox").await;
    assert_eq!((stats.ready, stats.in_flight, stats.delayed), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_with_superseded_handle_is_refused_and_the_newest_deletes() {
    let mut node = TestNode::start().await;
    node.create("q").await;
    node.send("q", "job").await;
    let first = node.receive("q", 1, 600).await.remove(0);
    // Visibility 0 makes it ready again at once; the next receive supersedes the first handle.
    node.change_visibility("q", &first.receipt_handle, 0)
        .await
        .unwrap();
    let second = node.receive("q", 1, 600).await.remove(0);
    assert_eq!(second.message_id, first.message_id);
    assert_eq!(second.receive_count, 2);
    assert_ne!(second.receipt_handle, first.receipt_handle);
    let stale = node.delete("q", &first.receipt_handle).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert!(stale.message().contains("receipt_handle"), "{stale:?}");
    node.delete("q", &second.receipt_handle).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_batch_reports_per_entry_failures_and_stores_the_rest() {
    let mut node = TestNode::start().await;
    node.create("batch").await;
    let entry = |id: &str, body: &str| pb::SendMessageBatchEntry {
        id: id.to_owned(),
        body: body.to_owned(),
        ..Default::default()
    };
    let response = node
        .client
        .send_message_batch(pb::SendMessageBatchRequest {
            queue: "batch".to_owned(),
            entries: vec![
                entry("a", "first"),
                entry("bad", "nul \u{0} is not allowed"),
                entry("c", "third"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let ok: Vec<&str> = response.successful.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ok, ["a", "c"]);
    assert_eq!(response.failed.len(), 1);
    assert_eq!(response.failed[0].id, "bad");
    assert_eq!(response.failed[0].code, "InvalidMessageContents");
    assert!(response.failed[0].sender_fault);
    assert_eq!(node.stats("batch").await.ready, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_visibility_batches_refuse_garbage_handles_per_entry() {
    let mut node = TestNode::start().await;
    node.create("b").await;
    node.send("b", "one").await;
    node.send("b", "two").await;
    let received = node.receive("b", 10, 600).await;
    assert_eq!(received.len(), 2);

    let visibility = node
        .client
        .change_visibility_batch(pb::ChangeVisibilityBatchRequest {
            queue: "b".to_owned(),
            entries: vec![
                pb::ChangeVisibilityBatchEntry {
                    id: "ok".to_owned(),
                    receipt_handle: received[0].receipt_handle.clone(),
                    visibility_timeout_seconds: 900,
                },
                pb::ChangeVisibilityBatchEntry {
                    id: "forged".to_owned(),
                    receipt_handle: "AAAAforged".to_owned(),
                    visibility_timeout_seconds: 10,
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(visibility.successful, ["ok"]);
    assert_eq!(visibility.failed[0].id, "forged");
    assert_eq!(visibility.failed[0].code, "ReceiptHandleIsInvalid");

    let deleted = node
        .client
        .delete_message_batch(pb::DeleteMessageBatchRequest {
            queue: "b".to_owned(),
            entries: vec![
                pb::DeleteMessageBatchEntry {
                    id: "m0".to_owned(),
                    receipt_handle: received[0].receipt_handle.clone(),
                },
                pb::DeleteMessageBatchEntry {
                    id: "m1".to_owned(),
                    receipt_handle: received[1].receipt_handle.clone(),
                },
                pb::DeleteMessageBatchEntry {
                    id: "junk".to_owned(),
                    receipt_handle: "not a handle".to_owned(),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.successful, ["m0", "m1"]);
    assert_eq!(deleted.failed.len(), 1);
    assert_eq!(deleted.failed[0].code, "ReceiptHandleIsInvalid");
    let stats = node.stats("b").await;
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_id_answers_the_first_message_id() {
    let mut node = TestNode::start().await;
    node.create("dedup").await;
    let request = pb::SendMessageRequest {
        deduplication_id: Some("order-17".to_owned()),
        ..send_request("dedup", "charge")
    };
    let first = node.try_send(request.clone()).await.unwrap();
    let second = node.try_send(request).await.unwrap();
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(first.message_id, second.message_id);
    assert_eq!(node.stats("dedup").await.ready, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_send_is_counted_delayed_not_ready() {
    let mut node = TestNode::start().await;
    node.create("later").await;
    node.client
        .send_message(pb::SendMessageRequest {
            delay_seconds: Some(600),
            ..send_request("later", "tomorrow")
        })
        .await
        .unwrap();
    let stats = node.stats("later").await;
    assert_eq!((stats.ready, stats.delayed), (0, 1));
    assert!(node.receive("later", 10, 30).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_past_max_receive_count_moves_to_the_dead_letter_queue() {
    let mut node = TestNode::start().await;
    node.create("dlq").await;
    node.create_with("src", redrive_to("dlq", 1)).await;
    let id = node.send("src", "poison").await;
    let first = node.receive("src", 1, 0).await;
    assert_eq!(first.len(), 1);
    // The second receive finds it at its max receive count and moves it instead.
    let mut moved = false;
    for _ in 0..50 {
        assert!(node.receive("src", 1, 0).await.is_empty());
        if node.stats("dlq").await.ready == 1 {
            moved = true;
            break;
        }
    }
    assert!(moved, "the message never reached the dead-letter queue");
    let dead = node.receive("dlq", 1, 600).await.remove(0);
    assert_eq!(dead.message_id, id);
    assert_eq!(dead.dead_letter_source.as_deref(), Some("src"));
    // The move keeps the count; this receive adds one.
    assert_eq!(dead.receive_count, 2);
}
