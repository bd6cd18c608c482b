//! Joining with a new replica database (spec/replication.md, *Stragglers and replacement*: how a
//! node knows it is a replacement, and when it votes): what a member knows of each peer's disk
//! ([`PeerDisks`]), what it answers a joining peer, and the joining node's verdict from the
//! answers ([`verdict`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use trireme_core::Millis;

use crate::NodeId;
use crate::planted::{Bug, planted};

/// What a member knows of one peer's disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerDisk {
    /// The disk it accepts the peer's requests from.
    pub disk_id: u64,
    /// When it last accepted one from that disk, by its own clock; `None`: not since this
    /// member started (kept in memory only).
    pub heard: Option<Millis>,
    /// When it last heard the disk this one replaced, if one was replaced (persisted).
    pub predecessor_heard: Option<Millis>,
}

/// A member's answer to `Join`: what it knew of the joining node before the join.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// The disk it took for that node's.
    pub disk_id: u64,
    /// When it last heard that disk (its own clock; *now* if not since it started).
    pub heard: Millis,
    /// When it last heard the disk before that one, if one was replaced.
    pub predecessor_heard: Option<Millis>,
}

/// Whether a request from a peer's disk is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acceptance {
    /// The peer's known disk (or its first): accepted. `changed`: the persisted part changed.
    Accepted { changed: bool },
    /// Another disk than the one this member takes for the peer's: a retired disk, refused.
    Retired { current: u64 },
}

/// What a member knows of its peers' disks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerDisks {
    disks: BTreeMap<NodeId, PeerDisk>,
}

impl PeerDisks {
    /// From what was persisted: each peer's disk and its predecessor's last contact.
    #[must_use]
    pub fn restored(persisted: impl IntoIterator<Item = (NodeId, u64, Option<Millis>)>) -> Self {
        PeerDisks {
            disks: persisted
                .into_iter()
                .map(|(node, disk_id, predecessor_heard)| {
                    (
                        node,
                        PeerDisk {
                            disk_id,
                            heard: None,
                            predecessor_heard,
                        },
                    )
                })
                .collect(),
        }
    }

    /// What this member knows of `node`'s disk.
    #[must_use]
    pub fn get(&self, node: NodeId) -> Option<PeerDisk> {
        self.disks.get(&node).copied()
    }

    /// A request from `node`'s disk `disk_id` at `now`: the first disk seen of a node is taken as
    /// its own; another one afterwards only through [`PeerDisks::join`].
    pub fn accept(&mut self, node: NodeId, disk_id: u64, now: Millis) -> Acceptance {
        match self.disks.get_mut(&node) {
            None => {
                self.disks.insert(
                    node,
                    PeerDisk {
                        disk_id,
                        heard: Some(now),
                        predecessor_heard: None,
                    },
                );
                Acceptance::Accepted { changed: true }
            }
            Some(known) if known.disk_id == disk_id => {
                known.heard = known.heard.max(Some(now));
                Acceptance::Accepted { changed: false }
            }
            Some(known) => Acceptance::Retired {
                current: known.disk_id,
            },
        }
    }

    /// `node` joins with a new database on disk `disk_id` at `now`: the answer is what this
    /// member knew before, and from now on `disk_id` is the node's disk (the one before it, if
    /// another, retired, with its last contact kept as the predecessor's).
    pub fn join(&mut self, node: NodeId, disk_id: u64, now: Millis) -> Option<Known> {
        let before = self.disks.get(&node).copied();
        let answer = before.map(|known| Known {
            disk_id: known.disk_id,
            heard: known.heard.unwrap_or(now),
            predecessor_heard: known.predecessor_heard,
        });
        let predecessor_heard = match answer {
            Some(known) if known.disk_id != disk_id => Some(known.heard),
            Some(known) => known.predecessor_heard,
            None => None,
        };
        self.disks.insert(
            node,
            PeerDisk {
                disk_id,
                heard: Some(now),
                predecessor_heard,
            },
        );
        answer
    }
}

/// The joining node's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not every peer has answered: wait, serving nothing.
    Waiting,
    /// No peer ever saw a disk of this node before this one: it votes at once.
    NewMember,
    /// A disk of this node was replaced: it rebuilds and votes once its clock passes
    /// `votes_from` (the latest contact with the old disk, plus `HORIZON + SKEW_MAX`).
    Replacement { votes_from: Millis },
}

