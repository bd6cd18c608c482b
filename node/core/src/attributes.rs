//! Queue attributes: the settings of one queue, their SQS defaults and legal ranges. `validate`
//! checks what one queue's attributes can say about themselves; what depends on other queues (a
//! redrive policy must name an existing other queue that allows it) is checked by `Queues`.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::error::Reject;
use crate::ids::QueueName;
use crate::limits;

/// Where a queue's messages go after too many receives: its dead-letter queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedrivePolicy {
    /// The dead-letter queue. It must exist when the policy is set; if it is deleted later the
    /// policy is inert until a queue of that name exists again.
    pub dead_letter_queue: QueueName,
    /// A receive that finds a message with at least this receive count moves it instead of
    /// delivering it. 1–1,000.
    pub max_receive_count: u32,
}

/// Which source queues may name this queue as their dead-letter queue (`RedriveAllowPolicy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RedriveAllow {
    /// Any queue may.
    #[default]
    AllowAll,
    /// No queue may.
    DenyAll,
    /// Only the queues named (at most `redrive_allow_sources_max`).
    ByQueue(BTreeSet<QueueName>),
}

impl RedriveAllow {
    /// Whether `source` may name the queue carrying this policy as its dead-letter queue.
    #[must_use]
    pub fn admits(&self, source: &QueueName) -> bool {
        match self {
            RedriveAllow::AllowAll => true,
            RedriveAllow::DenyAll => false,
            RedriveAllow::ByQueue(sources) => sources.contains(source),
        }
    }
}

/// The settings of one queue, with SQS's defaults (`Default`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueAttributes {
    /// `VisibilityTimeout`: how long a received message stays invisible unless the receive says
    /// otherwise. 0–43,200, default 30.
    pub visibility_timeout_s: u32,
    /// `DelaySeconds`: how long a sent message stays invisible unless the send says otherwise.
    /// 0–900, default 0.
    pub delay_s: u32,
    /// `MessageRetentionPeriod`: a message is gone this long after its original send, whatever
    /// its state. 60–1,209,600, default 345,600 (4 days).
    pub retention_s: u32,
    /// `MaximumMessageSize`: body plus attributes. 1,024–1,048,576, default 1,048,576.
    pub message_bytes_max: u32,
    /// `ReceiveMessageWaitTimeSeconds`: the long poll of a receive that does not say. 0–20,
    /// default 0.
    pub receive_wait_s: u32,
    /// `RedrivePolicy`: the dead-letter queue and `maxReceiveCount`, if any.
    pub redrive: Option<RedrivePolicy>,
    /// `RedriveAllowPolicy`: which queues may use this one as their dead-letter queue.
    pub redrive_allow: RedriveAllow,
    /// The settings SQS keeps and returns that the core never acts on.
    pub kept: KeptSettings,
}

/// Settings SQS keeps for a queue and returns, which the core stores and never acts on: the
/// access policy and the encryption settings (access is the endpoint's, and the store is the
/// node's). Kept so that a client reads back what it set, as tools that manage queues expect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptSettings {
    /// `Policy`: the access policy document as set, if any.
    pub policy: Option<String>,
    /// `KmsMasterKeyId`: the KMS key named for encryption, if any.
    pub kms_master_key_id: Option<String>,
    /// `KmsDataKeyReusePeriodSeconds`: 60–86,400, default 300.
    pub kms_data_key_reuse_s: u32,
    /// `SqsManagedSseEnabled`: SQS-managed encryption, default on (as SQS's is).
    pub sqs_managed_sse: bool,
}

impl Default for KeptSettings {
    fn default() -> Self {
        KeptSettings {
            policy: None,
            kms_master_key_id: None,
            kms_data_key_reuse_s: limits::kms_data_key_reuse_s_default,
            sqs_managed_sse: true,
        }
    }
}

impl Default for QueueAttributes {
    fn default() -> Self {
        QueueAttributes {
            visibility_timeout_s: limits::visibility_timeout_s_default,
            delay_s: limits::delay_s_default,
            retention_s: limits::retention_s_default,
            message_bytes_max: limits::message_bytes_max,
            receive_wait_s: limits::wait_s_default,
            redrive: None,
            redrive_allow: RedriveAllow::AllowAll,
            kept: KeptSettings::default(),
        }
    }
}

