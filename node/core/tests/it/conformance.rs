//! Conformance of the core to the model of `spec/queue-core.md`: the real `Queues` and the
//! stateright model (`trireme_spec::queue_core`) are stepped through the same actions, and after
//! every step everything an observer can see must be the same on both sides: every message with
//! its state and times, receive count, handle sequence, newest handle and source; the reason a
//! message left (`gone_in_last_step`); the waiters of each queue in serving order with their
//! deadlines; the reply (outcome or refusal kind, deliveries with handles and counts); the
//! waiters answered and what they got; the handles each worker holds; the message records a
//! shell storing every `take_changes` would hold. The core's `next_deadline` must never be later
//! than the model's next event. Every invariant of the page is checked on the model state, and
//! the core's own assertions run (debug builds).
//!
//! Random sequences pick, at every step, one of the actions the model enables in its current
//! state (`QueueCore::actions`, every option of the page's action set), so every sequence is a
//! path of the model; `pair` translates each action into a core command. Where a model
//! constant cannot be given to the core, the actions whose outcome depends on it are left out at
//! that scale (`scale`), and three scales (a tick of 1 s, 150 s, 4 h) together cover what one
//! cannot: see `scale.rs` for the table.
//!
//! What the mapping leaves out:
//! - everything the model leaves out: queue administration (create, set attributes, delete;
//!   the model's queues and attributes are fixed), tags, message sizes and attributes, the
//!   in-flight and waiter caps, more than two messages and two workers;
//! - the combinations no scale can hold at once, because the core's fixed limits do not keep
//!   the model's ratios: a long poll (20 s at most) together with retention expiry (60 s at
//!   least), a dedup window expiry (300 s) or the visibility cap (12 h); a delay (900 s at
//!   most) together with the visibility cap. So the page's same-instant case of a waiter served
//!   a message whose retention ends at that instant is not compared here;
//! - at 1 s ticks, a second purge of a queue (the core allows one per 60 s; not modelled), and
//!   any tick that would expire a message in the model only (time stops there, settle phases
//!   included).
//!
//! Chosen traces at the end step the classic races through both sides, and a self-test plants
//! each of the model's defects (`Bug`) to show the comparison catches a departure.
//!
//! A failure prints the seed, the command that replays it, the action trace, the parts that
//! differ and both sides in full.

mod pair;
mod scale;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use trireme_core::GoneReason;
use trireme_spec::queue_core::{
    Action, Bug, Events, Gone, InvalidReason, MessageId as ModelMessageId, Outcome, QueueCore,
    QueueId, ReceiptHandle as ModelHandle, Refusal, Reply, Slot, State, WorkerId, properties,
};

use pair::{Pair, Whereabouts, message_id};
use scale::{DEDUP_WINDOWS, Excluded, SECONDS, Scale, VISIBILITY_CAP};

/// Random sequences per scale, unless `TRIREME_CONFORMANCE_CASES` says otherwise (for a longer
/// soak).
const CASES: u32 = 500;

fn cases() -> u32 {
    std::env::var("TRIREME_CONFORMANCE_CASES").map_or(CASES, |text| {
        text.parse()
            .expect("TRIREME_CONFORMANCE_CASES is a decimal u32")
    })
}

/// Most steps per sequence: enough for two messages to go through two receives, a move to the
/// dead-letter queue, a redrive and a settle phase.
const STEPS_MAX: usize = 80;

/// How often each kind of action is picked, among the kinds the model enables and the scale
/// admits. `Tick` and `Receive` are weighted up so that timeouts, dead-letter moves and
/// redrives happen often; `Purge` and `Settle` down, as they end most of what can happen next.
fn weight(action: &Action) -> u32 {
    match action {
        Action::Send { .. } => 5,
        Action::Receive { .. } => 8,
        Action::Delete { .. } => 6,
        Action::ChangeVisibility { .. } => 4,
        Action::DeadLetterNow { .. } => 4,
        Action::Tick => 7,
        Action::Redrive { .. } => 4,
        Action::Purge { .. } => 1,
        Action::CancelWaiter { .. } => 2,
        Action::Settle => 1,
    }
}

fn kind(action: &Action) -> usize {
    match action {
        Action::Send { .. } => 0,
        Action::Receive { .. } => 1,
        Action::Delete { .. } => 2,
        Action::ChangeVisibility { .. } => 3,
        Action::Tick => 4,
        Action::Redrive { .. } => 5,
        Action::Purge { .. } => 6,
        Action::CancelWaiter { .. } => 7,
        Action::Settle => 8,
        Action::DeadLetterNow { .. } => 9,
    }
}

