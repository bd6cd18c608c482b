//! The client's calls against a real node: each call's reply and each refusal's variant.

use std::collections::BTreeMap;

use trireme_client::{
    Client, ClientConfig, DeleteEntry, Error, MessageAttribute, QueueAttributeChanges,
    QueueAttributes, ReceiptHandle, ReceiveOptions, RedriveChange, RedriveStatus, SendBatchEntry,
    SendMessage, StartRedrive, VisibilityChange,
};

use crate::fake;
use crate::node::{
    TestNode, create_queue, create_with_dead_letter_queue, queue_name, send, send_numbered,
};

fn wait(seconds: u32, max: u32) -> ReceiveOptions {
    ReceiveOptions {
        max_messages: max,
        visibility_timeout_seconds: None,
        wait_seconds: Some(seconds),
    }
}

#[tokio::test]
async fn create_is_idempotent_with_the_same_attributes_only() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("create");
    let attributes = QueueAttributes {
        visibility_timeout_seconds: Some(45),
        ..Default::default()
    };
    let first = client.create_queue(&name, &attributes).await.unwrap();
    assert!(first.created);
    assert_eq!(first.queue.settings.visibility_timeout_seconds, 45);
    assert_eq!(first.queue.settings.delay_seconds, 0);
    let again = client.create_queue(&name, &attributes).await.unwrap();
    assert!(!again.created);
    let other = QueueAttributes {
        visibility_timeout_seconds: Some(46),
        ..Default::default()
    };
    let err = client.create_queue(&name, &other).await.unwrap_err();
    assert!(
        matches!(err, Error::QueueExists { queue: Some(ref q), .. } if *q == name),
        "{err:?}"
    );
}

#[tokio::test]
async fn get_set_tag_and_delete_a_queue() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("lifecycle");
    let tags = BTreeMap::from([("team".to_owned(), "payments".to_owned())]);
    client
        .create_queue_with_tags(&name, &QueueAttributes::default(), &tags)
        .await
        .unwrap();
    assert_eq!(client.queue_tags(&name).await.unwrap(), tags);

    let changes = QueueAttributeChanges {
        delay_seconds: Some(5),
        ..Default::default()
    };
    let info = client.set_queue_attributes(&name, &changes).await.unwrap();
    assert_eq!(info.settings.delay_seconds, 5);
    assert_eq!(
        client
            .get_queue(&name)
            .await
            .unwrap()
            .settings
            .delay_seconds,
        5
    );

    client
        .tag_queue(
            &name,
            &BTreeMap::from([("env".to_owned(), "test".to_owned())]),
        )
        .await
        .unwrap();
    client
        .untag_queue(&name, &["team".to_owned()])
        .await
        .unwrap();
    let tags = client.queue_tags(&name).await.unwrap();
    assert_eq!(
        tags,
        BTreeMap::from([("env".to_owned(), "test".to_owned())])
    );

    client.delete_queue(&name).await.unwrap();
    let err = client.get_queue(&name).await.unwrap_err();
    assert!(matches!(err, Error::QueueNotFound { .. }), "{err:?}");
    let err = client
        .create_queue(&name, &QueueAttributes::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueueDeletedRecently { .. }), "{err:?}");
}

#[tokio::test]
async fn list_follows_pages_within_a_prefix() {
    let node = TestNode::start().await;
    let client = node.client();
    let mut made = Vec::new();
    for _ in 0..5 {
        let name = queue_name("paged");
        create_queue(&client, &name).await;
        made.push(name);
    }
    create_queue(&client, &queue_name("other")).await;

    let first = client.list_queues("paged-", Some(2), None).await.unwrap();
    assert_eq!(first.names.len(), 2);
    let token = first.next_page_token.clone().expect("more pages");
    let second = client
        .list_queues("paged-", Some(2), Some(&token))
        .await
        .unwrap();
    assert_eq!(second.names.len(), 2);
    assert!(second.names.iter().all(|n| !first.names.contains(n)));

    let mut all = client.list_all_queues("paged-").await.unwrap();
    all.sort();
    made.sort();
    assert_eq!(all, made);
}

