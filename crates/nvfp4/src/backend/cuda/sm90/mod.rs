//! The host side of the Hopper GEMM skeleton (kernels/sm90/): a pure plan per operation
//! ([`plan`]), then a bind step that attaches device operands, output and workspace ([`bind`]),
//! then launches on a stream. The GEMM, the fused dual GEMM and the grouped GEMM ([`grouped`])
//! are its operations.

pub mod bind;
mod family;
pub mod grouped;
pub mod plan;

pub use super::kernels::sm90::{Op, Variant, XKind, VARIANTS};
pub use bind::Sm90Operands;
pub(crate) use bind::{bind, Sm90Kernels};
pub(crate) use family::{grouped_route, route};
pub use grouped::{
    grouped_plan, grouped_plan_for, grouped_rejects, grouped_rejects_for, GroupedOperands, GroupedPlan, GroupedShape,
};
pub use plan::{plan, plan_for, rejects, rejects_for, stream_k_shape, Forced, Schedule, Sm90Plan, Sm90Scratch};
