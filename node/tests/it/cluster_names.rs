//! Queues in the cluster on loopback (spec/replication.md §1, §11): three members in one process,
//! as in `cluster.rs` (whose members this file uses), creating, changing and deleting queue
//! names through the real internal service.

use std::collections::{BTreeMap, BTreeSet};

use trireme_core::{MessageId, QueueName};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::cluster::anti_entropy::AntiEntropySettings;
use trireme_node::cluster::names::{ChangeQueueError, QueueState};
use trireme_replication::NodeId;
use trireme_replication::coordinator::SendAnswer;
use trireme_replication::name::{CreateAnswer, DeleteQueueAnswer, NameRecord, QueueIncarnation};

use super::cluster::{Member, birth, queue, runtime, start};

fn attributes(visibility: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("VisibilityTimeout".to_owned(), visibility.to_owned())])
}

async fn create(member: &Member, name: &str, visibility: &str) -> CreateAnswer {
    let (name, attributes) = (queue(name), attributes(visibility));
    member
        .call(move |c| async move { c.create_queue(&name, attributes, BTreeMap::new()).await })
        .await
}

async fn delete(member: &Member, name: &str) -> DeleteQueueAnswer {
    let name = queue(name);
    member
        .call(move |c| async move { c.delete_queue(&name).await })
        .await
}

async fn read(member: &Member, name: &str) -> Option<QueueState> {
    let name = queue(name);
    member
        .call(move |c| async move { c.queue(&name).await })
        .await
        .expect("two replicas answer")
}

async fn read_settled(member: &Member, name: &str) -> Option<QueueState> {
    let name = queue(name);
    member
        .call(move |c| async move { c.queue_settled(&name).await })
        .await
        .expect("two replicas answer")
}

async fn change(
    member: &Member,
    name: &str,
    incarnation: QueueIncarnation,
    attributes: &[(&str, Option<&str>)],
    tags: &[(&str, Option<&str>)],
) -> Result<(), ChangeQueueError> {
    let owned = |pairs: &[(&str, Option<&str>)]| -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
            .collect()
    };
    let (name, attributes, tags) = (queue(name), owned(attributes), owned(tags));
    member
        .call(move |c| async move { c.change_queue(&name, incarnation, attributes, tags).await })
        .await
}

/// Sends message `id` into the queue "jobs" of `incarnation`.
async fn send(member: &Member, incarnation: QueueIncarnation, id: u128) -> SendAnswer {
    member
        .call(move |c| async move {
            c.send(
                &queue("jobs"),
                incarnation,
                MessageId(id),
                birth("body", SystemClock.now()),
            )
            .await
        })
        .await
}

async fn queue_names(member: &Member) -> Vec<QueueName> {
    member.call(|c| async move { c.queue_names() }).await
}

/// The name records a member holds as a replica.
async fn name_records(member: &Member) -> Vec<(QueueName, NameRecord)> {
    member
        .call(|c| async move {
            c.store()
                .name_records(None, usize::MAX, |_| true)
                .expect("the name records read")
                .0
        })
        .await
}

fn created(answer: &CreateAnswer) -> QueueIncarnation {
    match answer {
        CreateAnswer::Created(incarnation) => *incarnation,
        other => panic!("expected the queue created, got {other:?}"),
    }
}

#[test]
fn a_queue_created_through_one_node_is_seen_through_the_others() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        let incarnation = created(&create(&m[0], "jobs", "30").await);
        assert_eq!(incarnation.node, 1, "the creating coordinator's");
        for member in m {
            let state = read(member, "jobs").await.expect("the queue exists");
            assert_eq!(state.incarnation, incarnation);
            assert_eq!(state.attributes, attributes("30"));
            assert_eq!(state.created_at.0, incarnation.hlc_ms);
            assert_eq!(state.modified_at, state.created_at);
            assert_eq!(state.purge_watermark, None);
            assert_eq!(queue_names(member).await, vec![queue("jobs")]);
        }
        assert_eq!(read(&m[1], "other").await, None, "a name never created");
        // A repeat with the same attributes names the same queue; other attributes do not.
        assert_eq!(
            create(&m[2], "jobs", "30").await,
            CreateAnswer::Created(incarnation)
        );
        assert_eq!(
            create(&m[1], "jobs", "45").await,
            CreateAnswer::NameExists(incarnation)
        );
    });
}

