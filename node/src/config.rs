//! The node's configuration: command-line flags (each with an environment variable) over an
//! optional TOML file over built-in defaults. Parsing and checking happen here, once, before
//! anything starts; the rest of the node reads a finished [`Config`].
//!
//! This module must never open sockets or files other than the configuration file itself.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use thiserror::Error;
use trireme_replication::NodeId;
use trireme_replication::placement::REPLICAS;

use crate::cluster::anti_entropy::AntiEntropySettings;
use crate::cluster::collection::CollectionSettings;
use crate::cluster::move_task::MoveTaskSettings;
use crate::handle::HANDLE_KEY_BYTES_MIN;
use crate::limits;

/// Default gRPC listen address.
pub const LISTEN_DEFAULT: &str = "0.0.0.0:7100";
/// Default SQS-compatible endpoint address (the port local SQS emulators use).
pub const SQS_LISTEN_DEFAULT: &str = "0.0.0.0:9324";
/// Default host name in SQS queue URLs.
pub const SQS_ADVERTISED_HOST_DEFAULT: &str = "localhost";
/// Default SQS region of the node (its queues have bare names).
pub const SQS_REGION_DEFAULT: &str = "us-east-1";
/// Default account id in SQS queue URLs and ARNs.
pub const SQS_ACCOUNT_ID_DEFAULT: &str = "000000000000";
/// Default data directory, relative to the working directory.
pub const DATA_DIR_DEFAULT: &str = "./trireme-data";
/// Default listen address of `/metrics`, `/health` and `/ready`: loopback, since the figures
/// name every queue (containers set `0.0.0.0:9100`).
pub const METRICS_LISTEN_DEFAULT: &str = "127.0.0.1:9100";
/// Default listen address of the internal replica service (the other members' port).
pub const PEER_LISTEN_DEFAULT: &str = "0.0.0.0:7200";
/// The label the receipt-handle key is derived under from the cluster secret. Changing it
/// changes every cluster's key, so it is fixed for good.
const HANDLE_KEY_LABEL: &[u8] = b"trireme receipt-handle key v1";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

/// `trireme-node`: a Trireme queue server. Every flag can also be set by the environment
/// variable shown, or by the same key (with `_` for `-`) in the `--config` TOML file. A flag or
/// variable beats the file; the file beats the default.
#[derive(Debug, Default, Parser)]
#[command(name = "trireme-node", version, about, long_about = None)]
pub struct Args {
    /// Something else than serving as one node.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// TOML file with any of the settings below (keys like `data_dir`, `listen`).
    #[arg(long, env = "TRIREME_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory holding the database (`trireme.redb`); created if missing.
    /// [default: ./trireme-data]
    #[arg(long, env = "TRIREME_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Address the gRPC API listens on. Port 0 picks a free port; the chosen address is printed.
    /// [default: 0.0.0.0:7100]
    #[arg(long, env = "TRIREME_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Address the SQS-compatible HTTP endpoint listens on. [default: 0.0.0.0:9324]
    #[arg(long, env = "TRIREME_SQS_LISTEN", value_name = "ADDR")]
    pub sqs_listen: Option<SocketAddr>,

    /// Do not serve the SQS-compatible endpoint.
    #[arg(long, env = "TRIREME_NO_SQS")]
    pub no_sqs: bool,

    /// Address `/metrics` (Prometheus), `/health` and `/ready` listen on. [default:
    /// 127.0.0.1:9100]
    #[arg(long, env = "TRIREME_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Do not serve `/metrics`, `/health` and `/ready`.
    #[arg(long, env = "TRIREME_NO_METRICS")]
    pub no_metrics: bool,

    /// Do not serve the web console (`/console` on the metrics listener).
    #[arg(long, env = "TRIREME_NO_CONSOLE")]
    pub no_console: bool,

    /// Host name put in SQS queue URLs (what clients use to reach this node).
    /// [default: localhost]
    #[arg(long, env = "TRIREME_SQS_ADVERTISED_HOST", value_name = "HOST")]
    pub sqs_advertised_host: Option<String>,

    /// Port put in SQS queue URLs. [default: the port the SQS endpoint listens on]
    #[arg(long, env = "TRIREME_SQS_ADVERTISED_PORT", value_name = "PORT")]
    pub sqs_advertised_port: Option<u16>,

    /// The node's own SQS region: unsigned requests act on its queues, which have bare names
    /// (requests signed for another region act on that region's). [default: us-east-1]
    #[arg(long, env = "TRIREME_SQS_REGION", value_name = "REGION")]
    pub sqs_region: Option<String>,

    /// Account id in SQS queue URLs and ARNs. [default: 000000000000]
    #[arg(long, env = "TRIREME_SQS_ACCOUNT_ID", value_name = "ID")]
    pub sqs_account_id: Option<String>,

    /// SigV4 access keys accepted by the SQS endpoint, as `ID:SECRET` (any queue) or
    /// `ID:SECRET:PREFIXES` (only queues whose names begin with one of the `/`-separated
    /// prefixes, e.g. `AKID:secret:orders-/billing-`), comma-separated or repeated. None:
    /// requests are not authenticated, as local SQS emulators do.
    #[arg(
        long = "sqs-access-key",
        env = "TRIREME_SQS_ACCESS_KEYS",
        value_name = "ID:SECRET",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub sqs_access_keys: Vec<String>,

    /// File of bearer tokens the gRPC API requires (one a line, 16 to 512 visible ASCII
    /// characters; `#` starts a comment line): a call passes only with `authorization: Bearer
    /// <token>` naming one. Unset: the gRPC API serves anyone who reaches it.
    #[arg(long, env = "TRIREME_API_TOKEN_FILE", value_name = "FILE")]
    pub api_token_file: Option<PathBuf>,

    /// Key authenticating receipt handles (at least 16 bytes), the same on every member of a
    /// cluster. Unset: in a cluster it is derived from `--cluster-secret`; a node alone
    /// generates a random key once and keeps it in the database.
    #[arg(
        long,
        env = "TRIREME_HANDLE_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub handle_key: Option<String>,

    /// This node's id in the cluster, 1 to 65535; required with `--peers`.
    #[arg(long, env = "TRIREME_NODE_ID", value_name = "N")]
    pub node_id: Option<u64>,

    /// Address the internal replica service listens on: for the other members only, so keep
    /// clients away from it. [default: 0.0.0.0:7200]
    #[arg(long, env = "TRIREME_PEER_LISTEN", value_name = "ADDR")]
    pub peer_listen: Option<SocketAddr>,

