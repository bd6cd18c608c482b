//! Model checks of spec/replication.md#1-queues-in-a-cluster: the bounded configurations,
//! exhaustively, and one test per planted bug asserting the checker finds a counterexample for
//! the property it breaks.
//!
//! `TRIREME_MODEL_LARGE=1` runs the larger bounds of `large_bounds_hold`.

mod common;

mod replication_queues {
    use std::io::Write as _;

    use trireme_spec::replication::queues::{Bug, Config, QueuesModel, Start};

    use super::common;

    const ONE_PER_EPOCH: &str = "at most one incarnation of an epoch is acknowledged";
    const ATTRIBUTES: &str = "a create answers success only for the attributes it asked for";
    const VISIBLE: &str =
        "an acknowledged incarnation is seen by every read quorum until its delete";
    const ISOLATED: &str = "a message is delivered only from the incarnation it was sent to";
    const NOT_MISSING: &str = "a local miss never reports an acknowledged queue missing";
    const CONVERGED: &str = "after heal, replicas converge";
    const LIVE: &str = "after heal, the name has one live incarnation";

    const RACE: &str = "two creates of one name race in one epoch";
    const AGREED: &str = "a losing create answered success (the attributes agree)";
    const REFUSED: &str = "a losing create answered QueueNameExists";
    const SEND_AFTER_DELETE: &str = "a send racing the delete was acknowledged after it";
    const RECREATED: &str = "the name was recreated while a predecessor's message is stored";
    const SKIPPED: &str = "a receive passed over another incarnation's message";
    const SPLIT: &str = "an epoch split three ways and a create moved to the next";
    const SETTLED: &str = "a read wrote a decision back before acting on it";
    const SENT_INTO_WINNER: &str = "a send through the losing coordinator went into the winner";
    const HEALED: &str = "heal ran to its end";
    const RECREATED_AFTER_COLLECTION: &str =
        "the name was created again in the epoch a collection moved it to";
    const STRAGGLER: &str = "a straggler's tombstone was outranked by a collected epoch";

    fn large() -> bool {
        std::env::var("TRIREME_MODEL_LARGE").is_ok_and(|v| v == "1")
    }

    /// Two creates with different attributes racing, a send through coordinator 0's view once
    /// its create answered, an anti-entropy exchange.
    fn race_differ() -> Config {
        Config {
            attributes_c1: 1,
            creates_max: 2,
            sends_max: 1,
            sends_through_view_only: true,
            anti_entropy_max: 1,
            heal: true,
            ..Config::quiet("create race, attributes differ")
        }
    }

    /// Two creates with the same attributes racing, and the send.
    fn race_agree() -> Config {
        Config {
            attributes_c1: 0,
            anti_entropy_max: 0,
            ..race_differ()
        }
        .named("create race, attributes agree")
    }

    /// From both vote requests in flight: the race and the send under one fault (drop,
    /// duplicate or crash).
    fn race_fault() -> Config {
        Config {
            start: Start::Racing,
            creates_max: 0,
            faults_max: 1,
            anti_entropy_max: 0,
            ..race_differ()
        }
        .named("create race, one fault")
    }

    /// From a created queue holding a message: coordinator 1 deletes it, recreates it and
    /// receives in the successor; coordinator 0 sends through its view, which may be stale.
    fn recreate() -> Config {
        Config {
            start: Start::Created,
            deletes_max: 1,
            sends_max: 1,
            creates_max: 1,
            creators: 0b10,
            receives_max: 1,
            heal: true,
            ..Config::quiet("delete and recreate")
        }
    }

    /// The delete, the recreation and the receive under one fault, without the send.
    fn recreate_fault() -> Config {
        Config {
            sends_max: 0,
            faults_max: 1,
            ..recreate()
        }
        .named("delete and recreate, one fault")
    }

    /// From a created queue holding a message: coordinator 1 deletes it, a replica collects the
    /// tombstone (finding N1's candidate: the next epoch's empty record), coordinator 1 creates
    /// the name again and receives; one anti-entropy exchange.
    fn collect() -> Config {
        Config {
            sends_max: 0,
            collections_max: 1,
            anti_entropy_max: 1,
            ..recreate()
        }
        .named("delete, collect and recreate")
    }

    /// As `collect`, under one fault (a lost collection write leaves a straggler).
    fn collect_fault() -> Config {
        Config {
            faults_max: 1,
            ..collect()
        }
        .named("delete, collect and recreate, one fault")
    }

