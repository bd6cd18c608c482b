//! The queue-level actions: create, find, list, delete, attributes, purge, tags, dead-letter
//! sources and message move tasks. Each turns its request into engine commands or queries and
//! its answer into the response shape; refusals come back as `SqsError`. Message actions live
//! in `messages.rs`.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use trireme_core::{
    AttributeChanges, Command, QueueAttributes, QueueName, QueuePrefixes, QueueView, RedriveAllow,
};

use super::attributes::{
    check_queue_type, first_difference, parse_queue_attributes, requested_queue_attributes,
};
use super::error::{Invalid, Limit, SqsError};
use super::move_task::MoveTaskHandle;
use super::permissions;
use super::redrive_policy::{
    RedriveAllowJson, RedrivePolicyJson, render_redrive_allow_policy, render_redrive_policy,
};
use super::wire::{
    AddPermissionRequest, AttributesResponse, CancelMessageMoveTaskRequest,
    CancelMessageMoveTaskResponse, CreateQueueRequest, Empty, GetQueueAttributesRequest,
    GetQueueUrlRequest, ListDeadLetterSourceQueuesRequest, ListDeadLetterSourceQueuesResponse,
    ListMessageMoveTasksRequest, ListMessageMoveTasksResponse, ListQueueTagsResponse,
    ListQueuesRequest, ListQueuesResponse, MoveTaskResult, QueueUrlRequest, QueueUrlResponse,
    RemovePermissionRequest, SetQueueAttributesRequest, StartMessageMoveTaskRequest,
    StartMessageMoveTaskResponse, TagQueueRequest, UntagQueueRequest,
};
use super::{Call, in_range, limits, required};
use crate::redrive::{RedriveError, RedriveFailure, RedriveStatus};

