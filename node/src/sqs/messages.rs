//! The message actions: send, receive, delete and change visibility, single and batched. Wire
//! attributes become core `AttributeValue`s here (base64 decoded, data types checked), and
//! deliveries become SQS messages with their receipt handle, digests and the system attributes
//! asked for. Batch entries run concurrently so that they share the engine's group commit; each
//! entry's refusal is reported in `Failed` inside a 200, as SQS does.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use tokio::task::JoinSet;
use trireme_core::{
    AttributeValue, Command, DedupId, Delivery, Outcome, QueueName, ReceiptHandle,
    limits as core_limits,
};

use super::attributes::{MessageAttributeFilter, requested_system_attributes};
use super::digest::{DigestAttribute, DigestValue, attributes_md5, body_md5};
use super::error::SqsError;
use super::wire::{
    BatchIdEntry, BatchResponse, BatchResultErrorEntry, ChangeMessageVisibilityBatchRequest,
    ChangeMessageVisibilityRequest, DeleteMessageBatchRequest, DeleteMessageRequest, Empty,
    MessageAttributeValue, MessageAttributes, ReceiveMessageRequest, ReceiveMessageResponse,
    ReceivedMessage, SendDigests, SendMessageBatchRequest, SendMessageBatchResultEntry,
    SendMessageRequest, SendMessageResponse,
};
use super::{Sqs, in_range, limits, required};

/// A send, converted and checked at the edge, ready for the engine.
struct PreparedSend {
    command: Command,
    digests: SendDigests,
    /// Bytes counted against the batch payload limit.
    payload_bytes: u64,
}

/// The members of one send, single or batched.
struct SendParts {
    body: Option<String>,
    delay_seconds: Option<i64>,
    message_attributes: Option<MessageAttributes>,
    message_system_attributes: Option<MessageAttributes>,
    message_deduplication_id: Option<String>,
}

impl Sqs {
    pub(super) async fn send_message(
        &self,
        request: SendMessageRequest,
    ) -> Result<SendMessageResponse, SqsError> {
        let queue = self.queue_from_url(request.queue_url.as_deref())?;
        let prepared = self.prepare_send(
            &queue,
            SendParts {
                body: request.message_body,
                delay_seconds: request.delay_seconds,
                message_attributes: request.message_attributes,
                message_system_attributes: request.message_system_attributes,
                message_deduplication_id: request.message_deduplication_id,
            },
        )?;
        let id = sent_id(self.engine.execute(prepared.command).await?);
        Ok(SendMessageResponse {
            digests: prepared.digests,
            message_id: id,
        })
    }

    pub(super) async fn send_message_batch(
        &self,
        request: SendMessageBatchRequest,
    ) -> Result<BatchResponse<SendMessageBatchResultEntry>, SqsError> {
        let (queue, entries) = self
            .open_batch(
                request.queue_url.as_deref(),
                request.entries,
                "SendMessageBatchRequestEntry",
                |entry| entry.id.as_deref(),
            )
            .await?;
        let mut failed = Vec::new();
        let mut prepared = Vec::new();
        for (id, entry) in entries {
            let parts = SendParts {
                body: entry.message_body,
                delay_seconds: entry.delay_seconds,
                message_attributes: entry.message_attributes,
                message_system_attributes: entry.message_system_attributes,
                message_deduplication_id: entry.message_deduplication_id,
            };
            match self.prepare_send(&queue, parts) {
                Ok(send) => prepared.push((id, send)),
                Err(error) => failed.push(failure(id, &error)),
            }
        }
        let payload_bytes: u64 = prepared.iter().map(|(_, send)| send.payload_bytes).sum();
        if payload_bytes > limits::batch_payload_bytes_max {
            return Err(SqsError::BatchRequestTooLong {
                size_bytes: payload_bytes,
                max_bytes: limits::batch_payload_bytes_max,
            });
        }
        let (commands, sends): (Vec<Command>, Vec<(String, SendDigests)>) = prepared
            .into_iter()
            .map(|(id, send)| (send.command, (id, send.digests)))
            .unzip();
        let mut successful = Vec::new();
        for ((id, digests), result) in sends.into_iter().zip(self.execute_all(commands).await) {
            match result {
                Ok(outcome) => successful.push(SendMessageBatchResultEntry {
                    id,
                    message_id: sent_id(outcome),
                    digests,
                }),
                Err(error) => failed.push(failure(id, &error)),
            }
        }
        Ok(BatchResponse { successful, failed })
    }

