//! Clients of several real nodes on loopback: every call gets through while one endpoint is a
//! closed port, calls move to the other node when one is killed mid-run, and a worker whose
//! first endpoint is down still dead-letters a terminal failure with its receive count.
//!
//! The nodes here are single nodes, not a cluster: each test creates its queues on every node,
//! and what a node holds shows which node a call reached.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use trireme_client::{
    Backoff, Client, ClientConfig, DeleteEntry, HandlerError, Message, MessageId,
    QueueAttributeChanges, QueueName, ReceiveOptions, SendBatchEntry, SendMessage, StartRedrive,
    VisibilityChange, Worker, WorkerConfig, WorkerCounters, WorkerMetrics,
};

use crate::fake::{self, ClosedPort};
use crate::node::{
    KillableNode, TestNode, create_queue, create_with_dead_letter_queue, queue_name, send_numbered,
};

fn wait(seconds: u32, max: u32) -> ReceiveOptions {
    ReceiveOptions {
        max_messages: max,
        visibility_timeout_seconds: Some(300),
        wait_seconds: Some(seconds),
    }
}

/// A client whose home is the closed port, probed again by every call (it is skipped for at
/// most a nanosecond), so that each call below fails over by itself.
fn through_closed_home(closed: &ClosedPort, node: &TestNode) -> Client {
    let mut config = ClientConfig::new([closed.address.clone(), node.address.clone()]);
    config.home_endpoint = Some(0);
    config.endpoint_down = Backoff::new(Duration::from_nanos(1), Duration::from_nanos(1));
    Client::new(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_succeeds_through_the_other_endpoint_when_one_is_closed() {
    let closed = fake::closed_port();
    let node = TestNode::start().await;
    let direct = node.client();
    let client = through_closed_home(&closed, &node);
    assert_eq!(client.home_endpoint(), closed.address);

    // Queues.
    let dlq = queue_name("fo-dlq");
    let queue = queue_name("fo");
    create_with_dead_letter_queue(&client, &queue, &dlq, 5).await;
    assert_eq!(client.get_queue(&queue).await.unwrap().name, queue);
    let listed = client.list_all_queues("fo").await.unwrap();
    assert!(
        listed.contains(&queue) && listed.contains(&dlq),
        "{listed:?}"
    );
    let changes = QueueAttributeChanges {
        delay_seconds: Some(0),
        visibility_timeout_seconds: Some(40),
        ..Default::default()
    };
    let changed = client.set_queue_attributes(&queue, &changes).await.unwrap();
    assert_eq!(changed.settings.visibility_timeout_seconds, 40);
    let tags: BTreeMap<String, String> = [("team".to_owned(), "payments".to_owned())].into();
    client.tag_queue(&queue, &tags).await.unwrap();
    client
        .untag_queue(&queue, &["absent".to_owned()])
        .await
        .unwrap();
    assert_eq!(client.queue_tags(&queue).await.unwrap(), tags);
    let sources = client
        .list_dead_letter_source_queues(&dlq, None, None)
        .await
        .unwrap();
    assert_eq!(sources.names, std::slice::from_ref(&queue));

    // Messages: sends without a deduplication id, receives and deletes move on too, since no
    // connection to the closed port ever opened.
    client
        .send_message(&queue, &SendMessage::new("one"))
        .await
        .unwrap();
    let batch: Vec<SendBatchEntry> = (0..3)
        .map(|i| SendBatchEntry {
            id: format!("e{i}"),
            message: SendMessage::new(format!("batch {i}")),
        })
        .collect();
    let sent = client.send_message_batch(&queue, &batch).await.unwrap();
    assert_eq!((sent.successful.len(), sent.failed.len()), (3, 0));
    let mut got = Vec::new();
    for _ in 0..20 {
        got.extend(client.receive_messages(&queue, &wait(1, 10)).await.unwrap());
        if got.len() == 4 {
            break;
        }
    }
    assert_eq!(got.len(), 4, "{got:?}");
    client
        .change_visibility(&queue, &got[0].receipt_handle, 100)
        .await
        .unwrap();
    let changes: Vec<VisibilityChange> = got[1..]
        .iter()
        .enumerate()
        .map(|(i, m)| VisibilityChange {
            id: i.to_string(),
            receipt_handle: m.receipt_handle.clone(),
            visibility_timeout_seconds: 100,
        })
        .collect();
    let changed = client
        .change_visibility_batch(&queue, &changes)
        .await
        .unwrap();
    assert_eq!(changed.successful.len(), 3);
    client
        .delete_message(&queue, &got[0].receipt_handle)
        .await
        .unwrap();
    let deletes = [DeleteEntry {
        id: "d".to_owned(),
        receipt_handle: got[1].receipt_handle.clone(),
    }];
    let deleted = client.delete_message_batch(&queue, &deletes).await.unwrap();
    assert_eq!(deleted.successful, ["d"]);
    let moved_to = client
        .dead_letter_message(&queue, &got[2].receipt_handle)
        .await
        .unwrap();
    assert_eq!(moved_to, dlq);

    // Redrive.
    let target = queue_name("fo-target");
    create_queue(&client, &target).await;
    send_numbered(&client, &dlq, 10).await;
    let task = client
        .start_redrive(&StartRedrive {
            source_queue: dlq.clone(),
            destination_queue: Some(target.clone()),
            max_messages_per_second: Some(1),
        })
        .await
        .unwrap();
    let tasks = client.list_redrives(&dlq, Some(10)).await.unwrap();
    assert!(tasks.iter().any(|t| t.task_handle == task));
    let moved = client.cancel_redrive(&task).await.unwrap();
    assert!(moved < 11, "{moved}");

    // Removal.
    client.purge_queue(&target).await.unwrap();
    client.delete_queue(&target).await.unwrap();

    // All of it reached the node; what is left there is what the calls above left.
    let stats = direct.queue_stats(&queue).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 1));
    assert!(direct.get_queue(&target).await.is_err());
}

