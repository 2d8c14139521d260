//! XDP programs in C and their typed Rust loaders (filled in by the gateway work)
