//! `trireme bench`: drives running nodes through the client crate, phase by phase, and reports
//! throughput, latency percentiles and errors by kind.
//!
//! Phases, in this order when chosen: `sync` (one send in flight), `pipe` (sends with N in
//! flight, once per `--in-flight` value), `receive` (receives with a visibility timeout of 0, one
//! in flight: what a receive costs at the queue's depth, consuming nothing), `consume`
//! (consumers that receive up to ten with a long poll and delete what they got in one batch,
//! until the queue is empty), `steady` (producers at a target rate and consumers together,
//! printing the queue's depth each second), `idle` (many long polls held open on an empty
//! queue, to see what waiting consumers cost the node) and `kill` (sync senders while the
//! operator's commands kill a member and restart it, then a drain that looks for every
//! acknowledged message: `kill.rs`). Latencies
//! go into HDR histograms (microseconds, three significant digits), one per task, merged at the
//! end of the phase, so the hot path takes no lock.
//!
//! Every phase stops by itself: at its message count, when the queue is drained, or at its time
//! cap, whichever comes first; each call is bounded by the client's own timeouts. A failed call
//! is counted by the error's kind and the task goes on after a short pause. This module only
//! measures: it asserts nothing about speed, and it belongs to the `trireme` binary (the library
//! does not export it).

mod kill;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use trireme_client::{
    Client, ClientConfig, DeleteEntry, Message, QueueAttributes, QueueName, ReceiveOptions,
    SendBatchEntry, SendMessage,
};

/// The largest latency a histogram holds (one hour in microseconds); longer ones saturate.
const LATENCY_US_MAX: u64 = 3_600_000_000;

/// Significant decimal digits the histograms keep (0.1 % resolution).
const LATENCY_DIGITS: u8 = 3;

/// Bytes at the start of each body that carry its send time (microseconds since the bench
/// began, zero-padded decimal), from which the steady phase measures send-to-receive latency.
const BODY_STAMP_BYTES: usize = 16;

/// The largest body the bench sends: the node's default message size cap (256 KiB).
const BODY_BYTES_MAX: usize = 262_144;

/// Tasks one phase may run: in-flight sends, consumers, producers or idle long polls.
const TASKS_MAX: usize = 20_000;

/// Connections opened per endpoint, at most.
const CONNECTIONS_MAX: usize = 64;

/// How long a task pauses after a failed call, so a node that refuses at once is not spun on.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// How long the steady phase's consumers may drain what the producers left, after they stop.
const STEADY_DRAIN_MAX: Duration = Duration::from_secs(30);

/// Visibility timeout of the bench's receives: far longer than a receive-then-delete takes,
/// so a message is redelivered only when its delete failed.
const RECEIVE_VISIBILITY_S: u32 = 60;

const _: () = assert!(BODY_STAMP_BYTES <= BODY_BYTES_MAX);
const _: () = assert!(BODY_BYTES_MAX <= trireme_client::limits::MESSAGE_BYTES_MAX);

/// One phase of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PhaseKind {
    /// Sends one at a time, each awaited.
    Sync,
    /// Sends with many in flight.
    Pipe,
    /// Receives that consume nothing (visibility timeout 0), one in flight.
    Receive,
    /// Receives and batch deletes until the queue is empty.
    Consume,
    /// Producers at a target rate and consumers together.
    Steady,
    /// Long polls held open on an empty queue.
    Idle,
    /// Sync senders while one member is killed and restarted, then a drain.
    Kill,
}

/// `trireme bench`'s arguments. The endpoints and `--json` are the CLI's global ones.
#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// The queue the bench sends to and drains (created with default attributes if missing).
    #[arg(long, default_value = "trireme-bench")]
    queue: QueueName,
    /// Phases to run, comma separated, always in the order sync, pipe, receive, consume, steady,
    /// idle, kill (the default leaves out receive, idle and kill).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sync,pipe,consume,steady"
    )]
    phases: Vec<PhaseKind>,
    /// Body size in bytes (16-262144); the first 16 carry the send time.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Sends before the sync phase that are not measured (they warm the connections).
    #[arg(long, default_value_t = 100)]
    warmup: u64,
    /// Messages the sync phase sends.
    #[arg(long, default_value_t = 2_000)]
    sync_count: u64,
    /// Receives the receive phase makes.
    #[arg(long, default_value_t = 2_000)]
    receive_count: u64,
    /// Messages each pipe phase sends.
    #[arg(long, default_value_t = 20_000)]
    pipe_count: u64,
    /// Sends in flight of each pipe phase, comma separated: one phase per value.
    #[arg(long, value_delimiter = ',', default_value = "32,256,1024")]
    in_flight: Vec<usize>,
    /// Messages per send call (1 = SendMessage, 2-10 = SendMessageBatch), in pipe and steady.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Connections per endpoint; requests in flight are spread over them.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Consumers of the consume and steady phases, each one receive in flight.
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Messages one receive asks for (1-10); the consumer deletes them in one batch.
    #[arg(long, default_value_t = 10)]
    receive_max: u32,
    /// Long-poll wait of each receive in seconds (0-20).
    #[arg(long, default_value_t = 1)]
    wait: u32,
    /// Producers of the steady phase, each one send in flight.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Target send rate of the steady phase, messages per second over all producers.
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// How long the steady phase's producers send.
    #[arg(long, default_value_t = 10)]
    steady_seconds: u64,
    /// Long polls the idle phase holds open (each re-opened when it ends), for
    /// --steady-seconds, on the queue `<queue>-idle`.
    #[arg(long, default_value_t = 1_000)]
    idle_polls: usize,
    /// Time cap of every other phase, in seconds: it stops there even short of its count.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// No progress line on stderr.
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    kill: kill::KillArgs,
}

