//! Attribute names and values as SQS spells them: queue attributes for `CreateQueue`,
//! `SetQueueAttributes` and `GetQueueAttributes`; system attribute names for `ReceiveMessage`
//! (`MessageSystemAttributeNames` and the older `AttributeNames`); message attribute name
//! filters (`All`, `.*`, `prefix.*`). Values are checked here, where the refusal can name the
//! attribute and its range; the core checks them again (a second fence, not the first).
//!
//! Attributes that exist for features Trireme does not have are handled explicitly, one by one:
//! FIFO-only ones are refused (standard queues only); encryption and access-policy ones are
//! accepted and not stored, because infrastructure tools set them on every queue.

use std::collections::{BTreeMap, BTreeSet};

use trireme_core::{AttributeChanges, QueueName, RedriveAllow, RedrivePolicy, limits};

use super::error::SqsError;
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

/// Attributes that only FIFO queues have.
const FIFO_ONLY: [&str; 3] = [
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
];

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
            .ok_or_else(|| SqsError::InvalidAttributeName { name: name.clone() })?;
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
            return Err(SqsError::InvalidAttributeName { name: name.clone() });
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
            "FifoQueue" => match value.as_str() {
                "false" => {}
                "true" => return Err(SqsError::fifo_unsupported("this queue")),
                _ => return Err(boolean_error(name, value)),
            },
            fifo if FIFO_ONLY.contains(&fifo) => {
                return Err(SqsError::UnsupportedOperation {
                    message: format!(
                        "The attribute {fifo} applies to FIFO queues only; Trireme supports standard queues only."
                    ),
                });
            }
            // Accepted so that tools which always send them work; nothing is stored (see the
            // module comment and the SQS differences in the README).
            "Policy" | "KmsMasterKeyId" => {}
            "KmsDataKeyReusePeriodSeconds" => {
                seconds(name, value, 60, 86_400)?;
            }
            "SqsManagedSseEnabled" => {
                if value != "true" && value != "false" {
                    return Err(boolean_error(name, value));
                }
            }
            _ => return Err(SqsError::InvalidAttributeName { name: name.clone() }),
        }
    }
    Ok(changes)
}

fn seconds(name: &str, value: &str, min: u32, max: u32) -> Result<u32, SqsError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|parsed| (min..=max).contains(parsed))
        .ok_or_else(|| SqsError::InvalidAttributeValue {
            message: format!("Invalid value for the parameter {name}. Reason: {value} must be an integer between {min} and {max}."),
        })
}

fn boolean_error(name: &str, value: &str) -> SqsError {
    SqsError::InvalidAttributeValue {
        message: format!(
            "Invalid value for the parameter {name}. Reason: {value} must be true or false."
        ),
    }
}

fn policy_error(error: PolicyError) -> SqsError {
    SqsError::InvalidParameterValue {
        message: error.to_string(),
    }
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
            Err(SqsError::InvalidAttributeName {
                name: "Colour".into()
            })
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
    fn out_of_range_values_name_the_attribute_and_range() {
        for (name, value, range) in [
            ("VisibilityTimeout", "43201", "0 and 43200"),
            ("DelaySeconds", "-1", "0 and 900"),
            ("MessageRetentionPeriod", "59", "60 and 1209600"),
            ("MaximumMessageSize", "1023", "1024 and 1048576"),
            ("ReceiveMessageWaitTimeSeconds", "21", "0 and 20"),
        ] {
            let map = BTreeMap::from([(name.to_owned(), value.to_owned())]);
            let error = parse_queue_attributes(&map, resolve).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, SqsError::InvalidAttributeValue { .. }),
                "{name}"
            );
            assert!(
                message.contains(name) && message.contains(range),
                "{message}"
            );
        }
    }

    #[test]
    fn fifo_read_only_and_unknown_attributes_are_refused() {
        let refuse = |name: &str, value: &str| {
            parse_queue_attributes(
                &BTreeMap::from([(name.to_owned(), value.to_owned())]),
                resolve,
            )
        };
        assert!(matches!(
            refuse("FifoQueue", "true"),
            Err(SqsError::UnsupportedOperation { .. })
        ));
        assert!(refuse("FifoQueue", "false").is_ok());
        assert!(matches!(
            refuse("ContentBasedDeduplication", "true"),
            Err(SqsError::UnsupportedOperation { .. })
        ));
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
