//! Long polls across nodes (spec/replication.md §9). A receive that finds nothing and may wait
//! becomes a waiter of this node, oldest first per queue, and one task per queue with waiters
//! receives for them: at once when a wake-up names messages a write made ready (the writer's
//! node sends one to every node after the write's acks), every `POLL_PERIOD` with candidates
//! from a read quorum of indexes (the re-poll), and at the instant this node's records say one
//! of them becomes ready. A wake-up that arrives while a receive runs makes the task receive
//! again when it ends (the page's `again`). The waiter's own future holds its deadline; a
//! delivery that meets a waiter already gone is released (section 5).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tracing::debug;
use trireme_core::{Incarnation, MessageId, QueueName};
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_client::ReplicaClient;
use trireme_replication::NodeId;
use trireme_replication::placement::REPLICAS;

use super::peers::Identity;
use super::service::CANDIDATES_PER_REPLY_MAX;
use super::{Cluster, DeadLetter, Delivered, wire};
use crate::trace::{self, TraceId};

/// `POLL_PERIOD` (spec/replication.md §9): how often a node with waiters on a queue receives
/// for them with a read quorum of indexes.
pub const POLL_PERIOD: Duration = Duration::from_secs(1);
/// How long a re-poll waits for the indexes that make its read a quorum before it goes on with
/// what it has.
const INDEX_READ_TIMEOUT: Duration = POLL_PERIOD;
/// Wake-ups waiting to go to the peers at most; beyond, new ones are dropped (a lost wake-up
/// costs a waiter at most one poll period).
const WAKE_UPS_QUEUED_MAX: usize = 1_024;
/// Message ids a queue's waiters keep from wake-ups they have not received for yet, at most
/// (the oldest go first: a re-poll finds them).
const NAMED_MAX: usize = 1_024;

/// What a receive asks for: its waiter keeps it while it waits.
#[derive(Clone, Debug)]
pub struct Wait {
    /// Messages at most.
    pub max: usize,
    /// The visibility timeout of what it receives.
    pub visibility_timeout_ms: u64,
    /// The queue's `MessageRetentionPeriod` (§3).
    pub retention_ms: u64,
    /// Where the queue's dead letters go.
    pub dead_letter: Option<DeadLetter>,
}

struct Waiter {
    wait: Wait,
    reply: oneshot::Sender<Vec<Delivered>>,
}

#[derive(Default)]
struct Waiting {
    /// Oldest first.
    waiters: VecDeque<Waiter>,
    /// Messages wake-ups named that no receive for these waiters has tried yet, oldest first.
    named: VecDeque<MessageId>,
    /// Long polls whose first receive runs: they are waiters already (a wake-up meanwhile is
    /// kept for them), not yet in line.
    arriving: usize,
}

#[derive(Default)]
struct QueueWaiters {
    waiting: Mutex<Waiting>,
    /// A wake-up arrived; a permit stored while a receive runs makes the next one start at once
    /// (the page's `again`).
    woken: Notify,
}

type QueueKey = (QueueName, Incarnation);

/// This node's waiters, by queue.
#[derive(Default)]
pub(super) struct LongPolls {
    queues: Mutex<HashMap<QueueKey, Arc<QueueWaiters>>>,
}

impl LongPolls {
    /// A wake-up for `ids` of the queue, from a peer or from this node's own write.
    pub(super) fn woken(&self, queue: &QueueName, incarnation: Incarnation, ids: &[MessageId]) {
        let waiters = self
            .queues
            .lock()
            .expect("the waiters' lock is never poisoned")
            .get(&(queue.clone(), incarnation))
            .cloned();
        let Some(waiters) = waiters else {
            return;
        };
        {
            let mut waiting = waiters
                .waiting
                .lock()
                .expect("the waiters' lock is never poisoned");
            for id in ids {
                if !waiting.named.contains(id) {
                    waiting.named.push_back(*id);
                }
            }
            while waiting.named.len() > NAMED_MAX {
                waiting.named.pop_front();
            }
        }
        waiters.woken.notify_one();
    }

