//! Writes that cannot lose data. A file is written whole under a temporary name in the folder of
//! its destination, flushed to disk, and only then renamed over the destination: a reader, or a
//! crash, sees the old file or the new one, never a truncated mix, and a failed write leaves the
//! old file as it was. A destination that is a symbolic link is followed, so the link keeps
//! pointing at the (replaced) file; an existing file's permissions carry over.
//!
//! A character device or a FIFO (`/dev/null`, a named pipe) is written in place instead: it is a
//! stream, which a rename would destroy rather than fill, and a stream has no "whole or nothing".
//! Folders, block devices, sockets and read-only files are refused (`destination.rs`), and
//! [`check_output`] finds all of that, and a folder the process cannot create a file in, before
//! a command does its work.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::destination::{destination, folder_of, Destination};
use super::io_error::io_err;
use crate::Result;

/// Tries at a free temporary name before giving up.
const MAX_TRIES: u32 = 100;

/// Distinguishes the temporary files of one process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Removes the temporary file unless the write completed.
struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A fresh, exclusively created temporary file next to `dest`.
fn create_temp(dest: &Path) -> Result<TempFile> {
    let dir = folder_of(dest);
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    let mut last_err = None;
    for _ in 0..MAX_TRIES {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.{}.{n}.nvfp4-tmp", std::process::id()));
        match File::options().write(true).create_new(true).open(&path) {
            Ok(_) => return Ok(TempFile { path, keep: false }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(io_err(dest, e)),
        }
    }
    Err(io_err(dest, last_err.unwrap_or_else(|| std::io::Error::other("no free temporary name"))))
}

/// Checks, before any work, that an output can be written at `path`: what [`write_atomically`]
/// would refuse is refused now, and for a file its temporary file is created and removed again
/// (a missing folder, a path through a file, a folder without write permission, a read-only file
/// system). A character device or a FIFO is not opened: opening a FIFO waits for its reader.
pub fn check_output(path: &Path) -> Result<()> {
    match destination(path)? {
        Destination::Replace(dest) => create_temp(&dest).map(drop),
        Destination::Stream(_) => Ok(()),
    }
}

/// Writes `path` through a temporary file (see the module docs): `fill` writes the complete
/// contents to the path it is given; then the file is synced and renamed over `path`. On any
/// error the temporary file is removed and `path` is untouched. A character device or a FIFO is
/// given to `fill` itself.
pub fn write_atomically(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dest = match destination(path)? {
        Destination::Stream(node) => return fill(&node),
        Destination::Replace(dest) => dest,
    };
    let mut temp = create_temp(&dest)?;
    fill(&temp.path)?;
    let file = File::options().write(true).open(&temp.path).map_err(|e| io_err(&temp.path, e))?;
    file.sync_all().map_err(|e| io_err(&temp.path, e))?;
    drop(file);
    if let Ok(meta) = fs::metadata(&dest) {
        fs::set_permissions(&temp.path, meta.permissions()).map_err(|e| io_err(&temp.path, e))?;
    }
    fs::rename(&temp.path, &dest).map_err(|e| io_err(&dest, e))?;
    temp.keep = true;
    sync_folder(&dest);
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file.
pub fn write_bytes_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically(path, |tmp| fs::write(tmp, bytes).map_err(|e| io_err(tmp, e)))
}

/// Makes the rename itself durable: syncs the folder that holds `dest` (best effort; some file
/// systems refuse to open folders for this).
fn sync_folder(dest: &Path) {
    #[cfg(unix)]
    if let Ok(f) = File::open(folder_of(dest)) {
        let _ = f.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dest;
}
