//! What a replica accepts and refuses (spec/replication.md#operations, the replica side of each
//! step). A replica never overwrites: every write it accepts is the merge of what it holds with
//! what it receives, and the conditional writes (claim, tombstone, visibility change, drop) are
//! checked against what it holds first.
//!
//! The caller owns durability: it persists [`Verdict::Store`] and acks only after the fsync that
//! covers it (spec/replication.md#durability). Requests of one batch are checked one after
//! another, each against the state that includes the records before it
//! (spec/replication.md §13, *Batching*): checking them all against the state before the batch
//! would let one replica accept two claims of one `seq`.

use serde::{Deserialize, Serialize};
use trireme_core::Millis;

use crate::ids::Generation;
use crate::planted::{Bug, planted};
use crate::record::{Body, Claim, Divergence, Held, Record, Settle, Tombstone, merge_held};

/// A write a coordinator asks a replica to make.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Write {
    /// Merge the record in: a send, a dead-letter or redrive copy, a tombstone made durable on a
    /// quorum before a delete answers "already gone", a read repair, anti-entropy.
    Merge(Record),
    /// Conditional claim (spec/replication.md#receive-claim, step 5, and §13, *A claim without
    /// the read*): the record the coordinator read (merged from a quorum, or its own replica's
    /// on the fast path), holding its new claim. Accepted only if, in that generation, the
    /// replica (a) holds no tombstone, (b) holds a claim of a strictly lower `seq`, (c) holds a
    /// claim whose visibility deadline has passed by `now`, and (d) holds a receive count below
    /// `max_receive_count`; or it is behind (an older generation or nothing). Carrying the
    /// whole record repairs a replica that was behind, and a replica that holds nothing never
    /// gets a claim without its message.
    Claim {
        /// The record with its new claim.
        record: Record,
        /// The coordinator's clock reading for this receive (check (c)).
        now: Millis,
        /// The queue's `maxReceiveCount` when it has a redrive policy (check (d)).
        max_receive_count: Option<u32>,
    },
    /// Conditional tombstone (spec/replication.md#delete, step 4, and the moves): accepted if,
    /// in that generation, the replica's claim is of no later version (`seq`) than `expect`, or
    /// it already holds the tombstone, or it is behind. A claim of `expect`'s own `seq` that lost
    /// the race for it does not refuse the holder (F1).
    Tombstone {
        /// The generation that ends.
        generation: Generation,
        /// The claim the coordinator read (`None`: an unclaimed copy).
        expect: Option<Claim>,
        /// Why and when.
        tombstone: Tombstone,
    },
    /// Conditional visibility change (spec/replication.md#change-visibility): the merged record
    /// holding the handle's claim with its change counter plus one. Same condition as the
    /// tombstone, and refused where the generation already ended.
    Visibility(Record),
    /// Confirm (spec/replication.md §4, *Send* step 4): make generation 0 of a message sent
    /// with a deduplication id ready, because two replicas named it for its id. A held copy
    /// becomes ready; a ready copy, a tombstone or a later generation is acked unchanged (the
    /// message was ready already). Refused where no copy is stored (the body is not there) and
    /// where the copy is void (a void copy is never the winner).
    Confirm,
    /// Conditional drop of a confirmed tombstone or purge-marked record
    /// (spec/replication.md#tombstones-and-their-collection, step 3, and §2): dropped only if
    /// the replica still holds the tombstone of `generation`, or a record of `generation` that
    /// its own purge mark still hides.
    Drop {
        /// The generation whose tombstone (or marked record) was confirmed on all three.
        generation: Generation,
    },
}

