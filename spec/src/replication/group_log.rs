//! The model of spec/replication.md#14-the-replicas-group-log: one replica's committer making
//! each group durable with one append and one sync of its redo, the B-tree committed unsynced
//! behind it, checkpoints that sync the B-tree and restart the log, metadata commits that sync
//! it at any moment, and crashes followed by a start's replay.
//!
//! Group `g` sets key `g % keys` to the value `g`, so a B-tree that is the result of groups
//! `1..m` in order names its `m`, and an old value put back is visible. Groups are numbered by
//! their sequence: a group a crash dropped is the next one again after the start (its requests
//! are retried), which is what lets L1 name the B-tree by a prefix. A group's steps (apply,
//! append, sync, B-tree commit, answer) are steps of their own, so that crashes and metadata
//! commits fall between them. A crash and the start that follows it are one step: the store
//! serves nothing between them. Ghost fields record what was answered, what a sync covered and
//! which scenarios happened; the replica never reads them. This module owns the whole state
//! machine of the section; it must never depend on another model.

use stateright::{Model, Property};

/// Keys a configuration may have (`Config::keys`).
pub const KEYS_MAX: usize = 4;
/// Log slots a configuration may have (`Config::slots`).
pub const SLOTS_MAX: usize = 4;

/// L1: in every state the current B-tree is the result of groups `1..m` in order, for some `m`
/// at least the last group answered.
pub const ANSWERED_SURVIVE: &str = "L1: answered groups survive";
/// L2: that `m` is at most the last group whose entry a sync covered (or a start found whole).
pub const READERS_SEE_SYNCED: &str = "L2: readers see only synced groups";
/// Scenario: a crash took an unsynced entry (lost or torn).
pub const CRASH_LOST_ENTRY: &str = "a crash lost an unsynced entry";
/// Scenario: a start's replay took at least one entry.
pub const START_REPLAYED: &str = "a start replayed an entry";
/// Scenario: a start's replay ended at a whole entry left from before a restart.
pub const START_STOPPED_AT_LEFTOVER: &str =
    "a start stopped at an entry left from before a restart";
/// Scenario: a start replayed a group that a metadata commit had already synced into the
/// durable B-tree, past its `log_sequence`.
pub const START_REPLAYED_METADATA_SYNCED: &str =
    "a start replayed a group a metadata commit had already synced";
/// Scenario: an append after a restart wrote over a whole entry left in its slot.
pub const RESTART_OVERWROTE_LEFTOVER: &str = "the log restarted and wrote over a leftover entry";

/// A rule of the section switched off on purpose, to show the checker catches its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The group is answered after its append, before the sync (the B-tree commit stays after
    /// the sync). Breaks L1.
    AnswerBeforeSync,
    /// The B-tree transaction is committed before the entry is appended and synced. Breaks L2.
    CommitBeforeAppend,
    /// The log restarts when the checkpoint is due, and the checkpoint's commit comes after, at
    /// any later moment between groups. Breaks L1.
    RestartBeforeCheckpoint,
    /// The start takes every whole entry after those it passes over, whatever its sequence.
    /// Breaks L1.
    ReplayIgnoresSequence,
}

/// Bounds and switches of one run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Printed with the run's figures.
    pub name: &'static str,
    /// Groups the committer applies, numbered from 1 (at most `u8::MAX - 1`).
    pub groups_max: u8,
    /// Keys of the B-tree (at most `KEYS_MAX`); group `g` writes key `g % keys`.
    pub keys: u8,
    /// Slots of the log (at most `SLOTS_MAX`); an entry fills one.
    pub slots: u8,
    /// Crashes, each followed by a start.
    pub crashes_max: u8,
    /// The planted bug, if any.
    pub bug: Option<Bug>,
}

impl Config {
    /// The page's bounds (four groups, two keys, three slots), one crash, no bug.
    pub fn new(name: &'static str) -> Config {
        Config {
            name,
            groups_max: 4,
            keys: 2,
            slots: 3,
            crashes_max: 1,
            bug: None,
        }
    }

    /// Whether `bug` is planted in this run.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// The steps of a group after its apply, in the order the committer takes them.
    pub fn order(&self) -> [Step; 4] {
        match self.bug {
            Some(Bug::AnswerBeforeSync) => [Step::Append, Step::Answer, Step::Sync, Step::Commit],
            Some(Bug::CommitBeforeAppend) => [Step::Commit, Step::Append, Step::Sync, Step::Answer],
            _ => [Step::Append, Step::Sync, Step::Commit, Step::Answer],
        }
    }

    fn assert_bounds(&self) {
        assert!(self.keys >= 1, "a group writes a key");
        assert!(
            usize::from(self.keys) <= KEYS_MAX,
            "keys fit the B-tree array"
        );
        assert!(self.slots >= 1, "the log holds an entry");
        assert!(
            usize::from(self.slots) <= SLOTS_MAX,
            "slots fit the log array"
        );
        assert!(
            self.groups_max < u8::MAX,
            "sequences count past the last group"
        );
    }
}

