//! The bench's `kill` phase: failover under load. Sync senders (one send in flight each, homed
//! on the endpoints in turn, so each member is the home of some) send numbered messages while,
//! at stated times, the operator's kill command takes one member down and the restart command
//! brings it back; then the queue is drained (receive and delete everything) and every
//! acknowledged message is looked for.
//!
//! The bench cannot know how the operator runs members, so it runs the operator's shell
//! commands (`sh -c`) at the stated times and waits for each to return (at most
//! [`COMMAND_TIMEOUT`]); the restart command must leave the member running and return. Without
//! a restart command something else brings the member back (the dev cluster restarts a member
//! that died after 2 s).
//!
//! The report: attempts, acknowledgements, failures by kind, the longest time without an
//! acknowledgement over all senders and per sender (when it began, relative to the kill), and
//! after the drain the acknowledged messages never received (lost) and the duplicates. What is
//! computed from the records ([`longest_gap`], [`reconcile`]) is pure and unit-tested; the rest
//! only sends, runs commands and records. Every loop ends by itself: the senders at
//! `--kill-seconds`, the drain at the phase cap `--seconds`, each call at the client's timeouts.
//! This module measures and asserts nothing about speed.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use rand::Rng;
use serde::Serialize;
use thiserror::Error;
use tokio::process::Command;
use tokio::task::JoinSet;
use tokio::time::Instant;
use trireme_client::{Client, ClientConfig, QueueName, ReceiveOptions, RetryPolicy, SendMessage};

use super::{
    ERROR_PAUSE, Live, PhaseKind, PhaseReport, Recorder, Stop, delete_batch, phase_report,
    spawn_progress, stop_progress,
};

/// Bytes at the start of a kill-phase body that name it: the run (16 hex digits), the sender
/// (4 digits) and the sender's attempt (12 digits). The rest is padding to `--body-bytes`.
pub(crate) const TAG_BYTES: usize = 32;

/// Senders the phase may run.
const SENDERS_MAX: usize = 1_000;

/// How long the kill or the restart command may take before it is killed and the phase goes on.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Empty receives in a row after which a drain consumer asks the queue's depth, and stops when
/// it is zero even though some acknowledged messages were not seen (they are then reported
/// lost); while the depth says messages remain it goes on, to the phase cap. Each receive
/// waits up to [`DRAIN_WAIT_S`].
const DRAIN_EMPTY_RECEIVES_MAX: u32 = 5;

/// Visibility timeout of the drain's receives: far longer than a receive-then-delete takes,
/// yet short, because a message whose claim race both coordinators gave up waits it out
/// before any receive returns it (spec/replication.md, *Split claims (F2)*); with 60 s the
/// drain met such messages 61-78 s after it began (BENCHMARKS.md 6d).
const DRAIN_VISIBILITY_S: u32 = 10;

/// Long-poll wait of the drain's receives.
const DRAIN_WAIT_S: u32 = 1;

/// How often the probe asks the killed member alone whether it serves again.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How long one probe call may take: a member that takes longer is not serving yet.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Failed attempts whose message the report keeps (the earliest), and lost messages it names.
const SAMPLES_MAX: usize = 20;

const _: () = assert!(TAG_BYTES <= super::BODY_BYTES_MAX);
const _: () = assert!(
    SENDERS_MAX <= 9_999,
    "a sender's number fits its four digits"
);

/// The kill phase's flags (all named `kill` somewhere, since they mean nothing to other phases).
#[derive(Args, Debug, Clone)]
pub(crate) struct KillArgs {
    /// kill phase: shell command (`sh -c`) that SIGKILLs one member, e.g.
    /// `kill -9 $(cat /run/n2.pid)`; it must return within 30 s.
    #[arg(long)]
    kill_command: Option<String>,
    /// kill phase: shell command that starts the member again and returns with it running (e.g.
    /// ending in `&`). Without it something else restarts the member (the dev cluster does,
    /// 2 s after a member died).
    #[arg(long)]
    restart_command: Option<String>,
    /// kill phase: the endpoint (as given to --endpoint) of the member the kill command kills:
    /// the report marks the senders homed there and times the member's return.
    #[arg(long)]
    killed_endpoint: Option<String>,
    /// kill phase: sync senders, one send in flight each, homed on the endpoints in turn.
    #[arg(long, default_value_t = 6)]
    kill_senders: usize,
    /// kill phase: seconds after the senders start when the kill command runs.
    #[arg(long, default_value_t = 5)]
    kill_after: u64,
    /// kill phase: seconds after the kill command when the restart command runs (default 5;
    /// needs --restart-command).
    #[arg(long)]
    restart_after: Option<u64>,
    /// kill phase: seconds the senders send in all; the kill and the restart come before.
    #[arg(long, default_value_t = 20)]
    kill_seconds: u64,
}

/// A kill flag that does not make a phase.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum KillFlagsError {
    #[error("--phases kill needs --kill-command, the shell command that kills one member")]
    NoKillCommand,
    #[error("--kill-command and the other kill flags need --phases kill")]
    NotChosen,
    #[error("--restart-after needs --restart-command")]
    RestartAfterWithoutCommand,
    #[error("--kill-senders must be 1-{SENDERS_MAX}, not {senders}")]
    Senders { senders: usize },
    #[error(
        "--kill-after must be at least 1 s: the gaps are measured against acknowledgements before the kill"
    )]
    KillAtStart,
    #[error(
        "the kill ({kill_at_s} s) and the restart ({restart_at_s:?} s after the start) must come before the senders stop (--kill-seconds {stop_s})"
    )]
    AfterTheStop {
        kill_at_s: u64,
        restart_at_s: Option<u64>,
        stop_s: u64,
    },
    #[error("--killed-endpoint {given} is not one of the endpoints ({endpoints})")]
    UnknownEndpoint { given: String, endpoints: String },
    #[error(
        "--body-bytes must be at least {TAG_BYTES} in the kill phase: each body names its sender and attempt"
    )]
    BodyTooSmall { body_bytes: usize },
}

