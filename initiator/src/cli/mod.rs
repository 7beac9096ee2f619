//! What the `nvmf` and `nvmf-perf` tools print and parse, as testable library code:
//! shared connection flags ([`args`]) and nvme-cli-like formatting of Identify Controller,
//! Identify Namespace, the namespace list, the discovery log, features and log pages
//! ([`mod@format`]), and their one-line error report ([`report`]).

pub mod args;
pub mod format;
pub mod report;