/// A B-tree as one of its commits left it: each key's value (0: never written) and the
/// metadata table's `log_sequence` (every group through it is in this B-tree).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BTree {
    /// The value of each key; keys past `Config::keys` stay 0.
    pub values: [u8; KEYS_MAX],
    /// The checkpoint's sequence.
    pub log_sequence: u8,
}

impl BTree {
    /// The highest group whose value this B-tree holds (0 if none): the `m` a reader sees.
    pub fn top(&self) -> u8 {
        self.values.iter().copied().max().unwrap_or_default()
    }

    /// The `m` such that the values are those of groups `1..m` applied in order, if there is
    /// one. Values determine it: `m` is the highest value.
    pub fn groups(&self, keys: u8) -> Option<u8> {
        let m = self.top();
        let mut prefix = [0u8; KEYS_MAX];
        for g in 1..=m {
            prefix[usize::from(g % keys)] = g;
        }
        (prefix == self.values).then_some(m)
    }

    /// Puts `value` at `key`: a group's commit, or the replay of its redo.
    fn put(&mut self, key: u8, value: u8) {
        self.values[usize::from(key)] = value;
    }
}

/// A log entry that is whole on disk (its checksum holds): its sequence and its group's redo.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The writer's `next` when it was appended.
    pub sequence: u8,
    /// The redo's one change: this key now holds `value`.
    pub key: u8,
    /// The value stored after the group: its number.
    pub value: u8,
}

/// An append no sync has covered yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Write {
    /// The slot written.
    pub offset: u8,
    /// What the slot holds once a sync covers the write.
    pub entry: Entry,
}

/// What a crash leaves of the unsynced append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// The entry is on disk, whole.
    Kept,
    /// The write never reached the disk: the slot holds what it held before.
    Lost,
    /// Part of it reached the disk: the slot fails its checksum.
    Torn,
}

/// A step of the group in flight, after its apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The entry is written, unsynced, into the slot at `offset`; `offset` and `next` advance.
    Append,
    /// The log is synced: the entry is on disk.
    Sync,
    /// The write transaction commits without a sync: the current B-tree holds the group.
    Commit,
    /// The group's requests are answered (ghost).
    Answer,
}

/// The group the committer holds: its transaction is open and its redo recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InFlight {
    /// Its number, the writer's `next` when it was taken.
    pub group: u8,
    /// How many of `Config::order`'s steps are done.
    pub done: u8,
}

/// Where a checkpoint stands between groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// No checkpoint under way.
    #[default]
    None,
    /// The checkpoint's commit returned; the committer restarts the log before the next group.
    RestartOwed,
    /// `RestartBeforeCheckpoint` only: the log restarted and the commit has not come yet.
    CommitOwed,
}

/// Scenarios the checker must reach, one bit each (the `sometimes` properties of the same
/// names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// `CRASH_LOST_ENTRY`.
    CrashLostEntry = 0,
    /// `START_REPLAYED`.
    StartReplayed = 1,
    /// `START_STOPPED_AT_LEFTOVER`.
    StartStoppedAtLeftover = 2,
    /// `START_REPLAYED_METADATA_SYNCED`.
    StartReplayedMetadataSynced = 3,
    /// `RESTART_OVERWROTE_LEFTOVER`.
    RestartOverwroteLeftover = 4,
}

/// What only the model knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The highest group answered.
    pub answered: u8,
    /// The last group whose entry a sync covered; after a start, what the replay reached (the
    /// current B-tree's highest group, all of it synced by the start's checkpoint).
    pub synced: u8,
    /// The scenarios reached, a bit per `Scenario`.
    pub scenarios: u8,
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

/// The replica: its two B-trees, its log and its committer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// What the database file holds as of its last synced commit.
    pub durable: BTree,
    /// The durable B-tree and every commit since: what reads, scans and digests see.
    pub current: BTree,
    /// What each slot holds on disk as of the last sync: a whole entry, or nothing whole
    /// (zeroed or torn). Slots past `Config::slots` stay empty.
    pub log: [Option<Entry>; SLOTS_MAX],
    /// The one append since the last sync (an append comes only after the previous sync).
    pub unsynced: Option<Write>,
    /// The writer's next slot.
    pub offset: u8,
    /// The writer's next sequence; the committer's next group is numbered by it.
    pub next: u8,
    /// The group the committer holds, if any.
    pub in_flight: Option<InFlight>,
    /// A checkpoint between its commit and the log's restart (either order).
    pub checkpoint: Checkpoint,
    /// Crashes so far.
    pub crashes: u8,
    /// What only the model knows.
    pub ghost: Ghost,
}

