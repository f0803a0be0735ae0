//! What `nvfp4 check` prints: one row per case of either mode (a table, or one JSON document),
//! a count per problem and mode, and what a pass on the backend establishes.

use std::fmt::Display;

use nvfp4::check::w4a16::{short, what_w4a16_check_proves, Case16};
use nvfp4::check::{what_check_proves, CaseSpec, Mode, Report};
use nvfp4::problem::{ProblemKind, Shape, Tier};
use nvfp4::{OutputDtype, ScaleLayout};

use crate::console::outln;

/// A comparison's outcome, whatever the type of its values.
pub struct Verdict {
    passed: bool,
    failures: usize,
    max_abs_err: f64,
    text: String,
}

impl Verdict {
    pub fn of<V: Display>(r: &Report<V>) -> Self {
        Self { passed: r.passed(), failures: r.failures, max_abs_err: r.max_abs_err, text: r.to_string() }
    }
}

/// A W4A16 case's data: tier, activation and output types, whether a weight scale is NaN and
/// whether the gate's slack widens its tolerance.
struct Data16 {
    tier: Tier,
    act: OutputDtype,
    out: OutputDtype,
    nan: bool,
    gate_slack: bool,
}

impl Data16 {
    /// `exact bf16->f16 nan`.
    fn describe(&self) -> String {
        let nan = if self.nan { " nan" } else { "" };
        format!("{} {}->{}{nan}", self.tier, short(self.act), short(self.out))
    }
}

/// One case's row.
pub struct Row {
    kind: ProblemKind,
    label: String,
    shape: Shape,
    seed: u64,
    layout: ScaleLayout,
    alpha: Option<f32>,
    /// `None` for W4A4.
    w4a16: Option<Data16>,
    mode: Mode,
    verdict: Result<Verdict, nvfp4::Error>,
    seconds: f64,
}

impl Row {
    pub fn w4a4(kind: ProblemKind, s: CaseSpec, mode: Mode, verdict: nvfp4::Result<Verdict>, seconds: f64) -> Self {
        let CaseSpec { label, shape, seed, layout, alpha } = s;
        Self { kind, label, shape, seed, layout, alpha, w4a16: None, mode, verdict, seconds }
    }

    pub fn w4a16(kind: ProblemKind, s: Case16, verdict: nvfp4::Result<Verdict>, seconds: f64) -> Self {
        let (mode, gate_slack) = (s.mode(), s.gate_slack());
        let Case16 { label, shape, seed, layout, alpha, tier, act, out, nan_scale } = s;
        let data = Data16 { tier, act, out, nan: nan_scale, gate_slack };
        Self { kind, label, shape, seed, layout, alpha, w4a16: Some(data), mode, verdict, seconds }
    }

    pub fn passed(&self) -> bool {
        matches!(&self.verdict, Ok(v) if v.passed)
    }

    fn form(&self) -> &'static str {
        if self.w4a16.is_some() {
            "w4a16"
        } else {
            "w4a4"
        }
    }

    /// `gemm w4a16 exact test:3 256x7168x256`.
    pub fn describe(&self) -> String {
        match &self.w4a16 {
            None => format!("{} {} {}", self.kind, self.label, self.shape),
            Some(d) => format!("{} w4a16 {} {} {}", self.kind, d.tier, self.label, self.shape),
        }
    }

    pub fn verdict_text(&self) -> String {
        match &self.verdict {
            Ok(v) => v.text.clone(),
            Err(e) => format!("FAIL: error: {e}"),
        }
    }
}

fn layout_name(l: ScaleLayout) -> String {
    format!("{l:?}").to_lowercase()
}

fn rule_name(r: &Row) -> &'static str {
    match (r.mode, r.w4a16.as_ref().is_some_and(|d| d.gate_slack)) {
        (Mode::BitExact, _) => "bit-exact",
        (Mode::Tolerance, false) => "tolerance",
        (Mode::Tolerance, true) => "tol+gate",
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        format!("{}...", &s[..n - 3])
    }
}