/// Default seconds from the kill to the restart.
const RESTART_AFTER_DEFAULT_S: u64 = 5;

/// The kill phase as checked flags make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KillPlan {
    kill_command: String,
    restart_command: Option<String>,
    /// Index into the endpoints of the member the kill command kills, when the operator said.
    killed_endpoint: Option<usize>,
    senders: usize,
    /// Since the senders started.
    kill_at: Duration,
    /// Since the senders started; `None`: no restart command.
    restart_at: Option<Duration>,
    /// Since the senders started: no send starts after it.
    stop_at: Duration,
}

impl KillArgs {
    /// The plan, when `chosen` (the kill phase is among `--phases`); `None` when it is not.
    ///
    /// # Errors
    /// A flag missing, out of range, or given without the phase ([`KillFlagsError`]).
    pub(crate) fn plan(
        &self,
        chosen: bool,
        endpoints: &[String],
        body_bytes: usize,
    ) -> Result<Option<KillPlan>, KillFlagsError> {
        if !chosen {
            let given = self.kill_command.is_some()
                || self.restart_command.is_some()
                || self.killed_endpoint.is_some()
                || self.restart_after.is_some();
            return if given {
                Err(KillFlagsError::NotChosen)
            } else {
                Ok(None)
            };
        }
        let kill_command = self
            .kill_command
            .clone()
            .ok_or(KillFlagsError::NoKillCommand)?;
        if self.restart_after.is_some() && self.restart_command.is_none() {
            return Err(KillFlagsError::RestartAfterWithoutCommand);
        }
        if !(1..=SENDERS_MAX).contains(&self.kill_senders) {
            return Err(KillFlagsError::Senders {
                senders: self.kill_senders,
            });
        }
        if self.kill_after == 0 {
            return Err(KillFlagsError::KillAtStart);
        }
        if body_bytes < TAG_BYTES {
            return Err(KillFlagsError::BodyTooSmall { body_bytes });
        }
        let restart_at_s = self.restart_command.as_ref().map(|_| {
            self.kill_after
                .saturating_add(self.restart_after.unwrap_or(RESTART_AFTER_DEFAULT_S))
        });
        let last_s = restart_at_s.unwrap_or(self.kill_after);
        if last_s >= self.kill_seconds {
            return Err(KillFlagsError::AfterTheStop {
                kill_at_s: self.kill_after,
                restart_at_s,
                stop_s: self.kill_seconds,
            });
        }
        let killed_endpoint = match &self.killed_endpoint {
            None => None,
            Some(given) => Some(
                endpoints
                    .iter()
                    .position(|e| bare(e) == bare(given))
                    .ok_or_else(|| KillFlagsError::UnknownEndpoint {
                        given: given.clone(),
                        endpoints: endpoints.join(", "),
                    })?,
            ),
        };
        Ok(Some(KillPlan {
            kill_command,
            restart_command: self.restart_command.clone(),
            killed_endpoint,
            senders: self.kill_senders,
            kill_at: Duration::from_secs(self.kill_after),
            restart_at: restart_at_s.map(Duration::from_secs),
            stop_at: Duration::from_secs(self.kill_seconds),
        }))
    }
}

/// An endpoint without its scheme, so `127.0.0.1:7100` names `http://127.0.0.1:7100`.
fn bare(endpoint: &str) -> &str {
    let endpoint = endpoint.trim().trim_end_matches('/');
    endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint)
}

/// One send of the kill phase, times since the senders started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub(crate) sender: usize,
    /// The sender's attempt number: each attempt sends a body of its own.
    pub(crate) seq: u64,
    pub(crate) begun: Duration,
    pub(crate) ended: Duration,
    /// `None`: acknowledged; otherwise the error's kind.
    pub(crate) failure: Option<&'static str>,
}

/// One message the drain received, named by its body's tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) sender: usize,
    pub(crate) seq: u64,
    pub(crate) message_id: String,
}

/// The longest time without an acknowledgement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Gap {
    /// Milliseconds from an acknowledgement to the next one (or to the senders' stop).
    pub(crate) ms: f64,
    /// When it began, in milliseconds after the kill command started (negative: before).
    pub(crate) began_ms_after_kill: f64,
    /// The gap ran to the senders' stop: no acknowledgement ended it.
    pub(crate) open_at_stop: bool,
}

/// The longest gap between consecutive acknowledgements at `acks` (in any order, since the
/// senders started) among those that began in `window`, or `None` when none did. A gap that no
/// acknowledgement ends runs to `stop`; with no acknowledgement at all the gap is the whole
/// phase, begun at zero. The time before the first acknowledgement is not a gap: it is the
/// first send's latency, connection set-up included.
pub(crate) fn longest_gap(
    acks: &[Duration],
    stop: Duration,
    kill: Duration,
    window: Range<Duration>,
) -> Option<Gap> {
    let mut sorted = acks.to_vec();
    sorted.sort_unstable();
    // (length, start, open at stop); the earliest of equal gaps is kept.
    let mut gaps: Vec<(Duration, Duration, bool)> = sorted
        .windows(2)
        .map(|pair| (pair[1] - pair[0], pair[0], false))
        .collect();
    match sorted.last() {
        None => gaps.push((stop, Duration::ZERO, true)),
        Some(&last) if stop > last => gaps.push((stop - last, last, true)),
        Some(_) => {}
    }
    let (length, began, open_at_stop) = gaps
        .into_iter()
        .filter(|(_, began, _)| window.contains(began))
        .reduce(|best, gap| if gap.0 > best.0 { gap } else { best })?;
    Some(Gap {
        ms: ms(length),
        began_ms_after_kill: ms_between(kill, began),
        open_at_stop,
    })
}

