//! The JSON strings SQS uses for the `RedrivePolicy` and `RedriveAllowPolicy` queue attributes:
//! parsing what clients set, and writing what `GetQueueAttributes` answers. Queue ARNs stay text
//! here; the caller resolves them to queue names. Ranges are checked here so that the refusal
//! names the attribute and the allowed range, in SQS's wording style.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trireme_core::limits;

/// A parsed `RedrivePolicy`: where messages go after `max_receive_count` receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedrivePolicyJson {
    /// The dead-letter queue's ARN.
    pub dead_letter_target_arn: String,
    /// Receives after which a message moves, 1–1,000.
    pub max_receive_count: u32,
}

/// A parsed `RedriveAllowPolicy`: which source queues may use this queue as dead-letter queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedriveAllowJson {
    /// Any queue (the default).
    AllowAll,
    /// No queue.
    DenyAll,
    /// Only the queues with these ARNs (1–10 of them).
    ByQueue(Vec<String>),
}

/// Why a policy string was refused; the message is the one the client sees.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Value {value} for parameter {attribute} is invalid. Reason: {reason}")]
pub struct PolicyError {
    /// `RedrivePolicy` or `RedriveAllowPolicy`.
    pub attribute: &'static str,
    /// The refused text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a `RedrivePolicy`. `maxReceiveCount` may be a JSON number or a string of digits, as
/// SQS accepts both. An empty string means "remove the policy" and gives `None`.
///
/// # Errors
/// `PolicyError` naming the missing or out-of-range member.
pub fn parse_redrive_policy(text: &str) -> Result<Option<RedrivePolicyJson>, PolicyError> {
    if text.is_empty() {
        return Ok(None);
    }
    let refuse = |reason: String| PolicyError {
        attribute: "RedrivePolicy",
        value: text.to_owned(),
        reason,
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|_| refuse("Redrive policy is not a valid JSON map.".to_owned()))?;
    let map = value
        .as_object()
        .ok_or_else(|| refuse("Redrive policy is not a valid JSON map.".to_owned()))?;
    let arn = match map.get("deadLetterTargetArn") {
        Some(Value::String(arn)) if !arn.is_empty() => arn.clone(),
        _ => {
            return Err(refuse(
                "Redrive policy does not contain mandatory attribute: deadLetterTargetArn."
                    .to_owned(),
            ));
        }
    };
    let count = match map.get("maxReceiveCount") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        None => {
            return Err(refuse(
                "Redrive policy does not contain mandatory attribute: maxReceiveCount.".to_owned(),
            ));
        }
        Some(_) => None,
    };
    let range = i64::from(limits::max_receive_count_min)..=i64::from(limits::max_receive_count_max);
    let max_receive_count = count
        .filter(|count| range.contains(count))
        .and_then(|count| u32::try_from(count).ok())
        .ok_or_else(|| {
            refuse(format!(
                "Value for maxReceiveCount must be between {} and {}.",
                limits::max_receive_count_min,
                limits::max_receive_count_max
            ))
        })?;
    if let Some(unknown) = map
        .keys()
        .find(|key| *key != "deadLetterTargetArn" && *key != "maxReceiveCount")
    {
        return Err(refuse(format!(
            "Redrive policy has an unknown attribute: {unknown}."
        )));
    }
    Ok(Some(RedrivePolicyJson {
        dead_letter_target_arn: arn,
        max_receive_count,
    }))
}

/// Writes a `RedrivePolicy` the way SQS answers it.
#[must_use]
pub fn render_redrive_policy(policy: &RedrivePolicyJson) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        dead_letter_target_arn: &'a str,
        max_receive_count: u32,
    }
    serde_json::to_string(&Out {
        dead_letter_target_arn: &policy.dead_letter_target_arn,
        max_receive_count: policy.max_receive_count,
    })
    .expect("a struct of a string and a number always serializes")
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AllowIn {
    redrive_permission: String,
    #[serde(default)]
    source_queue_arns: Option<Vec<String>>,
}

/// Parses a `RedriveAllowPolicy`. An empty string restores the default (`allowAll`).
///
/// # Errors
/// `PolicyError` for malformed JSON, an unknown permission, or source ARNs that do not fit the
/// permission (`byQueue` needs 1–10, the others none).
pub fn parse_redrive_allow_policy(text: &str) -> Result<RedriveAllowJson, PolicyError> {
    if text.is_empty() {
        return Ok(RedriveAllowJson::AllowAll);
    }
    let refuse = |reason: String| PolicyError {
        attribute: "RedriveAllowPolicy",
        value: text.to_owned(),
        reason,
    };
    let parsed: AllowIn = serde_json::from_str(text).map_err(|_| {
        refuse(
            "Must be a JSON map with redrivePermission and, for byQueue, sourceQueueArns."
                .to_owned(),
        )
    })?;
    let arns = parsed.source_queue_arns.unwrap_or_default();
    match parsed.redrive_permission.as_str() {
        "allowAll" | "denyAll" if !arns.is_empty() => Err(refuse(format!(
            "sourceQueueArns is allowed only when redrivePermission is byQueue, not {}.",
            parsed.redrive_permission
        ))),
        "allowAll" => Ok(RedriveAllowJson::AllowAll),
        "denyAll" => Ok(RedriveAllowJson::DenyAll),
        "byQueue" if arns.is_empty() || arns.len() > limits::redrive_allow_sources_max => {
            Err(refuse(format!(
                "byQueue needs between 1 and {} sourceQueueArns.",
                limits::redrive_allow_sources_max
            )))
        }
        "byQueue" => Ok(RedriveAllowJson::ByQueue(arns)),
        other => Err(refuse(format!(
            "redrivePermission must be allowAll, denyAll or byQueue, not {other}."
        ))),
    }
}

