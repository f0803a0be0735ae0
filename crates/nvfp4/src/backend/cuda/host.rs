//! The [`Backend`] trait for host data, a thin layer over device operands: stage (upload, bind
//! with the shared workspace), launch on the backend's stream, download. No operand is cloned and
//! no output goes through an enum.

use super::backend::CudaBackend;
use super::prepared::HostOp;
use super::sm90::{self, Forced, GroupedShape, Op};
use super::DeviceOp;
use crate::format::F16Tensor;
use crate::ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm, MoeGemm};
use crate::Result;

impl CudaBackend {
    /// Runs `op` once on host data: its output tensors (one per group for grouped GEMM).
    fn run_once(&self, op: HostOp<'_>) -> Result<Vec<F16Tensor>> {
        let mut staged = self.stage(op, true)?;
        staged.launch()?;
        staged.output_tensors()
    }

    /// [`CudaBackend::run_once`] of an operation with one output.
    fn run_single(&self, op: HostOp<'_>) -> Result<F16Tensor> {
        Ok(self.run_once(op)?.remove(0))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn gemv(&self, p: &Gemv) -> Result<F16Tensor> {
        self.run_single(HostOp::Gemv(p))
    }
    fn gemm(&self, p: &Gemm) -> Result<F16Tensor> {
        self.run_single(HostOp::Gemm(p))
    }
    fn dual_gemm(&self, p: &DualGemm) -> Result<F16Tensor> {
        self.run_single(HostOp::DualGemm(p))
    }
    fn grouped_gemm(&self, p: &GroupedGemm) -> Result<Vec<F16Tensor>> {
        self.run_once(HostOp::GroupedGemm(p))
    }
    /// One launch that reads the offsets on the device (uploaded here); shapes the skeleton does
    /// not take (K % 32 != 0, K < 64) run the experts with tokens as one grouped GEMM of host
    /// slices instead, scattered into `[1, T, N]`.
    fn moe_gemm(&self, p: &MoeGemm) -> Result<F16Tensor> {
        p.validate()?;
        let (e, t, n, k) = p.etnk();
        if sm90::grouped_rejects(&GroupedShape::Moe { t, n, k, e }, Forced::from_env(Op::Grouped)).is_none() {
            let (a, b) = (self.upload(&p.a)?, self.upload(&p.b)?);
            let offsets = self.upload_i32(&p.offsets)?;
            let c = self.alloc_output([1, t, n])?; // zero: rows past the last offset stay zero
            let op = DeviceOp::MoeGemm { a: &a.view(), b: &b.view(), offsets: &offsets, alpha: p.alpha, c: &c.view() };
            self.bind(op)?.launch()?;
            return self.download(&c);
        }
        let experts = p.routed_experts()?;
        if experts.is_empty() {
            return p.assemble([]);
        }
        let groups = experts.iter().map(|&e| p.expert_gemm(e)).collect::<Result<_>>()?;
        let outputs = self.grouped_gemm(&GroupedGemm::new(groups)?)?;
        p.assemble(experts.into_iter().zip(outputs))
    }
}
