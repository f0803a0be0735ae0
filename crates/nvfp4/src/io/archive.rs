//! The safetensors container under every io function: typed look-ups that turn a missing name, a
//! wrong dtype or a wrong shape into an [`Error::Tensor`] naming the tensor and what was expected,
//! over a file held in memory or read piece by piece from disk; and the writer.
//!
//! Untrusted bytes never panic here: the header is parsed and validated by the safetensors crate
//! (offsets contiguous, every tensor's byte length equal to its shape times its dtype, data covering
//! the file exactly), and nothing is allocated beyond what the file really holds.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Metadata, SafeTensorError};
use safetensors::{Dtype, View};

use super::atomic::write_atomically;
use super::io_error::io_err;
use crate::memory::{ensure_host, try_zeroed};
use crate::{Error, Result};

/// What [`Error::File`] names when the bytes came from memory rather than a path.
pub(crate) const IN_MEMORY: &str = "<in-memory safetensors>";

/// Header sizes above this are refused, as the safetensors crate itself does.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Bytes of the little-endian u64 header length that opens every file.
const LEN_BYTES: u64 = 8;

pub(crate) fn tensor_err(name: &str, msg: impl Into<String>) -> Error {
    Error::Tensor { name: name.to_string(), msg: msg.into() }
}

pub(crate) fn file_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::File { path: path.to_path_buf(), msg: msg.into() }
}

/// One dimension of an expected shape: a number, or a named size that any value >= 1 matches.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dim {
    /// Exactly this size.
    Is(usize),
    /// Any size >= 1, shown under this name (`M`, `K/2`).
    Any(&'static str),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Is(n) => write!(f, "{n}"),
            Dim::Any(s) => f.write_str(s),
        }
    }
}

/// `DTYPE [d0, d1, ..]`, the form every message uses for both sides.
fn describe(dtype: Dtype, dims: &[impl fmt::Display]) -> String {
    let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("{dtype} [{}]", dims.join(", "))
}

/// Where a container's data bytes live.
enum Source<'a> {
    /// The data section of a file held in memory.
    Mem(&'a [u8]),
    /// A file on disk; the data section starts at `data_start`.
    Disk { file: File, data_start: u64 },
}

/// A parsed safetensors container: its validated header and its data.
pub(crate) struct Archive<'a> {
    meta: Metadata,
    origin: PathBuf,
    src: Source<'a>,
}

/// The header length that a file of `file_len` bytes declares in its first 8 bytes, refused
/// when the header could not fit in the file.
fn header_len(prefix: [u8; LEN_BYTES as usize], file_len: u64, origin: &Path) -> Result<u64> {
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES || n > file_len - LEN_BYTES {
        return Err(file_err(
            origin,
            format!("header length {n} is impossible for a file of {file_len} bytes (not safetensors, or truncated)"),
        ));
    }
    Ok(n)
}

/// Parses the JSON header of a file of `file_len` bytes and checks that its tensors' data
/// covers the rest of the file exactly. Deserializing [`Metadata`] validates the offsets and every
/// tensor's byte length against its shape and dtype (safetensors' own checks); every sum here is
/// checked, so offsets near the end of the address space are refused, not wrapped around.
fn parse_header(header: &[u8], file_len: u64, origin: &Path) -> Result<Metadata> {
    let meta: Metadata = serde_json::from_slice(header)
        .map_err(|e| file_err(origin, format!("not a valid safetensors file: bad header: {e}")))?;
    let data_start = LEN_BYTES + header.len() as u64;
    let data_len = meta.data_len() as u64;
    if data_start.checked_add(data_len) != Some(file_len) {
        return Err(file_err(
            origin,
            format!(
                "header describes {data_len} bytes of tensor data, the file holds {} (truncated or corrupt)",
                file_len - data_start
            ),
        ));
    }
    Ok(meta)
}

/// The error for a file too short to hold the length prefix.
fn too_short(file_len: u64, origin: &Path) -> Error {
    file_err(origin, format!("{file_len} bytes is too short for a safetensors file"))
}