pub fn print_table(rows: &[Row], backend: &str) {
    outln!(
        "{:<13} {:<6} {:<10} {:<40} {:<8} {:<20} {:<10} {:>8}  verdict",
        "problem",
        "mode",
        "case",
        "shape",
        "scales",
        "data",
        "compare",
        "seconds"
    );
    for r in rows {
        let first_line = r.verdict_text().lines().next().unwrap_or_default().to_string();
        let data = r.w4a16.as_ref().map_or_else(|| "spec".to_string(), Data16::describe);
        outln!(
            "{:<13} {:<6} {:<10} {:<40} {:<8} {:<20} {:<10} {:>8.3}  {}",
            r.kind.name(),
            r.form(),
            r.label,
            truncate(&r.shape.to_string(), 40),
            layout_name(r.layout),
            data,
            rule_name(r),
            r.seconds,
            first_line
        );
    }
    for &kind in &ProblemKind::ALL {
        for form in ["w4a4", "w4a16"] {
            let of_kind: Vec<&Row> = rows.iter().filter(|r| r.kind == kind && r.form() == form).collect();
            if !of_kind.is_empty() {
                let passed = of_kind.iter().filter(|r| r.passed()).count();
                outln!("{kind} {form}: {passed}/{} cases pass on {backend}", of_kind.len());
            }
        }
    }
    let failed = rows.iter().filter(|r| !r.passed()).count();
    outln!("{} passed, {failed} failed", rows.len() - failed);
    for (form, text) in statements(rows, backend) {
        outln!("\nWhat this shows ({form}): {text}");
    }
}

/// What a pass shows, for each mode that ran.
fn statements(rows: &[Row], backend: &str) -> Vec<(&'static str, &'static str)> {
    let ran = |form: &str| rows.iter().any(|r| r.form() == form);
    let mut out = Vec::new();
    if ran("w4a4") {
        out.push(("w4a4", what_check_proves(backend)));
    }
    if ran("w4a16") {
        out.push(("w4a16", what_w4a16_check_proves(backend)));
    }
    out
}

pub fn print_json(rows: &[Row], backend: &str) {
    let items: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (failures, max_abs_err) = match &r.verdict {
                Ok(v) => (serde_json::json!(v.failures), serde_json::json!(v.max_abs_err)),
                Err(_) => (serde_json::Value::Null, serde_json::Value::Null),
            };
            let mut v = serde_json::json!({
                "problem": r.kind.name(), "mode": r.form(), "case": r.label, "shape": r.shape.to_string(),
                "seed": r.seed, "scales": layout_name(r.layout), "alpha": r.alpha, "compare": rule_name(r),
                "passed": r.passed(), "failures": failures, "max_abs_err": max_abs_err, "seconds": r.seconds,
                "verdict": r.verdict_text(),
            });
            if let Some(alphas) = nvfp4::check::expert_alphas(&r.shape, r.alpha) {
                v["expert_alphas"] = serde_json::json!(alphas);
            }
            if let Some(d) = &r.w4a16 {
                v["tier"] = serde_json::json!(d.tier.name());
                v["activation"] = serde_json::json!(short(d.act));
                v["output"] = serde_json::json!(short(d.out));
                v["nan_scale"] = serde_json::json!(d.nan);
            }
            v
        })
        .collect();
    let failed = rows.iter().filter(|r| !r.passed()).count();
    let shows: serde_json::Map<String, serde_json::Value> =
        statements(rows, backend).into_iter().map(|(f, t)| (f.to_string(), serde_json::json!(t))).collect();
    // `what_this_shows` keeps the W4A4 statement (or the W4A16 one when only that mode ran).
    let main = statements(rows, backend).first().map(|s| s.1).unwrap_or_else(|| what_check_proves(backend));
    outln!(
        "{}",
        serde_json::json!({
            "backend": backend, "passed": rows.len() - failed, "failed": failed,
            "what_this_shows": main, "what_each_mode_shows": shows, "cases": items,
        })
    );
}
