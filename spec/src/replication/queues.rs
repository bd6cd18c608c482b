//! The model of spec/replication.md#1-queues-in-a-cluster: one queue name's record on its three
//! replicas, creates of that name racing on two coordinators, its delete, sends racing the
//! delete, and its recreation, checked exhaustively with stateright.
//!
//! It owns the name record and its merge (`NameRecord`), the create vote, the settle rule, the
//! message keys that carry the incarnation, and the section's invariants and liveness claims as
//! properties. Messages themselves are not replicated here: part 1 (`protocol`) proves one
//! message's replication, so a stored message is one durable entry under its key. It must never
//! be used by the node, and never change part 1's model.

use stateright::{Model, Property};

use super::net::{bit, count, push_sorted};

/// Replicas of the name record (the replicas of the queue name on the ring).
pub const REPLICAS: usize = 3;
/// Coordinators (each also plays the client that called it).
pub const COORDINATORS: usize = 2;
/// Acks a write needs before the coordinator acts on it.
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs before the coordinator decides.
pub const READ_QUORUM: usize = 2;
/// Votes that make a proposal the epoch's incarnation.
pub const VOTE_QUORUM: usize = 2;
/// Steps the heal schedule may take before it is declared stuck (a liveness failure).
pub const HEAL_STEPS_MAX: u32 = 2_000;
/// Creates the heal schedule's fair client tries before giving up.
const HEAL_CREATES_MAX: usize = 4;

/// Which creation of the name this is. Unique by construction: the real id is (hybrid logical
/// clock time, coordinator node id, random nonce); the model keeps the coordinator and a per
/// coordinator count of proposals, which is what makes the real one unique.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation {
    /// The coordinator that drew it.
    pub coordinator: u8,
    /// The coordinator's count of proposals before this one.
    pub nonce: u8,
}

/// What a create proposes: an incarnation and the attributes the client asked for (abstract:
/// two creates agree exactly when their numbers are equal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Proposal {
    pub incarnation: Incarnation,
    pub attributes: u8,
}

/// One replica's record of the queue name.
///
/// `epoch` counts the name's incarnations (0 for the first). Within an epoch each replica casts
/// at most one vote, in its own slot of `votes`; a proposal with two votes is the epoch's
/// incarnation, and `deleted` is the tombstone that ends the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameRecord {
    pub epoch: u8,
    /// Slot `r` holds replica `r`'s vote in this epoch, copied to other replicas by merges.
    pub votes: [Option<Proposal>; REPLICAS],
    pub deleted: bool,
}

/// How replicas merge name records. The correct rule is [`NameMerge::Join`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NameMerge {
    /// A later epoch wins whole; within an epoch the tombstone and every slot's vote are kept.
    Join,
    /// Planted bug: the record with the greater stamp (epoch, tombstone, newest incarnation in
    /// it) wins whole, as a last-writer-wins register would.
    LastWriter,
}

impl NameRecord {
    /// The incarnation of the epoch: the proposal holding `quorum` votes (under a planted
    /// quorum of one, the greatest such). Votes are counted by incarnation id, as a replica's
    /// vote names an id.
    pub fn decided_with(&self, quorum: usize) -> Option<Proposal> {
        let mut best: Option<Proposal> = None;
        for proposal in self.votes.iter().flatten() {
            let votes = self
                .votes
                .iter()
                .flatten()
                .filter(|v| v.incarnation == proposal.incarnation)
                .count();
            if votes >= quorum && best.is_none_or(|b| *proposal > b) {
                best = Some(*proposal);
            }
        }
        best
    }

    /// The incarnation of the epoch under the correct vote quorum.
    pub fn decided(&self) -> Option<Proposal> {
        self.decided_with(VOTE_QUORUM)
    }

    /// The live incarnation: decided and not deleted.
    pub fn live(&self) -> Option<Proposal> {
        if self.deleted { None } else { self.decided() }
    }

    /// Every replica voted and no proposal has a quorum: nobody can win this epoch.
    pub fn split(&self) -> bool {
        self.votes.iter().all(Option::is_some) && self.decided().is_none()
    }

    /// The join of `self` (what a replica holds) and `incoming`.
    #[must_use]
    pub fn merge(self, incoming: NameRecord, rule: NameMerge) -> NameRecord {
        if rule == NameMerge::LastWriter {
            let stamp = |r: &NameRecord| {
                let newest = r.votes.iter().flatten().map(|p| p.incarnation).max();
                (r.epoch, r.deleted, newest, *r)
            };
            return if stamp(&incoming) > stamp(&self) {
                incoming
            } else {
                self
            };
        }
        if self.epoch != incoming.epoch {
            return if self.epoch > incoming.epoch {
                self
            } else {
                incoming
            };
        }
        let mut votes = self.votes;
        for (slot, vote) in votes.iter_mut().zip(incoming.votes) {
            // A slot is written once per epoch, by its replica only, so two copies that both
            // hold a vote hold the same one; max keeps the merge total for the property tests.
            *slot = (*slot).max(vote);
        }
        NameRecord {
            epoch: self.epoch,
            votes,
            deleted: self.deleted || incoming.deleted,
        }
    }
}

/// The join of a set of records under the correct rule (bottom: [`NameRecord::default`]).
pub fn join_all(records: impl IntoIterator<Item = NameRecord>) -> NameRecord {
    records
        .into_iter()
        .fold(NameRecord::default(), |held, incoming| {
            held.merge(incoming, NameMerge::Join)
        })
}

/// A protocol rule switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The incarnation is the creation time in ms, which two creations can draw alike (the
    /// model draws the same value every time).
    IncarnationFromClock,
    /// A message's key is (queue name, message id), without the incarnation.
    KeyWithoutIncarnation,
    /// A create counts its proposal as decided at its first vote.
    CreateWithoutQuorum,
    /// Name records merge by last writer instead of the join.
    QueueRecordLastWriter,
    /// A coordinator acts on a decision (answers a create, takes a send) that its replies show
    /// but that no two replicas hold yet.
    ActBeforeSettled,
    /// A create that lost answers success without comparing attributes.
    LoserAnswersSuccess,
    /// An epoch split three ways is never given up: creates keep proposing in it.
    SplitEpochNeverEnds,
    /// Anti-entropy digests cover the epoch and the tombstone only, so records that differ
    /// only in votes are never exchanged.
    DigestWithoutVotes,
    /// A send whose coordinator has no view of the name answers `QueueDoesNotExist` without
    /// asking a quorum.
    LocalMissAnswersMissing,
    /// Collection compacts a record whose epoch holds no tombstone into the next epoch's empty
    /// record (the collector does not check what it read is deleted).
    CollectWithoutTombstone,
}

