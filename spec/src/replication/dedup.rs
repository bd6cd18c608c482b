//! The model of spec/replication.md section 4: one deduplication id sent through two
//! coordinators, three replicas, a lossy network, a consumer, and the end of the window.
//!
//! A send writes its message held and reads the deduplication record, puts a record naming its
//! message (or the one it saw under way) to the record's home replica (replica 0) and then the
//! message the home names to the other two (or, if the home never answers, its own candidate),
//! and once two replicas name one message confirms that message and voids its own copy if it
//! lost. A compact model of its own: the message records
//! keep only what deduplication decides (held, void, ready, tombstone), and a receive and a delete
//! are one quorum read and one write to two replicas, because part 1's claims are proven by the
//! part-1 model and change nothing about which message a deduplication id names. Every step is a
//! pure function of the state; ghost fields record what clients were told and are never read by
//! the protocol. Nothing here is used by the node.

use stateright::{Model, Property};

use super::net::{bit, count, push_sorted};

/// Replicas of every record (the message records and the deduplication record).
pub const REPLICAS: usize = 3;
/// Coordinators that send the deduplication id: coordinator `i` draws message id `i`.
pub const SENDERS: usize = 2;
/// The coordinator a consumer receives and deletes through.
pub const CONSUMER: usize = 2;
/// Coordinators in all: the two senders and the consumer's.
pub const COORDINATORS: usize = 3;
/// Message ids the senders can draw (one each).
pub const MESSAGES: usize = SENDERS;
/// Acks a write needs.
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs.
pub const READ_QUORUM: usize = 2;
/// The deduplication record's home: its first replica in ring order, which every put reaches
/// first (spec/replication.md, section 4, *Send* step 3).
pub const HOME: usize = 0;
/// Receive rounds the heal's consumer may run before the heal is declared stuck.
pub const HEAL_RECEIVES_MAX: usize = 4;

/// One replica's record of one message, as far as deduplication is concerned, in merge order:
/// the merge of two records is the greater (spec/replication.md, section 4, *Records*).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageRecord {
    /// Not stored.
    #[default]
    Absent,
    /// Stored with its deduplication id, not yet receivable: no durable deduplication record
    /// names it yet. Dropped at the window's end.
    Held,
    /// A held copy whose deduplication id named another message: never receivable, dropped at
    /// the window's end. Outranks only `Held`, so a void can never hide a ready message.
    Void,
    /// In the queue and receivable.
    Ready,
    /// Deleted (by a consumer; in the planted bug `ReceivableAtOnce`, also by its loser).
    Tombstone,
}

/// One replica's deduplication record of the id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DedupRecord {
    /// No send has reached this replica yet.
    #[default]
    Empty,
    /// Names the message this replica accepted first; never changes within the window.
    Names(u8),
    /// The window ended on this replica's clock: the record is dropped, and every later
    /// request of the window (a put, a held or void copy) is refused.
    Expired,
}

/// A protocol rule switched off on purpose, to show that the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The draft: the message is receivable as soon as it is written, and the loser
    /// tombstones its own copy after the deduplication record is decided.
    ReceivableAtOnce,
    /// The deduplication record is written before the message.
    DedupBeforeMessage,
    /// One replica naming a message, in the read or in the put's replies, is taken as the id
    /// being decided for that message.
    HitFromOneReplica,
    /// The loser answers with the winner's id and leaves its own copy held.
    LoserKeepsCopy,
    /// The winner is answered as soon as its deduplication record is durable; the confirm that
    /// makes it receivable is sent without waiting for acks.
    AnswerBeforeConfirm,
    /// Anti-entropy does not carry deduplication records to a replica that has none.
    NoDedupRepair,
}

/// Bounds and switches of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    /// Drops, duplicates and replica crashes, together.
    pub faults_max: u8,
    /// Receives by the consumer.
    pub receives_max: u8,
    /// Deletes by the consumer.
    pub deletes_max: u8,
    /// Anti-entropy exchanges between two replicas.
    pub anti_entropy_max: u8,
    /// Whether the window may end (one event per replica, each on its own clock).
    pub window_end: bool,
    /// Whether coordinator 1 may send only after coordinator 0's attempt ended (the client's
    /// retry on the next endpoint); otherwise the two sends may overlap (two producers, or a
    /// retry after a timeout while the first attempt is still under way).
    pub retry_only: bool,
    /// Whether the free phase may end in the heal schedule (liveness).
    pub heal: bool,
    /// The protocol rule switched off, if any (planted-bug tests only).
    pub bug: Option<Bug>,
}

impl Config {
    /// Everything off. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            faults_max: 0,
            receives_max: 0,
            deletes_max: 0,
            anti_entropy_max: 0,
            window_end: false,
            retry_only: false,
            heal: false,
            bug: None,
        }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
}

/// One replica's durable state (it fsyncs before it acks, as in part 1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Reachable: not crashed, not cut off. Requests to a down replica wait.
    pub up: bool,
    /// The record of each message id.
    pub messages: [MessageRecord; MESSAGES],
    /// The deduplication record of the id.
    pub dedup: DedupRecord,
}

