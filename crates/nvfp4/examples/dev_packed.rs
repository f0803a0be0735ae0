//! The packed W4A16 weight form (format/w16_pack.rs) against the weight as it is, for kernel work:
//! a dev tool, not a test and not the benchmark (the numbers that count come from the peer bench).
//! Needs an NVIDIA GPU.
//!
//! `dev_packed [MxNxK ...]`: for each shape (W4A16 GEMM, bf16 activations, exact data), checks
//! the packed and the unpacked launches bit-identical to the CPU reference, then times both under
//! SPEC §7's graph protocol (N >= 20 launches captured in one graph over weight sets rotating
//! through more than 3x L2), in A B B A order; prints the routes and µs per launch (medians).

use std::sync::Arc;

use nvfp4::backend::cuda::{BoundOp, CudaBackend, DeviceOp};
use nvfp4::bench::{Graph, Rotation};
use nvfp4::format::PackAct;
use nvfp4::ops::Act;
use nvfp4::problem::Rng;
use nvfp4::{Backend, CpuBackend, Gemm, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};

mod common;
use common::gpu;

const DEFAULT: [&str; 9] = [
    "16x8192x8192",
    "64x8192x8192",
    "128x8192x8192",
    "256x8192x8192",
    "1024x8192x8192",
    "4096x8192x8192",
    "128x7168x16384",
    "128x4096x7168",
    "128x7168x2048",
];

fn weights(rng: &mut Rng, n: usize, k: usize) -> Nvfp4Tensor {
    let values = (0..n * k / 2).map(|_| rng.below(256) as u8).collect();
    let scales = (0..n * k / 16).map(|_| rng.below(4) as u8).collect();
    Nvfp4Tensor::new(1, n, k, values, scales, ScaleLayout::Plain).unwrap()
}

fn activation(rng: &mut Rng, m: usize, k: usize) -> OutTensor {
    let d = OutputDtype::Bf16;
    let bits = (0..m * k).map(|_| d.round_f32((rng.below(5) as f32 - 2.0) * 0.5)).collect();
    OutTensor::new(d, [1, m, k], bits).unwrap()
}

fn time(b: &CudaBackend, ops: &[BoundOp], launches: usize) -> f64 {
    let stream: Arc<_> = b.stream().clone();
    let g = Graph::capture(&stream, launches, |i| ops[i % ops.len()].launch_chained_on_stream(&stream)).unwrap();
    g.time_us(2, 10).unwrap().median()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shapes: Vec<String> = if args.is_empty() { DEFAULT.iter().map(|s| s.to_string()).collect() } else { args };
    let b = gpu();
    let l2 = nvfp4::bench::l2_bytes(b.stream()).unwrap();
    for s in &shapes {
        let d: Vec<usize> = s.split('x').map(|v| v.parse().expect("MxNxK")).collect();
        let (m, n, k) = (d[0], d[1], d[2]);
        let mut rng = Rng::new(1);
        let rot = Rotation::new((n * k / 2 + n * k / 16) as u64, l2);
        let ws: Vec<Nvfp4Tensor> = (0..rot.sets.min(2)).map(|_| weights(&mut rng, n, k)).collect();
        let a = activation(&mut rng, m, k);
        let want =
            CpuBackend.gemm16_as(&Gemm::new(a.clone(), ws[0].clone(), None).unwrap(), OutputDtype::Bf16).unwrap();
        let ad = b.upload_dense(&a).unwrap();
        let c = b.alloc_output_as([1, m, n], OutputDtype::Bf16).unwrap();
        // Every set: the same two weights' data re-uploaded (distinct memory), packed or not.
        let mut plain = Vec::new();
        let mut packed = Vec::new();
        for i in 0..rot.sets {
            let w = &ws[i % ws.len()];
            let wd = b.upload(w).unwrap();
            let pk = b.upload_packed(w, PackAct::Bf16).unwrap();
            let (v, vp) = (wd.view(), wd.view().with_packed(&pk).unwrap());
            plain.push(b.bind(DeviceOp::Gemm { a: Act::Dense(&ad.view()), b: &v, alpha: None, c: &c.view() }).unwrap());
            packed
                .push(b.bind(DeviceOp::Gemm { a: Act::Dense(&ad.view()), b: &vp, alpha: None, c: &c.view() }).unwrap());
        }
        for (name, op) in [("plain", &plain[0]), ("packed", &packed[0])] {
            b.poison(&c).unwrap();
            op.launch().unwrap();
            let got = b.download_out(&c).unwrap();
            let bad = got.bits().iter().zip(want.bits()).filter(|(g, w)| g != w).count();
            assert_eq!(bad, 0, "{s} {name}: {bad} elements differ ({})", op.describe());
        }
        let (a1, p1, p2, a2) = (
            time(&b, &plain, rot.launches),
            time(&b, &packed, rot.launches),
            time(&b, &packed, rot.launches),
            time(&b, &plain, rot.launches),
        );
        let (pl, pk) = ((a1 + a2) / 2.0, (p1 + p2) / 2.0);
        println!(
            "{s:>16}  plain {a1:8.2} {a2:8.2}  packed {p1:8.2} {p2:8.2}  speedup {:.3}  sets {}  [{}]",
            pl / pk,
            rot.sets,
            packed[0].describe()
        );
    }
}
