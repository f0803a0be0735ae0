//! What `nvfp4::bench` computes without a GPU: statistics, geometric means, the speed-of-light
//! and read-ceiling arithmetic, the graph protocol's rotation, row and report JSON, the terminal
//! table, the peer's f16 operands and its check.

use half::f16;
use nvfp4::bench::{
    check_mode, check_peer, dequantize_f16, fail_verdict, geomean, geomeans, input_bytes, iso8601_utc, tbps, tflops,
    Ceilings, GraphRun, LaunchFloor, Measurement, Options, PeerAgreement, Protocol, Report, Rotation, Row, Samples,
    ShapeSet, MIN_GRAPH_LAUNCHES, MIN_SAMPLES, PASS,
};
use nvfp4::check::Mode;
use nvfp4::problem::{bench_shapes, generate};
use nvfp4::{Error, F16Tensor, Output, Problem, ProblemKind, Shape};

const H100: Ceilings = Ceilings { copy_tbps: 2.97, fp16_tflops: 736.0, fp16_tflops_nvfp4_data: None };

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn median_of_odd_and_even_counts() {
    let s = Samples::new(vec![5.0, 1.0, 3.0]).unwrap();
    assert_eq!((s.median(), s.min(), s.max(), s.len()), (3.0, 1.0, 5.0, 3));
    let s = Samples::new(vec![4.0, 1.0, 3.0, 2.0]).unwrap();
    assert_eq!(s.median(), 2.5);
    assert_eq!(s.as_slice(), &[4.0, 1.0, 3.0, 2.0], "samples keep their order");
}

#[test]
fn median_ignores_outliers() {
    let mut v = vec![10.0; 29];
    v.push(1e6);
    assert_eq!(Samples::new(v).unwrap().median(), 10.0);
}

#[test]
fn samples_refuse_empty_and_non_finite() {
    assert!(matches!(Samples::new(vec![]), Err(Error::Invalid(_))));
    assert!(matches!(Samples::new(vec![1.0, f64::NAN]), Err(Error::Invalid(_))));
    assert!(matches!(Samples::new(vec![-1.0]), Err(Error::Invalid(_))));
}

#[test]
fn geometric_mean() {
    assert!(close(geomean([2.0, 8.0]).unwrap(), 4.0));
    assert!(close(geomean([1.0, 10.0, 100.0]).unwrap(), 10.0));
    assert!(close(geomean([7.5]).unwrap(), 7.5));
    assert_eq!(geomean(std::iter::empty()), None);
    assert_eq!(geomean([1.0, 0.0]), None);
    assert_eq!(geomean([1.0, f64::INFINITY]), None);
}

#[test]
fn throughput_units_are_decimal() {
    // 1 GB in 1000 µs is 1 TB/s; 1 TFLOP in 1 s is 1 TFLOP/s.
    assert!(close(tbps(1e9, 1000.0), 1.0));
    assert!(close(tflops(1e12, 1e6), 1.0));
}

#[test]
fn speed_of_light_takes_the_larger_bound() {
    // Memory-bound: 2.97 MB at 2.97 TB/s is 1 µs; 1 GFLOP at 736 TFLOP/s is 1.36 µs.
    assert!(close(H100.memory_us(2_970_000), 1.0));
    assert!(close(H100.math_us(736e6), 1.0));
    assert!(close(H100.speed_of_light_us(2_970_000, 1e6), 1.0));
    assert!(close(H100.speed_of_light_us(1000, 736e6), 1.0));
}

