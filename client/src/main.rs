//! `trireme`: the command-line client. Manage queues, send, receive and delete messages,
//! redrive dead-letter queues, run a command per message (`trireme worker`), and measure nodes
//! (`trireme bench`, in `bench.rs`).
//!
//! Output is for people by default and JSON with `--json` (one document per command, or one
//! line per message for `worker`). Errors and logs (filtered by `TRIREME_LOG`) go to stderr;
//! a failed command exits with status 1, a usage error with 2. This binary owns
//! presentation only; every rule about queues lives in the client crate and the node.

mod bench;

use std::collections::BTreeMap;
use std::io::{Read, Write};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use trireme_client::{
    Client, ClientConfig, DEFAULT_ENDPOINT, Message, MessageAttribute, QueueAttributeChanges,
    QueueAttributes, QueueInfo, QueueName, ReceiptHandle, ReceiveOptions, RedriveChange,
    RedrivePolicy, RedriveTask, SendMessage, StartRedrive, TaskHandle,
};

#[derive(Parser, Debug)]
#[command(
    name = "trireme",
    version,
    about = "Command-line client for Trireme message queues"
)]
struct Cli {
    /// Node address; several nodes of a cluster repeated or comma-separated (`a:7100,b:7100`),
    /// used by every command, `worker` and `bench` included. A node that cannot be reached is
    /// skipped for a while and the call moves to the next one.
    #[arg(long = "endpoint", env = "TRIREME_ENDPOINT", value_delimiter = ',', default_value = DEFAULT_ENDPOINT, global = true)]
    endpoints: Vec<String>,

    /// Bearer token for nodes started with `--api-token-file` (sent as `authorization: Bearer
    /// <token>` on every call). Prefer the environment variable: a command line is visible to
    /// every user of the machine.
    #[arg(long, env = "TRIREME_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,

    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, inspect, change and remove queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Send a message (the body is the argument, or stdin when it is absent or `-`).
    Send(SendArgs),
    /// Receive messages, optionally deleting them once printed.
    Receive(ReceiveArgs),
    /// Delete a received message by its receipt handle.
    Delete {
        /// The queue.
        queue: QueueName,
        /// The receipt handle from `trireme receive`.
        receipt_handle: String,
    },
    /// Move messages out of a dead-letter queue.
    #[command(subcommand)]
    Redrive(RedriveCommand),
    /// Run a command per message until SIGINT or SIGTERM: the body on its stdin, exit status 0
    /// deletes the message, 75 (EX_TEMPFAIL) retries it later, anything else moves it to the
    /// queue's dead-letter queue.
    Worker(WorkerArgs),
    /// Measure the nodes: sync send, pipelined send, consume and a steady mixed phase, with
    /// throughput, latency percentiles and errors by kind; stops by itself.
    Bench(bench::BenchArgs),
}

#[derive(Args, Debug)]
struct WorkerArgs {
    /// The queue.
    queue: QueueName,
    /// The command, run by `sh -c` with the body on stdin and TRIREME_QUEUE,
    /// TRIREME_MESSAGE_ID, TRIREME_IDEMPOTENCY_KEY and TRIREME_RECEIVE_COUNT set; its stdout
    /// goes to stderr so that this command's own output stays parseable.
    #[arg(long)]
    exec: String,
    /// Commands running at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Seconds a received message stays invisible; extended while the command runs.
    #[arg(long, default_value_t = trireme_client::limits::WORKER_VISIBILITY_SECONDS_DEFAULT)]
    visibility: u32,
    /// Long-poll wait of each receive in seconds (0-20).
    #[arg(long, default_value_t = trireme_client::limits::WAIT_SECONDS_MAX)]
    wait: u32,
    /// Seconds running commands may finish after a signal before their messages are released.
    #[arg(long, default_value_t = trireme_client::limits::WORKER_SHUTDOWN_GRACE_DEFAULT.as_secs())]
    grace: u64,
    /// Largest retry delay in seconds (the first is up to 1 s, doubling per receive).
    #[arg(long, default_value_t = trireme_client::limits::WORKER_RETRY_BACKOFF_CAP_DEFAULT.as_secs())]
    retry_cap: u64,
}

