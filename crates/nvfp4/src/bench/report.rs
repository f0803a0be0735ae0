//! What a benchmark run reports: one row per shape, a geometric mean per problem, the ceilings,
//! as JSON (serde) and as a terminal table. Pure data and formatting, no device.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::ceilings::{tbps, tflops, Ceilings};
use super::floors::LaunchFloor;
use super::graph::GraphRun;
use super::stats::{geomean, Samples};
use crate::problem::{ProblemKind, Shape};
use crate::{Error, Result};

/// The verdict of a kernel that passed its check.
pub const PASS: &str = "pass";

/// A failing verdict: `FAIL: <reason>`, on one line.
pub fn fail_verdict(reason: impl std::fmt::Display) -> String {
    let reason = reason.to_string();
    let one_line = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("FAIL: {one_line}")
}

/// Everything measured for one shape, before the arithmetic of a [`Row`].
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Which operation.
    pub problem: ProblemKind,
    /// Its shape.
    pub shape: Shape,
    /// [`crate::Problem::bytes`].
    pub bytes: u64,
    /// [`crate::Problem::flops`].
    pub flops: f64,
    /// The kernel's samples; `None` when it failed its check and was not timed.
    pub kernel: Option<Samples>,
    /// The peer's samples; `None` when the peer could not run.
    pub peer: Option<Samples>,
    /// [`PASS`] or a [`fail_verdict`].
    pub verdict: String,
    /// The kernel's launch configuration (`Prepared::describe`).
    pub config: String,
    /// The peer's GEMMs.
    pub peer_config: String,
    /// The read ceiling's samples (a pure read of the input bytes, same protocol); `None` when
    /// it could not be measured.
    pub read: Option<Samples>,
    /// The read ceiling's grid setting.
    pub read_config: String,
    /// The kernel's graph run (graph protocol only).
    pub graph: Option<GraphRun>,
    /// The peer's graph run (graph protocol only).
    pub peer_graph: Option<GraphRun>,
}

/// One benchmark row (SPEC §7). Times in µs; `None` (JSON `null`) where nothing was measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Operation name (`gemv`, `gemm`, `dual-gemm`, `grouped-gemm`).
    pub problem: String,
    /// The shape as [`Shape`]'s `Display` writes it.
    pub shape: String,
    /// Median kernel time.
    pub us_median: Option<f64>,
    /// Fastest kernel sample.
    pub us_min: Option<f64>,
    /// Bytes over the median time, decimal TB/s.
    pub tbps: Option<f64>,
    /// FLOPs over the median time.
    pub tflops: Option<f64>,
    /// Speed of light on the measured ceilings.
    pub sol_us: f64,
    /// `sol_us / us_median` (1.0 = at the speed of light).
    pub sol_fraction: Option<f64>,
    /// Median time of the cuBLASLt FP16 peer, same protocol.
    pub peer_us: Option<f64>,
    /// `peer_us / us_median` (above 1 = faster than the peer).
    pub speedup: Option<f64>,
    /// `pass` or `FAIL: <reason>`.
    pub verdict: String,
    /// The kernel's launch configuration.
    pub config: String,
    /// What the peer launches.
    pub peer_config: String,
    /// Median time of a pure streaming read of the row's input bytes (no decode, best of a few
    /// grid settings), same protocol: what a memory-bound kernel can reach at this size.
    pub read_us: Option<f64>,
    /// `read_us / us_median` (1.0 = as fast as the pure read).
    pub read_fraction: Option<f64>,
    /// The read ceiling's grid setting.
    pub read_config: String,
    /// Graph protocol: the kernel's launches per graph, input sets, whether they total more than
    /// 3x L2 and whether launches were chained with programmatic dependent launch; `null` cold.
    pub graph: Option<GraphRun>,
    /// The same for the peer.
    pub peer_graph: Option<GraphRun>,
}

impl Row {
    /// The row's arithmetic: throughput, speed of light and speedup from the samples.
    pub fn new(m: &Measurement, ceilings: &Ceilings) -> Self {
        let us_median = m.kernel.as_ref().map(Samples::median);
        let peer_us = m.peer.as_ref().map(Samples::median);
        let sol_us = ceilings.speed_of_light_us(m.bytes, m.flops);
        let read_us = m.read.as_ref().map(Samples::median);
        Row {
            problem: m.problem.name().to_string(),
            shape: m.shape.to_string(),
            us_median,
            us_min: m.kernel.as_ref().map(Samples::min),
            tbps: us_median.map(|us| tbps(m.bytes as f64, us)),
            tflops: us_median.map(|us| tflops(m.flops, us)),
            sol_us,
            sol_fraction: us_median.map(|us| sol_us / us),
            peer_us,
            speedup: us_median.zip(peer_us).map(|(us, peer)| peer / us),
            verdict: m.verdict.clone(),
            config: m.config.clone(),
            peer_config: m.peer_config.clone(),
            read_us,
            read_fraction: read_us.zip(us_median).map(|(read, us)| read / us),
            read_config: m.read_config.clone(),
            graph: m.graph,
            peer_graph: m.peer_graph,
        }
    }