impl State {
    /// An empty replica: nothing written, `log_sequence` 0, the writer at slot 0 with sequence 1.
    pub fn initial() -> State {
        State {
            durable: BTree::default(),
            current: BTree::default(),
            log: [None; SLOTS_MAX],
            unsynced: None,
            offset: 0,
            next: 1,
            in_flight: None,
            checkpoint: Checkpoint::None,
            crashes: 0,
            ghost: Ghost::default(),
        }
    }

    /// L1: the current B-tree is the result of groups `1..m` in order, for some `m` at least
    /// the last group answered.
    pub fn answered_survive(&self, config: &Config) -> bool {
        self.current
            .groups(config.keys)
            .is_some_and(|m| m >= self.ghost.answered)
    }

    /// L2: the highest group the current B-tree holds is at most the last group whose entry a
    /// sync covered (or a start found whole).
    pub fn readers_see_synced(&self) -> bool {
        self.current.top() <= self.ghost.synced
    }

    /// The committer takes the next group: a write transaction applies it and records its redo.
    fn apply(&mut self) {
        assert!(self.in_flight.is_none(), "one group at a time");
        self.in_flight = Some(InFlight {
            group: self.next,
            done: 0,
        });
    }

    /// The group in flight takes its next step.
    fn step(&mut self, config: &Config, step: Step) {
        let mut flight = self.in_flight.expect("a step belongs to a group in flight");
        let group = flight.group;
        // The group's redo: its one change, the value stored after it.
        let (key, value) = (group % config.keys, group);
        match step {
            Step::Append => {
                assert!(self.unsynced.is_none(), "the previous append was synced");
                assert!(self.offset < config.slots, "the log is not full");
                let offset = usize::from(self.offset);
                if self.log[offset].is_some() {
                    self.ghost.reach(Scenario::RestartOverwroteLeftover);
                }
                self.unsynced = Some(Write {
                    offset: self.offset,
                    entry: Entry {
                        sequence: self.next,
                        key,
                        value,
                    },
                });
                self.offset += 1;
                self.next += 1;
            }
            Step::Sync => {
                let write = self
                    .unsynced
                    .take()
                    .expect("the group's append precedes its sync");
                self.log[usize::from(write.offset)] = Some(write.entry);
                self.ghost.synced = group;
            }
            Step::Commit => self.current.put(key, value),
            Step::Answer => self.ghost.answered = self.ghost.answered.max(group),
        }
        flight.done += 1;
        self.in_flight = (usize::from(flight.done) < config.order().len()).then_some(flight);
    }

    /// The checkpoint's synced commit: `log_sequence := next − 1`, and redb syncs every
    /// unsynced commit with it.
    fn checkpoint_commit(&mut self, config: &Config) {
        assert!(self.in_flight.is_none(), "a checkpoint runs between groups");
        self.current.log_sequence = self.next - 1;
        self.durable = self.current;
        self.checkpoint = if config.has(Bug::RestartBeforeCheckpoint) {
            Checkpoint::None
        } else {
            Checkpoint::RestartOwed
        };
    }

    /// The log restarts: the writer goes back to slot 0; `next` goes on counting up.
    fn restart(&mut self, config: &Config) {
        assert!(self.in_flight.is_none(), "a restart runs between groups");
        self.offset = 0;
        self.checkpoint = if config.has(Bug::RestartBeforeCheckpoint) {
            Checkpoint::CommitOwed
        } else {
            Checkpoint::None
        };
    }

    /// The replica crashes, with `fate` for its unsynced append if it has one, and starts.
    fn crash(&mut self, config: &Config, fate: Option<Fate>) {
        self.crashes += 1;
        if let Some(write) = self.unsynced.take() {
            let slot = &mut self.log[usize::from(write.offset)];
            match fate.expect("a crash decides the unsynced append's fate") {
                Fate::Kept => *slot = Some(write.entry),
                Fate::Lost => self.ghost.reach(Scenario::CrashLostEntry),
                Fate::Torn => {
                    *slot = None;
                    self.ghost.reach(Scenario::CrashLostEntry);
                }
            }
        }
        self.current = self.durable;
        self.in_flight = None;
        self.checkpoint = Checkpoint::None;
        self.start(config);
    }

