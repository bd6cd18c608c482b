//! The model of spec/replication.md#9-long-polling-across-nodes: a waiter on one node served by
//! a message sent through another, through the send coordinator's wake-up and the waiter's own
//! re-poll, never through anti-entropy.
//!
//! Three nodes, each a replica of the one message: node A (0) holds an open long poll, node B (1)
//! coordinates the send, node C (2) serves another consumer. Receives are part 1's (quorum read,
//! conditional claim, delivery after two acks). Ghost fields record what clients were told, so
//! the liveness claims can be stated on the healed state; the protocol never reads them. This
//! module owns the whole state machine of this section; it must never depend on the part-1
//! model (`protocol`).

use stateright::{Model, Property};

use super::net::{bit, push_sorted};

/// Replicas of the message; on three nodes every node is one.
pub const REPLICAS: usize = 3;
/// Acks a write needs.
pub const WRITE_QUORUM: usize = 2;
/// Replies a read needs.
pub const READ_QUORUM: usize = 2;
/// The node with the open long poll (the waiter).
pub const WAITER: usize = 0;
/// The node that coordinates the send.
pub const SENDER: usize = 1;
/// The node that serves another consumer's receive.
pub const OTHER: usize = 2;
/// Steps the heal schedule may take before it is declared stuck.
pub const HEAL_STEPS_MAX: u32 = 200;

/// A replica's record of the message, ordered as the merge: nothing, sent, claimed by a
/// receive of node `coordinator` (claims do not expire within a long poll in this model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Record {
    #[default]
    Absent,
    Ready,
    Claimed {
        coordinator: u8,
    },
}

/// A protocol rule switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The waiter's receive reads only its own replica (the single node's way of waiting).
    WaiterReadsOwnReplica,
    /// Waiters never re-poll: only a wake-up makes them receive.
    NoRepoll,
    /// The send's coordinator wakes the waiters when it starts the send, before the two acks.
    WakeUpBeforeAck,
    /// A wake-up that arrives while the waiter's receive is running is dropped instead of
    /// making it receive again.
    WakeUpIgnoredWhileReceiving,
}

/// Bounds and switches of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    /// Whether the waiter is already waiting when the send starts (else it may arrive later).
    pub waiting_at_start: bool,
    /// Re-polls of the waiter in the free phase.
    pub repolls_max: u8,
    /// Receives of the other consumer.
    pub other_receives_max: u8,
    /// Packets dropped.
    pub faults_max: u8,
    pub bug: Option<Bug>,
}

impl Config {
    /// Everything off. Configurations start from here.
    pub fn quiet(name: &'static str) -> Config {
        Config {
            name,
            waiting_at_start: true,
            repolls_max: 0,
            other_receives_max: 0,
            faults_max: 0,
            bug: None,
        }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
}

/// What a node is doing for its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Idle,
    Send { acks: u8 },
    ClaimRead { replies: [Option<Record>; REPLICAS] },
    ClaimWrite { acks: u8 },
}

/// The long poll on node A, as its client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiter {
    /// Not arrived yet.
    Before,
    /// Waiting; `again`: a wake-up arrived while a receive was running, so the node receives
    /// again when that receive ends empty.
    Open { again: bool },
    /// Answered with the message.
    Served,
}

/// A node: its round (replies of another round are ignored) and its operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub round: u8,
    pub op: Op,
}

/// Packets on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    Read,
    /// The send's write (acked).
    Write,
    /// Conditional claim: applied only to a replica that holds no claim.
    Claim,
    /// The send's coordinator tells node `to` that the queue has a new message.
    WakeUp,
}

/// A packet from node `from` (round `round`) to node `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub to: u8,
    pub from: u8,
    pub round: u8,
    pub message: Message,
}

/// Scenarios the checker must reach, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The waiter was served while its own replica did not hold the message.
    ServedPastLaggingReplica = 0,
    /// The waiter's claim lost to the other consumer's and the waiter went back to wait.
    LostRace = 1,
    /// The waiter was served by a re-poll after its wake-up was lost.
    ServedByRepoll = 2,
    /// A wake-up arrived while the waiter's receive was running.
    WokenWhileReceiving = 3,
}

