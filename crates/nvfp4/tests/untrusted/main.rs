//! Reading untrusted files under stress. Thousands of damaged versions of valid files (case files
//! of every problem kind in both scale layouts, grouped ones included, outputs, ModelOpt and
//! compressed-tensors checkpoints, a dense file for `quantize_file`) go to every reader, in memory
//! and on disk. Each must return a typed error or a value the oracle confirms from the file's
//! bytes; none may panic or abort, and none may allocate more than the file it reads, however
//! large the sizes its header declares (measured by a counting allocator on the reading thread).
//!
//! Deterministic: the crate's seeded generator draws every mutation; a failure names the source,
//! the round and the mutation.

mod alloc;
mod mutate;
mod oracle;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use nvfp4::io::{
    load_compressed_tensors_weight, load_modelopt_weight, load_output, load_problem, load_weight, output_from_bytes,
    output_to_bytes, problem_from_bytes, problem_to_bytes, quantize_file, stored_problem_kind, weight_from_bytes,
    QuantizeOptions,
};
use nvfp4::problem::{generate, Rng};
use nvfp4::{CpuBackend, Error, Problem, ProblemKind, ScaleLayout, Shape};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use mutate::PREFIX;

#[global_allocator]
static COUNTING: alloc::Counting = alloc::Counting;

/// Damaged versions of each source file.
const ROUNDS: usize = 600;

/// Every this many rounds the damaged file also goes through the readers that open a path.
const DISK_EVERY: usize = 8;

/// Allocations a reader makes whatever the file (parsed header, names, messages), bytes: the
/// bounds below add this to what the file itself justifies.
const SLACK: usize = 16 << 10;

/// One source file to damage.
struct Source {
    label: String,
    bytes: Vec<u8>,
    /// A dense file, also fed to `quantize_file`.
    dense: bool,
}

fn shape(kind: ProblemKind) -> Shape {
    match kind {
        ProblemKind::Gemv => Shape::Gemv { m: 130, k: 96, l: 2 },
        ProblemKind::Gemm => Shape::Gemm { m: 40, n: 130, k: 64, l: 1 },
        ProblemKind::DualGemm => Shape::DualGemm { m: 33, n: 20, k: 64, l: 2 },
        ProblemKind::GroupedGemm => Shape::GroupedGemm { groups: vec![(40, 24, 64), (72, 130, 32), (8, 8, 16)] },
    }
}

/// A problem with an alpha and a global scale on its first operand, so those tensors exist too.
fn decorated(kind: ProblemKind, seed: u64) -> Problem {
    let mut p = generate(&shape(kind), seed).unwrap();
    p.set_alpha(Some(0.5)).unwrap();
    match p {
        Problem::Gemv(mut g) => {
            g.a = g.a.with_global_scale(0.25);
            Problem::Gemv(g)
        }
        Problem::Gemm(mut g) => {
            g.b = g.b.with_global_scale(2.0);
            Problem::Gemm(g)
        }
        Problem::DualGemm(mut d) => {
            d.b2 = d.b2.with_global_scale(0.125);
            Problem::DualGemm(d)
        }
        Problem::GroupedGemm(mut g) => {
            g.groups[1].a = g.groups[1].a.clone().with_global_scale(4.0);
            Problem::GroupedGemm(g)
        }
        Problem::Moe(mut g) => {
            g.b = g.b.with_global_scale(4.0);
            Problem::Moe(g)
        }
    }
}

/// Serializes named raw tensors.
fn file(tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize(views, None).unwrap()
}

fn checkpoint(compressed: bool, rng: &mut Rng) -> Vec<u8> {
    let (n, k) = (48, 128);
    let values: Vec<u8> = (0..n * k / 2).map(|_| rng.below(256) as u8).collect();
    let scales: Vec<u8> = (0..n * k / 16).map(|_| 0x30 + rng.below(16) as u8).collect();
    let (vname, gname, g) = if compressed {
        ("weight_packed", "weight_global_scale", 448.0f32)
    } else {
        ("weight", "weight_scale_2", 1e-3)
    };
    file(&[
        (format!("{PREFIX}{vname}"), Dtype::U8, vec![n, k / 2], values),
        (format!("{PREFIX}weight_scale"), Dtype::F8_E4M3, vec![n, k / 16], scales),
        (format!("{PREFIX}{gname}"), Dtype::F32, vec![], g.to_le_bytes().to_vec()),
        ("model.norm.weight".into(), Dtype::F16, vec![64], vec![0x3C; 128]),
    ])
}

