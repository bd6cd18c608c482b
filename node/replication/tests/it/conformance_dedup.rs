//! Conformance of sends with deduplication ids: this crate and the model of
//! spec/replication.md section 4 (`trireme_spec::replication::dedup`) stepped through the same
//! random operations, their full states compared after every step: every replica's two message
//! records and its deduplication record, every request in flight, each sender's phase, and what
//! was answered, delivered and deleted.
//!
//! The model drives: two senders of one deduplication id, the consumer's receive and delete,
//! deliveries, drops, duplicates, crashes, timeouts, the home's timeout, anti-entropy and the
//! window's end on each replica, applied to the model and to a world of `dedup::DedupSendOp`,
//! `dedup::accept`, `replica::accept` and the node's late-copy rule. The model's reductions are
//! mapped, not mirrored:
//!
//! - *One settle request carries the confirm and the void* in the model, each acked on its own;
//!   the crate sends them as two writes to the same three replicas. The world keeps them together
//!   as one request in flight per replica, delivered, lost or duplicated together.
//! - *A sender's read of the deduplication record is one step on two replicas*: the crate's reads
//!   wait beside the network until the model's `ReadDedup` names the two that answer; the third
//!   is never answered.
//! - *A refusal is silent* (a late copy, a confirm with no body, a put after the window): the
//!   crate's early answers on refusals are its unit tests' business, as in `conformance`.
//! - *Time*: every send is at [`SENT_AT`]; a replica's clock stays there until the model's
//!   `WindowEnd` moves it to the window's end, after which the replica reads its record as
//!   expired, refuses the window's puts and late copies, and drops its held and void copies.

use std::collections::{BTreeMap, BTreeSet};

use trireme_core::{DedupId, Incarnation, MessageId, Millis, QueueName};
use trireme_replication::anti_entropy::reconcile_dedups;
use trireme_replication::coordinator::{Effects, Outgoing, Reply, Request};
use trireme_replication::dedup::{
    self, DedupChange, DedupKey, DedupOutgoing, DedupRecord, DedupReply, DedupRequest,
    DedupSendAnswer, DedupSendOp, DedupSendSettings, SendOutgoing,
};
use trireme_replication::placement::Ring;
use trireme_replication::record::{Birth, Record, Settle, TombstoneReason};
use trireme_replication::replica::{Verdict, Write, accept};
use trireme_replication::{Generation, NodeId, RecordKey};
use trireme_spec::replication::dedup::{
    self as model, Action, Config, DedupModel, MESSAGES, REPLICAS, Request as ModelRequest,
    SENDERS, Scenario, State,
};

use super::walks::{self, exchange};

const SEQUENCES: u64 = 600;
/// `DEDUP_WINDOW`.
const WINDOW_MS: u64 = 300_000;
/// `OP_TIMEOUT + SKEW_MAX`: never reached before a window's end here, so a put is refused for
/// its window only, as in the model.
const LATE_MS: u64 = 10_000;
/// Every send's time, by every coordinator's clock; every replica's clock until its window ends.
const SENT_AT: Millis = Millis(1_000);
const WINDOW_END: Millis = Millis(SENT_AT.0 + WINDOW_MS);
const _: () = assert!(LATE_MS < WINDOW_MS);

const DEDUP_ID: &str = "order-17";

fn queue() -> QueueName {
    QueueName::try_from("q".to_string()).expect("a valid name")
}

fn incarnation() -> Incarnation {
    Incarnation::local(Millis(1))
}

fn ring() -> Ring {
    Ring::new([NodeId(1), NodeId(2), NodeId(3)]).expect("three members")
}

fn dedup_key() -> DedupKey {
    DedupKey {
        queue: queue(),
        incarnation: incarnation(),
        id: DedupId::try_from(DEDUP_ID.to_string()).expect("a valid id"),
    }
}

/// The model's replica `r` is the deduplication record's `r`-th replica in ring order, so the
/// model's home (replica 0) is the crate's.
fn nodes() -> [NodeId; REPLICAS] {
    dedup_key().replicas(&ring())
}

fn replica_of(node: NodeId) -> usize {
    nodes()
        .iter()
        .position(|n| *n == node)
        .expect("a request goes to one of the three")
}

/// Sender `c` draws message id `c + 1` (the model's message `c`): the crate adopts the smallest
/// id it read, the model the smallest index, the same message.
fn message_id(m: usize) -> MessageId {
    MessageId(m as u128 + 1)
}

