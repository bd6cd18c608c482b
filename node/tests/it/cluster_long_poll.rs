//! Receives and long polls through members that hold no copy of a message
//! (spec/replication.md, *Candidates beyond the node's own index*, and §9): on five members
//! each holds three messages in five, and a member that was down holds none of what was sent
//! meanwhile until anti-entropy runs. Members run in-process as in `cluster`.

use std::collections::BTreeSet;
use std::time::Duration;

use trireme_core::{Incarnation, MessageId, Millis};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::cluster::Delivered;
use trireme_node::cluster::long_poll::Wait;
use trireme_replication::NodeId;
use trireme_replication::coordinator::SendAnswer;
use trireme_replication::placement::{Placement, Ring};

use super::cluster::{Member, birth, queue, runtime, start};

const INCARNATION: Incarnation = Incarnation::local(Millis(1));
const RETENTION_MS: u64 = 4 * 24 * 3_600_000;
const VISIBILITY_MS: u64 = 60_000;

fn wait(max: usize) -> Wait {
    Wait {
        max,
        visibility_timeout_ms: VISIBILITY_MS,
        retention_ms: RETENTION_MS,
        dead_letter: None,
    }
}

/// Message ids from `from` on whose three replicas on five members `node` is not.
fn held_without(node: u16, from: u128, count: usize) -> Vec<u128> {
    let ring = Ring::new((1..=5).map(NodeId)).expect("a ring");
    (from..)
        .filter(|id| {
            !ring
                .replicas(&queue("jobs"), MessageId(*id))
                .contains(&NodeId(node))
        })
        .take(count)
        .collect()
}

async fn send(member: &Member, id: u128, delay_ms: u64) -> SendAnswer {
    member
        .call(move |cluster| async move {
            let now = SystemClock.now();
            let mut birth = birth(&format!("m{id}"), now);
            if delay_ms > 0 {
                birth.visible_from = Millis(now.0 + delay_ms);
            }
            cluster
                .send(&queue("jobs"), INCARNATION, MessageId(id), birth)
                .await
        })
        .await
}

async fn short_poll(member: &Member, max: usize) -> Vec<Delivered> {
    member
        .call(move |cluster| async move {
            cluster
                .receive(
                    &queue("jobs"),
                    INCARNATION,
                    max,
                    VISIBILITY_MS,
                    RETENTION_MS,
                    None,
                )
                .await
        })
        .await
}

async fn long_poll(member: &Member, max: usize, wait_s: u64) -> Vec<Delivered> {
    member
        .call(move |cluster| async move {
            let until = tokio::time::Instant::now() + Duration::from_secs(wait_s);
            cluster
                .long_poll(&queue("jobs"), INCARNATION, wait(max), until)
                .await
        })
        .await
}

fn ids(delivered: &[Delivered]) -> BTreeSet<u128> {
    delivered.iter().map(|d| d.key.message.0).collect()
}

#[test]
fn short_polls_through_one_of_five_members_reach_every_message() {
    let cluster = start(5);
    runtime().block_on(async {
        let m = &cluster.members;
        for id in 0..30u128 {
            assert_eq!(send(&m[0], id, 0).await, SendAnswer::Sent);
        }
        let missing = held_without(5, 0, 30)
            .into_iter()
            .filter(|id| *id < 30)
            .count();
        assert!(missing > 0, "node 5 replicates only some of the 30");
        let mut delivered = BTreeSet::new();
        // Bounded: a sample that a loaded machine answers past SAMPLE_WAIT is skipped, and the
        // next receive asks the next member.
        for _ in 0..300 {
            if delivered.len() == 30 {
                break;
            }
            let got = short_poll(&m[4], 10).await;
            if got.is_empty() {
                // The third replica's write may still be on its way: let it land.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for message in ids(&got) {
                assert!(delivered.insert(message), "{message} delivered twice");
            }
        }
        assert_eq!(
            delivered,
            (0..30).collect(),
            "every message reached through node 5, {missing} of them held only elsewhere"
        );
    });
}

