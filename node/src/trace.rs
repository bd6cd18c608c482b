//! Following one request across the members: its trace id.
//!
//! Every inbound request at an edge (gRPC, SQS) gets a trace id, or keeps the one its client
//! sent in `trireme-trace-id`; the id is a field of the request's span and is sent back in the
//! answer's `trireme-trace-id` header, so a client can find its request in the logs. While the
//! request runs, the id is the task's current trace ([`scope`], [`current`]), and every replica
//! call the request causes carries it to the peer in the gRPC metadata key
//! [`TRACE_IDS_KEY`]; the peer's replica service records it as the `trace_ids` field of its own
//! span. One request is then found in the three members' logs by one id.
//!
//! A task-local, not the tracing span, carries the id: it reaches the peer links whatever
//! subscriber is installed (none in most tests), and costs nothing when logs are off. A task
//! the request spawns inherits it only through [`inherit`]. A batch of the peer links serves
//! several requests at once, so its metadata lists their ids (at most
//! `limits::trace_ids_per_call_max`, the rest counted). This module only labels: nothing is
//! decided on a trace id.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::http;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::limits;

/// The header (HTTP) and metadata key (gRPC) of an edge request's trace id, both ways.
pub const TRACE_ID_HEADER: &str = "trireme-trace-id";
/// [`TRACE_ID_HEADER`] as a header name, made once: a name given as text is parsed again on
/// every insert and lookup.
pub const TRACE_ID_NAME: http::HeaderName = http::HeaderName::from_static(TRACE_ID_HEADER);
/// The metadata key of a replica call: the trace ids of the requests it serves, comma-separated.
pub const TRACE_IDS_KEY: &str = "trireme-trace-ids";

/// One request's trace id: 64 random bits, written as 16 lowercase hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TraceId(pub u64);

impl TraceId {
    /// The id `text` writes, if it is one: exactly 16 hex digits (a client's header of any other
    /// shape is ignored, and a fresh id used instead).
    #[must_use]
    pub fn parse(text: &str) -> Option<TraceId> {
        if text.len() != 16 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(text, 16).ok().map(TraceId)
    }

    /// The id as a header value, marked never to be indexed by HTTP/2's header compression.
    ///
    /// Every answer's id is new, so HPACK's table (RFC 7541 §2.3.2) would only fill with ids
    /// never sent again: each would evict an entry worth keeping, and the encoder would compare
    /// every id against all those before it (BENCHMARKS.md 6o: 6 % of a member's instructions
    /// per idle long poll). A never-indexed literal (§6.2.3) costs neither side a table entry.
    #[must_use]
    pub fn header_value(self) -> http::HeaderValue {
        let mut value = http::HeaderValue::from_bytes(&self.hex_digits())
            .expect("hex digits are a valid header");
        value.set_sensitive(true);
        value
    }

    /// The id's 16 lowercase hex digits, without formatting machinery.
    fn hex_digits(self) -> [u8; 16] {
        let mut digits = [0; 16];
        hex::encode_to_slice(self.0.to_be_bytes(), &mut digits)
            .expect("8 bytes make 16 hex digits");
        digits
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Where a node's fresh trace ids come from: a stream of its seed when it has one, so that a
/// simulated run sends the same bytes when it replays (ids travel in metadata), else the OS.
/// Cheap to clone; the clones share the stream.
#[derive(Clone, Debug)]
pub struct TraceIds(Arc<Mutex<ChaCha20Rng>>);

impl TraceIds {
    /// The trace ids of a node seeded with `seed` (`None`: from the OS).
    #[must_use]
    pub fn new(seed: Option<u64>) -> TraceIds {
        let rng = match seed {
            // A stream apart from the node's other seeded streams ("trace_id").
            Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ 0x7472_6163_655f_6964),
            None => ChaCha20Rng::from_os_rng(),
        };
        TraceIds(Arc::new(Mutex::new(rng)))
    }

    /// A fresh id.
    #[must_use]
    pub fn next(&self) -> TraceId {
        TraceId(
            self.0
                .lock()
                .expect("the trace id stream's lock is never poisoned")
                .random(),
        )
    }

    /// The id a client sent in `headers`, else a fresh one.
    #[must_use]
    pub fn of_request(&self, headers: &http::HeaderMap) -> TraceId {
        headers
            .get(TRACE_ID_NAME)
            .and_then(|value| value.to_str().ok())
            .and_then(TraceId::parse)
            .unwrap_or_else(|| self.next())
    }
}

impl Default for TraceIds {
    fn default() -> TraceIds {
        TraceIds::new(None)
    }
}

tokio::task_local! {
    static CURRENT: TraceId;
}

/// Runs `future` with `trace` as its current trace id.
pub async fn scope<F: Future>(trace: TraceId, future: F) -> F::Output {
    CURRENT.scope(trace, future).await
}

/// Runs `f` with `trace` as the current trace id: [`scope`] for a future its caller polls by
/// hand, each poll and its drop in `f`, which needs no future of its own to be boxed.
pub fn sync_scope<R>(trace: TraceId, f: impl FnOnce() -> R) -> R {
    CURRENT.sync_scope(trace, f)
}

/// The current task's trace id, if it serves a request.
#[must_use]
pub fn current() -> Option<TraceId> {
    CURRENT.try_with(|trace| *trace).ok()
}

/// `future` with the current trace id (if any), for a task the request spawns.
pub fn inherit<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let trace = current();
    async move {
        match trace {
            Some(trace) => CURRENT.scope(trace, future).await,
            None => future.await,
        }
    }
}

