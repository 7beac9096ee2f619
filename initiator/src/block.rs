//! Blocking block device (next).