/// Two creates of one name through two nodes at once: one incarnation, whoever wins.
fn race(visibility_a: &'static str, visibility_b: &'static str) -> [CreateAnswer; 2] {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        let (a, b) = tokio::join!(
            create(&m[0], "jobs", visibility_a),
            create(&m[1], "jobs", visibility_b)
        );
        let live: BTreeSet<QueueIncarnation> = [
            read(&m[0], "jobs").await,
            read(&m[1], "jobs").await,
            read(&m[2], "jobs").await,
        ]
        .into_iter()
        .map(|state| state.expect("the queue exists").incarnation)
        .collect();
        assert_eq!(live.len(), 1, "one incarnation on every node: {live:?}");
        let winner = *live.first().expect("one");
        for answer in [&a, &b] {
            match answer {
                CreateAnswer::Created(i) | CreateAnswer::NameExists(i) => assert_eq!(*i, winner),
                other => panic!("both creates answer with the winner: {other:?}"),
            }
        }
        [a, b]
    })
}

#[test]
fn racing_creates_with_different_attributes_end_with_one_queue_and_the_loser_told_it_exists() {
    let answers = race("30", "45");
    let created = answers
        .iter()
        .filter(|a| matches!(a, CreateAnswer::Created(_)))
        .count();
    let exists = answers
        .iter()
        .filter(|a| matches!(a, CreateAnswer::NameExists(_)))
        .count();
    assert_eq!((created, exists), (1, 1), "{answers:?}");
}

#[test]
fn racing_creates_with_the_same_attributes_both_succeed_with_one_queue() {
    let answers = race("30", "30");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, CreateAnswer::Created(_))),
        "{answers:?}"
    );
}

#[test]
fn a_deleted_queue_is_gone_everywhere_its_name_waits_and_its_messages_are_dropped() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        let incarnation = created(&create(&m[0], "jobs", "30").await);
        assert_eq!(send(&m[0], incarnation, 1).await, SendAnswer::Sent);
        let kept = |member: &Member| {
            member
                .records()
                .keys()
                .filter_map(|key| trireme_replication::RecordKey::decode(key))
                .filter(|key| key.incarnation == incarnation)
                .count()
        };
        // The message reaches the delete's coordinator (it may follow the send's two acks).
        for _ in 0..2_000 {
            if kept(&m[1]) == 1 {
                break;
            }
            // The replica store commits on its own thread: give its fsync real time, bounded by
            // the attempts (10 s at most), not a count of yields that a loaded machine outruns.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(kept(&m[1]), 1, "the message is on node 2 before the delete");
        assert_eq!(
            delete(&m[1], "jobs").await,
            DeleteQueueAnswer::Deleted(incarnation)
        );
        for member in m {
            assert_eq!(
                read_settled(member, "jobs").await,
                None,
                "no live queue after the delete"
            );
        }
        assert_eq!(read(&m[1], "jobs").await, None);
        assert!(queue_names(&m[1]).await.is_empty());
        assert_eq!(delete(&m[2], "jobs").await, DeleteQueueAnswer::DoesNotExist);
        assert_eq!(
            create(&m[0], "jobs", "30").await,
            CreateAnswer::DeletedRecently,
            "within 60 s of the delete"
        );

        // The delete's coordinator knows the deletion: its replica drops the message, and a
        // late send under the deleted incarnation is acknowledged and not kept.
        // The background sweeper may have dropped it already; either way it is gone.
        m[1].call(|c| async move { c.sweep_deleted().await }).await;
        assert_eq!(kept(&m[1]), 0, "the deleted queue's message is dropped");
        assert_eq!(send(&m[1], incarnation, 2).await, SendAnswer::Sent);
        assert_eq!(kept(&m[1]), 0, "a late send is dropped too");
    });
}