    pub(super) async fn receive_message(
        &self,
        request: ReceiveMessageRequest,
    ) -> Result<ReceiveMessageResponse, SqsError> {
        let queue = self.queue_from_url(request.queue_url.as_deref())?;
        let max = in_range(
            request.max_number_of_messages,
            "MaxNumberOfMessages",
            1,
            core_limits::batch_entries_max,
        )?
        .unwrap_or(1);
        let visibility_s = in_range(
            request.visibility_timeout,
            "VisibilityTimeout",
            0,
            core_limits::visibility_timeout_s_max,
        )?;
        let wait_s = in_range(
            request.wait_time_seconds,
            "WaitTimeSeconds",
            0,
            core_limits::wait_s_max,
        )?;
        let system = requested_system_attributes(
            &request.message_system_attribute_names.unwrap_or_default(),
            &request.attribute_names.unwrap_or_default(),
        )?;
        let filter =
            MessageAttributeFilter::new(&request.message_attribute_names.unwrap_or_default());
        let deliveries = self
            .engine
            .receive(queue, max, visibility_s, wait_s)
            .await?;
        Ok(ReceiveMessageResponse {
            messages: deliveries
                .into_iter()
                .map(|delivery| self.render_delivery(delivery, &system, &filter))
                .collect(),
        })
    }

    pub(super) async fn delete_message(
        &self,
        request: DeleteMessageRequest,
    ) -> Result<Empty, SqsError> {
        let queue = self.queue_from_url(request.queue_url.as_deref())?;
        let handle = self.decode_handle(request.receipt_handle.as_deref())?;
        self.engine
            .execute(Command::Delete { queue, handle })
            .await?;
        Ok(Empty {})
    }

    pub(super) async fn delete_message_batch(
        &self,
        request: DeleteMessageBatchRequest,
    ) -> Result<BatchResponse<BatchIdEntry>, SqsError> {
        let (queue, entries) = self
            .open_batch(
                request.queue_url.as_deref(),
                request.entries,
                "DeleteMessageBatchRequestEntry",
                |entry| entry.id.as_deref(),
            )
            .await?;
        let prepared = entries.into_iter().map(|(id, entry)| {
            let command = self
                .decode_handle(entry.receipt_handle.as_deref())
                .map(|handle| Command::Delete {
                    queue: queue.clone(),
                    handle,
                });
            (id, command)
        });
        Ok(self.run_id_batch(prepared.collect()).await)
    }

    pub(super) async fn change_message_visibility(
        &self,
        request: ChangeMessageVisibilityRequest,
    ) -> Result<Empty, SqsError> {
        let queue = self.queue_from_url(request.queue_url.as_deref())?;
        let handle = self.decode_handle(request.receipt_handle.as_deref())?;
        let timeout_s = visibility_timeout(request.visibility_timeout)?;
        self.engine
            .execute(Command::ChangeVisibility {
                queue,
                handle,
                timeout_s,
            })
            .await?;
        Ok(Empty {})
    }

    pub(super) async fn change_message_visibility_batch(
        &self,
        request: ChangeMessageVisibilityBatchRequest,
    ) -> Result<BatchResponse<BatchIdEntry>, SqsError> {
        let (queue, entries) = self
            .open_batch(
                request.queue_url.as_deref(),
                request.entries,
                "ChangeMessageVisibilityBatchRequestEntry",
                |entry| entry.id.as_deref(),
            )
            .await?;
        let prepared = entries.into_iter().map(|(id, entry)| {
            let command = self
                .decode_handle(entry.receipt_handle.as_deref())
                .and_then(|handle| {
                    Ok(Command::ChangeVisibility {
                        queue: queue.clone(),
                        handle,
                        timeout_s: visibility_timeout(entry.visibility_timeout)?,
                    })
                });
            (id, command)
        });
        Ok(self.run_id_batch(prepared.collect()).await)
    }

