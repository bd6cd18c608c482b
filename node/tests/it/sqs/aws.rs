//! The SQS endpoint answering exactly as AWS does (issue 14): for each class of difference found
//! against AWS, every case, with AWS's code, HTTP status and wording. The one deliberate
//! difference (a visibility change with a superseded receipt handle is refused) is tested as
//! such. Driven by aws-sdk-sqs; raw HTTP where the status matters.

use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{ACCOUNT, Harness, arn, error_parts, queue_name, send_entry};

/// A message received twice: its first (superseded) handle and its current one.
async fn received_twice(h: &Harness, url: &str) -> (String, String) {
    h.send(url, "job").await;
    let first = h.receive(url).await.messages()[0]
        .receipt_handle()
        .unwrap()
        .to_owned();
    h.change_visibility(url, &first, 0).await.unwrap();
    let second = h.receive(url).await.messages()[0]
        .receipt_handle()
        .unwrap()
        .to_owned();
    (first, second)
}

fn code_and_message(parts: (String, String)) -> (String, String) {
    parts
}

fn pair(code: &str, message: &str) -> (String, String) {
    (code.to_owned(), message.to_owned())
}

// ---- Class 2: superseded receipt handles ----

#[tokio::test]
async fn a_delete_with_a_superseded_handle_succeeds_deletes_nothing_and_is_counted() {
    let h = Harness::start().await;
    let url = h.create("superseded").await;
    let (old, new) = received_twice(&h, &url).await;
    h.delete(&url, &old).await.unwrap();
    assert_eq!(h.metrics.superseded_deletes(&queue_name("superseded")), 1);
    // Nothing was deleted: the message is still in flight under the newer handle.
    let counts = h
        .attributes(
            &url,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        )
        .await;
    assert_eq!(
        counts[&QueueAttributeName::ApproximateNumberOfMessagesNotVisible],
        "1"
    );
    // A batch delete with the old handle is a successful entry too.
    let batch = h
        .client
        .delete_message_batch()
        .queue_url(&url)
        .entries(
            DeleteMessageBatchRequestEntry::builder()
                .id("old")
                .receipt_handle(&old)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(batch.successful()[0].id(), "old");
    assert!(batch.failed().is_empty());
    assert_eq!(h.metrics.superseded_deletes(&queue_name("superseded")), 2);
    h.delete(&url, &new).await.unwrap();
    assert!(h.receive(&url).await.messages().is_empty());
    assert_eq!(h.metrics.superseded_deletes(&queue_name("superseded")), 2);
}

#[tokio::test]
async fn a_visibility_change_with_a_superseded_handle_stays_refused() {
    let h = Harness::start().await;
    let url = h.create("superseded-visibility").await;
    let (old, _new) = received_twice(&h, &url).await;
    let error = h.change_visibility(&url, &old, 60).await.unwrap_err();
    assert_eq!(
        error_parts(&error),
        pair(
            "InvalidParameterValue",
            &format!(
                "Value {old} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
            )
        )
    );
    let batch = h
        .client
        .change_message_visibility_batch()
        .queue_url(&url)
        .entries(
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id("old")
                .receipt_handle(&old)
                .visibility_timeout(60)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let failed = &batch.failed()[0];
    assert_eq!(failed.code(), "InvalidParameterValue");
    assert!(failed.sender_fault());
}

// ---- Class 3: malformed receipt handles ----

#[tokio::test]
async fn a_malformed_handle_is_400_receipt_handle_is_invalid_in_aws_words() {
    let h = Harness::start().await;
    let url = h.create("garbage-handles").await;
    let path = format!("/{ACCOUNT}/garbage-handles");
    let body = format!(r#"{{"QueueUrl":"{url}","ReceiptHandle":"garbage"}}"#);
    let (status, headers, json) = h.raw(&path, "AmazonSQS.DeleteMessage", &body).await;
    assert_eq!(status, 400);
    assert!(headers.contains("x-amzn-query-error: receipthandleisinvalid;sender"));
    assert_eq!(json["__type"], "com.amazonaws.sqs#ReceiptHandleIsInvalid");
    assert_eq!(
        json["message"],
        "The input receipt handle \"garbage\" is not a valid receipt handle."
    );
    let error = h.delete(&url, "garbage").await.unwrap_err();
    assert!(
        error
            .as_service_error()
            .unwrap()
            .is_receipt_handle_is_invalid()
    );
    let visibility = h.change_visibility(&url, "garbage", 5).await.unwrap_err();
    assert_eq!(
        error_parts(&visibility),
        pair(
            "ReceiptHandleIsInvalid",
            "The input receipt handle \"garbage\" is not a valid receipt handle."
        )
    );
    let batch = h
        .client
        .delete_message_batch()
        .queue_url(&url)
        .entries(
            DeleteMessageBatchRequestEntry::builder()
                .id("g")
                .receipt_handle("garbage")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let failed = &batch.failed()[0];
    assert_eq!(failed.code(), "ReceiptHandleIsInvalid");
    assert_eq!(
        failed.message(),
        Some("The input receipt handle \"garbage\" is not a valid receipt handle.")
    );
}

#[tokio::test]
async fn a_handle_of_another_queue_is_not_a_valid_receipt_handle() {
    let h = Harness::start().await;
    let url = h.create("handles-here").await;
    let other = h.create("handles-there").await;
    h.send(&url, "x").await;
    let handle = h.receive(&url).await.messages()[0]
        .receipt_handle()
        .unwrap()
        .to_owned();
    let error = h.delete(&other, &handle).await.unwrap_err();
    assert_eq!(
        error_parts(&error),
        pair(
            "ReceiptHandleIsInvalid",
            &format!("The input receipt handle \"{handle}\" is not a valid receipt handle.")
        )
    );
}

// ---- Class 4: wording and codes of validation errors ----

#[tokio::test]
async fn batch_validation_is_worded_as_aws_words_it() {
    let h = Harness::start().await;
    let url = h.create("batch-wording").await;
    let bad_id = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("not valid!", "x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&bad_id),
        pair(
            "AWS.SimpleQueueService.InvalidBatchEntryId",
            "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long."
        )
    );
    let mut too_many = h.client.send_message_batch().queue_url(&url);
    for index in 0..20 {
        too_many = too_many.entries(send_entry(&format!("e{index}"), "x"));
    }
    assert_eq!(
        error_parts(&too_many.send().await.unwrap_err()),
        pair(
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            "Maximum number of entries per request are 10. You have sent 20."
        )
    );
    let big = "x".repeat(600 * 1024);
    let too_long = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("a", &big))
        .entries(send_entry("b", &format!("{big}yy")))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&too_long),
        pair(
            "AWS.SimpleQueueService.BatchRequestTooLong",
            &format!(
                "Batch requests cannot be longer than 1048576 bytes. You have sent {} bytes.",
                2 * big.len() + 2
            )
        )
    );
}

#[tokio::test]
async fn oversized_messages_are_worded_as_aws_words_them() {
    let h = Harness::start().await;
    let url = h.create("size-wording").await;
    h.client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap();
    let body = "y".repeat(1_025);
    let single = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body(&body)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&single),
        pair(
            "InvalidParameterValue",
            "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes."
        )
    );
    let batch = h
        .client
        .send_message_batch()
        .queue_url(&url)
        .entries(send_entry("big", &body))
        .entries(send_entry("small", "ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.successful()[0].id(), "small");
    let failed = &batch.failed()[0];
    assert_eq!(failed.id(), "big");
    assert_eq!(failed.code(), "InvalidParameterValue");
    assert_eq!(
        failed.message(),
        Some(
            "One or more parameters cannot be validated. Reason: Message must be shorter than 1024 bytes."
        )
    );
}

#[tokio::test]
async fn ranges_and_missing_members_are_worded_as_aws_words_them() {
    let h = Harness::start().await;
    let url = h.create("range-wording").await;
    for wait in [21, -1] {
        let error = h
            .client
            .receive_message()
            .queue_url(&url)
            .wait_time_seconds(wait)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            error_parts(&error),
            pair(
                "InvalidParameterValue",
                &format!(
                    "Value {wait} for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, if provided."
                )
            )
        );
    }
    let delay = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .delay_seconds(901)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&delay),
        pair(
            "InvalidParameterValue",
            "Value 901 for parameter DelaySeconds is invalid. Reason: DelaySeconds must be >= 0 and <= 900."
        )
    );
    let empty = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&empty),
        pair(
            "MissingParameter",
            "The request must contain the parameter MessageBody."
        )
    );
    let contents = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("bad \u{1} body")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&contents),
        pair(
            "InvalidMessageContents",
            "Invalid binary character '#x1' was found in the message body, the set of allowed characters is #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]."
        )
    );
    let dedup = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .message_deduplication_id("group 123")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&dedup),
        pair(
            "InvalidParameterValue",
            "Value group 123 for parameter MessageDeduplicationId is invalid. Reason: MessageDeduplicationId can only include alphanumeric and punctuation characters. 1 to 128 in length."
        )
    );
}

