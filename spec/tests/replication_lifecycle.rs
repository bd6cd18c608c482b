//! Model checks of spec/replication.md part 2, sections 2 (purge) and 3 (retention expiry): the
//! bounded configurations, exhaustively, and one test per planted bug asserting the checker
//! finds a counterexample for the property it breaks.
//!
//! `TRIREME_MODEL_LARGE=1` runs the larger bounds of `large_bounds_hold`;
//! `TRIREME_MODEL_PATHS=1` prints each planted bug's counterexample.

mod common;

mod lifecycle {
    use std::io::Write as _;

    use trireme_spec::replication::lifecycle::{Bug, Config, LifecycleModel, Start};

    use super::common;

    const LOST: &str = "acknowledged send is never lost unless deleted, purged or expired";
    const PURGED: &str =
        "receive after an acknowledged purge never delivers what entered before it";
    const DELETED: &str = "receive after an acknowledged delete never delivers it";
    const EXPIRED: &str = "receive after every clock passed the retention never delivers it";
    const CONVERGED: &str = "after heal, replicas converge";
    const SWEPT: &str = "after heal, nothing hidden or expired is still live";
    const DRAINED: &str =
        "after heal, every acknowledged send not deleted, purged or expired was delivered";

    const PURGE_ACKED: &str = "purge acknowledged";
    const HIDDEN_SWEPT: &str = "sweep marks what a purge hides";
    const SKIPPED: &str = "receive skips what the watermark hides";
    const SENT_AFTER: &str = "message sent after an acknowledged purge delivered";
    const REDRIVEN_AFTER: &str = "message redriven after an acknowledged purge delivered";
    const CONCURRENT: &str =
        "receive under way when a purge was acknowledged delivers what it hides";
    const EXPIRED_SWEPT: &str = "sweep tombstones an expired record";
    const SLOW_CLOCK: &str = "slower clock delivers what a replica already expired";
    const HEALED: &str = "heal ran to its end";
    const REVIVED: &str = "later copy of a purged generation is live again";
    const FAST_DELIVERED: &str = "claim without the read delivered";
    const FAST_HIDDEN: &str =
        "claim without the read hidden by the watermark read beside it, its claim orphaned";
    const FAST_FELL_BACK: &str = "claim without the read refused, fell back to the read";
    /// Reached in the purge races only by a replica holding the claim itself (anti-entropy
    /// brought it, or, claims having no nonce here, the earlier claim of the same coordinator
    /// and `seq`): one receiver, no deletes and no expiry leave no rival to refuse it.
    const FAST_REFUSED_AFTER_ACK: &str =
        "claim without the read refused by one replica after another acked it, delivered";

    fn large() -> bool {
        std::env::var("TRIREME_MODEL_LARGE").is_ok_and(|v| v == "1")
    }

    const FAST: u8 = 0b01;
    const EXACT: u8 = 0b10;

    /// A purge by the fast clock (watermark 2 at tick 0, acknowledged at tick 3 at the
    /// earliest) racing a send and a receive by the exact clock; the send may come before,
    /// during or after the purge.
    fn send_after_purge() -> Config {
        Config {
            ticks_max: 3,
            send: true,
            purgers: FAST,
            enterers: EXACT,
            receivers: EXACT,
            purges_max: 1,
            claims_max: 1,
            heal: true,
            ..Config::quiet("send after purge")
        }
    }

    /// The mirror image: a purge by the exact clock (watermark 1 at tick 0), a send by the
    /// fast clock, whose stamps run one tick ahead of the purger's, and a receive by the fast
    /// clock.
    fn send_before_purge() -> Config {
        Config {
            purgers: EXACT,
            enterers: FAST,
            receivers: FAST,
            ..send_after_purge()
        }
        .named("send before purge")
    }

    /// A redrive by the exact clock (the message sent at tick 0, entering at the redriver's
    /// clock) racing a purge by the fast clock, which then receives.
    fn redrive_after_purge() -> Config {
        Config {
            send: false,
            redrive: true,
            receivers: FAST,
            ..send_after_purge()
        }
        .named("redrive after purge")
    }

