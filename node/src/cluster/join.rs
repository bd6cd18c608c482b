//! Joining with a new replica database (spec/replication.md, *Stragglers and replacement*: how a
//! node knows it is a replacement, and when it votes), as this node runs it: the peers' disks
//! it accepts requests from ([`Membership`]), and, for a new database, the join itself — ask
//! every peer, then vote at once (a new member) or wait out the horizon since the old disk was
//! last heard and rebuild by anti-entropy with every peer (a replacement). Until it votes the
//! node answers no replica request and its public APIs answer unavailable.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};
use trireme_core::Millis;
use trireme_proto::replica::v1 as pb;
use trireme_replication::NodeId;
use trireme_replication::join::{Acceptance, Known, PeerDisks, Verdict, verdict};

use super::anti_entropy::AntiEntropySettings;
use super::store::{ReplicaStore, StoreError};
use super::wire::Sender;
use super::{Cluster, SKEW_MAX_MS};

/// Between two rounds of asking the peers that have not answered yet.
const ASK_EVERY: Duration = Duration::from_millis(200);
/// Between two looks at the clock while a replacement waits out the horizon.
const WAIT_STEP: Duration = Duration::from_secs(1);

/// Where this node stands in joining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinState {
    /// It votes and coordinates.
    Joined,
    /// A new database: asking every peer what it knew of this node.
    Asking,
    /// A replacement waiting until its clock passes `votes_from`.
    Waiting { votes_from: Millis },
    /// A replacement merging from every peer.
    Rebuilding,
    /// This node's disk was replaced by `by` (a peer refused this one as retired): it never
    /// serves again (spec/replication.md, *Stragglers and replacement*).
    Retired { by: u64 },
}

impl JoinState {
    /// Why this node does not serve yet, for its refusals; `None` once joined.
    #[must_use]
    pub fn refusal(self) -> Option<String> {
        match self {
            JoinState::Joined => None,
            JoinState::Asking => {
                Some("this node's replica database is new: it is asking its peers whether it replaces a disk, and serves once every peer has answered".to_owned())
            }
            JoinState::Waiting { votes_from } => Some(format!(
                "this node replaces a lost disk: it rebuilds from its peers and serves once its clock passes {} ms since the epoch (the tombstone horizon since the old disk was last heard)",
                votes_from.0
            )),
            JoinState::Rebuilding => {
                Some("this node replaces a lost disk and is rebuilding from its peers".to_owned())
            }
            JoinState::Retired { by } => Some(format!(
                "this node's disk was replaced by disk {by}, which its peers now take for this node: a replaced disk never rejoins (stop this process; its data directory must not be used again)"
            )),
        }
    }
}

/// The peers' disks this node accepts requests from, and whether it has joined.
pub struct Membership {
    disks: Mutex<PeerDisks>,
    store: ReplicaStore,
    state: watch::Sender<JoinState>,
}

/// Why a peer's request is refused by [`Membership::accept`].
#[derive(Debug)]
pub enum Refusal {
    /// This node has not joined yet.
    Joining(String),
    /// The request came from a disk of the peer that was replaced.
    Retired { current: u64 },
    /// What this node knows could not be persisted.
    Store(StoreError),
}

impl Membership {
    /// From the store: the persisted peers' disks, and joined unless the database is new.
    ///
    /// # Errors
    /// As [`ReplicaStore::peer_disks`] and [`ReplicaStore::joined`].
    pub fn open(store: ReplicaStore) -> Result<Membership, StoreError> {
        let disks = PeerDisks::restored(store.peer_disks()?);
        let state = if store.joined()? {
            JoinState::Joined
        } else {
            JoinState::Asking
        };
        Ok(Membership {
            disks: Mutex::new(disks),
            store,
            state: watch::Sender::new(state),
        })
    }

    /// Where this node stands.
    #[must_use]
    pub fn state(&self) -> JoinState {
        *self.state.borrow()
    }

    /// This node's disk was replaced by `by`: from now on it serves nothing, as a replica or
    /// as a coordinator.
    pub fn retire(&self, by: u64) {
        let already = matches!(self.state(), JoinState::Retired { .. });
        self.state.send_replace(JoinState::Retired { by });
        if !already {
            tracing::error!(
                replaced_by = by,
                "a peer refused this node's disk as replaced: it serves nothing from now on; stop this process (its data directory must not be used again)"
            );
        }
    }