    /// The cluster's members as `ID=HOST:PORT` (each one's peer address), comma-separated or
    /// repeated; this node's own entry may be listed or left out. Host names are resolved when
    /// connecting. At least 3 members. Unset: the node runs alone.
    #[arg(
        long = "peers",
        env = "TRIREME_PEERS",
        value_name = "ID=HOST:PORT",
        value_delimiter = ','
    )]
    pub peers: Vec<String>,

    /// The cluster CA's certificate (PEM): a peer is accepted only with a certificate it signed,
    /// in both directions (mutual TLS on the peer port). `trireme-node certs` makes one.
    #[arg(long, env = "TRIREME_PEER_TLS_CA", value_name = "FILE")]
    pub peer_tls_ca: Option<PathBuf>,

    /// This member's certificate chain (PEM), signed by the cluster CA for `node-N.trireme`
    /// (N: `--node-id`), which peers check against the id this node claims.
    #[arg(long, env = "TRIREME_PEER_TLS_CERT", value_name = "FILE")]
    pub peer_tls_cert: Option<PathBuf>,

    /// This member's private key (PEM) for `--peer-tls-cert`.
    #[arg(long, env = "TRIREME_PEER_TLS_KEY", value_name = "FILE")]
    pub peer_tls_key: Option<PathBuf>,

    /// Speak to the other members in plaintext, unauthenticated: anyone who reaches the peer
    /// port can act as a member. Only for development on one machine; logged as a warning.
    /// A cluster needs either this or the three `--peer-tls-*` files.
    #[arg(long, env = "TRIREME_PEER_PLAINTEXT")]
    pub peer_plaintext: bool,

    /// Secret shared by every member of the cluster (at least 16 bytes); the receipt-handle key
    /// is derived from it unless `--handle-key` is set. Prefer the environment variable: a
    /// command line is visible to every user of the machine.
    #[arg(
        long,
        env = "TRIREME_CLUSTER_SECRET",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub cluster_secret: Option<String>,

    /// Milliseconds a cluster operation waits for its quorum before it answers unavailable.
    /// [default: 5000]
    #[arg(long, env = "TRIREME_OPERATION_TIMEOUT_MS", value_name = "MS")]
    pub operation_timeout_ms: Option<u64>,

    /// Seconds between two anti-entropy passes (a comparison with every peer). [default: 600]
    #[arg(long, env = "TRIREME_ANTI_ENTROPY_PERIOD_S", value_name = "SECONDS")]
    pub anti_entropy_period_s: Option<u64>,

    /// Seconds between two tombstone-collection rounds. [default: 60]
    #[arg(long, env = "TRIREME_COLLECTION_PERIOD_S", value_name = "SECONDS")]
    pub collection_period_s: Option<u64>,

    /// Stored records one tombstone-collection round walks at most. [default: 4096]
    #[arg(
        long,
        env = "TRIREME_COLLECTION_ROWS_PER_ROUND_MAX",
        value_name = "COUNT"
    )]
    pub collection_rows_per_round_max: Option<usize>,

    /// Seed of the node's random source (message ids, receipt-handle keys it generates).
    /// Unset: seeded from the operating system. Set it only for reproducible tests.
    #[arg(long, env = "TRIREME_SEED", value_name = "U64")]
    pub seed: Option<u64>,

    /// redb page cache in MiB, of each database the node opens: its own and, in a cluster, its
    /// replica store (which holds the messages). [default: 64]
    #[arg(long, env = "TRIREME_DB_CACHE_MIB", value_name = "MIB")]
    pub db_cache_mib: Option<usize>,

    /// Largest gRPC request decoded, in bytes. [default: 2097152]
    #[arg(long, env = "TRIREME_GRPC_REQUEST_BYTES_MAX", value_name = "BYTES")]
    pub grpc_request_bytes_max: Option<usize>,

    /// Largest gRPC response encoded, in bytes. [default: 12582912]
    #[arg(long, env = "TRIREME_GRPC_RESPONSE_BYTES_MAX", value_name = "BYTES")]
    pub grpc_response_bytes_max: Option<usize>,

    /// Seconds before an unfinished request is cancelled; must exceed the 20 s long poll.
    /// [default: 60]
    #[arg(long, env = "TRIREME_REQUEST_TIMEOUT_S", value_name = "SECONDS")]
    pub request_timeout_s: Option<u64>,

    /// Open long polls (receives waiting for a message) allowed at once. [default: 10000]
    #[arg(long, env = "TRIREME_LONG_POLLS_MAX", value_name = "COUNT")]
    pub long_polls_max: Option<usize>,

    /// Client connections the gRPC port serves at once (1 to 65536); the next waits, unaccepted,
    /// until one closes. [default: 4096]
    #[arg(long, env = "TRIREME_GRPC_CONNECTIONS_MAX", value_name = "COUNT")]
    pub grpc_connections_max: Option<usize>,

    /// Client connections the SQS port serves at once (1 to 65536); the next waits, unaccepted,
    /// until one closes. [default: 4096]
    #[arg(long, env = "TRIREME_SQS_CONNECTIONS_MAX", value_name = "COUNT")]
    pub sqs_connections_max: Option<usize>,

    /// Commands applied per group commit (one fsync). [default: 1024]
    #[arg(long, env = "TRIREME_COMMIT_BATCH_COMMANDS_MAX", value_name = "COUNT")]
    pub commit_batch_commands_max: Option<usize>,

    /// Commands queued for the engine before callers wait. [default: 4096]
    #[arg(long, env = "TRIREME_ENGINE_QUEUE_COMMANDS_MAX", value_name = "COUNT")]
    pub engine_queue_commands_max: Option<usize>,

    /// Seconds shutdown waits for open requests after answering long polls. [default: 10]
    #[arg(long, env = "TRIREME_SHUTDOWN_GRACE_S", value_name = "SECONDS")]
    pub shutdown_grace_s: Option<u64>,

    /// Log filter in `tracing` syntax, e.g. `info` or `trireme_node=debug`. [default: info]
    #[arg(long, env = "TRIREME_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    /// Log line format. [default: text]
    #[arg(long, env = "TRIREME_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

/// The TOML file: the same settings as the flags, all optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    sqs_listen: Option<SocketAddr>,
    no_sqs: Option<bool>,
    metrics_listen: Option<SocketAddr>,
    no_metrics: Option<bool>,
    no_console: Option<bool>,
    sqs_advertised_host: Option<String>,
    sqs_advertised_port: Option<u16>,
    sqs_region: Option<String>,
    sqs_account_id: Option<String>,
    sqs_access_keys: Option<Vec<String>>,
    api_token_file: Option<PathBuf>,
    handle_key: Option<String>,
    node_id: Option<u64>,
    peer_listen: Option<SocketAddr>,
    peers: Option<Vec<String>>,
    peer_tls_ca: Option<PathBuf>,
    peer_tls_cert: Option<PathBuf>,
    peer_tls_key: Option<PathBuf>,
    peer_plaintext: Option<bool>,
    cluster_secret: Option<String>,
    operation_timeout_ms: Option<u64>,
    anti_entropy_period_s: Option<u64>,
    collection_period_s: Option<u64>,
    collection_rows_per_round_max: Option<usize>,
    seed: Option<u64>,
    db_cache_mib: Option<usize>,
    grpc_request_bytes_max: Option<usize>,
    grpc_response_bytes_max: Option<usize>,
    request_timeout_s: Option<u64>,
    long_polls_max: Option<usize>,
    grpc_connections_max: Option<usize>,
    sqs_connections_max: Option<usize>,
    commit_batch_commands_max: Option<usize>,
    engine_queue_commands_max: Option<usize>,
    shutdown_grace_s: Option<u64>,
    log: Option<String>,
    log_format: Option<LogFormat>,
}

