//! Starting real nodes in-process on loopback with a temporary data directory, and small
//! helpers every area uses. Waiting is always bounded: `eventually` polls a condition with a
//! deadline and an attempt cap, never a bare sleep.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use trireme_core::QueueName;
use trireme_node::Node;
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::config::Config;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;

pub type Client = QueueServiceClient<Channel>;

/// A node serving gRPC on 127.0.0.1, with a client connected to it.
pub struct TestNode {
    pub client: Client,
    pub address: SocketAddr,
    /// Where the node serves `/metrics`, `/health` and `/ready`.
    pub metrics: SocketAddr,
    node: Option<Node>,
    /// Kept so the data directory outlives restarts and is removed at the end.
    pub dir: Arc<TempDir>,
}

impl TestNode {
    /// A node on a new, empty data directory.
    pub async fn start() -> TestNode {
        TestNode::start_in(Arc::new(TempDir::new().unwrap())).await
    }

    /// A node on the data directory `dir` (which may hold an earlier node's database).
    pub async fn start_in(dir: Arc<TempDir>) -> TestNode {
        TestNode::start_with(dir, Arc::new(SystemClock)).await
    }

    /// A node on the data directory `dir`, reading time from `clock`.
    pub async fn start_with(dir: Arc<TempDir>, clock: Arc<dyn Clock>) -> TestNode {
        TestNode::start_configured(dir, clock, |_| {}).await
    }

    /// A node on the data directory `dir`, reading time from `clock`, with the settings
    /// `configure` changes from the defaults.
    pub async fn start_configured(
        dir: Arc<TempDir>,
        clock: Arc<dyn Clock>,
        configure: impl FnOnce(&mut Config),
    ) -> TestNode {
        let mut config = Config::with_data_dir(dir.path());
        configure(&mut config);
        let storage = trireme_node::open_storage(&config).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let incoming = trireme_node::tcp_incoming(listener);
        let mut node = Node::start(&config, storage, incoming, clock).unwrap();
        let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics = metrics_listener.local_addr().unwrap();
        node.serve_metrics(metrics_listener);
        TestNode {
            client: connect(address).await,
            address,
            metrics,
            node: Some(node),
            dir,
        }
    }

    /// Serves the SQS endpoint (default settings) on `listener`.
    pub fn serve_sqs(&mut self, listener: TcpListener) {
        self.node
            .as_mut()
            .unwrap()
            .serve_sqs(listener, trireme_node::sqs::SqsSettings::default());
    }

    /// The running node's engine.
    pub fn engine(&self) -> &trireme_node::engine::Engine {
        self.node.as_ref().unwrap().engine()
    }

    /// Graceful shutdown, then a new node on the same data directory.
    pub async fn restart(mut self) -> TestNode {
        self.node.take().unwrap().shutdown().await;
        TestNode::start_in(self.dir.clone()).await
    }

    /// Graceful shutdown; the data directory stays until `dir` is dropped.
    pub async fn shutdown(mut self) -> Arc<TempDir> {
        self.node.take().unwrap().shutdown().await;
        self.dir.clone()
    }

    /// Creates a queue with default attributes.
    pub async fn create(&mut self, name: &str) {
        self.create_with(name, pb::QueueAttributes::default()).await;
    }

    /// Creates a queue with `attributes`.
    pub async fn create_with(&mut self, name: &str, attributes: pb::QueueAttributes) {
        self.try_create(name, attributes).await.unwrap();
    }

    /// Asks to create a queue with `attributes` and no tags; the node may refuse.
    pub async fn try_create(
        &mut self,
        name: &str,
        attributes: pb::QueueAttributes,
    ) -> Result<pb::CreateQueueResponse, tonic::Status> {
        let request = pb::CreateQueueRequest {
            name: name.to_owned(),
            attributes: Some(attributes),
            tags: Default::default(),
        };
        Ok(self.client.create_queue(request).await?.into_inner())
    }

    /// Sends `body` and returns the message id.
    pub async fn send(&mut self, queue: &str, body: &str) -> String {
        self.try_send(send_request(queue, body))
            .await
            .unwrap()
            .message_id
    }

