//! Attribute names and values as SQS spells them: queue attributes for `CreateQueue`,
//! `SetQueueAttributes` and `GetQueueAttributes`; system attribute names for `ReceiveMessage`
//! (`MessageSystemAttributeNames` and the older `AttributeNames`); message attribute name
//! filters (`All`, `.*`, `prefix.*`). Values are checked here, where the refusal can name the
//! attribute and its range; the core checks them again (a second fence, not the first).
//!
//! Attributes that exist for features Trireme does not have are handled explicitly, one by one:
//! FIFO-only ones are refused as SQS refuses them on a standard queue; encryption and
//! access-policy ones are kept and returned but never acted on (access is the endpoint's keys'),
//! because tools that manage queues set them and read them back.

use std::collections::{BTreeMap, BTreeSet};

use trireme_core::{AttributeChanges, QueueName, RedriveAllow, RedrivePolicy, limits};

use super::error::{AttributeNameProblem, Invalid, SqsError};
use super::redrive_policy::{self, PolicyError, RedriveAllowJson};

/// Every queue attribute name `GetQueueAttributes` knows, in SQS's order.
pub const QUEUE_ATTRIBUTE_NAMES: [&str; 21] = [
    "Policy",
    "VisibilityTimeout",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
    "ApproximateNumberOfMessagesDelayed",
    "DelaySeconds",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "RedriveAllowPolicy",
    "SqsManagedSseEnabled",
];

/// Checks a `CreateQueue`'s name against its `FifoQueue` attribute, as SQS does before anything
/// else: `FifoQueue=true` needs a `.fifo` name and a `.fifo` name needs `FifoQueue=true`. A FIFO
/// queue asked for consistently is refused: Trireme has standard queues only.
///
/// # Errors
/// `InvalidParameterValue` for an inconsistent request, `UnsupportedOperation` for a FIFO queue.
pub fn check_queue_type(name: &str, attributes: &BTreeMap<String, String>) -> Result<(), SqsError> {
    let fifo_asked = attributes
        .get("FifoQueue")
        .is_some_and(|value| value == "true");
    match (name.ends_with(".fifo"), fifo_asked) {
        (true, true) => Err(SqsError::FifoUnsupported {
            name: name.to_owned(),
        }),
        (true, false) => Err(SqsError::InvalidParameterValue(Invalid::QueueName)),
        (false, true) => Err(SqsError::InvalidParameterValue(Invalid::FifoQueueName)),
        (false, false) => Ok(()),
    }
}

/// The first attribute a `CreateQueue` names whose value differs from the existing queue's, in
/// name order; `None` when the request matches the queue (SQS then answers its URL).
///
/// # Errors
/// As [`parse_queue_attributes`], for a value that does not parse.
pub fn first_difference(
    existing: &trireme_core::QueueAttributes,
    attributes: &BTreeMap<String, String>,
    resolve: impl Fn(&str) -> Result<QueueName, SqsError>,
) -> Result<Option<String>, SqsError> {
    for (name, value) in attributes {
        let one = BTreeMap::from([(name.clone(), value.clone())]);
        let changes = parse_queue_attributes(&one, &resolve)?;
        if existing.with(&changes) != *existing {
            return Ok(Some(name.clone()));
        }
    }
    Ok(None)
}

/// The system attributes `ReceiveMessage` can return, in SQS's order.
pub const SYSTEM_ATTRIBUTE_NAMES: [&str; 10] = [
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
    "All",
];

/// Which queue attributes a `GetQueueAttributes` asked for. `All` selects every one; an
/// unknown name is refused. No names select none (SQS answers an empty map).
///
/// # Errors
/// `InvalidAttributeName` naming the first unknown name.
pub fn requested_queue_attributes(names: &[String]) -> Result<BTreeSet<&'static str>, SqsError> {
    let mut selected = BTreeSet::new();
    for name in names {
        if name == "All" {
            selected.extend(QUEUE_ATTRIBUTE_NAMES);
            continue;
        }
        let known = QUEUE_ATTRIBUTE_NAMES
            .iter()
            .find(|known| **known == name.as_str())
            .ok_or_else(|| SqsError::unknown_attribute(name))?;
        selected.insert(*known);
    }
    Ok(selected)
}

