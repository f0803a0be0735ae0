//! Sizes checked before allocating: byte counts that cannot overflow, the host's available
//! memory, and `Error::TooLarge` from generators, constructors and runs instead of an abort.

use half::f16;
use nvfp4::memory::{checked_product, checked_sum, ensure_within, host_memory, parse_meminfo, try_zeroed, Source};
use nvfp4::problem::generate;
use nvfp4::{CpuBackend, Error, F16Tensor, Gemm, Nvfp4Tensor, Problem, ProblemKind, ScaleLayout, Shape};

/// Bytes of an NVFP4 tensor `[l, rows, k]`: packed values plus scales in `layout`, from the
/// format's definition (plain: one byte per 16 values; blocked: 512-byte tiles of 128 rows by 4
/// scale columns).
fn tensor_bytes(l: usize, rows: usize, k: usize, layout: ScaleLayout) -> u64 {
    let scales = match layout {
        ScaleLayout::Plain => l * rows * (k / 16),
        ScaleLayout::Blocked => l * rows.div_ceil(128) * (k / 16).div_ceil(4) * 512,
    };
    (l * rows * k / 2 + scales) as u64
}

#[track_caller]
fn assert_too_large<T: std::fmt::Debug>(r: nvfp4::Result<T>) -> (String, u64, u64) {
    match r {
        Err(Error::TooLarge { what, needed, available }) => {
            assert!(needed > available, "{what}: needed {needed} <= available {available}");
            (what, needed, available)
        }
        other => panic!("expected Error::TooLarge, got {other:?}"),
    }
}

#[test]
fn meminfo_parsing() {
    let modern = "MemTotal:       24684084 kB\nMemFree:        24523028 kB\nMemAvailable:   24426496 kB\n";
    assert_eq!(parse_meminfo(modern), Some((24426496 * 1024, Source::MemAvailable)));
    // Kernels before 3.14 have no MemAvailable: free memory plus buffers and page cache.
    let old = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 20 kB\nCached: 300 kB\n";
    assert_eq!(parse_meminfo(old), Some((420 * 1024, Source::MemFree)));
    for bad in ["", "garbage", "MemAvailable: lots kB", "MemAvailable: 5 MB", "MemAvailableX: 5 kB"] {
        assert_eq!(parse_meminfo(bad), None, "{bad:?}");
    }
    assert_eq!(parse_meminfo("MemAvailable: 18446744073709551615 kB"), None, "overflow is not a figure");
    let m = host_memory();
    assert!(m.available > 0, "{m}");
}

#[test]
fn checked_arithmetic() {
    assert_eq!(checked_product(&[3, 5, 7]), Some(105));
    assert_eq!(checked_product(&[]), Some(1));
    assert_eq!(checked_product(&[1 << 32, 1 << 32]), None);
    assert_eq!(checked_sum([Some(1), Some(2)]), Some(3));
    assert_eq!(checked_sum([Some(u64::MAX), Some(1)]), None);
    assert_eq!(checked_sum([Some(1), None]), None);
    assert!(ensure_within("x", Some(10), 10).is_ok());
    let (what, needed, available) = assert_too_large(ensure_within("eleven bytes", Some(11), 10));
    assert_eq!((what.as_str(), needed, available), ("eleven bytes", 11, 10));
    let (what, needed, _) = assert_too_large(ensure_within("more than can be counted", None, 10));
    assert!(what.contains("beyond 64 bits"), "{what}");
    assert_eq!(needed, u64::MAX);
    assert_too_large(try_zeroed::<u64>("a buffer no allocator gives", usize::MAX / 8));
    assert_eq!(try_zeroed::<u16>("small", 3).unwrap(), vec![0, 0, 0]);
}

#[test]
fn shape_byte_counts_match_the_format() {
    let gemm = Shape::Gemm { m: 130, n: 40, k: 80, l: 3 };
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let want = tensor_bytes(3, 130, 80, layout) + tensor_bytes(3, 40, 80, layout);
        assert_eq!(gemm.input_bytes(layout), Some(want), "{layout:?}");
    }
    assert_eq!(gemm.output_bytes(), Some(3 * 130 * 40 * 2));
    let dual = Shape::DualGemm { m: 5, n: 7, k: 32, l: 1 };
    let want = tensor_bytes(1, 5, 32, ScaleLayout::Plain) + 2 * tensor_bytes(1, 7, 32, ScaleLayout::Plain);
    assert_eq!(dual.input_bytes(ScaleLayout::Plain), Some(want));
    let grouped = Shape::GroupedGemm { groups: vec![(8, 16, 32), (3, 5, 64)] };
    assert_eq!(grouped.output_bytes(), Some((8 * 16 + 3 * 5) * 2));
    assert_eq!(Shape::Gemv { m: 9, k: 16, l: 2 }.output_bytes(), Some(9 * 2 * 2));
    let huge = Shape::Gemm { m: 1 << 40, n: 1 << 40, k: 1 << 40, l: 1 };
    assert_eq!(huge.input_bytes(ScaleLayout::Plain), None);
    assert_eq!(huge.output_bytes(), None);
}