/// Picks one of `admitted` from two random numbers: a kind, weighted, then an action of it.
fn pick(admitted: &[Action], kind_pick: u16, index_pick: u16) -> Action {
    let mut kinds: BTreeMap<usize, Vec<Action>> = BTreeMap::new();
    for action in admitted {
        kinds.entry(kind(action)).or_default().push(*action);
    }
    let total: u32 = kinds.values().map(|actions| weight(&actions[0])).sum();
    let mut point = u32::from(kind_pick) % total;
    for actions in kinds.values() {
        let w = weight(&actions[0]);
        if point < w {
            return actions[usize::from(index_pick) % actions.len()];
        }
        point -= w;
    }
    unreachable!("the point lies below the total weight")
}

/// What the sequences of one scale reached, so a run shows (and asserts) that the interesting
/// paths were taken and not filtered away.
#[derive(Debug, Default)]
struct Tally {
    sequences: u64,
    steps: u64,
    dead_letter_moves: u64,
    dead_lettered_now: u64,
    dead_letter_now_waiter_served: u64,
    redriven: u64,
    redrive_failed: u64,
    waiters_served: u64,
    waiters_served_by_send: u64,
    waiters_served_by_restore: u64,
    waiters_answered_empty: u64,
    expired: u64,
    deleted: u64,
    deleted_after_timeout: u64,
    already_gone: u64,
    purged: u64,
    duplicates: u64,
    dedup_reopened: u64,
    stale_refused: u64,
    wrong_queue_refused: u64,
    never_issued_refused: u64,
    not_in_flight_refused: u64,
    cap_refused: u64,
    no_redrive_policy_refused: u64,
    drained: u64,
    excluded: BTreeMap<Excluded, u64>,
}

impl Tally {
    fn record(&mut self, before: &State, after: &State, action: &Action, reply: &Reply) {
        self.steps += 1;
        for (id, queue, life) in after.stored() {
            let was_in_d = before.message(id).and_then(|m| m.queue) == Some(QueueId::D);
            if queue == QueueId::D && life.source.is_some() && !was_in_d {
                self.dead_letter_moves += 1;
            }
        }
        for answer in &reply.answered {
            if answer.delivered.is_empty() {
                self.waiters_answered_empty += 1;
            } else {
                self.waiters_served += 1;
            }
        }
        if after.ghost_events.contains(Events::WAITER_SERVED_BY_SEND) {
            self.waiters_served_by_send += 1;
        }
        if after
            .ghost_events
            .contains(Events::WAITER_SERVED_BY_RESTORE)
        {
            self.waiters_served_by_restore += 1;
        }
        if after.ghost_events.contains(Events::DELETED_AFTER_TIMEOUT) {
            self.deleted_after_timeout += 1;
        }
        if after
            .ghost_events
            .contains(Events::WAITER_SERVED_BY_DEAD_LETTER_NOW)
        {
            self.dead_letter_now_waiter_served += 1;
        }
        for m in ModelMessageId::all() {
            let was = before.message(m).and_then(|message| message.gone);
            match (was, after.message(m).and_then(|message| message.gone)) {
                (None, Some(Gone::Expired)) => self.expired += 1,
                (None, Some(Gone::Deleted)) => self.deleted += 1,
                (None, Some(Gone::Purged)) => self.purged += 1,
                _ => {}
            }
        }
        if let Action::Send {
            queue, dedup: true, ..
        } = *action
        {
            let earlier_stored = before.messages.iter().any(
                |slot| matches!(slot, Slot::Sent(m) if m.ghost_dedup && m.ghost_sent_to == queue),
            );
            if earlier_stored
                && matches!(
                    reply.outcome,
                    Outcome::Sent {
                        duplicate: false,
                        ..
                    }
                )
            {
                self.dedup_reopened += 1;
            }
        }
        match &reply.outcome {
            Outcome::Sent {
                duplicate: true, ..
            } => self.duplicates += 1,
            Outcome::Redriven { moved, failed } => {
                self.redriven += u64::from(*moved);
                self.redrive_failed += u64::from(*failed);
            }
            Outcome::Deleted { already_gone: true } => self.already_gone += 1,
            Outcome::DeadLettered { .. } => self.dead_lettered_now += 1,
            Outcome::Refused(refusal) => match refusal {
                Refusal::StaleReceiptHandle { .. } => self.stale_refused += 1,
                Refusal::ReceiptHandleInvalid {
                    reason: InvalidReason::WrongQueue,
                } => self.wrong_queue_refused += 1,
                Refusal::ReceiptHandleInvalid {
                    reason: InvalidReason::NeverIssued,
                } => self.never_issued_refused += 1,
                Refusal::MessageNotInFlight { .. } => self.not_in_flight_refused += 1,
                Refusal::VisibilityCapExceeded { .. } => self.cap_refused += 1,
                Refusal::NoRedrivePolicy { .. } => self.no_redrive_policy_refused += 1,
            },
            _ => {}
        }
    }
}

