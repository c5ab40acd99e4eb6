//! Micro-benchmark (being written).
fn main() {}
