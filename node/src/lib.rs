//! trireme-node: the Trireme server. It wraps the pure queue core (`trireme-core`) with durable
//! storage (redb, group commit), the gRPC API (`trireme.v1`), metrics and health (`metrics`),
//! configuration, logging and graceful shutdown.
//!
//! A node takes its listener, storage and clock as arguments ([`Node::start`]), so the same code
//! runs in production, in tests on loopback, and under turmoil. With a cluster configured it
//! also opens its replica store, joins the other members and serves them the internal replica
//! service on its own listener ([`Node::serve_peers`]). This crate must never put queue
//! semantics outside the core, and never acknowledge a change before it is fsynced.
#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod certs;
pub mod clock;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod connections;
pub mod console;
pub mod engine;
pub mod fault;
pub mod files;
pub mod grpc;
pub mod handle;
pub mod limits;
pub mod metrics;
pub mod redrive;
pub mod sqs;
pub mod status;
pub mod storage;
pub mod trace;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tonic::transport::server::Connected;
use tracing::{info, warn};

use crate::auth::{ApiAuth, ApiTokens, TokenFileError};
use crate::backend::Backend;
use crate::clock::Clock;
use crate::cluster::anti_entropy::{AntiEntropySettings, AntiEntropyTask};
use crate::cluster::collection::{CollectionSettings, CollectionTask};
use crate::cluster::edge::ClusterEdge;
use crate::cluster::move_task::{MoveTaskDriver, MoveTaskSettings};
use crate::cluster::peers::LinkSettings;
use crate::cluster::store::{ReplicaStore, StoreClosed, StoreError};
use crate::cluster::tls::{PeerTls, PeerTlsError};
use crate::cluster::{Cluster, ClusterError, ClusterSettings};
use crate::config::{ClusterConfig, Config, PeerSecurity};
use crate::engine::{Engine, EngineError, EngineSettings};
use crate::handle::{HandleCodec, HandleKeyError};
use crate::storage::{Storage, StorageError};

/// Why a node could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum NodeError {
    /// The database could not be opened or read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The configured receipt-handle key is unusable.
    #[error(transparent)]
    HandleKey(#[from] HandleKeyError),
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The data directory's replica database belongs to another member.
    #[error(
        "the data directory {data_dir} belongs to node {stored}, but this node is configured \
         as node {configured}: give every member its own data directory"
    )]
    WrongNode {
        data_dir: String,
        stored: u16,
        configured: u16,
    },
    /// The replica database could not be opened or read.
    #[error(transparent)]
    Replica(StoreError),
    /// The cluster could not be joined.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The peer TLS files are unusable.
    #[error(transparent)]
    PeerTls(#[from] PeerTlsError),
    /// The API token file is unusable.
    #[error(transparent)]
    ApiTokens(#[from] TokenFileError),
    /// The gRPC server failed.
    #[error("gRPC server failed: {reason}")]
    Serve { reason: String },
}

/// Bytes of a receipt-handle key the node generates for itself.
const GENERATED_HANDLE_KEY_BYTES: usize = 32;

/// Opens the database in the configured data directory.
///
/// # Errors
/// `NodeError::Storage` when the directory or database cannot be opened.
pub fn open_storage(config: &Config) -> Result<Storage, NodeError> {
    Ok(Storage::open_path(&config.data_dir, config.db_cache_bytes)?)
}

/// A running node: the engine, the gRPC server, optionally the SQS endpoint, and its part in a
/// cluster if it is a member.
pub struct Node {
    engine: Engine,
    /// What the node counts and shows on its metrics listener.
    metrics: Arc<metrics::Metrics>,
    /// The edges' request metrics (the SQS endpoint gets a clone when it is served).
    requests: metrics::RequestMetrics,
    /// What the edges serve requests with: the engine alone, the cluster for a member.
    backend: Backend,
    /// `None`: the node runs alone.
    member: Option<Member>,
    /// The servers; each ends with its error text, or `Ok` after a graceful stop.
    servers: Vec<JoinHandle<Result<(), String>>>,
    /// Set to `true` to make every server stop accepting.
    stop_accepting: watch::Sender<bool>,
    shutdown_grace: Duration,
    /// Whether the metrics listener serves the console too.
    console: bool,
    /// The SQS endpoint's keys, which the console's login takes (none until it is served).
    console_keys: Vec<sqs::AccessKey>,
    /// Client connections the SQS endpoint serves at once (`Config::sqs_connections_max`).
    sqs_connections_max: usize,
    /// Where both edges' requests get their trace ids: the node's seed's stream if it has one.
    trace_ids: trace::TraceIds,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("engine", &self.engine)
            .field(
                "member",
                &self.member.as_ref().map(|member| member.cluster.node()),
            )
            .field("servers", &self.servers.len())
            .finish_non_exhaustive()
    }
}