#[tokio::test]
async fn a_create_with_other_attributes_names_the_attribute() {
    let h = Harness::start().await;
    let url = h
        .client
        .create_queue()
        .queue_name("differs")
        .attributes(QueueAttributeName::ReceiveMessageWaitTimeSeconds, "1")
        .attributes(QueueAttributeName::DelaySeconds, "1")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    assert_eq!(h.create("differs").await, url);
    let error = h
        .client
        .create_queue()
        .queue_name("differs")
        .attributes(QueueAttributeName::ReceiveMessageWaitTimeSeconds, "1")
        .attributes(QueueAttributeName::DelaySeconds, "2")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&error),
        pair(
            "QueueAlreadyExists",
            "A queue already exists with the same name and a different value for attribute DelaySeconds"
        )
    );
    assert!(error.as_service_error().unwrap().is_queue_name_exists());
}

#[tokio::test]
async fn message_attribute_values_are_checked_in_aws_words() {
    let h = Harness::start().await;
    let url = h.create("attribute-wording").await;
    let send = |name: &str, data_type: &str, value: &str| {
        h.client
            .send_message()
            .queue_url(&url)
            .message_body("x")
            .message_attributes(
                name,
                MessageAttributeValue::builder()
                    .data_type(data_type)
                    .string_value(value)
                    .build()
                    .unwrap(),
            )
            .send()
    };
    let empty = send("ErrorDetails", "String", "").await.unwrap_err();
    assert_eq!(
        error_parts(&empty),
        pair(
            "InvalidParameterValue",
            "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type 'String'."
        )
    );
    let number = send("Hello", "Number", "world").await.unwrap_err();
    assert_eq!(
        error_parts(&number),
        pair(
            "InvalidParameterValue",
            "Can't cast the value of message (user) attribute 'Hello' to a number."
        )
    );
    let kind = send("odd", "Colour", "red").await.unwrap_err();
    assert_eq!(
        error_parts(&kind),
        pair(
            "InvalidParameterValue",
            "The type of message (user) attribute 'odd' is invalid. You must use only the following supported type prefixes: Binary, Number, String."
        )
    );
    // Class 5: SQS refuses the characters a body may not hold in a string value too.
    let control = send("attr1", "String", "Invalid-\u{8},\u{b}")
        .await
        .unwrap_err();
    let (code, message) = code_and_message(error_parts(&control));
    assert_eq!(code, "InvalidParameterValue");
    assert!(
        message.contains("'attr1'") && message.contains("#x8"),
        "{message}"
    );
    // Letters of any script are legal in a name, as in SQS.
    send("attr.1øßä", "String", "Valida").await.unwrap();
}

