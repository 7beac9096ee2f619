//! The verbs provider (to be written).