/// Which system attributes a `ReceiveMessage` asked for, from both `MessageSystemAttributeNames`
/// and the older `AttributeNames` (which may also carry queue attribute names; SQS ignores those).
///
/// # Errors
/// `InvalidAttributeName` for a name that is neither.
pub fn requested_system_attributes(
    system_names: &[String],
    legacy_names: &[String],
) -> Result<BTreeSet<&'static str>, SqsError> {
    let mut selected = BTreeSet::new();
    for name in system_names.iter().chain(legacy_names) {
        if name == "All" {
            selected.extend(SYSTEM_ATTRIBUTE_NAMES.iter().filter(|n| **n != "All"));
        } else if let Some(known) = SYSTEM_ATTRIBUTE_NAMES
            .iter()
            .find(|known| **known == name.as_str())
        {
            selected.insert(*known);
        } else if !QUEUE_ATTRIBUTE_NAMES.contains(&name.as_str()) || system_names.contains(name) {
            return Err(SqsError::unknown_attribute(name));
        }
    }
    Ok(selected)
}

/// A `MessageAttributeNames` filter: `All` or `.*` selects everything, `name.*` every attribute
/// whose name starts with `name.`, anything else that exact name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageAttributeFilter {
    all: bool,
    prefixes: Vec<String>,
    names: BTreeSet<String>,
}

impl MessageAttributeFilter {
    /// The filter for the requested names.
    #[must_use]
    pub fn new(requested: &[String]) -> Self {
        let mut filter = MessageAttributeFilter::default();
        for name in requested {
            if name == "All" || name == ".*" {
                filter.all = true;
            } else if let Some(prefix) = name.strip_suffix(".*") {
                filter.prefixes.push(format!("{prefix}."));
            } else {
                filter.names.insert(name.clone());
            }
        }
        filter
    }

    /// Whether the attribute `name` is selected.
    #[must_use]
    pub fn selects(&self, name: &str) -> bool {
        self.all
            || self.names.contains(name)
            || self
                .prefixes
                .iter()
                .any(|prefix| name.starts_with(prefix.as_str()))
    }
}

/// Parses the `Attributes` map of `CreateQueue` or `SetQueueAttributes` into core changes.
/// `resolve` turns a queue ARN into a queue name of this endpoint (for redrive policies).
///
/// # Errors
/// `InvalidAttributeName` for unknown or read-only names, `InvalidAttributeValue` for values
/// out of range, `UnsupportedOperation` for FIFO attributes, `InvalidParameterValue` for a
/// malformed redrive policy.
pub fn parse_queue_attributes(
    attributes: &BTreeMap<String, String>,
    resolve: impl Fn(&str) -> Result<QueueName, SqsError>,
) -> Result<AttributeChanges, SqsError> {
    let mut changes = AttributeChanges::default();
    for (name, value) in attributes {
        match name.as_str() {
            "VisibilityTimeout" => {
                changes.visibility_timeout_s =
                    Some(seconds(name, value, 0, limits::visibility_timeout_s_max)?);
            }
            "DelaySeconds" => changes.delay_s = Some(seconds(name, value, 0, limits::delay_s_max)?),
            "MessageRetentionPeriod" => {
                changes.retention_s = Some(seconds(
                    name,
                    value,
                    limits::retention_s_min,
                    limits::retention_s_max,
                )?);
            }
            "MaximumMessageSize" => {
                changes.message_bytes_max = Some(seconds(
                    name,
                    value,
                    limits::message_bytes_min,
                    limits::message_bytes_max,
                )?);
            }
            "ReceiveMessageWaitTimeSeconds" => {
                changes.receive_wait_s = Some(seconds(name, value, 0, limits::wait_s_max)?);
            }
            "RedrivePolicy" => {
                let parsed = redrive_policy::parse_redrive_policy(value).map_err(policy_error)?;
                changes.redrive = Some(match parsed {
                    None => None,
                    Some(policy) => Some(RedrivePolicy {
                        dead_letter_queue: resolve(&policy.dead_letter_target_arn)?,
                        max_receive_count: policy.max_receive_count,
                    }),
                });
            }
            "RedriveAllowPolicy" => {
                let parsed =
                    redrive_policy::parse_redrive_allow_policy(value).map_err(policy_error)?;
                changes.redrive_allow = Some(match parsed {
                    RedriveAllowJson::AllowAll => RedriveAllow::AllowAll,
                    RedriveAllowJson::DenyAll => RedriveAllow::DenyAll,
                    RedriveAllowJson::ByQueue(arns) => RedriveAllow::ByQueue(
                        arns.iter()
                            .map(|arn| resolve(arn))
                            .collect::<Result<_, _>>()?,
                    ),
                });
            }
            // A standard queue has no `FifoQueue` or `ContentBasedDeduplication` attribute, and
            // SQS names the other two FIFO attributes in its refusal.
            "FifoQueue" | "ContentBasedDeduplication" => {
                return Err(SqsError::unknown_attribute(name));
            }
            "DeduplicationScope" => {
                return Err(SqsError::InvalidAttributeName(
                    AttributeNameProblem::FifoOnly {
                        name: "DeduplicationScope",
                    },
                ));
            }
            "FifoThroughputLimit" => {
                return Err(SqsError::InvalidAttributeName(
                    AttributeNameProblem::FifoOnly {
                        name: "FifoThroughputLimit",
                    },
                ));
            }
            // Kept and returned, never acted on (see the module comment).
            "Policy" => {
                changes.policy = Some(if value.is_empty() {
                    None
                } else {
                    let document: Option<serde_json::Value> = serde_json::from_str(value).ok();
                    if !document.is_some_and(|document| document.is_object()) {
                        return Err(value_error(name));
                    }
                    Some(value.clone())
                });
            }
            "KmsMasterKeyId" => {
                changes.kms_master_key_id = Some((!value.is_empty()).then(|| value.clone()));
            }
            "KmsDataKeyReusePeriodSeconds" => {
                changes.kms_data_key_reuse_s = Some(seconds(
                    name,
                    value,
                    limits::kms_data_key_reuse_s_min,
                    limits::kms_data_key_reuse_s_max,
                )?);
            }
            "SqsManagedSseEnabled" => {
                changes.sqs_managed_sse = Some(match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(value_error(name)),
                });
            }
            _ => return Err(SqsError::unknown_attribute(name)),
        }
    }
    // One kind of encryption at a time: a KMS key turns SQS-managed encryption off, and
    // SQS-managed encryption drops the key; asking for both is refused, as SQS refuses it.
    match (&changes.kms_master_key_id, changes.sqs_managed_sse) {
        (Some(Some(_)), Some(true)) => {
            return Err(SqsError::InvalidAttributeName(
                AttributeNameProblem::TwoKindsOfSse,
            ));
        }
        (Some(Some(_)), None) => changes.sqs_managed_sse = Some(false),
        (None, Some(true)) => changes.kms_master_key_id = Some(None),
        _ => {}
    }
    Ok(changes)
}