/// A configuration that was refused, naming the setting.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {path}: {reason}")]
    FileUnreadable { path: String, reason: String },
    /// The configuration file is not valid TOML or has an unknown key.
    #[error("configuration file {path} is invalid: {reason}")]
    FileInvalid { path: String, reason: String },
    /// A setting is out of its range.
    #[error("setting {setting}: {reason}")]
    Invalid {
        setting: &'static str,
        reason: String,
    },
    /// Members are listed but this node's id is not given.
    #[error("peers are configured but node_id is not: a member needs its own id")]
    PeersWithoutNodeId,
    /// A node id is given without the members: neither a cluster nor a node alone.
    #[error(
        "node_id is set but peers is not: a cluster needs its member list (without both, the \
         node runs alone)"
    )]
    NodeIdWithoutPeers,
    /// A node id outside `1..=65535`.
    #[error("node id {value} is out of range 1..=65535")]
    NodeIdOutOfRange { value: u64 },
    /// A `peers` entry that is not `ID=HOST:PORT`.
    #[error("peers entry {entry:?}: {reason}")]
    PeerMalformed { entry: String, reason: String },
    /// One node id listed twice.
    #[error("node {node} is listed twice in peers")]
    DuplicateMember { node: u16 },
    /// Two members listed at one address.
    #[error("nodes {first} and {second} are both listed at {address}")]
    DuplicateAddress {
        first: u16,
        second: u16,
        address: String,
    },
    /// Fewer members than a message has copies.
    #[error("a cluster needs at least {REPLICAS} members, peers lists {members} (with this node)")]
    TooFewMembers { members: usize },
    /// More members than the cluster supports.
    #[error(
        "a cluster has at most {max} members, peers lists {members} (with this node)",
        max = limits::cluster_members_max
    )]
    TooManyMembers { members: usize },
    /// A cluster without a shared receipt-handle key: a handle issued by one member would not
    /// work on another.
    #[error(
        "a cluster refuses to start without a shared handle key: set cluster_secret (or \
         handle_key) to the same value on every member"
    )]
    NoHandleKey,
    /// A cluster with neither peer TLS nor explicit plaintext.
    #[error(
        "a cluster refuses to start without peer security: set peer_tls_ca, peer_tls_cert and \
         peer_tls_key (`trireme-node certs --out DIR` makes a CA and every member's certificate), \
         or peer_plaintext to let anyone who reaches the peer port act as a member (development \
         only)"
    )]
    NoPeerSecurity,
    /// Some of the peer TLS files are given, not all three.
    #[error("peer TLS needs peer_tls_ca, peer_tls_cert and peer_tls_key; {missing} is not set")]
    PeerTlsIncomplete { missing: &'static str },
    /// Peer TLS and plaintext both asked for.
    #[error("peer_plaintext contradicts the peer_tls_* settings: choose one")]
    PeerTlsAndPlaintext,
    /// Peer security is set for a node that runs alone.
    #[error("{setting} is set but peers is not: only a cluster member has peers to secure")]
    PeerSecurityWithoutPeers { setting: &'static str },
    /// This node's own `peers` entry is not where its peer service listens.
    #[error("peers lists this node ({node}) at {listed}, but peer_listen is {peer_listen}")]
    OwnAddressMismatch {
        node: u16,
        listed: String,
        peer_listen: SocketAddr,
    },
}

/// What the binary is asked to do besides serving as one node.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs a three-node cluster on loopback for development: three `trireme-node` processes
    /// with their own data directories, one shared cluster secret, stopped together by Ctrl-C.
    DevCluster(DevClusterArgs),
    /// GETs an http:// URL (such as `http://127.0.0.1:9100/ready`) and exits 0 when it answers
    /// 200, 1 otherwise, printing the answer: a container's health check without a shell.
    Probe(ProbeArgs),
    /// Makes a cluster CA and a certificate for each member (mutual TLS on the peer port):
    /// `ca.pem`, `ca-key.pem`, `node-N.pem` and `node-N-key.pem` in the output directory.
    Certs(CertsArgs),
}

/// `trireme-node probe`'s settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL, `http://HOST:PORT/PATH`.
    #[arg(value_name = "URL")]
    pub url: String,

    /// Milliseconds to connect, and for each read and write.
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    pub timeout_ms: u64,
}

/// `trireme-node certs`'s settings.
#[derive(Clone, Debug, clap::Args)]
pub struct CertsArgs {
    /// Directory the CA and the members' files are written to (created if missing). A
    /// directory that already holds a CA is refused, unless `--keep-existing`.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Members to make certificates for: node 1 to N.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub nodes: u16,

    /// Another name or IP address member N's certificate is valid for, as `N=NAME` (repeated
    /// or comma-separated). Every certificate names `node-N.trireme` (the name its peers check
    /// against the id it claims), `nodeN` (compose service names), `localhost`, `127.0.0.1`
    /// and `::1`.
    #[arg(long = "host", value_name = "N=NAME", value_delimiter = ',')]
    pub hosts: Vec<String>,

    /// Days the CA and the certificates are valid from now.
    #[arg(long, value_name = "DAYS", default_value_t = 3650)]
    pub days: u32,

    /// Do nothing (and succeed) when the directory already holds a CA: for a one-shot step
    /// that runs on every start (docker-compose.yml's `certs` service).
    #[arg(long)]
    pub keep_existing: bool,
}

/// `trireme-node dev-cluster`'s settings. Node N (1 to 3) listens on the base ports + N − 1.
#[derive(Clone, Debug, clap::Args)]
pub struct DevClusterArgs {
    /// Root of the nodes' data directories (`node-1` to `node-3`) and of the cluster secret.
    #[arg(long, value_name = "DIR", default_value = DATA_DIR_DEFAULT)]
    pub data_dir: PathBuf,

    /// gRPC port of node 1 (nodes 2 and 3 take the next two).
    #[arg(long, value_name = "PORT", default_value_t = 7100)]
    pub grpc_port: u16,

    /// SQS port of node 1 (nodes 2 and 3 take the next two).
    #[arg(long, value_name = "PORT", default_value_t = 9324)]
    pub sqs_port: u16,

    /// Peer port of node 1 (nodes 2 and 3 take the next two).
    #[arg(long, value_name = "PORT", default_value_t = 7200)]
    pub peer_port: u16,

    /// Metrics port of node 1 (`/metrics`, `/health`, `/ready`; nodes 2 and 3 take the next
    /// two).
    #[arg(long, value_name = "PORT", default_value_t = 9100)]
    pub metrics_port: u16,

    /// Log filter of the three nodes, in `tracing` syntax.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log: String,

    /// Run the peers in plaintext instead of mutual TLS with the certificates under
    /// `DIR/certs` (made on the first start).
    #[arg(long)]
    pub peer_plaintext: bool,
}

/// The finished configuration of one node.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the database lives.
    pub data_dir: PathBuf,
    /// The gRPC listen address (the caller binds it; tests pass their own listener).
    pub listen: SocketAddr,
    /// The SQS endpoint's listen address and settings; `None` when it is turned off.
    pub sqs: Option<SqsConfig>,
    /// Where `/metrics`, `/health` and `/ready` listen (the caller binds it); `None` when they
    /// are turned off.
    pub metrics_listen: Option<SocketAddr>,
    /// Whether the metrics listener also serves the web console (`/console`).
    pub console: bool,
    /// The bearer tokens the gRPC API requires (read when the node starts); `None`: none.
    pub api_token_file: Option<PathBuf>,
    /// The receipt-handle key given by the operator or derived from the cluster secret; `None`
    /// (only for a node alone) means the database's own key.
    pub handle_key: Option<Vec<u8>>,
    /// The cluster this node is a member of; `None`: it runs alone.
    pub cluster: Option<ClusterConfig>,
    /// Seed of the node's random source; `None` seeds from the operating system.
    pub seed: Option<u64>,
    /// redb page cache in bytes.
    pub db_cache_bytes: usize,
    /// Largest gRPC request decoded.
    pub grpc_request_bytes_max: usize,
    /// Largest gRPC response encoded.
    pub grpc_response_bytes_max: usize,
    /// Seconds before an unfinished request is cancelled.
    pub request_timeout_s: u64,
    /// Open long polls allowed at once.
    pub long_polls_max: usize,
    /// Client connections the gRPC port serves at once.
    pub grpc_connections_max: usize,
    /// Client connections the SQS port serves at once.
    pub sqs_connections_max: usize,
    /// Commands per group commit.
    pub commit_batch_commands_max: usize,
    /// Commands queued for the engine.
    pub engine_queue_commands_max: usize,
    /// Seconds shutdown waits for open requests.
    pub shutdown_grace_s: u64,
    /// Log filter.
    pub log: String,
    /// Log format.
    pub log_format: LogFormat,
}

/// The SQS-compatible endpoint's settings.
#[derive(Clone, Debug)]
pub struct SqsConfig {
    /// The listen address (the caller binds it).
    pub listen: SocketAddr,
    /// Host name in queue URLs.
    pub advertised_host: String,
    /// Port in queue URLs; `None`: the bound port.
    pub advertised_port: Option<u16>,
    /// Region in queue ARNs.
    pub region: String,
    /// Account id in queue URLs and ARNs.
    pub account_id: String,
    /// Accepted SigV4 keys, each with the queue name prefixes it is limited to; empty: no
    /// authentication.
    pub access_keys: Vec<crate::sqs::AccessKey>,
}