/// Steps one random sequence through both sides. `Err` carries the readable report.
fn run_sequence(
    scale: Scale,
    model: &QueueCore,
    picks: &[(u16, u16)],
    tally: &mut Tally,
) -> Result<(), String> {
    let mut pair = Pair::with_model(scale, model.clone());
    tally.sequences += 1;
    for &(kind_pick, index_pick) in picks {
        let seen = pair.model.advanced(&pair.state);
        let mut admitted = Vec::new();
        for action in pair.model.actions(&pair.state) {
            match scale.admits(&seen, &pair.purges, &action) {
                Ok(()) => admitted.push(action),
                Err(excluded) => *tally.excluded.entry(excluded).or_default() += 1,
            }
        }
        if admitted.is_empty() {
            if pair.state.settled && pair.model.actions(&pair.state).is_empty() {
                // L3: the settle phase ran to its end; every message must be gone on both
                // sides (the last comparison already showed the core agrees).
                if !properties::drained(&pair.state) {
                    return Err(format!(
                        "the settle phase ended with messages left: {:#?}",
                        pair.state
                    ));
                }
                tally.drained += 1;
            }
            break;
        }
        let action = pick(&admitted, kind_pick, index_pick);
        let before = pair.state.clone();
        let reply = pair.step(action).map_err(|mismatch| mismatch.0)?;
        tally.record(&before, &pair.state, &action, &reply);
    }
    Ok(())
}

/// The seed of this run: `TRIREME_CONFORMANCE_SEED` if set, else a fresh one.
fn seed() -> u64 {
    match std::env::var("TRIREME_CONFORMANCE_SEED") {
        Ok(text) => text
            .parse()
            .expect("TRIREME_CONFORMANCE_SEED is a decimal u64"),
        Err(_) => RandomState::new().hash_one("trireme conformance"),
    }
}

/// A failed run: the report of the minimal failing sequence, and its picks.
struct Failure {
    report: String,
    picks: Vec<(u16, u16)>,
}

/// Runs `cases` random sequences of `model` against the core at `scale`, from `seed`; returns
/// what they reached and the first failure, shrunk.
fn explore(scale: Scale, model: &QueueCore, cases: u32, seed: u64) -> (Tally, Option<Failure>) {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        failure_persistence: None,
        ..Config::with_cases(cases)
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let tally = RefCell::new(Tally::default());
    let picks = proptest::collection::vec(any::<(u16, u16)>(), 1..=STEPS_MAX);
    let result = runner.run(&picks, |picks| {
        run_sequence(scale, model, &picks, &mut tally.borrow_mut()).map_err(TestCaseError::fail)
    });
    let failure = match result {
        Ok(()) => None,
        Err(TestError::Fail(reason, picks)) => Some(Failure {
            report: reason.to_string(),
            picks,
        }),
        Err(TestError::Abort(reason)) => panic!("aborted: {reason} (seed {seed})"),
    };
    (tally.into_inner(), failure)
}

/// Runs `CASES` random sequences of the model of the page at `scale`, fails with a readable
/// report on the first disagreement, and returns what the sequences reached.
fn conform(scale: Scale, test_name: &str) -> Tally {
    let seed = seed();
    let cases = cases();
    let (tally, failure) = explore(scale, &QueueCore::unbounded_options(), cases, seed);
    if let Some(Failure { report, picks }) = failure {
        panic!(
            "{report}\nseed {seed}, minimal picks {picks:?}\nreplay: \
             TRIREME_CONFORMANCE_SEED={seed} cargo test -p trireme-core -- --exact \
             conformance::{test_name}"
        );
    }
    println!("{} ({cases} cases, seed {seed}): {tally:#?}", scale.name);
    tally
}