fn seconds(name: &str, value: &str, min: u32, max: u32) -> Result<u32, SqsError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|parsed| (min..=max).contains(parsed))
        .ok_or_else(|| value_error(name))
}

/// SQS's refusal of an attribute value: it names the attribute and gives no reason.
fn value_error(name: &str) -> SqsError {
    SqsError::InvalidAttributeValue {
        attribute: name.to_owned(),
        reason: None,
    }
}

fn policy_error(error: PolicyError) -> SqsError {
    SqsError::InvalidParameterValue(Invalid::Policy {
        attribute: error.attribute,
        value: error.value,
        reason: error.reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn resolve(arn: &str) -> Result<QueueName, SqsError> {
        let name = arn.rsplit(':').next().unwrap();
        QueueName::try_from(name).map_err(|_| SqsError::QueueDoesNotExist)
    }

    #[test]
    fn all_selects_every_queue_attribute_and_unknown_names_are_refused() {
        let all = requested_queue_attributes(&strings(&["All"])).unwrap();
        assert!(all.contains("ApproximateNumberOfMessagesDelayed"));
        assert!(all.contains("RedriveAllowPolicy"));
        let some = requested_queue_attributes(&strings(&["QueueArn", "DelaySeconds"])).unwrap();
        assert_eq!(some.len(), 2);
        assert_eq!(
            requested_queue_attributes(&strings(&["QueueArn", "Colour"])),
            Err(SqsError::unknown_attribute("Colour"))
        );
        assert!(requested_queue_attributes(&[]).unwrap().is_empty());
    }

    #[test]
    fn system_attributes_come_from_both_parameters() {
        let selected = requested_system_attributes(
            &strings(&["SentTimestamp"]),
            &strings(&["ApproximateReceiveCount"]),
        )
        .unwrap();
        assert_eq!(selected.len(), 2);
        let all = requested_system_attributes(&[], &strings(&["All"])).unwrap();
        assert!(all.contains("DeadLetterQueueSourceArn"));
        assert!(!all.contains("All"));
        // A queue attribute name in the legacy list is ignored, as SQS does.
        assert!(
            requested_system_attributes(&[], &strings(&["VisibilityTimeout"]))
                .unwrap()
                .is_empty()
        );
        assert!(requested_system_attributes(&strings(&["Bogus"]), &[]).is_err());
    }

    #[test]
    fn message_attribute_filter_handles_all_prefixes_and_names() {
        let filter = MessageAttributeFilter::new(&strings(&["trace.*", "exact"]));
        assert!(filter.selects("trace.id"));
        assert!(!filter.selects("tracer"));
        assert!(filter.selects("exact"));
        assert!(!filter.selects("exactly"));
        assert!(MessageAttributeFilter::new(&strings(&["All"])).selects("anything"));
        assert!(MessageAttributeFilter::new(&strings(&[".*"])).selects("anything"));
        assert!(!MessageAttributeFilter::new(&[]).selects("anything"));
    }

    #[test]
    fn queue_attributes_parse_into_changes() {
        let mut map = BTreeMap::new();
        map.insert("VisibilityTimeout".to_owned(), "45".to_owned());
        map.insert(
            "RedrivePolicy".to_owned(),
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:dlq","maxReceiveCount":"2"}"#.to_owned(),
        );
        map.insert("SqsManagedSseEnabled".to_owned(), "true".to_owned());
        let changes = parse_queue_attributes(&map, resolve).unwrap();
        assert_eq!(changes.visibility_timeout_s, Some(45));
        let policy = changes.redrive.unwrap().unwrap();
        assert_eq!(policy.dead_letter_queue.as_str(), "dlq");
        assert_eq!(policy.max_receive_count, 2);
        let mut clear = BTreeMap::new();
        clear.insert("RedrivePolicy".to_owned(), String::new());
        assert_eq!(
            parse_queue_attributes(&clear, resolve).unwrap().redrive,
            Some(None)
        );
    }

    #[test]
    fn out_of_range_values_name_the_attribute() {
        for (name, value) in [
            ("VisibilityTimeout", "43201"),
            ("DelaySeconds", "-1"),
            ("MessageRetentionPeriod", "59"),
            ("MaximumMessageSize", "1023"),
            ("ReceiveMessageWaitTimeSeconds", "21"),
        ] {
            let map = BTreeMap::from([(name.to_owned(), value.to_owned())]);
            let error = parse_queue_attributes(&map, resolve).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, SqsError::InvalidAttributeValue { .. }),
                "{name} {value}"
            );
            // SQS names the attribute and gives no reason.
            assert_eq!(message, format!("Invalid value for the parameter {name}."));
        }
    }

    #[test]
    fn a_fifo_name_needs_fifo_queue_and_a_fifo_queue_is_refused() {
        let with = |fifo: Option<&str>| {
            fifo.map(|value| BTreeMap::from([("FifoQueue".to_owned(), value.to_owned())]))
                .unwrap_or_default()
        };
        assert_eq!(
            check_queue_type("jobs.fifo", &with(None)),
            Err(SqsError::InvalidParameterValue(Invalid::QueueName))
        );
        assert_eq!(
            check_queue_type("jobs", &with(Some("true"))),
            Err(SqsError::InvalidParameterValue(Invalid::FifoQueueName))
        );
        assert!(matches!(
            check_queue_type("jobs.fifo", &with(Some("true"))),
            Err(SqsError::FifoUnsupported { .. })
        ));
        assert_eq!(check_queue_type("jobs", &with(Some("false"))), Ok(()));
        assert_eq!(check_queue_type("jobs", &with(None)), Ok(()));
    }

    #[test]
    fn fifo_read_only_and_unknown_attributes_are_refused() {
        let refuse = |name: &str, value: &str| {
            parse_queue_attributes(
                &BTreeMap::from([(name.to_owned(), value.to_owned())]),
                resolve,
            )
        };
        // As SQS words them on a standard queue.
        for (name, message) in [
            ("FifoQueue", "Unknown Attribute FifoQueue."),
            (
                "ContentBasedDeduplication",
                "Unknown Attribute ContentBasedDeduplication.",
            ),
            (
                "DeduplicationScope",
                "You can specify the DeduplicationScope only when FifoQueue is set to true.",
            ),
            (
                "FifoThroughputLimit",
                "You can specify the FifoThroughputLimit only when FifoQueue is set to true.",
            ),
        ] {
            let error = refuse(name, "false").unwrap_err();
            assert!(matches!(error, SqsError::InvalidAttributeName(_)), "{name}");
            assert_eq!(error.to_string(), message);
        }
        assert!(matches!(
            refuse("QueueArn", "x"),
            Err(SqsError::InvalidAttributeName { .. })
        ));
        assert!(matches!(
            refuse("Colour", "x"),
            Err(SqsError::InvalidAttributeName { .. })
        ));
        assert!(matches!(
            refuse("RedrivePolicy", "{}"),
            Err(SqsError::InvalidParameterValue { .. })
        ));
    }
}
