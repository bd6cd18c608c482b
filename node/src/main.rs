//! The `trireme-node` binary: parses the configuration, sets up logging, opens the data
//! directory, binds the gRPC listener, prints where it listens, and runs the node until SIGTERM
//! or Ctrl-C, then shuts down gracefully.

use std::io::{IsTerminal, Write};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;
use trireme_node::clock::SystemClock;
use trireme_node::config::{Args, Config, LogFormat};

fn main() -> anyhow::Result<()> {
    let config = Config::load(Args::parse())?;
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("trireme-node")
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Watch SIGTERM before anything is printed: whoever reads the address may stop the node at
    // once, and an unwatched SIGTERM would kill it without a graceful shutdown.
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let storage = trireme_node::open_storage(&config)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr().context("listener has no address")?;
    let sqs_listener = match &config.sqs {
        Some(sqs) => Some(
            tokio::net::TcpListener::bind(sqs.listen)
                .await
                .with_context(|| format!("cannot listen on {} (SQS endpoint)", sqs.listen))?,
        ),
        None => None,
    };
    // Standard output says where the node listens: scripts and tests read the addresses here.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "trireme-node: gRPC listening on {address}")?;
    if let Some(sqs_listener) = &sqs_listener {
        let sqs_address = sqs_listener
            .local_addr()
            .context("listener has no address")?;
        writeln!(
            stdout,
            "trireme-node: SQS listening on http://{sqs_address}"
        )?;
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
    trireme_node::run(
        &config,
        storage,
        listener,
        sqs_listener,
        Arc::new(SystemClock),
        shutdown,
    )
    .await?;
    Ok(())
}
