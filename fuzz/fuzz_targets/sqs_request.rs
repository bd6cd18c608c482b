//! The SQS endpoint's request parsing and validation: the first byte picks the action, the rest
//! is the JSON body, served by the endpoint's router on a node with a queue named `fuzz`. Any
//! answer is fine (most are refusals); a panic, an abort or a hang is a finding.
#![no_main]

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use trireme_fuzz::Node;

const ACTIONS: [&str; 23] = [
    "CreateQueue",
    "GetQueueUrl",
    "ListQueues",
    "DeleteQueue",
    "GetQueueAttributes",
    "SetQueueAttributes",
    "PurgeQueue",
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "ListDeadLetterSourceQueues",
    "StartMessageMoveTask",
    "ListMessageMoveTasks",
    "CancelMessageMoveTask",
    "TagQueue",
    "UntagQueue",
    "ListQueueTags",
    "AddPermission",
    "RemovePermission",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let action = ACTIONS[usize::from(selector) % ACTIONS.len()];
    let body = body.to_vec();
    Node::with(|_, router| async move {
        let request = Request::post("/")
            .header("x-amz-target", format!("AmazonSQS.{action}"))
            .header("content-type", "application/x-amz-json-1.0")
            .body(Body::from(body))
            .expect("a request of fixed parts builds");
        let response = router
            .oneshot(request)
            .await
            .expect("the router is infallible");
        // A 5xx is the node's own failure, never the answer to a malformed request.
        assert!(
            !response.status().is_server_error(),
            "{action} answered {}",
            response.status()
        );
    });
});