#[tokio::test]
async fn a_visibility_change_of_a_gone_message_or_past_the_cap_is_worded_as_aws_words_it() {
    let h = Harness::start().await;
    let url = h.create("gone-visibility").await;
    h.send(&url, "x").await;
    let handle = h.receive(&url).await.messages()[0]
        .receipt_handle()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cap = h
        .change_visibility(&url, &handle, 43_200)
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&cap),
        pair(
            "InvalidParameterValue",
            "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is beyond the limit [43200 seconds]"
        )
    );
    h.delete(&url, &handle).await.unwrap();
    let gone = h.change_visibility(&url, &handle, 42).await.unwrap_err();
    assert_eq!(
        error_parts(&gone),
        pair(
            "InvalidParameterValue",
            &format!(
                "Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for visibility timeout change."
            )
        )
    );
}

// ---- Class 5: validation AWS does ----

#[tokio::test]
async fn fifo_attributes_and_names_are_refused_as_aws_refuses_them_on_standard_queues() {
    let h = Harness::start().await;
    let create = |name: &str, attribute: QueueAttributeName, value: &str| {
        h.client
            .create_queue()
            .queue_name(name)
            .attributes(attribute, value)
            .send()
    };
    let cases = [
        (
            "standard",
            QueueAttributeName::FifoQueue,
            "true",
            pair(
                "InvalidParameterValue",
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length.",
            ),
        ),
        (
            "standard",
            QueueAttributeName::FifoQueue,
            "false",
            pair("InvalidAttributeName", "Unknown Attribute FifoQueue."),
        ),
        (
            "named.fifo",
            QueueAttributeName::DelaySeconds,
            "0",
            pair(
                "InvalidParameterValue",
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
            ),
        ),
        (
            "standard",
            QueueAttributeName::ContentBasedDeduplication,
            "false",
            pair(
                "InvalidAttributeName",
                "Unknown Attribute ContentBasedDeduplication.",
            ),
        ),
        (
            "standard",
            QueueAttributeName::DeduplicationScope,
            "queue",
            pair(
                "InvalidAttributeName",
                "You can specify the DeduplicationScope only when FifoQueue is set to true.",
            ),
        ),
        (
            "standard",
            QueueAttributeName::FifoThroughputLimit,
            "perQueue",
            pair(
                "InvalidAttributeName",
                "You can specify the FifoThroughputLimit only when FifoQueue is set to true.",
            ),
        ),
    ];
    for (name, attribute, value, expected) in cases {
        let error = create(name, attribute.clone(), value).await.unwrap_err();
        assert_eq!(
            error_parts(&error),
            expected,
            "{name} {attribute:?}={value}"
        );
    }
    let url = h.create("standard").await;
    let set = h
        .client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&set),
        pair("InvalidAttributeName", "Unknown Attribute FifoQueue.")
    );
}

