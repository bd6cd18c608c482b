//! Measures send + receive + delete throughput of one in-process node with fsync on (every
//! acknowledged change is committed with redb `Durability::Immediate`).
//!
//! `cargo run --release -p trireme-node --example throughput -- --workers 32 --seconds 10`
//!
//! Each worker loops: send one message (or a batch), receive it (them) with no wait, delete
//! it (them). A cycle is one message sent, received and deleted. The figure printed is rough:
//! it depends on the disk's fsync latency and on how many workers share each group commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use tonic::transport::Channel;
use trireme_node::Node;
use trireme_node::clock::SystemClock;
use trireme_node::config::Config;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;

#[derive(Parser)]
struct Args {
    /// Concurrent workers, each with its own connection.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Messages per send/receive/delete call (1 = single calls, up to 10 = batch calls).
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Where the database goes (a real disk, not tmpfs, or fsync costs nothing).
    /// Default: a new directory under the system temp dir.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Body size in bytes.
    #[arg(long, default_value_t = 256)]
    body_bytes: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!((1..=10).contains(&args.batch), "--batch must be 1-10");
    let temp = tempfile::TempDir::new()?;
    let dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_owned());
    let config = Config::with_data_dir(&dir);
    let storage = trireme_node::open_storage(&config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let node = Node::start(
        &config,
        storage,
        trireme_node::tcp_incoming(listener),
        Arc::new(SystemClock),
    )?;
    let channel = |address| async move {
        Channel::from_shared(format!("http://{address}"))
            .expect("a valid uri")
            // tonic's default, set because it matters: without it each small request waits.
            .tcp_nodelay(true)
            .connect()
            .await
    };
    let mut admin = QueueServiceClient::new(channel(address).await?);
    admin
        .create_queue(pb::CreateQueueRequest {
            name: "bench".to_owned(),
            ..Default::default()
        })
        .await?;

    let cycles = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let body = "x".repeat(args.body_bytes);
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let mut client = QueueServiceClient::new(channel(address).await?);
        let cycles = cycles.clone();
        let body = body.clone();
        let batch = args.batch;
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let deleted = cycle(&mut client, &body, batch).await?;
                cycles.fetch_add(deleted, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    for worker in workers {
        worker.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let done = cycles.load(Ordering::Relaxed);
    let calls_per_cycle = if args.batch == 1 {
        3.0
    } else {
        3.0 / f64::from(args.batch)
    };
    println!(
        "workers={} batch={} body={}B: {done} messages sent+received+deleted in {elapsed:.1} s = {:.0} messages/s ({:.0} RPCs/s), fsync on",
        args.workers,
        args.batch,
        args.body_bytes,
        done as f64 / elapsed,
        done as f64 * calls_per_cycle / elapsed,
    );
    node.shutdown().await;
    // Every group commit is one revision: how many requests shared each fsync.
    let commits = trireme_node::storage::Storage::open_path(&dir, 8 * 1024 * 1024)?.revision();
    println!(
        "{commits} group commits = {:.0} commits/s, {:.1} RPCs per commit",
        commits as f64 / elapsed,
        done as f64 * calls_per_cycle / commits.max(1) as f64
    );
    Ok(())
}

/// One send, receive and delete of `batch` messages; returns how many were deleted. Another
/// worker may receive this worker's messages; every message received is deleted, so the queue
/// stays small and the count of deletes is the count of full cycles.
async fn cycle(
    client: &mut QueueServiceClient<Channel>,
    body: &str,
    batch: u32,
) -> anyhow::Result<u64> {
    if batch == 1 {
        client
            .send_message(pb::SendMessageRequest {
                queue: "bench".to_owned(),
                body: body.to_owned(),
                ..Default::default()
            })
            .await?;
    } else {
        client
            .send_message_batch(pb::SendMessageBatchRequest {
                queue: "bench".to_owned(),
                entries: (0..batch)
                    .map(|index| pb::SendMessageBatchEntry {
                        id: format!("e{index}"),
                        body: body.to_owned(),
                        ..Default::default()
                    })
                    .collect(),
            })
            .await?;
    }
    let messages = client
        .receive_messages(pb::ReceiveMessagesRequest {
            queue: "bench".to_owned(),
            max_messages: batch,
            visibility_timeout_seconds: Some(60),
            wait_seconds: Some(1),
        })
        .await?
        .into_inner()
        .messages;
    let received = messages.len() as u64;
    if batch == 1 {
        for message in messages {
            client
                .delete_message(pb::DeleteMessageRequest {
                    queue: "bench".to_owned(),
                    receipt_handle: message.receipt_handle,
                })
                .await?;
        }
    } else if !messages.is_empty() {
        client
            .delete_message_batch(pb::DeleteMessageBatchRequest {
                queue: "bench".to_owned(),
                entries: messages
                    .into_iter()
                    .enumerate()
                    .map(|(index, message)| pb::DeleteMessageBatchEntry {
                        id: format!("d{index}"),
                        receipt_handle: message.receipt_handle,
                    })
                    .collect(),
            })
            .await?;
    }
    Ok(received)
}