impl BenchArgs {
    fn check(&self) -> Result<()> {
        if !(BODY_STAMP_BYTES..=BODY_BYTES_MAX).contains(&self.body_bytes) {
            bail!("--body-bytes must be {BODY_STAMP_BYTES}-{BODY_BYTES_MAX}");
        }
        if !(1..=trireme_client::limits::BATCH_ENTRIES_MAX).contains(&self.batch) {
            bail!(
                "--batch must be 1-{}",
                trireme_client::limits::BATCH_ENTRIES_MAX
            );
        }
        if !(1..=trireme_client::limits::RECEIVE_MESSAGES_MAX).contains(&self.receive_max) {
            bail!(
                "--receive-max must be 1-{}",
                trireme_client::limits::RECEIVE_MESSAGES_MAX
            );
        }
        if self.wait > trireme_client::limits::WAIT_SECONDS_MAX {
            bail!(
                "--wait must be 0-{}",
                trireme_client::limits::WAIT_SECONDS_MAX
            );
        }
        if !(1..=CONNECTIONS_MAX).contains(&self.connections) {
            bail!("--connections must be 1-{CONNECTIONS_MAX}");
        }
        for (flag, tasks) in [
            ("--consumers", self.consumers),
            ("--producers", self.producers),
            ("--idle-polls", self.idle_polls),
        ]
        .into_iter()
        .chain(self.in_flight.iter().map(|n| ("--in-flight", *n)))
        {
            if !(1..=TASKS_MAX).contains(&tasks) {
                bail!("{flag} must be 1-{TASKS_MAX}");
            }
        }
        if self.rate == 0 || self.seconds == 0 || self.steady_seconds == 0 {
            bail!("--rate, --seconds and --steady-seconds must be at least 1");
        }
        Ok(())
    }
}

/// Latency percentiles of one kind of call, in milliseconds.
#[derive(Debug, Serialize)]
struct Latency {
    count: u64,
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p99_9: f64,
    max: f64,
}

impl Latency {
    fn of(histogram: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1_000.0;
        Latency {
            count: histogram.len(),
            mean: histogram.mean() / 1_000.0,
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            p99_9: ms(histogram.value_at_quantile(0.999)),
            max: ms(histogram.max()),
        }
    }
}

/// Why a phase ended.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Stop {
    /// Its message count was reached.
    Count,
    /// Its consumers found the queue empty.
    Drained,
    /// Its time cap came first.
    Time,
}

/// One sample of the steady phase's depth.
#[derive(Debug, Serialize)]
struct DepthSample {
    /// Seconds since the phase began.
    t_s: f64,
    /// Messages sent in this phase so far.
    sent: u64,
    /// Messages deleted in this phase so far.
    deleted: u64,
    /// The queue's counts as the node reports them (absent when the call failed).
    ready: Option<u64>,
    in_flight: Option<u64>,
    delayed: Option<u64>,
}

/// What one phase measured.
#[derive(Debug, Serialize)]
struct PhaseReport {
    phase: PhaseKind,
    /// Sends in flight (pipe and sync), consumers (consume), producers (steady).
    tasks: usize,
    /// Messages acknowledged: sent (sync, pipe, steady) or deleted (consume).
    messages: u64,
    /// Calls that succeeded, of every kind.
    calls: u64,
    elapsed_s: f64,
    messages_per_s: f64,
    stopped_by: Stop,
    /// Latency per kind of call (`send`, `receive`, `delete`), and `end_to_end` (send start to
    /// receipt) in the steady phase.
    latency_ms: BTreeMap<&'static str, Latency>,
    /// Failed calls by `call/kind`, e.g. `send/Timeout`, and refused batch entries by
    /// `delete-entry/code`.
    errors: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consume: Option<ConsumeCounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    steady: Option<SteadyReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kill: Option<kill::KillReport>,
}

/// Consumer-side counts of the consume and steady phases.
#[derive(Debug, Default, Serialize)]
struct ConsumeCounts {
    received: u64,
    deleted: u64,
    empty_receives: u64,
}

/// What only the steady phase has.
#[derive(Debug, Serialize)]
struct SteadyReport {
    target_rate: u64,
    /// Sends per second while the producers ran.
    sent_per_s: f64,
    sent: u64,
    producing_s: f64,
    depth: Vec<DepthSample>,
}

/// The whole run.
#[derive(Debug, Serialize)]
struct Report {
    queue: QueueName,
    endpoints: Vec<String>,
    body_bytes: usize,
    connections_per_endpoint: usize,
    /// `/proc/loadavg`'s 1, 5 and 15 minute figures before and after (absent elsewhere).
    load_average_before: Option<[f64; 3]>,
    load_average_after: Option<[f64; 3]>,
    /// Messages in the queue before the first phase.
    depth_before: u64,
    phases: Vec<PhaseReport>,
}