/// Where a search starts. The operations a starting point has already done are not counted
/// against the budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// The name was never created.
    Empty,
    /// Both coordinators read the name missing and asked for votes on their proposals for
    /// epoch 0 (`c0/0` with attributes 0, `c1/0` with `attributes_c1`); every vote request is
    /// in flight. A state the `Empty` start reaches.
    Racing,
    /// Created by coordinator 0 with attributes 0 (incarnation `c0/0`), held by all three
    /// replicas, known to both coordinators, and holding one acknowledged message.
    Created,
}

/// Bounds and switches of one model run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    pub start: Start,
    /// The attributes coordinator 1's creates ask for (coordinator 0 asks for 0).
    pub attributes_c1: u8,
    /// Creates started after the starting point.
    pub creates_max: u8,
    /// The coordinators that create (bitmask).
    pub creators: u8,
    /// Queue deletes started (by coordinator 1).
    pub deletes_max: u8,
    /// Sends started (by coordinator 0).
    pub sends_max: u8,
    /// Whether sends start only through a view (after the sender's create answered), not
    /// after a read of their own (the read path is the receive's and the create's).
    pub sends_through_view_only: bool,
    /// Receives started.
    pub receives_max: u8,
    /// Drops, duplicates and replica crashes, together.
    pub faults_max: u8,
    /// Anti-entropy exchanges between two replicas.
    pub anti_entropy_max: u8,
    /// Collections of the name's tombstone (the candidate answer to finding N1: the empty record
    /// of the next epoch written to the three replicas as an ordinary merge).
    pub collections_max: u8,
    /// Whether the free phase may end in the heal schedule (liveness).
    pub heal: bool,
    /// The protocol rule switched off, if any (planted-bug tests only).
    pub bug: Option<Bug>,
}

impl Config {
    /// Everything off: no operations, no faults. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            start: Start::Empty,
            attributes_c1: 0,
            creates_max: 0,
            creators: 0b11,
            deletes_max: 0,
            sends_max: 0,
            sends_through_view_only: false,
            receives_max: 0,
            faults_max: 0,
            anti_entropy_max: 0,
            collections_max: 0,
            heal: false,
            bug: None,
        }
    }

    /// The same bounds under another name.
    pub fn named(self, name: &'static str) -> Config {
        Config { name, ..self }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    fn merge_rule(&self) -> NameMerge {
        if self.has(Bug::QueueRecordLastWriter) {
            NameMerge::LastWriter
        } else {
            NameMerge::Join
        }
    }

    fn decided(&self, record: &NameRecord) -> Option<Proposal> {
        let quorum = if self.has(Bug::CreateWithoutQuorum) {
            1
        } else {
            VOTE_QUORUM
        };
        if record.deleted {
            None
        } else {
            record.decided_with(quorum)
        }
    }

    fn split(&self, record: &NameRecord) -> bool {
        !self.has(Bug::SplitEpochNeverEnds) && record.split()
    }

    /// The incarnation coordinator `c` draws for its proposal number `nonce`.
    fn draw(&self, c: usize, nonce: u8) -> Incarnation {
        if self.has(Bug::IncarnationFromClock) {
            Incarnation::default()
        } else {
            Incarnation {
                coordinator: c as u8,
                nonce,
            }
        }
    }

    /// The key a message of `incarnation` is stored under.
    fn key(&self, incarnation: Incarnation) -> Key {
        if self.has(Bug::KeyWithoutIncarnation) {
            Key::NameOnly
        } else {
            Key::Incarnation(incarnation)
        }
    }

    fn attributes(&self, c: usize) -> u8 {
        if c == 0 { 0 } else { self.attributes_c1 }
    }
}

/// A stored message's key (the queue name and the message id are the same for all messages of
/// the model's one name, so only what follows them is kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Incarnation(Incarnation),
    /// Planted bug only.
    NameOnly,
}

/// An acknowledged message: durable under `key` (part 1's send), with the ghost of the
/// incarnation its send was acknowledged into (named by epoch too, so that two incarnations
/// whose ids a planted bug draws alike are still told apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stored {
    pub key: Key,
    pub sent_to: View,
}

/// What a coordinator's local view says the name is: the incarnation of an epoch it learnt
/// from a settled read. It may lag (a delete through another coordinator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct View {
    pub epoch: u8,
    pub incarnation: Incarnation,
}

/// What a read of the name is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// `proposed`: the incarnation this create proposed, once it voted (ghost for the
    /// scenarios: a create that proposed and lost).
    Create {
        attributes: u8,
        proposed: Option<Incarnation>,
    },
    Delete,
    /// `acknowledged_before`: ghost, the epochs acknowledged when the send started.
    Send {
        acknowledged_before: u8,
    },
    /// As for `Send`.
    Receive {
        acknowledged_before: u8,
    },
}

/// What a coordinator is doing. Each phase waits for replies tagged with its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Idle,
    Read {
        purpose: Purpose,
        replies: [Option<NameRecord>; REPLICAS],
    },
    /// Writing `record` back until two replicas hold it, before acting on it.
    Settle {
        purpose: Purpose,
        record: NameRecord,
        acks: u8,
    },
    /// Asking for votes on `proposal` in `epoch`; each reply is the replica's record after it.
    Vote {
        proposal: Proposal,
        epoch: u8,
        replies: [Option<NameRecord>; REPLICAS],
    },
    /// Writing the tombstone of `epoch`.
    Tombstone {
        epoch: u8,
        acks: u8,
    },
}

/// A node serving one client operation at a time, with its local view of the name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    pub round: u8,
    pub op: Op,
    pub view: Option<View>,
    /// Proposals drawn so far (the nonce of the next incarnation).
    pub proposals: u8,
}

/// A request in flight from a coordinator to a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    Read,
    /// Vote for `proposal` in `epoch` unless this replica already voted in it.
    Vote {
        proposal: Proposal,
        epoch: u8,
    },
    /// Merge `record` in and ack.
    Write {
        record: NameRecord,
    },
    /// Merge the tombstone of `epoch` in and ack.
    Tombstone {
        epoch: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub replica: u8,
    pub coordinator: u8,
    pub round: u8,
    pub request: Request,
}

/// A replica's answer, which reaches its coordinator in the step that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    Record(NameRecord),
    Ack,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    pub up: bool,
    pub record: NameRecord,
}