fn message_of(id: MessageId) -> usize {
    let m = usize::try_from(id.0 - 1).expect("small ids");
    assert!(m < MESSAGES, "one of the model's messages");
    m
}

fn key(m: usize) -> RecordKey {
    RecordKey {
        queue: queue(),
        incarnation: incarnation(),
        message: message_id(m),
    }
}

fn held(m: usize) -> Record {
    Record::sent_held(Birth {
        payload: format!("m{m}").into_bytes(),
        sent_at: SENT_AT,
        visible_from: SENT_AT,
        source_queue: None,
        dedup_id: Some(DEDUP_ID.to_owned()),
    })
}

fn bit(m: usize) -> u8 {
    1 << m
}

// ----- between the two vocabularies -------------------------------------------------------------

fn project(record: Option<&Record>) -> model::MessageRecord {
    let Some(record) = record else {
        return model::MessageRecord::Absent;
    };
    assert_eq!(record.generation, Generation(0), "one life");
    match record.live() {
        None => model::MessageRecord::Tombstone,
        Some(live) => match live.settle {
            Settle::Held => model::MessageRecord::Held,
            Settle::Void => model::MessageRecord::Void,
            Settle::Ready => model::MessageRecord::Ready,
        },
    }
}

/// A replica's deduplication record as the model keeps it: expired once the replica's clock
/// reached the window's end (it then reads as none and refuses every put of the window, whether
/// or not it stored one), otherwise the message it names.
fn project_dedup(record: Option<&DedupRecord>, now: Millis) -> model::DedupRecord {
    if now >= WINDOW_END {
        return model::DedupRecord::Expired;
    }
    match record {
        None => model::DedupRecord::Empty,
        Some(record) => {
            assert!(record.live_at(now), "a window still open here");
            let m = message_of(record.value.message);
            model::DedupRecord::Names(u8::try_from(m).expect("small"))
        }
    }
}

/// A request in flight as the model keeps it: `(replica, coordinator, current, request)`.
type WireKey = (u8, u8, bool, ModelRequest);

fn wire_of_model(packet: &model::Packet) -> WireKey {
    (
        packet.replica,
        packet.coordinator,
        packet.round == 1,
        packet.request,
    )
}

// ----- the world built from this crate ---------------------------------------------------------

/// What the world has in flight to one replica.
#[derive(Clone, Debug)]
enum Part {
    /// The held write of step 1.
    Write(Outgoing),
    /// A conditional put of step 3.
    Put(DedupOutgoing),
    /// Step 4 to one replica: the confirm and, for a loser, the void of its own copy (the
    /// model's one settle request).
    Settle {
        confirm: Option<Outgoing>,
        void: Option<Outgoing>,
    },
}

impl Part {
    /// The sender's phase the request belongs to: 0 the write, 1 the put, 2 the settle.
    fn phase(&self) -> u8 {
        match self {
            Part::Write(_) => 0,
            Part::Put(_) => 1,
            Part::Settle { .. } => 2,
        }
    }
}

/// What one replica answered one request in flight, with the rounds they answer: acks of message
/// writes, and the deduplication record's reply (none when refused).
type Replies = (Vec<(u32, Reply)>, Option<(u32, DedupReply)>);

#[derive(Clone, Debug)]
struct InFlight {
    replica: usize,
    from: usize,
    /// Which operation of its sender sent it.
    op: u64,
    part: Part,
}

/// A replica's durable state and its clock.
#[derive(Clone, Debug)]
struct Replica {
    records: [Option<Record>; MESSAGES],
    dedup: Option<DedupRecord>,
    now: Millis,
}

/// A rule of the crate switched off in the world (self-tests of the comparison only).
#[derive(Clone, Copy, Debug)]
enum Plant {
    /// A replica's put replaces a live deduplication record (written more than once per window).
    PutOverwrites,
    /// A held copy arriving after its window's end is stored.
    LateCopyStored,
}

