//! The SQS endpoint driven by the official Rust SDK (`aws-sdk-sqs`) against a live in-process
//! node: every action, dead-letter moves and a move task back, long polling, batch partial
//! failures, error shapes (also checked on the raw wire), MD5 digests and SigV4 verification.

mod aws;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::change_message_visibility::{
    ChangeMessageVisibilityError, ChangeMessageVisibilityOutput,
};
use aws_sdk_sqs::operation::delete_message::{DeleteMessageError, DeleteMessageOutput};
use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use trireme_node::Node;
use trireme_node::clock::SystemClock;
use trireme_node::config::Config;
use trireme_node::metrics::MessageCounters;
use trireme_node::sqs::{AccessKey, SqsSettings, router};

const ACCOUNT: &str = "000000000000";

fn queue_name(name: &str) -> trireme_core::QueueName {
    trireme_core::QueueName::try_from(name).unwrap()
}
const KEY_ID: &str = "AKIDTRIREMETEST";
const SECRET: &str = "trireme-test-secret";

/// A node with its SQS endpoint on loopback, and an SDK client pointed at it.
struct Harness {
    client: Client,
    address: SocketAddr,
    /// The node's message counters (superseded deletes among them).
    metrics: MessageCounters,
    _node: Node,
    _dir: TempDir,
}

impl Harness {
    async fn start() -> Harness {
        Harness::start_with_keys(Vec::new()).await
    }

