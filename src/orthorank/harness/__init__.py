"""The harness around the library: everything that measures the method rather than runs it.

- evaluation/: perplexity, zero-shot, long inputs, comparisons, claims: the numbers and their intervals;
- search/: calibration searches (SLEB-style greedy, hybrid) and the router fit;
- runtime/ and speed/: timing, memory, cost tables; the speed benchmarks;
- analysis/: the sink analysis; reports/: every table, figure and HTML page;
- api/ (one typed function per command), cli/ (the `orthorank` command), study/ (the study's stages);
- results.py, store.py: result files and the resumable result store.

The library itself is `orthorank.method` and `orthorank.models`, with its front door in `orthorank`.
"""