    /// Long polls in line on the queue at this node, their clients gone or not.
    fn in_line(&self, queue: &QueueName, incarnation: Incarnation) -> usize {
        self.queues
            .lock()
            .expect("the waiters' lock is never poisoned")
            .get(&(queue.clone(), incarnation))
            .map_or(0, |waiters| {
                waiters
                    .waiting
                    .lock()
                    .expect("the waiters' lock is never poisoned")
                    .waiters
                    .len()
            })
    }

    /// Whether this node has waiters on the queue.
    #[cfg(test)]
    fn waiting(&self, queue: &QueueName, incarnation: Incarnation) -> bool {
        self.queues
            .lock()
            .expect("the waiters' lock is never poisoned")
            .contains_key(&(queue.clone(), incarnation))
    }
}

/// The sending half of the wake-ups this node's writes send its peers, each with the trace id
/// of the request whose write made the messages ready (`crate::trace`).
pub(super) type WakeUps = mpsc::Sender<(QueueName, Incarnation, Vec<MessageId>, Option<TraceId>)>;

/// The messages and trace ids of the wake-ups of one queue gathered for one call.
type Gathered = (Vec<MessageId>, BTreeSet<TraceId>);

/// Starts the task that sends wake-ups to every peer: each once, unawaited by the write, those
/// queued together in one request per queue and peer. It ends when the cluster drops `WakeUps`.
pub(super) fn spawn_wake_ups(
    me: Identity,
    peers: Vec<(NodeId, ReplicaClient<Channel>)>,
) -> WakeUps {
    let (wake_ups, mut queued) = mpsc::channel(WAKE_UPS_QUEUED_MAX);
    tokio::spawn(async move {
        let mut calls = JoinSet::new();
        while let Some(first) = queued.recv().await {
            // In key order: the calls' order must not depend on a random hasher (the
            // simulation replays a seed bit for bit).
            let mut by_queue: BTreeMap<QueueKey, Gathered> = BTreeMap::new();
            let mut add = |(queue, incarnation, ids, trace): (
                QueueName,
                Incarnation,
                Vec<MessageId>,
                Option<TraceId>,
            )| {
                let (gathered, traces) = by_queue.entry((queue, incarnation)).or_default();
                gathered.extend(ids);
                traces.extend(trace);
            };
            add(first);
            while let Ok(more) = queued.try_recv() {
                add(more);
            }
            // Calls still running from earlier wake-ups are not waited for; finished ones go.
            while calls.try_join_next().is_some() {}
            for ((queue, incarnation), (ids, traces)) in by_queue {
                let traces: Vec<TraceId> = traces.into_iter().collect();
                let traced = trace::ids_value(&traces);
                for chunk in ids.chunks(CANDIDATES_PER_REPLY_MAX) {
                    for (peer, client) in &peers {
                        let mut client = client.clone();
                        let mut request = tonic::Request::new(pb::WakeUpRequest {
                            sender: Some(me.now().into()),
                            queue: queue.as_str().to_owned(),
                            incarnation_hlc_ms: incarnation.hlc_ms,
                            incarnation_node: u32::from(incarnation.node),
                            incarnation_nonce: incarnation.nonce,
                            messages: chunk.iter().copied().map(wire::candidate).collect(),
                        });
                        if let Some(value) = &traced {
                            request
                                .metadata_mut()
                                .insert(trace::TRACE_IDS_KEY, value.clone());
                        }
                        let peer = *peer;
                        calls.spawn(async move {
                            if let Err(status) = client.wake_up(request).await {
                                debug!(peer = peer.0, %status, "a wake-up did not arrive");
                            }
                        });
                    }
                }
            }
        }
    });
    wake_ups
}

/// Why the queue's waiters' task receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// A wake-up, or an instant this node knows a message becomes ready at: the ordinary
    /// receive, beginning with the named messages.
    Woken,
    /// The poll period: candidates from a read quorum of indexes.
    Repoll,
}

/// A long poll whose first receive runs: counted among the queue's arriving waiters until it
/// is in line or has gone.
struct Arrival {
    waiters: Arc<QueueWaiters>,
}

