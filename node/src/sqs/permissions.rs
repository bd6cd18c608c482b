//! `AddPermission` and `RemovePermission` as SQS performs them: each adds or removes one
//! statement, named by its label (`Sid`), in the queue's `Policy` document. The document is
//! kept and returned, never enforced (access is the endpoint's keys'). This module only edits
//! the document's text; reading and storing the queue's policy is the action's.

use serde_json::{Map, Value, json};

use super::error::SqsError;

/// The longest label SQS accepts.
const LABEL_CHARS_MAX: usize = 80;

/// The policy with a statement `label` that allows `accounts` the `actions` on the queue
/// `queue_arn`; a queue without a policy gets SQS's default document around it.
///
/// # Errors
/// `InvalidParameterValue` for a label already in the policy or not of SQS's form.
pub fn add_statement(
    policy: Option<&str>,
    queue_arn: &str,
    label: &str,
    accounts: &[String],
    actions: &[String],
) -> Result<String, SqsError> {
    check_label(label)?;
    let mut document = match policy.and_then(|text| serde_json::from_str::<Value>(text).ok()) {
        Some(Value::Object(document)) => document,
        _ => default_document(queue_arn),
    };
    let statements = statements(&mut document);
    if statements
        .iter()
        .any(|statement| statement.get("Sid").and_then(Value::as_str) == Some(label))
    {
        return Err(SqsError::invalid("Label", label, "Already exists."));
    }
    let principals: Vec<Value> = accounts
        .iter()
        .map(|account| Value::String(format!("arn:aws:iam::{account}:root")))
        .collect();
    let actions: Vec<Value> = actions
        .iter()
        .map(|action| Value::String(format!("SQS:{action}")))
        .collect();
    statements.push(json!({
        "Sid": label,
        "Effect": "Allow",
        "Principal": { "AWS": one_or_list(principals) },
        "Action": one_or_list(actions),
        "Resource": queue_arn,
    }));
    Ok(Value::Object(document).to_string())
}

/// The policy without the statement `label`; `None` once no statement is left (SQS then
/// answers no `Policy` at all).
///
/// # Errors
/// `InvalidParameterValue` when no statement has this label.
pub fn remove_statement(policy: Option<&str>, label: &str) -> Result<Option<String>, SqsError> {
    let missing = || SqsError::invalid("Label", label, "can't find label.");
    let Some(Value::Object(mut document)) =
        policy.and_then(|text| serde_json::from_str::<Value>(text).ok())
    else {
        return Err(missing());
    };
    let statements = statements(&mut document);
    let before = statements.len();
    statements.retain(|statement| statement.get("Sid").and_then(Value::as_str) != Some(label));
    if statements.len() == before {
        return Err(missing());
    }
    if statements.is_empty() {
        return Ok(None);
    }
    Ok(Some(Value::Object(document).to_string()))
}

fn check_label(label: &str) -> Result<(), SqsError> {
    let legal = (1..=LABEL_CHARS_MAX).contains(&label.chars().count())
        && label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if legal {
        Ok(())
    } else {
        Err(SqsError::invalid(
            "Label",
            label,
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length.",
        ))
    }
}

/// The document SQS starts a queue's policy with.
fn default_document(queue_arn: &str) -> Map<String, Value> {
    let mut document = Map::new();
    document.insert("Version".to_owned(), json!("2008-10-17"));
    document.insert(
        "Id".to_owned(),
        json!(format!("{queue_arn}/SQSDefaultPolicy")),
    );
    document.insert("Statement".to_owned(), json!([]));
    document
}

/// The document's statements as a list (a single statement object becomes a list of one).
fn statements(document: &mut Map<String, Value>) -> &mut Vec<Value> {
    let entry = document
        .entry("Statement")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !entry.is_array() {
        let single = entry.take();
        *entry = Value::Array(if single.is_null() {
            vec![]
        } else {
            vec![single]
        });
    }
    entry.as_array_mut().expect("made an array just above")
}

/// One value as itself, several as a list: SQS's form for principals and actions.
fn one_or_list(mut values: Vec<Value>) -> Value {
    if values.len() == 1 {
        values.remove(0)
    } else {
        Value::Array(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str = "arn:aws:sqs:us-east-1:000000000000:jobs";

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| (*item).to_owned()).collect()
    }

    #[test]
    fn statements_are_added_in_sqs_form_and_removed_by_label() {
        let one = add_statement(
            None,
            ARN,
            "readers",
            &strings(&["111111111111", "222222222222"]),
            &strings(&["ReceiveMessage"]),
        )
        .unwrap();
        let document: Value = serde_json::from_str(&one).unwrap();
        assert_eq!(document["Version"], "2008-10-17");
        assert_eq!(document["Id"], format!("{ARN}/SQSDefaultPolicy"));
        let statement = &document["Statement"][0];
        assert_eq!(statement["Sid"], "readers");
        assert_eq!(statement["Effect"], "Allow");
        assert_eq!(
            statement["Principal"]["AWS"],
            json!([
                "arn:aws:iam::111111111111:root",
                "arn:aws:iam::222222222222:root"
            ])
        );
        assert_eq!(statement["Action"], "SQS:ReceiveMessage");
        assert_eq!(statement["Resource"], ARN);
        let two = add_statement(
            Some(&one),
            ARN,
            "writers",
            &strings(&["111111111111"]),
            &strings(&["SendMessage", "DeleteMessage"]),
        )
        .unwrap();
        let document: Value = serde_json::from_str(&two).unwrap();
        assert_eq!(document["Statement"].as_array().unwrap().len(), 2);
        assert_eq!(
            document["Statement"][1]["Principal"]["AWS"],
            "arn:aws:iam::111111111111:root"
        );
        let left = remove_statement(Some(&two), "readers").unwrap().unwrap();
        let document: Value = serde_json::from_str(&left).unwrap();
        assert_eq!(document["Statement"][0]["Sid"], "writers");
        assert_eq!(remove_statement(Some(&left), "writers").unwrap(), None);
    }

    #[test]
    fn a_repeated_or_unknown_label_is_refused_in_sqs_words() {
        let one = add_statement(None, ARN, "p", &strings(&["1"]), &strings(&["*"])).unwrap();
        assert_eq!(
            add_statement(Some(&one), ARN, "p", &strings(&["2"]), &strings(&["*"]))
                .unwrap_err()
                .to_string(),
            "Value p for parameter Label is invalid. Reason: Already exists."
        );
        assert_eq!(
            remove_statement(Some(&one), "q").unwrap_err().to_string(),
            "Value q for parameter Label is invalid. Reason: can't find label."
        );
        assert!(remove_statement(None, "p").is_err());
        assert!(add_statement(None, ARN, "bad label", &strings(&["1"]), &strings(&["*"])).is_err());
    }
}
