//! Discovery of the QEMU guest test bed's devices (see docs/CONTRACTS.md).
