//! The fallback's verdicts and launch sizes, without a GPU.

use super::{MmaConfig, TILE_M};
use crate::backend::cuda::family::Modeled;
use crate::backend::cuda::overrides::Overrides;
use crate::backend::cuda::route::route;
use crate::backend::cuda::sm90::Forced;
use crate::format::{OutputDtype, ScaleLayout};
use crate::problem::{Rng, Shape};

const TYPES: [(OutputDtype, &str); 2] = [(OutputDtype::Bf16, "bf16"), (OutputDtype::F16, "f16")];

/// W4A16 shapes the skeleton declines (K % 32 != 0, K < 64) with more activation rows than the
/// W4A16 GEMV family takes (a GEMM of at most 8 rows is its):
/// (shape, the kernel's operation prefix).
fn declined_by_the_skeleton() -> Vec<(Shape, &'static str)> {
    let gemm = |m, n, k, l| Shape::Gemm { m, n, k, l };
    let dual = |m, n, k, l| Shape::DualGemm { m, n, k, l };
    vec![
        (gemm(40, 130, 48, 3), "gemm"),
        (gemm(9, 1, 16, 1), "gemm"),
        (gemm(130, 7, 32, 1), "gemm"),
        (gemm(9, 40, 4112, 1), "gemm"),
        (dual(40, 130, 48, 1), "dual_gemm"),
        (dual(7, 7, 16, 2), "dual_gemm"),
        (dual(130, 40, 32, 1), "dual_gemm"),
        // One group the skeleton cannot take sends the whole list to the fallback.
        (Shape::GroupedGemm { groups: vec![(40, 130, 256), (7, 1, 16)] }, "gemm"),
        (Shape::GroupedGemm { groups: vec![(1, 7, 4112), (130, 40, 48)] }, "gemm"),
        (Shape::Moe { n: 130, k: 48, counts: vec![40, 0, 7, 1] }, "grouped_gemm"),
        (Shape::Moe { n: 7, k: 32, counts: vec![130] }, "grouped_gemm"),
    ]
}

#[test]
fn w4a16_shapes_the_skeleton_declines_take_the_fallback_of_their_type() {
    for (shape, op) in declined_by_the_skeleton() {
        for (dtype, ty) in TYPES {
            for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                let meta = shape.op_meta_in(layout, Some(dtype));
                let r =
                    route(&meta, &Modeled::HOPPER, &Overrides::NONE).unwrap_or_else(|e| panic!("{shape} {ty}: {e}"));
                assert_eq!(r.family(), "fallback", "{shape} {ty}: {r}");
                assert!(r.plan().starts_with(&format!("{op}_w4a16{ty}_sm90_mma [")), "{shape} {ty}: {r}");
                assert!(r.plan().contains(&format!("mma.sync m16n8k16 {ty}->f32")), "{r}");
                assert!(
                    r.declined().iter().any(|(f, why)| (*f == "sm90" || *f == "grouped") && why.contains("K = ")),
                    "{r}"
                );
            }
        }
        // The W4A4 form of the same shape never gets a W4A16 kernel.
        if let Ok(r) = route(&shape.op_meta(ScaleLayout::Plain), &Modeled::HOPPER, &Overrides::NONE) {
            assert!(!r.plan().contains("w4a16"), "{shape}: {r}");
        }
    }
}

#[test]
fn the_w4a4_moe_form_is_still_declined_and_one_w4a16_row_stays_with_the_gemv() {
    let moe = Shape::Moe { n: 130, k: 48, counts: vec![40, 0, 7, 1] };
    let e = route(&moe.op_meta(ScaleLayout::Plain), &Modeled::HOPPER, &Overrides::NONE).err().expect("refused");
    assert!(e.to_string().contains("offsets are on the device"), "{e}");
    let one = Shape::Gemm { m: 1, n: 130, k: 48, l: 1 }.op_meta_in(ScaleLayout::Plain, Some(OutputDtype::Bf16));
    assert_eq!(route(&one, &Modeled::HOPPER, &Overrides::NONE).unwrap().family(), "gemv16");
}

#[test]
fn w4a16_forced_off_the_skeleton_takes_the_fallback() {
    let cases = [
        (Shape::Gemm { m: 256, n: 512, k: 256, l: 1 }, Overrides::gemm(Forced::Off), "NVFP4_GEMM_SM90=off"),
        (Shape::DualGemm { m: 256, n: 512, k: 256, l: 1 }, Overrides::dual(Forced::Off), "NVFP4_DUAL_SM90=off"),
        (
            Shape::Moe { n: 384, k: 512, counts: vec![40, 0, 76] },
            Overrides::grouped(Forced::Off),
            "NVFP4_GROUPED_SM90=off",
        ),
    ];
    for (shape, ov, var) in cases {
        let meta = shape.op_meta_in(ScaleLayout::Blocked, Some(OutputDtype::F16));
        let r = route(&meta, &Modeled::HOPPER, &ov).unwrap();
        assert_eq!(r.family(), "fallback", "{shape}: {r}");
        assert!(r.to_string().contains(var) && r.plan().contains("_w4a16f16_sm90_mma"), "{shape}: {r}");
    }
}

/// The MoE form launches enough row tiles for any routing of T tokens over E experts (each
/// expert's tokens in ceil(c / TILE_M) tiles), and no more than that bound.
#[test]
fn the_moe_grid_covers_every_routing() {
    let mut rng = Rng::new(3);
    for _ in 0..2000 {
        let e = 1 + rng.below(200) as usize;
        let t = 1 + rng.below(1000) as usize;
        // Random cuts of 0..t into e ranges, some empty.
        let mut ends: Vec<usize> = (0..e).map(|_| rng.below(t as u32 + 1) as usize).collect();
        ends.sort_unstable();
        *ends.last_mut().unwrap() = t;
        let tiles: usize =
            std::iter::once(0).chain(ends.iter().copied()).zip(&ends).map(|(s, &x)| (x - s).div_ceil(TILE_M)).sum();
        let config = MmaConfig::moe("k", OutputDtype::Bf16, (t, 130, 48), e);
        assert_eq!(config.grid % 3, 0, "130 columns: 3 column tiles");
        assert!(tiles <= config.grid / 3, "T = {t}, E = {e}: {tiles} tiles, {} launched", config.grid / 3);
    }
    // One token per expert: exactly one tile each.
    assert_eq!(MmaConfig::moe("k", OutputDtype::F16, (40, 64, 16), 40).grid, 40);
    assert_eq!(MmaConfig::moe("k", OutputDtype::F16, (640, 64, 16), 1).grid, 10);
}
