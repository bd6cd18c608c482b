//! The stateright model of spec/replication.md: actions, boundary and properties.
//!
//! The protocol itself lives in `protocol`; this module only says which steps are possible in a
//! state, how far the search goes (`within_boundary`), and what must hold. It must never change
//! the protocol's behaviour.

use stateright::{Model, Property};

use super::record::Claim;

use super::protocol::{
    Bug, COORDINATORS, Config, MoveCause, Op, Queue, REPLICAS, Scenario, Start, State, Violation,
};

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Deliver the packet at this index of the (sorted) network.
    Deliver(u8),
    Drop(u8),
    Duplicate(u8),
    Crash(u8),
    Restart(u8),
    Replace(u8),
    /// Planted bug only.
    OldDiskReturns(u8),
    /// A coordinator times out or crashes.
    Abandon(u8),
    Send,
    /// A receive from `queue` through `coordinator`.
    Claim {
        coordinator: u8,
        queue: Queue,
    },
    /// A delete with the coordinator's newest handle, in the queue the handle names.
    Delete(u8),
    /// Dead-letter-now with the coordinator's newest handle of the source copy.
    DeadLetterNow(u8),
    Redrive,
    Collect(Queue),
    CollectDrop,
    /// Planted bug only.
    Hint(u8),
    /// Replicas `a` and `b` exchange records and both keep the merge.
    AntiEntropy {
        a: u8,
        b: u8,
    },
    Horizon,
    Heal {
        deliver_pending: bool,
    },
}

/// The coordinator that sends and redrives (the other one collects tombstones).
const SENDER: usize = 0;
const COLLECTOR: usize = 1;

/// The replication model under one configuration.
#[derive(Clone, Debug)]
pub struct ReplicationModel {
    /// Bounds and planted bug of this run.
    pub config: Config,
}

impl ReplicationModel {
    /// The model of `config`.
    pub fn new(config: Config) -> ReplicationModel {
        ReplicationModel { config }
    }
}

fn idle(state: &State, c: usize) -> bool {
    matches!(state.coordinators[c].op, Op::Idle)
}

