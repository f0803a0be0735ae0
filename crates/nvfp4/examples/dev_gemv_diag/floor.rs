//! `dev_gemv_diag floor`: the GEMV bench shapes under SPEC §7's two protocols, in one run.
//!
//! Cold: a 4x L2 memset flush before each sample, events around one launch, median of 30 (the
//! bench's `Timer`). Graph: 24 launches over rotating input sets (> 3x L2 in all) captured in one
//! CUDA graph, median of 9 replays, µs per launch. For each shape: the empty kernel, the best pure
//! streaming read of exactly the row's bytes (the read ceiling), the GEMV as the library launches
//! it (`Prepared`, PDL attribute per its config), and GEMV variants compiled here, each with and
//! without the PDL attribute. Every variant is checked bit-exactly before it is timed, and every
//! output of the PDL graph after it ran (poisoned before).
//!
//! Variants: `NVFP4_DIAG_GEMV_VARIANTS="name:DEF=V,DEF=V;name2:..."` compiles the GEMV source (the
//! embedded one, or the file `NVFP4_DIAG_GEMV_SOURCE`) with those `#define`s in front; `cur` (no
//! defines) is always timed, and `old` when `NVFP4_DIAG_OLD_GEMV` names another gemv.cu.

use nvfp4::backend::cuda::dev::{with_values_from, DevGemvLaunch, DevModule};
use nvfp4::backend::cuda::{CudaBackend, DeviceF16, GemvConfig, GemvForm as Form, KernelModule, Prepared};
use nvfp4::bench::Timer;
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::problem::{bench_shapes, generate, Output, Problem, ProblemKind};
use nvfp4::{Backend, CpuBackend, F16Tensor};

use super::common::graph::time_graph;
use super::{gpu, load_diag, run_prepared, time_enqueued, DIAG_MODULE};

const SAMPLES: usize = 30;
const LAUNCHES: usize = 24;
const REPLAYS: usize = 9;

/// The GEMV source with `defines` in front, only the plain 16 B kernel kept (the bench shapes'
/// variant; a quarter of the compile time).
fn variant_module(source: &str, defines: &str) -> KernelModule {
    let mut text = String::new();
    for d in defines.split(',').filter(|d| !d.is_empty()) {
        let (name, value) = d.split_once('=').unwrap_or((d, "1"));
        text += &format!("#define {name} {value}\n");
    }
    for line in source.lines() {
        if line.starts_with("GEMV_KERNEL(") && !line.starts_with("GEMV_KERNEL(gemv_nvfp4_sm90_plain,") {
            continue;
        }
        text += line;
        text += "\n";
    }
    KernelModule { file: "gemv.cu", source: Box::leak(text.into_boxed_str()), symbols: &[] }
}

fn gemv_source() -> String {
    match std::env::var("NVFP4_DIAG_GEMV_SOURCE") {
        Ok(path) => std::fs::read_to_string(path).unwrap(),
        Err(_) => include_str!("../../kernels/gemv.cu").to_string(),
    }
}

fn variants(b: &CudaBackend) -> Vec<(String, DevModule)> {
    let source = gemv_source();
    let mut list = vec![("cur".to_string(), String::new())];
    if let Ok(spec) = std::env::var("NVFP4_DIAG_GEMV_VARIANTS") {
        for v in spec.split(';').filter(|v| !v.is_empty()) {
            let (name, defines) = v.split_once(':').unwrap_or((v, ""));
            list.push((name.to_string(), defines.to_string()));
        }
    }
    let mut out: Vec<_> = list
        .into_iter()
        .map(|(name, defines)| {
            let t = std::time::Instant::now();
            let m = load_diag(b, &variant_module(&source, &defines));
            println!("compiled variant {name} [{defines}] in {:.1} s", t.elapsed().as_secs_f64());
            (name, m)
        })
        .collect();
    if let Ok(path) = std::env::var("NVFP4_DIAG_OLD_GEMV") {
        out.push(("old".into(), load_diag(b, &variant_module(&std::fs::read_to_string(path).unwrap(), ""))));
    }
    out
}

/// One input set of a variant: the launch (holding its operands and workspace) and its output,
/// in buffers of their own.
struct Set {
    launch: DevGemvLaunch,
    c: DeviceF16,
}