impl<'a> Archive<'a> {
    /// Parses a whole file held in memory; `origin` is the path errors name.
    pub(crate) fn from_bytes(bytes: &'a [u8], origin: &Path) -> Result<Self> {
        let file_len = bytes.len() as u64;
        let head = bytes.get(..LEN_BYTES as usize).and_then(|p| p.try_into().ok());
        let n = header_len(head.ok_or_else(|| too_short(file_len, origin))?, file_len, origin)?;
        // n <= file_len - 8, so both ends lie inside the buffer.
        let start = (LEN_BYTES + n) as usize;
        let meta = parse_header(&bytes[LEN_BYTES as usize..start], file_len, origin)?;
        Ok(Self { meta, origin: origin.to_path_buf(), src: Source::Mem(&bytes[start..]) })
    }
}

impl Archive<'static> {
    /// Opens a file on disk, reading only its header: tensors are read on demand, so one weight
    /// of a multi-gigabyte checkpoint costs its own bytes only.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| io_err(path, e))?;
        let file_len = file.metadata().map_err(|e| io_err(path, e))?.len();
        if file_len < LEN_BYTES {
            return Err(too_short(file_len, path));
        }
        let mut head = [0u8; LEN_BYTES as usize];
        file.read_exact(&mut head).map_err(|e| io_err(path, e))?;
        let n = header_len(head, file_len, path)?;
        // n <= MAX_HEADER_BYTES, so this fits any usize we run on.
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(|e| io_err(path, e))?;
        let meta = parse_header(&header, file_len, path)?;
        Ok(Self { meta, origin: path.to_path_buf(), src: Source::Disk { file, data_start: LEN_BYTES + n } })
    }
}

impl Archive<'_> {
    /// Bytes of tensor data the header describes (validated against the file's length).
    pub(crate) fn data_len(&self) -> u64 {
        self.meta.data_len() as u64
    }

    /// The path errors name.
    pub(crate) fn origin(&self) -> &Path {
        &self.origin
    }

    /// Whether the file has a tensor called `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.meta.info(name).is_some()
    }

    /// Dtype and shape of `name`, if present.
    pub(crate) fn info(&self, name: &str) -> Option<(Dtype, &[usize])> {
        self.meta.info(name).map(|i| (i.dtype, &i.shape[..]))
    }

    /// Tensor names in file order (by data offset).
    pub(crate) fn names(&self) -> Vec<String> {
        self.meta.offset_keys()
    }

    /// Bytes of tensor `name`'s data, if present.
    pub(crate) fn byte_len(&self, name: &str) -> Option<u64> {
        let (start, end) = self.meta.info(name)?.data_offsets;
        Some(end.checked_sub(start)? as u64)
    }

    /// The `__metadata__` string map of the header, if any.
    pub(crate) fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.meta.metadata().as_ref()
    }

    /// Checks that `name` exists with `dtype` and a shape matching `dims`, and returns its shape.
    /// `note` (may be empty) says where the expected sizes come from.
    pub(crate) fn expect(&self, name: &str, dtype: Dtype, dims: &[Dim], note: &str) -> Result<Vec<usize>> {
        let want = describe(dtype, dims);
        let note = if note.is_empty() { String::new() } else { format!(" ({note})") };
        let Some((got_dtype, shape)) = self.info(name) else {
            return Err(tensor_err(name, format!("missing from the file (expected {want}{note})")));
        };
        let fits = shape.len() == dims.len()
            && shape.iter().zip(dims).all(|(&s, d)| match *d {
                Dim::Is(n) => s == n,
                Dim::Any(_) => s >= 1,
            });
        if got_dtype != dtype || !fits {
            let zero = if shape.contains(&0) { "; every dimension must be >= 1" } else { "" };
            return Err(tensor_err(name, format!("expected {want}{note}, found {}{zero}", describe(got_dtype, shape))));
        }
        Ok(shape.to_vec())
    }

    /// An optional F32 scalar (shape `[]` or `[1]`): `None` when absent.
    pub(crate) fn scalar_f32(&self, name: &str) -> Result<Option<f32>> {
        let Some((dtype, shape)) = self.info(name) else { return Ok(None) };
        if dtype != Dtype::F32 || shape.iter().product::<usize>() != 1 || shape.len() > 1 {
            return Err(tensor_err(
                name,
                format!("expected an F32 scalar (shape [] or [1]), found {}", describe(dtype, shape)),
            ));
        }
        let bytes = self.bytes(name)?;
        let word: [u8; 4] = bytes[..].try_into().map_err(|_| tensor_err(name, "F32 scalar is not 4 bytes"))?;
        Ok(Some(f32::from_le_bytes(word)))
    }

    /// The raw bytes of `name`, borrowed from memory or read from disk.
    pub(crate) fn bytes(&self, name: &str) -> Result<Cow<'_, [u8]>> {
        let info = self.meta.info(name).ok_or_else(|| tensor_err(name, "missing from the file"))?;
        let (start, end) = info.data_offsets;
        let short = || file_err(&self.origin, format!("data of tensor `{name}` lies outside the file"));
        match &self.src {
            Source::Mem(data) => data.get(start..end).map(Cow::Borrowed).ok_or_else(short),
            Source::Disk { file, data_start } => {
                // Offsets were validated against the file length on open; re-check for a file that
                // shrank since.
                let len = end.checked_sub(start).ok_or_else(short)?;
                let what = format!("reading tensor `{name}` of {}", self.origin.display());
                ensure_host(&what, Some(len as u64))?;
                let mut buf = try_zeroed(&what, len)?;
                let mut f = file;
                f.seek(SeekFrom::Start(data_start + start as u64)).map_err(|e| io_err(&self.origin, e))?;
                f.read_exact(&mut buf).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => short(),
                    _ => io_err(&self.origin, e),
                })?;
                Ok(Cow::Owned(buf))
            }
        }
    }
}

