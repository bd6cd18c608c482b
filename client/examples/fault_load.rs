//! `fault_load`: the load and the checker of `.ci/extra/compose-faults.sh`, which runs it against
//! a three-node cluster while it kills, cuts off and restarts the nodes' containers.
//!
//! It creates a queue with a dead-letter queue (through every node, since a create with the same
//! attributes changes nothing), then runs producers and consumers homed on every node (each
//! client lists all nodes and fails over). Producers send numbered messages at a fixed total rate
//! (without deduplication ids, which a cluster now serves but this load does not use: a send that
//! failed may or may not have stored its message, and only acknowledged ones are owed); consumers
//! receive and delete;
//! every `--poison-every`-th message is never deleted from the source queue, so the node must
//! move it to the dead-letter queue after `--max-receive-count` receives, where dead-letter
//! consumers delete it. A delete that failed on the way is retried (a delete of a message already
//! gone succeeds), one refused as stale is left to the receive that superseded it.
//!
//! Standard input steers it, one command per line: `phase NAME` starts a named phase (the fault
//! script names each fault), `drain` (or the end of input) stops the producers. It then waits
//! until every acknowledged send has been deleted, sweeps both queues through each node alone,
//! and checks:
//!
//! - no acknowledged send lost: each was delivered (from the queue or the dead-letter queue);
//! - each was deleted by the end of the drain;
//! - no acknowledged delete delivered again: no receive that began after a delete of a message
//!   was acknowledged returned that message;
//! - every poison message reached the dead-letter queue, naming its source;
//! - bodies arrived as sent;
//! - both queues are described, listed and received from on every node alone.
//!
//! It prints what it counted (sends acknowledged and failed, deliveries, duplicates, failed
//! requests by call and kind, and per phase the longest stall: cluster-wide between two
//! acknowledged sends and two acknowledged deletes, and of any single worker between two answered
//! calls), writes the same as JSON with `--report`, and exits 1 when a check failed. Every wait
//! is bounded: the run by `--run-max-s`, the drain by `--drain-max-s`, each call by the client's
//! timeouts.
//!
//! ```text
//! cargo run --release -p trireme-client --example fault_load -- \
//!     --endpoint http://127.0.0.1:7101,http://127.0.0.1:7102,http://127.0.0.1:7103
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use trireme_client::{
    Client, ClientConfig, Error, Message, QueueAttributes, QueueName, ReceiptHandle,
    ReceiveOptions, RedrivePolicy, SendMessage,
};

/// Characters after the sequence number in every body, so that a body is checked whole.
const BODY_FILL: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Long-poll wait of the consumers' receives: short, so a worker answers often and its stalls
/// are visible.
const RECEIVE_WAIT_S: u32 = 1;

/// How long a worker pauses after a failed call, so a refusing node is not spun on.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

/// Times one failed delete is tried again before the consumer gives it up.
const DELETE_RETRIES_MAX: u32 = 20;

/// How long one call may take on one node beyond its long poll: above the nodes' 5 s operation
/// timeout, so a coordinator's own "unavailable" answer arrives before the client gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(8);

/// Attempts of each setup call (one a second), for nodes that have just started.
const SETUP_ATTEMPTS_MAX: u32 = 60;

/// Attempts of each call of the final per-node checks (one a second).
const CHECK_ATTEMPTS_MAX: u32 = 10;

/// Commands from the fault script buffered before the reader waits.
const COMMANDS_BUFFERED_MAX: usize = 16;

/// Receives per queue and node in the final sweep, at most (each returns up to 10 messages).
const SWEEP_RECEIVES_MAX: u32 = 100;

#[derive(Parser, Debug)]
struct Args {
    /// The nodes' gRPC addresses, comma-separated or repeated.
    #[arg(long = "endpoint", value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// The source queue; the dead-letter queue is this name with `-dlq`.
    #[arg(long, default_value = "faults")]
    queue: String,
    /// Messages sent at most.
    #[arg(long, default_value_t = 6_000)]
    messages: u64,
    /// Sends per second, all producers together.
    #[arg(long, default_value_t = 25)]
    rate: u32,
    /// Producers homed on each node.
    #[arg(long, default_value_t = 1)]
    producers_per_node: usize,
    /// Consumers of the source queue homed on each node.
    #[arg(long, default_value_t = 2)]
    consumers_per_node: usize,
    /// Visibility timeout of the consumers' receives, in seconds.
    #[arg(long, default_value_t = 5)]
    visibility_s: u32,
    /// The source queue's redrive policy: receives before the move to the dead-letter queue.
    #[arg(long, default_value_t = 3)]
    max_receive_count: u32,
    /// Every this-many-th message is never deleted from the source queue (0: none).
    #[arg(long, default_value_t = 50)]
    poison_every: u64,
    /// Seconds from the start after which the producers stop even without `drain`.
    #[arg(long, default_value_t = 480)]
    run_max_s: u64,
    /// Seconds the drain may take.
    #[arg(long, default_value_t = 120)]
    drain_max_s: u64,
    /// Write the report here as JSON too.
    #[arg(long)]
    report: Option<PathBuf>,
}

