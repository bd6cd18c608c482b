//! One message's state (spec/queue-core.md#variables) and the checks a message passes before it
//! is stored: body characters, attribute count and names, and size. It never decides when a
//! message changes state; `Queues` does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Reject;
use crate::ids::{MessageId, Millis, QueueName};
use crate::limits;

/// A message attribute's value with its data type (`String`, `Number`, `Binary`, optionally with
/// a custom label such as `Number.java.lang.Long`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttributeValue {
    /// A `String` or `Number` attribute.
    String { data_type: String, value: String },
    /// A `Binary` attribute.
    Binary { data_type: String, value: Vec<u8> },
}

impl AttributeValue {
    /// The full data type, custom label included.
    #[must_use]
    pub fn data_type(&self) -> &str {
        match self {
            AttributeValue::String { data_type, .. } | AttributeValue::Binary { data_type, .. } => {
                data_type
            }
        }
    }

    /// Bytes of the value.
    #[must_use]
    pub fn value_bytes(&self) -> usize {
        match self {
            AttributeValue::String { value, .. } => value.len(),
            AttributeValue::Binary { value, .. } => value.len(),
        }
    }
}

/// Where a stored message is in its life inside its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MessageState {
    /// Sent with a delay; becomes ready at `until`.
    Delayed { until: Millis },
    /// Can be received; ready since `since` (receive takes the oldest first).
    Ready { since: Millis },
    /// Received and invisible until `until`, then ready again (keeping its handle).
    InFlight { until: Millis },
}

/// The system attributes a sender may set, kept with the body and returned on every receive
/// (dead-letter moves included), as SQS keeps them. They do not count towards the message's size.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemAttributes {
    /// `AWSTraceHeader`: the sender's X-Ray trace header.
    pub trace_header: Option<String>,
    /// `MessageGroupId`: a standard queue keeps and returns it (fair queues use it).
    pub group_id: Option<String>,
}

/// A stored message. `Queues` owns every instance and keeps its indexes in step with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) queue: QueueName,
    pub(crate) state: MessageState,
    pub(crate) receive_count: u32,
    pub(crate) last_seq: u32,
    pub(crate) first_receive_at: Option<Millis>,
    pub(crate) received_at: Option<Millis>,
    pub(crate) handle: Option<u32>,
    pub(crate) sent_at: Millis,
    pub(crate) source: Option<QueueName>,
    pub(crate) body: String,
    pub(crate) attributes: BTreeMap<String, AttributeValue>,
    pub(crate) system: SystemAttributes,
}

impl Message {
    pub(crate) fn view(&self, id: MessageId) -> MessageView {
        MessageView {
            id,
            queue: self.queue.clone(),
            state: self.state,
            receive_count: self.receive_count,
            last_seq: self.last_seq,
            first_receive_at: self.first_receive_at,
            received_at: self.received_at,
            handle: self.handle,
            sent_at: self.sent_at,
            source: self.source.clone(),
            body: self.body.clone(),
            attributes: self.attributes.clone(),
        }
    }
}

/// Everything the core knows about one stored message, for inspection and for the conformance
/// tests that compare the core with the model. A message that is gone has no view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageView {
    /// The message's id.
    pub id: MessageId,
    /// The queue it is in now.
    pub queue: QueueName,
    /// Delayed, ready or in flight, with the time that goes with the state.
    pub state: MessageState,
    /// Deliveries since the message entered its current life (send or redrive).
    pub receive_count: u32,
    /// The highest receipt-handle `seq` ever issued for this message, in any queue and any life.
    /// It equals `receive_count` until a redrive resets the count; it never goes down, so a
    /// handle from before a redrive can never match a handle issued after it.
    pub last_seq: u32,
    /// When the first receive delivered it; `None` until then.
    pub first_receive_at: Option<Millis>,
    /// When the latest receive delivered it; the anchor of the 12 h visibility cap.
    pub received_at: Option<Millis>,
    /// `seq` of the newest receipt handle issued in the current queue; `None` until the first
    /// receive there.
    pub handle: Option<u32>,
    /// When it was originally sent; retention counts from here.
    pub sent_at: Millis,
    /// The queue it was moved from into its dead-letter queue.
    pub source: Option<QueueName>,
    /// The body, as sent.
    pub body: String,
    /// The message attributes, as sent.
    pub attributes: BTreeMap<String, AttributeValue>,
}

/// Size of a message as SQS counts it against `MaximumMessageSize`: body bytes plus, for every
/// attribute, its name, data type and value bytes.
#[must_use]
pub fn message_size_bytes(body: &str, attributes: &BTreeMap<String, AttributeValue>) -> u64 {
    let attribute_bytes: usize = attributes
        .iter()
        .map(|(name, value)| name.len() + value.data_type().len() + value.value_bytes())
        .sum();
    (body.len() + attribute_bytes) as u64
}

