//! Conformance of change visibility: this crate and the model of spec/replication.md section 5
//! (`trireme_spec::replication::visibility`) stepped through the same random operations, their
//! full states compared after every step.
//!
//! The model drives, as in `conformance`: receives, changes, a node's release (a change to 0),
//! deliveries, drops, duplicates, timeouts, anti-entropy and the clock's ticks, applied to the
//! model and to a world of `replica::accept`, `ReceiveOp` and `HandleOp`. A tick is
//! [`TICK_MS`] of the crate's clock; the model's receive time stands where the crate's claim has
//! its nonce (it tells one coordinator's two claims of one `seq` apart), so the world draws the
//! nonce from the receive's tick.
//!
//! Every run has the model's `claim_without_read` on, since the crate's replicas always check
//! (c), a claim's deadline against the `now` it carries (spec/replication.md §13, *A claim
//! without the read*): the model without the switch takes claims the crate refuses. A receive
//! through coordinator `c` therefore claims from replica `c`'s record in place when the model's
//! does, through `ReceiveOp::start_fast`, and the world's network answers a refusal of such a
//! claim while no replica has acked it, as the model's does, so both fall back to the read on
//! it; after an ack both leave its refusals silent, as a read-path claim's.

use std::collections::BTreeMap;

use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_replication::coordinator::{
    Effects, Handle, HandleAction, HandleAnswer, HandleOp, Outgoing, ReceiveAnswer, ReceiveOp,
    ReceivePath, ReceiveSettings, Reply, Request,
};
use trireme_replication::record::{Birth, Body, Claim, Held, Record};
use trireme_replication::replica::{Verdict, Write, accept};
use trireme_replication::{Generation, NodeId, RecordKey};
use trireme_spec::replication::visibility::{
    self as model, Action, CHANGE_TIMEOUT, COORDINATORS, Config, Message, Op, Packet, REPLICAS,
    Scenario, Start, State, VISIBILITY, VISIBILITY_SHORT, VISIBILITY_TOTAL_MAX, VisibilityModel,
};

use super::walks::{self, exchange};

/// One tick of the model on the crate's clock.
const TICK_MS: u64 = 1_000;
const SEQUENCES: u64 = 600;

fn key() -> RecordKey {
    RecordKey {
        queue: QueueName::try_from("q".to_string()).expect("a valid name"),
        incarnation: Incarnation::local(Millis(1)),
        message: MessageId(1),
    }
}

fn replicas() -> [NodeId; REPLICAS] {
    [NodeId(0), NodeId(1), NodeId(2)]
}

fn at(tick: u8) -> Millis {
    Millis(u64::from(tick) * TICK_MS)
}

fn tick_of(millis: Millis) -> u8 {
    assert_eq!(millis.0 % TICK_MS, 0, "the world's times are whole ticks");
    u8::try_from(millis.0 / TICK_MS).expect("small ticks")
}

// ----- between the two vocabularies -------------------------------------------------------------

fn project_held(held: Held) -> model::Lease {
    assert_eq!(
        held.claim.nonce,
        u64::from(tick_of(held.received_at)),
        "the world draws a claim's nonce from its receive's tick"
    );
    model::Lease {
        handle: model::Handle {
            claim: model::Claim {
                seq: u8::try_from(held.claim.seq).expect("small seqs"),
                coordinator: u8::try_from(held.claim.coordinator.0).expect("two coordinators"),
            },
            received_at: tick_of(held.received_at),
        },
        change_counter: u8::try_from(held.change_counter).expect("small counters"),
        deadline: tick_of(held.deadline),
    }
}

/// A replica's record as the model keeps it: the lease of the one generation, if any. The
/// message is stored on every replica before the model starts and never deleted.
fn project(record: Option<&Record>) -> model::Record {
    let record = record.expect("the message is on every replica");
    assert_eq!(record.generation, Generation(0), "one life");
    record
        .live()
        .expect("never deleted here")
        .held
        .map(project_held)
}

fn inject_claim(handle: model::Handle) -> Claim {
    Claim {
        seq: u32::from(handle.claim.seq),
        coordinator: NodeId(u16::from(handle.claim.coordinator)),
        nonce: u64::from(handle.received_at),
    }
}