/// The metadata value listing `traces` (deduplicated by the caller), at most
/// `limits::trace_ids_per_call_max` of them and `+N` for the rest; `None` when empty.
#[must_use]
pub fn ids_value(traces: &[TraceId]) -> Option<tonic::metadata::AsciiMetadataValue> {
    if traces.is_empty() {
        return None;
    }
    let mut text = String::with_capacity(17 * traces.len().min(limits::trace_ids_per_call_max));
    for (index, trace) in traces
        .iter()
        .take(limits::trace_ids_per_call_max)
        .enumerate()
    {
        if index > 0 {
            text.push(',');
        }
        text.push_str(&trace.to_string());
    }
    if traces.len() > limits::trace_ids_per_call_max {
        text.push_str(&format!(
            ",+{}",
            traces.len() - limits::trace_ids_per_call_max
        ));
    }
    Some(
        text.parse()
            .expect("hex digits, commas and + are valid metadata"),
    )
}

/// Attaches the current trace id to a replica call that serves one request.
pub fn attach<T>(request: &mut tonic::Request<T>) {
    if let Some(value) = current().and_then(|trace| ids_value(&[trace])) {
        request.metadata_mut().insert(TRACE_IDS_KEY, value);
    }
}

/// The trace ids a replica call carries, as received (for the span's `trace_ids` field):
/// only a value of the shape [`ids_value`] writes and at most its length, else empty.
#[must_use]
pub fn ids_received(metadata: &tonic::metadata::MetadataMap) -> String {
    let Some(text) = metadata
        .get(TRACE_IDS_KEY)
        .and_then(|value| value.to_str().ok())
    else {
        return String::new();
    };
    let longest = 17 * limits::trace_ids_per_call_max + 12;
    let shaped = text.len() <= longest
        && text
            .bytes()
            .all(|byte| byte.is_ascii_hexdigit() || byte == b',' || byte == b'+');
    if shaped {
        text.to_owned()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_sixteen_hex_digits_both_ways() {
        let trace = TraceId(0x00ab_cdef_0123_4567);
        assert_eq!(trace.to_string(), "00abcdef01234567");
        assert_eq!(TraceId::parse("00abcdef01234567"), Some(trace));
        assert_eq!(TraceId::parse("abc"), None);
        assert_eq!(TraceId::parse("00abcdef0123456z"), None);
        assert_eq!(TraceId::parse("<script>alert(1)"), None);
    }

    #[test]
    fn a_trace_id_header_is_its_hex_digits_and_never_indexed() {
        for trace in [
            TraceId(0),
            TraceId(0x00ab_cdef_0123_4567),
            TraceId(u64::MAX),
        ] {
            let value = trace.header_value();
            assert_eq!(value.to_str().unwrap(), trace.to_string());
            assert!(value.is_sensitive(), "HPACK must not index {trace}");
        }
    }

    #[test]
    fn a_call_lists_at_most_its_cap_of_ids_and_counts_the_rest() {
        let many: Vec<TraceId> = (0..limits::trace_ids_per_call_max as u64 + 3)
            .map(TraceId)
            .collect();
        let value = ids_value(&many).unwrap();
        let text = value.to_str().unwrap().to_owned();
        assert_eq!(text.split(',').count(), limits::trace_ids_per_call_max + 1);
        assert!(text.ends_with(",+3"), "{text}");
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(TRACE_IDS_KEY, value);
        assert_eq!(ids_received(&metadata), text);
        metadata.insert(TRACE_IDS_KEY, "a b".parse().unwrap());
        assert_eq!(ids_received(&metadata), "");
        assert_eq!(ids_value(&[]), None);
    }

    #[test]
    fn a_seeded_node_draws_the_same_trace_ids_again() {
        let (first, second) = (TraceIds::new(Some(7)), TraceIds::new(Some(7)));
        let drawn: Vec<TraceId> = (0..4).map(|_| first.next()).collect();
        assert_eq!(drawn, (0..4).map(|_| second.next()).collect::<Vec<_>>());
        assert_ne!(drawn[0], TraceIds::new(Some(8)).next());
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACE_ID_HEADER, "00000000000000ff".parse().unwrap());
        assert_eq!(
            first.of_request(&headers),
            TraceId(0xff),
            "the client's id is kept"
        );
    }

    #[tokio::test]
    async fn a_spawned_task_inherits_the_trace_only_when_asked() {
        let trace = TraceId(7);
        let (inherited, lost) = scope(trace, async {
            let inherited = tokio::spawn(inherit(async { current() }));
            let lost = tokio::spawn(async { current() });
            (inherited.await.unwrap(), lost.await.unwrap())
        })
        .await;
        assert_eq!(inherited, Some(trace));
        assert_eq!(lost, None);
        assert_eq!(current(), None);
    }
}
