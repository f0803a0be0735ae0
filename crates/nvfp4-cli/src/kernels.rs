//! `nvfp4 kernels`: compile every kernel with NVRTC for an architecture (the NVRTC library is
//! needed, a GPU is not) and print each kernel's registers, spills, stack and static shared memory
//! from ptxas's report. Exits non-zero on a compile error or on any spill, so CI can gate on it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nvfp4::backend::cuda::{kernel_reports_to, KernelReport, DEFAULT_ARCH};
use nvfp4::Error;

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

/// Compiles every kernel; with `cubin_dir`, the CUBINs are first written into a temporary folder
/// inside it and then renamed into place one by one, so no CUBIN is ever seen half written.
fn reports(arch: &str, cubin_dir: Option<&Path>) -> nvfp4::Result<Vec<KernelReport>> {
    let Some(dir) = cubin_dir else { return kernel_reports_to(arch, None) };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    let staging = dir.join(format!(".nvfp4-cubins.{}.tmp", std::process::id()));
    let result = (|| {
        fs::create_dir_all(&staging).map_err(io(&staging))?;
        let reports = kernel_reports_to(arch, Some(&staging))?;
        for entry in fs::read_dir(&staging).map_err(io(&staging))? {
            let from = entry.map_err(io(&staging))?.path();
            let Some(name) = from.file_name() else { continue };
            let to = dir.join(name);
            fs::rename(&from, &to).map_err(io(&to))?;
        }
        Ok(reports)
    })();
    let _ = fs::remove_dir_all(&staging);
    result
}

pub fn main(args: Args) -> Outcome {
    let reports = reports(&args.arch, args.cubin_dir.as_deref())?;
    let spilling: Vec<&KernelReport> = reports.iter().filter(|r| r.spills()).collect();
    if args.json {
        let doc = serde_json::json!({
            "arch": args.arch,
            "kernels": reports,
            "ok": spilling.is_empty(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| Error::Invalid(e.to_string()))?);
    } else {
        println!("NVRTC {} ({} kernels)", args.arch, reports.len());
        print!("{}", table(&reports));
    }
    if spilling.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for r in &spilling {
            eprintln!("error: kernel spills registers: {r}");
        }
        Ok(ExitCode::FAILURE)
    }
}
