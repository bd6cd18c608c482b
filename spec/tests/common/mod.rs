//! The harness every model check in `spec/tests` shares: running a model exhaustively with its
//! printed figures, and asserting that a planted bug's counterexample is found.
//!
//! Figures go to stderr directly, past the test harness's capture, so that every `cargo test`
//! run shows them, passing or not; the page's run tables quote them. `TRIREME_MODEL_PATHS=1`
//! also prints the actions of each planted bug's counterexample.
//!
//! It never builds a model or chooses its bounds: each test file does, and names its
//! properties and scenarios.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::io::Write as _;
use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// Runs `model` (the configuration called `name`) exhaustively, prints its generated and unique
/// state counts and its maximum depth under `label`, then asserts that no `always` property has
/// a counterexample and that every one of `scenarios` (its `sometimes` properties) was reached.
pub fn check<M>(label: &str, name: &str, model: M, scenarios: &[&'static str])
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    let _ = writeln!(
        std::io::stderr(),
        "{label} model `{name}`: {} states generated, {} unique, max depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for property in &properties {
        if property.expectation == Expectation::Always {
            checker.assert_no_discovery(property.name);
        }
    }
    for scenario in scenarios {
        checker.assert_any_discovery(scenario);
    }
}

/// Runs `model`, which carries the planted `bug`, until the checker finds a counterexample for
/// `property`, asserts that it found one, and prints its length and the states explored under
/// `label`.
pub fn finds<M>(label: &str, bug: impl Debug, model: M, property: &'static str)
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
{
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let actions = checker.assert_any_discovery(property).into_actions();
    if std::env::var("TRIREME_MODEL_PATHS").is_ok_and(|v| v == "1") {
        let _ = writeln!(std::io::stderr(), "{actions:#?}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "{label} planted bug {bug:?}: `{property}` fails after {} steps ({} states, {:.1?})",
        actions.len(),
        checker.unique_state_count(),
        started.elapsed()
    );
}