/// Broken invariants, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two incarnations of one epoch were acknowledged (to a create, or by taking a send).
    TwoIncarnationsAcknowledged = 0,
    /// A create answered success for an incarnation with other attributes than it asked for.
    CreateAnsweredOtherAttributes = 1,
    /// A receive delivered a message sent to another incarnation.
    DeliveredFromOtherIncarnation = 2,
    HealStuck = 3,
    /// A send or receive answered `QueueDoesNotExist` although an incarnation acknowledged
    /// before it started was never reached by a delete.
    MissingAfterAcknowledged = 4,
}

/// Scenarios the checks must reach, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A create that proposed and lost answered success (the attributes agreed).
    LoserAgreed = 0,
    /// A create that proposed and lost answered `QueueNameExists`.
    LoserRefused = 1,
    /// A send was acknowledged into an incarnation whose delete had been acknowledged.
    SendAfterDelete = 2,
    /// An incarnation of a later epoch was acknowledged while a predecessor's message is stored.
    Recreated = 3,
    /// A receive in one incarnation passed over a stored message of another.
    OtherIncarnationSkipped = 4,
    /// A create found its epoch split three ways and proposed in the next one.
    SplitEpochLeft = 5,
    /// A read acted on only after writing back a decision no two replicas of its quorum held.
    SettledByRead = 6,
    /// A send through coordinator 0 went into an incarnation coordinator 1 drew (coordinator 0
    /// lost the race, or never proposed).
    SentIntoOthersIncarnation = 7,
    /// A create was acknowledged in an epoch that a collection had compacted a tombstone into.
    RecreatedAfterCollection = 8,
    /// A replica's tombstone of an epoch reached (by anti-entropy or a write) a replica that a
    /// collection had already moved to a later epoch, and was outranked there.
    StragglerOutranked = 9,
}

/// What only the model knows: what clients were told, and what went wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// (epoch, incarnation) acknowledged to a create or by an acknowledged send, sorted.
    pub acknowledged: Vec<(u8, Incarnation)>,
    /// Epochs whose tombstone reached some replica (a delete took effect), bitmask.
    pub tombstoned: u8,
    /// Epochs whose delete was acknowledged, bitmask.
    pub deletes_acked: u8,
    pub violations: u8,
    pub scenarios: u16,
    /// Epochs a collection's empty record reached some replica in, bitmask.
    pub compacted: u8,
}

impl Ghost {
    fn violate(&mut self, violation: Violation) {
        self.violations |= 1 << violation as u8;
    }

    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u8;
    }

    /// Whether `violation` happened on the way to this state.
    pub fn violated(&self, violation: Violation) -> bool {
        self.violations & (1 << violation as u8) != 0
    }

    /// Whether `scenario` happened on the way to this state.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u8) != 0
    }

    /// The epochs with an acknowledged incarnation, as a bitmask.
    fn acknowledged_epochs(&self) -> u8 {
        self.acknowledged
            .iter()
            .fold(0, |mask, (epoch, _)| mask | bit(*epoch as usize))
    }

    /// A send or receive that started when the epochs `acknowledged_before` were acknowledged
    /// answers `QueueDoesNotExist`.
    fn answer_missing(&mut self, acknowledged_before: u8) {
        if acknowledged_before & !self.tombstoned != 0 {
            self.violate(Violation::MissingAfterAcknowledged);
        }
    }

    /// A client was told that `incarnation` is the name's incarnation of `epoch`.
    fn acknowledge(&mut self, epoch: u8, incarnation: Incarnation) {
        if self
            .acknowledged
            .iter()
            .any(|(e, i)| *e == epoch && *i != incarnation)
        {
            self.violate(Violation::TwoIncarnationsAcknowledged);
        }
        if let Err(at) = self.acknowledged.binary_search(&(epoch, incarnation)) {
            self.acknowledged.insert(at, (epoch, incarnation));
        }
    }
}

/// Budget spent so far (the boundary compares it with `Config`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub creates: u8,
    pub deletes: u8,
    pub sends: u8,
    pub receives: u8,
    pub faults: u8,
    pub anti_entropy: u8,
    pub collections: u8,
}

/// The whole system: the name's replicas, the coordinators, the network, the stored messages
/// and the ghost.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replicas: [Replica; REPLICAS],
    pub coordinators: [Coordinator; COORDINATORS],
    /// A multiset, kept sorted so equal states hash equal.
    pub network: Vec<Packet>,
    /// Acknowledged messages, sorted.
    pub messages: Vec<Stored>,
    pub used: Used,
    pub ghost: Ghost,
    /// The heal schedule ran; nothing happens afterwards.
    pub healed: bool,
}

/// The replicas whose reply was `merged` itself, as a bitmask.
fn holders(replies: &[Option<NameRecord>; REPLICAS], merged: NameRecord) -> u8 {
    (0..REPLICAS)
        .filter(|r| replies[*r] == Some(merged))
        .fold(0, |mask, r| mask | bit(r))
}

impl State {
    /// The initial states of `config.start`.
    pub fn initial(config: &Config) -> Vec<State> {
        let replica = Replica {
            up: true,
            record: NameRecord::default(),
        };
        let coordinator = Coordinator {
            round: 0,
            op: Op::Idle,
            view: None,
            proposals: 0,
        };
        let mut state = State {
            replicas: [replica.clone(), replica.clone(), replica],
            coordinators: [coordinator.clone(), coordinator],
            network: Vec::new(),
            messages: Vec::new(),
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        };
        if config.start == Start::Racing {
            for c in 0..COORDINATORS {
                state.propose(config, c, config.attributes(c), 0);
            }
            state.normalize(config);
        }
        if config.start == Start::Created {
            let incarnation = config.draw(0, 0);
            let proposal = Proposal {
                incarnation,
                attributes: 0,
            };
            for replica in &mut state.replicas {
                replica.record.votes = [Some(proposal); REPLICAS];
            }
            state.coordinators[0].proposals = 1;
            let view = View {
                epoch: 0,
                incarnation,
            };
            for coordinator in &mut state.coordinators {
                coordinator.view = Some(view);
            }
            state.ghost.acknowledge(0, incarnation);
            state.messages.push(Stored {
                key: config.key(incarnation),
                sent_to: view,
            });
        }
        vec![state]
    }

    /// The join of every replica's record: what the cluster knows.
    pub fn joined(&self) -> NameRecord {
        join_all(self.replicas.iter().map(|r| r.record))
    }

