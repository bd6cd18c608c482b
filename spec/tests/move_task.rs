//! Model checks of spec/replication.md section 8 (move tasks): the bounded configurations,
//! exhaustively, and one test per planted bug asserting the checker finds its counterexample.
//!
//! `TRIREME_MODEL_PATHS=1` prints the actions of each planted bug's counterexample.

mod common;

mod move_task {
    use trireme_spec::replication::move_task::{Bug, Config, MoveTaskModel, Start};

    use super::common;

    const ONE_START: &str = "at most one start acknowledged per task number";
    const ONE_RUNNER: &str = "at most one runner acquires each lease epoch";
    const SUPERSEDED: &str = "a superseded lease never moves a message";
    const CANCEL: &str = "no move starts after an acknowledged cancel";
    const PROGRESS: &str = "progress never goes down";
    const STATUS: &str = "status never goes back";
    const ENDED: &str = "after heal, the task ended and says why";

    const STARTS_RACE: &str = "two starts race for one task number";
    const OUTRANKED: &str = "an acknowledged start outranked by one that was not";
    const TAKEOVER: &str = "a runner takes over a live runner's task";
    const OVERLAP: &str = "two runners move under overlapping leases";
    const COMPLETED: &str = "task completed";
    const CANCELLED: &str = "task cancelled";
    const MOVE_AFTER_CANCEL: &str = "a move under way when the cancel was acknowledged finished";
    const FAILED: &str = "task failed: destination deleted";
    const HEALED: &str = "heal ran to its end";

    /// Two runners: the first takes the lease and moves, the second takes over (any lease may
    /// have expired by its clock); each renews once.
    fn runners() -> Config {
        Config {
            start: Start::Started,
            acquires_max: 2,
            renewals_max: 2,
            heal: true,
            ..Config::quiet("move task: runners")
        }
    }

    /// One runner, a cancel by the starter's client, and the destination deleted meanwhile.
    fn cancel_and_failure() -> Config {
        Config {
            start: Start::Started,
            acquires_max: 1,
            renewals_max: 1,
            cancels_max: 1,
            destination_delete: true,
            heal: true,
            ..Config::quiet("move task: cancel and failure")
        }
    }

    /// One runner under one network fault (a drop or a duplicate) and anti-entropy.
    fn faults() -> Config {
        Config {
            start: Start::Started,
            acquires_max: 1,
            renewals_max: 2,
            anti_entropy_max: 1,
            faults_max: 1,
            heal: true,
            ..Config::quiet("move task: faults")
        }
    }

    /// Two clients start a task for one source at once, through two coordinators; the heal runs
    /// whichever won.
    fn racing_starts() -> Config {
        Config {
            start: Start::Empty,
            starts_max: 2,
            anti_entropy_max: 1,
            heal: true,
            ..Config::quiet("move task: racing starts")
        }
    }

    /// Runs `config` exhaustively with its printed figures (`common::check`).
    fn check(config: Config, scenarios: &[&'static str]) {
        let name = config.name;
        common::check("move-task", name, MoveTaskModel { config }, scenarios);
    }

    /// Asserts that the checker finds a counterexample for `property` under `config`.
    fn finds(config: Config, property: &'static str) {
        let bug = config.bug;
        common::finds("move-task", bug, MoveTaskModel { config }, property);
    }

    fn with(bug: Bug, config: Config) -> Config {
        Config {
            bug: Some(bug),
            ..config
        }
    }

    #[test]
    fn runners_hold() {
        check(runners(), &[TAKEOVER, OVERLAP, COMPLETED, HEALED]);
    }

    #[test]
    fn cancel_and_failure_hold() {
        check(
            cancel_and_failure(),
            &[CANCELLED, MOVE_AFTER_CANCEL, FAILED, COMPLETED, HEALED],
        );
    }

    #[test]
    fn faults_hold() {
        check(faults(), &[COMPLETED, HEALED]);
    }

    #[test]
    fn racing_starts_hold() {
        check(
            racing_starts(),
            &[STARTS_RACE, OUTRANKED, COMPLETED, HEALED],
        );
    }

    #[test]
    fn start_without_compare_and_set_acknowledges_two_starts() {
        let config = Config {
            start: Start::Empty,
            starts_max: 2,
            ..Config::quiet("start without compare-and-set")
        };
        finds(with(Bug::StartWithoutCompareAndSet, config), ONE_START);
    }

    #[test]
    fn lease_epoch_not_strict_gives_one_epoch_two_runners() {
        let config = Config {
            start: Start::Started,
            acquires_max: 2,
            ..Config::quiet("lease epoch not strict")
        };
        finds(with(Bug::LeaseEpochNotStrict, config), ONE_RUNNER);
    }

    #[test]
    fn renewal_ignoring_epoch_lets_a_superseded_runner_move() {
        let config = Config {
            start: Start::Started,
            acquires_max: 2,
            renewals_max: 1,
            ..Config::quiet("renewal ignores epoch")
        };
        finds(with(Bug::RenewalIgnoresEpoch, config), SUPERSEDED);
    }

    #[test]
    fn renewal_ignoring_cancel_moves_after_the_cancel() {
        let config = Config {
            start: Start::Started,
            acquires_max: 1,
            renewals_max: 1,
            cancels_max: 1,
            ..Config::quiet("renewal ignores cancel")
        };
        finds(with(Bug::RenewalIgnoresCancel, config), CANCEL);
    }

    #[test]
    fn progress_by_last_writer_goes_down() {
        let config = Config {
            start: Start::Started,
            acquires_max: 1,
            renewals_max: 2,
            anti_entropy_max: 1,
            ..Config::quiet("progress by last writer")
        };
        finds(with(Bug::ProgressLastWriter, config), PROGRESS);
    }

    #[test]
    fn status_by_last_writer_goes_back() {
        let config = Config {
            start: Start::Started,
            cancels_max: 1,
            anti_entropy_max: 1,
            ..Config::quiet("status by last writer")
        };
        finds(with(Bug::StatusLastWriter, config), STATUS);
    }

    #[test]
    fn failure_not_recorded_never_ends_the_task() {
        let config = Config {
            start: Start::Started,
            destination_delete: true,
            heal: true,
            ..Config::quiet("failure not recorded")
        };
        finds(with(Bug::FailureNotRecorded, config), ENDED);
    }
}
