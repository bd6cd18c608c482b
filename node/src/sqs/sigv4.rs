//! Verification of AWS Signature Version 4 on SQS requests, used when access keys are
//! configured. The server rebuilds the canonical request from what it received, derives the
//! signing key from the configured secret, and compares signatures in constant time.
//!
//! Only the `Authorization` header form is accepted (SDKs and the CLI use it for SQS);
//! query-string (presigned) signatures are refused. The region in the credential scope is the
//! client's choice, and chooses whose queues the request acts on ([`signing_region`]; queues
//! are kept per region, as in SQS). This module never logs a
//! secret and never answers which part of a signature was wrong beyond what AWS itself says.

use axum::http::{HeaderMap, Method};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::digest::to_hex;
use super::error::SqsError;
use super::limits::clock_skew_ms_max;

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
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AccessKey {{ id: {:?}, secret: .. }}", self.id)
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

/// The parsed `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
struct Authorization<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

/// Checks the request's signature against `keys` at server time `now_ms` (ms since the epoch).
/// Returns the access key id that signed it.
///
/// # Errors
/// `MissingAuthenticationToken` without an `Authorization` header; `IncompleteSignature` for a
/// malformed one (or a presigned query); `InvalidClientTokenId` for an unknown key id;
/// `RequestExpired` for an `X-Amz-Date` more than 15 minutes off; `SignatureDoesNotMatch`
/// otherwise when the signature is wrong.
pub fn verify(
    request: &SignedRequest<'_>,
    keys: &[AccessKey],
    now_ms: u64,
) -> Result<String, SqsError> {
    let Some(header) = request.headers.get("authorization") else {
        if request.query.contains("X-Amz-Signature=") {
            return Err(SqsError::IncompleteSignature {
                reason: "query-string (presigned) signatures are not accepted; sign the Authorization header".to_owned(),
            });
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
    let signed_at_ms = parse_amz_date(amz_date).ok_or_else(|| SqsError::IncompleteSignature {
        reason: format!("X-Amz-Date {amz_date} is not of the form YYYYMMDDTHHMMSSZ"),
    })?;
    if signed_at_ms.abs_diff(now_ms) > clock_skew_ms_max {
        return Err(SqsError::RequestExpired {
            signed_at: amz_date.to_owned(),
            now: format_amz_date(now_ms),
        });
    }
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
        let canonical_request =
            canonical_request(request, &authorization.signed_headers, canonical_uri)?;
        let string_to_sign = format!(
            "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
            to_hex(&Sha256::digest(canonical_request.as_bytes()))
        );
        let mut mac =
            HmacSha256::new_from_slice(&signing_key).expect("HMAC takes keys of any length");
        mac.update(string_to_sign.as_bytes());
        if mac.verify_slice(&expected).is_ok() {
            return Ok(key.id.clone());
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
    let parts: Vec<&str> = credential.split('/').collect();
    let [access_key_id, date, region, service, terminator] = parts.as_slice() else {
        return Err(incomplete(
            "Credential must be <key id>/<date>/<region>/<service>/aws4_request",
        ));
    };
    if *terminator != "aws4_request" || date.len() != 8 || access_key_id.is_empty() {
        return Err(incomplete(
            "Credential must be <key id>/<date>/<region>/<service>/aws4_request",
        ));
    }
    Ok(Authorization {
        access_key_id,
        date,
        region,
        service,
        signed_headers: signed_headers.split(';').collect(),
        signature,
    })
}

fn canonical_request(
    request: &SignedRequest<'_>,
    signed_headers: &[&str],
    canonical_uri: &str,
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
        canonical_query(request.query),
        canonical_headers,
        signed_headers.join(";"),
        payload_hash
    ))
}

/// Query parameters decoded, re-encoded the SigV4 way and sorted by name then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (
                uri_encode(&percent_decode(name), true),
                uri_encode(&percent_decode(value), true),
            )
        })
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
    let legal = (1..=32).contains(&region.len())
        && region
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-');
    if legal {
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
            verify(&get(&headers), &keys(), SUITE_TIME_MS),
            Ok(KEY_ID.to_owned())
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
            verify(&get(&headers), &keys(), SUITE_TIME_MS),
            Err(SqsError::InvalidClientTokenId)
        );
        let mut unsigned = vanilla_headers(GET_VANILLA);
        unsigned.remove("authorization");
        assert_eq!(
            verify(&get(&unsigned), &keys(), SUITE_TIME_MS),
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
        assert_eq!(canonical_query("b=2&a=x%20y&a=1"), "a=1&a=x%20y&b=2");
        assert_eq!(canonical_query(""), "");
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
