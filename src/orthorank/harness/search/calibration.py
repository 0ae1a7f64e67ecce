"""Calibration windows: random fixed-length slices of calibration text, as SLEB samples them, from one source or
from an equal mix of domains; with the provenance that plans record and that `compare` uses to rebuild them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orthorank.errors import UserError
from orthorank.harness.evaluation.data import DOMAINS, MIX_DEFAULT, load_calibration_part
from orthorank.harness.evaluation.perplexity import tokenize_text

# Default calibration: the source and size the transfer matrix chooses by the worst evaluation domain
# (studies/smollm2-135m/transfer/transfer.md, "Default calibration"; tests/harness/test_study.py keeps the two equal):
# 8K tokens of the four-domain mix, 32 windows of 256 in batches of 4, racing from the first 2K tokens.
DEFAULT_CALIB_DATA = "mix"
DEFAULT_CALIB_TOKENS = 8192
DEFAULT_CALIB_SEQ_LEN = 256
DEFAULT_CALIB_BATCH = 4
FIRST_RACE_TOKENS = 2048  # greedy searches race from the first batches that hold this many tokens (all: exhaustive)


def calibration_windows(tokenizer, text: str, samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """[samples, seq_len] token ids from random offsets (seeded, so the same seed gives the same windows)."""
    if samples < 1 or seq_len < 2:
        raise UserError(f"need at least 1 calibration sample of at least 2 tokens, got {samples} x {seq_len}")
    ids = tokenize_text(tokenizer, text)
    return _windows_from_ids(ids, samples, seq_len, seed)


def _windows_from_ids(ids: torch.Tensor, samples: int, seq_len: int, seed: int, what: str = "calibration text"):
    if ids.numel() <= seq_len:
        raise UserError(f"{what} has {ids.numel()} tokens, fewer than one window of {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len, (samples,), generator=gen)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


@dataclass
class CalibrationSet:
    windows: torch.Tensor  # [samples, seq_len]
    provenance: dict[str, Any]  # what plans record: source(s), sizes, seed, text provenance, windows digest


def parse_mix(source: str) -> list[str] | None:
    """"mix" -> the default domains; "mix:c4+code" -> those; anything else -> None."""
    if source == "mix":
        return list(MIX_DEFAULT)
    if not source.startswith("mix:"):
        return None
    names = [n.strip() for n in source[4:].split("+") if n.strip()]
    bad = [n for n in names if n not in DOMAINS]
    if bad or len(names) < 2 or len(set(names)) != len(names):
        raise UserError(f"--calib-data {source!r}: a mix names two or more different domains from "
                        f"{', '.join(DOMAINS)}, joined by '+', e.g. mix:c4+code")
    return names


def windows_digest(windows: torch.Tensor) -> str:
    return hashlib.sha256(windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def calibration_set(tokenizer, source: str, samples: int, seq_len: int, seed: int = 0,
                    data_dir: str | Path | None = None) -> CalibrationSet:
    """Calibration windows of a source: a domain's calibration part, a file, or a mix. A mix takes an equal number
    of windows from each domain (samples must divide evenly), each domain drawn with seed + its position in the mix,
    and interleaves them (window i from domain i mod k) so that every batch, and so the screening batches of a fast
    search, sees every domain. A source with fewer tokens than the windows ask for is refused: the windows would
    mostly repeat each other."""
    if samples < 1 or seq_len < 2:
        raise UserError(f"need at least 1 calibration sample of at least 2 tokens, got {samples} x {seq_len}")
    names = parse_mix(source)
    base = {"data": source, "samples": samples, "seq_len": seq_len, "seed": seed, "tokens": samples * seq_len}
    if names is None:
        part = load_calibration_part(source, data_dir)
        ids = tokenize_text(tokenizer, part.text)
        _check_size(source, ids.numel(), samples * seq_len)
        windows = _windows_from_ids(ids, samples, seq_len, seed, f"calibration data {source}")
        prov = {**base, "text": _brief(part.provenance), "source_tokens": int(ids.numel())}
        return CalibrationSet(windows, {**prov, "windows_sha256": windows_digest(windows)})
    k = len(names)
    if samples % k:
        raise UserError(f"--calib-data {source} mixes {k} domains equally: the number of windows ({samples}) must be "
                        f"a multiple of {k}")
    per = samples // k
    parts, texts = [], {}
    for i, name in enumerate(names):
        part = load_calibration_part(name, data_dir)
        ids = tokenize_text(tokenizer, part.text)
        _check_size(name, ids.numel(), per * seq_len)
        parts.append(_windows_from_ids(ids, per, seq_len, seed + i, f"calibration data {name}"))
        texts[name] = {**_brief(part.provenance), "source_tokens": int(ids.numel()), "windows": per,
                       "seed": seed + i}
    windows = torch.stack([parts[i % k][i // k] for i in range(samples)])
    prov = {**base, "mix": names, "parts": texts, "windows_sha256": windows_digest(windows)}
    return CalibrationSet(windows, prov)


def _check_size(name: str, have: int, need: int) -> None:
    if have < need:
        raise UserError(f"calibration data {name} has {have} tokens, fewer than the {need} asked for; ask for fewer "
                        "tokens (--calib-tokens / --calib-samples) or give a longer source")


def _brief(provenance: dict[str, Any]) -> dict[str, Any]:
    """Text provenance for a plan: long file lists are kept as a count and a digest."""
    out = dict(provenance)
    if isinstance(out.get("files"), list):
        files = out.pop("files")
        out["files"] = {"count": len(files), "first": files[:3], "last": files[-3:],
                        "sha256": hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]}
    return out
