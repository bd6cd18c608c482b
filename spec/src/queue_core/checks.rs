//! Model checks of the queue-core model: every property of the page holds in the full state
//! space, every witness is reached, and each planted bug turns its property red.
//!
//! Every run of `cargo test -p trireme-spec` prints the state counts and depths;
//! `TRIREME_MODEL_LARGE=1` checks the large configuration instead.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};

use super::properties::{self, INVARIANTS};
use super::{Action, Bug, InvalidReason, Outcome, QueueCore, Refusal, State};

/// The full check: depth-first with `QueueCore::representative` (stateright 0.31 applies
/// symmetry reduction in its DFS checker only).
#[test]
fn every_property_of_the_page_holds() {
    let model = QueueCore::from_env();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(2)
        .symmetry_fn(QueueCore::representative)
        .spawn_dfs()
        .join();
    // Written to stderr directly, past the test harness's capture, so that every
    // `cargo test` run shows the state count and depth, passing or not.
    let _ = writeln!(
        std::io::stderr(),
        "queue-core full check ({}): {} unique states, {} transitions, max depth {}, {:.1?}",
        if checker.model().t_max == super::T_MAX_LARGE {
            "large"
        } else {
            "default"
        },
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done());
    checker.assert_properties();
    assert_refused(
        &checker,
        properties::STALE_HANDLE_HELD,
        properties::stale_handle_held,
        |refusal| matches!(refusal, Refusal::StaleReceiptHandle { .. }),
    );
    assert_refused(
        &checker,
        properties::UNISSUED_HANDLE_PRESENTABLE,
        |s| properties::unissued_handle(&QueueCore::default(), s),
        |refusal| {
            *refusal
                == Refusal::ReceiptHandleInvalid {
                    reason: InvalidReason::NeverIssued,
                }
        },
    );
    // The witnesses read only the queues' attributes, which every configuration shares.
    let dead_letter_now_refusals: [RefusalWitness; 5] = [
        (
            properties::STALE_DEAD_LETTER_NOW,
            |s| properties::stale_dead_letter_now(&QueueCore::default(), s),
            |refusal| matches!(refusal, Refusal::StaleReceiptHandle { .. }),
        ),
        (
            properties::UNISSUED_DEAD_LETTER_NOW,
            |s| properties::unissued_dead_letter_now(&QueueCore::default(), s),
            |refusal| {
                *refusal
                    == Refusal::ReceiptHandleInvalid {
                        reason: InvalidReason::NeverIssued,
                    }
            },
        ),
        (
            properties::WRONG_QUEUE_DEAD_LETTER_NOW,
            |s| properties::wrong_queue_dead_letter_now(&QueueCore::default(), s),
            |refusal| {
                *refusal
                    == Refusal::ReceiptHandleInvalid {
                        reason: InvalidReason::WrongQueue,
                    }
            },
        ),
        (
            properties::DEAD_LETTER_NOW_WITHOUT_POLICY,
            |s| properties::dead_letter_now_without_policy(&QueueCore::default(), s),
            |refusal| matches!(refusal, Refusal::NoRedrivePolicy { .. }),
        ),
        (
            properties::DEAD_LETTER_NOW_OF_MOVED,
            |s| properties::dead_letter_now_of_moved(&QueueCore::default(), s),
            |refusal| matches!(refusal, Refusal::MessageNotInFlight { .. }),
        ),
    ];
    for (name, action_in, expected) in dead_letter_now_refusals {
        assert_refused(&checker, name, action_in, expected);
    }
    assert_refused(
        &checker,
        properties::HANDLE_FOR_OTHER_QUEUE_HELD,
        properties::handle_for_other_queue,
        |refusal| {
            *refusal
                == Refusal::ReceiptHandleInvalid {
                    reason: InvalidReason::WrongQueue,
                }
        },
    );
}

/// A refusal witness: its name, the refused action in its last state, and the refusal expected.
type RefusalWitness = (
    &'static str,
    fn(&State) -> Option<Action>,
    fn(&Refusal) -> bool,
);