impl QueueAttributes {
    /// Checks every value against its range. The redrive policy's target is checked against the
    /// other queues by `Queues`, not here.
    ///
    /// # Errors
    /// `InvalidAttribute` naming the first attribute out of range, with its legal range.
    pub fn validate(&self) -> Result<(), Reject> {
        in_range(
            "VisibilityTimeout",
            self.visibility_timeout_s,
            0..=limits::visibility_timeout_s_max,
        )?;
        in_range("DelaySeconds", self.delay_s, 0..=limits::delay_s_max)?;
        in_range(
            "MessageRetentionPeriod",
            self.retention_s,
            limits::retention_s_min..=limits::retention_s_max,
        )?;
        in_range(
            "MaximumMessageSize",
            self.message_bytes_max,
            limits::message_bytes_min..=limits::message_bytes_max,
        )?;
        in_range(
            "ReceiveMessageWaitTimeSeconds",
            self.receive_wait_s,
            0..=limits::wait_s_max,
        )?;
        if let Some(policy) = &self.redrive {
            in_range(
                "RedrivePolicy",
                policy.max_receive_count,
                limits::max_receive_count_min..=limits::max_receive_count_max,
            )
            .map_err(|_| Reject::InvalidAttribute {
                attribute: "RedrivePolicy",
                reason: format!(
                    "maxReceiveCount must be in {}..={}, got {}",
                    limits::max_receive_count_min,
                    limits::max_receive_count_max,
                    policy.max_receive_count
                ),
            })?;
        }
        if self
            .kept
            .policy
            .as_ref()
            .is_some_and(|policy| policy.len() > limits::queue_policy_bytes_max)
        {
            return Err(Reject::InvalidAttribute {
                attribute: "Policy",
                reason: format!("must be at most {} bytes", limits::queue_policy_bytes_max),
            });
        }
        if self
            .kept
            .kms_master_key_id
            .as_ref()
            .is_some_and(|key| key.chars().count() > limits::kms_key_id_chars_max)
        {
            return Err(Reject::InvalidAttribute {
                attribute: "KmsMasterKeyId",
                reason: format!(
                    "must be at most {} characters",
                    limits::kms_key_id_chars_max
                ),
            });
        }
        in_range(
            "KmsDataKeyReusePeriodSeconds",
            self.kept.kms_data_key_reuse_s,
            limits::kms_data_key_reuse_s_min..=limits::kms_data_key_reuse_s_max,
        )?;
        if let RedriveAllow::ByQueue(sources) = &self.redrive_allow
            && !(1..=limits::redrive_allow_sources_max).contains(&sources.len())
        {
            return Err(Reject::InvalidAttribute {
                attribute: "RedriveAllowPolicy",
                reason: format!(
                    "byQueue must name 1..={} source queues, got {}",
                    limits::redrive_allow_sources_max,
                    sources.len()
                ),
            });
        }
        Ok(())
    }

    /// These attributes with `changes` applied; values are not validated here.
    #[must_use]
    pub fn with(&self, changes: &AttributeChanges) -> QueueAttributes {
        QueueAttributes {
            visibility_timeout_s: changes
                .visibility_timeout_s
                .unwrap_or(self.visibility_timeout_s),
            delay_s: changes.delay_s.unwrap_or(self.delay_s),
            retention_s: changes.retention_s.unwrap_or(self.retention_s),
            message_bytes_max: changes.message_bytes_max.unwrap_or(self.message_bytes_max),
            receive_wait_s: changes.receive_wait_s.unwrap_or(self.receive_wait_s),
            redrive: changes
                .redrive
                .clone()
                .unwrap_or_else(|| self.redrive.clone()),
            redrive_allow: changes
                .redrive_allow
                .clone()
                .unwrap_or_else(|| self.redrive_allow.clone()),
            kept: KeptSettings {
                policy: changes
                    .policy
                    .clone()
                    .unwrap_or_else(|| self.kept.policy.clone()),
                kms_master_key_id: changes
                    .kms_master_key_id
                    .clone()
                    .unwrap_or_else(|| self.kept.kms_master_key_id.clone()),
                kms_data_key_reuse_s: changes
                    .kms_data_key_reuse_s
                    .unwrap_or(self.kept.kms_data_key_reuse_s),
                sqs_managed_sse: changes.sqs_managed_sse.unwrap_or(self.kept.sqs_managed_sse),
            },
        }
    }

    /// Retention in ms.
    #[must_use]
    pub fn retention_ms(&self) -> u64 {
        u64::from(self.retention_s) * 1_000
    }
}

/// A `SetQueueAttributes` request: `None` leaves an attribute as it is. For `redrive`,
/// `Some(None)` removes the policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttributeChanges {
    /// New `VisibilityTimeout`.
    pub visibility_timeout_s: Option<u32>,
    /// New `DelaySeconds`.
    pub delay_s: Option<u32>,
    /// New `MessageRetentionPeriod`.
    pub retention_s: Option<u32>,
    /// New `MaximumMessageSize`.
    pub message_bytes_max: Option<u32>,
    /// New `ReceiveMessageWaitTimeSeconds`.
    pub receive_wait_s: Option<u32>,
    /// New `RedrivePolicy`; `Some(None)` removes it.
    pub redrive: Option<Option<RedrivePolicy>>,
    /// New `RedriveAllowPolicy`.
    pub redrive_allow: Option<RedriveAllow>,
    /// New `Policy`; `Some(None)` removes it.
    pub policy: Option<Option<String>>,
    /// New `KmsMasterKeyId`; `Some(None)` removes it.
    pub kms_master_key_id: Option<Option<String>>,
    /// New `KmsDataKeyReusePeriodSeconds`.
    pub kms_data_key_reuse_s: Option<u32>,
    /// New `SqsManagedSseEnabled`.
    pub sqs_managed_sse: Option<bool>,
}