    /// Opens a batch request: the queue its URL names, and each entry paired with its checked
    /// id. A missing queue refuses the whole batch, as in SQS, not each entry.
    ///
    /// # Errors
    /// A bad or missing `QueueUrl`, missing `Entries`, `QueueDoesNotExist`, and the refusals
    /// of [`check_batch`]: the whole request is refused.
    async fn open_batch<E>(
        &self,
        queue_url: Option<&str>,
        entries: Option<Vec<E>>,
        entry: &'static str,
        id_of: impl Fn(&E) -> Option<&str>,
    ) -> Result<(QueueName, Vec<(String, E)>), SqsError> {
        let queue = self.queue_from_url(queue_url)?;
        let entries = required(entries, "Entries")?;
        self.view(&queue).await?;
        let ids = check_batch(entries.iter().map(id_of), entry)?;
        Ok((queue, ids.into_iter().zip(entries).collect()))
    }

    /// Runs the commands of a delete or visibility batch; entries already refused at the edge
    /// are reported as they are.
    async fn run_id_batch(
        &self,
        prepared: Vec<(String, Result<Command, SqsError>)>,
    ) -> BatchResponse<BatchIdEntry> {
        let mut failed = Vec::new();
        let mut ready = Vec::new();
        for (id, command) in prepared {
            match command {
                Ok(command) => ready.push((id, command)),
                Err(error) => failed.push(failure(id, &error)),
            }
        }
        let (ids, commands): (Vec<String>, Vec<Command>) = ready.into_iter().unzip();
        let mut successful = Vec::new();
        for (id, result) in ids.into_iter().zip(self.execute_all(commands).await) {
            match result {
                Ok(_) => successful.push(BatchIdEntry { id }),
                Err(error) => failed.push(failure(id, &error)),
            }
        }
        BatchResponse { successful, failed }
    }

