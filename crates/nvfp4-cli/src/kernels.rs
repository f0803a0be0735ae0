//! `nvfp4 kernels`: compile every kernel with NVRTC for an architecture (the NVRTC library is
//! needed, a GPU is not) and print each kernel's registers, spills, stack and static shared memory
//! from ptxas's report. Exits non-zero on a compile error or on any spill, so CI can gate on it.

use std::path::PathBuf;
use std::process::ExitCode;

use nvfp4::backend::cuda::{fill_cache, kernel_reports_of, KernelReport, DEFAULT_ARCH};
use nvfp4::Error;

use crate::console::{errln, out, outln};
use crate::exit::Outcome;

/// Arguments of `nvfp4 kernels`.
#[derive(clap::Args)]
pub struct Args {
    /// Target architecture as NVRTC names it (sm_90a for Hopper).
    #[arg(long, default_value = DEFAULT_ARCH)]
    arch: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write each kernel file's CUBIN into this folder (for `cuobjdump -sass`); each file
    /// appears whole or not at all.
    #[arg(long, value_name = "DIR")]
    cubin_dir: Option<PathBuf>,
    /// Only the kernel files whose name contains this text (e.g. `w4a16bf16`).
    #[arg(long, value_name = "TEXT", default_value = "")]
    only: String,
    /// Instead of the report: compile each kernel file as a launch does and store it in the CUBIN
    /// cache (`$NVFP4_CACHE_DIR`, else `$XDG_CACHE_HOME/nvfp4`, else `~/.cache/nvfp4`), so that
    /// the first calls on a GPU machine with the same NVRTC version skip compiling. Uses every
    /// core.
    #[arg(long, conflicts_with_all = ["json", "cubin_dir"])]
    fill_cache: bool,
}

fn table(reports: &[KernelReport]) -> String {
    let w = reports.iter().map(|r| r.symbol.len()).max().unwrap_or(6).max(6);
    let mut s = format!(
        "{:<16} {:<w$} {:>5} {:>11} {:>10} {:>6} {:>6}\n",
        "file", "kernel", "regs", "spill st B", "spill ld B", "stack", "smem"
    );
    for r in reports {
        s += &format!(
            "{:<16} {:<w$} {:>5} {:>11} {:>10} {:>6} {:>6}{}\n",
            r.file,
            r.symbol,
            r.registers,
            r.spill_stores,
            r.spill_loads,
            r.stack_bytes,
            r.smem_bytes,
            if r.spills() { "  SPILLS" } else { "" }
        );
    }
    s
}

pub fn main(args: Args) -> Outcome {
    if args.fill_cache {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let filled = fill_cache(&args.arch, &args.only, threads)?;
        let fresh = filled.iter().filter(|(_, f)| *f).count();
        outln!(
            "CUBIN cache for {}: {} kernel files, {fresh} compiled now, {} already there",
            args.arch,
            filled.len(),
            filled.len() - fresh
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Each CUBIN is written to a temporary file and renamed into place: whole or not at all.
    let reports = kernel_reports_of(&args.arch, args.cubin_dir.as_deref(), &args.only)?;
    let spilling: Vec<&KernelReport> = reports.iter().filter(|r| r.spills()).collect();
    if args.json {
        let doc = serde_json::json!({
            "arch": args.arch,
            "kernels": reports,
            "ok": spilling.is_empty(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc).map_err(|e| Error::Invalid(e.to_string()))?);
    } else {
        outln!("NVRTC {} ({} kernels)", args.arch, reports.len());
        out!("{}", table(&reports));
    }
    if spilling.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for r in &spilling {
            errln!("error: kernel spills registers: {r}");
        }
        Ok(ExitCode::FAILURE)
    }
}