/// One task's measurements, merged into the phase's at its end.
struct Recorder {
    latency: BTreeMap<&'static str, Histogram<u64>>,
    errors: BTreeMap<String, u64>,
    calls: u64,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            latency: BTreeMap::new(),
            errors: BTreeMap::new(),
            calls: 0,
        }
    }

    fn record(&mut self, call: &'static str, took: Duration) {
        self.calls += 1;
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        self.latency
            .entry(call)
            .or_insert_with(new_histogram)
            .saturating_record(micros);
    }

    fn error(&mut self, call: &str, kind: &str) {
        *self.errors.entry(format!("{call}/{kind}")).or_default() += 1;
    }

    fn merge(&mut self, other: Recorder) {
        self.calls += other.calls;
        for (call, histogram) in other.latency {
            self.latency
                .entry(call)
                .or_insert_with(new_histogram)
                .add(histogram)
                .expect("histograms with the same bounds always add");
        }
        for (kind, count) in other.errors {
            *self.errors.entry(kind).or_default() += count;
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_DIGITS)
        .expect("constant bounds are valid")
}

/// Counters the progress line and the depth sampler read while tasks run.
#[derive(Default)]
struct Live {
    sent: AtomicU64,
    deleted: AtomicU64,
    errors: AtomicU64,
}

/// What every task of a run shares.
struct Shared {
    /// Clients to spread over: `connections` per endpoint, each with that endpoint as its home
    /// (so it fails over to the others).
    clients: Vec<Client>,
    queue: QueueName,
    body_bytes: usize,
    /// When the bench began: body stamps count from here.
    epoch: Instant,
}

impl Shared {
    fn client(&self, task: usize) -> Client {
        self.clients[task % self.clients.len()].clone()
    }

    /// A body of the configured size carrying the current time.
    fn body(&self) -> String {
        let micros = self.epoch.elapsed().as_micros();
        let mut body = format!("{micros:0width$}", width = BODY_STAMP_BYTES);
        body.truncate(BODY_STAMP_BYTES);
        body.extend(std::iter::repeat_n('x', self.body_bytes - BODY_STAMP_BYTES));
        body
    }

    /// The send-to-now latency of a body made by [`Shared::body`], if it is one.
    fn age(&self, body: &str) -> Option<Duration> {
        let micros: u64 = body.get(..BODY_STAMP_BYTES)?.parse().ok()?;
        let now = u64::try_from(self.epoch.elapsed().as_micros()).ok()?;
        Some(Duration::from_micros(now.saturating_sub(micros)))
    }
}

/// Runs the bench against the endpoints of `config` (each client homed on one of them, all
/// with its token and settings) and prints the report.
///
/// # Errors
/// Bad arguments, or the queue could not be created or read.
pub(crate) async fn run(config: ClientConfig, json: bool, args: BenchArgs) -> Result<()> {
    args.check()?;
    let endpoints = config.endpoints.clone();
    let kill_plan = args.kill.plan(
        args.phases.contains(&PhaseKind::Kill),
        &endpoints,
        args.body_bytes,
    )?;
    let mut clients = Vec::with_capacity(endpoints.len() * args.connections);
    for _ in 0..args.connections {
        for home in 0..endpoints.len() {
            let mut config = config.clone();
            config.home_endpoint = Some(home);
            clients.push(Client::new(config)?);
        }
    }
    let admin = clients[0].clone();
    admin
        .create_queue(&args.queue, &QueueAttributes::default())
        .await
        .with_context(|| format!("creating queue {}", args.queue))?;
    let depth_before = depth(&admin, &args.queue).await?;
    let shared = Arc::new(Shared {
        clients,
        queue: args.queue.clone(),
        body_bytes: args.body_bytes,
        epoch: Instant::now(),
    });
    let progress = !args.no_progress;
    let mut report = Report {
        queue: args.queue.clone(),
        endpoints,
        body_bytes: args.body_bytes,
        connections_per_endpoint: args.connections,
        load_average_before: load_average(),
        load_average_after: None,
        depth_before,
        phases: Vec::new(),
    };
    let cap = Duration::from_secs(args.seconds);
    let mut phases = args.phases.clone();
    phases.sort();
    phases.dedup();
    for phase in phases {
        match phase {
            PhaseKind::Sync => {
                if args.warmup > 0 {
                    let plan = SendPlan {
                        kind: PhaseKind::Sync,
                        tasks: 1,
                        count: args.warmup,
                        batch: 1,
                        cap,
                    };
                    send_phase(&shared, &plan, false).await;
                }
                let plan = SendPlan {
                    kind: PhaseKind::Sync,
                    tasks: 1,
                    count: args.sync_count,
                    batch: 1,
                    cap,
                };
                let phase = send_phase(&shared, &plan, progress).await;
                print_phase(json, &phase);
                report.phases.push(phase);
            }
            PhaseKind::Pipe => {
                for &tasks in &args.in_flight {
                    let plan = SendPlan {
                        kind: PhaseKind::Pipe,
                        tasks,
                        count: args.pipe_count,
                        batch: args.batch,
                        cap,
                    };
                    let phase = send_phase(&shared, &plan, progress).await;
                    print_phase(json, &phase);
                    report.phases.push(phase);
                }
            }
            PhaseKind::Consume => {
                let target = depth(&admin, &args.queue).await?;
                let phase = consume_phase(&shared, &args, target, cap, progress).await;
                print_phase(json, &phase);
                report.phases.push(phase);
            }
            PhaseKind::Steady => {
                let phase = steady_phase(&shared, &args, progress).await;
                print_phase(json, &phase);
                report.phases.push(phase);
            }
            PhaseKind::Receive => {
                let phase = receive_phase(&shared, &args, cap, progress).await;
                print_phase(json, &phase);
                report.phases.push(phase);
            }
            PhaseKind::Idle => {
                let idle = QueueName::new(format!("{}-idle", args.queue))?;
                admin
                    .create_queue(&idle, &QueueAttributes::default())
                    .await
                    .with_context(|| format!("creating queue {idle}"))?;
                let clients = idle_clients(&config, &args)?;
                let phase = idle_phase(&clients, &args, &idle, progress).await;
                print_phase(json, &phase);
                report.phases.push(phase);
            }
            PhaseKind::Kill => {
                let plan = kill_plan
                    .as_ref()
                    .expect("a plan whenever the kill phase is chosen");
                // A queue of its own, so the drain meets only what this phase sent.
                let queue = QueueName::new(format!("{}-kill", args.queue))?;
                admin
                    .create_queue(&queue, &QueueAttributes::default())
                    .await
                    .with_context(|| format!("creating queue {queue}"))?;
                let phase = kill::kill_phase(kill::KillRun {
                    plan,
                    config: &config,
                    clients: &shared.clients,
                    endpoints: &report.endpoints,
                    queue,
                    body_bytes: args.body_bytes,
                    consumers: args.consumers,
                    cap,
                    progress,
                })
                .await;
                print_phase(json, &phase);
                report.phases.push(phase);
            }
        }
    }
    report.load_average_after = load_average();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// Messages in the queue: ready, in flight and delayed.
async fn depth(client: &Client, queue: &QueueName) -> Result<u64> {
    let stats = client
        .queue_stats(queue)
        .await
        .with_context(|| format!("reading queue {}", queue))?;
    Ok(stats.ready + stats.in_flight + stats.delayed)
}

/// `/proc/loadavg`'s first three figures, where there is one.
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut figures = text.split_whitespace().map(str::parse::<f64>);
    Some([
        figures.next()?.ok()?,
        figures.next()?.ok()?,
        figures.next()?.ok()?,
    ])
}

