//! The [`Backend`] trait for host data, a thin layer over device operands: upload, bind, launch
//! on the backend's stream, download. No operand is cloned and no output goes through an enum.

use super::backend::CudaBackend;
use super::device::{DeviceF16, F16View};
use super::device_op::{DeviceOp, GemmViews};
use crate::format::F16Tensor;
use crate::ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm};
use crate::Result;

impl CudaBackend {
    /// Runs a bound operation once on host data: binds, launches on the backend's stream,
    /// downloads `c`.
    fn run_once(&self, op: DeviceOp<'_>, c: &DeviceF16) -> Result<F16Tensor> {
        self.bind(op)?.launch()?;
        self.download(c)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn gemv(&self, p: &Gemv) -> Result<F16Tensor> {
        let (m, _, l) = p.mkl();
        let a = self.upload(&p.a)?;
        let b =
            if p.b.layout() == p.a.layout() { self.upload(&p.b)? } else { self.upload(&p.b.to_layout(p.a.layout()))? };
        let c = self.alloc_output([l, m, 1])?;
        self.run_once(DeviceOp::Gemv(GemmViews { a: &a.view(), b: &b.view(), alpha: p.alpha, c: &c.view() }), &c)
    }
    fn gemm(&self, p: &Gemm) -> Result<F16Tensor> {
        let (m, n, _, l) = p.mnkl();
        let (a, b, c) = (self.upload(&p.a)?, self.upload(&p.b)?, self.alloc_output([l, m, n])?);
        self.run_once(DeviceOp::Gemm(GemmViews { a: &a.view(), b: &b.view(), alpha: p.alpha, c: &c.view() }), &c)
    }
    fn dual_gemm(&self, p: &DualGemm) -> Result<F16Tensor> {
        let (m, n, _, l) = p.mnkl();
        let (a, b1, b2) = (self.upload(&p.a)?, self.upload(&p.b1)?, self.upload(&p.b2)?);
        let c = self.alloc_output([l, m, n])?;
        let op = DeviceOp::DualGemm { a: &a.view(), b1: &b1.view(), b2: &b2.view(), alpha: p.alpha, c: &c.view() };
        self.run_once(op, &c)
    }
    fn grouped_gemm(&self, p: &GroupedGemm) -> Result<Vec<F16Tensor>> {
        let mut inputs = Vec::with_capacity(p.groups.len());
        let mut outputs = Vec::with_capacity(p.groups.len());
        for g in &p.groups {
            inputs.push((self.upload(&g.a)?.view(), self.upload(&g.b)?.view()));
            outputs.push(self.alloc_output([1, g.a.rows(), g.b.rows()])?);
        }
        let views: Vec<F16View> = outputs.iter().map(DeviceF16::view).collect();
        let groups: Vec<GemmViews<'_>> = inputs
            .iter()
            .zip(&views)
            .zip(&p.groups)
            .map(|(((a, b), c), g)| GemmViews { a, b, alpha: g.alpha, c })
            .collect();
        self.bind(DeviceOp::GroupedGemm(&groups))?.launch()?;
        outputs.iter().map(|c| self.download(c)).collect()
    }
}
