//! The model's state: the variables of `spec/queue-core.md#variables`, plus the ghost variables
//! the invariants need. Plain data with public fields, so a conformance test can read every part
//! of it; it owns no behaviour beyond small lookups and must never decide a transition.

use super::{MESSAGES, WORKERS};

/// Model time in whole ticks (one tick is one second of the real system).
pub type Tick = u8;

/// The two queues of the model: the source queue `Q`, whose redrive policy names `D`, and the
/// dead-letter queue `D`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QueueId {
    /// The source queue.
    Q,
    /// The dead-letter queue of `Q`.
    D,
}

impl QueueId {
    /// Both queues, in index order.
    pub const ALL: [QueueId; 2] = [QueueId::Q, QueueId::D];

    /// Position of this queue in `State::queues`.
    pub fn index(self) -> usize {
        match self {
            QueueId::Q => 0,
            QueueId::D => 1,
        }
    }

    /// The queue that is not this one (used to present a handle at the wrong queue).
    pub fn other(self) -> QueueId {
        match self {
            QueueId::Q => QueueId::D,
            QueueId::D => QueueId::Q,
        }
    }
}

/// A message id, chosen by the sender; the model has `m0` and `m1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub u8);

impl MessageId {
    /// Every message id of the model, in id order.
    pub fn all() -> impl Iterator<Item = MessageId> {
        (0..MESSAGES as u8).map(MessageId)
    }

    /// Position of this message in `State::messages` and in `Worker::held`.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A worker (a consumer process). `w0` and `w1` act in the free phase; `CONSUMER` is the fair
/// consumer that alone acts in the settle phase (`spec/queue-core.md#liveness`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u8);

impl WorkerId {
    /// The fair consumer of the settle phase.
    pub const CONSUMER: WorkerId = WorkerId(WORKERS as u8);

    /// The workers of the free phase.
    pub fn free() -> impl Iterator<Item = WorkerId> {
        (0..WORKERS as u8).map(WorkerId)
    }

    /// Position of this worker in `State::workers`.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A receipt handle as the core sees it once the edge has authenticated it:
/// `(queue, incarnation, message, seq)`. Issued handles have `seq >= 1`; a forged one may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReceiptHandle {
    /// The queue whose receive issued it.
    pub queue: QueueId,
    /// The incarnation of that queue when it was issued.
    pub incarnation: u8,
    /// The message it names.
    pub message: MessageId,
    /// The receive sequence number it carries.
    pub seq: u8,
}

/// Where a stored message is in its visibility cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageState {
    /// Sent with a delay that ends at `until`.
    Delayed {
        /// Tick at which it becomes ready.
        until: Tick,
    },
    /// Receivable; `since` orders receives (oldest first).
    Ready {
        /// Tick at which it became ready.
        since: Tick,
    },
    /// Delivered and invisible until `until`.
    InFlight {
        /// Tick at which its visibility timeout expires.
        until: Tick,
    },
}

/// Why a message is gone. `QueueDeleted` of the page is absent: the model does not delete
/// queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gone {
    /// A delete with the current receipt handle.
    Deleted,
    /// Its retention period ran out.
    Expired,
    /// Its queue was purged.
    Purged,
}

/// The stored record of a message, present while it is in a queue. Dropping it when the message
/// is gone is what the code does too, and it keeps gone messages from carrying state that no
/// longer means anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Life {
    /// Delayed, ready or in flight.
    pub state: MessageState,
    /// Receives that delivered it since it entered its current life (send or redrive).
    pub receive_count: u8,
    /// Receives that delivered it over all its lives: the `seq` of its newest receipt handle.
    /// Not on the page; see `spec-questions.md` (a redrive must not make old handles valid).
    pub receive_seq: u8,
    /// When the first receive of this life delivered it.
    pub first_receive_at: Option<Tick>,
    /// When the latest receive delivered it (anchor of the visibility cap).
    pub received_at: Option<Tick>,
    /// The `seq` of the newest receipt handle issued in its current queue.
    pub handle: Option<u8>,
    /// The queue it was moved from into a dead-letter queue.
    pub source: Option<QueueId>,
    /// Ghost: deliveries since the start of this life (I5 compares `receive_count` with it).
    pub ghost_deliveries: u8,
    /// Ghost: *DeadLetterNow* moved it into its current queue (I7 allows it there below
    /// `maxReceiveCount`). Cleared by a redrive, which starts a new life.
    pub ghost_dead_lettered_now: bool,
}

/// A message that was sent and stored (not a deduplicated duplicate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Message {
    /// The queue it is in, `None` once gone.
    pub queue: Option<QueueId>,
    /// Why it is gone, `None` while it exists.
    pub gone: Option<Gone>,
    /// Tick of the original send; retention counts from it.
    pub sent_at: Tick,
    /// The stored record; `None` once gone.
    pub life: Option<Life>,
    /// Ghost: the queue the send named (I9 compares sends to the same queue).
    pub ghost_sent_to: QueueId,
    /// Ghost: whether the send carried the model's one deduplication id.
    pub ghost_dedup: bool,
    /// Ghost: set when a delete made it gone `Deleted` (I8 holds it to that).
    pub ghost_deleted: bool,
}

/// What became of a message id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// Not sent yet.
    Unsent,
    /// Sent, but deduplicated: nothing was stored and the reply named `of`.
    Duplicate {
        /// The message whose deduplication entry matched.
        of: MessageId,
    },
    /// Sent and stored.
    Sent(Message),
}

impl Slot {
    /// The stored message, if this id was sent and stored.
    pub fn message(&self) -> Option<&Message> {
        match self {
            Slot::Sent(message) => Some(message),
            Slot::Unsent | Slot::Duplicate { .. } => None,
        }
    }
}