#[test]
fn speed_of_light_of_the_bench_shapes_matches_hopper_notes() {
    // HOPPER.md's floors at 2.97 TB/s and 736 TFLOP/s: GEMV 22 / 44 / 11 µs, GEMM 41 / 10 / 5 µs.
    let floors = |kind| -> Vec<f64> {
        bench_shapes(kind)
            .iter()
            .map(|s| {
                let p = generate(s, 1).unwrap();
                H100.speed_of_light_us(p.bytes(), p.flops())
            })
            .collect()
    };
    let gemv = floors(ProblemKind::Gemv);
    for (got, want) in gemv.iter().zip([22.0, 44.0, 11.0]) {
        assert!((got - want).abs() < 1.0, "gemv floor {got:.1} µs, HOPPER.md says {want}");
    }
    let gemm = floors(ProblemKind::Gemm);
    for (got, want) in gemm.iter().zip([41.0, 10.0, 5.0]) {
        assert!((got - want).abs() < 1.0, "gemm floor {got:.1} µs, HOPPER.md says {want}");
    }
}

fn gemm_shape() -> Shape {
    Shape::Gemm { m: 128, n: 7168, k: 16384, l: 1 }
}

fn measurement(kernel: Option<Vec<f64>>, peer: Option<Vec<f64>>, verdict: &str) -> Measurement {
    Measurement {
        problem: ProblemKind::Gemm,
        shape: gemm_shape(),
        bytes: 2_970_000_000,
        flops: 1e9,
        kernel: kernel.map(|v| Samples::new(v).unwrap()),
        peer: peer.map(|v| Samples::new(v).unwrap()),
        verdict: verdict.to_string(),
        config: "tile 64x128".into(),
        peer_config: "cublasLt f16 TN".into(),
        read: None,
        read_config: String::new(),
        graph: None,
        peer_graph: None,
    }
}

#[test]
fn row_arithmetic() {
    let r = Row::new(&measurement(Some(vec![2000.0, 1000.0, 1500.0]), Some(vec![3000.0]), PASS), &H100);
    assert_eq!(r.problem, "gemm");
    assert_eq!(r.shape, "128x7168x16384");
    assert_eq!((r.us_median, r.us_min), (Some(1500.0), Some(1000.0)));
    assert!(close(r.tbps.unwrap(), 2.97e9 / 1500.0 / 1e6));
    assert!(close(r.tflops.unwrap(), 1e9 / 1500.0 / 1e6));
    assert!(close(r.sol_us, 1000.0));
    assert!(close(r.sol_fraction.unwrap(), 1000.0 / 1500.0));
    assert_eq!(r.peer_us, Some(3000.0));
    assert!(close(r.speedup.unwrap(), 2.0));
    assert!(r.passed());
}

#[test]
fn a_failed_kernel_has_no_timing_but_keeps_the_peer_and_floor() {
    let r = Row::new(&measurement(None, Some(vec![30.0]), &fail_verdict("3 of 9 elements differ")), &H100);
    assert_eq!(
        (r.us_median, r.us_min, r.tbps, r.tflops, r.sol_fraction, r.speedup),
        (None, None, None, None, None, None)
    );
    assert_eq!(r.peer_us, Some(30.0));
    assert!(close(r.sol_us, 1000.0));
    assert_eq!(r.verdict, "FAIL: 3 of 9 elements differ");
    assert!(!r.passed());
}

#[test]
fn fail_verdicts_are_one_line() {
    assert_eq!(fail_verdict("a\n  b\tc"), "FAIL: a b c");
    assert_eq!(fail_verdict(Error::NoGpu), "FAIL: no CUDA GPU found");
}

#[test]
fn geomeans_per_problem_need_every_row() {
    let mut rows = vec![
        Row::new(&measurement(Some(vec![10.0]), Some(vec![20.0]), PASS), &H100),
        Row::new(&measurement(Some(vec![40.0]), Some(vec![20.0]), PASS), &H100),
    ];
    let mut gemv = measurement(None, Some(vec![50.0]), "FAIL: unsupported");
    gemv.problem = ProblemKind::Gemv;
    gemv.shape = Shape::Gemv { m: 7168, k: 16384, l: 1 };
    rows.push(Row::new(&gemv, &H100));
    let g = geomeans(&rows);
    assert_eq!(g.len(), 2);
    assert_eq!(g[0].problem, "gemm");
    assert!(close(g[0].us_median.unwrap(), 20.0));
    assert!(close(g[0].speedup.unwrap(), 1.0));
    assert!(close(g[0].sol_fraction.unwrap(), (100.0f64 * 25.0).sqrt()));
    assert!(close(g[0].peer_us.unwrap(), 20.0));
    assert_eq!(g[1].problem, "gemv");
    assert_eq!((g[1].us_median, g[1].sol_fraction, g[1].speedup), (None, None, None));
    assert!(close(g[1].peer_us.unwrap(), 50.0));
}

