//! GEMV timing diagnostics for kernel work (a dev tool, not a test and not the benchmark; the
//! numbers that count come from `nvfp4 bench`). Needs an NVIDIA GPU.
//!
//! `dev_gemv_diag timing`      GEMV bench shapes, L2 cold by rotation and by a memset flush
//! `dev_gemv_diag profile`     a few flushed launches per shape, a target for ncu
//! `dev_gemv_diag fixed-cost`  empty kernel and pure streaming reads of the GEMV's byte count
//!                             (the library's floor kernels, kernels/floors.cu, over more grids
//!                             than `nvfp4 bench` tries)
//! `dev_gemv_diag floor`       SPEC §7's cold and graph protocols side by side: launch floor, read
//!                             ceiling, the GEMV as the library launches it, kernel variants with
//!                             and without programmatic dependent launch
//!
//! Every GEMV configuration is checked bit-exactly against the CPU reference before it is timed.

use nvfp4::backend::cuda::dev::DevModule;
use nvfp4::backend::cuda::{CudaBackend, KernelModule, Prepared};
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::format::ScaleLayout;
use nvfp4::problem::{bench_shapes, generate, ProblemKind};
use nvfp4::problem::{Output, Problem};
use nvfp4::CpuBackend;

mod common;
#[path = "dev_gemv_diag/floor.rs"]
mod floor;
use common::{events, gpu, median, median_min, time_memset_flush};

const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("timing") => gemv_timing(),
        Some("profile") => gemv_profile_target(),
        Some("fixed-cost") => gemv_fixed_cost(),
        Some("floor") => floor::gemv_floor(),
        _ => {
            eprintln!("usage: dev_gemv_diag timing|profile|fixed-cost|floor");
            std::process::exit(2);
        }
    }
}

/// Poison, launch, read back: an unwritten element stays NaN and fails the comparison.
fn run_prepared(prep: &mut Prepared) -> Output {
    prep.poison().unwrap();
    prep.launch().unwrap();
    prep.output().unwrap()
}

/// Device-to-device copy bandwidth (bytes read + written per second), the GEMV's ceiling.
fn copy_bandwidth(b: &CudaBackend) -> f64 {
    let s = b.stream();
    let n = 1usize << 30;
    let src = s.alloc_zeros::<u8>(n).unwrap();
    let mut dst = s.alloc_zeros::<u8>(n).unwrap();
    let (e0, e1) = events(b);
    let mut ms = Vec::new();
    for i in 0..12 {
        e0.record(s).unwrap();
        s.memcpy_dtod(&src, &mut dst).unwrap();
        e1.record(s).unwrap();
        let t = e0.elapsed_ms(&e1).unwrap();
        if i >= 2 {
            ms.push(t);
        }
    }
    2.0 * n as f64 / (median(&mut ms) as f64 * 1e-3)
}

/// L2 size of the H100/H200 (50/60 MB): input sets rotate over more than 3x this.
const L2_BYTES: f64 = 60e6;

/// µs of one launch per sample, L2 cold by rotation: `preps` hold identical problems in distinct
/// buffers totalling > 3x L2, launched round-robin, so no sample finds its inputs in L2 and no
/// dirty line of a flush is written back during the sample.
fn time_rotating(b: &CudaBackend, preps: &mut [Prepared], samples: usize) -> (f32, f32) {
    let s = b.stream();
    let (e0, e1) = events(b);
    for p in preps.iter_mut() {
        p.launch().unwrap();
    }
    let n = preps.len();
    let us = (0..samples)
        .map(|i| {
            e0.record(s).unwrap();
            preps[i % n].launch().unwrap();
            e1.record(s).unwrap();
            e0.elapsed_ms(&e1).unwrap() * 1e3
        })
        .collect();
    median_min(us)
}