/// Asserts every named count is positive: the scale reached those paths in this run.
fn assert_reached(tally: &Tally, counts: &[(&str, u64)]) {
    for (name, count) in counts {
        assert!(
            *count > 0,
            "no sequence reached {name}; the generator or a filter starves it: {tally:#?}"
        );
    }
}

#[test]
fn core_conforms_to_the_model_at_one_second_ticks() {
    let tally = conform(SECONDS, "core_conforms_to_the_model_at_one_second_ticks");
    assert_reached(
        &tally,
        &[
            ("a dead-letter move", tally.dead_letter_moves),
            ("a dead-letter-now", tally.dead_lettered_now),
            (
                "a dead-letter queue waiter served by a dead-letter-now",
                tally.dead_letter_now_waiter_served,
            ),
            (
                "a dead-letter-now without a redrive policy",
                tally.no_redrive_policy_refused,
            ),
            ("a redrive", tally.redriven),
            (
                "a redrive of a message without a source",
                tally.redrive_failed,
            ),
            ("a waiter served by a send", tally.waiters_served_by_send),
            (
                "a waiter served by a restore",
                tally.waiters_served_by_restore,
            ),
            ("a waiter answered empty", tally.waiters_answered_empty),
            ("a delete after the timeout", tally.deleted_after_timeout),
            ("a repeated delete", tally.already_gone),
            ("a duplicate send", tally.duplicates),
            ("a stale handle", tally.stale_refused),
            ("a handle at the wrong queue", tally.wrong_queue_refused),
            ("a handle never issued", tally.never_issued_refused),
            (
                "a visibility change of a gone message",
                tally.not_in_flight_refused,
            ),
            ("a purge", tally.purged),
            ("a drained settle phase", tally.drained),
        ],
    );
}

#[test]
fn core_conforms_to_the_model_at_dedup_window_ticks() {
    let tally = conform(
        DEDUP_WINDOWS,
        "core_conforms_to_the_model_at_dedup_window_ticks",
    );
    assert_reached(
        &tally,
        &[
            ("a dead-letter move", tally.dead_letter_moves),
            ("a redrive", tally.redriven),
            ("a retention expiry", tally.expired),
            ("a duplicate send", tally.duplicates),
            ("a dedup send after the window", tally.dedup_reopened),
            ("a stale handle", tally.stale_refused),
            ("a drained settle phase", tally.drained),
        ],
    );
}

#[test]
fn core_conforms_to_the_model_at_visibility_cap_ticks() {
    let tally = conform(
        VISIBILITY_CAP,
        "core_conforms_to_the_model_at_visibility_cap_ticks",
    );
    assert_reached(
        &tally,
        &[
            ("a dead-letter move", tally.dead_letter_moves),
            ("a redrive", tally.redriven),
            ("a retention expiry", tally.expired),
            ("a visibility change past the cap", tally.cap_refused),
            ("a stale handle", tally.stale_refused),
            ("a drained settle phase", tally.drained),
        ],
    );
}

/// The comparison can fail: each defect planted in the model (`trireme_spec::queue_core::Bug`)
/// makes the model depart from the page, and the core, which follows the page, must then
/// disagree with it visibly, at a scale where the defect's constant is exact.
#[test]
fn every_bug_planted_in_the_model_shows_as_a_disagreement() {
    let seed = seed();
    let bugs = [
        (Bug::ClearHandleOnRestore, SECONDS),
        (Bug::SameHandleEveryReceive, SECONDS),
        (Bug::ServeInFlightToWaiter, SECONDS),
        (Bug::ReceiveCountNotIncremented, SECONDS),
        (Bug::DeadLetterMoveLoses, SECONDS),
        (Bug::ZeroMeansNone, SECONDS),
        (Bug::SendDoesNotServe, SECONDS),
        (Bug::DeadLetterOneEarly, SECONDS),
        (Bug::DeleteLeavesReadyMessage, SECONDS),
        (Bug::DedupExpiresEarly, DEDUP_WINDOWS),
        (Bug::RetentionSkipsInFlight, DEDUP_WINDOWS),
        (Bug::NoVisibilityCap, VISIBILITY_CAP),
        (Bug::RestoreNeverFires, SECONDS),
        (Bug::HandleSeqResetByRedrive, SECONDS),
        (Bug::DeadLetterNowAcceptsStale, SECONDS),
        (Bug::DeadLetterNowAcceptsUnissued, SECONDS),
        (Bug::DeadLetterNowResetsReceiveCount, SECONDS),
        (Bug::DeadLetterNowDoesNotServe, SECONDS),
    ];
    for (bug, scale) in bugs {
        let model = QueueCore::unbounded_options().with_bug(bug);
        let (_, failure) = explore(scale, &model, CASES, seed);
        let Some(failure) = failure else {
            panic!(
                "{bug:?} went unnoticed in {CASES} sequences at {} (seed {seed})",
                scale.name
            );
        };
        // Found by comparing with the core, not by the model's own invariants.
        let compared = [
            "the core and the model disagree",
            "the core's next_deadline",
        ]
        .into_iter()
        .any(|opening| failure.report.starts_with(opening));
        assert!(
            compared,
            "{bug:?} was found, but not by comparing with the core (seed {seed}): {}",
            failure.report
        );
    }
}

