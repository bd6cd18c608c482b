//! SigV4 verification of SQS requests (the `Authorization` header form and the presigned query
//! form). The input is split at 0xFF bytes into the path, the query, the headers (one
//! `name: value` per line) and the body; the method is POST when the input starts with an even
//! byte. It is verified against one configured key at a fixed time. Any verdict is fine; a
//! panic or an abort is a finding.
#![no_main]

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use trireme_node::sqs::AccessKey;
use trireme_node::sqs::sigv4::{SignedRequest, verify};

/// The AWS SigV4 test suite's time, 2015-08-30T12:36:00Z.
const NOW_MS: u64 = 1_440_938_160_000;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let method = if first % 2 == 0 {
        Method::POST
    } else {
        Method::GET
    };
    let mut parts = rest.splitn(4, |byte| *byte == 0xFF);
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let query = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let header_block = parts.next().unwrap_or_default();
    let body = parts.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for line in header_block.split(|byte| *byte == b'\n') {
        let Some(colon) = line.iter().position(|byte| *byte == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) {
            headers.append(name, value);
        }
    }
    let keys = [AccessKey {
        id: "AKIDEXAMPLE".to_owned(),
        secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_owned(),
        queue_prefixes: Vec::new(),
    }];
    let request = SignedRequest {
        method: &method,
        path: &path,
        query: &query,
        headers: &headers,
        body,
    };
    let _ = verify(&request, &keys, NOW_MS);
});
