//! The gRPC edge: `trireme.v1.QueueService` over the engine. Wire types stop here: every request
//! is validated and converted into core types (the field and its limit named in each refusal),
//! and every answer is built from core types. One span per request carries the queue, where
//! there is one the message id, and the request's trace id (`crate::trace`), which the answer's
//! `trireme-trace-id` header gives back.
//!
//! This module must never hold queue state or decide queue semantics; it only translates and
//! calls the engine.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::http;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span, debug, field, info_span};
use trireme_core::{
    AttributeChanges, AttributeValue, Command, DedupId, Delivery, MessageId, Outcome,
    QueueAttributes, QueueName, QueueView, ReceiptHandle, RedriveAllow, RedrivePolicy,
    limits as core_limits, message_size_bytes,
};
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_server::QueueService;

use crate::backend::Backend;
use crate::engine::EngineError;
use crate::limits;
use crate::metrics::{Api, OperationMetrics, RequestMetrics};
use crate::redrive::{RedriveProgress, RedriveStatus};
use crate::sqs::body_md5;
use crate::status::{self, FieldError};
use crate::trace;

/// The gRPC service of one node.
#[derive(Clone, Debug)]
pub struct GrpcService {
    backend: Backend,
}

impl GrpcService {
    /// The service over `backend`.
    #[must_use]
    pub fn new(backend: Backend) -> Self {
        GrpcService { backend }
    }

    fn server(self) -> pb::queue_service_server::QueueServiceServer<GrpcService> {
        pb::queue_service_server::QueueServiceServer::new(self)
    }
}

/// The methods of `trireme.v1.QueueService`, as the request path names them after the service:
/// the metrics' `operation` label takes only these (and `unknown`), never a client's text.
const METHODS: [&str; 20] = [
    "CreateQueue",
    "GetQueue",
    "ListQueues",
    "SetQueueAttributes",
    "DeleteQueue",
    "PurgeQueue",
    "ListDeadLetterSourceQueues",
    "TagQueue",
    "UntagQueue",
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessages",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeVisibility",
    "ChangeVisibilityBatch",
    "DeadLetterMessage",
    "StartRedrive",
    "ListRedrives",
    "CancelRedrive",
];

/// The index in [`METHODS`] of the method a request path (`/trireme.v1.QueueService/SendMessage`)
/// calls, or `METHODS.len()` (`unknown` in the metrics) for any other path.
fn method_index(path: &str) -> usize {
    let method = path
        .strip_prefix('/')
        .and_then(|path| path.split_once('/'))
        .filter(|(service, _)| {
            *service == <pb::queue_service_server::QueueServiceServer<GrpcService> as tonic::server::NamedService>::NAME
        })
        .map_or("", |(_, method)| method);
    METHODS
        .iter()
        .position(|known| *known == method)
        .unwrap_or(METHODS.len())
}

/// Records every gRPC request's latency (to its response headers, which is where a unary
/// call's answer is decided) and, for a refusal, its reason: `trireme-reason` when the status
/// carries one (always one of `status::Reason`'s names), else the gRPC code's name.
#[derive(Clone, Debug)]
pub struct MetricsLayer {
    /// Each of [`METHODS`]' figures, then `unknown`'s, indexed by [`method_index`]: resolved
    /// once, so that a request neither builds nor hashes its labels (BENCHMARKS.md 6r).
    operations: Arc<[OperationMetrics]>,
    trace_ids: trace::TraceIds,
}

impl MetricsLayer {
    /// A layer recording into `requests`, giving each request a trace id (`crate::trace`) from
    /// `trace_ids` unless its client sent one.
    #[must_use]
    pub fn new(requests: &RequestMetrics, trace_ids: trace::TraceIds) -> MetricsLayer {
        let operations = METHODS
            .iter()
            .copied()
            .chain(std::iter::once("unknown"))
            .map(|method| requests.operation(Api::Grpc, method))
            .collect();
        MetricsLayer {
            operations,
            trace_ids,
        }
    }
}

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = Metered<S>;

    fn layer(&self, inner: S) -> Metered<S> {
        Metered {
            inner,
            operations: Arc::clone(&self.operations),
            trace_ids: self.trace_ids.clone(),
        }
    }
}

/// A gRPC service whose requests are recorded (see [`MetricsLayer`]).
#[derive(Clone, Debug)]
pub struct Metered<S> {
    inner: S,
    operations: Arc<[OperationMetrics]>,
    trace_ids: trace::TraceIds,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Metered<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    // Polled in place, not boxed: the service's own future is boxed already (tonic's
    // generated server), which makes it `Unpin`.
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let operation = method_index(request.uri().path());
        let started = tokio::time::Instant::now();
        let trace = self.trace_ids.of_request(request.headers());
        // The handler runs inside the trace's scope (every poll of the answer, and its drop),
        // so its span and every replica call it causes see the request's trace id (`trace`).
        MeteredFuture {
            answer: Some(self.inner.call(request)),
            operations: Arc::clone(&self.operations),
            operation,
            started,
            trace,
        }
    }
}

/// The answer of a [`Metered`] service: the inner service's, run in the request's trace scope,
/// recorded when it is ready and given the `trireme-trace-id` header.
#[derive(Debug)]
pub struct MeteredFuture<F> {
    /// The inner service's answer; `None` once it was ready.
    answer: Option<F>,
    operations: Arc<[OperationMetrics]>,
    /// The index in `operations` of the request's method.
    operation: usize,
    started: tokio::time::Instant,
    trace: trace::TraceId,
}