impl Call<'_> {
    pub(super) async fn create_queue(
        &self,
        request: CreateQueueRequest,
    ) -> Result<QueueUrlResponse, SqsError> {
        let text = required(request.queue_name, "QueueName")?;
        let attributes = request.attributes.unwrap_or_default();
        check_queue_type(&text, &attributes)?;
        let name = self
            .addresses
            .scoped(&text)
            .map_err(|_| SqsError::InvalidParameterValue(Invalid::QueueName))?;
        self.allowed(&name)?;
        let changes =
            parse_queue_attributes(&attributes, |arn| self.queue_from_arn(arn, "RedrivePolicy"))?;
        // SQS compares only the attributes the request names with those of an existing queue,
        // so "create if missing" without attributes finds a queue whatever its settings; the
        // refusal names the first attribute that differs.
        if let Some(existing) = self.backend.queue(&name).await? {
            if let Some(attribute) = first_difference(&existing.attributes, &attributes, |arn| {
                self.queue_from_arn(arn, "RedrivePolicy")
            })? {
                return Err(SqsError::QueueNameExists { attribute });
            }
            return Ok(QueueUrlResponse {
                queue_url: self.addresses.queue_url(&name),
            });
        }
        let attributes = QueueAttributes::default().with(&changes);
        self.backend
            .execute(Command::CreateQueue {
                name: name.clone(),
                attributes,
                tags: request.tags.unwrap_or_default(),
            })
            .await?;
        Ok(QueueUrlResponse {
            queue_url: self.addresses.queue_url(&name),
        })
    }

    pub(super) async fn get_queue_url(
        &self,
        request: GetQueueUrlRequest,
    ) -> Result<QueueUrlResponse, SqsError> {
        let text = required(request.queue_name, "QueueName")?;
        if request
            .queue_owner_aws_account_id
            .is_some_and(|owner| owner != self.addresses.account())
        {
            return Err(SqsError::QueueDoesNotExist);
        }
        let name = self.existing_queue_name(&text)?;
        self.allowed(&name)?;
        self.view(&name).await?;
        Ok(QueueUrlResponse {
            queue_url: self.addresses.queue_url(&name),
        })
    }

    pub(super) async fn list_queues(
        &self,
        request: ListQueuesRequest,
    ) -> Result<ListQueuesResponse, SqsError> {
        let prefix = request.queue_name_prefix.unwrap_or_default();
        let (mut after, limit) = page(request.next_token.as_deref(), request.max_results)?;
        // Names sort by their full text, so other regions' queues interleave with this
        // region's: pages are read until `limit + 1` of this region's are found or the names
        // end. The number of queues is capped, so this ends. A key limited by prefix sees its
        // own queues only, read past the same way.
        let mut names = Vec::new();
        loop {
            let batch = self
                .backend
                .list_queues(prefix.clone(), after.clone(), limit + 1)
                .await?;
            let exhausted = batch.len() <= limit;
            after = batch.last().cloned();
            names.extend(
                batch
                    .into_iter()
                    .filter(|name| self.addresses.in_region(name) && self.listed(name)),
            );
            if exhausted || names.len() > limit {
                break;
            }
        }
        let next_token = more(&mut names, limit, request.max_results.is_some());
        Ok(ListQueuesResponse {
            queue_urls: names
                .iter()
                .map(|name| self.addresses.queue_url(name))
                .collect(),
            next_token,
        })
    }

    pub(super) async fn delete_queue(&self, request: QueueUrlRequest) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        self.backend.execute(Command::DeleteQueue { name }).await?;
        Ok(Empty {})
    }

    pub(super) async fn purge_queue(&self, request: QueueUrlRequest) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        self.backend.execute(Command::PurgeQueue { name }).await?;
        Ok(Empty {})
    }

    pub(super) async fn get_queue_attributes(
        &self,
        request: GetQueueAttributesRequest,
    ) -> Result<AttributesResponse, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        let names = request.attribute_names.unwrap_or_default();
        let selected = requested_queue_attributes(&names)?;
        let allow_policy_named = names.iter().any(|name| name == "RedriveAllowPolicy");
        let view = self.view(&name).await?;
        Ok(AttributesResponse {
            attributes: self.render_attributes(&view, &selected, allow_policy_named),
        })
    }

    pub(super) async fn set_queue_attributes(
        &self,
        request: SetQueueAttributesRequest,
    ) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        let attributes = required(request.attributes, "Attributes")?;
        let changes =
            parse_queue_attributes(&attributes, |arn| self.queue_from_arn(arn, "RedrivePolicy"))?;
        self.backend
            .execute(Command::SetQueueAttributes { name, changes })
            .await?;
        Ok(Empty {})
    }

    /// Adds a statement to the queue's policy. The policy is read, changed and written back:
    /// two permission changes of one queue at the same moment may lose one (see the README).
    pub(super) async fn add_permission(
        &self,
        request: AddPermissionRequest,
    ) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        let label = required(request.label, "Label")?;
        let accounts = required(
            request.aws_account_ids.filter(|ids| !ids.is_empty()),
            "AWSAccountIds",
        )?;
        let actions = required(request.actions.filter(|list| !list.is_empty()), "Actions")?;
        let view = self.view(&name).await?;
        let policy = permissions::add_statement(
            view.attributes.kept.policy.as_deref(),
            &self.addresses.queue_arn(&name),
            &label,
            &accounts,
            &actions,
        )?;
        self.set_policy(name, Some(policy)).await
    }

    /// Removes the statement `Label` from the queue's policy.
    pub(super) async fn remove_permission(
        &self,
        request: RemovePermissionRequest,
    ) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        let label = required(request.label, "Label")?;
        let view = self.view(&name).await?;
        let policy = permissions::remove_statement(view.attributes.kept.policy.as_deref(), &label)?;
        self.set_policy(name, policy).await
    }

    async fn set_policy(&self, name: QueueName, policy: Option<String>) -> Result<Empty, SqsError> {
        let changes = AttributeChanges {
            policy: Some(policy),
            ..AttributeChanges::default()
        };
        self.backend
            .execute(Command::SetQueueAttributes { name, changes })
            .await?;
        Ok(Empty {})
    }

    pub(super) async fn tag_queue(&self, request: TagQueueRequest) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        let tags = required(request.tags, "Tags")?;
        self.backend
            .execute(Command::TagQueue { name, tags })
            .await?;
        Ok(Empty {})
    }

    pub(super) async fn untag_queue(&self, request: UntagQueueRequest) -> Result<Empty, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        let keys: BTreeSet<String> = required(request.tag_keys, "TagKeys")?.into_iter().collect();
        self.backend
            .execute(Command::UntagQueue { name, keys })
            .await?;
        Ok(Empty {})
    }

    pub(super) async fn list_queue_tags(
        &self,
        request: QueueUrlRequest,
    ) -> Result<ListQueueTagsResponse, SqsError> {
        let name = self.queue_from_url(request.queue_url.as_deref())?;
        Ok(ListQueueTagsResponse {
            tags: self.view(&name).await?.tags,
        })
    }

    pub(super) async fn list_dead_letter_source_queues(
        &self,
        request: ListDeadLetterSourceQueuesRequest,
    ) -> Result<ListDeadLetterSourceQueuesResponse, SqsError> {
        let dlq = self.queue_from_url(request.queue_url.as_deref())?;
        self.view(&dlq).await?;
        let (after, limit) = page(request.next_token.as_deref(), request.max_results)?;
        let mut sources: Vec<QueueName> = self
            .backend
            .dead_letter_sources(&dlq)
            .await?
            .into_iter()
            .filter(|name| self.addresses.in_region(name) && self.listed(name))
            .filter(|name| after.as_ref().is_none_or(|after| name > after))
            .take(limit + 1)
            .collect();
        let next_token = more(&mut sources, limit, request.max_results.is_some());
        Ok(ListDeadLetterSourceQueuesResponse {
            queue_urls: sources
                .iter()
                .map(|name| self.addresses.queue_url(name))
                .collect(),
            next_token,
        })
    }

    pub(super) async fn start_message_move_task(
        &self,
        request: StartMessageMoveTaskRequest,
    ) -> Result<StartMessageMoveTaskResponse, SqsError> {
        let source_arn = required(request.source_arn, "SourceArn")?;
        let from = self.move_task_queue(&source_arn, "SourceArn").await?;
        let to = match request.destination_arn.as_deref() {
            Some(arn) => Some(self.move_task_queue(arn, "DestinationArn").await?),
            None => None,
        };
        let rate = in_range(
            request.max_number_of_messages_per_second,
            "MaxNumberOfMessagesPerSecond",
            1,
            limits::move_task_rate_per_s_max,
        )?;
        // SQS moves messages out of dead-letter queues only, whether or not a destination is
        // named.
        let sources = self.backend.dead_letter_sources(&from).await?;
        if sources.is_empty() {
            return Err(SqsError::InvalidParameterValue(
                Invalid::NotADeadLetterQueue,
            ));
        }
        // Without a destination the messages go back to their sources: a key limited by prefix
        // may start that only when it may reach every one of them, as it may send to none
        // outside its prefix (AWS asks for `sqs:SendMessage` on the sources alike).
        if to.is_none() {
            for source in &sources {
                self.allowed(source)?;
            }
        }
        // The check above reads the sources of now; a message's source is where it was
        // dead-lettered from, so the task keeps the key's restriction and checks each message
        // (spec/queue-core.md, *A move task moves only into queues its starter may reach*).
        let allowed = self
            .scope
            .as_ref()
            .and_then(|key| QueuePrefixes::new(key.queue_prefixes.clone()));
        let task_id = self
            .backend
            .start_move_task(from.clone(), to.clone(), rate, allowed)
            .await
            .map_err(|error| move_task_error(error, &from))?;
        Ok(StartMessageMoveTaskResponse {
            task_handle: MoveTaskHandle {
                task_id,
                source_arn,
            }
            .encode(),
        })
    }

    pub(super) async fn list_message_move_tasks(
        &self,
        request: ListMessageMoveTasksRequest,
    ) -> Result<ListMessageMoveTasksResponse, SqsError> {
        let source_arn = required(request.source_arn, "SourceArn")?;
        let limit = in_range(
            request.max_results,
            "MaxResults",
            1,
            limits::move_tasks_results_max,
        )?
        .unwrap_or(1);
        let from = self.move_task_queue(&source_arn, "SourceArn").await?;
        let tasks = self
            .backend
            .list_move_tasks(&from, usize_from(limit))
            .await?;
        let results = tasks
            .into_iter()
            .map(|task| {
                let (status, failure_reason) = match task.status {
                    RedriveStatus::Running => ("RUNNING", None),
                    RedriveStatus::Completed => ("COMPLETED", None),
                    RedriveStatus::Cancelling => ("CANCELLING", None),
                    RedriveStatus::Cancelled => ("CANCELLED", None),
                    // SQS gives the error code of what stopped the task.
                    RedriveStatus::Failed(failure) => ("FAILED", Some(failure_reason(failure))),
                };
                MoveTaskResult {
                    task_handle: (status == "RUNNING").then(|| {
                        MoveTaskHandle {
                            task_id: task.handle.clone(),
                            source_arn: source_arn.clone(),
                        }
                        .encode()
                    }),
                    status,
                    source_arn: source_arn.clone(),
                    destination_arn: task.to.as_ref().map(|to| self.addresses.queue_arn(to)),
                    max_number_of_messages_per_second: task.rate_per_s,
                    approximate_number_of_messages_moved: task.moved,
                    approximate_number_of_messages_to_move: task.to_move,
                    failure_reason,
                    started_timestamp: task.started_at.0,
                }
            })
            .collect();
        Ok(ListMessageMoveTasksResponse { results })
    }

    pub(super) async fn cancel_message_move_task(
        &self,
        request: CancelMessageMoveTaskRequest,
    ) -> Result<CancelMessageMoveTaskResponse, SqsError> {
        let text = required(request.task_handle, "TaskHandle")?;
        let handle = MoveTaskHandle::decode(&text)
            .ok_or(SqsError::InvalidParameterValue(Invalid::TaskHandle))?;
        let from = self
            .move_task_queue(&handle.source_arn, "SourceArn")
            .await?;
        // A task of another queue is no task of this one.
        if self
            .backend
            .move_task(&handle.task_id)
            .await?
            .is_none_or(|task| task.from != from)
        {
            return Err(SqsError::TaskDoesNotExist);
        }
        let moved = self
            .backend
            .cancel_move_task(&handle.task_id)
            .await
            .map_err(|error| move_task_error(error, &from))?;
        Ok(CancelMessageMoveTaskResponse {
            approximate_number_of_messages_moved: moved,
        })
    }

    /// The existing queue a move task's ARN parameter names, or SQS's `ResourceNotFound` naming
    /// the parameter.
    async fn move_task_queue(
        &self,
        arn: &str,
        parameter: &'static str,
    ) -> Result<QueueName, SqsError> {
        let missing = SqsError::ResourceNotFound { parameter };
        let name = match self.queue_from_arn(arn, parameter) {
            Ok(name) => name,
            Err(SqsError::QueueDoesNotExist) => return Err(missing),
            Err(other) => return Err(other),
        };
        match self.backend.queue(&name).await? {
            Some(_) => Ok(name),
            None => Err(missing),
        }
    }

    /// The queue's current state, or `QueueDoesNotExist`.
    pub(super) async fn view(&self, name: &QueueName) -> Result<QueueView, SqsError> {
        self.backend
            .queue(name)
            .await?
            .ok_or(SqsError::QueueDoesNotExist)
    }

    fn render_attributes(
        &self,
        view: &QueueView,
        selected: &BTreeSet<&'static str>,
        allow_policy_named: bool,
    ) -> BTreeMap<String, String> {
        let attributes = &view.attributes;
        let mut out = BTreeMap::new();
        for name in selected {
            let value = match *name {
                "VisibilityTimeout" => attributes.visibility_timeout_s.to_string(),
                "MaximumMessageSize" => attributes.message_bytes_max.to_string(),
                "MessageRetentionPeriod" => attributes.retention_s.to_string(),
                "DelaySeconds" => attributes.delay_s.to_string(),
                "ReceiveMessageWaitTimeSeconds" => attributes.receive_wait_s.to_string(),
                "ApproximateNumberOfMessages" => view.counts.ready.to_string(),
                "ApproximateNumberOfMessagesNotVisible" => view.counts.in_flight.to_string(),
                "ApproximateNumberOfMessagesDelayed" => view.counts.delayed.to_string(),
                "CreatedTimestamp" => (view.created_at.0 / 1_000).to_string(),
                "LastModifiedTimestamp" => (view.modified_at.0 / 1_000).to_string(),
                "QueueArn" => self.addresses.queue_arn(&view.name),
                "SqsManagedSseEnabled" => attributes.kept.sqs_managed_sse.to_string(),
                "Policy" => match &attributes.kept.policy {
                    Some(policy) => policy.clone(),
                    None => continue,
                },
                // The KMS settings appear once a key is named, as in SQS.
                "KmsMasterKeyId" => match &attributes.kept.kms_master_key_id {
                    Some(key) => key.clone(),
                    None => continue,
                },
                "KmsDataKeyReusePeriodSeconds" => match &attributes.kept.kms_master_key_id {
                    Some(_) => attributes.kept.kms_data_key_reuse_s.to_string(),
                    None => continue,
                },
                "RedrivePolicy" => match &attributes.redrive {
                    Some(policy) => render_redrive_policy(&RedrivePolicyJson {
                        dead_letter_target_arn: self.addresses.queue_arn(&policy.dead_letter_queue),
                        max_receive_count: policy.max_receive_count,
                    }),
                    None => continue,
                },
                "RedriveAllowPolicy" => {
                    // The default (allow all) is shown only when asked for by name, as SQS
                    // leaves an unset policy out of `All`.
                    if attributes.redrive_allow == RedriveAllow::AllowAll && !allow_policy_named {
                        continue;
                    }
                    render_redrive_allow_policy(&match &attributes.redrive_allow {
                        RedriveAllow::AllowAll => RedriveAllowJson::AllowAll,
                        RedriveAllow::DenyAll => RedriveAllowJson::DenyAll,
                        RedriveAllow::ByQueue(sources) => RedriveAllowJson::ByQueue(
                            sources
                                .iter()
                                .map(|source| self.addresses.queue_arn(source))
                                .collect(),
                        ),
                    })
                }
                // FIFO attributes: a standard queue has none.
                _ => continue,
            };
            out.insert((*name).to_owned(), value);
        }
        out
    }
}