/// This node's part in a cluster.
struct Member {
    cluster: Cluster,
    /// The replica service, configured as the gRPC server is, until [`Node::serve_peers`]
    /// serves it.
    peer_router: Option<tonic::transport::server::Router>,
    /// Mutual TLS on the peer port; `None`: plaintext, as configured.
    tls: Option<PeerTls>,
    anti_entropy: AntiEntropySettings,
    collection: CollectionSettings,
    move_tasks: MoveTaskSettings,
    /// The background work, once the peers are served.
    tasks: Option<(AntiEntropyTask, CollectionTask, MoveTaskDriver)>,
    /// Resolves when the replica database is closed.
    store_closed: StoreClosed,
}

impl Member {
    /// Opens the replica store in the node's data directory (a new one gets `new_disk_id`) and
    /// joins the cluster of `config`, with the node's seed and request timeout.
    fn start(
        config: &ClusterConfig,
        node: &Config,
        clock: Arc<dyn Clock>,
        new_disk_id: u64,
    ) -> Result<Member, NodeError> {
        let data_dir = node.data_dir.as_path();
        let (store, store_closed) =
            ReplicaStore::open(data_dir, config.node, new_disk_id, node.db_cache_bytes).map_err(
                |error| match error {
                    StoreError::WrongNode { stored, configured } => NodeError::WrongNode {
                        data_dir: data_dir.display().to_string(),
                        stored,
                        configured,
                    },
                    other => NodeError::Replica(other),
                },
            )?;
        let operation_timeout = Duration::from_millis(config.operation_timeout_ms);
        let settings = ClusterSettings {
            node: config.node,
            peers: config.peers.clone(),
            operation_timeout,
            link: LinkSettings {
                connect_timeout: Duration::from_millis(limits::peer_connect_timeout_ms)
                    .min(operation_timeout),
                // A call outliving its operation only holds a slot of the link.
                call_timeout: operation_timeout,
                keepalive_interval: Duration::from_millis(limits::peer_keepalive_interval_ms),
                keepalive_timeout: Duration::from_millis(limits::peer_keepalive_timeout_ms),
            },
            horizon_ms: limits::horizon_ms,
            dedup_window_ms: trireme_core::limits::dedup_window_ms,
            monitor_clock: true,
        };
        let tls = match &config.peer_security {
            PeerSecurity::Tls(files) => Some(PeerTls::load(files, config.node)?),
            PeerSecurity::Plaintext => {
                warn!(
                    peer_listen = %config.peer_listen,
                    "PEER TRAFFIC IS PLAINTEXT AND UNAUTHENTICATED (--peer-plaintext): anyone who \
                     can reach the peer port can act as a member, read and change every \
                     message. For development on one machine only; give members \
                     --peer-tls-ca, --peer-tls-cert and --peer-tls-key anywhere else"
                );
                None
            }
        };
        let (cluster, service) = match &tls {
            Some(tls) => {
                let (cluster, service) =
                    Cluster::start_with(&settings, store, clock, node.seed, &|peer, endpoint| {
                        tls.channel(peer, endpoint)
                    })?;
                (cluster, service.requiring_certified_peers())
            }
            None => Cluster::start(&settings, store, clock, node.seed)?,
        };
        // No `tcp_nodelay` here either: the accepted sockets get it from `tcp_incoming`.
        let peer_router = tonic::transport::Server::builder()
            .timeout(Duration::from_secs(node.request_timeout_s))
            .http2_keepalive_interval(Some(Duration::from_secs(limits::grpc_keepalive_interval_s)))
            .http2_keepalive_timeout(Some(Duration::from_secs(limits::grpc_keepalive_timeout_s)))
            .max_concurrent_streams(Some(limits::grpc_streams_per_connection_max))
            .add_service(service.into_server());
        let anti_entropy = AntiEntropySettings {
            period: Duration::from_secs(config.anti_entropy_period_s),
            ..AntiEntropySettings::default()
        };
        let collection = CollectionSettings {
            period: Duration::from_secs(config.collection_period_s),
            rows_per_round_max: config.collection_rows_per_round_max,
            ..CollectionSettings::default()
        };
        let move_tasks = MoveTaskSettings {
            lease_ms: config.move_task_lease_ms,
            // A look well within a lease, so a takeover is not late by much more than the rule.
            scan_period: Duration::from_millis(config.move_task_lease_ms / 4)
                .min(MoveTaskSettings::default().scan_period),
        };
        Ok(Member {
            cluster,
            peer_router: Some(peer_router),
            tls,
            anti_entropy,
            collection,
            move_tasks,
            tasks: None,
            store_closed,
        })
    }