/// Sends with deduplication ids (so a send under way when its node dies is retried on the
/// other) until `after_kill_min` of them started after `killed` was set, and sorts the ids the
/// sends were acknowledged with: those that ended before `half` was signalled, those that
/// started after `killed`, and the rest.
async fn send_through_a_kill(
    client: Client,
    queue: QueueName,
    half: oneshot::Sender<()>,
    half_at: u32,
    killed: Arc<AtomicBool>,
    after_kill_min: usize,
) -> (BTreeSet<MessageId>, BTreeSet<MessageId>) {
    let mut half = Some(half);
    let mut before = BTreeSet::new();
    let mut after = BTreeSet::new();
    // Bounded: the kill takes far fewer sends than this on any machine.
    for i in 0..100_000u32 {
        let started_after_kill = killed.load(Ordering::SeqCst);
        let message = SendMessage::new(format!("m{i}")).deduplication_id(format!("d{i}"));
        let sent = client
            .send_message(&queue, &message)
            .await
            .unwrap_or_else(|error| panic!("send {i} failed: {error}"));
        if started_after_kill {
            after.insert(sent.message_id);
            if after.len() >= after_kill_min {
                return (before, after);
            }
        } else if half.is_some() {
            before.insert(sent.message_id);
        }
        if i + 1 == half_at {
            half.take().expect("signalled once").send(()).unwrap();
        }
    }
    panic!("the kill did not finish within 100,000 sends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_over_when_a_node_is_killed_mid_run() {
    let mut first = KillableNode::start().await;
    let second = TestNode::start().await;
    let queue = queue_name("killed");
    create_queue(&first.client(), &queue).await;
    create_queue(&second.client(), &queue).await;
    let mut config = ClientConfig::new([first.address.clone(), second.address.clone()]);
    config.home_endpoint = Some(0);
    let client = Client::new(config).unwrap();

    let killed = Arc::new(AtomicBool::new(false));
    let (half_tx, half_rx) = oneshot::channel();
    let sender = tokio::spawn(send_through_a_kill(
        client.clone(),
        queue.clone(),
        half_tx,
        50,
        killed.clone(),
        50,
    ));
    // Killed while the sender keeps sending.
    half_rx.await.unwrap();
    first.kill().await;
    let address: SocketAddr = first.address.trim_start_matches("http://").parse().unwrap();
    let _dead = fake::hold_closed(address);
    killed.store(true, Ordering::SeqCst);
    let (before, after) = sender.await.unwrap();
    assert_eq!(before.len(), 50);

    // Receives and deletes fail over as well: everything the second node holds comes back
    // through the client whose home is dead.
    let mut on_second = Vec::new();
    for _ in 0..1_000 {
        let got = client.receive_messages(&queue, &wait(0, 10)).await.unwrap();
        if got.is_empty() {
            break;
        }
        let deletes: Vec<DeleteEntry> = got
            .iter()
            .enumerate()
            .map(|(i, m)| DeleteEntry {
                id: i.to_string(),
                receipt_handle: m.receipt_handle.clone(),
            })
            .collect();
        let deleted = client.delete_message_batch(&queue, &deletes).await.unwrap();
        assert_eq!(deleted.successful.len(), got.len(), "{:?}", deleted.failed);
        on_second.extend(got.into_iter().map(|m| m.message_id));
    }
    let on_second: BTreeSet<MessageId> = on_second.into_iter().collect();
    // Every send that began after the kill reached the second node; none that was
    // acknowledged before the kill began did (they went to the home, which answered).
    let missing: Vec<_> = after.difference(&on_second).collect();
    assert!(
        missing.is_empty(),
        "acknowledged after the kill but not on the second node: {missing:?}"
    );
    let strays: Vec<_> = before.intersection(&on_second).collect();
    assert!(
        strays.is_empty(),
        "sent to the home before the kill yet on the second node: {strays:?}"
    );
    let stats = second.client().queue_stats(&queue).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight, stats.delayed), (0, 0, 0));
}

