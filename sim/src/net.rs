//! gRPC over turmoil's simulated TCP: the node's incoming connections and the clients' channels.
//!
//! turmoil's TCP drops segments during a partition and never retransmits them, so a connection
//! that lived through a partition can be dead without either side noticing. Clients therefore
//! run HTTP/2 keepalive (a dead connection is closed and the lazy channel reconnects) and every
//! call has its own deadline (see `workload`).
//!
//! This module must never block on a connection at construction: hosts start together, and an
//! eager connect would race the node's bind.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};
use turmoil::net::{TcpListener, TcpStream};

/// The port the node serves gRPC on.
pub const GRPC_PORT: u16 = 7100;

/// Accepted connections queued before the accept loop waits for the server to take them.
const ACCEPT_QUEUE_MAX: usize = 64;

/// Client keepalive: how often an HTTP/2 ping goes out, and how long it may go unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_millis(1_000);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long a client waits for a TCP connection before the call fails.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1_000);

/// One accepted simulated connection, in the shape tonic's server takes.
#[derive(Debug)]
pub struct Accepted(TcpStream);

impl Connected for Accepted {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The connections `listener` accepts, as a stream for `Node::start`. The accept loop runs as
/// a task of the calling host and ends with it (a crash drops it).
#[must_use]
pub fn incoming(listener: TcpListener) -> ReceiverStream<std::io::Result<Accepted>> {
    let (connections, stream) = mpsc::channel(ACCEPT_QUEUE_MAX);
    tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await.map(|(tcp, _peer)| Accepted(tcp));
            // A closed receiver means the server stopped: nothing will accept any more.
            if connections.send(accepted).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(stream)
}

/// A lazy gRPC channel to `host:port` over simulated TCP, with keepalive; it connects on the
/// first call and reconnects after a connection dies.
#[must_use]
pub fn channel(host: &str, port: u16) -> Channel {
    let address = format!("http://{host}:{port}");
    let endpoint = Endpoint::from_shared(address)
        .expect("a host name and a port make a valid URI")
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    lazy_channel(&endpoint)
}

/// A lazy channel to `endpoint` (its own timeouts and keepalive kept) over simulated TCP: the
/// clients' channels and the cluster members' peer links (`Cluster::start_with`).
#[must_use]
pub fn lazy_channel(endpoint: &Endpoint) -> Channel {
    endpoint
        .clone()
        // h2 remembers locally reset streams (a call whose deadline passed is reset) for a while
        // measured on the real clock (`std::time::Instant`), and whether a late frame for such a
        // stream is ignored depends on it. Remembering none keeps the real clock out of a run.
        .http2_max_concurrent_reset_streams(0)
        .connect_with_connector_lazy(tower::service_fn(|uri: Uri| async move {
            let host = uri
                .host()
                .expect("the endpoint URI names a host")
                .to_owned();
            let port = uri.port_u16().expect("the endpoint URI names a port");
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tcp))
        }))
}

/// The `date` every simulated gRPC response carries.
const FIXED_DATE: &str = "Thu, 01 Jan 2026 00:00:00 GMT";

/// A response of the simulated server with its `date` header set to [`FIXED_DATE`].
fn with_fixed_date(
    mut response: tonic::codegen::http::Response<tonic::body::Body>,
) -> tonic::codegen::http::Response<tonic::body::Body> {
    response.headers_mut().insert(
        tonic::codegen::http::header::DATE,
        tonic::codegen::http::HeaderValue::from_static(FIXED_DATE),
    );
    response
}

/// The layer a simulated gRPC server needs for its responses not to depend on real time.
/// hyper's HTTP/2 server gives every response that has no `date` header one read from the real
/// clock (`SystemTime`, refreshed each real second). Its HPACK encoding's length varies with the
/// digits, so frame sizes, the compression table and with them the simulated network's
/// schedule followed real time: five-member seeds replayed differently after other seeds in the
/// same process, or with logging on (seed 117 gave three histories). hyper keeps a `date` the
/// service set, so every response carries this fixed one instead.
#[must_use]
pub fn fixed_date() -> tower::util::MapResponseLayer<
    fn(
        tonic::codegen::http::Response<tonic::body::Body>,
    ) -> tonic::codegen::http::Response<tonic::body::Body>,
> {
    tower::util::MapResponseLayer::new(with_fixed_date)
}