#[derive(Clone, Debug)]
struct World {
    replicas: [Replica; REPLICAS],
    senders: [Option<DedupSendOp>; SENDERS],
    /// Operations started per sender (the current one's number).
    ops: [u64; SENDERS],
    /// The current operation's phase (`Part::phase`).
    phases: [u8; SENDERS],
    /// `(about the deduplication record, round, replica)` of every reply the current operation
    /// was given (a read and the held write share their round).
    fed: [BTreeSet<(bool, u32, usize)>; SENDERS],
    /// The reads of step 1 not yet answered, by replica.
    reads: [BTreeMap<usize, DedupOutgoing>; SENDERS],
    network: Vec<InFlight>,
    answered: u8,
    delivered: u8,
    consumer_deleted: u8,
    to_delete: u8,
    plant: Option<Plant>,
}

impl World {
    fn new(plant: Option<Plant>) -> World {
        let replica = Replica {
            records: [None, None],
            dedup: None,
            now: SENT_AT,
        };
        World {
            replicas: [replica.clone(), replica.clone(), replica],
            senders: [None, None],
            ops: [0; SENDERS],
            phases: [0; SENDERS],
            fed: Default::default(),
            reads: Default::default(),
            network: Vec::new(),
            answered: 0,
            delivered: 0,
            consumer_deleted: 0,
            to_delete: 0,
            plant,
        }
    }

    fn busy(&self, c: usize) -> bool {
        self.senders[c].is_some()
    }

    fn current(&self, packet: &InFlight) -> bool {
        let c = packet.from;
        self.busy(c) && packet.op == self.ops[c] && packet.part.phase() == self.phases[c]
    }

    /// Whether the sender of `packet` still waits for this replica's reply to it (for a
    /// settle, the confirm's or the void's).
    fn awaited(&self, packet: &InFlight) -> bool {
        if !self.current(packet) {
            return false;
        }
        let fed = &self.fed[packet.from];
        let waits =
            |dedup: bool, out_round: u32| !fed.contains(&(dedup, out_round, packet.replica));
        match &packet.part {
            Part::Write(out) => waits(false, out.round),
            Part::Put(out) => waits(true, out.round),
            Part::Settle { confirm, void } => {
                confirm.as_ref().is_some_and(|out| waits(false, out.round))
                    || void.as_ref().is_some_and(|out| waits(false, out.round))
            }
        }
    }

    fn key(&self, packet: &InFlight) -> WireKey {
        let request = match &packet.part {
            Part::Write(out) => {
                let Request::Write { write, .. } = &out.request else {
                    panic!("a send with a deduplication id reads no message record");
                };
                let Write::Merge(record) = write.as_ref() else {
                    panic!("step 1 merges its held copy");
                };
                ModelRequest::Write {
                    message: u8::try_from(message_of(out.key.message)).expect("small"),
                    record: project(Some(record)),
                }
            }
            Part::Put(out) => {
                let DedupRequest::Put { record, .. } = &out.request else {
                    panic!("only puts travel the network here");
                };
                ModelRequest::Put {
                    message: u8::try_from(message_of(record.value.message)).expect("small"),
                }
            }
            Part::Settle { confirm, void } => ModelRequest::Settle {
                confirm: u8::try_from(message_of(
                    confirm.as_ref().expect("every settle confirms").key.message,
                ))
                .expect("small"),
                void: void
                    .as_ref()
                    .map(|out| u8::try_from(message_of(out.key.message)).expect("small")),
            },
        };
        (
            u8::try_from(packet.replica).expect("small"),
            u8::try_from(packet.from).expect("small"),
            self.current(packet),
            request,
        )
    }

    fn keys(&self) -> Vec<WireKey> {
        let mut keys: Vec<WireKey> = self.network.iter().map(|p| self.key(p)).collect();
        keys.sort();
        keys
    }

    /// The network as the model keeps it: a request nobody awaits whose delivery would change
    /// nothing its replica holds is removed.
    fn normalize(&mut self) {
        let network = std::mem::take(&mut self.network);
        self.network = network
            .into_iter()
            .filter(|packet| self.awaited(packet) || self.changes(packet))
            .collect();
    }

    /// Whether delivering `packet` would change what its replica holds, as the model sees it.
    fn changes(&self, packet: &InFlight) -> bool {
        let mut copy = self.clone();
        copy.apply_to_replica(packet);
        let (before, after) = (
            &self.replicas[packet.replica],
            &copy.replicas[packet.replica],
        );
        (0..MESSAGES)
            .any(|m| project(before.records[m].as_ref()) != project(after.records[m].as_ref()))
            || project_dedup(before.dedup.as_ref(), before.now)
                != project_dedup(after.dedup.as_ref(), after.now)
    }