/// Times the GEMV benchmark shapes (both layouts) against the copy ceiling,
/// L2 cold by rotating input sets and, for comparison, by a memset flush. Each configuration is
/// checked bit-exactly before it is timed.
fn gemv_timing() {
    let b = gpu();
    let bw = copy_bandwidth(&b);
    println!("device {} ({} SMs), copy bandwidth {:.3} TB/s", b.device_name(), b.sm_count(), bw / 1e12);
    let mut rows = Vec::new();
    for (i, shape) in bench_shapes(ProblemKind::Gemv).iter().enumerate() {
        let base = generate(shape, 500 + i as u64).unwrap();
        let reference = base.run(&CpuBackend).unwrap();
        for layout in LAYOUTS {
            let p = base.with_layout(layout);
            let bytes = p.bytes() as f64;
            let sets = (3.0 * L2_BYTES / bytes).ceil() as usize + 1;
            {
                let mut preps: Vec<Prepared> = (0..sets).map(|_| b.prepare(&p).unwrap()).collect();
                let report = compare_outputs(&run_prepared(&mut preps[0]), &reference, Mode::BitExact);
                assert!(report.passed(), "gemv {shape} {layout:?}: {report}");
                let (med, min) = time_rotating(&b, &mut preps, 60);
                let (fmed, _) = time_memset_flush(&b, &mut preps[0], 30);
                let floor = bytes / bw * 1e6;
                rows.push(format!(
                    "{:<14} {:<8} {:>7.2} us (min {:>6.2}) {:>6.3} TB/s {:>5.1}% of copy, floor {:>6.2} us | \
                     memset-flushed {:>6.2} us | {}",
                    shape.to_string(),
                    format!("{layout:?}"),
                    med,
                    min,
                    bytes / (med as f64 * 1e-6) / 1e12,
                    100.0 * floor / med as f64,
                    floor,
                    fmed,
                    preps[0].describe()
                ));
                println!("{}", rows.last().unwrap());
            }
        }
    }
    println!("\nGEMV timing summary (L2 cold by rotating input sets, median of 60; copy {:.3} TB/s):", bw / 1e12);
    for r in rows {
        println!("{r}");
    }
}

/// Launches each GEMV benchmark shape a few times behind an L2 flush, nothing else: a target for
/// `ncu -k regex:gemv gpu-bin/test-cuda --ignored gemv_profile_target`.
fn gemv_profile_target() {
    let b = gpu();
    let s = b.stream();
    let mut flush = s.alloc_zeros::<u8>(512 << 20).unwrap();
    for (i, shape) in bench_shapes(ProblemKind::Gemv).iter().enumerate() {
        let mut prep = b.prepare(&generate(shape, 600 + i as u64).unwrap()).unwrap();
        println!("{shape}: {}", prep.describe());
        for _ in 0..3 {
            s.memset_zeros(&mut flush).unwrap();
            prep.launch().unwrap();
        }
        prep.output().unwrap();
    }
}

// ---- fixed-cost diagnostic ---------------------------------------------------------------------