#[test]
fn an_attribute_change_through_one_node_is_read_through_another() {
    let cluster = start(3);
    runtime().block_on(async {
        let m = &cluster.members;
        let incarnation = created(&create(&m[0], "jobs", "30").await);
        change(
            &m[1],
            "jobs",
            incarnation,
            &[
                ("VisibilityTimeout", Some("45")),
                ("DelaySeconds", Some("5")),
            ],
            &[("team", Some("blue"))],
        )
        .await
        .expect("changed");
        let state = read_settled(&m[2], "jobs").await.expect("the queue exists");
        assert_eq!(state.attributes["VisibilityTimeout"], "45");
        assert_eq!(state.attributes["DelaySeconds"], "5");
        assert_eq!(state.tags["team"], "blue");
        assert!(state.modified_at > state.created_at);
        // A removal, through the third node, after the change: it wins by its stamp.
        change(
            &m[2],
            "jobs",
            incarnation,
            &[("DelaySeconds", None)],
            &[("team", None)],
        )
        .await
        .expect("changed");
        let state = read_settled(&m[0], "jobs").await.expect("the queue exists");
        assert_eq!(state.attributes, attributes("45"));
        assert!(state.tags.is_empty());

        let mut other = incarnation;
        other.nonce = other.nonce.wrapping_add(1);
        assert_eq!(
            change(&m[0], "jobs", other, &[("DelaySeconds", Some("1"))], &[]).await,
            Err(ChangeQueueError::Gone),
            "another incarnation's change writes nothing"
        );
        assert_eq!(
            delete(&m[0], "jobs").await,
            DeleteQueueAnswer::Deleted(incarnation)
        );
        assert_eq!(
            change(
                &m[0],
                "jobs",
                incarnation,
                &[("DelaySeconds", Some("1"))],
                &[]
            )
            .await,
            Err(ChangeQueueError::Gone),
            "a deleted queue's change through the deleting node writes nothing"
        );
        // Through a node whose fresh view still shows the incarnation (the tombstone's push
        // has not reached it yet), the page lets the change skip its read and be written into
        // the deleted epoch, where it dies with it (spec/replication.md §1, SetQueueAttributes,
        // and Considerations, *A change names its incarnation*; SQS too lets calls about a
        // deleted queue succeed for up to 60 s). Either answer is allowed; neither revives it.
        let through_other = change(
            &m[1],
            "jobs",
            incarnation,
            &[("DelaySeconds", Some("1"))],
            &[],
        )
        .await;
        assert!(
            matches!(through_other, Ok(()) | Err(ChangeQueueError::Gone)),
            "{through_other:?}"
        );
        for member in m {
            assert_eq!(
                read_settled(member, "jobs")
                    .await
                    .map(|state| state.attributes),
                None,
                "the deleted queue stays deleted after a racing change"
            );
        }
    });
}

#[test]
fn with_one_member_down_creates_changes_reads_and_deletes_succeed() {
    let mut cluster = start(3);
    cluster.members[2].kill();
    runtime().block_on(async {
        let m = &cluster.members;
        let incarnation = created(&create(&m[0], "jobs", "30").await);
        let state = read(&m[1], "jobs").await.expect("the queue exists");
        assert_eq!(state.incarnation, incarnation);
        change(
            &m[1],
            "jobs",
            incarnation,
            &[("VisibilityTimeout", Some("9"))],
            &[],
        )
        .await
        .expect("changed");
        let state = read_settled(&m[0], "jobs").await.expect("the queue exists");
        assert_eq!(state.attributes, attributes("9"));
        assert_eq!(
            delete(&m[0], "jobs").await,
            DeleteQueueAnswer::Deleted(incarnation)
        );
        assert_eq!(read_settled(&m[1], "jobs").await, None);
    });
}

#[test]
fn a_member_that_missed_a_create_converges_by_anti_entropy() {
    let mut cluster = start(3);
    cluster.members[2].kill();
    let rt = runtime();
    let incarnation = rt.block_on(async {
        let incarnation = created(&create(&cluster.members[0], "jobs", "30").await);
        change(
            &cluster.members[1],
            "jobs",
            incarnation,
            &[],
            &[("team", Some("blue"))],
        )
        .await
        .expect("changed");
        incarnation
    });
    let addresses = cluster.addresses.clone();
    cluster.members[2].restart(&addresses);
    rt.block_on(async {
        let m = &cluster.members;
        assert!(
            name_records(&m[2]).await.is_empty(),
            "the third replica missed the create"
        );
        assert!(queue_names(&m[2]).await.is_empty());
        let report = m[2]
            .call(|c| async move {
                c.anti_entropy_round(NodeId(1), &AntiEntropySettings::default())
                    .await
                    .expect("the round runs")
            })
            .await;
        assert!(report.names_exchanged);
        assert_eq!(report.names_pulled, 1);
        let records = name_records(&m[0]).await;
        assert_eq!(records.len(), 1);
        for member in &m[1..] {
            assert_eq!(
                name_records(member).await,
                records,
                "node {} holds the same name record",
                member.node
            );
        }
        assert_eq!(queue_names(&m[2]).await, vec![queue("jobs")]);
        let state = QueueState::of(&records[0].1).expect("live");
        assert_eq!(state.incarnation, incarnation);
        assert_eq!(state.tags["team"], "blue");
        // A second round finds nothing to exchange.
        let again = m[2]
            .call(|c| async move {
                c.anti_entropy_round(NodeId(2), &AntiEntropySettings::default())
                    .await
                    .expect("the round runs")
            })
            .await;
        assert!(!again.names_exchanged, "{again:?}");
    });
}