#[derive(Subcommand, Debug)]
enum QueueCommand {
    /// Create a queue (succeeds unchanged if it exists with the same attributes).
    Create {
        /// The queue name: 1-80 of [A-Za-z0-9_-].
        name: QueueName,
        #[command(flatten)]
        attributes: AttributeArgs,
        /// A tag, `key=value`; repeatable.
        #[arg(long = "tag", value_parser = parse_pair)]
        tags: Vec<(String, String)>,
    },
    /// List queue names.
    List {
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Print one page of at most this many names (1-1000) and the token of the next;
        /// without it every page is followed.
        #[arg(long)]
        max_results: Option<u32>,
        /// Continue a paged listing from this token (implies one page).
        #[arg(long)]
        page_token: Option<String>,
    },
    /// Show a queue's attributes, tags and message counts.
    Get {
        /// The queue.
        name: QueueName,
    },
    /// Change a queue's attributes.
    Set {
        /// The queue.
        name: QueueName,
        #[command(flatten)]
        attributes: AttributeArgs,
        /// Remove the redrive policy.
        #[arg(long, conflicts_with_all = ["dead_letter_queue", "max_receive_count"])]
        clear_redrive_policy: bool,
        /// Add or replace a tag, `key=value`; repeatable.
        #[arg(long = "tag", value_parser = parse_pair)]
        tags: Vec<(String, String)>,
        /// Remove the tag with this key; repeatable.
        #[arg(long = "untag")]
        untags: Vec<String>,
    },
    /// Delete a queue and all its messages.
    Delete {
        /// The queue.
        name: QueueName,
    },
    /// Remove every message of a queue.
    Purge {
        /// The queue.
        name: QueueName,
    },
    /// List the queues that use this queue as their dead-letter queue.
    Sources {
        /// The dead-letter queue.
        name: QueueName,
    },
}

#[derive(Args, Debug)]
struct AttributeArgs {
    /// Seconds a received message stays invisible (0-43200).
    #[arg(long)]
    visibility_timeout: Option<u32>,
    /// Seconds before a new message can be received (0-900).
    #[arg(long)]
    delay: Option<u32>,
    /// Seconds a message is kept (60-1209600).
    #[arg(long)]
    retention: Option<u32>,
    /// Largest body plus attributes in bytes (1024-1048576).
    #[arg(long)]
    max_message_bytes: Option<u32>,
    /// Default long-poll wait of a receive in seconds (0-20).
    #[arg(long)]
    receive_wait: Option<u32>,
    /// Dead-letter queue of the redrive policy (needs --max-receive-count).
    #[arg(long, requires = "max_receive_count")]
    dead_letter_queue: Option<QueueName>,
    /// Receives after which a message moves to the dead-letter queue (1-1000).
    #[arg(long, requires = "dead_letter_queue")]
    max_receive_count: Option<u32>,
}

impl AttributeArgs {
    fn redrive_policy(&self) -> Option<RedrivePolicy> {
        match (&self.dead_letter_queue, self.max_receive_count) {
            (Some(queue), Some(count)) => Some(RedrivePolicy {
                dead_letter_queue: queue.clone(),
                max_receive_count: count,
            }),
            _ => None,
        }
    }
}

#[derive(Args, Debug)]
struct SendArgs {
    /// The queue.
    queue: QueueName,
    /// The body; read from stdin when absent or `-`.
    body: Option<String>,
    /// A String attribute, `name=value`; repeatable.
    #[arg(long = "attribute", value_parser = parse_pair)]
    attributes: Vec<(String, String)>,
    /// Seconds before the message can be received (0-900).
    #[arg(long)]
    delay: Option<u32>,
    /// Deduplication id: a second send with it within five minutes stores nothing.
    #[arg(long)]
    deduplication_id: Option<String>,
}

#[derive(Args, Debug)]
struct ReceiveArgs {
    /// The queue.
    queue: QueueName,
    /// At most this many messages (1-10).
    #[arg(long, default_value_t = 1)]
    max: u32,
    /// Long-poll up to this many seconds for the first message (0-20; default: the queue's).
    #[arg(long)]
    wait: Option<u32>,
    /// Seconds the messages stay invisible (0-43200; default: the queue's).
    #[arg(long)]
    visibility: Option<u32>,
    /// Delete each message after printing it.
    #[arg(long)]
    delete: bool,
}