impl<F, RB, E> Future for MeteredFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let trace = this.trace;
        let answer = this
            .answer
            .as_mut()
            .expect("a metered answer is not polled after it was ready");
        let mut result = ready!(trace::sync_scope(trace, || Pin::new(answer).poll(context)));
        let answer = this.answer.take();
        trace::sync_scope(trace, || drop(answer));
        let reason = match &result {
            Ok(response) => refusal_reason(response.headers()),
            Err(_) => Some("Transport".to_owned()),
        };
        this.operations[this.operation].observe(this.started.elapsed(), reason.as_deref());
        if let Ok(response) = &mut result {
            response
                .headers_mut()
                .insert(trace::TRACE_ID_NAME, trace.header_value());
        }
        Poll::Ready(result)
    }
}

impl<F> Drop for MeteredFuture<F> {
    /// An answer dropped before it was ready (the client went away) is dropped in its trace's
    /// scope, as it ran.
    fn drop(&mut self) {
        if let Some(answer) = self.answer.take() {
            trace::sync_scope(self.trace, || drop(answer));
        }
    }
}

/// The `grpc-status` header, named once rather than parsed on every lookup.
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// The reason of a refused call from its response headers (a refusal is a trailers-only
/// response: its status is in the headers); `None` for an answer.
fn refusal_reason(headers: &http::HeaderMap) -> Option<String> {
    let code = headers
        .get(GRPC_STATUS)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<i32>().ok())
        .map(tonic::Code::from_i32)
        .filter(|code| *code != tonic::Code::Ok)?;
    let reason = headers
        .get(status::REASON_KEY)
        .and_then(|value| value.to_str().ok())
        // Only this node writes it, from `status::Reason`'s names; anything else is not ours.
        .filter(|reason| reason.len() <= 40 && reason.bytes().all(|b| b.is_ascii_alphanumeric()));
    Some(reason.map_or_else(|| format!("{code:?}"), str::to_owned))
}

/// The tonic service with explicit message-size limits.
#[must_use]
pub fn service(
    backend: Backend,
    request_bytes_max: usize,
    response_bytes_max: usize,
) -> pb::queue_service_server::QueueServiceServer<GrpcService> {
    GrpcService::new(backend)
        .server()
        .max_decoding_message_size(request_bytes_max)
        .max_encoding_message_size(response_bytes_max)
}

type GrpcResult<T> = Result<Response<T>, Status>;

fn engine_status(error: &EngineError) -> Status {
    debug!(%error, "refused");
    status::engine_status(error)
}

fn field_status(error: &FieldError) -> Status {
    debug!(%error, "refused at the edge");
    status::field_status(error)
}

fn queue_name(field: &str, name: &str) -> Result<QueueName, FieldError> {
    QueueName::try_from(name).map_err(|reject| FieldError::new(field, reject.to_string()))
}

fn in_range(field: &str, value: u32, min: u32, max: u32) -> Result<u32, FieldError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(FieldError::new(
            field,
            format!("must be {min}–{max}, got {value}"),
        ))
    }
}

fn optional_in_range(
    field: &str,
    value: Option<u32>,
    min: u32,
    max: u32,
) -> Result<Option<u32>, FieldError> {
    value
        .map(|value| in_range(field, value, min, max))
        .transpose()
}

fn redrive_policy(policy: &pb::RedrivePolicy) -> Result<RedrivePolicy, FieldError> {
    Ok(RedrivePolicy {
        dead_letter_queue: queue_name(
            "attributes.redrive_policy.dead_letter_queue",
            &policy.dead_letter_queue,
        )?,
        max_receive_count: in_range(
            "attributes.redrive_policy.max_receive_count",
            policy.max_receive_count,
            core_limits::max_receive_count_min,
            core_limits::max_receive_count_max,
        )?,
    })
}

fn redrive_allow(policy: &pb::RedriveAllowPolicy) -> Result<RedriveAllow, FieldError> {
    use pb::redrive_allow_policy::Permission;
    let field = "attributes.redrive_allow_policy";
    let permission = Permission::try_from(policy.permission).map_err(|_| {
        FieldError::new(
            format!("{field}.permission"),
            format!("unknown permission {}", policy.permission),
        )
    })?;
    let sources_given = !policy.source_queues.is_empty();
    match permission {
        Permission::Unspecified => Err(FieldError::new(
            format!("{field}.permission"),
            "must be ALLOW_ALL, DENY_ALL or BY_QUEUE",
        )),
        Permission::AllowAll | Permission::DenyAll if sources_given => Err(FieldError::new(
            format!("{field}.source_queues"),
            "only BY_QUEUE names source queues",
        )),
        Permission::AllowAll => Ok(RedriveAllow::AllowAll),
        Permission::DenyAll => Ok(RedriveAllow::DenyAll),
        Permission::ByQueue => {
            let max = core_limits::redrive_allow_sources_max;
            if !(1..=max).contains(&policy.source_queues.len()) {
                return Err(FieldError::new(
                    format!("{field}.source_queues"),
                    format!(
                        "BY_QUEUE must name 1–{max} queues, got {}",
                        policy.source_queues.len()
                    ),
                ));
            }
            let sources = policy
                .source_queues
                .iter()
                .enumerate()
                .map(|(index, name)| queue_name(&format!("{field}.source_queues[{index}]"), name))
                .collect::<Result<BTreeSet<_>, _>>()?;
            Ok(RedriveAllow::ByQueue(sources))
        }
    }
}