/// The longest gaps of one set of acknowledgements, by the part of the phase they began in.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Gaps {
    /// Over the whole phase.
    pub(crate) all: Gap,
    /// Before the kill command started: the baseline the machine gives without a fault.
    pub(crate) before_kill: Option<Gap>,
    /// From the kill to the restart command (to the stop without one): the member is down.
    pub(crate) while_down: Option<Gap>,
    /// From the restart command on.
    pub(crate) after_restart: Option<Gap>,
}

/// [`longest_gap`] over the whole phase and over each of its parts.
pub(crate) fn gaps(
    acks: &[Duration],
    stop: Duration,
    kill: Duration,
    restart: Option<Duration>,
) -> Gaps {
    let end = Duration::MAX;
    Gaps {
        all: longest_gap(acks, stop, kill, Duration::ZERO..end)
            .expect("the whole phase holds a gap: at least the one to the stop"),
        before_kill: longest_gap(acks, stop, kill, Duration::ZERO..kill),
        while_down: longest_gap(acks, stop, kill, kill..restart.unwrap_or(end)),
        after_restart: restart.and_then(|at| longest_gap(acks, stop, kill, at..end)),
    }
}

/// A duration in milliseconds (exact to the microsecond).
fn ms(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1_000.0
}

/// Milliseconds from `from` to `to`, negative when `to` is earlier.
fn ms_between(from: Duration, to: Duration) -> f64 {
    if to >= from {
        ms(to - from)
    } else {
        -ms(from - to)
    }
}

/// What the drain found against what was sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Reconciliation {
    /// Distinct messages of this run the drain received.
    pub(crate) received_distinct: u64,
    /// Acknowledged messages the drain never received.
    pub(crate) lost: u64,
    /// The first of them (sender, attempt), at most [`SAMPLES_MAX`].
    pub(crate) lost_first: Vec<(usize, u64)>,
    /// Receipts beyond the first of one message: `redelivered` (the same message id again, its
    /// delete failed or its visibility ran out) plus `stored_twice`.
    pub(crate) duplicates: u64,
    pub(crate) redelivered: u64,
    /// A body received under a second message id: one send stored as two messages.
    pub(crate) stored_twice: u64,
    /// Failed attempts whose message was received anyway: the node stored it and the answer was
    /// lost (allowed: the sender cannot know, at-least-once).
    pub(crate) failed_but_stored: u64,
    /// Bodies tagged with this run that no attempt sent (a bug of the bench or the queue).
    pub(crate) unknown: u64,
}

/// Holds the drain's receipts against the attempts.
pub(crate) fn reconcile(attempts: &[Attempt], received: &[Received]) -> Reconciliation {
    let outcome: BTreeMap<(usize, u64), bool> = attempts
        .iter()
        .map(|a| ((a.sender, a.seq), a.failure.is_none()))
        .collect();
    // Message ids seen per sent body.
    let mut seen: BTreeMap<(usize, u64), BTreeSet<&str>> = BTreeMap::new();
    let mut result = Reconciliation::default();
    for receipt in received {
        let key = (receipt.sender, receipt.seq);
        if !outcome.contains_key(&key) {
            result.unknown += 1;
            continue;
        }
        let ids = seen.entry(key).or_default();
        if ids.is_empty() {
            ids.insert(&receipt.message_id);
        } else if ids.insert(&receipt.message_id) {
            result.stored_twice += 1;
        } else {
            result.redelivered += 1;
        }
    }
    result.duplicates = result.redelivered + result.stored_twice;
    result.received_distinct = seen.len() as u64;
    for (key, acknowledged) in &outcome {
        match (acknowledged, seen.contains_key(key)) {
            (true, false) => {
                result.lost += 1;
                if result.lost_first.len() < SAMPLES_MAX {
                    result.lost_first.push(*key);
                }
            }
            (false, true) => result.failed_but_stored += 1,
            _ => {}
        }
    }
    result
}

/// The tag that starts a kill-phase body.
fn tag(run: u64, sender: usize, seq: u64) -> String {
    format!("{run:016x}{sender:04}{seq:012}")
}

/// The (sender, attempt) of a body tagged by run `run`, if it is one.
fn parse_tag(run: u64, body: &str) -> Option<(usize, u64)> {
    let head = body.get(..TAG_BYTES)?;
    if u64::from_str_radix(&head[..16], 16).ok()? != run {
        return None;
    }
    Some((head[16..20].parse().ok()?, head[20..32].parse().ok()?))
}

/// How a kill or restart command went.
#[derive(Debug, Serialize)]
pub(crate) struct CommandRun {
    command: String,
    /// When it started, seconds since the senders started.
    at_s: f64,
    took_ms: f64,
    /// `exit 0`, `exit 1`, `signal 9`, `timed out`, or why it could not start.
    status: String,
    ok: bool,
}