/// Reads `NextToken` and `MaxResults` of a list action: where to start after, and how many.
fn page(
    next_token: Option<&str>,
    max_results: Option<i64>,
) -> Result<(Option<QueueName>, usize), SqsError> {
    let limit = in_range(max_results, "MaxResults", 1, limits::list_results_max)?
        .unwrap_or(limits::list_results_max);
    let after = match next_token {
        None | Some("") => None,
        Some(token) => {
            let invalid = || {
                SqsError::invalid(
                    "NextToken",
                    token,
                    "It is not a token this endpoint issued.",
                )
            };
            if token.len() > limits::next_token_chars_max {
                return Err(invalid());
            }
            let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
            let name = String::from_utf8(bytes).map_err(|_| invalid())?;
            Some(QueueName::try_from(name).map_err(|_| invalid())?)
        }
    };
    Ok((after, usize_from(limit)))
}

/// Trims a page fetched with one extra entry; the token when there are more and the caller set
/// `MaxResults` (SQS pages only then).
fn more(names: &mut Vec<QueueName>, limit: usize, paged: bool) -> Option<String> {
    if names.len() <= limit {
        return None;
    }
    names.truncate(limit);
    let last = names.last().expect("limit is at least 1");
    paged.then(|| URL_SAFE_NO_PAD.encode(last.as_str()))
}

