//! Load benchmark (being written).
fn main() {}