/// The changes a wire `QueueAttributes` asks for; ranges are checked here with the proto's
/// field names (the core checks them again).
fn attribute_changes(attributes: &pb::QueueAttributes) -> Result<AttributeChanges, FieldError> {
    if attributes.clear_redrive_policy && attributes.redrive_policy.is_some() {
        return Err(FieldError::new(
            "attributes.clear_redrive_policy",
            "cannot be set together with redrive_policy",
        ));
    }
    let redrive = if attributes.clear_redrive_policy {
        Some(None)
    } else {
        attributes
            .redrive_policy
            .as_ref()
            .map(redrive_policy)
            .transpose()?
            .map(Some)
    };
    Ok(AttributeChanges {
        visibility_timeout_s: optional_in_range(
            "attributes.visibility_timeout_seconds",
            attributes.visibility_timeout_seconds,
            0,
            core_limits::visibility_timeout_s_max,
        )?,
        delay_s: optional_in_range(
            "attributes.delay_seconds",
            attributes.delay_seconds,
            0,
            core_limits::delay_s_max,
        )?,
        retention_s: optional_in_range(
            "attributes.retention_seconds",
            attributes.retention_seconds,
            core_limits::retention_s_min,
            core_limits::retention_s_max,
        )?,
        message_bytes_max: optional_in_range(
            "attributes.max_message_bytes",
            attributes.max_message_bytes,
            core_limits::message_bytes_min,
            core_limits::message_bytes_max,
        )?,
        receive_wait_s: optional_in_range(
            "attributes.receive_wait_seconds",
            attributes.receive_wait_seconds,
            0,
            core_limits::wait_s_max,
        )?,
        redrive,
        redrive_allow: attributes
            .redrive_allow_policy
            .as_ref()
            .map(redrive_allow)
            .transpose()?,
        // The policy and encryption settings are the SQS endpoint's; the gRPC API has none.
        ..AttributeChanges::default()
    })
}

fn queue_info(view: QueueView) -> pb::QueueInfo {
    use pb::redrive_allow_policy::Permission;
    let attributes = view.attributes;
    let allow = match attributes.redrive_allow {
        RedriveAllow::AllowAll => pb::RedriveAllowPolicy {
            permission: Permission::AllowAll.into(),
            source_queues: Vec::new(),
        },
        RedriveAllow::DenyAll => pb::RedriveAllowPolicy {
            permission: Permission::DenyAll.into(),
            source_queues: Vec::new(),
        },
        RedriveAllow::ByQueue(sources) => pb::RedriveAllowPolicy {
            permission: Permission::ByQueue.into(),
            source_queues: sources.into_iter().map(String::from).collect(),
        },
    };
    pb::QueueInfo {
        name: view.name.into(),
        attributes: Some(pb::QueueAttributes {
            visibility_timeout_seconds: Some(attributes.visibility_timeout_s),
            delay_seconds: Some(attributes.delay_s),
            retention_seconds: Some(attributes.retention_s),
            max_message_bytes: Some(attributes.message_bytes_max),
            receive_wait_seconds: Some(attributes.receive_wait_s),
            redrive_policy: attributes.redrive.map(|policy| pb::RedrivePolicy {
                dead_letter_queue: policy.dead_letter_queue.into(),
                max_receive_count: policy.max_receive_count,
            }),
            redrive_allow_policy: Some(allow),
            clear_redrive_policy: false,
        }),
        created_at_ms: view.created_at.0,
        modified_at_ms: view.modified_at.0,
        tags: view.tags.into_iter().collect(),
        stats: Some(pb::QueueStats {
            ready: view.counts.ready,
            in_flight: view.counts.in_flight,
            delayed: view.counts.delayed,
        }),
    }
}

fn message_attributes(
    field: &str,
    attributes: std::collections::HashMap<String, pb::MessageAttribute>,
) -> Result<BTreeMap<String, AttributeValue>, FieldError> {
    use pb::message_attribute::Value;
    let max = core_limits::message_attributes_max;
    if attributes.len() > max {
        return Err(FieldError::new(
            field,
            format!("at most {max} attributes, got {}", attributes.len()),
        ));
    }
    attributes
        .into_iter()
        .map(|(name, attribute)| {
            let value = match attribute.value {
                Some(Value::StringValue(value)) => {
                    let base = attribute.data_type.split('.').next().unwrap_or_default();
                    if base == "Number" && !value.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                        return Err(FieldError::new(
                            format!("{field}[{name:?}].string_value"),
                            format!("{value:?} is not a number, as data type Number requires"),
                        ));
                    }
                    AttributeValue::String {
                        data_type: attribute.data_type,
                        value,
                    }
                }
                Some(Value::BinaryValue(value)) => AttributeValue::Binary {
                    data_type: attribute.data_type,
                    value,
                },
                None => {
                    return Err(FieldError::new(
                        format!("{field}[{name:?}]"),
                        "needs string_value or binary_value",
                    ));
                }
            };
            Ok((name, value))
        })
        .collect()
}

fn pb_attributes(
    attributes: BTreeMap<String, AttributeValue>,
) -> std::collections::HashMap<String, pb::MessageAttribute> {
    use pb::message_attribute::Value;
    attributes
        .into_iter()
        .map(|(name, value)| {
            let attribute = match value {
                AttributeValue::String { data_type, value } => pb::MessageAttribute {
                    data_type,
                    value: Some(Value::StringValue(value)),
                },
                AttributeValue::Binary { data_type, value } => pb::MessageAttribute {
                    data_type,
                    value: Some(Value::BinaryValue(value)),
                },
            };
            (name, attribute)
        })
        .collect()
}

fn dedup_id(field: &str, id: Option<String>) -> Result<Option<DedupId>, FieldError> {
    id.map(|id| DedupId::try_from(id).map_err(|reject| FieldError::new(field, reject.to_string())))
        .transpose()
}

/// A send as the core sees it, built from one wire send.
struct SendParts {
    body: String,
    attributes: BTreeMap<String, AttributeValue>,
    delay_s: Option<u32>,
    dedup: Option<DedupId>,
}

fn send_parts(
    prefix: &str,
    body: String,
    attributes: std::collections::HashMap<String, pb::MessageAttribute>,
    delay_seconds: Option<u32>,
    deduplication_id: Option<String>,
) -> Result<SendParts, FieldError> {
    let attributes = message_attributes(&format!("{prefix}attributes"), attributes)?;
    let size_bytes = message_size_bytes(&body, &attributes);
    if size_bytes > u64::from(core_limits::message_bytes_max) {
        return Err(FieldError::new(
            format!("{prefix}body"),
            format!(
                "body and attributes are {size_bytes} bytes, at most {} are allowed",
                core_limits::message_bytes_max
            ),
        ));
    }
    Ok(SendParts {
        body,
        attributes,
        delay_s: optional_in_range(
            &format!("{prefix}delay_seconds"),
            delay_seconds,
            0,
            core_limits::delay_s_max,
        )?,
        dedup: dedup_id(&format!("{prefix}deduplication_id"), deduplication_id)?,
    })
}

