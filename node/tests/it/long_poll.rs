//! Long polling: a waiter is answered by the send that makes a message ready, an abandoned
//! waiter is cancelled, a wait ends empty, and shutdown answers open waits empty.

use std::time::Duration;

use tokio::task::JoinHandle;
use trireme_proto::v1 as pb;

use std::sync::Arc;

use tempfile::TempDir;
use trireme_node::clock::SystemClock;
use trireme_node::status::REASON_KEY;

use crate::harness::{Client, TestNode, connect};

fn long_poll(queue: &str, wait_s: u32) -> pb::ReceiveMessagesRequest {
    pb::ReceiveMessagesRequest {
        queue: queue.to_owned(),
        max_messages: 10,
        visibility_timeout_seconds: Some(600),
        wait_seconds: Some(wait_s),
    }
}

/// A 20 s long poll of `queue` through `client`, on a task of its own.
fn spawn_long_poll(
    mut client: Client,
    queue: &'static str,
) -> JoinHandle<Result<tonic::Response<pb::ReceiveMessagesResponse>, tonic::Status>> {
    tokio::spawn(async move { client.receive_messages(long_poll(queue, 20)).await })
}

/// A bound on how long a test waits for an answer that should come at once; it only guards
/// against a hang and measures nothing.
const HANG_GUARD: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_is_answered_by_the_send_that_makes_a_message_ready() {
    let mut node = TestNode::start().await;
    node.create("events").await;
    let waiting = spawn_long_poll(node.client.clone(), "events");
    node.await_waiters("events", 1).await;
    let id = node.send("events", "wake up").await;
    let answer = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("the waiter was not answered")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(answer.messages.len(), 1);
    assert_eq!(answer.messages[0].message_id, id);
    assert_eq!(answer.messages[0].receive_count, 1);
    node.await_waiters("events", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_idle_long_polls_are_each_served_once() {
    let mut node = TestNode::start().await;
    node.create("fanout").await;
    let mut polls = Vec::new();
    for _ in 0..50 {
        polls.push(spawn_long_poll(node.client.clone(), "fanout"));
    }
    node.await_waiters("fanout", 50).await;
    for index in 0..50 {
        node.send("fanout", &format!("m{index}")).await;
    }
    let mut ids = std::collections::BTreeSet::new();
    for poll in polls {
        let answer = tokio::time::timeout(HANG_GUARD, poll)
            .await
            .expect("a waiter was not answered")
            .unwrap()
            .unwrap()
            .into_inner();
        for message in answer.messages {
            assert!(
                ids.insert(message.message_id),
                "a message was delivered twice"
            );
        }
    }
    assert_eq!(ids.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_ends_empty_when_its_wait_passes() {
    let mut node = TestNode::start().await;
    node.create("quiet").await;
    let answer = tokio::time::timeout(
        HANG_GUARD,
        node.client.receive_messages(long_poll("quiet", 1)),
    )
    .await
    .expect("the wait never ended")
    .unwrap()
    .into_inner();
    assert!(answer.messages.is_empty());
    node.await_waiters("quiet", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_long_poll_is_cancelled_and_takes_no_message() {
    let mut node = TestNode::start().await;
    node.create("gone").await;
    // A connection of its own, closed with the task, so the server sees the request end.
    let waiting = spawn_long_poll(connect(node.address).await, "gone");
    node.await_waiters("gone", 1).await;
    waiting.abort();
    node.await_waiters("gone", 0).await;
    node.send("gone", "for someone present").await;
    let received = node.receive("gone", 10, 30).await;
    assert_eq!(
        received.len(),
        1,
        "the abandoned waiter swallowed the message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_open_long_polls_empty() {
    let mut node = TestNode::start().await;
    node.create("closing").await;
    let waiting = spawn_long_poll(node.client.clone(), "closing");
    node.await_waiters("closing", 1).await;
    let shutdown = tokio::spawn(node.shutdown());
    let answer = tokio::time::timeout(HANG_GUARD, waiting)
        .await
        .expect("shutdown left the long poll open")
        .unwrap()
        .unwrap()
        .into_inner();
    assert!(answer.messages.is_empty());
    tokio::time::timeout(HANG_GUARD, shutdown)
        .await
        .expect("shutdown hung")
        .unwrap();
}

/// Beyond `long_polls_max` a receive that would wait is shed with the throttling refusal, not
/// answered empty (a client told "nothing" polls again at once); a short poll still works, and
/// a place frees when a long poll ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_beyond_the_cap_is_throttled() {
    let dir = Arc::new(TempDir::new().unwrap());
    let mut node = TestNode::start_configured(dir, Arc::new(SystemClock), |config| {
        config.long_polls_max = 2;
    })
    .await;
    node.create("capped").await;
    node.create("other").await;
    let first = spawn_long_poll(node.client.clone(), "capped");
    let second = spawn_long_poll(node.client.clone(), "other");
    node.await_waiters("capped", 1).await;
    node.await_waiters("other", 1).await;

    let refused = tokio::time::timeout(
        HANG_GUARD,
        node.client
            .clone()
            .receive_messages(long_poll("capped", 20)),
    )
    .await
    .expect("a refusal comes at once")
    .expect_err("a third long poll is over the cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        refused
            .metadata()
            .get(REASON_KEY)
            .unwrap()
            .to_str()
            .unwrap(),
        "Overloaded"
    );
    assert!(refused.message().contains("2 long polls"), "{refused:?}");
    // Nothing waits for it, and a short poll is served.
    node.await_waiters("capped", 1).await;
    assert!(node.receive("capped", 10, 30).await.is_empty());

    // A message ends the first wait; its place is free for the next long poll.
    let id = node.send("capped", "for the first").await;
    let answer = tokio::time::timeout(HANG_GUARD, first)
        .await
        .expect("the first waiter is answered")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(answer.messages[0].message_id, id);
    let third = spawn_long_poll(node.client.clone(), "capped");
    node.await_waiters("capped", 1).await;
    node.send("capped", "for the third").await;
    let answer = tokio::time::timeout(HANG_GUARD, third)
        .await
        .expect("the third waiter is answered")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(answer.messages.len(), 1);
    node.send("other", "for the second").await;
    tokio::time::timeout(HANG_GUARD, second)
        .await
        .expect("the second waiter is answered")
        .unwrap()
        .unwrap();
}
