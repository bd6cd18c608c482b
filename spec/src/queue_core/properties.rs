//! The invariants (I1–I12), the reachability witnesses and the liveness claim L3 of
//! `spec/queue-core.md`, as stateright properties. Each invariant is also a plain public
//! function of the state, so a conformance test can check a state built from the core.
//! This module only reads states; it must never change one.
//!
//! # How stateright 0.31 checks `eventually`, and why L3 is not vacuous here
//!
//! Read in `stateright-0.31.0/src/checker/bfs.rs` (the DFS checker does the same): every path
//! carries one bit per `eventually` property. The bit is cleared at the first state on the path
//! where the condition holds. A discovery (a counterexample) is recorded only at a *terminal*
//! state: one where every action's `next_state` is `None` or outside `within_boundary`. A
//! successor that was already generated makes its parent non-terminal and is not explored again,
//! with the bits of the first path that reached it; a cycle therefore never reports anything
//! (the false pass the toolchain notes warn about), and neither does a state skipped by
//! `target_max_depth`.
//!
//! L3 is stated so that none of this hides a counterexample:
//! - The condition is `settled && every sent message is gone`. It is false in every free-phase
//!   state, so no bit is cleared before `Settle`; in particular the initial state (nothing sent)
//!   does not satisfy it.
//! - Free-phase states are never terminal: `Settle` is enabled in each of them and always
//!   changes the state.
//! - The settle phase is acyclic: each consumer step deletes a message, delivers one (raising
//!   its receive sequence), moves one to `D`, or advances time, and none of those is undone
//!   there, so [`settle_progress`] grows at every step; `next_state` asserts it on every settle
//!   step the checker takes (model of the page only; a planted bug may break it).
//! - A settled state with every message gone has no action (the consumer has nothing to do),
//!   and no later state can lose that, so along settle paths the bit is a function of the state:
//!   the checker's merging of paths at an already generated state cannot lose a bit.
//! - `within_boundary` bounds the free phase only (a state all of whose successors were outside
//!   would count as terminal): settled states are always inside, and a free-phase state always
//!   has its `Settle` successor, so the bound never makes a state terminal. No check sets
//!   `target_max_depth`. Every settle path thus runs to its terminal state; the planted bug
//!   `RestoreNeverFires` shows a terminal state with a message left is reported.
//! - The full check merges states through `QueueCore::representative`. Merging is the same
//!   "already generated" case as above, and `drained` reads only what the representative keeps.
//!
//! Time advances in the settle phase only while a delay or visibility timeout is still to end,
//! not to let retention clear what the consumer did not: otherwise every message would expire
//! after `RETENTION` ticks and L3 would hold for any consumer, broken or not.

use stateright::Property;

use super::action::Action;
use super::state::{
    Events, Gone, HeldHandle, MessageState, ReceiptHandle, Slot, State, Tick, WorkerId,
};
use super::{DEDUP_WINDOW, QueueCore, RETENTION, VISIBILITY_TOTAL_MAX};

