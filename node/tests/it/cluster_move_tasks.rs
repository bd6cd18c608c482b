//! Move tasks served by a three-member cluster (spec/replication.md §8): a task started through
//! one member moves dead letters back and every member lists it, a second start and a cancel
//! are answered as one node answers them, and a runner stopped mid-task is taken over by
//! another member, which finishes without losing a message, and a task survives a restart of
//! the whole cluster, anti-entropy carries the task record to a member that was away, and with
//! five members (each holding only its share of the dead letters) a task moves them all. Members
//! as in `cluster_edges.rs`, with a 2 s lease (anti-entropy every second).

use std::collections::BTreeSet;
use std::time::Duration;

use tonic::Code;
use trireme_proto::v1 as pb;
use trireme_proto::v1::redrive_task::Status as TaskStatus;

use crate::cluster_edges::{EdgeCluster, create, stats};
use crate::harness::{Client, eventually, eventually_within, redrive_to, send_request};

/// Every wait for a task to end (a takeover waits a lease, `SKEW_MAX` and a lease per rank).
const TASK_END_MAX: Duration = Duration::from_secs(60);

async fn receive(client: &mut Client, queue: &str, visibility_s: u32) -> Vec<pb::ReceivedMessage> {
    client
        .receive_messages(pb::ReceiveMessagesRequest {
            queue: queue.to_owned(),
            max_messages: 10,
            visibility_timeout_seconds: Some(visibility_s),
            wait_seconds: Some(0),
        })
        .await
        .unwrap()
        .into_inner()
        .messages
}

async fn ready(client: &mut Client, queue: &str) -> u64 {
    stats(client, queue).await.ready
}

/// `src` with dead-letter queue `dlq` (maxReceiveCount 1) and `count` messages moved there by
/// receives through the members in turn; returns their ids once the members' views count each
/// ready in `dlq` on its three replicas.
async fn dead_lettered(cluster: &mut EdgeCluster, count: usize) -> BTreeSet<String> {
    create(cluster.at(0), "dlq", pb::QueueAttributes::default()).await;
    create(cluster.at(1), "src", redrive_to("dlq", 1)).await;
    let mut sent = BTreeSet::new();
    for index in 0..count {
        let reply = cluster
            .at(index)
            .send_message(send_request("src", &format!("m{index}")))
            .await
            .unwrap()
            .into_inner();
        sent.insert(reply.message_id);
    }
    // Each received once with visibility 0; the next receive finds it at its maximum and moves
    // it instead.
    let mut received = BTreeSet::new();
    for attempt in 0..200 {
        if received.len() == count {
            break;
        }
        for message in receive(cluster.at(attempt), "src", 0).await {
            received.insert(message.message_id);
        }
    }
    assert_eq!(received, sent);
    let clients: Vec<Client> = (0..cluster.len()).map(|i| cluster.at(i).clone()).collect();
    eventually("every dead letter counted on its three replicas", || {
        let clients = clients.clone();
        async move {
            let mut counted = 0;
            for mut client in clients {
                receive(&mut client, "src", 0).await;
                counted += ready(&mut client, "dlq").await;
            }
            counted == 3 * count as u64
        }
    })
    .await;
    sent
}

/// Starts a task of `dlq`. A start answered unavailable (no quorum in time on a loaded machine)
/// may have taken effect, as a failed send may: it is asked again (bounded), and a retry refused
/// as already running answers the task the first try started.
async fn start(
    client: &mut Client,
    destination: Option<&str>,
    rate: u32,
) -> Result<String, tonic::Status> {
    let request = pb::StartRedriveRequest {
        source_queue: "dlq".to_owned(),
        destination_queue: destination.map(str::to_owned),
        max_messages_per_second: rate,
    };
    let mut retried = false;
    for _ in 0..5 {
        match client.start_redrive(request.clone()).await {
            Ok(reply) => return Ok(reply.into_inner().task_handle),
            Err(status) if status.code() == Code::Unavailable => retried = true,
            Err(status) if retried && status.code() == Code::FailedPrecondition => {
                let running = tasks(client, "dlq").await;
                let task = running
                    .iter()
                    .find(|task| task.status == TaskStatus::Running as i32)
                    .unwrap_or_else(|| panic!("{status:?} with no running task: {running:?}"));
                return Ok(task.task_handle.clone());
            }
            Err(status) => return Err(status),
        }
    }
    panic!("five starts answered unavailable");
}

