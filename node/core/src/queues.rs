//! `Queues`: one node's queues as the state machine of spec/queue-core.md. `apply` advances time
//! to `now` (firing delay ends, visibility restores, retention, deduplication expiry and waiter
//! deadlines, instant by instant in time order) and then performs one command; every action
//! that makes a message ready serves that queue's waiters before it returns. It never reads a clock, never blocks,
//! never does I/O, and iterates only ordered collections, so the same inputs give the same
//! outputs bit for bit.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;

use crate::attributes::{AttributeChanges, QueueAttributes};
use crate::command::{Command, Delivery, Outcome, Step, Wakeup};
use crate::error::{HandleProblem, Reject};
use crate::ids::{
    ClaimTag, DedupId, MessageId, Millis, QueueName, QueuePrefixes, ReceiptHandle, WaiterId,
};
use crate::limits;
use crate::message::{
    AttributeValue, Message, MessageState, MessageView, SystemAttributes, check_message,
    check_system_attributes,
};
use crate::queue::{Queue, QueueStats, QueueView, Waiter, WaiterView};
use crate::records::RecordKey;

/// One node's queues, messages, waiters and deduplication windows.
#[derive(Clone, Debug, Default)]
pub struct Queues {
    /// The latest time seen; time inside the core never goes back.
    pub(crate) now: Millis,
    pub(crate) queues: BTreeMap<QueueName, Queue>,
    /// Every stored message, whichever queue holds it (`Message::queue`).
    pub(crate) messages: BTreeMap<MessageId, Message>,
    /// Names deleted less than `queue_name_reuse_ms` ago, with the time of deletion.
    pub(crate) deleted_names: BTreeMap<QueueName, Millis>,
    /// The same names by the time they become available again.
    pub(crate) name_releases: BTreeSet<(Millis, QueueName)>,
    /// Every queue with something due, by the time of its next event (`Queue::scheduled`):
    /// finding what is due is O(log queues) instead of a look at every queue.
    pub(crate) agenda: BTreeSet<(Millis, QueueName)>,
    /// Open waiters: their queue and arrival number.
    pub(crate) waiter_index: BTreeMap<WaiterId, (QueueName, u64)>,
    /// Arrival number of the next waiter; orders waiters of a queue first come, first served.
    next_arrival: u64,
    /// Records touched since the last `take_changes`.
    pub(crate) dirty: BTreeSet<RecordKey>,
    /// Queues that got a ready message and may have waiters to serve, in the order they got it.
    to_serve: VecDeque<QueueName>,
    /// Waiters answered during the current step.
    wakeups: Vec<Wakeup>,
    /// Messages that became gone during the latest step, and why. Cleared when a step starts,
    /// so it holds one step's work at most.
    gone: Vec<(MessageId, GoneReason)>,
}

/// Why a message is gone (spec/queue-core.md#variables). The core forgets a gone message; the
/// reason is reported once, by `gone_in_last_step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GoneReason {
    /// A delete with the current receipt handle.
    Deleted,
    /// Its retention ended.
    Expired,
    /// Its queue was purged.
    Purged,
    /// Its queue was deleted.
    QueueDeleted,
}

impl Queues {
    /// No queues, time 0.
    #[must_use]
    pub fn new() -> Queues {
        Queues::default()
    }

    /// The latest time seen.
    #[must_use]
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Advances time to `now` (firing due events, see the page), then applies the command.
    /// Never blocks, never reads a clock. A refused command changes nothing but the time.
    pub fn apply(&mut self, now: Millis, command: Command) -> Step {
        self.gone.clear();
        self.fire_due(now);
        let at = self.now;
        let result = self.perform(at, command);
        self.serve_pending(at);
        self.finish_step();
        Step {
            result,
            wakeups: std::mem::take(&mut self.wakeups),
        }
    }

    /// Only advances time to `now`; returns the waiters it answered (served, or empty at their
    /// deadline) in the order they were answered. A `now` earlier than the latest seen is
    /// treated as the latest seen.
    pub fn advance(&mut self, now: Millis) -> Vec<Wakeup> {
        self.gone.clear();
        self.fire_due(now);
        self.finish_step();
        std::mem::take(&mut self.wakeups)
    }

    /// Earliest time at which `advance` would change anything: a delay end, visibility expiry,
    /// retention, waiter deadline, deduplication expiry or name release. It may be `now()` (a
    /// message received with visibility 0 is restored by the next action). O(log queues).
    #[must_use]
    pub fn next_deadline(&self) -> Option<Millis> {
        self.earliest_event(None)
    }

    /// A queue's settings, counts and tags.
    #[must_use]
    pub fn queue(&self, name: &QueueName) -> Option<QueueView> {
        self.queues.get(name).map(|queue| QueueView {
            name: name.clone(),
            attributes: queue.attributes.clone(),
            incarnation: queue.incarnation,
            created_at: queue.created_at,
            modified_at: queue.modified_at,
            tags: queue.tags.clone(),
            counts: queue.counts(),
            last_purge_at: queue.last_purge_at,
        })
    }

    /// Every queue's figures for an operator's scrape, in name order: O(queues).
    #[must_use]
    pub fn stats(&self) -> Vec<QueueStats> {
        self.queues
            .iter()
            .map(|(name, queue)| QueueStats {
                name: name.clone(),
                counts: queue.counts(),
                oldest_sent_at: queue.retained.first().map(|(sent_at, _)| *sent_at),
                dead_letter_moves: queue.dead_letter_moves,
            })
            .collect()
    }

    /// Up to `limit` queue names starting with `prefix`, in name order, after `after` if given.
    #[must_use]
    pub fn list_queues(
        &self,
        prefix: &str,
        after: Option<&QueueName>,
        limit: usize,
    ) -> Vec<QueueName> {
        // Names starting with `prefix` are contiguous in name order and begin at the prefix
        // itself; a prefix that is no legal name prefix matches nothing.
        let from_prefix = if prefix.is_empty() {
            Bound::Unbounded
        } else {
            match QueueName::try_from(prefix) {
                Ok(name) => Bound::Included(name),
                Err(_) => return Vec::new(),
            }
        };
        let from_after = after.map_or(Bound::Unbounded, |after| Bound::Excluded(after.clone()));
        let start = match (from_prefix, from_after) {
            (Bound::Included(prefix), Bound::Excluded(after)) if after >= prefix => {
                Bound::Excluded(after)
            }
            (Bound::Unbounded, from_after) => from_after,
            (from_prefix, _) => from_prefix,
        };
        self.queues
            .range((start, Bound::Unbounded))
            .map(|(name, _)| name)
            .take_while(|name| name.as_str().starts_with(prefix))
            .take(limit)
            .cloned()
            .collect()
    }

