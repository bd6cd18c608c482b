//! The SQS-compatible HTTP endpoint: AWS JSON 1.0 (`POST` with `X-Amz-Target:
//! AmazonSQS.<Action>`), on `/` and on any queue path, so that code written against the AWS SDKs
//! and CLI runs against Trireme with only the endpoint URL changed.
//!
//! This module owns the wire: request parsing, SigV4 verification, queue URLs and ARNs, MD5
//! digests, attribute names, and the translation of every refusal into SQS's error shapes
//! (`error.rs`, the only place that does it). It never holds queue state: every action becomes
//! `Command`s and queries on the node's `Engine`, whose answers are final once durable.

mod actions;
mod address;
mod attributes;
mod digest;
mod error;
mod limits;
mod messages;
mod move_task;
mod permissions;
mod redrive_policy;
/// Public for the fuzz targets (`fuzz/`), which verify arbitrary requests with it.
pub mod sigv4;

/// The body digest both endpoints report (`MD5OfMessageBody`, gRPC `md5_of_body`): one
/// implementation, tested against SQS's vectors in `digest`.
pub(crate) use digest::body_md5;
/// SQS's code for a core refusal, for the gRPC endpoint's batch entries: one table for both.
pub(crate) use error::{reject_code, throttled_code};
mod wire;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Instrument, debug, debug_span, info, warn};
use trireme_core::QueueName;

use crate::backend::Backend;
use crate::metrics::{Api, RequestMetrics};
use crate::trace::{self, TraceIds};
use address::{AddressError, Addresses};
use error::{Invalid, JSON_CONTENT_TYPE, SqsError};
pub use sigv4::AccessKey;

/// The SQS endpoint's settings, from the node configuration.
#[derive(Clone, Debug)]
pub struct SqsSettings {
    /// The host name clients use to reach this node; it goes into every queue URL.
    pub advertised_host: String,
    /// The port clients use to reach this node's SQS listener.
    pub advertised_port: u16,
    /// The region in queue ARNs.
    pub region: String,
    /// The account id in queue URLs and ARNs.
    pub account_id: String,
    /// Access keys whose SigV4 signatures are accepted. Empty: requests are not authenticated
    /// (signed or not), as local SQS emulators do.
    pub access_keys: Vec<AccessKey>,
    /// Where the endpoint records each request's latency and refusal (the node's metrics).
    pub requests: RequestMetrics,
    /// Where requests without a client's trace id get one (the node's stream).
    pub trace_ids: TraceIds,
}

impl Default for SqsSettings {
    fn default() -> Self {
        SqsSettings {
            advertised_host: "localhost".to_owned(),
            advertised_port: 9324,
            region: "us-east-1".to_owned(),
            account_id: "000000000000".to_owned(),
            access_keys: Vec::new(),
            requests: RequestMetrics::default(),
            trace_ids: TraceIds::default(),
        }
    }
}

/// Shared by every request of one endpoint.
struct Sqs {
    backend: Backend,
    /// The endpoint's addresses in the node's own region; each request sees them from its
    /// region ([`Call`]).
    home: Addresses,
    access_keys: Vec<AccessKey>,
    requests: RequestMetrics,
    /// Fresh trace ids (`crate::trace`).
    trace_ids: TraceIds,
}

/// One request as its action's handler sees the endpoint: everything of [`Sqs`], with the
/// addresses of the region the request was signed for (spec/queue-core.md, *Queues per region
/// are names with a region suffix*).
struct Call<'a> {
    sqs: &'a Sqs,
    addresses: Addresses,
    /// The access key that signed the request when it is limited to queues by name prefix
    /// (`None`: any queue). Every queue name a request gives reaches its action through
    /// [`Call::queue_from_url`], [`Call::queue_from_arn`] or [`Call::allowed`], which check it.
    scope: Option<AccessKey>,
}

impl std::ops::Deref for Call<'_> {
    type Target = Sqs;

    fn deref(&self) -> &Sqs {
        self.sqs
    }
}

/// The SQS endpoint as an axum router. Every path accepts `POST`; the action comes from
/// `X-Amz-Target`. Logs at startup whether requests are authenticated.
pub fn router(backend: Backend, settings: SqsSettings) -> Router {
    if settings.access_keys.is_empty() {
        warn!(
            "SQS endpoint accepts unsigned and any-signed requests: no access keys are configured"
        );
    } else {
        info!(
            keys = settings.access_keys.len(),
            "SQS endpoint verifies SigV4 signatures"
        );
    }
    let sqs = Arc::new(Sqs {
        backend,
        home: Addresses::new(
            &settings.advertised_host,
            settings.advertised_port,
            &settings.account_id,
            &settings.region,
        ),
        access_keys: settings.access_keys,
        requests: settings.requests,
        trace_ids: settings.trace_ids,
    });
    Router::new()
        .fallback(serve)
        .with_state(sqs)
        // The body is read in `serve` with `limits::request_bytes_max`, so that an oversized
        // request is refused in SQS's error shape rather than with axum's plain-text 413.
        .layer(DefaultBodyLimit::disable())
}