/// Checks the entry ids of a batch: 1–10 entries, each id 1–80 of `[A-Za-z0-9_-]`, distinct.
fn check_batch_ids<'a>(ids: impl ExactSizeIterator<Item = &'a str>) -> Result<(), FieldError> {
    let max = core_limits::batch_entries_max as usize;
    let count = ids.len();
    if !(1..=max).contains(&count) {
        return Err(FieldError::new(
            "entries",
            format!("a batch holds 1–{max} entries, got {count}"),
        ));
    }
    let mut seen = HashSet::with_capacity(count);
    for (index, id) in ids.enumerate() {
        let legal = (1..=limits::batch_entry_id_chars_max).contains(&id.len())
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !legal {
            return Err(FieldError::new(
                format!("entries[{index}].id"),
                format!("must be 1–80 of A-Z, a-z, 0-9, '_', '-', got {id:?}"),
            ));
        }
        if !seen.insert(id) {
            return Err(FieldError::new(
                format!("entries[{index}].id"),
                format!("{id:?} appears twice; entry ids must be distinct"),
            ));
        }
    }
    Ok(())
}

fn page_size(field: &str, requested: u32, max: u32, zero_means: u32) -> Result<usize, FieldError> {
    let size = if requested == 0 {
        zero_means
    } else {
        requested
    };
    let size = in_range(field, size, 1, max)?;
    Ok(usize::try_from(size).expect("a u32 fits usize on every supported target"))
}

fn page_token(token: &str) -> Result<Option<QueueName>, FieldError> {
    if token.is_empty() {
        Ok(None)
    } else {
        queue_name("page_token", token).map(Some)
    }
}

/// The size and start of a page of queue names: `max_results` 1 to the listing maximum (0:
/// the maximum), and the token (empty: from the start).
fn queue_page_request(
    max_results: u32,
    page_token: &str,
) -> Result<(usize, Option<QueueName>), FieldError> {
    let limit = page_size(
        "max_results",
        max_results,
        limits::list_queues_results_max,
        limits::list_queues_results_max,
    )?;
    Ok((limit, self::page_token(page_token)?))
}