#[test]
fn on_five_nodes_a_queue_is_served_and_deleted_through_nodes_that_do_not_replicate_its_name() {
    let cluster = start(5);
    let ring = trireme_replication::placement::Ring::new((1..=5).map(NodeId)).expect("a ring");
    // A name whose three replicas leave out nodes 1 and 2 (names spread over the ring).
    let name = (0..1_000)
        .map(|i| format!("jobs-{i}"))
        .find(|name| {
            let replicas = ring.name_replicas(&queue(name));
            !replicas.contains(&NodeId(1)) && !replicas.contains(&NodeId(2))
        })
        .expect("some name leaves out two of five nodes");
    runtime().block_on(async {
        let m = &cluster.members;
        let incarnation = created(&create(&m[0], &name, "30").await);
        for member in m {
            let state = read(member, &name).await.expect("the queue exists");
            assert_eq!(state.incarnation, incarnation);
            assert_eq!(queue_names(member).await, vec![queue(&name)]);
        }
        for member in m {
            let held = name_records(member).await.len();
            let replica = ring
                .name_replicas(&queue(&name))
                .contains(&NodeId(member.node));
            assert_eq!(held, usize::from(replica), "node {}", member.node);
        }
        // Messages of the queue land on every node; node 2 is a replica of some of them.
        for id in 0..20u128 {
            let name = queue(&name);
            let answer = m[id as usize % 5]
                .call(move |c| async move {
                    c.send(
                        &name,
                        incarnation,
                        MessageId(id),
                        birth("m", SystemClock.now()),
                    )
                    .await
                })
                .await;
            assert_eq!(answer, SendAnswer::Sent);
        }
        assert_eq!(
            delete(&m[1], &name).await,
            DeleteQueueAnswer::Deleted(incarnation)
        );
        for member in m {
            // A settled read puts the tombstone in every view (if the push has not already).
            assert_eq!(read_settled(member, &name).await, None);
            member
                .call(|c| async move { c.sweep_deleted().await })
                .await;
            let kept = member
                .records()
                .keys()
                .filter_map(|key| trireme_replication::RecordKey::decode(key))
                .filter(|key| key.incarnation == incarnation)
                .count();
            assert_eq!(
                kept, 0,
                "node {} dropped the deleted queue's messages",
                member.node
            );
            assert!(queue_names(member).await.is_empty());
        }
    });
}

/// One `Exchange` carrying a single name request, sent to `to` as node `from` with its clock at
/// `clock_ms`; the name reply.
async fn exchange_name(
    cluster: &super::cluster::Cluster3,
    to: u16,
    from: u16,
    clock_ms: u64,
    (name, request): (&str, &trireme_replication::name::NameRequest),
) -> trireme_replication::name::NameReply {
    use trireme_node::cluster::wire;
    use trireme_proto::replica::v1 as pb;
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", cluster.addresses[&to]))
            .expect("an address")
            .connect()
            .await
            .expect("the member serves");
    let reply = pb::replica_client::ReplicaClient::new(channel)
        .exchange(pb::Batch {
            request_id: 1,
            sender: Some(pb::Sender {
                node_id: u32::from(from),
                disk_id: u64::from(from) * 1_000 + 7,
                clock_ms,
            }),
            entries: Vec::new(),
            names: vec![wire::name_entry(&queue(name), request)],
            tasks: Vec::new(),
            dedups: Vec::new(),
        })
        .await
        .expect("the batch is answered")
        .into_inner();
    wire::name_replies(&reply.name_replies, 1)
        .expect("one name reply")
        .pop()
        .expect("one")
}

