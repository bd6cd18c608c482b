//! Message move task handles, as SQS shapes them: base64 of a small JSON object with the task's
//! id and its source queue's ARN. Clients treat the handle as opaque; the ARN inside lets
//! `CancelMessageMoveTask` find the source queue without another lookup. A handle that does not
//! decode is an invalid `TaskHandle`. This module never starts or stops a task.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};

/// The decoded content of a task handle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveTaskHandle {
    /// The node's handle of the task.
    #[serde(rename = "taskId")]
    pub task_id: String,
    /// The ARN of the queue the task moves messages out of.
    #[serde(rename = "sourceArn")]
    pub source_arn: String,
}

/// Longest handle accepted for decoding; real handles are far shorter.
const HANDLE_CHARS_MAX: usize = 1_024;

impl MoveTaskHandle {
    /// The opaque handle string.
    #[must_use]
    pub fn encode(&self) -> String {
        STANDARD.encode(serde_json::to_vec(self).expect("two strings always serialize"))
    }

    /// Reads a handle string; `None` when it is not one this endpoint issued.
    #[must_use]
    pub fn decode(text: &str) -> Option<MoveTaskHandle> {
        if text.len() > HANDLE_CHARS_MAX {
            return None;
        }
        // Standard base64, as SQS writes it; the URL-safe alphabet is read too.
        let bytes = STANDARD
            .decode(text)
            .or_else(|_| URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')))
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_is_base64_json() {
        let handle = MoveTaskHandle {
            task_id: "redrive-00ff".to_owned(),
            source_arn: "arn:aws:sqs:us-east-1:000000000000:dlq".to_owned(),
        };
        let text = handle.encode();
        let json = STANDARD.decode(&text).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["taskId"], "redrive-00ff");
        assert_eq!(MoveTaskHandle::decode(&text), Some(handle.clone()));
        let url_safe = URL_SAFE_NO_PAD.encode(&json);
        assert_eq!(MoveTaskHandle::decode(&url_safe), Some(handle));
    }

    #[test]
    fn garbage_is_no_handle() {
        for junk in ["", "Z m9v", "bm90IGpzb24", &"A".repeat(2_000)] {
            assert_eq!(MoveTaskHandle::decode(junk), None, "{junk}");
        }
    }
}
