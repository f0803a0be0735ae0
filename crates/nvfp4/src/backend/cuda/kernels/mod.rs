//! The kernel registry: every `.cu` module with its symbols and, beside each, the parameter
//! structs its kernels take, plus the header `generated.cuh` that carries everything Rust and
//! CUDA share (struct layouts, tile sizes, the shared-memory carve-up), written once here.
//!
//! Depends only on the runtime layer; compilation, planning and launching depend on this.

#[cfg(test)]
mod decode_packed;
#[cfg(test)]
mod decode_w16;
pub mod fallback;
pub mod floors;
pub mod gemv;
pub mod gemv16;
pub mod grouped;
mod module;
pub mod pack;
pub mod quantize;
pub mod sm90;
pub mod small;

use std::sync::OnceLock;

pub use module::KernelModule;

/// Every kernel module of the library.
pub static MODULES: [&KernelModule; 24] = [
    &gemv::GEMV,
    &gemv16::GEMV16,
    &fallback::FALLBACK,
    &fallback::FALLBACK16,
    &small::SMALL,
    &sm90::DECODE_X,
    &sm90::GEMM_SM90,
    &sm90::DUAL_SM90,
    &sm90::GROUPED_SM90,
    &sm90::GEMM16_BF16_SM90,
    &sm90::GEMM16_F16_SM90,
    &sm90::DUAL16_BF16_SM90,
    &sm90::DUAL16_F16_SM90,
    &sm90::GROUPED16_BF16_SM90,
    &sm90::GROUPED16_F16_SM90,
    &sm90::GEMM16P_BF16_SM90,
    &sm90::GEMM16P_F16_SM90,
    &sm90::DUAL16P_BF16_SM90,
    &sm90::DUAL16P_F16_SM90,
    &sm90::GROUPED16P_BF16_SM90,
    &sm90::GROUPED16P_F16_SM90,
    &quantize::QUANTIZE,
    &floors::FLOORS,
    &pack::PACK,
];

/// Kernels that may be launched as programmatic dependents of the previous kernel on their stream
/// (SPEC §7's graph protocol chains launches this way): each executes `griddepcontrol.wait`
/// (`ptx::wait_prerequisites`) before it touches memory an earlier kernel may write or still read
/// (its output, workspace, counters; reading operands that no kernel writes may come first).
/// A bound operation chains its first kernel only when that kernel is listed here or its whole
/// module is in [`PDL_READY_MODULES`]; a kernel made ready adds its symbol.
pub static PDL_READY: &[&str] = &[
    // kernels/decode_x_sm90.cu (the GEMM's and dual GEMM's first kernel): prefetches W, then
    // waits before it reads X or writes the decoded X that the previous launch may still read.
    sm90::DECODE_X_SYMBOL,
    floors::EMPTY_SYMBOL,
    floors::READ_STRIDED4_SYMBOL,
    floors::READ_STRIDED8_SYMBOL,
    floors::READ_CONTIGUOUS8_SYMBOL,
];

/// Modules whose every kernel is ready in the sense of [`PDL_READY`], and more: none reads or
/// writes global memory before its `griddepcontrol.wait`, weights included, so it may be chained
/// behind any kernel whatever that kernel writes ([`pdl_safe`]). kernels/gemv.cu and
/// kernels/gemv16.cu wait before their first window (the MoE walker before its table);
/// kernels/gemm_small.cu waits first; the W4A16 GEMM and dual GEMM only ask their first W stages
/// into L2 before it (`prefetch_packed_w` in sm90/producer.cuh: a prefetch cannot return stale
/// data).
pub static PDL_READY_MODULES: &[&KernelModule] = &[
    &gemv::GEMV,
    &gemv16::GEMV16,
    &small::SMALL,
    &sm90::GEMM16_BF16_SM90,
    &sm90::GEMM16_F16_SM90,
    &sm90::DUAL16_BF16_SM90,
    &sm90::DUAL16_F16_SM90,
    &sm90::GEMM16P_BF16_SM90,
    &sm90::GEMM16P_F16_SM90,
    &sm90::DUAL16P_BF16_SM90,
    &sm90::DUAL16P_F16_SM90,
];

/// True when `symbol`'s kernel reads and writes nothing before its wait (its module is in
/// [`PDL_READY_MODULES`]): chaining it is safe behind any kernel, even one that wrote its
/// weights. The W4A4 GEMM's pre-pass is ready but not safe in this sense: it lets the main
/// kernel read W before the pre-pass's own wait returns.
pub fn pdl_safe(symbol: &str) -> bool {
    PDL_READY_MODULES.iter().any(|m| m.symbols.contains(&symbol))
}