/// What a sending phase does.
struct SendPlan {
    kind: PhaseKind,
    /// Sends in flight.
    tasks: usize,
    /// Messages to send in all.
    count: u64,
    /// Messages per call.
    batch: usize,
    cap: Duration,
}

/// `tasks` senders share `count` tickets until they are gone or the cap passes.
async fn send_phase(shared: &Arc<Shared>, plan: &SendPlan, progress: bool) -> PhaseReport {
    let live = Arc::new(Live::default());
    let tickets = Arc::new(AtomicU64::new(plan.count));
    let started = Instant::now();
    let deadline = started + plan.cap;
    let ticker = progress.then(|| spawn_progress(phase_label(plan), live.clone(), started));
    let mut tasks = JoinSet::new();
    for task in 0..plan.tasks {
        let client = shared.client(task);
        let (shared, live, tickets) = (shared.clone(), live.clone(), tickets.clone());
        let batch = plan.batch as u64;
        tasks.spawn(async move {
            let mut recorder = Recorder::new();
            while Instant::now() < deadline {
                let Some(take) = take_tickets(&tickets, batch) else {
                    break;
                };
                let sent = send_once(&client, &shared, take, &mut recorder).await;
                live.sent.fetch_add(sent, Ordering::Relaxed);
                if sent < take {
                    live.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
            recorder
        });
    }
    let recorder = join_all(tasks).await;
    let elapsed = started.elapsed();
    stop_progress(ticker).await;
    let messages = live.sent.load(Ordering::Relaxed);
    let stopped_by = if tickets.load(Ordering::Relaxed) == 0 {
        Stop::Count
    } else {
        Stop::Time
    };
    phase_report(
        plan.kind, plan.tasks, messages, elapsed, stopped_by, recorder,
    )
}

fn phase_label(plan: &SendPlan) -> String {
    match plan.kind {
        PhaseKind::Pipe => format!("pipe:{}", plan.tasks),
        _ => "sync".to_owned(),
    }
}

/// Takes up to `want` of the remaining tickets; `None` when none are left.
fn take_tickets(tickets: &AtomicU64, want: u64) -> Option<u64> {
    let before = tickets
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            (left > 0).then(|| left - left.min(want))
        })
        .ok()?;
    Some(before.min(want))
}

/// Sends `count` messages in one call (`SendMessageBatch` when more than one); returns how many
/// the node acknowledged.
async fn send_once(client: &Client, shared: &Shared, count: u64, recorder: &mut Recorder) -> u64 {
    let begun = Instant::now();
    if count == 1 {
        let message = SendMessage::new(shared.body());
        match client.send_message(&shared.queue, &message).await {
            Ok(_) => {
                recorder.record("send", begun.elapsed());
                1
            }
            Err(error) => {
                recorder.error("send", error.kind());
                0
            }
        }
    } else {
        let entries: Vec<SendBatchEntry> = (0..count)
            .map(|index| SendBatchEntry {
                id: format!("e{index}"),
                message: SendMessage::new(shared.body()),
            })
            .collect();
        match client.send_message_batch(&shared.queue, &entries).await {
            Ok(outcome) => {
                recorder.record("send", begun.elapsed());
                for failed in &outcome.failed {
                    recorder.error("send-entry", &failed.code);
                }
                outcome.successful.len() as u64
            }
            Err(error) => {
                recorder.error("send", error.kind());
                0
            }
        }
    }
}

/// Waits for every task and merges their recorders. A task that panicked is a bug of the
/// bench, so the panic goes on.
async fn join_all(mut tasks: JoinSet<Recorder>) -> Recorder {
    let mut merged = Recorder::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(recorder) => merged.merge(recorder),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a bench task was cancelled: {error}"),
        }
    }
    merged
}