    async fn start_with_keys(access_keys: Vec<AccessKey>) -> Harness {
        let dir = TempDir::new().unwrap();
        let config = Config::with_data_dir(dir.path());
        let storage = trireme_node::open_storage(&config).unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let incoming = trireme_node::tcp_incoming(grpc);
        let node = Node::start(&config, storage, incoming, Arc::new(SystemClock)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let settings = SqsSettings {
            advertised_host: "127.0.0.1".to_owned(),
            advertised_port: address.port(),
            access_keys,
            ..SqsSettings::default()
        };
        let metrics = node.backend().counters().clone();
        let app = router(node.backend().clone(), settings);
        let listener = trireme_node::sqs_incoming(listener);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Harness {
            client: client(address, KEY_ID, SECRET),
            address,
            metrics,
            _node: node,
            _dir: dir,
        }
    }

    fn url(&self, name: &str) -> String {
        format!("http://{}/{ACCOUNT}/{name}", self.address)
    }

    async fn create(&self, name: &str) -> String {
        self.client
            .create_queue()
            .queue_name(name)
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap()
    }

    async fn send(&self, url: &str, body: &str) -> String {
        self.client
            .send_message()
            .queue_url(url)
            .message_body(body)
            .send()
            .await
            .unwrap()
            .message_id
            .unwrap()
    }

    /// The queue's attributes named by `name` (or every one, for `All`).
    async fn attributes(
        &self,
        url: &str,
        name: QueueAttributeName,
    ) -> HashMap<QueueAttributeName, String> {
        self.client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(name)
            .send()
            .await
            .unwrap()
            .attributes
            // SQS leaves `Attributes` out when none of those asked for is set.
            .unwrap_or_default()
    }

    /// `DeleteMessage` of the message received with `handle`.
    async fn delete(
        &self,
        url: &str,
        handle: &str,
    ) -> Result<DeleteMessageOutput, SdkError<DeleteMessageError>> {
        self.client
            .delete_message()
            .queue_url(url)
            .receipt_handle(handle)
            .send()
            .await
    }

    /// `ChangeMessageVisibility` of the message received with `handle` to `timeout_s`.
    async fn change_visibility(
        &self,
        url: &str,
        handle: &str,
        timeout_s: i32,
    ) -> Result<ChangeMessageVisibilityOutput, SdkError<ChangeMessageVisibilityError>> {
        self.client
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(handle)
            .visibility_timeout(timeout_s)
            .send()
            .await
    }

    /// One `ReceiveMessage` with every optional parameter left to the queue's defaults.
    async fn receive(&self, url: &str) -> ReceiveMessageOutput {
        self.client
            .receive_message()
            .queue_url(url)
            .send()
            .await
            .unwrap()
    }

    /// A raw HTTP/1.1 POST with the SQS JSON headers; returns status, headers and body.
    async fn raw(&self, path: &str, target: &str, body: &str) -> (u16, String, serde_json::Value) {
        let (status, head, body) = self
            .raw_text(path, target, "application/x-amz-json-1.0", body)
            .await;
        (status, head, serde_json::from_str(&body).unwrap())
    }

    /// A raw HTTP/1.1 POST; returns status, lower-cased headers and the body text.
    async fn raw_text(
        &self,
        path: &str,
        target: &str,
        content_type: &str,
        body: &str,
    ) -> (u16, String, String) {
        let mut stream = TcpStream::connect(self.address).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nX-Amz-Target: {target}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    }
}

/// A send-batch entry with this id and body.
fn send_entry(id: &str, body: &str) -> SendMessageBatchRequestEntry {
    SendMessageBatchRequestEntry::builder()
        .id(id)
        .message_body(body)
        .build()
        .unwrap()
}

fn client(address: SocketAddr, key_id: &str, secret: &str) -> Client {
    client_at(&format!("http://{address}"), "us-east-1", key_id, secret)
}

/// An SDK client that signs for `region` with this key and posts to `endpoint`.
fn client_at(endpoint: &str, region: &'static str, key_id: &str, secret: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region))
        .credentials_provider(Credentials::new(
            key_id,
            secret,
            None,
            None,
            "trireme-tests",
        ))
        .endpoint_url(endpoint)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}

fn arn(name: &str) -> String {
    format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{name}")
}

/// The query code and message of an SDK error.
fn error_parts<E: ProvideErrorMetadata>(error: &E) -> (String, String) {
    (
        error.code().unwrap_or_default().to_owned(),
        error.message().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn queue_lifecycle_create_find_list_attributes_delete() {
    let h = Harness::start().await;
    let url = h.create("orders").await;
    assert_eq!(url, h.url("orders"));
    // Creating again with the same attributes answers the same URL.
    assert_eq!(h.create("orders").await, url);
    let conflict = h
        .client
        .create_queue()
        .queue_name("orders")
        .attributes(QueueAttributeName::VisibilityTimeout, "99")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(conflict.is_queue_name_exists(), "{conflict:?}");

    let found = h
        .client
        .get_queue_url()
        .queue_name("orders")
        .send()
        .await
        .unwrap();
    assert_eq!(found.queue_url.unwrap(), url);
    for name in ["orders-eu", "orders-us", "other"] {
        h.create(name).await;
    }
    let listed = h
        .client
        .list_queues()
        .queue_name_prefix("orders")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.queue_urls().len(), 3);
    assert!(listed.next_token.is_none());
    let first = h.client.list_queues().max_results(2).send().await.unwrap();
    assert_eq!(first.queue_urls(), [h.url("orders"), h.url("orders-eu")]);
    let token = first.next_token.unwrap();
    let second = h
        .client
        .list_queues()
        .max_results(2)
        .next_token(token)
        .send()
        .await
        .unwrap();
    assert_eq!(second.queue_urls(), [h.url("orders-us"), h.url("other")]);
    assert!(second.next_token.is_none());

    h.client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::VisibilityTimeout, "45")
        .attributes(QueueAttributeName::DelaySeconds, "2")
        .send()
        .await
        .unwrap();
    // Creating an existing queue compares only the attributes the request names.
    assert_eq!(h.create("orders").await, url);
    let same = h
        .client
        .create_queue()
        .queue_name("orders")
        .attributes(QueueAttributeName::VisibilityTimeout, "45")
        .send()
        .await
        .unwrap();
    assert_eq!(same.queue_url.unwrap(), url);
    h.send(&url, "delayed").await;
    let attributes = h.attributes(&url, QueueAttributeName::All).await;
    assert_eq!(attributes[&QueueAttributeName::VisibilityTimeout], "45");
    assert_eq!(attributes[&QueueAttributeName::DelaySeconds], "2");
    assert_eq!(
        attributes[&QueueAttributeName::MaximumMessageSize],
        "1048576"
    );
    assert_eq!(
        attributes[&QueueAttributeName::MessageRetentionPeriod],
        "345600"
    );
    assert_eq!(
        attributes[&QueueAttributeName::ApproximateNumberOfMessagesDelayed],
        "1"
    );
    assert_eq!(
        attributes[&QueueAttributeName::ApproximateNumberOfMessages],
        "0"
    );
    assert_eq!(attributes[&QueueAttributeName::QueueArn], arn("orders"));
    let created: u64 = attributes[&QueueAttributeName::CreatedTimestamp]
        .parse()
        .unwrap();
    let modified: u64 = attributes[&QueueAttributeName::LastModifiedTimestamp]
        .parse()
        .unwrap();
    // Epoch seconds, not milliseconds.
    assert!(
        created > 1_600_000_000 && created < 10_000_000_000,
        "{created}"
    );
    assert!(modified >= created);
    assert!(!attributes.contains_key(&QueueAttributeName::RedrivePolicy));

    let one = h.attributes(&url, QueueAttributeName::QueueArn).await;
    assert_eq!(one.len(), 1);

    h.client
        .delete_queue()
        .queue_url(&url)
        .send()
        .await
        .unwrap();
    let gone = h
        .client
        .get_queue_url()
        .queue_name("orders")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(gone.is_queue_does_not_exist(), "{gone:?}");
    let recently = h
        .client
        .create_queue()
        .queue_name("orders")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(recently.is_queue_deleted_recently(), "{recently:?}");
}

#[tokio::test]
async fn send_and_receive_carry_exact_md5s_attributes_and_system_attributes() {
    let h = Harness::start().await;
    let url = h.create("md5").await;
    let sent = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("derp")
        .message_attributes(
            "timestamp",
            MessageAttributeValue::builder()
                .data_type("Number.java.lang.Long")
                .string_value("1493147359900")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    // The vectors from the SQS documentation and SDK test suites.
    assert_eq!(
        sent.md5_of_message_body(),
        Some("58fd9edd83341c29f1aebba81c31e257")
    );
    assert_eq!(
        sent.md5_of_message_attributes(),
        Some("2e2e4876d8e0bd6b8c2c8f556831c349")
    );

    let binary = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("binary")
        .message_attributes(
            "binaryAttribute",
            MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(Blob::new(b"Hello binary world!".to_vec()))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        binary.md5_of_message_attributes(),
        Some("31a92b15d92f8db860eda32aceb656c3")
    );

    let received = h
        .client
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap();
    let messages = received.messages();
    assert_eq!(messages.len(), 2);
    let derp = messages.iter().find(|m| m.body() == Some("derp")).unwrap();
    assert_eq!(derp.message_id(), sent.message_id());
    assert_eq!(derp.md5_of_body(), Some("58fd9edd83341c29f1aebba81c31e257"));
    assert_eq!(
        derp.md5_of_message_attributes(),
        Some("2e2e4876d8e0bd6b8c2c8f556831c349")
    );
    let timestamp = &derp.message_attributes().unwrap()["timestamp"];
    assert_eq!(timestamp.data_type(), "Number.java.lang.Long");
    assert_eq!(timestamp.string_value(), Some("1493147359900"));
    let system = derp.attributes().unwrap();
    assert_eq!(
        system[&MessageSystemAttributeName::ApproximateReceiveCount],
        "1"
    );
    assert_eq!(system[&MessageSystemAttributeName::SenderId], ACCOUNT);
    let sent_ms: u64 = system[&MessageSystemAttributeName::SentTimestamp]
        .parse()
        .unwrap();
    let first_ms: u64 = system[&MessageSystemAttributeName::ApproximateFirstReceiveTimestamp]
        .parse()
        .unwrap();
    assert!(sent_ms > 1_600_000_000_000 && first_ms >= sent_ms);
    assert!(!system.contains_key(&MessageSystemAttributeName::DeadLetterQueueSourceArn));
    let blob = messages
        .iter()
        .find(|m| m.body() == Some("binary"))
        .unwrap();
    assert_eq!(
        blob.message_attributes().unwrap()["binaryAttribute"]
            .binary_value()
            .unwrap()
            .as_ref(),
        b"Hello binary world!"
    );

    for message in messages {
        h.delete(&url, message.receipt_handle().unwrap())
            .await
            .unwrap();
    }
    let empty = h.receive(&url).await;
    assert!(empty.messages.is_none());
}

#[tokio::test]
async fn message_attribute_names_filter_by_name_and_prefix_and_the_md5_follows() {
    let h = Harness::start().await;
    let url = h.create("filtered").await;
    let text = |value: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .unwrap()
    };
    h.client
        .send_message()
        .queue_url(&url)
        .message_body("b")
        .message_attributes("trace.id", text("1"))
        .message_attributes("trace.span", text("2"))
        .message_attributes("other", text("3"))
        .send()
        .await
        .unwrap();
    let received = h
        .client
        .receive_message()
        .queue_url(&url)
        .message_attribute_names("trace.*")
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let message = &received.messages()[0];
    let names: Vec<&String> = message.message_attributes().unwrap().keys().collect();
    assert_eq!(names.len(), 2);
    assert!(names.iter().all(|n| n.starts_with("trace.")));
    // No attributes asked for: neither attributes nor their digest.
    let bare = h.receive(&url).await;
    let message = &bare.messages()[0];
    assert!(message.message_attributes.is_none());
    assert!(message.md5_of_message_attributes.is_none());
}

#[tokio::test]
async fn long_poll_is_served_by_a_send_and_ends_empty_at_its_wait() {
    let h = Harness::start().await;
    let url = h.create("poll").await;
    let poller = {
        let client = h.client.clone();
        let url = url.clone();
        tokio::spawn(async move {
            client
                .receive_message()
                .queue_url(url)
                .wait_time_seconds(10)
                .send()
                .await
                .unwrap()
        })
    };
    h.send(&url, "wake up").await;
    let received = poller.await.unwrap();
    assert_eq!(received.messages()[0].body(), Some("wake up"));

    // Nothing arrives: the poll answers empty when its wait ends, without a Messages member.
    let empty = h
        .client
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert!(empty.messages.is_none());
}

#[tokio::test]
async fn visibility_changes_and_receipt_handles_follow_sqs() {
    let h = Harness::start().await;
    let url = h.create("visibility").await;
    h.send(&url, "job").await;
    let first = h.receive(&url).await;
    let old_handle = first.messages()[0].receipt_handle().unwrap().to_owned();
    // Make it visible again at once, then receive it a second time.
    h.change_visibility(&url, &old_handle, 0).await.unwrap();
    let second = h
        .client
        .receive_message()
        .queue_url(&url)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .send()
        .await
        .unwrap();
    let message = &second.messages()[0];
    assert_eq!(
        message.attributes().unwrap()[&MessageSystemAttributeName::ApproximateReceiveCount],
        "2"
    );
    let new_handle = message.receipt_handle().unwrap();
    assert_ne!(new_handle, old_handle);

    // The superseded handle is answered with success and deletes nothing, as SQS does; the
    // newest deletes; a repeat delete succeeds.
    h.delete(&url, &old_handle).await.unwrap();
    assert_eq!(h.metrics.superseded_deletes(&queue_name("visibility")), 1);
    h.delete(&url, new_handle).await.unwrap();
    h.delete(&url, new_handle).await.unwrap();

    // A visibility change on a deleted message is InvalidParameterValue, as SQS answers.
    let gone = h.change_visibility(&url, new_handle, 10).await.unwrap_err();
    assert_eq!(error_parts(&gone).0, "InvalidParameterValue");

    // A handle is only good for the queue whose receive issued it.
    let other = h.create("visibility-other").await;
    h.send(&url, "second").await;
    let held = h.receive(&url).await;
    let wrong_queue = h
        .delete(&other, held.messages()[0].receipt_handle().unwrap())
        .await
        .unwrap_err()
        .into_service_error();
    assert!(
        wrong_queue.is_receipt_handle_is_invalid(),
        "{wrong_queue:?}"
    );

    let garbage = h
        .delete(&url, "not-a-handle")
        .await
        .unwrap_err()
        .into_service_error();
    assert!(garbage.is_receipt_handle_is_invalid(), "{garbage:?}");
}

#[tokio::test]
async fn batches_report_partial_failures_inside_a_success() {
    let h = Harness::start().await;
    let url = h.create("batch").await;
    let sent = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("a", "one"))
        .entries(send_entry("b", "bad \u{1} character"))
        .entries(send_entry("c", "three"))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.successful().len(), 2);
    assert_eq!(sent.failed().len(), 1);
    let failed = &sent.failed()[0];
    assert_eq!(failed.id(), "b");
    assert_eq!(failed.code(), "InvalidMessageContents");
    assert!(failed.sender_fault());
    let one = sent.successful().iter().find(|s| s.id() == "a").unwrap();
    assert_eq!(
        one.md5_of_message_body(),
        "f97c5d29941bfb1b2fdab0874906ab82"
    );

    let received = h
        .client
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages().len(), 2);
    let handle = received.messages()[0].receipt_handle().unwrap();
    let changed = h
        .client
        .change_message_visibility_batch()
        .queue_url(&url)
        .entries(
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id("ok")
                .receipt_handle(handle)
                .visibility_timeout(60)
                .build()
                .unwrap(),
        )
        .entries(
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id("too-long")
                .receipt_handle(handle)
                .visibility_timeout(43_201)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(changed.successful().len(), 1);
    assert_eq!(changed.failed()[0].code(), "InvalidParameterValue");

    let mut delete = h.client.delete_message_batch().queue_url(&url);
    for (index, message) in received.messages().iter().enumerate() {
        delete = delete.entries(
            DeleteMessageBatchRequestEntry::builder()
                .id(format!("m{index}"))
                .receipt_handle(message.receipt_handle().unwrap())
                .build()
                .unwrap(),
        );
    }
    let deleted = delete
        .entries(
            DeleteMessageBatchRequestEntry::builder()
                .id("junk")
                .receipt_handle("junk")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.successful().len(), 2);
    assert_eq!(deleted.failed()[0].id(), "junk");
    assert_eq!(deleted.failed()[0].code(), "ReceiptHandleIsInvalid");
}

