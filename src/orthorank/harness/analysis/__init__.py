"""See the sink: per-layer statistics behind OrthoRank (stats.py) and their figures (plots.py); the HTML report is
harness/reports/analysis.py. `orthorank analyze` drives them from the command line."""

from orthorank.harness.analysis.stats import SinkAnalysis, analyze, observations

__all__ = ["SinkAnalysis", "analyze", "observations"]