/// What only the model knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The send was acknowledged.
    pub sent_acked: bool,
    /// A wake-up packet was dropped.
    pub wake_up_lost: bool,
    /// The other consumer was given the message.
    pub other_served: bool,
    pub scenarios: u8,
    /// The heal: the waiter was open when it began.
    pub open_at_heal: bool,
    /// The heal: the waiter was served before its re-poll.
    pub served_before_repoll: bool,
    /// The heal: before the re-poll, a claim not delivered to the waiter held the message.
    pub held_before_repoll: bool,
    /// The heal ran with every packet delivered (not lost).
    pub healed_delivering: bool,
    /// The heal exceeded its step cap.
    pub heal_stuck: bool,
}

impl Ghost {
    fn reach(&mut self, scenario: Scenario) {
        self.scenarios |= 1 << scenario as u8;
    }

    /// Whether `scenario` happened on the way to this state.
    pub fn reached(&self, scenario: Scenario) -> bool {
        self.scenarios & (1 << scenario as u8) != 0
    }
}

/// Budget spent so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Used {
    pub sends: u8,
    pub repolls: u8,
    pub other_receives: u8,
    pub faults: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replicas: [Record; REPLICAS],
    pub nodes: [Node; REPLICAS],
    pub waiter: Waiter,
    /// A multiset, kept sorted so equal states hash equal.
    pub network: Vec<Packet>,
    pub used: Used,
    pub ghost: Ghost,
    /// The heal schedule ran; nothing happens afterwards.
    pub healed: bool,
}

impl State {
    /// The initial state: nothing sent; the waiter waiting already (its first receive found the
    /// queue empty) or not yet arrived.
    pub fn initial(config: &Config) -> State {
        let idle = Node {
            round: 0,
            op: Op::Idle,
        };
        State {
            replicas: [Record::Absent; REPLICAS],
            nodes: [idle; REPLICAS],
            waiter: if config.waiting_at_start {
                Waiter::Open { again: false }
            } else {
                Waiter::Before
            },
            network: Vec::new(),
            used: Used::default(),
            ghost: Ghost::default(),
            healed: false,
        }
    }

    fn push(&mut self, packet: Packet) {
        push_sorted(&mut self.network, packet);
    }

    fn broadcast(&mut self, from: usize, message: Message) {
        let round = self.nodes[from].round;
        for to in 0..REPLICAS {
            self.push(Packet {
                to: to as u8,
                from: from as u8,
                round,
                message,
            });
        }
    }

    fn begin(&mut self, node: usize, op: Op) {
        self.nodes[node].round += 1;
        self.nodes[node].op = op;
    }

    fn wake_up(&mut self) {
        // The wake-up goes to every node with waiters on the queue; only A has one here.
        self.push(Packet {
            to: WAITER as u8,
            from: SENDER as u8,
            round: 0,
            message: Message::WakeUp,
        });
    }

    /// B sends the message: the write to all three, answered at two acks, then the wake-up.
    pub fn start_send(&mut self, config: &Config) {
        self.used.sends += 1;
        self.begin(SENDER, Op::Send { acks: 0 });
        self.broadcast(SENDER, Message::Write);
        if config.has(Bug::WakeUpBeforeAck) {
            self.wake_up();
        }
    }

    /// The long poll arrives at A: its first receive.
    pub fn arrive(&mut self, config: &Config) {
        self.waiter = Waiter::Open { again: false };
        self.start_receive(config, WAITER);
    }

    /// `node` runs an ordinary receive: part 1's quorum read.
    pub fn start_receive(&mut self, config: &Config, node: usize) {
        self.begin(
            node,
            Op::ClaimRead {
                replies: [None; REPLICAS],
            },
        );
        if node == WAITER && config.has(Bug::WaiterReadsOwnReplica) {
            let round = self.nodes[node].round;
            self.push(Packet {
                to: WAITER as u8,
                from: WAITER as u8,
                round,
                message: Message::Read,
            });
        } else {
            self.broadcast(node, Message::Read);
        }
    }

    /// The node's operation ends (answered, refused, or timed out).
    fn finish(&mut self, config: &Config, node: usize) {
        self.nodes[node].op = Op::Idle;
        if node == WAITER
            && let Waiter::Open { again: true } = self.waiter
        {
            // A wake-up came while this receive ran: the message it announced may have been
            // written after this receive read; receive again.
            self.waiter = Waiter::Open { again: false };
            self.start_receive(config, WAITER);
        }
    }

