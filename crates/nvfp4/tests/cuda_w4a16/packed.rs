//! The weights' packed form (format/w16_pack.rs) on the skeleton's W4A16 GEMM and grouped
//! kernels: every shape of the suite, both activation types and scale layouts, bit-identical on
//! exact data and within tolerance on random data; signed, zero and NaN scales; every tile and
//! K schedule forced; the dual GEMM with its pair packed together; the route must name the packed
//! kernel (a weight whose packed form is ignored fails); the device's packed bytes equal the
//! host's (format/w16_pack.rs).

use super::*;

/// The route of a packed run names the packed kernels (and, when `what` says a variant was
/// forced, that variant's).
fn check_packed(b: &CudaBackend, w: &W16, out: OutputDtype, rule: Rule, what: &str) -> Vec<OutTensor> {
    let want = w.reference(out);
    let (got, route) = w.run(b, out, None, true);
    assert!(route.contains("16p_sm90"), "{what}: route {route}");
    if let Some(forced) = what.split("forced ").nth(1) {
        // The tile of a forced value such as m256n64s3: up to the digits after its 'n'.
        let n = forced.find('n').expect("a tile");
        let end = n + 1 + forced[n + 1..].find(|c: char| !c.is_ascii_digit()).unwrap_or(forced.len() - n - 1);
        let tile = &forced[..end];
        assert!(route.contains(&format!("p_sm90_ws_{tile}")), "{what}: not the forced {tile}: {route}");
    }
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

/// The skeleton's shapes (no GEMM of up to 8 rows and no decode routing: the W4A16 GEMV
/// families take those, from the weights as they are), and a dual GEMM whose N is not a
/// multiple of 8 (the pair's last 16 packed rows half past B1's and B2's rows).
fn packed_shapes() -> Vec<Shape> {
    let mut v: Vec<Shape> =
        shapes().into_iter().filter(|s| !matches!(s, Shape::Gemm { m, .. } if *m <= 8) && !moe_decode(s)).collect();
    v.push(Shape::DualGemm { m: 33, n: 77, k: 288, l: 2 });
    v
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

/// The device's packing (kernels/pack_w16.cu) writes the host's bytes (format/w16_pack.rs): one
/// operand and a dual pair, both layouts and activation types, rows and K off the groups and
/// stages, every scale code.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_device_packs_the_hosts_bytes() {
    use nvfp4::format::{pack_w16, pack_w16_dual};
    let b = gpu();
    let mut rng = Rng::new(3);
    for (l, rows, k) in [(1, 64, 256), (2, 100, 96), (1, 130, 544), (3, 7, 32)] {
        for layout in LAYOUTS {
            let make = |rng: &mut Rng| {
                let values = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
                let scales = (0..l * rows * k / 16).map(|i| (i * 37 + rng.below(7) as usize) as u8).collect();
                Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain).unwrap().to_layout(layout)
            };
            let (t1, t2) = (make(&mut rng), make(&mut rng));
            let (d1, d2) = (b.upload(&t1).unwrap(), b.upload(&t2).unwrap());
            for act in [PackAct::Bf16, PackAct::F16] {
                let one = b.pack(&d1.view(), act).unwrap();
                assert_eq!(
                    b.download_packed(&one).unwrap(),
                    pack_w16(&t1, act).unwrap(),
                    "[{l}, {rows}, {k}] {layout:?} {act:?}"
                );
                let pair = b.pack_dual(&d1.view(), &d2.view(), act).unwrap();
                let want = pack_w16_dual(&t1, &t2, act).unwrap();
                assert_eq!(b.download_packed(&pair).unwrap(), want, "pair [{l}, {rows}, {k}] {layout:?} {act:?}");
            }
        }
    }
}

/// Negative scales (their sign folded into the codes at pack time), zero scales (codes zeroed),
/// and a NaN scale poisoning exactly its outputs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_signed_zero_and_nan_scales() {
    let b = gpu();
    for (i, shape) in packed_shapes().iter().enumerate() {
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
                W16::Dual(d) => W16::Dual(
                    DualGemm::new(d.a, with_signed_scales(&d.b1), with_signed_scales(&d.b2), d.alpha).unwrap(),
                ),
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

/// Every tile and K schedule of the packed kernels, forced (the dual GEMM's pair included).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_every_variant_and_schedule_is_bit_identical() {
    every_variant(&gpu(), 9, |b, w, dtype, what| {
        check_packed(b, w, dtype, Rule::Exact, what);
    });
}

/// A packed dual GEMM pair takes the variant the W4A16 plan must skip (the unpacked decode
/// spills in the dual m128n256) when the planner over every variant picks it.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_packed_pair_takes_the_variants_only_it_has() {
    let b = gpu();
    let (m, n, k) = (1024, 2048, 1024);
    let shape = Shape::DualGemm { m, n, k, l: 1 };
    let plan = nvfp4::backend::cuda::sm90::plan(Op::Dual, (m, n, k, 1), b.sm_count() as usize, None);
    for dtype in TYPES {
        let w = W16::make(&shape, dtype, ScaleLayout::Blocked, Data::Random, 31);
        let want = w.reference(dtype);
        let (got, route) = w.run(&b, dtype, None, true);
        let variant = format!("m{}n{}", plan.variant.bm, plan.variant.bn);
        assert!(route.contains(&format!("p_sm90_ws_{variant}")), "the planner's {variant}: {route}");
        for outs in got {
            let bad = differences(&outs[0], &want[0], Rule::Tolerance);
            assert!(bad.is_empty(), "{shape} {dtype} ({route}): {bad:?}");
        }
        println!("ok packed pair {shape} {dtype}: {route}");
    }
}

/// Per-expert alphas (issue 21 item 4) on packed weights: the packed grouped kernels take the
/// same per-expert epilogue.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn packed_moe_with_per_expert_alphas() {
    let b = gpu();
    let shape = Shape::Moe { n: 520, k: 512, counts: vec![1, 300, 0, 71, 129] };
    for dtype in TYPES {
        for layout in LAYOUTS {
            let W16::Moe(m) = W16::make(&shape, dtype, layout, Data::Exact, 41) else { unreachable!("the MoE form") };
            let alphas = vec![0.8125, -1.3, 0.0, 3.1e-3, 2.0];
            let w = W16::Moe(MoeGemm::new(m.a, m.b, m.offsets, alphas).unwrap());
            check_packed(&b, &w, dtype, Rule::Exact, &format!("per-expert alphas {shape} {dtype} {layout:?}"));
        }
    }
}