/// Checks a body and its attributes against SQS's rules and the queue's size limit.
///
/// # Errors
/// `InvalidMessageContents` for an empty body or a character SQS refuses; `InvalidParameter`
/// for too many attributes or a malformed attribute name, type or value; `MessageTooLong` when
/// the total exceeds `message_bytes_max`.
pub fn check_message(
    body: &str,
    attributes: &BTreeMap<String, AttributeValue>,
    message_bytes_max: u32,
) -> Result<(), Reject> {
    if body.is_empty() {
        return Err(Reject::InvalidMessageContents {
            reason: "the body must hold at least one character".to_owned(),
        });
    }
    // Most bodies are ASCII, and a byte loop without early exit settles those several times
    // faster than decoding chars (it was most of a send's time in `benches/core.rs`). Any other
    // body, or an ASCII one with a refused byte, takes the char path, which names the culprit.
    let ascii_allowed = body.bytes().fold(true, |allowed, byte| {
        allowed & body_ascii_byte_allowed(byte)
    });
    if !ascii_allowed && let Some(bad) = body.chars().find(|c| !body_char_allowed(*c)) {
        return Err(Reject::InvalidMessageContents {
            reason: format!("character U+{:04X} is not allowed", u32::from(bad)),
        });
    }
    if attributes.len() > limits::message_attributes_max {
        return Err(Reject::InvalidParameter {
            parameter: "MessageAttributes",
            reason: format!(
                "at most {} attributes, got {}",
                limits::message_attributes_max,
                attributes.len()
            ),
        });
    }
    for (name, value) in attributes {
        check_attribute(name, value)?;
    }
    let size_bytes = message_size_bytes(body, attributes);
    if size_bytes > u64::from(message_bytes_max) {
        return Err(Reject::MessageTooLong {
            size_bytes,
            max_bytes: message_bytes_max,
        });
    }
    Ok(())
}

/// Checks the system attributes a sender set: lengths only (the SQS edge checks their form).
///
/// # Errors
/// `InvalidParameter` naming the attribute that is too long or empty.
pub fn check_system_attributes(system: &SystemAttributes) -> Result<(), Reject> {
    let fields = [
        (
            "AWSTraceHeader",
            &system.trace_header,
            limits::trace_header_chars_max,
        ),
        (
            "MessageGroupId",
            &system.group_id,
            limits::group_id_chars_max,
        ),
    ];
    for (parameter, value, max) in fields {
        if let Some(value) = value {
            let chars = value.chars().count();
            if !(1..=max).contains(&chars) {
                return Err(Reject::InvalidParameter {
                    parameter,
                    reason: format!("must be 1–{max} characters, got {chars}"),
                });
            }
        }
    }
    Ok(())
}