    /// Whether every acknowledged incarnation whose epoch no delete reached is the live
    /// incarnation of the join of every two replicas (what any read quorum would see).
    pub fn acknowledged_visible(&self) -> bool {
        self.ghost
            .acknowledged
            .iter()
            .filter(|(epoch, _)| self.ghost.tombstoned & bit(*epoch as usize) == 0)
            .all(|(epoch, incarnation)| {
                (0..REPLICAS).all(|a| {
                    (a + 1..REPLICAS).all(|b| {
                        let seen = join_all([self.replicas[a].record, self.replicas[b].record]);
                        seen.epoch == *epoch
                            && seen.live().map(|p| p.incarnation) == Some(*incarnation)
                    })
                })
            })
    }

    fn push(&mut self, packet: Packet) {
        push_sorted(&mut self.network, packet);
    }

    fn broadcast(&mut self, c: usize, request: Request) {
        let round = self.coordinators[c].round;
        for replica in 0..REPLICAS {
            self.push(Packet {
                replica: replica as u8,
                coordinator: c as u8,
                round,
                request,
            });
        }
    }

    fn begin(&mut self, c: usize, op: Op) {
        let coordinator = &mut self.coordinators[c];
        coordinator.round += 1;
        coordinator.op = op;
    }

    fn finish(&mut self, c: usize) {
        self.coordinators[c].op = Op::Idle;
    }

    // ----- operations started by clients -----------------------------------------------------

    /// A client creates the name through `c`: the read that comes first.
    pub fn start_create(&mut self, config: &Config, c: usize) {
        self.used.creates += 1;
        self.start_read(
            c,
            Purpose::Create {
                attributes: config.attributes(c),
                proposed: None,
            },
        );
    }

    /// A client deletes the queue through `c`.
    pub fn start_delete(&mut self, c: usize) {
        self.used.deletes += 1;
        self.start_read(c, Purpose::Delete);
    }

    /// A client sends through `c`: with a local view, straight into its incarnation; without
    /// one, after a read (a local miss asks a quorum).
    pub fn start_send(&mut self, config: &Config, c: usize) {
        self.used.sends += 1;
        let acknowledged_before = self.ghost.acknowledged_epochs();
        match self.coordinators[c].view {
            Some(view) => self.store_message(config, view),
            None if config.has(Bug::LocalMissAnswersMissing) => {
                self.ghost.answer_missing(acknowledged_before);
            }
            None => self.start_read(
                c,
                Purpose::Send {
                    acknowledged_before,
                },
            ),
        }
    }

    /// A client receives through `c`, from the incarnation of its view, or after a read.
    pub fn start_receive(&mut self, config: &Config, c: usize) {
        self.used.receives += 1;
        let acknowledged_before = self.ghost.acknowledged_epochs();
        match self.coordinators[c].view {
            Some(view) => self.receive_from(config, view),
            None => self.start_read(
                c,
                Purpose::Receive {
                    acknowledged_before,
                },
            ),
        }
    }