/// An open long poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waiter {
    /// Who is waiting.
    pub worker: WorkerId,
    /// Most messages it takes when served.
    pub max: u8,
    /// Visibility timeout of the messages it takes.
    pub visibility: Tick,
    /// When it is answered empty.
    pub deadline: Tick,
}

/// A deduplication entry: the message whose send carried the id, and when the entry ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupEntry {
    /// The first message sent with the id.
    pub message: MessageId,
    /// The entry is dropped once `expires_at <= now`.
    pub expires_at: Tick,
}

/// The variables of one queue that change. Attributes are fixed in the model and live in
/// `QueueCore`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct QueueState {
    /// Open long polls, oldest first.
    pub waiters: Vec<Waiter>,
    /// The entry of the model's one deduplication id.
    pub dedup: Option<DedupEntry>,
}

/// A receipt handle a worker holds, with the ghost flag of the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeldHandle {
    /// The handle as issued.
    pub handle: ReceiptHandle,
    /// Ghost: a later receive of the same message superseded it.
    pub ghost_superseded: bool,
}

/// A worker: the newest handle it received for each message. (It keeps one per message: a
/// newer receive by the same worker replaces it, so stale handles are those another worker's
/// receive superseded.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Worker {
    /// Indexed by message.
    pub held: [Option<HeldHandle>; MESSAGES],
}

/// Notable events of the latest step that leave no other trace in the state, kept only so
/// `sometimes` properties can name them. Reset by every step, so they add a state only next to
/// the step that caused them. Refusals are not among them: a refusal changes nothing, so its
/// witness is the state in which the refused action is enabled (see `properties`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Events(pub u16);

impl Events {
    /// A waiter was served a message that a send made ready.
    pub const WAITER_SERVED_BY_SEND: Events = Events(1 << 0);
    /// A waiter was served a message that a visibility restore made ready.
    pub const WAITER_SERVED_BY_RESTORE: Events = Events(1 << 1);
    /// A redrive moved a message out of the dead-letter queue.
    pub const REDRIVEN: Events = Events(1 << 2);
    /// A delete with the newest handle succeeded after the visibility timeout expired and before
    /// anyone received the message again.
    pub const DELETED_AFTER_TIMEOUT: Events = Events(1 << 3);
    /// A dead-letter-now moved a message whose visibility timeout had expired and which nobody
    /// had received again. (A dead-letter-now in general needs no event: the moved message's
    /// ghost flag shows it.)
    pub const DEAD_LETTERED_NOW_AFTER_TIMEOUT: Events = Events(1 << 4);
    /// A waiter of the dead-letter queue was served the message a dead-letter-now moved.
    pub const WAITER_SERVED_BY_DEAD_LETTER_NOW: Events = Events(1 << 5);

    /// Whether every event of `other` is in `self`.
    pub fn contains(self, other: Events) -> bool {
        self.0 & other.0 == other.0
    }

    /// Adds the events of `other`.
    pub fn insert(&mut self, other: Events) {
        self.0 |= other.0;
    }
}

/// The whole model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// The latest time seen.
    pub now: Tick,
    /// Whether `Settle` ended the free phase.
    pub settled: bool,
    /// Indexed by `QueueId::index`.
    pub queues: [QueueState; 2],
    /// Indexed by `MessageId::index`.
    pub messages: [Slot; MESSAGES],
    /// Indexed by `WorkerId::index`; the last one is the fair consumer.
    pub workers: [Worker; WORKERS + 1],
    /// Ghost: a delete or visibility change with a superseded handle succeeded (I2).
    pub ghost_deleted_with_stale: bool,
    /// Ghost: a receive delivered a message that was not ready (I4).
    pub ghost_served_in_flight: bool,
    /// Ghost: notable events of the latest step.
    pub ghost_events: Events,
    /// Ghost: successful dead-letter-nows on this path (the model's bound reads it).
    pub ghost_dead_letter_nows: u8,
}

impl State {
    /// The state before anything happened: time 0, nothing sent.
    pub fn initial() -> State {
        State {
            now: 0,
            settled: false,
            queues: Default::default(),
            messages: [Slot::Unsent; MESSAGES],
            workers: Default::default(),
            ghost_deleted_with_stale: false,
            ghost_served_in_flight: false,
            ghost_events: Events::default(),
            ghost_dead_letter_nows: 0,
        }
    }

    /// The queue's changing variables.
    pub fn queue(&self, queue: QueueId) -> &QueueState {
        &self.queues[queue.index()]
    }

    /// The stored message `message`, if it was sent and stored.
    pub fn message(&self, message: MessageId) -> Option<&Message> {
        self.messages[message.index()].message()
    }

    /// The record of `message` if it is stored in `queue` right now.
    pub fn stored_in(&self, message: MessageId, queue: QueueId) -> Option<&Life> {
        let stored = self.message(message)?;
        if stored.queue == Some(queue) {
            stored.life.as_ref()
        } else {
            None
        }
    }

    /// Every stored message with its record and queue.
    pub fn stored(&self) -> impl Iterator<Item = (MessageId, QueueId, &Life)> {
        MessageId::all().filter_map(|id| {
            let message = self.message(id)?;
            Some((id, message.queue?, message.life.as_ref()?))
        })
    }

    /// Whether `worker` has an open long poll.
    pub fn is_waiting(&self, worker: WorkerId) -> bool {
        self.queues
            .iter()
            .any(|queue| queue.waiters.iter().any(|w| w.worker == worker))
    }

    /// Whether `queue` holds a ready message.
    pub fn has_ready(&self, queue: QueueId) -> bool {
        self.stored()
            .any(|(_, q, life)| q == queue && matches!(life.state, MessageState::Ready { .. }))
    }
}
