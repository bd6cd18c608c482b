//! The SQS endpoint in the cluster runs: every member serves the node's own axum SQS app
//! (`trireme_node::sqs::router` over the member's `Backend`, as `Node::serve_sqs` builds it) on
//! turmoil's TCP through [`SimListener`], and clients call it with a minimal HTTP/1.1 client
//! speaking the JSON protocol (`X-Amz-Target: AmazonSQS.<Action>`, one connection per call,
//! `Connection: close`). [`call`] takes the front's [`Request`]s and gives the front's
//! [`Answer`]s, so a client records an SQS call in the same history as a front call.
//!
//! Unsigned requests: the members configure no access keys, as a local emulator does. This
//! module must never decide anything the endpoint decides: it translates, nothing more.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trireme_node::backend::Backend;
use trireme_node::sqs::{SqsSettings, router};
use trireme_node::trace::TraceIds;
use turmoil::net::{TcpListener, TcpStream};

use super::front::{
    self, Answer, DEAD_LETTER_QUEUE, Failure, Got, QUEUE, RACE_QUEUE, Request, Ticket,
};
use super::workload::QUEUE_VISIBILITY_S;

/// The port every member serves the SQS endpoint on.
pub const SQS_PORT: u16 = 9324;
/// The account in the queue URLs (the endpoint's default).
const ACCOUNT: &str = "000000000000";
/// The region in the queue ARNs (the endpoint's default).
const REGION: &str = "us-east-1";
/// Longest response the client reads; a longer one is a broken endpoint.
const RESPONSE_BYTES_MAX: u64 = 1024 * 1024;