/// Name of I1.
pub const HANDLE_FRESH: &str = "I1 handle-fresh";
/// Name of I2.
pub const STALE_NEVER_DELETES: &str = "I2 stale-never-deletes";
/// Name of I3 (with I11, also L1 waiters-end).
pub const NO_IDLE_WAITER: &str = "I3 no-idle-waiter";
/// Name of I4.
pub const EXCLUSIVE_DELIVERY: &str = "I4 exclusive-delivery";
/// Name of I5.
pub const RECEIVE_COUNT: &str = "I5 receive-count";
/// Name of I6.
pub const CONSERVATION: &str = "I6 conservation";
/// Name of I7.
pub const DEAD_LETTER_ONLY_PAST_MAX: &str = "I7 dead-letter-only-past-max";
/// Name of I8.
pub const DELETED_STAYS_DELETED: &str = "I8 deleted-stays-deleted";
/// Name of I9.
pub const DEDUP: &str = "I9 dedup";
/// Name of I10.
pub const FIRST_RECEIVE_KNOWN: &str = "I10 first-receive-known";
/// Name of I11 (also L1 with I3, and L2 restore).
pub const TIMERS_FIRE: &str = "I11 timers-fire";
/// Name of I12.
pub const VISIBILITY_CAP: &str = "I12 visibility-cap";
/// Name of L3.
pub const DRAIN: &str = "L3 drain";
/// Witness: a worker holds a superseded handle of a message still in that handle's queue, so the
/// delete it may attempt classifies as stale.
pub const STALE_HANDLE_HELD: &str = "stale delete attempted";
/// Witness: a received message is stored, so a forged handle (`seq` never issued) may be
/// presented for it and classifies as never issued.
pub const UNISSUED_HANDLE_PRESENTABLE: &str = "forged-handle delete attempted";
/// Witness: a worker holds a handle of a stored message, and may present it at the other queue.
pub const HANDLE_FOR_OTHER_QUEUE_HELD: &str = "wrong-queue delete attempted";
/// Witness: a worker holds a superseded handle of a message still in that handle's queue, which
/// has a redrive policy, so the dead-letter-now it may attempt classifies as stale.
pub const STALE_DEAD_LETTER_NOW: &str = "stale dead-letter-now attempted";
/// Witness: a received message is stored in a queue with a redrive policy, so a forged
/// dead-letter-now (`seq` never issued) may be presented for it.
pub const UNISSUED_DEAD_LETTER_NOW: &str = "forged-handle dead-letter-now attempted";
/// Witness: a worker holds a handle of a stored message issued by a queue other than one with a
/// redrive policy, and may present it there.
pub const WRONG_QUEUE_DEAD_LETTER_NOW: &str = "wrong-queue dead-letter-now attempted";
/// Witness: a worker holds a handle a queue without a redrive policy issued, of a message still
/// stored, and may present it there.
pub const DEAD_LETTER_NOW_WITHOUT_POLICY: &str =
    "dead-letter-now without a redrive policy attempted";
/// Witness: a worker holds a handle of a queue with a redrive policy whose message has left that
/// queue (moved to its dead-letter queue) but is still stored.
pub const DEAD_LETTER_NOW_OF_MOVED: &str = "dead-letter-now of a message moved already attempted";

/// Every invariant name, in page order.
pub const INVARIANTS: [&str; 12] = [
    HANDLE_FRESH,
    STALE_NEVER_DELETES,
    NO_IDLE_WAITER,
    EXCLUSIVE_DELIVERY,
    RECEIVE_COUNT,
    CONSERVATION,
    DEAD_LETTER_ONLY_PAST_MAX,
    DELETED_STAYS_DELETED,
    DEDUP,
    FIRST_RECEIVE_KNOWN,
    TIMERS_FIRE,
    VISIBILITY_CAP,
];

