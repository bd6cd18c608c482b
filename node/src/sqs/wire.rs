//! The JSON shapes of SQS requests and responses (AWS JSON 1.0): members in PascalCase, except
//! the two SQS spells otherwise (`tags` in `CreateQueue`, `queueUrls` in
//! `ListDeadLetterSourceQueues`). Absent response members are left out, never written as null.
//!
//! Every request member is optional here so that a missing required member is refused by the
//! action with `MissingParameter` naming it, rather than by serde with a generic message. Numbers
//! are read as `i64` so that an out-of-range value is refused with its range. Nothing here
//! validates or converts; that is the action's job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A message attribute as it travels: data type plus a string or base64 binary value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MessageAttributeValue {
    /// `String`, `Number` or `Binary`, optionally with a custom label (`Number.int`).
    pub data_type: Option<String>,
    /// The value of a `String` or `Number` attribute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub string_value: Option<String>,
    /// The base64 value of a `Binary` attribute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary_value: Option<String>,
    /// Reserved by SQS; refused when not empty.
    #[serde(default, skip_serializing)]
    pub string_list_values: Option<Vec<String>>,
    /// Reserved by SQS; refused when not empty.
    #[serde(default, skip_serializing)]
    pub binary_list_values: Option<Vec<String>>,
}

