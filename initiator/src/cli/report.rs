//! How `nvmf` and `nvmf-perf` end on an error: one line on stderr, each cause once.
//!
//! The library errors name their source in their own message as well as returning it from
//! `source()` (so a log line of the error alone says everything); anyhow's "Caused by" list
//! then repeated it, the OS error twice.

use std::process::ExitCode;

/// The error and its causes as one line, a cause left out when the text before it already
/// holds it.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// A tool's exit: success, or `error: LINE` on stderr and failure.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connect queue 0: {source}")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_its_parent_names_is_said_once() {
        let os = std::io::Error::from_raw_os_error(19);
        let os_text = os.to_string();
        let e = anyhow::Error::new(Outer { source: os }).context("connect to rdma:10.0.0.1:4420");
        let line = error_line(&e);
        assert_eq!(line.matches(&os_text).count(), 1, "{line}");
        assert!(line.starts_with("connect to rdma:10.0.0.1:4420: connect queue 0: "));
    }

    #[test]
    fn causes_not_named_are_joined() {
        let e = anyhow::anyhow!("No such file or directory").context("write /x/y");
        assert_eq!(error_line(&e), "write /x/y: No such file or directory");
    }
}
