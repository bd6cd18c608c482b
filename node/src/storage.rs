//! Durable storage of the core's records in redb.
//!
//! One table maps each record's key to a checksummed frame (see `codec`) holding a
//! [`StoredEntry`]: the record and the revision of the commit that wrote it. Every call to
//! [`Storage::commit`] is one write transaction committed with `Durability::Immediate`: when it
//! returns, the changes are fsynced. The engine calls it once per batch of commands (group
//! commit), so many requests share one fsync.
//!
//! The database is opened through [`Storage::open_path`] (a file in the data directory),
//! [`Storage::open_files`] (the same initialisation on any [`Files`], such as the simulation's
//! filesystem) or [`Storage::open_backend`] (any redb `StorageBackend`), so the same engine and
//! the same initialisation run in production and in simulation.
//!
//! Replication will add per-record versions and tombstones: `StoredEntry` is an enum so they
//! arrive as new variants, and the frame's format byte lets the payload encoding change. This
//! module must never interpret records beyond their keys: queue semantics live in the core.

use std::path::Path;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend,
    TableDefinition,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use trireme_core::{Change, Record};

use crate::codec::{self, CodecError};
use crate::fault::{self, FaultKind, StoreFault};
use crate::files::{Files, OpenError, OsFiles, open_database};

/// Record key (bincode of `RecordKey`) → framed `StoredEntry`.
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// Node-level facts: the handle key, the latest revision, the layout version.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

const META_LAYOUT: &str = "layout";
const META_REVISION: &str = "revision";
const META_HANDLE_KEY: &str = "handle_key";

/// The table layout this build writes. A database with another layout is refused at open.
/// 2: a message is a state record and a body record (trireme-core `Record::MessageBody`).
/// 3: a queue's incarnation is `(hlc_ms, node, nonce)` (spec/replication.md §1).
const LAYOUT_VERSION: u8 = 3;

/// The file name of the database inside the data directory.
pub const DATABASE_FILE_NAME: &str = "trireme.redb";

/// Where a new database is built before it is renamed to [`DATABASE_FILE_NAME`].
const DATABASE_STAGING_FILE_NAME: &str = "trireme.redb.new";

/// What one key holds on disk.
#[derive(Debug, Serialize, Deserialize)]
pub enum StoredEntry {
    /// A live record, written by the commit numbered `revision` (counting from 1 on this node).
    Live { revision: u64, record: Record },
}

/// A storage failure. Any of them means the node cannot promise durability, so the engine stops
/// accepting writes.
#[derive(Debug, Error)]
pub enum StorageError {
    /// The data directory or database file could not be opened or created.
    #[error("cannot open the database at {path}: {reason}")]
    Open { path: String, reason: String },
    /// The database was written by a build with another table layout.
    #[error("database layout {found} is not the layout {LAYOUT_VERSION} this build uses")]
    Layout { found: u8 },
    /// A read failed.
    #[error("reading the database failed: {reason}")]
    Read { kind: FaultKind, reason: String },
    /// A write transaction failed; its changes are not durable.
    #[error("writing the database failed: {reason}")]
    Write { kind: FaultKind, reason: String },
    /// A stored record fails its checksum or does not decode.
    #[error("stored record {key_hex} is corrupt: {source}")]
    Corrupt {
        key_hex: String,
        #[source]
        source: CodecError,
    },
}

impl StorageError {
    /// The failure as a typed fault: what callers are told and act on.
    #[must_use]
    pub fn fault(&self) -> StoreFault {
        let kind = match self {
            // The database could not be opened as this build's: no record was read or written.
            StorageError::Open { .. } | StorageError::Layout { .. } => FaultKind::Io,
            StorageError::Corrupt { .. } => FaultKind::Corrupt,
            StorageError::Read { kind, .. } | StorageError::Write { kind, .. } => *kind,
        };
        StoreFault {
            kind,
            detail: self.to_string(),
        }
    }
}