// ----- chosen traces: the classic races of the issue, stepped through both sides -----

/// Steps `actions` through both sides at `scale`. Each must be enabled in the model and
/// admitted at the scale; any disagreement fails with the report. Returns the pair (to read
/// the end state) and the model's replies, which the core matched.
fn trace(scale: Scale, actions: &[Action]) -> (Pair, Vec<Reply>) {
    let mut pair = Pair::new(scale);
    let mut replies = Vec::new();
    for action in actions {
        let seen = pair.model.advanced(&pair.state);
        if let Err(excluded) = scale.admits(&seen, &pair.purges, action) {
            panic!("{action:?} is left out at {} ({excluded:?})", scale.name);
        }
        match pair.step(*action) {
            Ok(reply) => replies.push(reply),
            Err(mismatch) => panic!("{mismatch}"),
        }
    }
    (pair, replies)
}

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);
const M0: ModelMessageId = ModelMessageId(0);
const M1: ModelMessageId = ModelMessageId(1);

fn send(message: ModelMessageId) -> Action {
    Action::Send {
        queue: QueueId::Q,
        message,
        delay: 0,
        dedup: false,
    }
}

fn send_dedup(message: ModelMessageId) -> Action {
    Action::Send {
        queue: QueueId::Q,
        message,
        delay: 0,
        dedup: true,
    }
}

fn receive(worker: WorkerId, queue: QueueId, visibility: u8) -> Action {
    Action::Receive {
        queue,
        worker,
        max: 1,
        visibility,
        wait: 0,
    }
}

fn long_poll(worker: WorkerId) -> Action {
    long_poll_on(worker, QueueId::Q)
}

fn long_poll_on(worker: WorkerId, queue: QueueId) -> Action {
    Action::Receive {
        queue,
        worker,
        max: 2,
        visibility: 2,
        wait: 2,
    }
}

/// The handle a receive in `queue` issued for `message` as its `seq`-th.
fn issued(queue: QueueId, message: ModelMessageId, seq: u8) -> ModelHandle {
    ModelHandle {
        queue,
        incarnation: 1,
        message,
        seq,
    }
}

fn delete(by: WorkerId, queue: QueueId, handle: ModelHandle) -> Action {
    Action::Delete {
        by: Some(by),
        queue,
        handle,
    }
}

/// A delete with `handle` that no worker holds any more (the message is gone).
fn presented(queue: QueueId, handle: ModelHandle) -> Action {
    Action::Delete {
        by: None,
        queue,
        handle,
    }
}

fn change_visibility(by: WorkerId, handle: ModelHandle, timeout: u8) -> Action {
    Action::ChangeVisibility {
        by,
        queue: handle.queue,
        handle,
        timeout,
    }
}

fn refused(reply: &Reply) -> Option<Refusal> {
    match reply.outcome {
        Outcome::Refused(refusal) => Some(refusal),
        _ => None,
    }
}

fn delivered_to(reply: &Reply, worker: WorkerId) -> Vec<(ModelMessageId, u8)> {
    reply
        .answered
        .iter()
        .filter(|answer| answer.worker == worker)
        .flat_map(|answer| &answer.delivered)
        .map(|d| (d.message, d.handle.seq))
        .collect()
}