/// turmoil's listener in the shape `axum::serve` takes.
pub struct SimListener(pub TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            // turmoil's accept fails only while the host goes down; the next one waits.
            if let Ok(accepted) = self.0.accept().await {
                return accepted;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Serves the node's SQS app over `backend` on `listener` until the host goes down. `host` is
/// the member's host name (its queue URLs), `seed` the member's boot seed (its trace ids, which
/// travel in the peer calls' metadata and so must replay).
pub async fn serve(listener: TcpListener, backend: Backend, host: String, seed: u64) {
    let settings = SqsSettings {
        advertised_host: host,
        advertised_port: SQS_PORT,
        trace_ids: TraceIds::new(Some(seed)),
        ..SqsSettings::default()
    };
    let app = router(backend, settings);
    // Ends only with an I/O error of the listener, which turmoil's never gives.
    let _ = axum::serve(SimListener(listener), app).await;
}

/// The run's queue's URL at `host`, or its dead-letter queue's.
fn queue_url(host: &str, dead_letter: bool) -> String {
    let name = if dead_letter {
        DEAD_LETTER_QUEUE
    } else {
        QUEUE
    };
    format!("http://{host}:{SQS_PORT}/{ACCOUNT}/{name}")
}

/// The URL of the queue that issued `ticket`'s handle, as its client knows it.
fn ticket_url(host: &str, ticket: &Ticket) -> String {
    queue_url(host, ticket.dead_letter())
}

/// The ARN of `name`.
fn queue_arn(name: &str) -> String {
    format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{name}")
}

/// The action and JSON body of `request`; `None` for what only the front answers.
fn encode(host: &str, request: &Request) -> Option<(&'static str, Value)> {
    let url = queue_url(host, false);
    Some(match request {
        Request::CreateQueue {
            dead_letter,
            max_receive_count,
        } => {
            let mut attributes = json!({ "VisibilityTimeout": QUEUE_VISIBILITY_S.to_string() });
            if let Some(max) = max_receive_count {
                attributes["RedrivePolicy"] = json!(
                    json!({
                        "deadLetterTargetArn": queue_arn(DEAD_LETTER_QUEUE),
                        "maxReceiveCount": max.to_string(),
                    })
                    .to_string()
                );
            }
            let name = if *dead_letter {
                DEAD_LETTER_QUEUE
            } else {
                QUEUE
            };
            (
                "CreateQueue",
                json!({ "QueueName": name, "Attributes": attributes }),
            )
        }
        Request::StartMoveTask => (
            "StartMessageMoveTask",
            json!({ "SourceArn": queue_arn(DEAD_LETTER_QUEUE) }),
        ),
        Request::Send {
            body,
            delay_s,
            dedup,
        } => {
            let mut send = json!({ "QueueUrl": url, "MessageBody": body, "DelaySeconds": delay_s });
            if let Some(dedup) = dedup {
                send["MessageDeduplicationId"] = json!(dedup);
            }
            ("SendMessage", send)
        }
        Request::SendBatch { entries } => (
            "SendMessageBatch",
            json!({
                "QueueUrl": url,
                "Entries": entries
                    .iter()
                    .enumerate()
                    .map(|(index, (body, delay_s))| json!({
                        "Id": index.to_string(),
                        "MessageBody": body,
                        "DelaySeconds": delay_s,
                    }))
                    .collect::<Vec<Value>>(),
            }),
        ),
        Request::DeleteBatch { tickets } => (
            "DeleteMessageBatch",
            json!({
                // A batch holds handles of one queue (the client batches them so).
                "QueueUrl": tickets.first().map_or(url, |ticket| ticket_url(host, ticket)),
                "Entries": tickets
                    .iter()
                    .enumerate()
                    .map(|(index, ticket)| json!({
                        "Id": index.to_string(),
                        "ReceiptHandle": ticket.handle,
                    }))
                    .collect::<Vec<Value>>(),
            }),
        ),
        Request::Receive {
            dead_letter,
            max,
            visibility_s,
            wait_s,
        } => (
            "ReceiveMessage",
            json!({
                "QueueUrl": queue_url(host, *dead_letter),
                "MaxNumberOfMessages": max,
                "VisibilityTimeout": visibility_s,
                "WaitTimeSeconds": wait_s,
                "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
            }),
        ),
        Request::Delete { ticket } => (
            "DeleteMessage",
            json!({ "QueueUrl": ticket_url(host, ticket), "ReceiptHandle": ticket.handle }),
        ),
        Request::ChangeVisibility { ticket, timeout_s } => (
            "ChangeMessageVisibility",
            json!({
                "QueueUrl": ticket_url(host, ticket),
                "ReceiptHandle": ticket.handle,
                "VisibilityTimeout": timeout_s,
            }),
        ),
        Request::Purge => ("PurgeQueue", json!({ "QueueUrl": url })),
        Request::RaceQueue { create: true } => ("CreateQueue", json!({ "QueueName": RACE_QUEUE })),
        Request::RaceQueue { create: false } => (
            "DeleteQueue",
            json!({ "QueueUrl": format!("http://{host}:{SQS_PORT}/{ACCOUNT}/{RACE_QUEUE}") }),
        ),
        // Dead-letter now is the node's own action, on gRPC only.
        Request::DeadLetterNow { .. } | Request::Count | Request::Records => return None,
    })
}

/// The front's message id (32 hex digits) of an SQS `MessageId` (a UUID's 8-4-4-4-12).
fn message_id(text: &str) -> Option<u128> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    (hex.len() == 32)
        .then(|| u128::from_str_radix(&hex, 16).ok())
        .flatten()
}

/// The answer a 200 response to `request` gives, `None` when it does not read as one.
fn decode(request: &Request, body: &Value) -> Option<Answer> {
    Some(match request {
        Request::CreateQueue { .. } | Request::RaceQueue { create: true } => {
            body.get("QueueUrl")?.as_str()?;
            Answer::Done
        }
        Request::RaceQueue { create: false } => Answer::Done,
        Request::Send { .. } => Answer::Sent {
            message_id: format!("{:032x}", message_id(body.get("MessageId")?.as_str()?)?),
        },
        Request::Receive { .. } => {
            let messages = match body.get("Messages") {
                None => Vec::new(),
                Some(messages) => messages.as_array()?.clone(),
            };
            Answer::Received(
                messages
                    .iter()
                    .map(|message| {
                        let id = message_id(message.get("MessageId")?.as_str()?)?;
                        let count = message
                            .get("Attributes")?
                            .get("ApproximateReceiveCount")?
                            .as_str()?
                            .parse()
                            .ok()?;
                        Some(Got {
                            ticket: Ticket {
                                message: trireme_core::MessageId(id),
                                handle: message.get("ReceiptHandle")?.as_str()?.to_owned(),
                            },
                            body: message.get("Body")?.as_str()?.to_owned(),
                            receive_count: count,
                        })
                    })
                    .collect::<Option<Vec<Got>>>()?,
            )
        }
        Request::Delete { .. } => delete_ok(),
        Request::ChangeVisibility { .. } | Request::Purge => Answer::Done,
        Request::StartMoveTask => {
            body.get("TaskHandle")?.as_str()?;
            Answer::Done
        }
        Request::SendBatch { entries } => batch(body, entries.len(), |entry| {
            Some(Answer::Sent {
                message_id: format!("{:032x}", message_id(entry.get("MessageId")?.as_str()?)?),
            })
        })?,
        Request::DeleteBatch { tickets } => batch(body, tickets.len(), |_| Some(delete_ok()))?,
        Request::DeadLetterNow { .. } | Request::Count | Request::Records => return None,
    })
}

/// What an SQS delete's success says: SQS answers a delete with a superseded receipt handle
/// with success and deletes nothing (`node/src/sqs/messages.rs`, as AWS documents it), so the
/// success is no acknowledgement of a delete: it may or may not have taken effect.
fn delete_ok() -> Answer {
    Answer::Unavailable {
        reason: "sqs_delete_succeeded_the_handle_may_be_superseded".to_owned(),
    }
}

/// A batch's answer from its `Successful` entries (read by `success`) and its `Failed` ones:
/// each entry's, in entry order, every entry answered once.
fn batch(
    body: &Value,
    entries: usize,
    success: impl Fn(&Value) -> Option<Answer>,
) -> Option<Answer> {
    let mut answers: Vec<Option<Answer>> = vec![None; entries];
    let list = |name: &str| -> Option<Vec<Value>> {
        match body.get(name) {
            None => Some(Vec::new()),
            Some(list) => list.as_array().cloned(),
        }
    };
    for entry in list("Successful")? {
        let index: usize = entry.get("Id")?.as_str()?.parse().ok()?;
        *answers.get_mut(index)? = Some(success(&entry)?);
    }
    for entry in list("Failed")? {
        let index: usize = entry.get("Id")?.as_str()?.parse().ok()?;
        let code = entry.get("Code")?.as_str()?.to_owned();
        let sender_fault = entry.get("SenderFault")?.as_bool()?;
        let message = entry.get("Message").and_then(Value::as_str).unwrap_or("");
        // As a whole call's error: the receiver's fault or a throttling may have taken effect,
        // except the clock gate's refusal, which did nothing.
        *answers.get_mut(index)? = Some(if front::not_coordinating(message) {
            Answer::Refused {
                code: front::NOT_COORDINATING.to_owned(),
            }
        } else if !sender_fault || code.contains("Throttl") {
            Answer::Unavailable {
                reason: format!("sqs_entry_{code}"),
            }
        } else {
            Answer::Refused { code }
        });
    }
    answers
        .into_iter()
        .collect::<Option<Vec<Answer>>>()
        .map(Answer::Batch)
}

/// The answer an error response gives: a server error or a throttling refusal may have taken
/// effect (unknown), except the clock gate's refusal (a `ServiceUnavailable` whose message says
/// the member coordinated nothing), which did nothing; any other client error is a refusal that
/// changed nothing.
fn failed(status: u16, body: &Value) -> Answer {
    let shape = body
        .get("__type")
        .and_then(Value::as_str)
        .unwrap_or("NoErrorShape");
    let code = shape.rsplit('#').next().unwrap_or(shape).to_owned();
    let message = body.get("message").and_then(Value::as_str).unwrap_or("");
    if front::not_coordinating(message) {
        Answer::Refused {
            code: front::NOT_COORDINATING.to_owned(),
        }
    } else if status >= 500 || code.contains("Throttl") {
        Answer::Unavailable {
            reason: format!("sqs_{status}_{code}"),
        }
    } else {
        Answer::Refused { code }
    }
}

/// The status and the body of an HTTP/1.1 response read to its end.
fn parse_response(bytes: &[u8]) -> Option<(u16, Vec<u8>)> {
    let split = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..split]).ok()?;
    let mut rest = &bytes[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().ok()?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    if chunked {
        let mut body = Vec::new();
        loop {
            let end = rest.windows(2).position(|w| w == b"\r\n")?;
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..end]).ok()?.trim(), 16).ok()?;
            rest = &rest[end + 2..];
            if size == 0 {
                return Some((status, body));
            }
            body.extend_from_slice(rest.get(..size)?);
            rest = rest.get(size + 2..)?;
        }
    }
    let body = match length {
        Some(length) => rest.get(..length)?.to_vec(),
        None => rest.to_vec(),
    };
    Some((status, body))
}

