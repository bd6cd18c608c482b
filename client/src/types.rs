//! The client's own request and response types, and their conversion from and to the wire
//! (`trireme_proto::v1`).
//!
//! The prost types stop here: every public method of the client takes and returns these. A
//! response missing a field the API promises is a protocol error, never a default value.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use trireme_proto::v1 as pb;

use crate::error::Error;

/// The longest queue name, as in SQS.
const QUEUE_NAME_CHARS_MAX: usize = 80;
/// The longest region of a queue of another region (`name@region`).
const REGION_CHARS_MAX: usize = 32;

/// A queue name: 1–80 characters of `[A-Za-z0-9_-]`, or `name@region` for a queue the SQS
/// endpoint keeps in another region than the node's own (a region being 1–32 of `[a-z0-9-]`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct QueueName(String);

impl QueueName {
    /// Checks `name` against the naming rule.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the field `name` when it is empty, longer than 80
    /// characters, or has a character outside `[A-Za-z0-9_-]`, or its region after `@` is not
    /// 1–32 of `[a-z0-9-]`.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let legal = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        let legal_region = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        let (bare, region) = match name.split_once('@') {
            Some((bare, region)) => (bare, Some(region)),
            None => (name.as_str(), None),
        };
        let bare_ok =
            !bare.is_empty() && bare.len() <= QUEUE_NAME_CHARS_MAX && bare.chars().all(legal);
        let region_ok = region.is_none_or(|region| {
            !region.is_empty()
                && region.len() <= REGION_CHARS_MAX
                && region.chars().all(legal_region)
        });
        if !(bare_ok && region_ok) {
            return Err(Error::InvalidArgument {
                field: Some("name".to_owned()),
                message: format!(
                    "queue name {name:?} must be 1-{QUEUE_NAME_CHARS_MAX} characters of [A-Za-z0-9_-], optionally followed by @ and a region of 1-{REGION_CHARS_MAX} characters of [a-z0-9-]"
                ),
            });
        }
        Ok(Self(name))
    }

    /// A name the server sent: trusted to follow the rule, so not checked again.
    pub(crate) fn from_server(name: String) -> Self {
        Self(name)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for QueueName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::new(s)
    }
}

macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps text the server issued (or the user copied from an earlier reply).
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The value as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

opaque_id!(
    /// A message id, unique per message, assigned by the node at send.
    MessageId
);
opaque_id!(
    /// The proof of one receive of a message, required to delete it or change its visibility.
    /// Each receive issues a new one and supersedes the previous.
    ReceiptHandle
);
opaque_id!(
    /// Names one redrive task.
    TaskHandle
);

/// Where a queue's messages go after `max_receive_count` receives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RedrivePolicy {
    /// The dead-letter queue.
    pub dead_letter_queue: QueueName,
    /// Receives after which the next receive moves the message instead (1-1,000).
    pub max_receive_count: u32,
}

/// Which source queues may name a queue as their dead-letter queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(
    rename_all = "snake_case",
    tag = "permission",
    content = "source_queues"
)]
pub enum RedriveAllowPolicy {
    /// Any queue may.
    AllowAll,
    /// No queue may.
    DenyAll,
    /// Only the queues listed.
    ByQueue(Vec<QueueName>),
}

/// Attributes given at creation; `None` takes the node's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueAttributes {
    /// How long a received message stays invisible (0-43,200 s; default 30).
    pub visibility_timeout_seconds: Option<u32>,
    /// Delay of every new message (0-900 s; default 0).
    pub delay_seconds: Option<u32>,
    /// How long a message is kept after its send (60-1,209,600 s; default 4 days).
    pub retention_seconds: Option<u32>,
    /// Largest body plus attributes (1,024-1,048,576 bytes; default 1 MiB).
    pub max_message_bytes: Option<u32>,
    /// Long-poll wait of a receive that names none (0-20 s; default 0).
    pub receive_wait_seconds: Option<u32>,
    /// Where messages go after too many receives.
    pub redrive_policy: Option<RedrivePolicy>,
    /// Which queues may use this one as their dead-letter queue.
    pub redrive_allow_policy: Option<RedriveAllowPolicy>,
}

/// What to do with a queue's redrive policy in [`QueueAttributeChanges`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RedriveChange {
    /// Leave it as it is.
    #[default]
    Keep,
    /// Replace it.
    Set(RedrivePolicy),
    /// Remove it.
    Clear,
}

