"""Throughput benchmarks: dense vs layer removal (SLEB-style) vs OrthoRank, with the weight-based cost model."""

from orthorank.harness.runtime.costmodel import (
    ideal_speedup, kv_fraction, layer_weight_counts, selective_layer_cost, spread_layers,
)

__all__ = ["ideal_speedup", "kv_fraction", "layer_weight_counts", "selective_layer_cost", "spread_layers"]