/// Every property of the model: the invariants, the `sometimes` witnesses, and L3.
pub fn all() -> Vec<Property<QueueCore>> {
    vec![
        Property::always(HANDLE_FRESH, |_, s| handle_fresh(s)),
        Property::always(STALE_NEVER_DELETES, |_, s| stale_never_deletes(s)),
        Property::always(NO_IDLE_WAITER, |_, s| no_idle_waiter(s)),
        Property::always(EXCLUSIVE_DELIVERY, |_, s| exclusive_delivery(s)),
        Property::always(RECEIVE_COUNT, |_, s| receive_count(s)),
        Property::always(CONSERVATION, |_, s| conservation(s)),
        Property::always(DEAD_LETTER_ONLY_PAST_MAX, dead_letter_only_past_max),
        Property::always(DELETED_STAYS_DELETED, |_, s| deleted_stays_deleted(s)),
        Property::always(DEDUP, |_, s| dedup(s)),
        Property::always(FIRST_RECEIVE_KNOWN, |_, s| first_receive_known(s)),
        Property::always(TIMERS_FIRE, |_, s| timers_fire(s)),
        Property::always(VISIBILITY_CAP, |_, s| visibility_cap(s)),
        Property::sometimes(STALE_HANDLE_HELD, |_, s: &State| {
            stale_handle_held(s).is_some()
        }),
        Property::sometimes(UNISSUED_HANDLE_PRESENTABLE, |m, s: &State| {
            unissued_handle(m, s).is_some()
        }),
        Property::sometimes(HANDLE_FOR_OTHER_QUEUE_HELD, |_, s: &State| {
            handle_for_other_queue(s).is_some()
        }),
        Property::sometimes("waiter served by a send", |_, s: &State| {
            s.ghost_events.contains(Events::WAITER_SERVED_BY_SEND)
        }),
        Property::sometimes("waiter served by a visibility restore", |_, s: &State| {
            s.ghost_events.contains(Events::WAITER_SERVED_BY_RESTORE)
        }),
        Property::sometimes("moved to the dead-letter queue", |_, s: &State| {
            s.stored().any(|(_, _, life)| life.source.is_some())
        }),
        Property::sometimes("redriven", |_, s: &State| {
            s.ghost_events.contains(Events::REDRIVEN)
        }),
        Property::sometimes("deduplicated send", |_, s: &State| {
            s.messages
                .iter()
                .any(|slot| matches!(slot, Slot::Duplicate { .. }))
        }),
        Property::sometimes("expired by retention", |_, s: &State| {
            s.messages
                .iter()
                .filter_map(Slot::message)
                .any(|m| m.gone == Some(Gone::Expired))
        }),
        Property::sometimes(
            "deleted after visibility expired, before a new receive",
            |_, s: &State| s.ghost_events.contains(Events::DELETED_AFTER_TIMEOUT),
        ),
        Property::sometimes(STALE_DEAD_LETTER_NOW, |m, s: &State| {
            stale_dead_letter_now(m, s).is_some()
        }),
        Property::sometimes(UNISSUED_DEAD_LETTER_NOW, |m, s: &State| {
            unissued_dead_letter_now(m, s).is_some()
        }),
        Property::sometimes(WRONG_QUEUE_DEAD_LETTER_NOW, |m, s: &State| {
            wrong_queue_dead_letter_now(m, s).is_some()
        }),
        Property::sometimes(DEAD_LETTER_NOW_WITHOUT_POLICY, |m, s: &State| {
            dead_letter_now_without_policy(m, s).is_some()
        }),
        Property::sometimes(DEAD_LETTER_NOW_OF_MOVED, |m, s: &State| {
            dead_letter_now_of_moved(m, s).is_some()
        }),
        Property::sometimes("dead-lettered now", |_, s: &State| {
            s.stored().any(|(_, _, life)| life.ghost_dead_lettered_now)
        }),
        Property::sometimes(
            "dead-lettered now after visibility expired, before a new receive",
            |_, s: &State| {
                s.ghost_events
                    .contains(Events::DEAD_LETTERED_NOW_AFTER_TIMEOUT)
            },
        ),
        Property::sometimes(
            "dead-letter queue waiter served by dead-letter-now",
            |_, s: &State| {
                s.ghost_events
                    .contains(Events::WAITER_SERVED_BY_DEAD_LETTER_NOW)
            },
        ),
        Property::sometimes(
            "in the dead-letter queue below maxReceiveCount",
            |m: &QueueCore, s: &State| {
                s.stored().any(|(_, _, life)| {
                    life.source
                        .and_then(|source| m.attributes(source).redrive)
                        .is_some_and(|policy| life.receive_count < policy.max_receive_count)
                })
            },
        ),
        Property::sometimes("settle starts with a message in flight", |_, s: &State| {
            s.settled
                && s.stored()
                    .any(|(_, _, life)| matches!(life.state, MessageState::InFlight { .. }))
        }),
        Property::eventually(DRAIN, |_, s| drained(s)),
    ]
}

