//! Where an operation's host work runs: from a Python function, without the GIL (`Python`:
//! other Python threads run meanwhile); from a torch operator's boxed kernel (`NoGil`), as it
//! is: the dispatcher called it without the GIL, and nothing there touches Python objects.

use pyo3::Python;

/// Runs the part of a call that needs no Python objects.
pub(crate) trait Detach {
    fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T;
}

impl Detach for Python<'_> {
    fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        self.detach(f)
    }
}

/// A caller that holds no GIL to release.
pub(crate) struct NoGil;

impl Detach for NoGil {
    fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        f()
    }
}