impl Arrival {
    /// The long poll waits in line, as the newest waiter.
    fn in_line(self, waiter: Waiter) {
        let mut waiting = self
            .waiters
            .waiting
            .lock()
            .expect("the waiters' lock is never poisoned");
        waiting.waiters.push_back(waiter);
        if !waiting.named.is_empty() {
            // A wake-up came while its first receive ran: it is served as if it had waited.
            self.waiters.woken.notify_one();
        }
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.waiters
            .waiting
            .lock()
            .expect("the waiters' lock is never poisoned")
            .arriving -= 1;
    }
}

/// What the queue's waiters' task does next.
enum Next {
    /// Receives for the oldest waiter, beginning with these named messages.
    Serve(Waiter, VecDeque<MessageId>),
    /// Nothing now: a long poll is arriving, none is in line.
    Idle,
    /// No waiter is left, and the queue's waiters are gone (a later one starts a new task).
    Gone,
}

impl Cluster {
    /// A long poll (spec/replication.md §9): the ordinary receive; if it finds nothing, waits
    /// as the queue's newest waiter until a receive for it delivers or `until` passes. Empty
    /// when nothing arrived in time. From its arrival, a wake-up for the queue is kept for it.
    pub async fn long_poll(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        wait: Wait,
        until: tokio::time::Instant,
    ) -> Vec<Delivered> {
        let (arrival, others_in_line) = self.arrive(queue, incarnation);
        // The ordinary receive, but beside waiters in line it asks no peer's index: what only
        // a peer's index shows is owed to the oldest waiter, whose re-poll reads a quorum of
        // indexes within the poll period (spec/replication.md §9, *Arrival*). Else every
        // arriving poll of a busy queue would cost a peer call.
        let candidates = if others_in_line {
            self.own_candidates(queue, incarnation, wait.max)
        } else {
            self.sampled_candidates(queue, incarnation, wait.max).await
        };
        let first = self.claim(queue, incarnation, candidates, &wait).await;
        if !first.is_empty() || tokio::time::Instant::now() >= until {
            return first;
        }
        let (reply, replied) = oneshot::channel();
        arrival.in_line(Waiter { wait, reply });
        tokio::select! {
            // A delivery that arrives with the deadline is taken: it was claimed for this wait.
            biased;
            delivered = replied => delivered.unwrap_or_default(),
            () = tokio::time::sleep_until(until) => Vec::new(),
        }
    }

    /// Long polls waiting in line on the queue at this node (those whose clients have gone
    /// leave the line at the queue's next receive for its waiters).
    #[must_use]
    pub fn waiters_in_line(&self, queue: &QueueName, incarnation: Incarnation) -> usize {
        self.inner.long_polls.in_line(queue, incarnation)
    }

    /// Wakes this node's waiters on the queue and sends the wake-up to every peer: `ids` were
    /// made ready by a write whose acks are in.
    pub(super) fn wake(&self, queue: &QueueName, incarnation: Incarnation, ids: Vec<MessageId>) {
        if ids.is_empty() {
            return;
        }
        self.inner.long_polls.woken(queue, incarnation, &ids);
        if self
            .inner
            .wake_ups
            .try_send((queue.clone(), incarnation, ids, trace::current()))
            .is_err()
        {
            debug!(%queue, "wake-ups queued beyond their bound: one dropped");
        }
    }

    /// Counts a long poll among the queue's arriving waiters (starting the queue's waiters'
    /// task if it has none), and says whether waiters were already in line.
    fn arrive(&self, queue: &QueueName, incarnation: Incarnation) -> (Arrival, bool) {
        let key = (queue.clone(), incarnation);
        let mut queues = self
            .inner
            .long_polls
            .queues
            .lock()
            .expect("the waiters' lock is never poisoned");
        let waiters = queues.entry(key.clone()).or_insert_with(|| {
            let waiters = Arc::new(QueueWaiters::default());
            tokio::spawn(self.clone().serve_waiters(key, Arc::clone(&waiters)));
            waiters
        });
        let mut waiting = waiters
            .waiting
            .lock()
            .expect("the waiters' lock is never poisoned");
        waiting.arriving += 1;
        let others_in_line = !waiting.waiters.is_empty();
        drop(waiting);
        let arrival = Arrival {
            waiters: Arc::clone(waiters),
        };
        (arrival, others_in_line)
    }

