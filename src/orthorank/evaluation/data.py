"""Evaluation and calibration text: from --data-dir, else ../shared/data, else the hub where reachable."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orthorank.errors import UserError

DATASETS = ("wikitext2", "c4")
# GPTQ/SLEB evaluate C4 on the first 1,100 validation documents; the rest of our 2,000-document sample is
# held out for calibration, so calibration never sees evaluation text.
C4_EVAL_DOCS = 1100


def data_dir_candidates(explicit: str | Path | None = None) -> list[Path]:
    if explicit is not None:
        return [Path(explicit)]
    out = []
    if os.environ.get("ORTHORANK_DATA_DIR"):
        out.append(Path(os.environ["ORTHORANK_DATA_DIR"]))
    here = Path.cwd()
    out += [here / "../shared/data", here / "shared/data"]
    repo = Path(__file__).resolve().parents[3]  # src/orthorank/evaluation/data.py -> repo root
    out += [repo / "../shared/data", repo / "shared/data"]
    return out


def find_data_dir(explicit: str | Path | None = None) -> Path | None:
    for cand in data_dir_candidates(explicit):
        if cand.is_dir():
            return cand.resolve()
    if explicit is not None:
        raise UserError(f"data directory {explicit} does not exist")
    return None


def _hub_text(dataset: str, split: str) -> str:
    try:
        import datasets  # optional
    except ImportError:
        datasets = None
    if datasets is None or os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise UserError(
            f"no local copy of {dataset} found (looked for ../shared/data; pass --data-dir) and the hub is not usable"
        )
    try:
        if dataset == "wikitext2":
            rows = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split=split)["text"]
            return "\n\n".join(rows)
        ds = datasets.load_dataset("allenai/c4", data_files={"validation": "en/c4-validation.00000-of-00008.json.gz"},
                                   split="validation")
        return " ".join(ds["text"][:C4_EVAL_DOCS])
    except Exception as exc:  # network errors come in many types
        raise UserError(
            f"no local copy of {dataset} found (pass --data-dir) and the hub is unreachable: {type(exc).__name__}"
        ) from None


def _require(path: Path) -> Path:
    if not path.is_file():
        raise UserError(f"missing data file {path}; see ../shared/data/README.md or pass --data-dir")
    return path


def wikitext2_rows(data_dir: Path) -> list[str]:
    # Rebuild the HF `datasets` rows from the raw file, as the data README describes.
    lines = _require(data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return [line + "\n" if line.strip() else "" for line in lines]


def c4_documents(data_dir: Path) -> list[str]:
    path = _require(data_dir / "c4" / "c4_validation_2k.jsonl")
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


def load_eval_text(dataset: str, data_dir: str | Path | None = None) -> str:
    """The evaluation text of a dataset name (wikitext2, c4) or a path to a UTF-8 text file."""
    if dataset not in DATASETS:
        path = Path(dataset)
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            if not text.strip():
                raise UserError(f"{path} is empty")
            return text
        if any(sep in dataset for sep in ("/", "\\", ".")):
            raise UserError(f"text file {dataset} does not exist")
        raise UserError(f"unknown dataset {dataset!r}; choose {', '.join(DATASETS)} or give a text file path")
    root = find_data_dir(data_dir)
    if root is None:
        return _hub_text(dataset, "test")
    if dataset == "wikitext2":
        return "\n\n".join(wikitext2_rows(root))
    return " ".join(c4_documents(root)[:C4_EVAL_DOCS])


def load_calibration_text(source: str = "c4", data_dir: str | Path | None = None) -> str:
    """Calibration text disjoint from the evaluation text: C4 sample documents after the evaluation ones, the
    WikiText-2 train split (hub only), or a user file."""
    if source == "c4":
        root = find_data_dir(data_dir)
        if root is None:
            raise UserError("calibration data c4 needs ../shared/data (or --data-dir); or pass --calib-data FILE")
        docs = c4_documents(root)[C4_EVAL_DOCS:]
        if not docs:
            raise UserError("the C4 sample has no documents beyond the evaluation ones")
        return "\n\n".join(docs)
    if source == "wikitext2-train":
        return _hub_text("wikitext2", "train")
    if not Path(source).is_file():
        raise UserError(f"calibration data {source!r} is neither 'c4', 'wikitext2-train' nor an existing file")
    return load_eval_text(source, data_dir)