    fn start_read(&mut self, c: usize, purpose: Purpose) {
        self.begin(
            c,
            Op::Read {
                purpose,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(c, Request::Read);
    }

    /// The view expires (or the node restarts): the next send or receive reads again.
    pub fn forget_view(&mut self, c: usize) {
        self.coordinators[c].view = None;
    }

    /// The coordinator timed out or crashed: its client learns nothing more.
    pub fn abandon(&mut self, c: usize) {
        self.finish(c);
    }

    /// Whether `c` is in a write phase (a timeout in a read phase equals never starting).
    pub fn writing(&self, c: usize) -> bool {
        matches!(
            self.coordinators[c].op,
            Op::Settle { .. } | Op::Vote { .. } | Op::Tombstone { .. }
        )
    }

    /// Part 1's send, reduced to its outcome: the message is durable under the key of `view`'s
    /// incarnation and the send is acknowledged.
    fn store_message(&mut self, config: &Config, view: View) {
        if self.ghost.deletes_acked & bit(view.epoch as usize) != 0 {
            self.ghost.reach(Scenario::SendAfterDelete);
        }
        if view.incarnation.coordinator != SENDER as u8 {
            self.ghost.reach(Scenario::SentIntoOthersIncarnation);
        }
        self.ghost.acknowledge(view.epoch, view.incarnation);
        let stored = Stored {
            key: config.key(view.incarnation),
            sent_to: view,
        };
        let at = self.messages.partition_point(|m| *m <= stored);
        self.messages.insert(at, stored);
    }

    /// A receive in the incarnation of `view` delivers what is stored under its key.
    fn receive_from(&mut self, config: &Config, view: View) {
        let key = config.key(view.incarnation);
        for stored in self.messages.clone() {
            if stored.key == key {
                if stored.sent_to != view {
                    self.ghost.violate(Violation::DeliveredFromOtherIncarnation);
                }
            } else if stored.sent_to != view {
                self.ghost.reach(Scenario::OtherIncarnationSkipped);
            }
        }
    }

    // ----- faults and background work --------------------------------------------------------

    pub fn crash(&mut self, r: usize) {
        self.used.faults += 1;
        self.replicas[r].up = false;
    }

    pub fn restart(&mut self, r: usize) {
        self.replicas[r].up = true;
    }

    pub fn drop_packet(&mut self, index: usize) {
        self.used.faults += 1;
        self.network.remove(index);
    }

    pub fn duplicate_packet(&mut self, index: usize) {
        self.used.faults += 1;
        let packet = self.network[index];
        self.push(packet);
    }

    /// Whether the packet at `index` can be delivered now (its replica is up).
    pub fn deliverable(&self, index: usize) -> bool {
        self.replicas[self.network[index].replica as usize].up
    }

    /// Replica `from` pushes its record to replica `to`, which merges it.
    pub fn anti_entropy(&mut self, config: &Config, from: usize, to: usize) {
        let incoming = self.replicas[from].record;
        self.note_straggler(incoming, to);
        let held = &mut self.replicas[to].record;
        *held = held.merge(incoming, config.merge_rule());
    }

    /// A tombstone arriving at a replica already in a compacted later epoch.
    fn note_straggler(&mut self, incoming: NameRecord, to: usize) {
        let held = self.replicas[to].record;
        if incoming.deleted
            && held.epoch > incoming.epoch
            && self.ghost.compacted & bit(held.epoch as usize) != 0
        {
            self.ghost.reach(Scenario::StragglerOutranked);
        }
    }

    /// Whether replica `r` may collect the name: it is up and its record is a tombstone (under
    /// the planted bug, any record with a live incarnation).
    pub fn collectable(&self, config: &Config, r: usize) -> bool {
        let replica = &self.replicas[r];
        replica.up
            && if config.has(Bug::CollectWithoutTombstone) {
                replica.record.live().is_some()
            } else {
                replica.record.deleted
            }
    }

    /// Collection of the name's tombstone as the candidate answer to finding N1 has it: replica
    /// `r`, reading its own record (the tombstone of epoch `e`), writes the empty record of
    /// epoch `e + 1` to the three replicas, an ordinary merge nobody awaits. No read of all
    /// three and no horizon: the write only raises the epoch, as a create after the delete would.
    pub fn collect(&mut self, r: usize) {
        self.used.collections += 1;
        let record = NameRecord {
            epoch: self.replicas[r].record.epoch + 1,
            ..NameRecord::default()
        };
        for replica in 0..REPLICAS {
            // Round 0 of coordinator 0 is never an awaited round of a busy coordinator.
            self.push(Packet {
                replica: replica as u8,
                coordinator: 0,
                round: 0,
                request: Request::Write { record },
            });
        }
    }

    /// Whether an anti-entropy push from `from` to `to` would change anything, as the digests
    /// tell it.
    pub fn anti_entropy_useful(&self, config: &Config, from: usize, to: usize) -> bool {
        let (f, t) = (&self.replicas[from], &self.replicas[to]);
        if !f.up || !t.up {
            return false;
        }
        if config.has(Bug::DigestWithoutVotes)
            && (f.record.epoch, f.record.deleted) == (t.record.epoch, t.record.deleted)
        {
            return false;
        }
        t.record.merge(f.record, config.merge_rule()) != t.record
    }

    // ----- replicas --------------------------------------------------------------------------

    /// Delivers the packet at `index` to its replica, whose reply reaches the coordinator.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        let r = packet.replica as usize;
        let held = self.replicas[r].record;
        let reply = match packet.request {
            Request::Read => Reply::Record(held),
            Request::Vote { proposal, epoch } => {
                // One vote per replica per epoch: the replica votes if it is behind (an older
                // epoch) or has not voted in this one; otherwise it refuses, and its record
                // tells the coordinator who it voted for.
                let mut record = held;
                if held.epoch < epoch {
                    record = NameRecord {
                        epoch,
                        ..NameRecord::default()
                    };
                }
                if record.epoch == epoch && !record.deleted && record.votes[r].is_none() {
                    record.votes[r] = Some(proposal);
                    self.replicas[r].record = record;
                }
                Reply::Record(self.replicas[r].record)
            }
            Request::Write { record } => {
                self.note_straggler(record, r);
                let merged = held.merge(record, config.merge_rule());
                if merged != held
                    && record
                        == (NameRecord {
                            epoch: record.epoch,
                            ..NameRecord::default()
                        })
                    && record.epoch > held.epoch
                {
                    // Only a collection writes an empty record of a later epoch.
                    self.ghost.compacted |= bit(record.epoch as usize);
                }
                self.replicas[r].record = merged;
                Reply::Ack
            }
            Request::Tombstone { epoch } => {
                self.ghost.tombstoned |= bit(epoch as usize);
                let tombstone = NameRecord {
                    epoch,
                    deleted: true,
                    ..NameRecord::default()
                };
                self.note_straggler(tombstone, r);
                self.replicas[r].record = held.merge(tombstone, config.merge_rule());
                Reply::Ack
            }
        };
        self.on_reply(config, &packet, reply);
    }

    // ----- coordinators ----------------------------------------------------------------------

    fn on_reply(&mut self, config: &Config, packet: &Packet, reply: Reply) {
        let c = packet.coordinator as usize;
        if self.coordinators[c].round != packet.round {
            return;
        }
        let r = packet.replica as usize;
        match (self.coordinators[c].op, reply) {
            (
                Op::Read {
                    purpose,
                    mut replies,
                },
                Reply::Record(record),
            ) => {
                replies[r] = Some(record);
                self.coordinators[c].op = Op::Read { purpose, replies };
                if replies.iter().flatten().count() >= READ_QUORUM {
                    let merged = join_all(replies.iter().flatten().copied());
                    let holding = holders(&replies, merged);
                    self.settle(config, c, purpose, merged, holding);
                }
            }
            (
                Op::Settle {
                    purpose,
                    record,
                    mut acks,
                },
                Reply::Ack,
            ) => {
                acks |= bit(r);
                self.coordinators[c].op = Op::Settle {
                    purpose,
                    record,
                    acks,
                };
                if count(acks) >= WRITE_QUORUM {
                    self.act(config, c, purpose, record);
                }
            }
            (
                Op::Vote {
                    proposal,
                    epoch,
                    mut replies,
                },
                Reply::Record(record),
            ) => {
                replies[r] = Some(record);
                self.coordinators[c].op = Op::Vote {
                    proposal,
                    epoch,
                    replies,
                };
                self.count_votes(config, c);
            }
            (Op::Tombstone { epoch, mut acks }, Reply::Ack) => {
                acks |= bit(r);
                self.coordinators[c].op = Op::Tombstone { epoch, acks };
                if count(acks) >= WRITE_QUORUM {
                    self.ghost.deletes_acked |= bit(epoch as usize);
                    self.coordinators[c].view = None;
                    self.finish(c);
                }
            }
            _ => {}
        }
    }

    /// The settle rule: act on `merged` only once two replicas hold it. The replicas whose
    /// reply was `merged` itself (`holding`) already do; if they are fewer than two, `merged` is
    /// written to the others first.
    fn settle(
        &mut self,
        config: &Config,
        c: usize,
        purpose: Purpose,
        merged: NameRecord,
        holding: u8,
    ) {
        if count(holding) >= WRITE_QUORUM || config.has(Bug::ActBeforeSettled) {
            self.act(config, c, purpose, merged);
            return;
        }
        if matches!(self.coordinators[c].op, Op::Read { .. }) {
            self.ghost.reach(Scenario::SettledByRead);
        }
        self.begin(
            c,
            Op::Settle {
                purpose,
                record: merged,
                acks: holding,
            },
        );
        let round = self.coordinators[c].round;
        for replica in (0..REPLICAS).filter(|r| holding & bit(*r) == 0) {
            self.push(Packet {
                replica: replica as u8,
                coordinator: c as u8,
                round,
                request: Request::Write { record: merged },
            });
        }
    }

    /// Acts on a settled record of the name.
    fn act(&mut self, config: &Config, c: usize, purpose: Purpose, record: NameRecord) {
        let live = config.decided(&record);
        let view = live.map(|p| View {
            epoch: record.epoch,
            incarnation: p.incarnation,
        });
        match purpose {
            Purpose::Create {
                attributes,
                proposed,
            } => {
                if let Some(winner) = live {
                    self.answer_create(config, c, attributes, proposed, record.epoch, winner);
                } else if record.deleted || config.split(&record) {
                    if record.split() {
                        self.ghost.reach(Scenario::SplitEpochLeft);
                    }
                    self.propose(config, c, attributes, record.epoch + 1);
                } else {
                    self.propose(config, c, attributes, record.epoch);
                }
            }
            Purpose::Delete => {
                self.coordinators[c].view = None;
                if live.is_some() {
                    let epoch = record.epoch;
                    self.begin(c, Op::Tombstone { epoch, acks: 0 });
                    self.broadcast(c, Request::Tombstone { epoch });
                } else {
                    // Already deleted (success) or never created (`QueueDoesNotExist`).
                    self.finish(c);
                }
            }
            Purpose::Send {
                acknowledged_before,
            } => {
                self.coordinators[c].view = view;
                match view {
                    Some(view) => self.store_message(config, view),
                    None => self.ghost.answer_missing(acknowledged_before),
                }
                self.finish(c);
            }
            Purpose::Receive {
                acknowledged_before,
            } => {
                self.coordinators[c].view = view;
                match view {
                    Some(view) => self.receive_from(config, view),
                    None => self.ghost.answer_missing(acknowledged_before),
                }
                self.finish(c);
            }
        }
    }

    fn answer_create(
        &mut self,
        config: &Config,
        c: usize,
        attributes: u8,
        proposed: Option<Incarnation>,
        epoch: u8,
        winner: Proposal,
    ) {
        self.coordinators[c].view = Some(View {
            epoch,
            incarnation: winner.incarnation,
        });
        let lost = proposed.is_some_and(|mine| mine != winner.incarnation);
        let agree = winner.attributes == attributes;
        if agree || config.has(Bug::LoserAnswersSuccess) {
            if !agree {
                self.ghost.violate(Violation::CreateAnsweredOtherAttributes);
            }
            if lost {
                self.ghost.reach(Scenario::LoserAgreed);
            }
            if self.messages.iter().any(|m| m.sent_to.epoch < epoch) {
                self.ghost.reach(Scenario::Recreated);
            }
            if self.ghost.compacted & bit(epoch as usize) != 0 {
                self.ghost.reach(Scenario::RecreatedAfterCollection);
            }
            self.ghost.acknowledge(epoch, winner.incarnation);
        } else if lost {
            // `QueueNameExists`.
            self.ghost.reach(Scenario::LoserRefused);
        }
        self.finish(c);
    }

    fn propose(&mut self, config: &Config, c: usize, attributes: u8, epoch: u8) {
        let nonce = self.coordinators[c].proposals;
        self.coordinators[c].proposals += 1;
        let proposal = Proposal {
            incarnation: config.draw(c, nonce),
            attributes,
        };
        self.begin(
            c,
            Op::Vote {
                proposal,
                epoch,
                replies: [None; REPLICAS],
            },
        );
        self.broadcast(c, Request::Vote { proposal, epoch });
    }

    /// A vote reply came: decide when the replies show the epoch's incarnation, give the epoch
    /// up when they show it split, wait otherwise.
    fn count_votes(&mut self, config: &Config, c: usize) {
        let Op::Vote {
            proposal,
            epoch,
            replies,
        } = self.coordinators[c].op
        else {
            unreachable!("votes are counted only in the vote phase");
        };
        let merged = join_all(replies.iter().flatten().copied());
        let purpose = Purpose::Create {
            attributes: proposal.attributes,
            proposed: Some(proposal.incarnation),
        };
        if merged.epoch != epoch || merged.deleted {
            // The name moved on (deleted, or a later epoch): the create fails; the client
            // retries.
            self.finish(c);
        } else if config.decided(&merged).is_some() {
            let holding = holders(&replies, merged);
            self.settle(config, c, purpose, merged, holding);
        } else if config.split(&merged) {
            self.ghost.reach(Scenario::SplitEpochLeft);
            self.propose(config, c, proposal.attributes, epoch + 1);
        }
    }
}

impl State {
    /// Whether delivering `packet` could still change anything: its coordinator awaits its
    /// reply, or it would change its replica's record. Records only grow, so a request that
    /// would change nothing now never will.
    fn alive(&self, config: &Config, packet: &Packet) -> bool {
        let coordinator = &self.coordinators[packet.coordinator as usize];
        let awaited = coordinator.round == packet.round
            && matches!(
                (packet.request, coordinator.op),
                (Request::Read, Op::Read { .. })
                    | (Request::Vote { .. }, Op::Vote { .. })
                    | (Request::Write { .. }, Op::Settle { .. })
                    | (Request::Tombstone { .. }, Op::Tombstone { .. })
            );
        let held = self.replicas[packet.replica as usize].record;
        let changes = match packet.request {
            Request::Read => false,
            Request::Vote { epoch, .. } => {
                held.epoch < epoch
                    || (held.epoch == epoch
                        && !held.deleted
                        && held.votes[packet.replica as usize].is_none())
            }
            Request::Write { record } => held.merge(record, config.merge_rule()) != held,
            Request::Tombstone { epoch } => {
                let tombstone = NameRecord {
                    epoch,
                    deleted: true,
                    ..NameRecord::default()
                };
                held.merge(tombstone, config.merge_rule()) != held
            }
        };
        awaited || changes
    }

