//! Benchmarks: producer throughput by mode (see `producer-bench`).
