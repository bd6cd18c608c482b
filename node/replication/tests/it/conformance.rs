//! Conformance: this crate and the model of spec/replication.md (`trireme_spec::replication`)
//! are stepped through the same random operations, and their full states are compared after
//! every step: every replica's record, every request in flight, every coordinator's phase and
//! handle, and every delivery.
//!
//! The model drives: each step is one of the actions the model enables (sends, receives,
//! deletes, dead-letter moves, dead-letter-now, redrives, receives and deletes in the dead-letter
//! queue, deliveries, drops, duplicates, crashes, restarts, timeouts, anti-entropy), applied to
//! the model with `next_state` and to a small world built from this crate (replicas that decide
//! with `replica::accept`, coordinators that are `coordinator::*Op`, a multiset network). The
//! world keeps the model's two records per replica: the message in the source queue and its
//! dead-letter copy, one message id under two queue names. The
//! model's reductions are mirrored, not re-implemented: a refusal is silent but a delete's
//! refused conditional tombstone, which the model answers (spec/replication.md, *Delete* step 4,
//! F3: the delete answers from its refusals; the other operations' early answers on refusals are
//! covered by the crate's unit tests), replies arrive in the step that produced them, and a read
//! its coordinator no longer awaits is dropped from the network.
//!
//! With the model's `claim_without_read` (spec/replication.md §13, *A claim without the read*)
//! a receive through coordinator `c` first tries the claim from replica `c`'s record, the
//! model's own replica of that coordinator, through `ReceiveOp::start_fast`, and a refusal of
//! that claim while no replica has acked it is answered, as in the model, so both fall back to
//! the read on it; after an ack both leave its refusals silent, as a read-path claim's.

use std::collections::BTreeMap;

use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_replication::coordinator::{
    CollectAnswer, CollectOp, DeadLetterNowAnswer, Effects, Handle, HandleAction, HandleAnswer,
    HandleOp, MoveOp, Outgoing, ReceiveAnswer, ReceiveOp, ReceivePath, ReceiveSettings, RedriveOp,
    Reply, Request, SendAnswer, SendOp, drop_requests,
};
use trireme_replication::record::{Birth, Body, Claim, Held, Live, Record, SourceQueue};
use trireme_replication::replica::{Verdict, Write, accept};
use trireme_replication::{Generation, NodeId, RecordKey};
use trireme_spec::replication::protocol::{self as model, Message, Op, Packet, Queue, Scenario};
use trireme_spec::replication::record as model_record;
use trireme_spec::replication::{Action, Config, ReplicationModel, Start, State};

use super::walks::{self, exchange};

const REPLICAS: usize = 3;
const COORDINATORS: usize = 2;

const QUEUES: usize = 2;

fn queue_name(queue: Queue) -> QueueName {
    let name = match queue {
        Queue::Source => "q",
        Queue::DeadLetter => "q-dlq",
    };
    QueueName::try_from(name.to_string()).expect("a valid name")
}

fn incarnation() -> Incarnation {
    Incarnation::local(Millis(1))
}

/// The message's key in `queue`: one message id in both queues, as moves and redrives keep it.
fn key(queue: Queue) -> RecordKey {
    RecordKey {
        queue: queue_name(queue),
        incarnation: incarnation(),
        message: MessageId(1),
    }
}

fn queue_of(key: &RecordKey) -> Queue {
    [Queue::Source, Queue::DeadLetter]
        .into_iter()
        .find(|queue| queue_name(*queue) == key.queue)
        .unwrap_or_else(|| panic!("a key of the model's queues: {key:?}"))
}

fn source_queue() -> SourceQueue {
    SourceQueue {
        name: queue_name(Queue::Source),
        incarnation: incarnation(),
    }
}

fn replicas() -> [NodeId; REPLICAS] {
    [NodeId(0), NodeId(1), NodeId(2)]
}

/// Once-fields as every correct writer derives them: the payload and send time travel with the
/// message; a copy in the dead-letter queue names its source (`coordinator::dead_letter_copy`),
/// a copy in the source does not (`coordinator::redrive_copy`).
fn birth(queue: Queue) -> Birth {
    Birth {
        payload: b"m".to_vec(),
        sent_at: Millis(0),
        visible_from: Millis(0),
        source_queue: (queue == Queue::DeadLetter).then(|| Box::new(source_queue())),
        dedup_id: None,
    }
}

// ----- between the two vocabularies -------------------------------------------------------------

fn project(record: Option<&Record>) -> model_record::Record {
    let Some(record) = record else {
        return model_record::Record::default();
    };
    let generation = u8::try_from(record.generation.0).expect("the model's generations are small");
    match &record.body {
        Body::Tombstone(_) => model_record::Record::tombstone(generation),
        Body::Live(live) => model_record::Record {
            generation,
            body: model_record::Body::Live {
                claim: live.held.map(|held| project_claim(held.claim)),
                receive_count: u8::try_from(live.receive_count).expect("small counts"),
            },
        },
    }
}

fn project_claim(claim: Claim) -> model_record::Claim {
    assert_eq!(claim.nonce, 0, "the model has no nonces; the world draws 0");
    model_record::Claim {
        seq: u8::try_from(claim.seq).expect("small seqs"),
        coordinator: u8::try_from(claim.coordinator.0).expect("two coordinators"),
    }
}

fn inject_claim(claim: model_record::Claim) -> Claim {
    Claim {
        seq: u32::from(claim.seq),
        coordinator: NodeId(u16::from(claim.coordinator)),
        nonce: 0,
    }
}

