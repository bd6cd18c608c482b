//! The filesystem a node's databases live on, and the one way a database is opened or created
//! on it ([`open_database`]). The node passes the operating system's ([`OsFiles`]); the
//! simulation passes turmoil's simulated filesystem, so its harnesses open the queue database
//! and the replica database exactly as the node does: a change to the initialisation is a
//! change to both.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{Builder, Database, DatabaseError, StorageBackend};

/// The few filesystem operations opening a database needs.
pub trait Files {
    /// What a database file is to redb.
    type Backend: StorageBackend;

    /// Creates `dir` and its parents if missing.
    ///
    /// # Errors
    /// The filesystem's error.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;

    /// Removes the file at `path`.
    ///
    /// # Errors
    /// The filesystem's error.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Renames `from` to `to`, replacing `to`.
    ///
    /// # Errors
    /// The filesystem's error.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes `dir`'s entries (a rename into it, a new file) durable.
    ///
    /// # Errors
    /// The filesystem's error.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Opens the file at `path` for reading and writing, creating it if missing.
    ///
    /// # Errors
    /// The filesystem's error.
    fn open(&self, path: &Path) -> io::Result<Self::Backend>;
}

/// The operating system's filesystem.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFiles;

impl Files for OsFiles {
    type Backend = FileBackend;

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        fs::File::open(dir).and_then(|dir| dir.sync_all())
    }

    /// As redb's own `Builder::create` opens a path.
    fn open(&self, path: &Path) -> io::Result<FileBackend> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        FileBackend::new(file).map_err(io::Error::other)
    }
}

/// Why [`open_database`] failed.
#[derive(Debug)]
pub enum OpenError<E> {
    /// A file or directory operation failed at `path`.
    Io { path: PathBuf, source: io::Error },
    /// redb refused the file at `path` (another process holds it, not a redb file, ...).
    Database {
        path: PathBuf,
        source: DatabaseError,
    },
    /// The new database's initialisation failed.
    Initialise(E),
}

/// Opens the database `file_name` in `data_dir` on `files` with `builder`'s settings, creating
/// the directory if needed. A new database is created atomically: built by `initialise` (which
/// must commit durably) under `staging_name`, then renamed into place and the directory synced.
/// redb writes its magic number last, so a crash during a node's very first start would
/// otherwise leave a database file no later start can open; this way it leaves at most a
/// staging file, which the next open removes.
///
/// # Errors
/// `Io` for the directory, the staging file, the rename or the directory sync; `Database` when
/// redb refuses a file; `Initialise` with `initialise`'s error.
pub fn open_database<F: Files, E>(
    files: &F,
    data_dir: &Path,
    file_name: &str,
    staging_name: &str,
    builder: &Builder,
    initialise: impl FnOnce(Database) -> Result<(), E>,
) -> Result<Database, OpenError<E>> {
    let io_at = |at: &Path| {
        let path = at.to_path_buf();
        move |source| OpenError::Io { path, source }
    };
    // As redb's `Builder::create`: a file that cannot be opened is redb's error too.
    let create = |at: &Path| -> Result<Database, OpenError<E>> {
        files
            .open(at)
            .map_err(DatabaseError::from)
            .and_then(|backend| builder.create_with_backend(backend))
            .map_err(|source| OpenError::Database {
                path: at.to_path_buf(),
                source,
            })
    };
    files.create_dir_all(data_dir).map_err(io_at(data_dir))?;
    let path = data_dir.join(file_name);
    if !files.exists(&path) {
        let staging = data_dir.join(staging_name);
        if files.exists(&staging) {
            files.remove_file(&staging).map_err(io_at(&staging))?;
        }
        initialise(create(&staging)?).map_err(OpenError::Initialise)?;
        files.rename(&staging, &path).map_err(io_at(&path))?;
        // The renamed entry is durable only once the directory is synced.
        files.sync_dir(data_dir).map_err(io_at(data_dir))?;
    }
    create(&path)
}
