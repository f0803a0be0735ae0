//! The weights' packed form (format/w16_pack.rs) on the skeleton's W4A16 GEMM and grouped
//! kernels: every shape of the suite, both activation types and scale layouts, bit-identical on
//! exact data and within tolerance on random data; signed, zero and NaN scales; every tile and
//! K schedule forced; and the route must name the packed kernel (a weight whose packed form is
//! ignored fails). The dual GEMM has no packed kernels: its packed forms are ignored.

use super::*;

/// The route of a packed run names the packed kernels (except the dual GEMM's).
fn check_packed(b: &CudaBackend, w: &W16, out: OutputDtype, rule: Rule, what: &str) -> Vec<OutTensor> {
    let want = w.reference(out);
    let (got, route) = w.run(b, out, None, true);
    let packed_kernel = route.contains("16p_sm90") || route.contains("f16p_sm90");
    assert_eq!(packed_kernel, !matches!(w, W16::Dual(_)), "{what}: route {route}");
    let rule = if matches!(w, W16::Dual(_)) { Rule::Tolerance } else { rule };
    for (launch, outs) in got.iter().enumerate() {
        for (i, (g, x)) in outs.iter().zip(&want).enumerate() {
            let bad = differences(g, x, rule);
            assert!(bad.is_empty(), "{what} ({route}), launch {launch}, output {i}: (index, got, want) {bad:?}");
        }
    }
    println!("ok packed {what}: {route}");
    want
}

/// The skeleton's shapes (no one-row GEMM: the GEMV family takes those).
fn packed_shapes() -> Vec<Shape> {
    shapes().into_iter().filter(|s| !matches!(s, Shape::Gemm { m: 1, .. })).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_exact_data_is_bit_identical() {
    let b = gpu();
    for (i, shape) in packed_shapes().iter().enumerate() {
        for dtype in TYPES {
            for layout in LAYOUTS {
                let w = W16::make(shape, dtype, layout, Data::Exact, 600 + i as u64);
                check_packed(&b, &w, dtype, Rule::Exact, &format!("{shape} {dtype} {layout:?}"));
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_random_data_is_within_tolerance() {
    let b = gpu();
    for (i, shape) in packed_shapes().iter().enumerate() {
        for dtype in TYPES {
            let w = W16::make(shape, dtype, LAYOUTS[i % 2], Data::Random, 700 + i as u64);
            check_packed(&b, &w, dtype, Rule::Tolerance, &format!("random {shape} {dtype}"));
        }
    }
}

/// `t` with each scale's sign bit set where `flip(row, block)`, and one block of zero scale.
fn with_signed_scales(t: &Nvfp4Tensor) -> Nvfp4Tensor {
    let plain = t.to_layout(ScaleLayout::Plain);
    let sf = t.k() / 16;
    let scales: Vec<u8> = plain
        .scales()
        .iter()
        .enumerate()
        .map(|(i, &s)| if (i / sf + i % sf) % 3 == 1 { s | 0x80 } else { s })
        .collect();
    Nvfp4Tensor::new(t.l(), t.rows(), t.k(), plain.values().to_vec(), scales, ScaleLayout::Plain)
        .unwrap()
        .to_layout(t.layout())
}

/// Negative scales (their sign folded into the codes at pack time), zero scales (codes zeroed),
/// and a NaN scale poisoning exactly its outputs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_signed_zero_and_nan_scales() {
    let b = gpu();
    for (i, shape) in packed_shapes().iter().enumerate().filter(|(_, s)| !matches!(s, Shape::DualGemm { .. })) {
        for dtype in TYPES {
            let layout = LAYOUTS[i % 2];
            let signed = match W16::make(shape, dtype, layout, Data::Exact, 800 + i as u64) {
                W16::Gemm(g) => W16::Gemm(Gemm::new(g.a, with_signed_scales(&g.b), g.alpha).unwrap()),
                W16::Moe(m) => W16::Moe(MoeGemm::new(m.a, with_signed_scales(&m.b), m.offsets, m.alpha).unwrap()),
                W16::Grouped(gg) => W16::Grouped(
                    GroupedGemm::new(
                        gg.groups
                            .into_iter()
                            .map(|g| Gemm::new(g.a, with_signed_scales(&g.b), g.alpha).unwrap())
                            .collect(),
                    )
                    .unwrap(),
                ),
                W16::Dual(_) => unreachable!(),
            };
            check_packed(&b, &signed, dtype, Rule::Exact, &format!("signed scales {shape} {dtype}"));
            let nan = plant_nan(signed);
            let want = check_packed(&b, &nan, dtype, Rule::Tolerance, &format!("NaN scale {shape} {dtype}"));
            let nans: usize = want.iter().map(|t| t.to_f32().iter().filter(|v| v.is_nan()).count()).sum();
            let reads = !matches!(shape, Shape::Moe { counts, .. } if counts.last() == Some(&0));
            assert!((nans > 0) == reads, "{shape}: {nans} NaN");
        }
    }
}

/// Every tile and K schedule of the packed kernels, forced.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_every_variant_and_schedule_is_bit_identical() {
    let b = gpu();
    let gemm = Shape::Gemm { m: 200, n: 1100, k: 1056, l: 1 };
    let list = Shape::GroupedGemm { groups: vec![(40, 520, 544), (300, 130, 288)] };
    let moe = Shape::Moe { n: 520, k: 544, counts: vec![40, 0, 300, 9] };
    let tiles = ["m256n16", "m256n32", "m256n64", "m256n128", "m128n128", "m128n256"];
    let schedules = ["m256n64s3", "m128n128sk", "m256n64c2", "m256n32c2sk", "m128n128s2d", "m256n16s4d"];
    let cases: Vec<(Op, &Shape, Vec<&str>)> = vec![
        (Op::Gemm, &gemm, tiles.iter().chain(&schedules).copied().collect()),
        (Op::Grouped, &list, tiles.to_vec()),
        (Op::Grouped, &moe, tiles.to_vec()),
    ];
    for (op, shape, forced) in cases {
        for value in forced {
            for (dtype, layout) in [(OutputDtype::Bf16, ScaleLayout::Blocked), (OutputDtype::F16, ScaleLayout::Plain)] {
                let w = W16::make(shape, dtype, layout, Data::Exact, 9);
                let what = format!("{shape} {dtype} {layout:?} forced {value}");
                with_forced(&b, op, value, |b| check_packed(b, &w, dtype, Rule::Exact, &what));
            }
        }
    }
}