#[tokio::test]
async fn a_message_group_id_is_validated_on_a_standard_queue() {
    let h = Harness::start().await;
    let url = h.create("groups").await;
    h.client
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .message_group_id("tenant-1")
        .send()
        .await
        .unwrap();
    for bad in ["", "group 123", &"a".repeat(129)] {
        let error = h
            .client
            .send_message()
            .queue_url(&url)
            .message_body("x")
            .message_group_id(bad)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            error_parts(&error),
            pair(
                "InvalidParameterValue",
                &format!(
                    "Value {bad} for parameter MessageGroupId is invalid. Reason: MessageGroupId can only include alphanumeric and punctuation characters. 1 to 128 in length."
                )
            )
        );
    }
}

// ---- Class 7: queue addressing ----

#[tokio::test]
async fn a_bare_name_and_a_regional_url_address_a_queue() {
    let h = Harness::start().await;
    h.create("addressed").await;
    h.send("addressed", "by name").await;
    let regional = format!(
        "http://sqs.us-east-1.localhost:{}/{ACCOUNT}/addressed",
        h.address.port()
    );
    let received = h
        .client
        .receive_message()
        .queue_url(&regional)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages()[0].body(), Some("by name"));
    let attributes = h
        .attributes("addressed", QueueAttributeName::QueueArn)
        .await;
    assert_eq!(attributes[&QueueAttributeName::QueueArn], arn("addressed"));
}