/// How this node takes part in a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This member.
    pub node: NodeId,
    /// The internal replica service's listen address (the caller binds it).
    pub peer_listen: SocketAddr,
    /// Every other member and the `host:port` of its peer service (a host name is resolved
    /// when the link connects).
    pub peers: BTreeMap<NodeId, String>,
    /// How long an operation waits for its quorum.
    pub operation_timeout_ms: u64,
    /// Between two anti-entropy passes.
    pub anti_entropy_period_s: u64,
    /// Between two collection rounds.
    pub collection_period_s: u64,
    /// Rows one collection round walks at most.
    pub collection_rows_per_round_max: usize,
    /// A move task's lease (`TASK_LEASE`, spec/replication.md §8): the page's 30 s; tests
    /// shorten it so a takeover comes within seconds.
    pub move_task_lease_ms: u64,
    /// How the peer port is secured.
    pub peer_security: PeerSecurity,
}

/// How members speak to each other on the peer port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerSecurity {
    /// Mutual TLS against the cluster CA (`cluster::tls`).
    Tls(PeerTlsFiles),
    /// Plaintext, unauthenticated: asked for explicitly, for development only.
    Plaintext,
}

/// The PEM files of a member's peer TLS (read when the node starts, not here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// The cluster CA's certificate: the only issuer of peers' certificates it accepts.
    pub ca: PathBuf,
    /// This member's certificate chain, for `node-N.trireme`.
    pub cert: PathBuf,
    /// This member's private key.
    pub key: PathBuf,
}

impl ClusterConfig {
    /// Members of the cluster, this node included.
    #[must_use]
    pub fn members(&self) -> usize {
        self.peers.len() + 1
    }
}

/// The cluster's settings as given, before they are checked.
struct ClusterInput {
    node_id: Option<u64>,
    peer_listen: Option<SocketAddr>,
    peers: Vec<String>,
    operation_timeout_ms: Option<u64>,
    anti_entropy_period_s: Option<u64>,
    collection_period_s: Option<u64>,
    collection_rows_per_round_max: Option<usize>,
    peer_tls_ca: Option<PathBuf>,
    peer_tls_cert: Option<PathBuf>,
    peer_tls_key: Option<PathBuf>,
    peer_plaintext: bool,
}

impl Config {
    /// The defaults, with the database in `data_dir`. Used by tests and embedders.
    #[must_use]
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Config {
        Config::resolve(Args::default(), FileConfig::default())
            .map(|mut config| {
                config.data_dir = data_dir.into();
                config
            })
            .expect("the defaults are valid")
    }

    /// Reads the file named by `args.config` (if any) and merges it under the flags.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file or the setting that is wrong.
    pub fn load(args: Args) -> Result<Config, ConfigError> {
        let file = match &args.config {
            None => FileConfig::default(),
            Some(path) => read_file(path)?,
        };
        Config::resolve(args, file)
    }

    fn resolve(args: Args, file: FileConfig) -> Result<Config, ConfigError> {
        let mut handle_key = args.handle_key.or(file.handle_key).map(String::into_bytes);
        at_least_bytes("handle_key", handle_key.as_deref())?;
        let cluster_secret = args.cluster_secret.or(file.cluster_secret);
        at_least_bytes(
            "cluster_secret",
            cluster_secret.as_deref().map(str::as_bytes),
        )?;
        let cluster = resolve_cluster(ClusterInput {
            node_id: args.node_id.or(file.node_id),
            peer_listen: args.peer_listen.or(file.peer_listen),
            peers: if args.peers.is_empty() {
                file.peers.unwrap_or_default()
            } else {
                args.peers
            },
            operation_timeout_ms: args.operation_timeout_ms.or(file.operation_timeout_ms),
            anti_entropy_period_s: args.anti_entropy_period_s.or(file.anti_entropy_period_s),
            collection_period_s: args.collection_period_s.or(file.collection_period_s),
            collection_rows_per_round_max: args
                .collection_rows_per_round_max
                .or(file.collection_rows_per_round_max),
            peer_tls_ca: args.peer_tls_ca.or(file.peer_tls_ca),
            peer_tls_cert: args.peer_tls_cert.or(file.peer_tls_cert),
            peer_tls_key: args.peer_tls_key.or(file.peer_tls_key),
            peer_plaintext: args.peer_plaintext || file.peer_plaintext.unwrap_or(false),
        })?;
        if cluster.is_some() && handle_key.is_none() {
            // Every member must authenticate every member's receipt handles
            // (spec/replication.md: any node coordinates any request).
            let secret = cluster_secret.ok_or(ConfigError::NoHandleKey)?;
            handle_key = Some(derive_handle_key(secret.as_bytes()));
        }
        let no_sqs = args.no_sqs || file.no_sqs.unwrap_or(false);
        let sqs = if no_sqs {
            None
        } else {
            let keys = if args.sqs_access_keys.is_empty() {
                file.sqs_access_keys.unwrap_or_default()
            } else {
                args.sqs_access_keys
            };
            let access_keys = keys
                .iter()
                .map(|text| access_key(text))
                .collect::<Result<Vec<_>, _>>()?;
            Some(SqsConfig {
                listen: args.sqs_listen.or(file.sqs_listen).unwrap_or_else(|| {
                    SQS_LISTEN_DEFAULT.parse().expect("a valid literal address")
                }),
                advertised_host: args
                    .sqs_advertised_host
                    .or(file.sqs_advertised_host)
                    .unwrap_or_else(|| SQS_ADVERTISED_HOST_DEFAULT.to_owned()),
                advertised_port: args.sqs_advertised_port.or(file.sqs_advertised_port),
                region: {
                    let region = args
                        .sqs_region
                        .or(file.sqs_region)
                        .unwrap_or_else(|| SQS_REGION_DEFAULT.to_owned());
                    // A queue name scopes other regions' queues by region name, with the
                    // core's alphabet for regions; the node's own must be one as well.
                    if !trireme_core::region_is_legal(&region) {
                        return Err(ConfigError::Invalid {
                            setting: "sqs_region",
                            reason: format!(
                                "{region:?} is not a region name (1–32 of a-z, 0-9 and '-')"
                            ),
                        });
                    }
                    region
                },
                account_id: args
                    .sqs_account_id
                    .or(file.sqs_account_id)
                    .unwrap_or_else(|| SQS_ACCOUNT_ID_DEFAULT.to_owned()),
                access_keys,
            })
        };
        let no_metrics = args.no_metrics || file.no_metrics.unwrap_or(false);
        let metrics_listen = (!no_metrics).then(|| {
            args.metrics_listen
                .or(file.metrics_listen)
                .unwrap_or_else(|| {
                    METRICS_LISTEN_DEFAULT
                        .parse()
                        .expect("a valid literal address")
                })
        });
        let config = Config {
            sqs,
            metrics_listen,
            console: !(args.no_console || file.no_console.unwrap_or(false)),
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from(DATA_DIR_DEFAULT)),
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| LISTEN_DEFAULT.parse().expect("a valid literal address")),
            api_token_file: args.api_token_file.or(file.api_token_file),
            handle_key,
            cluster,
            seed: args.seed.or(file.seed),
            db_cache_bytes: args
                .db_cache_mib
                .or(file.db_cache_mib)
                .unwrap_or(limits::db_cache_mib_default)
                .saturating_mul(1024 * 1024),
            grpc_request_bytes_max: args
                .grpc_request_bytes_max
                .or(file.grpc_request_bytes_max)
                .unwrap_or(limits::grpc_request_bytes_max_default),
            grpc_response_bytes_max: args
                .grpc_response_bytes_max
                .or(file.grpc_response_bytes_max)
                .unwrap_or(limits::grpc_response_bytes_max_default),
            request_timeout_s: args
                .request_timeout_s
                .or(file.request_timeout_s)
                .unwrap_or(limits::request_timeout_s_default),
            long_polls_max: args
                .long_polls_max
                .or(file.long_polls_max)
                .unwrap_or(limits::long_polls_max_default),
            grpc_connections_max: args
                .grpc_connections_max
                .or(file.grpc_connections_max)
                .unwrap_or(limits::grpc_connections_max_default),
            sqs_connections_max: args
                .sqs_connections_max
                .or(file.sqs_connections_max)
                .unwrap_or(limits::sqs_connections_max_default),
            commit_batch_commands_max: args
                .commit_batch_commands_max
                .or(file.commit_batch_commands_max)
                .unwrap_or(limits::commit_batch_commands_max_default),
            engine_queue_commands_max: args
                .engine_queue_commands_max
                .or(file.engine_queue_commands_max)
                .unwrap_or(limits::engine_queue_commands_max_default),
            shutdown_grace_s: args
                .shutdown_grace_s
                .or(file.shutdown_grace_s)
                .unwrap_or(limits::shutdown_grace_s_default),
            log: args.log.or(file.log).unwrap_or_else(|| "info".to_owned()),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let at_least = |setting: &'static str, value: u64, min: u64| {
            if value < min {
                Err(ConfigError::Invalid {
                    setting,
                    reason: format!("is {value}, at least {min} is required"),
                })
            } else {
                Ok(())
            }
        };
        let wait_s_max = u64::from(trireme_core::limits::wait_s_max);
        at_least("request_timeout_s", self.request_timeout_s, wait_s_max + 5)?;
        at_least("db_cache_mib", self.db_cache_bytes as u64, 1024 * 1024)?;
        // A request must fit a full send batch; a response a full receive.
        at_least(
            "grpc_request_bytes_max",
            self.grpc_request_bytes_max as u64,
            limits::batch_payload_bytes_max + 64 * 1024,
        )?;
        at_least(
            "grpc_response_bytes_max",
            self.grpc_response_bytes_max as u64,
            u64::from(trireme_core::limits::batch_entries_max)
                * u64::from(trireme_core::limits::message_bytes_max)
                + 256 * 1024,
        )?;
        at_least("long_polls_max", self.long_polls_max as u64, 1)?;
        for (setting, value) in [
            ("grpc_connections_max", self.grpc_connections_max),
            ("sqs_connections_max", self.sqs_connections_max),
        ] {
            if !(1..=limits::connections_max_ceiling).contains(&value) {
                return Err(ConfigError::Invalid {
                    setting,
                    reason: format!(
                        "is {value}, it must be 1 to {} (connections served at once)",
                        limits::connections_max_ceiling
                    ),
                });
            }
        }
        if let Some(cluster) = &self.cluster {
            at_least("operation_timeout_ms", cluster.operation_timeout_ms, 10)?;
            if cluster.operation_timeout_ms > limits::operation_timeout_ms_max {
                return Err(ConfigError::Invalid {
                    setting: "operation_timeout_ms",
                    reason: format!(
                        "is {}, at most {} is accepted (the tombstone horizon must exceed it)",
                        cluster.operation_timeout_ms,
                        limits::operation_timeout_ms_max
                    ),
                });
            }
            // An operation answers (unavailable at worst) before its request is cancelled.
            let request_timeout_ms = self.request_timeout_s.saturating_mul(1_000);
            if cluster.operation_timeout_ms >= request_timeout_ms {
                return Err(ConfigError::Invalid {
                    setting: "operation_timeout_ms",
                    reason: format!(
                        "is {}, it must be below request_timeout_s ({request_timeout_ms} ms)",
                        cluster.operation_timeout_ms
                    ),
                });
            }
            at_least("anti_entropy_period_s", cluster.anti_entropy_period_s, 1)?;
            at_least("collection_period_s", cluster.collection_period_s, 1)?;
            at_least(
                "collection_rows_per_round_max",
                cluster.collection_rows_per_round_max as u64,
                1,
            )?;
        }
        at_least(
            "commit_batch_commands_max",
            self.commit_batch_commands_max as u64,
            1,
        )?;
        at_least(
            "engine_queue_commands_max",
            self.engine_queue_commands_max as u64,
            self.commit_batch_commands_max as u64,
        )?;
        Ok(())
    }
}