/// What a coordinator is doing. Each phase waits for replies of its round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Op {
    #[default]
    Idle,
    /// A sender writes its message held (or, with `ReceivableAtOnce`, ready) and, at the same
    /// time, reads the deduplication record from two replicas: `read` is what they held, once
    /// read. With `DedupBeforeMessage` the write comes after the put (`after_put`) and nothing
    /// is read.
    Write {
        acks: u8,
        read: Option<[DedupRecord; READ_QUORUM]>,
        after_put: bool,
    },
    /// A sender's conditional put of the deduplication record naming `message` (its own, or
    /// the one it adopted), first to the home replica alone; `replies[r]` is the message replica
    /// `r` names after the put. `spread` once the put went to the other two (with the message
    /// the home named, or after the home's timeout with `message`).
    Put {
        message: u8,
        replies: [Option<u8>; REPLICAS],
        spread: bool,
    },
    /// A sender confirms the winner and voids its own copy if it lost. The settle request
    /// carries both writes; each is acked on its own (`acks` the confirm's, `voids` the void's,
    /// `None` when there is no void), and the sender waits for two acks of each (a replica whose
    /// window ended refuses the void as a late copy while it may still ack the confirm).
    Settle {
        winner: u8,
        acks: u8,
        voids: Option<u8>,
    },
}

impl Op {
    fn acks_mut(&mut self) -> Option<&mut u8> {
        match self {
            Op::Write { acks, .. } | Op::Settle { acks, .. } => Some(acks),
            _ => None,
        }
    }
}

/// A node serving one client operation at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Coordinator {
    /// Tags requests; a reply of another round is ignored.
    pub round: u8,
    /// The operation in progress.
    pub op: Op,
}

/// Requests on the network (replies reach the coordinator in the step that produced them, as
/// in part 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    /// Merge `record` into the message's record; acked.
    Write { message: u8, record: MessageRecord },
    /// Conditional put: store `Names(message)` if the replica has no record of the id; the
    /// reply names whatever the replica holds afterwards.
    Put { message: u8 },
    /// Make `confirm` receivable (only a stored copy can be: the body must be there), and void
    /// `void` if it is only held; acked when `confirm` is ready (or already past it).
    Settle { confirm: u8, void: Option<u8> },
}

/// A request in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub replica: u8,
    pub coordinator: u8,
    pub round: u8,
    pub request: Request,
}

/// Broken invariants, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two message ids were answered or delivered for the deduplication id.
    TwoMessages = 0,
    /// A send answered with another message's id left its own copy held on two replicas.
    LoserCopyKept = 1,
    /// The heal ended with the id undecided although a send reached a replica's record.
    Undecided = 2,
    /// The heal's consumer did not empty the queue within its rounds.
    HealStuck = 3,
}

/// Scenarios the runs must reach, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A send was answered with the other coordinator's message id.
    AnsweredWithOther = 0,
    /// A sender confirmed a winner it did not write, still held somewhere.
    ConfirmedOthers = 1,
    /// Two replicas named different messages while the third named none.
    Split = 2,
    /// Anti-entropy gave a replica with no record the other's, deciding the id.
    DecidedByAntiEntropy = 3,
    /// The window ended on a replica holding a copy that was never made receivable.
    HeldDroppedAtWindowEnd = 4,
    /// The consumer received the message.
    Delivered = 5,
    /// A send's put was refused by a replica whose window had ended.
    PutAfterWindowEnd = 6,
    /// A sender's read found another message's put under way and put that message instead.
    Adopted = 7,
    /// A sender's put to the home replica came back naming another message, which the sender
    /// then put to the other two instead of its candidate.
    TookHomeValue = 8,
    /// A sender gave up waiting for the home and put its candidate to the other two.
    HomeTimedOut = 9,
}

/// What only the model knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Message ids a send was answered with (bitmask).
    pub answered: u8,
    /// Message ids the consumer received (bitmask).
    pub delivered: u8,
    /// Message ids a consumer's delete reached a replica for (bitmask).
    pub consumer_deleted: u8,
    /// Broken invariants (`Violation` bits).
    pub violations: u8,
    /// Scenarios reached (`Scenario` bits).
    pub scenarios: u16,
}

impl Ghost {
    fn violate(&mut self, violation: Violation) {
        self.violations |= 1 << violation as u8;
    }

    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u16;
    }

    /// Whether `violation` happened on the way here.
    pub fn violated(&self, violation: Violation) -> bool {
        self.violations & (1 << violation as u8) != 0
    }

    /// Whether `scenario` happened on the way here.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u16) != 0
    }
}

/// Budget spent so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub faults: u8,
    /// Senders that have sent (bitmask).
    pub sends: u8,
    pub receives: u8,
    pub deletes: u8,
    pub anti_entropy: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replicas: [Replica; REPLICAS],
    pub coordinators: [Coordinator; COORDINATORS],
    /// A multiset, kept sorted so equal states hash equal.
    pub network: Vec<Packet>,
    /// Messages the consumer received and has not deleted (bitmask).
    pub to_delete: u8,
    pub used: Used,
    pub ghost: Ghost,
    /// The heal schedule ran; nothing happens afterwards.
    pub healed: bool,
}

impl State {
    /// Nothing sent, every replica up.
    pub fn initial() -> State {
        let replica = Replica {
            up: true,
            ..Replica::default()
        };
        State {
            replicas: [replica.clone(), replica.clone(), replica],
            coordinators: Default::default(),
            network: Vec::new(),
            to_delete: 0,
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        }
    }