fn bit_exact(got: F16Tensor, reference: &Output) -> bool {
    compare_outputs(&Output::Single(got), reference, Mode::BitExact).passed()
}

pub fn gemv_floor() {
    let t0 = std::time::Instant::now();
    let step = |what: &str| eprintln!("[{:6.1} s] {what}", t0.elapsed().as_secs_f64());
    let b = gpu();
    let s = b.stream().clone();
    let timer = Timer::new(s.clone()).unwrap();
    let (copy_tbps, _) = nvfp4::bench::ceilings::measure_copy(&timer).unwrap();
    let sms = b.sm_count() as usize;
    println!("device {} ({sms} SMs), L2 {} MB, copy {copy_tbps:.3} TB/s", b.device_name(), timer.l2_bytes() >> 20);
    let diag = load_diag(&b, &DIAG_MODULE);
    step("PDL dependency check");
    let mut table = pdl_dependency_check(&b, &gemv_source());
    step("variants");
    let vars = variants(&b);

    // The empty kernel and the read buffers are the library's floor kernels' (kernels/floors.cu).
    let floors = b.floors().unwrap();
    let empty_cold = time_enqueued(&b, Some(&timer), SAMPLES, |_| floors.launch_empty(false).unwrap());
    let empty_graph = time_graph(&b, LAUNCHES, REPLAYS, |_| floors.launch_empty(false).unwrap());
    let empty_pdl = time_graph(&b, LAUNCHES, REPLAYS, |_| floors.launch_empty(true).unwrap());
    table.push(format!(
        "empty kernel: cold {empty_cold:.2} us, graph {empty_graph:.2} us/launch, graph+PDL {empty_pdl:.2} us/launch"
    ));
    println!("{}", table.last().unwrap());

    let reads = ["diag_i4_ef", "diag_i8_ef", "diag_c4_ef", "diag_c8_ef"];
    let grids = [(256, 2), (256, 4), (512, 2), (512, 4), (1024, 1), (1024, 2)];
    for (si, shape) in bench_shapes(ProblemKind::Gemv).iter().enumerate() {
        step(&format!("{shape}: generating"));
        let p = generate(shape, 500 + si as u64).unwrap();
        let reference = p.run(&CpuBackend).unwrap();
        step("reference done, read sweep");
        let bytes = p.bytes() as usize;
        let copy_us = bytes as f64 / (copy_tbps * 1e6);
        let sets = (3 * timer.l2_bytes()).div_ceil(bytes) + 1;
        let pct = |t: f64, base: f64| 100.0 * base / t;

        // Read ceiling: exactly the row's bytes, best grid/flavour cold, that one in a graph.
        let srcs: Vec<_> = (0..sets).map(|_| floors.source(bytes).unwrap()).collect();
        let sums = floors.sums().unwrap();
        let mut best = (f64::INFINITY, String::new(), "", 0u32, 0u32);
        for name in reads {
            let f = diag.read(name).unwrap();
            for (threads, per_sm) in grids {
                let grid = (sms * per_sm) as u32;
                let t = time_enqueued(&b, Some(&timer), SAMPLES, |_| f.launch(grid, threads, &srcs[0], &sums).unwrap());
                if t < best.0 {
                    best = (t, format!("{name} {grid}x{threads}"), name, grid, threads);
                }
            }
        }
        let f = diag.read(best.2).unwrap();
        step("read graph");
        let read_graph =
            time_graph(&b, LAUNCHES, REPLAYS, |i| f.launch(best.3, best.4, &srcs[i % sets], &sums).unwrap());
        drop(srcs);
        let read_cold = best.0;
        let head = format!(
            "{shape} ({:.1} MB, {sets} sets): copy {copy_us:.2} us | read ceiling cold {read_cold:.2} ({}) graph {read_graph:.2} \
             ({:.1}% of copy)",
            bytes as f64 / 1e6,
            best.1,
            pct(read_graph, copy_us)
        );
        println!("{head}");
        table.push(head);

        // The GEMV as the library launches it.
        step("library GEMV");
        {
            let mut preps: Vec<Prepared> = (0..sets).map(|_| b.prepare(&p).unwrap()).collect();
            let report = compare_outputs(&run_prepared(&mut preps[0]), &reference, Mode::BitExact);
            assert!(report.passed(), "gemv {shape}: {report}");
            let cold = time_enqueued(&b, Some(&timer), SAMPLES, |_| preps[0].launch().unwrap());
            for prep in preps.iter_mut() {
                prep.poison().unwrap();
            }
            let graph = time_graph(&b, LAUNCHES, REPLAYS, |i| preps[i % sets].launch().unwrap());
            let ok =
                preps.iter().all(|prep| compare_outputs(&prep.output().unwrap(), &reference, Mode::BitExact).passed());
            let line = format!(
                "  library: cold {cold:.2} ({:.1}% of read) | graph {graph:.2} ({:.1}% of copy){} | {}",
                pct(cold, read_cold),
                pct(graph, copy_us),
                if ok { "" } else { " GRAPH OUTPUT WRONG" },
                preps[0].describe()
            );
            println!("{line}");
            table.push(line);
        }

        // Variants, launched as the library launches its GEMV, over `sets` input sets.
        let Problem::Gemv(g) = &p else { unreachable!() };
        let (m, k, l) = g.mkl();
        for (vname, module) in &vars {
            let (symbol, _) = nvfp4::backend::cuda::gemv::variant(k, g.a.layout(), nvfp4::OutputDtype::F16);
            let kernel = module.gemv(symbol).unwrap();
            let c = GemvConfig::choose(Form::Gemv, (m, k, l), g.a.layout(), nvfp4::OutputDtype::F16, sms, |_, smem| {
                kernel.ctas_per_sm(smem).unwrap()
            });
            let mk_set = || {
                let (a, x) = (b.upload(&g.a).unwrap(), b.upload(&g.b).unwrap());
                let out = b.alloc_output([l, m, 1]).unwrap();
                b.poison(&out).unwrap();
                let launch = kernel.bind(c.clone(), (&a.view(), &x.view()), g.alpha, &out.view()).unwrap();
                Set { launch, c: out }
            };
            step(&format!("variant {vname}"));
            let vsets: Vec<Set> = (0..sets).map(|_| mk_set()).collect();
            let launch = |set: &Set, pdl: bool| set.launch.launch(pdl).unwrap();
            launch(&vsets[0], false);
            if !bit_exact(b.download(&vsets[0].c).unwrap(), &reference) {
                let line = format!("  {vname}: FAILED the bit-exact check (not timed)");
                println!("{line}");
                table.push(line);
                continue;
            }
            let cold_pdl = time_enqueued(&b, Some(&timer), SAMPLES, |_| launch(&vsets[0], true));
            let cold = time_enqueued(&b, Some(&timer), SAMPLES, |_| launch(&vsets[0], false));
            let nopdl = time_graph(&b, LAUNCHES, REPLAYS, |i| launch(&vsets[i % sets], false));
            for set in &vsets {
                b.poison(&set.c).unwrap();
            }
            let pdl = time_graph(&b, LAUNCHES, REPLAYS, |i| launch(&vsets[i % sets], true));
            let ok = vsets.iter().all(|set| bit_exact(b.download(&set.c).unwrap(), &reference));
            let line = format!(
                "  {vname}: cold {cold:.2} ({:.1}% of read), +PDL attr {cold_pdl:.2} | graph {nopdl:.2} ({:.1}% of copy), \
                 +PDL {pdl:.2} ({:.1}%){}",
                pct(cold, read_cold),
                pct(nopdl, copy_us),
                pct(pdl, copy_us),
                if ok { "" } else { " PDL GRAPH OUTPUT WRONG" }
            );
            println!("{line}");
            table.push(line);
        }
    }
    println!("\nGEMV floor table (us; cold: 4x L2 flush + events, median of {SAMPLES}; graph: {LAUNCHES} launches");
    println!("per graph over rotating sets, median of {REPLAYS} replays / {LAUNCHES}; copy {copy_tbps:.3} TB/s):");
    for r in table {
        println!("{r}");
    }
}