#[tokio::test]
async fn queues_are_kept_per_region_taken_from_the_signing_scope() {
    let h = Harness::start().await;
    let endpoint = format!("http://{}", h.address);
    let ireland = super::client_at(&endpoint, "eu-west-1", super::KEY_ID, super::SECRET);
    // One name in two regions is two queues, with one URL (URLs carry no region).
    let home_url = h.create("regional").await;
    let away_url = ireland
        .create_queue()
        .queue_name("regional")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    assert_eq!(home_url, away_url);
    h.send(&home_url, "in us-east-1").await;
    ireland
        .send_message()
        .queue_url(&away_url)
        .message_body("in eu-west-1")
        .send()
        .await
        .unwrap();
    for (client, body) in [(&h.client, "in us-east-1"), (&ireland, "in eu-west-1")] {
        let received = client
            .receive_message()
            .queue_url(&home_url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        let bodies: Vec<_> = received.messages().iter().map(|m| m.body()).collect();
        assert_eq!(bodies, [Some(body)]);
    }
    // A queue of one region does not exist in another, by name, URL or listing.
    ireland
        .create_queue()
        .queue_name("only-away")
        .send()
        .await
        .unwrap();
    let missing = h
        .client
        .get_queue_url()
        .queue_name("only-away")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(missing.is_queue_does_not_exist(), "{missing:?}");
    let listed = |urls: &[String]| -> Vec<String> {
        urls.iter()
            .map(|url| url.rsplit('/').next().unwrap().to_owned())
            .collect()
    };
    let home_list = h.client.list_queues().send().await.unwrap();
    assert_eq!(listed(home_list.queue_urls()), ["regional"]);
    let away_list = ireland.list_queues().send().await.unwrap();
    assert_eq!(listed(away_list.queue_urls()), ["only-away", "regional"]);
    // Each queue's ARN names its region; an ARN of another region names no queue here.
    let away_arn = ireland
        .get_queue_attributes()
        .queue_url(&away_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()[&QueueAttributeName::QueueArn]
        .clone();
    assert_eq!(
        away_arn,
        format!("arn:aws:sqs:eu-west-1:{ACCOUNT}:regional")
    );
    let cross = h
        .client
        .start_message_move_task()
        .source_arn(&away_arn)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&cross).0,
        "ResourceNotFoundException",
        "{cross:?}"
    );
    // Below the endpoint, another region's queue is one more name (the gRPC API's name too).
    let names: Vec<String> = h
        ._node
        .backend()
        .list_queues(String::new(), None, 10)
        .await
        .unwrap()
        .iter()
        .map(|name| name.as_str().to_owned())
        .collect();
    assert_eq!(
        names,
        ["only-away@eu-west-1", "regional", "regional@eu-west-1"]
    );
}

// ---- Class 8: message move tasks ----

/// A dead-letter queue `dlq` for a source queue `source`, holding `count` messages.
async fn dead_letter_queue(h: &Harness, dlq: &str, source: &str, count: usize) -> String {
    let url = h.create(dlq).await;
    h.client
        .create_queue()
        .queue_name(source)
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(
                r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":2}}"#,
                arn(dlq)
            ),
        )
        .send()
        .await
        .unwrap();
    for index in 0..count {
        h.send(&url, &format!("m{index}")).await;
    }
    url
}

#[tokio::test]
async fn move_tasks_are_refused_in_aws_words() {
    let h = Harness::start().await;
    h.create("plain").await;
    dead_letter_queue(&h, "tasks-dlq", "tasks-source", 3).await;
    let start = |source: &str, destination: Option<&str>| {
        h.client
            .start_message_move_task()
            .source_arn(arn(source))
            .set_destination_arn(destination.map(arn))
            .max_number_of_messages_per_second(1)
            .send()
    };
    // Only a dead-letter queue is a source, with a destination or without.
    for destination in [None, Some("tasks-source")] {
        let error = start("plain", destination).await.unwrap_err();
        assert_eq!(
            error_parts(&error),
            pair(
                "InvalidParameterValue",
                "Source queue must be configured as a Dead Letter Queue."
            )
        );
    }
    let missing = start("tasks-dlq", Some("nowhere")).await.unwrap_err();
    assert_eq!(
        error_parts(&missing),
        pair(
            "ResourceNotFoundException",
            "The resource that you specified for the DestinationArn parameter doesn't exist."
        )
    );
    let no_source = start("nothing-here", None).await.unwrap_err();
    assert_eq!(
        error_parts(&no_source),
        pair(
            "ResourceNotFoundException",
            "The resource that you specified for the SourceArn parameter doesn't exist."
        )
    );
    let handle = start("tasks-dlq", Some("tasks-source"))
        .await
        .unwrap()
        .task_handle
        .unwrap();
    // AWS's form: base64 of a JSON object with the task id and the source ARN.
    let decoded: serde_json::Value =
        serde_json::from_slice(&STANDARD.decode(&handle).unwrap()).unwrap();
    assert_eq!(decoded["sourceArn"], arn("tasks-dlq"));
    let task_id = decoded["taskId"].as_str().unwrap();
    assert_eq!(
        task_id.split('-').map(str::len).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12]
    );
    let second = start("tasks-dlq", None).await.unwrap_err();
    assert_eq!(
        error_parts(&second),
        pair(
            "InvalidParameterValue",
            "There is already a task running. Only one active task is allowed for a source queue arn at a given time."
        )
    );
    let cancel = |handle: String| {
        h.client
            .cancel_message_move_task()
            .task_handle(handle)
            .send()
    };
    let malformed = cancel("garbage".to_owned()).await.unwrap_err();
    assert_eq!(
        error_parts(&malformed),
        pair(
            "InvalidParameterValue",
            "Value for parameter TaskHandle is invalid."
        )
    );
    let forged = |task: &str, source: &str| {
        STANDARD.encode(format!(r#"{{"taskId":"{task}","sourceArn":"{source}"}}"#))
    };
    let unknown_task = cancel(forged(
        "00000000-0000-0000-0000-000000000000",
        &arn("tasks-dlq"),
    ))
    .await
    .unwrap_err();
    assert_eq!(
        error_parts(&unknown_task),
        pair("ResourceNotFoundException", "Task does not exist.")
    );
    let unknown_source = cancel(forged(task_id, &arn("nothing-here")))
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&unknown_source),
        pair(
            "ResourceNotFoundException",
            "The resource that you specified for the SourceArn parameter doesn't exist."
        )
    );
    cancel(handle).await.unwrap();
}