/// Changes to a queue's attributes; `None` and [`RedriveChange::Keep`] leave a value unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueAttributeChanges {
    /// New visibility timeout (0-43,200 s).
    pub visibility_timeout_seconds: Option<u32>,
    /// New delay (0-900 s).
    pub delay_seconds: Option<u32>,
    /// New retention (60-1,209,600 s).
    pub retention_seconds: Option<u32>,
    /// New maximum message size (1,024-1,048,576 bytes).
    pub max_message_bytes: Option<u32>,
    /// New default long-poll wait (0-20 s).
    pub receive_wait_seconds: Option<u32>,
    /// The redrive policy change.
    pub redrive_policy: RedriveChange,
    /// New redrive allow policy.
    pub redrive_allow_policy: Option<RedriveAllowPolicy>,
}

/// A queue's effective settings: every attribute, defaults filled in by the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueSettings {
    /// Visibility timeout of a receive that names none.
    pub visibility_timeout_seconds: u32,
    /// Delay of a message that names none.
    pub delay_seconds: u32,
    /// How long a message is kept after its send.
    pub retention_seconds: u32,
    /// Largest body plus attributes.
    pub max_message_bytes: u32,
    /// Long-poll wait of a receive that names none.
    pub receive_wait_seconds: u32,
    /// Where messages go after too many receives, if anywhere.
    pub redrive_policy: Option<RedrivePolicy>,
    /// Which queues may use this one as their dead-letter queue, if restricted.
    pub redrive_allow_policy: Option<RedriveAllowPolicy>,
}

/// Approximate message counts of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Messages a receive could take now.
    pub ready: u64,
    /// Messages received and not yet deleted nor visible again.
    pub in_flight: u64,
    /// Messages whose delay has not ended.
    pub delayed: u64,
}

/// A queue as the node describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueInfo {
    /// Its name.
    pub name: QueueName,
    /// Its effective settings.
    pub settings: QueueSettings,
    /// When it was created, in ms since the Unix epoch.
    pub created_at_ms: u64,
    /// When its attributes last changed, in ms since the Unix epoch.
    pub modified_at_ms: u64,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// Its message counts.
    pub stats: QueueStats,
}

/// The reply to a create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CreatedQueue {
    /// The queue.
    pub queue: QueueInfo,
    /// False when the queue already existed with the same attributes.
    pub created: bool,
}

/// One page of queue names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueuePage {
    /// Names on this page, in the node's order.
    pub names: Vec<QueueName>,
    /// Pass to the next call for the following page; `None` on the last page.
    pub next_page_token: Option<String>,
}

/// The value of a message attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttributeValue {
    /// Text (for the `String` and `Number` data types).
    String(String),
    /// Bytes (for the `Binary` data type), shown in hex in JSON.
    Binary(#[serde(serialize_with = "serialize_hex")] Vec<u8>),
}

fn serialize_hex<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex(bytes))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(out, "{b:02x}").expect("writing to a String cannot fail");
    }
    out
}

/// A message attribute: a data type (`String`, `Number`, `Binary`, optionally with a custom
/// label such as `Number.int`) and a value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MessageAttribute {
    /// The data type.
    pub data_type: String,
    /// The value.
    pub value: AttributeValue,
}

impl MessageAttribute {
    /// A `String` attribute.
    pub fn string(value: impl Into<String>) -> Self {
        Self {
            data_type: "String".to_owned(),
            value: AttributeValue::String(value.into()),
        }
    }

    /// A `Number` attribute, given as its decimal text.
    pub fn number(value: impl fmt::Display) -> Self {
        Self {
            data_type: "Number".to_owned(),
            value: AttributeValue::String(value.to_string()),
        }
    }

    /// A `Binary` attribute.
    pub fn binary(value: impl Into<Vec<u8>>) -> Self {
        Self {
            data_type: "Binary".to_owned(),
            value: AttributeValue::Binary(value.into()),
        }
    }
}

/// A message to send.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendMessage {
    /// The body (at least one character).
    pub body: String,
    /// Up to 10 attributes.
    pub attributes: BTreeMap<String, MessageAttribute>,
    /// Delay before the message can be received (0-900 s); `None` takes the queue's.
    pub delay_seconds: Option<u32>,
    /// A second send with the same id within five minutes stores nothing and returns the first
    /// message's id. Setting it also makes the send safe to retry, so the client does.
    pub deduplication_id: Option<String>,
}

impl SendMessage {
    /// A message with this body and nothing else set.
    pub fn new(body: impl Into<String>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }

    /// Adds an attribute.
    #[must_use]
    pub fn attribute(mut self, name: impl Into<String>, value: MessageAttribute) -> Self {
        self.attributes.insert(name.into(), value);
        self
    }

    /// Sets the delay.
    #[must_use]
    pub fn delay_seconds(mut self, seconds: u32) -> Self {
        self.delay_seconds = Some(seconds);
        self
    }

    /// Sets the deduplication id.
    #[must_use]
    pub fn deduplication_id(mut self, id: impl Into<String>) -> Self {
        self.deduplication_id = Some(id.into());
        self
    }
}

/// The reply to a send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SentMessage {
    /// The message's id (the first message's, for a duplicate).
    pub message_id: MessageId,
    /// True when the deduplication id matched an earlier send and nothing was stored.
    pub duplicate: bool,
    /// Hex MD5 of the body as the node stored it.
    pub md5_of_body: String,
}

/// One accepted entry of a send batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SentBatchEntry {
    /// The caller's entry id.
    pub id: String,
    /// What was sent.
    pub sent: SentMessage,
}

/// The refusal of one batch entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchEntryError {
    /// The caller's entry id.
    pub id: String,
    /// A stable machine-readable code, e.g. `InvalidParameterValue`, `ReceiptHandleIsInvalid`.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// True when the entry itself is at fault: sending it again fails again.
    pub sender_fault: bool,
}

/// The reply to a batch call: entries that succeeded and entries that were refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchOutcome<T> {
    /// Accepted entries.
    pub successful: Vec<T>,
    /// Refused entries.
    pub failed: Vec<BatchEntryError>,
}

/// How to receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveOptions {
    /// At most this many messages (1-10).
    pub max_messages: u32,
    /// How long the messages stay invisible (0-43,200 s); `None` takes the queue's.
    pub visibility_timeout_seconds: Option<u32>,
    /// Long-poll wait (0-20 s); `None` takes the queue's.
    pub wait_seconds: Option<u32>,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        Self {
            max_messages: 1,
            visibility_timeout_seconds: None,
            wait_seconds: None,
        }
    }
}

/// A received message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// Its id.
    pub message_id: MessageId,
    /// The handle of this receive.
    pub receipt_handle: ReceiptHandle,
    /// Its body.
    pub body: String,
    /// Its attributes.
    pub attributes: BTreeMap<String, MessageAttribute>,
    /// Receives that delivered it, this one included.
    pub receive_count: u32,
    /// When it was sent, in ms since the Unix epoch.
    pub sent_at_ms: u64,
    /// When it was first received, in ms since the Unix epoch.
    pub first_receive_at_ms: u64,
    /// The queue it was dead-lettered from, when it was.
    pub dead_letter_source: Option<QueueName>,
    /// Hex MD5 of the body.
    pub md5_of_body: String,
}

/// One entry of a change-visibility batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibilityChange {
    /// The caller's entry id, distinct within the batch: 1-80 of `[A-Za-z0-9_-]`.
    pub id: String,
    /// The handle of the receive to extend or end.
    pub receipt_handle: ReceiptHandle,
    /// The new timeout from now (0 makes the message visible at once).
    pub visibility_timeout_seconds: u32,
}

/// One entry of a delete batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteEntry {
    /// The caller's entry id, distinct within the batch.
    pub id: String,
    /// The handle of the receive.
    pub receipt_handle: ReceiptHandle,
}

/// A redrive task to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRedrive {
    /// The dead-letter queue to move messages out of.
    pub source_queue: QueueName,
    /// `None`: each message goes back to the queue it was dead-lettered from.
    pub destination_queue: Option<QueueName>,
    /// Rate limit (1-500); `None` moves as fast as the node allows.
    pub max_messages_per_second: Option<u32>,
}

/// Where a redrive task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedriveStatus {
    /// Moving messages.
    Running,
    /// Done.
    Completed,
    /// Asked to stop, not yet stopped.
    Cancelling,
    /// Stopped before done.
    Cancelled,
    /// Stopped by an error (see `failure_reason`).
    Failed,
}

impl fmt::Display for RedriveStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Cancelling => "cancelling",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        })
    }
}