/// PDL dependency check: GEMV 1 (8192 x 32768, ~35 µs) writes its f16 output into the buffer that GEMV 2
/// (256 x 32768, launched with the PDL attribute right behind it) reads as its packed B values,
/// poisoned before each of `REPS` chains. GEMV 2 must wait for GEMV 1's writes: `module`
/// passes every chain bit-exactly; the same source with its `griddepcontrol.wait` removed
/// (`nowait`) must fail, which shows that the check can fail.
pub fn pdl_dependency_check(b: &CudaBackend, source: &str) -> Vec<String> {
    use nvfp4::format::{Nvfp4Tensor, ScaleLayout};
    use nvfp4::problem::Shape;
    const REPS: usize = 5;
    let sms = b.sm_count() as usize;
    let nowait: String =
        source.lines().filter(|l| l.trim() != "ptx::wait_prerequisites();").map(|l| format!("{l}\n")).collect();
    assert!(nowait.len() < source.len(), "gemv.cu: no griddepcontrol.wait line to remove");
    let modules =
        [("cur", load_diag(b, &variant_module(source, ""))), ("nowait", load_diag(b, &variant_module(&nowait, "")))];

    let (m1, k1, m2) = (8192usize, 32768usize, 256usize);
    let k2 = 4 * m1; // B2's K/2 bytes are GEMV 1's M f16 outputs
    let Problem::Gemv(g1) = generate(&Shape::Gemv { m: m1, k: k1, l: 1 }, 71).unwrap() else { unreachable!() };
    let Problem::Gemv(g2) = generate(&Shape::Gemv { m: m2, k: k2, l: 1 }, 72).unwrap() else { unreachable!() };
    let c1_ref = CpuBackend.gemv(&g1).unwrap();
    let c1_bytes: Vec<u8> = c1_ref.data().iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
    let b2 = Nvfp4Tensor::new(1, 1, k2, c1_bytes, g2.b.scales().to_vec(), ScaleLayout::Plain).unwrap();
    let g2 = nvfp4::Gemv::new(g2.a.clone(), b2, None).unwrap();
    let c2_ref = Output::Single(CpuBackend.gemv(&g2).unwrap());

    let up = |t: &Nvfp4Tensor| b.upload(t).unwrap().view();
    let (a1, b1, a2) = (up(&g1.a), up(&g1.b), up(&g2.a));
    let shared = b.alloc_output([1, m1, 1]).unwrap(); // GEMV 1's c, GEMV 2's packed B
    let c2 = b.alloc_output([1, m2, 1]).unwrap();
    // B2's scales, its values read from `shared`.
    let b2 = with_values_from(up(&g2.b), &shared.view()).unwrap();

    let mut lines = Vec::new();
    for (name, module) in &modules {
        let kernel = module.gemv("gemv_nvfp4_sm90_plain").unwrap();
        let occ = |_: &'static str, smem: usize| kernel.ctas_per_sm(smem).unwrap();
        let cfg1 = GemvConfig::choose(Form::Gemv, (m1, k1, 1), ScaleLayout::Plain, nvfp4::OutputDtype::F16, sms, occ);
        let cfg2 = GemvConfig::choose(Form::Gemv, (m2, k2, 1), ScaleLayout::Plain, nvfp4::OutputDtype::F16, sms, occ);
        assert!(cfg1.tiling.split == 1, "GEMV 1 must need no workspace: {cfg1}");
        let gemv1 = kernel.bind(cfg1.clone(), (&a1, &b1), g1.alpha, &shared.view()).unwrap();
        // Each bound GEMV has a workspace of its own: the two kernels never share one.
        let gemv2 = kernel.bind(cfg2.clone(), (&a2, &b2), g2.alpha, &c2.view()).unwrap();
        let mut good = 0;
        for _ in 0..REPS {
            b.poison(&shared).unwrap();
            gemv1.launch(false).unwrap();
            gemv2.launch(true).unwrap();
            if bit_exact(b.download(&c2).unwrap(), &c2_ref) {
                good += 1;
            }
        }
        lines.push(format!(
            "PDL dependency check, {name}: {good}/{REPS} chains bit-exact (GEMV 1 grid {}, GEMV 2 grid {} split {})",
            cfg1.tiling.grid, cfg2.tiling.grid, cfg2.tiling.split
        ));
        println!("{}", lines.last().unwrap());
    }
    lines
}