#[tokio::test]
async fn a_move_task_whose_destination_is_deleted_ends_failed() {
    let h = Harness::start().await;
    dead_letter_queue(&h, "failing-dlq", "failing-source", 10).await;
    let destination = h.create("doomed").await;
    h.client
        .start_message_move_task()
        .source_arn(arn("failing-dlq"))
        .destination_arn(arn("doomed"))
        .max_number_of_messages_per_second(1)
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    h.client
        .delete_queue()
        .queue_url(&destination)
        .send()
        .await
        .unwrap();
    let mut task = None;
    for _ in 0..100 {
        let listed = h
            .client
            .list_message_move_tasks()
            .source_arn(arn("failing-dlq"))
            .send()
            .await
            .unwrap();
        let current = listed.results()[0].clone();
        if current.status() == Some("FAILED") {
            task = Some(current);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let task = task.expect("the task fails once its destination is gone");
    assert_eq!(
        task.failure_reason(),
        Some("AWS.SimpleQueueService.NonExistentQueue")
    );
    assert!(task.task_handle().is_none());
    let moved = task.approximate_number_of_messages_moved;
    assert!((1..10).contains(&moved), "{moved}");
    // The messages not moved stay in the dead-letter queue.
    let left = h
        .attributes(
            &h.url("failing-dlq"),
            QueueAttributeName::ApproximateNumberOfMessages,
        )
        .await;
    assert_eq!(
        left[&QueueAttributeName::ApproximateNumberOfMessages],
        (10 - moved).to_string()
    );
}

#[tokio::test]
async fn system_attribute_names_in_all_leave_out_what_a_message_lacks() {
    let h = Harness::start().await;
    let url = h.create("system-all").await;
    h.send(&url, "x").await;
    let received = h
        .client
        .receive_message()
        .queue_url(&url)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap();
    let attributes = received.messages()[0].attributes().unwrap();
    for present in [
        MessageSystemAttributeName::SenderId,
        MessageSystemAttributeName::SentTimestamp,
        MessageSystemAttributeName::ApproximateReceiveCount,
        MessageSystemAttributeName::ApproximateFirstReceiveTimestamp,
    ] {
        assert!(attributes.contains_key(&present), "{present:?}");
    }
    assert!(!attributes.contains_key(&MessageSystemAttributeName::DeadLetterQueueSourceArn));
}

// ---- Class 6: attributes kept and returned ----

/// The queue's policy document, if it has one.
async fn policy(h: &Harness, url: &str) -> Option<serde_json::Value> {
    h.attributes(url, QueueAttributeName::Policy)
        .await
        .get(&QueueAttributeName::Policy)
        .map(|text| serde_json::from_str(text).unwrap())
}

#[tokio::test]
async fn a_policy_is_kept_returned_and_cleared() {
    let h = Harness::start().await;
    let url = h.create("with-policy").await;
    let all = h.attributes(&url, QueueAttributeName::All).await;
    assert!(!all.contains_key(&QueueAttributeName::Policy));
    let policy = format!(
        r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":"*","Action":"sqs:SendMessage","Resource":"{}"}}]}}"#,
        arn("with-policy")
    );
    h.client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::Policy, &policy)
        .send()
        .await
        .unwrap();
    let kept = h.attributes(&url, QueueAttributeName::Policy).await;
    assert_eq!(kept[&QueueAttributeName::Policy], policy);
    let all = h.attributes(&url, QueueAttributeName::All).await;
    assert_eq!(all[&QueueAttributeName::Policy], policy);
    let invalid = h
        .client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::Policy, "not json")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&invalid),
        pair(
            "InvalidAttributeValue",
            "Invalid value for the parameter Policy."
        )
    );
    h.client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::Policy, "")
        .send()
        .await
        .unwrap();
    let cleared = h.attributes(&url, QueueAttributeName::Policy).await;
    assert!(!cleared.contains_key(&QueueAttributeName::Policy));
}