/// The delete a worker may attempt with a superseded handle of a message still in that handle's
/// queue (classifies as stale), if the state has one. A refusal changes nothing, so the state in
/// which the refused delete is enabled is its witness; the checker tries every enabled action,
/// I2 shows none of them succeeds, and the tests apply this one and read the refusal.
pub fn stale_handle_held(s: &State) -> Option<Action> {
    free_workers(s).find_map(|(worker, held)| {
        held.iter().flatten().find_map(|h| {
            let life = s.stored_in(h.handle.message, h.handle.queue)?;
            let stale = h.ghost_superseded && life.handle.is_some_and(|n| h.handle.seq < n);
            stale.then_some(Action::Delete {
                by: Some(worker),
                queue: h.handle.queue,
                handle: h.handle,
            })
        })
    })
}

/// A forged delete (`seq` one past the newest issued) of a received message that is still
/// stored, if the state has one.
pub fn unissued_handle(model: &QueueCore, s: &State) -> Option<Action> {
    if s.settled {
        return None;
    }
    s.stored().find_map(|(message, queue, life)| {
        life.handle.map(|_| Action::Delete {
            by: None,
            queue,
            handle: ReceiptHandle {
                queue,
                incarnation: model.attributes(queue).incarnation,
                message,
                seq: life.receive_seq + 1,
            },
        })
    })
}

/// A delete with a held handle of a stored message, presented at the other queue, if the state
/// has one.
pub fn handle_for_other_queue(s: &State) -> Option<Action> {
    free_workers(s).find_map(|(worker, held)| {
        held.iter().flatten().find_map(|h| {
            s.message(h.handle.message)?.queue?;
            Some(Action::Delete {
                by: Some(worker),
                queue: h.handle.queue.other(),
                handle: h.handle,
            })
        })
    })
}

/// A dead-letter-now a worker may attempt with a superseded handle of a message still in that
/// handle's queue, which has a redrive policy (classifies as stale), if the state has one.
pub fn stale_dead_letter_now(model: &QueueCore, s: &State) -> Option<Action> {
    let (worker, held) = held_handle(s, |h| {
        let has_policy = model.attributes(h.handle.queue).redrive.is_some();
        let life = s.stored_in(h.handle.message, h.handle.queue);
        has_policy
            && h.ghost_superseded
            && life.is_some_and(|life| life.handle.is_some_and(|n| h.handle.seq < n))
    })?;
    Some(Action::DeadLetterNow {
        by: Some(worker),
        queue: held.handle.queue,
        handle: held.handle,
    })
}

/// A forged dead-letter-now (`seq` one past the newest issued) of a received message stored in
/// a queue with a redrive policy, if the state has one.
pub fn unissued_dead_letter_now(model: &QueueCore, s: &State) -> Option<Action> {
    if s.settled {
        return None;
    }
    s.stored().find_map(|(message, queue, life)| {
        let has_policy = model.attributes(queue).redrive.is_some();
        (has_policy && life.handle.is_some()).then_some(Action::DeadLetterNow {
            by: None,
            queue,
            handle: ReceiptHandle {
                queue,
                incarnation: model.attributes(queue).incarnation,
                message,
                seq: life.receive_seq + 1,
            },
        })
    })
}

/// A dead-letter-now with a held handle of a stored message, presented at a queue that has a
/// redrive policy and did not issue the handle, if the state has one.
pub fn wrong_queue_dead_letter_now(model: &QueueCore, s: &State) -> Option<Action> {
    let (worker, held) = held_handle(s, |h| {
        let other = h.handle.queue.other();
        model.attributes(other).redrive.is_some()
            && s.message(h.handle.message)
                .is_some_and(|m| m.queue.is_some())
    })?;
    Some(Action::DeadLetterNow {
        by: Some(worker),
        queue: held.handle.queue.other(),
        handle: held.handle,
    })
}

/// A dead-letter-now with a held handle of a stored message, presented at the queue without a
/// redrive policy that issued it, if the state has one.
pub fn dead_letter_now_without_policy(model: &QueueCore, s: &State) -> Option<Action> {
    let queue = super::QueueId::ALL
        .into_iter()
        .find(|&q| model.attributes(q).redrive.is_none())?;
    let (worker, held) = held_handle(s, |h| {
        h.handle.queue == queue
            && s.message(h.handle.message)
                .is_some_and(|m| m.queue.is_some())
    })?;
    Some(Action::DeadLetterNow {
        by: Some(worker),
        queue,
        handle: held.handle,
    })
}