#[test]
fn generated_problems_hold_exactly_the_counted_bytes() {
    for kind in ProblemKind::ALL {
        let shape = match kind {
            ProblemKind::Gemv => Shape::Gemv { m: 130, k: 48, l: 2 },
            ProblemKind::Gemm => Shape::Gemm { m: 7, n: 129, k: 64, l: 2 },
            ProblemKind::DualGemm => Shape::DualGemm { m: 7, n: 9, k: 32, l: 1 },
            ProblemKind::GroupedGemm => Shape::GroupedGemm { groups: vec![(8, 16, 32), (3, 5, 64)] },
        };
        let p = generate(&shape, 4).unwrap();
        assert_eq!(p.shape(), shape);
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            let q = p.clone().into_layout(layout);
            let held: usize = tensors_of(&q).iter().map(|t| t.nbytes()).sum();
            assert_eq!(shape.input_bytes(layout), Some(held as u64), "{kind} {layout:?}");
            assert_eq!(q, p.with_layout(layout), "into_layout and with_layout agree");
        }
        let out = p.run(&CpuBackend).unwrap();
        let out_bytes: usize = out.tensors().iter().map(|t| t.data().len() * 2).sum();
        assert_eq!(shape.output_bytes(), Some(out_bytes as u64));
    }
}

fn tensors_of(p: &Problem) -> Vec<&Nvfp4Tensor> {
    match p {
        Problem::Gemv(g) => vec![&g.a, &g.b],
        Problem::Gemm(g) => vec![&g.a, &g.b],
        Problem::DualGemm(d) => vec![&d.a, &d.b1, &d.b2],
        Problem::GroupedGemm(g) => g.groups.iter().flat_map(|x| [&x.a, &x.b]).collect(),
        Problem::Moe(g) => vec![&g.a, &g.b],
    }
}

#[test]
fn generating_more_than_the_host_holds_is_refused() {
    // 1.1 TB of operands: more than any host this runs on.
    let shape = Shape::Gemm { m: 1_000_000, n: 1_000_000, k: 1_000_000, l: 1 };
    let (what, needed, _) = assert_too_large(generate(&shape, 1));
    assert_eq!(needed, tensor_bytes(1, 1_000_000, 1_000_000, ScaleLayout::Plain) * 2);
    assert!(what.contains("1000000x1000000x1000000"), "{what}");
    // Every kind, and a count beyond 64 bits.
    for shape in [
        Shape::Gemv { m: 1 << 30, k: 1 << 30, l: 1 << 10 },
        Shape::DualGemm { m: 1 << 20, n: 1 << 20, k: 1 << 20, l: 1 },
        Shape::GroupedGemm { groups: vec![(16, 16, 16), (1 << 40, 1 << 40, 1 << 40)] },
    ] {
        assert_too_large(generate(&shape, 1));
    }
}

#[test]
fn constructors_refuse_shapes_whose_counts_overflow() {
    // 2^62 x 4 x 32 wraps to 0 bytes in 64 bits: empty buffers must not pass for it.
    let r = Nvfp4Tensor::new(1 << 62, 4, 32, vec![], vec![], ScaleLayout::Plain);
    assert_too_large(r);
    let r = Nvfp4Tensor::new(1, 1 << 62, 1 << 6, vec![], vec![], ScaleLayout::Blocked);
    assert!(r.is_err(), "{r:?}");
    assert_too_large(F16Tensor::new(1 << 32, 1 << 32, 1 << 32, Vec::<f16>::new()));
    assert!(matches!(F16Tensor::new(2, 3, 4, vec![f16::ZERO; 23]), Err(Error::BufferSize { .. })));
    assert_eq!(Nvfp4Tensor::bytes_for(1 << 40, 1 << 40, 1 << 40, ScaleLayout::Plain), None);
}

#[test]
fn running_an_output_larger_than_the_host_is_refused() {
    // 9 MB operands whose product is 2 TB of f16 output (and 8 TB of CPU sums).
    let (m, n, k) = (1_000_000, 1_000_000, 16);
    let t = |rows: usize| Nvfp4Tensor::new(1, rows, k, vec![0x11; rows * k / 2], vec![0x38; rows], ScaleLayout::Plain);
    let p = Problem::Gemm(Gemm::new(t(m).unwrap(), t(n).unwrap(), None).unwrap());
    let (what, needed, _) = assert_too_large(p.run(&CpuBackend));
    assert!(needed >= (m * n * 2) as u64, "needed {needed} does not even count the output");
    assert!(what.contains("1000000x1000000x16") && what.contains("cpu"), "{what}");
    assert_eq!(p.run_host_bytes(&CpuBackend), Some(needed));
    // The CPU backend's share beside the output, as the backend itself can ask for it.
    let working = nvfp4::problem::cpu_working_bytes(1, m, n, k, 1).unwrap();
    assert_eq!(needed, (m * n * 2) as u64 + working);
    assert!(working >= (m * n * 8) as u64, "the f64 sums alone are 8 bytes per output element");
}
