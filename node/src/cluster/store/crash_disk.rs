//! A file for crash tests of the replica store (tests only): its synced state is kept apart from
//! what was written since, and a crash keeps the synced bytes and, of each unsynced write, a
//! prefix (a torn write) or nothing.

use std::sync::{Arc, Mutex};

use redb::StorageBackend;

/// A file whose synced state is kept apart from what was written since: a crash keeps the
/// synced bytes and, of the unsynced writes, a prefix of each (a torn write) or nothing.
#[derive(Debug, Clone, Default)]
pub struct Disk {
    state: Arc<Mutex<DiskState>>,
}

#[derive(Debug, Default)]
struct DiskState {
    written: Vec<u8>,
    synced: Vec<u8>,
    /// Writes since the last sync, `(offset, bytes)`.
    pending: Vec<(u64, Vec<u8>)>,
}

impl Disk {
    /// The file after a crash: synced bytes, then each unsynced write torn to its first
    /// `keep(i)` bytes.
    pub fn crashed(&self, keep: impl Fn(usize, usize) -> usize) -> Disk {
        let state = self.state.lock().unwrap();
        let mut bytes = state.synced.clone();
        for (i, (offset, data)) in state.pending.iter().enumerate() {
            if data.is_empty() {
                // An unsynced size change: the crash may or may not keep it; it holds
                // only zeros either way.
                continue;
            }
            let kept = keep(i, data.len()).min(data.len());
            let end = *offset as usize + kept;
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[*offset as usize..end].copy_from_slice(&data[..kept]);
        }
        Disk {
            state: Arc::new(Mutex::new(DiskState {
                written: bytes.clone(),
                synced: bytes,
                pending: Vec::new(),
            })),
        }
    }
}

impl StorageBackend for Disk {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.state.lock().unwrap().written.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let state = self.state.lock().unwrap();
        let start = offset as usize;
        out.copy_from_slice(&state.written[start..start + out.len()]);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap();
        state.written.resize(len as usize, 0);
        // A size change is pending like a write until a sync.
        state.pending.push((len, Vec::new()));
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        // The pending writes and size changes, applied in order: what was written, without
        // copying the whole file on every sync.
        let mut state = self.state.lock().unwrap();
        let pending = std::mem::take(&mut state.pending);
        for (offset, data) in pending {
            if data.is_empty() {
                state.synced.resize(offset as usize, 0);
            } else {
                let end = offset as usize + data.len();
                if state.synced.len() < end {
                    state.synced.resize(end, 0);
                }
                state.synced[offset as usize..end].copy_from_slice(&data);
            }
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap();
        let end = offset as usize + data.len();
        if state.written.len() < end {
            state.written.resize(end, 0);
        }
        state.written[offset as usize..end].copy_from_slice(data);
        state.pending.push((offset, data.to_vec()));
        Ok(())
    }
}