impl Model for ReplicationModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        State::initial(&self.config)
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        let used = &state.used;
        if state.healed {
            return;
        }
        let fault = used.faults < config.faults_max;
        for (i, packet) in state.network.iter().enumerate() {
            if i > 0 && state.network[i - 1] == *packet {
                continue;
            }
            if state.deliverable(i) {
                actions.push(Action::Deliver(i as u8));
            }
            if fault {
                actions.push(Action::Drop(i as u8));
                actions.push(Action::Duplicate(i as u8));
            }
        }
        for r in 0..REPLICAS {
            let replica = &state.replicas[r];
            if replica.up && fault {
                actions.push(Action::Crash(r as u8));
            }
            if !replica.up {
                actions.push(Action::Restart(r as u8));
                if (replica.away_past_horizon || config.has(Bug::ReplaceBeforeHorizon))
                    && used.replacements < config.replacements_max
                {
                    actions.push(Action::Replace(r as u8));
                }
            }
            if replica.retired.is_some() && config.has(Bug::ReplacedDiskReturns) {
                actions.push(Action::OldDiskReturns(r as u8));
            }
        }
        for c in 0..COORDINATORS {
            if !idle(state, c) {
                if state.writing(c) {
                    actions.push(Action::Abandon(c as u8));
                }
                if config.has(Bug::HintCountsTowardQuorum) && state.can_hint(c) {
                    actions.push(Action::Hint(c as u8));
                }
                continue;
            }
            if used.claims < config.claims_max {
                actions.push(Action::Claim {
                    coordinator: c as u8,
                    queue: Queue::Source,
                });
                if config.dead_letter_claims {
                    actions.push(Action::Claim {
                        coordinator: c as u8,
                        queue: Queue::DeadLetter,
                    });
                }
            }
            let handle = state.coordinators[c].handle;
            if used.deletes < config.deletes_max && handle.is_some() {
                actions.push(Action::Delete(c as u8));
            }
            if used.dead_letter_nows < config.dead_letter_nows_max
                && handle.is_some_and(|h| h.queue == Queue::Source)
            {
                actions.push(Action::DeadLetterNow(c as u8));
            }
        }
        if idle(state, SENDER) {
            if used.sends == 0 {
                actions.push(Action::Send);
            }
            if config.dead_letter && used.redrives < config.redrives_max {
                actions.push(Action::Redrive);
            }
        }
        if idle(state, COLLECTOR) && used.collects < config.collects_max {
            actions.push(Action::Collect(Queue::Source));
            if config.dead_letter {
                actions.push(Action::Collect(Queue::DeadLetter));
            }
        }
        if let Op::CollectWait { confirmed_era, .. } = state.coordinators[COLLECTOR].op
            && state.era > confirmed_era
        {
            actions.push(Action::CollectDrop);
        }
        if used.anti_entropy < config.anti_entropy_max {
            for a in 0..REPLICAS {
                for b in a + 1..REPLICAS {
                    if state.anti_entropy_useful(config, a, b)
                        || state.anti_entropy_useful(config, b, a)
                    {
                        actions.push(Action::AntiEntropy {
                            a: a as u8,
                            b: b as u8,
                        });
                    }
                }
            }
        }
        if used.horizons < config.horizons_max {
            actions.push(Action::Horizon);
        }
        if config.heal {
            actions.push(Action::Heal {
                deliver_pending: true,
            });
            actions.push(Action::Heal {
                deliver_pending: false,
            });
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let config = &self.config;
        let mut state = last.clone();
        match action {
            Action::Deliver(i) => state.deliver(config, i as usize),
            Action::Drop(i) => state.drop_packet(i as usize),
            Action::Duplicate(i) => state.duplicate_packet(i as usize),
            Action::Crash(r) => state.crash(r as usize),
            Action::Restart(r) => state.restart(r as usize),
            Action::Replace(r) => state.replace(r as usize),
            Action::OldDiskReturns(r) => state.old_disk_returns(r as usize),
            Action::Abandon(c) => state.abandon(c as usize),
            Action::Send => state.start_send(SENDER),
            Action::Claim { coordinator, queue } => {
                state.start_claim(&self.config, coordinator as usize, queue)
            }
            Action::Delete(c) => state.start_delete(config, c as usize),
            Action::DeadLetterNow(c) => state.start_dead_letter_now(c as usize),
            Action::Redrive => state.start_redrive(SENDER),
            Action::Collect(queue) => state.start_collect(COLLECTOR, queue),
            Action::CollectDrop => state.collect_drop(COLLECTOR),
            Action::Hint(c) => state.store_hint(config, c as usize),
            Action::AntiEntropy { a, b } => {
                state.used.anti_entropy += 1;
                state.anti_entropy(config, a as usize, b as usize);
                state.anti_entropy(config, b as usize, a as usize);
            }
            Action::Horizon => state.pass_horizon(config),
            Action::Heal { deliver_pending } => state.heal(config, deliver_pending),
        }
        state.normalize();
        Some(state)
    }

    /// The bound of the search: the budgets of `Config`. A healed state is terminal and its
    /// schedule is not budgeted.
    fn within_boundary(&self, state: &State) -> bool {
        let (config, used) = (&self.config, &state.used);
        state.healed
            || (used.faults <= config.faults_max
                && used.claims <= config.claims_max
                && used.deletes <= config.deletes_max
                && used.collects <= config.collects_max
                && used.redrives <= config.redrives_max
                && used.dead_letter_nows <= config.dead_letter_nows_max
                && used.horizons <= config.horizons_max
                && used.anti_entropy <= config.anti_entropy_max
                && used.replacements <= config.replacements_max)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("acknowledged send is never lost", |_, s: &State| {
                !s.ghost.sent_acked
                    || s.ghost.deleted
                    || s.joined(Queue::Source).is_live()
                    || s.joined(Queue::DeadLetter).is_live()
            }),
            Property::always(
                "acknowledged delete is never resurrected",
                |_, s: &State| !s.ghost.violated(Violation::Resurrection),
            ),
            Property::always("superseded handle never takes effect", |_, s: &State| {
                !s.ghost.violated(Violation::StaleHandleTookEffect)
            }),
            Property::always("at most one delivery per claim version", |_, s: &State| {
                !s.ghost.violated(Violation::TwoDeliveriesOfOneVersion)
            }),
            Property::always(
                "delivered only after two replicas stored the claim",
                |_, s: &State| !s.ghost.violated(Violation::DeliveredWithoutQuorum),
            ),
            Property::always("receive count never goes down", |_, s: &State| {
                !s.ghost.violated(Violation::ReceiveCountWentDown)
            }),
            Property::always(
                "tombstone dropped only when all three replicas hold it",
                |_, s: &State| !s.ghost.violated(Violation::DroppedBeforeAllHeld),
            ),
            Property::always(
                "dead-letter move only past maxReceiveCount",
                |_, s: &State| !s.ghost.violated(Violation::MovedBeforeMax),
            ),
            Property::always(
                "a receive delivers only up to maxReceiveCount",
                |_, s: &State| !s.ghost.violated(Violation::DeliveredPastMax),
            ),
            Property::always(
                "delivered claim's holder refused only by a later receive",
                |_, s: &State| !s.ghost.violated(Violation::HolderRefused),
            ),
            Property::always("a delete answered stale wrote nothing", |_, s: &State| {
                !s.ghost.violated(Violation::StaleDeleteWrote)
            }),
            Property::always("after heal, replicas converge", |_, s: &State| {
                !s.healed || converged(s)
            }),
            Property::always(
                "after heal, every acknowledged send was delivered, deleted or dead-lettered",
                |_, s: &State| !s.healed || drained(s),
            ),
            Property::sometimes(
                "claim reached one replica, then its coordinator died",
                |_, s: &State| s.ghost.reached(Scenario::OrphanClaim),
            ),
            Property::sometimes(
                "two coordinators claim one version at once",
                |_, s: &State| concurrent_claims(s),
            ),
            Property::sometimes(
                "split claim: one replica acked it, another holds a rival claim of its version",
                |_, s: &State| split_claim(s),
            ),
            Property::sometimes(
                "delete races a receive after the visibility timeout",
                |_, s: &State| delete_races_receive(s),
            ),
            Property::sometimes(
                "delete answered stale after all three replicas refused its tombstone",
                |_, s: &State| s.ghost.reached(Scenario::DeleteStaleAtThreeRefusals),
            ),
            Property::sometimes(
                "acknowledged delete, stale replica fixed by read repair",
                |_, s: &State| s.ghost.reached(Scenario::RepairAfterAckedDelete),
            ),
            Property::sometimes(
                "acknowledged delete, stale replica fixed by anti-entropy",
                |_, s: &State| s.ghost.reached(Scenario::AntiEntropyAfterAckedDelete),
            ),
            Property::sometimes("replica rejoins holding old copies", |_, s: &State| {
                s.ghost.reached(Scenario::RejoinWithOldCopies)
            }),
            Property::sometimes(
                "tombstone collected while a replica was away, and it came back",
                |_, s: &State| s.ghost.reached(Scenario::CollectedWhileAway),
            ),
            Property::sometimes(
                "receive under way when a delete was acknowledged delivered afterwards",
                |_, s: &State| s.ghost.reached(Scenario::DeliveredAfterConcurrentDelete),
            ),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ];
        if self.config.replacements_max > 0 {
            properties.push(Property::sometimes(
                "replica away past the horizon replaced by an empty one",
                |_, s: &State| s.ghost.reached(Scenario::Replaced),
            ));
        }
        if self.config.dead_letter {
            properties.push(Property::sometimes(
                "message moved to the dead-letter queue",
                |_, s: &State| s.ghost.reached(Scenario::Moved),
            ));
            properties.push(Property::sometimes(
                "message redriven to its source queue",
                |_, s: &State| s.ghost.reached(Scenario::Redriven),
            ));
            properties.push(Property::sometimes(
                "a move's tombstone reaches a later life of the message",
                |_, s: &State| s.ghost.reached(Scenario::LateTombstoneOfEarlierLife),
            ));
        }
        if self.config.dead_letter_claims {
            properties.push(Property::sometimes(
                "delete in the dead-letter queue acknowledged",
                |_, s: &State| s.ghost.reached(Scenario::DeletedInDeadLetter),
            ));
            properties.push(Property::sometimes(
                "copy received in the dead-letter queue redriven",
                |_, s: &State| s.ghost.reached(Scenario::RedrivenAfterReceive),
            ));
            properties.push(Property::sometimes(
                "redrive's tombstone refused for a newer claim",
                |_, s: &State| s.ghost.reached(Scenario::RedriveRefusedByNewerClaim),
            ));
            properties.push(Property::sometimes(
                "redrive finished over a newer delivered claim",
                |_, s: &State| s.ghost.reached(Scenario::RedriveOverNewerClaim),
            ));
        }
        if self.config.heal_redrives {
            properties.push(Property::always(
                "after heal, a redrive empties the dead-letter queue",
                |_, s: &State| !s.healed || !s.joined(Queue::DeadLetter).is_live(),
            ));
        }
        if self.config.claim_without_read {
            properties.push(Property::sometimes(
                "claim without the read delivered",
                |_, s: &State| s.ghost.reached(Scenario::ClaimWithoutReadDelivered),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused, fell back to the read",
                |_, s: &State| s.ghost.reached(Scenario::ClaimWithoutReadFellBack),
            ));
            properties.push(Property::sometimes(
                "claim without the read taken by its own replica after another's ack",
                |_, s: &State| s.ghost.reached(Scenario::ClaimWithoutReadOwnLast),
            ));
            properties.push(Property::sometimes(
                "claim without the read refused by one replica after another acked it, delivered",
                |_, s: &State| {
                    s.ghost
                        .reached(Scenario::ClaimWithoutReadRefusedAfterAckDelivered)
                },
            ));
            properties.push(Property::sometimes(
                "claim without the read refused by a rival after another replica acked it, delivered",
                |_, s: &State| {
                    s.ghost
                        .reached(Scenario::ClaimWithoutReadRefusedByRivalAfterAckDelivered)
                },
            ));
            properties.push(Property::sometimes(
                "claim without the read stored on one replica while a delete was acknowledged",
                |_, s: &State| fast_claim_races_delete(s),
            ));
        }
        if self.config.dead_letter_nows_max > 0 {
            properties.push(Property::sometimes(
                "message moved by dead-letter-now",
                |_, s: &State| s.ghost.reached(Scenario::MovedNow),
            ));
            properties.push(Property::sometimes(
                "dead-letter-now refused for a superseded handle",
                |_, s: &State| s.ghost.reached(Scenario::NowRefused),
            ));
            properties.push(Property::sometimes(
                "dead-letter-now races a receive",
                |_, s: &State| now_races_receive(s),
            ));
        }
        properties
    }
}

