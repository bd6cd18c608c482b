//! Redrive tasks: moving a dead-letter queue back to its source with progress, cancelling a
//! slow one, and the refusals.

use tonic::Code;
use trireme_proto::v1 as pb;
use trireme_proto::v1::redrive_task::Status as TaskStatus;

use crate::harness::{Client, TestNode, eventually, redrive_to};

/// A source queue `src` with dead-letter queue `dlq` (maxReceiveCount 1) and `count` messages
/// moved there by receives.
async fn dead_lettered(node: &mut TestNode, count: usize) {
    node.create("dlq").await;
    node.create_with("src", redrive_to("dlq", 1)).await;
    for index in 0..count {
        node.send("src", &format!("m{index}")).await;
    }
    // Receive each once with visibility 0, then receive again until all have moved.
    let mut received = 0;
    for _ in 0..100 {
        received += node.receive("src", 10, 0).await.len();
        if received >= count {
            break;
        }
    }
    assert_eq!(received, count);
    for _ in 0..200 {
        node.receive("src", 10, 0).await;
        if node.stats("dlq").await.ready == count as u64 {
            return;
        }
    }
    panic!("the messages never reached the dead-letter queue");
}

/// Starts a redrive of `source`, to `destination` or back to each message's source queue,
/// at `rate` messages a second (0: the default); returns the task handle.
async fn start_redrive(
    node: &mut TestNode,
    source: &str,
    destination: Option<&str>,
    rate: u32,
) -> Result<String, tonic::Status> {
    let request = pb::StartRedriveRequest {
        source_queue: source.to_owned(),
        destination_queue: destination.map(str::to_owned),
        max_messages_per_second: rate,
    };
    let reply = node.client.start_redrive(request).await?;
    Ok(reply.into_inner().task_handle)
}

/// Waits (bounded) until the task `handle` of `dlq` reports `status`.
async fn await_task_status(node: &TestNode, handle: &str, status: TaskStatus) {
    let client = node.client.clone();
    eventually(&format!("redrive {handle} to be {status:?}"), || {
        let mut client = client.clone();
        async move {
            dlq_tasks(&mut client)
                .await
                .iter()
                .any(|task| task.task_handle == handle && task.status == status as i32)
        }
    })
    .await;
}

/// The ten most recent redrive tasks of `dlq`, newest first.
async fn dlq_tasks(client: &mut Client) -> Vec<pb::RedriveTask> {
    client
        .list_redrives(pb::ListRedrivesRequest {
            source_queue: "dlq".to_owned(),
            max_results: 10,
        })
        .await
        .unwrap()
        .into_inner()
        .tasks
}

async fn task(node: &mut TestNode, handle: &str) -> pb::RedriveTask {
    dlq_tasks(&mut node.client)
        .await
        .into_iter()
        .find(|task| task.task_handle == handle)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_moves_dead_letters_back_to_their_source_with_progress() {
    let mut node = TestNode::start().await;
    dead_lettered(&mut node, 5).await;
    let handle = start_redrive(&mut node, "dlq", None, 0).await.unwrap();
    await_task_status(&node, &handle, TaskStatus::Completed).await;
    let done = task(&mut node, &handle).await;
    assert_eq!((done.moved, done.failed, done.to_move), (5, 0, 5));
    assert_eq!(node.stats("dlq").await.ready, 0);
    assert_eq!(node.stats("src").await.ready, 5);
    // Redrive resets the receive count, so the next receive delivers instead of moving again.
    let back = node.receive("src", 10, 600).await;
    assert_eq!(back.len(), 5);
    assert!(back.iter().all(|message| message.receive_count == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_redrive_can_be_cancelled_and_keeps_its_progress() {
    let mut node = TestNode::start().await;
    dead_lettered(&mut node, 4).await;
    let handle = start_redrive(&mut node, "dlq", Some("src"), 1)
        .await
        .unwrap();
    let second = start_redrive(&mut node, "dlq", None, 1).await.unwrap_err();
    assert_eq!(second.code(), Code::FailedPrecondition, "{second:?}");
    let moved = node
        .client
        .cancel_redrive(pb::CancelRedriveRequest {
            task_handle: handle.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .moved;
    await_task_status(&node, &handle, TaskStatus::Cancelled).await;
    let stopped = task(&mut node, &handle).await;
    assert!(stopped.moved >= moved && stopped.moved < 4, "{stopped:?}");
    assert_eq!(
        node.stats("dlq").await.ready + node.stats("src").await.ready,
        4,
        "a cancelled redrive lost or duplicated messages"
    );
    let again = node
        .client
        .cancel_redrive(pb::CancelRedriveRequest {
            task_handle: handle,
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_refusals_name_what_is_wrong() {
    let mut node = TestNode::start().await;
    node.create("plain").await;
    let not_dlq = start_redrive(&mut node, "plain", None, 0)
        .await
        .unwrap_err();
    assert_eq!(not_dlq.code(), Code::FailedPrecondition);
    assert!(not_dlq.message().contains("dead-letter"), "{not_dlq:?}");
    let rate = start_redrive(&mut node, "plain", Some("plain"), 501)
        .await
        .unwrap_err();
    assert_eq!(rate.code(), Code::InvalidArgument);
    assert!(
        rate.message().contains("max_messages_per_second"),
        "{rate:?}"
    );
    assert!(rate.message().contains("500"), "{rate:?}");
    let missing = start_redrive(&mut node, "absent", None, 0)
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let unknown = node
        .client
        .cancel_redrive(pb::CancelRedriveRequest {
            task_handle: "redrive-0".to_owned(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}
