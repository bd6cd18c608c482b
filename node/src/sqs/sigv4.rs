//! Verification of AWS Signature Version 4 on SQS requests, used when access keys are
//! configured. The server rebuilds the canonical request from what it received, derives the
//! signing key from the configured secret, and compares signatures in constant time.
//!
//! Both of SigV4's forms are accepted: the `Authorization` header (SDKs and the CLI use it) and
//! the query string of a presigned URL (`X-Amz-Algorithm`, `X-Amz-Credential`, `X-Amz-Date`,
//! `X-Amz-Expires`, `X-Amz-SignedHeaders`, `X-Amz-Signature`), which is valid from its date for
//! `X-Amz-Expires` seconds (at most 7 days, as AWS allows). A presigned request's canonical query
//! is its query without `X-Amz-Signature`, and its payload hash is that of its body (as
//! botocore's generic query signer makes it), so a presigned URL cannot carry another body than
//! the one signed. The region in the credential scope is the client's choice, and chooses whose
//! queues the request acts on ([`signing_region`]; queues are kept per region, as in SQS). This
//! module never logs a secret and never answers which part of a signature was wrong beyond what
//! AWS itself says.

use axum::http::{HeaderMap, Method};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::digest::to_hex;
use super::error::SqsError;
use super::limits::{clock_skew_ms_max, presigned_expires_s_max};

type HmacSha256 = Hmac<Sha256>;

/// The only algorithm SigV4 names.
const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// One configured access key.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessKey {
    /// The public id (`AKIA…` on AWS; any text here).
    pub id: String,
    /// The secret; never printed.
    pub secret: String,
    /// The queues this key may name: those whose names begin with one of these prefixes. Empty:
    /// every queue.
    pub queue_prefixes: Vec<String>,
}

impl AccessKey {
    /// Whether this key may name the queue `name`.
    #[must_use]
    pub fn allows(&self, name: &str) -> bool {
        self.queue_prefixes.is_empty()
            || self
                .queue_prefixes
                .iter()
                .any(|prefix| name.starts_with(prefix.as_str()))
    }
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AccessKey {{ id: {:?}, secret: .., queue_prefixes: {:?} }}",
            self.id, self.queue_prefixes
        )
    }
}

/// What the verifier needs from a request; borrowed, so verification copies nothing large.
#[derive(Debug)]
pub struct SignedRequest<'a> {
    /// The HTTP method.
    pub method: &'a Method,
    /// The path exactly as received (percent-encoded as the client sent it).
    pub path: &'a str,
    /// The raw query string, without `?`.
    pub query: &'a str,
    /// All headers.
    pub headers: &'a HeaderMap,
    /// The body bytes.
    pub body: &'a [u8],
}

/// The parsed `Authorization` header, or the same parts of a presigned query.
#[derive(Debug, PartialEq, Eq)]
struct Authorization<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

/// Checks the request's signature against `keys` at server time `now_ms` (ms since the epoch),
/// in the header form or, without an `Authorization` header, the presigned query form.
/// Returns the access key that signed it.
///
/// # Errors
/// `MissingAuthenticationToken` without a signature of either form; `IncompleteSignature` for a
/// malformed one; `InvalidClientTokenId` for an unknown key id; `RequestExpired` for an
/// `X-Amz-Date` more than 15 minutes off (a presigned one: more than 15 minutes ahead) or a
/// presigned request past its `X-Amz-Expires`; `SignatureDoesNotMatch` otherwise when the
/// signature is wrong.
pub fn verify<'k>(
    request: &SignedRequest<'_>,
    keys: &'k [AccessKey],
    now_ms: u64,
) -> Result<&'k AccessKey, SqsError> {
    let Some(header) = request.headers.get("authorization") else {
        if presigned(request.query) {
            return verify_presigned(request, keys, now_ms);
        }
        return Err(SqsError::MissingAuthenticationToken);
    };
    let header = header.to_str().map_err(|_| SqsError::IncompleteSignature {
        reason: "the Authorization header is not ASCII".to_owned(),
    })?;
    let authorization = parse_authorization(header)?;
    let key = keys
        .iter()
        .find(|key| key.id == authorization.access_key_id)
        .ok_or(SqsError::InvalidClientTokenId)?;

    let amz_date = request
        .headers
        .get("x-amz-date")
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| SqsError::IncompleteSignature {
            reason: "the X-Amz-Date header is missing".to_owned(),
        })?;
    let signed_at_ms = amz_date_ms(amz_date)?;
    if signed_at_ms.abs_diff(now_ms) > clock_skew_ms_max {
        return Err(SqsError::RequestExpired {
            signed_at: amz_date.to_owned(),
            now: format_amz_date(now_ms),
        });
    }
    check_signature(
        request,
        key,
        &authorization,
        amz_date,
        &canonical_query(request.query, false),
    )?;
    Ok(key)
}

