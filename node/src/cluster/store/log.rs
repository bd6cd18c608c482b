//! The replica store's log of groups (spec/replication.md §14, *The replica's group log*): each
//! group commit's stored values appended as one entry and synced, so that
//! the B-tree behind it can commit without a sync until a checkpoint. This module is the log
//! alone: writing entries, and finding after a crash the entries a start must replay.
//!
//! An entry is a 16-byte header and its payload: the payload's length (`u32`), a CRC-32 of the
//! log's salt, the sequence and the payload (`u32`), and the group's sequence (`u64`), all
//! little-endian. The salt is the replica database's disk id, so that a log left beside a
//! database it does not belong to (a replaced database file) replays nothing into it. Entries
//! follow one another from offset 0; a checkpoint lets the writer start again at offset 0, over
//! older entries. Replay from a checkpoint that holds every group through sequence `s` reads from
//! offset 0, passes over entries of sequence `s` or lower, and takes the entries after them while
//! each is whole (its checksum holds) and carries the next sequence. The first that is torn,
//! unsynced, or left over from before the writer last started again ends the log: none of those
//! was ever answered, since an entry is answered only after the sync that covers it.
//!
//! The file is written through a redb [`StorageBackend`], so the simulation's disk (torn writes,
//! failed and lying syncs, power cuts) covers the log as it covers the database. It grows in
//! [`GROWTH`] steps written with zeros, each synced once, so that a sync after an entry carries
//! data only.

use redb::StorageBackend;

/// The header of every entry: length, checksum, sequence.
pub const HEADER: usize = 16;

/// How much the file grows by when an entry does not fit (zeroed, then synced once).
pub const GROWTH: u64 = 4 << 20;

/// How much of a growth step one write of zeros covers.
const ZERO_CHUNK: usize = 1 << 20;

/// The longest payload an entry may carry. The store logs no group whose redo reaches its
/// checkpoint's byte budget (16 MiB: such a group's own commit is the checkpoint), far below it.
pub const PAYLOAD_MAX: usize = 1 << 30;

/// The log's writer.
#[derive(Debug)]
pub struct Log<B: StorageBackend> {
    file: B,
    /// Mixed into every entry's checksum: the database's disk id.
    salt: u64,
    /// Where the next entry goes.
    offset: u64,
    /// The next entry's sequence.
    next: u64,
}

/// What a start found in the log after a checkpoint: the entries to replay, in order.
#[derive(Debug, PartialEq, Eq)]
pub struct Replay {
    /// `(sequence, payload)` of every entry after the checkpoint, in sequence order.
    pub entries: Vec<(u64, Vec<u8>)>,
}

