//! Caps on the connections a node serves at once (`Config::grpc_connections_max`,
//! `Config::sqs_connections_max`, `limits::peer_connections_max`). Every served connection
//! holds a permit of its listener's semaphore for as long as it is open; with none left the
//! node accepts no more connections until one closes, and the kernel's backlog holds the
//! callers (a connection that is not accepted cannot be answered with an error; its client sees
//! a slow connect and its own timeout). Requests beyond the engine's capacity on the
//! connections served are shed with the throttling refusal instead
//! (`engine::EngineError::Overloaded`).
//!
//! This module must never read or write a connection's bytes; it only counts connections.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// A connection that holds one permit of its listener's cap until it is dropped.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(context, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(context, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(context)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(context)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(context, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Counted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The connections of `incoming`, at most `max` open at once: the stream takes the next
/// connection only once a permit is free (one accepted connection may wait for it).
pub fn capped_incoming<I, IO, IE>(
    incoming: I,
    max: usize,
) -> impl Stream<Item = Result<Counted<IO>, IE>> + Send + 'static
where
    I: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: Send + 'static,
    IE: Send + 'static,
{
    assert!(max >= 1, "a listener serves at least one connection");
    let permits = Arc::new(Semaphore::new(max));
    incoming.then(move |accepted| {
        let permits = permits.clone();
        async move {
            let io = accepted?;
            let permit = permits
                .acquire_owned()
                .await
                .expect("the cap's semaphore is never closed");
            Ok(Counted {
                io,
                _permit: permit,
            })
        }
    })
}

/// An axum listener that accepts at most `max` connections open at once: it waits for a free
/// permit before it accepts the next.
#[derive(Debug)]
pub struct CappedListener<L> {
    inner: L,
    permits: Arc<Semaphore>,
}

impl<L> CappedListener<L> {
    /// `inner`, serving at most `max` connections at once.
    #[must_use]
    pub fn new(inner: L, max: usize) -> Self {
        assert!(max >= 1, "a listener serves at least one connection");
        CappedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
        }
    }
}

impl<L: axum::serve::Listener> axum::serve::Listener for CappedListener<L> {
    type Io = Counted<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the cap's semaphore is never closed");
        let (io, address) = self.inner.accept().await;
        (
            Counted {
                io,
                _permit: permit,
            },
            address,
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use std::future::Future;

    /// Whether `future` is ready at its first poll.
    fn ready_now<F: Future>(future: Pin<&mut F>) -> bool {
        let mut context = Context::from_waker(std::task::Waker::noop());
        future.poll(&mut context).is_ready()
    }

    #[tokio::test]
    async fn a_capped_listener_accepts_no_more_than_its_cap_until_one_closes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut capped = CappedListener::new(listener, 2);
        let _clients: Vec<_> = [
            tokio::net::TcpStream::connect(address).await.unwrap(),
            tokio::net::TcpStream::connect(address).await.unwrap(),
            tokio::net::TcpStream::connect(address).await.unwrap(),
        ]
        .into();
        let (first, _) = capped.accept().await;
        let (_second, _) = capped.accept().await;
        {
            let third = capped.accept();
            tokio::pin!(third);
            assert!(!ready_now(third.as_mut()), "a third connection waits");
        }
        drop(first);
        let (_third, _) = capped.accept().await;
    }
}
