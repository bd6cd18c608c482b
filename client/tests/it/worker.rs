//! The worker harness (issue 6) against a real node: heartbeats, crashes, poison messages,
//! terminal failures and shutdown. Effects are awaited through the metrics hooks or through
//! long polls, never through sleeps; every wait is a bounded loop.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use trireme_client::worker::IDEMPOTENCY_KEY_ATTRIBUTE;
use trireme_client::{
    Backoff, Client, HandlerError, HandlerOutcome, Job, Message, MessageId, QueueName,
    ReceiveOptions, SendMessage, Worker, WorkerConfig, WorkerCounters, WorkerMetrics,
};

use crate::node::{TestNode, create_queue, create_with_dead_letter_queue, queue_name, send};

/// What a worker reported, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Processed(MessageId),
    Retried(MessageId),
    DeadLettered(MessageId),
    Extended(MessageId),
    Released(MessageId),
}

/// Metrics that forward every event to the test and keep totals.
struct Events {
    tx: mpsc::UnboundedSender<Event>,
    counters: WorkerCounters,
}

impl WorkerMetrics for Events {
    fn processed(&self, m: &Message) {
        self.counters.processed(m);
        let _ = self.tx.send(Event::Processed(m.message_id.clone()));
    }
    fn retried(&self, m: &Message, delay: Duration) {
        self.counters.retried(m, delay);
        let _ = self.tx.send(Event::Retried(m.message_id.clone()));
    }
    fn dead_lettered(&self, m: &Message) {
        self.counters.dead_lettered(m);
        let _ = self.tx.send(Event::DeadLettered(m.message_id.clone()));
    }
    fn extended(&self, m: &Message) {
        self.counters.extended(m);
        let _ = self.tx.send(Event::Extended(m.message_id.clone()));
    }
    fn released(&self, m: &Message) {
        self.counters.released(m);
        let _ = self.tx.send(Event::Released(m.message_id.clone()));
    }
    fn handler_latency(&self, m: &Message, latency: Duration, outcome: HandlerOutcome) {
        self.counters.handler_latency(m, latency, outcome);
    }
}

fn events() -> (Arc<Events>, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Arc::new(Events {
            tx,
            counters: WorkerCounters::default(),
        }),
        rx,
    )
}

/// A worker running on its own task until [`Running::stop`].
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), trireme_client::Error>>,
}

impl Running {
    fn start<H, Fut>(worker: Worker<H>) -> Running
    where
        H: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(worker.run(async {
            let _ = stop_rx.await;
        }));
        Running { stop, task }
    }

    /// Asks the worker to stop and requires that it ends without error.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

/// The next event, failing the test if none comes within a generous bound.
async fn next(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the worker reported nothing for 60 s")
        .expect("the worker is gone")
}

/// The next event that is not a heartbeat.
async fn next_settlement(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    loop {
        match next(rx).await {
            Event::Extended(_) => {}
            other => return other,
        }
    }
}

fn config(visibility_timeout_seconds: u32) -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        receive_batch: 10,
        wait_seconds: 1,
        visibility_timeout_seconds,
        retry_backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(1)),
        shutdown_grace: Duration::from_secs(10),
        ..WorkerConfig::default()
    }
}

fn poll(wait_seconds: u32) -> ReceiveOptions {
    ReceiveOptions {
        max_messages: 10,
        visibility_timeout_seconds: None,
        wait_seconds: Some(wait_seconds),
    }
}