#[derive(Subcommand, Debug)]
enum RedriveCommand {
    /// Start moving a dead-letter queue's messages back to their sources (or to --to).
    Start {
        /// The dead-letter queue.
        queue: QueueName,
        /// Move everything here instead of to each message's source.
        #[arg(long)]
        to: Option<QueueName>,
        /// Messages per second (1-500; default: as fast as the node allows).
        #[arg(long)]
        rate: Option<u32>,
    },
    /// List recent redrive tasks of a dead-letter queue.
    List {
        /// The dead-letter queue.
        queue: QueueName,
        /// At most this many tasks (1-10).
        #[arg(long, default_value_t = 10)]
        max: u32,
    },
    /// Cancel a running redrive task.
    Cancel {
        /// The task handle from `trireme redrive start` or `list`.
        task_handle: String,
    },
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected key=value, got {s:?}"))?;
    if key.is_empty() {
        return Err(format!("empty key in {s:?}"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// Prints `value` as JSON, or the text `human` makes of it.
///
/// # Errors
/// A failed write to stdout (`BrokenPipe` when the reader went away, which `main` takes for the
/// end of the output, as `trireme queue list | head` wants).
fn emit<T: Serialize>(json: bool, value: &T, human: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        print_line(&serde_json::to_string_pretty(value)?)?;
    } else {
        let text = human(value);
        if !text.is_empty() {
            print_line(&text)?;
        }
    }
    Ok(())
}

/// Writes `text` and a newline to stdout. Unlike `println!`, which panics when stdout is a pipe
/// whose reader has gone, a failed write is an error for the caller.
fn print_line(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")?;
    stdout.flush()
}

/// Whether `error` is a write to a stdout whose reader went away.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn describe_queue(q: &QueueInfo) -> String {
    let s = &q.settings;
    let mut out = format!(
        "queue {}\n  ready {}  in flight {}  delayed {}\n  visibility timeout {} s, delay {} s, retention {} s, max message {} bytes, receive wait {} s\n  created at {} ms, modified at {} ms",
        q.name,
        q.stats.ready,
        q.stats.in_flight,
        q.stats.delayed,
        s.visibility_timeout_seconds,
        s.delay_seconds,
        s.retention_seconds,
        s.max_message_bytes,
        s.receive_wait_seconds,
        q.created_at_ms,
        q.modified_at_ms,
    );
    if let Some(p) = &s.redrive_policy {
        out.push_str(&format!(
            "\n  dead-letter queue {} after {} receives",
            p.dead_letter_queue, p.max_receive_count
        ));
    }
    for (k, v) in &q.tags {
        out.push_str(&format!("\n  tag {k}={v}"));
    }
    out
}

fn describe_message(m: &Message) -> String {
    let mut out = format!(
        "message {} (receive {}, sent at {} ms)\n  receipt handle {}",
        m.message_id, m.receive_count, m.sent_at_ms, m.receipt_handle
    );
    if let Some(source) = &m.dead_letter_source {
        out.push_str(&format!("\n  dead-lettered from {source}"));
    }
    for (name, attribute) in &m.attributes {
        let value = match &attribute.value {
            trireme_client::AttributeValue::String(s) => s.clone(),
            trireme_client::AttributeValue::Binary(b) => format!("{} bytes", b.len()),
        };
        out.push_str(&format!(
            "\n  attribute {name} ({}) = {value}",
            attribute.data_type
        ));
    }
    out.push_str(&format!("\n  body {}", m.body));
    out
}

fn describe_task(t: &RedriveTask) -> String {
    let mut out = format!(
        "task {} {}: moved {} of {}, failed {}",
        t.task_handle, t.status, t.moved, t.to_move, t.failed
    );
    if let Some(reason) = &t.failure_reason {
        out.push_str(&format!(" ({reason})"));
    }
    out
}

async fn run(cli: Cli) -> Result<()> {
    let mut config = ClientConfig::new(cli.endpoints.clone());
    config.token = cli.token.clone();
    let client = Client::new(config.clone())?;
    let json = cli.json;
    match cli.command {
        Command::Queue(command) => queue(&client, json, command).await,
        Command::Send(args) => {
            let body = match args.body.as_deref() {
                Some(body) if body != "-" => body.to_owned(),
                _ => {
                    let mut body = String::new();
                    std::io::stdin()
                        .read_to_string(&mut body)
                        .context("reading the body from stdin")?;
                    body
                }
            };
            let mut message = SendMessage::new(body);
            for (name, value) in args.attributes {
                message = message.attribute(name, MessageAttribute::string(value));
            }
            message.delay_seconds = args.delay;
            message.deduplication_id = args.deduplication_id;
            let sent = client.send_message(&args.queue, &message).await?;
            emit(json, &sent, |s| {
                if s.duplicate {
                    format!("{} (duplicate of an earlier send)", s.message_id)
                } else {
                    s.message_id.to_string()
                }
            })
        }
        Command::Receive(args) => {
            let options = ReceiveOptions {
                max_messages: args.max,
                visibility_timeout_seconds: args.visibility,
                wait_seconds: args.wait,
            };
            let messages = client.receive_messages(&args.queue, &options).await?;
            // Printed before deleted: a message is never deleted unseen, even if a delete fails.
            emit(json, &messages, |ms| {
                if ms.is_empty() {
                    "no messages".to_owned()
                } else {
                    ms.iter()
                        .map(describe_message)
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            })?;
            if args.delete {
                for m in &messages {
                    client
                        .delete_message(&args.queue, &m.receipt_handle)
                        .await
                        .with_context(|| format!("deleting message {}", m.message_id))?;
                }
            }
            Ok(())
        }
        Command::Delete {
            queue,
            receipt_handle,
        } => {
            client
                .delete_message(&queue, &ReceiptHandle::new(receipt_handle))
                .await?;
            emit(json, &serde_json::json!({ "deleted": true }), |_| {
                "deleted".to_owned()
            })
        }
        Command::Redrive(command) => redrive(&client, json, command).await,
        Command::Worker(args) => worker::run(client, json, args).await,
        Command::Bench(args) => bench::run(config, json, args).await,
    }
}

async fn queue(client: &Client, json: bool, command: QueueCommand) -> Result<()> {
    match command {
        QueueCommand::Create {
            name,
            attributes,
            tags,
        } => {
            let wanted = QueueAttributes {
                visibility_timeout_seconds: attributes.visibility_timeout,
                delay_seconds: attributes.delay,
                retention_seconds: attributes.retention,
                max_message_bytes: attributes.max_message_bytes,
                receive_wait_seconds: attributes.receive_wait,
                redrive_policy: attributes.redrive_policy(),
                redrive_allow_policy: None,
            };
            let tags: BTreeMap<String, String> = tags.into_iter().collect();
            let created = client.create_queue_with_tags(&name, &wanted, &tags).await?;
            emit(json, &created, |c| {
                let verb = if c.created {
                    "created"
                } else {
                    "exists already:"
                };
                format!("{verb} {}", describe_queue(&c.queue))
            })
        }
        QueueCommand::List {
            prefix,
            max_results,
            page_token,
        } if max_results.is_some() || page_token.is_some() => {
            let page = client
                .list_queues(&prefix, max_results, page_token.as_deref())
                .await?;
            emit(json, &page, |p| {
                let mut lines: Vec<String> = p.names.iter().map(ToString::to_string).collect();
                if let Some(token) = &p.next_page_token {
                    lines.push(format!("next page: --page-token {token}"));
                }
                lines.join("\n")
            })
        }
        QueueCommand::List { prefix, .. } => {
            let names = client.list_all_queues(&prefix).await?;
            emit(json, &names, |ns| {
                ns.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        QueueCommand::Get { name } => {
            let info = client.get_queue(&name).await?;
            emit(json, &info, describe_queue)
        }
        QueueCommand::Set {
            name,
            attributes,
            clear_redrive_policy,
            tags,
            untags,
        } => {
            let changes = QueueAttributeChanges {
                visibility_timeout_seconds: attributes.visibility_timeout,
                delay_seconds: attributes.delay,
                retention_seconds: attributes.retention,
                max_message_bytes: attributes.max_message_bytes,
                receive_wait_seconds: attributes.receive_wait,
                redrive_policy: match (clear_redrive_policy, attributes.redrive_policy()) {
                    (true, _) => RedriveChange::Clear,
                    (false, Some(policy)) => RedriveChange::Set(policy),
                    (false, None) => RedriveChange::Keep,
                },
                redrive_allow_policy: None,
            };
            let attributes_changed = changes != QueueAttributeChanges::default();
            if !attributes_changed && tags.is_empty() && untags.is_empty() {
                bail!("nothing to change: give at least one attribute or tag");
            }
            if !tags.is_empty() {
                client.tag_queue(&name, &tags.into_iter().collect()).await?;
            }
            if !untags.is_empty() {
                client.untag_queue(&name, &untags).await?;
            }
            let info = if attributes_changed {
                client.set_queue_attributes(&name, &changes).await?
            } else {
                client.get_queue(&name).await?
            };
            emit(json, &info, describe_queue)
        }
        QueueCommand::Delete { name } => {
            client.delete_queue(&name).await?;
            emit(json, &serde_json::json!({ "deleted": name }), |_| {
                format!("deleted queue {name}")
            })
        }
        QueueCommand::Purge { name } => {
            client.purge_queue(&name).await?;
            emit(json, &serde_json::json!({ "purged": name }), |_| {
                format!("purged queue {name}")
            })
        }
        QueueCommand::Sources { name } => {
            let mut names = Vec::new();
            let mut token: Option<String> = None;
            for _ in 0..trireme_client::limits::LIST_PAGES_MAX {
                let page = client
                    .list_dead_letter_source_queues(&name, None, token.as_deref())
                    .await?;
                names.extend(page.names);
                token = page.next_page_token;
                if token.is_none() {
                    break;
                }
            }
            emit(json, &names, |ns| {
                ns.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
    }
}

async fn redrive(client: &Client, json: bool, command: RedriveCommand) -> Result<()> {
    match command {
        RedriveCommand::Start { queue, to, rate } => {
            let handle = client
                .start_redrive(&StartRedrive {
                    source_queue: queue,
                    destination_queue: to,
                    max_messages_per_second: rate,
                })
                .await?;
            emit(json, &serde_json::json!({ "task_handle": handle }), |_| {
                handle.to_string()
            })
        }
        RedriveCommand::List { queue, max } => {
            let tasks = client.list_redrives(&queue, Some(max)).await?;
            emit(json, &tasks, |ts| {
                if ts.is_empty() {
                    "no redrive tasks".to_owned()
                } else {
                    ts.iter().map(describe_task).collect::<Vec<_>>().join("\n")
                }
            })
        }
        RedriveCommand::Cancel { task_handle } => {
            let moved = client.cancel_redrive(&TaskHandle::new(task_handle)).await?;
            emit(json, &serde_json::json!({ "moved": moved }), |_| {
                format!("cancelled after moving {moved} messages")
            })
        }
    }
}

mod worker {
    //! `trireme worker --exec`: the client crate's `Worker` with a shell command as handler.

    use std::os::fd::AsFd;
    use std::process::Stdio;
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::{Context, Result};
    use tokio::io::AsyncWriteExt;
    use tokio::signal::unix::{SignalKind, signal};
    use trireme_client::{
        Backoff, Client, HandlerError, HandlerOutcome, Job, Message, Worker, WorkerConfig,
        WorkerCounters, WorkerMetrics,
    };

    use super::WorkerArgs;

    /// The exit status that asks for a retry: `EX_TEMPFAIL` from sysexits.h.
    const EXIT_RETRY: i32 = 75;

    /// Prints one line per settled message and keeps the totals.
    struct Report {
        json: bool,
        counters: WorkerCounters,
    }

    impl Report {
        fn line(&self, event: &str, message: &Message, detail: Option<String>) {
            if self.json {
                let mut value = serde_json::json!({
                    "event": event,
                    "message_id": message.message_id,
                    "receive_count": message.receive_count,
                });
                if let Some(detail) = detail {
                    value["detail"] = serde_json::Value::String(detail);
                }
                // The worker goes on when nobody reads its log of jobs any more.
                let _ = super::print_line(&value.to_string());
            } else {
                let line = match detail {
                    Some(detail) => format!("{event} {} ({detail})", message.message_id),
                    None => format!("{event} {}", message.message_id),
                };
                let _ = super::print_line(&line);
            }
        }
    }

    impl WorkerMetrics for Report {
        fn processed(&self, message: &Message) {
            self.counters.processed(message);
            self.line("processed", message, None);
        }
        fn retried(&self, message: &Message, delay: Duration) {
            self.counters.retried(message, delay);
            self.line(
                "retried",
                message,
                Some(format!("visible again in {} s", delay.as_secs())),
            );
        }
        fn dead_lettered(&self, message: &Message) {
            self.counters.dead_lettered(message);
            self.line("dead_lettered", message, None);
        }
        fn extended(&self, message: &Message) {
            self.counters.extended(message);
        }
        fn released(&self, message: &Message) {
            self.counters.released(message);
            self.line("released", message, None);
        }
        fn handler_latency(&self, message: &Message, latency: Duration, outcome: HandlerOutcome) {
            self.counters.handler_latency(message, latency, outcome);
        }
    }

    /// Runs the command for one job and maps its exit status to an outcome.
    async fn run_command(command: Arc<String>, job: Job) -> Result<(), HandlerError> {
        let stdout = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(HandlerError::retryable)?;
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(command.as_str())
            .env("TRIREME_QUEUE", job.queue.as_str())
            .env("TRIREME_MESSAGE_ID", job.message.message_id.as_str())
            .env("TRIREME_IDEMPOTENCY_KEY", job.idempotency_key())
            .env(
                "TRIREME_RECEIVE_COUNT",
                job.message.receive_count.to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::from(stdout))
            // A released message's command is killed with it.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HandlerError::retryable(format!("cannot start sh: {e}")))?;
        let mut stdin = child.stdin.take().expect("stdin was piped");
        // A command that exits without reading its input is not an error of the worker's.
        let _ = stdin.write_all(job.message.body.as_bytes()).await;
        drop(stdin);
        let status = child.wait().await.map_err(HandlerError::retryable)?;
        match status.code() {
            Some(0) => Ok(()),
            Some(EXIT_RETRY) => Err(HandlerError::retryable(format!("exit status {EXIT_RETRY}"))),
            Some(code) => Err(HandlerError::terminal(format!("exit status {code}"))),
            None => Err(HandlerError::terminal("killed by a signal")),
        }
    }

    pub(super) async fn run(client: Client, json: bool, args: WorkerArgs) -> Result<()> {
        let config = WorkerConfig {
            concurrency: args.concurrency,
            wait_seconds: args.wait,
            visibility_timeout_seconds: args.visibility,
            shutdown_grace: Duration::from_secs(args.grace),
            retry_backoff: Backoff::new(
                trireme_client::limits::WORKER_RETRY_BACKOFF_BASE_DEFAULT,
                Duration::from_secs(args.retry_cap)
                    .max(trireme_client::limits::WORKER_RETRY_BACKOFF_BASE_DEFAULT),
            ),
            ..WorkerConfig::default()
        };
        let report = Arc::new(Report {
            json,
            counters: WorkerCounters::default(),
        });
        let command = Arc::new(args.exec);
        let worker = Worker::new(client, args.queue, move |job| {
            run_command(command.clone(), job)
        })
        .with_config(config)
        .with_metrics(report.clone());
        let mut terminate =
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        let result = worker.run(shutdown).await;
        let totals = report.counters.snapshot();
        if json {
            println!(
                "{}",
                serde_json::json!({ "event": "stopped", "totals": totals })
            );
        } else {
            eprintln!(
                "stopped: {} processed, {} retried, {} dead-lettered, {} released, {} extensions",
                totals.processed,
                totals.retried,
                totals.dead_lettered,
                totals.released,
                totals.extended
            );
        }
        Ok(result?)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Diagnostics go to stderr so stdout stays the command's output; TRIREME_LOG filters them
    // (e.g. `TRIREME_LOG=trireme_client=debug`), warnings by default.
    let filter = tracing_subscriber::EnvFilter::try_from_env("TRIREME_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of the output went away (`| head`): it has what it wanted.
        Err(error) if is_broken_pipe(&error) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