/// A redrive task and its progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RedriveTask {
    /// Its handle.
    pub task_handle: TaskHandle,
    /// The dead-letter queue it moves out of.
    pub source_queue: QueueName,
    /// Where it moves to; `None` means each message's source.
    pub destination_queue: Option<QueueName>,
    /// Where it is.
    pub status: RedriveStatus,
    /// Its rate limit; `None` when unlimited.
    pub max_messages_per_second: Option<u32>,
    /// Messages moved so far.
    pub moved: u64,
    /// Messages that could not be moved.
    pub failed: u64,
    /// Messages in the dead-letter queue when it started.
    pub to_move: u64,
    /// When it started, in ms since the Unix epoch.
    pub started_at_ms: u64,
    /// Why it failed, when it did.
    pub failure_reason: Option<String>,
}

// ---- Conversions to the wire. ----

impl From<&RedrivePolicy> for pb::RedrivePolicy {
    fn from(p: &RedrivePolicy) -> Self {
        Self {
            dead_letter_queue: p.dead_letter_queue.as_str().to_owned(),
            max_receive_count: p.max_receive_count,
        }
    }
}

impl From<&RedriveAllowPolicy> for pb::RedriveAllowPolicy {
    fn from(p: &RedriveAllowPolicy) -> Self {
        use pb::redrive_allow_policy::Permission;
        let (permission, source_queues) = match p {
            RedriveAllowPolicy::AllowAll => (Permission::AllowAll, Vec::new()),
            RedriveAllowPolicy::DenyAll => (Permission::DenyAll, Vec::new()),
            RedriveAllowPolicy::ByQueue(queues) => (
                Permission::ByQueue,
                queues.iter().map(|q| q.as_str().to_owned()).collect(),
            ),
        };
        Self {
            permission: permission.into(),
            source_queues,
        }
    }
}

impl From<&QueueAttributes> for pb::QueueAttributes {
    fn from(a: &QueueAttributes) -> Self {
        Self {
            visibility_timeout_seconds: a.visibility_timeout_seconds,
            delay_seconds: a.delay_seconds,
            retention_seconds: a.retention_seconds,
            max_message_bytes: a.max_message_bytes,
            receive_wait_seconds: a.receive_wait_seconds,
            redrive_policy: a.redrive_policy.as_ref().map(Into::into),
            redrive_allow_policy: a.redrive_allow_policy.as_ref().map(Into::into),
            clear_redrive_policy: false,
        }
    }
}

impl From<&QueueAttributeChanges> for pb::QueueAttributes {
    fn from(c: &QueueAttributeChanges) -> Self {
        let (redrive_policy, clear_redrive_policy) = match &c.redrive_policy {
            RedriveChange::Keep => (None, false),
            RedriveChange::Set(p) => (Some(p.into()), false),
            RedriveChange::Clear => (None, true),
        };
        Self {
            visibility_timeout_seconds: c.visibility_timeout_seconds,
            delay_seconds: c.delay_seconds,
            retention_seconds: c.retention_seconds,
            max_message_bytes: c.max_message_bytes,
            receive_wait_seconds: c.receive_wait_seconds,
            redrive_policy,
            redrive_allow_policy: c.redrive_allow_policy.as_ref().map(Into::into),
            clear_redrive_policy,
        }
    }
}

impl From<&MessageAttribute> for pb::MessageAttribute {
    fn from(a: &MessageAttribute) -> Self {
        use pb::message_attribute::Value;
        Self {
            data_type: a.data_type.clone(),
            value: Some(match &a.value {
                AttributeValue::String(s) => Value::StringValue(s.clone()),
                AttributeValue::Binary(b) => Value::BinaryValue(b.clone()),
            }),
        }
    }
}

pub(crate) fn attributes_to_wire(
    attributes: &BTreeMap<String, MessageAttribute>,
) -> std::collections::HashMap<String, pb::MessageAttribute> {
    attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.into()))
        .collect()
}

pub(crate) fn send_to_wire(queue: &QueueName, m: &SendMessage) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        queue: queue.as_str().to_owned(),
        body: m.body.clone(),
        attributes: attributes_to_wire(&m.attributes),
        delay_seconds: m.delay_seconds,
        deduplication_id: m.deduplication_id.clone(),
    }
}

pub(crate) fn send_entry_to_wire(id: &str, m: &SendMessage) -> pb::SendMessageBatchEntry {
    pb::SendMessageBatchEntry {
        id: id.to_owned(),
        body: m.body.clone(),
        attributes: attributes_to_wire(&m.attributes),
        delay_seconds: m.delay_seconds,
        deduplication_id: m.deduplication_id.clone(),
    }
}

// ---- Conversions from the wire. ----

fn missing(what: &str) -> Error {
    Error::Protocol {
        message: format!("the node's reply has no {what}"),
    }
}

