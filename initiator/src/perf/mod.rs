//! nvmf-perf as a library: the workload ([`workload`]), the --verify block format
//! ([`verify`]), one job on one I/O queue ([`job`]), the jobs of one reactor stepped by
//! readiness ([`job_set`]), the multi-reactor run ([`runner`]) and the report ([`report`]). The binary only parses flags and connects.

mod in_flight;
pub mod job;
pub mod job_set;
pub mod report;
pub mod runner;
pub mod verify;
pub mod workload;

#[cfg(test)]
mod tests;
