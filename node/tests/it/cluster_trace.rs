//! One request followed across three members by its trace id: a send through member 1 (over
//! gRPC, then over SQS) carries the id its client chose into member 1's request span, back in
//! the answer's `trireme-trace-id`, and in the metadata of the replica calls it causes, where
//! members 2 and 3 record it in their `replica` spans. The spans are captured by a tracing
//! layer of this test, installed once as the test binary's global subscriber (a default scoped
//! to one thread lost spans to the callsite cache when other tests ran beside it): it sees only
//! spans named `request`, `sqs` and `replica`, and keeps only those whose trace ids carry this
//! test's [`MARK`], so other tests' requests cost it a name check and nothing is kept of them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use trireme_proto::v1 as pb;

use crate::cluster_edges::{EdgeCluster, create};
use crate::harness::{eventually, send_request};

/// What this test's trace ids start with; a random id starts so once in 2^24.
const MARK: &str = "c0ffee";

/// A span as the layer saw it: its name and its fields' values as text.
#[derive(Clone, Debug)]
struct Seen {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture {
    /// Every span by its id while it lives, then kept (ids are reused only after close).
    spans: Arc<Mutex<Vec<Seen>>>,
    open: Arc<Mutex<BTreeMap<u64, usize>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attributes.record(&mut Fields(&mut fields));
        let ours = ["trace_id", "trace_ids"].iter().any(|field| {
            fields
                .get(*field)
                .is_some_and(|ids| ids.split(',').any(|id| id.starts_with(MARK)))
        });
        if !ours {
            return;
        }
        let mut spans = self.spans.lock().unwrap();
        spans.push(Seen {
            name: attributes.metadata().name(),
            fields,
        });
        self.open
            .lock()
            .unwrap()
            .insert(id.into_u64(), spans.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(index) = self.open.lock().unwrap().get(&id.into_u64()) {
            values.record(&mut Fields(&mut self.spans.lock().unwrap()[*index].fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        self.open.lock().unwrap().remove(&id.into_u64());
    }
}

impl Capture {
    /// The capture, installed as the global subscriber at the first call.
    fn installed() -> &'static Capture {
        static CAPTURE: OnceLock<Capture> = OnceLock::new();
        CAPTURE.get_or_init(|| {
            let capture = Capture::default();
            let spans = tracing_subscriber::filter::filter_fn(|metadata| {
                metadata.is_span() && matches!(metadata.name(), "request" | "sqs" | "replica")
            });
            let subscriber = tracing_subscriber::registry().with(
                tracing_subscriber::Layer::with_filter(capture.clone(), spans),
            );
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other test installs a global subscriber");
            capture
        })
    }

    fn spans(&self, name: &str) -> Vec<Seen> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|seen| seen.name == name)
            .cloned()
            .collect()
    }

    /// The members (node ids) whose replica spans list `trace`.
    fn replicas_that_saw(&self, trace: &str) -> Vec<String> {
        self.replicas_that_saw_in(trace, None)
    }

    /// The members (node ids) whose replica spans of `rpc` (any if `None`) list `trace`.
    fn replicas_that_saw_in(&self, trace: &str, rpc: Option<&str>) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .spans("replica")
            .into_iter()
            .filter(|seen| {
                rpc.is_none_or(|rpc| seen.fields.get("rpc").map(String::as_str) == Some(rpc))
            })
            .filter(|seen| {
                seen.fields
                    .get("trace_ids")
                    .is_some_and(|ids| ids.split(',').any(|id| id == trace))
            })
            .map(|seen| seen.fields["node"].clone())
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }
}

/// POSTs one SQS JSON request to `address` with `trace` in `trireme-trace-id`; the answer's
/// head and body.
async fn sqs_post(address: std::net::SocketAddr, action: &str, body: &str, trace: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {address}\r\nX-Amz-Target: AmazonSQS.{action}\r\n\
         Content-Type: application/x-amz-json-1.0\r\ntrireme-trace-id: {trace}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_through_one_member_is_followed_by_its_trace_id_into_the_other_replicas() {
    let capture = Capture::installed();

    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "traced", pb::QueueAttributes::default()).await;

    // gRPC: the client names the trace id; member 1 keeps it and answers with it.
    let trace = "c0ffee000badf00d";
    let mut request = tonic::Request::new(send_request("traced", "followed"));
    request
        .metadata_mut()
        .insert("trireme-trace-id", trace.parse().unwrap());
    let answer = cluster.at(0).send_message(request).await.unwrap();
    assert_eq!(
        answer.metadata().get("trireme-trace-id").unwrap(),
        trace,
        "the answer gives the trace id back"
    );
    let message_id = answer.into_inner().message_id;
    let edge: Vec<Seen> = capture
        .spans("request")
        .into_iter()
        .filter(|seen| seen.fields.get("trace_id").map(String::as_str) == Some(trace))
        .collect();
    assert_eq!(
        edge.len(),
        1,
        "one edge span carries the trace id: {edge:?}"
    );
    assert_eq!(edge[0].fields["queue"], "traced");
    assert_eq!(edge[0].fields["message_id"], message_id);
    // The send's write goes to all three replicas and answers on two: the third's call may
    // still be on its way.
    eventually("members 2 and 3 record the send's trace id", || {
        let nodes = capture.replicas_that_saw(trace);
        async move { nodes == ["2", "3"] }
    })
    .await;
    // Once the send's acks are in, its wake-up goes to every peer with the same id.
    eventually(
        "members 2 and 3 are woken under the send's trace id",
        || {
            let nodes = capture.replicas_that_saw_in(trace, Some("WakeUp"));
            async move { nodes == ["2", "3"] }
        },
    )
    .await;
    assert!(
        capture.replicas_that_saw("c0ffee1111111111").is_empty(),
        "an id no request carried is seen nowhere"
    );

    // SQS: the same through member 1's SQS endpoint.
    let trace = "c0ffee55aa55aa55";
    let queue_url = format!(
        "http://127.0.0.1:{}/000000000000/traced",
        cluster.members[0].sqs.port()
    );
    let body = format!(r#"{{"QueueUrl":"{queue_url}","MessageBody":"followed too"}}"#);
    let answer = sqs_post(cluster.members[0].sqs, "SendMessage", &body, trace).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains(&format!("trireme-trace-id: {trace}")),
        "{answer}"
    );
    let edge: Vec<Seen> = capture
        .spans("sqs")
        .into_iter()
        .filter(|seen| seen.fields.get("trace_id").map(String::as_str) == Some(trace))
        .collect();
    assert_eq!(edge.len(), 1, "{edge:?}");
    assert_eq!(edge[0].fields["queue"], "traced");
    assert!(answer.contains(&edge[0].fields["message_id"]), "{answer}");
    eventually("members 2 and 3 record the SQS send's trace id", || {
        let nodes = capture.replicas_that_saw(trace);
        async move { nodes == ["2", "3"] }
    })
    .await;
    cluster.shutdown().await;
}