#[tokio::test]
async fn encryption_settings_are_kept_with_sqs_managed_encryption_on_by_default() {
    let h = Harness::start().await;
    let url = h.create("encrypted").await;
    let all = h.attributes(&url, QueueAttributeName::All).await;
    assert_eq!(all[&QueueAttributeName::SqsManagedSseEnabled], "true");
    assert!(!all.contains_key(&QueueAttributeName::KmsMasterKeyId));
    h.client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::KmsMasterKeyId, "testKeyId")
        .attributes(QueueAttributeName::KmsDataKeyReusePeriodSeconds, "6000")
        .attributes(QueueAttributeName::SqsManagedSseEnabled, "false")
        .send()
        .await
        .unwrap();
    let kms = h.attributes(&url, QueueAttributeName::All).await;
    assert_eq!(kms[&QueueAttributeName::KmsMasterKeyId], "testKeyId");
    assert_eq!(
        kms[&QueueAttributeName::KmsDataKeyReusePeriodSeconds],
        "6000"
    );
    assert_eq!(kms[&QueueAttributeName::SqsManagedSseEnabled], "false");
    let both = h
        .client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::KmsMasterKeyId, "other")
        .attributes(QueueAttributeName::SqsManagedSseEnabled, "true")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&both),
        pair(
            "InvalidAttributeName",
            "You can use one type of server-side encryption (SSE) at one time. You can either enable KMS SSE or SQS SSE."
        )
    );
    // A create naming the same settings finds the queue; another value is named.
    assert_eq!(
        h.client
            .create_queue()
            .queue_name("encrypted")
            .attributes(QueueAttributeName::KmsMasterKeyId, "testKeyId")
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap(),
        url
    );
    let other = h
        .client
        .create_queue()
        .queue_name("encrypted")
        .attributes(QueueAttributeName::KmsMasterKeyId, "otherKey")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&other),
        pair(
            "QueueAlreadyExists",
            "A queue already exists with the same name and a different value for attribute KmsMasterKeyId"
        )
    );
}