    /// Sends `request`; the node may refuse.
    pub async fn try_send(
        &mut self,
        request: pb::SendMessageRequest,
    ) -> Result<pb::SendMessageResponse, tonic::Status> {
        Ok(self.client.send_message(request).await?.into_inner())
    }

    /// One receive of up to `max` messages, no wait, with `visibility_s`.
    pub async fn receive(
        &mut self,
        queue: &str,
        max: u32,
        visibility_s: u32,
    ) -> Vec<pb::ReceivedMessage> {
        self.client
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: queue.to_owned(),
                max_messages: max,
                visibility_timeout_seconds: Some(visibility_s),
                wait_seconds: Some(0),
            })
            .await
            .unwrap()
            .into_inner()
            .messages
    }

    /// Deletes the message received with `receipt_handle`.
    pub async fn delete(&mut self, queue: &str, receipt_handle: &str) -> Result<(), tonic::Status> {
        self.client
            .delete_message(pb::DeleteMessageRequest {
                queue: queue.to_owned(),
                receipt_handle: receipt_handle.to_owned(),
            })
            .await?;
        Ok(())
    }

    /// Hides the message received with `receipt_handle` for `timeout_s` from now.
    pub async fn change_visibility(
        &mut self,
        queue: &str,
        receipt_handle: &str,
        timeout_s: u32,
    ) -> Result<(), tonic::Status> {
        self.client
            .change_visibility(pb::ChangeVisibilityRequest {
                queue: queue.to_owned(),
                receipt_handle: receipt_handle.to_owned(),
                visibility_timeout_seconds: timeout_s,
            })
            .await?;
        Ok(())
    }

    /// The queue's settings, tags and counts; the node may refuse.
    pub async fn get_queue(&mut self, queue: &str) -> Result<pb::QueueInfo, tonic::Status> {
        let request = pb::GetQueueRequest {
            name: queue.to_owned(),
        };
        let reply = self.client.get_queue(request).await?.into_inner();
        Ok(reply.queue.expect("a found queue comes with its info"))
    }

    /// The queue's counts.
    pub async fn stats(&mut self, queue: &str) -> pb::QueueStats {
        self.get_queue(queue).await.unwrap().stats.unwrap()
    }

    /// Waits (bounded) until `queue` has `count` open long polls.
    pub async fn await_waiters(&self, queue: &str, count: usize) {
        let name = QueueName::try_from(queue).unwrap();
        let engine = self.engine().clone();
        eventually(&format!("{count} waiters on {queue}"), || {
            let engine = engine.clone();
            let name = name.clone();
            async move { engine.waiters(&name).await.unwrap().len() == count }
        })
        .await;
    }
}

/// A gRPC client for `address`.
pub async fn connect(address: SocketAddr) -> Client {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    QueueServiceClient::new(channel)
        .max_decoding_message_size(16 * 1024 * 1024)
        .max_encoding_message_size(16 * 1024 * 1024)
}

/// A send of `body` to `queue` with nothing else set.
pub fn send_request(queue: &str, body: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        queue: queue.to_owned(),
        body: body.to_owned(),
        ..Default::default()
    }
}

/// Queue attributes that move a message to `dead_letter_queue` once it has been received
/// `max_receive_count` times.
pub fn redrive_to(dead_letter_queue: &str, max_receive_count: u32) -> pb::QueueAttributes {
    pb::QueueAttributes {
        redrive_policy: Some(pb::RedrivePolicy {
            dead_letter_queue: dead_letter_queue.to_owned(),
            max_receive_count,
        }),
        ..Default::default()
    }
}

/// Polls `condition` every 20 ms until it holds; panics after 15 s or 750 attempts.
pub async fn eventually<F, Fut>(what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, Duration::from_secs(15), condition).await;
}

/// Polls `condition` every 20 ms until it holds; panics after `limit` (at most 3,000 attempts).
pub async fn eventually_within<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    for _ in 0..3_000 {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The data directory's database file exists (a node ran there).
pub fn has_database(dir: &Path) -> bool {
    dir.join(trireme_node::storage::DATABASE_FILE_NAME).exists()
}
