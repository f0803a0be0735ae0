//! Terminal output: a progress bar when stderr is a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::time::Duration;

use crate::console::errln;
use indicatif::{ProgressBar, ProgressStyle};

/// Progress over a known number of steps.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    done: usize,
    quiet: bool,
}

impl Progress {
    /// A bar of `total` steps; `quiet` (e.g. with `--json`) prints nothing at all.
    pub fn new(total: usize, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total as u64);
            let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self { bar, total, done: 0, quiet }
    }

    /// Announces the step about to run.
    pub fn start(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_string()),
            None if !self.quiet => errln!("[{}/{}] {what}", self.done + 1, self.total),
            None => {}
        }
    }

    /// Marks one step done.
    pub fn step(&mut self) {
        self.done += 1;
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Prints a line without tearing the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None if !self.quiet => errln!("{line}"),
            None => {}
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