fn inject_held(lease: model::Lease) -> Held {
    Held {
        claim: inject_claim(lease.handle),
        change_counter: u32::from(lease.change_counter),
        deadline: at(lease.deadline),
        received_at: at(lease.handle.received_at),
    }
}

fn sent() -> Record {
    Record::sent(Birth {
        payload: b"m".to_vec(),
        sent_at: Millis(0),
        visible_from: Millis(0),
        source_queue: None,
        dedup_id: None,
    })
}

/// The crate's record of a model record: the sent message with the model's lease and one
/// receive per `seq` (receive counts are not part of the model).
fn inject(record: model::Record) -> Record {
    let mut stored = sent();
    if let (Some(lease), Body::Live(live)) = (record, &mut stored.body) {
        live.held = Some(inject_held(lease));
        live.receive_count = u32::from(lease.handle.claim.seq);
        live.first_received_at = Some(Millis(0));
    }
    stored
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wire {
    Read,
    Repair(model::Record),
    Claim(model::Lease),
    Change(model::Lease),
}

/// `(replica, coordinator or 0 when not current, current, request)`.
type WireKey = (u8, u8, bool, Wire);

fn wire_of_model(packet: &Packet) -> WireKey {
    let wire = match packet.message {
        Message::Read => Wire::Read,
        Message::Repair { record } => Wire::Repair(record),
        Message::Claim { lease } => Wire::Claim(lease),
        Message::Change { lease, .. } => Wire::Change(lease),
    };
    (packet.replica, packet.coordinator, packet.round == 1, wire)
}

fn lease_of(record: &Record) -> model::Lease {
    project(Some(record)).expect("a claim or a change carries its lease")
}

fn wire_of_request(request: &Request) -> Wire {
    match request {
        Request::Read => Wire::Read,
        Request::Write { write, ack } => match (write.as_ref(), ack) {
            (Write::Merge(record), false) => Wire::Repair(project(Some(record))),
            (Write::Claim { record, .. }, true) => Wire::Claim(lease_of(record)),
            (Write::Visibility(record), true) => Wire::Change(lease_of(record)),
            (other, ack) => panic!("section 5's runs send no {other:?} (ack {ack})"),
        },
    }
}

// ----- the world built from this crate ---------------------------------------------------------

#[derive(Clone, Debug)]
enum Running {
    Idle,
    Receive(ReceiveOp),
    Change(HandleOp),
}

#[derive(Clone, Debug)]
struct InFlight {
    replica: usize,
    /// `None` for a read repair.
    from: Option<usize>,
    op: u64,
    round: u32,
    request: Request,
}

/// A replica rule switched off in the world, to show the comparison catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plant {
    /// A replica takes a change whatever claim it holds, the change's lease replacing its own
    /// (the replica condition of spec/replication.md section 5, step 3, left out).
    UnconditionalChange,
    /// A replica takes a claim whatever its lease's deadline and the `now` the claim carries
    /// (check (c) of spec/replication.md §13 left out, the model's
    /// `ClaimWithoutReadNoDeadlineCheck`).
    NoDeadlineCheck,
    /// A coordinator's claim without the read goes to its own replica at once, with the two
    /// others, and not again at the first ack (spec/replication.md §13 before *Own replica
    /// last*, the model's `FastClaimOwnReplicaFirst`).
    OwnReplicaFirst,
}

#[derive(Clone, Debug)]
struct World {
    stores: [Record; REPLICAS],
    running: [Running; COORDINATORS],
    ops: [u64; COORDINATORS],
    rounds: [u32; COORDINATORS],
    /// The handle each client holds.
    clients: [Option<Handle>; COORDINATORS],
    network: Vec<InFlight>,
    now: u8,
    /// The read replies each coordinator's current operation took, by replica, with the
    /// operation's number.
    replied: [[Option<(u64, Record)>; REPLICAS]; COORDINATORS],
    /// The model's `claim_without_read`: a receive first tries the claim from its
    /// coordinator's own replica.
    fast: bool,
    plant: Option<Plant>,
}

