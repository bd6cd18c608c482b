//! A scripted stand-in for a node, for tests of what the client does when a node fails: every
//! call is counted, then answered per the node's `Behaviour`. Real nodes are used everywhere
//! the semantics matter; this exists because a real node cannot be made to fail on cue.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::net::{TcpListener, TcpSocket};
use tonic::{Code, Request, Response, Status};
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_server::{QueueService, QueueServiceServer};

/// How a fake node answers.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Every call fails with this code, sent by the node (so the client knows it arrived).
    Fails(Code),
    /// Every call hangs until the client gives up.
    Hangs,
    /// Calls the tests use succeed with fixed replies.
    Answers,
}

/// A running fake node.
pub struct FakeNode {
    pub address: String,
    calls: Arc<AtomicU32>,
}

impl FakeNode {
    /// Calls this node has seen.
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Starts a fake node on a loopback port. It lives until the test's runtime ends.
pub async fn start(behaviour: Behaviour) -> FakeNode {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve(listener, behaviour)
}

/// Starts a fake node on `listener`. It lives until the test's runtime ends.
pub fn serve(listener: TcpListener, behaviour: Behaviour) -> FakeNode {
    let address = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let service = Fake {
        behaviour,
        calls: calls.clone(),
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(QueueServiceServer::new(service))
            .serve_with_incoming(trireme_node::tcp_incoming(listener))
            .await
            .unwrap();
    });
    FakeNode { address, calls }
}

/// A loopback port where nothing listens, held for as long as this lives: its socket is bound
/// but not listening, so a connection is refused at once and no other test can take the port.
pub struct ClosedPort {
    pub address: String,
    socket: TcpSocket,
}

impl ClosedPort {
    /// Starts listening on the port: from now on it is open, and `serve` can answer on it.
    pub fn open(self) -> TcpListener {
        self.socket.listen(128).unwrap()
    }
}

/// A fresh closed port on 127.0.0.1.
pub fn closed_port() -> ClosedPort {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    ClosedPort {
        address: format!("http://{}", socket.local_addr().unwrap()),
        socket,
    }
}

/// Holds `address`'s port closed from now on, as [`closed_port`] does: for the port of a node
/// that was just killed, so probes of it keep being refused. `SO_REUSEADDR` lets it bind while
/// the dead node's connections linger in TIME_WAIT.
pub fn hold_closed(address: SocketAddr) -> ClosedPort {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(address).unwrap();
    ClosedPort {
        address: format!("http://{address}"),
        socket,
    }
}

struct Fake {
    behaviour: Behaviour,
    calls: Arc<AtomicU32>,
}

impl Fake {
    async fn enter(&self) -> Result<(), Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.behaviour {
            Behaviour::Fails(code) => Err(Status::new(code, "scripted failure")),
            Behaviour::Hangs => std::future::pending().await,
            Behaviour::Answers => Ok(()),
        }
    }
}

fn queue_info(name: String) -> pb::QueueInfo {
    pb::QueueInfo {
        name,
        attributes: Some(pb::QueueAttributes {
            visibility_timeout_seconds: Some(30),
            delay_seconds: Some(0),
            retention_seconds: Some(345_600),
            max_message_bytes: Some(1_048_576),
            receive_wait_seconds: Some(0),
            ..Default::default()
        }),
        created_at_ms: 1,
        modified_at_ms: 1,
        tags: HashMap::new(),
        stats: Some(pb::QueueStats::default()),
    }
}

fn unused<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not scripted"))
}

#[tonic::async_trait]
impl QueueService for Fake {
    async fn create_queue(
        &self,
        r: Request<pb::CreateQueueRequest>,
    ) -> Result<Response<pb::CreateQueueResponse>, Status> {
        self.enter().await?;
        Ok(Response::new(pb::CreateQueueResponse {
            queue: Some(queue_info(r.into_inner().name)),
            created: true,
        }))
    }
    async fn get_queue(
        &self,
        r: Request<pb::GetQueueRequest>,
    ) -> Result<Response<pb::GetQueueResponse>, Status> {
        self.enter().await?;
        Ok(Response::new(pb::GetQueueResponse {
            queue: Some(queue_info(r.into_inner().name)),
        }))
    }
    async fn list_queues(
        &self,
        _: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn set_queue_attributes(
        &self,
        _: Request<pb::SetQueueAttributesRequest>,
    ) -> Result<Response<pb::SetQueueAttributesResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn delete_queue(
        &self,
        _: Request<pb::DeleteQueueRequest>,
    ) -> Result<Response<pb::DeleteQueueResponse>, Status> {
        self.enter().await?;
        Ok(Response::new(pb::DeleteQueueResponse {}))
    }
    async fn purge_queue(
        &self,
        _: Request<pb::PurgeQueueRequest>,
    ) -> Result<Response<pb::PurgeQueueResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn list_dead_letter_source_queues(
        &self,
        _: Request<pb::ListDeadLetterSourceQueuesRequest>,
    ) -> Result<Response<pb::ListDeadLetterSourceQueuesResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn tag_queue(
        &self,
        _: Request<pb::TagQueueRequest>,
    ) -> Result<Response<pb::TagQueueResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn untag_queue(
        &self,
        _: Request<pb::UntagQueueRequest>,
    ) -> Result<Response<pb::UntagQueueResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn send_message(
        &self,
        _: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        self.enter().await?;
        Ok(Response::new(pb::SendMessageResponse {
            message_id: "m1".to_owned(),
            duplicate: false,
            md5_of_body: String::new(),
        }))
    }
    async fn send_message_batch(
        &self,
        _: Request<pb::SendMessageBatchRequest>,
    ) -> Result<Response<pb::SendMessageBatchResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn receive_messages(
        &self,
        _: Request<pb::ReceiveMessagesRequest>,
    ) -> Result<Response<pb::ReceiveMessagesResponse>, Status> {
        self.enter().await?;
        Ok(Response::new(pb::ReceiveMessagesResponse {
            messages: Vec::new(),
        }))
    }
    async fn delete_message(
        &self,
        _: Request<pb::DeleteMessageRequest>,
    ) -> Result<Response<pb::DeleteMessageResponse>, Status> {
        self.enter().await?;
        Ok(Response::new(pb::DeleteMessageResponse {}))
    }
    async fn delete_message_batch(
        &self,
        _: Request<pb::DeleteMessageBatchRequest>,
    ) -> Result<Response<pb::DeleteMessageBatchResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn change_visibility(
        &self,
        _: Request<pb::ChangeVisibilityRequest>,
    ) -> Result<Response<pb::ChangeVisibilityResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn change_visibility_batch(
        &self,
        _: Request<pb::ChangeVisibilityBatchRequest>,
    ) -> Result<Response<pb::ChangeVisibilityBatchResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn dead_letter_message(
        &self,
        _: Request<pb::DeadLetterMessageRequest>,
    ) -> Result<Response<pb::DeadLetterMessageResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn start_redrive(
        &self,
        _: Request<pb::StartRedriveRequest>,
    ) -> Result<Response<pb::StartRedriveResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn list_redrives(
        &self,
        _: Request<pb::ListRedrivesRequest>,
    ) -> Result<Response<pb::ListRedrivesResponse>, Status> {
        self.enter().await?;
        unused()
    }
    async fn cancel_redrive(
        &self,
        _: Request<pb::CancelRedriveRequest>,
    ) -> Result<Response<pb::CancelRedriveResponse>, Status> {
        self.enter().await?;
        unused()
    }
}