async fn serve(
    State(sqs): State<Arc<Sqs>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request_id = sqs.backend.new_message_id().to_string();
    let action = headers
        .get("x-amz-target")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // The queue is recorded once the request names one (`queue_from_url`).
    let trace = sqs.trace_ids.of_request(&headers);
    let span = debug_span!(
        "sqs",
        request_id = %request_id,
        action = %action,
        queue = tracing::field::Empty,
        message_id = tracing::field::Empty,
        trace_id = %trace,
    );
    let started = tokio::time::Instant::now();
    let operation = operation_name(&action);
    let form_encoded = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"));
    let response = async {
        let result = match axum::body::to_bytes(body, limits::request_bytes_max).await {
            Ok(body) => sqs.answer(&method, &uri, &headers, &body, &action).await,
            Err(_) => Err(SqsError::InvalidParameterValue(Invalid::RequestTooLong {
                max_bytes: limits::request_bytes_max,
            })),
        };
        let reason = result.as_ref().err().map(|error| error.wire().query_code);
        sqs.requests
            .observe(Api::Sqs, operation, started.elapsed(), reason.as_deref());
        match result {
            Ok(json) => {
                debug!("answered");
                let mut response = (StatusCode::OK, json).into_response();
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(JSON_CONTENT_TYPE),
                );
                response
            }
            Err(error) => {
                let wire = error.wire();
                if wire.status.is_server_error() {
                    warn!(%error, "request failed");
                } else {
                    debug!(code = %wire.query_code, "refused");
                }
                if form_encoded {
                    error.into_query_response(&request_id)
                } else {
                    error.into_response()
                }
            }
        }
    }
    .instrument(span);
    // Every replica call this request causes carries its trace id (`crate::trace`).
    let mut response = trace::scope(trace, response).await;
    response
        .headers_mut()
        .insert(trace::TRACE_ID_HEADER, trace.header_value());
    response.headers_mut().insert(
        "x-amzn-requestid",
        HeaderValue::from_str(&request_id).expect("a uuid-shaped id is a valid header value"),
    );
    response
}

/// The actions this endpoint serves, as `X-Amz-Target` names them after `AmazonSQS.`: the
/// metrics' `operation` label takes only these (and `unknown`), never a client's text.
const ACTIONS: [&str; 23] = [
    "CreateQueue",
    "GetQueueUrl",
    "ListQueues",
    "DeleteQueue",
    "GetQueueAttributes",
    "SetQueueAttributes",
    "PurgeQueue",
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "ListDeadLetterSourceQueues",
    "StartMessageMoveTask",
    "ListMessageMoveTasks",
    "CancelMessageMoveTask",
    "TagQueue",
    "UntagQueue",
    "ListQueueTags",
    "AddPermission",
    "RemovePermission",
];

/// The metrics' name for the action `target` asks for: one of [`ACTIONS`], or `unknown`.
fn operation_name(target: &str) -> &'static str {
    let action = target.strip_prefix("AmazonSQS.").unwrap_or_default();
    ACTIONS
        .iter()
        .find(|known| **known == action)
        .copied()
        .unwrap_or("unknown")
}

impl Sqs {
    async fn answer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
        target: &str,
    ) -> Result<Vec<u8>, SqsError> {
        let scope = if self.access_keys.is_empty() {
            None
        } else {
            let request = sigv4::SignedRequest {
                method,
                path: uri.path(),
                query: uri.query().unwrap_or_default(),
                headers,
                body,
            };
            let key = sigv4::verify(&request, &self.access_keys, self.backend.now().0)?;
            (!key.queue_prefixes.is_empty()).then(|| key.clone())
        };
        let region = sigv4::signing_region(headers, uri.query().unwrap_or_default())?;
        let call = Call {
            sqs: self,
            addresses: match region {
                Some(region) => self.home.for_region(region),
                None => self.home.clone(),
            },
            scope,
        };
        if method != Method::POST {
            return Err(SqsError::UnknownOperation {
                target: format!("{method} {}", uri.path()),
            });
        }
        let Some(action) = target.strip_prefix("AmazonSQS.") else {
            let form = headers
                .get(header::CONTENT_TYPE)
                .and_then(|value| value.to_str().ok())
                .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"));
            if form {
                return Err(SqsError::Serialization {
                    reason: "this endpoint speaks the AWS JSON 1.0 protocol only; use an SDK release from late 2023 or newer".to_owned(),
                });
            }
            return Err(SqsError::UnknownOperation {
                target: if target.is_empty() {
                    "(no X-Amz-Target header)".to_owned()
                } else {
                    target.to_owned()
                },
            });
        };
        call.dispatch(action, body).await
    }
}