/// Receives from `queue` until `count` messages arrived, in at most `polls` long polls.
async fn receive_until(
    client: &Client,
    queue: &QueueName,
    count: usize,
    polls: usize,
) -> Vec<Message> {
    let mut got = Vec::new();
    for _ in 0..polls {
        got.extend(client.receive_messages(queue, &poll(5)).await.unwrap());
        if got.len() >= count {
            return got;
        }
    }
    panic!(
        "only {} of {count} messages arrived in {polls} polls",
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_is_not_redelivered_while_its_heartbeats_run() {
    let node = TestNode::start().await;
    let client = node.client();
    let queue = queue_name("slow");
    create_queue(&client, &queue).await;
    let sent = send(&client, &queue, "slow job").await;

    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<()>();
    let finish = Arc::new(Semaphore::new(0));
    let gate = finish.clone();
    let (metrics, mut rx) = events();
    let worker = Worker::new(client.clone(), queue.clone(), move |_job| {
        let (started, gate) = (started_tx.clone(), gate.clone());
        async move {
            let _ = started.send(());
            // Runs until the test lets it finish: far longer than the 2 s visibility timeout.
            let _permit = gate.acquire().await.expect("the gate stays open");
            Ok(())
        }
    })
    .with_config(config(2))
    .with_metrics(metrics.clone());
    let running = Running::start(worker);
    started_rx.recv().await.unwrap();

    // Three heartbeats span three visibility timeouts (each extends by 2 s every 1 s).
    let mut extended = 0;
    while extended < 3 {
        assert_eq!(
            next(&mut rx).await,
            Event::Extended(sent.message_id.clone())
        );
        extended += 1;
    }
    // Another consumer polling meanwhile gets nothing: the message stays invisible.
    for _ in 0..3 {
        let stolen = client.receive_messages(&queue, &poll(1)).await.unwrap();
        assert!(
            stolen.is_empty(),
            "redelivered while the handler ran: {stolen:?}"
        );
    }

    finish.add_permits(1);
    assert_eq!(
        next_settlement(&mut rx).await,
        Event::Processed(sent.message_id.clone())
    );
    running.stop().await;
    let counts = metrics.counters.snapshot();
    assert_eq!(counts.processed, 1);
    assert!(counts.extended >= 3);
    assert_eq!(counts.handler_runs, 1);
    let stats = client.queue_stats(&queue).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_workers_messages_come_back_after_the_timeout() {
    let node = TestNode::start().await;
    let client = node.client();
    let queue = queue_name("crash");
    create_queue(&client, &queue).await;
    let mut sent = BTreeSet::new();
    for i in 0..3 {
        sent.insert(
            client
                .send_message(&queue, &SendMessage::new(format!("job {i}")))
                .await
                .unwrap()
                .message_id,
        );
    }

    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<MessageId>();
    let worker = Worker::new(client.clone(), queue.clone(), move |job| {
        let started = started_tx.clone();
        async move {
            let _ = started.send(job.message.message_id.clone());
            // Never finishes: the worker will crash first.
            std::future::pending::<Result<(), HandlerError>>().await
        }
    })
    .with_config(config(4));
    let running = tokio::spawn(worker.run(std::future::pending()));
    let mut started = BTreeSet::new();
    while started.len() < 3 {
        started.insert(started_rx.recv().await.unwrap());
    }
    assert_eq!(started, sent);

    // The crash: the worker stops at once, with no release and no more heartbeats.
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    // A crash releases nothing: the last heartbeat keeps the messages hidden for a while yet.
    let early = client.receive_messages(&queue, &poll(0)).await.unwrap();
    assert!(early.is_empty(), "released by a crash: {early:?}");

    let back = receive_until(&client, &queue, 3, 10).await;
    let ids: BTreeSet<MessageId> = back.iter().map(|m| m.message_id.clone()).collect();
    assert_eq!(ids, sent);
    assert!(back.iter().all(|m| m.receive_count == 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_reach_the_dead_letter_queue_after_max_receive_count() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("poison-dlq");
    let queue = queue_name("poison");
    create_with_dead_letter_queue(&client, &queue, &dlq, 3).await;
    let poison = send(&client, &queue, "poison").await;
    let good = send(&client, &queue, "good").await;

    let (metrics, mut rx) = events();
    let worker = Worker::new(client.clone(), queue.clone(), |job| async move {
        if job.message.body == "poison" {
            Err(HandlerError::retryable("downstream keeps failing"))
        } else {
            Ok(())
        }
    })
    .with_config(config(30))
    .with_metrics(metrics.clone());
    let running = Running::start(worker);

    // Each of the three receives allowed ends in a retry; the fourth receive moves the message.
    let mut retries = 0;
    let mut processed = false;
    while retries < 3 || !processed {
        match next_settlement(&mut rx).await {
            Event::Retried(id) => {
                assert_eq!(id, poison.message_id);
                retries += 1;
            }
            Event::Processed(id) => {
                assert_eq!(id, good.message_id);
                processed = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let dead = receive_until(&client, &dlq, 1, 10).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id, poison.message_id);
    // Three deliveries from the source queue, and this one: the count spans queues.
    assert_eq!(dead[0].receive_count, 4);
    assert_eq!(dead[0].dead_letter_source.as_ref(), Some(&queue));

    running.stop().await;
    let counts = metrics.counters.snapshot();
    assert_eq!(
        (counts.retried, counts.processed, counts.dead_lettered),
        (3, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_failure_moves_the_message_to_the_dead_letter_queue_at_once() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("terminal-dlq");
    let queue = queue_name("terminal");
    create_with_dead_letter_queue(&client, &queue, &dlq, 5).await;
    let message = SendMessage::new("not a number")
        .attribute("origin", trireme_client::MessageAttribute::string("test"));
    let sent = client.send_message(&queue, &message).await.unwrap();

    let (metrics, mut rx) = events();
    let worker = Worker::new(client.clone(), queue.clone(), |job| async move {
        job.message
            .body
            .parse::<u64>()
            .map(drop)
            .map_err(HandlerError::terminal)
    })
    .with_config(config(30))
    .with_metrics(metrics.clone());
    let running = Running::start(worker);
    assert_eq!(
        next_settlement(&mut rx).await,
        Event::DeadLettered(sent.message_id.clone())
    );
    running.stop().await;

    let stats = client.queue_stats(&queue).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight, stats.delayed), (0, 0, 0));
    // The node moved the message itself: the same id, its receive count (one delivery in the
    // source, this one in the dead-letter queue), its send time, and the source recorded.
    let moved = receive_until(&client, &dlq, 1, 2).await.remove(0);
    assert_eq!(moved.message_id, sent.message_id);
    assert_eq!(moved.receive_count, 2);
    assert_eq!(moved.dead_letter_source.as_ref(), Some(&queue));
    assert_eq!(moved.body, "not a number");
    assert_eq!(moved.attributes, message.attributes);
    assert!(!moved.attributes.contains_key(IDEMPOTENCY_KEY_ATTRIBUTE));
    assert_eq!(metrics.counters.snapshot().dead_lettered, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_loses_nothing() {
    let node = TestNode::start().await;
    let client = node.client();
    let queue = queue_name("shutdown");
    create_queue(&client, &queue).await;
    let total = 30;
    let mut sent = BTreeSet::new();
    for i in 0..total {
        // The oldest message is received first and its handler never ends.
        let body = if i % 10 == 0 { "stuck" } else { "quick" };
        sent.insert(
            client
                .send_message(&queue, &SendMessage::new(body))
                .await
                .unwrap()
                .message_id,
        );
    }

    let (metrics, mut rx) = events();
    let worker = Worker::new(client.clone(), queue.clone(), |job| async move {
        if job.message.body == "stuck" {
            // Outlives the grace period: must be released, not lost.
            std::future::pending::<()>().await;
        }
        Ok(())
    })
    .with_config(WorkerConfig {
        concurrency: 4,
        // Long enough that a message seen again soon was released, not expired.
        visibility_timeout_seconds: 120,
        shutdown_grace: Duration::from_millis(300),
        ..config(120)
    })
    .with_metrics(metrics.clone());
    let running = Running::start(worker);

    let mut processed = BTreeSet::new();
    while processed.len() < 5 {
        if let Event::Processed(id) = next_settlement(&mut rx).await {
            processed.insert(id);
        }
    }
    running.stop().await;
    let mut released = BTreeSet::new();
    while let Ok(event) = rx.try_recv() {
        match event {
            Event::Processed(id) => assert!(processed.insert(id)),
            Event::Released(id) => assert!(released.insert(id)),
            Event::Extended(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    // Everything not processed is still in the queue, released messages visible at once.
    let left = sent.len() - processed.len();
    let remaining = receive_until(&client, &queue, left, 10).await;
    let remaining: BTreeSet<MessageId> = remaining.into_iter().map(|m| m.message_id).collect();
    assert_eq!(
        remaining.len(),
        left,
        "a message came back twice or a processed one is back"
    );
    assert!(remaining.is_disjoint(&processed));
    assert!(
        !released.is_empty(),
        "the stuck handler's message was not released"
    );
    assert!(released.is_subset(&remaining));
    let all: BTreeSet<MessageId> = remaining.union(&processed).cloned().collect();
    assert_eq!(all, sent);
    let counts = metrics.counters.snapshot();
    assert_eq!(counts.processed as usize, processed.len());
    assert_eq!(counts.released as usize, released.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_not_lost() {
    let node = TestNode::start().await;
    let client = node.client();
    let queue = queue_name("panic");
    create_queue(&client, &queue).await;
    let sent = send(&client, &queue, "flaky").await;

    let (metrics, mut rx) = events();
    let worker = Worker::new(client.clone(), queue.clone(), |job| async move {
        assert!(job.message.receive_count > 1, "first delivery panics");
        Ok(())
    })
    .with_config(config(30))
    .with_metrics(metrics.clone());
    let running = Running::start(worker);
    assert_eq!(
        next_settlement(&mut rx).await,
        Event::Retried(sent.message_id.clone())
    );
    assert_eq!(
        next_settlement(&mut rx).await,
        Event::Processed(sent.message_id.clone())
    );
    running.stop().await;
    assert_eq!(metrics.counters.snapshot().handler_runs, 2);
}