/// A worker's settlements, sent to the test.
struct Settled {
    tx: mpsc::UnboundedSender<(&'static str, MessageId)>,
    counters: WorkerCounters,
}

impl WorkerMetrics for Settled {
    fn processed(&self, m: &Message) {
        self.counters.processed(m);
        let _ = self.tx.send(("processed", m.message_id.clone()));
    }
    fn retried(&self, m: &Message, delay: Duration) {
        self.counters.retried(m, delay);
        let _ = self.tx.send(("retried", m.message_id.clone()));
    }
    fn dead_lettered(&self, m: &Message) {
        self.counters.dead_lettered(m);
        let _ = self.tx.send(("dead_lettered", m.message_id.clone()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_behind_a_closed_endpoint_dead_letters_a_terminal_failure_with_its_receive_count()
{
    let closed = fake::closed_port();
    let node = TestNode::start().await;
    let direct = node.client();
    let dlq = queue_name("wfo-dlq");
    let queue = queue_name("wfo");
    create_with_dead_letter_queue(&direct, &queue, &dlq, 5).await;
    let good = direct
        .send_message(&queue, &SendMessage::new("fine"))
        .await
        .unwrap();
    let poison = direct
        .send_message(&queue, &SendMessage::new("poison"))
        .await
        .unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let metrics = Arc::new(Settled {
        tx,
        counters: WorkerCounters::default(),
    });
    // The poison message fails twice: first as retryable, then as terminal.
    let worker = Worker::new(
        through_closed_home(&closed, &node),
        queue.clone(),
        |job| async move {
            match (job.message.body.as_str(), job.message.receive_count) {
                ("poison", 1) => Err(HandlerError::retryable("try once more")),
                ("poison", _) => Err(HandlerError::terminal("never works")),
                _ => Ok(()),
            }
        },
    )
    .with_config(WorkerConfig {
        concurrency: 2,
        wait_seconds: 1,
        visibility_timeout_seconds: 30,
        retry_backoff: Backoff::new(Duration::from_millis(100), Duration::from_millis(200)),
        ..WorkerConfig::default()
    })
    .with_metrics(metrics.clone());
    let (stop, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stop_rx.await;
    }));
    let mut settled = BTreeSet::new();
    while settled.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("the worker settled nothing for 60 s")
            .expect("the worker is gone");
        settled.insert(event);
    }
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let expected: BTreeSet<_> = [
        ("processed", good.message_id.clone()),
        ("retried", poison.message_id.clone()),
        ("dead_lettered", poison.message_id.clone()),
    ]
    .into();
    assert_eq!(settled, expected);

    let stats = direct.queue_stats(&queue).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight, stats.delayed), (0, 0, 0));
    // Moved by the node at the second delivery: the same id, received twice in the source,
    // and once more here.
    let moved = direct.receive_messages(&dlq, &wait(5, 10)).await.unwrap();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0].message_id, poison.message_id);
    assert_eq!(moved[0].receive_count, 3);
    assert_eq!(moved[0].dead_letter_source.as_ref(), Some(&queue));
    let counts = metrics.counters.snapshot();
    assert_eq!(
        (counts.processed, counts.retried, counts.dead_lettered),
        (1, 1, 1)
    );
}