    /// Removes dead packets (delivering them is a no-op, so this changes no behaviour) and
    /// renumbers rounds to "current" (1) and "older" (0), so equal situations are equal states.
    pub fn normalize(&mut self, config: &Config) {
        let network = std::mem::take(&mut self.network);
        let mut network: Vec<Packet> = network
            .into_iter()
            .filter(|p| self.alive(config, p))
            .collect();
        for packet in &mut network {
            let coordinator = &self.coordinators[packet.coordinator as usize];
            let current = !matches!(coordinator.op, Op::Idle) && packet.round == coordinator.round;
            if current {
                packet.round = 1;
            } else {
                packet.round = 0;
                packet.coordinator = 0;
            }
        }
        network.sort();
        self.network = network;
        for c in 0..COORDINATORS {
            let busy = !matches!(self.coordinators[c].op, Op::Idle);
            self.coordinators[c].round = u8::from(busy);
            // A view only serves sends and receives: once neither can start again, it is
            // forgotten, so states that differ only in it are one state.
            if !self.healed && !self.view_used(config, c) {
                self.coordinators[c].view = None;
            }
        }
    }

    /// Whether coordinator `c` may still start an operation that uses its view.
    fn view_used(&self, config: &Config, c: usize) -> bool {
        match c {
            SENDER => self.used.sends < config.sends_max,
            _ => self.used.receives < config.receives_max,
        }
    }

