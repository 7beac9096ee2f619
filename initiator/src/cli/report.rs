//! How `nvmf` and `nvmf-perf` end on an error: one line on stderr, each cause once
//! ([`nvmf_transport::one_line`]; anyhow's "Caused by" list repeated the OS error).

use std::process::ExitCode;

/// A tool's exit: success, or `error: LINE` on stderr and failure.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", nvmf_transport::one_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
