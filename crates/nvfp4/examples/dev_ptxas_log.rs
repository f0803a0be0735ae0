//! Development aid: prints ptxas's log lines for the kernel files whose name contains the
//! argument (every file when none; exactly that file for a name ending in `.cu`), e.g. to look for wgmma serialization warnings and spills (each line after its function's name; `DEV_PTXAS_ALL=1`: every line). Needs NVRTC,
//! not a GPU: `cargo run --release --example dev_ptxas_log -- w4a16bf16p`. `DEV_CUBIN_DIR=dir` also
//! writes each module's CUBIN there (`dir/gemv16.cubin`), for `nvdisasm -c` (PyPI's
//! nvidia-cuda-nvdisasm has it): the SASS without a GPU.
use nvfp4::backend::cuda::compile::compile;
use nvfp4::backend::cuda::kernels::MODULES;

fn main() {
    let only = std::env::args().nth(1).unwrap_or_default();
    // DEV_PTXAS_ALL=1 prints every line of the log (registers per function, too).
    let every_line = std::env::var("DEV_PTXAS_ALL").is_ok_and(|v| v == "1");
    // A name ending in ".cu" is one file exactly.
    let pick = |f: &str| if only.ends_with(".cu") { f == only } else { f.contains(&only) };
    let cubin_dir = std::env::var_os("DEV_CUBIN_DIR").map(std::path::PathBuf::from);
    for m in MODULES.iter().filter(|m| pick(m.file)) {
        match compile(m, nvfp4::backend::cuda::DEFAULT_ARCH, true) {
            Ok((cubin, log)) => {
                if let Some(dir) = &cubin_dir {
                    let path = dir.join(m.file.replace(".cu", ".cubin"));
                    if let Err(e) = std::fs::write(&path, &cubin) {
                        println!("{}: writing {}: {e}", m.file, path.display());
                    }
                }
                // ptxas names a function ("Compiling entry function '...'") before its lines.
                let mut function = "";
                for line in log.lines().filter(|l| !l.contains("Compile time") && !l.contains("bytes gmem")) {
                    if let Some(name) = line.split("function '").nth(1) {
                        function = name.split('\'').next().unwrap_or(name);
                    }
                    let spills = line.contains("spill") && !line.contains(" 0 bytes spill stores, 0 bytes spill loads");
                    if every_line || line.contains("arning") || line.contains("erializ") || spills {
                        println!("{}: {function}: {line}", m.file);
                    }
                }
                println!("{}: compiled", m.file);
            }
            Err(e) => println!("{}: {e}", m.file),
        }
    }
}