    /// The join of every replica's record of `message`: what the cluster knows.
    pub fn joined(&self, message: usize) -> MessageRecord {
        self.replicas
            .iter()
            .map(|r| r.messages[message])
            .max()
            .expect("there are replicas")
    }

    /// Replicas whose deduplication record names `message`.
    pub fn naming(&self, message: usize) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.dedup == DedupRecord::Names(message as u8))
            .count()
    }

    /// Replicas that store `message` (held, void, ready or deleted).
    pub fn storing(&self, message: usize) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.messages[message] != MessageRecord::Absent)
            .count()
    }

    fn push(&mut self, packet: Packet) {
        push_sorted(&mut self.network, packet);
    }

    fn broadcast(&mut self, coordinator: usize, request: Request) {
        let round = self.coordinators[coordinator].round;
        for replica in 0..REPLICAS {
            self.push(Packet {
                replica: replica as u8,
                coordinator: coordinator as u8,
                round,
                request,
            });
        }
    }

    fn begin(&mut self, coordinator: usize, op: Op) {
        let c = &mut self.coordinators[coordinator];
        c.round += 1;
        c.op = op;
    }

    fn finish(&mut self, coordinator: usize) {
        self.coordinators[coordinator].op = Op::Idle;
    }

    /// Whether `coordinator` is idle.
    pub fn idle(&self, coordinator: usize) -> bool {
        self.coordinators[coordinator].op == Op::Idle
    }

    /// Whether `coordinator` has an operation under way that a timeout would cut short.
    pub fn abandonable(&self, coordinator: usize) -> bool {
        let mut op = self.coordinators[coordinator].op;
        op.acks_mut().is_some() || matches!(op, Op::Put { .. })
    }

    // ----- operations ---------------------------------------------------------------------------

    /// A client sends the message with the deduplication id through sender `c`, which draws
    /// message id `c`.
    pub fn start_send(&mut self, config: &Config, c: usize) {
        self.used.sends |= bit(c);
        if config.has(Bug::DedupBeforeMessage) {
            self.start_put(c, c as u8);
        } else {
            self.start_write(config, c, false);
        }
    }

    fn start_write(&mut self, config: &Config, c: usize, after_put: bool) {
        self.begin(
            c,
            Op::Write {
                acks: 0,
                read: None,
                after_put,
            },
        );
        let record = if config.has(Bug::ReceivableAtOnce) {
            MessageRecord::Ready
        } else {
            MessageRecord::Held
        };
        self.broadcast(
            c,
            Request::Write {
                message: c as u8,
                record,
            },
        );
    }

    fn start_put(&mut self, c: usize, message: u8) {
        self.begin(
            c,
            Op::Put {
                message,
                replies: [None; REPLICAS],
                spread: false,
            },
        );
        let round = self.coordinators[c].round;
        self.push(Packet {
            replica: HOME as u8,
            coordinator: c as u8,
            round,
            request: Request::Put { message },
        });
    }

    /// Sends the put of `message` to the replicas other than the home, once per put.
    fn spread_put(&mut self, c: usize, message: u8) {
        let Op::Put { spread, .. } = &mut self.coordinators[c].op else {
            unreachable!("a put spreads only in its own phase");
        };
        assert!(!*spread, "a put spreads once");
        *spread = true;
        let round = self.coordinators[c].round;
        for replica in (0..REPLICAS).filter(|r| *r != HOME) {
            self.push(Packet {
                replica: replica as u8,
                coordinator: c as u8,
                round,
                request: Request::Put { message },
            });
        }
    }

    /// Whether sender `c` still waits for the home's reply to its put before spreading it.
    pub fn waiting_for_home(&self, c: usize) -> bool {
        matches!(self.coordinators[c].op, Op::Put { spread: false, .. })
    }

    /// Sender `c` stops waiting for the home (it did not answer in time, or refused) and puts
    /// its candidate to the other two.
    pub fn home_timeout(&mut self, c: usize) {
        let Op::Put { message, .. } = self.coordinators[c].op else {
            unreachable!("the home's timeout is a put's");
        };
        self.ghost.reach(Scenario::HomeTimedOut);
        self.spread_put(c, message);
    }

    fn start_settle(&mut self, config: &Config, c: usize, winner: u8) {
        if winner as usize != c
            && self
                .replicas
                .iter()
                .any(|r| r.messages[winner as usize] == MessageRecord::Held)
        {
            self.ghost.reach(Scenario::ConfirmedOthers);
        }
        let void = (winner as usize != c && !config.has(Bug::LoserKeepsCopy)).then_some(c as u8);
        self.begin(
            c,
            Op::Settle {
                winner,
                acks: 0,
                voids: void.map(|_| 0),
            },
        );
        self.broadcast(
            c,
            Request::Settle {
                confirm: winner,
                void,
            },
        );
        if config.has(Bug::AnswerBeforeConfirm) && winner as usize == c {
            self.answer(c, winner);
        }
    }

    /// Whether a quorum read of replicas `a` and `b` finds a ready message.
    pub fn ready_in(&self, a: usize, b: usize) -> bool {
        (0..MESSAGES).any(|m| {
            self.replicas[a].messages[m].max(self.replicas[b].messages[m]) == MessageRecord::Ready
        })
    }

    /// The consumer receives through a quorum read of replicas `a` and `b`, taken in one step
    /// (spec/replication.md, section 4, *The model*): every message whose merged record is ready
    /// is delivered.
    pub fn receive(&mut self, a: usize, b: usize) {
        self.used.receives += 1;
        for m in 0..MESSAGES {
            let merged = self.replicas[a].messages[m].max(self.replicas[b].messages[m]);
            if merged == MessageRecord::Ready {
                self.ghost.delivered |= bit(m);
                self.ghost.reach(Scenario::Delivered);
                self.to_delete |= bit(m);
                self.check_one_message();
            }
        }
    }

    /// The consumer deletes `message`, which it received: the tombstone reaches replicas `a`
    /// and `b` in one step (the third learns it by anti-entropy).
    pub fn delete(&mut self, message: usize, a: usize, b: usize) {
        self.used.deletes += 1;
        for r in [a, b] {
            self.replicas[r].messages[message] = MessageRecord::Tombstone;
        }
        self.ghost.consumer_deleted |= bit(message);
        self.to_delete &= !bit(message);
    }

    /// The coordinator times out or crashes: its client learns nothing more.
    pub fn abandon(&mut self, c: usize) {
        self.finish(c);
    }

    /// Answers sender `c`'s client with `message`.
    fn answer(&mut self, c: usize, message: u8) {
        self.ghost.answered |= bit(message as usize);
        self.check_one_message();
        if message as usize != c
            && self
                .replicas
                .iter()
                .filter(|r| r.messages[c] == MessageRecord::Held)
                .count()
                >= WRITE_QUORUM
        {
            self.ghost.violate(Violation::LoserCopyKept);
        }
        if message as usize != c {
            self.ghost.reach(Scenario::AnsweredWithOther);
        }
    }

    fn check_one_message(&mut self) {
        if count(self.ghost.answered | self.ghost.delivered) > 1 {
            self.ghost.violate(Violation::TwoMessages);
        }
    }

    // ----- faults and background work -----------------------------------------------------------

    /// Replica `r` crashes or is cut off (a fault).
    pub fn crash(&mut self, r: usize) {
        self.used.faults += 1;
        self.replicas[r].up = false;
    }

    /// Replica `r` comes back with its durable records.
    pub fn restart(&mut self, r: usize) {
        self.replicas[r].up = true;
    }

    /// The network loses the packet at `index` (a fault).
    pub fn drop_packet(&mut self, index: usize) {
        self.used.faults += 1;
        self.network.remove(index);
    }

    /// The network duplicates the packet at `index` (a fault).
    pub fn duplicate_packet(&mut self, index: usize) {
        self.used.faults += 1;
        let packet = self.network[index];
        self.push(packet);
    }

    /// The window ends on replica `r`'s clock: it drops its deduplication record and every copy
    /// that was never made receivable, and refuses the window's later puts and held copies.
    pub fn end_window(&mut self, r: usize) {
        let replica = &mut self.replicas[r];
        replica.dedup = DedupRecord::Expired;
        for record in &mut replica.messages {
            if matches!(*record, MessageRecord::Held | MessageRecord::Void) {
                if *record == MessageRecord::Held {
                    self.ghost.reach(Scenario::HeldDroppedAtWindowEnd);
                }
                *record = MessageRecord::Absent;
            }
        }
    }

    /// Replica `from` pushes its records to replica `to`, which merges them.
    pub fn anti_entropy(&mut self, config: &Config, from: usize, to: usize) {
        let incoming = self.replicas[from].clone();
        let expired = self.replicas[to].dedup == DedupRecord::Expired;
        for (m, record) in incoming.messages.iter().enumerate() {
            if expired && *record < MessageRecord::Ready {
                continue;
            }
            let held = &mut self.replicas[to].messages[m];
            *held = (*held).max(*record);
        }
        if let DedupRecord::Names(message) = incoming.dedup
            && self.replicas[to].dedup == DedupRecord::Empty
            && !config.has(Bug::NoDedupRepair)
        {
            self.replicas[to].dedup = DedupRecord::Names(message);
            if self.naming(message as usize) == WRITE_QUORUM {
                self.ghost.reach(Scenario::DecidedByAntiEntropy);
            }
        }
    }

    /// Whether an anti-entropy push from `from` to `to` would change anything.
    pub fn anti_entropy_useful(&self, config: &Config, from: usize, to: usize) -> bool {
        let mut copy = self.clone();
        copy.anti_entropy(config, from, to);
        self.replicas[from].up && self.replicas[to].up && copy.replicas[to] != self.replicas[to]
    }

    /// Whether the packet at `index` can be delivered now (its replica is up).
    pub fn deliverable(&self, index: usize) -> bool {
        self.replicas[self.network[index].replica as usize].up
    }

    /// Delivers the packet at `index` to its replica; the reply reaches the coordinator in the
    /// same step.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        let r = packet.replica as usize;
        let expired = self.replicas[r].dedup == DedupRecord::Expired;
        match packet.request {
            Request::Write { message, record } => {
                if expired && record < MessageRecord::Ready {
                    return;
                }
                let held = &mut self.replicas[r].messages[message as usize];
                *held = (*held).max(record);
                self.on_ack(config, &packet);
            }
            Request::Put { message } => {
                let replica = &mut self.replicas[r];
                if expired {
                    self.ghost.reach(Scenario::PutAfterWindowEnd);
                    return;
                }
                if replica.dedup == DedupRecord::Empty {
                    replica.dedup = DedupRecord::Names(message);
                }
                let DedupRecord::Names(named) = replica.dedup else {
                    unreachable!("a replica in the window names a message after a put");
                };
                self.on_put_reply(config, &packet, named);
            }
            Request::Settle { confirm, void } => {
                let replica = &mut self.replicas[r];
                // A void after the window's end is refused as a late copy (the copy it would
                // void was dropped there at the window's end): no ack for it.
                let voided = void.is_some() && !expired;
                if let Some(void) = void
                    && !expired
                {
                    let loser = if config.has(Bug::ReceivableAtOnce) {
                        MessageRecord::Tombstone
                    } else {
                        MessageRecord::Void
                    };
                    let held = &mut replica.messages[void as usize];
                    *held = (*held).max(loser);
                }
                let record = &mut replica.messages[confirm as usize];
                let confirmed = match *record {
                    // No body here to make receivable; a void copy is never the winner.
                    MessageRecord::Absent | MessageRecord::Void => false,
                    MessageRecord::Held => {
                        *record = MessageRecord::Ready;
                        true
                    }
                    MessageRecord::Ready | MessageRecord::Tombstone => true,
                };
                self.on_settle_reply(config, &packet, confirmed, voided);
            }
        }
    }

    fn current(&self, packet: &Packet) -> bool {
        self.coordinators[packet.coordinator as usize].round == packet.round
    }

    fn on_ack(&mut self, config: &Config, packet: &Packet) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let mut op = self.coordinators[c].op;
        let Some(acks) = op.acks_mut() else {
            return;
        };
        *acks |= bit(packet.replica as usize);
        let have = count(*acks);
        self.coordinators[c].op = op;
        if have < WRITE_QUORUM {
            return;
        }
        match op {
            Op::Write { .. } => self.decide_write(config, c),
            _ => unreachable!("on_ack counts the write's acks; a settle's go to on_settle_reply"),
        }
    }

    /// A replica's answer to a settle request: `confirmed` when it acked the confirm, `voided`
    /// when it took the void.
    fn on_settle_reply(&mut self, config: &Config, packet: &Packet, confirmed: bool, voided: bool) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let Op::Settle {
            winner,
            mut acks,
            mut voids,
        } = self.coordinators[c].op
        else {
            return;
        };
        let r = bit(packet.replica as usize);
        if confirmed {
            acks |= r;
        }
        if let Some(voids) = voids.as_mut()
            && voided
        {
            *voids |= r;
        }
        self.coordinators[c].op = Op::Settle {
            winner,
            acks,
            voids,
        };
        self.settled(config, c);
    }

    /// Step 5, once the confirm and the void (if any) have two acks each.
    fn settled(&mut self, config: &Config, c: usize) {
        let Op::Settle {
            winner,
            acks,
            voids,
        } = self.coordinators[c].op
        else {
            unreachable!("settled only in the settle phase");
        };
        if count(acks) < WRITE_QUORUM || voids.is_some_and(|voids| count(voids) < WRITE_QUORUM) {
            return;
        }
        if !(config.has(Bug::AnswerBeforeConfirm) && winner as usize == c) {
            self.answer(c, winner);
        }
        self.finish(c);
    }

    /// Sender `c` reads the deduplication record from replicas `a` and `b`, in one step.
    pub fn read_dedup(&mut self, config: &Config, c: usize, a: usize, b: usize) {
        let Op::Write { read, .. } = &mut self.coordinators[c].op else {
            unreachable!("the deduplication record is read only in the write phase");
        };
        *read = Some([self.replicas[a].dedup, self.replicas[b].dedup]);
        self.decide_write(config, c);
    }

    /// Whether sender `c` still has to read the deduplication record.
    pub fn reading(&self, c: usize) -> bool {
        matches!(
            self.coordinators[c].op,
            Op::Write {
                read: None,
                after_put: false,
                ..
            }
        )
    }

    /// The write phase is over once the copy is on two replicas and (unless the put came
    /// first) two replicas answered the read.
    fn decide_write(&mut self, config: &Config, c: usize) {
        let Op::Write {
            acks,
            read,
            after_put,
        } = self.coordinators[c].op
        else {
            unreachable!("decided only in the write phase");
        };
        if count(acks) < WRITE_QUORUM {
            return;
        }
        if after_put {
            // The put already named this message: confirm it.
            self.start_settle(config, c, c as u8);
            return;
        }
        let Some(read) = read else {
            return;
        };
        let named = |m: u8| read.iter().filter(|r| **r == DedupRecord::Names(m)).count();
        let needed = if config.has(Bug::HitFromOneReplica) {
            1
        } else {
            WRITE_QUORUM
        };
        if let Some(winner) = (0..MESSAGES as u8).find(|m| named(*m) >= needed) {
            // A duplicate: two replicas name `winner`, so it is the id's message.
            self.start_settle(config, c, winner);
        } else if let Some(seen) = (0..MESSAGES as u8).find(|m| named(*m) > 0) {
            // A candidate is under way: help it rather than add a rival.
            self.ghost.reach(Scenario::Adopted);
            self.start_put(c, seen);
        } else {
            self.start_put(c, c as u8);
        }
    }

    fn on_put_reply(&mut self, config: &Config, packet: &Packet, named: u8) {
        if !self.current(packet) {
            return;
        }
        let c = packet.coordinator as usize;
        let Op::Put {
            message,
            mut replies,
            spread,
        } = self.coordinators[c].op
        else {
            return;
        };
        replies[packet.replica as usize] = Some(named);
        self.coordinators[c].op = Op::Put {
            message,
            replies,
            spread,
        };
        let agreeing = replies.iter().filter(|n| **n == Some(named)).count();
        let needed = if config.has(Bug::HitFromOneReplica) {
            1
        } else {
            WRITE_QUORUM
        };
        if agreeing < needed {
            if packet.replica as usize == HOME && !spread {
                // Every sender's put meets the home first and spreads what the home names, so
                // concurrent sends converge on the home's first value.
                if named != message {
                    self.ghost.reach(Scenario::TookHomeValue);
                }
                self.spread_put(c, named);
            }
            return;
        }
        // `named` is durable on two replicas, and each replica names one message for the whole
        // window: no other message can ever be named by two.
        if config.has(Bug::DedupBeforeMessage) && named as usize == c {
            self.start_write(config, c, true);
        } else {
            self.start_settle(config, c, named);
        }
    }

    /// Whether the coordinator of `packet` still waits for this replica's reply to it.
    fn awaited(&self, packet: &Packet) -> bool {
        if !self.current(packet) {
            return false;
        }
        let r = packet.replica as usize;
        match self.coordinators[packet.coordinator as usize].op {
            Op::Idle => false,
            Op::Write { acks, .. } => acks & bit(r) == 0,
            Op::Settle { acks, voids, .. } => {
                acks & bit(r) == 0 || voids.is_some_and(|voids| voids & bit(r) == 0)
            }
            Op::Put { replies, .. } => replies[r].is_none(),
        }
    }

    /// Whether delivering `packet` would change its replica's records or the ghost.
    fn changes_replica(&self, packet: &Packet) -> bool {
        let replica = &self.replicas[packet.replica as usize];
        let expired = replica.dedup == DedupRecord::Expired;
        match packet.request {
            Request::Write { message, record } => {
                !(expired && record < MessageRecord::Ready)
                    && replica.messages[message as usize] < record
            }
            Request::Put { .. } => replica.dedup == DedupRecord::Empty,
            Request::Settle { confirm, void } => {
                let voids = void.is_some_and(|v| {
                    !expired && replica.messages[v as usize] < MessageRecord::Void
                });
                voids || replica.messages[confirm as usize] == MessageRecord::Held
            }
        }
    }

    /// Removes packets whose delivery can change nothing (no replica record, no ghost, and no
    /// coordinator waits for the reply): delivering them is a no-op, so this changes no
    /// behaviour. Renumbers rounds to "current" (1) and "older" (0), so equal situations are
    /// equal states.
    pub fn normalize(&mut self) {
        let network = std::mem::take(&mut self.network);
        let mut network: Vec<Packet> = network
            .into_iter()
            .filter(|p| self.awaited(p) || self.changes_replica(p))
            .collect();
        for packet in &mut network {
            let coordinator = &self.coordinators[packet.coordinator as usize];
            if coordinator.op != Op::Idle && packet.round == coordinator.round {
                packet.round = 1;
            } else {
                packet.round = 0;
            }
        }
        network.sort();
        self.network = network;
        for coordinator in &mut self.coordinators {
            coordinator.round = u8::from(coordinator.op != Op::Idle);
        }
    }

    fn split(&self) -> bool {
        let named = |m: u8| {
            self.replicas
                .iter()
                .filter(|r| r.dedup == DedupRecord::Names(m))
                .count()
        };
        let empty = self
            .replicas
            .iter()
            .filter(|r| r.dedup == DedupRecord::Empty)
            .count();
        named(0) == 1 && named(1) == 1 && empty == 1
    }

    // ----- heal ---------------------------------------------------------------------------------

    /// The fair schedule liveness is checked on: every replica comes back; packets in flight
    /// are delivered (or, with `deliver_pending = false`, were all lost); operations left
    /// waiting time out; anti-entropy runs between every pair until nothing changes (the id must
    /// then be decided); the consumer receives and deletes until nothing is receivable; then
    /// the window ends on every replica.
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        for r in 0..REPLICAS {
            self.restart(r);
        }
        if !deliver_pending {
            self.network.clear();
        }
        self.heal_network(config);
        self.heal_anti_entropy(config);
        let in_window = self
            .replicas
            .iter()
            .all(|r| r.dedup != DedupRecord::Expired);
        let named = self
            .replicas
            .iter()
            .any(|r| matches!(r.dedup, DedupRecord::Names(_)));
        let decided = (0..MESSAGES).any(|m| self.naming(m) >= WRITE_QUORUM);
        if in_window && named && !decided {
            self.ghost.violate(Violation::Undecided);
        }
        let mut rounds = 0;
        while (0..MESSAGES).any(|m| self.joined(m) == MessageRecord::Ready) {
            if rounds == HEAL_RECEIVES_MAX {
                self.ghost.violate(Violation::HealStuck);
                break;
            }
            rounds += 1;
            let (a, b) = (0..REPLICAS)
                .flat_map(|a| (a + 1..REPLICAS).map(move |b| (a, b)))
                .find(|(a, b)| self.ready_in(*a, *b))
                .expect("a ready copy is seen by some pair after anti-entropy");
            self.receive(a, b);
            for m in 0..MESSAGES {
                if self.to_delete & bit(m) != 0 {
                    self.delete(m, a, b);
                }
            }
            self.heal_anti_entropy(config);
        }
        for r in 0..REPLICAS {
            self.end_window(r);
        }
        self.heal_anti_entropy(config);
        self.normalize();
        self.healed = true;
    }

    fn heal_network(&mut self, config: &Config) {
        loop {
            if let Some(c) = (0..SENDERS).find(|c| self.reading(*c)) {
                self.read_dedup(config, c, 0, 1);
            } else if !self.network.is_empty() {
                self.deliver(config, 0);
            } else {
                break;
            }
        }
        for c in 0..COORDINATORS {
            self.abandon(c);
        }
    }

    fn heal_anti_entropy(&mut self, config: &Config) {
        loop {
            let mut changed = false;
            for from in 0..REPLICAS {
                for to in 0..REPLICAS {
                    if from != to && self.anti_entropy_useful(config, from, to) {
                        self.anti_entropy(config, from, to);
                        changed = true;
                    }
                }
            }
            if !changed {
                return;
            }
        }
    }
}