/// The crate's record of a model record in `queue`, with the fields the model leaves out at the
/// values the world's clock (always 0) and visibility timeout (0) give them.
fn inject(queue: Queue, record: model_record::Record) -> Option<Record> {
    let generation = Generation(u32::from(record.generation));
    match record.body {
        model_record::Body::Absent => None,
        model_record::Body::Tombstone => Some(Record::tombstone(
            generation,
            trireme_replication::TombstoneReason::Deleted,
            Millis(0),
        )),
        model_record::Body::Live {
            claim,
            receive_count,
        } => Some(Record {
            generation,
            body: Body::Live(Live {
                birth: birth(queue),
                entered_at: Millis(0),
                hidden_through: None,
                held: claim.map(|claim| Held {
                    claim: inject_claim(claim),
                    change_counter: 0,
                    deadline: Millis(0),
                    received_at: Millis(0),
                }),
                receive_count: u32::from(receive_count),
                // A dead-letter copy keeps its first receive without its claim.
                first_received_at: (claim.is_some() || receive_count > 0).then_some(Millis(0)),
                settle: trireme_replication::Settle::Ready,
            }),
        }),
    }
}

/// A request as both sides can state it: the model's ghost fields (a tombstone's reason) and
/// the crate's extra fields (payload, times) left out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wire {
    Read,
    Write {
        record: model_record::Record,
        ack: bool,
    },
    Claim {
        generation: u8,
        claim: model_record::Claim,
        receive_count: u8,
    },
    Tombstone {
        generation: u8,
        expect: Option<model_record::Claim>,
    },
    Drop {
        generation: u8,
    },
}

/// `(replica, coordinator or 0 when not current, current, queue, request)`, as the model
/// normalises.
type WireKey = (u8, u8, bool, Queue, Wire);

fn wire_of_model(packet: &Packet) -> WireKey {
    let (queue, wire) = match packet.message {
        Message::Read { queue } => (queue, Wire::Read),
        Message::Write { queue, record, ack } => (queue, Wire::Write { record, ack }),
        Message::Claim {
            queue,
            generation,
            claim,
            receive_count,
        } => (
            queue,
            Wire::Claim {
                generation,
                claim,
                receive_count,
            },
        ),
        Message::Tombstone {
            queue,
            generation,
            expect,
            ..
        } => (queue, Wire::Tombstone { generation, expect }),
        Message::Drop { queue, generation } => (queue, Wire::Drop { generation }),
        Message::ReadReply { .. } | Message::Ack | Message::Refused => {
            unreachable!("replies reach coordinators in the step that made them")
        }
    };
    (
        packet.replica,
        packet.coordinator,
        packet.round == 1,
        queue,
        wire,
    )
}

fn wire_of_request(request: &Request) -> Wire {
    match request {
        Request::Read => Wire::Read,
        Request::Write { write, ack } => match write.as_ref() {
            Write::Merge(record) => Wire::Write {
                record: project(Some(record)),
                ack: *ack,
            },
            Write::Claim { record, .. } => {
                let projected = project(Some(record));
                let model_record::Body::Live {
                    claim: Some(claim),
                    receive_count,
                } = projected.body
                else {
                    panic!("a claim write holds its claim");
                };
                Wire::Claim {
                    generation: projected.generation,
                    claim,
                    receive_count,
                }
            }
            Write::Tombstone {
                generation, expect, ..
            } => Wire::Tombstone {
                generation: u8::try_from(generation.0).expect("small generations"),
                expect: expect.map(project_claim),
            },
            Write::Drop { generation } => Wire::Drop {
                generation: u8::try_from(generation.0).expect("small generations"),
            },
            Write::Visibility(_) => panic!("the model's runs here change no visibility"),
            Write::Confirm => panic!("part 1's model sends no deduplication ids"),
        },
    }
}

// ----- the world built from this crate ---------------------------------------------------------

#[derive(Clone, Debug)]
enum Running {
    Idle,
    Send(SendOp),
    Receive(ReceiveOp),
    Handle(HandleOp),
    Move(MoveOp),
    Redrive(RedriveOp),
    /// A collection's read of all three.
    Collect(CollectOp),
    /// All three held the tombstone of `generation` in `queue` when the clock's era was `era`;
    /// the drop waits for the horizon to pass (the driver's timer).
    CollectWait {
        queue: Queue,
        generation: Generation,
        era: u8,
    },
}

#[derive(Clone, Debug)]
struct InFlight {
    replica: usize,
    /// `None` for a read repair (nobody awaits it).
    from: Option<usize>,
    /// Which operation of its coordinator sent it.
    op: u64,
    /// The operation's round, as the crate numbered it.
    round: u32,
    queue: Queue,
    request: Request,
}

/// A handle as the world's clients hold it: the queue it was issued in and the crate's handle.
type HeldHandle = (Queue, Handle);

/// A read reply a coordinator took: its operation's number and the record.
type Replied = (u64, Option<Record>);

#[derive(Clone, Debug)]
struct World {
    /// Each replica's record per queue, in the model's order (`Queue::index`).
    stores: [[Option<Record>; QUEUES]; REPLICAS],
    running: [Running; COORDINATORS],
    /// Operations started per coordinator (the current one's number).
    ops: [u64; COORDINATORS],
    /// The current operation's newest round.
    rounds: [u32; COORDINATORS],
    handles: [Option<HeldHandle>; COORDINATORS],
    network: Vec<InFlight>,
    deliveries: Vec<(u8, model_record::Claim, u8)>,
    /// The read replies each coordinator's current operation took, by replica, with the
    /// operation's number: what its read repairs are measured against.
    replied: [[Option<Replied>; REPLICAS]; COORDINATORS],
    /// Horizons passed so far.
    era: u8,
    /// The redrive policy's `maxReceiveCount` of the source, when the run has a dead-letter
    /// queue.
    max_receive_count: Option<u32>,
    /// The model's `claim_without_read`: a receive first tries the claim from its
    /// coordinator's own replica.
    fast: bool,
    /// A crate rule switched off (self-tests of the comparison only).
    plant: Option<Plant>,
}