/// A dead-letter-now with a held handle of a queue with a redrive policy whose message is
/// stored in another queue (it was moved), if the state has one.
pub fn dead_letter_now_of_moved(model: &QueueCore, s: &State) -> Option<Action> {
    let (worker, held) = held_handle(s, |h| {
        model.attributes(h.handle.queue).redrive.is_some()
            && s.message(h.handle.message)
                .and_then(|m| m.queue)
                .is_some_and(|queue| queue != h.handle.queue)
    })?;
    Some(Action::DeadLetterNow {
        by: Some(worker),
        queue: held.handle.queue,
        handle: held.handle,
    })
}

/// The first handle a free-phase worker that may act holds and `wanted` accepts.
fn held_handle(s: &State, wanted: impl Fn(&HeldHandle) -> bool) -> Option<(WorkerId, HeldHandle)> {
    free_workers(s).find_map(|(worker, held)| {
        held.iter()
            .flatten()
            .find(|h| wanted(h))
            .map(|h| (worker, *h))
    })
}

/// The free-phase workers that may act in `s` (the free phase, not waiting on a long poll), with
/// the handles they hold.
fn free_workers(s: &State) -> impl Iterator<Item = (WorkerId, &[Option<HeldHandle>])> {
    WorkerId::free()
        .filter(|&worker| !s.settled && !s.is_waiting(worker))
        .map(|worker| (worker, &s.workers[worker.index()].held[..]))
}

/// I1: the newest handle of a stored message is its receive sequence number, an in-flight
/// message has one, and the handles workers hold for one message are pairwise distinct.
pub fn handle_fresh(s: &State) -> bool {
    let records_fresh = s.stored().all(|(_, _, life)| {
        let follows_seq = life.handle.is_none_or(|seq| seq == life.receive_seq);
        let in_flight_has_handle =
            !matches!(life.state, MessageState::InFlight { .. }) || life.handle.is_some();
        follows_seq && in_flight_has_handle
    });
    let held_distinct = (0..s.messages.len()).all(|m| {
        let held: Vec<_> = s
            .workers
            .iter()
            .filter_map(|worker| worker.held[m])
            .map(|held| held.handle)
            .collect();
        held.iter()
            .enumerate()
            .all(|(i, a)| held[i + 1..].iter().all(|b| a != b))
    });
    records_fresh && held_distinct
}

/// I2: no delete or visibility change with a superseded handle ever succeeded.
pub fn stale_never_deletes(s: &State) -> bool {
    !s.ghost_deleted_with_stale
}

/// I3: no queue has both an open waiter and a ready message.
pub fn no_idle_waiter(s: &State) -> bool {
    super::QueueId::ALL
        .into_iter()
        .all(|q| s.queue(q).waiters.is_empty() || !s.has_ready(q))
}

/// I4: no receive ever delivered a message that was not ready.
pub fn exclusive_delivery(s: &State) -> bool {
    !s.ghost_served_in_flight
}

/// I5: the receive count equals the deliveries of the current life.
pub fn receive_count(s: &State) -> bool {
    s.stored()
        .all(|(_, _, life)| life.receive_count == life.ghost_deliveries)
}

/// I6: every sent and stored message is in exactly one queue, or gone with a reason, and its
/// record exists exactly while it is in a queue.
pub fn conservation(s: &State) -> bool {
    s.messages
        .iter()
        .filter_map(Slot::message)
        .all(|m| m.queue.is_some() != m.gone.is_some() && m.queue.is_some() == m.life.is_some())
}

