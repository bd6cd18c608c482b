//! The node's disk in simulation: a redb [`StorageBackend`] over one file of turmoil's simulated
//! filesystem (`turmoil::fs::shim`), so the real storage engine runs unchanged and a crash keeps
//! exactly what was synced.
//!
//! Power: a crash in turmoil drops the host's tasks, and dropping a redb `Database` runs its
//! clean shutdown (more writes and a sync). A machine losing power does no such thing, so the
//! harness cuts the [`Power`] before `Sim::crash`: from then on every write and sync fails and
//! only what was synced before survives. The disk can also lie ([`DiskMode::LyingSync`]): its
//! sync returns success without making anything durable, which is how the planted
//! "acknowledge before fsync" bug is built without touching the node.
//!
//! This module must never make a write durable except through the shim's sync.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::StorageBackend;
use turmoil::fs::shim::std::fs as simfs;

/// Whether the node's machine has power. Shared by the harness (which cuts it before a crash
/// and restores it before a restart) and the disk of the running node.
#[derive(Clone, Debug)]
pub struct Power {
    on: Arc<AtomicBool>,
}

impl Power {
    /// Power that is on.
    #[must_use]
    pub fn new() -> Power {
        Power {
            on: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Cuts the power: every later write, resize and sync of the disk fails.
    pub fn cut(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// Restores the power for the next boot.
    pub fn restore(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }
}

impl Default for Power {
    fn default() -> Self {
        Power::new()
    }
}

/// How the disk treats a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskMode {
    /// A sync makes every earlier write durable (a correct disk).
    Honest,
    /// A sync reports success and makes nothing durable: a node on this disk acknowledges
    /// changes a crash then loses. Only for showing that the checker catches it.
    LyingSync,
}

/// A redb backend over one simulated file. Must be used inside the simulation (on the node
/// host's runtime): the shim finds the host's filesystem through turmoil's thread-local world.
#[derive(Debug)]
pub struct SimDisk {
    file: simfs::File,
    path: PathBuf,
    power: Power,
    mode: DiskMode,
}

fn power_cut() -> std::io::Error {
    std::io::Error::other("the machine has no power")
}

impl SimDisk {
    /// Opens `path`, creating it (and its directory) if missing. A new file's directory entry,
    /// and a new directory's, are synced at once, as `Storage::open_path` does on a real disk:
    /// otherwise a crash would remove the whole database file.
    ///
    /// # Errors
    /// The shim's error when the directory or file cannot be created or opened.
    pub fn open(path: &Path, power: Power, mode: DiskMode) -> std::io::Result<SimDisk> {
        let dir = path
            .parent()
            .expect("the database path names a file in a directory");
        if !simfs::exists(dir) {
            simfs::create_dir_all(dir)?;
            simfs::sync_dir(dir.parent().unwrap_or(Path::new("/")))?;
        }
        let existed = simfs::exists(path);
        let file = simfs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if !existed {
            simfs::sync_dir(dir)?;
        }
        Ok(SimDisk {
            file,
            path: path.to_path_buf(),
            power,
            mode,
        })
    }

    /// The file this disk writes.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl StorageBackend for SimDisk {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        if !self.power.is_on() {
            return Err(power_cut());
        }
        self.file.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        if !self.power.is_on() {
            return Err(power_cut());
        }
        match self.mode {
            DiskMode::Honest => self.file.sync_data(),
            DiskMode::LyingSync => Ok(()),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if !self.power.is_on() {
            return Err(power_cut());
        }
        self.file.write_all_at(data, offset)
    }
}