fn dense(rng: &mut Rng) -> Vec<u8> {
    let mut floats = |count: usize| -> Vec<u8> {
        (0..count).flat_map(|_| (rng.below(2000) as f32 / 100.0 - 10.0).to_le_bytes()).collect()
    };
    let (w, p, bias) = (floats(32 * 64), floats(16 * 48), floats(32));
    let half: Vec<u8> = p.chunks_exact(4).flat_map(|c| half::f16::from_le_bytes([c[2], c[3]]).to_le_bytes()).collect();
    file(&[
        ("layer.weight".into(), Dtype::F32, vec![32, 64], w),
        ("layer.proj".into(), Dtype::F16, vec![16, 48], half),
        ("layer.bias".into(), Dtype::F32, vec![32], bias),
    ])
}

fn sources() -> Vec<Source> {
    let mut out = Vec::new();
    let mut rng = Rng::new(0x5eed);
    for kind in ProblemKind::ALL {
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            let p = decorated(kind, 10 + out.len() as u64).with_layout(layout);
            let bytes = problem_to_bytes(&p).unwrap();
            // Without the kind in the metadata, readers of the other kinds get past that check.
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let bare = safetensors::serialize(st.tensors(), None).unwrap();
            out.push(Source { label: format!("{kind} {layout:?}"), bytes, dense: false });
            out.push(Source { label: format!("{kind} {layout:?} without metadata"), bytes: bare, dense: false });
        }
        let o = generate(&shape(kind), 3).unwrap().run(&CpuBackend).unwrap();
        out.push(Source { label: format!("{kind} output"), bytes: output_to_bytes(&o).unwrap(), dense: false });
    }
    out.push(Source { label: "ModelOpt checkpoint".into(), bytes: checkpoint(false, &mut rng), dense: false });
    out.push(Source { label: "compressed-tensors checkpoint".into(), bytes: checkpoint(true, &mut rng), dense: false });
    out.push(Source { label: "dense file".into(), bytes: dense(&mut rng), dense: true });
    out
}

/// Outcomes, for the summary and the test's own sanity checks.
#[derive(Default)]
struct Tally {
    files: usize,
    calls: usize,
    ok: BTreeMap<&'static str, usize>,
    largest_over_file: f64,
}

/// Runs one reader on `file_len` bytes of input and judges the outcome.
fn judge<T>(
    tally: &mut Tally,
    reader: &'static str,
    file_len: usize,
    ctx: &str,
    call: impl FnOnce() -> nvfp4::Result<T>,
    oracle: impl FnOnce(&T) -> Result<(), String>,
) {
    tally.calls += 1;
    let (outcome, usage) = alloc::measure(|| catch_unwind(AssertUnwindSafe(call)));
    let result = outcome.unwrap_or_else(|_| panic!("{reader} panicked on {ctx}"));
    assert!(
        usage.largest <= file_len + SLACK,
        "{reader} allocated {} bytes at once for a file of {file_len} bytes: {ctx}",
        usage.largest
    );
    assert!(
        usage.peak <= 3 * file_len + SLACK,
        "{reader} held {} bytes at once for a file of {file_len} bytes: {ctx}",
        usage.peak
    );
    if file_len >= SLACK {
        tally.largest_over_file = tally.largest_over_file.max(usage.largest as f64 / file_len as f64);
    }
    match result {
        Ok(v) => {
            if let Err(why) = oracle(&v) {
                panic!("{reader} returned a value the file does not support ({why}): {ctx}");
            }
            *tally.ok.entry(reader).or_default() += 1;
        }
        Err(e) => {
            let typed = matches!(
                e,
                Error::File { .. }
                    | Error::Tensor { .. }
                    | Error::Shape(_)
                    | Error::BufferSize { .. }
                    | Error::KNotMultipleOf16 { .. }
                    | Error::Invalid(_)
            );
            assert!(typed, "{reader} failed with {e:?} on {ctx}");
            assert!(!e.to_string().is_empty());
        }
    }
}

/// Every reader that takes bytes.
fn in_memory(tally: &mut Tally, b: &[u8], ctx: &str) {
    for kind in ProblemKind::ALL {
        judge(
            tally,
            "problem_from_bytes",
            b.len(),
            ctx,
            || problem_from_bytes(b, kind),
            |p| oracle::problem(b, kind, p),
        );
        judge(tally, "output_from_bytes", b.len(), ctx, || output_from_bytes(b, kind), |o| oracle::output(b, kind, o));
    }
    for prefix in ["", PREFIX] {
        let check = |(t, c): &(nvfp4::Nvfp4Tensor, _)| oracle::weight(b, prefix, t, *c);
        judge(tally, "weight_from_bytes", b.len(), ctx, || weight_from_bytes(b, prefix), check);
    }
}