/// True when `symbol`'s kernel may be launched as a programmatic dependent (see [`PDL_READY`]).
pub fn pdl_ready(symbol: &str) -> bool {
    PDL_READY.contains(&symbol) || PDL_READY_MODULES.iter().any(|m| m.symbols.contains(&symbol))
}

/// The handwritten headers, `#include`d by these names (NVRTC has no include path).
const STATIC_HEADERS: [(&str, &str); 28] = [
    ("ptx.cuh", include_str!("../../../../kernels/ptx.cuh")),
    ("nvfp4.cuh", include_str!("../../../../kernels/nvfp4.cuh")),
    ("output.cuh", include_str!("../../../../kernels/output.cuh")),
    ("gemv_tiles.cuh", include_str!("../../../../kernels/gemv_tiles.cuh")),
    ("gemv_stream.cuh", include_str!("../../../../kernels/gemv_stream.cuh")),
    ("gemv16_cols.cuh", include_str!("../../../../kernels/gemv16_cols.cuh")),
    ("gemv16_moe.cuh", include_str!("../../../../kernels/gemv16_moe.cuh")),
    ("block_scan.cuh", include_str!("../../../../kernels/block_scan.cuh")),
    ("fallback/stage.cuh", include_str!("../../../../kernels/fallback/stage.cuh")),
    ("fallback/moe.cuh", include_str!("../../../../kernels/fallback/moe.cuh")),
    ("fallback/body.cuh", include_str!("../../../../kernels/fallback/body.cuh")),
    ("sm90/config.cuh", include_str!("../../../../kernels/sm90/config.cuh")),
    ("sm90/schedule.cuh", include_str!("../../../../kernels/sm90/schedule.cuh")),
    ("sm90/producer.cuh", include_str!("../../../../kernels/sm90/producer.cuh")),
    ("sm90/mainloop.cuh", include_str!("../../../../kernels/sm90/mainloop.cuh")),
    ("sm90/decode_w16.cuh", include_str!("../../../../kernels/sm90/decode_w16.cuh")),
    ("sm90/mainloop16.cuh", include_str!("../../../../kernels/sm90/mainloop16.cuh")),
    ("sm90/decode_packed.cuh", include_str!("../../../../kernels/sm90/decode_packed.cuh")),
    ("sm90/mainloop_packed.cuh", include_str!("../../../../kernels/sm90/mainloop_packed.cuh")),
    ("sm90/fixup.cuh", include_str!("../../../../kernels/sm90/fixup.cuh")),
    ("sm90/kreduce.cuh", include_str!("../../../../kernels/sm90/kreduce.cuh")),
    ("sm90/store.cuh", include_str!("../../../../kernels/sm90/store.cuh")),
    ("sm90/epilogue.cuh", include_str!("../../../../kernels/sm90/epilogue.cuh")),
    ("sm90/kernel.cuh", include_str!("../../../../kernels/sm90/kernel.cuh")),
    ("sm90/decode_x.cuh", include_str!("../../../../kernels/sm90/decode_x.cuh")),
    ("sm90/prefetch_w.cuh", include_str!("../../../../kernels/sm90/prefetch_w.cuh")),
    ("sm90/grouped.cuh", include_str!("../../../../kernels/sm90/grouped.cuh")),
    ("sm90/grouped_table.cuh", include_str!("../../../../kernels/sm90/grouped_table.cuh")),
];

/// Name of the generated header.
pub const GENERATED: &str = "generated.cuh";