fn usize_from(value: u32) -> usize {
    usize::try_from(value).expect("u32 fits usize on every supported target")
}

/// The `FailureReason` of a failed task: the SQS error code of what stopped it.
fn failure_reason(failure: RedriveFailure) -> String {
    let error = match failure {
        RedriveFailure::DestinationDeleted { .. } => SqsError::QueueDoesNotExist,
        RedriveFailure::Engine(error) => error.into(),
    };
    error.wire().query_code.into_owned()
}

fn move_task_error(error: RedriveError, from: &QueueName) -> SqsError {
    match error {
        RedriveError::QueueNotFound { name } => SqsError::ResourceNotFound {
            parameter: if &name == from {
                "SourceArn"
            } else {
                "DestinationArn"
            },
        },
        RedriveError::NotADeadLetterQueue { .. } => {
            SqsError::InvalidParameterValue(Invalid::NotADeadLetterQueue)
        }
        RedriveError::AlreadyRunning { .. } => {
            SqsError::InvalidParameterValue(Invalid::MoveTaskRunning)
        }
        RedriveError::TooManyRunning { max } => SqsError::OverLimit(Limit::MoveTasks { max }),
        RedriveError::RateOutOfRange { rate, max } => {
            SqsError::out_of_range("MaxNumberOfMessagesPerSecond", rate, 1, u64::from(max))
        }
        RedriveError::TaskNotFound { .. } => SqsError::TaskDoesNotExist,
        RedriveError::NotRunning { .. } => {
            SqsError::InvalidParameterValue(Invalid::MoveTaskNotRunning)
        }
        RedriveError::Engine(error) => error.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_round_trips_through_the_token() {
        let names: Vec<QueueName> = ["a", "b", "c"]
            .iter()
            .map(|n| QueueName::try_from(*n).unwrap())
            .collect();
        let mut page_one = names.clone();
        let token = more(&mut page_one, 2, true).unwrap();
        assert_eq!(page_one.len(), 2);
        let (after, limit) = page(Some(&token), Some(2)).unwrap();
        assert_eq!(after.unwrap().as_str(), "b");
        assert_eq!(limit, 2);
        // Without MaxResults there is no token, as in SQS.
        let mut unpaged = names;
        assert_eq!(more(&mut unpaged, 2, false), None);
    }

    #[test]
    fn max_results_and_tokens_are_validated() {
        assert!(matches!(
            page(None, Some(0)),
            Err(SqsError::InvalidParameterValue { .. })
        ));
        assert!(matches!(
            page(None, Some(1_001)),
            Err(SqsError::InvalidParameterValue { .. })
        ));
        assert!(matches!(
            page(Some("!!"), None),
            Err(SqsError::InvalidParameterValue { .. })
        ));
        assert_eq!(page(None, None).unwrap().1, 1_000);
    }
}