    /// The node times out in a write phase: its client is told nothing (a waiter keeps
    /// waiting).
    pub fn abandon(&mut self, config: &Config, node: usize) {
        if node == WAITER
            && matches!(self.nodes[node].op, Op::ClaimWrite { .. })
            && self.joined() > Record::Ready
            && self.joined() != (Record::Claimed { coordinator: 0 })
        {
            self.ghost.reach(Scenario::LostRace);
        }
        self.finish(config, node);
    }

    /// Whether `node` is in a write phase.
    pub fn writing(&self, node: usize) -> bool {
        matches!(self.nodes[node].op, Op::Send { .. } | Op::ClaimWrite { .. })
    }

    /// The join of every replica's record.
    pub fn joined(&self) -> Record {
        self.replicas.iter().copied().max().unwrap_or_default()
    }

    /// The liveness claims' exemption, for a waiter not served: a claim holds the message, and
    /// it was not delivered to the waiter (another consumer's, or one whose receive timed out
    /// after the claim landed, the waiter's own included). The message is visible again at
    /// that claim's deadline, and the next poll finds it.
    pub fn held_by_a_claim(&self) -> bool {
        matches!(self.joined(), Record::Claimed { .. })
    }

    /// The network loses the packet at `index` (a fault).
    pub fn drop_packet(&mut self, index: usize) {
        self.used.faults += 1;
        let packet = self.network.remove(index);
        if packet.message == Message::WakeUp {
            self.ghost.wake_up_lost = true;
        }
    }

    /// Delivers the packet at `index`; a reply reaches its node at once.
    pub fn deliver(&mut self, config: &Config, index: usize) {
        let packet = self.network.remove(index);
        let r = packet.to as usize;
        match packet.message {
            Message::Read => {
                let record = self.replicas[r];
                self.on_reply(config, packet, Some(record));
            }
            Message::Write => {
                self.replicas[r] = self.replicas[r].max(Record::Ready);
                self.on_reply(config, packet, None);
            }
            Message::Claim => {
                if self.replicas[r] <= Record::Ready {
                    self.replicas[r] = Record::Claimed {
                        coordinator: packet.from,
                    };
                    self.on_reply(config, packet, None);
                }
            }
            Message::WakeUp => self.on_wake_up(config),
        }
    }

    fn on_wake_up(&mut self, config: &Config) {
        let Waiter::Open { .. } = self.waiter else {
            // Nobody waits here any more: nothing to do.
            return;
        };
        if self.nodes[WAITER].op == Op::Idle {
            self.start_receive(config, WAITER);
        } else if !config.has(Bug::WakeUpIgnoredWhileReceiving) {
            self.ghost.reach(Scenario::WokenWhileReceiving);
            self.waiter = Waiter::Open { again: true };
        }
    }

    fn on_reply(&mut self, config: &Config, packet: Packet, record: Option<Record>) {
        let node = packet.from as usize;
        if self.nodes[node].round != packet.round {
            return;
        }
        let mut op = self.nodes[node].op;
        match (&mut op, record) {
            (Op::ClaimRead { replies }, Some(record)) => {
                replies[packet.to as usize] = Some(record);
                let have = replies.iter().flatten().count();
                let needed = if node == WAITER && config.has(Bug::WaiterReadsOwnReplica) {
                    1
                } else {
                    READ_QUORUM
                };
                let replies = *replies;
                self.nodes[node].op = op;
                if have >= needed {
                    self.decide(config, node, replies);
                }
            }
            (Op::Send { acks } | Op::ClaimWrite { acks }, None) => {
                *acks |= bit(packet.to as usize);
                let done = acks.count_ones() as usize >= WRITE_QUORUM;
                self.nodes[node].op = op;
                if done {
                    self.complete_write(config, node);
                }
            }
            _ => {}
        }
    }