/// Applies the refused action the witness `name` names in its last state, and checks it is
/// enabled, refused as `expected` says, and changes nothing.
fn assert_refused(
    checker: &impl Checker<QueueCore>,
    name: &'static str,
    action_in: fn(&State) -> Option<Action>,
    expected: fn(&Refusal) -> bool,
) {
    let path = checker.assert_any_discovery(name);
    let state = path.last_state();
    let action = action_in(state).expect("the witness names an action");
    let (next, reply) = checker
        .model()
        .step_with_reply(state, &action)
        .expect("the refused action is enabled");
    match &reply.outcome {
        Outcome::Refused(refusal) => assert!(expected(refusal), "{name}: got {refusal:?}"),
        other => panic!("{name}: {action:?} was not refused: {other:?}"),
    }
    // Only the advance to the current time, which every action does first, may change anything.
    let seen = checker.model().advanced(state);
    assert_eq!(
        next.messages, seen.messages,
        "{name}: a refusal changed messages"
    );
    assert_eq!(
        next.workers, seen.workers,
        "{name}: a refusal changed handles"
    );
}

/// Checks the model with `bug` planted breadth-first (short counterexamples; stateright keeps
/// the latest discovery of a batch, not the first) until each of `names` has a discovery, and
/// returns the last state of each counterexample.
fn assert_bug_found(bug: Bug, names: &[&'static str]) -> Vec<State> {
    let model = QueueCore::default().with_bug(bug);
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AllOf(
            names.iter().copied().collect::<BTreeSet<_>>(),
        ))
        .spawn_bfs()
        .join();
    let mut last_states = Vec::new();
    for &name in names {
        let path = checker.assert_any_discovery(name);
        last_states.push(path.last_state().clone());
        let actions = path.into_actions();
        println!(
            "{bug:?} turns {name:?} red in {} steps ({} states, {:.1?}): {actions:?}",
            actions.len(),
            checker.unique_state_count(),
            started.elapsed(),
        );
    }
    last_states
}

#[test]
fn every_invariant_and_l3_has_a_planted_bug() {
    let covered: BTreeSet<&str> = PLANTED
        .iter()
        .flat_map(|(_, names)| names.iter().copied())
        .collect();
    for name in INVARIANTS.into_iter().chain([properties::DRAIN]) {
        assert!(covered.contains(name), "no planted bug turns {name:?} red");
    }
}

/// Each planted bug and the properties it must turn red.
const PLANTED: &[(Bug, &[&str])] = &[
    (Bug::SameHandleEveryReceive, &[properties::HANDLE_FRESH]),
    (
        Bug::ClearHandleOnRestore,
        &[properties::STALE_NEVER_DELETES],
    ),
    (Bug::SendDoesNotServe, &[properties::NO_IDLE_WAITER]),
    (
        Bug::ServeInFlightToWaiter,
        &[properties::EXCLUSIVE_DELIVERY],
    ),
    (
        Bug::ReceiveCountNotIncremented,
        &[properties::RECEIVE_COUNT],
    ),
    (Bug::DeadLetterMoveLoses, &[properties::CONSERVATION]),
    (
        Bug::DeadLetterOneEarly,
        &[properties::DEAD_LETTER_ONLY_PAST_MAX],
    ),
    (
        Bug::DeleteLeavesReadyMessage,
        &[properties::DELETED_STAYS_DELETED],
    ),
    (Bug::DedupExpiresEarly, &[properties::DEDUP]),
    (Bug::ZeroMeansNone, &[properties::FIRST_RECEIVE_KNOWN]),
    (Bug::RetentionSkipsInFlight, &[properties::TIMERS_FIRE]),
    (Bug::NoVisibilityCap, &[properties::VISIBILITY_CAP]),
    (
        Bug::RestoreNeverFires,
        &[properties::DRAIN, properties::TIMERS_FIRE],
    ),
    (
        Bug::HandleSeqResetByRedrive,
        &[properties::HANDLE_FRESH, properties::STALE_NEVER_DELETES],
    ),
    (
        Bug::DeadLetterNowAcceptsStale,
        &[properties::STALE_NEVER_DELETES],
    ),
    (
        Bug::DeadLetterNowAcceptsUnissued,
        &[properties::DEAD_LETTER_ONLY_PAST_MAX],
    ),
    (
        Bug::DeadLetterNowResetsReceiveCount,
        &[properties::RECEIVE_COUNT],
    ),
    (
        Bug::DeadLetterNowDoesNotServe,
        &[properties::NO_IDLE_WAITER],
    ),
];