/// The tasks of `queue`, newest first; none when the read found no quorum in time (the waits
/// that call it ask again).
async fn tasks(client: &mut Client, queue: &str) -> Vec<pb::RedriveTask> {
    let listed = client
        .list_redrives(pb::ListRedrivesRequest {
            source_queue: queue.to_owned(),
            max_results: 10,
        })
        .await;
    match listed {
        Ok(reply) => reply.into_inner().tasks,
        Err(status) if status.code() == Code::Unavailable => Vec::new(),
        Err(status) => panic!("listing the tasks of {queue}: {status:?}"),
    }
}

async fn cancel(client: &mut Client, handle: &str) -> Result<u64, tonic::Status> {
    let reply = client
        .cancel_redrive(pb::CancelRedriveRequest {
            task_handle: handle.to_owned(),
        })
        .await?;
    Ok(reply.into_inner().moved)
}

/// Waits (bounded) until member `client` lists the task `handle` of `dlq` with `status`, and
/// returns it.
async fn listed_with(client: &Client, handle: &str, status: TaskStatus) -> pb::RedriveTask {
    let what = format!("task {handle} listed as {status:?}");
    eventually_within(&what, TASK_END_MAX, || {
        let mut client = client.clone();
        async move {
            tasks(&mut client, "dlq")
                .await
                .iter()
                .any(|task| task.task_handle == handle && task.status == status as i32)
        }
    })
    .await;
    let mut client = client.clone();
    tasks(&mut client, "dlq")
        .await
        .into_iter()
        .find(|task| task.task_handle == handle)
        .unwrap()
}

