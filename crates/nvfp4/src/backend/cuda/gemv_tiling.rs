//! The tiling both GEMV kernels share (kernels/gemv.cu, W4A4, and kernels/gemv16.cu, W4A16, over
//! kernels/gemv_tiles.cuh): row tiles of 32 rows, K-steps of 32 chunks, split-K, the persistent
//! grid and the shared-memory window of the vector. Only the window's bytes per K-step and its
//! largest size differ between them; the rest is this one deterministic heuristic, its workspace
//! and its printed form, tested without a GPU.

use std::fmt;

use super::device::WorkspaceNeeds;
use super::kernels::gemv::{Chunk, KSTEP_CHUNKS, ROWS_PER_CTA, THREADS};

/// One GEMV shape's work split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// 32-row tiles per batch.
    pub row_ctas: usize,
    /// K-steps (32 chunks) per row.
    pub ksteps: usize,
    /// K slices (split-K); 1 writes the output directly.
    pub split: usize,
    /// K-steps per slice.
    pub ksteps_per_slice: usize,
    /// K-steps of the vector in shared memory at a time.
    pub window_ksteps: usize,
    /// Work items: row tiles x L x slices.
    pub tiles: usize,
    /// Tiles per (persistent) CTA.
    pub tiles_per_cta: usize,
    /// CTAs launched.
    pub grid: usize,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: usize,
    /// Resident CTAs per SM (occupancy).
    pub ctas_per_sm: usize,
}

impl Tiling {
    /// The heuristic for `rows` x `k` x `l` in chunks of `chunk`, a window taking `kstep_smem`
    /// bytes per K-step and at most `max_window` K-steps (and `fixed_smem` bytes beside it), on
    /// `sms` SMs; `occupancy(smem)` is the number of CTAs of the kernel that fit one SM with
    /// `smem` bytes of dynamic shared memory (from the driver; any positive number in tests).
    ///
    /// 1. Row tiles: 4 per 128 rows, dropping the trailing tiles of the last 128 rows that would
    ///    hold no row (row = 128t + 32q + 8c + r, r = 0..7).
    /// 2. Slots = SMs x occupancy: the CTAs that run at once. If the tiles of all batches fill
    ///    less than half of them, split K so they fill the slots (each slice >= 1 K-step), since
    ///    a GEMV needs every SM pulling bytes.
    /// 3. Persistent grid: each CTA takes ceil(tiles / slots) consecutive tiles (same batch, so
    ///    the vector is staged once), all CTAs run in one wave with no tail wave.
    /// 4. The window: the slice's K when it fits `max_window`, else pieces of it.
    pub fn choose(
        (rows, k, l): (usize, usize, usize),
        chunk: Chunk,
        (kstep_smem, fixed_smem): (usize, usize),
        max_window: usize,
        sms: usize,
        occupancy: impl FnOnce(usize) -> usize,
    ) -> Self {
        let tiles128 = rows.div_ceil(128);
        let last_rows = rows - 128 * (tiles128 - 1);
        let row_ctas = 4 * (tiles128 - 1) + last_rows.div_ceil(8).min(4);
        let chunks = k / 2 / chunk.bytes();
        let ksteps = chunks.div_ceil(KSTEP_CHUNKS);
        let max_window = max_window.max(1);

        let first_smem = ksteps.min(max_window) * kstep_smem + fixed_smem;
        let ctas_per_sm = occupancy(first_smem).max(1);
        let slots = sms.max(1) * ctas_per_sm;
        let base = row_ctas * l;
        let split = if 2 * base > slots { 1 } else { (slots / base).clamp(1, ksteps) };
        let ksteps_per_slice = ksteps.div_ceil(split);
        let split = ksteps.div_ceil(ksteps_per_slice);
        let window_ksteps = ksteps_per_slice.min(max_window);
        let tiles = base * split;
        let tiles_per_cta = tiles.div_ceil(slots);
        let grid = tiles.div_ceil(tiles_per_cta);
        Self {
            row_ctas,
            ksteps,
            split,
            ksteps_per_slice,
            window_ksteps,
            tiles,
            tiles_per_cta,
            grid,
            smem_bytes: window_ksteps * kstep_smem + fixed_smem,
            ctas_per_sm,
        }
    }
}

impl Tiling {
    /// Workspace of `rows` x `cols` x `l` outputs: split-K partial sums `[split, L, cols, rows]`
    /// f32 at scratch offset 0 and one arrival counter per row tile and batch (none without split).
    pub fn scratch(&self, rows: usize, cols: usize, l: usize) -> WorkspaceNeeds {
        if self.split > 1 {
            WorkspaceNeeds { bytes: self.split * l * cols * rows * 4, counters: l * self.row_ctas }
        } else {
            WorkspaceNeeds::default()
        }
    }

    /// The printed work split of a plan over `l` batches on `sms` SMs, after the family's own
    /// words; `vector` names what the window holds.
    pub(crate) fn fmt_split(&self, f: &mut fmt::Formatter<'_>, l: usize, sms: usize, vector: &str) -> fmt::Result {
        write!(
            f,
            "{} tiles of {ROWS_PER_CTA} rows x L {l} x split {} ({} of {} K-steps per slice), {} tiles, {} \
             tile(s)/CTA, grid {} x {THREADS} ({} CTAs/SM x {sms} SMs), {vector} window {} K-steps = {} B smem",
            self.row_ctas,
            self.split,
            self.ksteps_per_slice,
            self.ksteps,
            self.tiles,
            self.tiles_per_cta,
            self.grid,
            self.ctas_per_sm,
            self.window_ksteps,
            self.smem_bytes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: usize, k: usize, l: usize) -> Tiling {
        let chunk = if k.is_multiple_of(32) { Chunk::B16 } else { Chunk::B8 };
        Tiling::choose((rows, k, l), chunk, (1000, 0), 16, 132, |_| 2)
    }

    #[test]
    fn slices_cover_k_and_the_grid_is_one_wave() {
        for (rows, k, l) in [(1, 16, 1), (7, 48, 3), (8192, 8192, 1), (130, 64, 3), (64, 65536, 1), (1, 16400, 5)] {
            let c = t(rows, k, l);
            assert!(c.ksteps_per_slice * (c.split - 1) < c.ksteps, "{c:?}");
            assert!(c.ksteps_per_slice * c.split >= c.ksteps, "{c:?}");
            assert!(c.grid * c.tiles_per_cta >= c.tiles && c.grid <= 264, "{c:?}");
            assert!(c.window_ksteps <= 16 && c.smem_bytes == c.window_ksteps * 1000, "{c:?}");
            let last = c.row_ctas - 1;
            assert!((last / 4) * 128 + (last % 4) * 8 < rows, "{c:?}");
        }
        // 8192 rows: 256 tiles fill the 264 slots without a split.
        let c = t(8192, 8192, 1);
        assert_eq!((c.row_ctas, c.split, c.ksteps, c.tiles, c.grid, c.window_ksteps), (256, 1, 8, 256, 256, 8));
        // One row: one tile, K split over the slots (8192 / 1024 = 8 K-steps, 8 slices).
        let c = t(1, 8192, 1);
        assert_eq!((c.row_ctas, c.split, c.ksteps_per_slice, c.grid), (1, 8, 1, 8));
    }
}