fn report() -> Report {
    let rows = vec![
        Row::new(&measurement(Some(vec![10.0, 12.0]), Some(vec![20.0]), PASS), &H100),
        Row::new(&measurement(None, Some(vec![20.0]), "FAIL: unsupported"), &H100),
    ];
    Report {
        device: "NVIDIA H100 80GB HBM3".into(),
        driver: "13.0".into(),
        date: iso8601_utc(1_700_000_000),
        shapes: "bench".into(),
        mode: "cold".into(),
        ceilings: H100,
        launch_floor: Some(LaunchFloor { cold_us: 3.25, graph_us: 1.5, graph_unchained_us: 2.0 }),
        samples: 30,
        warmup: 10,
        geomean: geomeans(&rows),
        rows,
        notes: vec!["dual-gemm: no large shapes, skipped".into()],
    }
}

#[test]
fn json_has_the_documented_shape() {
    let r = report();
    assert!(!r.all_passed());
    let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    for key in ["device", "driver", "date", "ceilings", "samples", "rows", "geomean"] {
        assert!(v.get(key).is_some(), "top-level `{key}` missing");
    }
    assert_eq!(v["date"], "2023-11-14T22:13:20Z");
    assert_eq!(v["samples"], 30);
    assert_eq!(v["ceilings"]["copy_tbps"], 2.97);
    assert_eq!(v["ceilings"]["fp16_tflops"], 736.0);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for key in [
        "problem",
        "shape",
        "us_median",
        "us_min",
        "tbps",
        "tflops",
        "sol_us",
        "sol_fraction",
        "peer_us",
        "speedup",
        "verdict",
        "config",
    ] {
        assert!(rows.iter().all(|r| r.get(key).is_some()), "row field `{key}` missing");
    }
    assert_eq!(rows[0]["us_median"], 11.0);
    assert_eq!(rows[0]["verdict"], "pass");
    assert!(rows[1]["us_median"].is_null(), "an untimed kernel is null, not 0");
    let g = v["geomean"].as_array().unwrap();
    assert_eq!(g.len(), 1);
    for key in ["problem", "us_median", "sol_fraction", "speedup"] {
        assert!(g[0].get(key).is_some(), "geomean field `{key}` missing");
    }
    assert!(g[0]["us_median"].is_null());
}