    fn decide(&mut self, config: &Config, node: usize, replies: [Option<Record>; REPLICAS]) {
        // No read repair: it only speeds up what this model is about to show without it (a
        // waiter served past its lagging replica).
        let merged = replies.iter().flatten().copied().max().unwrap_or_default();
        if merged != Record::Ready {
            // Nothing visible: a waiter goes back to wait, another consumer gets an empty reply.
            self.finish(config, node);
            return;
        }
        self.begin(node, Op::ClaimWrite { acks: 0 });
        self.broadcast(node, Message::Claim);
    }

    fn complete_write(&mut self, config: &Config, node: usize) {
        match self.nodes[node].op {
            Op::Send { .. } => {
                self.ghost.sent_acked = true;
                if !config.has(Bug::WakeUpBeforeAck) {
                    self.wake_up();
                }
            }
            Op::ClaimWrite { .. } if node == WAITER => {
                if self.replicas[WAITER] < Record::Ready {
                    self.ghost.reach(Scenario::ServedPastLaggingReplica);
                }
                if self.ghost.wake_up_lost {
                    self.ghost.reach(Scenario::ServedByRepoll);
                }
                self.waiter = Waiter::Served;
            }
            Op::ClaimWrite { .. } => self.ghost.other_served = true,
            _ => unreachable!("complete_write is called only in write phases"),
        }
        self.nodes[node].op = Op::Idle;
    }

    /// Removes reads nobody awaits and renumbers rounds to "current" (1) and "older" (0).
    pub fn normalize(&mut self) {
        let nodes = self.nodes;
        let mut network: Vec<Packet> = self
            .network
            .iter()
            .copied()
            .filter(|p| {
                let n = &nodes[p.from as usize];
                p.message != Message::Read
                    || (n.round == p.round && matches!(n.op, Op::ClaimRead { .. }))
            })
            .collect();
        for packet in &mut network {
            let n = &nodes[packet.from as usize];
            let current = n.op != Op::Idle && packet.round == n.round;
            packet.round = u8::from(current);
            if !current && packet.message != Message::WakeUp {
                // Nobody awaits its reply; only its effect on the replica is left.
                packet.from = 0;
            }
        }
        network.sort();
        self.network = network;
        for n in &mut self.nodes {
            n.round = u8::from(n.op != Op::Idle);
        }
    }

    fn run_network(&mut self, config: &Config, steps: &mut u32) {
        while !self.network.is_empty() && *steps <= HEAL_STEPS_MAX {
            self.deliver(config, 0);
            *steps += 1;
        }
        for node in 0..REPLICAS {
            if self.nodes[node].op != Op::Idle {
                self.abandon(config, node);
            }
        }
    }

    /// The heal schedule of spec/replication.md#9-long-polling-across-nodes: faults stop; every
    /// packet in flight is delivered (or, with `deliver_pending = false`, lost) and what the
    /// deliveries start runs to its end; operations that cannot finish time out; then one poll
    /// period passes: the waiter, if still open, re-polls once and that receive runs to its
    /// end. No anti-entropy: it runs every 10 minutes, longer than any long poll.
    pub fn heal(&mut self, config: &Config, deliver_pending: bool) {
        let mut steps = 0u32;
        self.ghost.open_at_heal = matches!(self.waiter, Waiter::Open { .. });
        self.ghost.healed_delivering = deliver_pending;
        if !deliver_pending {
            if self.network.iter().any(|p| p.message == Message::WakeUp) {
                self.ghost.wake_up_lost = true;
            }
            self.network.clear();
        }
        self.run_network(config, &mut steps);
        // Twice: a timeout above may have started the receive a wake-up asked for.
        self.run_network(config, &mut steps);
        self.ghost.served_before_repoll = self.waiter == Waiter::Served;
        self.ghost.held_before_repoll = !self.ghost.served_before_repoll && self.held_by_a_claim();
        if matches!(self.waiter, Waiter::Open { .. }) && !config.has(Bug::NoRepoll) {
            self.start_receive(config, WAITER);
            self.run_network(config, &mut steps);
            self.run_network(config, &mut steps);
        }
        self.ghost.heal_stuck = steps > HEAL_STEPS_MAX;
        self.normalize();
        self.healed = true;
    }
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Deliver(u8),
    Drop(u8),
    Abandon(u8),
    /// B sends the message.
    Send,
    /// The long poll arrives at A (when it was not waiting at the start).
    Arrive,
    /// A's poll timer fires: the waiter receives again.
    Repoll,
    /// C's client receives.
    OtherReceive,
    Heal {
        deliver_pending: bool,
    },
}