impl World {
    fn from_model(config: &Config, state: &State) -> World {
        let mut world = World {
            stores: std::array::from_fn(|r| {
                [Queue::Source, Queue::DeadLetter]
                    .map(|queue| inject(queue, state.replicas[r].store[queue.index()]))
            }),
            running: [Running::Idle, Running::Idle],
            ops: [0; COORDINATORS],
            rounds: [0; COORDINATORS],
            handles: std::array::from_fn(|c| {
                state.coordinators[c].handle.map(|handle| {
                    (
                        handle.queue,
                        Handle {
                            generation: Generation(u32::from(handle.generation)),
                            claim: inject_claim(handle.claim),
                        },
                    )
                })
            }),
            network: Vec::new(),
            deliveries: state
                .ghost
                .deliveries
                .iter()
                .map(|d| (d.generation, d.claim, d.receive_count))
                .collect(),
            replied: Default::default(),
            era: 0,
            max_receive_count: config
                .dead_letter
                .then_some(u32::from(config.max_receive_count)),
            fast: config.claim_without_read,
            plant: None,
        };
        for packet in &state.network {
            assert!(
                packet.round == 0,
                "starting points hold only requests nobody awaits"
            );
            let Message::Write { queue, record, ack } = packet.message else {
                panic!("starting points hold only writes in flight");
            };
            world.network.push(InFlight {
                replica: packet.replica as usize,
                from: None,
                op: 0,
                round: 0,
                queue,
                request: Request::Write {
                    write: Box::new(Write::Merge(
                        inject(queue, record).expect("a write carries a record"),
                    )),
                    ack,
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
            Running::Handle(op) => op.reading(),
            Running::Redrive(op) => op.reading(),
            Running::Collect(_) => true,
            Running::Idle | Running::Send(_) | Running::Move(_) | Running::CollectWait { .. } => {
                false
            }
        }
    }

    /// Whether `packet` is of coordinator `c`'s current operation and round.
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
            packet.queue,
            wire_of_request(&packet.request),
        )
    }

    /// The network as the model keeps it: reads nobody awaits are dead and removed.
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

    /// Takes one step's effects of coordinator `c`: new rounds for its requests, the answer.
    fn absorb<A>(&mut self, c: usize, effects: Effects<A>, on_answer: impl FnOnce(&mut World, A)) {
        for out in effects.sends {
            assert_eq!(out.key.message, MessageId(1), "one message in the model");
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
                queue: queue_of(&out.key),
                request: out.request,
            });
        }
        if let Some(answer) = effects.answer {
            self.running[c] = Running::Idle;
            on_answer(self, answer);
        }
    }

    /// Whether the read repair `out` of coordinator `c` differs from what its replica replied
    /// only in fields the model leaves out (two tombstones of one generation with different
    /// reasons or times): the model, which sees them equal, sends none, so the world drops it.
    fn repairs_only_unmodelled_fields(&self, c: usize, out: &Outgoing) -> bool {
        let Request::Write { write, .. } = &out.request else {
            return false;
        };
        let Write::Merge(merged) = write.as_ref() else {
            return false;
        };
        match &self.replied[c][usize::from(out.to.0)] {
            Some((op, reply)) if *op == self.ops[c] => {
                project(reply.as_ref()) == project(Some(merged))
            }
            _ => panic!("coordinator {c} repairs a replica whose reply it did not take"),
        }
    }

    fn begin(&mut self, c: usize) {
        self.ops[c] += 1;
        self.rounds[c] = 0;
    }

    fn start_send(&mut self, c: usize) {
        self.begin(c);
        let (op, effects) = SendOp::start(
            key(Queue::Source),
            replicas(),
            Record::sent(birth(Queue::Source)),
        );
        self.running[c] = Running::Send(op);
        self.absorb(c, effects, |_, _: SendAnswer| {});
    }

    /// A receive of `queue` through coordinator `c`; `own_serves`: the driver's part of the
    /// fast path's guard, that replica `c` is up and not rebuilding (the model's, read from its
    /// state, since a crash here only makes the world's replica unreachable).
    fn start_receive(&mut self, c: usize, queue: Queue, own_serves: bool) {
        let settings = ReceiveSettings {
            me: NodeId(c as u16),
            now: Millis(0),
            visibility_timeout_ms: 0,
            // Only the source has a redrive policy (spec#7).
            max_receive_count: self.max_receive_count.filter(|_| queue == Queue::Source),
            nonce: 0,
            purged_through: None,
            // Part 1's model has no retention (section 3 has its own).
            retention_ms: u64::MAX,
        };
        self.begin(c);
        // The crate's guard alone decides whether the fast path applies; `compare` checks that
        // the model's decided the same. A replica holding nothing has no record to claim from.
        let local = self.stores[c][queue.index()].clone();
        let fast = local
            .filter(|_| self.fast && own_serves)
            .and_then(|local| ReceiveOp::start_fast(key(queue), replicas(), settings, &local));
        let Some((mut op, effects)) = fast else {
            let (op, effects) = ReceiveOp::start(key(queue), replicas(), settings);
            self.running[c] = Running::Receive(op);
            self.absorb(c, effects, World::on_receive_answer(c, queue));
            return;
        };
        // The model has no purge: the watermark read finds none, and a fast claim is delivered
        // at its two acks.
        let watermark = op.on_watermark(None);
        assert!(
            watermark.sends.is_empty() && watermark.answer.is_none(),
            "the watermark alone decides nothing before the claim's acks"
        );
        self.running[c] = Running::Receive(op);
        self.absorb(c, effects, World::on_receive_answer(c, queue));
    }

    fn start_handle(&mut self, c: usize, action: HandleAction) {
        let (queue, handle) = self.handles[c].expect("enabled only with a handle");
        self.begin(c);
        let (op, effects) = HandleOp::start(key(queue), replicas(), handle, action, Millis(0));
        self.running[c] = Running::Handle(op);
        self.absorb(c, effects, World::on_handle_answer(c));
    }

    /// The move of `record` (the source's merged record a receive or a dead-letter-now read)
    /// to the dead-letter queue, as the node's driver runs it after either answer.
    fn start_move(&mut self, c: usize, record: &Record) {
        self.begin(c);
        let (op, effects) = MoveOp::start(
            (key(Queue::Source), replicas()),
            (key(Queue::DeadLetter), replicas()),
            record,
            source_queue(),
            Millis(0),
        );
        self.running[c] = Running::Move(op);
        self.absorb(c, effects, |_, _| {});
    }

    fn start_redrive(&mut self, c: usize) {
        self.begin(c);
        let (op, effects) = RedriveOp::start(
            (key(Queue::DeadLetter), replicas()),
            Some((key(Queue::Source), replicas())),
            Millis(0),
            None,
        );
        self.running[c] = Running::Redrive(op);
        self.absorb(c, effects, |_, _| {});
    }

    /// A collection of `queue`'s tombstone through coordinator `c`: the read of all three.
    fn start_collect(&mut self, c: usize, queue: Queue) {
        self.begin(c);
        let (op, effects) = CollectOp::start(key(queue), replicas(), Millis(0));
        self.running[c] = Running::Collect(op);
        self.absorb(c, effects, World::on_collect_answer(c, queue));
    }

    fn on_collect_answer(c: usize, queue: Queue) -> impl FnOnce(&mut World, CollectAnswer) {
        move |world, answer| {
            if let CollectAnswer::Confirmed { generation, .. } = answer {
                world.running[c] = Running::CollectWait {
                    queue,
                    generation,
                    era: world.era,
                };
            }
        }
    }

    /// The horizon passed since coordinator `c` confirmed its tombstone: the drops, unawaited.
    fn collect_drop(&mut self, c: usize) {
        let Running::CollectWait {
            queue,
            generation,
            era,
        } = self.running[c]
        else {
            panic!("a drop is enabled only while a collection waits");
        };
        assert!(self.era > era, "the horizon passed since the confirmation");
        self.begin(c);
        self.running[c] = Running::Idle;
        let effects: Effects<()> = Effects {
            sends: drop_requests(key(queue), replicas(), generation),
            answer: None,
        };
        self.absorb(c, effects, |_, _| {});
    }

    /// The clock jumps past the tombstone horizon: every request in flight is older than the
    /// horizon and refused by its replica (spec/replication.md, *Horizon rule*), and every
    /// operation but a waiting collection reaches its deadline.
    fn pass_horizon(&mut self) {
        self.era += 1;
        self.network.clear();
        for c in 0..COORDINATORS {
            if self.busy(c) && !matches!(self.running[c], Running::CollectWait { .. }) {
                self.abandon(c);
                assert!(!self.busy(c), "coordinator {c} answers at its deadline");
            }
        }
    }

    fn on_receive_answer(c: usize, queue: Queue) -> impl FnOnce(&mut World, ReceiveAnswer) {
        move |world, answer| match answer {
            ReceiveAnswer::Delivered(record) => {
                let claim = record.claim().expect("a delivery holds its claim");
                let live = record.live().expect("a delivery is live");
                world.handles[c] = Some((
                    queue,
                    Handle {
                        generation: record.generation,
                        claim,
                    },
                ));
                world.deliveries.push((
                    u8::try_from(record.generation.0).expect("small"),
                    project_claim(claim),
                    u8::try_from(live.receive_count).expect("small"),
                ));
            }
            ReceiveAnswer::DeadLetter(record) => world.start_move(c, &record),
            _ => {}
        }
    }

    fn on_handle_answer(c: usize) -> impl FnOnce(&mut World, HandleAnswer) {
        move |world, answer| {
            if let HandleAnswer::DeadLetterNow(DeadLetterNowAnswer::Current(record)) = answer {
                world.start_move(c, &record);
            }
        }
    }

    fn abandon(&mut self, c: usize) {
        match &mut self.running[c] {
            Running::Send(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Receive(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Handle(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Move(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Redrive(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Collect(op) => {
                let effects = op.on_timeout();
                self.absorb(c, effects, |_, _| {});
            }
            Running::Idle | Running::CollectWait { .. } => {
                panic!("only an operation under way times out")
            }
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
        let (r, q) = (packet.replica, packet.queue.index());
        let reply = match &packet.request {
            Request::Read => Some(Reply::Record(self.stores[r][q].clone())),
            Request::Write { write, ack } => {
                let verdict =
                    planted_verdict(self.plant, self.stores[r][q].as_ref(), write.as_ref());
                let acked = verdict.acks();
                let refused = verdict == Verdict::Refused;
                match verdict {
                    Verdict::Store(record) => self.stores[r][q] = record,
                    Verdict::Unchanged | Verdict::Refused => {}
                    Verdict::Diverged(divergence) => panic!("no writer diverges: {divergence}"),
                }
                // As in the model, a delete hears its conditional tombstone refused (in part 1
                // only a delete's handle operation writes one), a claim without the read its
                // claim refused (spec §13: it falls back on it), and every other refusal is
                // silent; nobody waits for a repair's ack.
                let delete_refused = refused
                    && matches!(write.as_ref(), Write::Tombstone { .. })
                    && packet
                        .from
                        .is_some_and(|c| matches!(self.running[c], Running::Handle(_)));
                let fast_refused = refused
                    && matches!(write.as_ref(), Write::Claim { .. })
                    && packet.from.is_some_and(|c| self.fast_claim_unacked(c))
                    && self.plant != Some(Plant::SilentFastRefusal);
                if delete_refused || fast_refused {
                    Some(Reply::Refused)
                } else {
                    (acked && *ack).then_some(Reply::Ack)
                }
            }
        };
        let (Some(reply), Some(c)) = (reply, packet.from) else {
            return;
        };
        // The driver routes a reply to the operation that sent the request; the operation
        // itself ignores rounds it has left.
        if !self.busy(c) || packet.op != self.ops[c] {
            return;
        }
        if let Reply::Record(record) = &reply {
            self.replied[c][r] = Some((packet.op, record.clone()));
        }
        let (from, round) = (NodeId(r as u16), packet.round);
        match &mut self.running[c] {
            Running::Send(op) => {
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, |_, _| {});
            }
            Running::Receive(op) => {
                let queue = packet.queue;
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, World::on_receive_answer(c, queue));
            }
            Running::Handle(op) => {
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, World::on_handle_answer(c));
            }
            Running::Move(op) => {
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, |_, _| {});
            }
            Running::Redrive(op) => {
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, |_, _| {});
            }
            Running::Collect(op) => {
                let queue = packet.queue;
                let effects = op.on_reply(from, round, &reply);
                self.absorb(c, effects, World::on_collect_answer(c, queue));
            }
            Running::Idle | Running::CollectWait { .. } => {
                unreachable!("no request of a waiting collection is awaited")
            }
        }
    }

    /// One anti-entropy round between replicas `a` and `b`, as the node's driver runs it with
    /// the crate's `anti_entropy`: per-partition digests, the partitions that differ, the
    /// records each side lacks something of, each merged in by `replica::accept`.
    fn anti_entropy(&mut self, a: usize, b: usize) {
        let held = |r: usize| -> BTreeMap<RecordKey, Record> {
            [Queue::Source, Queue::DeadLetter]
                .into_iter()
                .filter_map(|queue| {
                    self.stores[r][queue.index()]
                        .clone()
                        .map(|record| (key(queue), record))
                })
                .collect()
        };
        let Some(reconciled) = exchange(&held(a), &held(b)) else {
            return;
        };
        for (to, records) in [(b, reconciled.to_peer), (a, reconciled.to_me)] {
            for (key, record) in records {
                let q = queue_of(&key).index();
                if let Verdict::Store(merged) =
                    accept(self.stores[to][q].as_ref(), &Write::Merge(record))
                {
                    self.stores[to][q] = merged;
                }
            }
        }
    }
}

