//! A rough send + receive + delete throughput figure for one node or several, measured through
//! the client. With several endpoints each producer and consumer has its own client, and their
//! home endpoints spread over the list.
//!
//! Producers send `--messages` messages (in batches of `--batch`) while consumers receive and
//! delete them (batches of the same size); the figure is messages fully processed per second,
//! from the first send to the last delete. Not a benchmark suite: one number to compare
//! builds and machines by.
//!
//! ```text
//! cargo run --release -p trireme-node -- --data-dir ./data &
//! cargo run --release -p trireme-client --example client_throughput -- --messages 20000 --batch 10
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;
use trireme_client::{
    Client, DEFAULT_ENDPOINT, DeleteEntry, QueueAttributes, QueueName, ReceiveOptions,
    SendBatchEntry, SendMessage,
};

#[derive(Parser, Debug)]
struct Args {
    /// The nodes: repeated or comma-separated.
    #[arg(long = "endpoint", value_delimiter = ',', default_value = DEFAULT_ENDPOINT)]
    endpoints: Vec<String>,
    /// Messages to push through.
    #[arg(long, default_value_t = 10_000)]
    messages: u64,
    /// Messages per send, receive and delete call (1-10).
    #[arg(long, default_value_t = 10)]
    batch: u32,
    /// Concurrent producers, and as many consumers.
    #[arg(long, default_value_t = 16)]
    concurrency: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 256)]
    body_bytes: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !(1..=10).contains(&args.batch) {
        bail!("--batch must be 1-10");
    }
    let client = Client::connect(args.endpoints.clone())?;
    let queue = QueueName::new(format!("throughput-{}", std::process::id()))?;
    client
        .create_queue(&queue, &QueueAttributes::default())
        .await?;
    let body = "x".repeat(args.body_bytes);
    let batch = u64::from(args.batch);
    let calls = args.messages.div_ceil(batch);
    let next_call = Arc::new(AtomicU64::new(0));
    let deleted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let (client, queue, body, next_call) = (
            Client::connect(args.endpoints.clone())?,
            queue.clone(),
            body.clone(),
            next_call.clone(),
        );
        tasks.spawn(async move {
            while next_call.fetch_add(1, Ordering::Relaxed) < calls {
                let entries: Vec<SendBatchEntry> = (0..batch)
                    .map(|i| SendBatchEntry {
                        id: i.to_string(),
                        message: SendMessage::new(body.clone()),
                    })
                    .collect();
                let outcome = client.send_message_batch(&queue, &entries).await?;
                if !outcome.failed.is_empty() {
                    bail!("sends refused: {:?}", outcome.failed);
                }
            }
            Ok(())
        });
    }
    let total = calls * batch;
    for _ in 0..args.concurrency {
        let (client, queue, deleted) = (
            Client::connect(args.endpoints.clone())?,
            queue.clone(),
            deleted.clone(),
        );
        tasks.spawn(async move {
            let options = ReceiveOptions {
                max_messages: u32::try_from(batch)?,
                visibility_timeout_seconds: Some(60),
                wait_seconds: Some(1),
            };
            while deleted.load(Ordering::Relaxed) < total {
                let messages = client.receive_messages(&queue, &options).await?;
                if messages.is_empty() {
                    continue;
                }
                let entries: Vec<DeleteEntry> = messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| DeleteEntry {
                        id: i.to_string(),
                        receipt_handle: m.receipt_handle.clone(),
                    })
                    .collect();
                let outcome = client.delete_message_batch(&queue, &entries).await?;
                deleted.fetch_add(outcome.successful.len() as u64, Ordering::Relaxed);
            }
            Ok(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    let elapsed = started.elapsed();
    client.delete_queue(&queue).await?;
    let rate = total as f64 / elapsed.as_secs_f64();
    println!(
        "{total} messages sent, received and deleted in {:.2} s: {rate:.0} messages/s (batch {}, {} producers + {} consumers, {} byte bodies)",
        elapsed.as_secs_f64(),
        args.batch,
        args.concurrency,
        args.concurrency,
        args.body_bytes
    );
    Ok(())
}