/// Every replica holds the same records, none is still rebuilding, nothing is in flight, and
/// the heal schedule finished within its step cap.
fn converged(s: &State) -> bool {
    let first = &s.replicas[0];
    s.network.is_empty()
        && !s.ghost.violated(Violation::HealStuck)
        && s.replicas
            .iter()
            .all(|r| r.up && r.rebuilding == 0 && r.store == first.store)
}

/// The source queue is empty and an acknowledged send ended in one of the allowed ways.
fn drained(s: &State) -> bool {
    let source_live = s.joined(Queue::Source).is_live();
    let dead_letter_live = s.joined(Queue::DeadLetter).is_live();
    let accounted = !s.ghost.sent_acked
        || !s.ghost.deliveries.is_empty()
        || s.ghost.deleted
        || dead_letter_live;
    !source_live && accounted
}

/// A claim in its write phase that one replica holds while another holds a rival claim of the
/// same version: it can count only through the third replica, and its coordinator may give it
/// up here (`Abandon`), which is what a split claim does after `SPLIT_WAIT` (spec, receive step
/// 7, and *Considerations*, *Split claims (F2)*).
fn split_claim(s: &State) -> bool {
    s.coordinators.iter().any(|c| match c.op {
        Op::ClaimWrite {
            queue,
            generation,
            claim,
            ..
        } => {
            let held = |pick: &dyn Fn(Claim) -> bool| {
                s.replicas
                    .iter()
                    .filter(|r| {
                        let record = r.store[queue.index()];
                        record.generation == generation && record.claim().is_some_and(pick)
                    })
                    .count()
            };
            held(&|other| other == claim) == 1
                && held(&|other| other.seq == claim.seq && other != claim) >= 1
        }
        _ => false,
    })
}

