//! What long work is doing, on stderr while it runs, only when stderr is a
//! terminal (indicatif draws nothing otherwise, so pipes, files and CI logs
//! get none of it): a spinner with the step and the time it has taken.
//! `policy mutate` has a bar of its own (it knows how many mutants).

use std::time::Duration;

/// A spinner on stderr, cleared when it drops.
pub struct Spinner(pub indicatif::ProgressBar);

impl Spinner {
    /// Show `step` now.
    pub fn start(step: &str) -> Spinner {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.set_message(step.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        Spinner(bar)
    }

    /// Move on to `step`.
    pub fn step(&self, step: &str) {
        self.0.set_message(step.to_string());
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