#[tokio::test]
async fn malformed_batches_are_refused_whole() {
    let h = Harness::start().await;
    let url = h.create("batch-errors").await;
    let empty = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .set_entries(Some(vec![]))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(empty.is_empty_batch_request(), "{empty:?}");
    let missing = h
        .client
        .send_message_batch()
        .queue_url(h.url("no-such-queue"))
        .entries(send_entry("a", "x"))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(missing.is_queue_does_not_exist(), "{missing:?}");
    let mut eleven = h.client.send_message_batch().queue_url(&url);
    for index in 0..11 {
        eleven = eleven.entries(send_entry(&format!("e{index}"), "x"));
    }
    let too_many = eleven.send().await.unwrap_err().into_service_error();
    assert!(
        too_many.is_too_many_entries_in_batch_request(),
        "{too_many:?}"
    );
    let twice = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("same", "x"))
        .entries(send_entry("same", "x"))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(twice.is_batch_entry_ids_not_distinct(), "{twice:?}");
    let bad_id = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("no spaces", "x"))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(bad_id.is_invalid_batch_entry_id(), "{bad_id:?}");
    let big = "x".repeat(600_000);
    let too_long = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("a", &big))
        .entries(send_entry("b", &big))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(too_long.is_batch_request_too_long(), "{too_long:?}");
}

