//! Model checks of spec/replication.md#9-long-polling-across-nodes: the bounded configurations,
//! exhaustively, and one test per planted bug asserting the checker finds a counterexample for
//! the claim it breaks.
//!
//! `TRIREME_MODEL_LARGE=1` runs the larger bounds of `large_bounds_hold`.

mod common;

mod replication_long_poll {
    use trireme_spec::replication::long_poll::{Bug, Config, LongPollModel};

    use super::common;

    const WITHIN_POLL: &str = "after heal, an open waiter is served within one poll period";
    const BY_WAKE_UP: &str =
        "after heal, a waiter whose wake-up arrived is served without a re-poll";

    const LAGGING: &str = "waiter served while its own replica lacks the message";
    const LOST_RACE: &str = "waiter lost the claim race and went back to wait";
    const BY_REPOLL: &str = "waiter served by a re-poll after its wake-up was lost";
    const WOKEN_BUSY: &str = "wake-up arrived while the waiter's receive was running";
    const HEALED: &str = "heal ran to its end";

    /// The waiter waits on A, B sends, C's consumer competes; one re-poll.
    fn race() -> Config {
        Config {
            repolls_max: 1,
            other_receives_max: 1,
            ..Config::quiet("race")
        }
    }

    /// The long poll may arrive before or after the send; one lost packet; one re-poll.
    fn faults() -> Config {
        Config {
            waiting_at_start: false,
            repolls_max: 1,
            faults_max: 1,
            ..Config::quiet("faults")
        }
    }

    /// The race under one lost packet.
    fn race_with_fault() -> Config {
        Config {
            name: "race with a fault",
            faults_max: 1,
            ..race()
        }
    }

    fn large() -> bool {
        std::env::var("TRIREME_MODEL_LARGE").is_ok_and(|v| v == "1")
    }

    /// Runs `config` exhaustively with its printed figures (`common::check`).
    fn check(config: Config, scenarios: &[&'static str]) {
        let name = config.name;
        common::check("long-poll", name, LongPollModel::new(config), scenarios);
    }

    /// Asserts that the checker finds a counterexample for `property` under `config`.
    fn finds(config: Config, property: &'static str) {
        let bug = config.bug;
        common::finds("long-poll", bug, LongPollModel::new(config), property);
    }

    fn with(bug: Bug, config: Config) -> Config {
        Config {
            bug: Some(bug),
            ..config
        }
    }

    #[test]
    fn race_holds() {
        check(race(), &[LAGGING, LOST_RACE, WOKEN_BUSY, HEALED]);
    }

    #[test]
    fn faults_hold() {
        check(faults(), &[LAGGING, BY_REPOLL, WOKEN_BUSY, HEALED]);
    }

    #[test]
    fn race_with_fault_holds() {
        check(
            race_with_fault(),
            &[LAGGING, LOST_RACE, BY_REPOLL, WOKEN_BUSY, HEALED],
        );
    }

    #[test]
    fn large_bounds_hold() {
        if !large() {
            println!("long-poll model: larger bounds skipped (set TRIREME_MODEL_LARGE=1)");
            return;
        }
        check(
            Config {
                name: "faults with a race",
                other_receives_max: 1,
                ..faults()
            },
            &[LAGGING, LOST_RACE, BY_REPOLL, WOKEN_BUSY, HEALED],
        );
        check(
            Config {
                name: "race with two re-polls",
                repolls_max: 2,
                ..race()
            },
            &[LAGGING, LOST_RACE, WOKEN_BUSY, HEALED],
        );
    }

    #[test]
    fn waiter_reading_its_own_replica_misses_the_message() {
        finds(with(Bug::WaiterReadsOwnReplica, race()), WITHIN_POLL);
    }

    #[test]
    fn no_repoll_waits_forever_after_a_lost_wake_up() {
        finds(with(Bug::NoRepoll, faults()), WITHIN_POLL);
    }

    #[test]
    fn wake_up_before_ack_needs_a_repoll() {
        finds(with(Bug::WakeUpBeforeAck, race()), BY_WAKE_UP);
    }

    #[test]
    fn wake_up_ignored_while_receiving_needs_a_repoll() {
        finds(with(Bug::WakeUpIgnoredWhileReceiving, race()), BY_WAKE_UP);
    }
}