impl World {
    fn from_model(config: &Config, state: &State) -> World {
        let mut world = World {
            stores: std::array::from_fn(|r| inject(state.replicas[r])),
            running: [Running::Idle, Running::Idle],
            ops: [0; COORDINATORS],
            rounds: [0; COORDINATORS],
            clients: std::array::from_fn(|c| {
                state.clients[c].map(|handle| Handle {
                    generation: Generation(0),
                    claim: inject_claim(handle),
                })
            }),
            network: Vec::new(),
            now: state.now,
            replied: Default::default(),
            fast: config.claim_without_read,
            plant: None,
        };
        for packet in &state.network {
            let Message::Repair { record } = packet.message else {
                panic!("starting points hold only repairs in flight");
            };
            world.network.push(InFlight {
                replica: packet.replica as usize,
                from: None,
                op: 0,
                round: 0,
                request: Request::Write {
                    write: Box::new(Write::Merge(inject(record))),
                    ack: false,
                },
            });
        }
        world
    }

    fn busy(&self, c: usize) -> bool {
        !matches!(self.running[c], Running::Idle)
    }

    /// Whether coordinator `c` is a receive whose claim without the read is under way (no
    /// refusal yet, no answer).
    /// A claim without the read that no replica has acked yet: the one kind of claim whose
    /// refusal the model answers (spec §13: after an ack it is a claim like the read path's,
    /// and the model leaves its refusals silent, as for those).
    fn fast_claim_unacked(&self, c: usize) -> bool {
        matches!(&self.running[c], Running::Receive(op) if op.path() == ReceivePath::Fast && op.claim_acked() == 0)
    }

    fn fast_claim(&self, c: usize) -> bool {
        matches!(&self.running[c], Running::Receive(op) if op.path() == ReceivePath::Fast)
    }

    fn reading(&self, c: usize) -> bool {
        match &self.running[c] {
            Running::Receive(op) => op.reading(),
            Running::Change(op) => op.reading(),
            Running::Idle => false,
        }
    }

    fn awaited(&self, c: usize, packet: &InFlight) -> bool {
        self.busy(c) && packet.op == self.ops[c] && packet.round == self.rounds[c]
    }

    fn key(&self, packet: &InFlight) -> WireKey {
        let current = packet.from.is_some_and(|c| self.awaited(c, packet));
        let coordinator = if current {
            packet.from.expect("current packets have a coordinator") as u8
        } else {
            0
        };
        (
            packet.replica as u8,
            coordinator,
            current,
            wire_of_request(&packet.request),
        )
    }

    fn normalize(&mut self) {
        let network = std::mem::take(&mut self.network);
        self.network = network
            .into_iter()
            .filter(|packet| {
                if !matches!(packet.request, Request::Read) {
                    return true;
                }
                let c = packet.from.expect("reads come from coordinators");
                self.awaited(c, packet) && self.reading(c)
            })
            .collect();
    }

    fn keys(&self) -> Vec<WireKey> {
        let mut keys: Vec<WireKey> = self.network.iter().map(|p| self.key(p)).collect();
        keys.sort();
        keys
    }

    fn absorb<A>(&mut self, c: usize, effects: Effects<A>, on_answer: impl FnOnce(&mut World, A)) {
        for out in effects.sends {
            assert_eq!(out.key, key(), "one message in the model");
            let repair = matches!(out.request, Request::Write { ack: false, .. });
            if repair && self.repairs_only_unmodelled_fields(c, &out) {
                continue;
            }
            if !repair {
                self.rounds[c] = self.rounds[c].max(out.round);
            }
            self.network.push(InFlight {
                replica: usize::from(out.to.0),
                from: (!repair).then_some(c),
                op: self.ops[c],
                round: out.round,
                request: out.request,
            });
        }
        if let Some(answer) = effects.answer {
            self.running[c] = Running::Idle;
            on_answer(self, answer);
        }
    }