#[tokio::test]
async fn validation_errors_name_the_parameter_and_range() {
    let h = Harness::start().await;
    let url = h.create("validation").await;
    let error = h
        .client
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(11)
        .send()
        .await
        .unwrap_err();
    let (code, message) = error_parts(&error);
    assert_eq!(code, "InvalidParameterValue");
    assert_eq!(
        message,
        "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."
    );
    let attribute = h
        .client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "10")
        .send()
        .await
        .unwrap_err();
    let (code, message) = error_parts(&attribute);
    assert_eq!(code, "InvalidAttributeValue");
    assert_eq!(
        message,
        "Invalid value for the parameter MessageRetentionPeriod."
    );
    let unknown = h
        .client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::from("Colour"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_parts(&unknown).0, "InvalidAttributeName");
}

#[tokio::test]
async fn fifo_queues_are_refused_as_standard_queues_only() {
    let h = Harness::start().await;
    let error = h
        .client
        .create_queue()
        .queue_name("jobs.fifo")
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(error.is_unsupported_operation(), "{error:?}");
    assert!(error.message().unwrap().contains("standard queues only"));
}

#[tokio::test]
async fn dead_letter_moves_and_a_move_task_brings_messages_back() {
    let h = Harness::start().await;
    let dlq = h.create("work-dlq").await;
    let source = h
        .client
        .create_queue()
        .queue_name("work")
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(
                r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":"1"}}"#,
                arn("work-dlq")
            ),
        )
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let policy = h
        .attributes(&source, QueueAttributeName::RedrivePolicy)
        .await;
    let policy: serde_json::Value =
        serde_json::from_str(&policy[&QueueAttributeName::RedrivePolicy]).unwrap();
    assert_eq!(policy["deadLetterTargetArn"], arn("work-dlq"));
    assert_eq!(policy["maxReceiveCount"], 1);

    let id = h.send(&source, "poison").await;
    // First receive delivers it (count 1) and makes it visible again at once; the second
    // receive would exceed maxReceiveCount and moves it to the dead-letter queue instead.
    let first = h
        .client
        .receive_message()
        .queue_url(&source)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert_eq!(first.messages()[0].message_id(), Some(id.as_str()));
    let second = h.receive(&source).await;
    assert!(second.messages.is_none());

    let sources = h
        .client
        .list_dead_letter_source_queues()
        .queue_url(&dlq)
        .send()
        .await
        .unwrap();
    assert_eq!(sources.queue_urls(), std::slice::from_ref(&source));

    let dead = h
        .client
        .receive_message()
        .queue_url(&dlq)
        .visibility_timeout(0)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap();
    let message = &dead.messages()[0];
    assert_eq!(message.message_id(), Some(id.as_str()));
    let system = message.attributes().unwrap();
    assert_eq!(
        system[&MessageSystemAttributeName::DeadLetterQueueSourceArn],
        arn("work")
    );

    // A move task without a destination returns each message to its own source queue.
    let started = h
        .client
        .start_message_move_task()
        .source_arn(arn("work-dlq"))
        .send()
        .await
        .unwrap();
    let handle = started.task_handle.unwrap();
    let back = h
        .client
        .receive_message()
        .queue_url(&source)
        .wait_time_seconds(10)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap();
    let message = &back.messages()[0];
    assert_eq!(message.message_id(), Some(id.as_str()));
    assert_eq!(message.body(), Some("poison"));
    assert!(
        !message
            .attributes()
            .unwrap()
            .contains_key(&MessageSystemAttributeName::DeadLetterQueueSourceArn)
    );

    let tasks = h
        .client
        .list_message_move_tasks()
        .source_arn(arn("work-dlq"))
        .max_results(10)
        .send()
        .await
        .unwrap();
    let task = &tasks.results()[0];
    assert_eq!(task.source_arn(), Some(arn("work-dlq").as_str()));
    assert!(
        matches!(task.status(), Some("RUNNING" | "COMPLETED")),
        "{task:?}"
    );
    if task.status() == Some("RUNNING") {
        assert_eq!(task.task_handle(), Some(handle.as_str()));
    }

    let unknown = h
        .client
        .cancel_message_move_task()
        .task_handle("bm90LWEtdGFzaw")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&unknown),
        (
            "InvalidParameterValue".to_owned(),
            "Value for parameter TaskHandle is invalid.".to_owned()
        )
    );
}

