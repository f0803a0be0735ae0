//! The grouped GEMM on the skeleton: its pure plan (`plan.rs`) and the step that binds the plan to
//! device operands and launches it (`bind.rs`).

mod bind;
mod plan;

pub(crate) use bind::bind_grouped;
pub use bind::GroupedOperands;
pub use plan::{
    grouped_plan, grouped_plan_for, grouped_rejects, grouped_rejects_for, GroupedPlan, GroupedScratch, GroupedShape,
};
