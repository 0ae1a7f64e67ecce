"""OrthoRank: token selection via sink-token orthogonality (Shin, Oh, Oh, ICML 2025), with layer-pruning baselines."""

from orthorank.method import Plan, SelectionConfig, apply_orthorank, apply_plan, prune_layers, restore_dense
from orthorank.models import load_model

__version__ = "0.1.0"
__all__ = ["Plan", "SelectionConfig", "apply_orthorank", "apply_plan", "load_model", "prune_layers",
           "restore_dense"]