fn in_range(attribute: &'static str, value: u32, range: RangeInclusive<u32>) -> Result<(), Reject> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(Reject::InvalidAttribute {
            attribute,
            reason: format!(
                "must be in {}..={}, got {value}",
                range.start(),
                range.end()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_attribute(attributes: &QueueAttributes) -> Option<&'static str> {
        match attributes.validate() {
            Ok(()) => None,
            Err(Reject::InvalidAttribute { attribute, .. }) => Some(attribute),
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_sqs_defaults_and_valid() {
        let defaults = QueueAttributes::default();
        assert_eq!(defaults.visibility_timeout_s, 30);
        assert_eq!(defaults.delay_s, 0);
        assert_eq!(defaults.retention_s, 345_600);
        assert_eq!(defaults.message_bytes_max, 1_048_576);
        assert_eq!(defaults.receive_wait_s, 0);
        assert_eq!(defaults.redrive, None);
        assert_eq!(defaults.redrive_allow, RedriveAllow::AllowAll);
        assert_eq!(refused_attribute(&defaults), None);
    }

    /// Sets one attribute of a `QueueAttributes`.
    type Setter = fn(&mut QueueAttributes, u32);

    #[test]
    fn every_range_end_is_accepted_and_one_past_it_refused() {
        let base = QueueAttributes::default();
        let cases: [(&str, Setter, u32, u32); 5] = [
            (
                "VisibilityTimeout",
                |a, v| a.visibility_timeout_s = v,
                0,
                43_200,
            ),
            ("DelaySeconds", |a, v| a.delay_s = v, 0, 900),
            (
                "MessageRetentionPeriod",
                |a, v| a.retention_s = v,
                60,
                1_209_600,
            ),
            (
                "MaximumMessageSize",
                |a, v| a.message_bytes_max = v,
                1_024,
                1_048_576,
            ),
            (
                "ReceiveMessageWaitTimeSeconds",
                |a, v| a.receive_wait_s = v,
                0,
                20,
            ),
        ];
        for (name, set, low, high) in cases {
            for ok in [low, high] {
                let mut attributes = base.clone();
                set(&mut attributes, ok);
                assert_eq!(refused_attribute(&attributes), None, "{name} = {ok}");
            }
            let mut above = base.clone();
            set(&mut above, high + 1);
            assert_eq!(
                refused_attribute(&above),
                Some(name),
                "{name} = {}",
                high + 1
            );
            if low > 0 {
                let mut below = base.clone();
                set(&mut below, low - 1);
                assert_eq!(
                    refused_attribute(&below),
                    Some(name),
                    "{name} = {}",
                    low - 1
                );
            }
        }
    }

    #[test]
    fn refusal_names_the_range() {
        let attributes = QueueAttributes {
            delay_s: 901,
            ..QueueAttributes::default()
        };
        let error = attributes.validate().unwrap_err();
        assert_eq!(
            error,
            Reject::InvalidAttribute {
                attribute: "DelaySeconds",
                reason: "must be in 0..=900, got 901".to_owned()
            }
        );
    }

    #[test]
    fn max_receive_count_is_1_to_1000() {
        let dlq = QueueName::try_from("dlq").unwrap();
        for (count, ok) in [(0, false), (1, true), (1_000, true), (1_001, false)] {
            let attributes = QueueAttributes {
                redrive: Some(RedrivePolicy {
                    dead_letter_queue: dlq.clone(),
                    max_receive_count: count,
                }),
                ..QueueAttributes::default()
            };
            let expected = if ok { None } else { Some("RedrivePolicy") };
            assert_eq!(refused_attribute(&attributes), expected, "count {count}");
        }
    }

    #[test]
    fn redrive_allow_by_queue_names_1_to_10_sources() {
        let names = |n: usize| -> BTreeSet<QueueName> {
            (0..n)
                .map(|i| QueueName::try_from(format!("q{i}")).unwrap())
                .collect()
        };
        for (n, ok) in [(0, false), (1, true), (10, true), (11, false)] {
            let attributes = QueueAttributes {
                redrive_allow: RedriveAllow::ByQueue(names(n)),
                ..QueueAttributes::default()
            };
            let expected = if ok { None } else { Some("RedriveAllowPolicy") };
            assert_eq!(refused_attribute(&attributes), expected, "{n} sources");
        }
    }

    #[test]
    fn changes_replace_only_what_they_name() {
        let base = QueueAttributes::default();
        let changed = base.with(&AttributeChanges {
            delay_s: Some(5),
            redrive: Some(None),
            ..AttributeChanges::default()
        });
        assert_eq!(changed.delay_s, 5);
        assert_eq!(changed.visibility_timeout_s, base.visibility_timeout_s);
        assert_eq!(changed.redrive, None);
    }
}