#[tokio::test]
async fn a_move_task_to_a_destination_can_be_cancelled() {
    let h = Harness::start().await;
    let dlq = h.create("parked").await;
    h.create("elsewhere").await;
    // Only a dead-letter queue can be the source of a move task.
    h.client
        .create_queue()
        .queue_name("parking-source")
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(
                r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":3}}"#,
                arn("parked")
            ),
        )
        .send()
        .await
        .unwrap();
    for index in 0..5 {
        h.send(&dlq, &format!("m{index}")).await;
    }
    let started = h
        .client
        .start_message_move_task()
        .source_arn(arn("parked"))
        .destination_arn(arn("elsewhere"))
        .max_number_of_messages_per_second(1)
        .send()
        .await
        .unwrap();
    let handle = started.task_handle.unwrap();
    let second = h
        .client
        .start_message_move_task()
        .source_arn(arn("parked"))
        .destination_arn(arn("elsewhere"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&second).0,
        "InvalidParameterValue",
        "one task per queue"
    );
    let cancelled = h
        .client
        .cancel_message_move_task()
        .task_handle(&handle)
        .send()
        .await
        .unwrap();
    assert!(cancelled.approximate_number_of_messages_moved <= 5);
    let tasks = h
        .client
        .list_message_move_tasks()
        .source_arn(arn("parked"))
        .send()
        .await
        .unwrap();
    let task = &tasks.results()[0];
    assert!(
        matches!(
            task.status(),
            Some("CANCELLING" | "CANCELLED" | "COMPLETED")
        ),
        "{task:?}"
    );
    assert_eq!(task.destination_arn(), Some(arn("elsewhere").as_str()));
    assert_eq!(task.approximate_number_of_messages_to_move, Some(5));
}

