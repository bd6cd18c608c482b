//! The replica service's decoding of what peers send (`cluster::wire`, the keys' decoders and
//! the node's codec) and the pure rules a replica applies to it before storing it
//! (`replica::accept`, the name, task and deduplication records' merges and votes).
//!
//! The first byte picks the mode: 0 decodes the rest as a protobuf `Batch` and every list of a
//! reply or page; the other modes split the rest at a length byte into a held record and an
//! incoming request, each wrapped in an intact frame (format byte and the right checksum), so
//! that bincode's decoding and the rules behind it are reached rather than the checksum refusal.
//! Any refusal is fine; a panic, an abort or a hang is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use trireme_core::Millis;
use trireme_node::cluster::wire;
use trireme_node::codec;
use trireme_proto::replica::v1 as pb;
use trireme_replication::coordinator::Request;
use trireme_replication::dedup::{self, DedupRecord, DedupRequest};
use trireme_replication::name::{NameRecord, NameRequest, vote};
use trireme_replication::record::Record;
use trireme_replication::replica::{Write, accept};
use trireme_replication::task::{TaskRecord, TaskRequest, accept_task};

/// `payload` in the node's frame, with its true checksum.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![codec::FORMAT_BINCODE_V1];
    frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// The held part and the incoming part of a pair mode's input.
fn split(rest: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (&held_len, rest) = rest.split_first()?;
    let (held, incoming) = rest.split_at(usize::from(held_len).min(rest.len()));
    Some((framed(held), framed(incoming)))
}

fn batch(bytes: &[u8]) {
    if let Ok(batch) = pb::Batch::decode(bytes) {
        let _ = wire::sender(batch.sender.as_ref());
        if let Ok(entries) = wire::entries(&batch.entries) {
            for (_, request) in entries {
                if let Request::Write { write, .. } = request {
                    // `wire::entries` refused malformed writes already.
                    assert!(write.malformed().is_none());
                    let _ = accept(None, &write);
                }
            }
        }
        let _ = wire::name_entries(&batch.names);
        let _ = wire::task_entries(&batch.tasks);
        let _ = wire::dedup_entries(&batch.dedups);
    }
    if let Ok(reply) = pb::BatchReply::decode(bytes) {
        let _ = wire::replies(&reply.replies, reply.replies.len());
        let _ = wire::name_replies(&reply.name_replies, reply.name_replies.len());
        let _ = wire::task_replies(&reply.task_replies, reply.task_replies.len());
        let _ = wire::dedup_replies(&reply.dedup_replies, reply.dedup_replies.len());
        if let Some(fault) = &reply.fault {
            let _ = wire::fault(fault);
        }
    }
    if let Ok(page) = pb::RecordsReply::decode(bytes) {
        let _ = wire::stored_records(&page.records);
    }
    if let Ok(page) = pb::NameRecordsReply::decode(bytes) {
        let _ = wire::stored_names(&page.records);
    }
    if let Ok(page) = pb::TaskRecordsReply::decode(bytes) {
        let _ = wire::stored_tasks(&page.records);
    }
    if let Ok(page) = pb::DedupRecordsReply::decode(bytes) {
        let _ = wire::stored_dedups(&page.records);
    }
    if let Ok(reply) = pb::DigestsReply::decode(bytes) {
        let _ = wire::digests(&reply.digests);
    }
    if let Ok(reply) = pb::CandidatesReply::decode(bytes) {
        let _ = wire::candidates(&reply.messages);
    }
}

fn records(held: &[u8], incoming: &[u8]) {
    let held: Option<Record> = codec::decode_framed(held).ok();
    let Ok(request) = codec::decode_framed::<Request>(incoming) else {
        return;
    };
    if let Request::Write { write, .. } = request {
        // The node's wire refuses what no coordinator makes (`cluster::wire::entries`).
        if write.malformed().is_some() {
            return;
        }
        let _ = accept(held.as_ref(), &write);
        if let (Some(held), Write::Merge(incoming)) = (&held, write.as_ref()) {
            let _ = held.merge(incoming);
        }
    }
}

fn names(held: &[u8], incoming: &[u8], slot: usize) {
    let held: NameRecord = codec::decode_framed(held).unwrap_or_default();
    match codec::decode_framed::<NameRequest>(incoming) {
        Ok(NameRequest::Vote { epoch, proposal }) => {
            let _ = vote(&held, slot, epoch, &proposal);
        }
        Ok(NameRequest::Write(incoming)) => {
            let _ = held.merge(&incoming);
        }
        _ => {}
    }
}

fn tasks(held: &[u8], incoming: &[u8]) {
    let held: Option<TaskRecord> = codec::decode_framed(held).ok();
    if let Ok(TaskRequest::Write { write, .. }) = codec::decode_framed::<TaskRequest>(incoming) {
        // The node's wire refuses what no coordinator makes (`cluster::wire::task_entries`).
        if write.malformed().is_some() {
            return;
        }
        let _ = accept_task(held.as_ref(), &write);
    }
}

fn dedups(held: &[u8], incoming: &[u8], now_ms: u64) {
    let held: Option<DedupRecord> = codec::decode_framed(held).ok();
    if let Ok(request) = codec::decode_framed::<DedupRequest>(incoming) {
        let _ = dedup::accept(held.as_ref(), &request, Millis(now_ms), 60_000);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 5 {
        0 => batch(rest),
        mode => {
            // The unframed bytes too: the frame's own checks.
            let _ = codec::decode_framed::<Request>(rest);
            let Some((held, incoming)) = split(rest) else {
                return;
            };
            match mode {
                1 => records(&held, &incoming),
                2 => names(&held, &incoming, usize::from(rest[0]) % 3),
                3 => tasks(&held, &incoming),
                _ => dedups(&held, &incoming, 1_700_000_000_000),
            }
        }
    }
});