impl Call<'_> {
    async fn dispatch(&self, action: &str, body: &[u8]) -> Result<Vec<u8>, SqsError> {
        match action {
            "CreateQueue" => json(self.create_queue(parse(body)?).await),
            "GetQueueUrl" => json(self.get_queue_url(parse(body)?).await),
            "ListQueues" => json(self.list_queues(parse(body)?).await),
            "DeleteQueue" => json(self.delete_queue(parse(body)?).await),
            "GetQueueAttributes" => json(self.get_queue_attributes(parse(body)?).await),
            "SetQueueAttributes" => json(self.set_queue_attributes(parse(body)?).await),
            "PurgeQueue" => json(self.purge_queue(parse(body)?).await),
            "SendMessage" => json(self.send_message(parse(body)?).await),
            "SendMessageBatch" => json(self.send_message_batch(parse(body)?).await),
            "ReceiveMessage" => json(self.receive_message(parse(body)?).await),
            "DeleteMessage" => json(self.delete_message(parse(body)?).await),
            "DeleteMessageBatch" => json(self.delete_message_batch(parse(body)?).await),
            "ChangeMessageVisibility" => json(self.change_message_visibility(parse(body)?).await),
            "ChangeMessageVisibilityBatch" => {
                json(self.change_message_visibility_batch(parse(body)?).await)
            }
            "ListDeadLetterSourceQueues" => {
                json(self.list_dead_letter_source_queues(parse(body)?).await)
            }
            "StartMessageMoveTask" => json(self.start_message_move_task(parse(body)?).await),
            "ListMessageMoveTasks" => json(self.list_message_move_tasks(parse(body)?).await),
            "CancelMessageMoveTask" => json(self.cancel_message_move_task(parse(body)?).await),
            "TagQueue" => json(self.tag_queue(parse(body)?).await),
            "UntagQueue" => json(self.untag_queue(parse(body)?).await),
            "ListQueueTags" => json(self.list_queue_tags(parse(body)?).await),
            "AddPermission" => json(self.add_permission(parse(body)?).await),
            "RemovePermission" => json(self.remove_permission(parse(body)?).await),
            other => Err(SqsError::UnknownOperation {
                target: format!("AmazonSQS.{other}"),
            }),
        }
    }

    /// The queue named by a `QueueUrl` member, in the request's region.
    fn queue_from_url(&self, url: Option<&str>) -> Result<QueueName, SqsError> {
        let url = url.ok_or(SqsError::MissingParameter {
            parameter: "QueueUrl",
        })?;
        let name = self
            .addresses
            .name_from_url(url)
            .map_err(|error| match error {
                AddressError::Malformed { text } => SqsError::InvalidAddress { url: text },
                AddressError::Foreign { .. } => SqsError::QueueDoesNotExist,
            })?;
        let name = self.existing_queue_name(name)?;
        tracing::Span::current().record("queue", name.as_str());
        self.allowed(&name)?;
        Ok(name)
    }

    /// Whether the request's access key may name `name`. The prefix is matched against the
    /// name without its region (a key limited to `orders-` reaches `orders-eu` in every region).
    ///
    /// # Errors
    /// `AccessDenied` when the key is limited to other queues.
    fn allowed(&self, name: &QueueName) -> Result<(), SqsError> {
        match &self.scope {
            Some(key) if !key.allows(name.bare()) => Err(SqsError::AccessDenied {
                key_id: key.id.clone(),
                queue: name.bare().to_owned(),
                prefixes: key.queue_prefixes.join(", "),
            }),
            _ => Ok(()),
        }
    }

    /// Whether the request's access key may see `name` in a list (`ListQueues`,
    /// `ListDeadLetterSourceQueues`): a limited key sees only its own queues.
    fn listed(&self, name: &QueueName) -> bool {
        self.allowed(name).is_ok()
    }

    /// The queue named by an ARN member (`parameter` names it in the refusal).
    fn queue_from_arn(&self, arn: &str, parameter: &'static str) -> Result<QueueName, SqsError> {
        let name = self
            .addresses
            .name_from_arn(arn)
            .map_err(|error| match error {
                AddressError::Malformed { .. } => {
                    SqsError::invalid(parameter, arn, "It is not an SQS queue ARN.")
                }
                // A queue of another region or account does not exist here.
                AddressError::Foreign { .. } => SqsError::QueueDoesNotExist,
            })?;
        let name = self.existing_queue_name(name)?;
        self.allowed(&name)?;
        Ok(name)
    }

    /// The queue a bare name taken from a URL, ARN or `GetQueueUrl` names in the request's
    /// region: an illegal name (a FIFO name, or one with `@`, among them) cannot name an
    /// existing queue, so it does not exist, as SQS answers.
    fn existing_queue_name(&self, bare: &str) -> Result<QueueName, SqsError> {
        self.addresses
            .scoped(bare)
            .map_err(|_| SqsError::QueueDoesNotExist)
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, SqsError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|error| SqsError::Serialization {
        reason: error.to_string(),
    })
}

fn json<T: Serialize>(result: Result<T, SqsError>) -> Result<Vec<u8>, SqsError> {
    result.map(|value| serde_json::to_vec(&value).expect("response shapes always serialize"))
}

/// A required member, or `MissingParameter` naming it.
fn required<T>(value: Option<T>, parameter: &'static str) -> Result<T, SqsError> {
    value.ok_or(SqsError::MissingParameter { parameter })
}

/// An optional integer member in `min..=max`, refused in SQS's wording otherwise.
fn in_range(
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
                SqsError::out_of_range(parameter, value, u64::from(min), u64::from(max))
            }),
    }
}