/// The verdict of a node joining with disk `disk_id`, from the answers so far of `peers`
/// (`None`: that peer never saw the node); `margin_ms` is `HORIZON + SKEW_MAX`.
#[must_use]
pub fn verdict(
    disk_id: u64,
    peers: &BTreeSet<NodeId>,
    answers: &BTreeMap<NodeId, Option<Known>>,
    margin_ms: u64,
) -> Verdict {
    if !peers.iter().all(|peer| answers.contains_key(peer)) {
        return Verdict::Waiting;
    }
    let old_disk_heard = peers
        .iter()
        .filter_map(|peer| answers[peer])
        .filter_map(|known| {
            if known.disk_id == disk_id {
                known.predecessor_heard
            } else {
                Some(known.heard)
            }
        })
        .max();
    match old_disk_heard {
        None => Verdict::NewMember,
        // The planted bug takes a replacement for a new member: it votes at once.
        Some(_) if planted(Bug::EmptyReplacementVotes) => Verdict::NewMember,
        Some(heard) => Verdict::Replacement {
            votes_from: heard.plus_ms(margin_ms),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);
    const C: NodeId = NodeId(3);

    fn peers() -> BTreeSet<NodeId> {
        [B, C].into()
    }

    #[test]
    fn a_new_cluster_s_members_vote_once_every_peer_answered_that_it_never_saw_them() {
        let mut answers = BTreeMap::new();
        answers.insert(B, None);
        assert_eq!(verdict(7, &peers(), &answers, 100), Verdict::Waiting);
        answers.insert(C, None);
        assert_eq!(verdict(7, &peers(), &answers, 100), Verdict::NewMember);
    }

    #[test]
    fn a_replaced_disk_votes_after_the_latest_contact_with_the_old_one_plus_the_margin() {
        let (mut b, mut c) = (PeerDisks::default(), PeerDisks::default());
        // The old disk 5 of node A was heard at 1,000 by B and at 1,400 by C.
        assert_eq!(
            b.accept(A, 5, Millis(1_000)),
            Acceptance::Accepted { changed: true }
        );
        assert_eq!(
            c.accept(A, 5, Millis(1_400)),
            Acceptance::Accepted { changed: true }
        );
        assert_eq!(
            c.accept(A, 5, Millis(1_200)),
            Acceptance::Accepted { changed: false }
        );
        let answers: BTreeMap<_, _> = [
            (B, b.join(A, 9, Millis(2_000))),
            (C, c.join(A, 9, Millis(2_000))),
        ]
        .into();
        assert_eq!(
            verdict(9, &peers(), &answers, 100),
            Verdict::Replacement {
                votes_from: Millis(1_500)
            }
        );
        // The old disk is retired on both; the new one is accepted.
        assert_eq!(
            b.accept(A, 5, Millis(2_100)),
            Acceptance::Retired { current: 9 }
        );
        assert_eq!(
            b.accept(A, 9, Millis(2_100)),
            Acceptance::Accepted { changed: false }
        );
        // A join again (the replacement crashed while it waited) gives the same wait.
        let again: BTreeMap<_, _> = [
            (B, b.join(A, 9, Millis(3_000))),
            (C, c.join(A, 9, Millis(3_000))),
        ]
        .into();
        assert_eq!(
            verdict(9, &peers(), &again, 100),
            Verdict::Replacement {
                votes_from: Millis(1_500)
            }
        );
    }

    #[test]
    fn a_member_that_restarted_counts_an_old_disk_as_heard_now() {
        // B persisted node A's disk 5 but restarted: it has not heard it since.
        let mut b = PeerDisks::restored([(A, 5, None)]);
        let known = b.join(A, 9, Millis(8_000)).unwrap();
        assert_eq!(known.heard, Millis(8_000), "later, never earlier");
        let answers: BTreeMap<_, _> = [(B, Some(known)), (C, None)].into();
        assert_eq!(
            verdict(9, &peers(), &answers, 100),
            Verdict::Replacement {
                votes_from: Millis(8_100)
            }
        );
        // What it persists keeps the predecessor's contact across its own restart.
        let kept = b.get(A).unwrap();
        assert_eq!(
            (kept.disk_id, kept.predecessor_heard),
            (9, Some(Millis(8_000)))
        );
    }

    #[test]
    fn a_new_member_that_crashed_before_it_voted_is_still_new() {
        let mut b = PeerDisks::default();
        let mut c = PeerDisks::default();
        assert_eq!(b.join(A, 9, Millis(10)), None);
        assert_eq!(c.join(A, 9, Millis(10)), None);
        let answers: BTreeMap<_, _> =
            [(B, b.join(A, 9, Millis(20))), (C, c.join(A, 9, Millis(20)))].into();
        assert_eq!(verdict(9, &peers(), &answers, 100), Verdict::NewMember);
    }
}