/// One page of names out of `names`, fetched one longer than `limit` to learn whether another
/// page follows; the token is then the page's last name, and empty otherwise.
fn queue_page(mut names: Vec<QueueName>, limit: usize) -> (Vec<String>, String) {
    let next_page_token = if names.len() > limit {
        names.truncate(limit);
        names
            .last()
            .map(|name| name.as_str().to_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    (
        names.into_iter().map(String::from).collect(),
        next_page_token,
    )
}

impl GrpcService {
    fn received(&self, deliveries: Vec<Delivery>) -> pb::ReceiveMessagesResponse {
        let handles = self.backend.handles();
        pb::ReceiveMessagesResponse {
            messages: deliveries
                .into_iter()
                .map(|delivery| {
                    tracing::trace!(message_id = %delivery.message, receive_count = delivery.receive_count, "delivered");
                    pb::ReceivedMessage {
                        message_id: delivery.message.to_string(),
                        receipt_handle: handles.encode(&delivery.handle),
                        md5_of_body: body_md5(&delivery.body),
                        body: delivery.body,
                        attributes: pb_attributes(delivery.attributes),
                        receive_count: delivery.receive_count,
                        sent_at_ms: delivery.sent_at.0,
                        first_receive_at_ms: delivery.first_receive_at.0,
                        dead_letter_source: delivery.source.map(String::from),
                    }
                })
                .collect(),
        }
    }

    async fn existing_queue(&self, name: &QueueName) -> Result<QueueView, Status> {
        self.backend
            .queue(name)
            .await
            .map_err(|error| engine_status(&error))?
            .ok_or_else(|| {
                engine_status(&EngineError::Rejected(
                    trireme_core::Reject::QueueNotFound { name: name.clone() },
                ))
            })
    }

    async fn command(&self, command: Command) -> Result<Outcome, Status> {
        self.backend
            .execute(command)
            .await
            .map_err(|error| engine_status(&error))
    }

    /// Decodes the `receipt_handle` field and records its message id on the request's span.
    fn receipt_handle(&self, encoded: &str) -> Result<ReceiptHandle, Status> {
        let handle = self
            .backend
            .handles()
            .decode(encoded)
            .map_err(|error| status::handle_status("receipt_handle", &error))?;
        Span::current().record("message_id", field::display(handle.message));
        Ok(handle)
    }

    /// Runs a delete or visibility batch: entries refused at the edge go to `failed` as they
    /// are; the others execute together (they then share one group commit) and each entry id
    /// is filed under `successful` or `failed`.
    async fn run_id_batch(
        &self,
        prepared: Vec<(String, Result<Command, pb::BatchEntryError>)>,
        successful: &mut Vec<String>,
        failed: &mut Vec<pb::BatchEntryError>,
    ) {
        let mut ids = Vec::new();
        let mut commands = Vec::new();
        for (id, command) in prepared {
            match command {
                Ok(command) => {
                    ids.push(id);
                    commands.push(command);
                }
                Err(refusal) => failed.push(refusal),
            }
        }
        let results = self.backend.execute_all(commands).await;
        for (id, result) in ids.into_iter().zip(results) {
            match result {
                Ok(Outcome::Deleted { .. } | Outcome::VisibilityChanged) => successful.push(id),
                Ok(other) => unreachable!(
                    "Delete and ChangeVisibility answer with their own outcomes, got {other:?}"
                ),
                Err(error) => failed.push(status::engine_entry_error(&id, &error)),
            }
        }
    }
}

/// The request's span: its RPC, queue, message id (once known) and trace id (`trace`).
fn request_span(rpc: &'static str, queue: &str) -> Span {
    let trace_id = trace::current().map(field::display);
    info_span!("request", rpc, queue, message_id = field::Empty, trace_id)
}

fn redrive_task(progress: RedriveProgress) -> pb::RedriveTask {
    use pb::redrive_task::Status as TaskStatus;
    let (status, failure_reason) = match progress.status {
        RedriveStatus::Running => (TaskStatus::Running, String::new()),
        RedriveStatus::Completed => (TaskStatus::Completed, String::new()),
        RedriveStatus::Cancelling => (TaskStatus::Cancelling, String::new()),
        RedriveStatus::Cancelled => (TaskStatus::Cancelled, String::new()),
        RedriveStatus::Failed(failure) => (TaskStatus::Failed, failure.to_string()),
    };
    pb::RedriveTask {
        task_handle: progress.handle,
        source_queue: progress.from.into(),
        destination_queue: progress.to.map(String::from),
        status: status.into(),
        max_messages_per_second: progress.rate_per_s.unwrap_or(0),
        moved: progress.moved,
        failed: progress.failed,
        to_move: progress.to_move,
        started_at_ms: progress.started_at.0,
        failure_reason,
    }
}

#[tonic::async_trait]
impl QueueService for GrpcService {
    async fn create_queue(
        &self,
        request: Request<pb::CreateQueueRequest>,
    ) -> GrpcResult<pb::CreateQueueResponse> {
        let request = request.into_inner();
        let span = request_span("CreateQueue", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            let changes = request
                .attributes
                .as_ref()
                .map(attribute_changes)
                .transpose()
                .map_err(|e| field_status(&e))?
                .unwrap_or_default();
            if changes.redrive == Some(None) {
                return Err(field_status(&FieldError::new(
                    "attributes.clear_redrive_policy",
                    "only SetQueueAttributes removes a redrive policy",
                )));
            }
            let attributes = QueueAttributes::default().with(&changes);
            let outcome = self
                .command(Command::CreateQueue {
                    name: name.clone(),
                    attributes,
                    tags: request.tags.into_iter().collect(),
                })
                .await?;
            let Outcome::QueueCreated { created } = outcome else {
                unreachable!("CreateQueue answers QueueCreated, got {outcome:?}");
            };
            let view = self.existing_queue(&name).await?;
            debug!(created, "queue created");
            Ok(Response::new(pb::CreateQueueResponse {
                queue: Some(queue_info(view)),
                created,
            }))
        }
        .instrument(span)
        .await
    }

    async fn get_queue(
        &self,
        request: Request<pb::GetQueueRequest>,
    ) -> GrpcResult<pb::GetQueueResponse> {
        let request = request.into_inner();
        let span = request_span("GetQueue", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            let view = self.existing_queue(&name).await?;
            Ok(Response::new(pb::GetQueueResponse {
                queue: Some(queue_info(view)),
            }))
        }
        .instrument(span)
        .await
    }

    async fn list_queues(
        &self,
        request: Request<pb::ListQueuesRequest>,
    ) -> GrpcResult<pb::ListQueuesResponse> {
        let request = request.into_inner();
        let span = request_span("ListQueues", "");
        async move {
            let (limit, after) = queue_page_request(request.max_results, &request.page_token)
                .map_err(|e| field_status(&e))?;
            if request.prefix.len() > core_limits::queue_name_chars_max {
                return Err(field_status(&FieldError::new(
                    "prefix",
                    format!(
                        "at most {} characters, got {}",
                        core_limits::queue_name_chars_max,
                        request.prefix.len()
                    ),
                )));
            }
            // One more than asked tells whether another page exists.
            let names = self
                .backend
                .list_queues(request.prefix, after, limit + 1)
                .await
                .map_err(|error| engine_status(&error))?;
            let (names, next_page_token) = queue_page(names, limit);
            Ok(Response::new(pb::ListQueuesResponse {
                names,
                next_page_token,
            }))
        }
        .instrument(span)
        .await
    }

    async fn set_queue_attributes(
        &self,
        request: Request<pb::SetQueueAttributesRequest>,
    ) -> GrpcResult<pb::SetQueueAttributesResponse> {
        let request = request.into_inner();
        let span = request_span("SetQueueAttributes", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            let changes = request
                .attributes
                .as_ref()
                .map(attribute_changes)
                .transpose()
                .map_err(|e| field_status(&e))?
                .unwrap_or_default();
            self.command(Command::SetQueueAttributes {
                name: name.clone(),
                changes,
            })
            .await?;
            let view = self.existing_queue(&name).await?;
            Ok(Response::new(pb::SetQueueAttributesResponse {
                queue: Some(queue_info(view)),
            }))
        }
        .instrument(span)
        .await
    }

    async fn delete_queue(
        &self,
        request: Request<pb::DeleteQueueRequest>,
    ) -> GrpcResult<pb::DeleteQueueResponse> {
        let request = request.into_inner();
        let span = request_span("DeleteQueue", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            self.command(Command::DeleteQueue { name }).await?;
            Ok(Response::new(pb::DeleteQueueResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn purge_queue(
        &self,
        request: Request<pb::PurgeQueueRequest>,
    ) -> GrpcResult<pb::PurgeQueueResponse> {
        let request = request.into_inner();
        let span = request_span("PurgeQueue", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            self.command(Command::PurgeQueue { name }).await?;
            Ok(Response::new(pb::PurgeQueueResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn list_dead_letter_source_queues(
        &self,
        request: Request<pb::ListDeadLetterSourceQueuesRequest>,
    ) -> GrpcResult<pb::ListDeadLetterSourceQueuesResponse> {
        let request = request.into_inner();
        let span = request_span("ListDeadLetterSourceQueues", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            let (limit, after) = queue_page_request(request.max_results, &request.page_token)
                .map_err(|e| field_status(&e))?;
            self.existing_queue(&name).await?;
            let sources = self
                .backend
                .dead_letter_sources(&name)
                .await
                .map_err(|error| engine_status(&error))?;
            let page: Vec<QueueName> = sources
                .into_iter()
                .filter(|source| after.as_ref().is_none_or(|after| source > after))
                .take(limit + 1)
                .collect();
            let (names, next_page_token) = queue_page(page, limit);
            Ok(Response::new(pb::ListDeadLetterSourceQueuesResponse {
                names,
                next_page_token,
            }))
        }
        .instrument(span)
        .await
    }

    async fn tag_queue(
        &self,
        request: Request<pb::TagQueueRequest>,
    ) -> GrpcResult<pb::TagQueueResponse> {
        let request = request.into_inner();
        let span = request_span("TagQueue", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            self.command(Command::TagQueue {
                name,
                tags: request.tags.into_iter().collect(),
            })
            .await?;
            Ok(Response::new(pb::TagQueueResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn untag_queue(
        &self,
        request: Request<pb::UntagQueueRequest>,
    ) -> GrpcResult<pb::UntagQueueResponse> {
        let request = request.into_inner();
        let span = request_span("UntagQueue", &request.name);
        async move {
            let name = queue_name("name", &request.name).map_err(|e| field_status(&e))?;
            self.command(Command::UntagQueue {
                name,
                keys: request.keys.into_iter().collect(),
            })
            .await?;
            Ok(Response::new(pb::UntagQueueResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> GrpcResult<pb::SendMessageResponse> {
        let request = request.into_inner();
        let span = request_span("SendMessage", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            let parts = send_parts(
                "",
                request.body,
                request.attributes,
                request.delay_seconds,
                request.deduplication_id,
            )
            .map_err(|e| field_status(&e))?;
            let id = self.backend.new_message_id();
            let md5_of_body = body_md5(&parts.body);
            let outcome = self
                .command(Command::Send {
                    queue,
                    id,
                    body: parts.body,
                    attributes: parts.attributes,
                    system: Default::default(),
                    delay_s: parts.delay_s,
                    dedup: parts.dedup,
                })
                .await?;
            let Outcome::Sent { id, duplicate } = outcome else {
                unreachable!("Send answers Sent, got {outcome:?}");
            };
            Span::current().record("message_id", field::display(id));
            debug!(duplicate, "sent");
            Ok(Response::new(pb::SendMessageResponse {
                message_id: id.to_string(),
                duplicate,
                md5_of_body,
            }))
        }
        .instrument(span)
        .await
    }

    async fn send_message_batch(
        &self,
        request: Request<pb::SendMessageBatchRequest>,
    ) -> GrpcResult<pb::SendMessageBatchResponse> {
        let request = request.into_inner();
        let span = request_span("SendMessageBatch", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            check_batch_ids(request.entries.iter().map(|entry| entry.id.as_str()))
                .map_err(|e| field_status(&e))?;
            let payload_bytes: u64 = request
                .entries
                .iter()
                .map(|entry| {
                    entry.body.len() as u64
                        + entry
                            .attributes
                            .iter()
                            .map(|(name, attribute)| {
                                let value_bytes = match &attribute.value {
                                    Some(pb::message_attribute::Value::StringValue(value)) => {
                                        value.len()
                                    }
                                    Some(pb::message_attribute::Value::BinaryValue(value)) => {
                                        value.len()
                                    }
                                    None => 0,
                                };
                                (name.len() + attribute.data_type.len() + value_bytes) as u64
                            })
                            .sum::<u64>()
                })
                .sum();
            if payload_bytes > limits::batch_payload_bytes_max {
                return Err(field_status(&FieldError::new(
                    "entries",
                    format!(
                        "the batch's bodies and attributes are {payload_bytes} bytes, at most {} are allowed",
                        limits::batch_payload_bytes_max
                    ),
                )));
            }
            let mut response = pb::SendMessageBatchResponse::default();
            let mut commands = Vec::new();
            let mut accepted = Vec::new();
            for (index, entry) in request.entries.into_iter().enumerate() {
                let prefix = format!("entries[{index}].");
                match send_parts(
                    &prefix,
                    entry.body,
                    entry.attributes,
                    entry.delay_seconds,
                    entry.deduplication_id,
                ) {
                    Err(error) => response
                        .failed
                        .push(status::field_entry_error(&entry.id, &error)),
                    Ok(parts) => {
                        accepted.push((entry.id, body_md5(&parts.body)));
                        commands.push(Command::Send {
                            queue: queue.clone(),
                            id: self.backend.new_message_id(),
                            body: parts.body,
                            attributes: parts.attributes,
                            system: Default::default(),
                            delay_s: parts.delay_s,
                            dedup: parts.dedup,
                        });
                    }
                }
            }
            // Entries stored in the same millisecond tie by message id: ids drawn in increasing
            // entry order keep the batch in entry order when it is received.
            let mut ids: Vec<MessageId> = commands
                .iter()
                .filter_map(|command| match command {
                    Command::Send { id, .. } => Some(*id),
                    _ => None,
                })
                .collect();
            ids.sort_unstable();
            for (command, drawn) in commands.iter_mut().zip(ids) {
                if let Command::Send { id, .. } = command {
                    *id = drawn;
                }
            }
            // All entries go to the engine before any answer is awaited: one group commit.
            let results = self.backend.execute_all(commands).await;
            for ((entry_id, md5_of_body), result) in accepted.into_iter().zip(results) {
                match result {
                    Ok(Outcome::Sent { id, duplicate }) => {
                        response.successful.push(pb::SendMessageBatchResult {
                            id: entry_id,
                            message_id: id.to_string(),
                            duplicate,
                            md5_of_body,
                        });
                    }
                    Ok(other) => unreachable!("Send answers Sent, got {other:?}"),
                    Err(EngineError::Rejected(trireme_core::Reject::QueueNotFound { name })) => {
                        // A missing queue fails the whole request, as in SQS.
                        return Err(engine_status(&EngineError::Rejected(
                            trireme_core::Reject::QueueNotFound { name },
                        )));
                    }
                    Err(error) => response
                        .failed
                        .push(status::engine_entry_error(&entry_id, &error)),
                }
            }
            debug!(
                sent = response.successful.len(),
                failed = response.failed.len(),
                "batch sent"
            );
            Ok(Response::new(response))
        }
        .instrument(span)
        .await
    }

    async fn receive_messages(
        &self,
        request: Request<pb::ReceiveMessagesRequest>,
    ) -> GrpcResult<pb::ReceiveMessagesResponse> {
        let request = request.into_inner();
        let span = request_span("ReceiveMessages", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            let max = if request.max_messages == 0 {
                1
            } else {
                request.max_messages
            };
            let max = in_range("max_messages", max, 1, core_limits::batch_entries_max)
                .map_err(|e| field_status(&e))?;
            let visibility_s = optional_in_range(
                "visibility_timeout_seconds",
                request.visibility_timeout_seconds,
                0,
                core_limits::visibility_timeout_s_max,
            )
            .map_err(|e| field_status(&e))?;
            let wait_s = optional_in_range(
                "wait_seconds",
                request.wait_seconds,
                0,
                core_limits::wait_s_max,
            )
            .map_err(|e| field_status(&e))?;
            let deliveries = self
                .backend
                .receive(queue, max, visibility_s, wait_s)
                .await
                .map_err(|error| engine_status(&error))?;
            debug!(delivered = deliveries.len(), "received");
            Ok(Response::new(self.received(deliveries)))
        }
        .instrument(span)
        .await
    }

    async fn delete_message(
        &self,
        request: Request<pb::DeleteMessageRequest>,
    ) -> GrpcResult<pb::DeleteMessageResponse> {
        let request = request.into_inner();
        let span = request_span("DeleteMessage", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            let handle = self.receipt_handle(&request.receipt_handle)?;
            let outcome = self.command(Command::Delete { queue, handle }).await?;
            let Outcome::Deleted { already_gone } = outcome else {
                unreachable!("Delete answers Deleted, got {outcome:?}");
            };
            debug!(already_gone, "deleted");
            Ok(Response::new(pb::DeleteMessageResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn dead_letter_message(
        &self,
        request: Request<pb::DeadLetterMessageRequest>,
    ) -> GrpcResult<pb::DeadLetterMessageResponse> {
        let request = request.into_inner();
        let span = request_span("DeadLetterMessage", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            let handle = self.receipt_handle(&request.receipt_handle)?;
            let outcome = self
                .command(Command::DeadLetterNow { queue, handle })
                .await?;
            let Outcome::DeadLettered { dead_letter_queue } = outcome else {
                unreachable!("DeadLetterNow answers DeadLettered, got {outcome:?}");
            };
            debug!(%dead_letter_queue, "dead-lettered now");
            Ok(Response::new(pb::DeadLetterMessageResponse {
                dead_letter_queue: dead_letter_queue.to_string(),
            }))
        }
        .instrument(span)
        .await
    }

    async fn delete_message_batch(
        &self,
        request: Request<pb::DeleteMessageBatchRequest>,
    ) -> GrpcResult<pb::DeleteMessageBatchResponse> {
        let request = request.into_inner();
        let span = request_span("DeleteMessageBatch", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            check_batch_ids(request.entries.iter().map(|entry| entry.id.as_str()))
                .map_err(|e| field_status(&e))?;
            let prepared = request.entries.into_iter().map(|entry| {
                let command = self
                    .backend
                    .handles()
                    .decode(&entry.receipt_handle)
                    .map(|handle| Command::Delete {
                        queue: queue.clone(),
                        handle,
                    })
                    .map_err(|error| status::handle_entry_error(&entry.id, &error));
                (entry.id, command)
            });
            let mut response = pb::DeleteMessageBatchResponse::default();
            self.run_id_batch(
                prepared.collect(),
                &mut response.successful,
                &mut response.failed,
            )
            .await;
            Ok(Response::new(response))
        }
        .instrument(span)
        .await
    }

    async fn change_visibility(
        &self,
        request: Request<pb::ChangeVisibilityRequest>,
    ) -> GrpcResult<pb::ChangeVisibilityResponse> {
        let request = request.into_inner();
        let span = request_span("ChangeVisibility", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            let timeout_s = in_range(
                "visibility_timeout_seconds",
                request.visibility_timeout_seconds,
                0,
                core_limits::visibility_timeout_s_max,
            )
            .map_err(|e| field_status(&e))?;
            let handle = self.receipt_handle(&request.receipt_handle)?;
            self.command(Command::ChangeVisibility {
                queue,
                handle,
                timeout_s,
            })
            .await?;
            Ok(Response::new(pb::ChangeVisibilityResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn change_visibility_batch(
        &self,
        request: Request<pb::ChangeVisibilityBatchRequest>,
    ) -> GrpcResult<pb::ChangeVisibilityBatchResponse> {
        let request = request.into_inner();
        let span = request_span("ChangeVisibilityBatch", &request.queue);
        async move {
            let queue = queue_name("queue", &request.queue).map_err(|e| field_status(&e))?;
            check_batch_ids(request.entries.iter().map(|entry| entry.id.as_str()))
                .map_err(|e| field_status(&e))?;
            let prepared = request
                .entries
                .into_iter()
                .enumerate()
                .map(|(index, entry)| {
                    let command = in_range(
                        &format!("entries[{index}].visibility_timeout_seconds"),
                        entry.visibility_timeout_seconds,
                        0,
                        core_limits::visibility_timeout_s_max,
                    )
                    .map_err(|error| status::field_entry_error(&entry.id, &error))
                    .and_then(|timeout_s| {
                        let handle = self
                            .backend
                            .handles()
                            .decode(&entry.receipt_handle)
                            .map_err(|error| status::handle_entry_error(&entry.id, &error))?;
                        Ok(Command::ChangeVisibility {
                            queue: queue.clone(),
                            handle,
                            timeout_s,
                        })
                    });
                    (entry.id, command)
                });
            let mut response = pb::ChangeVisibilityBatchResponse::default();
            self.run_id_batch(
                prepared.collect(),
                &mut response.successful,
                &mut response.failed,
            )
            .await;
            Ok(Response::new(response))
        }
        .instrument(span)
        .await
    }

    async fn start_redrive(
        &self,
        request: Request<pb::StartRedriveRequest>,
    ) -> GrpcResult<pb::StartRedriveResponse> {
        let request = request.into_inner();
        let span = request_span("StartRedrive", &request.source_queue);
        async move {
            let from =
                queue_name("source_queue", &request.source_queue).map_err(|e| field_status(&e))?;
            let to = request
                .destination_queue
                .as_deref()
                .map(|name| queue_name("destination_queue", name))
                .transpose()
                .map_err(|e| field_status(&e))?;
            let rate = match request.max_messages_per_second {
                0 => None,
                rate => Some(
                    in_range(
                        "max_messages_per_second",
                        rate,
                        1,
                        limits::redrive_rate_per_s_max,
                    )
                    .map_err(|e| field_status(&e))?,
                ),
            };
            let task_handle = self
                .backend
                // The API's tokens are not limited to queues: the task is not either.
                .start_move_task(from, to, rate, None)
                .await
                .map_err(|error| status::redrive_status(&error))?;
            Ok(Response::new(pb::StartRedriveResponse { task_handle }))
        }
        .instrument(span)
        .await
    }

    async fn list_redrives(
        &self,
        request: Request<pb::ListRedrivesRequest>,
    ) -> GrpcResult<pb::ListRedrivesResponse> {
        let request = request.into_inner();
        let span = request_span("ListRedrives", &request.source_queue);
        async move {
            let from =
                queue_name("source_queue", &request.source_queue).map_err(|e| field_status(&e))?;
            let limit = page_size(
                "max_results",
                request.max_results,
                limits::list_redrives_results_max,
                1,
            )
            .map_err(|e| field_status(&e))?;
            let tasks = self
                .backend
                .list_move_tasks(&from, limit)
                .await
                .map_err(|error| engine_status(&error))?;
            Ok(Response::new(pb::ListRedrivesResponse {
                tasks: tasks.into_iter().map(redrive_task).collect(),
            }))
        }
        .instrument(span)
        .await
    }

    async fn cancel_redrive(
        &self,
        request: Request<pb::CancelRedriveRequest>,
    ) -> GrpcResult<pb::CancelRedriveResponse> {
        let request = request.into_inner();
        let span = request_span("CancelRedrive", "");
        async move {
            let moved = self
                .backend
                .cancel_move_task(&request.task_handle)
                .await
                .map_err(|error| status::redrive_status(&error))?;
            Ok(Response::new(pb::CancelRedriveResponse { moved }))
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_the_sqs_example() {
        assert_eq!(body_md5("hello"), "5d41402abc4b2a76b9719d911017c592");
    }

    #[test]
    fn batch_ids_must_be_1_to_10_distinct_and_legal() {
        assert!(check_batch_ids(["a", "b-1", "c_2"].into_iter()).is_ok());
        let error = check_batch_ids(std::iter::empty()).unwrap_err();
        assert_eq!(error.field, "entries");
        let eleven: Vec<String> = (0..11).map(|i| format!("e{i}")).collect();
        assert!(check_batch_ids(eleven.iter().map(String::as_str)).is_err());
        let error = check_batch_ids(["a", "a"].into_iter()).unwrap_err();
        assert_eq!(error.field, "entries[1].id");
        let error = check_batch_ids(["ok", "no space"].into_iter()).unwrap_err();
        assert_eq!(error.field, "entries[1].id");
    }

    #[test]
    fn attribute_changes_name_the_field_out_of_range() {
        let attributes = pb::QueueAttributes {
            visibility_timeout_seconds: Some(43_201),
            ..Default::default()
        };
        let error = attribute_changes(&attributes).unwrap_err();
        assert_eq!(error.field, "attributes.visibility_timeout_seconds");
        assert!(error.reason.contains("0–43200"), "{}", error.reason);
        let attributes = pb::QueueAttributes {
            redrive_policy: Some(pb::RedrivePolicy {
                dead_letter_queue: "dlq".to_owned(),
                max_receive_count: 0,
            }),
            ..Default::default()
        };
        let error = attribute_changes(&attributes).unwrap_err();
        assert_eq!(error.field, "attributes.redrive_policy.max_receive_count");
    }

    #[test]
    fn number_attribute_must_hold_a_number() {
        let attribute = |value: &str| pb::MessageAttribute {
            data_type: "Number.int".to_owned(),
            value: Some(pb::message_attribute::Value::StringValue(value.to_owned())),
        };
        let ok = [("n".to_owned(), attribute("-12.5e3"))].into();
        assert!(message_attributes("attributes", ok).is_ok());
        let bad = [("n".to_owned(), attribute("twelve"))].into();
        let error = message_attributes("attributes", bad).unwrap_err();
        assert_eq!(error.field, "attributes[\"n\"].string_value");
    }

    #[test]
    fn page_size_zero_takes_the_default_and_over_max_is_refused() {
        assert_eq!(page_size("max_results", 0, 1_000, 1_000).unwrap(), 1_000);
        assert_eq!(page_size("max_results", 7, 10, 1).unwrap(), 7);
        assert!(page_size("max_results", 11, 10, 1).is_err());
    }
}