/// When consumers stop.
struct ConsumeUntil {
    /// Deleting this many ends the phase (`Count`).
    deleted: u64,
    /// No receive starts after this.
    deadline: Instant,
    /// Until this is set, an empty receive does not stop a consumer (the steady phase's
    /// producers are still sending); once set, [`EMPTY_IN_A_ROW_TO_STOP`] in a row do
    /// (`Drained`).
    producers_done: Arc<AtomicBool>,
    /// Set when `deleted` messages have been deleted: a consumer waiting in a long poll then
    /// stops at once instead of at the end of its wait.
    reached: watch::Sender<bool>,
}

/// Empty receives in a row that stop a consumer once nothing more is being sent. One is not
/// enough: an empty answer does not mean an empty queue (SQS's own receives may answer empty
/// while messages wait, and on a cluster concurrent receives race for the same oldest
/// messages; a consumer that stopped at its first one left most of the consume phase to one or
/// two consumers, whatever `--consumers` said).
const EMPTY_IN_A_ROW_TO_STOP: u32 = 3;

/// One consumer: receive, delete what came in one batch, until `until` says stop.
async fn consumer(
    client: Client,
    shared: Arc<Shared>,
    live: Arc<Live>,
    options: ReceiveOptions,
    until: Arc<ConsumeUntil>,
    end_to_end: bool,
) -> (Recorder, ConsumeCounts) {
    let mut recorder = Recorder::new();
    let mut counts = ConsumeCounts::default();
    let mut reached = until.reached.subscribe();
    let mut empty_in_a_row = 0;
    loop {
        if Instant::now() >= until.deadline || live.deleted.load(Ordering::Relaxed) >= until.deleted
        {
            break;
        }
        let producers_done = until.producers_done.load(Ordering::Relaxed);
        let begun = Instant::now();
        let received = tokio::select! {
            // The phase's count was deleted meanwhile: what this receive could still bring is
            // beyond it (dropped, a claim it made comes back after its visibility timeout).
            _ = reached.wait_for(|reached| *reached) => break,
            received = client.receive_messages(&shared.queue, &options) => received,
        };
        let messages = match received {
            Ok(messages) => {
                recorder.record("receive", begun.elapsed());
                messages
            }
            Err(error) => {
                recorder.error("receive", error.kind());
                live.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        if messages.is_empty() {
            counts.empty_receives += 1;
            empty_in_a_row += 1;
            if producers_done && empty_in_a_row >= EMPTY_IN_A_ROW_TO_STOP {
                break;
            }
            continue;
        }
        empty_in_a_row = 0;
        counts.received += messages.len() as u64;
        if end_to_end {
            record_ages(&shared, &messages, &mut recorder);
        }
        let deleted = delete_batch(&client, &shared.queue, &messages, &mut recorder).await;
        counts.deleted += deleted;
        if live
            .deleted
            .fetch_add(deleted, Ordering::Relaxed)
            .saturating_add(deleted)
            >= until.deleted
        {
            until.reached.send_replace(true);
        }
        if deleted < messages.len() as u64 {
            live.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    (recorder, counts)
}

fn record_ages(shared: &Shared, messages: &[Message], recorder: &mut Recorder) {
    for message in messages {
        if let Some(age) = shared.age(&message.body) {
            let micros = u64::try_from(age.as_micros()).unwrap_or(u64::MAX).max(1);
            recorder
                .latency
                .entry("end_to_end")
                .or_insert_with(new_histogram)
                .saturating_record(micros);
        }
    }
}

/// Deletes `messages` in one batch call; returns how many the node deleted.
async fn delete_batch(
    client: &Client,
    queue: &QueueName,
    messages: &[Message],
    recorder: &mut Recorder,
) -> u64 {
    let entries: Vec<DeleteEntry> = messages
        .iter()
        .enumerate()
        .map(|(index, message)| DeleteEntry {
            id: format!("d{index}"),
            receipt_handle: message.receipt_handle.clone(),
        })
        .collect();
    let begun = Instant::now();
    match client.delete_message_batch(queue, &entries).await {
        Ok(outcome) => {
            recorder.record("delete", begun.elapsed());
            for failed in &outcome.failed {
                recorder.error("delete-entry", &failed.code);
            }
            outcome.successful.len() as u64
        }
        Err(error) => {
            recorder.error("delete", error.kind());
            0
        }
    }
}

fn receive_options(args: &BenchArgs) -> ReceiveOptions {
    ReceiveOptions {
        max_messages: args.receive_max,
        visibility_timeout_seconds: Some(RECEIVE_VISIBILITY_S),
        wait_seconds: Some(args.wait),
    }
}

/// Starts `count` consumers.
fn spawn_consumers(
    shared: &Arc<Shared>,
    live: &Arc<Live>,
    args: &BenchArgs,
    until: &Arc<ConsumeUntil>,
    end_to_end: bool,
) -> JoinSet<(Recorder, ConsumeCounts)> {
    let mut tasks = JoinSet::new();
    for task in 0..args.consumers {
        tasks.spawn(consumer(
            shared.client(task),
            shared.clone(),
            live.clone(),
            receive_options(args),
            until.clone(),
            end_to_end,
        ));
    }
    tasks
}

async fn join_consumers(
    mut tasks: JoinSet<(Recorder, ConsumeCounts)>,
) -> (Recorder, ConsumeCounts) {
    let mut recorder = Recorder::new();
    let mut counts = ConsumeCounts::default();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((one, more)) => {
                recorder.merge(one);
                counts.received += more.received;
                counts.deleted += more.deleted;
                counts.empty_receives += more.empty_receives;
            }
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a bench consumer was cancelled: {error}"),
        }
    }
    (recorder, counts)
}

/// Consumers drain the queue: `target` messages (its depth at the start), or until each has
/// found it empty [`EMPTY_IN_A_ROW_TO_STOP`] times in a row, or the cap.
async fn consume_phase(
    shared: &Arc<Shared>,
    args: &BenchArgs,
    target: u64,
    cap: Duration,
    progress: bool,
) -> PhaseReport {
    let live = Arc::new(Live::default());
    let started = Instant::now();
    let until = Arc::new(ConsumeUntil {
        deleted: target,
        deadline: started + cap,
        producers_done: Arc::new(AtomicBool::new(true)),
        reached: watch::Sender::new(false),
    });
    let ticker = progress.then(|| spawn_progress("consume".to_owned(), live.clone(), started));
    let tasks = spawn_consumers(shared, &live, args, &until, false);
    let (recorder, counts) = join_consumers(tasks).await;
    let elapsed = started.elapsed();
    stop_progress(ticker).await;
    let stopped_by = if counts.deleted >= target {
        Stop::Count
    } else if Instant::now() >= until.deadline {
        Stop::Time
    } else {
        Stop::Drained
    };
    let mut phase = phase_report(
        PhaseKind::Consume,
        args.consumers,
        counts.deleted,
        elapsed,
        stopped_by,
        recorder,
    );
    phase.consume = Some(counts);
    phase
}

/// Producers send at `args.rate` for `args.steady_seconds` while consumers receive and delete;
/// then the consumers drain what is left (at most [`STEADY_DRAIN_MAX`]). The queue's depth is
/// sampled each second.
async fn steady_phase(shared: &Arc<Shared>, args: &BenchArgs, progress: bool) -> PhaseReport {
    let live = Arc::new(Live::default());
    let started = Instant::now();
    let producing = Duration::from_secs(args.steady_seconds);
    let producers_done = Arc::new(AtomicBool::new(false));
    let until = Arc::new(ConsumeUntil {
        deleted: u64::MAX,
        deadline: started + producing + STEADY_DRAIN_MAX,
        producers_done: producers_done.clone(),
        reached: watch::Sender::new(false),
    });
    let sampler = spawn_sampler(shared.clone(), live.clone(), started, progress);
    let consumers = spawn_consumers(shared, &live, args, &until, true);
    // Each producer sends one call per tick; together they make the target rate.
    let calls_per_s = args.rate as f64 / args.batch as f64;
    let period = Duration::from_secs_f64(args.producers as f64 / calls_per_s);
    let mut producers = JoinSet::new();
    for task in 0..args.producers {
        let client = shared.client(task);
        let (shared, live) = (shared.clone(), live.clone());
        let batch = args.batch as u64;
        // Producers start spread over one period, not all on the same tick.
        let offset = period.mul_f64(task as f64 / args.producers as f64);
        producers.spawn(async move {
            let mut recorder = Recorder::new();
            let mut ticks = tokio::time::interval_at(started + offset, period);
            // A producer that fell behind sends at once and then keeps the period from there;
            // it does not burst to catch up, so the achieved rate shows the shortfall.
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if started.elapsed() >= producing {
                    break;
                }
                let sent = send_once(&client, &shared, batch, &mut recorder).await;
                live.sent.fetch_add(sent, Ordering::Relaxed);
                if sent < batch {
                    live.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            recorder
        });
    }
    let mut recorder = join_all(producers).await;
    let producing_s = started.elapsed().as_secs_f64();
    producers_done.store(true, Ordering::Relaxed);
    let sent = live.sent.load(Ordering::Relaxed);
    let (consumed, counts) = join_consumers(consumers).await;
    recorder.merge(consumed);
    let elapsed = started.elapsed();
    let depth = sampler.finish().await;
    let stopped_by = if counts.deleted >= sent {
        Stop::Drained
    } else {
        Stop::Time
    };
    let mut phase = phase_report(
        PhaseKind::Steady,
        args.producers,
        sent,
        elapsed,
        stopped_by,
        recorder,
    );
    // The steady phase's throughput is the producers' achieved rate, not diluted by the drain.
    phase.messages_per_s = sent as f64 / producing_s.max(f64::MIN_POSITIVE);
    phase.consume = Some(counts);
    phase.steady = Some(SteadyReport {
        target_rate: args.rate,
        sent_per_s: phase.messages_per_s,
        sent,
        producing_s,
        depth,
    });
    phase
}

/// One task receives `--receive-count` times with a visibility timeout of 0 and no wait: each
/// receive claims and at once releases what it got, so the depth stays as it was.
async fn receive_phase(
    shared: &Arc<Shared>,
    args: &BenchArgs,
    cap: Duration,
    progress: bool,
) -> PhaseReport {
    let live = Arc::new(Live::default());
    let started = Instant::now();
    let deadline = started + cap;
    let ticker = progress.then(|| spawn_progress("receive".to_owned(), live.clone(), started));
    let client = shared.client(0);
    let options = ReceiveOptions {
        max_messages: args.receive_max,
        visibility_timeout_seconds: Some(0),
        wait_seconds: Some(0),
    };
    let mut recorder = Recorder::new();
    let mut counts = ConsumeCounts::default();
    let mut done = 0;
    while done < args.receive_count && Instant::now() < deadline {
        let begun = Instant::now();
        match client.receive_messages(&shared.queue, &options).await {
            Ok(messages) => {
                recorder.record("receive", begun.elapsed());
                counts.received += messages.len() as u64;
                if messages.is_empty() {
                    counts.empty_receives += 1;
                }
                // The progress line counts receives here: nothing is sent or deleted.
                live.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                recorder.error("receive", error.kind());
                live.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
        done += 1;
    }
    let elapsed = started.elapsed();
    stop_progress(ticker).await;
    let stopped_by = if done >= args.receive_count {
        Stop::Count
    } else {
        Stop::Time
    };
    let mut phase = phase_report(
        PhaseKind::Receive,
        1,
        counts.received,
        elapsed,
        stopped_by,
        recorder,
    );
    phase.consume = Some(counts);
    phase
}

/// The idle phase's clients: `--connections` per endpoint, or more when its polls need them. A
/// node carries at most `CALLS_PER_CONNECTION_MAX` calls on one connection at once, and a poll
/// beyond would wait in the client for a stream and time out, measuring the client instead of
/// the node: so every poll gets a stream of its own from the start.
fn idle_clients(config: &ClientConfig, args: &BenchArgs) -> Result<Vec<Client>> {
    let endpoints = config.endpoints.len();
    let needed = args
        .idle_polls
        .div_ceil(endpoints * trireme_client::limits::CALLS_PER_CONNECTION_MAX);
    let connections = args.connections.max(needed);
    if connections > args.connections {
        eprintln!(
            "idle: {connections} connections per endpoint for {} polls (at most {} calls at once \
             on one connection)",
            args.idle_polls,
            trireme_client::limits::CALLS_PER_CONNECTION_MAX
        );
    }
    let mut clients = Vec::with_capacity(endpoints * connections);
    for _ in 0..connections {
        for home in 0..endpoints {
            let mut config = config.clone();
            config.home_endpoint = Some(home);
            clients.push(Client::new(config)?);
        }
    }
    Ok(clients)
}

/// `--idle-polls` tasks each hold a long poll (20 s) open on the empty queue `idle` and open
/// the next when it ends, until `--steady-seconds` have passed; a poll still open then is
/// dropped, which cancels it on the node. The node's CPU and memory meanwhile are for the
/// caller to read from outside: the bench cannot see the node's process.
async fn idle_phase(
    clients: &[Client],
    args: &BenchArgs,
    idle: &QueueName,
    progress: bool,
) -> PhaseReport {
    let live = Arc::new(Live::default());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.steady_seconds);
    let ticker = progress.then(|| spawn_progress("idle".to_owned(), live.clone(), started));
    let options = ReceiveOptions {
        max_messages: 1,
        visibility_timeout_seconds: Some(RECEIVE_VISIBILITY_S),
        wait_seconds: Some(trireme_client::limits::WAIT_SECONDS_MAX),
    };
    let mut tasks = JoinSet::new();
    for task in 0..args.idle_polls {
        let client = clients[task % clients.len()].clone();
        let (live, idle) = (live.clone(), idle.clone());
        tasks.spawn(async move {
            let mut recorder = Recorder::new();
            loop {
                let begun = Instant::now();
                let poll = client.receive_messages(&idle, &options);
                match tokio::time::timeout_at(deadline, poll).await {
                    Err(_deadline) => break,
                    Ok(Ok(messages)) => {
                        recorder.record("receive", begun.elapsed());
                        live.deleted
                            .fetch_add(messages.len() as u64, Ordering::Relaxed);
                    }
                    Ok(Err(error)) => {
                        recorder.error("receive", error.kind());
                        live.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(ERROR_PAUSE).await;
                    }
                }
            }
            recorder
        });
    }
    let recorder = join_all(tasks).await;
    let elapsed = started.elapsed();
    stop_progress(ticker).await;
    let messages = live.deleted.load(Ordering::Relaxed);
    phase_report(
        PhaseKind::Idle,
        args.idle_polls,
        messages,
        elapsed,
        Stop::Time,
        recorder,
    )
}

/// A task that ends when asked and hands back what it gathered.
struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<DepthSample>>,
}

impl Sampler {
    async fn finish(self) -> Vec<DepthSample> {
        // The task may have ended already; then there is no one to tell.
        let _ = self.stop.send(());
        match self.task.await {
            Ok(samples) => samples,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("the depth sampler was cancelled: {error}"),
        }
    }
}

/// Samples the steady phase's depth each second (and prints it as the progress line).
fn spawn_sampler(
    shared: Arc<Shared>,
    live: Arc<Live>,
    started: Instant,
    progress: bool,
) -> Sampler {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut line = ProgressLine::new(progress);
        let mut ticks =
            tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = ticks.tick() => {}
            }
            let stats = shared.clients[0].queue_stats(&shared.queue).await.ok();
            let sample = DepthSample {
                t_s: started.elapsed().as_secs_f64(),
                sent: live.sent.load(Ordering::Relaxed),
                deleted: live.deleted.load(Ordering::Relaxed),
                ready: stats.as_ref().map(|s| s.ready),
                in_flight: stats.as_ref().map(|s| s.in_flight),
                delayed: stats.as_ref().map(|s| s.delayed),
            };
            line.show(&format!(
                "[steady] {:5.1} s  sent {}  deleted {}  depth {}  errors {}",
                sample.t_s,
                sample.sent,
                sample.deleted,
                stats.as_ref().map_or_else(
                    || "?".to_owned(),
                    |s| (s.ready + s.in_flight + s.delayed).to_string()
                ),
                live.errors.load(Ordering::Relaxed),
            ));
            samples.push(sample);
        }
        line.end();
        samples
    });
    Sampler { stop, task }
}