#[tokio::test]
async fn send_receive_delete_with_attributes_and_stats() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("messages");
    create_queue(&client, &name).await;
    let message = SendMessage::new("hello")
        .attribute("kind", MessageAttribute::string("greeting"))
        .attribute("n", MessageAttribute::number(7))
        .attribute("raw", MessageAttribute::binary(vec![0, 1, 2]));
    let sent = client.send_message(&name, &message).await.unwrap();
    assert!(!sent.duplicate);
    assert_eq!(client.queue_stats(&name).await.unwrap().ready, 1);

    let received = client.receive_messages(&name, &wait(5, 10)).await.unwrap();
    assert_eq!(received.len(), 1);
    let got = &received[0];
    assert_eq!(got.message_id, sent.message_id);
    assert_eq!(got.body, "hello");
    assert_eq!(got.attributes, message.attributes);
    assert_eq!(got.receive_count, 1);
    assert_eq!(got.md5_of_body, sent.md5_of_body);
    let stats = client.queue_stats(&name).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 1));

    client
        .delete_message(&name, &got.receipt_handle)
        .await
        .unwrap();
    // A repeated delete succeeds: the message is gone, as the caller wanted.
    client
        .delete_message(&name, &got.receipt_handle)
        .await
        .unwrap();
    let stats = client.queue_stats(&name).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}

#[tokio::test]
async fn a_long_poll_is_answered_by_a_later_send() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("longpoll");
    create_queue(&client, &name).await;
    let poller = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move { client.receive_messages(&name, &wait(20, 1)).await })
    };
    send(&client, &name, "late").await;
    let got = poller.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, "late");
}

#[tokio::test]
async fn a_superseded_handle_is_refused_as_stale() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("stale");
    create_queue(&client, &name).await;
    send(&client, &name, "x").await;
    let first = client
        .receive_messages(&name, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    client
        .change_visibility(&name, &first.receipt_handle, 0)
        .await
        .unwrap();
    let second = client
        .receive_messages(&name, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(second.message_id, first.message_id);
    assert_eq!(second.receive_count, 2);

    let err = client
        .delete_message(&name, &first.receipt_handle)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");
    let err = client
        .change_visibility(&name, &first.receipt_handle, 10)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");
    let err = client
        .delete_message(&name, &ReceiptHandle::new("garbage"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReceiptHandleInvalid { .. }), "{err:?}");

    client
        .delete_message(&name, &second.receipt_handle)
        .await
        .unwrap();
    let err = client
        .change_visibility(&name, &second.receipt_handle, 10)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MessageNotInFlight { .. }), "{err:?}");
}