/// Attribute maps as they travel.
pub type MessageAttributes = BTreeMap<String, MessageAttributeValue>;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CreateQueueRequest {
    pub queue_name: Option<String>,
    pub attributes: Option<BTreeMap<String, String>>,
    #[serde(rename = "tags")]
    pub tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetQueueUrlRequest {
    pub queue_name: Option<String>,
    #[serde(rename = "QueueOwnerAWSAccountId")]
    pub queue_owner_aws_account_id: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct QueueUrlResponse {
    pub queue_url: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListQueuesRequest {
    pub queue_name_prefix: Option<String>,
    pub next_token: Option<String>,
    pub max_results: Option<i64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListQueuesResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queue_urls: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

/// Requests that name only a queue: `DeleteQueue`, `PurgeQueue`, `ListQueueTags`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct QueueUrlRequest {
    pub queue_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetQueueAttributesRequest {
    pub queue_url: Option<String>,
    pub attribute_names: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AttributesResponse {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SetQueueAttributesRequest {
    pub queue_url: Option<String>,
    pub attributes: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessageRequest {
    pub queue_url: Option<String>,
    pub message_body: Option<String>,
    pub delay_seconds: Option<i64>,
    pub message_attributes: Option<MessageAttributes>,
    pub message_system_attributes: Option<MessageAttributes>,
    pub message_deduplication_id: Option<String>,
    /// Validated as SQS validates it on standard queues.
    pub message_group_id: Option<String>,
}

/// The digests a send answers with, single or batched: of the body, and of the message and
/// system attributes when any were sent.
#[derive(Debug, Serialize)]
pub struct SendDigests {
    #[serde(rename = "MD5OfMessageBody")]
    pub md5_of_message_body: String,
    #[serde(
        rename = "MD5OfMessageAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    pub md5_of_message_attributes: Option<String>,
    #[serde(
        rename = "MD5OfMessageSystemAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    pub md5_of_message_system_attributes: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessageResponse {
    #[serde(flatten)]
    pub digests: SendDigests,
    pub message_id: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessageBatchEntry {
    pub id: Option<String>,
    pub message_body: Option<String>,
    pub delay_seconds: Option<i64>,
    pub message_attributes: Option<MessageAttributes>,
    pub message_system_attributes: Option<MessageAttributes>,
    pub message_deduplication_id: Option<String>,
    /// Validated as SQS validates it on standard queues.
    pub message_group_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessageBatchRequest {
    pub queue_url: Option<String>,
    pub entries: Option<Vec<SendMessageBatchEntry>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessageBatchResultEntry {
    pub id: String,
    pub message_id: String,
    #[serde(flatten)]
    pub digests: SendDigests,
}

/// One failed entry of a batch, reported inside a 200 response.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BatchResultErrorEntry {
    pub id: String,
    pub sender_fault: bool,
    pub code: String,
    pub message: String,
}

/// A batch result: both lists are always present, as SQS answers them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BatchResponse<T> {
    pub successful: Vec<T>,
    pub failed: Vec<BatchResultErrorEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ReceiveMessageRequest {
    pub queue_url: Option<String>,
    pub attribute_names: Option<Vec<String>>,
    pub message_system_attribute_names: Option<Vec<String>>,
    pub message_attribute_names: Option<Vec<String>>,
    pub max_number_of_messages: Option<i64>,
    pub visibility_timeout: Option<i64>,
    pub wait_time_seconds: Option<i64>,
    // `ReceiveRequestAttemptId` (FIFO only) is skipped like any unknown member.
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ReceivedMessage {
    pub message_id: String,
    pub receipt_handle: String,
    #[serde(rename = "MD5OfBody")]
    pub md5_of_body: String,
    pub body: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<&'static str, String>,
    #[serde(
        rename = "MD5OfMessageAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    pub md5_of_message_attributes: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub message_attributes: MessageAttributes,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ReceiveMessageResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<ReceivedMessage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteMessageRequest {
    pub queue_url: Option<String>,
    pub receipt_handle: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteMessageBatchEntry {
    pub id: Option<String>,
    pub receipt_handle: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteMessageBatchRequest {
    pub queue_url: Option<String>,
    pub entries: Option<Vec<DeleteMessageBatchEntry>>,
}

/// A successful entry of `DeleteMessageBatch` or `ChangeMessageVisibilityBatch`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BatchIdEntry {
    pub id: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChangeMessageVisibilityRequest {
    pub queue_url: Option<String>,
    pub receipt_handle: Option<String>,
    pub visibility_timeout: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChangeMessageVisibilityBatchEntry {
    pub id: Option<String>,
    pub receipt_handle: Option<String>,
    pub visibility_timeout: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChangeMessageVisibilityBatchRequest {
    pub queue_url: Option<String>,
    pub entries: Option<Vec<ChangeMessageVisibilityBatchEntry>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListDeadLetterSourceQueuesRequest {
    pub queue_url: Option<String>,
    pub next_token: Option<String>,
    pub max_results: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct ListDeadLetterSourceQueuesResponse {
    /// Required in SQS's model, so present even when empty.
    #[serde(rename = "queueUrls")]
    pub queue_urls: Vec<String>,
    #[serde(rename = "NextToken", skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StartMessageMoveTaskRequest {
    pub source_arn: Option<String>,
    pub destination_arn: Option<String>,
    pub max_number_of_messages_per_second: Option<i64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct StartMessageMoveTaskResponse {
    pub task_handle: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListMessageMoveTasksRequest {
    pub source_arn: Option<String>,
    pub max_results: Option<i64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct MoveTaskResult {
    /// Only a running task has a handle (it is what cancels it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_handle: Option<String>,
    pub status: &'static str,
    pub source_arn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_number_of_messages_per_second: Option<u32>,
    pub approximate_number_of_messages_moved: u64,
    pub approximate_number_of_messages_to_move: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Epoch milliseconds.
    pub started_timestamp: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListMessageMoveTasksResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<MoveTaskResult>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CancelMessageMoveTaskRequest {
    pub task_handle: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CancelMessageMoveTaskResponse {
    pub approximate_number_of_messages_moved: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AddPermissionRequest {
    pub queue_url: Option<String>,
    pub label: Option<String>,
    #[serde(rename = "AWSAccountIds")]
    pub aws_account_ids: Option<Vec<String>>,
    pub actions: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RemovePermissionRequest {
    pub queue_url: Option<String>,
    pub label: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TagQueueRequest {
    pub queue_url: Option<String>,
    pub tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UntagQueueRequest {
    pub queue_url: Option<String>,
    pub tag_keys: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListQueueTagsResponse {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// The empty JSON object that actions without output answer.
#[derive(Debug, Serialize)]
pub struct Empty {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_receive_has_no_messages_key() {
        let json = serde_json::to_string(&ReceiveMessageResponse { messages: vec![] }).unwrap();
        assert_eq!(json, "{}");
    }

    #[test]
    fn members_use_sqs_spelling() {
        let digests = |attributes_md5: Option<&str>| SendDigests {
            md5_of_message_body: "b".into(),
            md5_of_message_attributes: attributes_md5.map(Into::into),
            md5_of_message_system_attributes: None,
        };
        let sent = SendMessageResponse {
            digests: digests(None),
            message_id: "m".into(),
        };
        assert_eq!(
            serde_json::to_string(&sent).unwrap(),
            r#"{"MD5OfMessageBody":"b","MessageId":"m"}"#
        );
        let entry = SendMessageBatchResultEntry {
            id: "1".into(),
            message_id: "m".into(),
            digests: digests(Some("a")),
        };
        assert_eq!(
            serde_json::to_string(&entry).unwrap(),
            r#"{"Id":"1","MessageId":"m","MD5OfMessageBody":"b","MD5OfMessageAttributes":"a"}"#
        );
        let sources = ListDeadLetterSourceQueuesResponse {
            queue_urls: vec![],
            next_token: None,
        };
        assert_eq!(
            serde_json::to_string(&sources).unwrap(),
            r#"{"queueUrls":[]}"#
        );
        let create: CreateQueueRequest =
            serde_json::from_str(r#"{"QueueName":"q","tags":{"a":"b"},"Unknown":1}"#).unwrap();
        assert_eq!(create.queue_name.as_deref(), Some("q"));
        assert_eq!(create.tags.unwrap()["a"], "b");
        let batch = BatchResponse::<BatchIdEntry> {
            successful: vec![],
            failed: vec![BatchResultErrorEntry {
                id: "1".into(),
                sender_fault: true,
                code: "ReceiptHandleIsInvalid".into(),
                message: "m".into(),
            }],
        };
        assert_eq!(
            serde_json::to_string(&batch).unwrap(),
            r#"{"Successful":[],"Failed":[{"Id":"1","SenderFault":true,"Code":"ReceiptHandleIsInvalid","Message":"m"}]}"#
        );
    }

    #[test]
    fn received_message_leaves_out_absent_members() {
        let message = ReceivedMessage {
            message_id: "m".into(),
            receipt_handle: "h".into(),
            md5_of_body: "d".into(),
            body: "b".into(),
            attributes: BTreeMap::new(),
            md5_of_message_attributes: None,
            message_attributes: BTreeMap::new(),
        };
        assert_eq!(
            serde_json::to_string(&message).unwrap(),
            r#"{"MessageId":"m","ReceiptHandle":"h","MD5OfBody":"d","Body":"b"}"#
        );
    }
}