async fn run_command(command: &str, started: Instant) -> CommandRun {
    let at = started.elapsed();
    let begun = Instant::now();
    // The command's output goes to stderr, so that stdout stays the report.
    let stdout = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_or_else(|_| std::process::Stdio::null(), std::process::Stdio::from);
    let child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .kill_on_drop(true)
        .spawn();
    let (status, ok) = match child {
        Err(error) => (format!("could not start: {error}"), false),
        Ok(mut child) => match tokio::time::timeout(COMMAND_TIMEOUT, child.wait()).await {
            Err(_) => (
                format!("timed out after {} s", COMMAND_TIMEOUT.as_secs()),
                false,
            ),
            Ok(Err(error)) => (format!("could not wait: {error}"), false),
            Ok(Ok(status)) => {
                use std::os::unix::process::ExitStatusExt;
                match (status.code(), status.signal()) {
                    (Some(code), _) => (format!("exit {code}"), code == 0),
                    (None, Some(signal)) => (format!("signal {signal}"), false),
                    (None, None) => ("ended".to_owned(), false),
                }
            }
        },
    };
    CommandRun {
        command: command.to_owned(),
        at_s: at.as_secs_f64(),
        took_ms: begun.elapsed().as_secs_f64() * 1_000.0,
        status,
        ok,
    }
}

/// One sender's figures.
#[derive(Debug, Serialize)]
pub(crate) struct SenderReport {
    sender: usize,
    /// The endpoint its calls start at (they fail over to the others).
    home: String,
    /// Its home is the killed member's endpoint.
    home_killed: bool,
    attempts: u64,
    acknowledged: u64,
    failed: u64,
    longest_gap: Gaps,
}

/// A failed attempt, as the report keeps the earliest of them.
#[derive(Debug, Serialize)]
pub(crate) struct FailureSample {
    sender: usize,
    /// When the attempt began and ended, milliseconds after the kill command started.
    began_ms_after_kill: f64,
    ended_ms_after_kill: f64,
    kind: &'static str,
    message: String,
}

/// What the drain did.
#[derive(Debug, Serialize)]
pub(crate) struct DrainReport {
    received: u64,
    deleted: u64,
    /// Messages in the queue that this run did not send (left by an earlier run).
    foreign: u64,
    elapsed_s: f64,
    stopped_by: Stop,
    /// Seconds from the drain's start until the last acknowledged message was first received
    /// (absent when some never were).
    all_acknowledged_seen_s: Option<f64>,
    /// The queue's depth after the drain (absent when the call failed).
    depth_after: Option<u64>,
}

/// What only the kill phase has.
#[derive(Debug, Serialize)]
pub(crate) struct KillReport {
    queue: QueueName,
    senders: usize,
    /// The run's tag in the bodies (hex).
    run: String,
    killed_endpoint: Option<String>,
    kill: CommandRun,
    restart: Option<CommandRun>,
    /// Milliseconds from the kill command's start until the killed member alone answered a
    /// call again (probed every 20 ms once the kill command returned); `None` without
    /// `--killed-endpoint`, or when it never answered before the senders stopped.
    member_back_ms_after_kill: Option<f64>,
    /// Whether the probe ever saw the killed member not answering.
    member_seen_down: bool,
    attempts: u64,
    acknowledged: u64,
    /// Failed attempts by kind of error.
    failed: BTreeMap<&'static str, u64>,
    failed_total: u64,
    /// Failed attempts that were in flight while the kill command ran (begun before it
    /// returned, ended after it started): at most the senders that had a call on the member.
    failed_in_flight_at_kill: u64,
    /// Over all senders together.
    longest_gap: Gaps,
    per_sender: Vec<SenderReport>,
    first_failures: Vec<FailureSample>,
    drain: DrainReport,
    reconciliation: Reconciliation,
}

/// Everything the kill phase needs from the bench.
pub(crate) struct KillRun<'a> {
    pub(crate) plan: &'a KillPlan,
    pub(crate) config: &'a ClientConfig,
    /// One client per sender slot, homed on the endpoints in turn (as the bench's clients).
    pub(crate) clients: &'a [Client],
    pub(crate) endpoints: &'a [String],
    pub(crate) queue: QueueName,
    pub(crate) body_bytes: usize,
    pub(crate) consumers: usize,
    /// The drain's time cap.
    pub(crate) cap: Duration,
    pub(crate) progress: bool,
}