/// Which queue a delivery came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Source {
    Queue,
    DeadLetterQueue,
}

/// One message returned by one receive.
#[derive(Debug)]
struct Delivery {
    seq: u64,
    source: Source,
    /// When the receive that returned it was sent (µs since the start).
    receive_started_us: u64,
    message_id: String,
    receive_count: u32,
    dead_letter_source: Option<String>,
}

/// What answered, for the stall figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answered {
    Send,
    Receive,
    Delete,
}

/// Everything the workers saw, in one place; each entry is appended once under the lock.
#[derive(Debug, Default)]
struct Journal {
    /// Acknowledged sends: sequence number → message id and when the send was acknowledged (µs).
    acked: BTreeMap<u64, (String, u64)>,
    /// Sends that failed: the message may or may not have been stored.
    send_failed: BTreeSet<u64>,
    deliveries: Vec<Delivery>,
    /// The first acknowledged delete of each message: when (µs) and from which queue.
    deleted: BTreeMap<u64, (u64, Source)>,
    /// Every delete that failed, by sequence number: when it ended (µs) and the error's kind.
    delete_failures: BTreeMap<u64, Vec<(u64, &'static str)>>,
    /// (worker, µs) of every answered call.
    answered: Vec<(usize, u64, Answered)>,
    /// Failed calls by `call:kind`.
    failures: BTreeMap<String, u64>,
    /// Bodies that are not what was sent.
    corrupt: Vec<String>,
}

/// A named phase of the run, from the `phase` commands.
#[derive(Clone, Debug, Serialize)]
struct Phase {
    name: String,
    start_us: u64,
    end_us: u64,
}

struct Shared {
    origin: Instant,
    queue: QueueName,
    dead_letter_queue: QueueName,
    messages_max: u64,
    poison_every: u64,
    visibility_s: u32,
    next_seq: AtomicU64,
    /// Cleared when the producers must stop.
    sending: AtomicBool,
    /// Cleared when the consumers must stop.
    consuming: AtomicBool,
    journal: Mutex<Journal>,
}

impl Shared {
    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros())
            .expect("a run lasts less than 584,000 years")
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal
            .lock()
            .expect("no worker panics while holding the journal")
    }

    fn answered(&self, worker: usize, what: Answered) {
        let at = self.now_us();
        self.journal().answered.push((worker, at, what));
    }

    fn failed(&self, call: &str, error: &Error) {
        *self
            .journal()
            .failures
            .entry(format!("{call}:{}", error.kind()))
            .or_default() += 1;
    }

    fn is_poison(&self, seq: u64) -> bool {
        self.poison_every != 0 && seq.is_multiple_of(self.poison_every)
    }
}

fn body(seq: u64) -> String {
    format!("{seq:010}:{BODY_FILL}")
}

/// The sequence number of a body this program sent, if it is one, unchanged.
fn parse_body(body: &str) -> Option<u64> {
    let (seq, fill) = body.split_once(':')?;
    let seq = seq.parse().ok()?;
    (fill == BODY_FILL).then_some(seq)
}

fn client_homed(endpoints: &[String], home: usize) -> Result<Client> {
    let mut config = ClientConfig::new(endpoints.iter().cloned());
    config.home_endpoint = Some(home);
    config.request_timeout = REQUEST_TIMEOUT;
    Ok(Client::new(config)?)
}

fn client_alone(endpoint: &str) -> Result<Client> {
    let mut config = ClientConfig::new([endpoint.to_owned()]);
    config.request_timeout = REQUEST_TIMEOUT;
    Ok(Client::new(config)?)
}

/// Runs `call` once a second until it succeeds, at most `attempts` times.
async fn patiently<T, F, Fut>(what: &str, attempts: u32, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut last = None;
    for _ in 0..attempts {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let last = last.expect("at least one attempt ran");
    bail!("{what}: still failing after {attempts} attempts: {last}")
}

async fn produce(shared: Arc<Shared>, client: Client, worker: usize, period: Duration) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Bounded by `messages_max` sequence numbers shared by all producers.
    loop {
        ticker.tick().await;
        if !shared.sending.load(Ordering::Relaxed) {
            return;
        }
        let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
        if seq >= shared.messages_max {
            return;
        }
        let message = SendMessage::new(body(seq));
        match client.send_message(&shared.queue, &message).await {
            Ok(sent) => {
                let at = shared.now_us();
                shared
                    .journal()
                    .acked
                    .insert(seq, (sent.message_id.as_str().to_owned(), at));
                shared.answered(worker, Answered::Send);
            }
            Err(error) => {
                shared.journal().send_failed.insert(seq);
                shared.failed("send", &error);
            }
        }
    }
}