// ----- comparison -------------------------------------------------------------------------------

fn model_phase_busy(op: &Op) -> bool {
    !matches!(op, Op::Idle)
}

fn compare(state: &State, world: &World, trace: &[Action]) {
    for r in 0..REPLICAS {
        for queue in [Queue::Source, Queue::DeadLetter] {
            assert_eq!(
                project(world.stores[r][queue.index()].as_ref()),
                state.replicas[r].store[queue.index()],
                "replica {r}'s {queue:?} record differs after {trace:?}"
            );
        }
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
            model_phase_busy(&state.coordinators[c].op),
            "coordinator {c} phase differs after {trace:?}"
        );
        let handle = world.handles[c].map(|(queue, handle)| model::Handle {
            queue,
            generation: u8::try_from(handle.generation.0).expect("small"),
            claim: project_claim(handle.claim),
        });
        assert_eq!(
            handle, state.coordinators[c].handle,
            "coordinator {c} handle differs after {trace:?}"
        );
    }
    let mut deliveries = world.deliveries.clone();
    deliveries.sort();
    let mut expected: Vec<_> = state
        .ghost
        .deliveries
        .iter()
        .map(|d| (d.generation, d.claim, d.receive_count))
        .collect();
    expected.sort();
    assert_eq!(deliveries, expected, "deliveries differ after {trace:?}");
}