/// I7: a message moved into a dead-letter queue sits in its source's dead-letter queue, and
/// either reached the source's `maxReceiveCount` or was moved by the holder of its current
/// handle (so it was received at least once).
pub fn dead_letter_only_past_max(model: &QueueCore, s: &State) -> bool {
    s.stored().all(|(_, queue, life)| match life.source {
        None => true,
        Some(source) => model.attributes(source).redrive.is_some_and(|policy| {
            let past_max = life.receive_count >= policy.max_receive_count;
            let asked = life.ghost_dead_lettered_now && life.receive_count >= 1;
            policy.dead_letter_queue == queue && (past_max || asked)
        }),
    })
}

/// I8: a message a delete made gone stays gone `Deleted`, out of every queue.
pub fn deleted_stays_deleted(s: &State) -> bool {
    s.messages
        .iter()
        .filter_map(Slot::message)
        .filter(|m| m.ghost_deleted)
        .all(|m| m.gone == Some(Gone::Deleted) && m.queue.is_none() && m.life.is_none())
}

/// I9: two stored messages sent to the same queue with the deduplication id were sent at least
/// `DEDUP_WINDOW` apart.
pub fn dedup(s: &State) -> bool {
    let sent: Vec<_> = s
        .messages
        .iter()
        .filter_map(Slot::message)
        .filter(|m| m.ghost_dedup)
        .collect();
    sent.iter().enumerate().all(|(i, a)| {
        sent[i + 1..].iter().all(|b| {
            a.ghost_sent_to != b.ghost_sent_to || a.sent_at.abs_diff(b.sent_at) >= DEDUP_WINDOW
        })
    })
}

/// I10: `first_receive_at` is set exactly when the receive count is positive, and then
/// `first_receive_at <= received_at <= now`.
pub fn first_receive_known(s: &State) -> bool {
    s.stored().all(|(_, _, life)| {
        if life.first_receive_at.is_some() != (life.receive_count > 0) {
            return false;
        }
        match (life.first_receive_at, life.received_at) {
            (None, _) => true,
            (Some(first), Some(latest)) => first <= latest && latest <= s.now,
            (Some(_), None) => false,
        }
    })
}

/// I11: nothing due is left unfired: no delay ended, no visibility expired before now, no
/// waiter past its deadline, no message past its retention.
pub fn timers_fire(s: &State) -> bool {
    let messages = s.stored().all(|(id, _, life)| {
        let sent_at = s.message(id).expect("stored").sent_at;
        let state_due = match life.state {
            MessageState::Delayed { until } => until <= s.now,
            MessageState::InFlight { until } => until < s.now,
            MessageState::Ready { .. } => false,
        };
        !state_due && sent_at + RETENTION > s.now
    });
    let waiters = s
        .queues
        .iter()
        .all(|q| q.waiters.iter().all(|w| w.deadline > s.now));
    messages && waiters
}

/// I12: an in-flight message becomes visible no later than `VISIBILITY_TOTAL_MAX` after its
/// latest receive.
pub fn visibility_cap(s: &State) -> bool {
    s.stored().all(|(_, _, life)| match life.state {
        MessageState::InFlight { until } => life
            .received_at
            .is_some_and(|received| until <= received + VISIBILITY_TOTAL_MAX),
        MessageState::Delayed { .. } | MessageState::Ready { .. } => true,
    })
}

/// A measure every settle-phase step raises: time, then messages gone, then messages moved to a
/// dead-letter queue, then receives (over all lives). The model asserts it on every settle step
/// of the model of the page, which makes the settle phase acyclic, so `eventually` is exact.
pub fn settle_progress(s: &State) -> (Tick, usize, usize, u32) {
    let gone = s
        .messages
        .iter()
        .filter_map(Slot::message)
        .filter(|m| m.gone.is_some())
        .count();
    let moved = s
        .stored()
        .filter(|(_, _, life)| life.source.is_some())
        .count();
    let receives = s
        .stored()
        .map(|(_, _, life)| u32::from(life.receive_seq))
        .sum();
    (s.now, gone, moved, receives)
}

/// L3's goal: the free phase ended and every sent message is gone with a reason.
pub fn drained(s: &State) -> bool {
    s.settled
        && s.messages
            .iter()
            .filter_map(Slot::message)
            .all(|m| m.gone.is_some() && m.queue.is_none())
}
