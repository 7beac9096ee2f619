//! nvmf-tests: end-to-end tests live in `tests/tests/`; this library holds what they share
//! (spawning the built binaries, temporary configs, the QEMU lab driver).