/// Applies `action` (enabled in `state`) to the world.
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
        // Replicas are durable: a crash only makes a replica unreachable, which the model's
        // enabled deliveries already reflect.
        Action::Crash(_) | Action::Restart(_) => {}
        Action::Abandon(c) => world.abandon(c as usize),
        Action::Send => world.start_send(0),
        Action::Claim { coordinator, queue } => {
            let own = &state.replicas[coordinator as usize];
            world.start_receive(coordinator as usize, queue, own.up && own.rebuilding == 0);
        }
        Action::Delete(c) => world.start_handle(c as usize, HandleAction::Delete),
        Action::DeadLetterNow(c) => world.start_handle(
            c as usize,
            HandleAction::DeadLetterNow {
                purged_through: None,
            },
        ),
        // The model's sender redrives (coordinator 0), its other coordinator collects.
        Action::Redrive => world.start_redrive(0),
        Action::Collect(queue) => world.start_collect(1, queue),
        Action::CollectDrop => world.collect_drop(1),
        Action::Horizon => world.pass_horizon(),
        Action::AntiEntropy { a, b } => world.anti_entropy(a as usize, b as usize),
        other => panic!("conformance runs do not enable {other:?}"),
    }
    world.normalize();
}

impl walks::World<ReplicationModel> for World {
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

/// One random walk (`walks::walk`), with `plant` in the world.
fn walk_with(config: &Config, seed: u64, plant: Option<Plant>) -> (Vec<Action>, State) {
    let model = ReplicationModel::new(config.clone());
    walks::walk(
        &model,
        seed,
        |action| matches!(action, Action::Heal { .. }),
        |state| World {
            plant,
            ..World::from_model(config, state)
        },
    )
}

/// What some walk of a run must have done, so the comparison covered what the run is for.
#[derive(Clone, Copy, Debug)]
enum Goal {
    /// The model's scenario.
    Reached(Scenario),
    /// A collection dropped a confirmed tombstone.
    Dropped,
}

impl Goal {
    fn met(self, trace: &[Action], last: &State) -> bool {
        match self {
            Goal::Reached(scenario) => last.ghost.reached(scenario),
            Goal::Dropped => trace.contains(&Action::CollectDrop),
        }
    }
}

/// Runs `sequences` walks of `config` and checks that some walk met each of `must_reach`.
fn run(config: Config, sequences: u64, must_reach: &[Goal]) {
    walks::run(
        &format!("conformance {:?}", config.name),
        sequences,
        "cargo test -p trireme-replication --test it conformance::",
        |seed| walk(&config, seed),
        must_reach,
        |goal, trace, last| goal.met(trace, last),
    );
}

const SEQUENCES: u64 = 600;

#[test]
fn receive_race_conforms() {
    run(
        Config {
            start: Start::Sent,
            claims_max: 3,
            deletes_max: 2,
            anti_entropy_max: 2,
            ..Config::quiet("receive race")
        },
        SEQUENCES,
        &[],
    );
}

#[test]
fn faults_conform() {
    run(
        Config {
            start: Start::Sent,
            claims_max: 2,
            deletes_max: 2,
            anti_entropy_max: 1,
            faults_max: 3,
            ..Config::quiet("faults")
        },
        SEQUENCES,
        &[Goal::Reached(Scenario::OrphanClaim)],
    );
}

#[test]
fn send_conforms() {
    run(
        Config {
            start: Start::Empty,
            claims_max: 2,
            deletes_max: 1,
            anti_entropy_max: 1,
            faults_max: 2,
            ..Config::quiet("send")
        },
        SEQUENCES,
        &[],
    );
}

#[test]
fn received_start_conforms() {
    run(
        Config {
            start: Start::Received,
            claims_max: 2,
            deletes_max: 2,
            anti_entropy_max: 2,
            faults_max: 1,
            ..Config::quiet("received")
        },
        SEQUENCES,
        &[Goal::Reached(Scenario::RepairAfterAckedDelete)],
    );
}

#[test]
fn dead_letter_move_conforms() {
    run(
        Config {
            start: Start::Received,
            dead_letter: true,
            max_receive_count: 1,
            claims_max: 3,
            anti_entropy_max: 1,
            faults_max: 2,
            ..Config::quiet("dead-letter move")
        },
        SEQUENCES,
        &[Goal::Reached(Scenario::Moved)],
    );
}

#[test]
fn dead_letter_queue_receive_delete_conforms() {
    run(
        Config {
            start: Start::Moved,
            dead_letter: true,
            dead_letter_claims: true,
            max_receive_count: 1,
            claims_max: 3,
            deletes_max: 2,
            anti_entropy_max: 1,
            faults_max: 1,
            ..Config::quiet("dead-letter queue receive/delete")
        },
        SEQUENCES,
        &[Goal::Reached(Scenario::DeletedInDeadLetter)],
    );
}

#[test]
fn redrive_conforms() {
    run(
        Config {
            start: Start::DeadLetterReceived,
            dead_letter: true,
            dead_letter_claims: true,
            max_receive_count: 1,
            claims_max: 2,
            deletes_max: 1,
            redrives_max: 2,
            anti_entropy_max: 1,
            faults_max: 1,
            ..Config::quiet("redrive")
        },
        SEQUENCES,
        &[
            Goal::Reached(Scenario::Redriven),
            Goal::Reached(Scenario::RedrivenAfterReceive),
        ],
    );
}

#[test]
fn move_racing_redrive_conforms() {
    run(
        Config {
            start: Start::Received,
            dead_letter: true,
            max_receive_count: 1,
            claims_max: 2,
            redrives_max: 2,
            anti_entropy_max: 1,
            faults_max: 1,
            ..Config::quiet("move races redrive")
        },
        SEQUENCES,
        &[
            Goal::Reached(Scenario::Moved),
            Goal::Reached(Scenario::Redriven),
            Goal::Reached(Scenario::LateTombstoneOfEarlierLife),
        ],
    );
}

#[test]
fn dead_letter_now_conforms() {
    run(
        Config {
            start: Start::Received,
            dead_letter: true,
            dead_letter_claims: true,
            max_receive_count: 2,
            claims_max: 2,
            deletes_max: 1,
            dead_letter_nows_max: 2,
            anti_entropy_max: 1,
            faults_max: 2,
            ..Config::quiet("dead-letter now")
        },
        SEQUENCES,
        &[
            Goal::Reached(Scenario::MovedNow),
            Goal::Reached(Scenario::NowRefused),
        ],
    );
}

#[test]
fn collection_conforms() {
    // Without the dead-letter queue: a move's tombstone and a delete's of one generation differ
    // in their reason until merged, and the crate then waits for the merge before it collects,
    // where the model, which does not record reasons, collects at once.
    run(
        Config {
            start: Start::Deleted,
            claims_max: 1,
            deletes_max: 1,
            anti_entropy_max: 2,
            faults_max: 2,
            collects_max: 2,
            horizons_max: 2,
            ..Config::quiet("collection")
        },
        SEQUENCES,
        &[Goal::Dropped],
    );
}

#[test]
fn collection_after_a_receive_conforms() {
    run(
        Config {
            start: Start::Received,
            claims_max: 1,
            deletes_max: 2,
            anti_entropy_max: 3,
            faults_max: 1,
            collects_max: 2,
            horizons_max: 2,
            ..Config::quiet("delete, then collection")
        },
        SEQUENCES,
        &[Goal::Dropped],
    );
}

/// After the move: redrives bring the message back past the source's old tombstone while
/// collections drop tombstones in both queues (no receives, so every tombstone of a generation
/// has one reason, as `collection_conforms` explains).
fn collection_with_redrive() -> Config {
    Config {
        start: Start::Moved,
        dead_letter: true,
        max_receive_count: 1,
        claims_max: 0,
        redrives_max: 2,
        collects_max: 2,
        horizons_max: 2,
        anti_entropy_max: 1,
        faults_max: 1,
        ..Config::quiet("collection with redrive")
    }
}

#[test]
fn collection_with_redrive_conforms() {
    run(
        collection_with_redrive(),
        SEQUENCES,
        &[Goal::Dropped, Goal::Reached(Scenario::Redriven)],
    );
}

// ----- the claim without the read (spec/replication.md §13) ------------------------------------

const FAST_DELIVERED: Goal = Goal::Reached(Scenario::ClaimWithoutReadDelivered);
const FAST_FELL_BACK: Goal = Goal::Reached(Scenario::ClaimWithoutReadFellBack);
/// The crate's claim without the read reaching its own replica after another's ack, as the
/// model's does (spec §13, *Own replica last*).
const OWN_LAST: Goal = Goal::Reached(Scenario::ClaimWithoutReadOwnLast);
/// A fast claim refused by one replica after another acked it goes on and is delivered, in
/// both (spec §13, *A refusal after an ack*).
const FAST_REFUSED_AFTER_ACK: Goal =
    Goal::Reached(Scenario::ClaimWithoutReadRefusedAfterAckDelivered);

/// The receive race with every receive trying the claim without the read first: two
/// coordinators' fast claims racing each other and the deletes.
#[test]
fn receive_race_without_the_read_conforms() {
    run(
        Config {
            start: Start::Sent,
            claims_max: 3,
            deletes_max: 2,
            anti_entropy_max: 2,
            claim_without_read: true,
            ..Config::quiet("receive race, without the read")
        },
        SEQUENCES,
        &[
            FAST_DELIVERED,
            FAST_FELL_BACK,
            OWN_LAST,
            FAST_REFUSED_AFTER_ACK,
        ],
    );
}

/// Faults with the claim without the read: a crashed own replica sends the receive down the
/// read path, a lost or duplicated fast claim leaves an orphan.
#[test]
fn faults_without_the_read_conform() {
    run(
        Config {
            start: Start::Sent,
            claims_max: 2,
            deletes_max: 2,
            anti_entropy_max: 1,
            faults_max: 3,
            claim_without_read: true,
            ..Config::quiet("faults, without the read")
        },
        SEQUENCES,
        &[
            FAST_DELIVERED,
            FAST_FELL_BACK,
            OWN_LAST,
            Goal::Reached(Scenario::OrphanClaim),
        ],
    );
}

/// spec §13's delete race: a fast claim from the coordinator's copy of the delivered claim
/// while its holder deletes.
#[test]
fn delete_race_without_the_read_conforms() {
    run(
        Config {
            start: Start::Received,
            claims_max: 2,
            deletes_max: 2,
            anti_entropy_max: 2,
            faults_max: 1,
            claim_without_read: true,
            ..Config::quiet("delete race, without the read")
        },
        SEQUENCES,
        &[
            FAST_DELIVERED,
            FAST_FELL_BACK,
            OWN_LAST,
            FAST_REFUSED_AFTER_ACK,
            Goal::Reached(Scenario::RepairAfterAckedDelete),
        ],
    );
}

/// The count checks: with `maxReceiveCount` 1 from the sent start, a coordinator whose own
/// replica shows the count at the maximum takes the read path (the crate's guard and the
/// model's local check), every claim carries the maximum to the replicas' (d), and the read
/// path moves the message.
#[test]
fn count_without_the_read_conforms() {
    run(
        Config {
            start: Start::Sent,
            dead_letter: true,
            max_receive_count: 1,
            claims_max: 3,
            anti_entropy_max: 1,
            faults_max: 2,
            claim_without_read: true,
            ..Config::quiet("count, without the read")
        },
        SEQUENCES,
        &[
            FAST_DELIVERED,
            FAST_FELL_BACK,
            Goal::Reached(Scenario::Moved),
        ],
    );
}

/// Receives and deletes in the dead-letter queue with the claim without the read, which has
/// no redrive policy of its own, so no count check.
#[test]
fn dead_letter_queue_without_the_read_conforms() {
    run(
        Config {
            start: Start::Moved,
            dead_letter: true,
            dead_letter_claims: true,
            max_receive_count: 1,
            claims_max: 3,
            deletes_max: 2,
            anti_entropy_max: 1,
            faults_max: 1,
            claim_without_read: true,
            ..Config::quiet("dead-letter queue, without the read")
        },
        SEQUENCES,
        &[
            FAST_DELIVERED,
            FAST_FELL_BACK,
            Goal::Reached(Scenario::DeletedInDeadLetter),
        ],
    );
}

/// A rule of the crate switched off in the world, to show the comparison catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plant {
    /// Replicas accept a claim whose `seq` equals the one they hold (the heart of S5).
    ClaimOfEqualSeq,
    /// Replicas accept every conditional tombstone, whatever claim they hold.
    UnconditionalTombstone,
    /// A replica holding a later life of the message lets a tombstone of an earlier one
    /// replace it (a move's tombstone arriving after the redrive brought the message back).
    TombstoneOverLaterLife,
    /// A collection's drop removes whatever the replica holds, also a later life.
    UnconditionalDrop,
    /// The world's network keeps a refusal of a claim without the read from its coordinator,
    /// which then never falls back (spec §13's fallback left out of the world).
    SilentFastRefusal,
}