/// The `__metadata__` map of a header.
type StringMap = HashMap<String, String>;

/// One tensor to write: dtype, shape and little-endian bytes (borrowed where possible).
pub(crate) struct Entry<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl<'a> Entry<'a> {
    pub(crate) fn new(dtype: Dtype, shape: Vec<usize>, data: impl Into<Cow<'a, [u8]>>) -> Self {
        Self { dtype, shape, data: data.into() }
    }

    /// A 0-d F32 tensor.
    pub(crate) fn scalar_f32(v: f32) -> Self {
        Self::new(Dtype::F32, vec![], v.to_le_bytes().to_vec())
    }
}

impl View for Entry<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// The tensors of a file about to be written, names checked unique.
#[derive(Default)]
pub(crate) struct Writer<'a> {
    entries: Vec<(String, Entry<'a>)>,
    names: HashSet<String>,
    metadata: HashMap<String, String>,
}

impl<'a> Writer<'a> {
    /// Adds a tensor; a second tensor of the same name is refused.
    pub(crate) fn push(&mut self, name: String, entry: Entry<'a>) -> Result<()> {
        if !self.names.insert(name.clone()) {
            return Err(tensor_err(&name, "two tensors of this name would be written"));
        }
        self.entries.push((name, entry));
        Ok(())
    }

    /// Sets one `__metadata__` string.
    pub(crate) fn meta(&mut self, key: &str, value: &str) {
        self.metadata.insert(key.to_string(), value.to_string());
    }

    fn parts(self) -> (Vec<(String, Entry<'a>)>, Option<StringMap>) {
        let meta = if self.metadata.is_empty() { None } else { Some(self.metadata) };
        (self.entries, meta)
    }

    /// The file as bytes.
    pub(crate) fn into_bytes(self) -> Result<Vec<u8>> {
        let (entries, meta) = self.parts();
        safetensors::serialize(entries, meta)
            .map_err(|e| file_err(Path::new(IN_MEMORY), format!("cannot serialize: {e}")))
    }

    /// Writes the file to `path`, streaming the tensors into a temporary file that replaces
    /// `path` only once complete ([`write_atomically`]).
    pub(crate) fn write(self, path: &Path) -> Result<()> {
        let (entries, meta) = self.parts();
        write_atomically(path, |tmp| {
            safetensors::serialize_to_file(entries, meta, tmp).map_err(|e| match e {
                SafeTensorError::IoError(source) => io_err(path, source),
                other => file_err(path, format!("cannot serialize: {other}")),
            })
        })
    }
}
