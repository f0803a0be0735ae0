//! Writes that cannot lose data. A file is written whole under a temporary name in the folder of
//! its destination, flushed to disk, and only then renamed over the destination: a reader, or a
//! crash, sees the old file or the new one, never a truncated mix, and a failed write leaves the
//! old file as it was. A destination that is a symbolic link is followed, so the link keeps
//! pointing at the (replaced) file; an existing file's permissions carry over.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::archive::io_err;
use crate::Result;

/// Symbolic links followed before giving up on a chain (the limit Linux itself uses).
const MAX_LINKS: usize = 40;

/// Tries at a free temporary name before giving up.
const MAX_TRIES: u32 = 100;

/// Distinguishes the temporary files of one process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// `path`, with every symbolic link at its end followed (a dangling link resolves to the path it
/// names, which the write then creates).
fn resolve_links(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let is_link = fs::symlink_metadata(&p).map(|m| m.file_type().is_symlink()).unwrap_or(false);
        let Some(target) = is_link.then(|| fs::read_link(&p).ok()).flatten() else { return p };
        p = match p.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    p
}

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
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
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

/// Writes `path` through a temporary file (see the module docs): `fill` writes the complete
/// contents to the path it is given; then the file is synced and renamed over `path`. On any
/// error the temporary file is removed and `path` is untouched.
pub fn write_atomically(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dest = resolve_links(path);
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
    if let Some(dir) = dest.parent() {
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        if let Ok(f) = File::open(dir) {
            let _ = f.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = dest;
}