fn planted_verdict(plant: Option<Plant>, held: Option<&Record>, write: &Write) -> Verdict {
    let verdict = accept(held, write);
    if let (
        Some(Plant::TombstoneOverLaterLife),
        Write::Tombstone {
            generation,
            tombstone,
            ..
        },
    ) = (plant, write)
        && held.is_some_and(|held| held.generation > *generation)
    {
        return Verdict::Store(Some(Record {
            generation: *generation,
            body: Body::Tombstone(*tombstone),
        }));
    }
    if let (Some(Plant::UnconditionalDrop), Write::Drop { .. }) = (plant, write) {
        return Verdict::Store(None);
    }
    if verdict != Verdict::Refused {
        return verdict;
    }
    let forced = match (plant, write) {
        (Some(Plant::ClaimOfEqualSeq), Write::Claim { record, .. }) => {
            held.and_then(Record::claim).map(|c| c.seq) == record.claim().map(|c| c.seq)
                && !held.is_some_and(Record::is_tombstone)
        }
        (Some(Plant::UnconditionalTombstone), Write::Tombstone { .. }) => true,
        _ => false,
    };
    if !forced {
        return verdict;
    }
    let incoming = match write {
        Write::Tombstone {
            generation,
            tombstone,
            ..
        } => Record {
            generation: *generation,
            body: Body::Tombstone(*tombstone),
        },
        Write::Claim { record, .. } => record.clone(),
        _ => unreachable!("only claims and tombstones are forced"),
    };
    let mut merged = incoming.clone();
    if let Some(held) = held
        && let Ok(joined) = held.merge(&incoming)
    {
        merged = joined;
    }
    if let (Some(Plant::ClaimOfEqualSeq), Body::Live(live)) = (plant, &mut merged.body) {
        // Overwrite instead of merging, as a replica that takes the rival claim would.
        live.held = incoming.live().and_then(|l| l.held);
    }
    Verdict::Store(Some(merged))
}

