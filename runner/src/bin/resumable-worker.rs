//! A worker program for process-isolated runs: `ProcessConfig::new(path_to_this)`.

fn main() {
    resumable_runner::process::serve_worker()
}
