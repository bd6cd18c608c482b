//! Real nodes on loopback for the tests: each with its own data directory, on the test's runtime
//! (the runtime's end stops them).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use trireme_client::{Client, ClientConfig, QueueName};
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
        let dir = tempfile::tempdir().unwrap();
        let config = Config::with_data_dir(dir.path());
        let storage = trireme_node::open_storage(&config).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let incoming = TcpListenerStream::new(listener);
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

/// A queue name unique within the test binary.
pub fn queue_name(prefix: &str) -> QueueName {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    QueueName::new(format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))).unwrap()
}
