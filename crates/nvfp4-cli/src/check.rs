//! `nvfp4 check`: every catalogue test case plus extra edge shapes through a backend, compared
//! with a reference (bit-identical where the data makes sums exact, docs/FORMAT.md §4's
//! tolerance otherwise), in both modes: W4A4 (NVFP4 activations, against the CPU reference) and
//! W4A16 (16-bit activations, docs/FORMAT.md §10, against the check's own reference, in an exact
//! and a random tier). The rows and their printing are in `check_report.rs`.

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Instant;

use nvfp4::backend::{open_with, BackendChoice, Overrides};
use nvfp4::check::w4a16::{cases16, run_case16, Case16};
use nvfp4::check::{cases, mode_for, run_case, CaseSpec};
use nvfp4::problem::{ProblemKind, Tier};

use crate::check_report::{print_json, print_table, Row, Verdict};
use crate::exit::{usage, Outcome};
use crate::ui::Progress;

/// Which cases `check` runs: W4A4, W4A16, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// NVFP4 activations (docs/FORMAT.md §3).
    W4a4,
    /// 16-bit activations (docs/FORMAT.md §10).
    W4a16,
}

impl FromStr for Form {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "w4a4" => Ok(Form::W4a4),
            "w4a16" => Ok(Form::W4a16),
            _ => Err(format!("unknown mode `{s}` (w4a4, w4a16)")),
        }
    }
}

/// Arguments of `nvfp4 check`.
#[derive(clap::Args)]
pub struct Args {
    /// One problem (gemv, gemm, dual-gemm, grouped-gemm); all four when absent.
    problem: Option<ProblemKind>,
    /// auto (cuda when a GPU is present), cpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Base generator seed (case n uses seed + n).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only the catalogue's test shapes (docs/FORMAT.md §6), not the extra edge shapes.
    #[arg(long)]
    spec_only: bool,
    /// Only one mode: w4a4 (NVFP4 activations) or w4a16 (16-bit activations); both when absent.
    #[arg(long)]
    mode: Option<Form>,
    /// Only the W4A16 cases of one tier: exact (bit-identical) or random (tolerance).
    #[arg(long)]
    tier: Option<Tier>,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// One case to run, of either mode.
enum Todo {
    W4a4(ProblemKind, CaseSpec),
    W4a16(ProblemKind, Case16),
}

impl Todo {
    fn describe(&self) -> String {
        match self {
            Todo::W4a4(kind, c) => format!("{kind} {} {}", c.label, c.shape),
            Todo::W4a16(kind, c) => format!("{kind} w4a16 {} {} {}", c.tier, c.label, c.shape),
        }
    }

    fn run(self, backend: &dyn nvfp4::Backend) -> Row {
        let t0 = Instant::now();
        match self {
            Todo::W4a4(kind, spec) => {
                let verdict = run_case(backend, &spec).map(|r| Verdict::of(&r));
                Row::w4a4(kind, spec, mode_for(kind), verdict, t0.elapsed().as_secs_f64())
            }
            Todo::W4a16(kind, spec) => {
                let verdict = run_case16(backend, &spec).map(|r| Verdict::of(&r));
                Row::w4a16(kind, spec, verdict, t0.elapsed().as_secs_f64())
            }
        }
    }
}

/// The cases the arguments select, W4A4 before W4A16 for each problem.
fn todo(args: &Args) -> Vec<Todo> {
    let kinds: Vec<ProblemKind> = args.problem.map_or(ProblemKind::ALL.to_vec(), |k| vec![k]);
    let wanted = |f: Form| args.mode.is_none_or(|m| m == f);
    let spec = |label: &str| !args.spec_only || label.starts_with("test:");
    let mut out = Vec::new();
    for &kind in &kinds {
        if wanted(Form::W4a4) && args.tier.is_none() {
            out.extend(cases(kind, args.seed).into_iter().filter(|c| spec(&c.label)).map(|c| Todo::W4a4(kind, c)));
        }
        if wanted(Form::W4a16) {
            out.extend(
                cases16(kind, args.seed)
                    .into_iter()
                    .filter(|c| spec(&c.label) && args.tier.is_none_or(|t| t == c.tier))
                    .map(|c| Todo::W4a16(kind, c)),
            );
        }
    }
    out
}

pub fn main(args: Args) -> Outcome {
    if args.tier.is_some() && args.mode == Some(Form::W4a4) {
        return Err(usage("--tier selects W4A16 cases; --mode w4a4 has none"));
    }
    let (backend, note) = open_with(args.backend, Overrides::from_env())?;
    if !args.json {
        crate::console::errln!("{note}");
    }
    let todo = todo(&args);
    let mut progress = Progress::new(todo.len(), args.json);
    let mut rows = Vec::with_capacity(todo.len());
    for case in todo {
        progress.start(&case.describe());
        let row = case.run(backend.as_ref());
        if !row.passed() {
            progress.println(&format!("FAIL {}: {}", row.describe(), row.verdict_text()));
        }
        rows.push(row);
        progress.step();
    }
    progress.finish();
    let failed = rows.iter().filter(|r| !r.passed()).count();
    if args.json {
        print_json(&rows, backend.name());
    } else {
        print_table(&rows, backend.name());
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
