//! The node driven through the `trireme-client` crate, as applications use it: create, send,
//! long-poll receive woken by a send, delete, and the typed refusal of a superseded handle.

use trireme_client::{Client, Error, QueueAttributes, QueueName, ReceiveOptions, SendMessage};

use crate::harness::TestNode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_crate_round_trip_with_long_poll_and_stale_handle() {
    let node = TestNode::start().await;
    let client = Client::connect([format!("http://{}", node.address)]).unwrap();
    let queue = QueueName::new("client-jobs").unwrap();
    client
        .create_queue(&queue, &QueueAttributes::default())
        .await
        .unwrap();

    let poller = client.clone();
    let polled = queue.clone();
    let waiting = tokio::spawn(async move {
        poller
            .receive_messages(
                &polled,
                &ReceiveOptions {
                    max_messages: 10,
                    visibility_timeout_seconds: Some(0),
                    wait_seconds: Some(20),
                },
            )
            .await
    });
    node.await_waiters("client-jobs", 1).await;
    let sent = client
        .send_message(&queue, &SendMessage::new("build #42"))
        .await
        .unwrap();
    let first = waiting.await.unwrap().unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].message_id, sent.message_id);

    // Visibility 0: the message is ready again; the second receive supersedes the first handle.
    let mut second = Vec::new();
    for _ in 0..50 {
        second = client
            .receive_messages(
                &queue,
                &ReceiveOptions {
                    max_messages: 1,
                    visibility_timeout_seconds: Some(600),
                    wait_seconds: Some(0),
                },
            )
            .await
            .unwrap();
        if !second.is_empty() {
            break;
        }
    }
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].receive_count, 2);
    let stale = client
        .delete_message(&queue, &first[0].receipt_handle)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, Error::StaleReceiptHandle { .. }),
        "{stale:?}"
    );
    client
        .delete_message(&queue, &second[0].receipt_handle)
        .await
        .unwrap();
    let stats = client.queue_stats(&queue).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}