/// Refuses a key or secret shorter than a receipt-handle key may be.
fn at_least_bytes(setting: &'static str, value: Option<&[u8]>) -> Result<(), ConfigError> {
    match value {
        Some(value) if value.len() < HANDLE_KEY_BYTES_MIN => Err(ConfigError::Invalid {
            setting,
            reason: format!(
                "is {} bytes, at least {HANDLE_KEY_BYTES_MIN} are required",
                value.len()
            ),
        }),
        _ => Ok(()),
    }
}

/// The receipt-handle key of a cluster with `secret`: HMAC-SHA256 keyed by the secret over a
/// fixed label, so every member derives the same 32 bytes and the secret itself never keys a
/// handle (it can key other things later under other labels).
#[must_use]
pub fn derive_handle_key(secret: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(HANDLE_KEY_LABEL);
    mac.finalize().into_bytes().to_vec()
}

/// The cluster from its settings: `None` without `peers`; otherwise every member once, at
/// least three of them, this node among them (listed at its own peer address, or not listed).
fn resolve_cluster(input: ClusterInput) -> Result<Option<ClusterConfig>, ConfigError> {
    if input.peers.is_empty() {
        let security = [
            ("peer_tls_ca", input.peer_tls_ca.is_some()),
            ("peer_tls_cert", input.peer_tls_cert.is_some()),
            ("peer_tls_key", input.peer_tls_key.is_some()),
            ("peer_plaintext", input.peer_plaintext),
        ];
        if let Some((setting, _)) = security.iter().find(|(_, set)| *set) {
            return Err(ConfigError::PeerSecurityWithoutPeers { setting });
        }
        return match input.node_id {
            Some(_) => Err(ConfigError::NodeIdWithoutPeers),
            None => Ok(None),
        };
    }
    let node = node_id(input.node_id.ok_or(ConfigError::PeersWithoutNodeId)?)?;
    let peer_listen = input.peer_listen.unwrap_or_else(|| {
        PEER_LISTEN_DEFAULT
            .parse()
            .expect("a valid literal address")
    });
    let mut peers: BTreeMap<NodeId, String> = BTreeMap::new();
    let mut listed_self = false;
    for entry in &input.peers {
        let (member, address) = parse_member(entry)?;
        if peers.contains_key(&member) || (member == node && listed_self) {
            return Err(ConfigError::DuplicateMember { node: member.0 });
        }
        if let Some((other, _)) = peers.iter().find(|(_, listed)| **listed == address) {
            return Err(ConfigError::DuplicateAddress {
                first: other.0,
                second: member.0,
                address,
            });
        }
        if member == node {
            if !listens_at(&address, peer_listen) {
                return Err(ConfigError::OwnAddressMismatch {
                    node: node.0,
                    listed: address,
                    peer_listen,
                });
            }
            listed_self = true;
        } else {
            peers.insert(member, address);
        }
    }
    let members = peers.len() + 1;
    if members < REPLICAS {
        return Err(ConfigError::TooFewMembers { members });
    }
    if members > limits::cluster_members_max {
        return Err(ConfigError::TooManyMembers { members });
    }
    let peer_security = peer_security(
        input.peer_tls_ca,
        input.peer_tls_cert,
        input.peer_tls_key,
        input.peer_plaintext,
    )?;
    let anti_entropy = AntiEntropySettings::default();
    let collection = CollectionSettings::default();
    Ok(Some(ClusterConfig {
        node,
        peer_listen,
        peers,
        operation_timeout_ms: input
            .operation_timeout_ms
            .unwrap_or(limits::operation_timeout_ms_default),
        anti_entropy_period_s: input
            .anti_entropy_period_s
            .unwrap_or(anti_entropy.period.as_secs()),
        collection_period_s: input
            .collection_period_s
            .unwrap_or(collection.period.as_secs()),
        collection_rows_per_round_max: input
            .collection_rows_per_round_max
            .unwrap_or(collection.rows_per_round_max),
        move_task_lease_ms: MoveTaskSettings::default().lease_ms,
        peer_security,
    }))
}