    // ----- heal: the fair schedule that liveness is checked on -------------------------------

    /// Faults stop: every replica comes back, packets in flight are delivered (or, with
    /// `deliver_pending = false`, were all lost), operations that cannot finish time out,
    /// anti-entropy runs between every pair until nothing changes, and a client creates the
    /// name through coordinator 0 until it is live (at most [`HEAL_CREATES_MAX`] creates).
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        let mut steps = 0u32;
        for replica in &mut self.replicas {
            replica.up = true;
        }
        if !deliver_pending {
            self.network.clear();
        }
        self.heal_network(config, &mut steps);
        self.heal_anti_entropy(config, &mut steps);
        for _ in 0..HEAL_CREATES_MAX {
            if self.joined().live().is_some() {
                break;
            }
            self.start_create(config, 0);
            self.heal_network(config, &mut steps);
            self.heal_anti_entropy(config, &mut steps);
        }
        if steps > HEAL_STEPS_MAX {
            self.ghost.violate(Violation::HealStuck);
        }
        self.normalize(config);
        self.healed = true;
    }

    fn heal_network(&mut self, config: &Config, steps: &mut u32) {
        while !self.network.is_empty() && *steps <= HEAL_STEPS_MAX {
            self.deliver(config, 0);
            *steps += 1;
        }
        for c in 0..COORDINATORS {
            self.abandon(c);
        }
    }

    fn heal_anti_entropy(&mut self, config: &Config, steps: &mut u32) {
        loop {
            let mut changed = false;
            for from in 0..REPLICAS {
                for to in 0..REPLICAS {
                    if from != to && self.anti_entropy_useful(config, from, to) {
                        self.anti_entropy(config, from, to);
                        changed = true;
                        *steps += 1;
                    }
                }
            }
            if !changed || *steps > HEAL_STEPS_MAX {
                return;
            }
        }
    }
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Deliver the packet at this index of the (sorted) network.
    Deliver(u8),
    Drop(u8),
    Duplicate(u8),
    Crash(u8),
    Restart(u8),
    /// A coordinator times out or crashes in a write phase.
    Abandon(u8),
    Create(u8),
    /// Coordinator 1 deletes the queue.
    Delete,
    /// Coordinator 0 sends a message.
    Send,
    /// Coordinator 1 receives.
    Receive,
    /// A coordinator's local view expires.
    ForgetView(u8),
    /// Replicas `a` and `b` exchange records and both keep the merge.
    AntiEntropy {
        a: u8,
        b: u8,
    },
    /// Replica `r` collects the name's tombstone it holds.
    Collect(u8),
    Heal {
        deliver_pending: bool,
    },
}

/// The coordinator that sends (the other one deletes and receives).
const SENDER: usize = 0;
const DELETER: usize = 1;

/// The model of section 1 under one configuration.
#[derive(Clone, Debug)]
pub struct QueuesModel {
    /// Bounds and planted bug of this run.
    pub config: Config,
}

impl QueuesModel {
    /// The model of `config`.
    pub fn new(config: Config) -> QueuesModel {
        QueuesModel { config }
    }
}

