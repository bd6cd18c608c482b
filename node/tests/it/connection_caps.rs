//! Connection caps (issue 16): a node started with small caps (`--grpc-connections-max`,
//! `--sqs-connections-max`) serves that many client connections on each port and holds the
//! next one, unanswered, until one of them closes; then it serves it.
//!
//! "Holds" is seen as no answer within `HELD_FOR`: a connection the node does not accept gets
//! no error to read (the kernel's backlog keeps it), so only its silence can be checked. The
//! answer after the close is awaited, not slept for.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;
use trireme_node::clock::SystemClock;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;

use crate::harness::{TestNode, connect};

/// The caps in this test.
const CAP: usize = 2;
/// How long a held connection must stay unanswered.
const HELD_FOR: Duration = Duration::from_millis(700);
/// How long a connection let in may take to be answered.
const ANSWER_MAX: Duration = Duration::from_secs(15);

async fn small_caps() -> TestNode {
    TestNode::start_configured(
        Arc::new(TempDir::new().unwrap()),
        Arc::new(SystemClock),
        |config| {
            config.grpc_connections_max = CAP;
            config.sqs_connections_max = CAP;
        },
    )
    .await
}

async fn list_queues(
    client: &mut QueueServiceClient<Channel>,
) -> Result<pb::ListQueuesResponse, tonic::Status> {
    client
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_its_grpc_connection_cap_and_holds_the_next_until_one_closes() {
    let mut node = small_caps().await;
    // The harness's client is the first connection, this one the second: both served.
    let mut second = connect(node.address).await;
    list_queues(&mut node.client).await.unwrap();
    list_queues(&mut second).await.unwrap();
    let mut third = QueueServiceClient::new(
        Channel::from_shared(format!("http://{}", node.address))
            .unwrap()
            .connect_lazy(),
    );
    let held = tokio::time::timeout(HELD_FOR, list_queues(&mut third)).await;
    assert!(held.is_err(), "a third connection was served: {held:?}");
    // The first two are still served meanwhile.
    list_queues(&mut node.client).await.unwrap();
    drop(second);
    let served = tokio::time::timeout(ANSWER_MAX, list_queues(&mut third))
        .await
        .expect("the held connection is served once another closed");
    served.unwrap();
}

/// An SQS `ListQueues` over HTTP/1.1 on `stream` (kept alive); the status line of the answer.
async fn sqs_list_queues(stream: &mut TcpStream) -> String {
    let request = "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: AmazonSQS.ListQueues\r\nContent-Length: 2\r\n\r\n{}";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    // The whole answer: headers, then as many bytes as Content-Length says.
    loop {
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(read > 0, "the node closed the connection");
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer);
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if answer.len() >= end + 4 + length {
                return text.lines().next().unwrap().to_owned();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_its_sqs_connection_cap_and_holds_the_next_until_one_closes() {
    let mut node = small_caps().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    node.serve_sqs(listener);
    let mut first = TcpStream::connect(address).await.unwrap();
    let mut second = TcpStream::connect(address).await.unwrap();
    assert_eq!(sqs_list_queues(&mut first).await, "HTTP/1.1 200 OK");
    assert_eq!(sqs_list_queues(&mut second).await, "HTTP/1.1 200 OK");
    // The kernel completes the connect; the node does not accept it while two are open.
    let mut third = TcpStream::connect(address).await.unwrap();
    let held = tokio::time::timeout(HELD_FOR, sqs_list_queues(&mut third)).await;
    assert!(held.is_err(), "a third connection was served: {held:?}");
    // A kept-alive connection is still served meanwhile.
    assert_eq!(sqs_list_queues(&mut second).await, "HTTP/1.1 200 OK");
    drop(first);
    // The held request was written already; its answer comes once the node accepts.
    let mut answer = [0u8; 12];
    tokio::time::timeout(ANSWER_MAX, third.read_exact(&mut answer))
        .await
        .expect("the held connection is served once another closed")
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
}
