//! The gRPC edge's conversions from protobuf into core types: the first byte picks the method,
//! the rest is decoded as that method's request message (as tonic would decode it off the wire)
//! and served by the node's `GrpcService`. Bytes that are no protobuf message end at decoding,
//! as on the wire; any status is fine for the rest. A panic, an abort, a hang or an `INTERNAL`
//! status (the node's own failure, never a caller's mistake) is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tonic::{Code, Request, Status};
use trireme_fuzz::Node;
use trireme_node::grpc::GrpcService;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_server::QueueService;

/// Decodes `bytes` as the request of `$method` and calls it; `None` when they do not decode.
macro_rules! call {
    ($service:expr, $bytes:expr, $method:ident, $request:ty) => {
        match <$request>::decode($bytes) {
            Ok(request) => Some($service.$method(Request::new(request)).await.map(|_| ())),
            Err(_) => None,
        }
    };
}

async fn serve(service: GrpcService, selector: u8, bytes: &[u8]) -> Option<Result<(), Status>> {
    match selector % 20 {
        0 => call!(service, bytes, create_queue, pb::CreateQueueRequest),
        1 => call!(service, bytes, get_queue, pb::GetQueueRequest),
        2 => call!(service, bytes, list_queues, pb::ListQueuesRequest),
        3 => call!(
            service,
            bytes,
            set_queue_attributes,
            pb::SetQueueAttributesRequest
        ),
        4 => call!(service, bytes, delete_queue, pb::DeleteQueueRequest),
        5 => call!(service, bytes, purge_queue, pb::PurgeQueueRequest),
        6 => call!(
            service,
            bytes,
            list_dead_letter_source_queues,
            pb::ListDeadLetterSourceQueuesRequest
        ),
        7 => call!(service, bytes, tag_queue, pb::TagQueueRequest),
        8 => call!(service, bytes, untag_queue, pb::UntagQueueRequest),
        9 => call!(service, bytes, send_message, pb::SendMessageRequest),
        10 => call!(
            service,
            bytes,
            send_message_batch,
            pb::SendMessageBatchRequest
        ),
        11 => call!(service, bytes, receive_messages, pb::ReceiveMessagesRequest),
        12 => call!(service, bytes, delete_message, pb::DeleteMessageRequest),
        13 => call!(
            service,
            bytes,
            delete_message_batch,
            pb::DeleteMessageBatchRequest
        ),
        14 => call!(
            service,
            bytes,
            change_visibility,
            pb::ChangeVisibilityRequest
        ),
        15 => call!(
            service,
            bytes,
            change_visibility_batch,
            pb::ChangeVisibilityBatchRequest
        ),
        16 => call!(
            service,
            bytes,
            dead_letter_message,
            pb::DeadLetterMessageRequest
        ),
        17 => call!(service, bytes, start_redrive, pb::StartRedriveRequest),
        18 => call!(service, bytes, list_redrives, pb::ListRedrivesRequest),
        _ => call!(service, bytes, cancel_redrive, pb::CancelRedriveRequest),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let bytes = bytes.to_vec();
    Node::with(|backend, _| async move {
        let service = GrpcService::new(backend);
        if let Some(Err(status)) = serve(service, selector, &bytes).await {
            assert_ne!(
                status.code(),
                Code::Internal,
                "method {selector}: {status:?}"
            );
        }
    });
});