/// Writes a `RedriveAllowPolicy` the way SQS answers it.
#[must_use]
pub fn render_redrive_allow_policy(policy: &RedriveAllowJson) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        redrive_permission: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        source_queue_arns: Option<&'a [String]>,
    }
    let out = match policy {
        RedriveAllowJson::AllowAll => Out {
            redrive_permission: "allowAll",
            source_queue_arns: None,
        },
        RedriveAllowJson::DenyAll => Out {
            redrive_permission: "denyAll",
            source_queue_arns: None,
        },
        RedriveAllowJson::ByQueue(arns) => Out {
            redrive_permission: "byQueue",
            source_queue_arns: Some(arns),
        },
    };
    serde_json::to_string(&out).expect("strings always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str = "arn:aws:sqs:us-east-1:000000000000:dlq";

    #[test]
    fn redrive_policy_accepts_number_or_string_count_and_round_trips() {
        let as_number = parse_redrive_policy(&format!(
            r#"{{"deadLetterTargetArn":"{ARN}","maxReceiveCount":3}}"#
        ))
        .unwrap()
        .unwrap();
        let as_string = parse_redrive_policy(&format!(
            r#"{{"deadLetterTargetArn":"{ARN}","maxReceiveCount":"3"}}"#
        ))
        .unwrap()
        .unwrap();
        assert_eq!(as_number, as_string);
        assert_eq!(as_number.max_receive_count, 3);
        let rendered = render_redrive_policy(&as_number);
        assert_eq!(parse_redrive_policy(&rendered).unwrap().unwrap(), as_number);
        assert_eq!(parse_redrive_policy("").unwrap(), None);
    }

    #[test]
    fn redrive_policy_refuses_missing_members_and_out_of_range_counts() {
        for (text, says) in [
            ("{}".to_owned(), "deadLetterTargetArn"),
            (
                format!(r#"{{"deadLetterTargetArn":"{ARN}"}}"#),
                "maxReceiveCount",
            ),
            (
                format!(r#"{{"deadLetterTargetArn":"{ARN}","maxReceiveCount":0}}"#),
                "between 1 and 1000",
            ),
            (
                format!(r#"{{"deadLetterTargetArn":"{ARN}","maxReceiveCount":1001}}"#),
                "between 1 and 1000",
            ),
            ("not json".to_owned(), "JSON"),
        ] {
            let error = parse_redrive_policy(&text).unwrap_err();
            assert_eq!(error.attribute, "RedrivePolicy");
            assert!(error.to_string().contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn redrive_allow_policy_kinds_parse_and_round_trip() {
        assert_eq!(
            parse_redrive_allow_policy(r#"{"redrivePermission":"allowAll"}"#).unwrap(),
            RedriveAllowJson::AllowAll
        );
        assert_eq!(
            parse_redrive_allow_policy(r#"{"redrivePermission":"denyAll"}"#).unwrap(),
            RedriveAllowJson::DenyAll
        );
        let by_queue = parse_redrive_allow_policy(&format!(
            r#"{{"redrivePermission":"byQueue","sourceQueueArns":["{ARN}"]}}"#
        ))
        .unwrap();
        assert_eq!(by_queue, RedriveAllowJson::ByQueue(vec![ARN.to_owned()]));
        assert_eq!(
            parse_redrive_allow_policy(&render_redrive_allow_policy(&by_queue)).unwrap(),
            by_queue
        );
        assert_eq!(
            render_redrive_allow_policy(&RedriveAllowJson::AllowAll),
            r#"{"redrivePermission":"allowAll"}"#
        );
    }

    #[test]
    fn redrive_allow_policy_refuses_inconsistent_sources() {
        let eleven: Vec<String> = (0..11).map(|i| format!("\"{ARN}{i}\"")).collect();
        for text in [
            r#"{"redrivePermission":"byQueue"}"#.to_owned(),
            format!(
                r#"{{"redrivePermission":"byQueue","sourceQueueArns":[{}]}}"#,
                eleven.join(",")
            ),
            format!(r#"{{"redrivePermission":"allowAll","sourceQueueArns":["{ARN}"]}}"#),
            r#"{"redrivePermission":"sometimes"}"#.to_owned(),
            "[]".to_owned(),
        ] {
            assert!(parse_redrive_allow_policy(&text).is_err(), "{text}");
        }
    }
}