/// What the replica does with one write.
impl Write {
    /// Why this write could not have come from a coordinator of this protocol, if it could not:
    /// a conditional claim and a visibility change carry the claim they are about. A peer's
    /// write is checked with this where it is decoded (the node's wire), so [`accept`] may
    /// assert it.
    #[must_use]
    pub fn malformed(&self) -> Option<&'static str> {
        match self {
            Write::Claim { record, .. } if record.claim().is_none() => {
                Some("a conditional claim carries no claim")
            }
            Write::Visibility(record) if record.claim().is_none() => {
                Some("a visibility change carries no claim")
            }
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted: persist this (`None`: remove the record), then ack.
    Store(Option<Record>),
    /// Accepted, and the replica already holds it: ack once what it holds is durable.
    Unchanged,
    /// Refused: answer with what the replica holds, for repair.
    Refused,
    /// Two writers of one generation disagree on a once-field: refused and reported.
    Diverged(Divergence),
}

impl Verdict {
    /// Whether the coordinator gets an ack.
    #[must_use]
    pub fn acks(&self) -> bool {
        matches!(self, Verdict::Store(_) | Verdict::Unchanged)
    }
}

/// Decides `write` against `held`, what the replica holds for the key (`None`: nothing).
#[must_use]
pub fn accept(held: Option<&Record>, write: &Write) -> Verdict {
    match write {
        Write::Merge(record) => merge_into(held, record),
        Write::Claim {
            record,
            now,
            max_receive_count,
        } => {
            let claim = record
                .claim()
                .expect("a conditional claim carries the claim it makes");
            let accept = match same_generation(held, record.generation) {
                Position::Ahead => false,
                Position::Behind => true,
                Position::Same(body) => match body {
                    // (a)
                    Body::Tombstone(_) => false,
                    Body::Live(live) => {
                        // (b)
                        live.held.map_or(0, |h| h.claim.seq) < claim.seq
                            // (c): a lease this replica holds is never superseded before its
                            // deadline by the coordinator's clock.
                            && (live.held.is_none_or(|h| h.deadline <= *now)
                                || planted(Bug::ClaimWithoutReadNoDeadlineCheck))
                            // (d)
                            && max_receive_count.is_none_or(|max| live.receive_count < max)
                    }
                },
            };
            if accept {
                merge_into(held, record)
            } else {
                Verdict::Refused
            }
        }
        Write::Tombstone {
            generation,
            expect,
            tombstone,
        } => {
            let accept = match same_generation(held, *generation) {
                Position::Ahead => false,
                Position::Behind => true,
                Position::Same(body) => match body {
                    Body::Tombstone(_) => true,
                    Body::Live(live) => no_later_version(live.held, *expect),
                },
            };
            if accept {
                let record = Record {
                    generation: *generation,
                    body: Body::Tombstone(*tombstone),
                };
                merge_into(held, &record)
            } else {
                Verdict::Refused
            }
        }
        Write::Visibility(record) => {
            let claim = record
                .claim()
                .expect("a visibility change carries the claim it changes");
            let accept = match same_generation(held, record.generation) {
                Position::Ahead => false,
                Position::Behind => true,
                Position::Same(body) => match body {
                    Body::Tombstone(_) => false,
                    Body::Live(live) => no_later_version(live.held, Some(claim)),
                },
            };
            if accept {
                merge_into(held, record)
            } else {
                Verdict::Refused
            }
        }
        Write::Confirm => match held {
            None => Verdict::Refused,
            Some(record) => match (&record.body, record.generation) {
                (Body::Live(live), Generation(0)) => match live.settle {
                    Settle::Held => {
                        let mut ready = record.clone();
                        if let Body::Live(live) = &mut ready.body {
                            live.settle = Settle::Ready;
                        }
                        Verdict::Store(Some(ready))
                    }
                    Settle::Void => Verdict::Refused,
                    Settle::Ready => Verdict::Unchanged,
                },
                _ => Verdict::Unchanged,
            },
        },
        Write::Drop { generation } => match held {
            Some(record) if record.generation == *generation && record.collectable() => {
                Verdict::Store(None)
            }
            // Anything else (a later generation brought back by a redrive, a copy of this
            // generation that entered above its purge mark, or nothing) is kept.
            _ => Verdict::Unchanged,
        },
    }
}

/// Whether a request sent at `sent_at` by its sender's clock may still be accepted at `now` by
/// this replica's clock (spec/replication.md, *Horizon rule*): a request older than the horizon
/// is refused, so once a collection has waited the horizon no older copy can still arrive.
#[must_use]
pub fn within_horizon(sent_at: Millis, now: Millis, horizon_ms: u64) -> bool {
    now.0.saturating_sub(sent_at.0) <= horizon_ms
}

/// The delete's replica condition (spec/replication.md#delete, step 4): the claim the replica
/// holds is of no later version (`seq`) than `expect`; never received is below every claim.
fn no_later_version(held: Option<Held>, expect: Option<Claim>) -> bool {
    if planted(Bug::WholeClaimFirst) {
        return held.map(|h| h.claim) <= expect;
    }
    held.map(|h| h.claim.seq) <= expect.map(|c| c.seq)
}

enum Position<'a> {
    /// The replica holds a later generation.
    Ahead,
    /// The replica holds an older generation, or nothing.
    Behind,
    /// The replica holds this generation.
    Same(&'a Body),
}

fn same_generation(held: Option<&Record>, generation: Generation) -> Position<'_> {
    match held {
        None => Position::Behind,
        Some(record) => match record.generation.cmp(&generation) {
            std::cmp::Ordering::Greater => Position::Ahead,
            std::cmp::Ordering::Less => Position::Behind,
            std::cmp::Ordering::Equal => Position::Same(&record.body),
        },
    }
}

