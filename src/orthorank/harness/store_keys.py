"""What a stored result is keyed by besides its plan and protocol: the code version of the modules that decide its
numbers, and a fingerprint of the model's weights (orthorank.harness.store keeps the results under these keys)."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

# The modules whose code decides the numbers a result of each kind holds; a change to their code (not to their
# comments or docstrings) is a new code version for that kind. How a model is loaded is not among them: what was
# loaded is named by the model fingerprint (config, dtypes, attention implementation, sampled weights).
_MODEL_MODULES = ("method/orthogonality.py", "method/selection.py", "method/attention.py", "method/attention_split.py", "method/layer.py",
                  "method/apply.py", "method/policies.py", "method/router.py", "method/recording.py",
                  "method/local_attention.py", "method/local_kernel.py", "models/adapters.py", "method/sequence_context.py",
                  "method/attention_routing.py", "method/policy_inputs.py", "method/dense_first.py")
NUMERIC_MODULES = {
    "perplexity": _MODEL_MODULES + ("harness/evaluation/perplexity.py",),
    "zeroshot": _MODEL_MODULES + ("harness/evaluation/zeroshot/scoring.py", "harness/evaluation/zeroshot/convert.py"),
    "longctx": _MODEL_MODULES + ("harness/evaluation/generation.py", "harness/evaluation/longctx.py", "harness/evaluation/longctx_suite.py",
                                 "harness/evaluation/longbench.py"),
    "continuation": _MODEL_MODULES + ("harness/evaluation/continuation.py",),
    "search": _MODEL_MODULES + ("harness/search/layer_search.py", "harness/search/racing.py"),
    "router-fit": _MODEL_MODULES + ("harness/search/router_fit.py",),
    "hybrid-search": _MODEL_MODULES + ("harness/search/layer_search.py", "harness/search/racing.py", "harness/search/hybrid.py",
                                       "harness/runtime/cost_table.py"),
}


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()


def digest(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(obj if isinstance(obj, bytes) else canonical(obj)).hexdigest()[:n]


def code_version(kind: str = "perplexity") -> str:
    """A hash of the code of the modules that decide the numbers of a result kind (their syntax trees without
    docstrings, so an edited comment or docstring keeps every stored result), plus torch and transformers versions.

    Computed once per process, at its first use (after the modules were imported): a file edited while a long run
    goes on must not give the results of the code that run executes the key of the code now on disk."""
    if kind not in _CODE_VERSIONS:
        _CODE_VERSIONS[kind] = _code_version(kind)
    return _CODE_VERSIONS[kind]


_CODE_VERSIONS: dict[str, str] = {}


def _code_version(kind: str) -> str:
    root = Path(__file__).resolve().parents[1]  # the package directory (src/orthorank): NUMERIC_MODULES are relative to it
    h = hashlib.sha256()
    for rel in NUMERIC_MODULES[kind]:
        path = root / rel
        h.update(rel.encode())
        h.update(_code_tree(path.read_text()).encode() if path.is_file() else b"-")
    h.update(f"torch={torch.__version__};transformers={transformers.__version__}".encode())
    return h.hexdigest()[:16]


def _code_tree(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


# Config fields that say where a checkpoint was loaded from, not what it is: the same weights installed in two
# checkouts (two virtual environments) must share their stored results.
_LOCATION_FIELDS = ("_name_or_path",)


def _config_identity(model: nn.Module) -> dict:
    config = model.config.to_dict() if hasattr(model, "config") else {}
    return {k: v for k, v in config.items() if k not in _LOCATION_FIELDS}


@torch.no_grad()
def model_fingerprint(model: nn.Module, samples_per_tensor: int = 4096) -> str:
    """Names, shapes, dtypes and an evenly strided sample of every parameter and buffer: cheap even for large models,
    and different for different weights (a change the sample misses would have to avoid every sampled element)."""
    h = hashlib.sha256()
    h.update(canonical(_config_identity(model)))
    h.update(str(getattr(getattr(model, "config", None), "_attn_implementation", None)).encode())
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type == "meta":
            continue
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // samples_per_tensor)
        sample = flat[::step][:samples_per_tensor].float().cpu().numpy().tobytes()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(sample)
    return h.hexdigest()[:16]