/// Whether the query carries a presigned signature's parameters.
fn presigned(query: &str) -> bool {
    query_pairs(query).any(|(name, _)| name == "X-Amz-Signature" || name == "X-Amz-Algorithm")
}

/// The query's parameters, percent-decoded, in the order sent.
fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
}

/// The presigned query form (see the module's documentation).
fn verify_presigned<'k>(
    request: &SignedRequest<'_>,
    keys: &'k [AccessKey],
    now_ms: u64,
) -> Result<&'k AccessKey, SqsError> {
    let incomplete = |reason: String| SqsError::IncompleteSignature { reason };
    let mut parameters: std::collections::BTreeMap<String, String> = Default::default();
    for (name, value) in query_pairs(request.query) {
        if name.starts_with("X-Amz-") && parameters.insert(name.clone(), value).is_some() {
            return Err(incomplete(format!("the query names {name} twice")));
        }
    }
    let parameter = |name: &str| {
        parameters
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| incomplete(format!("the presigned query has no {name}")))
    };
    if parameter("X-Amz-Algorithm")? != ALGORITHM {
        return Err(incomplete(format!("X-Amz-Algorithm must be {ALGORITHM}")));
    }
    let (access_key_id, date, region, service) = parse_credential(parameter("X-Amz-Credential")?)?;
    let amz_date = parameter("X-Amz-Date")?;
    let expires_s: u64 = parameter("X-Amz-Expires")?
        .parse()
        .ok()
        .filter(|seconds| *seconds <= presigned_expires_s_max)
        .ok_or_else(|| {
            incomplete(format!(
                "X-Amz-Expires must be a number of seconds from 0 to {presigned_expires_s_max}"
            ))
        })?;
    let authorization = Authorization {
        access_key_id,
        date,
        region,
        service,
        signed_headers: parameter("X-Amz-SignedHeaders")?.split(';').collect(),
        signature: parameter("X-Amz-Signature")?,
    };
    let key = keys
        .iter()
        .find(|key| key.id == authorization.access_key_id)
        .ok_or(SqsError::InvalidClientTokenId)?;
    let signed_at_ms = amz_date_ms(amz_date)?;
    if signed_at_ms > now_ms.saturating_add(clock_skew_ms_max) {
        return Err(SqsError::RequestExpired {
            signed_at: amz_date.to_owned(),
            now: format_amz_date(now_ms),
        });
    }
    let expires_at_ms = signed_at_ms.saturating_add(expires_s * 1_000);
    if now_ms > expires_at_ms {
        return Err(SqsError::PresignedRequestExpired {
            expired_at: format_amz_date(expires_at_ms),
            now: format_amz_date(now_ms),
        });
    }
    check_signature(
        request,
        key,
        &authorization,
        amz_date,
        &canonical_query(request.query, true),
    )?;
    Ok(key)
}

/// The milliseconds of an `X-Amz-Date`, or `IncompleteSignature` saying its form.
fn amz_date_ms(amz_date: &str) -> Result<u64, SqsError> {
    parse_amz_date(amz_date).ok_or_else(|| SqsError::IncompleteSignature {
        reason: format!("X-Amz-Date {amz_date} is not of the form YYYYMMDDTHHMMSSZ"),
    })
}

