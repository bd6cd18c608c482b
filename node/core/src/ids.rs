//! Identifiers that cross module and crate boundaries, each a newtype that can only hold a legal
//! value. Parsing (`TryFrom`, `FromStr`) is where a name or id is validated; nothing here reads a
//! clock or draws randomness: callers choose message ids, waiter ids and times.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Reject;
use crate::limits;

/// A point in time: milliseconds since the Unix epoch. The core never reads a clock; every
/// time comes in as a `Millis` argument (spec/queue-core.md#actions).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Millis(pub u64);

impl Millis {
    /// This time plus `ms` milliseconds, saturating at the end of time instead of wrapping.
    #[must_use]
    pub fn plus_ms(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }

    /// This time plus `s` whole seconds.
    #[must_use]
    pub fn plus_s(self, s: u32) -> Millis {
        self.plus_ms(u64::from(s) * 1_000)
    }

    /// Milliseconds from `earlier` to `self`, zero when `earlier` is later.
    #[must_use]
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A queue's name: 1–80 characters of `[A-Za-z0-9_-]` (the *bare* name, as SQS knows it),
/// optionally scoped to a region other than the node's own as `name@region`, the region being
/// 1–32 characters of `[a-z0-9-]` (spec/queue-core.md, *Queues per region are names with a region
/// suffix*). A `.fifo` suffix is refused because Trireme has standard queues only (and `.` is
/// not in the alphabet anyway).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueueName(String);

impl QueueName {
    /// The name as text: `name`, or `name@region` for a queue of another region.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The bare name, without the region: what SQS calls the queue's name.
    #[must_use]
    pub fn bare(&self) -> &str {
        self.0
            .split_once('@')
            .map_or(self.0.as_str(), |(bare, _)| bare)
    }

    /// The region the name is scoped to, `None` for the node's own region.
    #[must_use]
    pub fn region(&self) -> Option<&str> {
        self.0.split_once('@').map(|(_, region)| region)
    }

    /// The bare name `bare` in `region` (`None`: the node's own region).
    ///
    /// # Errors
    /// `InvalidParameter { parameter: "QueueName" }` when `bare` is not a legal bare name (an
    /// `@` in it among the reasons), or the region is not 1–32 characters of `[a-z0-9-]`.
    pub fn scoped(bare: &str, region: Option<&str>) -> Result<Self, Reject> {
        check_bare_name(bare)?;
        match region {
            None => Ok(QueueName(bare.to_owned())),
            Some(region) => {
                check_region(region)?;
                Ok(QueueName(format!("{bare}@{region}")))
            }
        }
    }
}

/// The queues an access key limited by name prefix may reach, as a move task it started keeps
/// them for its whole life (spec/queue-core.md, *A move task moves only into queues its starter
/// may reach*): a queue is within when its bare name (without its region, as the key's check
/// at the edge reads it) begins with one of the prefixes. [`QueuePrefixes::new`] never makes an
/// empty one: an unrestricted key has no `QueuePrefixes` at all.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QueuePrefixes(Vec<String>);

impl QueuePrefixes {
    /// The restriction of a key limited to `prefixes`; `None` when there are none (the key
    /// reaches every queue).
    #[must_use]
    pub fn new(prefixes: Vec<String>) -> Option<QueuePrefixes> {
        (!prefixes.is_empty()).then_some(QueuePrefixes(prefixes))
    }

    /// Whether the queue `name` is within the restriction.
    #[must_use]
    pub fn allows(&self, name: &QueueName) -> bool {
        self.0
            .iter()
            .any(|prefix| name.bare().starts_with(prefix.as_str()))
    }