    /// True when the verdict is [`PASS`].
    pub fn passed(&self) -> bool {
        self.verdict == PASS
    }
}

/// The geometric means of one problem over its shapes; a field is `None` unless every row of
/// the problem has that value (a mean over the passing shapes alone would flatter).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Geomean {
    /// Operation name.
    pub problem: String,
    /// Geometric mean of `us_median`.
    pub us_median: Option<f64>,
    /// Geometric mean of `sol_fraction`.
    pub sol_fraction: Option<f64>,
    /// Geometric mean of `read_fraction`.
    pub read_fraction: Option<f64>,
    /// Geometric mean of `speedup`.
    pub speedup: Option<f64>,
    /// Geometric mean of `peer_us`.
    pub peer_us: Option<f64>,
}

/// One geometric mean per problem, in the order the problems first appear in `rows`.
pub fn geomeans(rows: &[Row]) -> Vec<Geomean> {
    let mut order: Vec<&str> = Vec::new();
    for r in rows {
        if !order.contains(&r.problem.as_str()) {
            order.push(&r.problem);
        }
    }
    order
        .into_iter()
        .map(|p| {
            let of = |f: fn(&Row) -> Option<f64>| {
                let vals: Option<Vec<f64>> = rows.iter().filter(|r| r.problem == p).map(f).collect();
                vals.and_then(geomean)
            };
            Geomean {
                problem: p.to_string(),
                us_median: of(|r| r.us_median),
                sol_fraction: of(|r| r.sol_fraction),
                read_fraction: of(|r| r.read_fraction),
                speedup: of(|r| r.speedup),
                peer_us: of(|r| r.peer_us),
            }
        })
        .collect()
}

/// A whole run: what `--json` writes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Device name.
    pub device: String,
    /// Driver version.
    pub driver: String,
    /// When the run started, UTC ISO-8601.
    pub date: String,
    /// Which shape set (`bench`, `test`, `large`).
    pub shapes: String,
    /// The timing protocol of every row: `cold` or `graph` (SPEC §7).
    pub mode: String,
    /// The ceilings measured in this run.
    pub ceilings: Ceilings,
    /// The launch floor under each protocol; `None` when the CUDA backend is unavailable.
    pub launch_floor: Option<LaunchFloor>,
    /// Timed samples per measurement (graph protocol: timed replays).
    pub samples: usize,
    /// Warm-up launches before them.
    pub warmup: usize,
    /// One row per shape.
    pub rows: Vec<Row>,
    /// One geometric mean per problem.
    pub geomean: Vec<Geomean>,
    /// Remarks such as problems skipped for lack of shapes.
    pub notes: Vec<String>,
}