    /// Two redrives of one dead-letter copy by the exact clock (a first one that may reach one
    /// replica and die, a second one later), racing a purge by the fast clock: the two write
    /// the same generation with different stamps.
    fn two_redrives() -> Config {
        Config {
            redrives_max: 2,
            claims_max: 0,
            ..redrive_after_purge()
        }
        .named("two redrives across a purge")
    }

    /// A message sent before the purge; the purge by the fast clock racing a receive by the
    /// exact clock; anti-entropy.
    fn purge_race() -> Config {
        Config {
            start: Start::Sent,
            ticks_max: 3,
            purgers: FAST,
            receivers: EXACT,
            purges_max: 1,
            claims_max: 1,
            anti_entropy_max: 1,
            heal: true,
            ..Config::quiet("purge race")
        }
    }

    /// The same race under one fault (a drop or a duplicate), without anti-entropy.
    fn purge_faults() -> Config {
        Config {
            faults_max: 1,
            anti_entropy_max: 0,
            ..purge_race()
        }
        .named("purge faults")
    }

    /// A first purge (watermark 1) landed on two replicas and timed out; at tick 1 the fast
    /// clock sends (stamp 2) and purges again (watermark 3); the exact clock receives.
    fn two_purges() -> Config {
        Config {
            start: Start::PurgeLanded,
            ticks_max: 4,
            send: true,
            purgers: FAST,
            enterers: FAST,
            receivers: EXACT,
            purges_max: 2,
            purge_ticks_max: 1,
            claims_max: 1,
            heal: true,
            ..Config::quiet("two purges")
        }
    }

    /// The purge race with the claim without the read and two receives, so that a fast claim
    /// can be refused by the first one's claim (delivered through replicas 0 and 2 before its
    /// own replica took it), and a receive after the purge meets an earlier receive's orphan
    /// claim on the hidden record.
    fn purge_race_fast_two() -> Config {
        Config {
            claim_without_read: true,
            claims_max: 2,
            ..purge_race()
        }
        .named("purge race, claim without the read, two receives")
    }

    /// The purge race with the claim without the read (spec/replication.md §13) and one
    /// receive: the exact clock claims from replica 1's record in place, beside a quorum read
    /// of the watermark, while the fast clock purges.
    fn purge_race_fast() -> Config {
        Config {
            claim_without_read: true,
            ..purge_race()
        }
        .named("purge race, claim without the read")
    }

    /// The purge racing a claim without the read that its own replica's lag gets refused: the
    /// message was received through replicas 0 and 2, and replica 1 has not yet taken that
    /// claim when coordinator 1 claims from it again.
    fn purge_race_fast_behind() -> Config {
        Config {
            start: Start::Received,
            ..purge_race_fast()
        }
        .named("purge race, claim without the read, own replica behind")
    }

    /// The purge race while the message's retention runs out (sent at tick 0, retention 3
    /// ticks): purge, expiry, receive and sweeps in any order.
    fn purge_with_retention() -> Config {
        Config {
            retention: Some(3),
            anti_entropy_max: 0,
            ..purge_race()
        }
        .named("purge with retention")
    }

    /// After an acknowledged delete with one stale replica: expiry on any replica at any
    /// moment, two receives by either clock, anti-entropy.
    fn retention_deleted() -> Config {
        Config {
            start: Start::Deleted,
            retention: Some(2),
            ticks_max: 3,
            claims_max: 2,
            anti_entropy_max: 2,
            heal: true,
            ..Config::quiet("retention after delete")
        }
    }

    /// A sent message received and deleted while its retention runs out.
    fn retention_sent() -> Config {
        Config {
            start: Start::Sent,
            retention: Some(2),
            ticks_max: 3,
            claims_max: 1,
            deletes_max: 1,
            anti_entropy_max: 1,
            heal: true,
            ..Config::quiet("retention of a sent message")
        }
    }