/// The characters SQS allows in a body: `#x9 #xA #xD #x20–#xD7FF #xE000–#xFFFD
/// #x10000–#x10FFFF` (a Rust `char` is never a surrogate, so `#xD800–#xDFFF` cannot occur).
/// The SQS edge applies it to string attribute values too, as SQS does.
#[must_use]
pub fn body_char_allowed(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// `body_char_allowed` for a byte of an ASCII body: false for every byte of a multi-byte char.
fn body_ascii_byte_allowed(byte: u8) -> bool {
    matches!(byte, b'\t' | b'\n' | b'\r' | 0x20..=0x7F)
}

fn check_attribute(name: &str, value: &AttributeValue) -> Result<(), Reject> {
    let refuse = |reason: String| Reject::InvalidParameter {
        parameter: "MessageAttributes",
        reason,
    };
    let name_chars = name.chars().count();
    if !(1..=limits::message_attribute_name_chars_max).contains(&name_chars) {
        return Err(refuse(format!(
            "attribute names are 1–{} characters, got {name_chars}",
            limits::message_attribute_name_chars_max
        )));
    }
    // Letters and digits of any script, as SQS allows (`attr.1øßä` is a legal name there).
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(refuse(format!(
            "attribute name {name:?} holds {bad:?}; allowed are letters, digits, '_', '-', '.'"
        )));
    }
    if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        return Err(refuse(format!(
            "attribute name {name:?} may not start or end with '.' or hold '..'"
        )));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        return Err(refuse(format!(
            "attribute name {name:?} uses a reserved prefix (AWS. or Amazon.)"
        )));
    }
    let data_type = value.data_type();
    if data_type.chars().count() > limits::message_attribute_type_chars_max {
        return Err(refuse(format!(
            "data type of {name:?} is longer than {} characters",
            limits::message_attribute_type_chars_max
        )));
    }
    let base = data_type.split('.').next().unwrap_or_default();
    let base_fits = match value {
        AttributeValue::String { .. } => base == "String" || base == "Number",
        AttributeValue::Binary { .. } => base == "Binary",
    };
    if !base_fits {
        return Err(refuse(format!(
            "data type {data_type:?} of {name:?} does not fit its value (String, Number or Binary)"
        )));
    }
    if value.value_bytes() == 0 {
        return Err(refuse(format!("attribute {name:?} has an empty value")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(data_type: &str, value: &str) -> AttributeValue {
        AttributeValue::String {
            data_type: data_type.to_owned(),
            value: value.to_owned(),
        }
    }

    #[test]
    fn size_counts_body_and_attribute_names_types_and_values() {
        let mut attributes = BTreeMap::new();
        attributes.insert(
            "ts".to_owned(),
            string("Number.java.lang.Long", "1493147359900"),
        );
        attributes.insert(
            "raw".to_owned(),
            AttributeValue::Binary {
                data_type: "Binary".to_owned(),
                value: vec![1, 2, 3],
            },
        );
        let expected = "héllo".len() + 2 + 21 + 13 + 3 + 6 + 3;
        assert_eq!(message_size_bytes("héllo", &attributes), expected as u64);
    }

    #[test]
    fn message_at_the_size_limit_is_accepted_and_one_byte_more_refused() {
        let mut attributes = BTreeMap::new();
        attributes.insert("k".to_owned(), string("String", "v"));
        let overhead = 1 + 6 + 1;
        let body = "x".repeat(1_024 - overhead);
        assert_eq!(check_message(&body, &attributes, 1_024), Ok(()));
        let longer = format!("{body}x");
        assert_eq!(
            check_message(&longer, &attributes, 1_024),
            Err(Reject::MessageTooLong {
                size_bytes: 1_025,
                max_bytes: 1_024
            })
        );
    }

    #[test]
    fn body_characters_follow_sqs() {
        assert_eq!(
            check_message("tab\tnl\ncr\r ok ☃ 𝄞", &BTreeMap::new(), 1_024),
            Ok(())
        );
        assert_eq!(
            check_message("ascii only\t\r\n ~\u{7F}", &BTreeMap::new(), 1_024),
            Ok(())
        );
        for bad in [
            "",
            "nul\u{0}",
            "bell\u{7}",
            "\u{FFFE}",
            "é then \u{1}",
            "\u{1F}é",
        ] {
            assert!(
                matches!(
                    check_message(bad, &BTreeMap::new(), 1_024),
                    Err(Reject::InvalidMessageContents { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ascii_fast_path_agrees_with_the_char_rule() {
        for byte in 0..=0x7Fu8 {
            assert_eq!(
                body_ascii_byte_allowed(byte),
                body_char_allowed(char::from(byte)),
                "byte {byte:#04x}"
            );
        }
        for byte in 0x80..=0xFFu8 {
            assert!(!body_ascii_byte_allowed(byte), "byte {byte:#04x}");
        }
    }

    #[test]
    fn at_most_ten_attributes() {
        let ten: BTreeMap<String, AttributeValue> = (0..10)
            .map(|i| (format!("a{i}"), string("String", "v")))
            .collect();
        assert_eq!(check_message("b", &ten, 1_024), Ok(()));
        let mut eleven = ten.clone();
        eleven.insert("a10".to_owned(), string("String", "v"));
        assert!(matches!(
            check_message("b", &eleven, 1_024),
            Err(Reject::InvalidParameter {
                parameter: "MessageAttributes",
                ..
            })
        ));
    }

    #[test]
    fn attribute_names_and_types_follow_sqs() {
        let refused = |name: &str, value: AttributeValue| {
            let attributes = BTreeMap::from([(name.to_owned(), value)]);
            check_message("b", &attributes, 1_024).is_err()
        };
        assert!(!refused("SOME_Valid.attribute-Name", string("Number", "1")));
        assert!(!refused("custom", string("String.label", "x")));
        assert!(refused("", string("String", "x")));
        assert!(refused(".lead", string("String", "x")));
        assert!(refused("trail.", string("String", "x")));
        assert!(refused("dou..ble", string("String", "x")));
        assert!(refused("AWS.trace", string("String", "x")));
        assert!(refused("amazon.x", string("String", "x")));
        assert!(refused("sp ace", string("String", "x")));
        assert!(refused("k", string("Binary", "x")));
        assert!(refused("k", string("Integer", "1")));
        assert!(refused("k", string("String", "")));
        assert!(refused(
            "k",
            AttributeValue::Binary {
                data_type: "String".to_owned(),
                value: vec![1]
            }
        ));
    }
}