impl Report {
    /// True when every row passed.
    pub fn all_passed(&self) -> bool {
        self.rows.iter().all(Row::passed)
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Invalid(format!("JSON encoding: {e}")))
    }

    /// Writes [`Report::to_json`] to `path`.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let mut text = self.to_json()?;
        text.push('\n');
        crate::io::write_bytes_atomically(path, text.as_bytes())
    }

    /// The line that says which protocol the table shows.
    fn protocol_line(&self) -> String {
        if self.mode == "graph" {
            format!(
                "protocol: graph (N launches captured in one CUDA graph over rotating input sets > 3x L2, chained \
                 with programmatic dependent launch where the kernel supports it; µs per launch, median of {} \
                 replays)",
                self.samples
            )
        } else {
            format!(
                "protocol: cold single launch (L2 flushed before each sample, CUDA events around the launch; median \
                 of {} samples, {} warm-up)",
                self.samples, self.warmup
            )
        }
    }

    /// The terminal table: ceilings, one line per shape, then the per-problem geometric means.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "device: {} ({}), {}", self.device, self.driver, self.date);
        let c = &self.ceilings;
        let data_note = c
            .fp16_tflops_nvfp4_data
            .map_or(String::new(), |t| format!(" (random data; {t:.0} on NVFP4 values, not used for SoL)"));
        let _ = writeln!(out, "ceilings: copy {:.2} TB/s, fp16 {:.0} TFLOP/s{data_note}", c.copy_tbps, c.fp16_tflops);
        let _ = writeln!(out, "{}", self.protocol_line());
        if let Some(f) = &self.launch_floor {
            let _ = writeln!(
                out,
                "launch floor (empty kernel): cold {:.2} µs, graph {:.2} µs per launch chained ({:.2} unchained)",
                f.cold_us, f.graph_us, f.graph_unchained_us
            );
        }
        let header = [
            "problem", "shape", "µs med", "µs min", "TB/s", "TFLOP/s", "SoL µs", "%SoL", "read µs", "%read", "peer µs",
            "speedup", "verdict",
        ];
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.problem.clone(),
                    short_shape(&r.shape),
                    num(r.us_median, 1),
                    num(r.us_min, 1),
                    num(r.tbps, 2),
                    num(r.tflops, 1),
                    num(Some(r.sol_us), 1),
                    num(r.sol_fraction.map(|f| 100.0 * f), 1),
                    num(r.read_us, 1),
                    num(r.read_fraction.map(|f| 100.0 * f), 1),
                    num(r.peer_us, 1),
                    num(r.speedup, 2),
                    clip(&r.verdict, VERDICT_WIDTH),
                ]
            })
            .collect();
        out.push_str(&render(&header, &rows, 2..12));
        if !self.geomean.is_empty() {
            out.push('\n');
            let header = ["geomean", "µs med", "%SoL", "%read", "speedup", "peer µs"];
            let rows: Vec<Vec<String>> = self
                .geomean
                .iter()
                .map(|g| {
                    vec![
                        g.problem.clone(),
                        num(g.us_median, 1),
                        num(g.sol_fraction.map(|f| 100.0 * f), 1),
                        num(g.read_fraction.map(|f| 100.0 * f), 1),
                        num(g.speedup, 2),
                        num(g.peer_us, 1),
                    ]
                })
                .collect();
            out.push_str(&render(&header, &rows, 1..6));
        }
        if self.rows.iter().any(|r| !r.config.is_empty() || !r.peer_config.is_empty()) {
            out.push_str("\nlaunch configurations:\n");
            for r in &self.rows {
                let _ = writeln!(out, "  {} {}", r.problem, short_shape(&r.shape));
                let _ = writeln!(out, "    nvfp4: {}", if r.config.is_empty() { "-" } else { &r.config });
                let _ = writeln!(out, "    peer:  {}", if r.peer_config.is_empty() { "-" } else { &r.peer_config });
                if !r.read_config.is_empty() {
                    let _ = writeln!(out, "    read:  {}", r.read_config);
                }
                for (who, g) in [("nvfp4", &r.graph), ("peer", &r.peer_graph)] {
                    if let Some(g) = g {
                        let _ = writeln!(
                            out,
                            "    graph ({who}): {} launches over {} input sets{}{}",
                            g.launches,
                            g.sets,
                            if g.dram_cold { "" } else { " (L2-warm: sets total under 3x L2)" },
                            if g.chained { ", PDL-chained" } else { "" }
                        );
                    }
                }
            }
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

/// Widest verdict the table shows (the JSON and the progress lines keep the whole text).
const VERDICT_WIDTH: usize = 64;

/// `s` cut to `width` characters, the cut marked with an ellipsis.
fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        s.chars().take(width - 1).chain(std::iter::once('…')).collect()
    }
}

fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.decimals$}"))
}

/// A shape for the terminal: a grouped shape with one N and one K shows each once
/// (`80,176/4096/7168`); other shapes as they are.
pub fn short_shape(shape: &str) -> String {
    let parts: Vec<&str> = shape.split('/').collect();
    if parts.len() != 3 {
        return shape.to_string();
    }
    let collapse = |p: &str| {
        let mut items = p.split(',');
        let first = items.next().unwrap_or_default();
        if items.all(|x| x == first) {
            first.to_string()
        } else {
            p.to_string()
        }
    };
    format!("{}/{}/{}", parts[0], collapse(parts[1]), collapse(parts[2]))
}

/// Left-aligned text columns, right-aligned columns in `numeric`, two spaces apart.
fn render(header: &[&str], rows: &[Vec<String>], numeric: std::ops::Range<usize>) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, cell) in cells.enumerate() {
            let pad = width[i].saturating_sub(cell.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if numeric.contains(&i) {
                s.extend(std::iter::repeat_n(' ', pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                if i + 1 < cols {
                    s.extend(std::iter::repeat_n(' ', pad));
                }
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

/// `unix_secs` as UTC ISO-8601, e.g. `2026-11-22T09:30:00Z`.
pub fn iso8601_utc(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// The current time as UTC ISO-8601.
pub fn now_utc() -> String {
    iso8601_utc(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}
