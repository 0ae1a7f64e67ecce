"""A measured cost table: what one decoder layer costs on this device, dense and token-selective at each ratio, and
what the rest of the model costs, for predicting the prefill speed-up of any plan (hybrid plans are searched
against it).

`orthorank bench --cost-table FILE` measures it. Per round (warm-up rounds first, then `repeats` timed rounds whose
order rotates, so drift of the machine's speed hits every kind alike):
- dense_layer: one decoder layer on random hidden states [B, T, D], no padding, no cache (as `bench --mode layer`);
- selective@r: the same layer as a selection layer keeping ceil(r T) tokens, for every r;
- rest: the model with no decoder layers: embedding, rotary tables, mask, final norm and the LM head on the last
  position of each row (what prefill pays besides the layers);
- dense_model: the whole dense model, the same prefill, as a check of the parts: L x dense_layer + rest against it.

Decoder layers of one model have the same shape, so the layer measured (the middle one unless told) stands for
every layer; `--cost-layers` measures several and takes the median. A plan's predicted prefill speed-up is
(L d + rest) / (sum over layers of its cost + rest), a layer costing d (kept), f(r) d (selection at r) or 0
(removed).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from orthorank.harness.cpu_info import cpu_model_name
from orthorank.errors import UserError, number_list
from orthorank.method.apply import restore_dense
from orthorank.method.cost import head_flops, layer_flops, selection_layer_flops
from orthorank.method.layer import SelectiveLayer, SequenceContext
from orthorank.method.plan import REMOVE
from orthorank.method.selection import SelectionConfig, keep_count
from orthorank.models.adapters import get_adapter
from orthorank.models.last_token import LastTokenForward
from orthorank.harness.results import write_json
from orthorank.harness.runtime.timing import interleaved_rounds, random_ids, summarize, synchronize, time_call

COST_TABLE_FORMAT = "orthorank-cost-table/1"
DEFAULT_RATIOS = (0.25, 0.33, 0.5)


def ratio_key(ratio: float) -> str:
    """How a ratio names its entry: 0.33 -> "0.33" (the shortest form, as plan files write it)."""
    return f"{float(ratio):g}"


def device_description(device: torch.device | str | None = None) -> dict[str, Any]:
    """What a cost table's timings depend on besides the model: device kind and model, and on a CPU the threads
    torch uses."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(dev)}
    return {"type": dev.type, "name": cpu_model_name() if dev.type == "cpu" else dev.type,
            "threads": torch.get_num_threads()}


def describe(device: dict[str, Any]) -> str:
    text = f"{device.get('type')} {device.get('name')!r}"
    return text + (f", {device['threads']} thread(s)" if device.get("threads") is not None else "")