/// `generated.cuh`: the integer types come from ptx.cuh; then the tensor-map type, every kernel
/// struct (from its `kernel_struct!` field list, with layout asserts) and each kernel family's
/// sizes (sm90, quant, mma, small, gemv).
pub fn generated_header() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let mut s = String::from(
            "// generated.cuh: written by backend/cuda/kernels/ when the kernels are compiled; do not edit.\n\
             // Every struct layout and size that Rust and CUDA share, from their one definition in Rust.\n\
             #pragma once\n#include \"ptx.cuh\"\n\n\
             // A CUtensorMap: 128 opaque bytes encoded on the host by cuTensorMapEncodeTiled.\n\
             struct alignas(64) TmaMap {\n  u64 bits[16];\n};\n\n",
        );
        for decl in [
            gemv::GemvParams::cuda_decl(),
            fallback::MmaProblem::cuda_decl(),
            fallback::MmaParams::cuda_decl(),
            small::SmallParams::cuda_decl(),
            sm90::XDecodeParams::cuda_decl(),
            sm90::Sm90MainloopArgs::cuda_decl(),
            sm90::Sm90EpilogueArgs::cuda_decl(),
            sm90::Sm90Problem::cuda_decl(),
            sm90::Sm90Schedule::cuda_decl(),
            sm90::Sm90Params::cuda_decl(),
            sm90::WPrefetch::cuda_decl(),
            sm90::DecodeXParams::cuda_decl(),
            grouped::GroupedUnit::cuda_decl(),
            grouped::GroupSegment::cuda_decl(),
            grouped::GroupedBuild::cuda_decl(),
            grouped::GroupedPrepParams::cuda_decl(),
            grouped::Sm90GroupedParams::cuda_decl(),
            quantize::QuantizeParams::cuda_decl(),
            floors::FloorReadParams::cuda_decl(),
            pack::PackW16Params::cuda_decl(),
        ] {
            s += &decl;
            s.push('\n');
        }
        s += &sm90::cuda_sizes();
        s += &quantize::cuda_sizes();
        s += &fallback::cuda_sizes();
        s += &small::cuda_sizes();
        s += &gemv::cuda_sizes();
        s += &gemv16::cuda_sizes();
        s
    })
}

