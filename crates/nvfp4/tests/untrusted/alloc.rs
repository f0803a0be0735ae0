//! A global allocator that forwards to the system's and, on the thread that asks, records the
//! largest single request and the peak of bytes held while a closure runs. It lets the test
//! assert that a reader never allocates more than the file it reads, whatever its header claims.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator; install with `#[global_allocator]`.
pub struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn on() -> bool {
    ON.try_with(Cell::get).unwrap_or(false)
}

fn grew(size: usize) {
    if on() {
        LARGEST.with(|l| l.set(l.get().max(size)));
        let live = LIVE.with(|l| {
            l.set(l.get() + size as isize);
            l.get()
        });
        PEAK.with(|p| p.set(p.get().max(live)));
    }
}

fn shrank(size: usize) {
    if on() {
        LIVE.with(|l| l.set(l.get() - size as isize));
    }
}

// SAFETY: every method passes its arguments unchanged to the system allocator and returns what it
// returns, so the GlobalAlloc contract is the system allocator's. The bookkeeping touches only
// this thread's counters: const-initialised cells without destructors, whose access never
// allocates, so it cannot re-enter the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded as received (see above).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        shrank(layout.size());
        grew(new_size);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What a closure allocated on this thread.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// The largest single request, bytes.
    pub largest: usize,
    /// The most bytes held at once beyond what was held when it started.
    pub peak: usize,
}

/// Runs `f`, recording its allocations on this thread.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Usage) {
    LARGEST.with(|l| l.set(0));
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ON.with(|o| o.set(true));
    let out = f();
    ON.with(|o| o.set(false));
    let usage = Usage { largest: LARGEST.with(Cell::get), peak: PEAK.with(Cell::get).max(0) as usize };
    (out, usage)
}