/// The progress line on stderr: rewritten in place on a terminal, a line per second otherwise.
struct ProgressLine {
    enabled: bool,
    terminal: bool,
    shown: bool,
}

impl ProgressLine {
    fn new(enabled: bool) -> ProgressLine {
        ProgressLine {
            enabled,
            terminal: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn show(&mut self, text: &str) {
        if !self.enabled {
            return;
        }
        let mut stderr = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the bench.
        let _ = if self.terminal {
            write!(stderr, "\r{text}\x1b[K")
        } else {
            writeln!(stderr, "{text}")
        };
        let _ = stderr.flush();
        self.shown = true;
    }

    fn end(&mut self) {
        if self.enabled && self.terminal && self.shown {
            eprintln!();
        }
    }
}

/// A progress line for a sending or consuming phase, each second until stopped.
fn spawn_progress(label: String, live: Arc<Live>, started: Instant) -> Sampler {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut line = ProgressLine::new(true);
        let mut ticks =
            tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = ticks.tick() => {}
            }
            let elapsed = started.elapsed().as_secs_f64();
            let done = live.sent.load(Ordering::Relaxed) + live.deleted.load(Ordering::Relaxed);
            line.show(&format!(
                "[{label}] {elapsed:5.1} s  {done} messages  {:.0}/s  errors {}",
                done as f64 / elapsed,
                live.errors.load(Ordering::Relaxed),
            ));
        }
        line.end();
        Vec::new()
    });
    Sampler { stop, task }
}