    /// Stops the background work, lets go of the cluster and waits (until `deadline`) for the
    /// replica database to close: its last group committed, the file released.
    async fn stop(self, deadline: tokio::time::Instant) {
        if let Some((anti_entropy, collection, move_tasks)) = self.tasks {
            move_tasks.stop().await;
            anti_entropy.stop().await;
            collection.stop().await;
        }
        drop(self.cluster);
        let closed = self.store_closed;
        let waited =
            tokio::time::timeout_at(deadline, tokio::task::spawn_blocking(move || closed.wait()))
                .await;
        match waited {
            Ok(Ok(())) => info!("replica store closed"),
            Ok(Err(error)) => warn!(%error, "the replica store's committer failed"),
            // Whatever it still holds was never acknowledged: acks follow the fsync.
            Err(_) => warn!("the replica store did not close in time; exiting without it"),
        }
    }
}

/// Samples the queues' depths for the console's charts every
/// `limits::console_sample_period_ms` until the node stops accepting (then it lets go of the
/// console, whose handles hold the stores open).
async fn sample_depths(
    console: Arc<console::Console>,
    stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let period = Duration::from_millis(limits::console_sample_period_ms);
    let stopping = stopped(stop);
    tokio::pin!(stopping);
    loop {
        if let Err(error) = console.sample().await {
            // Only a node alone shutting down fails here; the stop follows.
            tracing::debug!(%error, "no depth sample");
        }
        tokio::select! {
            () = &mut stopping => return Ok(()),
            () = tokio::time::sleep(period) => {}
        }
    }
}

/// Resolves once `stop` turns `true` (or its sender is gone: the node is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

