//! Known bugs planted in the protocol's state machines, for the simulation to prove that it
//! catches them (issue 11, *Checks that are checked*). The switch exists only in builds with
//! the feature `sim-bugs`, which only `trireme-sim` asks for; without it [`planted`] is a
//! constant `false` and the bugs compile away.
//!
//! The switch is per thread: turmoil runs a whole simulation on the test's thread, so a test
//! that plants a bug changes no other test running beside it. This module must never be read
//! for anything but a planted bug.

/// A bug the simulation must find.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// A receive delivers its claim at the first replica's ack instead of at two
    /// (spec/replication.md#receive-claim, step 5): two coordinators can both deliver one
    /// version of a message.
    ClaimAtFirstAck,
    /// Receives, deletes and visibility changes read one replica instead of two, so a read
    /// need not meet the last write's quorum.
    ReadQuorumOfOne,
    /// The protocol before spec/replication.md's F1: leases ordered by the whole claim first
    /// (then counter and deadline), and handles checked by the whole claim at the coordinator
    /// and the replicas, so a claim that lost the race for a version refuses its holder and
    /// brings the message back at its own deadline.
    WholeClaimFirst,
    /// The driver before spec/replication.md's F3: a delete whose conditional tombstone two
    /// replicas refused answers `Stale` ("nothing written") even when the third took it, so a
    /// message a delete removed looks lost to every client.
    StaleAtTwoRefusals,
    /// A live copy merged into a record holding the tombstone of its own generation replaces it
    /// (spec/replication.md#tombstones-and-their-collection: a tombstone dominates every live
    /// copy of its generation): a replica that missed a delete brings the message back to the
    /// others through read repair and anti-entropy.
    TombstoneNotDominant,
    /// Anti-entropy leaves tombstones out of what it sends (spec/replication.md#read-repair-and-
    /// anti-entropy): a replica that missed a delete keeps its live copy, the three never
    /// converge, and the tombstones are never collected.
    AntiEntropySkipsTombstones,
    /// A replica acknowledges a group of writes before their commit is durable (its commits
    /// are not fsynced; spec/replication.md#durability): a crash loses what it acknowledged,
    /// and two such replicas lose an acknowledged write.
    AckBeforeFsync,
    /// Collection confirms a tombstone held by two replicas instead of all three
    /// (spec/replication.md#tombstones-and-their-collection, step 1; the model's
    /// `CollectAfterTwo`): a replica that was away when the message was deleted still holds
    /// its live copy when the other two drop the tombstone, and brings it back when it returns.
    CollectAfterTwo,
    /// A new disk that replaces a lost one votes at once, as a new member does, instead of
    /// waiting out the horizon and rebuilding from its peers (spec/replication.md, *Stragglers
    /// and replacement*; the model's `RebuildingReplicaServes`): with a peer that missed what
    /// the lost disk acknowledged, it makes a read quorum that knows none of it.
    EmptyReplacementVotes,
    /// A delete sends its conditional tombstone without the quorum read first (the model's
    /// `DeleteWithoutQuorumCheck`, spec/replication.md#delete): only the replicas' own check
    /// refuses a superseded handle, so a replica that missed the newer claim takes its
    /// tombstone, which dominates the new holder's copy (S4).
    DeleteWithoutQuorumRead,
    /// A long poll's re-poll takes its candidates from the member's own index only, as a single
    /// node's waiter would, instead of a read quorum of indexes (spec/replication.md §9,
    /// *Re-poll*; the model's `WaiterReadsOwnReplica`): a message made ready by time on
    /// replicas the waiters' member is not among is found by no re-poll, and the waiter waits
    /// beside it (L9b).
    WaiterReadsOwnReplica,
    /// A claim without the read is sent at whatever receive count the coordinator's own
    /// replica shows (the model's `ClaimWithoutReadNoLocalCountCheck`, spec/replication.md §13):
    /// an orphan claim that raised the local count leaves the other two below the maximum, they
    /// take the claim by (b) and (d), and the message is delivered past its `maxReceiveCount`
    /// where the read path would have moved it (S11).
    ClaimWithoutReadNoLocalCountCheck,
    /// Replicas take a conditional claim whatever their own lease's deadline (the model's
    /// `ClaimWithoutReadNoDeadlineCheck`, spec/replication.md §13, check (c)): a coordinator
    /// whose own replica holds an older lease claims the message again while the acknowledged
    /// lease still hides it (V1).
    ClaimWithoutReadNoDeadlineCheck,
    /// A claim without the read goes to the coordinator's own replica at once, with the two
    /// others (spec/replication.md §13 before *Own replica last*): an own replica that is
    /// behind the holder's lease (it holds the claim that lost the race for its `seq`, or
    /// missed an extension) takes the claim of the next `seq` that the two others refuse by
    /// (c), and that claim, of a shorter visibility than the holder's lease has left, then
    /// supersedes the lease by merge: the message is received again inside the holder's
    /// timeout (V1).
    FastClaimOwnReplicaFirst,
}

#[cfg(feature = "sim-bugs")]
thread_local! {
    static PLANTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Plants `bug` on this thread (or none). Only in builds with the feature `sim-bugs`.
#[cfg(feature = "sim-bugs")]
pub fn plant(bug: Option<Bug>) {
    PLANTED.set(bug);
}

/// Whether `bug` is planted on this thread.
#[cfg(feature = "sim-bugs")]
#[must_use]
pub fn planted(bug: Bug) -> bool {
    PLANTED.get() == Some(bug)
}

/// Whether `bug` is planted: never, without the feature `sim-bugs`.
#[cfg(not(feature = "sim-bugs"))]
#[must_use]
pub fn planted(bug: Bug) -> bool {
    let _ = bug;
    false
}