async fn stop_progress(ticker: Option<Sampler>) {
    if let Some(ticker) = ticker {
        ticker.finish().await;
    }
}

fn phase_report(
    kind: PhaseKind,
    tasks: usize,
    messages: u64,
    elapsed: Duration,
    stopped_by: Stop,
    recorder: Recorder,
) -> PhaseReport {
    let elapsed_s = elapsed.as_secs_f64();
    PhaseReport {
        phase: kind,
        tasks,
        messages,
        calls: recorder.calls,
        elapsed_s,
        messages_per_s: messages as f64 / elapsed_s.max(f64::MIN_POSITIVE),
        stopped_by,
        latency_ms: recorder
            .latency
            .iter()
            .map(|(call, histogram)| (*call, Latency::of(histogram)))
            .collect(),
        errors: recorder.errors,
        consume: None,
        steady: None,
        kill: None,
    }
}

/// Prints one phase for people (the JSON report comes whole at the end).
fn print_phase(json: bool, phase: &PhaseReport) {
    if json {
        return;
    }
    let name = match phase.phase {
        PhaseKind::Sync => "sync".to_owned(),
        PhaseKind::Pipe => format!("pipe {} in flight", phase.tasks),
        PhaseKind::Consume => format!("consume, {} consumers", phase.tasks),
        PhaseKind::Steady => format!("steady, {} producers", phase.tasks),
        PhaseKind::Receive => "receive (visibility 0, nothing consumed)".to_owned(),
        PhaseKind::Idle => format!("idle, {} long polls", phase.tasks),
        PhaseKind::Kill => format!("kill, {} sync senders", phase.tasks),
    };
    println!(
        "{name}: {} messages in {:.2} s = {:.0} messages/s (stopped by {:?})",
        phase.messages, phase.elapsed_s, phase.messages_per_s, phase.stopped_by
    );
    for (call, l) in &phase.latency_ms {
        println!(
            "  {call:<10} ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  ({} calls)",
            l.p50, l.p90, l.p99, l.p99_9, l.max, l.count
        );
    }
    if let Some(steady) = &phase.steady {
        println!(
            "  target {} messages/s, achieved {:.0}; depth per second: {}",
            steady.target_rate,
            steady.sent_per_s,
            steady
                .depth
                .iter()
                .map(|d| d
                    .ready
                    .zip(d.in_flight)
                    .zip(d.delayed)
                    .map_or_else(|| "?".to_owned(), |((r, i), l)| (r + i + l).to_string()))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    if let Some(kill) = &phase.kill {
        kill::print(kill);
    }
    if phase.errors.is_empty() {
        println!("  errors: none");
    } else {
        let errors: Vec<String> = phase
            .errors
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect();
        println!("  errors: {}", errors.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_run_out_exactly() {
        let tickets = AtomicU64::new(25);
        let mut taken = Vec::new();
        while let Some(n) = take_tickets(&tickets, 10) {
            taken.push(n);
        }
        assert_eq!(taken, [10, 10, 5]);
        assert_eq!(tickets.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_stamped_body_has_the_size_asked_and_its_age() {
        let shared = Shared {
            clients: Vec::new(),
            queue: QueueName::new("q").unwrap(),
            body_bytes: 20,
            epoch: Instant::now(),
        };
        let body = shared.body();
        assert_eq!(body.len(), 20);
        assert!(shared.age(&body).unwrap() < Duration::from_secs(60));
        assert_eq!(shared.age("not a stamp at all"), None);
    }

    #[test]
    fn percentiles_come_from_the_histogram_in_milliseconds() {
        let mut recorder = Recorder::new();
        for micros in 1..=1_000 {
            recorder.record("send", Duration::from_micros(micros));
        }
        let latency = Latency::of(&recorder.latency["send"]);
        assert_eq!(latency.count, 1_000);
        assert!((latency.p50 - 0.5).abs() < 0.01, "{latency:?}");
        assert!((latency.p99 - 0.99).abs() < 0.01, "{latency:?}");
        assert!((latency.max - 1.0).abs() < 0.01, "{latency:?}");
    }
}
