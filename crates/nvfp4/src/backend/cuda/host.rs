//! The [`Backend`] trait for host data, a thin layer over device operands: stage (upload, bind
//! with the shared workspace), launch on the backend's stream, download. No operand is cloned and
//! no output goes through an enum.

use super::backend::CudaBackend;
use super::prepared::Stage;
use crate::format::{OutTensor, OutputDtype};
use crate::ops::{Activation, Backend, DualGemm, Gemm, Gemv, GroupedGemm, HostActivation, HostOp, MoeGemm};
use crate::Result;

impl CudaBackend {
    /// Runs `op` once on host data: its output tensors (one per group for grouped GEMM).
    fn run_once<A: Stage + Activation>(&self, op: &HostOp<'_, A>, dtype: OutputDtype) -> Result<Vec<OutTensor>> {
        let mut staged = self.stage(op, true, dtype)?;
        staged.launch()?;
        staged.outputs()
    }

    /// [`CudaBackend::run_once`] of an operation with one output.
    fn run_single<A: Stage + Activation>(&self, op: &HostOp<'_, A>, dtype: OutputDtype) -> Result<OutTensor> {
        Ok(self.run_once(op, dtype)?.remove(0))
    }

    /// One launch that reads the offsets on the device (uploaded here) where a family takes the
    /// MoE form (its output starts as zeros: rows past the last offset stay zero): every W4A16
    /// shape (the skeleton's grouped launch, else the fallback). W4A4 shapes none takes (K % 32
    /// != 0, K < 64) run the experts with tokens as one grouped GEMM of host slices instead,
    /// scattered into `[1, T, N]`.
    fn run_moe<A: HostActivation>(&self, p: &MoeGemm<A>, dtype: OutputDtype) -> Result<OutTensor>
    where
        for<'x> &'x A: Stage,
    {
        p.validate()?;
        if self.route(&p.op().meta()).is_ok() {
            return self.run_single(&p.op(), dtype);
        }
        let experts = p.routed_experts()?;
        if experts.is_empty() {
            return p.assemble(dtype, []);
        }
        let groups = experts.iter().map(|&e| p.expert_gemm(e)).collect::<Result<_>>()?;
        let outputs = self.run_once(&GroupedGemm::new(groups)?.op(), dtype)?;
        p.assemble(dtype, experts.into_iter().zip(outputs))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn gemv_as(&self, p: &Gemv, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_single(&p.op(), dtype)
    }
    fn gemm_as(&self, p: &Gemm, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_single(&p.op(), dtype)
    }
    fn dual_gemm_as(&self, p: &DualGemm, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_single(&p.op(), dtype)
    }
    fn grouped_gemm_as(&self, p: &GroupedGemm, dtype: OutputDtype) -> Result<Vec<OutTensor>> {
        self.run_once(&p.op(), dtype)
    }
    fn moe_gemm_as(&self, p: &MoeGemm, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_moe(p, dtype)
    }
    fn gemv16_as(&self, p: &Gemv<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_single(&p.op(), dtype)
    }
    fn gemm16_as(&self, p: &Gemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_single(&p.op(), dtype)
    }
    fn dual_gemm16_as(&self, p: &DualGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_single(&p.op(), dtype)
    }
    fn grouped_gemm16_as(&self, p: &GroupedGemm<OutTensor>, dtype: OutputDtype) -> Result<Vec<OutTensor>> {
        self.run_once(&p.op(), dtype)
    }
    fn moe_gemm16_as(&self, p: &MoeGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        self.run_moe(p, dtype)
    }
}
