//! formatting
