//! The history of a run: every call a client invoked and how it completed, stamped with
//! simulated time, in the order they happened. The checker reads nothing else.
//!
//! A call that failed without a definite answer from the node (a timeout, a dead connection, a
//! crash mid-call) completes [`Outcome::Unknown`]: it may or may not have taken effect, as in
//! Jepsen's `:info`. This module must never guess an outcome.

use std::fmt::Write as _;

/// One call's arguments, as far as the checker needs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `CreateQueue` of the run's queue (idempotent).
    CreateQueue,
    /// `CreateQueue` of the run's dead-letter queue (idempotent), before the run's queue names
    /// it in its redrive policy.
    CreateDeadLetterQueue,
    /// `SendMessage` with a body no other send uses, except a retry of a send with a
    /// deduplication id, which repeats its body and id.
    Send {
        body: String,
        delay_s: Option<u32>,
        dedup_id: Option<String>,
    },
    /// `ReceiveMessages`, from the run's queue or (`dead_letter`) its dead-letter queue.
    Receive {
        dead_letter: bool,
        max: u32,
        wait_s: u32,
        /// The visibility timeout in effect for what this receive delivers (the override, or the
        /// queue's default when none was given).
        visibility_s: u32,
    },
    /// `DeleteMessage` with the handle of the delivery `(message_id, generation,
    /// receive_count)`, in the queue that delivered it.
    Delete {
        message_id: String,
        generation: u32,
        receive_count: u32,
    },
    /// `ChangeVisibility` with the handle of the delivery `(message_id, generation,
    /// receive_count)`.
    ChangeVisibility {
        message_id: String,
        generation: u32,
        receive_count: u32,
        timeout_s: u32,
    },
    /// Dead-letter now (`Command::DeadLetterNow`, spec/queue-core.md) with the handle of a
    /// delivery from the run's queue: the message moves to the dead-letter queue at once.
    DeadLetterNow {
        message_id: String,
        generation: u32,
        receive_count: u32,
    },
    /// The start of a move task taking the dead-letter queue's messages back to their source
    /// (`StartMessageMoveTask`, spec/replication.md §8); it runs in the background.
    StartMoveTask,
    /// `GetQueue`, for the queue's counts after the drain.
    Stats,
    /// `CreateQueue` (`create`) or `DeleteQueue` of a queue apart from the run's, raced
    /// through two members (spec/replication.md §1); no rule reads it but the queue's own.
    RaceQueue { queue: String, create: bool },
    /// `PurgeQueue` of the run's queue (spec/replication.md §2): a message sent before its
    /// answer may vanish; one sent after it is kept.
    Purge,
}

/// One message as a receive delivered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub message_id: String,
    pub body: String,
    pub receive_count: u32,
    /// The message's life the delivery belongs to: its generation in the cluster (0 when
    /// sent, one more at every dead-letter move and every redrive, spec/replication.md, *The
    /// record*), read from the receipt handle; always 0 on a node running alone. Receive counts,
    /// handles and deletes compare within one generation.
    pub generation: u32,
}

/// How a call completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The call succeeded; for other calls than these, with nothing to record.
    Ok,
    /// A send succeeded and the node named the message.
    Sent { message_id: String },
    /// A receive answered, possibly empty.
    Received(Vec<Delivery>),
    /// The queue's counts.
    Stats {
        ready: u64,
        in_flight: u64,
        delayed: u64,
    },
    /// The node refused the call; it changed nothing.
    Refused { code: String },
    /// No definite answer: the call may or may not have taken effect.
    Unknown { reason: String },
}

impl Outcome {
    /// Whether the call may have taken effect (it succeeded, or nobody knows).
    #[must_use]
    pub fn may_have_happened(&self) -> bool {
        !matches!(self, Outcome::Refused { .. })
    }

    /// Whether the node acknowledged the call.
    #[must_use]
    pub fn acknowledged(&self) -> bool {
        !matches!(self, Outcome::Refused { .. } | Outcome::Unknown { .. })
    }
}

/// One invoked call and, once it returned, its completion. Times are simulated milliseconds
/// since the start of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: u32,
    pub call: Call,
    pub invoked_at_ms: u64,
    /// `None` while the call is open (only in a history cut short).
    pub completed: Option<(u64, Outcome)>,
}

impl Op {
    /// The completion time, or `u64::MAX` for a call that never returned.
    #[must_use]
    pub fn completed_at_ms(&self) -> u64 {
        self.completed.as_ref().map_or(u64::MAX, |(at, _)| *at)
    }

