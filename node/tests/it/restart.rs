//! Restart: a node started again on the same data directory rebuilds its queues from storage,
//! with messages, receipt handles, receive counts, delays and deletions as they were.

use tonic::Code;
use trireme_proto::v1 as pb;

use crate::harness::{TestNode, has_database, send_request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_queues_messages_handles_and_receive_counts() {
    let mut node = TestNode::start().await;
    node.create_with(
        "durable",
        pb::QueueAttributes {
            visibility_timeout_seconds: Some(120),
            ..Default::default()
        },
    )
    .await;
    let kept = node.send("durable", "kept").await;
    let held = node.send("durable", "held").await;
    let deleted = node.send("durable", "deleted").await;
    node.client
        .send_message(pb::SendMessageRequest {
            delay_seconds: Some(900),
            ..send_request("durable", "delayed")
        })
        .await
        .unwrap();
    let mut in_flight = node.receive("durable", 10, 600).await;
    assert_eq!(in_flight.len(), 3);
    in_flight.sort_by_key(|message| message.body.clone());
    let [to_delete, to_hold, _kept] = [&in_flight[0], &in_flight[1], &in_flight[2]];
    assert_eq!(to_delete.message_id, deleted);
    assert_eq!(to_hold.message_id, held);
    node.delete("durable", &to_delete.receipt_handle)
        .await
        .unwrap();
    // Make "kept" visible again so it can be received after the restart.
    node.change_visibility("durable", &in_flight[2].receipt_handle, 0)
        .await
        .unwrap();

    let mut node = node.restart().await;
    assert!(has_database(node.dir.path()));
    let info = node.get_queue("durable").await.unwrap();
    assert_eq!(
        info.attributes.unwrap().visibility_timeout_seconds,
        Some(120)
    );
    let stats = info.stats.unwrap();
    assert_eq!((stats.ready, stats.in_flight, stats.delayed), (1, 1, 1));

    // The receipt handle issued before the restart still controls its message.
    node.change_visibility("durable", &to_hold.receipt_handle, 0)
        .await
        .unwrap();
    let mut again = node.receive("durable", 10, 600).await;
    again.sort_by_key(|message| message.body.clone());
    let bodies: Vec<&str> = again.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(
        bodies,
        ["held", "kept"],
        "the deleted message came back or one was lost"
    );
    assert_eq!(again[0].message_id, held);
    assert_eq!(again[1].message_id, kept);
    // Receive counts continued from before the restart.
    assert_eq!(again[0].receive_count, 2);
    assert_eq!(again[1].receive_count, 2);
    // The handle from before the restart is superseded now.
    let stale = node
        .delete("durable", &to_hold.receipt_handle)
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_window_and_deleted_queue_name_survive_a_restart() {
    let mut node = TestNode::start().await;
    node.create("d").await;
    node.create("gone").await;
    let request = pb::SendMessageRequest {
        deduplication_id: Some("once".to_owned()),
        ..send_request("d", "body")
    };
    let first = node.try_send(request.clone()).await.unwrap();
    node.client
        .delete_queue(pb::DeleteQueueRequest {
            name: "gone".to_owned(),
        })
        .await
        .unwrap();
    let mut node = node.restart().await;
    let second = node.try_send(request).await.unwrap();
    assert!(second.duplicate);
    assert_eq!(second.message_id, first.message_id);
    let recreate = node
        .client
        .create_queue(pb::CreateQueueRequest {
            name: "gone".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(recreate.code(), Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_the_same_data_directory_is_refused() {
    let node = TestNode::start().await;
    let config = trireme_node::config::Config::with_data_dir(node.dir.path());
    let second = trireme_node::open_storage(&config);
    let error = second.expect_err("two nodes opened one database");
    assert!(
        error
            .to_string()
            .contains(node.dir.path().to_str().unwrap()),
        "{error}"
    );
}
