//! The message actions: send, receive, delete and change visibility, single and batched. Wire
//! attributes become core `AttributeValue`s here (base64 decoded, data types checked), and
//! deliveries become SQS messages with their receipt handle, digests and the system attributes
//! asked for. A batch's entries go to the engine together, in entry order, so that they share
//! its group commit and a sent batch keeps its order; each entry's refusal is reported in
//! `Failed` inside a 200, as SQS does.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use trireme_core::{
    AttributeValue, Command, DedupId, Delivery, MessageId, Outcome, QueueName, ReceiptHandle,
    Reject, SystemAttributes, limits as core_limits,
};

use crate::engine::EngineError;

use super::attributes::{MessageAttributeFilter, requested_system_attributes};
use super::digest::{DigestAttribute, DigestValue, attributes_md5, body_md5};
use super::error::{Invalid, SqsError, Subject};
use super::wire::{
    BatchIdEntry, BatchResponse, BatchResultErrorEntry, ChangeMessageVisibilityBatchRequest,
    ChangeMessageVisibilityRequest, DeleteMessageBatchRequest, DeleteMessageRequest, Empty,
    MessageAttributeValue, MessageAttributes, ReceiveMessageRequest, ReceiveMessageResponse,
    ReceivedMessage, SendDigests, SendMessageBatchRequest, SendMessageBatchResultEntry,
    SendMessageRequest, SendMessageResponse,
};
use super::{Call, in_range, limits, required};

/// A send, converted and checked at the edge, ready for the engine.
struct PreparedSend {
    command: Command,
    /// The body, for the wording of a refusal that quotes its first bad character.
    body: String,
    digests: SendDigests,
    /// Bytes counted against the batch payload limit.
    payload_bytes: u64,
}

/// One entry of a delete or visibility batch, converted at the edge.
struct IdEntry {
    id: String,
    /// The receipt handle as sent, for the wording of a refusal.
    handle: String,
    /// The visibility timeout asked for, if any and valid.
    timeout_s: Option<u32>,
    /// The command, or the edge's refusal of the entry.
    command: Result<Command, SqsError>,
}

/// The members of one send, single or batched.
struct SendParts {
    body: Option<String>,
    delay_seconds: Option<i64>,
    message_attributes: Option<MessageAttributes>,
    message_system_attributes: Option<MessageAttributes>,
    message_deduplication_id: Option<String>,
    message_group_id: Option<String>,
}