    /// The queue's waiters' task: runs while the queue has waiters.
    async fn serve_waiters(self, key: QueueKey, waiters: Arc<QueueWaiters>) {
        let (queue, incarnation) = &key;
        let mut poll = tokio::time::interval(POLL_PERIOD);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is now: the waiter's first receive has just found nothing.
        poll.tick().await;
        loop {
            let now = self.inner.me.clock.now();
            let ready_at = self
                .inner
                .store
                .view(|view| view.next_ready(queue, *incarnation, now))
                .map(|at| tokio::time::Instant::now() + Duration::from_millis(at.0 - now.0));
            let mut trigger = tokio::select! {
                biased;
                () = waiters.woken.notified() => Trigger::Woken,
                _ = poll.tick() => Trigger::Repoll,
                () = super::sleep_until_some(ready_at), if ready_at.is_some() => Trigger::Woken,
            };
            loop {
                let (waiter, named) = match self.next_waiter(&key, &waiters) {
                    Next::Serve(waiter, named) => (waiter, named),
                    Next::Idle => break,
                    Next::Gone => return,
                };
                if self.coordinating().await.is_err() {
                    // This node may not coordinate now: its waiters wait (their deadlines
                    // answer empty), and the poll period tries again.
                    put_back(&waiters, waiter, named);
                    break;
                }
                let others = match trigger {
                    Trigger::Woken => {
                        self.sampled_candidates(queue, *incarnation, waiter.wait.max)
                            .await
                    }
                    Trigger::Repoll
                        if trireme_replication::planted::planted(
                            trireme_replication::planted::Bug::WaiterReadsOwnReplica,
                        ) =>
                    {
                        self.own_candidates(queue, *incarnation, waiter.wait.max)
                    }
                    Trigger::Repoll => {
                        self.quorum_candidates(queue, *incarnation, waiter.wait.max)
                            .await
                    }
                };
                let mut candidates: Vec<MessageId> = named.iter().copied().collect();
                for id in others {
                    if !candidates.contains(&id) {
                        candidates.push(id);
                    }
                }
                // Named messages beyond what this receive tries wait for the next one.
                let untried: VecDeque<MessageId> =
                    named.into_iter().skip(waiter.wait.max).collect();
                let delivered = self
                    .claim(queue, *incarnation, candidates, &waiter.wait)
                    .await;
                if delivered.is_empty() {
                    put_back(&waiters, waiter, untried);
                    break;
                }
                if let Err(delivered) = waiter.reply.send(delivered) {
                    // Its client has gone (its deadline, or its connection): released.
                    self.release(delivered).await;
                }
                put_back_named(&waiters, untried);
                // The next waiter's receive follows at once: more may be ready.
                trigger = Trigger::Woken;
            }
        }
    }

    /// The queue's oldest waiter whose client still waits, and the named messages to try
    /// first; when none is in line, whether one is arriving.
    fn next_waiter(&self, key: &QueueKey, waiters: &Arc<QueueWaiters>) -> Next {
        let mut queues = self
            .inner
            .long_polls
            .queues
            .lock()
            .expect("the waiters' lock is never poisoned");
        let mut waiting = waiters
            .waiting
            .lock()
            .expect("the waiters' lock is never poisoned");
        while let Some(waiter) = waiting.waiters.pop_front() {
            if !waiter.reply.is_closed() {
                return Next::Serve(waiter, std::mem::take(&mut waiting.named));
            }
        }
        if waiting.arriving > 0 {
            return Next::Idle;
        }
        if queues
            .get(key)
            .is_some_and(|registered| Arc::ptr_eq(registered, waiters))
        {
            queues.remove(key);
        }
        Next::Gone
    }

    /// Releases deliveries no waiter took (spec/replication.md §5: a change of visibility to
    /// 0 with the handle they were claimed under); one whose release fails comes back at its
    /// deadline.
    async fn release(&self, delivered: Vec<Delivered>) {
        for message in delivered {
            let answer = self
                .change_visibility(
                    &message.key,
                    message.handle,
                    0,
                    trireme_core::limits::visibility_total_ms_max,
                )
                .await;
            debug!(message = %message.key.message, ?answer, "released a delivery whose waiter had gone");
        }
    }

