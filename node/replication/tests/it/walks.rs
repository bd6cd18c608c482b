//! What the conformance walks share: a seeded random walk of a model, stepping a world built
//! from this crate beside it and comparing after every step; runs of many walks that report
//! their figures and check what some walk must have reached; and anti-entropy's exchange as the
//! node's driver runs it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::panic::RefUnwindSafe;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stateright::Model;
use trireme_replication::RecordKey;
use trireme_replication::anti_entropy::{self, Reconciled};
use trireme_replication::record::Record;

/// Steps per random walk; the models' budgets end most walks sooner.
pub(crate) const STEPS_MAX: usize = 60;

/// A world held to a model: built from one of its states, stepped by its actions, compared
/// with its states.
pub(crate) trait World<M: Model> {
    /// Applies `action` (enabled in `state`, the state before it) to the world.
    fn apply(&mut self, state: &M::State, action: M::Action);
    /// Panics, naming `trace`, where the world and `state` differ.
    fn compare(&self, state: &M::State, trace: &[M::Action]);
}

/// One walk of at most [`STEPS_MAX`] actions drawn by `seed` among those `model` enables
/// (except those `skipped`), from one of its initial states, each applied to the model and to
/// the world `make` builds from that state: its actions and the model's last state.
pub(crate) fn walk<M, W>(
    model: &M,
    seed: u64,
    skipped: impl Fn(&M::Action) -> bool,
    make: impl FnOnce(&M::State) -> W,
) -> (Vec<M::Action>, M::State)
where
    M: Model,
    M::State: Clone,
    M::Action: Copy,
    W: World<M>,
{
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let initial = model.init_states();
    let mut state = initial[rng.random_range(0..initial.len())].clone();
    let mut world = make(&state);
    let mut trace = Vec::new();
    world.compare(&state, &trace);
    for _ in 0..STEPS_MAX {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        actions.retain(|action| !skipped(action));
        if actions.is_empty() {
            break;
        }
        let action = actions[rng.random_range(0..actions.len())];
        trace.push(action);
        world.apply(&state, action);
        state = model
            .next_state(&state, action)
            .expect("every enabled action has a next state");
        world.compare(&state, &trace);
    }
    (trace, state)
}

/// Runs the walks of seeds `0..sequences` (`walk`), prints their figures under `name`, and
/// checks that each of `goals` was `met` by some walk. A failing walk prints its seed and
/// `replay`, the command that runs it again.
pub(crate) fn run<A, S, G>(
    name: &str,
    sequences: u64,
    replay: &str,
    walk: impl Fn(u64) -> (Vec<A>, S) + RefUnwindSafe,
    goals: &[G],
    met: impl Fn(G, &[A], &S) -> bool,
) where
    G: Copy + Debug,
{
    let mut steps = 0;
    let mut reached = vec![0_u64; goals.len()];
    for seed in 0..sequences {
        match std::panic::catch_unwind(|| walk(seed)) {
            Ok((trace, last)) => {
                steps += trace.len();
                for (count, goal) in reached.iter_mut().zip(goals) {
                    *count += u64::from(met(*goal, &trace, &last));
                }
            }
            Err(panic) => {
                eprintln!("{name} failed at seed {seed}; replay: {replay}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    let coverage: Vec<String> = goals
        .iter()
        .zip(&reached)
        .map(|(goal, count)| format!("{goal:?} in {count}"))
        .collect();
    eprintln!(
        "{name}: {sequences} sequences, {steps} compared steps; {}",
        coverage.join(", ")
    );
    assert!(steps > sequences as usize, "walks take steps");
    for (goal, count) in goals.iter().zip(&reached) {
        assert!(*count > 0, "no walk of {name} reached {goal:?}");
    }
}

/// The first seed below `sequences` whose walk fails, if any: how a planted rule is caught.
pub(crate) fn first_failing<T>(
    sequences: u64,
    walk: impl Fn(u64) -> T + RefUnwindSafe,
) -> Option<u64> {
    (0..sequences).find(|seed| std::panic::catch_unwind(|| walk(*seed)).is_err())
}

/// One anti-entropy round between two replicas holding `mine` and `theirs`, through the crate's
/// `anti_entropy` as the node's driver runs it: per-partition digests, and for the partitions
/// that differ the records each side lacks something of (`None` when no partition differs).
pub(crate) fn exchange(
    mine: &BTreeMap<RecordKey, Record>,
    theirs: &BTreeMap<RecordKey, Record>,
) -> Option<Reconciled> {
    let differing = anti_entropy::differing(
        &anti_entropy::digests(mine.iter()),
        &anti_entropy::digests(theirs.iter()),
    );
    if differing.is_empty() {
        return None;
    }
    let reconciled = anti_entropy::reconcile(mine, theirs);
    assert!(reconciled.diverged.is_empty(), "no writer diverges");
    Some(reconciled)
}
