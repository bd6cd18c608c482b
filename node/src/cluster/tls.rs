//! Mutual TLS on the peer port: the internal service's connections, both ways, authenticated
//! against the cluster CA (rustls with ring, TLS 1.3 only).
//!
//! - A member serves its peers only over TLS and only to a client whose certificate the CA
//!   signed; it connects to a peer only if the peer's certificate is the CA's and names
//!   `node-N.trireme` for the N it is listed as. The replica service then accepts a request
//!   only if its connection's certificate names the node the request claims to come from
//!   ([`certificate_names`]): a member's certificate cannot speak for another member.
//! - Every refusal is logged on both ends as a warning with the other end's address and the TLS
//!   reason (at most one warning per peer per `REFUSAL_LOG_PERIOD`, then one with the count of
//!   those left out): the server runs the handshakes itself ([`PeerTls::incoming`]) because
//!   tonic's own acceptor logs a failed one at debug, without the address; the client logs a
//!   failed handshake, and an alert that arrives after it (with TLS 1.3 the server judges the
//!   client's certificate after the client has finished its part).
//!
//! This module loads the files it is given and speaks TLS; it never decides membership.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::rustls::client::danger::ServerCertVerifier;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};
use tokio_stream::Stream;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::{debug, warn};
use trireme_replication::NodeId;

use crate::config::PeerTlsFiles;
use crate::limits;

/// The name member `node`'s certificate must carry (a DNS subject alternative name), which its
/// peers check against the node id it is listed as or claims: `node-N.trireme`.
#[must_use]
pub fn member_name(node: NodeId) -> String {
    format!("node-{}.trireme", node.0)
}

/// Whether `certs` (a connection's chain, its own certificate first, already verified against
/// the CA by the handshake) names member `node`.
#[must_use]
pub fn certificate_names(certs: &[CertificateDer<'_>], node: NodeId) -> bool {
    let Some(end_entity) = certs.first() else {
        return false;
    };
    let Ok(parsed) = ParsedCertificate::try_from(end_entity) else {
        return false;
    };
    let name = ServerName::try_from(member_name(node)).expect("a member name is a DNS name");
    rustls::client::verify_server_name(&parsed, &name).is_ok()
}

/// Why this member's TLS files are unusable. The node does not start.
#[derive(Debug, Error)]
pub enum PeerTlsError {
    /// A file could not be read or holds no PEM object of the kind expected.
    #[error("peer TLS: cannot read {what} from {path}: {reason}")]
    Unreadable {
        what: &'static str,
        path: String,
        reason: String,
    },
    /// The CA certificate cannot serve as a trust anchor.
    #[error("peer TLS: the cluster CA in {path} is unusable: {reason}")]
    Ca { path: String, reason: String },
    /// This member's own certificate would be refused by its peers.
    #[error(
        "peer TLS: {path} is not a certificate of node {node} from the cluster CA {ca}: \
         {reason} (it must be signed by the CA and name {name}; `trireme-node certs` makes one)"
    )]
    NotThisMember {
        path: String,
        ca: String,
        node: u16,
        name: String,
        reason: String,
    },
    /// The key does not go with the certificate, or rustls refused the configuration.
    #[error("peer TLS: the key {key} does not fit the certificate {cert}: {reason}")]
    Key {
        key: String,
        cert: String,
        reason: String,
    },
}

/// This member's TLS on the peer port: the configurations of both ends and the refusal log.
#[derive(Clone)]
pub struct PeerTls {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    log: Arc<RefusalLog>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").finish_non_exhaustive()
    }
}

