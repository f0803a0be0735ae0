//! The SPEC §6 catalogue, case names, shape parsing/printing and the SPEC §5 generators.

use std::collections::{BTreeMap, BTreeSet};

use nvfp4::problem::{bench_shapes, generate, test_shapes, Case};
use nvfp4::{Error, Nvfp4Tensor, Problem, ProblemKind, ScaleLayout, Shape};

/// E2M1 per SPEC §1.
fn e2m1(code: u8) -> f32 {
    let m = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// E4M3 per SPEC §1 (NaN for 0x7F / 0xFF).
fn e4m3(code: u8) -> f32 {
    let e = ((code >> 3) & 0xF) as i32;
    let m = (code & 7) as f32;
    let mag = if e == 15 && code & 7 == 7 {
        f32::NAN
    } else if e == 0 {
        m / 8.0 / 64.0
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

fn parse_all(kind: ProblemKind, list: &[&str]) -> Vec<Shape> {
    list.iter().map(|s| Shape::parse(kind, s).unwrap_or_else(|e| panic!("{kind} `{s}`: {e}"))).collect()
}

// The SPEC §6 lists, typed from the SPEC in the command-line form.
const GEMV_TESTS: [&str; 9] = [
    "128x256x1",
    "128x1536x1",
    "128x3072x1",
    "256x7168x1",
    "2432x4608x2",
    "384x7168x2",
    "512x512x2",
    "512x4096x2",
    "512x1536x2",
];
const GEMM_TESTS: [&str; 10] = [
    "128x256x256",
    "128x1536x7168",
    "128x3072x1536",
    "256x7168x256",
    "256x7168x2048",
    "2304x4608x7168",
    "384x7168x2304",
    "512x512x7168",
    "512x4096x512",
    "512x1536x7168",
];
const DUAL_TESTS: [&str; 9] = [
    "1536x512x7168",
    "256x512x256",
    "3072x1024x1536",
    "7168x1024x256",
    "7168x2304x2048",
    "4608x384x7168",
    "7168x384x2304",
    "512x768x7168",
    "4096x768x512",
];
const GROUPED_TESTS: [&str; 10] = [
    "96,128/128,256/256,512",
    "256,72/512,384/256,256",
    "128,128/128,256/512,256",
    "80,128,256/384,256,128/256,512,256",
    "64,72,96/128,384,512/512,512,256",
    "64,256,128/768,128,256/512,256,512",
    "128,128,64/256,512,512/768,256,768",
    "128,128,128,128/128,128,128,128/512,256,512,256",
    "40,56,384,512/512,384,256,128/256,256,256,256",
    "512,384,256,128/256,256,256,256/512,768,512,768",
];
const GEMV_BENCH: [&str; 3] = ["7168x16384x1", "4096x7168x8", "7168x2048x4"];
const GEMM_BENCH: [&str; 3] = ["128x7168x16384", "128x4096x7168", "128x7168x2048"];
const DUAL_BENCH: [&str; 4] = ["256x4096x7168", "512x4096x7168", "256x3072x4096", "512x3072x7168"];
const GROUPED_BENCH: [&str; 4] = [
    "80,176,128,72,64,248,96,160/4096/7168",
    "40,76,168,72,164,148,196,160/7168/2048",
    "192,320/3072/4096",
    "128,384/4096/1536",
];

#[test]
fn catalogue_sizes_match_spec() {
    let sizes: Vec<(usize, usize)> =
        ProblemKind::ALL.iter().map(|&k| (test_shapes(k).len(), bench_shapes(k).len())).collect();
    assert_eq!(sizes, vec![(9, 3), (10, 3), (9, 4), (10, 4)]);
}

#[test]
fn catalogue_entries_match_spec_lists() {
    let lists: [(ProblemKind, &[&str], &[&str]); 4] = [
        (ProblemKind::Gemv, &GEMV_TESTS, &GEMV_BENCH),
        (ProblemKind::Gemm, &GEMM_TESTS, &GEMM_BENCH),
        (ProblemKind::DualGemm, &DUAL_TESTS, &DUAL_BENCH),
        (ProblemKind::GroupedGemm, &GROUPED_TESTS, &GROUPED_BENCH),
    ];
    for (kind, tests, bench) in lists {
        assert_eq!(test_shapes(kind), parse_all(kind, tests), "{kind} test shapes");
        assert_eq!(bench_shapes(kind), parse_all(kind, bench), "{kind} bench shapes");
        for s in test_shapes(kind).iter().chain(&bench_shapes(kind)) {
            assert_eq!(s.kind(), kind);
            s.validate().unwrap();
        }
    }
}

#[test]
fn catalogue_spot_checks_as_structs() {
    assert_eq!(test_shapes(ProblemKind::Gemv)[4], Shape::Gemv { m: 2432, k: 4608, l: 2 });
    assert_eq!(test_shapes(ProblemKind::Gemm)[5], Shape::Gemm { m: 2304, n: 4608, k: 7168, l: 1 });
    assert_eq!(test_shapes(ProblemKind::DualGemm)[0], Shape::DualGemm { m: 1536, n: 512, k: 7168, l: 1 });
    assert_eq!(
        test_shapes(ProblemKind::GroupedGemm)[8],
        Shape::GroupedGemm { groups: vec![(40, 512, 256), (56, 384, 256), (384, 256, 256), (512, 128, 256)] }
    );
    assert_eq!(
        test_shapes(ProblemKind::GroupedGemm)[7],
        Shape::GroupedGemm { groups: vec![(128, 128, 512), (128, 128, 256), (128, 128, 512), (128, 128, 256)] }
    );
    assert_eq!(bench_shapes(ProblemKind::Gemv)[1], Shape::Gemv { m: 4096, k: 7168, l: 8 });
    assert_eq!(
        bench_shapes(ProblemKind::GroupedGemm)[2],
        Shape::GroupedGemm { groups: vec![(192, 3072, 4096), (320, 3072, 4096)] }
    );
    let g0 = &bench_shapes(ProblemKind::GroupedGemm)[0];
    let Shape::GroupedGemm { groups } = g0 else { panic!("{g0:?}") };
    let ms: Vec<usize> = groups.iter().map(|g| g.0).collect();
    assert_eq!(ms, vec![80, 176, 128, 72, 64, 248, 96, 160]);
    assert!(groups.iter().all(|&(_, n, k)| n == 4096 && k == 7168));
}

#[test]
fn case_parsing() {
    assert_eq!("test:0".parse::<Case>().unwrap(), Case::Test(0));
    assert_eq!("bench:3".parse::<Case>().unwrap(), Case::Bench(3));
    assert_eq!("test:9".parse::<Case>().unwrap(), Case::Test(9));
    for bad in ["foo:1", "test:x", "test", "test:", ":1", "test:-1", "bench:1.0", ""] {
        match bad.parse::<Case>() {
            Err(Error::UnknownCase(_)) => {}
            other => panic!("`{bad}`: {other:?}"),
        }
    }
}

#[test]
fn case_shapes_resolve_and_out_of_range_fails() {
    assert_eq!(Case::Test(0).shape(ProblemKind::Gemv).unwrap(), Shape::Gemv { m: 128, k: 256, l: 1 });
    assert_eq!(
        Case::Bench(3).shape(ProblemKind::DualGemm).unwrap(),
        Shape::DualGemm { m: 512, n: 3072, k: 7168, l: 1 }
    );
    assert_eq!(
        Case::Test(9).shape(ProblemKind::Gemm).unwrap(),
        Shape::parse(ProblemKind::Gemm, "512x1536x7168").unwrap()
    );
    // test:99 parses but names nothing; bench:3 exists for dual but not for gemv (3 shapes).
    let c: Case = "test:99".parse().unwrap();
    for kind in ProblemKind::ALL {
        assert!(matches!(c.shape(kind), Err(Error::UnknownCase(_))), "{kind}");
    }
    assert!(matches!(Case::Bench(3).shape(ProblemKind::Gemv), Err(Error::UnknownCase(_))));
    assert!(matches!(Case::Bench(3).shape(ProblemKind::Gemm), Err(Error::UnknownCase(_))));
    assert!(matches!(Case::Test(9).shape(ProblemKind::Gemv), Err(Error::UnknownCase(_))));
    assert!(Case::Test(9).shape(ProblemKind::GroupedGemm).is_ok());
}

#[test]
fn problem_kind_names_round_trip() {
    let names = ["gemv", "gemm", "dual-gemm", "grouped-gemm"];
    for (kind, name) in ProblemKind::ALL.iter().zip(names) {
        assert_eq!(kind.to_string(), name);
        assert_eq!(name.parse::<ProblemKind>().unwrap(), *kind);
    }
    assert!("dual".parse::<ProblemKind>().is_err());
}

#[test]
fn shape_parse_each_kind() {
    assert_eq!(Shape::parse(ProblemKind::Gemv, "128x256x2").unwrap(), Shape::Gemv { m: 128, k: 256, l: 2 });
    assert_eq!(Shape::parse(ProblemKind::Gemm, "7x40x48").unwrap(), Shape::Gemm { m: 7, n: 40, k: 48, l: 1 });
    assert_eq!(Shape::parse(ProblemKind::Gemm, "7x40x48x3").unwrap(), Shape::Gemm { m: 7, n: 40, k: 48, l: 3 });
    assert_eq!(
        Shape::parse(ProblemKind::DualGemm, "256x512x256").unwrap(),
        Shape::DualGemm { m: 256, n: 512, k: 256, l: 1 }
    );
    assert_eq!(
        Shape::parse(ProblemKind::GroupedGemm, "96,128/128,256/256,512").unwrap(),
        Shape::GroupedGemm { groups: vec![(96, 128, 256), (128, 256, 512)] }
    );
    assert_eq!(
        Shape::parse(ProblemKind::GroupedGemm, "80,176/4096/7168").unwrap(),
        Shape::GroupedGemm { groups: vec![(80, 4096, 7168), (176, 4096, 7168)] }
    );
}

#[test]
fn shape_display_and_round_trip() {
    let s = Shape::Gemv { m: 128, k: 256, l: 1 };
    assert_eq!(s.to_string(), "128x256x1");
    let s = Shape::Gemm { m: 7, n: 40, k: 48, l: 1 };
    assert_eq!(s.to_string(), "7x40x48");
    let s = Shape::DualGemm { m: 7, n: 40, k: 48, l: 3 };
    assert_eq!(s.to_string(), "7x40x48x3");
    let s = Shape::GroupedGemm { groups: vec![(96, 128, 256), (128, 256, 512)] };
    assert_eq!(s.to_string(), "96,128/128,256/256,512");

    // Canonical strings print back unchanged.
    for (kind, text) in [
        (ProblemKind::Gemv, "2432x4608x2"),
        (ProblemKind::Gemm, "128x1536x7168"),
        (ProblemKind::Gemm, "1x7x16x3"),
        (ProblemKind::DualGemm, "4096x768x512"),
        (ProblemKind::GroupedGemm, "96,128/128,256/256,512"),
        (ProblemKind::GroupedGemm, "40,56,384,512/512,384,256,128/256,256,256,256"),
    ] {
        assert_eq!(Shape::parse(kind, text).unwrap().to_string(), text);
    }
    // The broadcast form parses to the same shape as its spelled-out print.
    let b = Shape::parse(ProblemKind::GroupedGemm, "80,176/4096/7168").unwrap();
    assert_eq!(b.to_string(), "80,176/4096,4096/7168,7168");
    // Every catalogue shape survives Display -> parse.
    for kind in ProblemKind::ALL {
        for s in test_shapes(kind).into_iter().chain(bench_shapes(kind)) {
            assert_eq!(Shape::parse(kind, &s.to_string()).unwrap(), s, "{kind} {s}");
        }
    }
}

#[test]
fn shape_parse_rejects_bad_input() {
    let k_bad = [
        (ProblemKind::Gemv, "128x100x1"),
        (ProblemKind::Gemm, "128x256x40"),
        (ProblemKind::DualGemm, "16x16x8"),
        (ProblemKind::GroupedGemm, "96,128/128,256/256,100"),
        (ProblemKind::GroupedGemm, "96/128/24"),
    ];
    for (kind, text) in k_bad {
        match Shape::parse(kind, text) {
            Err(Error::KNotMultipleOf16 { .. }) => {}
            other => panic!("{kind} `{text}`: {other:?}"),
        }
    }
    let bad = [
        (ProblemKind::Gemv, "128x256x1x1"),
        (ProblemKind::Gemv, "128"),
        (ProblemKind::Gemm, "128x256"),
        (ProblemKind::Gemm, "axbxc"),
        (ProblemKind::DualGemm, "1x2x3x4x5"),
        (ProblemKind::GroupedGemm, "96,128/128,256"),
        (ProblemKind::GroupedGemm, "1,2/3,4,5/16"),
        (ProblemKind::GroupedGemm, "1,2/3/16,32,48"),
        (ProblemKind::Gemv, "0x256x1"),
        (ProblemKind::Gemm, "4x0x16"),
    ];
    for (kind, text) in bad {
        assert!(Shape::parse(kind, text).is_err(), "{kind} `{text}` accepted");
    }
    assert!(matches!(Shape::parse(ProblemKind::Gemv, "0x256x1"), Err(Error::Shape(_))));
}

// ---------------------------------------------------------------------------------------------
// Generators

fn operands(p: &Problem) -> Vec<&Nvfp4Tensor> {
    match p {
        Problem::Gemv(g) => vec![&g.a, &g.b],
        Problem::Gemm(g) => vec![&g.a, &g.b],
        Problem::DualGemm(g) => vec![&g.a, &g.b1, &g.b2],
        Problem::GroupedGemm(g) => g.groups.iter().flat_map(|x| [&x.a, &x.b]).collect(),
        Problem::Moe(g) => vec![&g.a, &g.b],
    }
}

fn counts<I: IntoIterator<Item = u8>>(it: I) -> BTreeMap<u8, usize> {
    let mut m = BTreeMap::new();
    for x in it {
        *m.entry(x).or_insert(0) += 1;
    }
    m
}

/// Each key's share of the total is within `tol` of `1 / keys`.
fn assert_roughly_uniform(c: &BTreeMap<u8, usize>, keys: usize, tol: f64, what: &str) {
    assert_eq!(c.len(), keys, "{what}: {c:?}");
    let total: usize = c.values().sum();
    for (k, &n) in c {
        let share = n as f64 / total as f64;
        assert!((share - 1.0 / keys as f64).abs() <= tol, "{what}: value {k} share {share}");
    }
}

#[test]
fn generator_is_deterministic_and_seed_dependent() {
    for kind in ProblemKind::ALL {
        let shape = match kind {
            ProblemKind::Gemv => Shape::Gemv { m: 40, k: 64, l: 2 },
            ProblemKind::Gemm => Shape::Gemm { m: 7, n: 9, k: 48, l: 2 },
            ProblemKind::DualGemm => Shape::DualGemm { m: 7, n: 9, k: 48, l: 1 },
            ProblemKind::GroupedGemm => Shape::GroupedGemm { groups: vec![(8, 16, 32), (5, 3, 48)] },
        };
        let p1 = generate(&shape, 42).unwrap();
        let p2 = generate(&shape, 42).unwrap();
        let p3 = generate(&shape, 43).unwrap();
        assert_eq!(p1, p2, "{kind}: same seed");
        assert_ne!(p1, p3, "{kind}: different seeds");
        assert_eq!(p1.kind(), kind);
        for t in operands(&p1) {
            assert_eq!(t.layout(), ScaleLayout::Plain);
            assert_eq!(t.global_scale(), 1.0);
        }
    }
}

#[test]
fn generator_shapes_follow_the_shape() {
    let p = generate(&Shape::Gemv { m: 40, k: 64, l: 3 }, 1).unwrap();
    let Problem::Gemv(g) = &p else { panic!() };
    assert_eq!((g.a.l(), g.a.rows(), g.a.k()), (3, 40, 64));
    assert_eq!((g.b.l(), g.b.rows(), g.b.k()), (3, 1, 64));
    assert_eq!(g.alpha, None);

    let p = generate(&Shape::DualGemm { m: 7, n: 9, k: 48, l: 2 }, 1).unwrap();
    let Problem::DualGemm(g) = &p else { panic!() };
    assert_eq!((g.a.l(), g.a.rows(), g.a.k()), (2, 7, 48));
    assert_eq!((g.b1.rows(), g.b2.rows()), (9, 9));

    let groups = vec![(8, 16, 32), (5, 3, 48), (1, 1, 16)];
    let p = generate(&Shape::GroupedGemm { groups: groups.clone() }, 1).unwrap();
    let Problem::GroupedGemm(g) = &p else { panic!() };
    let got: Vec<_> = g.groups.iter().map(|x| (x.a.rows(), x.b.rows(), x.a.k())).collect();
    assert_eq!(got, groups);
    assert!(g.groups.iter().all(|x| x.a.l() == 1 && x.b.l() == 1));

    assert!(matches!(generate(&Shape::Gemm { m: 1, n: 1, k: 24, l: 1 }, 0), Err(Error::KNotMultipleOf16 { .. })));
}

#[test]
fn generator_gemv_distribution() {
    let p = generate(&Shape::Gemv { m: 256, k: 512, l: 2 }, 7).unwrap();
    let ts = operands(&p);
    let bytes = counts(ts.iter().flat_map(|t| t.values().iter().copied()));
    // Bytes 0..=3: low nibble in {0, 0.5, 1, 1.5}, high nibble 0.
    assert_eq!(bytes.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_roughly_uniform(&bytes, 4, 0.02, "gemv bytes");
    let scale_vals = counts(ts.iter().flat_map(|t| t.scales().iter().map(|&s| e4m3(s) as u8)));
    for t in &ts {
        for &s in t.scales() {
            let v = e4m3(s);
            assert!(v == 0.0 || v == 1.0 || v == 2.0, "scale {s:#04x} = {v}");
        }
    }
    assert_roughly_uniform(&scale_vals, 3, 0.03, "gemv scales");
}

#[test]
fn generator_gemm_distribution() {
    let p = generate(&Shape::Gemm { m: 64, n: 64, k: 256, l: 1 }, 7).unwrap();
    let ts = operands(&p);
    let codes = counts(ts.iter().flat_map(|t| t.values().iter().flat_map(|&b| [b & 0xF, b >> 4])));
    // All 16 codes, -0 (8) included, roughly equally often.
    assert_roughly_uniform(&codes, 16, 0.01, "gemm nibbles");
    let bytes: BTreeSet<u8> = ts.iter().flat_map(|t| t.values().iter().copied()).collect();
    assert!(bytes.len() > 250, "only {} distinct bytes", bytes.len());
    for t in &ts {
        for &s in t.scales() {
            let v = e4m3(s);
            assert!([0.0, 1.0, 2.0, 3.0].contains(&v), "scale {s:#04x} = {v}");
        }
    }
    let scale_vals = counts(ts.iter().flat_map(|t| t.scales().iter().map(|&s| e4m3(s) as u8)));
    assert_roughly_uniform(&scale_vals, 4, 0.04, "gemm scales");
}

#[test]
fn generator_dual_distribution() {
    let p = generate(&Shape::DualGemm { m: 64, n: 64, k: 256, l: 1 }, 7).unwrap();
    let ts = operands(&p);
    assert_eq!(ts.len(), 3);
    for t in &ts {
        for &b in t.values() {
            assert_eq!(b & 0xBB, b, "byte {b:#04x}");
            for c in [b & 0xF, b >> 4] {
                assert!([0.0, 0.5, 1.0, 1.5].contains(&e2m1(c).abs()), "code {c}");
            }
        }
    }
    let codes = counts(ts.iter().flat_map(|t| t.values().iter().flat_map(|&b| [b & 0xF, b >> 4])));
    assert_eq!(codes.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 9, 10, 11]);
    let mut distinct = BTreeSet::new();
    let mut sum = 0f64;
    let mut n = 0usize;
    for t in &ts {
        for &s in t.scales() {
            let v = e4m3(s);
            assert!((0.0..=1.0).contains(&v) && !v.is_sign_negative(), "scale {s:#04x} = {v}");
            distinct.insert(s);
            sum += v as f64;
            n += 1;
        }
    }
    // uniform [0, 1) rounded to E4M3: many distinct codes, mean near 1/2.
    assert!(distinct.len() > 40, "only {} distinct scale codes", distinct.len());
    let mean = sum / n as f64;
    assert!((mean - 0.5).abs() < 0.03, "mean scale {mean}");
}

#[test]
fn generator_grouped_distribution() {
    let shape = Shape::GroupedGemm { groups: vec![(40, 64, 256), (72, 32, 128)] };
    let p = generate(&shape, 7).unwrap();
    let ts = operands(&p);
    for t in &ts {
        assert!(t.values().iter().all(|&b| b & 0xBB == b));
        for &s in t.scales() {
            let v = e4m3(s);
            assert!(v == 1.0 || v == 2.0, "scale {s:#04x} = {v}");
        }
    }
    let scale_vals = counts(ts.iter().flat_map(|t| t.scales().iter().map(|&s| e4m3(s) as u8)));
    assert_roughly_uniform(&scale_vals, 2, 0.05, "grouped scales");
}
