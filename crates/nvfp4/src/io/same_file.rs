//! Whether an output path names the input file: writing it would replace the data being read,
//! so commands that read one file and write another refuse such a pair before doing any work.

use std::path::Path;

#[cfg(not(unix))]
use super::io_error::io_err;
use crate::{Error, Result};

/// True when `output` exists and is the same file as `input`: the same device and inode on Unix,
/// so symbolic links, hard links and spellings such as `./x` or `dir/../x` all count; the same
/// canonical path elsewhere. An output that does not exist yet is never the input, and neither
/// is anything when the input cannot be read (reading it reports that).
pub fn same_file(input: &Path, output: &Path) -> Result<bool> {
    let Ok(out_meta) = std::fs::metadata(output) else { return Ok(false) };
    let Ok(in_meta) = std::fs::metadata(input) else { return Ok(false) };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(in_meta.dev() == out_meta.dev() && in_meta.ino() == out_meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = (in_meta, out_meta);
        let a = std::fs::canonicalize(input).map_err(|e| io_err(input, e))?;
        let b = std::fs::canonicalize(output).map_err(|e| io_err(output, e))?;
        Ok(a == b)
    }
}

/// [`Error::Invalid`] when `output` is `input` (see [`same_file`]).
pub fn refuse_same_file(input: &Path, output: &Path) -> Result<()> {
    if same_file(input, output)? {
        return Err(Error::Invalid(format!(
            "the output `{}` is the input `{}`: writing it would destroy the input; choose another output path",
            output.display(),
            input.display()
        )));
    }
    Ok(())
}
