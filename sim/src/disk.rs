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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
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

/// Injected sync failures: while `on`, each sync fails with probability `rate`, drawn from a
/// seeded source. A failed sync makes nothing durable, as an fsync that reports EIO may not.
#[derive(Clone, Debug)]
pub struct SyncFailures {
    rate: f64,
    on: Arc<AtomicBool>,
}

impl SyncFailures {
    /// Failures at `rate` (0 for none), on until [`SyncFailures::stop`].
    #[must_use]
    pub fn new(rate: f64) -> SyncFailures {
        assert!((0.0..=1.0).contains(&rate), "a probability");
        SyncFailures {
            rate,
            on: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Failures at `rate` once [`SyncFailures::start`] is called (a quiet start first).
    #[must_use]
    pub fn off_until_started(rate: f64) -> SyncFailures {
        let failures = SyncFailures::new(rate);
        failures.on.store(false, Ordering::SeqCst);
        failures
    }

    /// Failures from now on (the end of a quiet start).
    pub fn start(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// No more failures (the healing phase).
    pub fn stop(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    fn active(&self) -> bool {
        self.rate > 0.0 && self.on.load(Ordering::SeqCst)
    }
}

/// A redb backend over one simulated file. Must be used inside the simulation (on the node
/// host's runtime): the shim finds the host's filesystem through turmoil's thread-local world.
#[derive(Debug)]
pub struct SimDisk {
    file: simfs::File,
    path: PathBuf,
    power: Power,
    mode: DiskMode,
    failures: SyncFailures,
    /// Draws the injected failures; seeded by the caller, so a run replays them.
    rng: Mutex<ChaCha8Rng>,
}

fn power_cut() -> std::io::Error {
    std::io::Error::other("the machine has no power")
}

impl SimDisk {
    /// Opens `path`, creating it (and its directory) if missing. A new file's directory entry,
    /// and a new directory's, are synced at once, as `Storage::open_path` does on a real disk:
    /// otherwise a crash would remove the whole database file.
    ///
    /// `failures` says how often a sync fails, drawn from `seed`.
    ///
    /// # Errors
    /// The shim's error when the directory or file cannot be created or opened.
    pub fn open(
        path: &Path,
        power: Power,
        mode: DiskMode,
        failures: SyncFailures,
        seed: u64,
    ) -> std::io::Result<SimDisk> {
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
            failures,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
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
        if self.failures.active() {
            let roll: f64 = self
                .rng
                .lock()
                .expect("no code panics while holding the rng")
                .random();
            if roll < self.failures.rate {
                return Err(std::io::Error::other("injected sync failure"));
            }
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;

    const PATH: &str = "/data/disk-test";

    /// Boots a host that, on its first boot, writes a synced then an unsynced block and, on
    /// later boots, reports what the file holds; crashes it in between. Returns the file's
    /// contents after the crash.
    fn contents_after_crash(mode: DiskMode) -> Vec<u8> {
        let mut sim = turmoil::Builder::new().build();
        let power = Power::new();
        let seen: Rc<RefCell<Option<Vec<u8>>>> = Rc::new(RefCell::new(None));
        let boots = Rc::new(std::cell::Cell::new(0));
        {
            let (power, seen, boots) = (power.clone(), seen.clone(), boots.clone());
            sim.host("disk", move || {
                let (power, seen, boots) = (power.clone(), seen.clone(), boots.clone());
                async move {
                    boots.set(boots.get() + 1);
                    let disk =
                        SimDisk::open(Path::new(PATH), power, mode, SyncFailures::new(0.0), 0)?;
                    if boots.get() == 1 {
                        disk.set_len(8)?;
                        disk.write(0, b"synced!!")?;
                        disk.sync_data()?;
                        disk.set_len(16)?;
                        disk.write(8, b"unsynced")?;
                    } else {
                        let mut bytes = vec![0; usize::try_from(disk.len()?).unwrap()];
                        disk.read(0, &mut bytes)?;
                        *seen.borrow_mut() = Some(bytes);
                    }
                    std::future::pending::<()>().await;
                    Ok(())
                }
            });
        }
        sim.client("clock", async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(())
        });
        for _ in 0..10 {
            sim.step().unwrap();
        }
        power.cut();
        sim.crash("disk");
        power.restore();
        sim.bounce("disk");
        sim.run().unwrap();
        assert_eq!(boots.get(), 2);
        seen.borrow_mut()
            .take()
            .expect("the second boot read the file")
    }

    #[test]
    fn a_crash_keeps_synced_writes_and_drops_the_rest() {
        assert_eq!(contents_after_crash(DiskMode::Honest), b"synced!!");
    }

    #[test]
    fn a_lying_sync_keeps_nothing() {
        assert_eq!(contents_after_crash(DiskMode::LyingSync), b"");
    }
}

/// turmoil's simulated filesystem as the node's [`trireme_node::files::Files`], so the harness
/// opens its databases through the node's own initialisation
/// (`trireme_node::files::open_database`). Its database and log files are [`SimDisk`]s with one
/// power switch, mode and failures; each file's random source is drawn from `seed` and the
/// file's kind (a staging file, `.new`; the replica's group log, `.log`; a database).
#[derive(Clone, Debug)]
pub struct SimFiles {
    pub power: Power,
    pub mode: DiskMode,
    pub failures: SyncFailures,
    pub seed: u64,
}

impl trireme_node::files::Files for SimFiles {
    type Backend = SimDisk;

    /// A new directory's entry is synced at once, as a new file's is ([`SimDisk::open`]).
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        if !simfs::exists(dir) {
            simfs::create_dir_all(dir)?;
            simfs::sync_dir(dir.parent().unwrap_or(Path::new("/")))?;
        }
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        simfs::exists(path)
    }

    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        simfs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        simfs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        simfs::sync_dir(dir)
    }

    fn open(&self, path: &Path) -> std::io::Result<SimDisk> {
        let salt = match path.extension().and_then(|extension| extension.to_str()) {
            Some("new") => 0x5747,
            // The replica's group log: failures of its own, apart from the database's.
            Some("log") => 0x0010_6000,
            _ => 0x00d1_5c00,
        };
        SimDisk::open(
            path,
            self.power.clone(),
            self.mode,
            self.failures.clone(),
            self.seed ^ salt,
        )
    }
}