/// Diagnostic kernels: a pure streaming read (sum of every 16 B word, one f32 per CTA),
/// grid-strided (`i`, loads interleaved over the buffer) or contiguous per CTA (`c`), U loads in
/// flight per thread, with the GEMV's load flavour (`ef`: nc, L1::no_allocate, L2 evict_first,
/// 256 B prefetch) or a plain nc load (`nc`). They take the library's `FloorReadParams` (from
/// generated.cuh), so that the library launches them as it launches its own reads.
const DIAG_SOURCE: &str = r#"
#include "generated.cuh"
template <int U, bool EF>
__device__ __forceinline__ uint4 ld(const uint4* p, u64 pol) { return EF ? ptx::ld_stream_v4(p, pol) : ptx::ld_nc_v4(p); }
__device__ __forceinline__ void finish(u32 acc, float* out) {
  __shared__ u32 s;
  if (threadIdx.x == 0) s = 0;
  __syncthreads();
  for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (threadIdx.x % 32 == 0) atomicAdd(&s, acc);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = (float)s;
}
template <int U, bool EF>
__device__ void read_i(const uint4* p, u64 n, float* out) {
  const u64 pol = ptx::policy_evict_first();
  const u64 stride = (u64)gridDim.x * blockDim.x;
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u32 acc = 0;
  // NOTE: the unrolled loop's bound is rounded down to whole warps, so no warp splits between
  // it (and its __syncwarp) and the tail: a split warp with n % 32 != 0 deadlocked (the earlier
  // "timed-out" sweeps) at __syncwarp against the other lanes' __shfl_xor_sync.
  const u64 n_main = n & ~(u64)31;
  for (; i + (U - 1) * stride < n_main; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld<U, EF>(p + i + u * stride, pol);
    __syncwarp();  // keeps ptxas from interleaving the adds with the loads (U loads in flight)
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  for (; i < n; i += stride) { uint4 v = ld<U, EF>(p + i, pol); acc += v.x + v.y + v.z + v.w; }
  finish(acc, out);
}
template <int U, bool EF>
__device__ void read_c(const uint4* p, u64 n, float* out) {
  const u64 pol = ptx::policy_evict_first();
  const u64 per = (n + 32 * gridDim.x - 1) / (32 * gridDim.x) * 32;  // whole warps (see read_i)
  const u64 b0 = blockIdx.x * per, b1 = min(n, b0 + per);
  u64 i = b0 + threadIdx.x;
  const u64 stride = blockDim.x;
  u32 acc = 0;
  const u64 b1_main = b1 & ~(u64)31;
  for (; i + (U - 1) * stride < b1_main; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld<U, EF>(p + i + u * stride, pol);
    __syncwarp();  // keeps ptxas from interleaving the adds with the loads (U loads in flight)
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  for (; i < b1; i += stride) { uint4 v = ld<U, EF>(p + i, pol); acc += v.x + v.y + v.z + v.w; }
  finish(acc, out);
}
#define K(name, f, U, EF) extern "C" __global__ void __launch_bounds__(1024, 1) name(const __grid_constant__ FloorReadParams p) { f<U, EF>((const uint4*)p.src, p.words, (float*)p.out); }
K(diag_i4_ef, read_i, 4, true) K(diag_i8_ef, read_i, 8, true) K(diag_i4_nc, read_i, 4, false)
K(diag_i8_nc, read_i, 8, false) K(diag_c4_ef, read_c, 4, true) K(diag_c8_ef, read_c, 8, true)
"#;

const DIAG_MODULE: KernelModule = KernelModule { file: "diag.cu", source: DIAG_SOURCE, symbols: &[] };

/// Compiles and loads a diagnostic module: a variant of kernels/gemv.cu or [`DIAG_SOURCE`].
fn load_diag(b: &CudaBackend, module: &KernelModule) -> DevModule {
    // SAFETY: every module compiled here is kernels/gemv.cu with other defines or lines left out
    // (its kernels, taken with `gemv`, keep their `GemvParams`) or DIAG_SOURCE (its reads, taken
    // with `read`, take `FloorReadParams`).
    let (loaded, log) = unsafe { b.dev_module(module) }.unwrap_or_else(|e| panic!("{}: {e}", module.file));
    if !log.trim().is_empty() {
        println!("{}: {log}", module.file);
    }
    loaded
}

/// Median µs of `launch(i)` for sample i, every sample enqueued before one synchronisation (the
/// harness method); `flush` enqueues the harness's L2 flush before each sample.
fn time_enqueued(
    b: &CudaBackend,
    flush: Option<&nvfp4::bench::Timer>,
    samples: usize,
    mut launch: impl FnMut(usize),
) -> f64 {
    let s = b.stream();
    for i in 0..3 {
        launch(i);
    }
    s.synchronize().unwrap();
    let ev: Vec<_> = (0..samples).map(|_| events(b)).collect();
    for (i, (e0, e1)) in ev.iter().enumerate() {
        if let Some(t) = flush {
            t.flush_l2().unwrap();
        }
        e0.record(s).unwrap();
        launch(i);
        e1.record(s).unwrap();
    }
    s.synchronize().unwrap();
    let mut us: Vec<f32> = ev.iter().map(|(e0, e1)| e0.elapsed_ms(e1).unwrap() * 1e3).collect();
    median(&mut us) as f64
}

/// Where the GEMV's fixed cost goes (SPEC §7 harness: 4x L2 memset flush, events, median of 30):
/// (a) an empty kernel, (b) the best pure streaming read of the GEMV's byte count (several
/// grids, flavours), (c) the GEMV as `nvfp4 bench` runs it, plus GEMV variants compiled here.
/// `NVFP4_DIAG_OLD_GEMV` may name a previous gemv.cu to time beside the current one.
fn gemv_fixed_cost() {
    use nvfp4::backend::cuda::{GemvConfig, GemvForm as Form, ReadKernel, ReadSetting};
    use nvfp4::bench::Timer;

    const SAMPLES: usize = 30;
    let b = gpu();
    let s = b.stream().clone();
    let timer = Timer::new(s.clone()).unwrap();
    let (copy_tbps, _) = nvfp4::bench::ceilings::measure_copy(&timer).unwrap();
    let sms = b.sm_count() as usize;
    println!("device {} ({sms} SMs), L2 {} MB, copy {copy_tbps:.3} TB/s", b.device_name(), timer.l2_bytes() >> 20);

    // The library's floor kernels (kernels/floors.cu), what `nvfp4 bench` measures floors with.
    let floors = b.floors().unwrap();
    let t_empty = time_enqueued(&b, Some(&timer), SAMPLES, |_| floors.launch_empty(false).unwrap());
    let t_empty_noflush = time_enqueued(&b, None, SAMPLES, |_| floors.launch_empty(false).unwrap());
    println!("(a) empty kernel: {t_empty:.2} us (1x32), no flush {t_empty_noflush:.2} us");

    // GEMV variants compiled here: the current source at both pipeline depths, and an older one.
    let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
    let current = include_str!("../kernels/gemv.cu");
    let mut variants: Vec<(String, DevModule)> = Vec::new();
    for depth in [1, 2] {
        let m = KernelModule {
            file: "gemv.cu",
            source: leak(format!("#define GEMV_DEPTH {depth}\n{current}")),
            symbols: &[],
        };
        variants.push((format!("new-d{depth}"), load_diag(&b, &m)));
    }
    if let Ok(path) = std::env::var("NVFP4_DIAG_OLD_GEMV") {
        let m = KernelModule { file: "gemv.cu", source: leak(std::fs::read_to_string(&path).unwrap()), symbols: &[] };
        variants.push(("old".into(), load_diag(&b, &m)));
    }

    let reads = [ReadKernel::Strided4, ReadKernel::Strided8, ReadKernel::Contiguous8];
    let grids = [(256, 2), (256, 4), (256, 8), (512, 2), (512, 4), (1024, 1), (1024, 2)];
    let mut table = Vec::new();
    for (si, shape) in bench_shapes(ProblemKind::Gemv).iter().enumerate() {
        let p = generate(shape, 500 + si as u64).unwrap();
        let reference = p.run(&CpuBackend).unwrap();
        let bytes = p.bytes() as usize;
        let floor = bytes as f64 / (copy_tbps * 1e6);
        // (b) streaming reads of the same byte count (the library's read kernels).
        let sets = (3 * timer.l2_bytes()).div_ceil(bytes) + 1;
        let bufs: Vec<_> = (0..sets).map(|_| floors.source(bytes).unwrap()).collect();
        let sums = floors.sums().unwrap();
        let mut best: Option<(f64, ReadSetting)> = None;
        for kernel in reads {
            for (threads, ctas_per_sm) in grids {
                let setting = ReadSetting { kernel, ctas_per_sm, threads };
                let t = time_enqueued(&b, Some(&timer), SAMPLES, |_| {
                    floors.launch_read(setting, &bufs[0], &sums, false).unwrap()
                });
                println!("  {shape} read {setting}: {t:.2} us");
                if best.is_none_or(|(bt, _)| t < bt) {
                    best = Some((t, setting));
                }
            }
        }
        let (best_us, best_setting) = best.unwrap();
        let read_rot = time_enqueued(&b, None, SAMPLES, |i| {
            floors.launch_read(best_setting, &bufs[i % sets], &sums, false).unwrap()
        });
        drop(bufs);

        // (c) the GEMV as the bench runs it, then by rotation (no dirty lines in L2).
        let mut preps: Vec<Prepared> = (0..sets).map(|_| b.prepare(&p).unwrap()).collect();
        let report = compare_outputs(&run_prepared(&mut preps[0]), &reference, Mode::BitExact);
        assert!(report.passed(), "gemv {shape}: {report}");
        let gemv = time_enqueued(&b, Some(&timer), SAMPLES, |_| preps[0].launch().unwrap());
        let gemv_rot = time_enqueued(&b, None, SAMPLES, |i| preps[i % sets].launch().unwrap());
        let desc = preps[0].describe();
        drop(preps);

        // Variants: same data, configurations from the production heuristic and a
        // non-persistent one (one tile per CTA, split so that >= 3 CTAs per slot).
        let Problem::Gemv(g) = &p else { unreachable!() };
        let (m, k, l) = g.mkl();
        let (a_dev, b_dev) = (b.upload(&g.a).unwrap(), b.upload(&g.b).unwrap());
        let mut vrows = Vec::new();
        for (vname, module) in &variants {
            let (symbol, _) = nvfp4::backend::cuda::gemv::variant(k, g.a.layout(), nvfp4::OutputDtype::F16);
            let kernel = module.gemv(symbol).unwrap();
            let base =
                GemvConfig::choose(Form::Gemv, (m, k, l), g.a.layout(), nvfp4::OutputDtype::F16, sms, |_, smem| {
                    kernel.ctas_per_sm(smem).unwrap()
                });
            let mut np = base.clone();
            let slots = sms * base.tiling.ctas_per_sm;
            let mut split = 1;
            while np.tiling.row_ctas * l * split < 3 * slots && split < np.tiling.ksteps {
                split *= 2;
            }
            np.tiling.ksteps_per_slice = np.tiling.ksteps.div_ceil(split);
            np.tiling.split = np.tiling.ksteps.div_ceil(np.tiling.ksteps_per_slice);
            np.tiling.window_ksteps = np.tiling.ksteps_per_slice.min(base.tiling.window_ksteps.max(1));
            np.tiling.smem_bytes = np.tiling.window_ksteps * 32 * np.chunk.smem_per_chunk();
            np.tiling.tiles = np.tiling.row_ctas * l * np.tiling.split;
            np.tiling.tiles_per_cta = 1;
            np.tiling.grid = np.tiling.tiles;
            for (cname, c) in [("heuristic", &base), ("one-tile", &np)] {
                let out = b.alloc_output([l, m, 1]).unwrap();
                b.poison(&out).unwrap();
                let bound = kernel.bind(c.clone(), (&a_dev.view(), &b_dev.view()), g.alpha, &out.view()).unwrap();
                let launch = |_: usize| bound.launch(false).unwrap();
                launch(0);
                let got = b.download(&out).unwrap();
                let ok = compare_outputs(&nvfp4::problem::Output::Single(got), &reference, Mode::BitExact).passed();
                let t = time_enqueued(&b, Some(&timer), SAMPLES, launch);
                let line = if ok {
                    format!(
                        "{vname}/{cname}: {t:.2} us ({:.1}%) grid {} split {} tiles/CTA {}",
                        100.0 * floor / t,
                        c.tiling.grid,
                        c.tiling.split,
                        c.tiling.tiles_per_cta
                    )
                } else {
                    format!("{vname}/{cname}: FAILED bit-exact check (time withheld)")
                };
                println!("  {shape} variant {line}");
                vrows.push(line);
            }
        }
        table.push(format!(
            "{:<13} {:>7.1} MB floor {:>6.2} | empty {:>5.2} | read {:>6.2} ({:.1}%, {}) rot {:>6.2} | gemv {:>6.2} \
             ({:.1}%) rot {:>6.2} | {desc}\n      {}",
            shape.to_string(),
            bytes as f64 / 1e6,
            floor,
            t_empty,
            best_us,
            100.0 * floor / best_us,
            best_setting,
            read_rot,
            gemv,
            100.0 * floor / gemv,
            gemv_rot,
            vrows.join("\n      ")
        ));
    }
    println!("\nGEMV fixed-cost table (us, median of {SAMPLES}; 4x L2 memset flush before each sample unless 'rot'");
    println!("= rotating clean input sets; floor = bytes / copy {copy_tbps:.3} TB/s; % = floor / time):");
    for r in table {
        println!("{r}");
    }
}
