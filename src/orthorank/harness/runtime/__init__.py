"""What every command runs on, below the commands and the benchmarks: the memory guard, timing by interleaved rounds,
the decode bandwidth bound, the weight-based cost model, measured cost tables and speed matching."""