/// Compares the signature of either form with the one `key` makes of the request.
fn check_signature(
    request: &SignedRequest<'_>,
    key: &AccessKey,
    authorization: &Authorization<'_>,
    amz_date: &str,
    canonical_query: &str,
) -> Result<(), SqsError> {
    if !amz_date.starts_with(authorization.date) {
        return Err(SqsError::IncompleteSignature {
            reason: format!(
                "the credential scope date {} is not the date of X-Amz-Date {amz_date}",
                authorization.date
            ),
        });
    }
    if !authorization.signed_headers.contains(&"host") {
        return Err(SqsError::IncompleteSignature {
            reason: "the Host header must be signed".to_owned(),
        });
    }

    let scope = format!(
        "{}/{}/{}/aws4_request",
        authorization.date, authorization.region, authorization.service
    );
    let signing_key = signing_key(
        &key.secret,
        authorization.date,
        authorization.region,
        authorization.service,
    );
    let expected =
        from_hex(authorization.signature).ok_or_else(|| SqsError::IncompleteSignature {
            reason: "the signature is not hexadecimal".to_owned(),
        })?;

    // SDKs for services other than S3 encode each path segment twice; a client that encodes
    // once is also accepted, so both canonical forms are tried.
    let double = uri_encode(request.path, false);
    let mut last = None;
    for canonical_uri in [double.as_str(), request.path] {
        let canonical_request = canonical_request(
            request,
            &authorization.signed_headers,
            canonical_uri,
            canonical_query,
        )?;
        let string_to_sign = format!(
            "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
            to_hex(&Sha256::digest(canonical_request.as_bytes()))
        );
        let mut mac =
            HmacSha256::new_from_slice(&signing_key).expect("HMAC takes keys of any length");
        mac.update(string_to_sign.as_bytes());
        if mac.verify_slice(&expected).is_ok() {
            return Ok(());
        }
        last = Some((canonical_request, string_to_sign));
        if double == request.path {
            break;
        }
    }
    let (canonical_request, string_to_sign) = last.expect("the loop runs at least once");
    Err(SqsError::SignatureDoesNotMatch {
        canonical_request,
        string_to_sign,
    })
}

fn parse_authorization(header: &str) -> Result<Authorization<'_>, SqsError> {
    let incomplete = |reason: &str| SqsError::IncompleteSignature {
        reason: reason.to_owned(),
    };
    let rest = header
        .strip_prefix(ALGORITHM)
        .ok_or_else(|| incomplete("the Authorization header must start with AWS4-HMAC-SHA256"))?;
    let mut credential = None;
    let mut signed_headers = None;
    let mut signature = None;
    for component in rest.split(',') {
        let component = component.trim();
        if let Some(value) = component.strip_prefix("Credential=") {
            credential = Some(value);
        } else if let Some(value) = component.strip_prefix("SignedHeaders=") {
            signed_headers = Some(value);
        } else if let Some(value) = component.strip_prefix("Signature=") {
            signature = Some(value);
        }
    }
    let credential = credential.ok_or_else(|| incomplete("Credential is missing"))?;
    let signed_headers = signed_headers.ok_or_else(|| incomplete("SignedHeaders is missing"))?;
    let signature = signature.ok_or_else(|| incomplete("Signature is missing"))?;
    let (access_key_id, date, region, service) = parse_credential(credential)?;
    Ok(Authorization {
        access_key_id,
        date,
        region,
        service,
        signed_headers: signed_headers.split(';').collect(),
        signature,
    })
}

/// `<key id>/<date>/<region>/<service>/aws4_request`, as its four parts.
fn parse_credential(credential: &str) -> Result<(&str, &str, &str, &str), SqsError> {
    let malformed = || SqsError::IncompleteSignature {
        reason: "Credential must be <key id>/<date>/<region>/<service>/aws4_request".to_owned(),
    };
    let parts: Vec<&str> = credential.split('/').collect();
    let [access_key_id, date, region, service, terminator] = parts.as_slice() else {
        return Err(malformed());
    };
    if *terminator != "aws4_request" || date.len() != 8 || access_key_id.is_empty() {
        return Err(malformed());
    }
    Ok((access_key_id, date, region, service))
}

