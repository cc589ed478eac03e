//! The progress bar of long runs: drawn on stderr, only when stderr is a terminal, and only once
//! a measurement has run for a second (short runs never show one). It is drawn from the measuring
//! thread itself, at most a few times a second (no extra thread competing for the CPUs).

use crate::stats::Clock;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// Show the bar after a measurement has run this long.
const SHOW_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    label: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar for one measurement; `allowed`: the user did not turn bars off.
    pub fn new(allowed: bool, label: String) -> Progress {
        Progress { enabled: allowed && std::io::stderr().is_terminal(), label, bar: None }
    }

    /// A bar that never shows.
    pub fn off() -> Progress {
        Progress { enabled: false, label: String::new(), bar: None }
    }

    /// Called now and then (every few thousand iterations) from the measuring loop.
    #[inline]
    pub fn tick(&mut self, clock: &Clock, done: u64) {
        if !self.enabled {
            return;
        }
        self.tick_slow(clock, done);
    }

    #[cold]
    fn tick_slow(&mut self, clock: &Clock, done: u64) {
        let (pos, total) = clock.progress(done);
        match &self.bar {
            Some(bar) => bar.set_position(pos.min(total)),
            None if clock.start.elapsed() >= SHOW_AFTER => {
                let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
                let style = ProgressStyle::with_template("{msg} [{bar:30}] {percent:>3}% eta {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
                bar.set_style(style);
                bar.set_message(self.label.clone());
                bar.set_position(pos.min(total));
                self.bar = Some(bar);
            }
            None => {}
        }
    }

    /// Removes the bar (before the result line is printed).
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