impl PeerTls {
    /// Loads `files` for member `me` and checks that its own certificate is one its peers will
    /// accept: signed by the CA, for both ends of a connection, naming `me`, valid now.
    ///
    /// # Errors
    /// [`PeerTlsError`] naming the file and what is wrong with it.
    pub fn load(files: &PeerTlsFiles, me: NodeId) -> Result<PeerTls, PeerTlsError> {
        let ca = read_certificates(&files.ca, "the cluster CA's certificate")?;
        let chain = read_certificates(&files.cert, "this node's certificate")?;
        let key =
            PrivateKeyDer::from_pem_file(&files.key).map_err(|error| PeerTlsError::Unreadable {
                what: "this node's private key",
                path: files.key.display().to_string(),
                reason: error.to_string(),
            })?;
        let ca_error = |reason: String| PeerTlsError::Ca {
            path: files.ca.display().to_string(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        for certificate in ca {
            roots
                .add(certificate)
                .map_err(|error| ca_error(error.to_string()))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|error| ca_error(error.to_string()))?;
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::clone(&roots),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|error| ca_error(error.to_string()))?;

        // This member's certificate, judged as its peers will judge it, so that a wrong file
        // stops this node at start with the reason rather than every peer refusing it later.
        let not_this_member = |error: rustls::Error| PeerTlsError::NotThisMember {
            path: files.cert.display().to_string(),
            ca: files.ca.display().to_string(),
            node: me.0,
            name: member_name(me),
            reason: error.to_string(),
        };
        let now = UnixTime::now();
        let name = ServerName::try_from(member_name(me)).expect("a member name is a DNS name");
        server_verifier
            .verify_server_cert(&chain[0], &chain[1..], &name, &[], now)
            .map_err(not_this_member)?;
        client_verifier
            .verify_client_cert(&chain[0], &chain[1..], now)
            .map_err(not_this_member)?;

        let key_error = |error: rustls::Error| PeerTlsError::Key {
            key: files.key.display().to_string(),
            cert: files.cert.display().to_string(),
            reason: error.to_string(),
        };
        let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(key_error)?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(key_error)?;
        server.alpn_protocols = vec![b"h2".to_vec()];
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(key_error)?
            .with_webpki_verifier(server_verifier)
            .with_client_auth_cert(chain, key)
            .map_err(key_error)?;
        client.alpn_protocols = vec![b"h2".to_vec()];
        Ok(PeerTls {
            server: Arc::new(server),
            client: Arc::new(client),
            log: Arc::new(RefusalLog::default()),
        })
    }

    /// The connections `listener` accepts that complete a TLS handshake with a certificate of
    /// the cluster CA, each with `TCP_NODELAY` set, as the incoming stream of the peer service.
    /// Handshakes run concurrently (at most `peer_tls_handshakes_max`; beyond, accepting
    /// waits and the kernel's backlog holds the rest), each within
    /// `peer_tls_handshake_timeout_ms`; a failed one is logged with the peer's address and
    /// the reason and the connection closed. Accepting stops when the stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> impl Stream<Item = io::Result<server::TlsStream<TcpStream>>> + Send + 'static {
        let (ready, accepted) = mpsc::channel(limits::peer_tls_handshakes_max);
        tokio::spawn(accept(
            listener,
            TlsAcceptor::from(Arc::clone(&self.server)),
            ready,
            Arc::clone(&self.log),
        ));
        tokio_stream::wrappers::ReceiverStream::new(accepted)
    }

    /// A lazy channel to member `peer` at `endpoint` (its timeouts and keepalive kept) over
    /// TLS: the peer must show the CA's certificate for `node-N.trireme`, and this member
    /// shows its own. A refusal either way is logged with the peer and the reason.
    #[must_use]
    pub fn channel(&self, peer: NodeId, endpoint: &Endpoint) -> Channel {
        let connector = TlsConnector::from(Arc::clone(&self.client));
        let name = ServerName::try_from(member_name(peer)).expect("a member name is a DNS name");
        let log = Arc::clone(&self.log);
        endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
            let (connector, name, log) = (connector.clone(), name.clone(), Arc::clone(&log));
            async move {
                let host = uri.host().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "the peer URI names no host")
                })?;
                // An IPv6 literal comes bracketed in a URI, not in a socket address.
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let port = uri.port_u16().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "the peer URI names no port")
                })?;
                let tcp = TcpStream::connect((host, port)).await?;
                // Nagle would hold each small batch until the peer's delayed ack.
                tcp.set_nodelay(true)?;
                let address = tcp
                    .peer_addr()
                    .map_or_else(|_| format!("{host}:{port}"), |address| address.to_string());
                match connector.connect(name, tcp).await {
                    Ok(stream) => Ok(TokioIo::new(Watched {
                        stream,
                        peer,
                        address,
                        log,
                    })),
                    Err(error) => {
                        log.client_refused(peer, &address, &error);
                        Err(error)
                    }
                }
            }
        }))
    }
}

