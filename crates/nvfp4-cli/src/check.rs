//! `nvfp4 check`: every catalogue test case plus extra edge shapes through a backend, compared
//! with the CPU reference (bit-identical where the data makes sums exact, docs/FORMAT.md §4's
//! tolerance otherwise).

use std::process::ExitCode;
use std::time::Instant;

use nvfp4::backend::{open_with, BackendChoice, Overrides};
use nvfp4::check::{cases, mode_for, run_case, what_check_proves, CaseSpec};
use nvfp4::problem::ProblemKind;

use crate::console::{errln, outln};
use crate::exit::Outcome;
use crate::ui::Progress;

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
    /// Print the results as JSON on stdout.
    #[arg(long)]
    json: bool,
}

struct Row {
    kind: ProblemKind,
    spec: CaseSpec,
    verdict: Result<nvfp4::check::Report, nvfp4::Error>,
    seconds: f64,
}

impl Row {
    fn passed(&self) -> bool {
        matches!(&self.verdict, Ok(r) if r.passed())
    }
}

pub fn main(args: Args) -> Outcome {
    let (backend, note) = open_with(args.backend, Overrides::from_env())?;
    if !args.json {
        errln!("{note}");
    }
    let kinds: Vec<ProblemKind> = args.problem.map_or(ProblemKind::ALL.to_vec(), |k| vec![k]);
    let mut todo: Vec<(ProblemKind, CaseSpec)> = Vec::new();
    for &kind in &kinds {
        todo.extend(
            cases(kind, args.seed)
                .into_iter()
                .filter(|c| !args.spec_only || c.label.starts_with("test:"))
                .map(|c| (kind, c)),
        );
    }
    let mut progress = Progress::new(todo.len(), args.json);
    let mut rows = Vec::with_capacity(todo.len());
    for (kind, spec) in todo {
        progress.start(&format!("{kind} {} {}", spec.label, spec.shape));
        let t0 = Instant::now();
        let verdict = run_case(backend.as_ref(), &spec);
        let row = Row { kind, spec, verdict, seconds: t0.elapsed().as_secs_f64() };
        if !row.passed() {
            progress.println(&format!(
                "FAIL {} {} {}: {}",
                row.kind,
                row.spec.label,
                row.spec.shape,
                verdict_text(&row)
            ));
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

fn verdict_text(row: &Row) -> String {
    match &row.verdict {
        Ok(r) => r.to_string(),
        Err(e) => format!("FAIL: error: {e}"),
    }
}

fn print_table(rows: &[Row], backend: &str) {
    outln!("{:<13} {:<9} {:<40} {:<8} {:<10} {:>8}  verdict", "problem", "case", "shape", "scales", "mode", "seconds");
    for r in rows {
        let first_line = verdict_text(r).lines().next().unwrap_or_default().to_string();
        outln!(
            "{:<13} {:<9} {:<40} {:<8} {:<10} {:>8.3}  {}",
            r.kind.name(),
            r.spec.label,
            truncate(&r.spec.shape.to_string(), 40),
            format!("{:?}", r.spec.layout).to_lowercase(),
            if mode_for(r.kind) == nvfp4::check::Mode::BitExact { "bit-exact" } else { "tolerance" },
            r.seconds,
            first_line
        );
    }
    for &kind in &ProblemKind::ALL {
        let of_kind: Vec<&Row> = rows.iter().filter(|r| r.kind == kind).collect();
        if !of_kind.is_empty() {
            let passed = of_kind.iter().filter(|r| r.passed()).count();
            outln!("{kind}: {passed}/{} cases pass on {backend}", of_kind.len());
        }
    }
    let failed = rows.iter().filter(|r| !r.passed()).count();
    outln!("{} passed, {failed} failed", rows.len() - failed);
    outln!("\nWhat this shows: {}", what_check_proves(backend));
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("{}...", &s[..n - 3])
    }
}

fn print_json(rows: &[Row], backend: &str) {
    let items: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (failures, max_abs_err) = match &r.verdict {
                Ok(rep) => (serde_json::json!(rep.failures), serde_json::json!(rep.max_abs_err)),
                Err(_) => (serde_json::Value::Null, serde_json::Value::Null),
            };
            serde_json::json!({
                "problem": r.kind.name(), "case": r.spec.label, "shape": r.spec.shape.to_string(),
                "seed": r.spec.seed, "scales": format!("{:?}", r.spec.layout).to_lowercase(),
                "alpha": r.spec.alpha, "passed": r.passed(), "failures": failures,
                "max_abs_err": max_abs_err, "seconds": r.seconds, "verdict": verdict_text(r),
            })
        })
        .collect();
    let failed = rows.iter().filter(|r| !r.passed()).count();
    outln!(
        "{}",
        serde_json::json!({
            "backend": backend, "passed": rows.len() - failed, "failed": failed,
            "what_this_shows": what_check_proves(backend), "cases": items,
        })
    );
}
