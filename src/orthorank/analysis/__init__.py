"""See the sink: per-layer statistics behind OrthoRank (stats.py), their figures (plots.py) and an HTML report
(report.py). `orthorank analyze` drives them from the command line."""

from orthorank.analysis.report import load_compare, render_report
from orthorank.analysis.stats import SinkAnalysis, analyze, observations

__all__ = ["SinkAnalysis", "analyze", "load_compare", "observations", "render_report"]