// ----- the model --------------------------------------------------------------------------------

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Deliver the packet at this index of the (sorted) network.
    Deliver(u8),
    Drop(u8),
    Duplicate(u8),
    Crash(u8),
    Restart(u8),
    /// A coordinator times out or crashes.
    Abandon(u8),
    /// Sender `c` stops waiting for the home's reply to its put.
    HomeTimeout(u8),
    /// Sender `c`'s client sends with the deduplication id.
    Send(u8),
    /// Sender `c` reads the deduplication record from replicas `a` and `b`.
    ReadDedup {
        c: u8,
        a: u8,
        b: u8,
    },
    /// The consumer receives through a quorum read of these two replicas.
    Receive {
        a: u8,
        b: u8,
    },
    /// The consumer deletes this message, which it received, on these two replicas.
    Delete {
        message: u8,
        a: u8,
        b: u8,
    },
    /// Replicas `a` and `b` exchange records.
    AntiEntropy {
        a: u8,
        b: u8,
    },
    /// The window ends on this replica's clock.
    WindowEnd(u8),
    Heal {
        deliver_pending: bool,
    },
}

/// The deduplication model under one configuration.
#[derive(Clone, Debug)]
pub struct DedupModel {
    pub config: Config,
}

impl DedupModel {
    /// The model of `config`.
    pub fn new(config: Config) -> DedupModel {
        DedupModel { config }
    }
}