fn redrive_policy_from_wire(p: pb::RedrivePolicy) -> RedrivePolicy {
    RedrivePolicy {
        dead_letter_queue: QueueName::from_server(p.dead_letter_queue),
        max_receive_count: p.max_receive_count,
    }
}

fn redrive_allow_policy_from_wire(
    p: pb::RedriveAllowPolicy,
) -> Result<Option<RedriveAllowPolicy>, Error> {
    use pb::redrive_allow_policy::Permission;
    let permission = Permission::try_from(p.permission).map_err(|_| Error::Protocol {
        message: format!("unknown redrive allow permission {}", p.permission),
    })?;
    Ok(match permission {
        Permission::Unspecified => None,
        Permission::AllowAll => Some(RedriveAllowPolicy::AllowAll),
        Permission::DenyAll => Some(RedriveAllowPolicy::DenyAll),
        Permission::ByQueue => Some(RedriveAllowPolicy::ByQueue(
            p.source_queues
                .into_iter()
                .map(QueueName::from_server)
                .collect(),
        )),
    })
}

impl TryFrom<pb::QueueAttributes> for QueueSettings {
    type Error = Error;
    fn try_from(a: pb::QueueAttributes) -> Result<Self, Error> {
        Ok(Self {
            visibility_timeout_seconds: a
                .visibility_timeout_seconds
                .ok_or_else(|| missing("visibility timeout"))?,
            delay_seconds: a.delay_seconds.ok_or_else(|| missing("delay"))?,
            retention_seconds: a.retention_seconds.ok_or_else(|| missing("retention"))?,
            max_message_bytes: a
                .max_message_bytes
                .ok_or_else(|| missing("max message size"))?,
            receive_wait_seconds: a
                .receive_wait_seconds
                .ok_or_else(|| missing("receive wait time"))?,
            redrive_policy: a.redrive_policy.map(redrive_policy_from_wire),
            redrive_allow_policy: match a.redrive_allow_policy {
                Some(p) => redrive_allow_policy_from_wire(p)?,
                None => None,
            },
        })
    }
}

impl TryFrom<pb::QueueInfo> for QueueInfo {
    type Error = Error;
    fn try_from(q: pb::QueueInfo) -> Result<Self, Error> {
        let stats = q.stats.unwrap_or_default();
        Ok(Self {
            name: QueueName::from_server(q.name),
            settings: q
                .attributes
                .ok_or_else(|| missing("queue attributes"))?
                .try_into()?,
            created_at_ms: q.created_at_ms,
            modified_at_ms: q.modified_at_ms,
            tags: q.tags.into_iter().collect(),
            stats: QueueStats {
                ready: stats.ready,
                in_flight: stats.in_flight,
                delayed: stats.delayed,
            },
        })
    }
}

pub(crate) fn queue_from_wire(q: Option<pb::QueueInfo>) -> Result<QueueInfo, Error> {
    q.ok_or_else(|| missing("queue"))?.try_into()
}

fn attribute_from_wire(a: pb::MessageAttribute) -> Result<MessageAttribute, Error> {
    use pb::message_attribute::Value;
    let value = match a.value {
        Some(Value::StringValue(s)) => AttributeValue::String(s),
        Some(Value::BinaryValue(b)) => AttributeValue::Binary(b),
        None => return Err(missing("message attribute value")),
    };
    Ok(MessageAttribute {
        data_type: a.data_type,
        value,
    })
}

impl TryFrom<pb::ReceivedMessage> for Message {
    type Error = Error;
    fn try_from(m: pb::ReceivedMessage) -> Result<Self, Error> {
        Ok(Self {
            message_id: MessageId::new(m.message_id),
            receipt_handle: ReceiptHandle::new(m.receipt_handle),
            body: m.body,
            attributes: m
                .attributes
                .into_iter()
                .map(|(k, v)| Ok((k, attribute_from_wire(v)?)))
                .collect::<Result<_, Error>>()?,
            receive_count: m.receive_count,
            sent_at_ms: m.sent_at_ms,
            first_receive_at_ms: m.first_receive_at_ms,
            dead_letter_source: m.dead_letter_source.map(QueueName::from_server),
            md5_of_body: m.md5_of_body,
        })
    }
}

impl From<pb::BatchEntryError> for BatchEntryError {
    fn from(e: pb::BatchEntryError) -> Self {
        Self {
            id: e.id,
            code: e.code,
            message: e.message,
            sender_fault: e.sender_fault,
        }
    }
}

