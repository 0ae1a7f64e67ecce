"""The OrthoRank method: token selection (selection.py), the selective layer (layer.py), plans and applying them."""

from orthorank.method.apply import apply_orthorank, apply_plan, prune_layers, restore_dense
from orthorank.method.plan import Plan, layers_for_sparsity
from orthorank.method.selection import SelectionConfig

__all__ = ["Plan", "SelectionConfig", "apply_orthorank", "apply_plan", "layers_for_sparsity", "prune_layers",
           "restore_dense"]