/// Runs the kill phase: senders, kill, restart, stop, drain, reconcile.
pub(crate) async fn kill_phase(run: KillRun<'_>) -> PhaseReport {
    let plan = run.plan;
    let tag_run: u64 = rand::rng().random();
    let live = Arc::new(Live::default());
    let started = Instant::now();
    let ticker = run
        .progress
        .then(|| spawn_progress("kill".to_owned(), live.clone(), started));
    let stop_at = started + plan.stop_at;
    let mut senders = JoinSet::new();
    for sender in 0..plan.senders {
        let client = run.clients[sender % run.clients.len()].clone();
        let (queue, live) = (run.queue.clone(), live.clone());
        let body_bytes = run.body_bytes;
        senders.spawn(async move {
            let mut recorder = Recorder::new();
            let mut attempts = Vec::new();
            let mut failures = Vec::new();
            let mut seq = 0_u64;
            while Instant::now() < stop_at {
                let mut body = tag(tag_run, sender, seq);
                body.extend(std::iter::repeat_n('x', body_bytes - TAG_BYTES));
                let begun = started.elapsed();
                let result = client.send_message(&queue, &SendMessage::new(body)).await;
                let ended = started.elapsed();
                let failure = match result {
                    Ok(_) => {
                        recorder.record("send", ended - begun);
                        live.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        None
                    }
                    Err(error) => {
                        recorder.error("send", error.kind());
                        live.errors
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if failures.len() < SAMPLES_MAX {
                            failures.push((begun, ended, sender, error.kind(), error.to_string()));
                        }
                        Some(error.kind())
                    }
                };
                attempts.push(Attempt {
                    sender,
                    seq,
                    begun,
                    ended,
                    failure,
                });
                seq += 1;
                if failure.is_some() {
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
            (recorder, attempts, failures)
        });
    }

    // The operator's commands, at their times, and the probe of the killed member.
    tokio::time::sleep_until(started + plan.kill_at).await;
    let kill = run_command(&plan.kill_command, started).await;
    let kill_at = Duration::from_secs_f64(kill.at_s);
    let probe = plan.killed_endpoint.map(|index| {
        tokio::spawn(probe_member(
            run.config.clone(),
            run.endpoints[index].clone(),
            run.queue.clone(),
            started,
            stop_at,
        ))
    });
    let restart = match (&plan.restart_command, plan.restart_at) {
        (Some(command), Some(at)) => {
            tokio::time::sleep_until(started + at).await;
            Some(run_command(command, started).await)
        }
        _ => None,
    };

    let mut recorder = Recorder::new();
    let mut attempts = Vec::new();
    let mut failures = Vec::new();
    while let Some(done) = senders.join_next().await {
        match done {
            Ok((one, some, failed)) => {
                recorder.merge(one);
                attempts.extend(some);
                failures.extend(failed);
            }
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a kill-phase sender was cancelled: {error}"),
        }
    }
    let sending = started.elapsed();
    let (back, seen_down) = match probe {
        None => (None, false),
        Some(task) => task
            .await
            .expect("the probe neither panics nor is cancelled"),
    };
    stop_progress(ticker).await;

    let acknowledged: BTreeSet<(usize, u64)> = attempts
        .iter()
        .filter(|a| a.failure.is_none())
        .map(|a| (a.sender, a.seq))
        .collect();
    let (received, drain, drain_recorder) = drain(&run, tag_run, &acknowledged).await;
    recorder.merge(drain_recorder);
    let reconciliation = reconcile(&attempts, &received);

    let ms_after_kill = |at: Duration| ms_between(kill_at, at);
    let restart_at = restart
        .as_ref()
        .map(|run| Duration::from_secs_f64(run.at_s));
    let all_acks: Vec<Duration> = attempts
        .iter()
        .filter(|a| a.failure.is_none())
        .map(|a| a.ended)
        .collect();
    let mut failed: BTreeMap<&'static str, u64> = BTreeMap::new();
    for kind in attempts.iter().filter_map(|a| a.failure) {
        *failed.entry(kind).or_default() += 1;
    }
    let per_sender = (0..plan.senders)
        .map(|sender| {
            let mine: Vec<&Attempt> = attempts.iter().filter(|a| a.sender == sender).collect();
            let acks: Vec<Duration> = mine
                .iter()
                .filter(|a| a.failure.is_none())
                .map(|a| a.ended)
                .collect();
            let home = sender % run.endpoints.len();
            SenderReport {
                sender,
                home: run.endpoints[home].clone(),
                home_killed: plan.killed_endpoint == Some(home),
                attempts: mine.len() as u64,
                acknowledged: acks.len() as u64,
                failed: (mine.len() - acks.len()) as u64,
                longest_gap: gaps(&acks, plan.stop_at, kill_at, restart_at),
            }
        })
        .collect();
    let kill_end = kill_at + Duration::from_secs_f64(kill.took_ms / 1_000.0);
    let failed_in_flight_at_kill = attempts
        .iter()
        .filter(|a| a.failure.is_some() && a.begun <= kill_end && a.ended >= kill_at)
        .count() as u64;
    failures.sort_by_key(|f| f.0);
    let first_failures = failures
        .into_iter()
        .take(SAMPLES_MAX)
        .map(|(begun, ended, sender, kind, message)| FailureSample {
            sender,
            began_ms_after_kill: ms_after_kill(begun),
            ended_ms_after_kill: ms_after_kill(ended),
            kind,
            message,
        })
        .collect();
    let acknowledged_count = acknowledged.len() as u64;
    let mut phase = phase_report(
        PhaseKind::Kill,
        plan.senders,
        acknowledged_count,
        sending,
        Stop::Time,
        recorder,
    );
    phase.kill = Some(KillReport {
        queue: run.queue.clone(),
        senders: plan.senders,
        run: format!("{tag_run:016x}"),
        killed_endpoint: plan.killed_endpoint.map(|i| run.endpoints[i].clone()),
        kill,
        restart,
        member_back_ms_after_kill: back.map(ms_after_kill),
        member_seen_down: seen_down,
        attempts: attempts.len() as u64,
        acknowledged: acknowledged_count,
        failed_total: failed.values().sum(),
        failed_in_flight_at_kill,
        failed,
        longest_gap: gaps(&all_acks, plan.stop_at, kill_at, restart_at),
        per_sender,
        first_failures,
        drain,
        reconciliation,
    });
    phase
}

/// Asks the killed member alone (no failover, no retry) for the queue's counts every
/// [`PROBE_INTERVAL`] until it answers after having failed, or `stop_at`. Returns when it
/// answered again (since `started`, when the senders started) and whether it was ever seen
/// down.
async fn probe_member(
    config: ClientConfig,
    endpoint: String,
    queue: QueueName,
    started: Instant,
    stop_at: Instant,
) -> (Option<Duration>, bool) {
    let mut config = ClientConfig {
        endpoints: vec![endpoint],
        home_endpoint: Some(0),
        retry: RetryPolicy::never(),
        ..config
    };
    config.request_timeout = PROBE_TIMEOUT;
    config.connect_timeout = PROBE_TIMEOUT;
    let client = Client::new(config).expect("an endpoint the bench's own clients accepted");
    let mut seen_down = false;
    while Instant::now() < stop_at {
        match tokio::time::timeout(PROBE_TIMEOUT, client.queue_stats(&queue)).await {
            Ok(Ok(_)) if seen_down => return (Some(started.elapsed()), true),
            Ok(Ok(_)) => {}
            _ => seen_down = true,
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    (None, seen_down)
}

/// Receives and deletes everything in the queue with `run.consumers` consumers, until each has
/// seen every acknowledged message and then an empty receive, or has had
/// [`DRAIN_EMPTY_RECEIVES_MAX`] empty receives in a row and then read a depth of zero, or the
/// cap passed.
async fn drain(
    run: &KillRun<'_>,
    tag_run: u64,
    acknowledged: &BTreeSet<(usize, u64)>,
) -> (Vec<Received>, DrainReport, Recorder) {
    struct Seen {
        received: Vec<Received>,
        acknowledged_missing: BTreeSet<(usize, u64)>,
        foreign: u64,
        deleted: u64,
        /// When the last acknowledged message was first received, since the drain began.
        all_seen_after: Option<Duration>,
    }
    let seen = Arc::new(Mutex::new(Seen {
        received: Vec::new(),
        acknowledged_missing: acknowledged.clone(),
        foreign: 0,
        deleted: 0,
        all_seen_after: None,
    }));
    let started = Instant::now();
    let deadline = started + run.cap;
    let options = ReceiveOptions {
        max_messages: trireme_client::limits::RECEIVE_MESSAGES_MAX,
        visibility_timeout_seconds: Some(DRAIN_VISIBILITY_S),
        wait_seconds: Some(DRAIN_WAIT_S),
    };
    let mut consumers = JoinSet::new();
    for consumer in 0..run.consumers {
        let client = run.clients[consumer % run.clients.len()].clone();
        let (seen, queue) = (seen.clone(), run.queue.clone());
        consumers.spawn(async move {
            let mut recorder = Recorder::new();
            let mut empty_in_a_row = 0;
            let mut timed_out = true;
            while Instant::now() < deadline {
                let begun = Instant::now();
                let messages = match client.receive_messages(&queue, &options).await {
                    Ok(messages) => {
                        recorder.record("receive", begun.elapsed());
                        messages
                    }
                    Err(error) => {
                        recorder.error("receive", error.kind());
                        tokio::time::sleep(ERROR_PAUSE).await;
                        continue;
                    }
                };
                if messages.is_empty() {
                    empty_in_a_row += 1;
                    let all_seen = seen
                        .lock()
                        .expect("the drain's lock is never held across a panic")
                        .acknowledged_missing
                        .is_empty();
                    if all_seen {
                        timed_out = false;
                        break;
                    }
                    if empty_in_a_row >= DRAIN_EMPTY_RECEIVES_MAX {
                        empty_in_a_row = 0;
                        let depth = client
                            .queue_stats(&queue)
                            .await
                            .map(|s| s.ready + s.in_flight + s.delayed);
                        if depth.is_ok_and(|d| d == 0) {
                            timed_out = false;
                            break;
                        }
                    }
                    continue;
                }
                empty_in_a_row = 0;
                {
                    let mut seen = seen
                        .lock()
                        .expect("the drain's lock is never held across a panic");
                    for message in &messages {
                        match parse_tag(tag_run, &message.body) {
                            Some((sender, seq)) => {
                                if seen.acknowledged_missing.remove(&(sender, seq))
                                    && seen.acknowledged_missing.is_empty()
                                {
                                    seen.all_seen_after = Some(started.elapsed());
                                }
                                seen.received.push(Received {
                                    sender,
                                    seq,
                                    message_id: message.message_id.as_str().to_owned(),
                                });
                            }
                            None => seen.foreign += 1,
                        }
                    }
                }
                let deleted = delete_batch(&client, &queue, &messages, &mut recorder).await;
                seen.lock()
                    .expect("the drain's lock is never held across a panic")
                    .deleted += deleted;
            }
            (recorder, timed_out)
        });
    }
    let mut recorder = Recorder::new();
    let mut any_timed_out = false;
    while let Some(done) = consumers.join_next().await {
        match done {
            Ok((one, timed_out)) => {
                recorder.merge(one);
                any_timed_out |= timed_out;
            }
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => panic!("a drain consumer was cancelled: {error}"),
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let depth_after = run
        .clients
        .first()
        .expect("the bench has a client")
        .queue_stats(&run.queue)
        .await
        .ok()
        .map(|s| s.ready + s.in_flight + s.delayed);
    let seen = Arc::try_unwrap(seen)
        .map_err(|_| "shared")
        .expect("every consumer has ended")
        .into_inner()
        .expect("the drain's lock is never held across a panic");
    let report = DrainReport {
        received: seen.received.len() as u64 + seen.foreign,
        deleted: seen.deleted,
        foreign: seen.foreign,
        elapsed_s,
        stopped_by: if any_timed_out {
            Stop::Time
        } else {
            Stop::Drained
        },
        all_acknowledged_seen_s: seen.all_seen_after.map(|d| d.as_secs_f64()),
        depth_after,
    };
    (seen.received, report, recorder)
}

/// Prints the kill phase's own lines (after the common ones).
pub(crate) fn print(report: &KillReport) {
    let command = |run: &CommandRun| {
        format!(
            "at {:.2} s ({}, {:.0} ms)",
            run.at_s, run.status, run.took_ms
        )
    };
    println!(
        "  kill {}; restart {}; killed member answering again {}",
        command(&report.kill),
        report
            .restart
            .as_ref()
            .map_or_else(|| "by someone else".to_owned(), command),
        match (report.member_back_ms_after_kill, report.member_seen_down) {
            (Some(ms), _) => format!("{ms:.0} ms after the kill"),
            (None, true) => "never before the stop".to_owned(),
            (None, false) =>
                if report.killed_endpoint.is_some() {
                    "always (never seen down)".to_owned()
                } else {
                    "not probed (no --killed-endpoint)".to_owned()
                },
        }
    );
    let failed: Vec<String> = report
        .failed
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    println!(
        "  attempts {}, acknowledged {}, failed {}{}, of them in flight at the kill {}",
        report.attempts,
        report.acknowledged,
        report.failed_total,
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        },
        report.failed_in_flight_at_kill
    );
    println!(
        "  longest gap between acknowledgements: {}",
        gaps_text(&report.longest_gap)
    );
    for sender in &report.per_sender {
        println!(
            "    sender {} (home {}{}): {} acknowledged, {} failed, longest gap {}",
            sender.sender,
            sender.home,
            if sender.home_killed { ", killed" } else { "" },
            sender.acknowledged,
            sender.failed,
            gaps_text(&sender.longest_gap)
        );
    }
    let r = &report.reconciliation;
    println!(
        "  drain: received {} ({} of this run, {} foreign), deleted {} in {:.1} s (stopped by {:?}, depth after {})",
        report.drain.received,
        r.received_distinct,
        report.drain.foreign,
        report.drain.deleted,
        report.drain.elapsed_s,
        report.drain.stopped_by,
        report
            .drain
            .depth_after
            .map_or_else(|| "?".to_owned(), |d| d.to_string())
    );
    println!(
        "  lost {} of {} acknowledged; duplicates {} (redelivered {}, stored twice {}); failed but stored {}; unknown {}",
        r.lost,
        report.acknowledged,
        r.duplicates,
        r.redelivered,
        r.stored_twice,
        r.failed_but_stored,
        r.unknown
    );
    for failure in report.first_failures.iter().take(5) {
        println!(
            "    failure {:+.1} .. {:+.1} ms after the kill: {}",
            failure.began_ms_after_kill, failure.ended_ms_after_kill, failure.message
        );
    }
}

fn gaps_text(gaps: &Gaps) -> String {
    let part = |gap: &Option<Gap>| gap.as_ref().map_or_else(|| "-".to_owned(), gap_text);
    format!(
        "{}; before the kill {}, while down {}, after the restart {}",
        gap_text(&gaps.all),
        part(&gaps.before_kill),
        part(&gaps.while_down),
        part(&gaps.after_restart)
    )
}

fn gap_text(gap: &Gap) -> String {
    format!(
        "{:.1} ms from {:+.1} ms after the kill{}",
        gap.ms,
        gap.began_ms_after_kill,
        if gap.open_at_stop {
            " (to the stop)"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn attempt(sender: usize, seq: u64, ended_ms: u64, failure: Option<&'static str>) -> Attempt {
        Attempt {
            sender,
            seq,
            begun: ms(ended_ms.saturating_sub(1)),
            ended: ms(ended_ms),
            failure,
        }
    }

    fn received(sender: usize, seq: u64, id: &str) -> Received {
        Received {
            sender,
            seq,
            message_id: id.to_owned(),
        }
    }

    const ALL: Range<Duration> = Duration::ZERO..Duration::MAX;

    #[test]
    fn the_longest_gap_is_between_acknowledgements_in_time_order() {
        // Out of order on purpose: acks of several senders arrive merged.
        let acks = [ms(1_010), ms(1_000), ms(1_400), ms(1_020), ms(1_450)];
        let gap = longest_gap(&acks, ms(1_460), ms(1_015), ALL);
        assert_eq!(
            gap,
            Some(Gap {
                ms: 380.0,
                began_ms_after_kill: 5.0,
                open_at_stop: false
            })
        );
    }

    #[test]
    fn a_gap_no_acknowledgement_ends_runs_to_the_stop() {
        let gap = longest_gap(&[ms(100), ms(110)], ms(2_000), ms(500), ALL).unwrap();
        assert_eq!(gap.ms, 1_890.0);
        assert_eq!(gap.began_ms_after_kill, -390.0);
        assert!(gap.open_at_stop);
        // A send answered after the stop does not make a negative gap.
        let late = longest_gap(&[ms(100), ms(2_050)], ms(2_000), ms(500), ALL).unwrap();
        assert_eq!(late.ms, 1_950.0);
        assert!(!late.open_at_stop);
    }

    #[test]
    fn without_acknowledgements_the_whole_phase_is_the_gap() {
        let gap = longest_gap(&[], ms(3_000), ms(1_000), ALL).unwrap();
        assert_eq!(gap.ms, 3_000.0);
        assert_eq!(gap.began_ms_after_kill, -1_000.0);
        assert!(gap.open_at_stop);
    }

    #[test]
    fn each_part_of_the_phase_has_its_own_longest_gap() {
        // Kill at 1,000 ms, restart at 2,000, stop at 3,000. Before the kill: 790 ms from 200,
        // also the longest overall; the 300 ms from 990 began before the kill, so it is not
        // the down part's. While down: 200 ms from 1,300 (the earliest of three). After the
        // restart: 750 ms from 2,200; the last 50 ms run to the stop.
        let acks = [
            0, 100, 200, 990, 1_290, 1_300, 1_500, 1_700, 1_900, 2_050, 2_200, 2_950,
        ]
        .map(ms);
        let found = gaps(&acks, ms(3_000), ms(1_000), Some(ms(2_000)));
        let at = |gap: Option<Gap>| gap.map(|g| (g.ms, g.began_ms_after_kill));
        assert_eq!(at(Some(found.all.clone())), Some((790.0, -800.0)));
        assert_eq!(at(found.before_kill), Some((790.0, -800.0)));
        assert_eq!(at(found.while_down), Some((200.0, 300.0)));
        assert_eq!(at(found.after_restart), Some((750.0, 1_200.0)));
        // Without a restart the member is down to the stop, and nothing is after a restart.
        let unrestarted = gaps(&acks, ms(3_000), ms(1_000), None);
        assert_eq!(at(unrestarted.while_down), Some((750.0, 1_200.0)));
        assert_eq!(unrestarted.after_restart, None);
        // A part in which no gap began has none.
        assert_eq!(
            longest_gap(&acks, ms(3_000), ms(1_000), ms(2_960)..ms(2_970)),
            None
        );
    }

    #[test]
    fn an_acknowledged_message_never_received_is_lost_and_a_failed_one_is_not() {
        let attempts = [
            attempt(0, 0, 10, None),
            attempt(0, 1, 20, None),
            attempt(0, 2, 30, Some("Unavailable")),
            attempt(1, 0, 15, None),
            attempt(1, 1, 25, Some("Timeout")),
        ];
        let got = [
            received(0, 0, "a"),
            received(1, 0, "b"),
            // A failed send whose message the node stored anyway.
            received(1, 1, "c"),
        ];
        let r = reconcile(&attempts, &got);
        assert_eq!(r.lost, 1);
        assert_eq!(r.lost_first, [(0, 1)]);
        assert_eq!(r.failed_but_stored, 1);
        assert_eq!(r.received_distinct, 3);
        assert_eq!((r.duplicates, r.unknown), (0, 0));
    }

    #[test]
    fn duplicates_tell_a_redelivery_from_a_message_stored_twice() {
        let attempts = [attempt(0, 0, 10, None), attempt(0, 1, 20, None)];
        let got = [
            received(0, 0, "a"),
            received(0, 0, "a"),
            received(0, 1, "b"),
            received(0, 1, "b2"),
            received(0, 1, "b"),
            // Tagged with the run, but no attempt sent it.
            received(3, 9, "z"),
        ];
        let r = reconcile(&attempts, &got);
        assert_eq!(r.redelivered, 2);
        assert_eq!(r.stored_twice, 1);
        assert_eq!(r.duplicates, 3);
        assert_eq!(r.unknown, 1);
        assert_eq!((r.lost, r.received_distinct), (0, 2));
    }

    #[test]
    fn a_tag_names_its_run_sender_and_attempt() {
        let run = 0x0123_4567_89ab_cdef;
        let mut body = tag(run, 42, 1_234_567);
        assert_eq!(body.len(), TAG_BYTES);
        body.push_str("xxxx");
        assert_eq!(parse_tag(run, &body), Some((42, 1_234_567)));
        assert_eq!(parse_tag(run + 1, &body), None);
        assert_eq!(parse_tag(run, "short"), None);
    }

    fn args() -> KillArgs {
        KillArgs {
            kill_command: Some("kill -9 1".to_owned()),
            restart_command: Some("true".to_owned()),
            killed_endpoint: Some("127.0.0.1:2".to_owned()),
            kill_senders: 6,
            kill_after: 5,
            restart_after: None,
            kill_seconds: 20,
        }
    }

    #[test]
    fn kill_flags_make_a_plan_or_say_what_is_wrong() {
        let endpoints = ["http://127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let plan = args().plan(true, &endpoints, 1024).unwrap().unwrap();
        assert_eq!(plan.killed_endpoint, Some(1));
        assert_eq!(plan.kill_at, ms(5_000));
        assert_eq!(plan.restart_at, Some(ms(10_000)));
        assert_eq!(plan.stop_at, ms(20_000));
        let named = KillArgs {
            killed_endpoint: Some("http://127.0.0.1:1/".to_owned()),
            ..args()
        };
        assert_eq!(
            named
                .plan(true, &endpoints, 1024)
                .unwrap()
                .unwrap()
                .killed_endpoint,
            Some(0)
        );

        let error = |args: KillArgs, body: usize| args.plan(true, &endpoints, body).unwrap_err();
        assert_eq!(
            error(
                KillArgs {
                    kill_command: None,
                    ..args()
                },
                1024
            ),
            KillFlagsError::NoKillCommand
        );
        assert_eq!(
            error(
                KillArgs {
                    restart_command: None,
                    restart_after: Some(3),
                    ..args()
                },
                1024
            ),
            KillFlagsError::RestartAfterWithoutCommand
        );
        assert_eq!(
            error(
                KillArgs {
                    kill_senders: 0,
                    ..args()
                },
                1024
            ),
            KillFlagsError::Senders { senders: 0 }
        );
        assert_eq!(
            error(
                KillArgs {
                    kill_after: 0,
                    ..args()
                },
                1024
            ),
            KillFlagsError::KillAtStart
        );
        assert_eq!(
            error(
                KillArgs {
                    restart_after: Some(15),
                    ..args()
                },
                1024
            ),
            KillFlagsError::AfterTheStop {
                kill_at_s: 5,
                restart_at_s: Some(20),
                stop_s: 20
            }
        );
        assert!(matches!(
            error(
                KillArgs {
                    killed_endpoint: Some("127.0.0.1:3".to_owned()),
                    ..args()
                },
                1024
            ),
            KillFlagsError::UnknownEndpoint { .. }
        ));
        assert_eq!(
            error(args(), 31),
            KillFlagsError::BodyTooSmall { body_bytes: 31 }
        );
        // Without the phase, kill flags are a mistake and no flags are no plan.
        assert_eq!(
            args().plan(false, &endpoints, 1024),
            Err(KillFlagsError::NotChosen)
        );
        let none = KillArgs {
            kill_command: None,
            restart_command: None,
            killed_endpoint: None,
            ..args()
        };
        assert_eq!(none.plan(false, &endpoints, 1024), Ok(None));
    }
}