/// The peer port's security from its settings: all three TLS files, or plaintext asked for by
/// name; a cluster with neither does not start (a member reachable by anyone would take any
/// caller for a member: membership is by the node id a request claims).
fn peer_security(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    plaintext: bool,
) -> Result<PeerSecurity, ConfigError> {
    match (ca, cert, key, plaintext) {
        (None, None, None, false) => Err(ConfigError::NoPeerSecurity),
        (None, None, None, true) => Ok(PeerSecurity::Plaintext),
        (_, _, _, true) => Err(ConfigError::PeerTlsAndPlaintext),
        (Some(ca), Some(cert), Some(key), false) => {
            Ok(PeerSecurity::Tls(PeerTlsFiles { ca, cert, key }))
        }
        (ca, cert, _, false) => Err(ConfigError::PeerTlsIncomplete {
            missing: if ca.is_none() {
                "peer_tls_ca"
            } else if cert.is_none() {
                "peer_tls_cert"
            } else {
                "peer_tls_key"
            },
        }),
    }
}

/// A node id in `1..=65535` (0 is no member: a missing protobuf field reads as 0).
fn node_id(value: u64) -> Result<NodeId, ConfigError> {
    u16::try_from(value)
        .ok()
        .filter(|id| *id != 0)
        .map(NodeId)
        .ok_or(ConfigError::NodeIdOutOfRange { value })
}

/// One `peers` entry, `ID=HOST:PORT`, as the member and its address (`HOST:PORT`). The host
/// is a name, an IPv4 address or a bracketed IPv6 address; it is not resolved here.
fn parse_member(entry: &str) -> Result<(NodeId, String), ConfigError> {
    let malformed = |reason: &str| ConfigError::PeerMalformed {
        entry: entry.to_owned(),
        reason: reason.to_owned(),
    };
    let (id, address) = entry
        .trim()
        .split_once('=')
        .ok_or_else(|| malformed("expected ID=HOST:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| malformed("the node id is not a number"))?;
    let node = node_id(id)?;
    let address = address.trim();
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| malformed("expected HOST:PORT after the ="))?;
    match port.parse::<u16>() {
        Ok(port) if port != 0 => {}
        _ => return Err(malformed("the port is not a number in 1..=65535")),
    }
    let bracketed = host.len() > 2 && host.starts_with('[') && host.ends_with(']');
    if bracketed {
        host[1..host.len() - 1]
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| malformed("the bracketed host is not an IPv6 address"))?;
    } else if host.is_empty() {
        return Err(malformed("the host is empty"));
    } else if host.contains(':') {
        return Err(malformed("an IPv6 host goes in brackets, as [::1]:7200"));
    } else if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return Err(malformed("the host is not a host name or an IP address"));
    }
    Ok((node, address.to_owned()))
}

/// Whether a member listed at `address` (`HOST:PORT`, checked by [`parse_member`]) is the
/// peer service listening on `listen`: the same port, and the same IP unless `listen` is a
/// wildcard. A host name matches on its port alone: it is resolved only when peers connect.
fn listens_at(address: &str, listen: SocketAddr) -> bool {
    let (host, port) = address
        .rsplit_once(':')
        .expect("a checked address has a port");
    if port.parse::<u16>().ok() != Some(listen.port()) {
        return false;
    }
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(ip) => listen.ip().is_unspecified() || ip == listen.ip(),
        Err(_) => true,
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::FileUnreadable {
        path: path.display().to_string(),
        reason: error.to_string(),
    })?;
    toml::from_str(&text).map_err(|error| ConfigError::FileInvalid {
        path: path.display().to_string(),
        reason: error.to_string(),
    })
}