impl Node {
    /// Starts a node on `storage`, serving gRPC on the connections of `incoming` (a TCP
    /// listener's stream in production, turmoil's in simulation), reading time from `clock`.
    /// With `config.cluster` set it also opens the replica store in the data directory (its
    /// committer is an OS thread: not for the simulation) and joins the cluster; the peers are
    /// served once [`Node::serve_peers`] is called.
    ///
    /// # Errors
    /// `Storage` when the handle key or records cannot be read, `HandleKey` for a short
    /// configured key, `ApiTokens` for an unusable token file, `Engine` when the engine cannot
    /// start; for a member, `WrongNode` when the data directory belongs to another node id,
    /// `Replica` when the replica store cannot be opened, `PeerTls` for unusable TLS files,
    /// `Cluster` when the membership is refused.
    pub fn start<I, IO, IE>(
        config: &Config,
        mut storage: Storage,
        incoming: I,
        clock: Arc<dyn Clock>,
    ) -> Result<Node, NodeError>
    where
        I: Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let mut rng = match config.seed {
            // A stream apart from the engine's, so the key and the message ids do not repeat
            // each other.
            Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ 0x6b65_795f_6b65_795f),
            None => ChaCha20Rng::from_os_rng(),
        };
        let key = match &config.handle_key {
            Some(key) => key.clone(),
            None => {
                let generated: [u8; GENERATED_HANDLE_KEY_BYTES] = rng.random();
                storage.handle_key_or_store(&generated)?
            }
        };
        let handles = HandleCodec::new(&key)?;
        let tokens = match &config.api_token_file {
            Some(path) => {
                let tokens = ApiTokens::load(path)?;
                info!(tokens = tokens.len(), file = %path.display(), "the gRPC API requires a bearer token");
                Some(tokens)
            }
            None => {
                warn!("the gRPC API serves anyone who reaches it: no --api-token-file");
                None
            }
        };
        let member = match &config.cluster {
            Some(cluster) => Some(Member::start(
                cluster,
                config,
                Arc::clone(&clock),
                rng.random(),
            )?),
            None => None,
        };
        let settings = EngineSettings {
            commit_batch_commands_max: config.commit_batch_commands_max,
            engine_queue_commands_max: config.engine_queue_commands_max,
            long_polls_max: config.long_polls_max,
        };
        let backend_clock = Arc::clone(&clock);
        let engine = Engine::start(storage, clock, handles.clone(), settings, config.seed)?;
        let sources = metrics::Sources::default();
        // The edges serve a member's requests through the cluster; the engine then holds only
        // the node's own database (its handle key).
        let backend = match &member {
            Some(member) => Backend::cluster(
                ClusterEdge::new(member.cluster.clone(), handles, backend_clock, config.seed)
                    .with_long_polls_max(config.long_polls_max),
                sources.messages.clone(),
            ),
            None => Backend::alone(engine.clone(), sources.messages.clone()),
        };
        let node_metrics = Arc::new(metrics::Metrics::new(
            &sources,
            engine.clone(),
            member.as_ref().map(|member| member.cluster.clone()),
            config.data_dir.clone(),
        ));
        let trace_ids = trace::TraceIds::new(config.seed);
        let (stop_accepting, stop) = watch::channel(false);
        // No `tcp_nodelay` here: tonic ignores it for a custom incoming stream. The accepted
        // sockets get it from `tcp_incoming` (production) or need none (turmoil).
        let builder = tonic::transport::Server::builder()
            .timeout(Duration::from_secs(config.request_timeout_s))
            .http2_keepalive_interval(Some(Duration::from_secs(limits::grpc_keepalive_interval_s)))
            .http2_keepalive_timeout(Some(Duration::from_secs(limits::grpc_keepalive_timeout_s)))
            .max_concurrent_streams(Some(limits::grpc_streams_per_connection_max))
            .layer(grpc::MetricsLayer::new(
                &sources.requests,
                trace_ids.clone(),
            ));
        // The one service is served as it is, not through tonic's router (an axum router of
        // services by name): routing by name and its boxing were 4-5 % of the instructions of a
        // request (BENCHMARKS.md 6o), and the service answers a path it does not serve with
        // `Unimplemented` itself, as the router's fallback did. Its calls pass the API's tokens
        // in `auth::Authenticated`, which reads the request's headers in place (tonic's
        // interceptor turned them into metadata and back on every call: BENCHMARKS.md 6r).
        let service = auth::Authenticated::new(
            grpc::service(
                backend.clone(),
                config.grpc_request_bytes_max,
                config.grpc_response_bytes_max,
            ),
            ApiAuth::new(tokens),
        );
        let grpc_connections_max = config.grpc_connections_max;
        let server = tokio::spawn(async move {
            builder
                .serve_with_incoming_shutdown(
                    service,
                    connections::capped_incoming(incoming, grpc_connections_max),
                    stopped(stop),
                )
                .await
                .map_err(|error| format!("gRPC server: {error}"))
        });
        Ok(Node {
            engine,
            metrics: node_metrics,
            requests: sources.requests,
            backend,
            member,
            servers: vec![server],
            stop_accepting,
            shutdown_grace: Duration::from_secs(config.shutdown_grace_s),
            console: config.console,
            console_keys: Vec::new(),
            sqs_connections_max: config.sqs_connections_max,
            trace_ids,
        })
    }

    /// Serves the SQS-compatible endpoint on `listener` until the node shuts down. Every
    /// accepted socket has `TCP_NODELAY` set (see [`tcp_incoming`]).
    pub fn serve_sqs(&mut self, listener: tokio::net::TcpListener, settings: sqs::SqsSettings) {
        let settings = sqs::SqsSettings {
            requests: self.requests.clone(),
            trace_ids: self.trace_ids.clone(),
            ..settings
        };
        self.console_keys.clone_from(&settings.access_keys);
        let app = sqs::router(self.backend.clone(), settings);
        let stop = self.stop_accepting.subscribe();
        let listener =
            connections::CappedListener::new(sqs_incoming(listener), self.sqs_connections_max);
        self.servers.push(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped(stop))
                .await
                .map_err(|error| format!("SQS endpoint: {error}"))
        }));
    }

    /// Serves `/metrics`, `/health` and `/ready` on `listener` until the node shuts down (see
    /// [`metrics`]), and the console under `/console` unless it is turned off (see
    /// [`console`]; its login takes the SQS endpoint's keys, so serve that first).
    pub fn serve_metrics(&mut self, listener: tokio::net::TcpListener) {
        let mut app = metrics::router(Arc::clone(&self.metrics));
        if self.console {
            let console = Arc::new(console::Console::new(
                self.backend.clone(),
                Arc::clone(&self.metrics),
                self.cluster().cloned(),
                self.console_keys.clone(),
            ));
            app = app.merge(console::router(Arc::clone(&console)));
            let stop = self.stop_accepting.subscribe();
            self.servers
                .push(tokio::spawn(sample_depths(console, stop)));
        }
        let stop = self.stop_accepting.subscribe();
        self.servers.push(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped(stop))
                .await
                .map_err(|error| format!("metrics endpoint: {error}"))
        }));
    }

    /// What the node counts and shows (for embedding and tests).
    #[must_use]
    pub fn metrics(&self) -> &Arc<metrics::Metrics> {
        &self.metrics
    }

    /// Serves the internal replica service to the other members on the connections of
    /// `incoming` (a TCP listener's stream through [`tcp_incoming`] in production) until the
    /// node shuts down, and starts anti-entropy and tombstone collection. Until it is called the
    /// node coordinates but is no replica its peers can reach.
    ///
    /// # Panics
    /// If the node is not a cluster member, or its peers are served already.
    pub fn serve_peers<I, IO, IE>(&mut self, incoming: I)
    where
        I: Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let member = self
            .member
            .as_mut()
            .expect("only a cluster member serves peers");
        let router = member
            .peer_router
            .take()
            .expect("the peers are served once");
        let stop = self.stop_accepting.subscribe();
        self.servers.push(tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(
                    connections::capped_incoming(incoming, limits::peer_connections_max),
                    stopped(stop),
                )
                .await
                .map_err(|error| format!("peer service: {error}"))
        }));
        member.tasks = Some((
            member.cluster.spawn_anti_entropy(member.anti_entropy),
            member.cluster.spawn_collection(member.collection),
            member.cluster.spawn_move_tasks(member.move_tasks),
        ));
    }

    /// Serves the internal replica service on `listener` as [`Node::serve_peers`] does, over
    /// mutual TLS when the cluster is configured with it (each handshake's failure logged with
    /// the peer's address), else in plaintext; `TCP_NODELAY` on every accepted socket.
    ///
    /// # Panics
    /// As [`Node::serve_peers`].
    pub fn serve_peer_listener(&mut self, listener: tokio::net::TcpListener) {
        let tls = self
            .member
            .as_ref()
            .expect("only a cluster member serves peers")
            .tls
            .clone();
        match tls {
            Some(tls) => self.serve_peers(tls.incoming(listener)),
            None => self.serve_peers(tcp_incoming(listener)),
        }
    }

    /// The node's engine (for embedding and tests).
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// What the node's edges serve requests with (for embedding and tests).
    #[must_use]
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The cluster this node is a member of; `None` when it runs alone.
    #[must_use]
    pub fn cluster(&self) -> Option<&Cluster> {
        self.member.as_ref().map(|member| &member.cluster)
    }

    /// Resolves when a server stops by itself or the engine stops after a storage failure:
    /// either way the node can no longer serve, and the process should exit.
    ///
    /// # Errors
    /// `Serve` with the server's error, `Engine` with the storage failure.
    pub async fn serve_until_failure(&mut self) -> Result<(), NodeError> {
        let engine = self.engine.clone();
        let ended = tokio::select! {
            ended = first_to_end(&mut self.servers) => ended,
            fault = engine.failed() => {
                return Err(NodeError::Engine(EngineError::Storage(fault)));
            }
        };
        match ended {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(NodeError::Serve { reason }),
            Err(error) => Err(NodeError::Serve {
                reason: error.to_string(),
            }),
        }
    }

    /// Graceful shutdown: stop accepting connections and requests (clients' and peers'), answer
    /// open long polls empty, wait (up to the grace period) for open requests, then stop the
    /// engine, which commits what it applied and closes the database, and a member's
    /// anti-entropy, collection and replica store.
    pub async fn shutdown(self) {
        info!("shutting down: no new requests");
        // Receivers live as long as the servers; none left means every server already ended.
        let _ = self.stop_accepting.send(true);
        self.backend.cancel_move_tasks();
        self.engine.stop_waiting().await;
        info!("long polls answered");
        let deadline = tokio::time::Instant::now() + self.shutdown_grace;
        for mut server in self.servers {
            if tokio::time::timeout_at(deadline, &mut server)
                .await
                .is_err()
            {
                warn!(
                    grace_s = self.shutdown_grace.as_secs(),
                    "open requests did not finish in time; closing them"
                );
                server.abort();
            }
        }
        self.engine.close().await;
        // The edges' and the metrics' handles on the cluster hold the replica store open: let
        // go of them first (the metrics server, which held a clone, has ended above).
        drop(self.backend);
        drop(self.metrics);
        if let Some(member) = self.member {
            member
                .stop(tokio::time::Instant::now() + self.shutdown_grace)
                .await;
        }
        info!("shutdown complete");
    }
}

