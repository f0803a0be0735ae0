//! Host cost of one enqueue (issue 24's eager bound): host µs per call of the library's launch
//! paths, `calls` calls back to back then one synchronization, the median of 30 rounds. A dev
//! tool, not the benchmark (`crates/nvfp4-py/scripts/host_cost.py` measures the Python calls).
//! Needs an NVIDIA GPU.
//!
//! `dev_launch_cost [CALLS]` (default 100: the driver's launch queue never fills)
//!
//! Rows: the context scope every Python call enters (`CudaBackend::enter`), the empty kernel,
//! the small GEMM kernel (128x256x256, bound once) alone and inside the scope. The empty
//! kernel's row is the driver's launch alone: the floor under any call that launches a kernel.

use std::time::Instant;

use nvfp4::problem::{generate, Shape};

mod common;
use common::{gpu, median};

const ROUNDS: usize = 30;

fn host_us(b: &nvfp4::backend::cuda::CudaBackend, calls: usize, mut f: impl FnMut()) -> f32 {
    for _ in 0..calls {
        f();
    }
    b.sync().unwrap();
    let mut us: Vec<f32> = (0..ROUNDS)
        .map(|_| {
            b.sync().unwrap();
            let t0 = Instant::now();
            for _ in 0..calls {
                f();
            }
            let dt = t0.elapsed().as_secs_f32() * 1e6 / calls as f32;
            b.sync().unwrap();
            dt
        })
        .collect();
    median(&mut us)
}

fn main() {
    let calls: usize = std::env::args().nth(1).map(|s| s.parse().expect("CALLS")).unwrap_or(100);
    let b = gpu();
    let floors = b.floors().unwrap();
    let p = generate(&Shape::Gemm { m: 128, n: 256, k: 256, l: 1 }, 1).unwrap();
    let mut prep = b.prepare(&p).unwrap();
    println!("plan: {}", prep.describe());
    let rows: [(&str, f32); 4] = [
        ("enter() scope alone", host_us(&b, calls, || drop(b.enter().unwrap()))),
        ("empty kernel", host_us(&b, calls, || floors.launch_empty(false).unwrap())),
        ("small GEMM 128x256x256", host_us(&b, calls, || prep.launch().unwrap())),
        (
            "enter() + small GEMM",
            host_us(&b, calls, || {
                let _s = b.enter().unwrap();
                prep.launch().unwrap()
            }),
        ),
    ];
    for (name, us) in rows {
        println!("{{\"row\": \"{name}\", \"host_us\": {us:.3}, \"calls\": {calls}}}");
    }
}