    /// A re-poll's candidates (spec/replication.md §9, *Re-poll*): this node's own and every
    /// answering peer's, read until the answers hold two indexes of every replica set the ring
    /// places messages on, or for `INDEX_READ_TIMEOUT`.
    async fn quorum_candidates(
        &self,
        queue: &QueueName,
        incarnation: Incarnation,
        max: usize,
    ) -> Vec<MessageId> {
        let limit = max.saturating_mul(REPLICAS);
        let mut candidates = self.own_candidates(queue, incarnation, max);
        let mut answered = BTreeSet::from([self.inner.me.node]);
        let mut asked = JoinSet::new();
        for peer in self.peer_ids() {
            let cluster = self.clone();
            let queue = queue.clone();
            asked.spawn(async move {
                let theirs = cluster
                    .peer_candidates(peer, &queue, incarnation, limit)
                    .await;
                (peer, theirs)
            });
        }
        let deadline = tokio::time::Instant::now() + INDEX_READ_TIMEOUT;
        while !self.inner.index_quorum(&answered) {
            let joined = tokio::select! {
                // An answer that arrives with the deadline counts; an unbiased select would
                // draw from tokio's random source, which a simulation cannot seed.
                biased;
                joined = asked.join_next() => joined,
                () = tokio::time::sleep_until(deadline) => None,
            };
            let Some(joined) = joined else {
                break;
            };
            let (peer, theirs) = joined.expect("a candidates call does not panic");
            if let Some((theirs, _)) = theirs {
                answered.insert(peer);
                for id in theirs {
                    if !candidates.contains(&id) {
                        candidates.push(id);
                    }
                }
            }
        }
        candidates
    }
}

impl super::Inner {
    /// Whether the indexes of `answered` are a read quorum of indexes: two of every replica
    /// set the ring places messages on.
    fn index_quorum(&self, answered: &BTreeSet<NodeId>) -> bool {
        self.replica_sets.iter().all(|set| {
            set.iter()
                .filter(|member| answered.contains(member))
                .count()
                >= 2
        })
    }
}

fn put_back(waiters: &QueueWaiters, waiter: Waiter, named: VecDeque<MessageId>) {
    let mut waiting = waiters
        .waiting
        .lock()
        .expect("the waiters' lock is never poisoned");
    if !waiter.reply.is_closed() {
        // Still the oldest: it came first.
        waiting.waiters.push_front(waiter);
    }
    prepend(&mut waiting.named, named);
}

fn put_back_named(waiters: &QueueWaiters, named: VecDeque<MessageId>) {
    let mut waiting = waiters
        .waiting
        .lock()
        .expect("the waiters' lock is never poisoned");
    prepend(&mut waiting.named, named);
}

/// `older` before what `named` holds now, each once, within `NAMED_MAX`.
fn prepend(named: &mut VecDeque<MessageId>, older: VecDeque<MessageId>) {
    let newer = std::mem::replace(named, older);
    for id in newer {
        if !named.contains(&id) {
            named.push_back(id);
        }
    }
    while named.len() > NAMED_MAX {
        named.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> MessageId {
        MessageId(n)
    }

    #[test]
    fn named_messages_keep_their_order_once_each_within_the_bound() {
        let mut named: VecDeque<MessageId> = [id(3), id(4)].into();
        prepend(&mut named, [id(1), id(3)].into());
        assert_eq!(named, VecDeque::from([id(1), id(3), id(4)]));
        let mut full: VecDeque<MessageId> = (0..NAMED_MAX as u128).map(id).collect();
        prepend(&mut full, [id(u128::MAX)].into());
        assert_eq!(full.len(), NAMED_MAX);
        assert_eq!(full.front(), Some(&id(0)), "the oldest goes first");
        assert_eq!(full.back(), Some(&id(NAMED_MAX as u128 - 1)));
    }

    #[test]
    fn a_wake_up_for_a_queue_without_waiters_keeps_nothing() {
        let polls = LongPolls::default();
        let queue = QueueName::try_from("q".to_owned()).expect("a valid name");
        let incarnation = Incarnation::local(trireme_core::Millis(1));
        polls.woken(&queue, incarnation, &[id(1)]);
        assert!(!polls.waiting(&queue, incarnation));
    }
}