/// A delete to try again: its sequence number, handle and the tries left.
struct PendingDelete {
    seq: u64,
    handle: ReceiptHandle,
    tries_left: u32,
}

async fn consume(shared: Arc<Shared>, client: Client, worker: usize, source: Source) {
    let queue = match source {
        Source::Queue => shared.queue.clone(),
        Source::DeadLetterQueue => shared.dead_letter_queue.clone(),
    };
    let options = ReceiveOptions {
        max_messages: 10,
        visibility_timeout_seconds: Some(shared.visibility_s),
        wait_seconds: Some(RECEIVE_WAIT_S),
    };
    let mut pending: Vec<PendingDelete> = Vec::new();
    // Bounded: the main task clears `consuming` by the end of the drain.
    while shared.consuming.load(Ordering::Relaxed) {
        for delete in std::mem::take(&mut pending) {
            settle(
                &shared,
                &client,
                worker,
                &queue,
                source,
                delete,
                &mut pending,
            )
            .await;
        }
        let started = shared.now_us();
        let messages = match client.receive_messages(&queue, &options).await {
            Ok(messages) => messages,
            Err(error) => {
                shared.failed("receive", &error);
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        shared.answered(worker, Answered::Receive);
        for message in messages {
            let Some(seq) = record_delivery(&shared, &message, source, started) else {
                continue;
            };
            if source == Source::Queue && shared.is_poison(seq) {
                continue;
            }
            let delete = PendingDelete {
                seq,
                handle: message.receipt_handle,
                tries_left: DELETE_RETRIES_MAX,
            };
            settle(
                &shared,
                &client,
                worker,
                &queue,
                source,
                delete,
                &mut pending,
            )
            .await;
        }
    }
}

/// Records one delivered message; returns its sequence number unless its body is not one sent.
fn record_delivery(
    shared: &Shared,
    message: &Message,
    source: Source,
    receive_started_us: u64,
) -> Option<u64> {
    let mut journal = shared.journal();
    let Some(seq) = parse_body(&message.body) else {
        journal
            .corrupt
            .push(message.body.chars().take(80).collect());
        return None;
    };
    journal.deliveries.push(Delivery {
        seq,
        source,
        receive_started_us,
        message_id: message.message_id.as_str().to_owned(),
        receive_count: message.receive_count,
        dead_letter_source: message
            .dead_letter_source
            .as_ref()
            .map(|queue| queue.as_str().to_owned()),
    });
    Some(seq)
}

/// Deletes one message; a failure on the way is queued in `pending` to be tried again, a stale
/// handle is left to the receive that superseded it.
async fn settle(
    shared: &Shared,
    client: &Client,
    worker: usize,
    queue: &QueueName,
    source: Source,
    mut delete: PendingDelete,
    pending: &mut Vec<PendingDelete>,
) {
    match client.delete_message(queue, &delete.handle).await {
        Ok(()) => {
            let at = shared.now_us();
            shared
                .journal()
                .deleted
                .entry(delete.seq)
                .or_insert((at, source));
            shared.answered(worker, Answered::Delete);
        }
        Err(error) => {
            shared.failed("delete", &error);
            let at = shared.now_us();
            shared
                .journal()
                .delete_failures
                .entry(delete.seq)
                .or_default()
                .push((at, error.kind()));
            let transient = matches!(
                error,
                Error::Unavailable { .. }
                    | Error::Timeout { .. }
                    | Error::NoEndpointAvailable { .. }
            );
            if transient && delete.tries_left > 0 {
                delete.tries_left -= 1;
                pending.push(delete);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
}

/// Lines of standard input, read on a thread of their own (a blocking read must not hold a
/// runtime worker); the channel closes at the end of input.
fn commands() -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel(COMMANDS_BUFFERED_MAX);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else {
                eprintln!("fault_load: cannot read the commands; taking it as the end of input");
                return;
            };
            // A full channel waits for the reader; a closed one means nobody listens any more.
            if sender.blocking_send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Follows the fault script's commands; returns when told to drain, at the end of input, or at
/// the run's cap, with the phases it was told of and what ended the run.
async fn follow_script(shared: &Shared, run_max: Duration) -> (Vec<Phase>, &'static str) {
    let mut commands = commands();
    let mut phases: Vec<Phase> = Vec::new();
    let cap = tokio::time::sleep(run_max);
    tokio::pin!(cap);
    let why = loop {
        let line = tokio::select! {
            line = commands.recv() => line,
            () = &mut cap => break "the run's cap",
        };
        let Some(line) = line else {
            break "the end of input";
        };
        let now = shared.now_us();
        if let Some(name) = line.trim().strip_prefix("phase ") {
            if let Some(last) = phases.last_mut() {
                last.end_us = now;
            }
            phases.push(Phase {
                name: name.trim().to_owned(),
                start_us: now,
                end_us: now,
            });
            println!(
                "fault_load: phase {} at {:.1} s",
                name.trim(),
                now as f64 / 1e6
            );
        } else if line.trim() == "drain" {
            break "drain";
        } else if !line.trim().is_empty() {
            eprintln!("fault_load: unknown command {line:?} ignored");
        }
    };
    let now = shared.now_us();
    if let Some(last) = phases.last_mut() {
        last.end_us = now;
    }
    (phases, why)
}

/// The longest time in `[start, end]` without an entry of `times` (sorted).
fn longest_gap(times: &[u64], start: u64, end: u64) -> u64 {
    longest_gap_from(times, start, end).0
}

/// The longest time in `[start, end]` without an entry of `times` (sorted), and when it began
/// (the first such gap when several are as long).
fn longest_gap_from(times: &[u64], start: u64, end: u64) -> (u64, u64) {
    let mut previous = start;
    let mut longest = (0, start);
    for &at in times.iter().filter(|&&at| at >= start && at <= end) {
        if at - previous > longest.0 {
            longest = (at - previous, previous);
        }
        previous = at;
    }
    if end.saturating_sub(previous) > longest.0 {
        longest = (end - previous, previous);
    }
    longest
}

#[derive(Debug, Serialize)]
struct PhaseReport {
    name: String,
    seconds: f64,
    sends_acked: usize,
    /// Longest time without an acknowledged send, cluster-wide.
    send_stall_ms: u64,
    /// When that stall began, in seconds from the phase's start.
    send_stall_from_s: f64,
    /// Longest time without an acknowledged delete, cluster-wide.
    delete_stall_ms: u64,
    /// Longest time one worker went without an answered call.
    worker_stall_ms: u64,
    /// Which worker that was, and when its stall began (seconds from the phase's start).
    worker_stall_of: String,
    worker_stall_from_s: f64,
}

#[derive(Debug, Serialize)]
struct NodeCheck {
    endpoint: String,
    /// What failed on this node alone; empty when it served both queues.
    problems: Vec<String>,
    /// ready / in flight / delayed of the queue and the dead-letter queue, as this node says.
    queue_counts: [u64; 3],
    dead_letter_queue_counts: [u64; 3],
}

#[derive(Debug, Serialize)]
struct Report {
    sends_acked: usize,
    sends_failed: usize,
    /// Failed sends whose message was delivered all the same.
    sends_failed_but_stored: usize,
    deliveries: usize,
    distinct_delivered: usize,
    /// Deliveries of a message after its first, poison messages' expected receives excepted.
    duplicates: usize,
    /// Sequence numbers delivered under more than one message id.
    stored_twice: usize,
    poison_acked: usize,
    poison_in_dead_letter_queue: usize,
    non_poison_in_dead_letter_queue: usize,
    deletes_acked: usize,
    failed_requests: u64,
    failures: BTreeMap<String, u64>,
    phases: Vec<PhaseReport>,
    nodes: Vec<NodeCheck>,
    // The checks: each must be zero (or empty).
    lost: Vec<u64>,
    /// Delivered, never acknowledged deleted, gone: a failed delete took effect (allowed).
    deleted_by_failed_delete: Vec<u64>,
    unsettled: Vec<u64>,
    resurrected: Vec<u64>,
    poison_not_dead_lettered: Vec<u64>,
    corrupt: Vec<String>,
    /// What happened to each message a check names (the first few of each check).
    histories: Vec<String>,
    drain_seconds: f64,
    stopped_by: String,
    passed: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    // The client's own decisions (an endpoint marked down, a call moved on) on standard error
    // when `TRIREME_LOG` asks for them, e.g. `TRIREME_LOG=trireme_client=debug`.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("TRIREME_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    if args.endpoints.is_empty() || args.rate == 0 || args.producers_per_node == 0 {
        bail!("need at least one endpoint, a rate above 0 and a producer per node");
    }
    let queue = QueueName::new(args.queue.clone())?;
    let dead_letter_queue = QueueName::new(format!("{}-dlq", args.queue))?;
    let attributes = QueueAttributes {
        visibility_timeout_seconds: Some(args.visibility_s),
        redrive_policy: Some(RedrivePolicy {
            dead_letter_queue: dead_letter_queue.clone(),
            max_receive_count: args.max_receive_count,
        }),
        ..QueueAttributes::default()
    };
    // Through every node: a create with the same attributes changes nothing, and each node
    // must accept it.
    let plain = QueueAttributes::default();
    for endpoint in &args.endpoints {
        let client = client_alone(endpoint)?;
        patiently(
            &format!("create {dead_letter_queue} on {endpoint}"),
            SETUP_ATTEMPTS_MAX,
            || client.create_queue(&dead_letter_queue, &plain),
        )
        .await?;
        patiently(
            &format!("create {queue} on {endpoint}"),
            SETUP_ATTEMPTS_MAX,
            || client.create_queue(&queue, &attributes),
        )
        .await?;
    }
    let shared = Arc::new(Shared {
        origin: Instant::now(),
        queue,
        dead_letter_queue,
        messages_max: args.messages,
        poison_every: args.poison_every,
        visibility_s: args.visibility_s,
        next_seq: AtomicU64::new(1),
        sending: AtomicBool::new(true),
        consuming: AtomicBool::new(true),
        journal: Mutex::new(Journal::default()),
    });
    let nodes = args.endpoints.len();
    let producers = nodes * args.producers_per_node;
    let period = Duration::from_secs_f64(producers as f64 / f64::from(args.rate));
    let mut workers: Vec<String> = Vec::new();
    let mut producing = JoinSet::new();
    let mut consuming = JoinSet::new();
    for home in 0..nodes {
        for _ in 0..args.producers_per_node {
            let client = client_homed(&args.endpoints, home)?;
            producing.spawn(produce(shared.clone(), client, workers.len(), period));
            workers.push(format!("producer@{}", args.endpoints[home]));
        }
        let sources = std::iter::repeat_n(Source::Queue, args.consumers_per_node)
            .chain([Source::DeadLetterQueue]);
        for source in sources {
            let client = client_homed(&args.endpoints, home)?;
            consuming.spawn(consume(shared.clone(), client, workers.len(), source));
            workers.push(format!("{source:?} consumer@{}", args.endpoints[home]));
        }
    }
    println!(
        "fault_load: ready: {} and {} on {nodes} nodes, {producers} producers at {} msg/s, {} \
         consumers",
        shared.queue,
        shared.dead_letter_queue,
        args.rate,
        workers.len() - producers
    );
    std::io::stdout().flush()?;

    let (phases, stopped_by) = follow_script(&shared, Duration::from_secs(args.run_max_s)).await;
    shared.sending.store(false, Ordering::Relaxed);
    let sending_ended_us = shared.now_us();
    // Each producer returns at its next tick or when its call ends (bounded by the client).
    while producing.join_next().await.is_some() {}
    println!(
        "fault_load: producers stopped by {stopped_by}; draining (at most {} s)",
        args.drain_max_s
    );
    std::io::stdout().flush()?;
    let drain_started = Instant::now();
    let drain_deadline = drain_started + Duration::from_secs(args.drain_max_s);
    while Instant::now() < drain_deadline {
        let settled = {
            let journal = shared.journal();
            journal
                .acked
                .keys()
                .all(|seq| journal.deleted.contains_key(seq))
        };
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drain_seconds = drain_started.elapsed().as_secs_f64();
    shared.consuming.store(false, Ordering::Relaxed);
    while consuming.join_next().await.is_some() {}

    let mut node_checks = Vec::new();
    for endpoint in &args.endpoints {
        node_checks.push(check_node(&shared, endpoint).await?);
    }

    let report = build_report(&shared, &phases, sending_ended_us, &node_checks, &workers);
    let report = Report {
        nodes: node_checks,
        drain_seconds,
        stopped_by: stopped_by.to_owned(),
        ..report
    };
    print_report(&report);
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !report.passed {
        std::process::exit(1);
    }
    Ok(())
}

/// Both queues through one node alone: described, listed, received from (what the sweep finds
/// is recorded and deleted, so that a late resurrection is seen too).
async fn check_node(shared: &Shared, endpoint: &str) -> Result<NodeCheck> {
    let client = client_alone(endpoint)?;
    let mut problems = Vec::new();
    let mut counts = [[0u64; 3]; 2];
    for (index, (queue, source)) in [
        (&shared.queue, Source::Queue),
        (&shared.dead_letter_queue, Source::DeadLetterQueue),
    ]
    .into_iter()
    .enumerate()
    {
        match patiently(
            &format!("describe {queue} on {endpoint}"),
            CHECK_ATTEMPTS_MAX,
            || client.get_queue(queue),
        )
        .await
        {
            Ok(info) => {
                counts[index] = [info.stats.ready, info.stats.in_flight, info.stats.delayed];
            }
            Err(error) => problems.push(error.to_string()),
        }
        let options = ReceiveOptions {
            max_messages: 10,
            visibility_timeout_seconds: Some(shared.visibility_s),
            wait_seconds: Some(0),
        };
        for _ in 0..SWEEP_RECEIVES_MAX {
            let started = shared.now_us();
            let messages = match patiently(
                &format!("receive {queue} on {endpoint}"),
                CHECK_ATTEMPTS_MAX,
                || client.receive_messages(queue, &options),
            )
            .await
            {
                Ok(messages) => messages,
                Err(error) => {
                    problems.push(error.to_string());
                    break;
                }
            };
            if messages.is_empty() {
                break;
            }
            for message in messages {
                let Some(seq) = record_delivery(shared, &message, source, started) else {
                    continue;
                };
                if client
                    .delete_message(queue, &message.receipt_handle)
                    .await
                    .is_ok()
                {
                    let at = shared.now_us();
                    shared.journal().deleted.entry(seq).or_insert((at, source));
                }
            }
        }
    }
    match patiently(
        &format!("list queues on {endpoint}"),
        CHECK_ATTEMPTS_MAX,
        || client.list_all_queues(""),
    )
    .await
    {
        Ok(names) => {
            for queue in [&shared.queue, &shared.dead_letter_queue] {
                if !names.contains(queue) {
                    problems.push(format!("{queue} is not listed"));
                }
            }
        }
        Err(error) => problems.push(error.to_string()),
    }
    Ok(NodeCheck {
        endpoint: endpoint.to_owned(),
        problems,
        queue_counts: counts[0],
        dead_letter_queue_counts: counts[1],
    })
}

/// Of the acknowledged sends `acked`, those delivered and never acknowledged deleted: the ones a
/// failed delete may have removed (a delete of it failed and every node says the queue is
/// empty), and the rest, unsettled.
fn undeleted(
    acked: impl Iterator<Item = u64>,
    delivered: impl Fn(u64) -> bool,
    deleted: impl Fn(u64) -> bool,
    delete_failed: impl Fn(u64) -> bool,
    queue_empty_everywhere: bool,
) -> (Vec<u64>, Vec<u64>) {
    acked
        .filter(|&seq| delivered(seq) && !deleted(seq))
        .partition(|&seq| queue_empty_everywhere && delete_failed(seq))
}

fn build_report(
    shared: &Shared,
    phases: &[Phase],
    sending_ended_us: u64,
    nodes: &[NodeCheck],
    workers: &[String],
) -> Report {
    let journal = shared.journal();
    let mut delivered: BTreeMap<u64, Vec<&Delivery>> = BTreeMap::new();
    for delivery in &journal.deliveries {
        delivered.entry(delivery.seq).or_default().push(delivery);
    }
    let lost: Vec<u64> = journal
        .acked
        .keys()
        .filter(|seq| !delivered.contains_key(seq))
        .copied()
        .collect();
    // A delete that failed may still have taken effect (spec/replication.md, *Failed calls that
    // took effect*: a refused or timed-out conditional tombstone that reached one replica
    // spreads), which only ever happens to a delivered message. Such a message is settled once
    // every node says the queue holds nothing; the rest are unsettled.
    let queue_empty_everywhere = nodes.iter().all(|node| node.queue_counts == [0, 0, 0]);
    let (deleted_by_failed_delete, unsettled) = undeleted(
        journal.acked.keys().copied(),
        |seq| delivered.contains_key(&seq),
        |seq| journal.deleted.contains_key(&seq),
        |seq| journal.delete_failures.contains_key(&seq),
        queue_empty_everywhere,
    );
    let resurrected: BTreeSet<u64> = journal
        .deliveries
        .iter()
        .filter(|d| {
            journal
                .deleted
                .get(&d.seq)
                .is_some_and(|&(deleted_us, _)| d.receive_started_us > deleted_us)
        })
        .map(|d| d.seq)
        .collect();
    let poison_acked: Vec<u64> = journal
        .acked
        .keys()
        .filter(|&&seq| shared.is_poison(seq))
        .copied()
        .collect();
    let dead_lettered = |seq: &u64| {
        delivered.get(seq).is_some_and(|ds| {
            ds.iter().any(|d| {
                d.source == Source::DeadLetterQueue
                    && d.dead_letter_source.as_deref() == Some(shared.queue.as_str())
            })
        })
    };
    let poison_not_dead_lettered: Vec<u64> = poison_acked
        .iter()
        .filter(|seq| !dead_lettered(seq))
        .copied()
        .collect();
    let non_poison_in_dead_letter_queue = delivered
        .iter()
        .filter(|(seq, ds)| {
            !shared.is_poison(**seq) && ds.iter().any(|d| d.source == Source::DeadLetterQueue)
        })
        .count();
    // A poison message is received max_receive_count times from its queue by design, and once
    // from the dead-letter queue; anything beyond is a duplicate, as for the others beyond one.
    let duplicates = delivered
        .values()
        .map(|ds| {
            if shared.is_poison(ds[0].seq) {
                let from_dlq = ds
                    .iter()
                    .filter(|d| d.source == Source::DeadLetterQueue)
                    .count();
                from_dlq.saturating_sub(1)
            } else {
                ds.len() - 1
            }
        })
        .sum();
    let stored_twice = delivered
        .values()
        .filter(|ds| {
            ds.iter()
                .map(|d| d.message_id.as_str())
                .collect::<BTreeSet<_>>()
                .len()
                > 1
        })
        .count();
    let sends_failed_but_stored = journal
        .send_failed
        .iter()
        .filter(|seq| delivered.contains_key(seq))
        .count();

    let times = |what: Answered| {
        let mut times: Vec<u64> = journal
            .answered
            .iter()
            .filter(|(_, _, w)| *w == what)
            .map(|(_, at, _)| *at)
            .collect();
        times.sort_unstable();
        times
    };
    let sends = times(Answered::Send);
    let deletes = times(Answered::Delete);
    let mut by_worker: Vec<Vec<u64>> = vec![Vec::new(); workers.len()];
    for (worker, at, _) in &journal.answered {
        by_worker[*worker].push(*at);
    }
    for times in &mut by_worker {
        times.sort_unstable();
    }
    let phase_reports = phases
        .iter()
        .map(|phase| {
            // Stalls are measured while the producers ran: after that, no send is expected.
            let end = phase.end_us.min(sending_ended_us);
            // The longest, and the first worker's when several are as long.
            let worker_stall = by_worker
                .iter()
                .enumerate()
                .map(|(worker, times)| {
                    let (gap, from) = longest_gap_from(times, phase.start_us, end);
                    (gap, from, worker)
                })
                .fold((0, phase.start_us, 0), |longest, stall| {
                    if stall.0 > longest.0 { stall } else { longest }
                });
            PhaseReport {
                name: phase.name.clone(),
                seconds: (phase.end_us - phase.start_us) as f64 / 1e6,
                sends_acked: sends
                    .iter()
                    .filter(|&&at| at >= phase.start_us && at <= phase.end_us)
                    .count(),
                send_stall_ms: longest_gap(&sends, phase.start_us, end) / 1000,
                send_stall_from_s: (longest_gap_from(&sends, phase.start_us, end).1
                    - phase.start_us) as f64
                    / 1e6,
                delete_stall_ms: longest_gap(&deletes, phase.start_us, end) / 1000,
                worker_stall_ms: worker_stall.0 / 1000,
                worker_stall_of: workers[worker_stall.2].clone(),
                worker_stall_from_s: (worker_stall.1 - phase.start_us) as f64 / 1e6,
            }
        })
        .collect();
    let seconds = |us: u64| us as f64 / 1e6;
    let history = |seq: u64| {
        let mut events: Vec<(u64, String)> = Vec::new();
        if let Some((id, at)) = journal.acked.get(&seq) {
            events.push((*at, format!("send acknowledged (message id {id})")));
        }
        for d in delivered.get(&seq).into_iter().flatten() {
            events.push((
                d.receive_started_us,
                format!(
                    "receive began that returned it from {:?} (message id {}, receive count {})",
                    d.source, d.message_id, d.receive_count
                ),
            ));
        }
        for (at, kind) in journal.delete_failures.get(&seq).into_iter().flatten() {
            events.push((*at, format!("delete failed: {kind}")));
        }
        if let Some((at, source)) = journal.deleted.get(&seq) {
            events.push((*at, format!("delete acknowledged on {source:?}")));
        }
        events.sort();
        let events: Vec<String> = events
            .into_iter()
            .map(|(at, what)| format!("{:.3} s {what}", seconds(at)))
            .collect();
        format!("message {seq}: {}", events.join("; "))
    };
    let histories = lost
        .iter()
        .take(10)
        .chain(unsettled.iter().take(10))
        .chain(resurrected.iter().take(10))
        .map(|&seq| history(seq))
        .collect();
    let passed = lost.is_empty()
        && unsettled.is_empty()
        && resurrected.is_empty()
        && poison_not_dead_lettered.is_empty()
        && journal.corrupt.is_empty()
        && !journal.acked.is_empty()
        && nodes.iter().all(|n| n.problems.is_empty());
    Report {
        sends_acked: journal.acked.len(),
        sends_failed: journal.send_failed.len(),
        sends_failed_but_stored,
        deliveries: journal.deliveries.len(),
        distinct_delivered: delivered.len(),
        duplicates,
        stored_twice,
        poison_acked: poison_acked.len(),
        poison_in_dead_letter_queue: poison_acked.len() - poison_not_dead_lettered.len(),
        non_poison_in_dead_letter_queue,
        deletes_acked: journal.deleted.len(),
        failed_requests: journal.failures.values().sum(),
        failures: journal.failures.clone(),
        phases: phase_reports,
        nodes: Vec::new(),
        lost,
        deleted_by_failed_delete,
        unsettled,
        resurrected: resurrected.into_iter().collect(),
        poison_not_dead_lettered,
        corrupt: journal.corrupt.clone(),
        histories,
        drain_seconds: 0.0,
        stopped_by: String::new(),
        passed,
    }
}

fn print_report(report: &Report) {
    let sample = |seqs: &[u64]| {
        let shown: Vec<String> = seqs.iter().take(10).map(u64::to_string).collect();
        format!(
            "{} {}",
            seqs.len(),
            if shown.is_empty() {
                String::new()
            } else {
                format!("(e.g. {})", shown.join(", "))
            }
        )
    };
    println!(
        "fault_load: sent {} acknowledged, {} failed ({} of those stored all the same)",
        report.sends_acked, report.sends_failed, report.sends_failed_but_stored
    );
    println!(
        "fault_load: delivered {} messages in {} deliveries, {} duplicates, {} stored twice; \
         {} deletes acknowledged",
        report.distinct_delivered,
        report.deliveries,
        report.duplicates,
        report.stored_twice,
        report.deletes_acked
    );
    println!(
        "fault_load: poison {} acknowledged, {} reached the dead-letter queue; {} others \
         dead-lettered",
        report.poison_acked,
        report.poison_in_dead_letter_queue,
        report.non_poison_in_dead_letter_queue
    );
    let failures: Vec<String> = report
        .failures
        .iter()
        .map(|(what, count)| format!("{what} {count}"))
        .collect();
    println!(
        "fault_load: failed requests {} ({})",
        report.failed_requests,
        failures.join(", ")
    );
    for phase in &report.phases {
        println!(
            "fault_load: phase {:<10} {:>6.1} s: {:>5} sends acknowledged; longest stall: sends \
             {} ms (from {:.1} s), deletes {} ms, one worker {} ms ({} from {:.1} s)",
            phase.name,
            phase.seconds,
            phase.sends_acked,
            phase.send_stall_ms,
            phase.send_stall_from_s,
            phase.delete_stall_ms,
            phase.worker_stall_ms,
            phase.worker_stall_of,
            phase.worker_stall_from_s
        );
    }
    for node in &report.nodes {
        println!(
            "fault_load: node {}: {} (queue ready/in flight/delayed {:?}, dead-letter queue {:?})",
            node.endpoint,
            if node.problems.is_empty() {
                "both queues served".to_owned()
            } else {
                node.problems.join("; ")
            },
            node.queue_counts,
            node.dead_letter_queue_counts
        );
    }
    println!(
        "fault_load: drained in {:.1} s (producers stopped by {})",
        report.drain_seconds, report.stopped_by
    );
    println!("fault_load: lost {}", sample(&report.lost));
    println!(
        "fault_load: gone after a failed delete (allowed) {}",
        sample(&report.deleted_by_failed_delete)
    );
    println!("fault_load: unsettled {}", sample(&report.unsettled));
    println!(
        "fault_load: delivered after an acknowledged delete {}",
        sample(&report.resurrected)
    );
    println!(
        "fault_load: poison not dead-lettered {}",
        sample(&report.poison_not_dead_lettered)
    );
    println!("fault_load: corrupt bodies {}", report.corrupt.len());
    for history in &report.histories {
        println!("fault_load: {history}");
    }
    println!(
        "fault_load: {}",
        if report.passed { "PASS" } else { "FAIL" }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_parses_back_to_its_number_and_a_changed_one_does_not() {
        assert_eq!(parse_body(&body(42)), Some(42));
        assert_eq!(parse_body(&body(42).replace('z', "y")), None);
        assert_eq!(parse_body("hello"), None);
    }

    #[test]
    fn only_a_failed_delete_with_the_queue_empty_everywhere_settles_an_undeleted_message() {
        // 1 deleted, 2 delivered with a failed delete, 3 delivered with no delete tried,
        // 4 never delivered (the lost check's business).
        let settled = |empty| {
            undeleted(
                [1, 2, 3, 4].into_iter(),
                |seq| seq != 4,
                |seq| seq == 1,
                |seq| seq == 2,
                empty,
            )
        };
        assert_eq!(settled(true), (vec![2], vec![3]));
        assert_eq!(settled(false), (vec![], vec![2, 3]));
    }

    #[test]
    fn the_longest_gap_counts_the_window_edges() {
        assert_eq!(longest_gap(&[], 10, 50), 40);
        assert_eq!(longest_gap(&[20, 25, 45], 10, 50), 20);
        assert_eq!(longest_gap(&[5, 12, 60], 10, 50), 38);
        assert_eq!(longest_gap_from(&[20, 25, 45], 10, 50), (20, 25));
        assert_eq!(longest_gap_from(&[5, 12, 60], 10, 50), (38, 12));
        assert_eq!(longest_gap_from(&[], 10, 50), (40, 10));
    }
}