#[test]
fn late_delete_after_the_timeout_and_a_second_receive_is_stale() {
    let first = issued(QueueId::Q, M0, 1);
    let second = issued(QueueId::Q, M0, 2);
    let (pair, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 2),
            Action::Tick,
            Action::Tick, // the visibility timeout ends: m0 is ready again, handle kept
            receive(W1, QueueId::Q, 2),
            delete(W0, QueueId::Q, first),
            delete(W1, QueueId::Q, second),
            // The model's workers drop handles of gone messages; a repeated delete is offered
            // as a handle presented by no worker in particular.
            presented(QueueId::Q, first),
        ],
    );
    assert_eq!(
        refused(&replies[5]),
        Some(Refusal::StaleReceiptHandle { message_id: M0 })
    );
    assert_eq!(
        replies[6].outcome,
        Outcome::Deleted {
            already_gone: false
        }
    );
    assert_eq!(replies[7].outcome, Outcome::Deleted { already_gone: true });
    assert_eq!(
        pair.core.gone_in_last_step(),
        &[],
        "a repeated delete changes nothing"
    );
}

#[test]
fn newest_handle_deletes_after_the_timeout_before_another_receive() {
    let (pair, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 2),
            Action::Tick,
            Action::Tick,
            delete(W0, QueueId::Q, issued(QueueId::Q, M0, 1)),
        ],
    );
    assert!(
        pair.state
            .ghost_events
            .contains(Events::DELETED_AFTER_TIMEOUT)
    );
    assert_eq!(
        replies[4].outcome,
        Outcome::Deleted {
            already_gone: false
        }
    );
    assert_eq!(
        pair.core.gone_in_last_step(),
        &[(message_id(M0), GoneReason::Deleted)]
    );
}

#[test]
fn waiters_open_when_messages_are_sent_are_served_first_come_first_served() {
    let (pair, replies) = trace(SECONDS, &[long_poll(W0), long_poll(W1), send(M0), send(M1)]);
    assert_eq!(replies[0].outcome, Outcome::Waiting);
    assert_eq!(delivered_to(&replies[2], W0), vec![(M0, 1)]);
    assert_eq!(delivered_to(&replies[2], W1), vec![]);
    assert_eq!(delivered_to(&replies[3], W1), vec![(M1, 1)]);
    assert!(
        pair.core
            .waiter_views(&trireme_core::QueueName::try_from("work").unwrap())
            .is_empty()
    );
}

#[test]
fn waiter_is_served_by_a_visibility_restore_before_its_deadline() {
    let (_, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 2),
            Action::Tick,
            long_poll(W1), // deadline 3; m0 is restored at 2
            Action::Tick,
        ],
    );
    assert_eq!(replies[3].outcome, Outcome::Waiting);
    assert_eq!(delivered_to(&replies[4], W1), vec![(M0, 2)]);
}

#[test]
fn waiter_past_its_deadline_is_answered_empty() {
    let (_, replies) = trace(SECONDS, &[long_poll(W0), Action::Tick, Action::Tick]);
    assert!(replies[1].answered.is_empty());
    assert_eq!(replies[2].answered.len(), 1);
    assert!(replies[2].answered[0].delivered.is_empty());
}

/// Two delays end at the same instant: both messages are ready before the waiter is served,
/// so a waiter with a batch of two gets both (spec-questions: serve granularity).
#[test]
fn messages_ready_at_one_instant_are_served_to_one_batch_waiter() {
    let delayed = |message| Action::Send {
        queue: QueueId::Q,
        message,
        delay: 1,
        dedup: false,
    };
    let (_, replies) = trace(
        SECONDS,
        &[delayed(M0), delayed(M1), long_poll(W0), Action::Tick],
    );
    assert_eq!(delivered_to(&replies[3], W0), vec![(M0, 1), (M1, 1)]);
}

/// A long poll on the source takes a message past `maxReceiveCount`: the message moves to the
/// dead-letter queue, whose waiter is served at once, and the source's poller, given nothing,
/// waits.
#[test]
fn dead_letter_move_during_a_receive_serves_the_dead_letter_queue_waiter() {
    let (pair, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 0),
            receive(W0, QueueId::Q, 0),
            long_poll_on(W1, QueueId::D),
            long_poll(W0),
        ],
    );
    assert_eq!(replies[4].outcome, Outcome::Waiting);
    let served = &replies[4].answered;
    assert_eq!(served.len(), 1);
    assert_eq!((served[0].worker, served[0].queue), (W1, QueueId::D));
    let delivery = served[0].delivered[0];
    assert_eq!(
        (delivery.message, delivery.receive_count, delivery.source),
        (M0, 3, Some(QueueId::Q))
    );
    assert_eq!(pair.state.queue(QueueId::Q).waiters.len(), 1);
}