#[tokio::test]
async fn tags_purge_and_permissions() {
    let h = Harness::start().await;
    let url = h
        .client
        .create_queue()
        .queue_name("tagged")
        .tags("team", "payments")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    h.client
        .tag_queue()
        .queue_url(&url)
        .tags("env", "test")
        .send()
        .await
        .unwrap();
    let tags = h
        .client
        .list_queue_tags()
        .queue_url(&url)
        .send()
        .await
        .unwrap()
        .tags
        .unwrap();
    assert_eq!(tags.len(), 2);
    assert_eq!(tags["team"], "payments");
    h.client
        .untag_queue()
        .queue_url(&url)
        .tag_keys("team")
        .send()
        .await
        .unwrap();
    let tags = h
        .client
        .list_queue_tags()
        .queue_url(&url)
        .send()
        .await
        .unwrap()
        .tags
        .unwrap();
    assert_eq!(tags.keys().collect::<Vec<_>>(), ["env"]);

    h.send(&url, "a").await;
    h.client.purge_queue().queue_url(&url).send().await.unwrap();
    let empty = h.receive(&url).await;
    assert!(empty.messages.is_none());
    let again = h
        .client
        .purge_queue()
        .queue_url(&url)
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(again.is_purge_queue_in_progress(), "{again:?}");

    // Permissions are statements of the queue's policy (see `aws::permissions_are_statements_of_the_policy`).
    h.client
        .add_permission()
        .queue_url(&url)
        .label("l")
        .aws_account_ids("111111111111")
        .actions("SendMessage")
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn error_shapes_on_the_wire() {
    let h = Harness::start().await;
    let missing = format!(r#"{{"QueueUrl":"{}"}}"#, h.url("missing"));
    let (status, headers, body) = h.raw("/", "AmazonSQS.GetQueueAttributes", &missing).await;
    assert_eq!(status, 400);
    assert!(
        headers.contains("x-amzn-query-error: aws.simplequeueservice.nonexistentqueue;sender"),
        "{headers}"
    );
    assert!(headers.contains("x-amzn-requestid: "), "{headers}");
    assert!(
        headers.contains("content-type: application/x-amz-json-1.0"),
        "{headers}"
    );
    assert_eq!(body["__type"], "com.amazonaws.sqs#QueueDoesNotExist");
    assert!(body["message"].as_str().unwrap().contains("does not exist"));

    let (status, _, body) = h.raw("/", "AmazonSQS.DeleteQueue", "{}").await;
    assert_eq!(status, 400);
    assert_eq!(
        body["__type"],
        "com.amazonaws.sqs#MissingRequiredParameterException"
    );

    // Requests may also be posted to the queue's own path; an empty receive has no Messages key.
    h.create("wire").await;
    let queue_path = format!("/{ACCOUNT}/wire");
    let receive = format!(r#"{{"QueueUrl":"{}"}}"#, h.url("wire"));
    let (status, headers, body) = h
        .raw(&queue_path, "AmazonSQS.ReceiveMessage", &receive)
        .await;
    assert_eq!(status, 200);
    assert!(headers.contains("x-amzn-requestid: "), "{headers}");
    assert_eq!(body, serde_json::json!({}));

    // A client of the older query protocol gets an error it can read, telling it to upgrade.
    let (status, headers, text) = h
        .raw_text(
            "/",
            "",
            "application/x-www-form-urlencoded",
            "Action=ListQueues&Version=2012-11-05",
        )
        .await;
    assert_eq!(status, 400);
    assert!(headers.contains("content-type: text/xml"), "{headers}");
    assert!(
        text.contains("<ErrorResponse>") && text.contains("JSON 1.0"),
        "{text}"
    );

    // The older AttributeNames member still selects system attributes.
    let wire_url = h.url("wire");
    h.send(&wire_url, "old style").await;
    let legacy = format!(r#"{{"QueueUrl":"{wire_url}","AttributeNames":["All"]}}"#);
    let (status, _, body) = h.raw("/", "AmazonSQS.ReceiveMessage", &legacy).await;
    assert_eq!(status, 200);
    let attributes = &body["Messages"][0]["Attributes"];
    assert_eq!(attributes["ApproximateReceiveCount"], "1", "{body}");
    assert!(attributes["SentTimestamp"].is_string(), "{body}");

    let (status, _, body) = h.raw("/", "AmazonSQS.Frobnicate", "{}").await;
    assert_eq!(status, 400);
    assert!(
        body["__type"]
            .as_str()
            .unwrap()
            .ends_with("UnknownOperationException")
    );
}

#[tokio::test]
async fn signatures_are_verified_when_access_keys_are_configured() {
    let keys = vec![AccessKey {
        id: KEY_ID.to_owned(),
        secret: SECRET.to_owned(),
        queue_prefixes: Vec::new(),
    }];
    let h = Harness::start_with_keys(keys).await;
    // The SDK signs with the configured key: everything works.
    let url = h.create("signed").await;
    h.send(&url, "hello").await;

    // Some SDKs (JS v3) post to the queue URL itself: the signed path is then the queue's.
    let on_queue_path = client_at(&url, "us-east-1", KEY_ID, SECRET);
    on_queue_path
        .send_message()
        .queue_url(&url)
        .message_body("via the queue path")
        .send()
        .await
        .unwrap();

    let wrong_secret = client(h.address, KEY_ID, "not-the-secret");
    let error = wrong_secret.list_queues().send().await.unwrap_err();
    assert_eq!(error_parts(&error).0, "SignatureDoesNotMatch");
    let unknown_key = client(h.address, "AKIDUNKNOWN", SECRET);
    let error = unknown_key.list_queues().send().await.unwrap_err();
    assert_eq!(error_parts(&error).0, "InvalidClientTokenId");

    let (status, headers, _) = h.raw("/", "AmazonSQS.ListQueues", "{}").await;
    assert_eq!(status, 403);
    assert!(
        headers.contains("x-amzn-query-error: missingauthenticationtoken;sender"),
        "{headers}"
    );
}

/// A key limited to queues whose names begin with `orders-`.
const LIMITED_KEY_ID: &str = "AKIDORDERSONLY";

#[tokio::test]
async fn a_key_limited_by_prefix_is_denied_every_other_queue() {
    let keys = vec![
        AccessKey {
            id: KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: Vec::new(),
        },
        AccessKey {
            id: LIMITED_KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: vec!["orders-".to_owned()],
        },
    ];
    let h = Harness::start_with_keys(keys).await;
    let theirs = h.create("payroll").await;
    let ours = h.create("orders-eu").await;
    let limited = client(h.address, LIMITED_KEY_ID, SECRET);

    limited
        .send_message()
        .queue_url(&ours)
        .message_body("mine")
        .send()
        .await
        .unwrap();
    limited
        .create_queue()
        .queue_name("orders-us")
        .send()
        .await
        .unwrap();
    let listed = limited.list_queues().send().await.unwrap();
    assert_eq!(
        listed.queue_urls(),
        [ours.clone(), h.url("orders-us")],
        "a limited key lists only its queues"
    );

    let denied = limited
        .send_message()
        .queue_url(&theirs)
        .message_body("not mine")
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_parts(&denied).0, "AccessDenied", "{denied:?}");
    assert_eq!(denied.raw_response().unwrap().status().as_u16(), 403);
    for refused in [
        limited
            .create_queue()
            .queue_name("payroll-2")
            .send()
            .await
            .map(|_| ())
            .unwrap_err()
            .into_service_error()
            .code()
            .map(str::to_owned),
        limited
            .get_queue_url()
            .queue_name("payroll")
            .send()
            .await
            .map(|_| ())
            .unwrap_err()
            .into_service_error()
            .code()
            .map(str::to_owned),
        limited
            .delete_queue()
            .queue_url(&theirs)
            .send()
            .await
            .map(|_| ())
            .unwrap_err()
            .into_service_error()
            .code()
            .map(str::to_owned),
        // A dead-letter queue outside the prefix is a queue outside it too.
        limited
            .set_queue_attributes()
            .queue_url(&ours)
            .attributes(
                QueueAttributeName::RedrivePolicy,
                r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:payroll","maxReceiveCount":"3"}"#,
            )
            .send()
            .await
            .map(|_| ())
            .unwrap_err()
            .into_service_error()
            .code()
            .map(str::to_owned),
    ] {
        assert_eq!(refused.as_deref(), Some("AccessDenied"));
    }
    // Nothing of the refused calls happened.
    let everything = h.client.list_queues().send().await.unwrap();
    assert_eq!(everything.queue_urls().len(), 3);
    let untouched = h.receive(&theirs).await;
    assert!(untouched.messages().is_empty());
}

#[tokio::test]
async fn a_limited_key_cannot_move_its_dead_letters_back_to_sources_outside_its_prefix() {
    let keys = vec![
        AccessKey {
            id: KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: Vec::new(),
        },
        AccessKey {
            id: LIMITED_KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: vec!["orders-".to_owned()],
        },
    ];
    let h = Harness::start_with_keys(keys).await;
    let dlq = h.create("orders-dlq").await;
    let ours = h.create("orders-eu").await;
    // A queue outside the prefix names the limited key's queue as its dead-letter queue.
    let theirs = h
        .client
        .create_queue()
        .queue_name("payroll")
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(
                r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":"1"}}"#,
                arn("orders-dlq")
            ),
        )
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    h.send(&theirs, "salary").await;
    h.client
        .receive_message()
        .queue_url(&theirs)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert!(
        h.receive(&theirs).await.messages.is_none(),
        "moved to the DLQ"
    );
    let limited = client(h.address, LIMITED_KEY_ID, SECRET);

    // Back to their sources means into payroll: refused, and nothing moved.
    let denied = limited
        .start_message_move_task()
        .source_arn(arn("orders-dlq"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_parts(&denied).0, "AccessDenied", "{denied:?}");
    assert_eq!(denied.raw_response().unwrap().status().as_u16(), 403);
    let listed = limited
        .list_message_move_tasks()
        .source_arn(arn("orders-dlq"))
        .send()
        .await
        .unwrap();
    assert!(listed.results().is_empty(), "no task started");
    let held = h
        .client
        .receive_message()
        .queue_url(&dlq)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert_eq!(
        held.messages()[0].body(),
        Some("salary"),
        "still in the DLQ"
    );

    // To a queue of its own it may.
    limited
        .start_message_move_task()
        .source_arn(arn("orders-dlq"))
        .destination_arn(arn("orders-eu"))
        .send()
        .await
        .unwrap();
    let moved = h
        .client
        .receive_message()
        .queue_url(&ours)
        .wait_time_seconds(10)
        .send()
        .await
        .unwrap();
    assert_eq!(moved.messages()[0].body(), Some("salary"));
    assert!(h.receive(&theirs).await.messages.is_none());
}

/// Sends `body` to `url` and moves it to the queue's dead-letter queue (maxReceiveCount 1) by
/// two receives.
async fn dead_letter(h: &Harness, url: &str, body: &str) {
    h.send(url, body).await;
    let first = h
        .client
        .receive_message()
        .queue_url(url)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert_eq!(first.messages().len(), 1);
    assert!(h.receive(url).await.messages.is_none(), "moved to the DLQ");
}

#[tokio::test]
async fn a_limited_keys_move_task_leaves_in_the_dlq_what_would_go_outside_its_prefix() {
    let keys = vec![
        AccessKey {
            id: KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: Vec::new(),
        },
        AccessKey {
            id: LIMITED_KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: vec!["orders-".to_owned()],
        },
    ];
    let h = Harness::start_with_keys(keys).await;
    let dlq = h.create("orders-dlq").await;
    let policy = format!(
        r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":"1"}}"#,
        arn("orders-dlq")
    );
    let mut urls = Vec::new();
    for name in ["payroll", "orders-eu"] {
        let url = h
            .client
            .create_queue()
            .queue_name(name)
            .attributes(QueueAttributeName::RedrivePolicy, &policy)
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        urls.push(url);
    }
    let (theirs, ours) = (&urls[0], &urls[1]);
    dead_letter(&h, theirs, "salary").await;
    dead_letter(&h, ours, "order").await;
    // payroll no longer names the DLQ: the start's check sees only orders-eu, and lets the key
    // start; the salary's source is still payroll.
    h.client
        .set_queue_attributes()
        .queue_url(theirs)
        .attributes(QueueAttributeName::RedrivePolicy, "")
        .send()
        .await
        .unwrap();
    let limited = client(h.address, LIMITED_KEY_ID, SECRET);
    limited
        .start_message_move_task()
        .source_arn(arn("orders-dlq"))
        .send()
        .await
        .unwrap();
    let newest = || async {
        limited
            .list_message_move_tasks()
            .source_arn(arn("orders-dlq"))
            .send()
            .await
            .unwrap()
            .results()[0]
            .clone()
    };
    crate::harness::eventually("the task ends", || async {
        newest().await.status() != Some("RUNNING")
    })
    .await;
    let task = newest().await;
    // It completes: the message it may not move is skipped, not a failure of the task.
    assert_eq!(task.status(), Some("COMPLETED"), "{task:?}");
    assert_eq!(task.failure_reason(), None);
    assert_eq!(task.approximate_number_of_messages_to_move(), Some(2));
    assert_eq!(task.approximate_number_of_messages_moved(), 1, "{task:?}");
    assert!(
        h.receive(theirs).await.messages.is_none(),
        "nothing went into payroll"
    );
    let back = h.receive(ours).await;
    assert_eq!(back.messages()[0].body(), Some("order"));
    let held = h.receive(&dlq).await;
    assert_eq!(
        held.messages()[0].body(),
        Some("salary"),
        "still in the DLQ"
    );
}

/// A raw request to `h` presigned by the `aws-sigv4` crate at `signed_at` for `expires_s`: its
/// path and query, and the body it signed.
fn presigned_list_queues(
    h: &Harness,
    signed_at: std::time::SystemTime,
    expires_s: u64,
) -> (String, &'static str) {
    use aws_sigv4::http_request::{
        SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
    };
    let body = "{}";
    let identity = Credentials::new(KEY_ID, SECRET, None, None, "trireme-tests").into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(std::time::Duration::from_secs(expires_s));
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("sqs")
        .time(signed_at)
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let url = format!("http://{}/", h.address);
    let host = h.address.to_string();
    let request = SignableRequest::new(
        "POST",
        &url,
        [("host", host.as_str())].into_iter(),
        SignableBody::Bytes(body.as_bytes()),
    )
    .unwrap();
    let (instructions, _) = sign(request, &params).unwrap().into_parts();
    let mut signed = axum::http::Request::builder()
        .method("POST")
        .uri(&url)
        .body(())
        .unwrap();
    instructions.apply_to_request_http1x(&mut signed);
    (format!("/?{}", signed.uri().query().unwrap()), body)
}

#[tokio::test]
async fn a_presigned_request_is_served_until_it_expires() {
    let keys = vec![AccessKey {
        id: KEY_ID.to_owned(),
        secret: SECRET.to_owned(),
        queue_prefixes: Vec::new(),
    }];
    let h = Harness::start_with_keys(keys).await;
    h.create("presigned").await;
    let now = std::time::SystemTime::now();

    let (path, body) = presigned_list_queues(&h, now, 300);
    let (status, _, answer) = h.raw(&path, "AmazonSQS.ListQueues", body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["QueueUrls"][0], h.url("presigned"));

    let an_hour_ago = now - std::time::Duration::from_secs(3_600);
    let (path, body) = presigned_list_queues(&h, an_hour_ago, 60);
    let (status, headers, answer) = h.raw(&path, "AmazonSQS.ListQueues", body).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        headers.contains("x-amzn-query-error: requestexpired;sender"),
        "{headers}"
    );

    let (path, body) = presigned_list_queues(&h, now, 300);
    let tampered = path.replace("X-Amz-Signature=", "X-Amz-Signature=0");
    let (status, headers, _) = h.raw(&tampered, "AmazonSQS.ListQueues", body).await;
    assert_eq!(status, 400, "an odd-length signature is malformed");
    assert!(headers.contains("incompletesignature"), "{headers}");
    let flipped = {
        let at = path.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
        let digit = if &path[at..=at] == "0" { "1" } else { "0" };
        format!("{}{digit}{}", &path[..at], &path[at + 1..])
    };
    let (status, headers, _) = h.raw(&flipped, "AmazonSQS.ListQueues", body).await;
    assert_eq!(status, 403);
    assert!(
        headers.contains("x-amzn-query-error: signaturedoesnotmatch;sender"),
        "{headers}"
    );
}

#[tokio::test]
async fn making_a_message_visible_again_wakes_a_long_poll() {
    let h = Harness::start().await;
    let url = h.create("wake").await;
    h.send(&url, "again").await;
    let first = h.receive(&url).await;
    let handle = first.messages()[0].receipt_handle().unwrap().to_owned();
    let poller = {
        let client = h.client.clone();
        let url = url.clone();
        tokio::spawn(async move {
            client
                .receive_message()
                .queue_url(url)
                .wait_time_seconds(10)
                .send()
                .await
                .unwrap()
        })
    };
    h.change_visibility(&url, &handle, 0).await.unwrap();
    let woken = poller.await.unwrap();
    assert_eq!(woken.messages()[0].body(), Some("again"));
}

#[tokio::test]
async fn redrive_allow_policy_is_kept_and_enforced() {
    let h = Harness::start().await;
    let closed = h
        .client
        .create_queue()
        .queue_name("closed-dlq")
        .attributes(
            QueueAttributeName::RedriveAllowPolicy,
            r#"{"redrivePermission":"denyAll"}"#,
        )
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let attributes = h
        .attributes(&closed, QueueAttributeName::RedriveAllowPolicy)
        .await;
    let policy: serde_json::Value =
        serde_json::from_str(&attributes[&QueueAttributeName::RedriveAllowPolicy]).unwrap();
    assert_eq!(policy["redrivePermission"], "denyAll");
    // With All, the policy shows when it is not the default; a default one only when named.
    assert!(
        h.attributes(&closed, QueueAttributeName::All)
            .await
            .contains_key(&QueueAttributeName::RedriveAllowPolicy)
    );
    let open = h.create("open-dlq").await;
    assert!(
        !h.attributes(&open, QueueAttributeName::All)
            .await
            .contains_key(&QueueAttributeName::RedriveAllowPolicy)
    );
    let named = h
        .attributes(&open, QueueAttributeName::RedriveAllowPolicy)
        .await;
    assert_eq!(
        named[&QueueAttributeName::RedriveAllowPolicy],
        r#"{"redrivePermission":"allowAll"}"#
    );
    // A queue naming `dlq` as its dead-letter queue, received at most three times.
    let create_with_dlq = |name: &'static str, dlq: &'static str| {
        h.client
            .create_queue()
            .queue_name(name)
            .attributes(
                QueueAttributeName::RedrivePolicy,
                format!(
                    r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":3}}"#,
                    arn(dlq)
                ),
            )
            .send()
    };
    let refused = create_with_dlq("hopeful", "closed-dlq").await.unwrap_err();
    assert_eq!(error_parts(&refused).0, "InvalidParameterValue");
    let missing_dlq = create_with_dlq("orphan", "no-such-queue")
        .await
        .unwrap_err();
    let (code, message) = error_parts(&missing_dlq);
    assert_eq!(code, "InvalidParameterValue", "{message}");
    assert!(message.contains("RedrivePolicy"), "{message}");
}

#[tokio::test]
async fn urls_of_other_accounts_and_malformed_urls_name_no_queue() {
    let h = Harness::start().await;
    h.create("mine").await;
    let foreign = h
        .client
        .send_message()
        .queue_url(format!("http://{}/123456789012/mine", h.address))
        .message_body("x")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(foreign.is_queue_does_not_exist(), "{foreign:?}");
    let malformed = h
        .client
        .send_message()
        .queue_url("http://h/a/b/c")
        .message_body("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_parts(&malformed).0, "InvalidAddress");
    let other_owner = h
        .client
        .get_queue_url()
        .queue_name("mine")
        .queue_owner_aws_account_id("123456789012")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(other_owner.is_queue_does_not_exist(), "{other_owner:?}");
}

#[tokio::test]
async fn messages_over_the_queue_size_limit_are_refused() {
    let h = Harness::start().await;
    let url = h
        .client
        .create_queue()
        .queue_name("small")
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    h.send(&url, &"x".repeat(1024)).await;
    let error = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("x".repeat(1025))
        .send()
        .await
        .unwrap_err();
    let (code, message) = error_parts(&error);
    assert_eq!(code, "InvalidParameterValue");
    assert!(message.contains("1024"), "{message}");
}

#[tokio::test]
async fn number_attribute_digest_matches_the_sqs_vector_through_the_sdk() {
    let h = Harness::start().await;
    let url = h.create("number").await;
    let sent = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("n")
        .message_attributes(
            "SOME_Valid.attribute-Name",
            MessageAttributeValue::builder()
                .data_type("Number")
                .string_value("1493147359900")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        sent.md5_of_message_attributes(),
        Some("36655e7e9d7c0e8479fa3f3f42247ae7")
    );
}