    /// A redrive while the message's retention (counted from its original send) runs out.
    fn retention_redrive() -> Config {
        Config {
            redrive: true,
            retention: Some(2),
            ticks_max: 3,
            claims_max: 1,
            anti_entropy_max: 1,
            heal: true,
            ..Config::quiet("retention of a redriven message")
        }
    }

    /// Runs `config` exhaustively with its printed figures (`common::check`).
    fn check(config: Config, scenarios: &[&'static str]) {
        let name = config.name;
        common::check("lifecycle", name, LifecycleModel::new(config), scenarios);
    }

    /// Asserts that the checker finds a counterexample for `property` under `config`.
    fn finds(config: Config, property: &'static str) {
        let bug = config.bug;
        common::finds("lifecycle", bug, LifecycleModel::new(config), property);
    }

    trait Named {
        fn named(self, name: &'static str) -> Config;
    }

    impl Named for Config {
        fn named(self, name: &'static str) -> Config {
            Config { name, ..self }
        }
    }

    fn with(bug: Bug, config: Config) -> Config {
        Config {
            bug: Some(bug),
            ..config
        }
    }

    #[test]
    fn send_after_purge_holds() {
        check(
            send_after_purge(),
            &[
                PURGE_ACKED,
                HIDDEN_SWEPT,
                SKIPPED,
                SENT_AFTER,
                CONCURRENT,
                HEALED,
            ],
        );
    }

    #[test]
    fn send_before_purge_holds() {
        check(
            send_before_purge(),
            &[
                PURGE_ACKED,
                HIDDEN_SWEPT,
                SKIPPED,
                SENT_AFTER,
                CONCURRENT,
                HEALED,
            ],
        );
    }

    #[test]
    fn redrive_after_purge_holds() {
        check(
            redrive_after_purge(),
            &[PURGE_ACKED, HIDDEN_SWEPT, SKIPPED, REDRIVEN_AFTER, HEALED],
        );
    }

    #[test]
    fn two_redrives_hold() {
        check(
            two_redrives(),
            &[PURGE_ACKED, HIDDEN_SWEPT, REVIVED, HEALED],
        );
    }

    #[test]
    fn purge_race_holds() {
        check(
            purge_race(),
            &[PURGE_ACKED, HIDDEN_SWEPT, SKIPPED, CONCURRENT, HEALED],
        );
    }

    #[test]
    fn purge_race_with_claim_without_read_holds() {
        check(
            purge_race_fast(),
            &[
                PURGE_ACKED,
                HIDDEN_SWEPT,
                SKIPPED,
                CONCURRENT,
                HEALED,
                FAST_DELIVERED,
                FAST_HIDDEN,
                FAST_REFUSED_AFTER_ACK,
            ],
        );
        check(
            purge_race_fast_behind(),
            &[
                PURGE_ACKED,
                HIDDEN_SWEPT,
                SKIPPED,
                HEALED,
                FAST_DELIVERED,
                FAST_HIDDEN,
                FAST_FELL_BACK,
                FAST_REFUSED_AFTER_ACK,
            ],
        );
    }

    /// Two receives through the exact clock's own replica: a fast claim refused by the first
    /// receive's claim, orphan claims on a hidden record met by a later receive. About six
    /// minutes, so behind `TRIREME_MODEL_LARGE=1`.
    #[test]
    fn purge_race_with_claim_without_read_two_receives_holds() {
        if !large() {
            let _ = writeln!(
                std::io::stderr(),
                "lifecycle model: two receives without the read skipped (set TRIREME_MODEL_LARGE=1)"
            );
            return;
        }
        check(
            purge_race_fast_two(),
            &[
                PURGE_ACKED,
                HIDDEN_SWEPT,
                SKIPPED,
                CONCURRENT,
                HEALED,
                FAST_DELIVERED,
                FAST_HIDDEN,
                FAST_FELL_BACK,
            ],
        );
    }

    #[test]
    fn purge_faults_hold() {
        check(
            purge_faults(),
            &[PURGE_ACKED, HIDDEN_SWEPT, SKIPPED, CONCURRENT, HEALED],
        );
    }

    #[test]
    fn purge_with_retention_holds() {
        check(
            purge_with_retention(),
            &[
                PURGE_ACKED,
                HIDDEN_SWEPT,
                SKIPPED,
                CONCURRENT,
                EXPIRED_SWEPT,
                SLOW_CLOCK,
                HEALED,
            ],
        );
    }

    #[test]
    fn retention_holds() {
        check(retention_deleted(), &[EXPIRED_SWEPT, HEALED]);
        check(retention_sent(), &[EXPIRED_SWEPT, SLOW_CLOCK, HEALED]);
        check(retention_redrive(), &[EXPIRED_SWEPT, SLOW_CLOCK, HEALED]);
    }

    #[test]
    fn large_bounds_hold() {
        if !large() {
            let _ = writeln!(
                std::io::stderr(),
                "lifecycle model: larger bounds skipped (set TRIREME_MODEL_LARGE=1)"
            );
            return;
        }
        check(two_purges(), &[PURGE_ACKED, SKIPPED, HEALED]);
    }

    #[test]
    fn watermark_compared_with_sent_time_never_delivers_a_redriven_message() {
        finds(
            with(Bug::WatermarkComparesSentTime, redrive_after_purge()),
            DRAINED,
        );
    }

    #[test]
    fn entered_at_by_earliest_writer_loses_a_later_redrive() {
        finds(with(Bug::EnteredAtEarliest, two_redrives()), LOST);
    }

    #[test]
    fn purge_tombstone_loses_a_later_redrive() {
        finds(with(Bug::PurgeWritesTombstone, two_redrives()), LOST);
    }

    #[test]
    fn watermark_by_last_writer_undoes_a_purge() {
        finds(with(Bug::WatermarkLastWriter, two_purges()), PURGED);
    }

    #[test]
    fn purge_acked_after_one_replica_is_undone() {
        finds(with(Bug::PurgeAckedAfterOne, purge_race()), PURGED);
    }

    #[test]
    fn purge_acked_at_once_purges_a_later_send() {
        finds(with(Bug::PurgeAckedAtOnce, send_after_purge()), LOST);
    }

    #[test]
    fn watermark_without_margin_spares_an_earlier_send() {
        finds(
            with(Bug::WatermarkWithoutMargin, send_before_purge()),
            PURGED,
        );
    }

    #[test]
    fn sweep_dropping_expired_records_resurrects_a_deleted_message() {
        finds(with(Bug::SweepDropsExpired, retention_deleted()), DELETED);
    }

    #[test]
    fn receive_without_expiry_check_delivers_an_expired_message() {
        finds(
            with(Bug::ReceiveSkipsExpiryCheck, retention_sent()),
            EXPIRED,
        );
    }

    #[test]
    fn sweep_expiring_early_loses_a_message_inside_its_retention() {
        finds(with(Bug::SweepExpiresEarly, retention_sent()), LOST);
    }

    #[test]
    fn retention_counted_from_entry_keeps_a_redriven_message_too_long() {
        finds(
            with(Bug::RetentionCountsFromEntry, retention_redrive()),
            EXPIRED,
        );
    }

    #[test]
    fn claim_without_read_delivered_before_the_watermark_undoes_a_purge() {
        finds(
            with(Bug::FastClaimDeliveredWithoutWatermark, purge_race_fast()),
            PURGED,
        );
    }

    #[test]
    fn anti_entropy_without_watermark_never_converges() {
        finds(
            with(Bug::AntiEntropySkipsWatermark, purge_race()),
            CONVERGED,
        );
    }

    #[test]
    fn sweep_ignoring_watermark_leaves_purged_records_live() {
        finds(with(Bug::SweepIgnoresWatermark, purge_race()), SWEPT);
    }
}