impl Model for DedupModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial()]
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
            if state.replicas[r].up {
                if fault {
                    actions.push(Action::Crash(r as u8));
                }
            } else {
                actions.push(Action::Restart(r as u8));
            }
            // The replicas other than the home are interchangeable (they start equal and every
            // request but the home's first put goes to both), so the window ends on those two in
            // index order without losing behaviour, and on the home at any moment. A down
            // replica's clock runs on: its window ends all the same.
            let next_to_expire = (0..REPLICAS)
                .filter(|x| *x != HOME)
                .find(|x| state.replicas[*x].dedup != DedupRecord::Expired);
            let expires = if r == HOME {
                state.replicas[r].dedup != DedupRecord::Expired
            } else {
                next_to_expire == Some(r)
            };
            if config.window_end && expires {
                actions.push(Action::WindowEnd(r as u8));
            }
        }
        for c in 0..COORDINATORS {
            if state.abandonable(c) {
                actions.push(Action::Abandon(c as u8));
            }
        }
        for c in 0..SENDERS {
            if state.waiting_for_home(c) {
                actions.push(Action::HomeTimeout(c as u8));
            }
        }
        for c in 0..SENDERS {
            let first_ended = c == 0 || (used.sends & bit(0) != 0 && state.idle(0));
            if state.idle(c) && used.sends & bit(c) == 0 && (!config.retry_only || first_ended) {
                actions.push(Action::Send(c as u8));
            }
        }
        for c in 0..SENDERS {
            if state.reading(c) {
                for a in 0..REPLICAS {
                    for b in a + 1..REPLICAS {
                        if state.replicas[a].up && state.replicas[b].up {
                            actions.push(Action::ReadDedup {
                                c: c as u8,
                                a: a as u8,
                                b: b as u8,
                            });
                        }
                    }
                }
            }
        }
        if state.idle(CONSUMER) {
            if used.receives < config.receives_max {
                for a in 0..REPLICAS {
                    for b in a + 1..REPLICAS {
                        // A receive that finds nothing ready changes nothing but the budget.
                        if state.replicas[a].up && state.replicas[b].up && state.ready_in(a, b) {
                            actions.push(Action::Receive {
                                a: a as u8,
                                b: b as u8,
                            });
                        }
                    }
                }
            }
            if used.deletes < config.deletes_max {
                for m in 0..MESSAGES {
                    if state.to_delete & bit(m) == 0 {
                        continue;
                    }
                    for a in 0..REPLICAS {
                        for b in a + 1..REPLICAS {
                            if state.replicas[a].up && state.replicas[b].up {
                                actions.push(Action::Delete {
                                    message: m as u8,
                                    a: a as u8,
                                    b: b as u8,
                                });
                            }
                        }
                    }
                }
            }
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
            Action::Abandon(c) => state.abandon(c as usize),
            Action::HomeTimeout(c) => state.home_timeout(c as usize),
            Action::Send(c) => state.start_send(config, c as usize),
            Action::ReadDedup { c, a, b } => {
                state.read_dedup(config, c as usize, a as usize, b as usize)
            }
            Action::Receive { a, b } => state.receive(a as usize, b as usize),
            Action::Delete { message, a, b } => {
                state.delete(message as usize, a as usize, b as usize)
            }
            Action::AntiEntropy { a, b } => {
                state.used.anti_entropy += 1;
                state.anti_entropy(config, a as usize, b as usize);
                state.anti_entropy(config, b as usize, a as usize);
            }
            Action::WindowEnd(r) => state.end_window(r as usize),
            Action::Heal { deliver_pending } => state.heal(config, deliver_pending),
        }
        if state.split() {
            state.ghost.reach(Scenario::Split);
        }
        state.normalize();
        Some(state)
    }

    fn within_boundary(&self, state: &State) -> bool {
        let (config, used) = (&self.config, &state.used);
        state.healed
            || (used.faults <= config.faults_max
                && used.receives <= config.receives_max
                && used.deletes <= config.deletes_max
                && used.anti_entropy <= config.anti_entropy_max)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("acknowledged send is never lost", |_, s: &State| {
                (0..MESSAGES).all(|m| {
                    s.ghost.answered & bit(m) == 0
                        || s.ghost.delivered & bit(m) != 0
                        || s.ghost.consumer_deleted & bit(m) != 0
                        || s.joined(m) == MessageRecord::Ready
                })
            }),
            Property::always(
                "at most one message id is answered or delivered per deduplication id",
                |_, s: &State| !s.ghost.violated(Violation::TwoMessages),
            ),
            Property::always(
                "a deduplication record on two replicas names a message stored on two",
                |_, s: &State| {
                    // Within the window: once it ends on a replica, that replica drops both the
                    // record and the held copy, and the id is no longer answered from it.
                    let in_window = s.replicas.iter().all(|r| r.dedup != DedupRecord::Expired);
                    !in_window
                        || (0..MESSAGES)
                            .all(|m| s.naming(m) < WRITE_QUORUM || s.storing(m) >= WRITE_QUORUM)
                },
            ),
            Property::always(
                "a send answered with another id leaves its own copy held on at most one replica",
                |_, s: &State| !s.ghost.violated(Violation::LoserCopyKept),
            ),
            Property::always(
                "after heal, the deduplication id is decided",
                |_, s: &State| !s.healed || !s.ghost.violated(Violation::Undecided),
            ),
            Property::always(
                "after heal, every answered send was delivered or deleted",
                |_, s: &State| {
                    !s.healed
                        || (!s.ghost.violated(Violation::HealStuck)
                            && count(
                                s.ghost.answered & !(s.ghost.delivered | s.ghost.consumer_deleted),
                            ) == 0
                            && s.network.is_empty()
                            && (0..MESSAGES).all(|m| {
                                s.replicas.iter().all(|r| {
                                    !matches!(
                                        r.messages[m],
                                        MessageRecord::Held | MessageRecord::Ready
                                    )
                                })
                            }))
                },
            ),
            Property::sometimes("two senders put at once", |_, s: &State| {
                matches!(s.coordinators[0].op, Op::Put { .. })
                    && matches!(s.coordinators[1].op, Op::Put { .. })
            }),
            Property::sometimes("a send answered with the other's id", |_, s: &State| {
                s.ghost.reached(Scenario::AnsweredWithOther)
            }),
            Property::sometimes(
                "a sender confirmed a held winner it did not write",
                |_, s: &State| s.ghost.reached(Scenario::ConfirmedOthers),
            ),
            Property::sometimes(
                "two replicas name different messages, the third none",
                |_, s: &State| s.ghost.reached(Scenario::Split),
            ),
            Property::sometimes("anti-entropy decided the id", |_, s: &State| {
                s.ghost.reached(Scenario::DecidedByAntiEntropy)
            }),
            Property::sometimes("the consumer received the message", |_, s: &State| {
                s.ghost.reached(Scenario::Delivered)
            }),
            Property::sometimes(
                "the window ended on a replica holding a copy never made receivable",
                |_, s: &State| s.ghost.reached(Scenario::HeldDroppedAtWindowEnd),
            ),
            Property::sometimes("a put arrived after the window ended", |_, s: &State| {
                s.ghost.reached(Scenario::PutAfterWindowEnd)
            }),
            Property::sometimes(
                "a sender adopted the other's message seen on one replica",
                |_, s: &State| s.ghost.reached(Scenario::Adopted),
            ),
            Property::sometimes(
                "a sender put the home's message instead of its candidate",
                |_, s: &State| s.ghost.reached(Scenario::TookHomeValue),
            ),
            Property::sometimes(
                "a sender put its candidate after the home's timeout",
                |_, s: &State| s.ghost.reached(Scenario::HomeTimedOut),
            ),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ]
    }
}