/// The connections `listener` accepts, each with `TCP_NODELAY` set, as the incoming stream for
/// [`Node::start`]. Without it Nagle's algorithm holds a small reply until the peer's delayed
/// acknowledgement (~15 ms per request on Linux loopback with one request in flight), and
/// tonic's `Server::tcp_nodelay` does not reach sockets of a stream handed to it.
pub fn tcp_incoming(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener)
        .map(|accepted| accepted.inspect(set_nodelay))
}

/// `listener` for the SQS endpoint: the same `TCP_NODELAY` on every accepted socket as
/// [`tcp_incoming`] gives gRPC (axum, like tonic, leaves the socket as accepted).
pub fn sqs_incoming(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|socket| set_nodelay(socket))
}

/// Sets `TCP_NODELAY` on an accepted socket. A failure is only slower replies on that one
/// connection, so it is logged and the connection is served anyway.
pub(crate) fn set_nodelay(socket: &tokio::net::TcpStream) {
    if let Err(error) = socket.set_nodelay(true) {
        warn!(%error, "TCP_NODELAY could not be set; replies on this connection may be delayed");
    }
}

/// Waits for the first of `servers` to end (what `futures::future::select_all` does, written
/// here to avoid a dependency for one call).
async fn first_to_end(
    servers: &mut [JoinHandle<Result<(), String>>],
) -> Result<Result<(), String>, tokio::task::JoinError> {
    assert!(!servers.is_empty(), "a node runs at least its gRPC server");
    std::future::poll_fn(|context| {
        for server in servers.iter_mut() {
            if let std::task::Poll::Ready(result) = std::pin::Pin::new(server).poll(context) {
                return std::task::Poll::Ready(result);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The SQS endpoint's settings from the configuration, with `bound_port` as the advertised
/// port unless one is configured.
#[must_use]
pub fn sqs_settings(config: &config::SqsConfig, bound_port: u16) -> sqs::SqsSettings {
    sqs::SqsSettings {
        advertised_host: config.advertised_host.clone(),
        advertised_port: config.advertised_port.unwrap_or(bound_port),
        region: config.region.clone(),
        account_id: config.account_id.clone(),
        access_keys: config.access_keys.clone(),
        requests: metrics::RequestMetrics::default(),
        trace_ids: trace::TraceIds::default(),
    }
}

/// The listeners a node serves on, bound by the caller (who may print their addresses).
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC API.
    pub grpc: tokio::net::TcpListener,
    /// The SQS-compatible endpoint, if it is on.
    pub sqs: Option<tokio::net::TcpListener>,
    /// The internal replica service, for a cluster member.
    pub peers: Option<tokio::net::TcpListener>,
    /// `/metrics`, `/health` and `/ready`, if they are on.
    pub metrics: Option<tokio::net::TcpListener>,
}

/// Starts a node on `storage` serving on `listeners`, with `TCP_NODELAY` on every accepted
/// socket: gRPC, the SQS endpoint if configured, and for a cluster member the replica service
/// (over mutual TLS unless plaintext is configured), anti-entropy and collection.
///
/// # Errors
/// As for [`Node::start`].
///
/// # Panics
/// If `listeners.peers` is given to a node alone or missing for a member.
pub fn launch(
    config: &Config,
    storage: Storage,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
) -> Result<Node, NodeError> {
    assert_eq!(
        listeners.peers.is_some(),
        config.cluster.is_some(),
        "a cluster member, and only one, has a peer listener"
    );
    let address = listeners.grpc.local_addr().ok();
    let mut node = Node::start(config, storage, tcp_incoming(listeners.grpc), clock)?;
    let sqs_address = match (listeners.sqs, &config.sqs) {
        (Some(sqs_listener), Some(sqs_config)) => {
            let sqs_address = sqs_listener.local_addr().ok();
            let port = sqs_address.map_or(0, |address| address.port());
            node.serve_sqs(sqs_listener, sqs_settings(sqs_config, port));
            sqs_address
        }
        _ => None,
    };
    let metrics_address = listeners.metrics.map(|metrics_listener| {
        let metrics_address = metrics_listener.local_addr().ok();
        node.serve_metrics(metrics_listener);
        metrics_address
    });
    let peer_address = listeners.peers.map(|peer_listener| {
        let peer_address = peer_listener.local_addr().ok();
        node.serve_peer_listener(peer_listener);
        peer_address
    });
    info!(
        grpc = ?address,
        sqs = ?sqs_address,
        metrics = ?metrics_address.flatten(),
        peers = ?peer_address.flatten(),
        node_id = config.cluster.as_ref().map(|cluster| cluster.node.0),
        peer_security = config.cluster.as_ref().map(|cluster| match cluster.peer_security {
            PeerSecurity::Tls(_) => "mutual TLS",
            PeerSecurity::Plaintext => "PLAINTEXT",
        }),
        data_dir = %config.data_dir.display(),
        "node running"
    );
    Ok(node)
}

/// Runs `node` until `shutdown` resolves (SIGTERM in the binary) or it fails, then shuts it
/// down gracefully.
///
/// # Errors
/// `Serve` if a server fails while running, `Engine` after a storage failure.
pub async fn run(mut node: Node, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
    let result = tokio::select! {
        () = shutdown => Ok(()),
        result = node.serve_until_failure() => result,
    };
    node.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn accepted_grpc_connections_have_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut incoming = std::pin::pin!(tcp_incoming(listener));
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }

    #[tokio::test]
    async fn accepted_sqs_connections_have_nodelay() {
        use axum::serve::Listener;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut listener = sqs_incoming(listener);
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let (accepted, _) = listener.accept().await;
        assert!(accepted.nodelay().unwrap());
    }
}