    /// A message write on replica `r` as the node's store makes it: a held or void copy after
    /// its window is refused, the rest is `replica::accept`. Whether it acks.
    fn write(&mut self, r: usize, m: usize, write: &Write) -> bool {
        let replica = &mut self.replicas[r];
        if dedup::late_copy(write, replica.now, WINDOW_MS)
            && !matches!(self.plant, Some(Plant::LateCopyStored))
        {
            return false;
        }
        let verdict = accept(replica.records[m].as_ref(), write);
        let acks = verdict.acks();
        match verdict {
            Verdict::Store(record) => replica.records[m] = record,
            Verdict::Unchanged | Verdict::Refused => {}
            Verdict::Diverged(divergence) => panic!("no writer diverges: {divergence}"),
        }
        acks
    }

    /// A deduplication request on replica `r` (`dedup::accept`); its reply.
    fn dedup_request(&mut self, r: usize, request: &DedupRequest) -> DedupReply {
        let replica = &mut self.replicas[r];
        let (change, reply) = dedup::accept(replica.dedup.as_ref(), request, replica.now, LATE_MS);
        match (change, self.plant, request) {
            (DedupChange::Store(record), _, _) => replica.dedup = Some(record),
            (DedupChange::Keep, Some(Plant::PutOverwrites), DedupRequest::Put { record, .. })
                if reply != DedupReply::Refused =>
            {
                replica.dedup = Some(*record);
                return DedupReply::Record(Some(*record));
            }
            (DedupChange::Keep, _, _) => {}
        }
        reply
    }

    /// Applies `packet` to its replica; the replies, as `(round, reply)` for message records and
    /// deduplication records.
    fn apply_to_replica(&mut self, packet: &InFlight) -> Replies {
        let r = packet.replica;
        let mut record_replies = Vec::new();
        let mut dedup_reply = None;
        let mut write_out = |world: &mut World, out: &Outgoing| {
            let Request::Write { write, .. } = &out.request else {
                panic!("no reads of message records here");
            };
            if world.write(r, message_of(out.key.message), write) {
                record_replies.push((out.round, Reply::Ack));
            }
        };
        match &packet.part {
            Part::Write(out) => write_out(self, out),
            Part::Settle { confirm, void } => {
                // The model applies the void first; the two touch different messages.
                for out in void.iter().chain(confirm) {
                    write_out(self, out);
                }
            }
            Part::Put(out) => {
                let reply = self.dedup_request(r, &out.request);
                if reply != DedupReply::Refused {
                    dedup_reply = Some((out.round, reply));
                }
            }
        }
        (record_replies, dedup_reply)
    }

    /// Takes one step's effects of sender `c`.
    fn absorb(&mut self, c: usize, effects: Effects<DedupSendAnswer, SendOutgoing>) {
        let mut settles: BTreeMap<usize, (Option<Outgoing>, Option<Outgoing>)> = BTreeMap::new();
        for out in effects.sends {
            match out {
                SendOutgoing::Record(out) => {
                    let r = replica_of(out.to);
                    let Request::Write { write, ack } = &out.request else {
                        panic!("a send with a deduplication id reads no message record");
                    };
                    assert!(*ack, "every write of a send is awaited");
                    match write.as_ref() {
                        Write::Confirm => settles.entry(r).or_default().0 = Some(out),
                        Write::Merge(record)
                            if record
                                .live()
                                .is_some_and(|live| live.settle == Settle::Void) =>
                        {
                            settles.entry(r).or_default().1 = Some(out);
                        }
                        Write::Merge(_) => {
                            self.phases[c] = 0;
                            self.network.push(InFlight {
                                replica: r,
                                from: c,
                                op: self.ops[c],
                                part: Part::Write(out),
                            });
                        }
                        other => panic!("a send writes no {other:?}"),
                    }
                }
                SendOutgoing::Dedup(out) => {
                    let r = replica_of(out.to);
                    match out.request {
                        DedupRequest::Read => {
                            self.reads[c].insert(r, out);
                        }
                        DedupRequest::Put { .. } => {
                            self.phases[c] = 1;
                            self.reads[c].clear();
                            self.network.push(InFlight {
                                replica: r,
                                from: c,
                                op: self.ops[c],
                                part: Part::Put(out),
                            });
                        }
                        DedupRequest::Learn(_) => panic!("a sender sends no anti-entropy"),
                    }
                }
            }
        }
        if !settles.is_empty() {
            self.phases[c] = 2;
            self.reads[c].clear();
            assert_eq!(settles.len(), REPLICAS, "a settle goes to all three");
            for (r, (confirm, void)) in settles {
                assert!(confirm.is_some(), "every settle confirms the winner");
                self.network.push(InFlight {
                    replica: r,
                    from: c,
                    op: self.ops[c],
                    part: Part::Settle { confirm, void },
                });
            }
        }
        if let Some(answer) = effects.answer {
            self.senders[c] = None;
            self.reads[c].clear();
            if let DedupSendAnswer::Sent { message, duplicate } = answer {
                let m = message_of(message);
                assert_eq!(duplicate, m != c, "a duplicate is another sender's message");
                self.answered |= bit(m);
            }
        }
    }