/// Every header a module may include, as (name, text).
pub fn headers() -> Vec<(&'static str, &'static str)> {
    let mut h = STATIC_HEADERS.to_vec();
    h.push((GENERATED, generated_header()));
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `source` stamps out the skeleton kernel `sym` (`OP_nvfp4_sm90_ws_m{BM}n{BN}`,
    /// `OP_w4a16{ACT}_sm90_ws_m{BM}n{BN}` or `OP_w4a16{ACT}p_sm90_ws_m{BM}n{BN}`): a line
    /// `#define NAME(BM, BN) NVFP4_SM90_KERNEL(OP, ...)` (`NVFP4_SM90_KERNEL16(OP, ACT, ...)`,
    /// `NVFP4_SM90_KERNEL16P(OP, ACT, ...)`), a line `NVFP4_SM90_VARIANTS(NAME)`, and (BM, BN) in
    /// the variant list of the generated header.
    fn stamped(source: &str, sym: &str) -> bool {
        let Some((head, tile)) = sym.split_once("_sm90_ws_m") else { return false };
        let macro_args = match head.split_once("_w4a16") {
            // The packed weights' kernels: OP_w4a16{ACT}p_sm90_ws_*, NVFP4_SM90_KERNEL16P.
            Some((op, act)) if act.ends_with('p') => format!("NVFP4_SM90_KERNEL16P({op}, {},", &act[..act.len() - 1]),
            Some((op, act)) => format!("NVFP4_SM90_KERNEL16({op}, {act},"),
            None => match head.strip_suffix("_nvfp4") {
                Some(op) => format!("NVFP4_SM90_KERNEL({op},"),
                None => return false,
            },
        };
        let Some((bm, bn)) = tile.split_once('n') else { return false };
        let list = generated_header().lines().find_map(|l| l.strip_prefix("#define NVFP4_SM90_VARIANTS(X)"));
        let listed = list.is_some_and(|l| l.contains(&format!(" X({bm}, {bn})")));
        let expanded = source.lines().any(|l| {
            let def = l.strip_prefix("#define ").and_then(|d| d.split_once("(BM, BN) "));
            def.is_some_and(|(name, body)| {
                body.starts_with(&macro_args) && source.lines().any(|x| x == format!("NVFP4_SM90_VARIANTS({name})"))
            })
        });
        listed && expanded
    }

    #[test]
    fn every_symbol_is_defined_by_its_source() {
        for m in MODULES {
            for sym in m.symbols {
                let defined = m.source.contains(sym) || stamped(m.source, sym);
                assert!(defined, "{}: no definition of {sym}", m.file);
            }
        }
        assert!(!stamped(sm90::GEMM_SM90.source, "dual_gemm_nvfp4_sm90_ws_m256n16"));
        assert!(!stamped(sm90::GEMM_SM90.source, "gemm_nvfp4_sm90_ws_m64n16"));
        assert!(stamped(sm90::GEMM16_BF16_SM90.source, "gemm_w4a16bf16_sm90_ws_m256n16"));
        assert!(stamped(sm90::GEMM16_F16_SM90.source, "gemm_w4a16f16_sm90_ws_m128n256"));
        assert!(!stamped(sm90::GEMM16_F16_SM90.source, "gemm_w4a16bf16_sm90_ws_m128n256"));
        assert!(!stamped(sm90::GEMM16_BF16_SM90.source, "gemm_nvfp4_sm90_ws_m256n16"));
        assert!(!stamped(sm90::GEMM16_BF16_SM90.source, "gemm_w4a16fp8_sm90_ws_m256n16"));
        assert!(!stamped(sm90::DUAL16_BF16_SM90.source, "gemm_w4a16bf16_sm90_ws_m256n16"));
        assert!(stamped(sm90::DUAL16P_F16_SM90.source, "dual_gemm_w4a16f16p_sm90_ws_m128n256"));
        assert!(!stamped(sm90::GEMM16P_F16_SM90.source, "gemm_w4a16f16_sm90_ws_m128n256"));
        assert!(!stamped(sm90::GEMM16_F16_SM90.source, "gemm_w4a16f16p_sm90_ws_m128n256"));
    }

    #[test]
    fn pdl_ready_modules_wait() {
        // The wait is in the module's source or in a skeleton header it includes (gemv_tiles.cuh).
        let waits = |src: &str| {
            src.contains("wait_prerequisites()")
                || STATIC_HEADERS.iter().any(|(name, h)| {
                    src.contains(&format!("#include \"{name}\"")) && h.contains("ptx::wait_prerequisites();")
                })
        };
        for m in PDL_READY_MODULES {
            assert!(MODULES.iter().any(|x| x.file == m.file), "{} is not registered", m.file);
            assert!(waits(m.source), "{}: never waits", m.file);
            assert!(m.symbols.iter().all(|s| pdl_ready(s)), "{}", m.file);
        }
        assert!(pdl_ready("gemv_nvfp4_sm90_blocked_k16_bf16") && !pdl_ready("grouped_prepare_sm90"));
    }

    #[test]
    fn pdl_ready_kernels_are_defined_and_wait() {
        for sym in PDL_READY {
            let m = MODULES.iter().find(|m| m.symbols.contains(sym));
            let m = m.unwrap_or_else(|| panic!("{sym} is in no module"));
            // The empty kernel touches no memory; every other one must wait before it does.
            if *sym != floors::EMPTY_SYMBOL {
                assert!(m.source.contains("wait_prerequisites()"), "{}: {sym} never waits", m.file);
            }
        }
        assert!(pdl_ready(floors::EMPTY_SYMBOL) && !pdl_ready("no_such_kernel"));
    }

    #[test]
    fn generated_header_carries_layouts_and_sizes() {
        let h = generated_header();
        for needle in [
            "struct Sm90Params {",
            "static_assert(sizeof(Sm90Problem) == 960",
            "  Sm90EpilogueArgs epi;\n",
            "TmaMap tmap_w[2];",
            "const u8* sf_w[2];",
            "template <> struct Layout<2, 128, 256, false>",
            "template <> struct Layout<1, 256, 16, true>",
            "constexpr int THREADS = 384;",
            "constexpr int PACK_ROT[2][4][4] = {{{0, 0, 0, 0}, {4, 4, 4, 4}, {10, 10, 10, 10}, {6, 14, 14, 14}}, \
             {{0, 0, 0, 0}, {3, 3, 3, 3}, {6, 6, 6, 1}, {9, 9, 9, 2}}};",
            "namespace quant {\nconstexpr int THREADS = 256;",
            "i32 reverse;",
            "\n#define NVFP4_SM90_VARIANTS(X) X(256, 16) X(256, 32) X(256, 64) X(256, 128) X(128, 128) X(128, 256)\n",
            "template <int BM, int BN>\nconstexpr bool W16_SKIP_dual_gemm = false || (BM == 128 && BN == 256);\n",
            "template <int BM, int BN>\nconstexpr bool W16_SKIP_gemm = false;\n",
        ] {
            assert!(h.contains(needle), "missing `{needle}` in:\n{h}");
        }
        let names: Vec<&str> = headers().iter().map(|(n, _)| *n).collect();
        assert!(names.contains(&GENERATED) && names.contains(&"sm90/kernel.cuh"));
    }
}
