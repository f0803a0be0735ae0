//! What an output path names, decided before anything is written to it: a regular file (existing
//! or not) is replaced whole through a temporary file; a character device or a FIFO (`/dev/null`,
//! a named pipe, `/dev/stdout` on a pipe) is a stream, written in place, because renaming a file
//! over it would destroy the node instead of writing into it; anything else (a folder, a block
//! device, a socket, a read-only file, a path that names no file) is refused with the reason.

use std::fs::{self, Metadata};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::io_error::io_err;
use crate::{Error, Result};

/// Symbolic links followed before giving up on a chain (the limit Linux itself uses).
const MAX_LINKS: usize = 40;

/// Where the bytes of an output go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    /// A regular file, existing or not, at this path (every symbolic link at its end followed):
    /// written under a temporary name in its folder and renamed over it.
    Replace(PathBuf),
    /// An existing character device or FIFO: opened and written in place, never replaced.
    Stream(PathBuf),
}

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

/// The folder a file at `path` lives in (`.` for a bare name).
pub(crate) fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// True when `path` as written can only name a folder: empty, `.`, `..`, or ending in `/`, `/.`
/// or `/..` (std's `Path` drops a trailing `/.`, so the spelling is read here).
fn names_a_folder(path: &Path) -> bool {
    let s = path.as_os_str().as_encoded_bytes();
    let trailing = |end: &[u8]| s.ends_with(end) && (s.len() == end.len() || s[s.len() - end.len() - 1] == b'/');
    s.is_empty() || s.ends_with(b"/") || trailing(b".") || trailing(b"..")
}

/// A node that has no write permission bit for anyone: refused even when the process could write
/// it anyway (as root), so that a file protected by its mode is never replaced.
fn read_only(meta: &Metadata) -> bool {
    meta.permissions().readonly()
}

/// The kind of a node that is neither a regular file, a folder, a character device nor a FIFO.
#[cfg(unix)]
fn special_kind(meta: &Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_char_device() || t.is_fifo() {
        None
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("neither a file, a character device nor a FIFO")
    }
}

#[cfg(not(unix))]
fn special_kind(_: &Metadata) -> Option<&'static str> {
    Some("neither a file nor a folder")
}

/// The refusal of `path` as an [`Error::Io`] of `kind` (so callers can match on it as on the
/// system's own errors), saying why.
fn refuse(path: &Path, kind: ErrorKind, why: impl Into<String>) -> Error {
    io_err(path, std::io::Error::new(kind, why.into()))
}

/// Where an output at `path` goes, or why it cannot go there. Nothing is created; an existing
/// regular file is opened for writing (not truncated) to learn whether this process may write it.
pub(crate) fn destination(path: &Path) -> Result<Destination> {
    if names_a_folder(path) {
        return Err(refuse(path, ErrorKind::IsADirectory, "names a folder; the output must be a file"));
    }
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            Err(refuse(path, ErrorKind::IsADirectory, "is a folder; the output must be a file"))
        }
        Ok(meta) if meta.is_file() => {
            if read_only(&meta) {
                return Err(refuse(
                    path,
                    ErrorKind::PermissionDenied,
                    "is read-only (no write permission bit); it is not replaced: make it writable or choose another output",
                ));
            }
            fs::OpenOptions::new().write(true).open(path).map_err(|e| io_err(path, e))?;
            Ok(Destination::Replace(resolve_links(path)))
        }
        Ok(meta) => match special_kind(&meta) {
            Some(kind) => Err(refuse(
                path,
                ErrorKind::InvalidInput,
                format!("is {kind}; outputs go to regular files, character devices (/dev/null) or FIFOs"),
            )),
            None if read_only(&meta) => {
                Err(refuse(path, ErrorKind::PermissionDenied, "is read-only (no write permission bit)"))
            }
            None => Ok(Destination::Stream(path.to_path_buf())),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let dest = resolve_links(path);
            let folder = folder_of(&dest);
            match fs::metadata(folder) {
                Ok(m) if m.is_dir() => Ok(Destination::Replace(dest)),
                Ok(_) => Err(refuse(path, ErrorKind::NotADirectory, format!("`{}` is not a folder", folder.display()))),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    Err(refuse(path, ErrorKind::NotFound, format!("its folder `{}` does not exist", folder.display())))
                }
                Err(e) => Err(io_err(folder, e)),
            }
        }
        Err(e) if e.kind() == ErrorKind::NotADirectory => {
            Err(refuse(path, ErrorKind::NotADirectory, "goes through something that is not a folder"))
        }
        Err(e) => Err(io_err(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::names_a_folder;
    use std::path::Path;

    #[test]
    fn spellings_that_name_a_folder() {
        for s in ["", ".", "..", "/", "x/", "x/.", "x/..", "./", "a/b/"] {
            assert!(names_a_folder(Path::new(s)), "{s:?}");
        }
        for s in ["x", "x.safetensors", ".x", "..x", "x.", "a/.b", "a/b..", "/dev/null"] {
            assert!(!names_a_folder(Path::new(s)), "{s:?}");
        }
    }
}