fn planted(bug: Bug) -> &'static [&'static str] {
    PLANTED
        .iter()
        .find(|(b, _)| *b == bug)
        .map(|(_, names)| *names)
        .expect("every bug is listed in PLANTED")
}

#[test]
fn same_handle_every_receive_breaks_handle_freshness() {
    assert_bug_found(
        Bug::SameHandleEveryReceive,
        planted(Bug::SameHandleEveryReceive),
    );
}

#[test]
fn clearing_the_handle_on_restore_lets_a_stale_handle_delete() {
    assert_bug_found(
        Bug::ClearHandleOnRestore,
        planted(Bug::ClearHandleOnRestore),
    );
}

#[test]
fn a_send_that_does_not_serve_leaves_a_waiter_idle() {
    assert_bug_found(Bug::SendDoesNotServe, planted(Bug::SendDoesNotServe));
}

#[test]
fn serving_an_in_flight_message_to_a_waiter_breaks_exclusive_delivery() {
    assert_bug_found(
        Bug::ServeInFlightToWaiter,
        planted(Bug::ServeInFlightToWaiter),
    );
}

#[test]
fn a_receive_count_not_incremented_is_caught() {
    assert_bug_found(
        Bug::ReceiveCountNotIncremented,
        planted(Bug::ReceiveCountNotIncremented),
    );
}

#[test]
fn a_dead_letter_move_that_loses_the_message_breaks_conservation() {
    assert_bug_found(Bug::DeadLetterMoveLoses, planted(Bug::DeadLetterMoveLoses));
}

#[test]
fn a_dead_letter_move_one_receive_early_is_caught() {
    assert_bug_found(Bug::DeadLetterOneEarly, planted(Bug::DeadLetterOneEarly));
}

#[test]
fn a_delete_that_leaves_a_ready_message_in_its_queue_is_caught() {
    assert_bug_found(
        Bug::DeleteLeavesReadyMessage,
        planted(Bug::DeleteLeavesReadyMessage),
    );
}

#[test]
fn a_deduplication_entry_expiring_early_stores_a_duplicate() {
    assert_bug_found(Bug::DedupExpiresEarly, planted(Bug::DedupExpiresEarly));
}

/// Time 0 is a real time in the model and a first receive happens at it, so a sentinel 0 is
/// caught: the counterexample ends at time 0 with a received message that has no
/// `first_receive_at`.
#[test]
fn zero_as_none_loses_a_first_receive_at_time_zero() {
    let last = assert_bug_found(Bug::ZeroMeansNone, planted(Bug::ZeroMeansNone));
    assert_eq!(last[0].now, 0);
    assert!(
        last[0]
            .stored()
            .any(|(_, _, life)| life.receive_count > 0 && life.first_receive_at.is_none())
    );
}

#[test]
fn retention_that_skips_in_flight_messages_leaves_a_timer_unfired() {
    assert_bug_found(
        Bug::RetentionSkipsInFlight,
        planted(Bug::RetentionSkipsInFlight),
    );
}

#[test]
fn a_visibility_change_past_the_cap_is_caught() {
    assert_bug_found(Bug::NoVisibilityCap, planted(Bug::NoVisibilityCap));
}

#[test]
fn restore_never_firing_keeps_the_fair_consumer_from_draining() {
    assert_bug_found(Bug::RestoreNeverFires, planted(Bug::RestoreNeverFires));
}

/// The page as written resets the handle sequence at a redrive; the model's default does not
/// (see `spec/queue-core.md` questions). This pins why.
#[test]
fn resetting_the_handle_sequence_at_redrive_revives_a_superseded_handle() {
    assert_bug_found(
        Bug::HandleSeqResetByRedrive,
        planted(Bug::HandleSeqResetByRedrive),
    );
}

#[test]
fn dead_letter_now_with_a_superseded_handle_takes_the_message_from_its_new_holder() {
    assert_bug_found(
        Bug::DeadLetterNowAcceptsStale,
        planted(Bug::DeadLetterNowAcceptsStale),
    );
}

