//! Which of SPEC §7's two timing protocols a run uses.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// A timing protocol (SPEC §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// One launch per sample, L2 flushed before it, CUDA events around it (the default; the
    /// protocol of the public problems).
    #[default]
    Cold,
    /// N launches captured in one CUDA graph over rotating input sets, chained with
    /// programmatic dependent launch where the kernel supports it; µs per launch (what a decode
    /// step inside a graph sees).
    Graph,
}

impl FromStr for Protocol {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cold" => Ok(Protocol::Cold),
            "graph" => Ok(Protocol::Graph),
            _ => Err(Error::Invalid(format!("unknown timing mode `{s}` (cold, graph)"))),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Cold => "cold",
            Protocol::Graph => "graph",
        })
    }
}