/// Waiters of both queues reach their deadline at one instant. The page does not order their
/// answers, and the sides differ (the model answers `Q`'s first, the core in queue-name order),
/// so the comparison takes empty answers by waiter id.
#[test]
fn waiters_of_both_queues_past_their_deadline_at_one_instant_are_answered_empty() {
    let (pair, replies) = trace(
        SECONDS,
        &[
            long_poll_on(W0, QueueId::Q),
            long_poll_on(W1, QueueId::D),
            Action::Tick,
            Action::Tick,
        ],
    );
    let mut answered: Vec<_> = replies[3]
        .answered
        .iter()
        .map(|answer| (answer.worker, answer.queue, answer.delivered.len()))
        .collect();
    answered.sort();
    assert_eq!(answered, vec![(W0, QueueId::Q, 0), (W1, QueueId::D, 0)]);
    assert!(pair.state.queues.iter().all(|q| q.waiters.is_empty()));
}

/// The model's queue attributes are fixed, so "a limit changed while in flight" is the
/// message's own limit: its visibility, changed while in flight, up to the 12 h cap counted
/// from the receive (exact at 4 h ticks), and by a holder whose handle was superseded.
#[test]
fn visibility_changed_while_in_flight_stops_at_the_cap_and_at_a_newer_receive() {
    let first = issued(QueueId::Q, M0, 1);
    let (_, replies) = trace(
        VISIBILITY_CAP,
        &[
            send(M0),
            receive(W0, QueueId::Q, 2),
            Action::Tick,
            change_visibility(W0, first, 2), // until 3 = received 0 + cap 3: accepted
            Action::Tick,
            change_visibility(W0, first, 2), // until 4 > 3: refused
            change_visibility(W0, first, 0), // ready again now
            receive(W1, QueueId::Q, 2),
            change_visibility(W0, first, 2),
        ],
    );
    assert_eq!(replies[3].outcome, Outcome::VisibilityChanged);
    assert_eq!(
        refused(&replies[5]),
        Some(Refusal::VisibilityCapExceeded { message_id: M0 })
    );
    assert_eq!(replies[6].outcome, Outcome::VisibilityChanged);
    assert_eq!(
        refused(&replies[8]),
        Some(Refusal::StaleReceiptHandle { message_id: M0 })
    );
}

#[test]
fn delete_sent_to_the_wrong_queue_is_refused_and_changes_nothing() {
    let handle = issued(QueueId::Q, M0, 1);
    let (pair, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 2),
            delete(W0, QueueId::D, handle),
            delete(W0, QueueId::Q, handle),
        ],
    );
    assert_eq!(
        refused(&replies[2]),
        Some(Refusal::ReceiptHandleInvalid {
            reason: InvalidReason::WrongQueue
        })
    );
    assert_eq!(
        replies[3].outcome,
        Outcome::Deleted {
            already_gone: false
        }
    );
    assert_eq!(
        pair.core.gone_in_last_step(),
        &[(message_id(M0), GoneReason::Deleted)]
    );
}

/// Two receives, the third moves the message to the dead-letter queue; a redrive brings it
/// back with its receive count reset, and the handle sequence goes on from where it was, so
/// no handle from before the move becomes current again.
#[test]
fn dead_letter_move_and_redrive_keep_handles_fresh() {
    let (pair, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 0), // InFlight{0}: the next action restores it
            receive(W0, QueueId::Q, 0),
            receive(W1, QueueId::Q, 0), // receive count 2 = maxReceiveCount: moved to D
            receive(W1, QueueId::D, 0),
            Action::Redrive {
                from: QueueId::D,
                to: None,
                max: 1,
            },
            delete(W0, QueueId::Q, issued(QueueId::Q, M0, 2)),
            receive(W1, QueueId::Q, 2),
            delete(W0, QueueId::Q, issued(QueueId::Q, M0, 2)),
        ],
    );
    assert_eq!(replies[3].outcome, Outcome::Received { delivered: vec![] });
    let Outcome::Received { delivered } = &replies[4].outcome else {
        panic!("{:?}", replies[4]);
    };
    assert_eq!(
        (
            delivered[0].receive_count,
            delivered[0].handle.seq,
            delivered[0].source
        ),
        (3, 3, Some(QueueId::Q))
    );
    assert_eq!(
        replies[5].outcome,
        Outcome::Redriven {
            moved: 1,
            failed: 0
        }
    );
    assert_eq!(
        refused(&replies[6]),
        Some(Refusal::ReceiptHandleInvalid {
            reason: InvalidReason::NeverIssued
        })
    );
    let Outcome::Received { delivered } = &replies[7].outcome else {
        panic!("{:?}", replies[7]);
    };
    assert_eq!(
        (delivered[0].receive_count, delivered[0].handle.seq),
        (1, 4)
    );
    assert_eq!(
        refused(&replies[8]),
        Some(Refusal::StaleReceiptHandle { message_id: M0 })
    );
    let Whereabouts::Stored(stored) = &pair_message(&pair, M0) else {
        panic!("m0 is stored");
    };
    assert_eq!((stored.receive_count, stored.last_seq), (1, 4));
}