    /// Executes commands concurrently (they then share a group commit); results in input order.
    /// Dropping the future aborts what has not finished.
    async fn execute_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, SqsError>> {
        let count = commands.len();
        let mut tasks = JoinSet::new();
        for (index, command) in commands.into_iter().enumerate() {
            let engine = self.engine.clone();
            tasks.spawn(
                async move { (index, engine.execute(command).await.map_err(SqsError::from)) },
            );
        }
        let mut results: Vec<Option<Result<Outcome, SqsError>>> =
            (0..count).map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            let (index, result) =
                joined.expect("engine calls do not panic and are not aborted while joined");
            results[index] = Some(result);
        }
        results
            .into_iter()
            .map(|result| result.expect("every spawned command reports once"))
            .collect()
    }

    fn prepare_send(&self, queue: &QueueName, parts: SendParts) -> Result<PreparedSend, SqsError> {
        let body = required(parts.body, "MessageBody")?;
        let delay_s = in_range(
            parts.delay_seconds,
            "DelaySeconds",
            0,
            core_limits::delay_s_max,
        )?;
        let attributes = convert_attributes(parts.message_attributes.unwrap_or_default())?;
        let system_attributes_md5 =
            system_attributes_md5(&parts.message_system_attributes.unwrap_or_default())?;
        let dedup = parts
            .message_deduplication_id
            .map(|id| {
                DedupId::try_from(id.as_str()).map_err(|_| {
                    SqsError::invalid(
                        "MessageDeduplicationId",
                        &id,
                        "It must be 1 to 128 printable ASCII characters.",
                    )
                })
            })
            .transpose()?;
        let payload_bytes = trireme_core::message_size_bytes(&body, &attributes);
        Ok(PreparedSend {
            digests: SendDigests {
                md5_of_message_body: body_md5(&body),
                md5_of_message_attributes: core_attributes_md5(attributes.iter()),
                md5_of_message_system_attributes: system_attributes_md5,
            },
            payload_bytes,
            command: Command::Send {
                queue: queue.clone(),
                id: self.engine.new_message_id(),
                body,
                attributes,
                delay_s,
                dedup,
            },
        })
    }

    fn decode_handle(&self, text: Option<&str>) -> Result<ReceiptHandle, SqsError> {
        let text = required(text, "ReceiptHandle")?;
        self.engine
            .handles()
            .decode(text)
            .map_err(|error| SqsError::ReceiptHandleIsInvalid {
                reason: error.to_string(),
            })
    }

    fn render_delivery(
        &self,
        delivery: Delivery,
        system: &BTreeSet<&'static str>,
        filter: &MessageAttributeFilter,
    ) -> ReceivedMessage {
        let mut attributes = BTreeMap::new();
        for name in system {
            let value = match *name {
                "SenderId" => self.addresses.account().to_owned(),
                "SentTimestamp" => delivery.sent_at.0.to_string(),
                "ApproximateReceiveCount" => delivery.receive_count.to_string(),
                "ApproximateFirstReceiveTimestamp" => delivery.first_receive_at.0.to_string(),
                "DeadLetterQueueSourceArn" => match &delivery.source {
                    Some(source) => self.addresses.queue_arn(source.as_str()),
                    None => continue,
                },
                // FIFO attributes and trace headers: Trireme keeps none.
                _ => continue,
            };
            attributes.insert(*name, value);
        }
        let selected: Vec<(&String, &AttributeValue)> = delivery
            .attributes
            .iter()
            .filter(|(name, _)| filter.selects(name))
            .collect();
        let md5_of_message_attributes = core_attributes_md5(selected.iter().copied());
        let message_attributes = selected
            .into_iter()
            .map(|(name, value)| {
                let wire = match value {
                    AttributeValue::String { data_type, value } => MessageAttributeValue {
                        data_type: Some(data_type.clone()),
                        string_value: Some(value.clone()),
                        ..MessageAttributeValue::default()
                    },
                    AttributeValue::Binary { data_type, value } => MessageAttributeValue {
                        data_type: Some(data_type.clone()),
                        binary_value: Some(STANDARD.encode(value)),
                        ..MessageAttributeValue::default()
                    },
                };
                (name.clone(), wire)
            })
            .collect();
        ReceivedMessage {
            message_id: delivery.message.to_string(),
            receipt_handle: self.engine.handles().encode(&delivery.handle),
            md5_of_body: body_md5(&delivery.body),
            body: delivery.body,
            attributes,
            md5_of_message_attributes,
            message_attributes,
        }
    }
}

fn sent_id(outcome: Outcome) -> String {
    match outcome {
        Outcome::Sent { id, .. } => id.to_string(),
        other => unreachable!("a send answers Sent, got {other:?}"),
    }
}

fn visibility_timeout(value: Option<i64>) -> Result<u32, SqsError> {
    let value = required(value, "VisibilityTimeout")?;
    in_range(
        Some(value),
        "VisibilityTimeout",
        0,
        core_limits::visibility_timeout_s_max,
    )
    .map(|timeout| timeout.expect("a present value stays present"))
}

fn failure(id: String, error: &SqsError) -> BatchResultErrorEntry {
    let (code, sender_fault) = error.batch_entry_code();
    BatchResultErrorEntry {
        id,
        sender_fault,
        code,
        message: error.to_string(),
    }
}