    /// The prefixes, in the key's order.
    #[must_use]
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

fn refuse_name(reason: String) -> Reject {
    Reject::InvalidParameter {
        parameter: "QueueName",
        reason,
    }
}

/// A bare name: 1–80 characters of `[A-Za-z0-9_-]`, not `.fifo`.
fn check_bare_name(name: &str) -> Result<(), Reject> {
    if name.ends_with(".fifo") {
        return Err(refuse_name(
            "FIFO queues (.fifo) are not supported: standard queues only".to_owned(),
        ));
    }
    let length = name.chars().count();
    if !(limits::queue_name_chars_min..=limits::queue_name_chars_max).contains(&length) {
        return Err(refuse_name(format!(
            "must be {}–{} characters, got {length}",
            limits::queue_name_chars_min,
            limits::queue_name_chars_max
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(refuse_name(format!(
            "may contain only A-Z, a-z, 0-9, '_' and '-', found {bad:?}"
        )));
    }
    Ok(())
}

/// Whether `region` can scope a queue name: 1–32 characters of `[a-z0-9-]` (the one rule; the
/// SQS endpoint and the configuration check a region with it too).
#[must_use]
pub fn region_is_legal(region: &str) -> bool {
    (1..=limits::region_chars_max).contains(&region.len())
        && region
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
}

/// A region of a scoped name: 1–32 characters of `[a-z0-9-]`.
fn check_region(region: &str) -> Result<(), Reject> {
    if region_is_legal(region) {
        Ok(())
    } else {
        Err(refuse_name(format!(
            "the region after '@' must be 1–{} characters of a-z, 0-9 and '-', got {region:?}",
            limits::region_chars_max
        )))
    }
}

impl TryFrom<String> for QueueName {
    type Error = Reject;

    /// # Errors
    /// `InvalidParameter { parameter: "QueueName" }` for an empty or too long name, a character
    /// outside `[A-Za-z0-9_-]`, a FIFO (`.fifo`) name, or an illegal region after `@`.
    fn try_from(name: String) -> Result<Self, Reject> {
        match name.split_once('@') {
            None => {
                check_bare_name(&name)?;
                Ok(QueueName(name))
            }
            Some((bare, region)) => {
                check_bare_name(bare)?;
                check_region(region)?;
                Ok(QueueName(name))
            }
        }
    }
}

impl TryFrom<&str> for QueueName {
    type Error = Reject;

    /// # Errors
    /// As for `TryFrom<String>`.
    fn try_from(name: &str) -> Result<Self, Reject> {
        QueueName::try_from(name.to_owned())
    }
}

impl From<QueueName> for String {
    fn from(name: QueueName) -> String {
        name.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message's id, chosen by the caller (at random), unique for the life of the node.
/// Displayed as lowercase `8-4-4-4-12` hex, like the UUIDs SQS hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MessageId(pub u128);

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = format!("{:032x}", self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

impl FromStr for MessageId {
    type Err = Reject;

    /// Parses the `8-4-4-4-12` hex form that `Display` writes (either case).
    ///
    /// # Errors
    /// `InvalidParameter { parameter: "MessageId" }` for any other shape.
    fn from_str(text: &str) -> Result<Self, Reject> {
        let refuse = || Reject::InvalidParameter {
            parameter: "MessageId",
            reason: format!("expected 8-4-4-4-12 hexadecimal digits, got {text:?}"),
        };
        let groups: Vec<&str> = text.split('-').collect();
        let widths = [8, 4, 4, 4, 12];
        if groups.len() != widths.len()
            || groups.iter().zip(widths).any(|(group, width)| {
                group.len() != width || !group.chars().all(|c| c.is_ascii_hexdigit())
            })
        {
            return Err(refuse());
        }
        u128::from_str_radix(&groups.concat(), 16)
            .map(MessageId)
            .map_err(|_| refuse())
    }
}

/// A long poll waiting for a message, chosen by the caller, unique among open waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WaiterId(pub u64);

impl fmt::Display for WaiterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "waiter-{}", self.0)
    }
}

/// Which creation of a queue name this is: `(hlc_ms, node, nonce)`, the creating coordinator's
/// hybrid logical clock, its node id and a random nonce (spec/replication.md §1, *The name
/// record*). Unique by construction in a cluster: node ids are unique and one node never draws
/// the same `(hlc_ms, nonce)` twice. Ordered by its fields in order.
///
/// A node running alone creates [`Incarnation::local`] (node 0, nonce 0): a name cannot be
/// created again within `queue_name_reuse_ms` of its deletion and time inside the core never
/// goes back, so two creations of one name never share an incarnation there either.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Incarnation {
    /// The creating coordinator's hybrid logical clock at the create, in ms.
    pub hlc_ms: u64,
    /// The creating node (0 for a node running alone).
    pub node: u16,
    /// Drawn by the creating coordinator (0 for a node running alone).
    pub nonce: u64,
}

impl Incarnation {
    /// The incarnation a node running alone gives a queue created at `created_at`.
    #[must_use]
    pub const fn local(created_at: Millis) -> Incarnation {
        Incarnation {
            hlc_ms: created_at.0,
            node: 0,
            nonce: 0,
        }
    }
}

/// Which version and which claim of a replicated message a receipt handle names
/// (spec/replication.md, *The record*: `generation`, and the claim's coordinator and nonce).
/// The core never reads it: a node running alone issues the zero tag, and the cluster
/// coordinator fills it in from the claim it delivered.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ClaimTag {
    /// The message's generation in its queue.
    pub generation: u32,
    /// The coordinator that issued the claim.
    pub coordinator: u16,
    /// The nonce that coordinator drew for the claim.
    pub nonce: u64,
}

/// A receipt handle as the core sees it, after the edge decoded and authenticated the string
/// (spec/queue-core.md#deletequeue-handle). `seq` counts receives of the message from 1, so no
/// issued handle has `seq = 0`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReceiptHandle {
    /// The queue whose receive issued the handle.
    pub queue: QueueName,
    /// The creation of that queue the handle belongs to.
    pub incarnation: Incarnation,
    /// The message the handle names.
    pub message: MessageId,
    /// Which receive of the message issued the handle (its receive count after that receive).
    pub seq: u32,
    /// In a cluster, the version and claim; zero on a node running alone.
    pub claim: ClaimTag,
}

/// A send's deduplication id: 1–128 printable ASCII characters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DedupId(String);

impl DedupId {
    /// The id as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for DedupId {
    type Error = Reject;

