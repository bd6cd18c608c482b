//! Model checks of spec/replication.md#14-the-replicas-group-log: the bounded configurations,
//! exhaustively, and one test per planted bug asserting the checker finds a counterexample for
//! the invariant the page says it breaks.
//!
//! Each planted bug runs on the configuration `one_crash_holds` checks without it. Besides the
//! counterexample stateright reports (the last one it met in a block of states, so not always
//! the shortest), each prints the shortest, found by deepening the search one step at a time;
//! `TRIREME_MODEL_PATHS=1` prints its actions.

mod common;

mod replication_group_log {
    use std::collections::BTreeSet;
    use std::io::Write as _;

    use stateright::{Checker, HasDiscoveries, Model};
    use trireme_spec::replication::group_log::{
        ANSWERED_SURVIVE, Action, Bug, CRASH_LOST_ENTRY, Config, GroupLogModel, READERS_SEE_SYNCED,
        RESTART_OVERWROTE_LEFTOVER, START_REPLAYED, START_REPLAYED_METADATA_SYNCED,
        START_STOPPED_AT_LEFTOVER,
    };

    use super::common;

    /// Every scenario the page names.
    const SCENARIOS: [&str; 5] = [
        CRASH_LOST_ENTRY,
        START_REPLAYED,
        START_STOPPED_AT_LEFTOVER,
        START_REPLAYED_METADATA_SYNCED,
        RESTART_OVERWROTE_LEFTOVER,
    ];

    /// The deepest search `shortest` tries: past the longest path of `one_crash` (32 states).
    const SHORTEST_DEPTH_MAX: usize = 40;

    /// The page's bounds: four groups, two keys, three slots, one crash.
    fn one_crash() -> Config {
        Config::new("one crash")
    }

    /// The page's bounds with a second crash, which meets the leftovers of the first start.
    fn two_crashes() -> Config {
        Config {
            crashes_max: 2,
            ..Config::new("two crashes")
        }
    }

    /// Eight groups through three slots: more checkpoints, restarts and crashes in one run.
    fn eight_groups() -> Config {
        Config {
            groups_max: 8,
            crashes_max: 3,
            ..Config::new("eight groups")
        }
    }

    /// Runs `config` exhaustively with its printed figures (`common::check`).
    fn check(config: Config) {
        let name = config.name;
        common::check("group-log", name, GroupLogModel::new(config), &SCENARIOS);
    }

    /// Asserts that the checker finds a counterexample for `property` once `bug` is planted in
    /// `config`, and prints the shortest one's length.
    fn finds(bug: Bug, config: Config, property: &'static str) {
        let model = GroupLogModel::new(Config {
            bug: Some(bug),
            ..config
        });
        common::finds("group-log", bug, model.clone(), property);
        let actions = shortest(&model, property);
        if std::env::var("TRIREME_MODEL_PATHS").is_ok_and(|v| v == "1") {
            let _ = writeln!(std::io::stderr(), "{actions:?}");
        }
        let _ = writeln!(
            std::io::stderr(),
            "group-log planted bug {bug:?}: shortest counterexample of `{property}`: {} steps",
            actions.len()
        );
    }

    /// The actions of a shortest counterexample for `property`: the checker's first discovery
    /// when no state deeper than `depth` is checked, for the least `depth` that has one.
    fn shortest(model: &GroupLogModel, property: &'static str) -> Vec<Action> {
        for depth in 1..=SHORTEST_DEPTH_MAX {
            let checker = model
                .clone()
                .checker()
                .target_max_depth(depth)
                .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
                .spawn_bfs()
                .join();
            if let Some(path) = checker.discovery(property) {
                return path.into_actions();
            }
        }
        panic!("no counterexample of `{property}` within {SHORTEST_DEPTH_MAX} states");
    }

    #[test]
    fn one_crash_holds() {
        check(one_crash());
    }

    #[test]
    fn two_crashes_hold() {
        check(two_crashes());
    }

    #[test]
    fn eight_groups_hold() {
        check(eight_groups());
    }

    #[test]
    fn answer_before_sync_loses_an_answered_group() {
        finds(Bug::AnswerBeforeSync, one_crash(), ANSWERED_SURVIVE);
    }

    #[test]
    fn commit_before_append_shows_an_unsynced_group() {
        finds(Bug::CommitBeforeAppend, one_crash(), READERS_SEE_SYNCED);
    }

    #[test]
    fn restart_before_checkpoint_loses_an_answered_group() {
        finds(Bug::RestartBeforeCheckpoint, one_crash(), ANSWERED_SURVIVE);
    }

    #[test]
    fn replay_ignoring_sequence_puts_an_old_value_back() {
        finds(Bug::ReplayIgnoresSequence, one_crash(), ANSWERED_SURVIVE);
    }
}