/// Receives everything `src` holds through the members in turn until `expected` distinct
/// messages came (duplicates allowed: the page allows them), each deleted; returns their ids.
async fn drain_source(
    cluster: &mut EdgeCluster,
    members: &[usize],
    expected: usize,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for attempt in 0..200 {
        if seen.len() == expected {
            break;
        }
        let member = members[attempt % members.len()];
        for message in receive(cluster.at(member), "src", 30).await {
            assert_eq!(
                message.receive_count, 1,
                "a redrive resets the count: {message:?}"
            );
            cluster
                .at(member)
                .delete_message(pb::DeleteMessageRequest {
                    queue: "src".to_owned(),
                    receipt_handle: message.receipt_handle,
                })
                .await
                .unwrap();
            seen.insert(message.message_id);
        }
        if seen.len() < expected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_through_one_member_moves_dead_letters_back_and_every_member_lists_it() {
    let mut cluster = EdgeCluster::start().await;
    let sent = dead_lettered(&mut cluster, 5).await;
    let handle = start(cluster.at(0), None, 0).await.unwrap();
    for index in 0..3 {
        let client = cluster.at(index).clone();
        let done = listed_with(&client, &handle, TaskStatus::Completed).await;
        assert_eq!(
            (done.moved, done.failed, done.to_move),
            (5, 0, 5),
            "{done:?}"
        );
        assert_eq!(done.source_queue, "dlq");
        assert_eq!(done.destination_queue, None);
    }
    let back = drain_source(&mut cluster, &[1, 2, 0], sent.len()).await;
    assert_eq!(back, sent);
    let mut client = cluster.at(2).clone();
    eventually("the dead-letter queue is empty on member 2", || {
        let mut client = client.clone();
        async move { ready(&mut client, "dlq").await == 0 }
    })
    .await;
    assert!(receive(&mut client, "dlq", 30).await.is_empty());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_is_refused_a_cancel_stops_the_task_and_refusals_match_one_node() {
    let mut cluster = EdgeCluster::start().await;
    let sent = dead_lettered(&mut cluster, 4).await;
    let handle = start(cluster.at(1), Some("src"), 1).await.unwrap();
    // One active task per source, whichever member is asked.
    let second = start(cluster.at(2), None, 1).await.unwrap_err();
    assert_eq!(second.code(), Code::FailedPrecondition, "{second:?}");
    let moved = cancel(cluster.at(0), &handle).await.unwrap();
    let client = cluster.at(2).clone();
    let stopped = listed_with(&client, &handle, TaskStatus::Cancelled).await;
    assert!(stopped.moved >= moved && stopped.moved < 4, "{stopped:?}");
    assert_eq!(stopped.destination_queue.as_deref(), Some("src"));
    // Only a running task is cancelled; a handle naming no task is not found, as on one node.
    let again = cancel(cluster.at(1), &handle).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    let unknown = cancel(cluster.at(2), "redrive-0").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    // A new task starts once the first ended, and the list gives both, newest first.
    let next = start(cluster.at(0), None, 0).await.unwrap();
    assert_ne!(next, handle);
    let client = cluster.at(1).clone();
    listed_with(&client, &next, TaskStatus::Completed).await;
    let listed: Vec<String> = tasks(cluster.at(1), "dlq")
        .await
        .into_iter()
        .map(|task| task.task_handle)
        .collect();
    assert_eq!(listed, [next, handle]);
    let back = drain_source(&mut cluster, &[0, 1, 2], sent.len()).await;
    assert_eq!(back, sent, "the cancel lost no message");
    // The single node's refusals, in its words.
    create(cluster.at(2), "plain", pb::QueueAttributes::default()).await;
    let not_dlq = cluster
        .at(0)
        .start_redrive(pb::StartRedriveRequest {
            source_queue: "plain".to_owned(),
            destination_queue: None,
            max_messages_per_second: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(not_dlq.code(), Code::FailedPrecondition);
    assert!(not_dlq.message().contains("dead-letter"), "{not_dlq:?}");
    let rate = start(cluster.at(1), Some("plain"), 501).await.unwrap_err();
    assert_eq!(rate.code(), Code::InvalidArgument);
    assert!(rate.message().contains("500"), "{rate:?}");
    let missing = start(cluster.at(2), Some("absent"), 0).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    assert!(tasks(cluster.at(0), "absent").await.is_empty());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_stopped_mid_task_is_taken_over_and_no_message_is_lost() {
    let mut cluster = EdgeCluster::start().await;
    let sent = dead_lettered(&mut cluster, 6).await;
    // Started through member 0, which acquires the lease at once and runs it, one a second.
    let handle = start(cluster.at(0), None, 1).await.unwrap();
    let client = cluster.at(1).clone();
    eventually_within("the runner moved a message", TASK_END_MAX, || {
        let mut client = client.clone();
        let handle = handle.clone();
        async move {
            tasks(&mut client, "dlq")
                .await
                .iter()
                .any(|task| task.task_handle == handle && task.moved >= 1)
        }
    })
    .await;
    cluster.stop(0).await;
    // Another member takes over once the lease and SKEW_MAX passed, and finishes.
    for index in 1..3 {
        let client = cluster.at(index).clone();
        let done = listed_with(&client, &handle, TaskStatus::Completed).await;
        assert_eq!(done.to_move, 6, "{done:?}");
    }
    let back = drain_source(&mut cluster, &[1, 2], sent.len()).await;
    assert_eq!(back, sent, "every dead letter came back");
    let client = cluster.at(1).clone();
    eventually("the dead-letter queue is empty", || {
        let mut client = client.clone();
        async move { ready(&mut client, "dlq").await == 0 }
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_survives_a_restart_of_every_member_and_finishes() {
    let mut cluster = EdgeCluster::start().await;
    let sent = dead_lettered(&mut cluster, 6).await;
    let handle = start(cluster.at(2), None, 1).await.unwrap();
    let client = cluster.at(0).clone();
    eventually_within("the runner moved a message", TASK_END_MAX, || {
        let mut client = client.clone();
        let handle = handle.clone();
        async move {
            tasks(&mut client, "dlq")
                .await
                .iter()
                .any(|task| task.task_handle == handle && task.moved >= 1)
        }
    })
    .await;
    // Every member forgets what it ran; the task is only in the replicas' records now.
    for index in 0..3 {
        cluster.stop(index).await;
    }
    for index in 0..3 {
        cluster.restart(index).await;
    }
    let listed = tasks(cluster.at(1), "dlq").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].task_handle, handle);
    // Its runner before the restart finds its own lease in its record and takes it at once
    // (a new epoch); the task ends as if nothing happened.
    for index in 0..3 {
        let client = cluster.at(index).clone();
        let done = listed_with(&client, &handle, TaskStatus::Completed).await;
        assert_eq!(done.to_move, 6, "{done:?}");
    }
    let back = drain_source(&mut cluster, &[0, 1, 2], sent.len()).await;
    assert_eq!(back, sent, "every dead letter came back");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_away_during_the_task_gets_its_record_by_anti_entropy() {
    let mut cluster = EdgeCluster::start().await;
    let sent = dead_lettered(&mut cluster, 3).await;
    cluster.stop(2).await;
    let handle = start(cluster.at(0), None, 0).await.unwrap();
    let client = cluster.at(1).clone();
    listed_with(&client, &handle, TaskStatus::Completed).await;
    let back = drain_source(&mut cluster, &[0, 1], sent.len()).await;
    assert_eq!(back, sent);
    cluster.restart(2).await;
    // Nobody writes the record again once the task ended: only anti-entropy can bring it.
    let records = |cluster: &EdgeCluster, index: usize| {
        cluster
            .node(index)
            .cluster()
            .unwrap()
            .store()
            .task_records(None, 10, |_, _| true)
            .unwrap()
            .0
    };
    let expected = records(&cluster, 0);
    assert_eq!(expected.len(), 1);
    assert_eq!(records(&cluster, 1), expected);
    eventually_within(
        "member 2 holds the ended task's record",
        TASK_END_MAX,
        || {
            let held = records(&cluster, 2);
            let expected = expected.clone();
            async move { held == expected }
        },
    )
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_five_members_a_task_moves_the_dead_letters_every_member_holds() {
    let mut cluster = EdgeCluster::start_with(5).await;
    let sent = dead_lettered(&mut cluster, 10).await;
    let handle = start(cluster.at(0), None, 0).await.unwrap();
    let client = cluster.at(3).clone();
    let done = listed_with(&client, &handle, TaskStatus::Completed).await;
    assert_eq!((done.moved, done.to_move), (10, 10), "{done:?}");
    let back = drain_source(&mut cluster, &[0, 1, 2, 3, 4], sent.len()).await;
    assert_eq!(back, sent, "every dead letter came back");
    let clients: Vec<Client> = (0..5).map(|i| cluster.at(i).clone()).collect();
    eventually("no member counts a dead letter", || {
        let clients = clients.clone();
        async move {
            let mut counted = 0;
            for mut client in clients {
                counted += ready(&mut client, "dlq").await;
            }
            counted == 0
        }
    })
    .await;
    cluster.shutdown().await;
}

/// An SQS client of member `sqs` signing with the key `id` (secret `MOVER_SECRET`).
fn sqs_client(sqs: std::net::SocketAddr, id: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(id, MOVER_SECRET, None, None, "tests"))
        .endpoint_url(format!("http://{sqs}"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

const MOVER_SECRET: &str = "s3cret";
/// A key limited to queues whose names begin with `orders-`.
const LIMITED_KEY_ID: &str = "AKIDORDERSONLY";

/// Sends `bodies` to `queue` through member 0 and moves each to its dead-letter queue
/// (maxReceiveCount 1) by receives through the members in turn.
async fn dead_letter_from(cluster: &mut EdgeCluster, queue: &str, bodies: &[&str]) {
    let mut sent = BTreeSet::new();
    for body in bodies {
        let reply = cluster
            .at(0)
            .send_message(send_request(queue, body))
            .await
            .unwrap()
            .into_inner();
        sent.insert(reply.message_id);
    }
    let mut received = BTreeSet::new();
    for attempt in 0..200 {
        if received == sent {
            break;
        }
        for message in receive(cluster.at(attempt), queue, 0).await {
            received.insert(message.message_id);
        }
    }
    assert_eq!(received, sent);
    let clients: Vec<Client> = (0..cluster.len()).map(|i| cluster.at(i).clone()).collect();
    let queue = queue.to_owned();
    eventually("the source holds no ready message on any member", || {
        let (clients, queue) = (clients.clone(), queue.clone());
        async move {
            let mut left = 0;
            for mut client in clients {
                receive(&mut client, &queue, 0).await;
                left += ready(&mut client, &queue).await;
            }
            left == 0
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_keys_task_leaves_in_the_dlq_what_would_go_outside_its_prefix_across_restarts() {
    let keys = vec![trireme_node::sqs::AccessKey {
        id: LIMITED_KEY_ID.to_owned(),
        secret: MOVER_SECRET.to_owned(),
        queue_prefixes: vec!["orders-".to_owned()],
    }];
    let mut cluster = EdgeCluster::start_with_keys(keys).await;
    create(cluster.at(0), "orders-dlq", pb::QueueAttributes::default()).await;
    create(cluster.at(1), "payroll", redrive_to("orders-dlq", 1)).await;
    create(cluster.at(2), "orders-eu", redrive_to("orders-dlq", 1)).await;
    // The salary last: the runner takes the oldest first, so it meets the salary after the
    // restart, under the record's prefixes alone. (A message skipped by one run is counted again
    // by the next, so it is not made to meet it twice.)
    dead_letter_from(&mut cluster, "orders-eu", &["order-0", "order-1"]).await;
    dead_letter_from(&mut cluster, "payroll", &["salary"]).await;
    let clients: Vec<Client> = (0..3).map(|i| cluster.at(i).clone()).collect();
    eventually("the three dead letters counted on their replicas", || {
        let clients = clients.clone();
        async move {
            let mut counted = 0;
            for mut client in clients {
                counted += ready(&mut client, "orders-dlq").await;
            }
            counted == 3 * 3
        }
    })
    .await;
    // payroll no longer names the dead-letter queue, so the start's check lets the key start;
    // the salary's source is still payroll.
    cluster
        .at(1)
        .set_queue_attributes(pb::SetQueueAttributesRequest {
            name: "payroll".to_owned(),
            attributes: Some(pb::QueueAttributes {
                clear_redrive_policy: true,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let limited = sqs_client(cluster.members[0].sqs, LIMITED_KEY_ID);
    let source = "arn:aws:sqs:us-east-1:000000000000:orders-dlq";
    for _ in 0..5 {
        // One a second, so the restart below comes while it runs.
        let started = limited
            .start_message_move_task()
            .source_arn(source)
            .max_number_of_messages_per_second(1)
            .send()
            .await;
        match started {
            Ok(_) => break,
            Err(error) => {
                use aws_sdk_sqs::error::ProvideErrorMetadata;
                // A start answered unavailable may have taken effect; the list below tells.
                assert_eq!(error.code(), Some("ServiceUnavailable"), "{error:?}");
            }
        }
    }
    // Every member forgets what it ran; the task, and the key's prefixes, are only in the
    // replicas' records now.
    for index in 0..3 {
        cluster.stop(index).await;
    }
    for index in 0..3 {
        cluster.restart(index).await;
    }
    let client = cluster.at(2).clone();
    eventually_within("the task ends", TASK_END_MAX, || {
        let mut client = client.clone();
        async move {
            let listed = tasks(&mut client, "orders-dlq").await;
            listed.len() == 1 && listed[0].status != TaskStatus::Running as i32
        }
    })
    .await;
    let done = tasks(cluster.at(2), "orders-dlq").await.remove(0);
    assert_eq!(done.status, TaskStatus::Completed as i32, "{done:?}");
    assert_eq!(
        (done.moved, done.failed, done.to_move),
        (2, 1, 3),
        "{done:?}"
    );
    for index in 0..3 {
        assert!(
            receive(cluster.at(index), "payroll", 30).await.is_empty(),
            "nothing went into payroll"
        );
    }
    let mut back = BTreeSet::new();
    let mut held = Vec::new();
    for attempt in 0..200 {
        if back.len() == 2 && !held.is_empty() {
            break;
        }
        for message in receive(cluster.at(attempt), "orders-eu", 30).await {
            back.insert(message.body);
        }
        if held.is_empty() {
            held = receive(cluster.at(attempt), "orders-dlq", 30).await;
        }
    }
    assert_eq!(
        back,
        BTreeSet::from(["order-0".to_owned(), "order-1".to_owned()])
    );
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].body, "salary", "still in the dead-letter queue");
    cluster.shutdown().await;
}