impl TryFrom<pb::RedriveTask> for RedriveTask {
    type Error = Error;
    fn try_from(t: pb::RedriveTask) -> Result<Self, Error> {
        use pb::redrive_task::Status;
        let status = match Status::try_from(t.status) {
            Ok(Status::Running) => RedriveStatus::Running,
            Ok(Status::Completed) => RedriveStatus::Completed,
            Ok(Status::Cancelling) => RedriveStatus::Cancelling,
            Ok(Status::Cancelled) => RedriveStatus::Cancelled,
            Ok(Status::Failed) => RedriveStatus::Failed,
            Ok(Status::Unspecified) | Err(_) => {
                return Err(Error::Protocol {
                    message: format!("unknown redrive task status {}", t.status),
                });
            }
        };
        Ok(Self {
            task_handle: TaskHandle::new(t.task_handle),
            source_queue: QueueName::from_server(t.source_queue),
            destination_queue: t.destination_queue.map(QueueName::from_server),
            status,
            max_messages_per_second: (t.max_messages_per_second > 0)
                .then_some(t.max_messages_per_second),
            moved: t.moved,
            failed: t.failed,
            to_move: t.to_move,
            started_at_ms: t.started_at_ms,
            failure_reason: (!t.failure_reason.is_empty()).then_some(t.failure_reason),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_name_accepts_the_legal_alphabet() {
        assert!(QueueName::new("orders_v2-eu").is_ok());
        assert!(QueueName::new("a".repeat(80)).is_ok());
        assert!(QueueName::new("jobs@eu-west-1").is_ok());
    }

    #[test]
    fn queue_name_refuses_empty_long_and_foreign_characters() {
        for bad in [
            "",
            "orders.fifo",
            "with space",
            "ünïcode",
            "jobs@",
            "@eu-west-1",
            "jobs@EU",
            "jobs@eu@west",
        ] {
            let err = QueueName::new(bad).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidArgument { field: Some(f), .. } if f == "name"),
                "{bad:?}: {err:?}"
            );
        }
        assert!(QueueName::new("a".repeat(81)).is_err());
    }

    #[test]
    fn redrive_change_maps_to_policy_or_clear_flag() {
        let policy = RedrivePolicy {
            dead_letter_queue: QueueName::new("dlq").unwrap(),
            max_receive_count: 3,
        };
        let set = pb::QueueAttributes::from(&QueueAttributeChanges {
            redrive_policy: RedriveChange::Set(policy),
            ..Default::default()
        });
        assert_eq!(set.redrive_policy.unwrap().dead_letter_queue, "dlq");
        assert!(!set.clear_redrive_policy);
        let clear = pb::QueueAttributes::from(&QueueAttributeChanges {
            redrive_policy: RedriveChange::Clear,
            ..Default::default()
        });
        assert!(clear.redrive_policy.is_none());
        assert!(clear.clear_redrive_policy);
        let keep = pb::QueueAttributes::from(&QueueAttributeChanges::default());
        assert!(keep.redrive_policy.is_none() && !keep.clear_redrive_policy);
    }

    #[test]
    fn settings_with_a_missing_attribute_are_a_protocol_error() {
        let partial = pb::QueueAttributes {
            visibility_timeout_seconds: Some(30),
            ..Default::default()
        };
        assert!(matches!(
            QueueSettings::try_from(partial),
            Err(Error::Protocol { .. })
        ));
    }

    #[test]
    fn unknown_redrive_status_is_a_protocol_error() {
        let task = pb::RedriveTask {
            status: 99,
            ..Default::default()
        };
        assert!(matches!(
            RedriveTask::try_from(task),
            Err(Error::Protocol { .. })
        ));
    }

    #[test]
    fn attributes_round_trip_through_the_wire_types() {
        let attributes = BTreeMap::from([
            ("s".to_owned(), MessageAttribute::string("x")),
            ("n".to_owned(), MessageAttribute::number(42)),
            ("b".to_owned(), MessageAttribute::binary(vec![0, 255])),
        ]);
        let back: BTreeMap<String, MessageAttribute> = attributes_to_wire(&attributes)
            .into_iter()
            .map(|(k, v)| (k, attribute_from_wire(v).unwrap()))
            .collect();
        assert_eq!(back, attributes);
    }

    #[test]
    fn hex_is_lower_case_two_digits_per_byte() {
        assert_eq!(hex(&[0, 15, 16, 255]), "000f10ff");
    }
}