    /// # Errors
    /// `InvalidParameter { parameter: "MessageDeduplicationId" }` when empty, longer than
    /// `dedup_id_chars_max`, or holding a character outside printable ASCII.
    fn try_from(id: String) -> Result<Self, Reject> {
        let length = id.chars().count();
        if !(1..=limits::dedup_id_chars_max).contains(&length) {
            return Err(Reject::InvalidParameter {
                parameter: "MessageDeduplicationId",
                reason: format!(
                    "must be 1–{} characters, got {length}",
                    limits::dedup_id_chars_max
                ),
            });
        }
        if let Some(bad) = id.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(Reject::InvalidParameter {
                parameter: "MessageDeduplicationId",
                reason: format!("may contain only printable ASCII, found {bad:?}"),
            });
        }
        Ok(DedupId(id))
    }
}

impl TryFrom<&str> for DedupId {
    type Error = Reject;

    /// # Errors
    /// As for `TryFrom<String>`.
    fn try_from(id: &str) -> Result<Self, Reject> {
        DedupId::try_from(id.to_owned())
    }
}

impl From<DedupId> for String {
    fn from(id: DedupId) -> String {
        id.0
    }
}

impl fmt::Display for DedupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_name_accepts_the_sqs_alphabet_up_to_80_characters() {
        assert!(QueueName::try_from("orders_v2-eu").is_ok());
        assert!(QueueName::try_from("a".repeat(80).as_str()).is_ok());
    }