    /// The start: walk the log from slot 0, pass over whole entries of sequence `≤ c`, take
    /// whole entries while each has the next sequence, apply them in order and checkpoint.
    fn start(&mut self, config: &Config) {
        let c = self.durable.log_sequence;
        let slots = &self.log[..usize::from(config.slots)];
        let mut at = slots
            .iter()
            .take_while(|slot| slot.is_some_and(|entry| entry.sequence <= c))
            .count();
        let mut taken = Vec::new();
        while let Some(Some(entry)) = slots.get(at) {
            let expected = c + 1 + taken.len() as u8;
            if entry.sequence != expected && !config.has(Bug::ReplayIgnoresSequence) {
                // Another sequence ends the log; a lower one was written before a restart.
                if entry.sequence < expected {
                    self.ghost.reach(Scenario::StartStoppedAtLeftover);
                }
                break;
            }
            taken.push(*entry);
            at += 1;
        }
        let durable_top = self.durable.top();
        for entry in &taken {
            if entry.sequence > c && entry.value <= durable_top {
                self.ghost.reach(Scenario::StartReplayedMetadataSynced);
            }
            self.current.put(entry.key, entry.value);
        }
        if !taken.is_empty() {
            self.ghost.reach(Scenario::StartReplayed);
        }
        self.current.log_sequence = taken.last().map_or(c, |entry| entry.sequence);
        self.durable = self.current;
        self.offset = 0;
        self.next = self.current.log_sequence + 1;
        self.ghost.synced = self.current.top();
    }
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The committer takes the next group.
    Apply,
    /// The group in flight takes its next step.
    Group(Step),
    /// The checkpoint's synced commit.
    Checkpoint,
    /// The log restarts at slot 0.
    Restart,
    /// A synced commit of the metadata table alone: the durable B-tree becomes the current one.
    MetadataCommit,
    /// The replica crashes (with the fate of its unsynced append, if any) and starts.
    Crash(Option<Fate>),
}

/// The group-log model under one configuration.
#[derive(Clone, Debug)]
pub struct GroupLogModel {
    /// The bounds and the planted bug.
    pub config: Config,
}

impl GroupLogModel {
    /// The model of `config`.
    ///
    /// # Panics
    ///
    /// If `config`'s bounds do not fit the state's arrays.
    pub fn new(config: Config) -> GroupLogModel {
        config.assert_bounds();
        GroupLogModel { config }
    }
}

impl Model for GroupLogModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        if !state.answered_survive(config) || !state.readers_see_synced() {
            // A state that breaks L1 or L2 ends its run: it is a counterexample already, and
            // the checker reports a path to the last one it met, which must not run past it.
            return;
        }
        if let Some(flight) = state.in_flight {
            actions.push(Action::Group(config.order()[usize::from(flight.done)]));
        } else {
            // Between groups: a checkpoint step, or the next group.
            let may_apply = match state.checkpoint {
                Checkpoint::RestartOwed => {
                    actions.push(Action::Restart);
                    false
                }
                Checkpoint::CommitOwed => {
                    actions.push(Action::Checkpoint);
                    true
                }
                Checkpoint::None => {
                    // Due at any moment once the log holds something since the last one.
                    if state.offset > 0 {
                        actions.push(if config.has(Bug::RestartBeforeCheckpoint) {
                            Action::Restart
                        } else {
                            Action::Checkpoint
                        });
                    }
                    true
                }
            };
            // A full log waits for a checkpoint (its restart) before the next append.
            if may_apply && state.offset < config.slots && state.next <= config.groups_max {
                actions.push(Action::Apply);
            }
        }
        if state.current != state.durable {
            actions.push(Action::MetadataCommit);
        }
        if state.crashes < config.crashes_max {
            if state.unsynced.is_some() {
                actions
                    .extend([Fate::Kept, Fate::Lost, Fate::Torn].map(|f| Action::Crash(Some(f))));
            } else {
                actions.push(Action::Crash(None));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let config = &self.config;
        let mut state = last.clone();
        match action {
            Action::Apply => state.apply(),
            Action::Group(step) => state.step(config, step),
            Action::Checkpoint => state.checkpoint_commit(config),
            Action::Restart => state.restart(config),
            Action::MetadataCommit => state.durable = state.current,
            Action::Crash(fate) => state.crash(config, fate),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ANSWERED_SURVIVE, |model: &GroupLogModel, s: &State| {
                s.answered_survive(&model.config)
            }),
            Property::always(READERS_SEE_SYNCED, |_, s: &State| s.readers_see_synced()),
            Property::sometimes(CRASH_LOST_ENTRY, |_, s: &State| {
                s.ghost.reached(Scenario::CrashLostEntry)
            }),
            Property::sometimes(START_REPLAYED, |_, s: &State| {
                s.ghost.reached(Scenario::StartReplayed)
            }),
            Property::sometimes(START_STOPPED_AT_LEFTOVER, |_, s: &State| {
                s.ghost.reached(Scenario::StartStoppedAtLeftover)
            }),
            Property::sometimes(START_REPLAYED_METADATA_SYNCED, |_, s: &State| {
                s.ghost.reached(Scenario::StartReplayedMetadataSynced)
            }),
            Property::sometimes(RESTART_OVERWROTE_LEFTOVER, |_, s: &State| {
                s.ghost.reached(Scenario::RestartOverwroteLeftover)
            }),
        ]
    }
}