#[test]
fn a_name_request_older_than_the_horizon_or_to_a_node_that_does_not_replicate_the_name_is_refused()
{
    use trireme_replication::name::{NameReply, NameRequest};
    let cluster = start(5);
    let ring = trireme_replication::placement::Ring::new((1..=5).map(NodeId)).expect("a ring");
    let replicas = ring.name_replicas(&queue("jobs"));
    let replica = replicas[0].0;
    let outsider = (1..=5u16)
        .find(|node| !replicas.contains(&NodeId(*node)))
        .expect("two of five do not replicate the name");
    let sender = (1..=5u16)
        .find(|node| *node != replica && *node != outsider)
        .expect("a third member");
    runtime().block_on(async {
        let now = SystemClock.now().0;
        assert!(matches!(
            exchange_name(&cluster, replica, sender, now, ("jobs", &NameRequest::Read)).await,
            NameReply::Record(_)
        ));
        assert_eq!(
            exchange_name(&cluster, replica, sender, 0, ("jobs", &NameRequest::Read)).await,
            NameReply::Refused,
            "older than the horizon"
        );
        assert_eq!(
            exchange_name(
                &cluster,
                outsider,
                sender,
                now,
                ("jobs", &NameRequest::Read)
            )
            .await,
            NameReply::Refused,
            "not a replica of the name"
        );
        // A push reaches any member's view, replica of the name or not (a name nobody created:
        // only the push can have put it there).
        let proposal = trireme_replication::name::Proposal {
            incarnation: QueueIncarnation {
                hlc_ms: now,
                node: sender,
                nonce: 1,
            },
            ..trireme_replication::name::Proposal::default()
        };
        let mut record = NameRecord::default();
        record.votes[0] = Some(Box::new(proposal.clone()));
        record.votes[1] = Some(Box::new(proposal));
        let outsider_member = &cluster.members[usize::from(outsider) - 1];
        assert!(queue_names(outsider_member).await.is_empty());
        let pushed = NameRequest::View(record);
        assert_eq!(
            exchange_name(&cluster, outsider, sender, now, ("pushed", &pushed)).await,
            NameReply::Ack
        );
        assert_eq!(queue_names(outsider_member).await, vec![queue("pushed")]);
        assert!(
            name_records(outsider_member).await.is_empty(),
            "a push never touches a replica's records"
        );
    });
}

#[test]
fn a_node_that_replicates_no_copy_of_a_name_learns_it_by_the_catalogs_anti_entropy() {
    let mut cluster = start(5);
    let ring = trireme_replication::placement::Ring::new((1..=5).map(NodeId)).expect("a ring");
    let name = (0..1_000)
        .map(|i| format!("jobs-{i}"))
        .find(|name| !ring.name_replicas(&queue(name)).contains(&NodeId(5)))
        .expect("some name leaves out node 5");
    let replica = ring.name_replicas(&queue(&name))[0];
    cluster.members[4].kill();
    let rt = runtime();
    let incarnation =
        rt.block_on(async { created(&create(&cluster.members[0], &name, "30").await) });
    let addresses = cluster.addresses.clone();
    cluster.members[4].restart(&addresses);
    rt.block_on(async {
        let outsider = &cluster.members[4];
        assert!(
            queue_names(outsider).await.is_empty(),
            "the push went by while it was away"
        );
        let round = || {
            outsider.call(move |c| async move {
                c.anti_entropy_round(replica, &AntiEntropySettings::default())
                    .await
                    .expect("the round runs")
            })
        };
        let report = round().await;
        assert!(report.catalog_pulled >= 1, "{report:?}");
        assert!(!report.names_exchanged, "the two share no copy of the name");
        assert_eq!(queue_names(outsider).await, vec![queue(&name)]);
        assert!(
            name_records(outsider).await.is_empty(),
            "its view, not a replica's record"
        );
        assert_eq!(round().await.catalog_pulled, 0, "the view agrees now");
        let state = read(outsider, &name).await.expect("the queue exists");
        assert_eq!(state.incarnation, incarnation);
    });
}