/// The long-poll model under one configuration.
#[derive(Clone, Debug)]
pub struct LongPollModel {
    pub config: Config,
}

impl LongPollModel {
    /// The model of `config`.
    pub fn new(config: Config) -> LongPollModel {
        LongPollModel { config }
    }
}

impl Model for LongPollModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.config)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let (config, used) = (&self.config, &state.used);
        if state.healed {
            return;
        }
        for (i, packet) in state.network.iter().enumerate() {
            if i > 0 && state.network[i - 1] == *packet {
                continue;
            }
            actions.push(Action::Deliver(i as u8));
            if used.faults < config.faults_max {
                actions.push(Action::Drop(i as u8));
            }
        }
        // Only the waiter's node times out in the free phase: a timed-out send or other receive
        // leaves nothing the waiter could tell from a slow one (the heal times them out).
        if state.writing(WAITER) {
            actions.push(Action::Abandon(WAITER as u8));
        }
        if used.sends == 0 {
            actions.push(Action::Send);
        }
        let waiter_idle = state.nodes[WAITER].op == Op::Idle;
        if state.waiter == Waiter::Before && waiter_idle {
            actions.push(Action::Arrive);
        }
        if matches!(state.waiter, Waiter::Open { .. })
            && waiter_idle
            && used.repolls < config.repolls_max
            && !config.has(Bug::NoRepoll)
        {
            actions.push(Action::Repoll);
        }
        if state.nodes[OTHER].op == Op::Idle && used.other_receives < config.other_receives_max {
            actions.push(Action::OtherReceive);
        }
        actions.push(Action::Heal {
            deliver_pending: true,
        });
        actions.push(Action::Heal {
            deliver_pending: false,
        });
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let config = &self.config;
        let mut state = last.clone();
        match action {
            Action::Deliver(i) => state.deliver(config, i as usize),
            Action::Drop(i) => state.drop_packet(i as usize),
            Action::Abandon(node) => state.abandon(config, node as usize),
            Action::Send => state.start_send(config),
            Action::Arrive => state.arrive(config),
            Action::Repoll => {
                state.used.repolls += 1;
                state.start_receive(config, WAITER);
            }
            Action::OtherReceive => {
                state.used.other_receives += 1;
                state.start_receive(config, OTHER);
            }
            Action::Heal { deliver_pending } => state.heal(config, deliver_pending),
        }
        state.normalize();
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "after heal, an open waiter is served within one poll period",
                |_, s: &State| {
                    !s.healed
                        || s.ghost.heal_stuck
                        || !s.ghost.sent_acked
                        || !s.ghost.open_at_heal
                        || s.waiter == Waiter::Served
                        || s.held_by_a_claim()
                },
            ),
            Property::always(
                "after heal, a waiter whose wake-up arrived is served without a re-poll",
                |_, s: &State| {
                    !s.healed
                        || !s.ghost.healed_delivering
                        || s.ghost.wake_up_lost
                        || !s.ghost.sent_acked
                        || !s.ghost.open_at_heal
                        || s.ghost.served_before_repoll
                        || s.ghost.held_before_repoll
                },
            ),
            Property::always("heal ends within its step cap", |_, s: &State| {
                !s.ghost.heal_stuck
            }),
            Property::sometimes(
                "waiter served while its own replica lacks the message",
                |_, s: &State| s.ghost.reached(Scenario::ServedPastLaggingReplica),
            ),
            Property::sometimes(
                "waiter lost the claim race and went back to wait",
                |_, s: &State| s.ghost.reached(Scenario::LostRace),
            ),
            Property::sometimes(
                "waiter served by a re-poll after its wake-up was lost",
                |_, s: &State| s.ghost.reached(Scenario::ServedByRepoll),
            ),
            Property::sometimes(
                "wake-up arrived while the waiter's receive was running",
                |_, s: &State| s.ghost.reached(Scenario::WokenWhileReceiving),
            ),
            Property::sometimes("heal ran to its end", |_, s: &State| s.healed),
        ]
    }
}