    /// Whether the read repair `out` differs from what its replica replied only in fields the
    /// model leaves out (receive counts, entry and first-receive times): the model, seeing the
    /// two equal, sends none.
    fn repairs_only_unmodelled_fields(&self, c: usize, out: &Outgoing) -> bool {
        let Request::Write { write, .. } = &out.request else {
            return false;
        };
        let Write::Merge(merged) = write.as_ref() else {
            return false;
        };
        match &self.replied[c][usize::from(out.to.0)] {
            Some((op, reply)) if *op == self.ops[c] => {
                project(Some(reply)) == project(Some(merged))
            }
            _ => panic!("coordinator {c} repairs a replica whose reply it did not take"),
        }
    }

    fn begin(&mut self, c: usize) {
        self.ops[c] += 1;
        self.rounds[c] = 0;
    }

    /// Client `c`'s receive through its node, asking for `visibility` ticks.
    fn start_receive(&mut self, c: usize, visibility: u8) {
        let settings = ReceiveSettings {
            me: NodeId(c as u16),
            now: at(self.now),
            visibility_timeout_ms: u64::from(visibility) * TICK_MS,
            max_receive_count: None,
            nonce: u64::from(self.now),
            purged_through: None,
            retention_ms: u64::MAX,
        };
        self.begin(c);
        // The model's coordinator `c` has replica `c` as its own, read in place; the crate's
        // guard alone decides whether the fast path applies, and `compare` checks that the
        // model's guard decided the same.
        let fast = self
            .fast
            .then(|| ReceiveOp::start_fast(key(), replicas(), settings, &self.stores[c]))
            .flatten();
        let Some((mut op, effects)) = fast else {
            let (op, effects) = ReceiveOp::start(key(), replicas(), settings);
            self.running[c] = Running::Receive(op);
            self.absorb(c, effects, World::on_receive_answer(c));
            return;
        };
        // The model has no purge: the watermark read finds none, and a fast claim is delivered
        // at its two acks.
        let watermark = op.on_watermark(None);
        assert!(
            watermark.sends.is_empty() && watermark.answer.is_none(),
            "the watermark alone decides nothing before the claim's acks"
        );
        let mut effects = effects;
        if self.plant == Some(Plant::OwnReplicaFirst) {
            let mut own = effects
                .sends
                .first()
                .expect("a claim without the read sends its claim")
                .clone();
            own.to = NodeId(c as u16);
            effects.sends.push(own);
        }
        self.running[c] = Running::Receive(op);
        self.absorb(c, effects, World::on_receive_answer(c));
    }

    /// Whether `out`, sent by coordinator `c`'s claim without the read, is its claim to its own
    /// replica, which the plant `OwnReplicaFirst` sent at the start.
    fn sent_first(&self, c: usize, out: &Outgoing) -> bool {
        self.plant == Some(Plant::OwnReplicaFirst)
            && out.to == NodeId(c as u16)
            && matches!(&out.request, Request::Write { write, .. } if matches!(write.as_ref(), Write::Claim { .. }))
    }

    fn on_receive_answer(c: usize) -> impl FnOnce(&mut World, ReceiveAnswer) {
        move |world, answer| {
            if let ReceiveAnswer::Delivered(record) = answer {
                world.clients[c] = Some(Handle {
                    generation: record.generation,
                    claim: record.claim().expect("a delivery holds its claim"),
                });
            }
        }
    }

    /// Client `c`'s change through its node; `release`: the node's change to 0 for a long poll
    /// whose client left, which forgets the handle.
    fn start_change(&mut self, c: usize, release: bool) {
        let handle = self.clients[c].expect("a change needs a handle");
        let timeout = if release {
            self.clients[c] = None;
            0
        } else {
            CHANGE_TIMEOUT
        };
        let action = HandleAction::ChangeVisibility {
            timeout_ms: u64::from(timeout) * TICK_MS,
            cap_ms: u64::from(VISIBILITY_TOTAL_MAX) * TICK_MS,
        };
        self.begin(c);
        let (op, effects) = HandleOp::start(key(), replicas(), handle, action, at(self.now));
        self.running[c] = Running::Change(op);
        self.absorb(c, effects, |_, _: HandleAnswer| {});
    }