@dataclass
class CostTable:
    model: str
    signature: dict[str, Any]
    device: dict[str, Any]
    dtype: str
    batch: int
    seq_len: int
    dense_layer_s: float
    rest_s: float
    selective: dict[str, float]  # ratio key -> cost of a selection layer as a fraction of a dense layer
    measurements: dict[str, Any] = field(default_factory=dict)  # timings with their spread, per layer, checks
    settings: dict[str, Any] = field(default_factory=dict)
    source: str = "cost table"

    @property
    def num_layers(self) -> int:
        return int(self.signature["num_layers"])

    @property
    def ratios(self) -> list[float]:
        return sorted(float(k) for k in self.selective)

    def fraction(self, ratio: float) -> float:
        key = ratio_key(ratio)
        if key not in self.selective:
            raise UserError(f"{self.source} has no selective-layer cost at ratio {key} (it has "
                            f"{', '.join(ratio_key(r) for r in self.ratios)}); measure it with "
                            f"`orthorank bench --cost-table FILE --ratios ...`")
        return float(self.selective[key])

    def layer_cost(self, action: str | float | None) -> float:
        """Seconds one layer costs under an action: None (kept, dense), a selection ratio, or "remove"."""
        if action is None:
            return self.dense_layer_s
        if action == REMOVE:
            return 0.0
        return self.dense_layer_s * self.fraction(float(action))

    def model_cost(self, actions: dict[int, str | float]) -> float:
        """Predicted prefill seconds of the model with these per-layer actions (missing layers are kept)."""
        return sum(self.layer_cost(actions.get(i)) for i in range(self.num_layers)) + self.rest_s

    def predicted_speedup(self, actions: dict[int, str | float]) -> float:
        return self.model_cost({}) / self.model_cost(actions)

    def plan_actions(self, plan) -> dict[int, str | float]:
        """Any plan as per-layer actions (dense: none; prune: remove; orthorank: its ratio; hybrid: its own)."""
        return plan.kind.actions(plan)

    def plan_speedup(self, plan) -> float:
        return self.predicted_speedup(self.plan_actions(plan))

    def max_speedup(self, layers: list[int]) -> float:
        """The speed-up of removing every one of `layers` (what no search over them can exceed)."""
        return self.predicted_speedup({i: REMOVE for i in layers})

    # -- checks -------------------------------------------------------------------------------------------------

    def check_model(self, name: str, signature: dict[str, Any]) -> None:
        if name != self.model or any(signature.get(k) != v for k, v in self.signature.items()):
            raise UserError(f"{self.source} was measured for model {self.model!r} {self.signature}, not for "
                            f"{name!r} {signature}; measure one with `orthorank bench --model {name} --cost-table "
                            "FILE`")

    def check_device(self, device: dict[str, Any]) -> None:
        keys = set(self.device) | set(device)
        if any(self.device.get(k) != device.get(k) for k in keys):
            raise UserError(f"{self.source} was measured on {describe(self.device)}, but this run is on "
                            f"{describe(device)}; a cost table holds for the device it was measured on: measure "
                            "one here with `orthorank bench --cost-table FILE` (and the same --threads)")

    # -- files --------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": COST_TABLE_FORMAT,
            "model": self.model,
            "signature": self.signature,
            "device": self.device,
            "dtype": self.dtype,
            "batch": self.batch,
            "seq_len": self.seq_len,
            "costs": {
                "dense_layer_s": self.dense_layer_s,
                "rest_s": self.rest_s,
                "selective_fraction": dict(sorted(self.selective.items(), key=lambda kv: float(kv[0]))),
            },
            "measurements": self.measurements,
            "settings": self.settings,
        }

    def save(self, path: str | Path, overwrite: bool = False, device: torch.device | None = None) -> Path:
        return write_json(path, self.to_dict(), device=device, overwrite=overwrite)

    @classmethod
    def from_dict(cls, data: Any, source: str = "cost table") -> "CostTable":
        if not isinstance(data, dict) or data.get("format") != COST_TABLE_FORMAT:
            raise UserError(f"{source} is not an orthorank cost table (expected \"format\": "
                            f"\"{COST_TABLE_FORMAT}\"; make one with `orthorank bench --cost-table FILE`)")
        try:
            costs = data["costs"]
            selective = {ratio_key(float(k)): float(v) for k, v in dict(costs["selective_fraction"]).items()}
            table = cls(
                model=str(data["model"]), signature=dict(data["signature"]), device=dict(data["device"]),
                dtype=str(data["dtype"]), batch=int(data["batch"]), seq_len=int(data["seq_len"]),
                dense_layer_s=float(costs["dense_layer_s"]), rest_s=float(costs["rest_s"]), selective=selective,
                measurements=dict(data.get("measurements") or {}), settings=dict(data.get("settings") or {}),
                source=source,
            )
            int(table.signature["num_layers"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source} is malformed: {type(exc).__name__}: {exc}") from None
        values = [table.dense_layer_s, table.rest_s, *selective.values()]
        if not all(math.isfinite(v) and v >= 0 for v in values) or table.dense_layer_s <= 0:
            raise UserError(f"{source} is malformed: costs must be finite, non-negative, with a positive dense "
                            "layer cost")
        if not all(0.0 < float(k) < 1.0 for k in selective):
            raise UserError(f"{source} is malformed: selective ratios must lie in (0, 1)")
        return table

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        path = Path(path)
        if not path.is_file():
            raise UserError(f"cost table {path} does not exist; measure one with `orthorank bench --cost-table "
                            f"{path}`")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"cost table {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data, source=f"cost table {path}")


# -- measuring ------------------------------------------------------------------------------------------------------


@dataclass
class FlopCostTable(CostTable):
    """A cost table of FLOPs instead of measured seconds (the cost model of method/cost.py at `seq_len` tokens):
    a "speed-up" on it is dense FLOPs / plan FLOPs = 1 / (1 - compute sparsity). It prices any keep ratio (K / T
    for a whole number of kept tokens), so a search on it can be matched to a compute target exactly."""

    arch: Any = None  # method.cost.Arch

    def fraction(self, ratio: float) -> float:
        if not 0.0 < ratio <= 1.0:
            raise UserError(f"selection ratio must be in (0, 1], got {ratio:g}")
        return selection_layer_flops(self.arch, self.seq_len, ratio) / layer_flops(self.arch, self.seq_len).dense

    @classmethod
    def build(cls, arch, seq_len: int, ratios: list[float], model: str, signature: dict[str, Any]) -> "FlopCostTable":
        table = cls(model, signature, {"kind": "flop count"}, "-", 1, seq_len, layer_flops(arch, seq_len).dense,
                    head_flops(arch), {}, source=f"the FLOP count at {seq_len} tokens", arch=arch)
        table.selective = {ratio_key(r): table.fraction(r) for r in ratios}
        return table

    def compute_sparsity(self, actions: dict[int, str | float]) -> float:
        return 1.0 - self.model_cost(actions) / self.model_cost({})


def parse_ratios(text: str | list[float] | tuple[float, ...]) -> list[float]:
    if isinstance(text, (list, tuple)):
        values = [float(v) for v in text]
    else:
        values = number_list(text, "--ratios")
    if not values:
        raise UserError("--ratios is empty")
    bad = [v for v in values if not 0.0 < v < 1.0 or math.isnan(v)]
    if bad:
        raise UserError(f"selection ratios must lie in (0, 1), got {bad[0]:g}")
    return sorted({float(ratio_key(v)) for v in values})


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _rest_forward(model: nn.Module, ids: torch.Tensor) -> Callable[[], Any]:
    """Prefill of the model with its decoder layers taken out: embedding, rotary tables, mask, final norm and the
    LM head on the last position (the LastTokenForward of `bench`)."""

    adapter = get_adapter(model)
    forward = LastTokenForward(model)

    def run() -> Any:
        layers = adapter.layers(model)
        adapter.set_layers(model, nn.ModuleList())
        try:
            return forward(ids)
        finally:
            adapter.set_layers(model, layers)
    return run


def measure_cost_table(model: nn.Module, name: str, signature: dict[str, Any], device: torch.device,
                       ratios: list[float], batch: int = 1, seq_len: int = 1024, warmup: int = 1,
                       repeats: int = 7, layers: list[int] | None = None, selection: SelectionConfig | None = None,
                       seed: int = 0, log: Callable[[str], None] = print) -> CostTable:
    adapter = get_adapter(model)
    restore_dense(model)
    all_layers = adapter.layers(model)
    L = len(all_layers)
    layers = [L // 2] if not layers else sorted(set(layers))
    bad = [i for i in layers if not 0 <= i < L]
    if bad:
        raise UserError(f"--cost-layers {bad} are out of range for a model with {L} layers")
    if repeats < 1 or warmup < 0:
        raise UserError("need at least 1 timed repeat and 0 or more warm-up rounds")
    base = selection or SelectionConfig()
    load_before = _loadavg()
    cfg = model.config
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    fns: dict[str, Callable[[], Any]] = {}
    with torch.inference_mode():
        h = torch.randn(batch, seq_len, cfg.hidden_size, generator=gen).to(device=device, dtype=dtype)
        pos = torch.arange(seq_len, device=device).unsqueeze(0)
        for idx in layers:
            layer = all_layers[idx]
            kwargs = dict(attention_mask=None, position_ids=pos,
                          position_embeddings=adapter.position_embeddings(model, h, pos, idx), use_cache=False)
            fns[f"dense_layer/{idx}"] = lambda layer=layer, kwargs=kwargs: layer(h, **kwargs)
            for r in ratios:
                wrapper = SelectiveLayer(layer, adapter, replace(base, ratio=r), SequenceContext(), idx)
                fns[f"selective/{ratio_key(r)}/{idx}"] = lambda w=wrapper, kwargs=kwargs: w(h, **kwargs)
        ids = random_ids(cfg.vocab_size, batch, seq_len, device, seed)
        fns["rest"] = _rest_forward(model, ids)
        full = LastTokenForward(model)
        fns["dense_model"] = lambda: full(ids)

        def progress(rnd: int, times: dict[str, list[float]]) -> None:
            log(f"  round {rnd + 1}/{repeats}: dense layer {times[f'dense_layer/{layers[0]}'][-1] * 1e3:.1f} ms, "
                + ", ".join(f"r={ratio_key(r)} {times[f'selective/{ratio_key(r)}/{layers[0]}'][-1] * 1e3:.1f} ms"
                            for r in ratios)
                + f", rest {times['rest'][-1] * 1e3:.1f} ms, whole model {times['dense_model'][-1] * 1e3:.0f} ms")

        times = interleaved_rounds(list(fns), lambda key: time_call(fns[key], device), repeats, warmup,
                                   on_round=progress)
        synchronize(device)

    return _table_from_times(times, layers, ratios, L, name, signature, device, dtype, batch, seq_len, warmup,
                             repeats, seed, base, load_before)


def _table_from_times(times: dict[str, list[float]], layers: list[int], ratios: list[float], L: int, name: str,
                      signature: dict[str, Any], device: torch.device, dtype: torch.dtype, batch: int, seq_len: int,
                      warmup: int, repeats: int, seed: int, base: SelectionConfig,
                      load_before: list[float] | None) -> CostTable:
    """The cost table from the interleaved rounds' seconds: each measured layer's dense time and selective
    fractions (per-round paired ratios give their spread), their median over the measured layers, the rest of the
    model, and the whole model's time against the table's prediction."""
    stats = {k: summarize(v) for k, v in times.items()}
    per_layer: dict[str, Any] = {}
    for idx in layers:
        d = times[f"dense_layer/{idx}"]
        entry = {"dense_layer": stats[f"dense_layer/{idx}"], "selective": {}}
        for r in ratios:
            s = times[f"selective/{ratio_key(r)}/{idx}"]
            # per-round ratios, paired within a round: their spread is the fraction's uncertainty
            paired = summarize([a / b for a, b in zip(s, d)])
            entry["selective"][ratio_key(r)] = {
                "timing": stats[f"selective/{ratio_key(r)}/{idx}"],
                "fraction": stats[f"selective/{ratio_key(r)}/{idx}"]["median_s"] / stats[f"dense_layer/{idx}"]["median_s"],
                "fraction_per_round": {k: paired[k] for k in ("median_s", "min_s", "max_s", "iqr_s")},
            }
        per_layer[str(idx)] = entry
    dense_s = statistics.median(per_layer[str(i)]["dense_layer"]["median_s"] for i in layers)
    selective = {ratio_key(r): statistics.median(per_layer[str(i)]["selective"][ratio_key(r)]["fraction"]
                                                for i in layers) for r in ratios}
    rest_s = stats["rest"]["median_s"]
    model_s = stats["dense_model"]["median_s"]
    predicted = L * dense_s + rest_s
    return CostTable(
        model=name, signature=dict(signature), device=device_description(device),
        dtype=str(dtype).removeprefix("torch."), batch=batch, seq_len=seq_len, dense_layer_s=dense_s, rest_s=rest_s,
        selective=selective,
        measurements={
            "layers_measured": layers,
            "note": ("decoder layers of one model have the same shape: the measured layer(s) stand for every layer "
                     "(median over the measured layers)"),
            "kept_tokens_per_row": {ratio_key(r): keep_count(seq_len, r) for r in ratios},
            "per_layer": per_layer,
            "rest": {"what": "embedding, rotary tables, mask, final norm, LM head on the last position of each row",
                     "timing": stats["rest"]},
            "dense_model": {"timing": stats["dense_model"], "predicted_s": predicted,
                            "predicted_over_measured": predicted / model_s},
            # CPU timings depend on what else runs on the machine
            "load_average": {"before": load_before, "after": _loadavg()},
        },
        settings={"warmup": warmup, "repeats": repeats, "seed": seed, "selection": base.to_dict(),
                  "order": "interleaved rounds, order rotated each round"},
    )


def format_cost_table(table: CostTable) -> str:
    m = table.measurements
    lines = [f"cost table: {table.model}, {describe(table.device)}, {table.dtype}, batch {table.batch} x "
             f"{table.seq_len} tokens (layers measured: {m.get('layers_measured')})",
             f"  dense layer {table.dense_layer_s * 1e3:.2f} ms; rest of the model {table.rest_s * 1e3:.2f} ms"]
    per = m.get("per_layer", {})
    for key, frac in sorted(table.selective.items(), key=lambda kv: float(kv[0])):
        spread = [e["selective"][key]["fraction_per_round"] for e in per.values() if key in e.get("selective", {})]
        extra = (f" (per-round range {min(s['min_s'] for s in spread):.3f}-{max(s['max_s'] for s in spread):.3f})"
                 if spread else "")
        lines.append(f"  selective layer at ratio {key}: {frac:.3f} of a dense layer{extra}")
    check = m.get("dense_model")
    if check:
        lines.append(f"  whole dense model {check['timing']['median_s'] * 1e3:.1f} ms measured, "
                     f"{check['predicted_s'] * 1e3:.1f} ms from the parts ({check['predicted_over_measured']:.3f})")
    L = table.num_layers
    lines.append(f"  predicted speed-up of removing every inner layer: {table.max_speedup(list(range(1, L - 1))):.2f}x")
    return "\n".join(lines)