fn canonical_request(
    request: &SignedRequest<'_>,
    signed_headers: &[&str],
    canonical_uri: &str,
    canonical_query: &str,
) -> Result<String, SqsError> {
    let mut canonical_headers = String::new();
    for name in signed_headers {
        let values: Vec<String> = request
            .headers
            .get_all(*name)
            .iter()
            .map(|value| collapse_spaces(&String::from_utf8_lossy(value.as_bytes())))
            .collect();
        if values.is_empty() {
            return Err(SqsError::IncompleteSignature {
                reason: format!("the signed header {name} is not in the request"),
            });
        }
        canonical_headers.push_str(name);
        canonical_headers.push(':');
        canonical_headers.push_str(&values.join(","));
        canonical_headers.push('\n');
    }
    let payload_hash = match request
        .headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
    {
        Some("UNSIGNED-PAYLOAD") => "UNSIGNED-PAYLOAD".to_owned(),
        _ => to_hex(&Sha256::digest(request.body)),
    };
    Ok(format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method.as_str(),
        if canonical_uri.is_empty() {
            "/"
        } else {
            canonical_uri
        },
        canonical_query,
        canonical_headers,
        signed_headers.join(";"),
        payload_hash
    ))
}

/// Query parameters decoded, re-encoded the SigV4 way and sorted by name then value; without
/// `X-Amz-Signature` when `presigned` (a signature cannot sign itself).
fn canonical_query(query: &str, presigned: bool) -> String {
    let mut pairs: Vec<(String, String)> = query_pairs(query)
        .filter(|(name, _)| !(presigned && name == "X-Amz-Signature"))
        .map(|(name, value)| (uri_encode(&name, true), uri_encode(&value, true)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// SigV4's URI encoding: unreserved characters stay, everything else becomes `%XX` (upper
/// case); `/` is kept unless `encode_slash`.
fn uri_encode(text: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        let keep = byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'_' | b'.' | b'~')
            || (byte == b'/' && !encode_slash);
        if keep {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex_digit = |byte: u8| char::from(byte).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2]))
        {
            out.push(u8::try_from(high * 16 + low).expect("two hex digits fit a byte"));
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The bytes of a hex string; `None` for odd length or a non-hex character.
fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            let high = char::from(pair[0]).to_digit(16)?;
            let low = char::from(pair[1]).to_digit(16)?;
            u8::try_from(high * 16 + low).ok()
        })
        .collect()
}

/// Trims a header value and collapses runs of spaces into one, as SigV4 requires.
fn collapse_spaces(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let mut key = format!("AWS4{secret}").into_bytes();
    for part in [date, region, service, "aws4_request"] {
        let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length");
        mac.update(part.as_bytes());
        key = mac.finalize().into_bytes().to_vec();
    }
    key
}

/// Milliseconds since the epoch of a `YYYYMMDDTHHMMSSZ` timestamp.
fn parse_amz_date(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.len() != 16 || bytes[8] != b'T' || bytes[15] != b'Z' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1_000)
}