/// The message's record as the core shows it.
fn pair_message(pair: &Pair, message: ModelMessageId) -> Whereabouts {
    let id = message_id(message);
    ["work", "dead-letters"]
        .into_iter()
        .find_map(|queue| {
            pair.core
                .message(&trireme_core::QueueName::try_from(queue).unwrap(), id)
        })
        .map_or(Whereabouts::NotStored, |view| {
            Whereabouts::Stored(pair::Stored {
                queue: view.queue,
                state: view.state,
                receive_count: view.receive_count,
                last_seq: view.last_seq,
                handle: view.handle,
                first_receive_at: view.first_receive_at,
                received_at: view.received_at,
                sent_at: view.sent_at,
                source: view.source,
                body: view.body,
            })
        })
}

#[test]
fn dedup_id_within_the_window_is_a_duplicate_and_after_it_a_new_message() {
    // 150 s ticks: the window is 2 ticks on both sides.
    let (_, within) = trace(
        DEDUP_WINDOWS,
        &[send_dedup(M0), Action::Tick, send_dedup(M1)],
    );
    assert_eq!(
        within[2].outcome,
        Outcome::Sent {
            message: M0,
            duplicate: true
        }
    );
    let (_, after) = trace(
        DEDUP_WINDOWS,
        &[send_dedup(M0), Action::Tick, Action::Tick, send_dedup(M1)],
    );
    assert_eq!(
        after[3].outcome,
        Outcome::Sent {
            message: M1,
            duplicate: false
        }
    );
}

#[test]
fn retention_ends_an_in_flight_message_and_its_delete_then_finds_it_gone() {
    let handle = issued(QueueId::Q, M0, 1);
    let (_, replies) = trace(
        DEDUP_WINDOWS,
        &[
            send(M0),
            Action::Tick,
            Action::Tick,
            Action::Tick,
            receive(W0, QueueId::Q, 2),
            Action::Tick, // 4 ticks after the send: expired although in flight
            presented(QueueId::Q, handle),
        ],
    );
    assert_eq!(replies[6].outcome, Outcome::Deleted { already_gone: true });
}

fn dead_letter_now(by: WorkerId, handle: ModelHandle) -> Action {
    Action::DeadLetterNow {
        by: Some(by),
        queue: handle.queue,
        handle,
    }
}

/// The holder of the current handle moves the message to the dead-letter queue, whose waiter
/// is served in the same step with the receive count going on; the superseded holder was
/// refused before and nothing changed.
#[test]
fn dead_letter_now_keeps_the_message_and_serves_the_dead_letter_queue() {
    let first = issued(QueueId::Q, M0, 1);
    let second = issued(QueueId::Q, M0, 2);
    let (pair, replies) = trace(
        SECONDS,
        &[
            send(M0),
            receive(W0, QueueId::Q, 0),
            receive(W1, QueueId::Q, 2),
            dead_letter_now(W0, first),
            long_poll_on(W0, QueueId::D),
            dead_letter_now(W1, second),
        ],
    );
    assert_eq!(
        refused(&replies[3]),
        Some(Refusal::StaleReceiptHandle { message_id: M0 })
    );
    assert_eq!(
        replies[5].outcome,
        Outcome::DeadLettered {
            dead_letter_queue: QueueId::D
        }
    );
    let served = &replies[5].answered;
    assert_eq!((served[0].worker, served[0].queue), (W0, QueueId::D));
    let delivery = served[0].delivered[0];
    assert_eq!(
        (
            delivery.message,
            delivery.receive_count,
            delivery.handle.seq,
            delivery.source
        ),
        (M0, 3, 3, Some(QueueId::Q))
    );
    let Whereabouts::Stored(stored) = &pair_message(&pair, M0) else {
        panic!("m0 is stored");
    };
    assert_eq!((stored.receive_count, stored.last_seq), (3, 3));
}
