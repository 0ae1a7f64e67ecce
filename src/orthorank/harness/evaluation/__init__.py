"""Evaluation: data loading, perplexity, zero-shot (lm-evaluation-harness)."""