/// `YYYYMMDDTHHMMSSZ` for a time in ms since the epoch.
fn format_amz_date(ms: u64) -> String {
    let seconds = ms / 1_000;
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

// Howard Hinnant's civil-date algorithms, restricted to dates from 1970 on.
fn days_from_civil(year: u64, month: u64, day: u64) -> Option<u64> {
    let year = if month <= 2 {
        year.checked_sub(1)?
    } else {
        year
    };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    (era * 146_097 + day_of_era).checked_sub(719_468)
}

fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// The region a request was signed for: the credential scope's region in its `Authorization`
/// header, or in its `X-Amz-Credential` query parameter (a presigned request). `None` for a
/// request that carries no credential, or one too malformed to name a region (with no keys
/// configured such requests are served in the node's own region; with keys, [`verify`] has
/// refused them already).
///
/// # Errors
/// `IncompleteSignature` when the scope names a region that is not 1–32 characters of
/// `[a-z0-9-]`: it could name no queue.
pub fn signing_region<'a>(
    headers: &'a HeaderMap,
    query: &'a str,
) -> Result<Option<&'a str>, SqsError> {
    let from_header = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|header| parse_authorization(header).ok())
        .map(|authorization| authorization.region);
    let from_query = || {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("X-Amz-Credential="))
            .and_then(|credential| {
                // `/` arrives percent-encoded; region names need no other decoding.
                let mut parts = credential.split("%2F").flat_map(|part| part.split('/'));
                parts.nth(2)
            })
    };
    let Some(region) = from_header.or_else(from_query) else {
        return Ok(None);
    };
    if trireme_core::region_is_legal(region) {
        Ok(Some(region))
    } else {
        Err(SqsError::IncompleteSignature {
            reason: format!("the credential scope's region {region:?} is not a region name"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// The AWS SigV4 test suite's example credentials and time.
    const KEY_ID: &str = "AKIDEXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const SUITE_TIME_MS: u64 = 1_440_938_160_000; // 2015-08-30T12:36:00Z

    fn keys() -> Vec<AccessKey> {
        vec![AccessKey {
            id: KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
            queue_prefixes: Vec::new(),
        }]
    }

    fn vanilla_headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("example.amazonaws.com"));
        headers.insert("x-amz-date", HeaderValue::from_static("20150830T123600Z"));
        headers.insert(
            "authorization",
            HeaderValue::from_str(authorization).unwrap(),
        );
        headers
    }

    const GET_VANILLA: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";

    fn get(headers: &HeaderMap) -> SignedRequest<'_> {
        SignedRequest {
            method: &Method::GET,
            path: "/",
            query: "",
            headers,
            body: b"",
        }
    }

    #[test]
    fn suite_get_vanilla_verifies() {
        let headers = vanilla_headers(GET_VANILLA);
        assert_eq!(
            verify(&get(&headers), &keys(), SUITE_TIME_MS).map(|key| key.id.as_str()),
            Ok(KEY_ID)
        );
    }

    #[test]
    fn a_changed_request_no_longer_verifies() {
        let headers = vanilla_headers(GET_VANILLA);
        let post = SignedRequest {
            method: &Method::POST,
            ..get(&headers)
        };
        assert!(matches!(
            verify(&post, &keys(), SUITE_TIME_MS),
            Err(SqsError::SignatureDoesNotMatch { .. })
        ));
        let with_body = SignedRequest {
            body: b"{}",
            ..get(&headers)
        };
        assert!(matches!(
            verify(&with_body, &keys(), SUITE_TIME_MS),
            Err(SqsError::SignatureDoesNotMatch { .. })
        ));
        let wrong_secret = vec![AccessKey {
            id: KEY_ID.to_owned(),
            secret: "other".to_owned(),
            queue_prefixes: Vec::new(),
        }];
        assert!(matches!(
            verify(&get(&headers), &wrong_secret, SUITE_TIME_MS),
            Err(SqsError::SignatureDoesNotMatch { .. })
        ));
    }

    #[test]
    fn unknown_key_missing_header_and_stale_date_are_refused() {
        let headers = vanilla_headers(&GET_VANILLA.replace("AKIDEXAMPLE", "AKIDOTHER"));
        assert_eq!(
            verify(&get(&headers), &keys(), SUITE_TIME_MS).map(|key| key.id.as_str()),
            Err(SqsError::InvalidClientTokenId)
        );
        let mut unsigned = vanilla_headers(GET_VANILLA);
        unsigned.remove("authorization");
        assert_eq!(
            verify(&get(&unsigned), &keys(), SUITE_TIME_MS).map(|key| key.id.as_str()),
            Err(SqsError::MissingAuthenticationToken)
        );
        let headers = vanilla_headers(GET_VANILLA);
        let late = SUITE_TIME_MS + clock_skew_ms_max + 1_000;
        assert!(matches!(
            verify(&get(&headers), &keys(), late),
            Err(SqsError::RequestExpired { .. })
        ));
        let still_fine = SUITE_TIME_MS + clock_skew_ms_max - 1_000;
        assert!(verify(&get(&headers), &keys(), still_fine).is_ok());
    }

    #[test]
    fn malformed_authorization_is_incomplete() {
        for bad in [
            "Basic abc",
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, Signature=00",
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1, SignedHeaders=host, Signature=00",
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=x-amz-date, Signature=00",
        ] {
            let headers = vanilla_headers(bad);
            assert!(
                matches!(
                    verify(&get(&headers), &keys(), SUITE_TIME_MS),
                    Err(SqsError::IncompleteSignature { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn signing_key_matches_the_documented_derivation() {
        // The example in AWS's SigV4 documentation (IAM, 2012-02-15).
        assert_eq!(
            to_hex(&signing_key(SECRET, "20120215", "us-east-1", "iam")),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn canonical_query_sorts_and_encodes() {
        assert_eq!(canonical_query("b=2&a=x%20y&a=1", false), "a=1&a=x%20y&b=2");
        assert_eq!(canonical_query("", false), "");
        assert_eq!(
            canonical_query("X-Amz-Signature=ab&a=1", true),
            "a=1",
            "a presigned query's signature is not signed"
        );
        assert_eq!(uri_encode("/000/q%3A", false), "/000/q%253A");
    }

    #[test]
    fn amz_dates_parse_and_format_round_trip() {
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(SUITE_TIME_MS));
        assert_eq!(format_amz_date(SUITE_TIME_MS), "20150830T123600Z");
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(format_amz_date(951_782_400_000), "20000229T000000Z");
        for bad in [
            "2015-08-30T12:36:00Z",
            "20151330T123600Z",
            "20150830T123600",
        ] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    /// A request presigned by the `aws-sigv4` crate (the AWS SDK for Rust's signer) at
    /// `signed_at`, valid for `expires_s`: its query, and the headers it signed.
    fn presigned_by_sdk(
        method: &str,
        path_and_query: &str,
        body: &[u8],
        signed_at: std::time::SystemTime,
        expires_s: u64,
    ) -> String {
        use aws_sigv4::http_request::{
            SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
        };
        let identity =
            aws_credential_types::Credentials::new(KEY_ID, SECRET, None, None, "test").into();
        let mut settings = SigningSettings::default();
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(std::time::Duration::from_secs(expires_s));
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("sqs")
            .time(signed_at)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let url = format!("http://localhost:9324{path_and_query}");
        let request = SignableRequest::new(
            method,
            &url,
            [("host", "localhost:9324")].into_iter(),
            SignableBody::Bytes(body),
        )
        .unwrap();
        let (instructions, _) = sign(request, &params).unwrap().into_parts();
        let mut http_request = axum::http::Request::builder()
            .method(method)
            .uri(&url)
            .body(())
            .unwrap();
        instructions.apply_to_request_http1x(&mut http_request);
        http_request.uri().query().unwrap().to_owned()
    }

    fn host_only() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("localhost:9324"));
        headers
    }

    fn at(ms: u64) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)
    }

    #[test]
    fn a_url_presigned_by_the_sdk_verifies_until_it_expires() {
        let body = br#"{"QueueUrl":"jobs"}"#;
        let query = presigned_by_sdk(
            "POST",
            "/000000000000/jobs?a=1",
            body,
            at(SUITE_TIME_MS),
            300,
        );
        assert!(query.contains("X-Amz-Signature="), "{query}");
        let headers = host_only();
        let request = SignedRequest {
            method: &Method::POST,
            path: "/000000000000/jobs",
            query: &query,
            headers: &headers,
            body,
        };
        assert_eq!(
            verify(&request, &keys(), SUITE_TIME_MS).map(|key| key.id.as_str()),
            Ok(KEY_ID)
        );
        assert!(verify(&request, &keys(), SUITE_TIME_MS + 300_000).is_ok());
        assert!(matches!(
            verify(&request, &keys(), SUITE_TIME_MS + 300_001),
            Err(SqsError::PresignedRequestExpired { .. })
        ));
        // Signed more than 15 minutes in the future.
        assert!(matches!(
            verify(&request, &keys(), SUITE_TIME_MS - clock_skew_ms_max - 1_000),
            Err(SqsError::RequestExpired { .. })
        ));
    }

    #[test]
    fn a_presigned_url_with_another_body_query_or_secret_is_refused() {
        let body = br#"{"QueueUrl":"jobs"}"#;
        let query = presigned_by_sdk("POST", "/?a=1", body, at(SUITE_TIME_MS), 300);
        let headers = host_only();
        let request = SignedRequest {
            method: &Method::POST,
            path: "/",
            query: &query,
            headers: &headers,
            body,
        };
        assert!(verify(&request, &keys(), SUITE_TIME_MS).is_ok());
        let other_body = SignedRequest {
            body: br#"{"QueueUrl":"other"}"#,
            ..request
        };
        assert!(matches!(
            verify(&other_body, &keys(), SUITE_TIME_MS),
            Err(SqsError::SignatureDoesNotMatch { .. })
        ));
        let changed = query.replace("a=1", "a=2");
        let other_query = SignedRequest {
            query: &changed,
            ..request
        };
        assert!(matches!(
            verify(&other_query, &keys(), SUITE_TIME_MS),
            Err(SqsError::SignatureDoesNotMatch { .. })
        ));
        let wrong_secret = vec![AccessKey {
            secret: "other".to_owned(),
            ..keys().remove(0)
        }];
        assert!(matches!(
            verify(&request, &wrong_secret, SUITE_TIME_MS),
            Err(SqsError::SignatureDoesNotMatch { .. })
        ));
        let unknown = vec![AccessKey {
            id: "AKIDOTHER".to_owned(),
            ..keys().remove(0)
        }];
        assert_eq!(
            verify(&request, &unknown, SUITE_TIME_MS).map(|key| key.id.as_str()),
            Err(SqsError::InvalidClientTokenId)
        );
    }

    #[test]
    fn a_malformed_presigned_query_is_incomplete() {
        let query = presigned_by_sdk("GET", "/", b"", at(SUITE_TIME_MS), 300);
        let headers = host_only();
        let week = presigned_expires_s_max.to_string();
        let too_long = query.replace("X-Amz-Expires=300", &format!("X-Amz-Expires={week}1"));
        for bad in [
            query.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1"),
            query.replace("X-Amz-Expires=300", "X-Amz-Expires=soon"),
            too_long,
            query.replace("X-Amz-Date=", "X-Amz-Nate="),
            query.replace("aws4_request", "aws5_request"),
            format!("{query}&X-Amz-Date=20150830T123600Z"),
            query.replace("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders=x-amz-date"),
        ] {
            let request = SignedRequest {
                method: &Method::GET,
                path: "/",
                query: &bad,
                headers: &headers,
                body: b"",
            };
            assert!(
                matches!(
                    verify(&request, &keys(), SUITE_TIME_MS),
                    Err(SqsError::IncompleteSignature { .. })
                ),
                "{bad}: {:?}",
                verify(&request, &keys(), SUITE_TIME_MS)
            );
        }
    }

    #[test]
    fn a_key_limited_by_prefix_allows_only_its_queues() {
        let key = AccessKey {
            queue_prefixes: vec!["orders-".to_owned(), "billing".to_owned()],
            ..keys().remove(0)
        };
        assert!(key.allows("orders-eu"));
        assert!(key.allows("billing"));
        assert!(!key.allows("order"));
        assert!(!key.allows("payroll"));
        assert!(keys()[0].allows("payroll"), "no prefixes: every queue");
    }

    #[test]
    fn the_signing_region_comes_from_the_header_or_the_presigned_query() {
        let mut headers = HeaderMap::new();
        assert_eq!(signing_region(&headers, ""), Ok(None));
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKID/20260101/eu-west-1/sqs/aws4_request, SignedHeaders=host;x-amz-date, Signature=00"
                .parse()
                .unwrap(),
        );
        assert_eq!(signing_region(&headers, ""), Ok(Some("eu-west-1")));
        let query = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F20260101%2Fap-south-2%2Fsqs%2Faws4_request&X-Amz-Signature=00";
        assert_eq!(
            signing_region(&HeaderMap::new(), query),
            Ok(Some("ap-south-2"))
        );
        let mut odd = HeaderMap::new();
        odd.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKID/20260101/EU_WEST/sqs/aws4_request, SignedHeaders=host, Signature=00"
                .parse()
                .unwrap(),
        );
        assert!(matches!(
            signing_region(&odd, ""),
            Err(SqsError::IncompleteSignature { .. })
        ));
    }
}