    fn abandon(&mut self, c: usize) {
        match &mut self.running[c] {
            Running::Receive(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Change(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Idle => panic!("only a busy coordinator times out"),
        }
    }

    fn take(&mut self, key: &WireKey) -> InFlight {
        let index = self
            .network
            .iter()
            .position(|p| self.key(p) == *key)
            .unwrap_or_else(|| panic!("the world has the model's packet {key:?}"));
        self.network.remove(index)
    }

    fn deliver(&mut self, key: &WireKey) {
        let packet = self.take(key);
        let r = packet.replica;
        let reply = match &packet.request {
            Request::Read => Some(Reply::Record(Some(self.stores[r].clone()))),
            Request::Write { write, ack } => {
                let mut verdict = accept(Some(&self.stores[r]), write.as_ref());
                if let (Some(Plant::UnconditionalChange), Write::Visibility(change)) =
                    (self.plant, write.as_ref())
                    && verdict == Verdict::Refused
                {
                    verdict = Verdict::Store(Some(change.clone()));
                }
                if let (
                    Some(Plant::NoDeadlineCheck),
                    Write::Claim {
                        record,
                        max_receive_count,
                        ..
                    },
                ) = (self.plant, write.as_ref())
                    && verdict == Verdict::Refused
                {
                    // By a clock past every deadline, (c) passes and (a), (b), (d) decide.
                    let unchecked = Write::Claim {
                        record: record.clone(),
                        now: Millis(u64::MAX),
                        max_receive_count: *max_receive_count,
                    };
                    verdict = accept(Some(&self.stores[r]), &unchecked);
                }
                let acked = verdict.acks();
                // spec §13: a refusal answers only a fast claim, which falls back on it; the
                // read path's claim waits for its acks as in section 5's receive.
                let answered_refusal = verdict == Verdict::Refused
                    && matches!(write.as_ref(), Write::Claim { .. })
                    && packet.from.is_some_and(|c| self.fast_claim_unacked(c));
                match verdict {
                    Verdict::Store(Some(record)) => self.stores[r] = record,
                    Verdict::Store(None) => panic!("nothing removes the message here"),
                    Verdict::Unchanged | Verdict::Refused => {}
                    Verdict::Diverged(divergence) => panic!("no writer diverges: {divergence}"),
                }
                if answered_refusal {
                    Some(Reply::Refused)
                } else {
                    (acked && *ack).then_some(Reply::Ack)
                }
            }
        };
        let (Some(reply), Some(c)) = (reply, packet.from) else {
            return;
        };
        if !self.busy(c) || packet.op != self.ops[c] {
            return;
        }
        if let Reply::Record(Some(record)) = &reply {
            self.replied[c][r] = Some((packet.op, record.clone()));
        }
        let (from, round) = (NodeId(r as u16), packet.round);
        match &mut self.running[c] {
            Running::Receive(op) => {
                let fast = op.path() == ReceivePath::Fast;
                let mut effects = op.on_reply(from, round, &reply);
                if fast {
                    effects.sends.retain(|out| !self.sent_first(c, out));
                }
                self.absorb(c, effects, World::on_receive_answer(c));
            }
            Running::Change(op) => {
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, |_, _| {});
            }
            Running::Idle => unreachable!("checked busy above"),
        }
    }

    /// One anti-entropy round between replicas `a` and `b` through the crate's
    /// `anti_entropy` (digests, differing partitions, reconcile), as in `conformance`.
    fn anti_entropy(&mut self, a: usize, b: usize) {
        let held = |r: usize| BTreeMap::from([(key(), self.stores[r].clone())]);
        let Some(reconciled) = exchange(&held(a), &held(b)) else {
            return;
        };
        for (to, records) in [(b, reconciled.to_peer), (a, reconciled.to_me)] {
            for (_, record) in records {
                if let Verdict::Store(Some(merged)) =
                    accept(Some(&self.stores[to]), &Write::Merge(record))
                {
                    self.stores[to] = merged;
                }
            }
        }
    }
}

// ----- comparison -------------------------------------------------------------------------------

fn compare(state: &State, world: &World, trace: &[Action]) {
    assert_eq!(world.now, state.now, "clocks differ after {trace:?}");
    for r in 0..REPLICAS {
        assert_eq!(
            project(Some(&world.stores[r])),
            state.replicas[r],
            "replica {r} differs after {trace:?}"
        );
    }
    // The two fast paths' guards and fallbacks agree: a claim without the read is under way in
    // both or in neither. Checked before the network, whose difference it would explain.
    for c in 0..COORDINATORS {
        assert_eq!(
            world.fast_claim(c),
            matches!(state.coordinators[c].op, Op::ClaimWrite { fast: true, .. }),
            "coordinator {c}'s claim without the read differs after {trace:?}"
        );
    }
    let mut model_keys: Vec<WireKey> = state.network.iter().map(wire_of_model).collect();
    model_keys.sort();
    assert_eq!(world.keys(), model_keys, "network differs after {trace:?}");
    for c in 0..COORDINATORS {
        assert_eq!(
            world.busy(c),
            state.coordinators[c].op != Op::Idle,
            "coordinator {c} phase differs after {trace:?}"
        );
        let client = world.clients[c].map(|handle| {
            assert_eq!(handle.generation, Generation(0));
            model::Handle {
                claim: model::Claim {
                    seq: u8::try_from(handle.claim.seq).expect("small"),
                    coordinator: u8::try_from(handle.claim.coordinator.0).expect("small"),
                },
                received_at: u8::try_from(handle.claim.nonce).expect("small"),
            }
        });
        assert_eq!(
            client, state.clients[c],
            "client {c}'s handle differs after {trace:?}"
        );
    }
}

fn apply(world: &mut World, state: &State, action: Action) {
    match action {
        Action::Deliver(i) => world.deliver(&wire_of_model(&state.network[i as usize])),
        Action::Drop(i) => {
            world.take(&wire_of_model(&state.network[i as usize]));
        }
        Action::Duplicate(i) => {
            let key = wire_of_model(&state.network[i as usize]);
            let packet = world.take(&key);
            world.network.push(packet.clone());
            world.network.push(packet);
        }
        Action::Abandon(c) => world.abandon(c as usize),
        Action::Claim(c) => world.start_receive(c as usize, VISIBILITY),
        Action::ShortClaim(c) => world.start_receive(c as usize, VISIBILITY_SHORT),
        Action::Change(c) => world.start_change(c as usize, false),
        Action::Release(c) => world.start_change(c as usize, true),
        Action::AntiEntropy { a, b } => world.anti_entropy(a as usize, b as usize),
        Action::Tick => world.now += 1,
        Action::Heal { .. } => panic!("conformance runs leave the heal out"),
    }
    world.normalize();
}

impl walks::World<VisibilityModel> for World {
    fn apply(&mut self, state: &State, action: Action) {
        apply(self, state, action);
    }

