//! Real nodes on loopback for the tests: each with its own data directory, on the test's runtime
//! (the runtime's end stops them).

use std::sync::Arc;

use tokio::net::TcpListener;
use trireme_client::{
    Client, ClientConfig, QueueAttributes, QueueName, RedrivePolicy, SendMessage, SentMessage,
};
use trireme_node::Node;
use trireme_node::clock::SystemClock;
use trireme_node::config::Config;

/// A running node.
pub struct TestNode {
    pub address: String,
    // Kept for the node's lifetime: the engine and the server.
    _node: Node,
    // Kept for the node's lifetime: the database lives here.
    _dir: tempfile::TempDir,
}

impl TestNode {
    /// Starts a node with the default configuration on a free loopback port.
    pub async fn start() -> TestNode {
        TestNode::start_with_tokens(None).await
    }

    /// Starts a node as [`TestNode::start`] does whose gRPC API requires a bearer token, one of
    /// the lines of `tokens` (written to its token file) when given.
    pub async fn start_with_tokens(tokens: Option<&str>) -> TestNode {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::with_data_dir(dir.path());
        if let Some(tokens) = tokens {
            let file = dir.path().join("api-tokens");
            std::fs::write(&file, tokens).unwrap();
            config.api_token_file = Some(file);
        }
        let storage = trireme_node::open_storage(&config).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let incoming = trireme_node::tcp_incoming(listener);
        let node = Node::start(&config, storage, incoming, Arc::new(SystemClock)).unwrap();
        TestNode {
            address,
            _node: node,
            _dir: dir,
        }
    }

    /// A client of this node alone.
    pub fn client(&self) -> Client {
        Client::new(ClientConfig::new([self.address.clone()])).unwrap()
    }
}

/// A node on a runtime of its own, so that a test can kill it: [`KillableNode::kill`] ends the
/// runtime and with it every task of the node (its server, its open connections, its engine)
/// at once, with no graceful shutdown, as a crashed process would end.
pub struct KillableNode {
    pub address: String,
    runtime: Option<tokio::runtime::Runtime>,
    // Kept until the node is gone: the database lives here.
    _dir: tempfile::TempDir,
}

impl KillableNode {
    /// Starts a node with the default configuration on a free loopback port.
    pub async fn start() -> KillableNode {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::with_data_dir(dir.path());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (started, address) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let storage = trireme_node::open_storage(&config).unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = format!("http://{}", listener.local_addr().unwrap());
            let incoming = trireme_node::tcp_incoming(listener);
            let node = Node::start(&config, storage, incoming, Arc::new(SystemClock)).unwrap();
            started.send(address).unwrap();
            // The node runs until its runtime ends.
            std::future::pending::<()>().await;
            drop(node);
        });
        KillableNode {
            address: address.await.unwrap(),
            runtime: Some(runtime),
            _dir: dir,
        }
    }

    /// A client of this node alone.
    pub fn client(&self) -> Client {
        Client::new(ClientConfig::new([self.address.clone()])).unwrap()
    }

    /// Kills the node: returns once its runtime's threads have ended (within a generous
    /// bound), so its listener and connections are closed.
    pub async fn kill(&mut self) {
        let runtime = self.runtime.take().expect("a node is killed once");
        tokio::task::spawn_blocking(move || {
            runtime.shutdown_timeout(std::time::Duration::from_secs(30))
        })
        .await
        .unwrap();
    }
}

impl Drop for KillableNode {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which a test's async context does not allow.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A queue name unique within the test binary.
pub fn queue_name(prefix: &str) -> QueueName {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    QueueName::new(format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))).unwrap()
}

/// Creates `dlq`, then `queue` with a redrive policy that moves a message to `dlq` once it has
/// been received `max_receive_count` times; returns that policy.
pub async fn create_with_dead_letter_queue(
    client: &Client,
    queue: &QueueName,
    dlq: &QueueName,
    max_receive_count: u32,
) -> RedrivePolicy {
    client
        .create_queue(dlq, &QueueAttributes::default())
        .await
        .unwrap();
    let policy = RedrivePolicy {
        dead_letter_queue: dlq.clone(),
        max_receive_count,
    };
    let attributes = QueueAttributes {
        redrive_policy: Some(policy.clone()),
        ..Default::default()
    };
    client.create_queue(queue, &attributes).await.unwrap();
    policy
}

/// Creates `name` with default attributes.
pub async fn create_queue(client: &Client, name: &QueueName) {
    client
        .create_queue(name, &QueueAttributes::default())
        .await
        .unwrap();
}

/// Sends one message with this body.
pub async fn send(client: &Client, queue: &QueueName, body: &str) -> SentMessage {
    client
        .send_message(queue, &SendMessage::new(body))
        .await
        .unwrap()
}

/// Sends `count` messages to `queue`, with bodies `m0`, `m1`, ….
pub async fn send_numbered(client: &Client, queue: &QueueName, count: u32) {
    for i in 0..count {
        client
            .send_message(queue, &SendMessage::new(format!("m{i}")))
            .await
            .unwrap();
    }
}
