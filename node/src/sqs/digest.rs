//! The MD5 digests SQS returns with every send and receive (`MD5OfMessageBody`,
//! `MD5OfMessageAttributes`, `MD5OfMessageSystemAttributes`). Several SDKs (Java, .NET, Go, Ruby,
//! JS) recompute them and fail the call on a mismatch, so the byte layout here must be SQS's to
//! the bit. This module only hashes; it never validates or rejects anything.

use md5::{Digest, Md5};

/// The bytes of one attribute value as the digest sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestValue<'a> {
    /// `String` and `Number` attributes (and their custom-labelled forms): the UTF-8 text.
    Text(&'a str),
    /// `Binary` attributes: the raw bytes, not their base64 form.
    Bytes(&'a [u8]),
}

impl DigestValue<'_> {
    /// The transport byte SQS writes before the value: 1 for text, 2 for binary.
    fn transport_byte(self) -> u8 {
        match self {
            DigestValue::Text(_) => 1,
            DigestValue::Bytes(_) => 2,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            DigestValue::Text(text) => text.as_bytes(),
            DigestValue::Bytes(bytes) => bytes,
        }
    }
}

/// One message attribute (or system attribute) as input to the digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestAttribute<'a> {
    /// The attribute's name.
    pub name: &'a str,
    /// The full data type, custom label included (`Number.java.lang.Long`).
    pub data_type: &'a str,
    /// The value.
    pub value: DigestValue<'a>,
}

/// Lowercase hex MD5 of the UTF-8 body: `MD5OfMessageBody`.
#[must_use]
pub fn body_md5(body: &str) -> String {
    to_hex(&Md5::digest(body.as_bytes()))
}

/// `MD5OfMessageAttributes` (or `MD5OfMessageSystemAttributes`): attributes sorted by name; for
/// each, the name, the data type and the value, each preceded by its length as a 4-byte
/// big-endian integer, with the transport byte between data type and value. `None` when there
/// are no attributes: SQS then leaves the member out.
#[must_use]
pub fn attributes_md5(attributes: &[DigestAttribute<'_>]) -> Option<String> {
    if attributes.is_empty() {
        return None;
    }
    let mut sorted: Vec<&DigestAttribute<'_>> = attributes.iter().collect();
    // SQS sorts by the name's bytes; names are unique within a message.
    sorted.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let mut hasher = Md5::new();
    for attribute in sorted {
        update_length_prefixed(&mut hasher, attribute.name.as_bytes());
        update_length_prefixed(&mut hasher, attribute.data_type.as_bytes());
        hasher.update([attribute.value.transport_byte()]);
        update_length_prefixed(&mut hasher, attribute.value.bytes());
    }
    Some(to_hex(&hasher.finalize()))
}

/// Lowercase hex of `bytes` (MD5 and SHA-256 digests, signatures).
#[must_use]
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        write!(out, "{byte:02x}").expect("writing to a String cannot fail");
    }
    out
}

fn update_length_prefixed(hasher: &mut Md5, bytes: &[u8]) {
    let length = u32::try_from(bytes.len())
        .expect("attribute parts are capped far below 4 GiB by the request body limit");
    hasher.update(length.to_be_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_digest_matches_the_sqs_vector() {
        assert_eq!(body_md5("derp"), "58fd9edd83341c29f1aebba81c31e257");
    }

    #[test]
    fn number_attribute_digest_matches_the_sqs_vector() {
        let attributes = [DigestAttribute {
            name: "SOME_Valid.attribute-Name",
            data_type: "Number",
            value: DigestValue::Text("1493147359900"),
        }];
        assert_eq!(
            attributes_md5(&attributes).unwrap(),
            "36655e7e9d7c0e8479fa3f3f42247ae7"
        );
    }

    #[test]
    fn custom_label_is_part_of_the_digest() {
        let attributes = [DigestAttribute {
            name: "timestamp",
            data_type: "Number.java.lang.Long",
            value: DigestValue::Text("1493147359900"),
        }];
        assert_eq!(
            attributes_md5(&attributes).unwrap(),
            "2e2e4876d8e0bd6b8c2c8f556831c349"
        );
    }

    #[test]
    fn binary_attribute_hashes_raw_bytes_with_transport_byte_2() {
        let attributes = [DigestAttribute {
            name: "binaryAttribute",
            data_type: "Binary",
            value: DigestValue::Bytes(b"Hello binary world!"),
        }];
        assert_eq!(
            attributes_md5(&attributes).unwrap(),
            "31a92b15d92f8db860eda32aceb656c3"
        );
    }

    #[test]
    fn several_attributes_are_hashed_in_name_order() {
        let string = DigestAttribute {
            name: "attribName1",
            data_type: "String",
            value: DigestValue::Text("attribValue 1"),
        };
        let custom = DigestAttribute {
            name: "customNumberTypeAttrib",
            data_type: "Number.float",
            value: DigestValue::Text("4563442423554324324264524243.32543234"),
        };
        let binary = DigestAttribute {
            name: "binaryAttribute",
            data_type: "Binary",
            value: DigestValue::Bytes(b"Hello binary world!"),
        };
        let expected = "c932db14a896c663f83c260297d594ff";
        assert_eq!(attributes_md5(&[string, custom, binary]).unwrap(), expected);
        assert_eq!(attributes_md5(&[binary, string, custom]).unwrap(), expected);
        // Each part contributes: changing the data type alone changes the digest.
        let relabelled = DigestAttribute {
            data_type: "Number",
            ..custom
        };
        assert_ne!(
            attributes_md5(&[string, relabelled, binary]).unwrap(),
            expected
        );
    }

    #[test]
    fn no_attributes_means_no_digest() {
        assert_eq!(attributes_md5(&[]), None);
    }
}