    fn start_send(&mut self, c: usize) {
        assert!(!self.busy(c), "one send per sender at a time");
        self.ops[c] += 1;
        self.phases[c] = 0;
        self.fed[c].clear();
        let (op, effects) = DedupSendOp::start(
            key(c),
            held(c),
            dedup_key(),
            DedupSendSettings {
                now: SENT_AT,
                window_ms: WINDOW_MS,
                ring: ring(),
            },
        );
        assert_eq!(op.message(), message_id(c));
        self.senders[c] = Some(op);
        self.absorb(c, effects);
    }

    fn with_sender(
        &mut self,
        c: usize,
        step: impl FnOnce(&mut DedupSendOp) -> Effects<DedupSendAnswer, SendOutgoing>,
    ) {
        let op = self.senders[c].as_mut().expect("the sender is under way");
        let effects = step(op);
        self.absorb(c, effects);
    }

    /// Sender `c`'s read of the deduplication record, answered by replicas `a` and `b` in one
    /// step; the third read is never answered.
    fn read_dedup(&mut self, c: usize, a: usize, b: usize) {
        let mut reads = std::mem::take(&mut self.reads[c]);
        for r in [a, b] {
            let out = reads.remove(&r).expect("the sender read every replica");
            let reply = self.dedup_request(r, &out.request);
            let node = nodes()[r];
            if self.senders[c].is_some() {
                self.fed[c].insert((true, out.round, r));
                self.with_sender(c, |op| op.on_dedup_reply(node, out.round, &reply));
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
        let (record_replies, dedup_reply) = self.apply_to_replica(&packet);
        let c = packet.from;
        // The driver routes a reply to the operation that sent the request; the operation
        // itself ignores rounds it has left.
        if !self.busy(c) || packet.op != self.ops[c] {
            return;
        }
        let node = nodes()[packet.replica];
        // The confirm's reply first: the model's ack is the confirm's.
        for (round, reply) in record_replies.into_iter().rev() {
            if self.senders[c].is_none() {
                return;
            }
            self.fed[c].insert((false, round, packet.replica));
            self.with_sender(c, |op| op.on_record_reply(node, round, &reply));
        }
        if let Some((round, reply)) = dedup_reply
            && self.senders[c].is_some()
        {
            self.fed[c].insert((true, round, packet.replica));
            self.with_sender(c, |op| op.on_dedup_reply(node, round, &reply));
        }
    }

    /// The consumer's receive through replicas `a` and `b`: every message whose merged record is
    /// ready is delivered (held and void copies are never received).
    fn receive(&mut self, a: usize, b: usize) {
        for m in 0..MESSAGES {
            let merged = match (&self.replicas[a].records[m], &self.replicas[b].records[m]) {
                (Some(x), Some(y)) => Some(x.merge(y).expect("no writer diverges")),
                (x, y) => x.clone().or_else(|| y.clone()),
            };
            if merged.as_ref().is_some_and(Record::ready) {
                self.delivered |= bit(m);
                self.to_delete |= bit(m);
            }
        }
    }

    /// The consumer deletes `m` on replicas `a` and `b`.
    fn delete(&mut self, m: usize, a: usize, b: usize) {
        let tombstone = Record::tombstone(Generation(0), TombstoneReason::Deleted, SENT_AT);
        for r in [a, b] {
            self.write(r, m, &Write::Merge(tombstone.clone()));
        }
        self.consumer_deleted |= bit(m);
        self.to_delete &= !bit(m);
    }

    /// One anti-entropy round between replicas `a` and `b` as the node's driver runs it: the
    /// crate's digests and reconcile for message records, each merged in through the store's
    /// rules, and `reconcile_dedups` of the records live by each end's clock, learned by the
    /// other.
    fn anti_entropy(&mut self, a: usize, b: usize) {
        let records = |world: &World, r: usize| -> BTreeMap<RecordKey, Record> {
            (0..MESSAGES)
                .filter_map(|m| {
                    world.replicas[r].records[m]
                        .clone()
                        .map(|record| (key(m), record))
                })
                .collect()
        };
        if let Some(reconciled) = exchange(&records(self, a), &records(self, b)) {
            for (to, sent) in [(b, reconciled.to_peer), (a, reconciled.to_me)] {
                for (key, record) in sent {
                    self.write(to, message_of(key.message), &Write::Merge(record));
                }
            }
        }
        let dedups = |world: &World, r: usize| -> BTreeMap<DedupKey, DedupRecord> {
            let replica = &world.replicas[r];
            replica
                .dedup
                .filter(|record| record.live_at(replica.now))
                .map(|record| (dedup_key(), record))
                .into_iter()
                .collect()
        };
        let reconciled = reconcile_dedups(&dedups(self, a), &dedups(self, b));
        for (to, sent) in [(b, reconciled.to_peer), (a, reconciled.to_me)] {
            for (_, record) in sent {
                assert_eq!(
                    self.dedup_request(to, &DedupRequest::Learn(record)),
                    DedupReply::Ack
                );
            }
        }
    }

    /// The window ends on replica `r`'s clock: it drops its held and void copies (the collection
    /// walk's pass, `copy_window_ended`).
    fn end_window(&mut self, r: usize) {
        let replica = &mut self.replicas[r];
        replica.now = WINDOW_END;
        for record in &mut replica.records {
            if record
                .as_ref()
                .is_some_and(|held| dedup::copy_window_ended(held, WINDOW_END, WINDOW_MS))
            {
                *record = None;
            }
        }
    }
}

// ----- comparison -------------------------------------------------------------------------------

fn compare(state: &State, world: &World, trace: &[Action]) {
    for r in 0..REPLICAS {
        let replica = &world.replicas[r];
        for m in 0..MESSAGES {
            assert_eq!(
                project(replica.records[m].as_ref()),
                state.replicas[r].messages[m],
                "replica {r}'s record of message {m} differs after {trace:?}"
            );
        }
        assert_eq!(
            project_dedup(replica.dedup.as_ref(), replica.now),
            state.replicas[r].dedup,
            "replica {r}'s deduplication record differs after {trace:?}"
        );
    }
    let mut model_keys: Vec<WireKey> = state.network.iter().map(wire_of_model).collect();
    model_keys.sort();
    assert_eq!(world.keys(), model_keys, "network differs after {trace:?}");
    for c in 0..SENDERS {
        assert_eq!(
            world.busy(c),
            !state.idle(c),
            "sender {c}'s phase differs after {trace:?}"
        );
        assert_eq!(
            !world.reads[c].is_empty(),
            state.reading(c),
            "sender {c}'s read differs after {trace:?}"
        );
        let waiting = world.senders[c]
            .as_ref()
            .is_some_and(DedupSendOp::waiting_for_home);
        assert_eq!(
            waiting,
            state.waiting_for_home(c),
            "sender {c}'s wait for the home differs after {trace:?}"
        );
    }
    let ghost = &state.ghost;
    assert_eq!(
        world.answered, ghost.answered,
        "answers differ after {trace:?}"
    );
    assert_eq!(
        world.delivered, ghost.delivered,
        "deliveries differ after {trace:?}"
    );
    assert_eq!(
        world.consumer_deleted, ghost.consumer_deleted,
        "deletes differ after {trace:?}"
    );
    assert_eq!(
        world.to_delete, state.to_delete,
        "received, not deleted, after {trace:?}"
    );
}

fn apply(world: &mut World, state: &State, action: Action) {
    match action {
        Action::Deliver(i) => world.deliver(&wire_of_model(&state.network[i as usize])),
        Action::Drop(i) => {
            world.take(&wire_of_model(&state.network[i as usize]));
        }
        Action::Duplicate(i) => {
            let packet = world.take(&wire_of_model(&state.network[i as usize]));
            world.network.push(packet.clone());
            world.network.push(packet);
        }
        // Replicas are durable: a crash only makes a replica unreachable, which the model's
        // enabled deliveries and reads already reflect.
        Action::Crash(_) | Action::Restart(_) => {}
        Action::Abandon(c) => {
            let c = c as usize;
            world.with_sender(c, DedupSendOp::on_timeout);
        }
        Action::HomeTimeout(c) => world.with_sender(c as usize, DedupSendOp::on_home_timeout),
        Action::Send(c) => world.start_send(c as usize),
        Action::ReadDedup { c, a, b } => world.read_dedup(c as usize, a as usize, b as usize),
        Action::Receive { a, b } => world.receive(a as usize, b as usize),
        Action::Delete { message, a, b } => {
            world.delete(message as usize, a as usize, b as usize);
        }
        Action::AntiEntropy { a, b } => world.anti_entropy(a as usize, b as usize),
        Action::WindowEnd(r) => world.end_window(r as usize),
        Action::Heal { .. } => panic!("walks leave the heal out"),
    }
    world.normalize();
}

impl walks::World<DedupModel> for World {
    fn apply(&mut self, state: &State, action: Action) {
        apply(self, state, action);
    }

    fn compare(&self, state: &State, trace: &[Action]) {
        compare(state, self, trace);
    }
}

fn walk_with(config: &Config, seed: u64, plant: Option<Plant>) -> (Vec<Action>, State) {
    let model = DedupModel::new(config.clone());
    walks::walk(
        &model,
        seed,
        |action| matches!(action, Action::Heal { .. }),
        |_| World::new(plant),
    )
}

/// Two overlapping senders under one fault, with the consumer's receive and delete and an
/// anti-entropy exchange: the races for the id.
fn overlapping() -> Config {
    Config {
        faults_max: 1,
        receives_max: 1,
        deletes_max: 1,
        anti_entropy_max: 1,
        ..Config::quiet("overlapping")
    }
}

/// The same while the window ends on each replica's clock.
fn window() -> Config {
    Config {
        name: "window",
        window_end: true,
        ..overlapping()
    }
}

/// The client's retry on the next endpoint after its first attempt ended, under one fault.
fn retry() -> Config {
    Config {
        name: "retry",
        retry_only: true,
        ..overlapping()
    }
}

fn run(config: &Config, must_reach: &[Scenario]) {
    walks::run(
        &format!("conformance of deduplication {:?}", config.name),
        SEQUENCES,
        "cargo test -p trireme-replication --test it conformance_dedup::",
        |seed| walk_with(config, seed, None),
        must_reach,
        |scenario, _, last| last.ghost.reached(scenario),
    );
}

#[test]
fn overlapping_sends_conform() {
    run(
        &overlapping(),
        &[
            Scenario::AnsweredWithOther,
            Scenario::ConfirmedOthers,
            Scenario::Split,
            Scenario::DecidedByAntiEntropy,
            Scenario::Delivered,
            Scenario::Adopted,
            Scenario::TookHomeValue,
            Scenario::HomeTimedOut,
        ],
    );
}

#[test]
fn sends_at_the_windows_end_conform() {
    run(
        &window(),
        &[
            Scenario::HeldDroppedAtWindowEnd,
            Scenario::PutAfterWindowEnd,
        ],
    );
}

#[test]
fn a_retry_after_the_first_attempt_conforms() {
    run(
        &retry(),
        &[Scenario::AnsweredWithOther, Scenario::Delivered],
    );
}

fn caught(config: &Config, plant: Plant) -> Option<u64> {
    walks::first_failing(SEQUENCES, |seed| walk_with(config, seed, Some(plant)))
}

#[test]
fn a_deduplication_record_written_twice_is_caught() {
    let seed = caught(&overlapping(), Plant::PutOverwrites);
    eprintln!(
        "conformance of deduplication: a put replacing a live record caught at seed {seed:?}"
    );
    assert!(
        seed.is_some(),
        "the comparison missed a put replacing a live record"
    );
}

#[test]
fn a_held_copy_stored_after_its_window_is_caught() {
    let seed = caught(&window(), Plant::LateCopyStored);
    eprintln!("conformance of deduplication: a late held copy stored caught at seed {seed:?}");
    assert!(
        seed.is_some(),
        "the comparison missed a late held copy stored"
    );
}