/// Calls `host`'s SQS endpoint with `request`, as [`super::front::call`] calls its front;
/// `connect_timeout` bounds the connection, `deadline` the request and its answer.
///
/// # Errors
/// `NotSent` when no connection was made (or the request is one only the front answers);
/// `NoAnswer` when the answer did not arrive in time, the connection broke, or the response
/// does not read as one.
pub async fn call(
    host: &str,
    request: &Request,
    connect_timeout: Duration,
    deadline: Duration,
) -> Result<Answer, Failure> {
    let Some((action, body)) = encode(host, request) else {
        return Err(Failure::NotSent("not an SQS action".to_owned()));
    };
    let tcp =
        match tokio::time::timeout(connect_timeout, TcpStream::connect((host, SQS_PORT))).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(error)) => return Err(Failure::NotSent(error.kind().to_string())),
            Err(_) => return Err(Failure::NotSent("connect timeout".to_owned())),
        };
    let body = body.to_string();
    let text = format!(
        "POST / HTTP/1.1\r\nHost: {host}:{SQS_PORT}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: AmazonSQS.{action}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async move {
        let mut tcp = tcp;
        tcp.write_all(text.as_bytes()).await?;
        tcp.flush().await?;
        let mut response = Vec::new();
        (&mut tcp)
            .take(RESPONSE_BYTES_MAX)
            .read_to_end(&mut response)
            .await?;
        Ok::<Vec<u8>, std::io::Error>(response)
    };
    let response = match tokio::time::timeout(deadline, exchange).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return Err(Failure::NoAnswer(error.kind().to_string())),
        Err(_) => return Err(Failure::NoAnswer("deadline".to_owned())),
    };
    let undecodable = || {
        Failure::NoAnswer(format!(
            "undecodable SQS response {:?}",
            String::from_utf8_lossy(&response)
        ))
    };
    let (status, body) = parse_response(&response).ok_or_else(undecodable)?;
    let body: Value = serde_json::from_slice(&body).map_err(|_| undecodable())?;
    if status == 200 {
        decode(request, &body).ok_or_else(undecodable)
    } else {
        Ok(failed(status, &body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_read_with_a_length_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
        assert_eq!(parse_response(plain), Some((200, b"{}".to_vec())));
        let chunked =
            b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked), Some((400, b"{}".to_vec())));
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn message_ids_read_back_as_the_front_writes_them() {
        let id = 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef_u128;
        assert_eq!(
            message_id(&trireme_core::MessageId(id).to_string()),
            Some(id)
        );
        assert_eq!(message_id("not-an-id"), None);
    }

    #[test]
    fn throttling_and_server_errors_are_unknown_other_errors_refusals() {
        let shape = |s: &str| json!({ "__type": s, "message": "m" });
        assert!(matches!(
            failed(503, &shape("com.amazonaws.sqs#ServiceUnavailable")),
            Answer::Unavailable { .. }
        ));
        assert!(matches!(
            failed(400, &shape("com.amazonaws.sqs#RequestThrottled")),
            Answer::Unavailable { .. }
        ));
        assert_eq!(
            failed(400, &shape("com.amazonaws.sqs#QueueDoesNotExist")),
            Answer::Refused {
                code: "QueueDoesNotExist".to_owned()
            }
        );
    }

    /// The clock gate's refusal did nothing (spec/replication.md#clock-monitoring): the
    /// endpoint's `ServiceUnavailable` for it, whole or for a batch's entry, is a refusal; its
    /// other `ServiceUnavailable`s stay unknown.
    #[test]
    fn the_clock_gates_refusal_is_a_refusal() {
        // As the endpoint words `EngineError::Unavailable` (`SqsError::ReplicasUnavailable`).
        let message = format!(
            "The cluster could not serve the request: node 2 {}: 700 ms from the cluster's clock.",
            trireme_node::cluster::edge::NOT_COORDINATING
        );
        let refused = Answer::Refused {
            code: front::NOT_COORDINATING.to_owned(),
        };
        let body = json!({ "__type": "com.amazonaws.sqs#ServiceUnavailable", "message": message });
        assert_eq!(failed(503, &body), refused);
        let entries = json!({ "Failed": [
            { "Id": "0", "Code": "ServiceUnavailable", "SenderFault": false, "Message": message },
            { "Id": "1", "Code": "ServiceUnavailable", "SenderFault": false, "Message": "m" },
        ] });
        assert_eq!(
            batch(&entries, 2, |_| None),
            Some(Answer::Batch(vec![
                refused,
                Answer::Unavailable {
                    reason: "sqs_entry_ServiceUnavailable".to_owned()
                }
            ]))
        );
        let quorum = json!({
            "__type": "com.amazonaws.sqs#ServiceUnavailable",
            "message": "The cluster could not serve the request: no quorum."
        });
        assert!(matches!(failed(503, &quorum), Answer::Unavailable { .. }));
    }
}