fn caught(config: &Config, plant: Plant) -> Option<u64> {
    walks::first_failing(SEQUENCES, |seed| walk_with(config, seed, Some(plant)))
}

#[test]
fn a_replica_accepting_a_claim_of_an_equal_seq_is_caught() {
    let config = Config {
        start: Start::Sent,
        claims_max: 3,
        deletes_max: 1,
        anti_entropy_max: 1,
        ..Config::quiet("planted: claim of an equal seq")
    };
    let seed = caught(&config, Plant::ClaimOfEqualSeq);
    eprintln!("planted claim of an equal seq caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}

#[test]
fn a_replica_accepting_every_tombstone_is_caught() {
    let config = Config {
        start: Start::Received,
        claims_max: 2,
        deletes_max: 2,
        anti_entropy_max: 1,
        ..Config::quiet("planted: unconditional tombstone")
    };
    let seed = caught(&config, Plant::UnconditionalTombstone);
    eprintln!("planted unconditional tombstone caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}

#[test]
fn a_tombstone_replacing_a_later_life_is_caught() {
    let config = Config {
        start: Start::Received,
        dead_letter: true,
        max_receive_count: 1,
        claims_max: 2,
        redrives_max: 2,
        anti_entropy_max: 1,
        ..Config::quiet("planted: tombstone over a later life")
    };
    let seed = caught(&config, Plant::TombstoneOverLaterLife);
    eprintln!("planted tombstone over a later life caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}

#[test]
fn a_drop_of_a_later_life_is_caught() {
    let seed = caught(&collection_with_redrive(), Plant::UnconditionalDrop);
    eprintln!("planted unconditional drop caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}

#[test]
fn a_fast_claim_that_never_falls_back_is_caught() {
    let config = Config {
        start: Start::Sent,
        claims_max: 3,
        deletes_max: 1,
        anti_entropy_max: 1,
        claim_without_read: true,
        ..Config::quiet("planted: silent refusal of a fast claim")
    };
    let seed = caught(&config, Plant::SilentFastRefusal);
    eprintln!("planted silent refusal of a fast claim caught at seed {seed:?}");
    assert!(seed.is_some(), "the comparison sees the planted rule");
}
