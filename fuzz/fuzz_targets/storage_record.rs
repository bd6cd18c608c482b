//! The node's storage record decoder: a value of the records table (`StoredEntry`, framed by
//! the node's codec) and a key, as `Storage::load` reads them at start. The input is tried as
//! it is (the frame's own checks) and as the payload of an intact frame (so that bincode's
//! decoding of the record is reached). Any refusal is fine; a panic, an abort or a hang is a
//! finding. (What a start does with records that decode but contradict each other is
//! `Queues::restore`'s documented refusal to start, not a decoder's concern.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use trireme_core::RecordKey;
use trireme_node::codec;
use trireme_node::storage::StoredEntry;

fuzz_target!(|data: &[u8]| {
    let _ = codec::decode_framed::<StoredEntry>(data);
    let _ = codec::decode_key::<RecordKey>(data);
    let mut frame = vec![codec::FORMAT_BINCODE_V1];
    frame.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    frame.extend_from_slice(data);
    if let Ok(StoredEntry::Live { record, .. }) = codec::decode_framed::<StoredEntry>(&frame) {
        // A record that decodes is one the node can write back (encoding it never panics).
        let again = codec::encode_framed(&StoredEntry::Live {
            revision: 0,
            record,
        });
        assert!(codec::decode_framed::<StoredEntry>(&again).is_ok());
    }
});