impl Model for QueuesModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        State::initial(&self.config)
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let (config, used) = (&self.config, &state.used);
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
        for (r, replica) in state.replicas.iter().enumerate() {
            if replica.up && fault {
                actions.push(Action::Crash(r as u8));
            }
            if !replica.up {
                actions.push(Action::Restart(r as u8));
            }
        }
        for (c, coordinator) in state.coordinators.iter().enumerate() {
            // A sender that sends only through its view keeps it (forgetting it would only
            // disable the send).
            let forgettable = !(c == SENDER && config.sends_through_view_only);
            if coordinator.view.is_some() && forgettable && state.view_used(config, c) {
                actions.push(Action::ForgetView(c as u8));
            }
            if !matches!(coordinator.op, Op::Idle) {
                if state.writing(c) {
                    actions.push(Action::Abandon(c as u8));
                }
                continue;
            }
            if config.creators & bit(c) != 0 && used.creates < config.creates_max {
                actions.push(Action::Create(c as u8));
            }
            if c == DELETER && used.receives < config.receives_max {
                actions.push(Action::Receive);
            }
            if c == SENDER
                && used.sends < config.sends_max
                && (coordinator.view.is_some() || !config.sends_through_view_only)
            {
                actions.push(Action::Send);
            }
            if c == DELETER && used.deletes < config.deletes_max {
                actions.push(Action::Delete);
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
        if used.collections < config.collections_max {
            for r in 0..REPLICAS {
                if state.collectable(config, r) {
                    actions.push(Action::Collect(r as u8));
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
            Action::Create(c) => state.start_create(config, c as usize),
            Action::Delete => state.start_delete(DELETER),
            Action::Send => state.start_send(config, SENDER),
            Action::Receive => state.start_receive(config, DELETER),
            Action::ForgetView(c) => state.forget_view(c as usize),
            Action::AntiEntropy { a, b } => {
                state.used.anti_entropy += 1;
                let (a, b) = (a as usize, b as usize);
                if state.anti_entropy_useful(config, a, b) {
                    state.anti_entropy(config, a, b);
                }
                if state.anti_entropy_useful(config, b, a) {
                    state.anti_entropy(config, b, a);
                }
            }
            Action::Collect(r) => state.collect(r as usize),
            Action::Heal { deliver_pending } => state.heal(config, deliver_pending),
        }
        state.normalize(config);
        Some(state)
    }

    /// The bound of the search: the budgets of `Config`. A healed state is terminal and its
    /// schedule is not budgeted.
    fn within_boundary(&self, state: &State) -> bool {
        let (config, used) = (&self.config, &state.used);
        state.healed
            || (used.creates <= config.creates_max
                && used.deletes <= config.deletes_max
                && used.sends <= config.sends_max
                && used.receives <= config.receives_max
                && used.faults <= config.faults_max
                && used.anti_entropy <= config.anti_entropy_max
                && used.collections <= config.collections_max)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one incarnation of an epoch is acknowledged",
                |_, s: &State| !s.ghost.violated(Violation::TwoIncarnationsAcknowledged),
            ),
            Property::always(
                "a create answers success only for the attributes it asked for",
                |_, s: &State| !s.ghost.violated(Violation::CreateAnsweredOtherAttributes),
            ),
            Property::always(
                "an acknowledged incarnation is seen by every read quorum until its delete",
                |_, s: &State| s.acknowledged_visible(),
            ),
            Property::always(
                "a message is delivered only from the incarnation it was sent to",
                |_, s: &State| !s.ghost.violated(Violation::DeliveredFromOtherIncarnation),
            ),
            Property::always(
                "a local miss never reports an acknowledged queue missing",
                |_, s: &State| !s.ghost.violated(Violation::MissingAfterAcknowledged),
            ),
            Property::always("after heal, replicas converge", |_, s: &State| {
                !s.healed || converged(s)
            }),
            Property::always(
                "after heal, the name has one live incarnation",
                |_, s: &State| {
                    !s.healed
                        || (!s.ghost.violated(Violation::HealStuck) && s.joined().live().is_some())
                },
            ),
            Property::sometimes(
                "two creates of one name race in one epoch",
                |_, s: &State| creates_race(s),
            ),
            Property::sometimes(
                "a losing create answered success (the attributes agree)",
                |_, s: &State| s.ghost.reached(Scenario::LoserAgreed),
            ),
            Property::sometimes(
                "a losing create answered QueueNameExists",
                |_, s: &State| s.ghost.reached(Scenario::LoserRefused),
            ),
            Property::sometimes(
                "a send through the losing coordinator went into the winner",
                |_, s: &State| s.ghost.reached(Scenario::SentIntoOthersIncarnation),
            ),
            Property::sometimes(
                "a send racing the delete was acknowledged after it",
                |_, s: &State| s.ghost.reached(Scenario::SendAfterDelete),
            ),
            Property::sometimes(
                "the name was recreated while a predecessor's message is stored",
                |_, s: &State| s.ghost.reached(Scenario::Recreated),
            ),
            Property::sometimes(
                "a receive passed over another incarnation's message",
                |_, s: &State| s.ghost.reached(Scenario::OtherIncarnationSkipped),
            ),
            Property::sometimes(
                "an epoch split three ways and a create moved to the next",
                |_, s: &State| s.ghost.reached(Scenario::SplitEpochLeft),
            ),
            Property::sometimes(
                "a read wrote a decision back before acting on it",
                |_, s: &State| s.ghost.reached(Scenario::SettledByRead),
            ),
            Property::sometimes(
                "the name was created again in the epoch a collection moved it to",
                |_, s: &State| s.ghost.reached(Scenario::RecreatedAfterCollection),
            ),
            Property::sometimes(
                "a straggler's tombstone was outranked by a collected epoch",
                |_, s: &State| s.ghost.reached(Scenario::StragglerOutranked),
            ),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ]
    }
}

/// Every replica holds the same record, nothing is in flight, and the heal schedule finished
/// within its step cap.
fn converged(s: &State) -> bool {
    let first = s.replicas[0].record;
    s.network.is_empty()
        && !s.ghost.violated(Violation::HealStuck)
        && s.replicas.iter().all(|r| r.up && r.record == first)
}

fn creates_race(s: &State) -> bool {
    match (s.coordinators[0].op, s.coordinators[1].op) {
        (Op::Vote { epoch: e0, .. }, Op::Vote { epoch: e1, .. }) => e0 == e1,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A proposal; an incarnation always comes with the same attributes, as in the protocol
    /// (one create draws it).
    fn proposal() -> impl Strategy<Value = Proposal> {
        (0u8..2, 0u8..2).prop_map(|(coordinator, nonce)| Proposal {
            incarnation: Incarnation { coordinator, nonce },
            attributes: coordinator ^ nonce,
        })
    }

    /// `b` as the protocol could produce it beside `a`: a slot that both hold a vote in holds
    /// the same vote (a replica votes once per epoch).
    fn beside(a: NameRecord, mut b: NameRecord) -> NameRecord {
        if a.epoch == b.epoch {
            for (mine, theirs) in b.votes.iter_mut().zip(a.votes) {
                if mine.is_some() && theirs.is_some() {
                    *mine = theirs;
                }
            }
        }
        b
    }

    fn record() -> impl Strategy<Value = NameRecord> {
        (
            0u8..3,
            proptest::array::uniform3(proptest::option::of(proposal())),
            any::<bool>(),
        )
            .prop_map(|(epoch, votes, deleted)| NameRecord {
                epoch,
                votes,
                deleted,
            })
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in record(), b in record()) {
            prop_assert_eq!(a.merge(b, NameMerge::Join), b.merge(a, NameMerge::Join));
        }

        #[test]
        fn merge_is_associative(a in record(), b in record(), c in record()) {
            let join = NameMerge::Join;
            prop_assert_eq!(a.merge(b, join).merge(c, join), a.merge(b.merge(c, join), join));
        }

        #[test]
        fn merge_is_idempotent(a in record(), b in record()) {
            let join = NameMerge::Join;
            prop_assert_eq!(a.merge(a, join), a);
            let joined = a.merge(b, join);
            prop_assert_eq!(joined.merge(b, join), joined);
        }

        #[test]
        fn a_decision_survives_every_merge(a in record(), b in record()) {
            // Once two votes are in a record, merging cannot take them out of its epoch.
            let b = beside(a, b);
            let joined = a.merge(b, NameMerge::Join);
            if joined.epoch == a.epoch && let Some(decided) = a.decided() {
                prop_assert_eq!(joined.decided(), Some(decided));
            }
        }
    }

    #[test]
    fn last_writer_merge_drops_a_decision() {
        let x = Proposal {
            incarnation: Incarnation {
                coordinator: 0,
                nonce: 0,
            },
            attributes: 0,
        };
        let y = Proposal {
            incarnation: Incarnation {
                coordinator: 1,
                nonce: 0,
            },
            attributes: 1,
        };
        let decided = NameRecord {
            epoch: 0,
            votes: [Some(x), Some(x), None],
            deleted: false,
        };
        let loser = NameRecord {
            epoch: 0,
            votes: [None, None, Some(y)],
            deleted: false,
        };
        assert_eq!(decided.merge(loser, NameMerge::Join).decided(), Some(x));
        assert_eq!(decided.merge(loser, NameMerge::LastWriter).decided(), None);
    }
}