#[test]
fn json_file_round_trips() {
    let path = std::env::temp_dir().join(format!("nvfp4-bench-test-{}.json", std::process::id()));
    report().write_json(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(v["rows"][0]["shape"], "128x7168x16384");
}

#[test]
fn table_lists_rows_then_geomeans() {
    let t = report().table();
    let lines: Vec<&str> = t.lines().collect();
    let header = lines.iter().position(|l| l.starts_with("problem")).expect("row header");
    assert!(lines[header + 1].starts_with("gemm") && lines[header + 1].contains("128x7168x16384"));
    assert!(lines[header + 1].contains("11.0") && lines[header + 1].contains("pass"));
    assert!(lines[header + 2].contains("FAIL: unsupported"));
    assert!(lines.iter().any(|l| l.starts_with("geomean")));
    assert!(t.contains("2.97 TB/s") && t.contains("736 TFLOP/s"));
    assert!(t.contains("note: dual-gemm: no large shapes, skipped"));
    let configs = lines.iter().position(|l| *l == "launch configurations:").expect("config section");
    assert_eq!(lines[configs + 1].trim(), "gemm 128x7168x16384");
    assert_eq!(lines[configs + 2].trim(), "nvfp4: tile 64x128");
    assert_eq!(lines[configs + 3].trim(), "peer:  cublasLt f16 TN");
}

#[test]
fn table_clips_long_verdicts_json_keeps_them() {
    let long = fail_verdict(format!("{} of 9 elements differ", "9".repeat(100)));
    let mut r = report();
    r.rows[1] = Row::new(&measurement(None, None, &long), &H100);
    let t = r.table();
    assert!(!t.contains(&long) && t.contains('…'));
    let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(v["rows"][1]["verdict"], long.as_str());
    assert!(v["rows"][1]["peer_us"].is_null());
}

#[test]
fn table_names_the_data_dependent_fp16_rate() {
    let mut r = report();
    assert!(!r.table().contains("NVFP4 values"));
    r.ceilings.fp16_tflops_nvfp4_data = Some(903.0);
    assert!(r.table().contains("fp16 736 TFLOP/s (random data; 903 on NVFP4 values, not used for SoL)"));
    let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(v["ceilings"]["fp16_tflops_nvfp4_data"], 903.0);
}

#[test]
fn table_shortens_grouped_shapes() {
    let mut m = measurement(Some(vec![10.0]), Some(vec![20.0]), PASS);
    m.problem = ProblemKind::GroupedGemm;
    m.shape = bench_shapes(ProblemKind::GroupedGemm).remove(2);
    let mut r = report();
    r.rows = vec![Row::new(&m, &H100)];
    assert_eq!(r.rows[0].shape, "192,320/3072,3072/4096,4096", "JSON keeps the Display form");
    assert!(r.table().contains("192,320/3072/4096"));
}

#[test]
fn iso8601_dates() {
    assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(iso8601_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(iso8601_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(iso8601_utc(4_102_444_799), "2099-12-31T23:59:59Z");
}

#[test]
fn shape_sets_and_check_modes() {
    assert_eq!("large".parse::<ShapeSet>().unwrap(), ShapeSet::Large);
    assert!(matches!("huge".parse::<ShapeSet>(), Err(Error::Invalid(_))));
    assert_eq!(ShapeSet::Large.shapes(ProblemKind::Gemm).len(), 2);
    assert!(ShapeSet::Large.shapes(ProblemKind::DualGemm).is_empty());
    assert_eq!(ShapeSet::Bench.shapes(ProblemKind::DualGemm).len(), 4);
    assert_eq!(check_mode(ProblemKind::Gemm), Mode::BitExact);
    assert_eq!(check_mode(ProblemKind::DualGemm), Mode::Tolerance);
}

#[test]
fn too_few_samples_is_a_typed_error() {
    let opts = Options { samples: MIN_SAMPLES - 1, ..Options::default() };
    assert!(matches!(nvfp4::bench::run(&opts, &mut |_| {}), Err(Error::Invalid(_))));
}

#[test]
fn without_a_driver_the_run_is_a_typed_error() {
    if nvfp4::bench::driver_present() {
        return; // a machine with a GPU driver: nothing to check here
    }
    match nvfp4::bench::run(&Options::default(), &mut |_| {}) {
        Err(Error::NoDriver(_)) => {}
        other => panic!("expected a no-driver error, got {:?}", other.map(|r| r.rows.len())),
    }
}

#[test]
fn f16_operands_are_exact() {
    for kind in ProblemKind::ALL {
        let shape = nvfp4::problem::test_shapes(kind).remove(0);
        let p = generate(&shape, 1).unwrap();
        let t = match &p {
            Problem::Gemv(g) => &g.a,
            Problem::Gemm(g) => &g.b,
            Problem::DualGemm(g) => &g.b2,
            Problem::GroupedGemm(g) => &g.groups[0].a,
            Problem::Moe(g) => &g.b,
        };
        let f = dequantize_f16(t);
        let exact = t.dequantize();
        assert_eq!(f.len(), exact.len());
        assert!(f.iter().zip(&exact).all(|(h, x)| h.to_f32() == *x), "{kind}: f16 operand differs");
    }
}

fn out(v: &[f32]) -> Output {
    Output::Single(F16Tensor::new(1, 1, v.len(), v.iter().map(|&x| f16::from_f32(x)).collect()).unwrap())
}

#[test]
fn peer_check_is_loose_but_not_blind() {
    let reference = out(&[1.0, -2.0, 100.0]);
    assert_eq!(check_peer(&reference, &reference), Ok(PeerAgreement::BitExact));
    match check_peer(&out(&[1.005, -2.0, 100.5]), &reference) {
        Ok(PeerAgreement::Close { max_abs_err }) => assert!((max_abs_err - 0.5).abs() < 1e-9),
        other => panic!("expected close, got {other:?}"),
    }
    assert!(check_peer(&out(&[1.5, -2.0, 100.0]), &reference).is_err());
    assert!(check_peer(&out(&[1.0, f32::NAN, 100.0]), &reference).is_err());
    assert!(check_peer(&out(&[1.0, -2.0]), &out(&[1.0, -2.0, 3.0])).is_err());
}

#[test]
fn read_fraction_is_the_read_ceiling_over_the_kernel() {
    let mut m = measurement(Some(vec![25.0, 20.0, 30.0]), Some(vec![60.0]), PASS);
    m.read = Some(Samples::new(vec![19.0, 21.0, 23.0]).unwrap());
    m.read_config = "strided x4, 2/SM x 256".into();
    let r = Row::new(&m, &H100);
    assert_eq!(r.read_us, Some(21.0));
    assert!(close(r.read_fraction.unwrap(), 21.0 / 25.0));
    assert_eq!(r.read_config, "strided x4, 2/SM x 256");
    // A failed kernel keeps its read ceiling but has no fraction; a missing ceiling has neither.
    m.kernel = None;
    let failed = Row::new(&m, &H100);
    assert_eq!((failed.read_us, failed.read_fraction), (Some(21.0), None));
    let none = Row::new(&measurement(Some(vec![10.0]), None, PASS), &H100);
    assert_eq!((none.read_us, none.read_fraction), (None, None));
    // Geometric means need the fraction on every row of the problem.
    let rows = [Row::new(&measurement(Some(vec![10.0]), None, PASS), &H100), r.clone()];
    assert_eq!(geomeans(&rows)[0].read_fraction, None);
    let g = geomeans(&[r.clone(), r]);
    assert!(close(g[0].read_fraction.unwrap(), 21.0 / 25.0));
}

#[test]
fn rotation_totals_more_than_three_l2_in_whole_rounds() {
    let l2 = 60 << 20;
    // 66 MB GEMV weights: 3 sets read 198 MB > 180 MB; 21 launches = 7 whole rounds.
    let r = Rotation::new(66_060_288, l2);
    assert_eq!((r.sets, r.launches), (3, 21));
    assert!(r.dram_cold(l2));
    assert_eq!((r.set_of(0), r.set_of(2), r.set_of(3), r.set_of(20)), (0, 2, 0, 2));
    // 8 MB: 23 sets, one round each.
    let r = Rotation::new(8_300_000, l2);
    assert_eq!((r.sets, r.launches), (23, 23));
    assert!(r.dram_cold(l2) && r.sets as u64 * r.set_bytes > 3 * l2 as u64);
    // A set larger than 3x L2 still alternates between two.
    let r = Rotation::new(1 << 30, l2);
    assert_eq!((r.sets, r.launches), (2, MIN_GRAPH_LAUNCHES));
    // Tiny sets are capped (and say the L2 stays warm); huge ones by memory, never below 2.
    let r = Rotation::new(18_432, l2);
    assert_eq!(r.sets, nvfp4::bench::graph::MAX_SETS);
    assert!(!r.dram_cold(l2));
    assert!(r.launches >= MIN_GRAPH_LAUNCHES && r.launches.is_multiple_of(r.sets));
    let r = Rotation::new(6_000_000_000, l2);
    assert_eq!(r.sets, 2);
    for bytes in [1, 1000, 7_000_000, 33_030_144, 500_000_000] {
        let r = Rotation::new(bytes, l2);
        assert!(r.sets >= 2 && r.launches >= MIN_GRAPH_LAUNCHES && r.launches.is_multiple_of(r.sets), "{bytes}: {r:?}");
        assert!(r.sets as u64 * r.set_bytes <= nvfp4::bench::graph::MAX_SET_BYTES.max(2 * bytes));
    }
}

#[test]
fn input_bytes_leave_out_the_output() {
    for shape in [
        Shape::Gemv { m: 256, k: 512, l: 2 },
        Shape::Gemm { m: 128, n: 256, k: 256, l: 1 },
        bench_shapes(ProblemKind::GroupedGemm).remove(3),
    ] {
        let p = generate(&shape, 1).unwrap();
        let reference = p.run(&nvfp4::CpuBackend).unwrap();
        let out: u64 = reference.tensors().iter().map(|t| 2 * t.data().len() as u64).sum();
        assert_eq!(input_bytes(&p, &reference) + out, p.bytes(), "{shape}");
    }
    // GEMV 256x512x2: A 2*256*(256 + 32) bytes, B 2*(256 + 32).
    let p = generate(&Shape::Gemv { m: 256, k: 512, l: 2 }, 1).unwrap();
    assert_eq!(input_bytes(&p, &p.run(&nvfp4::CpuBackend).unwrap()), 2 * 256 * 288 + 2 * 288);
}

#[test]
fn protocols_parse_and_print() {
    assert_eq!("cold".parse::<Protocol>().unwrap(), Protocol::Cold);
    assert_eq!("graph".parse::<Protocol>().unwrap(), Protocol::Graph);
    assert!(matches!("warm".parse::<Protocol>(), Err(Error::Invalid(_))));
    assert_eq!(Protocol::Graph.to_string(), "graph");
    assert_eq!(Options::default().mode, Protocol::Cold);
}

#[test]
fn json_and_table_say_which_protocol() {
    let mut r = report();
    let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(v["mode"], "cold");
    assert_eq!(v["launch_floor"]["cold_us"], 3.25);
    assert_eq!(v["launch_floor"]["graph_us"], 1.5);
    for key in ["read_us", "read_fraction", "read_config", "graph", "peer_graph"] {
        assert!(v["rows"][0].get(key).is_some(), "row field `{key}` missing");
    }
    assert!(v["rows"][0]["graph"].is_null() && v["rows"][0]["read_us"].is_null());
    assert!(v["geomean"][0].get("read_fraction").is_some());
    let t = r.table();
    assert!(t.contains("protocol: cold single launch"), "{t}");
    assert!(t.contains("launch floor (empty kernel): cold 3.25 µs, graph 1.50 µs"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("problem") && l.contains("read µs") && l.contains("%read")));

    r.mode = "graph".into();
    let mut m = measurement(Some(vec![20.0]), Some(vec![60.0]), PASS);
    m.read = Some(Samples::new(vec![18.0]).unwrap());
    m.graph = Some(GraphRun { launches: 21, sets: 3, dram_cold: true, chained: true });
    m.peer_graph = Some(GraphRun { launches: 20, sets: 2, dram_cold: true, chained: false });
    r.rows = vec![Row::new(&m, &H100)];
    let t = r.table();
    assert!(t.contains("protocol: graph"), "{t}");
    assert!(t.contains("graph (nvfp4): 21 launches over 3 input sets, PDL-chained"), "{t}");
    assert!(t.contains("graph (peer): 20 launches over 2 input sets\n"), "{t}");
    assert!(t.contains("90.0"), "read fraction 18/20 in the table: {t}");
    let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(v["mode"], "graph");
    assert_eq!(v["rows"][0]["graph"]["launches"], 21);
    assert_eq!(v["rows"][0]["graph"]["chained"], true);
    assert_eq!(v["rows"][0]["peer_graph"]["sets"], 2);
    assert_eq!(v["rows"][0]["read_fraction"], 0.9);
}