    /// The outcome; an open call counts as unknown.
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        self.completed.as_ref().map_or_else(
            || Outcome::Unknown {
                reason: "never returned".to_owned(),
            },
            |(_, outcome)| outcome.clone(),
        )
    }
}

/// Index of an op in its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpId(pub usize);

/// Every op of a run, in invocation order, and the faults the harness injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    /// `(simulated ms, what happened)` for each fault and each heal, in time order.
    pub faults: Vec<(u64, String)>,
    /// How far two hosts' clocks may disagree, in ms. turmoil runs hosts one after another
    /// within a step, each advancing its own clock through the step, so a reply sent late in
    /// the node's step can be read early in the client's: a completion can be stamped up to one
    /// step before the node's time of sending. Real-time order needs a gap wider than this.
    pub clock_skew_ms: u64,
    /// How far apart the nodes' own clocks are (the cluster's members, each off true time by
    /// its offset), ms. A visibility deadline written by one node's clock and checked by
    /// another's may pass this much early by true time (spec/replication.md, *Time*): within
    /// `SKEW_MAX` by the bound, beyond it a duplicate, never a loss.
    pub clock_spread_ms: u64,
    /// The longest the network may hold a request before delivering it (the cluster's holds and
    /// pause), ms; 0 where nothing is held that long. A call's request may reach its node this
    /// long after it was sent, after its client gave up on it.
    pub held_max_ms: u64,
    /// The run's queue's `maxReceiveCount`, when it has a redrive policy (to the dead-letter
    /// queue the receives with `dead_letter` read).
    pub max_receive_count: Option<u32>,
}

/// How much a run exercised the system under test: what a harness that never reached it would
/// show as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exercise {
    /// Sends acknowledged.
    pub sends: usize,
    /// Messages delivered.
    pub delivered: usize,
    /// Deletes acknowledged.
    pub deletes: usize,
}

impl History {
    /// How much this history exercised the system: acknowledged sends and deletes, deliveries.
    #[must_use]
    pub fn exercise(&self) -> Exercise {
        let acknowledged = |want: fn(&Call) -> bool| {
            self.ops
                .iter()
                .filter(|op| want(&op.call) && op.outcome().acknowledged())
                .count()
        };
        Exercise {
            sends: acknowledged(|call| matches!(call, Call::Send { .. })),
            deletes: acknowledged(|call| matches!(call, Call::Delete { .. })),
            delivered: self
                .ops
                .iter()
                .map(|op| match op.outcome() {
                    Outcome::Received(got) => got.len(),
                    _ => 0,
                })
                .sum(),
        }
    }
    /// Records the invocation of `call` by `client` at `at_ms`.
    pub fn invoke(&mut self, client: u32, call: Call, at_ms: u64) -> OpId {
        self.ops.push(Op {
            client,
            call,
            invoked_at_ms: at_ms,
            completed: None,
        });
        OpId(self.ops.len() - 1)
    }

    /// Records the completion of `op` at `at_ms`.
    pub fn complete(&mut self, op: OpId, outcome: Outcome, at_ms: u64) {
        let entry = &mut self.ops[op.0];
        assert!(entry.completed.is_none(), "an op completes once");
        assert!(
            at_ms >= entry.invoked_at_ms,
            "an op completes after it starts"
        );
        entry.completed = Some((at_ms, outcome));
    }

    /// Records a fault or a heal.
    pub fn fault(&mut self, at_ms: u64, what: String) {
        self.faults.push((at_ms, what));
    }

    /// A digest of everything recorded (FNV-1a over a canonical rendering): the same seed must
    /// give the same digest, run after run.
    #[must_use]
    pub fn digest(&self) -> u64 {
        let mut text = String::new();
        for op in &self.ops {
            let _ = writeln!(text, "{op:?}");
        }
        for fault in &self.faults {
            let _ = writeln!(text, "{fault:?}");
        }
        fnv1a(text.as_bytes())
    }

    /// Counts of ops by outcome class, for the run summary: (acknowledged, refused, unknown).
    #[must_use]
    pub fn outcome_counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for op in &self.ops {
            match op.outcome() {
                Outcome::Refused { .. } => counts.1 += 1,
                Outcome::Unknown { .. } => counts.2 += 1,
                _ => counts.0 += 1,
            }
        }
        counts
    }
}

/// 64-bit FNV-1a: small, stable across platforms and Rust versions (unlike `DefaultHasher`).
#[must_use]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