#[tokio::test]
async fn refusals_name_the_field_and_the_limit() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("invalid");
    create_queue(&client, &name).await;
    let err = client
        .receive_messages(&name, &wait(0, 11))
        .await
        .unwrap_err();
    match err {
        Error::InvalidArgument { field, message } => {
            assert_eq!(field.as_deref(), Some("max_messages"));
            assert!(message.contains("10"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let bad = QueueAttributes {
        visibility_timeout_seconds: Some(43_201),
        ..Default::default()
    };
    let err = client
        .create_queue(&queue_name("invalid"), &bad)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let err = client
        .send_message(&queue_name("missing"), &SendMessage::new("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueueNotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn deduplicated_sends_store_one_message() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("dedup");
    create_queue(&client, &name).await;
    let message = SendMessage::new("once").deduplication_id("order-1");
    let first = client.send_message(&name, &message).await.unwrap();
    let second = client.send_message(&name, &message).await.unwrap();
    assert!(second.duplicate);
    assert_eq!(second.message_id, first.message_id);
    assert_eq!(client.queue_stats(&name).await.unwrap().ready, 1);
}

#[tokio::test]
async fn batches_report_each_entry() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("batch");
    create_queue(&client, &name).await;
    let entries = vec![
        SendBatchEntry {
            id: "a".into(),
            message: SendMessage::new("one"),
        },
        SendBatchEntry {
            id: "b".into(),
            message: SendMessage::new("two"),
        },
        SendBatchEntry {
            id: "c".into(),
            message: SendMessage::new("late").delay_seconds(901),
        },
    ];
    let sent = client.send_message_batch(&name, &entries).await.unwrap();
    let mut ok: Vec<&str> = sent.successful.iter().map(|s| s.id.as_str()).collect();
    ok.sort();
    assert_eq!(ok, ["a", "b"]);
    assert_eq!(sent.failed.len(), 1);
    assert_eq!(sent.failed[0].id, "c");
    assert!(sent.failed[0].sender_fault);

    let mut received = Vec::new();
    for _ in 0..10 {
        received.extend(client.receive_messages(&name, &wait(2, 10)).await.unwrap());
        if received.len() == 2 {
            break;
        }
    }
    assert_eq!(received.len(), 2);

    let changes: Vec<VisibilityChange> = received
        .iter()
        .enumerate()
        .map(|(i, m)| VisibilityChange {
            id: format!("v{i}"),
            receipt_handle: m.receipt_handle.clone(),
            visibility_timeout_seconds: 120,
        })
        .chain([VisibilityChange {
            id: "bad".into(),
            receipt_handle: ReceiptHandle::new("garbage"),
            visibility_timeout_seconds: 1,
        }])
        .collect();
    let changed = client
        .change_visibility_batch(&name, &changes)
        .await
        .unwrap();
    assert_eq!(changed.successful.len(), 2);
    assert_eq!(changed.failed.len(), 1);
    assert_eq!(changed.failed[0].code, "ReceiptHandleIsInvalid");

    let deletes: Vec<DeleteEntry> = received
        .iter()
        .enumerate()
        .map(|(i, m)| DeleteEntry {
            id: format!("d{i}"),
            receipt_handle: m.receipt_handle.clone(),
        })
        .collect();
    let deleted = client.delete_message_batch(&name, &deletes).await.unwrap();
    assert_eq!(deleted.successful.len(), 2);
    assert!(deleted.failed.is_empty());
    let stats = client.queue_stats(&name).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}

#[tokio::test]
async fn purge_empties_the_queue_once_a_minute() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("purge");
    create_queue(&client, &name).await;
    send_numbered(&client, &name, 3).await;
    client.purge_queue(&name).await.unwrap();
    assert_eq!(client.queue_stats(&name).await.unwrap().ready, 0);
    let err = client.purge_queue(&name).await.unwrap_err();
    assert!(matches!(err, Error::PurgeInProgress { .. }), "{err:?}");
}

#[tokio::test]
async fn dead_letter_move_and_redrive_back() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("dlq");
    let source = queue_name("source");
    let policy = create_with_dead_letter_queue(&client, &source, &dlq, 1).await;
    assert_eq!(
        client
            .get_queue(&source)
            .await
            .unwrap()
            .settings
            .redrive_policy,
        Some(policy)
    );
    let sources = client
        .list_dead_letter_source_queues(&dlq, None, None)
        .await
        .unwrap();
    assert_eq!(sources.names, vec![source.clone()]);

    let sent = send(&client, &source, "poison").await;
    let first = client
        .receive_messages(&source, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    client
        .change_visibility(&source, &first.receipt_handle, 0)
        .await
        .unwrap();
    // The second receive moves the message instead of delivering it.
    assert!(
        client
            .receive_messages(&source, &wait(0, 1))
            .await
            .unwrap()
            .is_empty()
    );
    let dead = client
        .receive_messages(&dlq, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(dead.message_id, sent.message_id);
    assert_eq!(dead.dead_letter_source.as_ref(), Some(&source));
    client
        .change_visibility(&dlq, &dead.receipt_handle, 0)
        .await
        .unwrap();

    let task = client
        .start_redrive(&StartRedrive {
            source_queue: dlq.clone(),
            destination_queue: None,
            max_messages_per_second: None,
        })
        .await
        .unwrap();
    let back = client
        .receive_messages(&source, &wait(10, 1))
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].message_id, sent.message_id);
    assert_eq!(back[0].receive_count, 1, "redrive resets the receive count");
    let tasks = client.list_redrives(&dlq, Some(10)).await.unwrap();
    let listed = tasks
        .iter()
        .find(|t| t.task_handle == task)
        .expect("the task is listed");
    assert_eq!(listed.source_queue, dlq);

    // Remove the policy; the source no longer names the dead-letter queue.
    let changes = QueueAttributeChanges {
        redrive_policy: RedriveChange::Clear,
        ..Default::default()
    };
    assert_eq!(
        client
            .set_queue_attributes(&source, &changes)
            .await
            .unwrap()
            .settings
            .redrive_policy,
        None
    );
}

#[tokio::test]
async fn a_cancelled_redrive_reports_what_it_moved() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("cdlq");
    let target = queue_name("ctarget");
    create_queue(&client, &dlq).await;
    create_queue(&client, &target).await;
    send_numbered(&client, &dlq, 20).await;
    let task = client
        .start_redrive(&StartRedrive {
            source_queue: dlq.clone(),
            destination_queue: Some(target.clone()),
            max_messages_per_second: Some(1),
        })
        .await
        .unwrap();
    let moved = client.cancel_redrive(&task).await.unwrap();
    assert!(moved < 20);
    let listed = client.list_redrives(&dlq, Some(10)).await.unwrap();
    let status = listed
        .iter()
        .find(|t| t.task_handle == task)
        .unwrap()
        .status;
    assert!(
        matches!(status, RedriveStatus::Cancelled | RedriveStatus::Cancelling),
        "{status:?}"
    );
    let err = client
        .cancel_redrive(&trireme_client::TaskHandle::new("no-such-task"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::RedriveTaskNotFound { .. } | Error::InvalidArgument { .. }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_node_that_is_down_is_skipped_for_every_call() {
    let node = TestNode::start().await;
    let closed = fake::closed_port();
    let client = Client::new(ClientConfig::new([
        closed.address.clone(),
        node.address.clone(),
    ]))
    .unwrap();
    let name = queue_name("failover");
    create_queue(&client, &name).await;
    send(&client, &name, "through").await;
    let got = client.receive_messages(&name, &wait(5, 1)).await.unwrap();
    assert_eq!(got[0].body, "through");
}

#[tokio::test]
async fn dead_letter_message_moves_the_same_message_and_refuses_what_it_cannot_move() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("now-dlq");
    let queue = queue_name("now");
    create_with_dead_letter_queue(&client, &queue, &dlq, 5).await;
    let sent = send(&client, &queue, "poison").await;
    let first = client
        .receive_messages(&queue, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    client
        .change_visibility(&queue, &first.receipt_handle, 0)
        .await
        .unwrap();
    let second = client
        .receive_messages(&queue, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    let err = client
        .dead_letter_message(&queue, &first.receipt_handle)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");

    let moved_to = client
        .dead_letter_message(&queue, &second.receipt_handle)
        .await
        .unwrap();
    assert_eq!(moved_to, dlq);
    // A repeat finds the message gone from the source.
    let err = client
        .dead_letter_message(&queue, &second.receipt_handle)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MessageNotInFlight { .. }), "{err:?}");
    let moved = client
        .receive_messages(&dlq, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(moved.message_id, sent.message_id);
    assert_eq!(moved.receive_count, 3);
    assert_eq!(moved.sent_at_ms, second.sent_at_ms);
    assert_eq!(moved.dead_letter_source.as_ref(), Some(&queue));

    let plain = queue_name("now-plain");
    create_queue(&client, &plain).await;
    send(&client, &plain, "x").await;
    let held = client
        .receive_messages(&plain, &wait(5, 1))
        .await
        .unwrap()
        .remove(0);
    let err = client
        .dead_letter_message(&plain, &held.receipt_handle)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NoDeadLetterQueue { queue: Some(ref q), .. } if *q == plain),
        "{err:?}"
    );
}