    fn compare(&self, state: &State, trace: &[Action]) {
        compare(state, self, trace);
    }
}

fn walk(config: &Config, seed: u64) -> (Vec<Action>, State) {
    walk_with(config, seed, None)
}

fn walk_with(config: &Config, seed: u64, plant: Option<Plant>) -> (Vec<Action>, State) {
    walks::walk(
        &VisibilityModel::new(config.clone()),
        seed,
        |action| matches!(action, Action::Heal { .. }),
        |state| World {
            plant,
            ..World::from_model(config, state)
        },
    )
}

/// A run with everything off but the claim without the read, which the crate always has: its
/// replicas check (c) on every claim, and the model checks it only with the switch.
fn quiet(name: &'static str) -> Config {
    Config {
        claim_without_read: true,
        ..Config::quiet(name)
    }
}

/// Runs the walks and checks that some walk reached each of `must_reach`.
fn run(config: Config, must_reach: &[Scenario]) {
    walks::run(
        &format!("visibility conformance {:?}", config.name),
        SEQUENCES,
        "cargo test -p trireme-replication --test it conformance_visibility::",
        |seed| walk(&config, seed),
        must_reach,
        |scenario, _, last: &State| last.ghost.reached(scenario),
    );
}

#[test]
fn changes_conform() {
    run(
        Config {
            start: Start::Received,
            claims_max: 2,
            changes_max: 3,
            anti_entropy_max: 1,
            faults_max: 2,
            ticks_max: 3,
            short_receives: true,
            ..quiet("changes")
        },
        &[
            Scenario::ExtensionHeld,
            Scenario::CapRefused,
            Scenario::StaleRefused,
            Scenario::FastDelivered,
            Scenario::FastFellBack,
            Scenario::DeadlineRefused,
            Scenario::OwnReplicaLast,
            Scenario::OwnReplicaSpared,
            Scenario::FastRefusedAfterAckDelivered,
        ],
    );
}

#[test]
fn release_conforms() {
    run(
        Config {
            start: Start::Received,
            claims_max: 2,
            changes_max: 1,
            releases_max: 2,
            anti_entropy_max: 1,
            faults_max: 1,
            ticks_max: 2,
            ..quiet("release")
        },
        &[
            Scenario::ReleasedAndReceived,
            Scenario::EqualCounterMerged,
            Scenario::FastDelivered,
            Scenario::FastFellBack,
            Scenario::DeadlineRefused,
        ],
    );
}

#[test]
fn rival_claims_conform() {
    run(
        Config {
            start: Start::Ready,
            claims_max: 3,
            changes_max: 2,
            anti_entropy_max: 2,
            faults_max: 2,
            ticks_max: 2,
            short_receives: true,
            ..quiet("rival claims")
        },
        &[
            Scenario::RivalClaimsMerged,
            Scenario::FastDelivered,
            Scenario::FastFellBack,
            Scenario::DeadlineRefused,
            Scenario::OwnReplicaLast,
            Scenario::FastRefusedAfterAckDelivered,
            Scenario::FastRefusedByRivalAfterAckDelivered,
        ],
    );
}

#[test]
fn a_replica_taking_every_change_is_caught() {
    let config = Config {
        start: Start::Received,
        claims_max: 2,
        changes_max: 2,
        faults_max: 1,
        ticks_max: 2,
        ..quiet("planted: unconditional change")
    };
    let seed = walks::first_failing(SEQUENCES, |seed| {
        walk_with(&config, seed, Some(Plant::UnconditionalChange))
    });
    eprintln!("planted unconditional change caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}

/// spec/replication.md §13's counterexample for (c): an extension acknowledged on replicas 1
/// and 2 leaves replica 0, coordinator 0's own, with the receive's older lease; at its
/// deadline coordinator 0 claims from it, and replicas without (c) take the claim before the
/// acknowledged deadline where the crate's refuse it.
#[test]
fn a_replica_without_the_deadline_check_is_caught() {
    let config = Config {
        start: Start::Received,
        claims_max: 1,
        changes_max: 2,
        ticks_max: 1,
        ..quiet("planted: claim without the deadline check")
    };
    assert_eq!(
        walks::first_failing(SEQUENCES, |seed| walk(&config, seed)),
        None,
        "without the plant the run conforms, so a failure below is the plant's"
    );
    let seed = walks::first_failing(SEQUENCES, |seed| {
        walk_with(&config, seed, Some(Plant::NoDeadlineCheck))
    });
    eprintln!("planted claim without the deadline check caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}

/// spec/replication.md §13, *Own replica last*: the crate sends a claim without the read to
/// its coordinator's own replica only after another replica's ack, as the model does. A world
/// that sends it there at once, the design before, steps in step with the model's planted
/// `FastClaimOwnReplicaFirst` (the model's bug is that design) and apart from the correct
/// model, at the first claim without the read.
#[test]
fn a_claim_without_the_read_sent_to_the_own_replica_first_is_caught() {
    let config = Config {
        start: Start::Received,
        claims_max: 2,
        changes_max: 2,
        ticks_max: 1,
        short_receives: true,
        ..quiet("planted: own replica first")
    };
    let old_design = Config {
        bug: Some(model::Bug::FastClaimOwnReplicaFirst),
        ..config.clone()
    };
    assert_eq!(
        walks::first_failing(SEQUENCES, |seed| {
            walk_with(&old_design, seed, Some(Plant::OwnReplicaFirst))
        }),
        None,
        "the world with the plant is the model with the bug"
    );
    let seed = walks::first_failing(SEQUENCES, |seed| {
        walk_with(&config, seed, Some(Plant::OwnReplicaFirst))
    });
    eprintln!("planted own replica first caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted order");
}