    /// Runs `config` exhaustively with its printed figures (`common::check`).
    fn check(config: Config, scenarios: &[&'static str]) {
        let name = config.name;
        common::check("queues", name, QueuesModel::new(config), scenarios);
    }

    /// Asserts that the checker finds a counterexample for `property` under `config`.
    fn finds(config: Config, property: &'static str) {
        let bug = config.bug;
        common::finds("queues", bug, QueuesModel::new(config), property);
    }

    #[test]
    fn race_differ_holds() {
        check(
            race_differ(),
            &[RACE, REFUSED, SENT_INTO_WINNER, SETTLED, SPLIT, HEALED],
        );
    }

    #[test]
    fn race_agree_holds() {
        check(
            race_agree(),
            &[RACE, AGREED, SENT_INTO_WINNER, SETTLED, HEALED],
        );
    }

    #[test]
    fn race_under_a_fault_holds() {
        check(
            race_fault(),
            &[RACE, REFUSED, SENT_INTO_WINNER, SPLIT, HEALED],
        );
    }

    #[test]
    fn recreate_holds() {
        check(
            recreate(),
            &[SEND_AFTER_DELETE, RECREATED, SKIPPED, SETTLED, HEALED],
        );
    }

    #[test]
    fn recreate_under_a_fault_holds() {
        check(recreate_fault(), &[RECREATED, SKIPPED, SETTLED, HEALED]);
    }

    #[test]
    fn collection_by_the_next_epoch_holds() {
        check(
            collect(),
            &[
                RECREATED,
                RECREATED_AFTER_COLLECTION,
                STRAGGLER,
                SKIPPED,
                HEALED,
            ],
        );
    }

    #[test]
    fn large_bounds_hold() {
        if !large() {
            let _ = writeln!(
                std::io::stderr(),
                "queues model: larger bounds skipped (set TRIREME_MODEL_LARGE=1)"
            );
            return;
        }
        check(
            Config {
                creates_max: 3,
                ..race_differ()
            }
            .named("create race, three creates"),
            &[RACE, REFUSED, AGREED, SPLIT, HEALED],
        );
        check(
            Config {
                faults_max: 2,
                ..race_fault()
            }
            .named("create race, two faults"),
            &[RACE, REFUSED, SENT_INTO_WINNER, SPLIT, HEALED],
        );
        check(
            Config {
                faults_max: 1,
                ..recreate()
            }
            .named("delete and recreate, one fault"),
            &[SEND_AFTER_DELETE, RECREATED, SKIPPED, SETTLED, HEALED],
        );
        check(
            collect_fault(),
            &[RECREATED_AFTER_COLLECTION, STRAGGLER, SKIPPED, HEALED],
        );
    }

    fn with(bug: Bug, config: Config) -> Config {
        Config {
            bug: Some(bug),
            ..config
        }
    }

    /// A delete of the created queue, its recreation and a receive in the successor.
    fn successor_receives() -> Config {
        Config {
            start: Start::Created,
            deletes_max: 1,
            creates_max: 1,
            creators: 0b10,
            receives_max: 1,
            ..Config::quiet("successor receives")
        }
    }

    #[test]
    fn incarnation_from_the_clock_delivers_the_predecessors_message() {
        finds(
            with(Bug::IncarnationFromClock, successor_receives()),
            ISOLATED,
        );
    }

    #[test]
    fn key_without_incarnation_delivers_the_predecessors_message() {
        finds(
            with(Bug::KeyWithoutIncarnation, successor_receives()),
            ISOLATED,
        );
    }

    #[test]
    fn create_without_quorum_acknowledges_two_incarnations() {
        let config = Config {
            attributes_c1: 1,
            creates_max: 2,
            ..Config::quiet("create without quorum")
        };
        finds(with(Bug::CreateWithoutQuorum, config), ONE_PER_EPOCH);
    }

    #[test]
    fn last_writer_merge_loses_an_acknowledged_create() {
        let config = Config {
            attributes_c1: 1,
            creates_max: 2,
            anti_entropy_max: 1,
            ..Config::quiet("queue record last writer")
        };
        finds(with(Bug::QueueRecordLastWriter, config), VISIBLE);
    }

    #[test]
    fn acting_before_settled_hides_an_acknowledged_create() {
        let config = Config {
            creates_max: 1,
            ..Config::quiet("act before settled")
        };
        finds(with(Bug::ActBeforeSettled, config), VISIBLE);
    }

    #[test]
    fn loser_answering_success_answers_other_attributes() {
        let config = Config {
            attributes_c1: 1,
            creates_max: 2,
            ..Config::quiet("loser answers success")
        };
        finds(with(Bug::LoserAnswersSuccess, config), ATTRIBUTES);
    }

    #[test]
    fn split_epoch_never_ending_never_creates() {
        let config = Config {
            attributes_c1: 1,
            creates_max: 2,
            heal: true,
            ..Config::quiet("split epoch never ends")
        };
        finds(with(Bug::SplitEpochNeverEnds, config), LIVE);
    }

    #[test]
    fn local_miss_answering_missing_reports_an_acknowledged_queue_missing() {
        let config = Config {
            start: Start::Created,
            sends_max: 1,
            ..Config::quiet("local miss answers missing")
        };
        finds(with(Bug::LocalMissAnswersMissing, config), NOT_MISSING);
    }

    #[test]
    fn collecting_without_a_tombstone_loses_an_acknowledged_queue() {
        let config = Config {
            start: Start::Created,
            collections_max: 1,
            ..Config::quiet("collect without tombstone")
        };
        finds(with(Bug::CollectWithoutTombstone, config), VISIBLE);
    }

    #[test]
    fn digest_without_votes_never_converges() {
        let config = Config {
            creates_max: 1,
            heal: true,
            ..Config::quiet("digest without votes")
        };
        finds(with(Bug::DigestWithoutVotes, config), CONVERGED);
    }
}
