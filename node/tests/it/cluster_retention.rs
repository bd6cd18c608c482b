//! Retention in a three-member cluster (spec/replication.md §3): a message past its queue's
//! `MessageRetentionPeriod` since its original send is received by no member, whatever its
//! state, and every member's sweep turns its copy into a tombstone, so the counts fall to zero.
//! Every member reads one manual clock, so a test can end the retention.

use std::sync::Arc;

use trireme_node::clock::{Clock, ManualClock, SystemClock};
use trireme_proto::v1 as pb;

use crate::cluster_edges::{EdgeCluster, create, receive, stats};
use crate::harness::{Client, eventually, send_request};

/// `(ready, in flight, delayed)` as member `client` counts them.
async fn counts(client: &mut Client, queue: &str) -> (u64, u64, u64) {
    let stats = stats(client, queue).await;
    (stats.ready, stats.in_flight, stats.delayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_its_retention_is_received_by_no_member_and_expires_on_every_replica() {
    let clock = ManualClock::new(SystemClock.now());
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let mut cluster = EdgeCluster::start_with_clock(shared).await;
    let attributes = pb::QueueAttributes {
        retention_seconds: Some(60),
        ..Default::default()
    };
    create(cluster.at(0), "short", attributes).await;
    for index in 0..3 {
        cluster
            .at(index)
            .send_message(send_request("short", &format!("m{index}")))
            .await
            .unwrap();
    }
    // One of the three is in flight when its retention ends.
    let held = cluster
        .at(0)
        .receive_messages(pb::ReceiveMessagesRequest {
            queue: "short".to_owned(),
            max_messages: 1,
            visibility_timeout_seconds: Some(600),
            wait_seconds: Some(1),
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    assert_eq!(held.len(), 1);
    clock.advance_ms(59_000);
    for index in 0..3 {
        let client = cluster.at(index).clone();
        eventually(
            &format!("member {index} counts two ready, one in flight"),
            || {
                let mut client = client.clone();
                async move { counts(&mut client, "short").await == (2, 1, 0) }
            },
        )
        .await;
    }
    clock.advance_ms(1_000);
    for index in 0..3 {
        assert!(
            receive(cluster.at(index), "short", 10, 1).await.is_empty(),
            "member {index} delivers a message past its retention"
        );
    }
    for index in 0..3 {
        let client = cluster.at(index).clone();
        eventually(
            &format!("member {index}'s sweep expires every copy"),
            || {
                let mut client = client.clone();
                async move { counts(&mut client, "short").await == (0, 0, 0) }
            },
        )
        .await;
    }
    for (index, member) in cluster.members.iter().enumerate() {
        let records = member
            .node
            .as_ref()
            .and_then(|node| node.cluster())
            .unwrap()
            .store()
            .records()
            .unwrap();
        assert_eq!(records.len(), 3, "member {index}");
        assert!(
            records.iter().all(|(_, record)| record.live().is_none()),
            "member {index} holds a live copy past its retention: {records:?}"
        );
    }
    cluster.shutdown().await;
}
