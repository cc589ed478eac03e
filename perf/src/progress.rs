//! The progress bar of long runs: drawn on stderr, only when stderr is a terminal, and only once
//! a measurement has run for a second (short runs never show one). It is drawn from the measuring
//! thread itself, at most a few times a second (no extra thread competing for the CPUs).

use crate::samples::Samples;
use crate::stats::{Budget, Clock, Latency};
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

/// Times `round_trip` until `budget` is spent: one latency sample per call (from the end of the
/// previous one, so nothing between calls goes unmeasured), ticking `progress` every 4,096
/// calls. The first error ends the measurement.
pub fn time_round_trips<E>(
    budget: Budget,
    progress: &mut Progress,
    mut round_trip: impl FnMut() -> Result<(), E>,
) -> Result<Latency, E> {
    const TICK: u64 = 4096;
    let mut samples = Samples::new(budget.iters());
    let clock = Clock::start(budget);
    let mut prev = clock.start;
    let mut n = 0u64;
    while clock.more(n, Some(prev)) {
        round_trip()?;
        let now = std::time::Instant::now();
        samples.record(now.duration_since(prev).as_nanos() as u64);
        prev = now;
        n += 1;
        if n % TICK == 0 {
            progress.tick(&clock, n);
        }
    }
    let secs = prev.duration_since(clock.start).as_secs_f64();
    Ok(samples.summary(secs))
}