/// One `sqs_access_keys` entry: `ID:SECRET` or `ID:SECRET:PREFIX/PREFIX/...` (AWS secrets hold
/// no `:`; queue names hold no `/`).
fn access_key(text: &str) -> Result<crate::sqs::AccessKey, ConfigError> {
    let invalid = |reason: &str| ConfigError::Invalid {
        setting: "sqs_access_keys",
        reason: reason.to_owned(),
    };
    let mut parts = text.splitn(3, ':');
    let (id, secret) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if id.is_empty() || secret.is_empty() {
        return Err(invalid(
            "each key must be ID:SECRET or ID:SECRET:PREFIXES with ID and SECRET non-empty",
        ));
    }
    let queue_prefixes = match parts.next() {
        None => Vec::new(),
        Some(prefixes) => {
            let prefixes: Vec<String> = prefixes.split('/').map(str::to_owned).collect();
            if prefixes.iter().any(String::is_empty) {
                return Err(invalid(
                    "a key's queue prefixes are non-empty and separated by `/` (ID:SECRET:orders-/billing-)",
                ));
            }
            prefixes
        }
    };
    Ok(crate::sqs::AccessKey {
        id: id.to_owned(),
        secret: secret.to_owned(),
        queue_prefixes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Args {
        let mut argv = vec!["trireme-node"];
        argv.extend_from_slice(flags);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn defaults_listen_on_7100_with_a_local_data_dir() {
        let config = Config::resolve(Args::default(), FileConfig::default()).unwrap();
        assert_eq!(config.listen.port(), 7100);
        assert_eq!(config.data_dir, PathBuf::from(DATA_DIR_DEFAULT));
        assert_eq!(config.handle_key, None);
        assert_eq!(config.db_cache_bytes, 64 * 1024 * 1024);
        let sqs = config.sqs.unwrap();
        assert_eq!(sqs.listen.port(), 9324);
        assert!(sqs.access_keys.is_empty());
    }

    #[test]
    fn metrics_listen_on_loopback_9100_by_default_from_flag_file_or_off() {
        let config = Config::resolve(Args::default(), FileConfig::default()).unwrap();
        assert_eq!(
            config.metrics_listen,
            Some("127.0.0.1:9100".parse().unwrap())
        );
        let flagged = Config::load(parse(&["--metrics-listen", "0.0.0.0:9200"])).unwrap();
        assert_eq!(
            flagged.metrics_listen,
            Some("0.0.0.0:9200".parse().unwrap())
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "metrics_listen = \"127.0.0.1:9300\"\n").unwrap();
        let filed = Config::load(parse(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(
            filed.metrics_listen,
            Some("127.0.0.1:9300".parse().unwrap())
        );
        let off = Config::load(parse(&["--no-metrics"])).unwrap();
        assert_eq!(off.metrics_listen, None);
    }

    #[test]
    fn sqs_access_keys_split_on_comma_and_colon_and_no_sqs_turns_it_off() {
        let config = Config::load(parse(&[
            "--sqs-access-key",
            "AKID:secret,other:s2:orders-/billing-",
        ]))
        .unwrap();
        let key = |id: &str, secret: &str, prefixes: &[&str]| crate::sqs::AccessKey {
            id: id.to_owned(),
            secret: secret.to_owned(),
            queue_prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
        };
        assert_eq!(
            config.sqs.unwrap().access_keys,
            vec![
                key("AKID", "secret", &[]),
                key("other", "s2", &["orders-", "billing-"])
            ]
        );
        for bad in ["no-secret", "AKID:secret:", "AKID:secret:orders-//billing-"] {
            let error = Config::load(parse(&["--sqs-access-key", bad])).unwrap_err();
            assert!(
                matches!(
                    error,
                    ConfigError::Invalid {
                        setting: "sqs_access_keys",
                        ..
                    }
                ),
                "{bad}"
            );
        }
        let error = Config::load(parse(&["--sqs-access-key", "no-secret"])).unwrap_err();
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "sqs_access_keys",
                ..
            }
        ));
        assert!(Config::load(parse(&["--no-sqs"])).unwrap().sqs.is_none());
    }

    #[test]
    fn the_sqs_region_must_be_a_region_name() {
        let config = Config::load(parse(&["--sqs-region", "eu-west-1"])).unwrap();
        assert_eq!(config.sqs.unwrap().region, "eu-west-1");
        for bad in ["EU-WEST-1", "eu_west_1", "", "eu@west"] {
            let error = Config::load(parse(&["--sqs-region", bad])).unwrap_err();
            assert!(
                matches!(
                    error,
                    ConfigError::Invalid {
                        setting: "sqs_region",
                        ..
                    }
                ),
                "{bad:?}: {error:?}"
            );
        }
    }

    #[test]
    fn flag_beats_file_and_file_beats_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "data_dir = \"/from/file\"\nlisten = \"127.0.0.1:9000\"\nlong_polls_max = 5\n",
        )
        .unwrap();
        let args = parse(&[
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7200",
        ]);
        let config = Config::load(args).unwrap();
        assert_eq!(config.listen, "127.0.0.1:7200".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("/from/file"));
        assert_eq!(config.long_polls_max, 5);
        assert_eq!(
            config.commit_batch_commands_max,
            limits::commit_batch_commands_max_default
        );
    }

    #[test]
    fn connection_caps_are_set_by_flag_variable_or_file_and_bad_ones_refused() {
        let defaults = Config::load(parse(&[])).unwrap();
        assert_eq!(
            (defaults.grpc_connections_max, defaults.sqs_connections_max),
            (4_096, 4_096)
        );
        let flags = Config::load(parse(&[
            "--grpc-connections-max",
            "2",
            "--sqs-connections-max",
            "65536",
        ]))
        .unwrap();
        assert_eq!(
            (flags.grpc_connections_max, flags.sqs_connections_max),
            (2, 65_536)
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "grpc_connections_max = 7\nsqs_connections_max = 9\n").unwrap();
        let file = Config::load(parse(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(
            (file.grpc_connections_max, file.sqs_connections_max),
            (7, 9)
        );
        for (flag, setting) in [
            ("--grpc-connections-max", "grpc_connections_max"),
            ("--sqs-connections-max", "sqs_connections_max"),
        ] {
            for bad in ["0", "65537", "18446744073709551615"] {
                let error = Config::load(parse(&[flag, bad])).unwrap_err();
                assert!(
                    matches!(error, ConfigError::Invalid { setting: s, .. } if s == setting),
                    "{flag} {bad}: {error:?}"
                );
                assert!(error.to_string().contains("1 to 65536"), "{error}");
            }
            // Not a number at all: clap refuses it before the node starts.
            assert!(Args::try_parse_from(["trireme-node", flag, "many"]).is_err());
        }
    }

    #[test]
    fn unknown_file_key_is_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "listen_port = 7100\n").unwrap();
        let error = Config::load(parse(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(matches!(error, ConfigError::FileInvalid { .. }), "{error}");
        assert!(error.to_string().contains("listen_port"), "{error}");
    }

    #[test]
    fn short_handle_key_and_short_request_timeout_are_refused() {
        let error = Config::load(parse(&["--handle-key", "short"])).unwrap_err();
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "handle_key",
                ..
            }
        ));
        let error = Config::load(parse(&["--request-timeout-s", "20"])).unwrap_err();
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "request_timeout_s",
                ..
            }
        ));
    }

    const SECRET: &str = "a shared secret of the cluster";

    fn cluster_flags(extra: &[&str]) -> Args {
        let mut flags = vec![
            "--node-id",
            "2",
            "--peer-listen",
            "127.0.0.1:7201",
            "--peers",
            "1=127.0.0.1:7200,2=127.0.0.1:7201,3=node3.example:7202",
            "--cluster-secret",
            SECRET,
            "--peer-plaintext",
        ];
        flags.extend_from_slice(extra);
        parse(&flags)
    }

    #[test]
    fn without_peers_the_node_runs_alone() {
        let config = Config::load(parse(&[])).unwrap();
        assert!(config.cluster.is_none());
        assert_eq!(config.handle_key, None);
    }

    #[test]
    fn peers_with_own_entry_name_the_other_members_and_derive_the_handle_key() {
        let config = Config::load(cluster_flags(&[])).unwrap();
        let cluster = config.cluster.unwrap();
        assert_eq!(cluster.node, NodeId(2));
        assert_eq!(cluster.members(), 3);
        assert_eq!(
            cluster.peers,
            BTreeMap::from([
                (NodeId(1), "127.0.0.1:7200".to_owned()),
                (NodeId(3), "node3.example:7202".to_owned()),
            ])
        );
        assert_eq!(
            cluster.anti_entropy_period_s,
            AntiEntropySettings::default().period.as_secs()
        );
        assert_eq!(
            cluster.operation_timeout_ms,
            limits::operation_timeout_ms_default
        );
        let key = config.handle_key.unwrap();
        assert_eq!(key, derive_handle_key(SECRET.as_bytes()));
        assert_eq!(key.len(), 32);
        assert_ne!(key, SECRET.as_bytes());
        assert_ne!(key, derive_handle_key(b"another secret of the cluster"));
    }

    #[test]
    fn peers_without_own_entry_are_the_same_cluster() {
        let args = parse(&[
            "--node-id",
            "2",
            "--peers",
            "1=127.0.0.1:7200",
            "--peers",
            "3=node3.example:7202",
            "--cluster-secret",
            SECRET,
            "--peer-plaintext",
        ]);
        let cluster = Config::load(args).unwrap().cluster.unwrap();
        assert_eq!(cluster.members(), 3);
        assert_eq!(cluster.peer_listen.port(), 7200);
        assert!(!cluster.peers.contains_key(&NodeId(2)));
    }

    #[test]
    fn a_given_handle_key_beats_the_cluster_secret() {
        let config = Config::load(cluster_flags(&["--handle-key", "0123456789abcdef"])).unwrap();
        assert_eq!(config.handle_key.unwrap(), b"0123456789abcdef");
    }

    #[test]
    fn a_cluster_without_a_handle_key_or_secret_is_refused() {
        let args = parse(&[
            "--node-id",
            "1",
            "--peers",
            "1=a:7200,2=b:7200,3=c:7200",
            "--peer-plaintext",
        ]);
        let error = Config::load(args).unwrap_err();
        assert!(matches!(error, ConfigError::NoHandleKey), "{error}");
        assert!(error.to_string().contains("shared handle key"), "{error}");
        let args = parse(&[
            "--node-id",
            "1",
            "--peers",
            "1=a:7200,2=b:7200,3=c:7200",
            "--handle-key",
            "0123456789abcdef",
            "--peer-plaintext",
        ]);
        assert!(Config::load(args).unwrap().cluster.is_some());
    }

    #[test]
    fn membership_mistakes_are_refused_each_with_its_own_error() {
        let load = |flags: &[&str]| {
            let mut all = vec!["--cluster-secret", SECRET];
            all.extend_from_slice(flags);
            Config::load(parse(&all)).unwrap_err()
        };
        let three = "1=a:7200,2=b:7200,3=c:7200";
        assert!(matches!(
            load(&["--peers", three]),
            ConfigError::PeersWithoutNodeId
        ));
        assert!(matches!(
            load(&["--node-id", "1"]),
            ConfigError::NodeIdWithoutPeers
        ));
        assert!(matches!(
            load(&["--node-id", "0", "--peers", three]),
            ConfigError::NodeIdOutOfRange { value: 0 }
        ));
        assert!(matches!(
            load(&["--node-id", "65536", "--peers", three]),
            ConfigError::NodeIdOutOfRange { value: 65536 }
        ));
        assert!(matches!(
            load(&[
                "--node-id",
                "1",
                "--peers",
                "1=a:7200,2=b:7200,70000=c:7200"
            ]),
            ConfigError::NodeIdOutOfRange { value: 70000 }
        ));
        assert!(matches!(
            load(&["--node-id", "1", "--peers", "1=a:7200,2=b:7200,2=c:7200"]),
            ConfigError::DuplicateMember { node: 2 }
        ));
        assert!(matches!(
            load(&[
                "--node-id",
                "1",
                "--peers",
                "1=a:7200,1=a:7200,2=b:7200,3=c:7200"
            ]),
            ConfigError::DuplicateMember { node: 1 }
        ));
        assert!(matches!(
            load(&["--node-id", "1", "--peers", "2=b:7200,3=b:7200,4=c:7200"]),
            ConfigError::DuplicateAddress {
                first: 2,
                second: 3,
                ..
            }
        ));
        assert!(matches!(
            load(&["--node-id", "1", "--peers", "1=a:7200,2=b:7200"]),
            ConfigError::TooFewMembers { members: 2 }
        ));
        assert!(matches!(
            load(&["--node-id", "1", "--peers", "2=b:7200"]),
            ConfigError::TooFewMembers { members: 2 }
        ));
        let many: Vec<String> = (1..=limits::cluster_members_max as u16 + 1)
            .map(|id| format!("{id}=n{id}:7200"))
            .collect();
        let many = many.join(",");
        assert!(matches!(
            load(&["--node-id", "1", "--peers", &many]),
            ConfigError::TooManyMembers { .. }
        ));
    }

    #[test]
    fn own_entry_must_be_where_the_peer_service_listens() {
        let load = |peer_listen: &str, own: &str| {
            let peers = format!("1={own},2=b:7200,3=c:7200");
            let args = parse(&[
                "--node-id",
                "1",
                "--peer-listen",
                peer_listen,
                "--peers",
                &peers,
                "--cluster-secret",
                SECRET,
                "--peer-plaintext",
            ]);
            Config::load(args)
        };
        assert!(load("0.0.0.0:7200", "10.0.0.1:7200").is_ok());
        assert!(load("10.0.0.1:7200", "10.0.0.1:7200").is_ok());
        assert!(load("0.0.0.0:7200", "node1:7200").is_ok());
        assert!(load("[::]:7200", "[::1]:7200").is_ok());
        for (peer_listen, own) in [
            ("0.0.0.0:7201", "10.0.0.1:7200"),
            ("10.0.0.2:7200", "10.0.0.1:7200"),
            ("0.0.0.0:7201", "node1:7200"),
        ] {
            let error = load(peer_listen, own).unwrap_err();
            assert!(
                matches!(error, ConfigError::OwnAddressMismatch { node: 1, .. }),
                "{peer_listen} {own}: {error}"
            );
        }
    }

    #[test]
    fn a_cluster_needs_peer_tls_or_explicit_plaintext() {
        let member = |extra: &[&str]| {
            let mut flags = vec![
                "--node-id",
                "1",
                "--peers",
                "1=a:7200,2=b:7200,3=c:7200",
                "--cluster-secret",
                SECRET,
            ];
            flags.extend_from_slice(extra);
            Config::load(parse(&flags))
        };
        let error = member(&[]).unwrap_err();
        assert!(matches!(error, ConfigError::NoPeerSecurity), "{error}");
        assert!(error.to_string().contains("trireme-node certs"), "{error}");
        let tls = [
            "--peer-tls-ca",
            "/certs/ca.pem",
            "--peer-tls-cert",
            "/certs/node-1.pem",
            "--peer-tls-key",
            "/certs/node-1-key.pem",
        ];
        assert_eq!(
            member(&tls).unwrap().cluster.unwrap().peer_security,
            PeerSecurity::Tls(PeerTlsFiles {
                ca: PathBuf::from("/certs/ca.pem"),
                cert: PathBuf::from("/certs/node-1.pem"),
                key: PathBuf::from("/certs/node-1-key.pem"),
            })
        );
        assert_eq!(
            member(&["--peer-plaintext"])
                .unwrap()
                .cluster
                .unwrap()
                .peer_security,
            PeerSecurity::Plaintext
        );
        let mut both = tls.to_vec();
        both.push("--peer-plaintext");
        assert!(matches!(
            member(&both).unwrap_err(),
            ConfigError::PeerTlsAndPlaintext
        ));
        for (left_out, missing) in [
            (0, "peer_tls_ca"),
            (2, "peer_tls_cert"),
            (4, "peer_tls_key"),
        ] {
            let mut partial = tls.to_vec();
            partial.drain(left_out..left_out + 2);
            let error = member(&partial).unwrap_err();
            assert!(
                matches!(error, ConfigError::PeerTlsIncomplete { missing: m } if m == missing),
                "{partial:?}: {error}"
            );
        }
        // A node alone has no peer port to secure.
        for alone in [&tls[..2], &["--peer-plaintext"][..]] {
            let error = Config::load(parse(alone)).unwrap_err();
            assert!(
                matches!(error, ConfigError::PeerSecurityWithoutPeers { .. }),
                "{alone:?}: {error}"
            );
        }
    }

    #[test]
    fn peer_tls_files_come_from_the_file_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "node_id = 2\npeers = [\"1=n1:7200\", \"2=n2:7200\", \"3=n3:7200\"]\n\
             cluster_secret = \"a shared secret of the cluster\"\n\
             peer_tls_ca = \"/c/ca.pem\"\npeer_tls_cert = \"/c/node-2.pem\"\n\
             peer_tls_key = \"/c/node-2-key.pem\"\n",
        )
        .unwrap();
        let config = Config::load(parse(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(
            config.cluster.unwrap().peer_security,
            PeerSecurity::Tls(PeerTlsFiles {
                ca: PathBuf::from("/c/ca.pem"),
                cert: PathBuf::from("/c/node-2.pem"),
                key: PathBuf::from("/c/node-2-key.pem"),
            })
        );
    }

    #[test]
    fn malformed_peer_entries_are_refused_with_the_entry() {
        for entry in [
            "1",
            "x=a:7200",
            "1=a",
            "1=a:0",
            "1=a:port",
            "1=:7200",
            "1=::1:7200",
            "1=[zz]:7200",
            "1=a/b:7200",
            "1=a b:7200",
        ] {
            let peers = format!("{entry},2=b:7200,3=c:7200");
            let args = parse(&[
                "--node-id",
                "2",
                "--peers",
                &peers,
                "--cluster-secret",
                SECRET,
            ]);
            let error = Config::load(args).unwrap_err();
            assert!(
                matches!(&error, ConfigError::PeerMalformed { entry: e, .. } if e == entry),
                "{entry}: {error}"
            );
        }
    }

    #[test]
    fn cluster_settings_come_from_the_file_and_are_range_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "node_id = 3\npeer_listen = \"0.0.0.0:7300\"\n\
             peers = [\"1=n1:7300\", \"2=n2:7300\", \"3=n3:7300\"]\n\
             cluster_secret = \"a shared secret of the cluster\"\n\
             peer_plaintext = true\n\
             operation_timeout_ms = 800\nanti_entropy_period_s = 5\n\
             collection_period_s = 7\ncollection_rows_per_round_max = 9\n",
        )
        .unwrap();
        let config = Config::load(parse(&["--config", path.to_str().unwrap()])).unwrap();
        let cluster = config.cluster.unwrap();
        assert_eq!(cluster.node, NodeId(3));
        assert_eq!(cluster.peer_listen.port(), 7300);
        assert_eq!(cluster.members(), 3);
        assert_eq!(
            (
                cluster.operation_timeout_ms,
                cluster.anti_entropy_period_s,
                cluster.collection_period_s,
                cluster.collection_rows_per_round_max
            ),
            (800, 5, 7, 9)
        );
        assert_eq!(
            config.handle_key.unwrap(),
            derive_handle_key(SECRET.as_bytes())
        );
        for (flag, value, setting) in [
            ("--operation-timeout-ms", "5", "operation_timeout_ms"),
            ("--operation-timeout-ms", "60000", "operation_timeout_ms"),
            ("--anti-entropy-period-s", "0", "anti_entropy_period_s"),
            ("--collection-period-s", "0", "collection_period_s"),
            (
                "--collection-rows-per-round-max",
                "0",
                "collection_rows_per_round_max",
            ),
        ] {
            let error = Config::load(cluster_flags(&[flag, value])).unwrap_err();
            assert!(
                matches!(error, ConfigError::Invalid { setting: s, .. } if s == setting),
                "{flag} {value}: {error}"
            );
        }
        let args = parse(&[
            "--node-id",
            "1",
            "--peers",
            "1=a:7200,2=b:7200,3=c:7200",
            "--cluster-secret",
            "short",
        ]);
        let error = Config::load(args).unwrap_err();
        assert!(
            matches!(
                error,
                ConfigError::Invalid {
                    setting: "cluster_secret",
                    ..
                }
            ),
            "{error}"
        );
    }
}
