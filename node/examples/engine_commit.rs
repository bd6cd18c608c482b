//! Measures the engine's group-commit path alone, without gRPC: `--workers` tasks each loop
//! send, receive and delete of one message through [`Engine`] directly, on a database file whose
//! backend times every write and every `fdatasync`. It prints how many commits ran, how many
//! commands shared each, and where the time of one commit cycle went: syncing, writing, and the
//! rest (applying commands in the core, redb's in-memory B-tree work, encoding, answering).
//!
//! `cargo run --release -p trireme-node --example engine_commit -- --workers 32 --seconds 10`
//!
//! `--skip-sync` replaces the `fdatasync` with nothing, to show what the engine would do if
//! syncing were free. It measures only; a node never runs that way.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use trireme_core::{Command, Outcome, QueueAttributes, QueueName};
use trireme_node::clock::SystemClock;
use trireme_node::engine::{Engine, EngineSettings};
use trireme_node::handle::HandleCodec;
use trireme_node::storage::Storage;

#[derive(Parser)]
struct Args {
    /// Concurrent tasks, each one command in flight.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Where the database goes (a real disk, not tmpfs). Default: a new temporary directory.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Do not sync at all (measurement only: shows the cost of everything but the sync).
    #[arg(long)]
    skip_sync: bool,
}

/// Time spent in the backend's calls, in nanoseconds, and how many there were.
#[derive(Debug, Default)]
struct Timings {
    writes: AtomicU64,
    write_ns: AtomicU64,
    syncs: AtomicU64,
    sync_ns: AtomicU64,
}

/// redb's file backend with each write and sync timed.
#[derive(Debug)]
struct TimedFile {
    inner: redb::backends::FileBackend,
    timings: Arc<Timings>,
    skip_sync: bool,
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl redb::StorageBackend for TimedFile {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        let began = Instant::now();
        let result = if self.skip_sync {
            Ok(())
        } else {
            self.inner.sync_data()
        };
        self.timings.syncs.fetch_add(1, Ordering::Relaxed);
        self.timings
            .sync_ns
            .fetch_add(elapsed_ns(began), Ordering::Relaxed);
        result
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let began = Instant::now();
        let result = self.inner.write(offset, data);
        self.timings.writes.fetch_add(1, Ordering::Relaxed);
        self.timings
            .write_ns
            .fetch_add(elapsed_ns(began), Ordering::Relaxed);
        result
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let temp = tempfile::TempDir::new()?;
    let dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&dir)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("engine-commit.redb"))?;
    let timings = Arc::new(Timings::default());
    let backend = TimedFile {
        inner: redb::backends::FileBackend::new(file)?,
        timings: timings.clone(),
        skip_sync: args.skip_sync,
    };
    let storage = Storage::open_backend(backend, 64 * 1024 * 1024)?;
    let handles = HandleCodec::new(b"engine-commit-example-key-0123456789")?;
    let engine = Engine::start(
        storage,
        Arc::new(SystemClock),
        handles,
        EngineSettings::default(),
        None,
    )?;
    let queue = QueueName::try_from("bench")?;
    engine
        .execute(Command::CreateQueue {
            name: queue.clone(),
            attributes: QueueAttributes::default(),
            tags: BTreeMap::new(),
        })
        .await?;

    let body = "x".repeat(args.body_bytes);
    let cycles = Arc::new(AtomicU64::new(0));
    let (syncs_before, sync_ns_before, writes_before, write_ns_before) = (
        timings.syncs.load(Ordering::Relaxed),
        timings.sync_ns.load(Ordering::Relaxed),
        timings.writes.load(Ordering::Relaxed),
        timings.write_ns.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let (engine, queue, body, cycles) =
            (engine.clone(), queue.clone(), body.clone(), cycles.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                engine
                    .execute(Command::Send {
                        queue: queue.clone(),
                        id: engine.new_message_id(),
                        body: body.clone(),
                        attributes: BTreeMap::new(),
                        system: Default::default(),
                        delay_s: None,
                        dedup: None,
                    })
                    .await?;
                let received = engine.receive(queue.clone(), 1, Some(60), Some(0)).await?;
                for delivery in received {
                    let outcome = engine
                        .execute(Command::Delete {
                            queue: queue.clone(),
                            handle: delivery.handle,
                        })
                        .await?;
                    anyhow::ensure!(matches!(outcome, Outcome::Deleted { .. }), "{outcome:?}");
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let elapsed = started.elapsed();
    let syncs = timings.syncs.load(Ordering::Relaxed) - syncs_before;
    let sync_s = (timings.sync_ns.load(Ordering::Relaxed) - sync_ns_before) as f64 / 1e9;
    let writes = timings.writes.load(Ordering::Relaxed) - writes_before;
    let write_s = (timings.write_ns.load(Ordering::Relaxed) - write_ns_before) as f64 / 1e9;
    engine.close().await;
    let done = cycles.load(Ordering::Relaxed);
    let seconds = elapsed.as_secs_f64();
    let per_commit_us = |s: f64| s * 1e6 / syncs.max(1) as f64;
    println!(
        "workers={} body={}B{}: {done} messages sent+received+deleted in {seconds:.1} s = {:.0} messages/s; {syncs} commits = {:.0} commits/s, {:.1} commands per commit, {:.1} writes per commit",
        args.workers,
        args.body_bytes,
        if args.skip_sync {
            " (sync skipped)"
        } else {
            ""
        },
        done as f64 / seconds,
        syncs as f64 / seconds,
        done as f64 * 3.0 / syncs.max(1) as f64,
        writes as f64 / syncs.max(1) as f64,
    );
    println!(
        "per commit cycle: {:.0} us = sync {:.0} us + write {:.0} us + rest {:.0} us",
        per_commit_us(seconds),
        per_commit_us(sync_s),
        per_commit_us(write_s),
        per_commit_us(seconds - sync_s - write_s),
    );
    Ok(())
}