#[test]
fn a_long_poll_on_a_member_without_a_copy_is_served_the_message_sent_through_another() {
    let cluster = start(5);
    runtime().block_on(async {
        let m = &cluster.members;
        let id = held_without(5, 100, 1)[0];
        let (served, sent) = tokio::join!(long_poll(&m[4], 10, 20), async {
            // The poll has found nothing and waits by now, unless the machine is very slow;
            // either way the message is to be served.
            tokio::time::sleep(Duration::from_millis(300)).await;
            send(&m[1], id, 0).await
        });
        assert_eq!(sent, SendAnswer::Sent);
        assert_eq!(ids(&served), BTreeSet::from([id]));
    });
}

#[test]
fn a_long_poll_is_served_a_delayed_message_it_holds_no_copy_of_once_the_delay_ends() {
    let cluster = start(5);
    runtime().block_on(async {
        let m = &cluster.members;
        let id = held_without(5, 200, 1)[0];
        let delay_ms = 1_500;
        let sent_at = SystemClock.now();
        assert_eq!(send(&m[0], id, delay_ms).await, SendAnswer::Sent);
        assert!(
            short_poll(&m[4], 10).await.is_empty(),
            "delayed: nothing to receive yet"
        );
        // No write announces the end of a delay: the waiter's re-poll reads a quorum of
        // indexes, none of them node 5's own.
        let served = long_poll(&m[4], 10, 20).await;
        assert_eq!(ids(&served), BTreeSet::from([id]));
        assert!(
            SystemClock.now().0 >= sent_at.0 + delay_ms,
            "served only after its delay"
        );
    });
}

#[test]
fn a_member_that_missed_the_sends_serves_them_at_once_to_its_own_receivers() {
    let mut cluster = start(3);
    let rt = runtime();
    cluster.members[2].kill();
    rt.block_on(async {
        for id in 0..5u128 {
            assert_eq!(send(&cluster.members[0], id, 0).await, SendAnswer::Sent);
        }
    });
    // Node 3 returns without the five; anti-entropy's period (10 minutes) is far away.
    let addresses = cluster.addresses.clone();
    cluster.members[2].restart(&addresses);
    rt.block_on(async {
        let m = &cluster.members;
        let mut delivered = BTreeSet::new();
        for _ in 0..20 {
            if delivered.len() == 5 {
                break;
            }
            let got = long_poll(&m[2], 10, 5).await;
            delivered.extend(ids(&got));
        }
        assert_eq!(delivered, (0..5).collect());
    });
}

/// Waits (bounded) until `member` has `count` long polls in line on the queue.
async fn until_in_line(member: &Member, count: usize) {
    for _ in 0..1_000 {
        let in_line = member
            .call(|cluster| async move { cluster.waiters_in_line(&queue("jobs"), INCARNATION) })
            .await;
        if in_line >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} long polls never waited in line");
}

async fn index_samples(member: &Member) -> u64 {
    member
        .call(|cluster| async move { cluster.metrics().index_samples() })
        .await
}

/// spec/replication.md §9, *Arrival*: a long poll that finds its member's own index empty asks
/// one peer's index first, as a short poll does; one that arrives while another waits in line
/// on the queue asks no peer (the waiters' re-poll reads a quorum of indexes for both), so
/// many polls re-opening on one queue cost their member no peer call each.
#[test]
fn a_long_poll_arriving_beside_a_waiter_asks_no_peers_index() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        let first = long_poll(&m[0], 1, 3);
        let second = async {
            until_in_line(&m[0], 1).await;
            assert_eq!(
                index_samples(&m[0]).await,
                1,
                "the first arrival sampled a peer"
            );
            let (served, ()) = tokio::join!(long_poll(&m[0], 1, 2), until_in_line(&m[0], 2));
            assert_eq!(
                index_samples(&m[0]).await,
                1,
                "the second arrival asked no peer"
            );
            served
        };
        let (first, second) = tokio::join!(first, second);
        assert!(first.is_empty() && second.is_empty(), "nothing was sent");
    });
}
