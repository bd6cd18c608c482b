//! `Client`: the typed API over one or more nodes.
//!
//! Each node has one lazily connected tonic channel. A call goes to the client's home endpoint
//! while it answers; an attempt that fails on the way to a node marks that endpoint down for a
//! while and, when `retry.rs` allows another attempt, the call moves on to the next endpoint
//! that is up at once, backing off only after it has tried them all (`endpoints.rs` keeps the
//! table). Every tonic setting that matters is set here explicitly: connect timeout, request
//! timeout (longer than the longest long poll), message size limits and HTTP/2 keepalive. This
//! module never interprets a status itself: `error.rs` maps it, `retry.rs` decides what happens
//! next.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status};
use tracing::debug;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;

use crate::backoff::Backoff;
use crate::endpoints::{self, Endpoints, Tried};
use crate::error::{Error, Subject};
use crate::limits;
use crate::retry::{Failure, Idempotence, RetryPolicy};
use crate::types::{
    BatchOutcome, CreatedQueue, DeleteEntry, Message, QueueAttributeChanges, QueueAttributes,
    QueueInfo, QueueName, QueuePage, QueueStats, ReceiptHandle, ReceiveOptions, RedriveTask,
    SendMessage, SentBatchEntry, SentMessage, StartRedrive, TaskHandle, VisibilityChange,
    queue_from_wire, send_entry_to_wire, send_to_wire,
};

/// The address used when none is given.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7100";

/// How to reach the nodes and how patiently.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Node addresses, `http://host:port` (a bare `host:port` gets `http://`). At least one, at
    /// most `limits::ENDPOINTS_MAX`. Any node of a cluster serves any call, so every node may
    /// be listed; one address keeps working as before.
    pub endpoints: Vec<String>,
    /// The index in `endpoints` of the one this client prefers: its calls go there while it
    /// answers, and come back to it once it answers again. `None` (the default) lets the client
    /// choose, so that clients spread over the endpoints: a random one for a process's first
    /// client, the next one for each further client.
    pub home_endpoint: Option<usize>,
    /// How long an endpoint is skipped after an attempt on it failed on the way to a node: the
    /// period is drawn from the upper half of `endpoint_down.ceiling(n)` for the `n`-th failure
    /// in a row. Only time ends it; the next call then probes the endpoint, and an answer makes
    /// it healthy again.
    pub endpoint_down: Backoff,
    /// How long opening a connection to one node may take.
    pub connect_timeout: Duration,
    /// How long one call may take on one node, beyond its long-poll wait.
    pub request_timeout: Duration,
    /// Idle connections are pinged this often, so a dead node is noticed without a request.
    pub keepalive_interval: Duration,
    /// A ping unanswered this long drops the connection.
    pub keepalive_timeout: Duration,
    /// Retries of calls that may be repeated.
    pub retry: RetryPolicy,
    /// The bearer token every call carries (`authorization: Bearer <token>`), for nodes started
    /// with `--api-token-file`; `None` sends none.
    pub token: Option<String>,
}

impl ClientConfig {
    /// The defaults of `limits.rs` for these endpoints.
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            home_endpoint: None,
            endpoint_down: Backoff::new(
                limits::ENDPOINT_DOWN_BASE_DEFAULT,
                limits::ENDPOINT_DOWN_CAP_DEFAULT,
            ),
            connect_timeout: limits::CONNECT_TIMEOUT_DEFAULT,
            request_timeout: limits::REQUEST_TIMEOUT_DEFAULT,
            keepalive_interval: limits::KEEPALIVE_INTERVAL_DEFAULT,
            keepalive_timeout: limits::KEEPALIVE_TIMEOUT_DEFAULT,
            retry: RetryPolicy::default(),
            token: None,
        }
    }
}

/// One node: its address and its channel.
#[derive(Clone, Debug)]
struct Node {
    address: String,
    rpc: QueueServiceClient<Channel>,
}

#[derive(Debug)]
struct Inner {
    /// In the order of `ClientConfig::endpoints`; `endpoints` is their health, by index.
    nodes: Vec<Node>,
    endpoints: Endpoints,
    request_timeout: Duration,
    retry: RetryPolicy,
    /// `Bearer <token>`, put on every call; `None`: no token.
    authorization: Option<MetadataValue<Ascii>>,
}

/// A Trireme client. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

/// One kind of call: its name for traces and whether it may be repeated.
#[derive(Clone, Copy, Debug)]
struct Op {
    name: &'static str,
    idempotence: Idempotence,
}