/// Reads every certificate in a PEM file; none is an error.
fn read_certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, PeerTlsError> {
    let unreadable = |reason: String| PeerTlsError::Unreadable {
        what,
        path: path.display().to_string(),
        reason,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| unreadable(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| unreadable(error.to_string()))?;
    if certificates.is_empty() {
        return Err(unreadable("the file holds no certificate".to_owned()));
    }
    Ok(certificates)
}

/// The peer port's accept loop under TLS (see [`PeerTls::incoming`]).
async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<io::Result<server::TlsStream<TcpStream>>>,
    log: Arc<RefusalLog>,
) {
    let handshakes = Arc::new(Semaphore::new(limits::peer_tls_handshakes_max));
    let timeout = Duration::from_millis(limits::peer_tls_handshake_timeout_ms);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&handshakes).acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
            () = ready.closed() => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = ready.closed() => return,
        };
        let (socket, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // The server decides, as for a plain listener: it goes on after a reset
                // connection and stops on anything else.
                if ready.send(Err(error)).await.is_err() {
                    return;
                }
                continue;
            }
        };
        crate::set_nodelay(&socket);
        let (acceptor, ready, log) = (acceptor.clone(), ready.clone(), Arc::clone(&log));
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(timeout, acceptor.accept(socket)).await;
            drop(permit);
            match handshake {
                // A server that stopped meanwhile drops the connection with the channel.
                Ok(Ok(stream)) => {
                    let _ = ready.send(Ok(stream)).await;
                }
                Ok(Err(error)) => log.server_refused(remote, &error),
                Err(_) => log.server_timed_out(remote, timeout),
            }
        });
    }
}