/// Every reader that opens a path, on `b` written to `path`.
fn on_disk(tally: &mut Tally, path: &Path, b: &[u8], ctx: &str) {
    std::fs::write(path, b).unwrap();
    let n = b.len();
    for kind in ProblemKind::ALL {
        judge(tally, "load_problem", n, ctx, || load_problem(path, kind), |p| oracle::problem(b, kind, p));
        judge(tally, "load_output", n, ctx, || load_output(path, kind), |o| oracle::output(b, kind, o));
    }
    judge(tally, "stored_problem_kind", n, ctx, || stored_problem_kind(path), |k| oracle::stored_kind(b, *k));
    let weight = |(t, c): &(nvfp4::Nvfp4Tensor, _)| oracle::weight(b, PREFIX, t, *c);
    judge(tally, "load_weight", n, ctx, || load_weight(path, PREFIX), weight);
    let modelopt = |t: &nvfp4::Nvfp4Tensor| oracle::weight(b, PREFIX, t, nvfp4::io::WeightConvention::ModelOpt);
    judge(tally, "load_modelopt_weight", n, ctx, || load_modelopt_weight(path, PREFIX), modelopt);
    let ct = |t: &nvfp4::Nvfp4Tensor| oracle::weight(b, PREFIX, t, nvfp4::io::WeightConvention::CompressedTensors);
    judge(tally, "load_compressed_tensors_weight", n, ctx, || load_compressed_tensors_weight(path, PREFIX), ct);
}

/// `quantize_file` on `b`: an error, or an output file that is a valid container holding every
/// tensor it says it quantized.
fn quantize(tally: &mut Tally, dir: &Path, b: &[u8], ctx: &str) {
    let (input, output) = (dir.join("dense.safetensors"), dir.join("quantized.safetensors"));
    std::fs::write(&input, b).unwrap();
    let _ = std::fs::remove_file(&output);
    let oracle = |s: &nvfp4::io::QuantizeSummary| {
        let out = std::fs::read(&output).map_err(|e| e.to_string())?;
        let st = safetensors::SafeTensors::deserialize(&out).map_err(|e| e.to_string())?;
        for (name, [n, k]) in &s.quantized {
            let v = st.tensor(name).map_err(|e| e.to_string())?;
            if v.dtype() != Dtype::U8 || v.shape() != [*n, k / 2] {
                return Err(format!("`{name}` written as {:?} {:?}", v.dtype(), v.shape()));
            }
        }
        Ok(())
    };
    // The output is at most the input's size plus the scales and names it adds.
    let budget = 2 * b.len();
    judge(tally, "quantize_file", budget, ctx, || quantize_file(&input, &output, QuantizeOptions::default()), oracle);
}

/// Headers whose offsets reach the end of the address space: summing them overflows 64 bits.
fn overflowing_headers() -> Vec<Vec<u8>> {
    let size = (1u64 << 61) - 1; // the largest U8 tensor whose size in bits fits in 64 bits
    let mut out = Vec::new();
    for count in [8u64, 9] {
        let entries: Vec<String> = (0..count)
            .map(|i| {
                let (s, e) = (i * size, (i + 1).saturating_mul(size));
                format!(r#""t{i}":{{"dtype":"U8","shape":[{size}],"data_offsets":[{s},{e}]}}"#)
            })
            .collect();
        let header = format!("{{{}}}", entries.join(","));
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        out.push(b);
    }
    out
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvfp4-untrusted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_reader_survives_damaged_files() {
    let dir = scratch();
    let path = dir.join("damaged.safetensors");
    let mut tally = Tally::default();
    for (i, b) in overflowing_headers().iter().enumerate() {
        let ctx = format!("overflowing header {i}");
        in_memory(&mut tally, b, &ctx);
        on_disk(&mut tally, &path, b, &ctx);
    }
    let mut rng = Rng::new(0xDA4A6E);
    for src in sources() {
        // The undamaged file reads back, so the oracle is exercised on every source.
        in_memory(&mut tally, &src.bytes, &format!("{} undamaged", src.label));
        for round in 0..ROUNDS {
            let (mut b, mut what) = mutate::mutate(&src.bytes, &mut rng);
            if rng.below(4) == 0 {
                let (b2, w2) = mutate::mutate(&b, &mut rng);
                (b, what) = (b2, format!("{what}; then {w2}"));
            }
            let ctx = format!("{} round {round}: {what}", src.label);
            tally.files += 1;
            in_memory(&mut tally, &b, &ctx);
            if round % DISK_EVERY == 0 {
                on_disk(&mut tally, &path, &b, &ctx);
            }
            if src.dense && round % 2 == 0 {
                quantize(&mut tally, &dir, &b, &ctx);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{} damaged files, {} reader calls, largest allocation {:.2}x the file (files over 16 KiB); accepted: {:?}",
        tally.files, tally.calls, tally.largest_over_file, tally.ok
    );
    // Damage that keeps the container valid must sometimes still read, or the oracle never ran.
    for reader in ["problem_from_bytes", "output_from_bytes", "weight_from_bytes", "load_problem", "quantize_file"] {
        assert!(tally.ok.get(reader).copied().unwrap_or(0) > 10, "{reader} accepted almost nothing: {:?}", tally.ok);
    }
}
