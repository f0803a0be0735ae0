//! `nvfp4 route`: the router's answer printed without a GPU: every catalogue shape gets a family
//! and its plan, the declines say why, the overrides steer it as they steer a run, and a shape
//! no kernel takes is refused with the rules (exit 1).

mod common;

use std::process::Command;

use common::{assert_exit, stdout, Scratch};

/// `nvfp4 route ARGS` with `env` (and no override the caller's environment may hold), in a
/// scratch folder of its own (`test`: tests run at once).
fn route(test: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let dir = Scratch::new(test);
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvfp4"));
    c.arg("route").args(args).current_dir(&dir.0);
    for var in ["NVFP4_GEMM_SM90", "NVFP4_DUAL_SM90", "NVFP4_GROUPED_SM90", "NVFP4_MOE_GEMV"] {
        c.env_remove(var);
    }
    c.envs(env.iter().copied()).output().expect("run the nvfp4 binary")
}

#[test]
fn every_benchmark_shape_names_its_family_and_plan() {
    let o = route("route-bench", &["--shapes", "bench"], &[]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3 + 3 + 4 + 4, "{text}");
    for (prefix, family, symbol) in [
        ("gemv ", "gemv", "gemv_nvfp4_sm90_"),
        ("gemm ", "sm90", "gemm_nvfp4_sm90_ws_"),
        ("dual-gemm ", "sm90", "dual_gemm_nvfp4_sm90_ws_"),
        ("grouped-gemm ", "grouped", "grouped_gemm_nvfp4_sm90_ws_"),
    ] {
        for l in lines.iter().filter(|l| l.starts_with(prefix)) {
            assert!(l.contains(&format!(": {family}: {symbol}")), "{l}");
        }
    }
}

#[test]
fn overrides_and_refusals_are_printed_with_their_rule() {
    let o = route("route-small", &["gemm", "--shape", "128x256x256"], &[]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains(": small: gemm_nvfp4_small"), "{}", stdout(&o));
    let o = route("route-off", &["gemm", "--shape", "128x256x256"], &[("NVFP4_GEMM_SM90", "off")]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    assert!(text.contains(": fallback: ") && text.contains("[not sm90: disabled by NVFP4_GEMM_SM90=off]"), "{text}");
    let o = route("route-moe", &["grouped-gemm", "--shape", "moe:40,0,76/384/48"], &[]);
    assert_exit(&o, 1);
    let text = stdout(&o);
    assert!(
        text.contains("refused") && text.contains("K = 48") && text.contains("offsets are on the device"),
        "{text}"
    );
}

#[test]
fn w4a16_shapes_the_skeleton_declines_print_the_fallback() {
    let cases = [
        ("route-w16-gemm", ["gemm", "--shape", "40x130x48x3"], "gemm_w4a16bf16_sm90_mma [40x130x48x3]", "sm90"),
        ("route-w16-dual", ["dual-gemm", "--shape", "40x130x48"], "dual_gemm_w4a16bf16_sm90_mma [", "sm90"),
        ("route-w16-list", ["grouped-gemm", "--shape", "40,7/130,1/48,16"], "gemm_w4a16bf16_sm90_mma [", "grouped"),
        (
            "route-w16-moe",
            ["grouped-gemm", "--shape", "moe:40,0,76/384/48"],
            "grouped_gemm_w4a16bf16_sm90_mma [",
            "grouped",
        ),
    ];
    for (test, args, plan, skeleton) in cases {
        let o = route(test, &[&args[..], &["--act", "bf16"]].concat(), &[]);
        assert_exit(&o, 0);
        let text = stdout(&o);
        assert!(text.contains(&format!(": fallback: {plan}")), "{text}");
        assert!(text.contains(&format!("[not {skeleton}: K = ")) && text.contains("bf16->f32"), "{text}");
    }
}

#[test]
fn batch1_decode_routings_take_the_gemv_moe_kernels_unless_the_grouped_launch_is_forced() {
    for (test, act, symbol) in [
        ("route-moe-decode", &[][..], "gemv16_nvfp4_sm90_nvfp4_plain_to_f16_moe"),
        ("route-moe-decode-w16", &["--act", "bf16"][..], "gemv16_nvfp4_sm90_bf16_plain_to_bf16_moe"),
    ] {
        let o = route(test, &[&["grouped-gemm", "--shape", "moe:1,0,0,0,0,1,0,0/1536/2048"][..], act].concat(), &[]);
        assert_exit(&o, 0);
        let text = stdout(&o);
        assert!(text.contains(&format!(": gemv16_moe: {symbol} T=2 N=1536 K=2048 E=8")), "{text}");
    }
    let forced = [("NVFP4_GROUPED_SM90", "m256n16")];
    let o = route("route-moe-decode-forced", &["grouped-gemm", "--shape", "moe:1,0,0,0,0,1,0,0/1536/2048"], &forced);
    assert_exit(&o, 0);
    let text = stdout(&o);
    assert!(text.contains(": grouped: ") && text.contains("[not gemv16_moe: the grouped launch is forced"), "{text}");
}
