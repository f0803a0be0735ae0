//! Host memory: how many bytes the host can give, and byte counts that cannot overflow.
//!
//! Every path that allocates from a declared shape (a generator, a file reader, an operation's
//! output) first computes the bytes it needs with checked arithmetic and asks [`ensure_host`]. A
//! request the host cannot meet is then an [`Error::TooLarge`] naming both sizes, instead of an
//! allocation failure, which aborts the process.
//!
//! "Available" is the kernel's `MemAvailable` (free memory plus what it can reclaim without
//! swapping), capped by the memory limit of the control group we run in, when one is set. Where
//! neither can be read (not Linux, no /proc), the figure is the largest single allocation Rust
//! allows, so only sizes that cannot exist anywhere are refused up front; the allocations that
//! matter most are also made fallibly ([`try_zeroed`]).

use std::fmt;

use crate::{Error, Result};

/// Where the figure of [`HostMemory::available`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `MemAvailable` in /proc/meminfo.
    MemAvailable,
    /// `MemFree + Buffers + Cached` in /proc/meminfo (kernels older than 3.14 lack MemAvailable).
    MemFree,
    /// The memory limit of our control group, lower than what /proc/meminfo reports.
    Cgroup,
    /// Nothing readable: the largest allocation Rust allows.
    Unknown,
}

/// What the host can give now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// Bytes.
    pub available: u64,
    /// Where the figure came from.
    pub source: Source,
}

impl fmt::Display for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = match self.source {
            Source::MemAvailable => "MemAvailable",
            Source::MemFree => "MemFree + Buffers + Cached",
            Source::Cgroup => "cgroup memory limit",
            Source::Unknown => "unknown: the largest possible allocation",
        };
        write!(f, "{} bytes ({from})", self.available)
    }
}

/// The largest single allocation Rust permits.
const ALLOCATION_LIMIT: u64 = isize::MAX as u64;

/// Reads what the host can give now (see the module docs). Never fails.
pub fn host_memory() -> HostMemory {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| parse_meminfo(&t));
    let mut best = match meminfo {
        Some((available, source)) => HostMemory { available, source },
        None => HostMemory { available: ALLOCATION_LIMIT, source: Source::Unknown },
    };
    if let Some(limit) = cgroup_limit() {
        if limit < best.available {
            best = HostMemory { available: limit, source: Source::Cgroup };
        }
    }
    best
}

/// Bytes the host can give now: [`host_memory`]'s figure.
pub fn host_available() -> u64 {
    host_memory().available
}

/// `MemAvailable` from the text of /proc/meminfo, or `MemFree + Buffers + Cached` where the
/// kernel does not report it; `None` when neither is there.
pub fn parse_meminfo(text: &str) -> Option<(u64, Source)> {
    let field = |key: &str| -> Option<u64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            let mut parts = rest.split_whitespace();
            let value: u64 = parts.next()?.parse().ok()?;
            match parts.next() {
                Some("kB") => value.checked_mul(1024),
                None => Some(value),
                Some(_) => None,
            }
        })
    };
    if let Some(v) = field("MemAvailable") {
        return Some((v, Source::MemAvailable));
    }
    let free = field("MemFree")?;
    let sum = [field("Buffers"), field("Cached")].into_iter().flatten().try_fold(free, u64::checked_add)?;
    Some((sum, Source::MemFree))
}

/// The memory limit of the control group at the root of our view of the cgroup tree (what a
/// container sees), v2 then v1; `None` when there is none or it cannot be read.
fn cgroup_limit() -> Option<u64> {
    ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| text.trim().parse().ok())
}

/// The product of `factors`, or `None` when it does not fit in 64 bits.
pub fn checked_product(factors: &[usize]) -> Option<u64> {
    factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(u64::try_from(f).ok()?))
}

/// The sum of `terms`, or `None` when a term is `None` or the sum does not fit in 64 bits.
pub fn checked_sum(terms: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    terms.into_iter().try_fold(0u64, |acc, t| acc.checked_add(t?))
}

/// Refuses a request of `needed` bytes (`None`: more than 64 bits can count) that the host
/// cannot give now; `what` names the request in the error.
pub fn ensure_host(what: &str, needed: Option<u64>) -> Result<()> {
    ensure_within(what, needed, host_memory().available)
}

/// [`ensure_host`] against a given figure.
pub fn ensure_within(what: &str, needed: Option<u64>, available: u64) -> Result<()> {
    match needed {
        Some(n) if n <= available && n <= ALLOCATION_LIMIT => Ok(()),
        Some(n) => Err(Error::TooLarge { what: what.to_string(), needed: n, available }),
        None => {
            Err(Error::TooLarge { what: format!("{what} (a byte count beyond 64 bits)"), needed: u64::MAX, available })
        }
    }
}

/// A zeroed buffer of `len` elements, or [`Error::TooLarge`] where the allocator refuses it
/// (instead of aborting).
pub fn try_zeroed<T: Clone + Default>(what: &str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::TooLarge {
        what: format!("{what} (refused by the allocator)"),
        needed: checked_product(&[len, std::mem::size_of::<T>()]).unwrap_or(u64::MAX),
        available: host_available(),
    })?;
    v.resize(len, T::default());
    Ok(v)
}