    /// The queues whose redrive policy names `dlq` as their dead-letter queue, in name order.
    #[must_use]
    pub fn dead_letter_sources(&self, dlq: &QueueName) -> Vec<QueueName> {
        self.queues
            .iter()
            .filter(|(_, queue)| {
                queue
                    .attributes
                    .redrive
                    .as_ref()
                    .is_some_and(|policy| &policy.dead_letter_queue == dlq)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The full state of message `id` if it is stored in `queue`.
    #[must_use]
    pub fn message(&self, queue: &QueueName, id: MessageId) -> Option<MessageView> {
        self.messages
            .get(&id)
            .filter(|message| &message.queue == queue)
            .map(|message| message.view(id))
    }

    /// Every message stored in `queue`, by `(sent_at, id)`.
    pub fn messages(&self, queue: &QueueName) -> impl Iterator<Item = MessageView> + '_ {
        self.queues
            .get(queue)
            .into_iter()
            .flat_map(|q| q.retained.iter())
            .map(|&(_, id)| {
                self.messages
                    .get(&id)
                    .expect("a retained message is stored")
                    .view(id)
            })
    }

    /// The open waiters of `queue`, oldest first (the order they are served in).
    #[must_use]
    pub fn waiters(&self, queue: &QueueName) -> Vec<WaiterId> {
        self.queues
            .get(queue)
            .map(|q| q.waiters.values().map(|waiter| waiter.id).collect())
            .unwrap_or_default()
    }

    /// The messages that became gone during the latest `apply` or `advance` (time advance and
    /// command together), in the order it happened, with the reason. For tracing and for the
    /// conformance tests; the state itself keeps no trace of a gone message.
    #[must_use]
    pub fn gone_in_last_step(&self) -> &[(MessageId, GoneReason)] {
        &self.gone
    }

    /// The open waiters of `queue` with their parameters, oldest first.
    #[must_use]
    pub fn waiter_views(&self, queue: &QueueName) -> Vec<WaiterView> {
        self.queues
            .get(queue)
            .map(|q| {
                q.waiters
                    .values()
                    .map(|waiter| WaiterView {
                        id: waiter.id,
                        max: waiter.max,
                        visibility_s: waiter.visibility_s,
                        deadline: waiter.deadline,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    // ----- time -----

    /// Advances time to `now` (spec/queue-core.md#actions): fires, instant by instant in time
    /// order, everything due at or before it, then sets the clock to `now`.
    ///
    /// Within one instant the page's order holds: delay ends, visibility restores, serving the
    /// queues that got a ready message (sources before their dead-letter queues), retention, deduplication expiry, waiter
    /// deadlines, then the end of deleted names' reuse windows. A message delivered with
    /// visibility 0 while serving at an instant is `InFlight{instant}`: it is restored at the
    /// next instant this advance fires, or at `now` if none is left, or (when the instant is
    /// `now` itself) by the next action, as the page says of a visibility of 0.
    fn fire_due(&mut self, now: Millis) {
        let target = now.max(self.now);
        let mut last: Option<Millis> = None;
        loop {
            let instant = match self.earliest_event(last) {
                Some(at) if at <= target => at,
                _ => {
                    // Only deliveries with visibility 0 made at `last` can still be due.
                    let left_in_flight = last.is_some_and(|last| last < target)
                        && self.earliest_event(None).is_some_and(|at| at <= target);
                    if !left_in_flight {
                        break;
                    }
                    target
                }
            };
            // I11 held after the previous step, so nothing was overdue then.
            assert!(instant >= self.now);
            assert!(last.is_none_or(|last| instant > last));
            self.fire_instant(instant);
            last = Some(instant);
        }
        self.now = target;
    }

    /// The earliest time anything is due. With `after`, in-flight deadlines at or before it
    /// are skipped: after an instant is fired, those are only deliveries with visibility 0
    /// made at that instant, and only the few queues they belong to are looked at closely.
    /// O(log queues + log n) plus those queues.
    pub(crate) fn earliest_event(&self, after: Option<Millis>) -> Option<Millis> {
        let mut earliest = self
            .name_releases
            .first()
            .map(|&(release_at, _)| release_at);
        for (scheduled, name) in &self.agenda {
            let next = match after {
                Some(after) if *scheduled <= after => {
                    self.queues[name].next_event_after(Some(after))
                }
                _ => Some(*scheduled),
            };
            if let Some(next) = next {
                earliest = Some(earliest.map_or(next, |earliest| earliest.min(next)));
            }
            if after.is_none_or(|after| *scheduled > after) {
                // The agenda is in time order: no later entry can be earlier.
                break;
            }
        }
        earliest
    }

    /// Puts `name`'s next event into the agenda after its indexes changed. A deleted queue has
    /// no entry (`delete_queue` removes it).
    pub(crate) fn reschedule(&mut self, name: &QueueName) {
        let Some(queue) = self.queues.get_mut(name) else {
            return;
        };
        let next = queue.next_event();
        if next == queue.scheduled {
            return;
        }
        if let Some(previous) = queue.scheduled {
            let removed = self.agenda.remove(&(previous, name.clone()));
            assert!(removed, "{name} was scheduled at {previous}");
        }
        if let Some(next) = next {
            self.agenda.insert((next, name.clone()));
        }
        queue.scheduled = next;
    }

    /// Fires everything due at or before `at`, in the page's order for one instant. Looks only
    /// at the queues the agenda says have something due.
    fn fire_instant(&mut self, at: Millis) {
        self.now = at;
        let due: Vec<QueueName> = self
            .agenda
            .iter()
            .take_while(|(scheduled, _)| *scheduled <= at)
            .map(|(_, name)| name.clone())
            .collect();
        // Delay ends, then visibility restores: each a batch of what was due when it started.
        let delay_ends: Vec<MessageId> = due
            .iter()
            .flat_map(|name| {
                self.queues[name]
                    .delayed
                    .iter()
                    .take_while(move |(until, _)| *until <= at)
                    .map(|&(_, id)| id)
            })
            .collect();
        let mut became_ready = BTreeSet::new();
        for id in delay_ends {
            assert!(matches!(
                self.messages[&id].state,
                MessageState::Delayed { until } if until <= at
            ));
            self.set_state(id, MessageState::Ready { since: at });
            became_ready.insert(self.messages[&id].queue.clone());
        }
        let restores: Vec<MessageId> = due
            .iter()
            .flat_map(|name| {
                self.queues[name]
                    .in_flight
                    .iter()
                    .take_while(move |(until, _)| *until <= at)
                    .map(|&(_, id)| id)
            })
            .collect();
        for id in restores {
            assert!(matches!(
                self.messages[&id].state,
                MessageState::InFlight { until } if until <= at
            ));
            // The handle is kept: clearing it would let `seq` restart and a superseded handle
            // become valid again (spec/queue-core.md#considerations).
            self.set_state(id, MessageState::Ready { since: at });
            became_ready.insert(self.messages[&id].queue.clone());
        }
        // Sources before their dead-letter queues (then by name), as the model serves `Q`
        // before `D`: a message a source's waiter moves down the chain meets the dead-letter
        // queue's waiters in the same order whatever the queues are called.
        let mut became_ready: Vec<(usize, QueueName)> = became_ready
            .into_iter()
            .map(|name| (self.dead_letter_queues_after(&name), name))
            .collect();
        became_ready.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, name) in became_ready {
            self.serve(at, &name);
        }
        // Retention, deduplication expiry, waiter deadlines. Serving cannot make anything of
        // these due (a message moved past its retention is gone at once), so the queues due
        // when the instant began are all there is to look at.
        for name in &due {
            self.expire_retained(name, at);
            let queue = self
                .queues
                .get_mut(name)
                .expect("no queue is deleted while time advances");
            while let Some((expires_at, dedup)) = queue.dedup_expiry.first().cloned() {
                if expires_at > at {
                    break;
                }
                queue.remove_dedup(&dedup);
                self.dirty.insert(RecordKey::Dedup(name.clone(), dedup));
            }
            while let Some(&(deadline, arrival)) = queue.waiter_deadlines.first() {
                if deadline > at {
                    break;
                }
                let waiter = queue.remove_waiter(arrival);
                let removed = self.waiter_index.remove(&waiter.id);
                assert!(removed.is_some());
                self.wakeups.push(Wakeup::Empty { waiter: waiter.id });
            }
            self.reschedule(name);
        }
        while let Some((release_at, name)) = self.name_releases.first().cloned() {
            if release_at > at {
                break;
            }
            self.name_releases.remove(&(release_at, name.clone()));
            let deleted_at = self
                .deleted_names
                .remove(&name)
                .expect("a released name was deleted");
            assert_eq!(deleted_at.plus_ms(limits::queue_name_reuse_ms), release_at);
            self.dirty.insert(RecordKey::DeletedName(name));
        }
    }

    fn finish_step(&mut self) {
        assert!(
            self.to_serve.is_empty(),
            "every ready message was offered to waiters"
        );
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    // ----- commands -----

    fn perform(&mut self, at: Millis, command: Command) -> Result<Outcome, Reject> {
        match command {
            Command::CreateQueue {
                name,
                attributes,
                tags,
            } => self.create_queue(at, name, attributes, tags),
            Command::SetQueueAttributes { name, changes } => {
                self.set_queue_attributes(at, &name, &changes)
            }
            Command::DeleteQueue { name } => self.delete_queue(at, &name),
            Command::PurgeQueue { name } => self.purge_queue(at, &name),
            Command::TagQueue { name, tags } => self.tag_queue(&name, tags),
            Command::UntagQueue { name, keys } => {
                let queue = self.queue_mut(&name)?;
                for key in &keys {
                    queue.tags.remove(key);
                }
                self.dirty.insert(RecordKey::Queue(name));
                Ok(Outcome::Done)
            }
            Command::Send {
                queue,
                id,
                body,
                attributes,
                system,
                delay_s,
                dedup,
            } => self.send(at, queue, id, body, attributes, system, delay_s, dedup),
            Command::Receive {
                queue,
                max,
                visibility_s,
                wait_s,
                waiter,
            } => self.receive(at, &queue, max, visibility_s, wait_s, waiter),
            Command::CancelWaiter { waiter } => {
                if let Some((queue, arrival)) = self.waiter_index.remove(&waiter) {
                    self.queues
                        .get_mut(&queue)
                        .expect("an open waiter's queue exists")
                        .remove_waiter(arrival);
                    self.reschedule(&queue);
                }
                Ok(Outcome::Done)
            }
            Command::Delete { queue, handle } => self.delete(&queue, &handle),
            Command::ChangeVisibility {
                queue,
                handle,
                timeout_s,
            } => self.change_visibility(at, &queue, &handle, timeout_s),
            Command::DeadLetterNow { queue, handle } => self.dead_letter_now(at, &queue, &handle),
            Command::Redrive {
                from,
                to,
                max,
                allowed,
            } => self.redrive(at, &from, to.as_ref(), max, allowed.as_ref()),
        }
    }

    fn queue_ref(&self, name: &QueueName) -> Result<&Queue, Reject> {
        self.queues
            .get(name)
            .ok_or_else(|| Reject::QueueNotFound { name: name.clone() })
    }

    fn queue_mut(&mut self, name: &QueueName) -> Result<&mut Queue, Reject> {
        self.queues
            .get_mut(name)
            .ok_or_else(|| Reject::QueueNotFound { name: name.clone() })
    }

    fn create_queue(
        &mut self,
        at: Millis,
        name: QueueName,
        attributes: QueueAttributes,
        tags: BTreeMap<String, String>,
    ) -> Result<Outcome, Reject> {
        attributes.validate()?;
        check_tags(&tags)?;
        if self.deleted_names.contains_key(&name) {
            return Err(Reject::QueueDeletedRecently { name });
        }
        if let Some(existing) = self.queues.get(&name) {
            return if existing.attributes == attributes {
                Ok(Outcome::QueueCreated { created: false })
            } else {
                Err(Reject::QueueNameExists { name })
            };
        }
        if self.queues.len() >= limits::queues_max {
            return Err(Reject::QueueLimit {
                max: limits::queues_max,
            });
        }
        if let Some(policy) = &attributes.redrive {
            self.check_redrive_target(&name, &policy.dead_letter_queue)?;
        }
        self.queues
            .insert(name.clone(), Queue::new(attributes, at, tags));
        self.dirty.insert(RecordKey::Queue(name));
        Ok(Outcome::QueueCreated { created: true })
    }

    /// A redrive policy of `source` may name `dlq` only if it exists, is another queue, admits
    /// `source`, and does not lead back to `source` through other queues' policies (a cycle
    /// would let one receive move a message around forever).
    fn check_redrive_target(&self, source: &QueueName, dlq: &QueueName) -> Result<(), Reject> {
        let refuse = |reason: String| Reject::InvalidAttribute {
            attribute: "RedrivePolicy",
            reason,
        };
        if dlq == source {
            return Err(refuse(format!(
                "the dead-letter queue must be another queue than {source}"
            )));
        }
        let target = self
            .queues
            .get(dlq)
            .ok_or_else(|| refuse(format!("dead-letter queue {dlq} does not exist")))?;
        if !target.attributes.redrive_allow.admits(source) {
            return Err(Reject::RedriveNotAllowed {
                source_queue: source.clone(),
                dead_letter_queue: dlq.clone(),
            });
        }
        // Follow the chain of policies by name, existing queues or not; it is finite because
        // every policy set so far passed this check.
        let mut seen = BTreeSet::new();
        let mut next = Some(dlq);
        while let Some(current) = next {
            if current == source {
                return Err(refuse(format!(
                    "dead-letter queue {dlq} leads back to {source}: redrive policies may not form a cycle"
                )));
            }
            assert!(seen.insert(current), "redrive policies form a cycle");
            next = self
                .queues
                .get(current)
                .and_then(|queue| queue.attributes.redrive.as_ref())
                .map(|policy| &policy.dead_letter_queue);
        }
        let chain_queues = self.queues_leading_into(source) + 1 + seen.len();
        if chain_queues > limits::redrive_chain_queues_max {
            return Err(refuse(format!(
                "the chain of dead-letter queues would hold {chain_queues} queues, at most {} are allowed",
                limits::redrive_chain_queues_max
            )));
        }
        Ok(())
    }

    /// How many queues follow `name` along its chain of redrive policies (existing or not).
    /// O(chain length), at most `redrive_chain_queues_max`.
    fn dead_letter_queues_after(&self, name: &QueueName) -> usize {
        let mut count = 0;
        let mut next = self
            .queues
            .get(name)
            .and_then(|queue| queue.attributes.redrive.as_ref());
        while let Some(policy) = next {
            count += 1;
            assert!(count < limits::redrive_chain_queues_max);
            next = self
                .queues
                .get(&policy.dead_letter_queue)
                .and_then(|queue| queue.attributes.redrive.as_ref());
        }
        count
    }

    /// The length of the longest chain of redrive policies that ends at `name` (0 when no
    /// queue names it as its dead-letter queue). O(queues · chain length); administrative
    /// commands only.
    fn queues_leading_into(&self, name: &QueueName) -> usize {
        let mut depth = 0;
        let mut frontier = BTreeSet::from([name.clone()]);
        loop {
            let previous: BTreeSet<QueueName> = self
                .queues
                .iter()
                .filter(|(_, queue)| {
                    queue
                        .attributes
                        .redrive
                        .as_ref()
                        .is_some_and(|policy| frontier.contains(&policy.dead_letter_queue))
                })
                .map(|(name, _)| name.clone())
                .collect();
            if previous.is_empty() {
                return depth;
            }
            depth += 1;
            // Chains are acyclic and capped, so this is a bound, not a guess.
            assert!(depth <= limits::redrive_chain_queues_max);
            frontier = previous;
        }
    }

    fn set_queue_attributes(
        &mut self,
        at: Millis,
        name: &QueueName,
        changes: &AttributeChanges,
    ) -> Result<Outcome, Reject> {
        let current = self.queue_ref(name)?;
        let attributes = current.attributes.with(changes);
        attributes.validate()?;
        if let Some(Some(policy)) = &changes.redrive {
            self.check_redrive_target(name, &policy.dead_letter_queue)?;
        }
        let queue = self.queue_mut(name)?;
        let retention_changed = queue.attributes.retention_s != attributes.retention_s;
        queue.attributes = attributes;
        queue.modified_at = at;
        self.dirty.insert(RecordKey::Queue(name.clone()));
        if retention_changed {
            // A shorter retention can put stored messages past it now; they go at once so
            // I11 (no message stored past its retention) holds after every action.
            self.expire_retained(name, at);
            self.reschedule(name);
        }
        Ok(Outcome::Done)
    }

    fn delete_queue(&mut self, at: Millis, name: &QueueName) -> Result<Outcome, Reject> {
        let queue = self
            .queues
            .remove(name)
            .ok_or_else(|| Reject::QueueNotFound { name: name.clone() })?;
        if let Some(scheduled) = queue.scheduled {
            assert!(self.agenda.remove(&(scheduled, name.clone())));
        }
        for &(_, id) in &queue.retained {
            let message = self
                .messages
                .remove(&id)
                .expect("a retained message is stored");
            assert_eq!(&message.queue, name);
            self.dirty.insert(RecordKey::Message(name.clone(), id));
            self.note_gone(id, GoneReason::QueueDeleted);
        }
        for dedup in queue.dedup.keys() {
            self.dirty
                .insert(RecordKey::Dedup(name.clone(), dedup.clone()));
        }
        for waiter in queue.waiters.values() {
            self.waiter_index.remove(&waiter.id);
            self.wakeups.push(Wakeup::Empty { waiter: waiter.id });
        }
        self.release_name_at(name.clone(), at);
        self.dirty.insert(RecordKey::Queue(name.clone()));
        self.dirty.insert(RecordKey::DeletedName(name.clone()));
        Ok(Outcome::Done)
    }

    /// Remembers that `name` was deleted at `deleted_at`, until the reuse window ends.
    pub(crate) fn release_name_at(&mut self, name: QueueName, deleted_at: Millis) {
        let release_at = deleted_at.plus_ms(limits::queue_name_reuse_ms);
        assert!(self.name_releases.insert((release_at, name.clone())));
        let previous = self.deleted_names.insert(name, deleted_at);
        assert!(
            previous.is_none(),
            "a name is deleted at most once per window"
        );
    }

    fn purge_queue(&mut self, at: Millis, name: &QueueName) -> Result<Outcome, Reject> {
        let queue = self.queue_ref(name)?;
        if let Some(purged_at) = queue.last_purge_at {
            let elapsed_ms = at.since(purged_at);
            if elapsed_ms < limits::purge_interval_ms {
                return Err(Reject::PurgeInProgress {
                    name: name.clone(),
                    retry_after_ms: limits::purge_interval_ms - elapsed_ms,
                });
            }
        }
        let ids: Vec<MessageId> = queue.retained.iter().map(|&(_, id)| id).collect();
        for id in ids {
            self.make_gone(id, GoneReason::Purged);
        }
        self.queue_mut(name)?.last_purge_at = Some(at);
        self.dirty.insert(RecordKey::Queue(name.clone()));
        Ok(Outcome::Done)
    }

    fn tag_queue(
        &mut self,
        name: &QueueName,
        tags: BTreeMap<String, String>,
    ) -> Result<Outcome, Reject> {
        let queue = self.queue_ref(name)?;
        let mut merged = queue.tags.clone();
        merged.extend(tags);
        check_tags(&merged)?;
        self.queue_mut(name)?.tags = merged;
        self.dirty.insert(RecordKey::Queue(name.clone()));
        Ok(Outcome::Done)
    }

    #[allow(clippy::too_many_arguments)] // One argument per field of `Command::Send`.
    fn send(
        &mut self,
        at: Millis,
        name: QueueName,
        id: MessageId,
        body: String,
        attributes: BTreeMap<String, AttributeValue>,
        system: SystemAttributes,
        delay_s: Option<u32>,
        dedup: Option<DedupId>,
    ) -> Result<Outcome, Reject> {
        let queue = self.queue_ref(&name)?;
        let delay_s = delay_s.unwrap_or(queue.attributes.delay_s);
        if delay_s > limits::delay_s_max {
            return Err(Reject::InvalidParameter {
                parameter: "DelaySeconds",
                reason: format!("must be in 0..={}, got {delay_s}", limits::delay_s_max),
            });
        }
        check_message(&body, &attributes, queue.attributes.message_bytes_max)?;
        check_system_attributes(&system)?;
        if let Some(dedup) = &dedup
            && let Some(entry) = queue.dedup.get(dedup)
        {
            // The window is open (entries are dropped when it closes): answer with the first
            // message's id, whatever became of that message.
            assert!(entry.expires_at > at);
            return Ok(Outcome::Sent {
                id: entry.message,
                duplicate: true,
            });
        }
        if self.messages.contains_key(&id) {
            return Err(Reject::MessageIdExists { message: id });
        }
        let state = if delay_s > 0 {
            MessageState::Delayed {
                until: at.plus_s(delay_s),
            }
        } else {
            MessageState::Ready { since: at }
        };
        self.insert_message(
            id,
            Message {
                queue: name.clone(),
                state,
                receive_count: 0,
                last_seq: 0,
                first_receive_at: None,
                received_at: None,
                handle: None,
                sent_at: at,
                source: None,
                body,
                attributes,
                system,
            },
        );
        // The body's only `Put`: moves and state changes rewrite the state record alone.
        self.dirty.insert(RecordKey::MessageBody(id));
        if let Some(dedup) = dedup {
            self.queues
                .get_mut(&name)
                .expect("checked above")
                .insert_dedup(dedup.clone(), id, at.plus_ms(limits::dedup_window_ms));
            self.reschedule(&name);
            self.dirty.insert(RecordKey::Dedup(name.clone(), dedup));
        }
        if matches!(state, MessageState::Ready { .. }) {
            self.to_serve.push_back(name);
        }
        Ok(Outcome::Sent {
            id,
            duplicate: false,
        })
    }

    fn receive(
        &mut self,
        at: Millis,
        name: &QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
        waiter: WaiterId,
    ) -> Result<Outcome, Reject> {
        let queue = self.queue_ref(name)?;
        let (visibility_s, wait_s) =
            receive_parameters(&queue.attributes, max, visibility_s, wait_s)?;
        if wait_s > 0 {
            if self.waiter_index.contains_key(&waiter) {
                return Err(Reject::WaiterExists { waiter });
            }
            if queue.waiters.len() >= limits::waiters_per_queue_max {
                return Err(Reject::WaiterLimit {
                    name: name.clone(),
                    max: limits::waiters_per_queue_max,
                });
            }
        }
        if queue.in_flight.len() as u64 >= limits::inflight_per_queue_max {
            return Err(Reject::InflightLimit {
                name: name.clone(),
                max: limits::inflight_per_queue_max,
            });
        }
        let deliveries = self.take_ready(at, name, max, visibility_s);
        if !deliveries.is_empty() || wait_s == 0 {
            return Ok(Outcome::Received(deliveries));
        }
        let queue = self.queues.get_mut(name).expect("checked above");
        // Nothing was delivered, so nothing is ready: the new waiter is not idle (I3).
        assert!(queue.ready.is_empty());
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        queue.push_waiter(
            arrival,
            Waiter {
                id: waiter,
                max,
                visibility_s,
                deadline: at.plus_s(wait_s),
            },
        );
        self.reschedule(name);
        self.waiter_index.insert(waiter, (name.clone(), arrival));
        Ok(Outcome::Waiting { waiter })
    }

    /// The *Receive* effect: takes ready messages of `name` oldest first until `max` are
    /// delivered, the queue has none ready, or its in-flight cap is reached; a message whose
    /// receive count reached the redrive policy's maximum moves to the dead-letter queue
    /// instead (and that queue is queued for serving).
    fn take_ready(
        &mut self,
        at: Millis,
        name: &QueueName,
        max: u32,
        visibility_s: u32,
    ) -> Vec<Delivery> {
        assert!((1..=limits::batch_entries_max).contains(&max));
        assert!(visibility_s <= limits::visibility_timeout_s_max);
        let mut deliveries = Vec::new();
        while deliveries.len() < max as usize {
            let queue = self
                .queues
                .get(name)
                .expect("receiving from an existing queue");
            let Some(&(_, id)) = queue.ready.first() else {
                break;
            };
            let receive_count = self.messages[&id].receive_count;
            let dead_letter_queue = queue
                .attributes
                .redrive
                .as_ref()
                .filter(|policy| {
                    receive_count >= policy.max_receive_count
                        && self.queues.contains_key(&policy.dead_letter_queue)
                })
                .map(|policy| policy.dead_letter_queue.clone());
            if let Some(dead_letter_queue) = dead_letter_queue {
                self.dead_letter_move(at, id, name, &dead_letter_queue);
                continue;
            }
            if queue.in_flight.len() as u64 >= limits::inflight_per_queue_max {
                break;
            }
            deliveries.push(self.deliver(at, id, visibility_s));
        }
        deliveries
    }

    /// Delivers one ready message: a new receipt handle, in flight for `visibility_s`.
    fn deliver(&mut self, at: Millis, id: MessageId, visibility_s: u32) -> Delivery {
        let message = self
            .messages
            .get_mut(&id)
            .expect("a ready message is stored");
        assert!(matches!(message.state, MessageState::Ready { .. }));
        assert!(message.handle.is_none() || message.handle == Some(message.last_seq));
        message.receive_count += 1;
        message.last_seq += 1;
        message.handle = Some(message.last_seq);
        message.received_at = Some(at);
        let first_receive_at = *message.first_receive_at.get_or_insert(at);
        let until = at.plus_s(visibility_s);
        let queue = message.queue.clone();
        let seq = message.last_seq;
        self.set_state(id, MessageState::InFlight { until });
        let message = &self.messages[&id];
        Delivery {
            queue: queue.clone(),
            message: id,
            handle: ReceiptHandle {
                incarnation: self.queues[&queue].incarnation,
                queue,
                message: id,
                seq,
                claim: ClaimTag::default(),
            },
            body: message.body.clone(),
            attributes: message.attributes.clone(),
            system: message.system.clone(),
            receive_count: message.receive_count,
            sent_at: message.sent_at,
            first_receive_at,
            source: message.source.clone(),
        }
    }

    /// *DeadLetterMove*: `id` leaves `from` for `to`, ready, with no handle (handles are per
    /// queue) and `source = from`; receive count, first receive, `sent_at`, body and attributes
    /// are kept. Not a receive. Also the effect of *DeadLetterNow*. Then *Serve(to)*, before the receive on `from` goes on. The
    /// recursion is as deep as the chain of redrive policies, which `check_redrive_target`
    /// keeps acyclic and at most `redrive_chain_queues_max` long.
    fn dead_letter_move(&mut self, at: Millis, id: MessageId, from: &QueueName, to: &QueueName) {
        assert!(from != to);
        let message = self
            .messages
            .get_mut(&id)
            .expect("a moved message is stored");
        assert!(&message.queue == from);
        assert!(matches!(message.state, MessageState::Ready { .. }));
        let kept = (
            message.receive_count,
            message.last_seq,
            message.first_receive_at,
            message.received_at,
            message.sent_at,
        );
        message.source = Some(from.clone());
        message.handle = None;
        self.queues
            .get_mut(from)
            .expect("a message moves out of an existing queue")
            .dead_letter_moves += 1;
        if self.relocate(at, id, to) {
            // The move keeps what the page says it keeps.
            let moved = &self.messages[&id];
            assert!(&moved.queue == to);
            assert!(moved.source.as_ref() == Some(from));
            assert!(moved.handle.is_none());
            assert_eq!(
                (
                    moved.receive_count,
                    moved.last_seq,
                    moved.first_receive_at,
                    moved.received_at,
                    moved.sent_at,
                ),
                kept
            );
            self.serve(at, to);
        }
    }

    /// Moves a ready message to `to`, ready since `at`. If the message is already past `to`'s
    /// retention (counted from `sent_at`) it is gone instead, so no message is ever stored past
    /// its retention (I11). Returns whether the message is stored in `to`.
    fn relocate(&mut self, at: Millis, id: MessageId, to: &QueueName) -> bool {
        let message = self.remove_message(id);
        assert!(matches!(message.state, MessageState::Ready { .. }));
        let retention_ms = self.queues[to].attributes.retention_ms();
        if message.sent_at.plus_ms(retention_ms) <= at {
            self.note_gone(id, GoneReason::Expired);
            return false;
        }
        self.insert_message(
            id,
            Message {
                queue: to.clone(),
                state: MessageState::Ready { since: at },
                ..message
            },
        );
        true
    }

    /// *Serve* for every queue that got a ready message, until none is left to serve.
    fn serve_pending(&mut self, at: Millis) {
        while let Some(name) = self.to_serve.pop_front() {
            self.serve(at, &name);
        }
    }

    /// *Serve(q)*: while `q` has waiters and a ready message, the oldest waiter receives with
    /// its own `max` and visibility; it leaves if that delivered anything, else (all it took
    /// moved to the dead-letter queue) it stays. A waiter that finds the in-flight cap reached
    /// is answered empty, so no waiter waits beside a ready message (I3).
    fn serve(&mut self, at: Millis, name: &QueueName) {
        loop {
            let Some(queue) = self.queues.get(name) else {
                return;
            };
            let Some((&arrival, waiter)) = queue.waiters.first_key_value() else {
                return;
            };
            if queue.ready.is_empty() {
                return;
            }
            let (max, visibility_s) = (waiter.max, waiter.visibility_s);
            if queue.in_flight.len() as u64 >= limits::inflight_per_queue_max {
                self.end_waiter(name, arrival, None);
                continue;
            }
            let deliveries = self.take_ready(at, name, max, visibility_s);
            if deliveries.is_empty() {
                assert!(self.queues[name].ready.is_empty());
                return;
            }
            self.end_waiter(name, arrival, Some(deliveries));
        }
    }

    fn end_waiter(&mut self, name: &QueueName, arrival: u64, deliveries: Option<Vec<Delivery>>) {
        let waiter = self
            .queues
            .get_mut(name)
            .expect("a waiter's queue exists")
            .remove_waiter(arrival);
        self.reschedule(name);
        let removed = self.waiter_index.remove(&waiter.id);
        assert!(removed.is_some());
        self.wakeups.push(match deliveries {
            Some(deliveries) => Wakeup::Served {
                waiter: waiter.id,
                deliveries,
            },
            None => Wakeup::Empty { waiter: waiter.id },
        });
    }

    /// Classifies a handle presented to `queue` (spec/queue-core.md#deletequeue-handle): Ok(None)
    /// when the message is no longer in the queue, Ok(Some(id)) when the handle is the newest.
    fn classify_handle(
        &self,
        name: &QueueName,
        handle: &ReceiptHandle,
    ) -> Result<Option<MessageId>, Reject> {
        let queue = self.queue_ref(name)?;
        if &handle.queue != name || handle.incarnation != queue.incarnation {
            return Err(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::WrongQueue,
            });
        }
        let Some(message) = self
            .messages
            .get(&handle.message)
            .filter(|message| &message.queue == name)
        else {
            return Ok(None);
        };
        let Some(newest) = message.handle else {
            return Err(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued,
            });
        };
        if handle.seq == 0 || handle.seq > message.last_seq {
            return Err(Reject::ReceiptHandleInvalid {
                reason: HandleProblem::NeverIssued,
            });
        }
        if handle.seq < newest {
            return Err(Reject::StaleReceiptHandle {
                message: handle.message,
            });
        }
        assert_eq!(handle.seq, newest);
        Ok(Some(handle.message))
    }

    fn delete(&mut self, name: &QueueName, handle: &ReceiptHandle) -> Result<Outcome, Reject> {
        match self.classify_handle(name, handle)? {
            None => Ok(Outcome::Deleted { already_gone: true }),
            Some(id) => {
                self.make_gone(id, GoneReason::Deleted);
                Ok(Outcome::Deleted {
                    already_gone: false,
                })
            }
        }
    }

    fn change_visibility(
        &mut self,
        at: Millis,
        name: &QueueName,
        handle: &ReceiptHandle,
        timeout_s: u32,
    ) -> Result<Outcome, Reject> {
        self.queue_ref(name)?;
        if timeout_s > limits::visibility_timeout_s_max {
            return Err(Reject::InvalidParameter {
                parameter: "VisibilityTimeout",
                reason: format!(
                    "must be in 0..={}, got {timeout_s}",
                    limits::visibility_timeout_s_max
                ),
            });
        }
        let Some(id) = self.classify_handle(name, handle)? else {
            return Err(Reject::MessageNotInFlight {
                message: handle.message,
            });
        };
        let message = &self.messages[&id];
        let received_at = message
            .received_at
            .expect("a message with a handle was received");
        let cap = received_at.plus_ms(limits::visibility_total_ms_max);
        let until = at.plus_s(timeout_s);
        if until > cap {
            return Err(Reject::VisibilityCapExceeded {
                message: id,
                requested_until_ms: until.0,
                cap_ms: cap.0,
            });
        }
        assert!(!matches!(message.state, MessageState::Delayed { .. }));
        if timeout_s == 0 {
            self.set_state(id, MessageState::Ready { since: at });
            self.to_serve.push_back(name.clone());
        } else {
            let was_ready = matches!(message.state, MessageState::Ready { .. });
            if was_ready
                && self.queues[name].in_flight.len() as u64 >= limits::inflight_per_queue_max
            {
                return Err(Reject::InflightLimit {
                    name: name.clone(),
                    max: limits::inflight_per_queue_max,
                });
            }
            self.set_state(id, MessageState::InFlight { until });
        }
        Ok(Outcome::VisibilityChanged)
    }

    /// *DeadLetterNow* (spec/queue-core.md#deadletternowq-handle): the redrive policy first,
    /// then the handle as a visibility change classifies it; a current handle moves the message
    /// as *DeadLetterMove* does, which serves the dead-letter queue's waiters.
    fn dead_letter_now(
        &mut self,
        at: Millis,
        name: &QueueName,
        handle: &ReceiptHandle,
    ) -> Result<Outcome, Reject> {
        let queue = self.queue_ref(name)?;
        let Some(policy) = &queue.attributes.redrive else {
            return Err(Reject::NoRedrivePolicy { name: name.clone() });
        };
        let dead_letter_queue = policy.dead_letter_queue.clone();
        if !self.queues.contains_key(&dead_letter_queue) {
            return Err(Reject::DeadLetterQueueMissing {
                name: name.clone(),
                dead_letter_queue,
            });
        }
        let Some(id) = self.classify_handle(name, handle)? else {
            return Err(Reject::MessageNotInFlight {
                message: handle.message,
            });
        };
        let message = &self.messages[&id];
        // Only a receive issues a handle, and it counts itself; a delay ends before a receive.
        assert!(message.receive_count >= 1);
        assert!(message.first_receive_at.is_some());
        assert!(!matches!(message.state, MessageState::Delayed { .. }));
        if let MessageState::InFlight { .. } = message.state {
            // Out of flight first: a move takes a ready message (its `since` is replaced).
            self.set_state(id, MessageState::Ready { since: at });
        }
        self.dead_letter_move(at, id, name, &dead_letter_queue);
        Ok(Outcome::DeadLettered { dead_letter_queue })
    }

    fn redrive(
        &mut self,
        at: Millis,
        from: &QueueName,
        to: Option<&QueueName>,
        max: u32,
        allowed: Option<&QueuePrefixes>,
    ) -> Result<Outcome, Reject> {
        let queue = self.queue_ref(from)?;
        if !(1..=limits::redrive_messages_max).contains(&max) {
            return Err(Reject::InvalidParameter {
                parameter: "MaxNumberOfMessages",
                reason: format!("must be in 1..={}, got {max}", limits::redrive_messages_max),
            });
        }
        if to == Some(from) {
            return Err(Reject::InvalidParameter {
                parameter: "DestinationArn",
                reason: format!("messages of {from} cannot be moved to {from} itself"),
            });
        }
        let taken: Vec<MessageId> = queue
            .ready
            .iter()
            .take(max as usize)
            .map(|&(_, id)| id)
            .collect();
        let (mut moved, mut failed) = (0, 0);
        for id in taken {
            let target = to
                .cloned()
                .or_else(|| self.messages[&id].source.clone())
                .filter(|target| self.queues.contains_key(target))
                // spec/queue-core.md, *A move task moves only into queues its starter may
                // reach*: outside the restriction is as a missing target.
                .filter(|target| allowed.is_none_or(|allowed| allowed.allows(target)));
            let Some(target) = target else {
                failed += 1;
                continue;
            };
            let message = self
                .messages
                .get_mut(&id)
                .expect("a taken message is stored");
            message.source = None;
            message.receive_count = 0;
            message.first_receive_at = None;
            message.handle = None;
            if self.relocate(at, id, &target) {
                self.to_serve.push_back(target);
            }
            moved += 1;
        }
        Ok(Outcome::Redriven { moved, failed })
    }

    /// Makes every message of `name` that is past its retention gone `Expired`.
    fn expire_retained(&mut self, name: &QueueName, at: Millis) {
        while let Some((expires_at, id)) = self.queues[name].next_expiry() {
            if expires_at > at {
                break;
            }
            self.make_gone(id, GoneReason::Expired);
        }
    }

    // ----- message bookkeeping: every change of a message goes through these -----

    /// Stores a message and indexes it in its queue.
    pub(crate) fn insert_message(&mut self, id: MessageId, message: Message) {
        let queue = self
            .queues
            .get_mut(&message.queue)
            .expect("a message is stored in an existing queue");
        queue.index_state(id, message.state, message.sent_at);
        assert!(queue.retained.insert((message.sent_at, id)));
        let name = message.queue.clone();
        let previous = self.messages.insert(id, message);
        assert!(previous.is_none(), "message {id} stored twice");
        self.reschedule(&name);
        self.dirty.insert(RecordKey::Message(name, id));
    }

    /// Removes a stored message for good, remembering why for `gone_in_last_step`.
    fn make_gone(&mut self, id: MessageId, reason: GoneReason) {
        self.remove_message(id);
        self.note_gone(id, reason);
    }

    /// Bookkeeping of a message that is no longer stored: its body record goes (the state
    /// record's key was marked when it was removed), and the reason is reported.
    fn note_gone(&mut self, id: MessageId, reason: GoneReason) {
        assert!(!self.messages.contains_key(&id));
        self.dirty.insert(RecordKey::MessageBody(id));
        self.gone.push((id, reason));
    }

    /// Removes a stored message and its index entries (to be gone, or to move it). Marks only
    /// its state record: a move keeps the body record, and `note_gone` marks it for removal.
    fn remove_message(&mut self, id: MessageId) -> Message {
        let message = self
            .messages
            .remove(&id)
            .expect("removing a stored message");
        let queue = self
            .queues
            .get_mut(&message.queue)
            .expect("a stored message's queue exists");
        queue.unindex_state(id, message.state, message.sent_at);
        assert!(queue.retained.remove(&(message.sent_at, id)));
        self.reschedule(&message.queue);
        self.dirty
            .insert(RecordKey::Message(message.queue.clone(), id));
        message
    }

    /// Changes a stored message's state and re-indexes it.
    fn set_state(&mut self, id: MessageId, state: MessageState) {
        let message = self
            .messages
            .get_mut(&id)
            .expect("changing a stored message");
        let queue = self
            .queues
            .get_mut(&message.queue)
            .expect("a stored message's queue exists");
        queue.unindex_state(id, message.state, message.sent_at);
        queue.index_state(id, state, message.sent_at);
        message.state = state;
        let name = message.queue.clone();
        self.reschedule(&name);
        self.dirty.insert(RecordKey::Message(name, id));
    }
}

/// A receive's visibility timeout and wait, the queue's defaults filled in, once `max`, the
/// visibility timeout and the wait are in range (checked in that order).
///
/// # Errors
/// `InvalidParameter` naming `MaxNumberOfMessages`, `VisibilityTimeout` or `WaitTimeSeconds`.
pub fn receive_parameters(
    attributes: &QueueAttributes,
    max: u32,
    visibility_s: Option<u32>,
    wait_s: Option<u32>,
) -> Result<(u32, u32), Reject> {
    if !(1..=limits::batch_entries_max).contains(&max) {
        return Err(Reject::InvalidParameter {
            parameter: "MaxNumberOfMessages",
            reason: format!("must be in 1..={}, got {max}", limits::batch_entries_max),
        });
    }
    let visibility_s = visibility_s.unwrap_or(attributes.visibility_timeout_s);
    if visibility_s > limits::visibility_timeout_s_max {
        return Err(Reject::InvalidParameter {
            parameter: "VisibilityTimeout",
            reason: format!(
                "must be in 0..={}, got {visibility_s}",
                limits::visibility_timeout_s_max
            ),
        });
    }
    let wait_s = wait_s.unwrap_or(attributes.receive_wait_s);
    if wait_s > limits::wait_s_max {
        return Err(Reject::InvalidParameter {
            parameter: "WaitTimeSeconds",
            reason: format!("must be in 0..={}, got {wait_s}", limits::wait_s_max),
        });
    }
    Ok((visibility_s, wait_s))
}

/// Tags: at most `tags_per_queue_max`, keys 1–128 characters, values up to 256.
///
/// # Errors
/// `InvalidParameter { parameter: "Tags" }` naming the first rule broken.
pub fn check_tags(tags: &BTreeMap<String, String>) -> Result<(), Reject> {
    let refuse = |reason: String| Reject::InvalidParameter {
        parameter: "Tags",
        reason,
    };
    if tags.len() > limits::tags_per_queue_max {
        return Err(refuse(format!(
            "at most {} tags per queue, got {}",
            limits::tags_per_queue_max,
            tags.len()
        )));
    }
    for (key, value) in tags {
        let key_chars = key.chars().count();
        if !(1..=limits::tag_key_chars_max).contains(&key_chars) {
            return Err(refuse(format!(
                "tag keys are 1–{} characters, got {key_chars}",
                limits::tag_key_chars_max
            )));
        }
        if value.chars().count() > limits::tag_value_chars_max {
            return Err(refuse(format!(
                "tag values are at most {} characters",
                limits::tag_value_chars_max
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Caps too large to reach one command at a time (the state is filled behind the state
    //! machine's back, then one command meets the cap), and the fine print of time advance.

    use super::*;

    const T0: Millis = Millis(1_000_000);

    fn jobs() -> QueueName {
        QueueName::try_from("jobs").unwrap()
    }

    fn create(queues: &mut Queues, name: &QueueName, attributes: QueueAttributes) {
        let step = queues.apply(
            T0,
            Command::CreateQueue {
                name: name.clone(),
                attributes,
                tags: BTreeMap::new(),
            },
        );
        assert_eq!(step.result, Ok(Outcome::QueueCreated { created: true }));
    }

    fn send(id: u128) -> Command {
        Command::Send {
            queue: jobs(),
            id: MessageId(id),
            body: "m".to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
            delay_s: None,
            dedup: None,
        }
    }

    fn receive(max: u32, visibility_s: u32, wait_s: u32, waiter: u64) -> Command {
        Command::Receive {
            queue: jobs(),
            max,
            visibility_s: Some(visibility_s),
            wait_s: Some(wait_s),
            waiter: WaiterId(waiter),
        }
    }

    /// Stores `count` in-flight messages in `jobs` directly (ids from 1_000_000 up).
    fn fill_in_flight(queues: &mut Queues, count: u64) {
        for n in 0..u128::from(count) {
            queues.insert_message(
                MessageId(1_000_000 + n),
                Message {
                    queue: jobs(),
                    state: MessageState::InFlight {
                        until: T0.plus_s(600),
                    },
                    receive_count: 1,
                    last_seq: 1,
                    first_receive_at: Some(T0),
                    received_at: Some(T0),
                    handle: Some(1),
                    sent_at: T0,
                    source: None,
                    body: "m".to_owned(),
                    attributes: BTreeMap::new(),
                    system: SystemAttributes::default(),
                },
            );
        }
    }

    #[test]
    fn queue_limit_refuses_one_more_queue() {
        let mut queues = Queues::new();
        for n in 0..limits::queues_max {
            let name = QueueName::try_from(format!("q{n}")).unwrap();
            queues.queues.insert(
                name,
                Queue::new(QueueAttributes::default(), T0, BTreeMap::new()),
            );
        }
        let step = queues.apply(
            T0,
            Command::CreateQueue {
                name: jobs(),
                attributes: QueueAttributes::default(),
                tags: BTreeMap::new(),
            },
        );
        assert_eq!(
            step.result,
            Err(Reject::QueueLimit {
                max: limits::queues_max
            })
        );
    }

    #[test]
    fn inflight_limit_refuses_a_receive_and_ends_waiters_empty() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        // A waiter opened before the queue filled up.
        let step = queues.apply(T0, receive(1, 30, 20, 7));
        assert_eq!(
            step.result,
            Ok(Outcome::Waiting {
                waiter: WaiterId(7)
            })
        );
        fill_in_flight(&mut queues, limits::inflight_per_queue_max);
        // A send makes a message ready; the waiter cannot take it and is answered empty
        // rather than left waiting beside a ready message.
        let step = queues.apply(T0, send(1));
        assert_eq!(
            step.wakeups,
            vec![Wakeup::Empty {
                waiter: WaiterId(7)
            }]
        );
        let step = queues.apply(T0, receive(1, 30, 0, 8));
        assert_eq!(
            step.result,
            Err(Reject::InflightLimit {
                name: jobs(),
                max: limits::inflight_per_queue_max
            })
        );
        assert_eq!(queues.queue(&jobs()).unwrap().counts.ready, 1);
    }

    #[test]
    fn receive_near_the_inflight_limit_delivers_only_up_to_it() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        fill_in_flight(&mut queues, limits::inflight_per_queue_max - 2);
        for id in 1..=5 {
            queues.apply(T0, send(id)).result.unwrap();
        }
        let step = queues.apply(T0, receive(10, 30, 0, 1));
        let Ok(Outcome::Received(deliveries)) = step.result else {
            panic!("{:?}", step.result);
        };
        assert_eq!(deliveries.len(), 2);
        assert_eq!(queues.queue(&jobs()).unwrap().counts.ready, 3);
    }

    #[test]
    fn waiter_limit_refuses_one_more_long_poll() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        let queue = queues.queues.get_mut(&jobs()).unwrap();
        for n in 0..limits::waiters_per_queue_max as u64 {
            queue.push_waiter(
                n,
                Waiter {
                    id: WaiterId(n),
                    max: 1,
                    visibility_s: 30,
                    deadline: T0.plus_s(20),
                },
            );
            queues.waiter_index.insert(WaiterId(n), (jobs(), n));
        }
        queues.next_arrival = limits::waiters_per_queue_max as u64;
        queues.reschedule(&jobs());
        let step = queues.apply(T0, receive(1, 30, 20, u64::MAX));
        assert_eq!(
            step.result,
            Err(Reject::WaiterLimit {
                name: jobs(),
                max: limits::waiters_per_queue_max
            })
        );
        // A short poll is not a waiter and is not refused.
        let step = queues.apply(T0, receive(1, 30, 0, u64::MAX));
        assert_eq!(step.result, Ok(Outcome::Received(vec![])));
    }

    #[test]
    fn visibility_change_of_a_restored_message_respects_the_inflight_limit() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        queues.apply(T0, send(1)).result.unwrap();
        let step = queues.apply(T0, receive(1, 0, 0, 1));
        let Ok(Outcome::Received(deliveries)) = step.result else {
            panic!("{:?}", step.result);
        };
        // Restored by the next action; then the queue fills up.
        queues.advance(T0);
        fill_in_flight(&mut queues, limits::inflight_per_queue_max);
        let step = queues.apply(
            T0,
            Command::ChangeVisibility {
                queue: jobs(),
                handle: deliveries[0].handle.clone(),
                timeout_s: 10,
            },
        );
        assert_eq!(
            step.result,
            Err(Reject::InflightLimit {
                name: jobs(),
                max: limits::inflight_per_queue_max
            })
        );
    }

    #[test]
    fn simultaneous_restore_serves_before_retention_expires() {
        // The page's order for one instant: delay ends, restores (and the serving they cause),
        // then retention. A message restored at the instant its retention ends is delivered to
        // an open waiter and is gone right after.
        let mut queues = Queues::new();
        let attributes = QueueAttributes {
            retention_s: 60,
            ..QueueAttributes::default()
        };
        create(&mut queues, &jobs(), attributes);
        queues.apply(T0, send(1)).result.unwrap();
        queues
            .apply(T0.plus_s(30), receive(1, 30, 0, 1))
            .result
            .unwrap();
        let step = queues.apply(T0.plus_s(40), receive(1, 30, 20, 2));
        assert_eq!(
            step.result,
            Ok(Outcome::Waiting {
                waiter: WaiterId(2)
            })
        );
        let wakeups = queues.advance(T0.plus_s(60));
        assert!(matches!(
            &wakeups[..],
            [Wakeup::Served { waiter: WaiterId(2), deliveries }] if deliveries.len() == 1
        ));
        assert_eq!(queues.message(&jobs(), MessageId(1)), None);
    }

    #[test]
    fn message_ready_at_a_waiters_deadline_serves_it() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        let delayed = Command::Send {
            queue: jobs(),
            id: MessageId(1),
            body: "m".to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
            delay_s: Some(20),
            dedup: None,
        };
        queues.apply(T0, delayed).result.unwrap();
        queues.apply(T0, receive(1, 30, 20, 1)).result.unwrap();
        let wakeups = queues.advance(T0.plus_s(20));
        assert!(matches!(
            &wakeups[..],
            [Wakeup::Served {
                waiter: WaiterId(1),
                ..
            }]
        ));
    }

    #[test]
    fn visibility_0_delivery_during_an_advance_is_restored_at_the_next_instant() {
        // A restore at 10 s with three waiters of visibility 0, and time jumping to 15 s: the
        // first waiter receives the message at 10 s; it is `InFlight{10 s}` until the next
        // instant the advance fires, here its target 15 s, where the second waiter receives it.
        // The third is served by the next action.
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        queues.apply(T0, send(1)).result.unwrap();
        queues.apply(T0, receive(1, 10, 0, 1)).result.unwrap();
        for waiter in 2..=4 {
            let step = queues.apply(T0, receive(1, 0, 20, waiter));
            assert_eq!(
                step.result,
                Ok(Outcome::Waiting {
                    waiter: WaiterId(waiter)
                })
            );
        }
        let wakeups = queues.advance(T0.plus_s(15));
        let served: Vec<u64> = wakeups.iter().map(|wakeup| wakeup.waiter().0).collect();
        assert_eq!(served, vec![2, 3]);
        let Wakeup::Served { deliveries, .. } = &wakeups[1] else {
            panic!("{wakeups:?}");
        };
        assert_eq!(deliveries[0].receive_count, 3);
        let view = queues.message(&jobs(), MessageId(1)).unwrap();
        assert_eq!(view.received_at, Some(T0.plus_s(15)));
        assert_eq!(
            view.state,
            MessageState::InFlight {
                until: T0.plus_s(15)
            }
        );
        assert_eq!(queues.waiters(&jobs()), vec![WaiterId(4)]);
        let wakeups = queues.advance(T0.plus_s(15));
        assert_eq!(wakeups.len(), 1);
        assert_eq!(wakeups[0].waiter(), WaiterId(4));
    }

    #[test]
    fn messages_ready_at_one_instant_are_served_together() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        for id in [1, 2] {
            let delayed = Command::Send {
                queue: jobs(),
                id: MessageId(id),
                body: "m".to_owned(),
                attributes: BTreeMap::new(),
                system: Default::default(),
                delay_s: Some(5),
                dedup: None,
            };
            queues.apply(T0, delayed).result.unwrap();
        }
        queues.apply(T0, receive(10, 30, 20, 1)).result.unwrap();
        let wakeups = queues.advance(T0.plus_s(5));
        let [Wakeup::Served { deliveries, .. }] = &wakeups[..] else {
            panic!("{wakeups:?}");
        };
        assert_eq!(
            deliveries.len(),
            2,
            "one waiter gets both messages of the instant"
        );
    }

    #[test]
    fn dead_letter_queue_is_served_after_each_move() {
        // Two poison messages taken by one receive: the dead-letter queue's oldest waiter is
        // served right after the first move, before the second message is looked at.
        let dlq = QueueName::try_from("dlq").unwrap();
        let mut queues = Queues::new();
        create(&mut queues, &dlq, QueueAttributes::default());
        let attributes = QueueAttributes {
            redrive: Some(crate::RedrivePolicy {
                dead_letter_queue: dlq.clone(),
                max_receive_count: 1,
            }),
            ..QueueAttributes::default()
        };
        create(&mut queues, &jobs(), attributes);
        for id in [1, 2] {
            queues.apply(T0, send(id)).result.unwrap();
        }
        queues.apply(T0, receive(2, 0, 0, 1)).result.unwrap();
        for waiter in [2, 3] {
            let long_poll = Command::Receive {
                queue: dlq.clone(),
                max: 2,
                visibility_s: Some(30),
                wait_s: Some(20),
                waiter: WaiterId(waiter),
            };
            queues.apply(T0, long_poll).result.unwrap();
        }
        let step = queues.apply(T0, receive(2, 30, 0, 4));
        assert_eq!(step.result, Ok(Outcome::Received(vec![])));
        let served: Vec<(u64, Vec<u128>)> = step
            .wakeups
            .iter()
            .map(|wakeup| match wakeup {
                Wakeup::Served { waiter, deliveries } => (
                    waiter.0,
                    deliveries
                        .iter()
                        .map(|delivery| delivery.message.0)
                        .collect(),
                ),
                Wakeup::Empty { waiter } => panic!("{waiter} answered empty"),
            })
            .collect();
        assert_eq!(served, vec![(2, vec![1]), (3, vec![2])]);
    }

    #[test]
    fn at_one_instant_sources_are_served_before_their_dead_letter_queue() {
        // The dead-letter queue's name sorts first, yet the source is served first: its waiter
        // moves message 1 into the dead-letter queue, whose waiter then takes it (the older id
        // of two messages ready since the same instant) before message 2.
        let dlq = QueueName::try_from("a-dlq").unwrap();
        let source = QueueName::try_from("z-jobs").unwrap();
        let mut queues = Queues::new();
        create(&mut queues, &dlq, QueueAttributes::default());
        let attributes = QueueAttributes {
            redrive: Some(crate::RedrivePolicy {
                dead_letter_queue: dlq.clone(),
                max_receive_count: 1,
            }),
            ..QueueAttributes::default()
        };
        create(&mut queues, &source, attributes);
        let send_to = |queue: &QueueName, id: u128| Command::Send {
            queue: queue.clone(),
            id: MessageId(id),
            body: "m".to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
            delay_s: None,
            dedup: None,
        };
        let receive_from =
            |queue: &QueueName, visibility_s: u32, wait_s: u32, waiter: u64| Command::Receive {
                queue: queue.clone(),
                max: 1,
                visibility_s: Some(visibility_s),
                wait_s: Some(wait_s),
                waiter: WaiterId(waiter),
            };
        queues.apply(T0, send_to(&source, 1)).result.unwrap();
        queues.apply(T0, send_to(&dlq, 2)).result.unwrap();
        queues
            .apply(T0, receive_from(&source, 10, 0, 1))
            .result
            .unwrap();
        queues
            .apply(T0, receive_from(&dlq, 10, 0, 2))
            .result
            .unwrap();
        queues
            .apply(T0, receive_from(&dlq, 30, 20, 3))
            .result
            .unwrap();
        queues
            .apply(T0, receive_from(&source, 30, 20, 4))
            .result
            .unwrap();
        let wakeups = queues.advance(T0.plus_s(10));
        let [Wakeup::Served { waiter, deliveries }] = &wakeups[..] else {
            panic!("{wakeups:?}");
        };
        assert_eq!(*waiter, WaiterId(3));
        assert_eq!(deliveries[0].message, MessageId(1));
        assert_eq!(deliveries[0].source, Some(source.clone()));
        assert_eq!(queues.waiters(&source), vec![WaiterId(4)]);
        assert_eq!(
            queues.message(&dlq, MessageId(2)).unwrap().state,
            MessageState::Ready {
                since: T0.plus_s(10)
            }
        );
    }

    #[test]
    fn redrive_chains_are_capped() {
        let mut queues = Queues::new();
        let names: Vec<QueueName> = (0..=limits::redrive_chain_queues_max)
            .map(|n| QueueName::try_from(format!("q{n}")).unwrap())
            .collect();
        create(&mut queues, &names[0], QueueAttributes::default());
        for pair in names.windows(2) {
            let attributes = QueueAttributes {
                redrive: Some(crate::RedrivePolicy {
                    dead_letter_queue: pair[0].clone(),
                    max_receive_count: 1,
                }),
                ..QueueAttributes::default()
            };
            let step = queues.apply(
                T0,
                Command::CreateQueue {
                    name: pair[1].clone(),
                    attributes,
                    tags: BTreeMap::new(),
                },
            );
            let chain = names.iter().position(|name| name == &pair[1]).unwrap() + 1;
            if chain <= limits::redrive_chain_queues_max {
                assert!(step.result.is_ok(), "{chain} queues: {:?}", step.result);
            } else {
                assert!(matches!(
                    step.result,
                    Err(Reject::InvalidAttribute {
                        attribute: "RedrivePolicy",
                        ..
                    })
                ));
            }
        }
    }

    #[test]
    fn visibility_0_waiter_served_at_the_advance_target_holds_the_message_until_the_next_action() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        queues.apply(T0, send(1)).result.unwrap();
        queues.apply(T0, receive(1, 10, 0, 1)).result.unwrap();
        for waiter in 2..=3 {
            queues.apply(T0, receive(1, 0, 20, waiter)).result.unwrap();
        }
        let wakeups = queues.advance(T0.plus_s(10));
        assert_eq!(wakeups.len(), 1);
        assert_eq!(wakeups[0].waiter(), WaiterId(2));
        let view = queues.message(&jobs(), MessageId(1)).unwrap();
        assert_eq!(
            view.state,
            MessageState::InFlight {
                until: T0.plus_s(10)
            }
        );
        assert_eq!(queues.waiters(&jobs()), vec![WaiterId(3)]);
        // The next action, at the same time, restores it and serves the second waiter.
        let wakeups = queues.advance(T0.plus_s(10));
        assert_eq!(wakeups.len(), 1);
        assert_eq!(wakeups[0].waiter(), WaiterId(3));
    }

    #[test]
    fn receive_is_deterministic_for_equal_ready_times() {
        let mut queues = Queues::new();
        create(&mut queues, &jobs(), QueueAttributes::default());
        for id in [5, 3, 9, 1] {
            queues.apply(T0, send(id)).result.unwrap();
        }
        let step = queues.apply(T0, receive(10, 30, 0, 1));
        let Ok(Outcome::Received(deliveries)) = step.result else {
            panic!("{:?}", step.result);
        };
        let ids: Vec<u128> = deliveries.iter().map(|d| d.message.0).collect();
        assert_eq!(ids, vec![1, 3, 5, 9], "ties are broken by message id");
    }
}