/// Checks a batch's entry ids: 1–10 entries, each id present, legal and distinct.
///
/// # Errors
/// `EmptyBatchRequest`, `TooManyEntriesInBatchRequest`, `MissingParameter`,
/// `InvalidBatchEntryId` or `BatchEntryIdsNotDistinct`: the whole request is refused.
fn check_batch<'a>(
    ids: impl ExactSizeIterator<Item = Option<&'a str>>,
    entry: &'static str,
) -> Result<Vec<String>, SqsError> {
    let count = ids.len();
    if count == 0 {
        return Err(SqsError::EmptyBatchRequest { entry });
    }
    if count > usize::try_from(core_limits::batch_entries_max).expect("10 fits usize") {
        return Err(SqsError::TooManyEntriesInBatchRequest { count });
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(count);
    for id in ids {
        let id = required(id, "Id")?;
        let legal = !id.is_empty()
            && id.chars().count() <= limits::batch_entry_id_chars_max
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !legal {
            return Err(SqsError::InvalidBatchEntryId { id: id.to_owned() });
        }
        if !seen.insert(id) {
            return Err(SqsError::BatchEntryIdsNotDistinct { id: id.to_owned() });
        }
        out.push(id.to_owned());
    }
    Ok(out)
}

/// Wire message attributes to core values: data types checked, binary values base64-decoded.
fn convert_attributes(
    attributes: MessageAttributes,
) -> Result<BTreeMap<String, AttributeValue>, SqsError> {
    let mut out = BTreeMap::new();
    for (name, value) in attributes {
        let invalid = |reason: String| SqsError::InvalidParameterValue {
            message: format!("Message attribute {name} is invalid. Reason: {reason}"),
        };
        if value
            .string_list_values
            .as_ref()
            .is_some_and(|list| !list.is_empty())
            || value
                .binary_list_values
                .as_ref()
                .is_some_and(|list| !list.is_empty())
        {
            return Err(invalid(
                "Message attribute list values are not supported.".to_owned(),
            ));
        }
        let data_type = value
            .data_type
            .filter(|data_type| !data_type.is_empty())
            .ok_or_else(|| invalid("It must have a DataType.".to_owned()))?;
        let base = data_type.split('.').next().unwrap_or_default();
        let converted = match base {
            "String" | "Number" => {
                let text = value
                    .string_value
                    .filter(|text| !text.is_empty())
                    .ok_or_else(|| {
                        invalid(format!(
                            "A {data_type} attribute must have a non-empty StringValue."
                        ))
                    })?;
                if base == "Number" && !text.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                    return Err(invalid(format!("{text} is not a number.")));
                }
                AttributeValue::String {
                    data_type,
                    value: text,
                }
            }
            "Binary" => {
                let encoded = value.binary_value.ok_or_else(|| {
                    invalid("A Binary attribute must have a BinaryValue.".to_owned())
                })?;
                let bytes = STANDARD
                    .decode(encoded.as_bytes())
                    .map_err(|_| invalid("BinaryValue is not valid base64.".to_owned()))?;
                AttributeValue::Binary {
                    data_type,
                    value: bytes,
                }
            }
            _ => {
                return Err(invalid(format!(
                    "The data type {data_type} does not start with one of String, Number, Binary."
                )));
            }
        };
        out.insert(name, converted);
    }
    Ok(out)
}

/// Checks `MessageSystemAttributes` (only `AWSTraceHeader`, a String, exists) and digests them.
/// Trireme does not store them; see the README's list of differences.
fn system_attributes_md5(attributes: &MessageAttributes) -> Result<Option<String>, SqsError> {
    let mut digest = Vec::new();
    for (name, value) in attributes {
        if name != "AWSTraceHeader" {
            return Err(SqsError::InvalidParameterValue {
                message: format!(
                    "Message system attribute {name} is invalid. Reason: Only AWSTraceHeader is supported."
                ),
            });
        }
        let (Some("String"), Some(text)) =
            (value.data_type.as_deref(), value.string_value.as_deref())
        else {
            return Err(SqsError::InvalidParameterValue {
                message: "Message system attribute AWSTraceHeader is invalid. Reason: It must be a String with a StringValue.".to_owned(),
            });
        };
        digest.push(DigestAttribute {
            name,
            data_type: "String",
            value: DigestValue::Text(text),
        });
    }
    Ok(attributes_md5(&digest))
}

