//! nvmf-perf library modules (next).
