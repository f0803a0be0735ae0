//! The grouped GEMM on the skeleton (grouped_gemm_sm90.cu, sm90/grouped.cuh): the structs its
//! pre-pass (which decodes every group's X and builds the work table) and its main kernel share
//! with the host. Its module, pre-pass symbol and sizes live with the skeleton's in `sm90`, which
//! names the module for `Op::Grouped` and writes the sizes into generated.cuh; they are
//! re-exported here for the grouped bind step.

use crate::backend::cuda::runtime::kernel_struct;

pub use super::sm90::{BUILD_THREADS, GROUPED_SM90, MAX_SEGMENTS, PREPARE_SYMBOL, TABLE_SYMBOL, TABLE_THREADS};

kernel_struct! {
    /// One piece of work of a grouped launch: a tile of one group over a range of k-steps,
    /// written by the pre-pass's builder, in CTA order.
    pub(crate) struct GroupedUnit {
        /// the group's problem
        prob: i32 => "i32",
        /// W's batch (the expert of a MoE launch)
        l: i32 => "i32",
        /// W tile
        tw: i32 => "i32",
        /// the tile's first X row, and the group's end row
        x_base: i32 => "i32",
        x_end: i32 => "i32",
        /// piece | pieces << 16
        pieces: i32 => "i32",
        /// k0 | k1 << 16 (64-element k-steps)
        ks: i32 => "i32",
        pad: i32 => "i32",
    }
}

kernel_struct! {
    /// A group of a list-form launch, for the builder.
    pub(crate) struct GroupSegment {
        prob: i32 => "i32",
        l: i32 => "i32",
        /// the group's rows of its X operand
        x_base: i32 => "i32",
        x_rows: i32 => "i32",
        /// its W tiles and k-steps
        tiles_w: i32 => "i32",
        k_iters: i32 => "i32",
        pad: [i32; 2] => "i32" [2],
    }
}

kernel_struct! {
    /// What the builder reads and writes.
    pub(crate) struct GroupedBuild {
        /// [segments] groups (list form), or null
        segs: u64 => "const GroupSegment*",
        /// [segments] i32 expert end rows (MoE form, on the device), or null
        offsets: u64 => "const i32*",
        /// [max_units] the table
        units: u64 => "GroupedUnit*",
        /// [slots + 1] each CTA's first unit
        slot_first: u64 => "i32*",
        segments: i32 => "i32",
        max_units: i32 => "i32",
        /// persistent CTAs of the main kernel
        slots: i32 => "i32",
        /// X rows per tile
        bn: i32 => "i32",
        /// MoE form: token rows, W tiles and k-steps of every expert
        moe_rows: i32 => "i32",
        moe_tiles_w: i32 => "i32",
        moe_k_iters: i32 => "i32",
        /// 1: whole waves of tile groups may be dealt round robin before the stream-K share
        deal: i32 => "i32",
    }
}

kernel_struct! {
    /// The pre-pass's parameters.
    pub(crate) struct GroupedPrepParams {
        /// [decodes] X operands to decode, each from block `block0` (+ 1) on
        decode: u64 => "const XDecodeParams*",
        decodes: i32 => "i32",
        pad: i32 => "i32",
        build: GroupedBuild => "GroupedBuild",
    }
}

kernel_struct! {
    /// The main kernel's parameters.
    pub(crate) struct Sm90GroupedParams {
        /// [groups] (list form) or [1] (MoE form)
        problems: u64 => "const Sm90Problem*",
        units: u64 => "const GroupedUnit*",
        slot_first: u64 => "const i32*",
        /// [2 * slots, BM * BN] f32 partial tiles
        workspace: u64 => "float*",
        /// [slots] arrivals per cut tile, zero between launches
        counters: u64 => "u32*",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts() {
        assert_eq!(std::mem::size_of::<GroupedUnit>(), 32);
        assert_eq!(std::mem::size_of::<GroupSegment>(), 32);
        assert_eq!(std::mem::size_of::<GroupedBuild>(), 64);
    }
}