    /// Waits until this node has joined.
    pub async fn joined(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|state| *state == JoinState::Joined).await;
    }

    /// A replica request from `sender` at `now`: accepted only once this node has joined, and
    /// only from the disk it takes for the sender's (the first it saw, or the one that joined).
    ///
    /// # Errors
    /// A [`Refusal`].
    pub fn accept(&self, sender: &Sender, now: Millis) -> Result<(), Refusal> {
        self.note(sender, now)?;
        match self.state().refusal() {
            Some(reason) => Err(Refusal::Joining(reason)),
            None => Ok(()),
        }
    }

    /// Notes a request from `sender` (on either side of a call: a peer's reply counts too),
    /// refusing a retired disk.
    ///
    /// # Errors
    /// `Retired` or `Store`.
    pub fn note(&self, sender: &Sender, now: Millis) -> Result<(), Refusal> {
        let mut disks = self.disks.lock().expect("the disks lock is never poisoned");
        match disks.accept(sender.node, sender.disk_id, now) {
            Acceptance::Accepted { changed: false } => Ok(()),
            Acceptance::Accepted { changed: true } => self
                .store
                .save_peer_disk(sender.node, sender.disk_id, None)
                .map_err(Refusal::Store),
            Acceptance::Retired { current } => Err(Refusal::Retired { current }),
        }
    }

    /// `sender` joins with a new database: what this node knew of it before, persisted as its
    /// new disk before the answer goes out.
    ///
    /// # Errors
    /// `Store` when the new disk cannot be persisted.
    pub fn join(&self, sender: &Sender, now: Millis) -> Result<Option<pb::KnownDisk>, StoreError> {
        let mut disks = self.disks.lock().expect("the disks lock is never poisoned");
        let known = disks.join(sender.node, sender.disk_id, now);
        let stored = disks.get(sender.node).expect("just joined");
        self.store
            .save_peer_disk(sender.node, stored.disk_id, stored.predecessor_heard)?;
        Ok(known.map(known_to_wire))
    }
}

/// `known` on the wire.
fn known_to_wire(known: Known) -> pb::KnownDisk {
    pb::KnownDisk {
        disk_id: known.disk_id,
        heard_ms: known.heard.0,
        predecessor_heard_ms: known.predecessor_heard.map(|at| at.0),
    }
}

/// A peer's `known` from the wire.
fn known_from_wire(known: pb::KnownDisk) -> Known {
    Known {
        disk_id: known.disk_id,
        heard: Millis(known.heard_ms),
        predecessor_heard: known.predecessor_heard_ms.map(Millis),
    }
}

impl Cluster {
    /// Runs the join of a new database to its end (nothing to do for one that has joined):
    /// asks every peer until all have answered, then votes at once, or waits out the horizon
    /// and rebuilds by anti-entropy with every peer first.
    pub(super) async fn join(self, settings: AntiEntropySettings) {
        let membership = &self.inner.membership;
        if membership.state() == JoinState::Joined {
            return;
        }
        let peers: BTreeSet<NodeId> = self.peer_ids().into_iter().collect();
        let disk_id = self.inner.me.disk_id;
        let mut answers: BTreeMap<NodeId, Option<Known>> = BTreeMap::new();
        let margin_ms = self.inner.horizon_ms + SKEW_MAX_MS;
        let votes_from = loop {
            for peer in &peers {
                if answers.contains_key(peer) {
                    continue;
                }
                let Some(mut client) = self.inner.peers.client(*peer) else {
                    continue;
                };
                let request = pb::JoinRequest {
                    sender: Some(self.inner.me.now().into()),
                };
                match client.join(request).await {
                    Ok(reply) => {
                        answers.insert(*peer, reply.into_inner().known.map(known_from_wire));
                    }
                    Err(status) => {
                        tracing::debug!(peer = peer.0, %status, "join: no answer yet");
                    }
                }
            }
            match verdict(disk_id, &peers, &answers, margin_ms) {
                Verdict::Waiting => tokio::time::sleep(ASK_EVERY).await,
                Verdict::NewMember => break None,
                Verdict::Replacement { votes_from } => break Some(votes_from),
            }
        };
        if let Some(votes_from) = votes_from {
            warn!(
                disk_id,
                votes_from_ms = votes_from.0,
                "this node's disk replaces a lost one: it serves nothing until the horizon has passed since the old disk was last heard, then rebuilds from its peers"
            );
            membership
                .state
                .send_replace(JoinState::Waiting { votes_from });
            while self.inner.me.clock.now() < votes_from {
                tokio::time::sleep(WAIT_STEP).await;
            }
            membership.state.send_replace(JoinState::Rebuilding);
            for peer in &peers {
                self.rebuild_from(*peer, &settings).await;
            }
        }
        loop {
            match membership.store.set_joined() {
                Ok(()) => break,
                Err(error) => {
                    warn!(%error, "join: cannot record that this node joined; retrying");
                    tokio::time::sleep(WAIT_STEP).await;
                }
            }
        }
        membership.state.send_replace(JoinState::Joined);
        info!(
            disk_id,
            replacement = votes_from.is_some(),
            "joined the cluster: this node votes and coordinates"
        );
    }

    /// Anti-entropy with `peer` until a round compares everything.
    async fn rebuild_from(&self, peer: NodeId, settings: &AntiEntropySettings) {
        loop {
            match self.anti_entropy_round(peer, settings).await {
                Ok(report) if report.complete => return,
                Ok(_) => {}
                Err(error) => {
                    warn!(peer = peer.0, %error, "rebuild: anti-entropy round failed; retrying");
                    tokio::time::sleep(WAIT_STEP).await;
                }
            }
        }
    }

    /// Where this node stands in joining.
    #[must_use]
    pub fn join_state(&self) -> JoinState {
        self.inner.membership.state()
    }

    /// Waits until this node has joined (at once for a database that has).
    pub async fn joined(&self) {
        self.inner.membership.joined().await;
    }
}
