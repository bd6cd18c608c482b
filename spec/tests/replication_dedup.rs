//! Model checks of spec/replication.md section 4 (deduplication ids across coordinators): the
//! bounded configurations, exhaustively, and one test per planted bug asserting the checker
//! finds a counterexample for the property it breaks.
//!
//! `TRIREME_MODEL_LARGE=1` runs the larger bounds of `large_bounds_hold`; `TRIREME_MODEL_PATHS=1`
//! prints the actions of each planted bug's counterexample.

mod common;

mod dedup {
    use std::io::Write as _;

    use trireme_spec::replication::dedup::{Bug, Config, DedupModel};

    use super::common;

    const LOST: &str = "acknowledged send is never lost";
    const ONE_MESSAGE: &str =
        "at most one message id is answered or delivered per deduplication id";
    const STORED: &str = "a deduplication record on two replicas names a message stored on two";
    const LOSER_FREED: &str =
        "a send answered with another id leaves its own copy held on at most one replica";
    const DECIDED: &str = "after heal, the deduplication id is decided";
    const DRAINED: &str = "after heal, every answered send was delivered or deleted";

    const RACE: &str = "two senders put at once";
    const OTHER: &str = "a send answered with the other's id";
    const CONFIRMED_OTHERS: &str = "a sender confirmed a held winner it did not write";
    const SPLIT: &str = "two replicas name different messages, the third none";
    const REPAIRED: &str = "anti-entropy decided the id";
    const DELIVERED: &str = "the consumer received the message";
    const DROPPED: &str = "the window ended on a replica holding a copy never made receivable";
    const LATE_PUT: &str = "a put arrived after the window ended";
    const ADOPTED: &str = "a sender adopted the other's message seen on one replica";
    const HOME_VALUE: &str = "a sender put the home's message instead of its candidate";
    const HOME_TIMEOUT: &str = "a sender put its candidate after the home's timeout";
    const HEALED: &str = "heal ran to its end";

    fn large() -> bool {
        std::env::var("TRIREME_MODEL_LARGE").is_ok_and(|v| v == "1")
    }

    /// Two overlapping sends (two producers, or a retry while the first attempt is still under
    /// way) and the window's end on each replica; no faults.
    fn race() -> Config {
        Config {
            window_end: true,
            heal: true,
            ..Config::quiet("race")
        }
    }

    /// Two overlapping sends and a consumer that receives and deletes while they run.
    fn consumer() -> Config {
        Config {
            receives_max: 1,
            deletes_max: 1,
            heal: true,
            ..Config::quiet("consumer")
        }
    }

    /// The client's retry on the next endpoint after its first attempt ended, under one fault
    /// (a drop, a duplicate or a crash).
    fn retry() -> Config {
        Config {
            faults_max: 1,
            retry_only: true,
            heal: true,
            ..Config::quiet("retry")
        }
    }

    /// Runs `config` exhaustively with its printed figures (`common::check`).
    fn check(config: Config, scenarios: &[&'static str]) {
        let name = config.name;
        common::check("dedup", name, DedupModel::new(config), scenarios);
    }

    /// Asserts that the checker finds a counterexample for `property` under `config`.
    fn finds(config: Config, property: &'static str) {
        let bug = config.bug;
        common::finds("dedup", bug, DedupModel::new(config), property);
    }

    fn with(bug: Bug, config: Config) -> Config {
        Config {
            bug: Some(bug),
            ..config
        }
    }

    #[test]
    fn race_holds() {
        check(
            race(),
            &[
                RACE,
                OTHER,
                CONFIRMED_OTHERS,
                ADOPTED,
                SPLIT,
                REPAIRED,
                DROPPED,
                LATE_PUT,
                HOME_VALUE,
                HOME_TIMEOUT,
                HEALED,
            ],
        );
    }

    #[test]
    fn consumer_holds() {
        check(consumer(), &[RACE, OTHER, DELIVERED, HEALED]);
    }

    #[test]
    fn retry_holds() {
        check(
            retry(),
            &[
                OTHER,
                CONFIRMED_OTHERS,
                ADOPTED,
                SPLIT,
                REPAIRED,
                DELIVERED,
                HOME_TIMEOUT,
                HEALED,
            ],
        );
    }

    #[test]
    fn large_bounds_hold() {
        if !large() {
            let _ = writeln!(
                std::io::stderr(),
                "dedup model: larger bounds skipped (set TRIREME_MODEL_LARGE=1)"
            );
            return;
        }
        check(
            Config {
                name: "race with one fault",
                faults_max: 1,
                ..race()
            },
            &[
                RACE,
                OTHER,
                CONFIRMED_OTHERS,
                ADOPTED,
                SPLIT,
                REPAIRED,
                DROPPED,
                LATE_PUT,
                HOME_VALUE,
                HOME_TIMEOUT,
                HEALED,
            ],
        );
    }

    /// The draft (the message receivable as soon as it is written): a consumer's quorum
    /// read finds both senders' copies before the id is decided, and delivers both.
    #[test]
    fn receivable_at_once_delivers_two_messages() {
        let config = Config {
            receives_max: 1,
            ..Config::quiet("receivable at once")
        };
        finds(with(Bug::ReceivableAtOnce, config), ONE_MESSAGE);
    }

    #[test]
    fn dedup_before_message_names_a_message_not_stored() {
        finds(
            with(
                Bug::DedupBeforeMessage,
                Config::quiet("dedup before message"),
            ),
            STORED,
        );
    }

    #[test]
    fn hit_from_one_replica_answers_two_messages() {
        finds(
            with(
                Bug::HitFromOneReplica,
                Config::quiet("hit from one replica"),
            ),
            ONE_MESSAGE,
        );
    }

    #[test]
    fn loser_keeping_its_copy_leaves_it_held() {
        finds(
            with(Bug::LoserKeepsCopy, Config::quiet("loser keeps copy")),
            LOSER_FREED,
        );
    }

    #[test]
    fn answer_before_confirm_answers_a_message_not_receivable() {
        finds(
            with(
                Bug::AnswerBeforeConfirm,
                Config::quiet("answer before confirm"),
            ),
            LOST,
        );
    }

    #[test]
    fn answer_before_confirm_never_delivers() {
        let config = Config {
            heal: true,
            ..Config::quiet("answer before confirm")
        };
        finds(with(Bug::AnswerBeforeConfirm, config), DRAINED);
    }

    #[test]
    fn no_dedup_repair_leaves_the_id_undecided() {
        let config = Config {
            heal: true,
            ..Config::quiet("no dedup repair")
        };
        finds(with(Bug::NoDedupRepair, config), DECIDED);
    }
}