fn merge_into(held: Option<&Record>, incoming: &Record) -> Verdict {
    match merge_held(held, Some(incoming)) {
        Ok(merged) if merged.as_ref() == held => Verdict::Unchanged,
        Ok(merged) => Verdict::Store(merged),
        Err(divergence) => Verdict::Diverged(divergence),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;
    use crate::record::{Birth, Held, TombstoneReason};

    fn sent() -> Record {
        Record::sent(Birth {
            payload: b"body".to_vec(),
            sent_at: Millis(1),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: None,
        })
    }

    fn claimed(seq: u32, coordinator: u16) -> Record {
        let mut record = sent();
        if let Body::Live(live) = &mut record.body {
            live.held = Some(Held {
                claim: Claim {
                    seq,
                    coordinator: NodeId(coordinator),
                    nonce: 0,
                },
                change_counter: 0,
                deadline: Millis(100),
                received_at: Millis(10),
            });
            live.receive_count = seq;
        }
        record
    }

    /// A conditional claim of `record` by a coordinator whose clock reads `now`, of a queue
    /// without a redrive policy.
    fn claim_at(record: Record, now: u64) -> Write {
        Write::Claim {
            record,
            now: Millis(now),
            max_receive_count: None,
        }
    }

    fn tombstone_write(expect: Option<Claim>) -> Write {
        Write::Tombstone {
            generation: Generation(0),
            expect,
            tombstone: Tombstone {
                reason: TombstoneReason::Deleted,
                at: Millis(50),
            },
        }
    }

    #[test]
    fn a_replica_accepts_at_most_one_claim_per_seq() {
        let first = claimed(1, 1);
        let Verdict::Store(Some(held)) = accept(Some(&sent()), &claim_at(first.clone(), 1_000))
        else {
            panic!("the first claim of seq 1 is accepted");
        };
        assert_eq!(
            accept(Some(&held), &claim_at(claimed(1, 2), 1_000)),
            Verdict::Refused
        );
        assert!(accept(Some(&held), &claim_at(claimed(2, 2), 1_000)).acks());
    }

    #[test]
    fn a_replica_refuses_a_claim_before_its_own_lease_s_deadline() {
        // (c): the held lease (seq 1) ends at 100 by the clock of the claim's coordinator.
        let held = claimed(1, 1);
        assert_eq!(
            accept(Some(&held), &claim_at(claimed(2, 2), 99)),
            Verdict::Refused
        );
        assert!(accept(Some(&held), &claim_at(claimed(2, 2), 100)).acks());
        // A replica behind holds no lease of that generation to protect.
        assert!(accept(None, &claim_at(claimed(2, 2), 0)).acks());
    }

    #[test]
    fn a_replica_refuses_a_claim_at_the_maximum_receive_count() {
        // (d): the held record was received twice; the queue moves at 2.
        let held = claimed(2, 1);
        let claim = |max| Write::Claim {
            record: claimed(3, 2),
            now: Millis(1_000),
            max_receive_count: Some(max),
        };
        assert_eq!(accept(Some(&held), &claim(2)), Verdict::Refused);
        assert!(accept(Some(&held), &claim(3)).acks());
    }

    #[test]
    fn a_replica_behind_accepts_a_claim_and_gets_the_message_with_it() {
        let claim = claimed(1, 1);
        assert_eq!(
            accept(None, &claim_at(claim.clone(), 1_000)),
            Verdict::Store(Some(claim))
        );
    }

    #[test]
    fn a_tombstone_refuses_claims_of_its_generation() {
        let tombstone = Record::tombstone(Generation(0), TombstoneReason::Deleted, Millis(5));
        assert_eq!(
            accept(Some(&tombstone), &claim_at(claimed(3, 1), 1_000)),
            Verdict::Refused
        );
    }

    #[test]
    fn a_tombstone_is_refused_where_a_newer_claim_is_held() {
        let held = claimed(2, 1);
        let stale = claimed(1, 1).claim();
        assert_eq!(
            accept(Some(&held), &tombstone_write(stale)),
            Verdict::Refused
        );
        assert!(accept(Some(&held), &tombstone_write(held.claim())).acks());
        // A replica that is behind cannot know better and accepts (spec: why the quorum read).
        assert!(accept(Some(&sent()), &tombstone_write(stale)).acks());
    }

    #[test]
    fn an_existing_tombstone_is_acked_again_without_a_change() {
        let tombstone = Record::tombstone(Generation(0), TombstoneReason::Deleted, Millis(50));
        assert_eq!(
            accept(Some(&tombstone), &tombstone_write(None)),
            Verdict::Unchanged
        );
    }

    #[test]
    fn a_drop_removes_only_the_confirmed_tombstone() {
        let tombstone = Record::tombstone(Generation(0), TombstoneReason::Moved, Millis(50));
        let drop = Write::Drop {
            generation: Generation(0),
        };
        assert_eq!(accept(Some(&tombstone), &drop), Verdict::Store(None));
        let mut back = sent();
        back.generation = Generation(2);
        assert_eq!(accept(Some(&back), &drop), Verdict::Unchanged);
    }

    #[test]
    fn a_drop_removes_a_marked_record_only_while_its_mark_hides_it() {
        let drop = Write::Drop {
            generation: Generation(0),
        };
        let mut marked = sent();
        if let Body::Live(live) = &mut marked.body {
            live.hidden_through = Some(Millis(1));
        }
        assert_eq!(accept(Some(&marked), &drop), Verdict::Store(None));
        // A later mover's copy of the generation, entered above the mark, made it live again.
        let mut back = marked.clone();
        if let Body::Live(live) = &mut back.body {
            live.entered_at = Millis(2);
        }
        assert_eq!(accept(Some(&back), &drop), Verdict::Unchanged);
        assert_eq!(accept(Some(&sent()), &drop), Verdict::Unchanged);
    }

    #[test]
    fn a_visibility_change_of_a_superseded_claim_is_refused() {
        let held = claimed(2, 1);
        let mut change = claimed(1, 1);
        if let Body::Live(live) = &mut change.body {
            live.held.as_mut().unwrap().change_counter = 1;
        }
        assert_eq!(
            accept(Some(&held), &Write::Visibility(change)),
            Verdict::Refused
        );
    }

    fn held_copy() -> Record {
        Record::sent_held(Birth {
            payload: b"body".to_vec(),
            sent_at: Millis(1),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: Some("order-17".to_owned()),
        })
    }

    #[test]
    fn a_confirm_makes_a_held_copy_ready_and_needs_its_body() {
        let held = held_copy();
        let Verdict::Store(Some(ready)) = accept(Some(&held), &Write::Confirm) else {
            panic!("a held copy is confirmed");
        };
        assert!(ready.ready());
        assert_eq!(accept(Some(&ready), &Write::Confirm), Verdict::Unchanged);
        let deleted = Record::tombstone(Generation(0), TombstoneReason::Deleted, Millis(5));
        assert_eq!(accept(Some(&deleted), &Write::Confirm), Verdict::Unchanged);
        assert_eq!(accept(None, &Write::Confirm), Verdict::Refused);
        assert_eq!(
            accept(Some(&held.voided()), &Write::Confirm),
            Verdict::Refused
        );
    }

    #[test]
    fn a_void_replaces_a_held_copy_or_nothing_and_never_a_ready_one() {
        let held = held_copy();
        let void = Write::Merge(held.voided());
        assert_eq!(
            accept(Some(&held), &void),
            Verdict::Store(Some(held.voided()))
        );
        assert_eq!(accept(None, &void), Verdict::Store(Some(held.voided())));
        let Verdict::Store(Some(ready)) = accept(Some(&held), &Write::Confirm) else {
            panic!("a held copy is confirmed");
        };
        assert_eq!(accept(Some(&ready), &void), Verdict::Unchanged);
        // A late held write does not bring a void copy back.
        assert_eq!(
            accept(Some(&held.voided()), &Write::Merge(held)),
            Verdict::Unchanged
        );
    }

    #[test]
    fn the_horizon_refuses_old_requests() {
        assert!(within_horizon(Millis(1_000), Millis(2_000), 1_000));
        assert!(!within_horizon(Millis(1_000), Millis(2_001), 1_000));
        assert!(within_horizon(Millis(5_000), Millis(2_000), 1_000));
    }
}