    #[test]
    fn queue_name_refuses_empty_long_fifo_and_foreign_characters() {
        for bad in [
            "",
            &"a".repeat(81),
            "jobs.fifo",
            "with space",
            "dot.ted",
            "é",
        ] {
            let result = QueueName::try_from(bad);
            assert!(
                matches!(
                    result,
                    Err(Reject::InvalidParameter {
                        parameter: "QueueName",
                        ..
                    })
                ),
                "{bad:?} gave {result:?}"
            );
        }
    }

    #[test]
    fn queue_name_scoped_to_a_region_keeps_its_bare_name_and_region() {
        let home = QueueName::scoped("jobs", None).unwrap();
        assert_eq!(
            (home.as_str(), home.bare(), home.region()),
            ("jobs", "jobs", None)
        );
        let away = QueueName::scoped("jobs", Some("eu-west-1")).unwrap();
        assert_eq!(away.as_str(), "jobs@eu-west-1");
        assert_eq!((away.bare(), away.region()), ("jobs", Some("eu-west-1")));
        assert_ne!(home, away);
        assert_eq!(QueueName::try_from("jobs@eu-west-1").unwrap(), away);
        let longest = format!("{}@{}", "a".repeat(80), "r".repeat(32));
        assert!(QueueName::try_from(longest.as_str()).is_ok());
    }

    #[test]
    fn queue_name_refuses_an_at_in_a_bare_name_and_illegal_regions() {
        for (bare, region) in [
            ("jo@bs", None),
            ("jobs", Some("")),
            ("jobs", Some("EU-WEST-1")),
            ("jobs", Some("eu_west_1")),
            ("jobs", Some("eu@west")),
        ] {
            assert!(
                QueueName::scoped(bare, region).is_err(),
                "{bare:?} {region:?}"
            );
        }
        let too_long = "r".repeat(33);
        assert!(QueueName::scoped("jobs", Some(&too_long)).is_err());
        for bad in ["jobs@", "@eu-west-1", "jobs@eu@west", "jobs.fifo@eu-west-1"] {
            assert!(QueueName::try_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn message_id_displays_as_uuid_and_parses_back() {
        let id = MessageId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let text = id.to_string();
        assert_eq!(text, "01234567-89ab-cdef-0011-223344556677");
        assert_eq!(text.parse::<MessageId>().unwrap(), id);
        assert_eq!(
            "01234567-89AB-CDEF-0011-223344556677"
                .parse::<MessageId>()
                .unwrap(),
            id
        );
    }

    #[test]
    fn message_id_refuses_other_shapes() {
        for bad in [
            "",
            "0123456789abcdef0011223344556677",
            "01234567-89ab-cdef-0011-22334455667",
            "01234567-89ab-cdef-0011-22334455667g",
            "+1234567-89ab-cdef-0011-223344556677",
        ] {
            assert!(bad.parse::<MessageId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn dedup_id_is_1_to_128_printable_ascii() {
        assert!(DedupId::try_from("order-17!").is_ok());
        assert!(DedupId::try_from("x".repeat(128).as_str()).is_ok());
        assert!(DedupId::try_from("").is_err());
        assert!(DedupId::try_from("x".repeat(129).as_str()).is_err());
        assert!(DedupId::try_from("tab\there").is_err());
        assert!(DedupId::try_from("space here").is_err());
    }

    #[test]
    fn queue_name_deserialization_validates() {
        assert_eq!(
            serde_json::from_str::<QueueName>("\"jobs\"").unwrap(),
            QueueName::try_from("jobs").unwrap()
        );
        assert!(serde_json::from_str::<QueueName>("\"jobs.fifo\"").is_err());
        assert!(serde_json::from_str::<DedupId>("\"\"").is_err());
    }

    #[test]
    fn millis_arithmetic_saturates() {
        assert_eq!(Millis(1_000).plus_s(30), Millis(31_000));
        assert_eq!(Millis(u64::MAX).plus_ms(5), Millis(u64::MAX));
        assert_eq!(Millis(5).since(Millis(9)), 0);
        assert_eq!(Millis(9).since(Millis(5)), 4);
    }
}