#[tokio::test]
async fn a_trace_header_and_group_id_are_returned_and_survive_a_dead_letter_move() {
    use aws_sdk_sqs::types::{MessageSystemAttributeNameForSends, MessageSystemAttributeValue};
    let h = Harness::start().await;
    dead_letter_queue(&h, "traced-dlq", "traced", 0).await;
    let url = h.url("traced");
    let trace = "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72;Sampled=1";
    let sent = h
        .client
        .send_message()
        .queue_url(&url)
        .message_body("test")
        .message_group_id("tenant-7")
        .message_system_attributes(
            MessageSystemAttributeNameForSends::AwsTraceHeader,
            MessageSystemAttributeValue::builder()
                .data_type("String")
                .string_value(trace)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert!(sent.md5_of_message_system_attributes().is_some());
    let receive = |queue: String| {
        h.client
            .receive_message()
            .queue_url(queue)
            .visibility_timeout(0)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
    };
    for _ in 0..2 {
        let received = receive(url.clone()).await.unwrap();
        let attributes = received.messages()[0].attributes().unwrap();
        assert_eq!(
            attributes[&MessageSystemAttributeName::AwsTraceHeader],
            trace
        );
        assert_eq!(
            attributes[&MessageSystemAttributeName::MessageGroupId],
            "tenant-7"
        );
    }
    // The third receive moves it to the dead-letter queue (maxReceiveCount 2).
    assert!(receive(url.clone()).await.unwrap().messages().is_empty());
    let dead = receive(h.url("traced-dlq")).await.unwrap();
    let attributes = dead.messages()[0].attributes().unwrap();
    assert_eq!(
        attributes[&MessageSystemAttributeName::AwsTraceHeader],
        trace
    );
    assert_eq!(
        attributes[&MessageSystemAttributeName::DeadLetterQueueSourceArn],
        arn("traced")
    );
    // Asked for by name only, as the older AttributeNames does.
    let named = h
        .client
        .receive_message()
        .queue_url(h.url("traced-dlq"))
        .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
        .send()
        .await
        .unwrap();
    let attributes = named.messages()[0].attributes().unwrap();
    assert_eq!(attributes.len(), 1);
    assert_eq!(
        attributes[&MessageSystemAttributeName::AwsTraceHeader],
        trace
    );
}

#[tokio::test]
async fn permissions_are_statements_of_the_policy() {
    let h = Harness::start().await;
    let url = h.create("shared").await;
    let add = |label: &str, accounts: &[&str]| {
        let mut request = h
            .client
            .add_permission()
            .queue_url(&url)
            .label(label)
            .actions("ReceiveMessage");
        for account in accounts {
            request = request.aws_account_ids(*account);
        }
        request.send()
    };
    add("crossaccountpermission", &["668614515564", "111111111111"])
        .await
        .unwrap();

    let document = policy(&h, &url).await.unwrap();
    assert_eq!(document["Version"], "2008-10-17");
    assert_eq!(
        document["Id"],
        format!("{}/SQSDefaultPolicy", arn("shared"))
    );
    let statement = &document["Statement"][0];
    assert_eq!(statement["Sid"], "crossaccountpermission");
    assert_eq!(statement["Effect"], "Allow");
    assert_eq!(
        statement["Principal"]["AWS"],
        serde_json::json!([
            "arn:aws:iam::668614515564:root",
            "arn:aws:iam::111111111111:root"
        ])
    );
    assert_eq!(statement["Action"], "SQS:ReceiveMessage");
    assert_eq!(statement["Resource"], arn("shared"));
    let again = add("crossaccountpermission", &["111111111111"])
        .await
        .unwrap_err();
    assert_eq!(
        error_parts(&again),
        pair(
            "InvalidParameterValue",
            "Value crossaccountpermission for parameter Label is invalid. Reason: Already exists."
        )
    );
    add("crossaccountpermission2", &["111111111111"])
        .await
        .unwrap();
    assert_eq!(
        policy(&h, &url).await.unwrap()["Statement"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let remove = |label: &str| {
        h.client
            .remove_permission()
            .queue_url(&url)
            .label(label)
            .send()
    };
    remove("crossaccountpermission").await.unwrap();
    let unknown = remove("crossaccountpermission").await.unwrap_err();
    assert_eq!(
        error_parts(&unknown),
        pair(
            "InvalidParameterValue",
            "Value crossaccountpermission for parameter Label is invalid. Reason: can't find label."
        )
    );
    remove("crossaccountpermission2").await.unwrap();
    assert!(policy(&h, &url).await.is_none());
}

// ---- Class 1: order ----

#[tokio::test]
async fn a_batch_comes_back_in_entry_order() {
    let h = Harness::start().await;
    let url = h.create("batch-order").await;
    for round in 0..3 {
        let mut batch = h.client.send_message_batch().queue_url(&url);
        for index in 0..10 {
            batch = batch.entries(send_entry(
                &format!("e{index}"),
                &format!("{round}-{index}"),
            ));
        }
        let sent = batch.send().await.unwrap();
        assert_eq!(sent.successful().len(), 10);
        let received = h
            .client
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        let bodies: Vec<&str> = received
            .messages()
            .iter()
            .map(|message| message.body().unwrap())
            .collect();
        let expected: Vec<String> = (0..10).map(|index| format!("{round}-{index}")).collect();
        assert_eq!(bodies, expected, "round {round}");
        for message in received.messages() {
            h.delete(&url, message.receipt_handle().unwrap())
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn a_message_whose_visibility_expired_comes_back_before_later_sends() {
    let h = Harness::start().await;
    let url = h.create("restore-order").await;
    h.send(&url, "first").await;
    h.client
        .receive_message()
        .queue_url(&url)
        .visibility_timeout(1)
        .send()
        .await
        .unwrap();
    h.send(&url, "second").await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let received = h
        .client
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    let bodies: Vec<&str> = received
        .messages()
        .iter()
        .map(|message| message.body().unwrap())
        .collect();
    assert_eq!(bodies, ["first", "second"]);
}
