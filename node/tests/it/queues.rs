//! Queue RPCs: create (idempotent, conflicting), get, list with pagination, set attributes,
//! tags, delete, purge, dead-letter sources.

use tonic::Code;
use trireme_proto::v1 as pb;

use crate::harness::TestNode;

fn attributes_with_visibility(visibility_s: u32) -> pb::QueueAttributes {
    pb::QueueAttributes {
        visibility_timeout_seconds: Some(visibility_s),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_is_idempotent_and_conflicting_attributes_are_refused() {
    let mut node = TestNode::start().await;
    let created = node
        .client
        .create_queue(pb::CreateQueueRequest {
            name: "orders".to_owned(),
            attributes: Some(attributes_with_visibility(45)),
            tags: [("team".to_owned(), "billing".to_owned())].into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    let info = created.queue.unwrap();
    let attributes = info.attributes.unwrap();
    assert_eq!(attributes.visibility_timeout_seconds, Some(45));
    // Unset attributes come back filled with SQS's defaults.
    assert_eq!(attributes.retention_seconds, Some(345_600));
    assert_eq!(attributes.max_message_bytes, Some(1_048_576));
    assert_eq!(info.tags.get("team").map(String::as_str), Some("billing"));

    let again = node
        .try_create("orders", attributes_with_visibility(45))
        .await
        .unwrap();
    assert!(!again.created);

    let conflict = node
        .try_create("orders", attributes_with_visibility(46))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_queues_pages_by_prefix() {
    let mut node = TestNode::start().await;
    for name in ["app-a", "app-b", "app-c", "other"] {
        node.create(name).await;
    }
    let first = node
        .client
        .list_queues(pb::ListQueuesRequest {
            prefix: "app-".to_owned(),
            max_results: 2,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.names, ["app-a", "app-b"]);
    assert!(!first.next_page_token.is_empty());
    let second = node
        .client
        .list_queues(pb::ListQueuesRequest {
            prefix: "app-".to_owned(),
            max_results: 2,
            page_token: first.next_page_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.names, ["app-c"]);
    assert!(second.next_page_token.is_empty());
    let all = node
        .client
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.names.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_attributes_tags_and_delete_change_what_get_shows() {
    let mut node = TestNode::start().await;
    node.create("jobs").await;
    node.create("jobs-dlq").await;
    let set = node
        .client
        .set_queue_attributes(pb::SetQueueAttributesRequest {
            name: "jobs".to_owned(),
            attributes: Some(pb::QueueAttributes {
                delay_seconds: Some(5),
                redrive_policy: Some(pb::RedrivePolicy {
                    dead_letter_queue: "jobs-dlq".to_owned(),
                    max_receive_count: 3,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .queue
        .unwrap();
    let attributes = set.attributes.unwrap();
    assert_eq!(attributes.delay_seconds, Some(5));
    assert_eq!(
        attributes.redrive_policy.unwrap().dead_letter_queue,
        "jobs-dlq"
    );

    let sources = node
        .client
        .list_dead_letter_source_queues(pb::ListDeadLetterSourceQueuesRequest {
            name: "jobs-dlq".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sources.names, ["jobs"]);

    let cleared = node
        .client
        .set_queue_attributes(pb::SetQueueAttributesRequest {
            name: "jobs".to_owned(),
            attributes: Some(pb::QueueAttributes {
                clear_redrive_policy: true,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .queue
        .unwrap();
    assert!(cleared.attributes.unwrap().redrive_policy.is_none());

    node.client
        .tag_queue(pb::TagQueueRequest {
            name: "jobs".to_owned(),
            tags: [
                ("env".to_owned(), "test".to_owned()),
                ("owner".to_owned(), "me".to_owned()),
            ]
            .into(),
        })
        .await
        .unwrap();
    node.client
        .untag_queue(pb::UntagQueueRequest {
            name: "jobs".to_owned(),
            keys: vec!["owner".to_owned()],
        })
        .await
        .unwrap();
    let info = node.get_queue("jobs").await.unwrap();
    assert_eq!(info.tags.len(), 1);
    assert_eq!(info.tags["env"], "test");

    node.client
        .delete_queue(pb::DeleteQueueRequest {
            name: "jobs".to_owned(),
        })
        .await
        .unwrap();
    let missing = node.get_queue("jobs").await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    // The name is held for 60 s after a delete.
    let recreate = node
        .client
        .create_queue(pb::CreateQueueRequest {
            name: "jobs".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(recreate.code(), Code::FailedPrecondition, "{recreate:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_every_message_and_a_second_purge_within_60_s_is_refused() {
    let mut node = TestNode::start().await;
    node.create("work").await;
    for body in ["a", "b", "c"] {
        node.send("work", body).await;
    }
    node.receive("work", 1, 600).await;
    let before = node.stats("work").await;
    assert_eq!((before.ready, before.in_flight), (2, 1));
    node.client
        .purge_queue(pb::PurgeQueueRequest {
            name: "work".to_owned(),
        })
        .await
        .unwrap();
    let after = node.stats("work").await;
    assert_eq!((after.ready, after.in_flight, after.delayed), (0, 0, 0));
    let again = node
        .client
        .purge_queue(pb::PurgeQueueRequest {
            name: "work".to_owned(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted, "{again:?}");
}