/// A client connection to a peer that logs the TLS error a read meets: with TLS 1.3 a peer
/// that refuses this member's certificate says so in an alert after the handshake.
struct Watched {
    stream: client::TlsStream<TcpStream>,
    peer: NodeId,
    address: String,
    log: Arc<RefusalLog>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if let Poll::Ready(Err(error)) = &polled
            && tls_error(error).is_some()
        {
            self.log.client_refused(self.peer, &self.address, error);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The rustls error inside an I/O error, if it is one.
fn tls_error(error: &io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether the other end refused this member (its alert), rather than this member the other.
fn refused_by_other_end(error: &io::Error) -> bool {
    matches!(tls_error(error), Some(rustls::Error::AlertReceived(_)))
}

/// Between two warnings about one peer's refusals; those in between are counted and logged at
/// debug. A peer with a bad certificate is refused on every reconnect, several times a second.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);
/// Peers whose last warning is remembered; beyond, the memory starts afresh (a few more
/// warnings, never an unbounded map).
const REFUSAL_LOG_PEERS_MAX: usize = 1_024;

/// When each peer was last warned about, and the refusals left out since.
#[derive(Default)]
struct RefusalLog {
    peers: Mutex<BTreeMap<String, (tokio::time::Instant, u64)>>,
}

impl RefusalLog {
    /// `Some(left out since the last warning)` if a refusal of `key` at `now` is warned about.
    fn admit(&self, key: String, now: tokio::time::Instant) -> Option<u64> {
        let mut peers = self.peers.lock().expect("the refusal log never panics");
        if peers.len() >= REFUSAL_LOG_PEERS_MAX && !peers.contains_key(&key) {
            peers.clear();
        }
        match peers.get_mut(&key) {
            Some((last, left_out)) if now.duration_since(*last) < REFUSAL_LOG_PERIOD => {
                *left_out += 1;
                None
            }
            Some((last, left_out)) => {
                *last = now;
                Some(std::mem::take(left_out))
            }
            None => {
                peers.insert(key, (now, 0));
                Some(0)
            }
        }
    }

    /// This member, connecting to `peer`, refused it or was refused by it.
    fn client_refused(&self, peer: NodeId, address: &str, error: &io::Error) {
        let Some(left_out) = self.admit(format!("client {}", peer.0), tokio::time::Instant::now())
        else {
            debug!(node = peer.0, peer = %address, reason = %error, "peer TLS refused again");
            return;
        };
        if refused_by_other_end(error) {
            warn!(
                node = peer.0,
                peer = %address,
                reason = %error,
                left_out,
                "a peer refused this node's TLS certificate (is it from the peer's cluster CA?)"
            );
        } else {
            warn!(
                node = peer.0,
                peer = %address,
                reason = %error,
                left_out,
                "refused a peer: its TLS certificate is not the cluster CA's for this node id, \
                 or it does not speak TLS"
            );
        }
    }

    /// A connection from `remote` to the peer port failed its handshake.
    fn server_refused(&self, remote: SocketAddr, error: &io::Error) {
        let Some(left_out) = self.admit(
            format!("server {}", remote.ip()),
            tokio::time::Instant::now(),
        ) else {
            debug!(peer = %remote, reason = %error, "peer TLS refused again");
            return;
        };
        if refused_by_other_end(error) {
            warn!(
                peer = %remote,
                reason = %error,
                left_out,
                "a connecting peer refused this node's TLS certificate (is it from the peer's \
                 cluster CA?)"
            );
        } else {
            warn!(
                peer = %remote,
                reason = %error,
                left_out,
                "refused a connection to the peer port: its TLS certificate is not the cluster \
                 CA's, or it does not speak TLS"
            );
        }
    }

    /// A connection from `remote` did not finish its handshake in time.
    fn server_timed_out(&self, remote: SocketAddr, timeout: Duration) {
        if let Some(left_out) = self.admit(
            format!("server {}", remote.ip()),
            tokio::time::Instant::now(),
        ) {
            warn!(
                peer = %remote,
                timeout_ms = timeout.as_millis(),
                left_out,
                "refused a connection to the peer port: no TLS handshake in time"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tokio_stream::StreamExt;

    use super::*;
    use crate::certs::{self, member_files};
    use crate::config::CertsArgs;

    /// A CA and three members' certificates in a new directory.
    fn cluster_ca() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        certs::make(&CertsArgs {
            out: dir.path().to_owned(),
            nodes: 3,
            hosts: Vec::new(),
            days: 1,
            keep_existing: false,
        })
        .unwrap();
        dir
    }

    fn member(dir: &Path, node: u16) -> PeerTls {
        PeerTls::load(&member_files(dir, NodeId(node)), NodeId(node)).unwrap()
    }

    /// A TLS client of `tls`'s member to `address`, expecting the server to be `expected`.
    async fn connect(
        tls: &PeerTls,
        address: SocketAddr,
        expected: u16,
    ) -> io::Result<client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(address).await?;
        let name = ServerName::try_from(member_name(NodeId(expected))).unwrap();
        TlsConnector::from(Arc::clone(&tls.client))
            .connect(name, tcp)
            .await
    }

    async fn bound() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        (listener, address)
    }

    #[test]
    fn a_member_certificate_names_its_node_and_no_other() {
        let dir = cluster_ca();
        let chain = read_certificates(&member_files(dir.path(), NodeId(2)).cert, "test").unwrap();
        assert!(certificate_names(&chain, NodeId(2)));
        assert!(!certificate_names(&chain, NodeId(1)));
        assert!(!certificate_names(&chain, NodeId(3)));
        assert!(!certificate_names(&[], NodeId(2)));
    }

    #[test]
    fn a_node_refuses_to_start_with_files_its_peers_would_refuse() {
        let dir = cluster_ca();
        let other = cluster_ca();
        let files = member_files(dir.path(), NodeId(2));
        // Node 2's certificate, for node 3.
        let error = PeerTls::load(&files, NodeId(3)).unwrap_err();
        assert!(
            matches!(error, PeerTlsError::NotThisMember { node: 3, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("node-3.trireme"), "{error}");
        // A certificate of another cluster's CA.
        let foreign = PeerTlsFiles {
            ca: files.ca.clone(),
            ..member_files(other.path(), NodeId(2))
        };
        let error = PeerTls::load(&foreign, NodeId(2)).unwrap_err();
        assert!(
            matches!(&error, PeerTlsError::NotThisMember { reason, .. } if reason.contains("UnknownIssuer")),
            "{error}"
        );
        // Another member's key.
        let wrong_key = PeerTlsFiles {
            key: member_files(dir.path(), NodeId(1)).key,
            ..files.clone()
        };
        let error = PeerTls::load(&wrong_key, NodeId(2)).unwrap_err();
        assert!(matches!(error, PeerTlsError::Key { .. }), "{error}");
        // No file, and a file that is no certificate.
        let missing = PeerTlsFiles {
            ca: PathBuf::from("/nonexistent/ca.pem"),
            ..files.clone()
        };
        let error = PeerTls::load(&missing, NodeId(2)).unwrap_err();
        assert!(matches!(error, PeerTlsError::Unreadable { .. }), "{error}");
        let not_a_certificate = PeerTlsFiles {
            ca: files.key.clone(),
            ..files
        };
        let error = PeerTls::load(&not_a_certificate, NodeId(2)).unwrap_err();
        assert!(
            matches!(&error, PeerTlsError::Unreadable { reason, .. } if reason.contains("no certificate")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn members_of_one_ca_connect_and_the_server_sees_the_client_certificate() {
        let dir = cluster_ca();
        let (server, client) = (member(dir.path(), 1), member(dir.path(), 2));
        let (listener, address) = bound().await;
        let mut incoming = std::pin::pin!(server.incoming(listener));
        let mut stream = connect(&client, address, 1).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        let (socket, session) = accepted.get_ref();
        assert!(socket.nodelay().unwrap());
        let certificates = session.peer_certificates().unwrap();
        assert!(certificate_names(certificates, NodeId(2)));
        assert!(!certificate_names(certificates, NodeId(1)));
        // The connection carries bytes both ways.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut accepted = accepted;
        stream.write_all(b"ping").await.unwrap();
        let mut read = [0; 4];
        accepted.read_exact(&mut read).await.unwrap();
        assert_eq!(&read, b"ping");
    }

    #[tokio::test]
    async fn a_member_of_another_ca_is_refused_both_ways() {
        let dir = cluster_ca();
        let other = cluster_ca();
        let server = member(dir.path(), 1);
        let stranger = member(other.path(), 2);
        let (listener, address) = bound().await;
        let mut incoming = std::pin::pin!(server.incoming(listener));
        // The stranger refuses the server's certificate...
        let error = connect(&stranger, address, 1).await.unwrap_err();
        assert!(
            matches!(
                tls_error(&error),
                Some(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer
                ))
            ),
            "{error}"
        );
        // ...and the server a stranger's server: a member connecting to it refuses it too.
        let (strange_listener, strange_address) = bound().await;
        let mut strange_incoming = std::pin::pin!(stranger.incoming(strange_listener));
        let member = member(dir.path(), 3);
        assert!(connect(&member, strange_address, 2).await.is_err());
        // Neither server yields a refused connection: the first either yields is a member's of
        // its own CA, connected after the refusals.
        let _good = connect(&member, address, 1).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(certificate_names(
            accepted.get_ref().1.peer_certificates().unwrap(),
            NodeId(3)
        ));
        let own = member_files(other.path(), NodeId(3));
        let stranger_peer = PeerTls::load(&own, NodeId(3)).unwrap();
        let _good = connect(&stranger_peer, strange_address, 2).await.unwrap();
        let accepted = strange_incoming.next().await.unwrap().unwrap();
        assert!(certificate_names(
            accepted.get_ref().1.peer_certificates().unwrap(),
            NodeId(3)
        ));
    }

    #[tokio::test]
    async fn a_member_at_another_members_address_is_refused_by_name() {
        let dir = cluster_ca();
        let (server, client) = (member(dir.path(), 1), member(dir.path(), 2));
        let (listener, address) = bound().await;
        let _incoming = server.incoming(listener);
        // Node 1 answers where node 3 is listed.
        let error = connect(&client, address, 3).await.unwrap_err();
        assert!(
            matches!(
                tls_error(&error),
                Some(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForNameContext { .. }
                        | rustls::CertificateError::NotValidForName
                ))
            ),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_plaintext_client_is_refused() {
        use tokio::io::AsyncWriteExt;
        let dir = cluster_ca();
        let server = member(dir.path(), 1);
        let (listener, address) = bound().await;
        let mut incoming = std::pin::pin!(server.incoming(listener));
        let mut plain = TcpStream::connect(address).await.unwrap();
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        // The server closes the connection instead of serving it.
        let mut rest = Vec::new();
        use tokio::io::AsyncReadExt;
        let _ = plain.read_to_end(&mut rest).await;
        let _good = connect(&member(dir.path(), 2), address, 1).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(certificate_names(
            accepted.get_ref().1.peer_certificates().unwrap(),
            NodeId(2)
        ));
    }

    #[test]
    fn refusals_of_one_peer_are_warned_about_once_a_period() {
        let log = RefusalLog::default();
        let start = tokio::time::Instant::now();
        let later = start + REFUSAL_LOG_PERIOD;
        assert_eq!(log.admit("a".to_owned(), start), Some(0));
        assert_eq!(log.admit("a".to_owned(), start), None);
        assert_eq!(log.admit("b".to_owned(), start), Some(0));
        assert_eq!(
            log.admit("a".to_owned(), later - Duration::from_millis(1)),
            None
        );
        assert_eq!(log.admit("a".to_owned(), later), Some(2));
        assert_eq!(log.admit("a".to_owned(), later), None);
    }
}