fn concurrent_claims(s: &State) -> bool {
    match (s.coordinators[0].op, s.coordinators[1].op) {
        (
            Op::ClaimWrite {
                generation: g0,
                claim: c0,
                ..
            },
            Op::ClaimWrite {
                generation: g1,
                claim: c1,
                ..
            },
        ) => g0 == g1 && c0.seq == c1.seq,
        _ => false,
    }
}

/// One coordinator moves the message with dead-letter-now while the other claims the same life.
fn now_races_receive(s: &State) -> bool {
    (0..COORDINATORS).any(|c| {
        let moving = match s.coordinators[c].op {
            Op::NowRead { handle, .. } => Some(handle.generation),
            Op::MoveTarget {
                generation,
                cause: MoveCause::Now { .. },
                ..
            }
            | Op::MoveSource {
                generation,
                cause: MoveCause::Now { .. },
                ..
            } => Some(generation),
            _ => None,
        };
        matches!(
            (moving, s.coordinators[1 - c].op),
            (Some(g), Op::ClaimWrite { generation, .. }) if g == generation
        )
    })
}

/// A claim without the read in its write phase, stored on some replica, while a delete of the
/// same life has been acknowledged (on two replicas): the race spec#13's fast path must lose
/// (S3 says nothing is delivered). Refused by both replicas that hold the tombstone, it falls
/// back if no replica has acked it, and its read finds the tombstone; once one has, it cannot
/// reach a second ack and ends by its deadline.
fn fast_claim_races_delete(s: &State) -> bool {
    s.coordinators.iter().any(|c| match c.op {
        Op::ClaimWrite {
            queue,
            generation,
            claim,
            fast: true,
            ..
        } => {
            s.ghost.deletes_acked & (1 << generation) != 0
                && s.replicas.iter().any(|r| {
                    let record = r.store[queue.index()];
                    record.generation == generation && record.claim() == Some(claim)
                })
        }
        _ => false,
    })
}

fn delete_races_receive(s: &State) -> bool {
    let deleting = |op: Op| match op {
        Op::DeleteRead { handle, .. }
        | Op::DeleteWrite {
            handle,
            conditional: true,
            ..
        } => Some(handle),
        _ => None,
    };
    (0..COORDINATORS).any(|c| {
        let other = s.coordinators[1 - c].op;
        match (deleting(s.coordinators[c].op), other) {
            (
                Some(handle),
                Op::ClaimWrite {
                    generation, claim, ..
                },
            ) => generation == handle.generation && claim.seq > handle.claim.seq,
            _ => false,
        }
    })
}

impl Config {
    /// Everything off: no operations, no faults. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            dead_letter: false,
            dead_letter_claims: false,
            heal_redrives: false,
            max_receive_count: 0,
            start: Start::Empty,
            faults_max: 0,
            claims_max: 0,
            deletes_max: 0,
            collects_max: 0,
            redrives_max: 0,
            dead_letter_nows_max: 0,
            horizons_max: 0,
            anti_entropy_max: 0,
            replacements_max: 0,
            heal: false,
            claim_without_read: false,
            bug: None,
        }
    }
}