fn checksum(salt: u64, sequence: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&salt.to_le_bytes());
    hasher.update(&sequence.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// An entry as it is written: header, then payload.
fn encode(salt: u64, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let size = u32::try_from(payload.len()).expect("bounded by PAYLOAD_MAX");
    let mut entry = Vec::with_capacity(HEADER + payload.len());
    entry.extend_from_slice(&size.to_le_bytes());
    entry.extend_from_slice(&checksum(salt, sequence, payload).to_le_bytes());
    entry.extend_from_slice(&sequence.to_le_bytes());
    entry.extend_from_slice(payload);
    entry
}

/// The entry at `offset`, if one is whole there: `(sequence, payload, next offset)`.
fn entry_at<B: StorageBackend>(
    file: &B,
    salt: u64,
    offset: u64,
    len: u64,
) -> std::io::Result<Option<(u64, Vec<u8>, u64)>> {
    let header_end = offset + HEADER as u64;
    if header_end > len {
        return Ok(None);
    }
    let mut header = [0u8; HEADER];
    file.read(offset, &mut header)?;
    let size = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let sum = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let sequence = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let size = size as usize;
    if size > PAYLOAD_MAX || header_end + size as u64 > len {
        return Ok(None);
    }
    let mut payload = vec![0u8; size];
    file.read(header_end, &mut payload)?;
    if checksum(salt, sequence, &payload) != sum {
        return Ok(None);
    }
    Ok(Some((sequence, payload, header_end + size as u64)))
}

impl<B: StorageBackend> Log<B> {
    /// Opens the log on `file`, whose entries carry `salt`, after a checkpoint that holds every
    /// group through sequence `checkpoint`: returns what to replay, and the writer, which
    /// continues after the last entry replayed with the next sequence (or at offset 0 when there
    /// was none).
    ///
    /// # Errors
    /// The file's read errors.
    pub fn open(file: B, salt: u64, checkpoint: u64) -> std::io::Result<(Log<B>, Replay)> {
        let len = file.len()?;
        let mut offset = 0;
        let mut entries = Vec::new();
        let mut resume = 0;
        // Entries the checkpoint holds come first (if the writer has not started again since);
        // the replay is the consecutive run after them.
        let mut expected: Option<u64> = None;
        while let Some((sequence, payload, next)) = entry_at(&file, salt, offset, len)? {
            match expected {
                None if sequence <= checkpoint => {}
                None if sequence == checkpoint + 1 => {
                    entries.push((sequence, payload));
                    expected = Some(sequence + 1);
                    resume = next;
                }
                Some(want) if sequence == want => {
                    entries.push((sequence, payload));
                    expected = Some(sequence + 1);
                    resume = next;
                }
                // A gap, or an older entry after newer ones: the log ends here.
                _ => break,
            }
            offset = next;
        }
        let next = expected.unwrap_or(checkpoint + 1);
        Ok((
            Log {
                file,
                salt,
                offset: resume,
                next,
            },
            Replay { entries },
        ))
    }

    /// The sequence the next entry gets.
    #[must_use]
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// Appends `payload` as the next entry and syncs it; returns its sequence. Only after this
    /// returns may the group it carries be answered.
    ///
    /// # Errors
    /// The file's write or sync errors: the entry may or may not be on the disk, and the store
    /// must refuse everything from then on, as after a failed commit.
    ///
    /// # Panics
    /// If `payload` is longer than [`PAYLOAD_MAX`].
    pub fn append(&mut self, payload: &[u8]) -> std::io::Result<u64> {
        self.write_entry(payload, true)
    }

    /// Appends `payload` as [`Log::append`] does, without the sync after it: only for the
    /// simulation's planted bug of acknowledging before the fsync, which must be caught.
    ///
    /// # Errors
    /// The file's write errors.
    pub fn append_unsynced(&mut self, payload: &[u8]) -> std::io::Result<u64> {
        self.write_entry(payload, false)
    }

    fn write_entry(&mut self, payload: &[u8], sync: bool) -> std::io::Result<u64> {
        assert!(payload.len() <= PAYLOAD_MAX, "a group's entry fits the log");
        let sequence = self.next;
        let entry = encode(self.salt, sequence, payload);
        let end = self.offset + entry.len() as u64;
        let len = self.file.len()?;
        if end > len {
            // Written with zeros and synced once, so that the entries' syncs change no file size
            // and allocate no blocks: a sync then carries data only (a sparse extension, or an
            // append to a growing file, makes every sync carry the file system's metadata too;
            // BENCHMARKS.md 6m measured the difference).
            let grown = end.div_ceil(GROWTH) * GROWTH;
            self.file.set_len(grown)?;
            let zeros = vec![0u8; ZERO_CHUNK];
            let mut at = len;
            while at < grown {
                let chunk = (grown - at).min(ZERO_CHUNK as u64);
                self.file.write(
                    at,
                    &zeros[..usize::try_from(chunk).expect("at most ZERO_CHUNK")],
                )?;
                at += chunk;
            }
            self.file.sync_data()?;
        }
        self.file.write(self.offset, &entry)?;
        if sync {
            self.file.sync_data()?;
        }
        self.offset = end;
        self.next = sequence + 1;
        Ok(sequence)
    }

    /// After a checkpoint that holds every entry written so far: the next entry goes to offset 0,
    /// over the old ones (its sequence goes on counting up, which is how a replay tells the new
    /// entries from what is left of the old).
    pub fn restart(&mut self) {
        self.offset = 0;
    }

    /// Where the next entry goes (for tests and metrics).
    #[must_use]
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file under the log.
    #[must_use]
    pub fn file(&self) -> &B {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::store::crash_disk::Disk;
    use proptest::prelude::*;
    use redb::backends::InMemoryBackend;

    const SALT: u64 = 0x5a17;

    fn payload(i: u64) -> Vec<u8> {
        format!("group {i} ")
            .repeat(usize::try_from(i % 7).unwrap() + 1)
            .into_bytes()
    }

    #[test]
    fn entries_appended_after_a_checkpoint_are_replayed_in_order() {
        let (mut log, replay) = Log::open(InMemoryBackend::new(), SALT, 0).unwrap();
        assert!(replay.entries.is_empty());
        for i in 1..=5 {
            assert_eq!(log.append(&payload(i)).unwrap(), i);
        }
        let file = log.file;
        let len = file.len().unwrap();
        assert_eq!(len % GROWTH, 0, "grown in whole steps");
        let (log, replay) = Log::open(file, SALT, 0).unwrap();
        assert_eq!(
            replay.entries,
            (1..=5).map(|i| (i, payload(i))).collect::<Vec<_>>()
        );
        assert_eq!(log.next_sequence(), 6, "the writer goes on after them");
        // A checkpoint through 3: only 4 and 5 are replayed.
        let (_, replay) = Log::open(log.file, SALT, 3).unwrap();
        assert_eq!(replay.entries, vec![(4, payload(4)), (5, payload(5))]);
    }

    #[test]
    fn a_torn_last_entry_ends_the_log_and_the_next_one_overwrites_it() {
        let disk = Disk::default();
        let (mut log, _) = Log::open(disk.clone(), SALT, 0).unwrap();
        for i in 1..=3 {
            log.append(&payload(i)).unwrap();
        }
        // Entry 4's write reaches the disk, torn, and the machine stops before its sync.
        let torn = {
            let entry = encode(SALT, log.next, &payload(4));
            log.file.write(log.offset, &entry).unwrap();
            disk.crashed(|_, len| len - 1)
        };
        let (mut log, replay) = Log::open(torn, SALT, 0).unwrap();
        assert_eq!(replay.entries.len(), 3, "the torn entry was never answered");
        assert_eq!(
            log.append(&payload(40)).unwrap(),
            4,
            "its sequence is taken again"
        );
        let (_, replay) = Log::open(log.file, SALT, 0).unwrap();
        assert_eq!(replay.entries.last().unwrap(), &(4, payload(40)));
    }

    #[test]
    fn after_a_restart_what_is_left_of_older_entries_is_not_replayed() {
        let (mut log, _) = Log::open(InMemoryBackend::new(), SALT, 0).unwrap();
        for i in 1..=6 {
            log.append(&payload(i)).unwrap();
        }
        // A checkpoint holds 1-6; the writer starts again at 0 with 7, exactly as long as entry
        // 1, so entry 2 follows it in the file whole, its checksum intact.
        log.restart();
        let seventh = vec![7u8; payload(1).len()];
        log.append(&seventh).unwrap();
        let mut header = [0u8; HEADER];
        log.file.read(log.offset(), &mut header).unwrap();
        assert_eq!(
            header[8..16],
            2u64.to_le_bytes(),
            "entry 2 is next in the file"
        );
        let (log, replay) = Log::open(log.file, SALT, 6).unwrap();
        assert_eq!(replay.entries, vec![(7, seventh)]);
        assert_eq!(log.next_sequence(), 8);
        // A checkpoint made right after the restart, before any new entry: nothing to replay.
        let (mut log, _) = Log::open(InMemoryBackend::new(), SALT, 0).unwrap();
        for i in 1..=4 {
            log.append(&payload(i)).unwrap();
        }
        let (log, replay) = Log::open(log.file, SALT, 4).unwrap();
        assert!(replay.entries.is_empty());
        assert_eq!(log.next_sequence(), 5);
    }

    #[test]
    fn a_log_of_another_database_replays_nothing() {
        let (mut log, _) = Log::open(InMemoryBackend::new(), SALT, 0).unwrap();
        for i in 1..=3 {
            log.append(&payload(i)).unwrap();
        }
        let (log, replay) = Log::open(log.file, SALT + 1, 0).unwrap();
        assert!(replay.entries.is_empty());
        assert_eq!((log.next_sequence(), log.offset()), (1, 0));
    }

    proptest! {
        /// Whatever a crash keeps of the unsynced writes, a replay returns exactly the entries
        /// whose append returned (they were synced) since the checkpoint, in order, and
        /// possibly the one entry whose append was cut by the crash if its bytes all landed.
        #[test]
        fn a_replay_holds_every_synced_entry_after_the_checkpoint_and_nothing_else(
            steps in proptest::collection::vec((0u8..4, 0usize..300), 1..40),
            cut in 0usize..400,
        ) {
            let disk = Disk::default();
            let (mut log, _) = Log::open(disk.clone(), SALT, 0).unwrap();
            let mut checkpoint = 0;
            let mut answered: Vec<(u64, Vec<u8>)> = Vec::new();
            for (kind, size) in steps {
                if kind == 0 {
                    // A checkpoint holds everything answered so far; the writer starts again.
                    checkpoint = log.next_sequence() - 1;
                    answered.clear();
                    log.restart();
                } else {
                    let body: Vec<u8> = (0..size).map(|b| (b % 251) as u8).collect();
                    let sequence = log.append(&body).unwrap();
                    answered.push((sequence, body));
                }
            }
            // One more entry written, not synced, and the machine stops: its bytes are kept
            // up to `cut`.
            let sequence = log.next_sequence();
            let body = vec![7u8; 200];
            let entry = encode(SALT, sequence, &body);
            let whole = cut >= entry.len();
            let end = log.offset() + entry.len() as u64;
            if end <= log.file().len().unwrap() {
                log.file().write(log.offset(), &entry).unwrap();
            }
            let after = disk.crashed(|_, len| cut.min(len));
            let (_, replay) = Log::open(after, SALT, checkpoint).unwrap();
            let fits = end <= disk.len().unwrap();
            if whole && fits {
                let mut expected = answered.clone();
                expected.push((sequence, body));
                prop_assert_eq!(replay.entries, expected);
            } else {
                prop_assert_eq!(replay.entries, answered);
            }
        }
    }
}