fn core_attributes_md5<'a>(
    attributes: impl Iterator<Item = (&'a String, &'a AttributeValue)>,
) -> Option<String> {
    let digest: Vec<DigestAttribute<'_>> = attributes
        .map(|(name, value)| DigestAttribute {
            name,
            data_type: value.data_type(),
            value: match value {
                AttributeValue::String { value, .. } => DigestValue::Text(value),
                AttributeValue::Binary { value, .. } => DigestValue::Bytes(value),
            },
        })
        .collect();
    attributes_md5(&digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_are_checked_in_sqs_order() {
        let none: Vec<Option<&str>> = vec![];
        assert!(matches!(
            check_batch(none.into_iter(), "E"),
            Err(SqsError::EmptyBatchRequest { .. })
        ));
        let eleven: Vec<Option<&str>> = (0..11).map(|_| Some("a")).collect();
        assert!(matches!(
            check_batch(eleven.into_iter(), "E"),
            Err(SqsError::TooManyEntriesInBatchRequest { count: 11 })
        ));
        assert!(matches!(
            check_batch(vec![Some("a b")].into_iter(), "E"),
            Err(SqsError::InvalidBatchEntryId { .. })
        ));
        let long = "x".repeat(81);
        assert!(matches!(
            check_batch(vec![Some(long.as_str())].into_iter(), "E"),
            Err(SqsError::InvalidBatchEntryId { .. })
        ));
        assert!(matches!(
            check_batch(vec![Some("a"), Some("a")].into_iter(), "E"),
            Err(SqsError::BatchEntryIdsNotDistinct { .. })
        ));
        assert_eq!(
            check_batch(vec![Some("a-1"), Some("b_2")].into_iter(), "E").unwrap(),
            vec!["a-1", "b_2"]
        );
    }

    fn attribute(data_type: &str, string: Option<&str>, binary: Option<&str>) -> MessageAttributes {
        BTreeMap::from([(
            "attr".to_owned(),
            MessageAttributeValue {
                data_type: Some(data_type.to_owned()),
                string_value: string.map(str::to_owned),
                binary_value: binary.map(str::to_owned),
                ..MessageAttributeValue::default()
            },
        )])
    }

    #[test]
    fn attributes_convert_with_custom_labels_and_binary() {
        let converted = convert_attributes(attribute(
            "Number.java.lang.Long",
            Some("1493147359900"),
            None,
        ))
        .unwrap();
        assert_eq!(
            converted["attr"],
            AttributeValue::String {
                data_type: "Number.java.lang.Long".into(),
                value: "1493147359900".into()
            }
        );
        let binary = convert_attributes(attribute("Binary", None, Some("SGVsbG8="))).unwrap();
        assert_eq!(
            binary["attr"],
            AttributeValue::Binary {
                data_type: "Binary".into(),
                value: b"Hello".to_vec()
            }
        );
    }

    #[test]
    fn malformed_attributes_are_refused() {
        for bad in [
            attribute("String", None, None),
            attribute("Number", Some("twelve"), None),
            attribute("Binary", None, Some("not base64!")),
            attribute("Binary", Some("x"), None),
            attribute("Colour", Some("red"), None),
            attribute("", Some("x"), None),
        ] {
            assert!(
                matches!(
                    convert_attributes(bad.clone()),
                    Err(SqsError::InvalidParameterValue { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn trace_header_is_the_only_system_attribute() {
        let trace = BTreeMap::from([(
            "AWSTraceHeader".to_owned(),
            MessageAttributeValue {
                data_type: Some("String".into()),
                string_value: Some("Root=1-5759e988-bd862e3fe1be46a994272793".into()),
                ..MessageAttributeValue::default()
            },
        )]);
        assert!(system_attributes_md5(&trace).unwrap().is_some());
        assert_eq!(system_attributes_md5(&BTreeMap::new()).unwrap(), None);
        let other = attribute("String", Some("x"), None);
        assert!(system_attributes_md5(&other).is_err());
    }
}