fn read_error(error: impl Into<redb::Error>) -> StorageError {
    let error = error.into();
    StorageError::Read {
        kind: fault::kind(&error),
        reason: error.to_string(),
    }
}

fn write_error(error: impl Into<redb::Error>) -> StorageError {
    let error = error.into();
    StorageError::Write {
        kind: fault::kind(&error),
        reason: error.to_string(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The node's durable store. Owned by the engine task; never shared.
#[derive(Debug)]
pub struct Storage {
    db: Database,
    /// The revision of the latest commit; the next commit writes `revision + 1`.
    revision: u64,
    /// Records in the records table after the latest commit (an operator's figure).
    records: u64,
}

impl Storage {
    /// Opens (or creates) the database file in `data_dir`, creating the directory if needed.
    /// `cache_bytes` bounds redb's page cache (its default is 1 GiB).
    ///
    /// # Errors
    /// `Open` when the directory or file cannot be created or opened (another process holds
    /// it, permissions, not a redb file); `Layout`, `Read` or `Write` as for `open_backend`.
    pub fn open_path(data_dir: &Path, cache_bytes: usize) -> Result<Storage, StorageError> {
        Storage::open_files(&OsFiles, data_dir, cache_bytes)
    }

    /// Opens (or creates) the database file in `data_dir` on `files` (the operating system's, or
    /// a simulated filesystem), as [`Storage::open_path`] does: a new database is built and
    /// fsynced under a staging name and only then renamed into place
    /// ([`crate::files::open_database`]), so a crash during a node's very first start leaves at
    /// most a stray staging file, which the next start removes, never a half-written
    /// `trireme.redb` that no later start could open.
    ///
    /// # Errors
    /// As [`Storage::open_path`].
    pub fn open_files<F: Files>(
        files: &F,
        data_dir: &Path,
        cache_bytes: usize,
    ) -> Result<Storage, StorageError> {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(cache_bytes);
        let db = open_database(
            files,
            data_dir,
            DATABASE_FILE_NAME,
            DATABASE_STAGING_FILE_NAME,
            &builder,
            // Writes the layout in a durable (fsynced) transaction.
            |db| Storage::from_database(db).map(drop),
        )
        .map_err(|error| match error {
            OpenError::Io { path, source } => StorageError::Open {
                path: path.display().to_string(),
                reason: source.to_string(),
            },
            OpenError::Database { path, source } => StorageError::Open {
                path: path.display().to_string(),
                reason: source.to_string(),
            },
            OpenError::Initialise(error) => error,
        })?;
        Storage::from_database(db)
    }

    /// Opens (or initialises) a database on any redb backend, e.g. a simulated disk.
    ///
    /// # Errors
    /// `Open` when redb refuses the backend's contents; `Layout` for a database of another
    /// layout; `Read` or `Write` when the first transaction fails.
    pub fn open_backend(
        backend: impl StorageBackend,
        cache_bytes: usize,
    ) -> Result<Storage, StorageError> {
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create_with_backend(backend)
            .map_err(|error| StorageError::Open {
                path: "(backend)".to_owned(),
                reason: error.to_string(),
            })?;
        Storage::from_database(db)
    }

    fn from_database(db: Database) -> Result<Storage, StorageError> {
        let mut storage = Storage {
            db,
            revision: 0,
            records: 0,
        };
        let txn = storage.begin_write()?;
        {
            let mut meta = txn.open_table(META).map_err(write_error)?;
            let layout = meta
                .get(META_LAYOUT)
                .map_err(read_error)?
                .map(|value| value.value().to_vec());
            match layout.as_deref() {
                None => {
                    meta.insert(META_LAYOUT, [LAYOUT_VERSION].as_slice())
                        .map_err(write_error)?;
                }
                Some([found]) if *found == LAYOUT_VERSION => {}
                Some(other) => {
                    return Err(StorageError::Layout {
                        found: other.first().copied().unwrap_or(0),
                    });
                }
            }
            storage.revision = match meta.get(META_REVISION).map_err(read_error)? {
                None => 0,
                Some(value) => u64::from_le_bytes(value.value().try_into().map_err(|_| {
                    StorageError::Corrupt {
                        key_hex: hex(META_REVISION.as_bytes()),
                        source: CodecError::Truncated {
                            len_bytes: value.value().len(),
                        },
                    }
                })?),
            };
            storage.records = txn
                .open_table(RECORDS)
                .map_err(write_error)?
                .len()
                .map_err(read_error)?;
        }
        txn.commit().map_err(write_error)?;
        Ok(storage)
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, StorageError> {
        let mut txn = self.db.begin_write().map_err(write_error)?;
        // Explicit although it is redb's default: an acknowledged change must survive a crash.
        txn.set_durability(Durability::Immediate)
            .map_err(write_error)?;
        Ok(txn)
    }

    /// The revision of the latest durable commit (0 for a new database).
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Records in the records table after the latest commit (for the node's metrics).
    #[must_use]
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Every stored record, in key order, each checked against its checksum.
    ///
    /// # Errors
    /// `Read` when redb fails; `Corrupt` for a record that fails its checksum or decoding (the
    /// node refuses to start rather than silently drop a message).
    pub fn load(&self) -> Result<Vec<Record>, StorageError> {
        let txn = self.db.begin_read().map_err(read_error)?;
        let table = txn.open_table(RECORDS).map_err(read_error)?;
        let mut records = Vec::new();
        for entry in table.iter().map_err(read_error)? {
            let (key, value) = entry.map_err(read_error)?;
            let stored: StoredEntry =
                codec::decode_framed(value.value()).map_err(|source| StorageError::Corrupt {
                    key_hex: hex(key.value()),
                    source,
                })?;
            let StoredEntry::Live { revision, record } = stored;
            assert!(revision <= self.revision, "a record from a future commit");
            let expected = codec::encode_key(&record.key());
            if expected != key.value() {
                return Err(StorageError::Corrupt {
                    key_hex: hex(key.value()),
                    source: CodecError::Malformed {
                        reason: "the record stored under this key has another key".to_owned(),
                    },
                });
            }
            records.push(record);
        }
        Ok(records)
    }

    /// Applies `changes` in order in one write transaction and fsyncs it before returning.
    /// An empty batch writes nothing.
    ///
    /// # Errors
    /// `Write` when the transaction cannot be committed: none of the changes are durable.
    pub fn commit(&mut self, changes: Vec<Change>) -> Result<(), StorageError> {
        if changes.is_empty() {
            return Ok(());
        }
        let revision = self.revision + 1;
        let records;
        let txn = self.begin_write()?;
        {
            let mut table = txn.open_table(RECORDS).map_err(write_error)?;
            for change in changes {
                match change {
                    Change::Put(record) => {
                        let key = codec::encode_key(&record.key());
                        let value = codec::encode_framed(&StoredEntry::Live { revision, record });
                        table
                            .insert(key.as_slice(), value.as_slice())
                            .map_err(write_error)?;
                    }
                    Change::Remove(key) => {
                        let key = codec::encode_key(&key);
                        table.remove(key.as_slice()).map_err(write_error)?;
                    }
                }
            }
            records = table.len().map_err(write_error)?;
            let mut meta = txn.open_table(META).map_err(write_error)?;
            meta.insert(META_REVISION, revision.to_le_bytes().as_slice())
                .map_err(write_error)?;
        }
        txn.commit().map_err(write_error)?;
        self.revision = revision;
        self.records = records;
        Ok(())
    }

    /// The handle key stored in this database, storing `generated` first if none is stored yet.
    /// Receipt handles must outlive restarts, so a key the node made up must be kept.
    ///
    /// # Errors
    /// `Read` or `Write` when redb fails.
    pub fn handle_key_or_store(&mut self, generated: &[u8]) -> Result<Vec<u8>, StorageError> {
        let txn = self.begin_write()?;
        let key = {
            let mut meta = txn.open_table(META).map_err(write_error)?;
            let stored = meta
                .get(META_HANDLE_KEY)
                .map_err(read_error)?
                .map(|value| value.value().to_vec());
            match stored {
                Some(key) => key,
                None => {
                    meta.insert(META_HANDLE_KEY, generated)
                        .map_err(write_error)?;
                    generated.to_vec()
                }
            }
        };
        txn.commit().map_err(write_error)?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use trireme_core::{DeletedNameRecord, Millis, QueueName, RecordKey};

    fn record(name: &str, at_ms: u64) -> Record {
        Record::DeletedName(DeletedNameRecord {
            name: QueueName::try_from(name).unwrap(),
            deleted_at: Millis(at_ms),
        })
    }

    #[test]
    fn committed_records_are_loaded_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut storage = Storage::open_path(dir.path(), 1 << 20).unwrap();
            storage
                .commit(vec![
                    Change::Put(record("a", 1)),
                    Change::Put(record("b", 2)),
                ])
                .unwrap();
            storage
                .commit(vec![
                    Change::Remove(RecordKey::DeletedName(QueueName::try_from("a").unwrap())),
                    Change::Put(record("b", 3)),
                ])
                .unwrap();
            storage.commit(Vec::new()).unwrap();
            assert_eq!(storage.revision(), 2, "an empty batch is no commit");
        }
        let storage = Storage::open_path(dir.path(), 1 << 20).unwrap();
        assert_eq!(storage.revision(), 2);
        assert_eq!(storage.load().unwrap(), vec![record("b", 3)]);
    }

    #[test]
    fn a_half_initialised_database_from_a_crashed_first_start_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        // What a power cut during the first start leaves behind: a staging file without redb's
        // magic number. It must not stop the next start.
        fs::write(dir.path().join(DATABASE_STAGING_FILE_NAME), vec![0u8; 4096]).unwrap();
        let mut storage = Storage::open_path(dir.path(), 1 << 20).unwrap();
        storage.commit(vec![Change::Put(record("q", 1))]).unwrap();
        drop(storage);
        assert!(!dir.path().join(DATABASE_STAGING_FILE_NAME).exists());
        let storage = Storage::open_path(dir.path(), 1 << 20).unwrap();
        assert_eq!(storage.load().unwrap(), vec![record("q", 1)]);
    }

    #[test]
    fn corrupted_record_is_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut storage = Storage::open_path(dir.path(), 1 << 20).unwrap();
        storage.commit(vec![Change::Put(record("q", 5))]).unwrap();
        // Flip one payload bit behind the codec's back.
        let key = codec::encode_key(&record("q", 5).key());
        let txn = storage.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(RECORDS).unwrap();
            let mut value = table.get(key.as_slice()).unwrap().unwrap().value().to_vec();
            let last = value.len() - 1;
            value[last] ^= 0x04;
            table.insert(key.as_slice(), value.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        assert!(matches!(
            storage.load(),
            Err(StorageError::Corrupt {
                source: CodecError::ChecksumMismatch { .. },
                ..
            })
        ));
    }

    #[test]
    fn generated_handle_key_is_kept_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let first = Storage::open_path(dir.path(), 1 << 20)
            .unwrap()
            .handle_key_or_store(&[1; 32])
            .unwrap();
        let second = Storage::open_path(dir.path(), 1 << 20)
            .unwrap()
            .handle_key_or_store(&[2; 32])
            .unwrap();
        assert_eq!(first, vec![1; 32]);
        assert_eq!(second, first);
    }

    #[test]
    fn in_memory_backend_works_like_a_file() {
        let mut storage =
            Storage::open_backend(redb::backends::InMemoryBackend::new(), 1 << 20).unwrap();
        storage.commit(vec![Change::Put(record("m", 9))]).unwrap();
        assert_eq!(storage.load().unwrap(), vec![record("m", 9)]);
    }
}
