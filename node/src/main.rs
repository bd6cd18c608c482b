//! The `trireme-node` binary: parses the configuration, sets up logging, opens the data
//! directory, binds the listeners (gRPC, SQS, and the peer service of a cluster member), starts
//! the node, prints where it listens, and runs it until SIGTERM or Ctrl-C, then shuts down
//! gracefully. `trireme-node dev-cluster` instead runs three nodes on loopback (`dev_cluster`);
//! `trireme-node certs` makes a cluster CA and the members' certificates (`trireme_node::certs`).

mod dev_cluster;

/// jemalloc instead of the system allocator (BENCHMARKS.md 6g): allocation was a fifth of a
/// member's CPU under load.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;
use trireme_node::Listeners;
use trireme_node::certs::Outcome;
use trireme_node::clock::SystemClock;
use trireme_node::config::{Args, CertsArgs, Command, Config, LogFormat};

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("trireme-node")
            .build()
            .context("cannot start the tokio runtime")
    };
    match args.command.take() {
        // The nodes log for themselves; this process only prints what it does.
        Some(Command::DevCluster(dev)) => return runtime()?.block_on(dev_cluster::run(dev)),
        Some(Command::Probe(probe)) => {
            let timeout = std::time::Duration::from_millis(probe.timeout_ms);
            let (status, body) = trireme_node::metrics::probe(&probe.url, timeout)?;
            print!("{body}");
            if status == 200 {
                return Ok(());
            }
            anyhow::bail!("{} answered {status}", probe.url);
        }
        Some(Command::Certs(certs)) => return make_certs(&certs),
        None => {}
    }
    dev_cluster::end_with_supervisor()?;
    let config = Config::load(args)?;
    let filter = EnvFilter::try_new(&config.log)
        .with_context(|| format!("invalid log filter {:?}", config.log))?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a person at a terminal, never into log files or pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => subscriber.init(),
        LogFormat::Json => subscriber.json().init(),
    }
    runtime()?.block_on(serve(config))
}

/// `trireme-node certs`: writes the CA and the members' certificates and says which files.
fn make_certs(args: &CertsArgs) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    match trireme_node::certs::make(args)? {
        Outcome::Kept => writeln!(
            stdout,
            "trireme-node certs: {} already holds a CA; nothing written",
            args.out.display()
        )?,
        Outcome::Made(files) => {
            for file in files {
                writeln!(stdout, "trireme-node certs: wrote {}", file.display())?;
            }
            writeln!(
                stdout,
                "trireme-node certs: give member N ca.pem, node-N.pem and node-N-key.pem \
                 (--peer-tls-ca, --peer-tls-cert, --peer-tls-key); keep ca-key.pem off the \
                 members"
            )?;
        }
    }
    Ok(())
}

async fn bind(address: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address} ({what})"))
}

fn local_address(listener: &tokio::net::TcpListener) -> anyhow::Result<SocketAddr> {
    listener.local_addr().context("listener has no address")
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Watch SIGTERM before anything is printed: whoever reads the address may stop the node at
    // once, and an unwatched SIGTERM would kill it without a graceful shutdown.
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let storage = trireme_node::open_storage(&config)?;
    let listeners = Listeners {
        grpc: bind(config.listen, "gRPC").await?,
        sqs: match &config.sqs {
            Some(sqs) => Some(bind(sqs.listen, "SQS endpoint").await?),
            None => None,
        },
        peers: match &config.cluster {
            Some(cluster) => Some(bind(cluster.peer_listen, "peer service").await?),
            None => None,
        },
        metrics: match config.metrics_listen {
            Some(listen) => Some(bind(listen, "metrics").await?),
            None => None,
        },
    };
    let address = local_address(&listeners.grpc)?;
    let sqs_address = listeners.sqs.as_ref().map(local_address).transpose()?;
    let peer_address = listeners.peers.as_ref().map(local_address).transpose()?;
    let metrics_address = listeners.metrics.as_ref().map(local_address).transpose()?;
    let node = trireme_node::launch(&config, storage, listeners, Arc::new(SystemClock))?;
    // Standard output says where the node listens, once it serves: scripts, tests and
    // `dev-cluster` read the addresses here.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "trireme-node: gRPC listening on {address}")?;
    if let Some(sqs_address) = sqs_address {
        writeln!(
            stdout,
            "trireme-node: SQS listening on http://{sqs_address}"
        )?;
    }
    if let Some(metrics_address) = metrics_address {
        writeln!(
            stdout,
            "trireme-node: metrics listening on http://{metrics_address}/metrics"
        )?;
    }
    if let (Some(peer_address), Some(cluster), Some(member)) =
        (peer_address, &config.cluster, node.cluster())
    {
        writeln!(
            stdout,
            "trireme-node: peers listening on {peer_address} (node {} of {}, disk {:016x})",
            cluster.node.0,
            cluster.members(),
            member.store().disk_id()
        )?;
    }
    // A member with a new replica database serves once it has joined (every peer answered
    // whether it replaces a disk; a replacement also waits out the horizon and rebuilds), so
    // the last line, which says the node serves, waits for that.
    if let Some(cluster) = node.cluster().cloned()
        && let Some(reason) = cluster.join_state().refusal()
    {
        writeln!(stdout, "trireme-node: joining: {reason}")?;
        stdout.flush()?;
        tokio::select! {
            () = cluster.joined() => {}
            _ = terminate.recv() => {
                tracing::info!("SIGTERM received while joining");
                return Ok(trireme_node::run(node, async {}).await?);
            }
            _ = interrupt.recv() => {
                tracing::info!("SIGINT received while joining");
                return Ok(trireme_node::run(node, async {}).await?);
            }
        }
    }
    writeln!(
        stdout,
        "trireme-node: data in {}",
        config.data_dir.display()
    )?;
    stdout.flush()?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
    };
    trireme_node::run(node, shutdown).await?;
    Ok(())
}