const fn idempotent(name: &'static str) -> Op {
    Op {
        name,
        idempotence: Idempotence::Idempotent,
    }
}

const fn once(name: &'static str) -> Op {
    Op {
        name,
        idempotence: Idempotence::NotIdempotent,
    }
}

fn normalize(address: &str) -> String {
    let address = address.trim();
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

impl Client {
    /// A client of the nodes in `config`. Connections open on first use, so this succeeds with
    /// nodes that are not up yet. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidEndpoint`] when the list is empty or longer than
    /// `limits::ENDPOINTS_MAX`, or an address is empty or not a valid URI;
    /// [`Error::InvalidArgument`] for a retry policy that allows no attempt, a home endpoint
    /// beyond the list, or a token that cannot travel as a header.
    pub fn new(config: ClientConfig) -> Result<Self, Error> {
        if config.endpoints.is_empty() {
            return Err(Error::InvalidEndpoint {
                address: String::new(),
                message: "at least one endpoint is needed".to_owned(),
            });
        }
        if config.endpoints.len() > limits::ENDPOINTS_MAX {
            return Err(Error::InvalidEndpoint {
                address: config.endpoints[limits::ENDPOINTS_MAX].clone(),
                message: format!(
                    "at most {} endpoints, got {}",
                    limits::ENDPOINTS_MAX,
                    config.endpoints.len()
                ),
            });
        }
        if let Some(home) = config.home_endpoint
            && home >= config.endpoints.len()
        {
            return Err(Error::InvalidArgument {
                field: Some("home_endpoint".to_owned()),
                message: format!(
                    "must be an index below {}, the number of endpoints; got {home}",
                    config.endpoints.len()
                ),
            });
        }
        let authorization = config
            .token
            .as_deref()
            .map(|token| {
                let invalid = || Error::InvalidArgument {
                    field: Some("token".to_owned()),
                    message: "a token is visible ASCII characters, at least one, without spaces"
                        .to_owned(),
                };
                if token.is_empty() || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
                    return Err(invalid());
                }
                MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| invalid())
            })
            .transpose()?;
        if config.retry.attempts_max == 0 {
            return Err(Error::InvalidArgument {
                field: Some("retry.attempts_max".to_owned()),
                message: "a retry policy must allow at least one attempt".to_owned(),
            });
        }
        // The longest attempt is a full long poll plus the request timeout; the channel's own
        // timeout is only a backstop above that.
        let channel_timeout =
            config.request_timeout + Duration::from_secs(u64::from(limits::WAIT_SECONDS_MAX));
        let mut nodes = Vec::with_capacity(config.endpoints.len());
        for address in &config.endpoints {
            if address.trim().is_empty() {
                return Err(Error::InvalidEndpoint {
                    address: address.clone(),
                    message: "an endpoint address is empty".to_owned(),
                });
            }
            let address = normalize(address);
            let endpoint = Endpoint::from_shared(address.clone())
                .map_err(|e| Error::InvalidEndpoint {
                    address: address.clone(),
                    message: e.to_string(),
                })?
                .connect_timeout(config.connect_timeout)
                .timeout(channel_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(config.keepalive_interval)
                .keep_alive_timeout(config.keepalive_timeout)
                .keep_alive_while_idle(true);
            let rpc = QueueServiceClient::new(endpoint.connect_lazy())
                .max_decoding_message_size(limits::DECODE_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(limits::ENCODE_MESSAGE_BYTES_MAX);
            nodes.push(Node { address, rpc });
        }
        let home = config
            .home_endpoint
            .unwrap_or_else(|| endpoints::next_home(nodes.len()));
        let endpoints = Endpoints::new(nodes.len(), home, config.endpoint_down);
        Ok(Self {
            inner: Arc::new(Inner {
                nodes,
                endpoints,
                request_timeout: config.request_timeout,
                retry: config.retry,
                authorization,
            }),
        })
    }

    /// A client of these endpoints with default settings.
    ///
    /// # Errors
    /// As [`Client::new`].
    pub fn connect(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Result<Self, Error> {
        Self::new(ClientConfig::new(endpoints))
    }

    /// The node addresses, normalized, in the order given.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.inner.nodes.iter().map(|n| n.address.as_str())
    }

    /// The address this client's calls go to while it answers (see
    /// [`ClientConfig::home_endpoint`]).
    pub fn home_endpoint(&self) -> &str {
        &self.inner.nodes[self.inner.endpoints.home()].address
    }

    /// Runs one call with retries. `attempt` sends `request` to one node; `timeout` bounds each
    /// attempt.
    ///
    /// Attempts go round the endpoints from home, up ones first (`Endpoints::pick`), without a
    /// pause while some endpoint is untried; once all have been tried the call backs off before
    /// the next round. The attempt cap and the deadline bound all of it.
    async fn call<Req, Resp, F, Fut>(
        &self,
        op: Op,
        subject: &Subject,
        request: Req,
        timeout: Duration,
        attempt: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(QueueServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let inner = &*self.inner;
        let policy = inner.retry;
        let count = inner.nodes.len();
        // One full attempt always fits, whatever the policy's budget.
        let deadline = Instant::now() + policy.deadline.max(timeout);
        let mut tries: u32 = 0;
        let mut backoffs: u32 = 0;
        let mut round = Tried::default();
        // The last failure on the way to a node of each endpoint tried, in first-tried order.
        let mut failures: Vec<(usize, Error)> = Vec::new();
        loop {
            let index = inner.endpoints.pick(Instant::now(), round);
            round.insert(index);
            let node = &inner.nodes[index];
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt_timeout = timeout.min(remaining);
            let mut grpc_request = tonic::Request::new(request.clone());
            // The node learns the deadline too (grpc-timeout), so it stops work nobody awaits.
            grpc_request.set_timeout(attempt_timeout);
            if let Some(authorization) = &inner.authorization {
                grpc_request
                    .metadata_mut()
                    .insert("authorization", authorization.clone());
            }
            let outcome =
                tokio::time::timeout(attempt_timeout, attempt(node.rpc.clone(), grpc_request))
                    .await;
            tries += 1;
            let (error, failure) = match outcome {
                Ok(Ok(response)) => {
                    inner.endpoints.succeeded(index);
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => {
                    let error = match Error::from_status(&status, &node.address, subject) {
                        Error::Timeout { address, .. } => Error::Timeout {
                            address,
                            after: attempt_timeout,
                        },
                        other => other,
                    };
                    (error, Failure::of_status(&status))
                }
                Err(_elapsed) => (
                    Error::Timeout {
                        address: node.address.clone(),
                        after: attempt_timeout,
                    },
                    Failure::Transient,
                ),
            };
            let now = Instant::now();
            if failure == Failure::Refused {
                // The node answered: it is up, and asking elsewhere gets the same answer.
                inner.endpoints.succeeded(index);
                return Err(error);
            }
            if let Some(down_for) = inner.endpoints.failed(index, now, &mut rand::rng()) {
                debug!(op = op.name, node = %node.address, error = %error, down_ms = down_for.as_millis() as u64, "endpoint marked down");
            }
            match failures.iter_mut().find(|(tried, _)| *tried == index) {
                Some((_, last)) => *last = error,
                None => failures.push((index, error)),
            }
            if !failure.retryable(op.idempotence) || tries >= policy.attempts_max || now >= deadline
            {
                return Err(no_endpoint_available(failures));
            }
            if round.covers(count) {
                // Every endpoint failed this round: wait before the next, as a lone node's
                // client waits between its attempts.
                round = Tried::default();
                let delay = policy
                    .backoff
                    .delay(backoffs, &mut rand::rng())
                    .min(deadline.saturating_duration_since(now));
                backoffs += 1;
                debug!(
                    op = op.name,
                    retry_in_ms = delay.as_millis() as u64,
                    "every endpoint failed; retrying"
                );
                tokio::time::sleep(delay).await;
            } else {
                debug!(op = op.name, node = %node.address, "moving to the next endpoint");
            }
        }
    }

    fn timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// [`Client::call`] about one queue, each attempt bounded by the request timeout.
    async fn call_queue<Req, Resp, F, Fut>(
        &self,
        op: Op,
        queue: &QueueName,
        request: Req,
        attempt: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(QueueServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        self.call(op, &Subject::queue(queue), request, self.timeout(), attempt)
            .await
    }

    // ---- Queues. ----

    /// Creates a queue; succeeds without change when it exists with the same attributes.
    /// Retried, since a second create with identical attributes is a no-op.
    ///
    /// # Errors
    /// [`Error::QueueExists`] with different attributes, [`Error::QueueDeletedRecently`],
    /// [`Error::InvalidArgument`] for an attribute out of range or a redrive policy naming a
    /// missing queue, and the transport errors.
    pub async fn create_queue(
        &self,
        name: &QueueName,
        attributes: &QueueAttributes,
    ) -> Result<CreatedQueue, Error> {
        self.create_queue_with_tags(name, attributes, &BTreeMap::new())
            .await
    }

    /// [`Client::create_queue`] with tags set at creation.
    ///
    /// # Errors
    /// As [`Client::create_queue`].
    pub async fn create_queue_with_tags(
        &self,
        name: &QueueName,
        attributes: &QueueAttributes,
        tags: &BTreeMap<String, String>,
    ) -> Result<CreatedQueue, Error> {
        let request = pb::CreateQueueRequest {
            name: name.as_str().to_owned(),
            attributes: Some(attributes.into()),
            tags: tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let reply = self
            .call_queue(
                idempotent("create_queue"),
                name,
                request,
                |mut c, r| async move { c.create_queue(r).await },
            )
            .await?;
        Ok(CreatedQueue {
            queue: queue_from_wire(reply.queue)?,
            created: reply.created,
        })
    }

    /// The queue's settings, tags and counts.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], and the transport errors.
    pub async fn get_queue(&self, name: &QueueName) -> Result<QueueInfo, Error> {
        let request = pb::GetQueueRequest {
            name: name.as_str().to_owned(),
        };
        let reply = self
            .call_queue(
                idempotent("get_queue"),
                name,
                request,
                |mut c, r| async move { c.get_queue(r).await },
            )
            .await?;
        queue_from_wire(reply.queue)
    }

    /// The queue's approximate ready, in-flight and delayed counts.
    ///
    /// # Errors
    /// As [`Client::get_queue`].
    pub async fn queue_stats(&self, name: &QueueName) -> Result<QueueStats, Error> {
        Ok(self.get_queue(name).await?.stats)
    }

    /// The queue's tags.
    ///
    /// # Errors
    /// As [`Client::get_queue`].
    pub async fn queue_tags(&self, name: &QueueName) -> Result<BTreeMap<String, String>, Error> {
        Ok(self.get_queue(name).await?.tags)
    }

    /// One page of queue names starting with `prefix`. `max_results` is 1-1000 (`None`: 1000);
    /// `page_token` is the previous page's `next_page_token`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad page size or token, and the transport errors.
    pub async fn list_queues(
        &self,
        prefix: &str,
        max_results: Option<u32>,
        page_token: Option<&str>,
    ) -> Result<QueuePage, Error> {
        let request = pb::ListQueuesRequest {
            prefix: prefix.to_owned(),
            max_results: max_results.unwrap_or(0),
            page_token: page_token.unwrap_or_default().to_owned(),
        };
        let reply = self
            .call(
                idempotent("list_queues"),
                &Subject::default(),
                request,
                self.timeout(),
                |mut c, r| async move { c.list_queues(r).await },
            )
            .await?;
        Ok(page(reply.names, reply.next_page_token))
    }

    /// Every queue name starting with `prefix`, following pages.
    ///
    /// # Errors
    /// As [`Client::list_queues`]; [`Error::Protocol`] if the node keeps returning pages past
    /// `limits::LIST_PAGES_MAX`.
    pub async fn list_all_queues(&self, prefix: &str) -> Result<Vec<QueueName>, Error> {
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..limits::LIST_PAGES_MAX {
            let page = self.list_queues(prefix, None, token.as_deref()).await?;
            names.extend(page.names);
            match page.next_page_token {
                Some(next) => token = Some(next),
                None => return Ok(names),
            }
        }
        Err(Error::Protocol {
            message: format!(
                "queue listing did not end after {} pages",
                limits::LIST_PAGES_MAX
            ),
        })
    }

    /// Changes the queue's attributes and returns the result.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], [`Error::InvalidArgument`], and the transport errors.
    pub async fn set_queue_attributes(
        &self,
        name: &QueueName,
        changes: &QueueAttributeChanges,
    ) -> Result<QueueInfo, Error> {
        let request = pb::SetQueueAttributesRequest {
            name: name.as_str().to_owned(),
            attributes: Some(changes.into()),
        };
        let reply = self
            .call_queue(
                idempotent("set_queue_attributes"),
                name,
                request,
                |mut c, r| async move { c.set_queue_attributes(r).await },
            )
            .await?;
        queue_from_wire(reply.queue)
    }

    /// Deletes the queue and every message in it. Not retried once sent: a repeat would answer
    /// [`Error::QueueNotFound`] for a delete that worked.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], and the transport errors.
    pub async fn delete_queue(&self, name: &QueueName) -> Result<(), Error> {
        let request = pb::DeleteQueueRequest {
            name: name.as_str().to_owned(),
        };
        self.call_queue(once("delete_queue"), name, request, |mut c, r| async move {
            c.delete_queue(r).await
        })
        .await?;
        Ok(())
    }

    /// Removes every message of the queue. Not retried once sent.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], [`Error::PurgeInProgress`] within 60 s of the last purge, and
    /// the transport errors.
    pub async fn purge_queue(&self, name: &QueueName) -> Result<(), Error> {
        let request = pb::PurgeQueueRequest {
            name: name.as_str().to_owned(),
        };
        self.call_queue(once("purge_queue"), name, request, |mut c, r| async move {
            c.purge_queue(r).await
        })
        .await?;
        Ok(())
    }

    /// Adds or replaces tags.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], [`Error::InvalidArgument`], and the transport errors.
    pub async fn tag_queue(
        &self,
        name: &QueueName,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        let request = pb::TagQueueRequest {
            name: name.as_str().to_owned(),
            tags: tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        self.call_queue(
            idempotent("tag_queue"),
            name,
            request,
            |mut c, r| async move { c.tag_queue(r).await },
        )
        .await?;
        Ok(())
    }

    /// Removes tags by key; absent keys are ignored.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], and the transport errors.
    pub async fn untag_queue(&self, name: &QueueName, keys: &[String]) -> Result<(), Error> {
        let request = pb::UntagQueueRequest {
            name: name.as_str().to_owned(),
            keys: keys.to_vec(),
        };
        self.call_queue(
            idempotent("untag_queue"),
            name,
            request,
            |mut c, r| async move { c.untag_queue(r).await },
        )
        .await?;
        Ok(())
    }

    /// One page of the queues whose redrive policy names `name` as their dead-letter queue.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], and the transport errors.
    pub async fn list_dead_letter_source_queues(
        &self,
        name: &QueueName,
        max_results: Option<u32>,
        page_token: Option<&str>,
    ) -> Result<QueuePage, Error> {
        let request = pb::ListDeadLetterSourceQueuesRequest {
            name: name.as_str().to_owned(),
            max_results: max_results.unwrap_or(0),
            page_token: page_token.unwrap_or_default().to_owned(),
        };
        let reply = self
            .call_queue(
                idempotent("list_dead_letter_source_queues"),
                name,
                request,
                |mut c, r| async move { c.list_dead_letter_source_queues(r).await },
            )
            .await?;
        Ok(page(reply.names, reply.next_page_token))
    }

    // ---- Messages. ----

    /// Sends one message. Retried only when it carries a deduplication id (the node then stores
    /// it once however often it arrives) or when no node was reached. Without one, an error
    /// after the request may have reached a node ([`Error::Unavailable`], [`Error::Timeout`], or
    /// [`Error::NoEndpointAvailable`] ending in one of them) does not prove that nothing was
    /// stored: sending the message again may store it twice, which at-least-once delivery
    /// allows.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], [`Error::InvalidArgument`] (empty or oversized body, bad
    /// attributes, delay out of range), and the transport errors.
    pub async fn send_message(
        &self,
        queue: &QueueName,
        message: &SendMessage,
    ) -> Result<SentMessage, Error> {
        let op = if message.deduplication_id.is_some() {
            idempotent("send_message")
        } else {
            once("send_message")
        };
        let request = send_to_wire(queue, message);
        let reply = self
            .call_queue(op, queue, request, |mut c, r| async move {
                c.send_message(r).await
            })
            .await?;
        Ok(sent_message(
            reply.message_id,
            reply.duplicate,
            reply.md5_of_body,
        ))
    }

    /// Sends up to 10 messages; each entry succeeds or fails on its own. Retried only when every
    /// entry carries a deduplication id, or when no node was reached.
    ///
    /// # Errors
    /// The call as a whole fails with [`Error::QueueNotFound`], [`Error::InvalidArgument`] (too
    /// many, no or duplicate entry ids), and the transport errors; refused entries are in the
    /// outcome's `failed`.
    pub async fn send_message_batch(
        &self,
        queue: &QueueName,
        entries: &[SendBatchEntry],
    ) -> Result<BatchOutcome<SentBatchEntry>, Error> {
        let all_deduplicated = entries.iter().all(|e| e.message.deduplication_id.is_some());
        let op = if all_deduplicated {
            idempotent("send_message_batch")
        } else {
            once("send_message_batch")
        };
        let request = pb::SendMessageBatchRequest {
            queue: queue.as_str().to_owned(),
            entries: entries
                .iter()
                .map(|e| send_entry_to_wire(&e.id, &e.message))
                .collect(),
        };
        let reply = self
            .call_queue(op, queue, request, |mut c, r| async move {
                c.send_message_batch(r).await
            })
            .await?;
        let successful = reply.successful.into_iter().map(|s| SentBatchEntry {
            id: s.id,
            sent: sent_message(s.message_id, s.duplicate, s.md5_of_body),
        });
        Ok(batch_outcome(successful.collect(), reply.failed))
    }

    /// Receives up to `options.max_messages` messages, waiting up to the long-poll time for the
    /// first. An empty vector means none arrived in time. Never retried once sent: a reply lost
    /// on the way has already made its messages invisible for their timeout.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], [`Error::InvalidArgument`] (max, visibility or wait out of
    /// range), [`Error::ResourceExhausted`] (in-flight or long-poll limit), and the transport
    /// errors.
    pub async fn receive_messages(
        &self,
        queue: &QueueName,
        options: &ReceiveOptions,
    ) -> Result<Vec<Message>, Error> {
        let request = pb::ReceiveMessagesRequest {
            queue: queue.as_str().to_owned(),
            max_messages: options.max_messages,
            visibility_timeout_seconds: options.visibility_timeout_seconds,
            wait_seconds: options.wait_seconds,
        };
        // The queue's default wait is unknown here; assume the longest allowed.
        let wait = options
            .wait_seconds
            .unwrap_or(limits::WAIT_SECONDS_MAX)
            .min(limits::WAIT_SECONDS_MAX);
        let timeout = self.timeout() + Duration::from_secs(u64::from(wait));
        let reply = self
            .call(
                once("receive_messages"),
                &Subject::queue(queue),
                request,
                timeout,
                |mut c, r| async move { c.receive_messages(r).await },
            )
            .await?;
        reply.messages.into_iter().map(Message::try_from).collect()
    }

    /// Deletes the message received with `receipt_handle`. Succeeds also when the message is
    /// already gone, so it is retried.
    ///
    /// # Errors
    /// [`Error::StaleReceiptHandle`] when a later receive superseded the handle,
    /// [`Error::ReceiptHandleInvalid`], [`Error::QueueNotFound`], and the transport errors.
    pub async fn delete_message(
        &self,
        queue: &QueueName,
        receipt_handle: &ReceiptHandle,
    ) -> Result<(), Error> {
        let request = pb::DeleteMessageRequest {
            queue: queue.as_str().to_owned(),
            receipt_handle: receipt_handle.as_str().to_owned(),
        };
        self.call_queue(
            idempotent("delete_message"),
            queue,
            request,
            |mut c, r| async move { c.delete_message(r).await },
        )
        .await?;
        Ok(())
    }

    /// Moves the message received with `receipt_handle` to the queue's dead-letter queue at
    /// once, keeping its message id, receive count and send time; its dead-letter source becomes
    /// `queue`. Returns the dead-letter queue's name. Retried on transport errors: a retry cannot
    /// move anything else, and one whose first attempt moved the message answers
    /// [`Error::MessageNotInFlight`].
    ///
    /// # Errors
    /// [`Error::NoDeadLetterQueue`] when the queue has no redrive policy or its dead-letter
    /// queue does not exist (the message stays where it is), [`Error::StaleReceiptHandle`] when
    /// a later receive superseded the handle, [`Error::MessageNotInFlight`] when the message is
    /// no longer in the queue, [`Error::ReceiptHandleInvalid`], [`Error::QueueNotFound`], and
    /// the transport errors.
    pub async fn dead_letter_message(
        &self,
        queue: &QueueName,
        receipt_handle: &ReceiptHandle,
    ) -> Result<QueueName, Error> {
        let request = pb::DeadLetterMessageRequest {
            queue: queue.as_str().to_owned(),
            receipt_handle: receipt_handle.as_str().to_owned(),
        };
        let reply = self
            .call_queue(
                idempotent("dead_letter_message"),
                queue,
                request,
                |mut c, r| async move { c.dead_letter_message(r).await },
            )
            .await?;
        QueueName::new(&reply.dead_letter_queue).map_err(|error| Error::Protocol {
            message: format!("dead_letter_queue in the reply: {error}"),
        })
    }

    /// Deletes up to 10 messages; the outcome lists the entry ids deleted and those refused.
    ///
    /// # Errors
    /// As [`Client::send_message_batch`] for the call as a whole.
    pub async fn delete_message_batch(
        &self,
        queue: &QueueName,
        entries: &[DeleteEntry],
    ) -> Result<BatchOutcome<String>, Error> {
        let request = pb::DeleteMessageBatchRequest {
            queue: queue.as_str().to_owned(),
            entries: entries
                .iter()
                .map(|e| pb::DeleteMessageBatchEntry {
                    id: e.id.clone(),
                    receipt_handle: e.receipt_handle.as_str().to_owned(),
                })
                .collect(),
        };
        let reply = self
            .call_queue(
                idempotent("delete_message_batch"),
                queue,
                request,
                |mut c, r| async move { c.delete_message_batch(r).await },
            )
            .await?;
        Ok(batch_outcome(reply.successful, reply.failed))
    }

    /// Makes the message received with `receipt_handle` invisible for `timeout_seconds` from
    /// now (0: visible at once). Setting the same timeout twice has the same effect, so it is
    /// retried.
    ///
    /// # Errors
    /// [`Error::StaleReceiptHandle`], [`Error::ReceiptHandleInvalid`],
    /// [`Error::MessageNotInFlight`] when the message is gone, [`Error::VisibilityCapExceeded`]
    /// past 12 h from the receive, [`Error::InvalidArgument`], and the transport errors.
    pub async fn change_visibility(
        &self,
        queue: &QueueName,
        receipt_handle: &ReceiptHandle,
        timeout_seconds: u32,
    ) -> Result<(), Error> {
        let request = pb::ChangeVisibilityRequest {
            queue: queue.as_str().to_owned(),
            receipt_handle: receipt_handle.as_str().to_owned(),
            visibility_timeout_seconds: timeout_seconds,
        };
        self.call_queue(
            idempotent("change_visibility"),
            queue,
            request,
            |mut c, r| async move { c.change_visibility(r).await },
        )
        .await?;
        Ok(())
    }

    /// Changes the visibility of up to 10 messages.
    ///
    /// # Errors
    /// As [`Client::send_message_batch`] for the call as a whole.
    pub async fn change_visibility_batch(
        &self,
        queue: &QueueName,
        entries: &[VisibilityChange],
    ) -> Result<BatchOutcome<String>, Error> {
        let request = pb::ChangeVisibilityBatchRequest {
            queue: queue.as_str().to_owned(),
            entries: entries
                .iter()
                .map(|e| pb::ChangeVisibilityBatchEntry {
                    id: e.id.clone(),
                    receipt_handle: e.receipt_handle.as_str().to_owned(),
                    visibility_timeout_seconds: e.visibility_timeout_seconds,
                })
                .collect(),
        };
        let reply = self
            .call_queue(
                idempotent("change_visibility_batch"),
                queue,
                request,
                |mut c, r| async move { c.change_visibility_batch(r).await },
            )
            .await?;
        Ok(batch_outcome(reply.successful, reply.failed))
    }

    // ---- Redrive. ----

    /// Starts moving the ready messages of a dead-letter queue back to their source queues (or
    /// to `destination_queue`). Not retried once sent: a second task could start.
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], [`Error::InvalidArgument`] (rate out of range, a task already
    /// running), and the transport errors.
    pub async fn start_redrive(&self, redrive: &StartRedrive) -> Result<TaskHandle, Error> {
        let request = pb::StartRedriveRequest {
            source_queue: redrive.source_queue.as_str().to_owned(),
            destination_queue: redrive
                .destination_queue
                .as_ref()
                .map(|q| q.as_str().to_owned()),
            max_messages_per_second: redrive.max_messages_per_second.unwrap_or(0),
        };
        let reply = self
            .call_queue(
                once("start_redrive"),
                &redrive.source_queue,
                request,
                |mut c, r| async move { c.start_redrive(r).await },
            )
            .await?;
        Ok(TaskHandle::new(reply.task_handle))
    }

    /// The most recent redrive tasks of a dead-letter queue, newest first; `max_results` 1-10
    /// (`None`: 1).
    ///
    /// # Errors
    /// [`Error::QueueNotFound`], and the transport errors.
    pub async fn list_redrives(
        &self,
        source_queue: &QueueName,
        max_results: Option<u32>,
    ) -> Result<Vec<RedriveTask>, Error> {
        let request = pb::ListRedrivesRequest {
            source_queue: source_queue.as_str().to_owned(),
            max_results: max_results.unwrap_or(0),
        };
        let reply = self
            .call_queue(
                idempotent("list_redrives"),
                source_queue,
                request,
                |mut c, r| async move { c.list_redrives(r).await },
            )
            .await?;
        reply.tasks.into_iter().map(RedriveTask::try_from).collect()
    }

    /// Cancels a running redrive task; returns how many messages it had moved.
    ///
    /// # Errors
    /// [`Error::RedriveTaskNotFound`], [`Error::InvalidArgument`] when it is no longer running,
    /// and the transport errors.
    pub async fn cancel_redrive(&self, task_handle: &TaskHandle) -> Result<u64, Error> {
        let request = pb::CancelRedriveRequest {
            task_handle: task_handle.as_str().to_owned(),
        };
        let reply = self
            .call(
                once("cancel_redrive"),
                &Subject::task(task_handle),
                request,
                self.timeout(),
                |mut c, r| async move { c.cancel_redrive(r).await },
            )
            .await?;
        Ok(reply.moved)
    }
}

/// The error of a call whose attempts all failed on the way to a node: the one failure itself
/// when a single endpoint was tried, else [`Error::NoEndpointAvailable`] naming each endpoint.
fn no_endpoint_available(mut failures: Vec<(usize, Error)>) -> Error {
    assert!(!failures.is_empty(), "a failed call made an attempt");
    if failures.len() == 1 {
        return failures.pop().expect("one failure").1;
    }
    Error::NoEndpointAvailable {
        failures: failures.into_iter().map(|(_, error)| error).collect(),
    }
}

/// One entry of a send batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendBatchEntry {
    /// The caller's entry id, distinct within the batch: 1-80 of `[A-Za-z0-9_-]`.
    pub id: String,
    /// The message.
    pub message: SendMessage,
}

/// A batch's outcome from the entries the node accepted and those it refused.
fn batch_outcome<T>(successful: Vec<T>, failed: Vec<pb::BatchEntryError>) -> BatchOutcome<T> {
    BatchOutcome {
        successful,
        failed: failed.into_iter().map(Into::into).collect(),
    }
}

/// What a node answers for one sent message, single or batched.
fn sent_message(message_id: String, duplicate: bool, md5_of_body: String) -> SentMessage {
    SentMessage {
        message_id: crate::types::MessageId::new(message_id),
        duplicate,
        md5_of_body,
    }
}

fn page(names: Vec<String>, next_page_token: String) -> QueuePage {
    QueuePage {
        names: names.into_iter().map(QueueName::from_server).collect(),
        next_page_token: (!next_page_token.is_empty()).then_some(next_page_token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_needs_an_endpoint_and_an_attempt() {
        let none: [&str; 0] = [];
        assert!(matches!(
            Client::connect(none),
            Err(Error::InvalidEndpoint { .. })
        ));
        let mut config = ClientConfig::new(["http://127.0.0.1:7100"]);
        config.retry.attempts_max = 0;
        assert!(matches!(
            Client::new(config),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            Client::connect(["http://bad host"]),
            Err(Error::InvalidEndpoint { .. })
        ));
    }

    #[tokio::test]
    async fn endpoint_lists_are_checked_for_size_blanks_and_home() {
        let many: Vec<String> = (0..=limits::ENDPOINTS_MAX)
            .map(|i| format!("http://n{i}:7100"))
            .collect();
        assert!(matches!(
            Client::connect(many.clone()),
            Err(Error::InvalidEndpoint { ref message, .. }) if message.contains("at most 64")
        ));
        assert!(Client::connect(&many[..limits::ENDPOINTS_MAX]).is_ok());
        // "a,,b" from a command line.
        assert!(matches!(
            Client::connect(["n1:7100", " ", "n2:7100"]),
            Err(Error::InvalidEndpoint { .. })
        ));
        let mut config = ClientConfig::new(["n1:7100", "n2:7100"]);
        config.home_endpoint = Some(1);
        assert_eq!(
            Client::new(config).unwrap().home_endpoint(),
            "http://n2:7100"
        );
    }

    #[tokio::test]
    async fn bare_addresses_get_the_http_scheme() {
        let client = Client::connect([" 127.0.0.1:7100", "https://n2:7100"]).unwrap();
        let endpoints: Vec<&str> = client.endpoints().collect();
        assert_eq!(endpoints, ["http://127.0.0.1:7100", "https://n2:7100"]);
    }
}
