//! What kind of failure a store had, for the single node's storage and a replica's store alike
//! (spec/replication.md#durability): a full disk is not a failed fsync, and neither is
//! corruption. Callers and operators act differently on each (free space and retry; look at the
//! disk; restore from the replicas), so the kind travels as a type from redb's error to the
//! gRPC status and the peer protocol, and the words of the layer that failed travel beside it.

/// The kind of a store failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// No space left on the device (or the quota is exhausted).
    DiskFull,
    /// Another I/O failure: a write, a resize or an fsync failed.
    Io,
    /// A stored record does not decode, or redb found its file corrupt.
    Corrupt,
    /// The store is closed.
    Closed,
}

/// Why a store refused: the kind, and the operating system's or redb's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreFault {
    /// The kind.
    pub kind: FaultKind,
    /// What failed, in the words of the layer that failed.
    pub detail: String,
}

impl std::fmt::Display for StoreFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            FaultKind::DiskFull => "the disk is full",
            FaultKind::Io => "a write or fsync of the disk failed",
            FaultKind::Corrupt => "a stored record is corrupt",
            FaultKind::Closed => "the store is closed",
        };
        write!(f, "{what} ({})", self.detail)
    }
}

/// Whether an I/O error says the device (or the quota) is full.
#[must_use]
pub fn disk_full(error: &std::io::Error) -> bool {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    error.kind() == std::io::ErrorKind::StorageFull
        || error.kind() == std::io::ErrorKind::QuotaExceeded
        || matches!(error.raw_os_error(), Some(ENOSPC | EDQUOT))
}

/// The kind of a redb storage error.
#[must_use]
pub fn storage_kind(error: &redb::StorageError) -> FaultKind {
    match error {
        redb::StorageError::Io(io) if disk_full(io) => FaultKind::DiskFull,
        redb::StorageError::Corrupted(_) => FaultKind::Corrupt,
        redb::StorageError::DatabaseClosed => FaultKind::Closed,
        _ => FaultKind::Io,
    }
}

/// The kind of any redb error.
#[must_use]
pub fn kind(error: &redb::Error) -> FaultKind {
    match error {
        redb::Error::Io(io) if disk_full(io) => FaultKind::DiskFull,
        redb::Error::Corrupted(_) => FaultKind::Corrupt,
        redb::Error::DatabaseClosed => FaultKind::Closed,
        _ => FaultKind::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_device_is_told_from_other_failures() {
        let full = std::io::Error::from_raw_os_error(28);
        let quota = std::io::Error::from_raw_os_error(122);
        let other = std::io::Error::from_raw_os_error(5);
        assert!(disk_full(&full) && disk_full(&quota) && !disk_full(&other));
        assert_eq!(kind(&redb::Error::Io(full)), FaultKind::DiskFull);
        assert_eq!(kind(&redb::Error::Io(other)), FaultKind::Io);
        assert_eq!(
            kind(&redb::Error::Corrupted("bad page".into())),
            FaultKind::Corrupt
        );
        assert_eq!(kind(&redb::Error::DatabaseClosed), FaultKind::Closed);
    }
}