impl Call<'_> {
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
                message_group_id: request.message_group_id,
            },
        )?;
        let outcome = self
            .backend
            .execute(prepared.command)
            .await
            .map_err(|error| send_refusal(error, &prepared.body, false))?;
        let id = sent_id(outcome);
        tracing::Span::current().record("message_id", id.as_str());
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
                message_group_id: entry.message_group_id,
            };
            match self.prepare_send(&queue, parts) {
                Ok(send) => prepared.push((id, send)),
                Err(error) => failed.push(failure(id, &in_batch(error))),
            }
        }
        // Entries stored in the same millisecond tie by message id: ids drawn in increasing
        // entry order keep the batch in entry order when it is received.
        let mut ids: Vec<MessageId> = prepared
            .iter()
            .filter_map(|(_, send)| match &send.command {
                Command::Send { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        for ((_, send), drawn) in prepared.iter_mut().zip(ids) {
            if let Command::Send { id, .. } = &mut send.command {
                *id = drawn;
            }
        }
        let payload_bytes: u64 = prepared.iter().map(|(_, send)| send.payload_bytes).sum();
        if payload_bytes > limits::batch_payload_bytes_max {
            return Err(SqsError::BatchRequestTooLong {
                size_bytes: payload_bytes,
                max_bytes: limits::batch_payload_bytes_max,
            });
        }
        let (commands, sends): (Vec<Command>, Vec<(String, SendDigests, String)>) = prepared
            .into_iter()
            .map(|(id, send)| (send.command, (id, send.digests, send.body)))
            .unzip();
        let mut successful = Vec::new();
        for ((id, digests, body), result) in sends.into_iter().zip(self.execute_all(commands).await)
        {
            match result {
                Ok(outcome) => successful.push(SendMessageBatchResultEntry {
                    id,
                    message_id: sent_id(outcome),
                    digests,
                }),
                Err(error) => failed.push(failure(id, &send_refusal(error, &body, true))),
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
        let wait_s = in_bounds(
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
            .backend
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
        let text = required(request.receipt_handle.as_deref(), "ReceiptHandle")?;
        let handle = self.decode_handle(text)?;
        let result = self
            .backend
            .execute(Command::Delete { queue, handle })
            .await;
        self.delete_answer(result, text)?;
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
            let text = entry.receipt_handle.unwrap_or_default();
            let command = required(
                Some(text.as_str()).filter(|text| !text.is_empty()),
                "ReceiptHandle",
            )
            .and_then(|text| self.decode_handle(text))
            .map(|handle| Command::Delete {
                queue: queue.clone(),
                handle,
            });
            IdEntry {
                id,
                handle: text,
                timeout_s: None,
                command,
            }
        });
        Ok(self.run_id_batch(prepared.collect(), true).await)
    }

    pub(super) async fn change_message_visibility(
        &self,
        request: ChangeMessageVisibilityRequest,
    ) -> Result<Empty, SqsError> {
        let queue = self.queue_from_url(request.queue_url.as_deref())?;
        let text = required(request.receipt_handle.as_deref(), "ReceiptHandle")?;
        let handle = self.decode_handle(text)?;
        let timeout_s = visibility_timeout(request.visibility_timeout)?;
        self.backend
            .execute(Command::ChangeVisibility {
                queue,
                handle,
                timeout_s,
            })
            .await
            .map_err(|error| {
                SqsError::from_engine(
                    error,
                    Subject {
                        handle: Some(text),
                        visibility_timeout_s: Some(timeout_s),
                        body: None,
                    },
                )
            })?;
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
            let text = entry.receipt_handle.unwrap_or_default();
            let timeout = visibility_timeout(entry.visibility_timeout);
            let command = required(
                Some(text.as_str()).filter(|text| !text.is_empty()),
                "ReceiptHandle",
            )
            .and_then(|text| self.decode_handle(text))
            .and_then(|handle| {
                Ok(Command::ChangeVisibility {
                    queue: queue.clone(),
                    handle,
                    timeout_s: timeout.clone()?,
                })
            });
            IdEntry {
                id,
                handle: text,
                timeout_s: timeout.ok(),
                command,
            }
        });
        Ok(self.run_id_batch(prepared.collect(), false).await)
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

    /// Runs the commands of a delete (`deletes`) or visibility batch: each entry with its id,
    /// its receipt handle as sent, its visibility timeout and its command. Entries already
    /// refused at the edge are reported as they are.
    async fn run_id_batch(
        &self,
        prepared: Vec<IdEntry>,
        deletes: bool,
    ) -> BatchResponse<BatchIdEntry> {
        let mut failed = Vec::new();
        let mut entries = Vec::new();
        let mut commands = Vec::new();
        for entry in prepared {
            match entry.command {
                Ok(command) => {
                    entries.push((entry.id, entry.handle, entry.timeout_s));
                    commands.push(command);
                }
                Err(error) => failed.push(failure(entry.id, &error)),
            }
        }
        let mut successful = Vec::new();
        for ((id, text, timeout_s), result) in
            entries.into_iter().zip(self.execute_all(commands).await)
        {
            let answer = if deletes {
                self.delete_answer(result, &text)
            } else {
                result.map(|_| ()).map_err(|error| {
                    SqsError::from_engine(
                        error,
                        Subject {
                            handle: Some(&text),
                            visibility_timeout_s: timeout_s,
                            body: None,
                        },
                    )
                })
            };
            match answer {
                Ok(()) => successful.push(BatchIdEntry { id }),
                Err(error) => failed.push(failure(id, &error)),
            }
        }
        BatchResponse { successful, failed }
    }

    /// The answer to a delete: SQS answers a delete with a superseded receipt handle with
    /// success and deletes nothing, and so does this endpoint (the backend counts it, as it counts
    /// the gRPC API's, which keeps the core's precise refusal).
    fn delete_answer(
        &self,
        result: Result<Outcome, EngineError>,
        handle: &str,
    ) -> Result<(), SqsError> {
        match result {
            Ok(_) => Ok(()),
            Err(EngineError::Rejected(Reject::StaleReceiptHandle { message })) => {
                tracing::debug!(%message, "delete with a superseded receipt handle answered with success");
                Ok(())
            }
            Err(error) => Err(SqsError::from_engine(
                error,
                Subject {
                    handle: Some(handle),
                    ..Subject::default()
                },
            )),
        }
    }

    /// Executes commands in their order, sharing one group commit; results in that order. A
    /// batch's entries are applied in entry order, which is what keeps a sent batch in entry
    /// order (spec/queue-core.md, "A batch comes back in entry order").
    async fn execute_all(&self, commands: Vec<Command>) -> Vec<Result<Outcome, EngineError>> {
        self.backend.execute_all(commands).await
    }

    fn prepare_send(&self, queue: &QueueName, parts: SendParts) -> Result<PreparedSend, SqsError> {
        // SQS treats an empty body as a missing one.
        let body = required(parts.body.filter(|body| !body.is_empty()), "MessageBody")?;
        let delay_s = match parts.delay_seconds {
            None => None,
            Some(delay) => Some(
                u32::try_from(delay)
                    .ok()
                    .filter(|delay| *delay <= core_limits::delay_s_max)
                    .ok_or_else(|| {
                        SqsError::invalid(
                            "DelaySeconds",
                            delay,
                            format!(
                                "DelaySeconds must be >= 0 and <= {}.",
                                core_limits::delay_s_max
                            ),
                        )
                    })?,
            ),
        };
        let attributes = convert_attributes(parts.message_attributes.unwrap_or_default())?;
        let system_attributes = parts.message_system_attributes.unwrap_or_default();
        let system_attributes_md5 = system_attributes_md5(&system_attributes)?;
        let dedup = parts
            .message_deduplication_id
            .map(|id| {
                DedupId::try_from(id.as_str()).map_err(|_| {
                    SqsError::invalid(
                        "MessageDeduplicationId",
                        &id,
                        "MessageDeduplicationId can only include alphanumeric and punctuation characters. 1 to 128 in length.",
                    )
                })
            })
            .transpose()?;
        if let Some(group) = &parts.message_group_id {
            check_group_id(group)?;
        }
        let payload_bytes = trireme_core::message_size_bytes(&body, &attributes);
        Ok(PreparedSend {
            body: body.clone(),
            digests: SendDigests {
                md5_of_message_body: body_md5(&body),
                md5_of_message_attributes: core_attributes_md5(attributes.iter()),
                md5_of_message_system_attributes: system_attributes_md5,
            },
            payload_bytes,
            command: Command::Send {
                queue: queue.clone(),
                id: self.backend.new_message_id(),
                body,
                attributes,
                system: SystemAttributes {
                    trace_header: system_attributes
                        .get("AWSTraceHeader")
                        .and_then(|value| value.string_value.clone()),
                    group_id: parts.message_group_id,
                },
                delay_s,
                dedup,
            },
        })
    }

    fn decode_handle(&self, text: &str) -> Result<ReceiptHandle, SqsError> {
        self.backend
            .handles()
            .decode(text)
            .inspect(|handle| {
                tracing::Span::current()
                    .record("message_id", tracing::field::display(handle.message));
            })
            .map_err(|_| SqsError::ReceiptHandleIsInvalid {
                handle: text.to_owned(),
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
                    Some(source) => self.addresses.queue_arn(source),
                    None => continue,
                },
                "AWSTraceHeader" => match &delivery.system.trace_header {
                    Some(header) => header.clone(),
                    None => continue,
                },
                "MessageGroupId" => match &delivery.system.group_id {
                    Some(group) => group.clone(),
                    None => continue,
                },
                // FIFO attributes: a standard queue has none.
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
            receipt_handle: self.backend.handles().encode(&delivery.handle),
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

/// The refusal of a send by the engine, worded with its body; `batched` for AWS's wording of a
/// batch entry's size refusal.
fn send_refusal(error: EngineError, body: &str, batched: bool) -> SqsError {
    let error = SqsError::from_engine(
        error,
        Subject {
            body: Some(body),
            ..Subject::default()
        },
    );
    if batched { in_batch(error) } else { error }
}

/// A send refusal as a batch entry reports it: AWS words an oversized entry differently.
fn in_batch(error: SqsError) -> SqsError {
    match error {
        SqsError::InvalidParameterValue(Invalid::MessageTooLong { max_bytes }) => {
            SqsError::InvalidParameterValue(Invalid::EntryTooLong { max_bytes })
        }
        other => other,
    }
}

/// Checks a `MessageGroupId` as SQS does on standard queues (it accepts the id since fair
/// queues): 1 to 128 characters, alphanumeric or ASCII punctuation.
fn check_group_id(group: &str) -> Result<(), SqsError> {
    let legal = (1..=128).contains(&group.chars().count())
        && group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c.is_ascii_punctuation());
    if legal {
        Ok(())
    } else {
        Err(SqsError::invalid(
            "MessageGroupId",
            group,
            "MessageGroupId can only include alphanumeric and punctuation characters. 1 to 128 in length.",
        ))
    }
}

/// An optional integer member in `min..=max`, refused in SQS's `WaitTimeSeconds` wording.
fn in_bounds(
    value: Option<i64>,
    parameter: &'static str,
    min: u32,
    max: u32,
) -> Result<Option<u32>, SqsError> {
    match value {
        None => Ok(None),
        Some(value) => u32::try_from(value)
            .ok()
            .filter(|value| (min..=max).contains(value))
            .map(Some)
            .ok_or_else(|| {
                SqsError::out_of_bounds(parameter, value, u64::from(min), u64::from(max))
            }),
    }
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
            return Err(SqsError::InvalidBatchEntryId);
        }
        if !seen.insert(id) {
            return Err(SqsError::BatchEntryIdsNotDistinct { id: id.to_owned() });
        }
        out.push(id.to_owned());
    }
    Ok(out)
}

/// Wire message attributes to core values: data types checked, binary values base64-decoded,
/// string values held to the body's characters (as SQS does). Names are the core's to check.
fn convert_attributes(
    attributes: MessageAttributes,
) -> Result<BTreeMap<String, AttributeValue>, SqsError> {
    let mut out = BTreeMap::new();
    for (name, value) in attributes {
        let refuse = |invalid: Invalid| SqsError::InvalidParameterValue(invalid);
        let reason = |reason: String| {
            refuse(Invalid::Attribute {
                name: name.clone(),
                reason,
            })
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
            return Err(reason(
                "Message attribute list values are not supported.".to_owned(),
            ));
        }
        let data_type = value.data_type.unwrap_or_default();
        let base = data_type.split('.').next().unwrap_or_default().to_owned();
        let empty = || {
            refuse(Invalid::EmptyAttributeValue {
                name: name.clone(),
                data_type: base.clone(),
            })
        };
        let converted = match base.as_str() {
            "String" | "Number" => {
                let text = value
                    .string_value
                    .filter(|text| !text.is_empty())
                    .ok_or_else(empty)?;
                if let Some(bad) = text.chars().find(|c| !trireme_core::body_char_allowed(*c)) {
                    return Err(reason(format!(
                        "Invalid binary character '#x{:X}' was found in its value.",
                        u32::from(bad)
                    )));
                }
                if base == "Number" && !text.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                    return Err(refuse(Invalid::AttributeNotNumber { name: name.clone() }));
                }
                AttributeValue::String {
                    data_type,
                    value: text,
                }
            }
            "Binary" => {
                let encoded = value
                    .binary_value
                    .filter(|encoded| !encoded.is_empty())
                    .ok_or_else(empty)?;
                let bytes = STANDARD
                    .decode(encoded.as_bytes())
                    .map_err(|_| reason("BinaryValue is not valid base64.".to_owned()))?;
                AttributeValue::Binary {
                    data_type,
                    value: bytes,
                }
            }
            _ => return Err(refuse(Invalid::AttributeType { name: name.clone() })),
        };
        out.insert(name, converted);
    }
    Ok(out)
}

/// Checks `MessageSystemAttributes` (only `AWSTraceHeader`, a String, exists) and digests them.
fn system_attributes_md5(attributes: &MessageAttributes) -> Result<Option<String>, SqsError> {
    let mut digest = Vec::new();
    for (name, value) in attributes {
        if name != "AWSTraceHeader" {
            return Err(SqsError::InvalidParameterValue(Invalid::SystemAttribute {
                name: name.clone(),
                reason: "Only AWSTraceHeader is supported.".to_owned(),
            }));
        }
        let (Some("String"), Some(text)) =
            (value.data_type.as_deref(), value.string_value.as_deref())
        else {
            return Err(SqsError::InvalidParameterValue(Invalid::SystemAttribute {
                name: name.clone(),
                reason: "It must be a String with a StringValue.".to_owned(),
            }));
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
            Err(SqsError::InvalidBatchEntryId)
        ));
        let long = "x".repeat(81);
        assert!(matches!(
            check_batch(vec![Some(long.as_str())].into_iter(), "E"),
            Err(SqsError::InvalidBatchEntryId)
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
