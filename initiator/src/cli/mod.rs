//! nvmf CLI formatting (next).