/// The counterexample moves a message nobody received: in the dead-letter queue with a receive
/// count of 0.
#[test]
fn dead_letter_now_with_a_forged_handle_moves_a_message_nobody_received() {
    let last = assert_bug_found(
        Bug::DeadLetterNowAcceptsUnissued,
        planted(Bug::DeadLetterNowAcceptsUnissued),
    );
    assert!(
        last[0]
            .stored()
            .any(|(_, _, life)| life.source.is_some() && life.receive_count == 0)
    );
}

#[test]
fn dead_letter_now_that_resets_the_receive_count_is_caught() {
    assert_bug_found(
        Bug::DeadLetterNowResetsReceiveCount,
        planted(Bug::DeadLetterNowResetsReceiveCount),
    );
}

#[test]
fn dead_letter_now_that_does_not_serve_leaves_a_dead_letter_waiter_idle() {
    assert_bug_found(
        Bug::DeadLetterNowDoesNotServe,
        planted(Bug::DeadLetterNowDoesNotServe),
    );
}

/// The settle phase must end: from any state a bounded number of consumer steps reaches a
/// state without actions. (The checker's `eventually` is exact only on acyclic paths.)
#[test]
fn the_settle_phase_terminates_from_every_free_state_sampled() {
    let model = QueueCore::default();
    let mut frontier = vec![State::initial()];
    let mut seen = std::collections::HashSet::new();
    // Breadth-first over the free phase, a few levels deep, settling from each state.
    for _ in 0..4 {
        let mut next = Vec::new();
        for state in frontier {
            if !seen.insert(state.clone()) {
                continue;
            }
            let mut settled = model
                .step(&state, &Action::Settle)
                .expect("Settle is enabled");
            let mut steps = 0;
            while let Some(action) = model.actions(&settled).first().copied() {
                settled = model
                    .step(&settled, &action)
                    .expect("a consumer step changes the state");
                steps += 1;
                assert!(steps <= 40, "settle phase too long from {state:?}");
            }
            assert!(properties::drained(&settled), "not drained: {settled:?}");
            next.extend(
                model
                    .next_states(&state)
                    .into_iter()
                    .filter(|s| !s.settled && model.within_boundary(s)),
            );
        }
        frontier = next;
    }
}

mod walks {
    //! Random walks through the public step function, the way a conformance test drives it.
    //! They go past the checker's bounds: no cap on receives, and every option of the action
    //! set (`QueueCore::unbounded_options`), so they sample what the exhaustive check leaves out.

    use proptest::prelude::*;
    use stateright::{Expectation, Model};

    use super::super::{Action, QueueCore, State, properties};

    fn assert_invariants(model: &QueueCore, state: &State) -> Result<(), TestCaseError> {
        for property in model.properties() {
            if property.expectation == Expectation::Always {
                prop_assert!(
                    (property.condition)(model, state),
                    "{} broken in {state:?}",
                    property.name
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_walks_keep_every_invariant_and_settle_drained(
            choices in proptest::collection::vec(any::<u16>(), 1..80),
            large in any::<bool>(),
        ) {
            let model = if large { QueueCore::unbounded_options() } else { QueueCore::default() };
            let mut state = State::initial();
            for choice in choices {
                let actions = model.actions(&state);
                if actions.is_empty() {
                    // The walk settled and the fair consumer finished.
                    break;
                }
                let action = actions[usize::from(choice) % actions.len()];
                state = model
                    .step_with_reply(&state, &action)
                    .expect("an action from actions() is enabled")
                    .0;
                assert_invariants(&model, &state)?;
            }
            if !state.settled {
                state = model.step(&state, &Action::Settle).expect("Settle changes the state");
            }
            let mut steps = 0;
            while let Some(action) = model.actions(&state).first().copied() {
                let before = properties::settle_progress(&state);
                state = model.step(&state, &action).expect("a consumer step changes the state");
                assert_invariants(&model, &state)?;
                // The settle phase must be acyclic for `eventually` to be exact.
                prop_assert!(properties::settle_progress(&state) > before, "{action:?} made no progress");
                steps += 1;
                prop_assert!(steps <= 60, "the settle phase does not end");
            }
            prop_assert!(properties::drained(&state), "settled but not drained: {state:?}");
        }
    }
}
