"""Evaluation and calibration text by domain: from --data-dir, else ../shared/data, else the hub where reachable.

Every named domain has two disjoint parts: the evaluation text (its windows are what `compare` scores) and the
calibration text (what `calibrate --calib-data NAME` samples windows from). Each part comes with its provenance
(files, checksums, which documents), which plans and result files record. Disjointness is by construction (other
documents, other files) except for WikiText-2, whose evaluation text stays the whole standard test file: its
calibration part is the last 40% of the test file's articles, and `compare` checks every evaluation window
against each plan's calibration windows (harness/evaluation/overlap.py) and refuses windows that reach into them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orthorank.errors import UserError

# GPTQ/SLEB evaluate C4 on the first 1,100 validation documents; the rest of our 2,000-document sample is
# held out for calibration, so calibration never sees evaluation text.
C4_EVAL_DOCS = 1100
# WikiText-2: the last 40% of the test file's articles (by its " = Title = " headings, about 100K of its 305K
# SmolLM2 tokens) is the calibration part; the first 100 evaluation windows of 2,048 tokens lie before it.
WIKITEXT2_CALIB_SHARE = 0.4
# LongBench multi_news: the first 150 examples' documents are evaluation text (the LongBench slices use the first
# examples too), the last 50 calibration text.
NEWS_EVAL_EXAMPLES = 150
# Python source: a file is calibration text when sha256(its path) % 4 == 0 (a quarter, stable when files are added
# or removed), evaluation text otherwise; each part is cut at this many characters, files in sorted order.
CODE_CALIB_MODULUS = 4
CODE_MAX_CHARS = 3_000_000
# Tests, installed packages, and the generated charmap tables of encodings/ (their lines repeat from file to file,
# so they would put the same text on both sides of the split).
_CODE_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}


@dataclass(frozen=True)
class TextPart:
    text: str
    provenance: dict[str, Any]


@dataclass(frozen=True)
class Domain:
    name: str
    description: str
    evaluation: Callable[[Path | None], TextPart]
    calibration: Callable[[Path | None], TextPart]
    # Evaluation windows are cut from the first 256 x seq-len tokens only (as GPTQ and SLEB do for C4), so a long
    # source does not make a full evaluation take hours.
    capped: bool = True
    needs_data_dir: bool = True


def data_dir_candidates(explicit: str | Path | None = None) -> list[Path]:
    if explicit is not None:
        return [Path(explicit)]
    out = []
    if os.environ.get("ORTHORANK_DATA_DIR"):
        out.append(Path(os.environ["ORTHORANK_DATA_DIR"]))
    here = Path.cwd()
    out += [here / "../shared/data", here / "shared/data"]
    repo = Path(__file__).resolve().parents[4]  # src/orthorank/harness/evaluation/data.py -> repo root
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
        import datasets  # lazily: optional dependency, only the hub fallback reads it
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- WikiText-2 ---------------------------------------------------------------------------------------------------

_WIKI_TITLE = re.compile(r"^ = [^=].* = \n$")


def wikitext2_rows(data_dir: Path) -> list[str]:
    # Rebuild the HF `datasets` rows from the raw file, as the data README describes.
    lines = _require(data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return [line + "\n" if line.strip() else "" for line in lines]


def wikitext2_calibration_start(rows: list[str]) -> tuple[int, int, int]:
    """(first calibration row, first calibration article, articles): the last WIKITEXT2_CALIB_SHARE of the articles."""
    heads = [i for i, r in enumerate(rows) if _WIKI_TITLE.match(r)]
    if len(heads) < 4:
        raise UserError(f"the WikiText-2 file has {len(heads)} articles; too few to hold a quarter out")
    first = math.ceil((1.0 - WIKITEXT2_CALIB_SHARE) * len(heads))
    return heads[first], first, len(heads)


def _wikitext2_eval(root: Path | None) -> TextPart:
    if root is None:
        return TextPart(_hub_text("wikitext2", "test"), {"source": "hub: wikitext-2-raw-v1 test"})
    path = root / "wikitext-2-raw" / "wiki.test.raw"
    rows = wikitext2_rows(root)
    return TextPart("\n\n".join(rows), {"file": str(path), "sha256": _sha256(path), "rows": [0, len(rows)],
                                         "note": "the whole test file (the standard protocol); its last 40% of "
                                                 "articles is the calibration part, checked against every plan"})


def _wikitext2_calib(root: Path | None) -> TextPart:
    if root is None:
        raise UserError("calibration data wikitext2 needs ../shared/data (or --data-dir); or pass --calib-data FILE")
    path = root / "wikitext-2-raw" / "wiki.test.raw"
    rows = wikitext2_rows(root)
    start, first, n = wikitext2_calibration_start(rows)
    return TextPart("\n\n".join(rows[start:]), {"file": str(path), "sha256": _sha256(path), "rows": [start, len(rows)],
                                                 "articles": [first, n]})


# -- C4 ----------------------------------------------------------------------------------------------------------


def c4_documents(data_dir: Path) -> list[str]:
    path = _require(data_dir / "c4" / "c4_validation_2k.jsonl")
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


def _c4_eval(root: Path | None) -> TextPart:
    if root is None:
        return TextPart(_hub_text("c4", "validation"), {"source": "hub: allenai/c4 en validation shard 0"})
    path = root / "c4" / "c4_validation_2k.jsonl"
    docs = c4_documents(root)
    return TextPart(" ".join(docs[:C4_EVAL_DOCS]), {"file": str(path), "sha256": _sha256(path),
                                                     "documents": [0, min(C4_EVAL_DOCS, len(docs))]})


def _c4_calib(root: Path | None) -> TextPart:
    if root is None:
        raise UserError("calibration data c4 needs ../shared/data (or --data-dir); or pass --calib-data FILE")
    path = root / "c4" / "c4_validation_2k.jsonl"
    docs = c4_documents(root)[C4_EVAL_DOCS:]
    if not docs:
        raise UserError("the C4 sample has no documents beyond the evaluation ones")
    return TextPart("\n\n".join(docs), {"file": str(path), "sha256": _sha256(path),
                                        "documents": [C4_EVAL_DOCS, C4_EVAL_DOCS + len(docs)]})


# -- News: the documents of LongBench's multi_news file -----------------------------------------------------------

_PASSAGE = re.compile(r"Passage \d+:\n")


def news_documents(data_dir: Path) -> list[list[str]]:
    """Per example, its source news articles (LongBench's "Passage N:" headers and NEWLINE_CHAR markers undone).
    A document whose opening (first 300 characters) occurs more than once in the file is left out everywhere: those
    are crawler boilerplate ("Starting in 1996, Alexa Internet has been donating ...") or one article cited by two
    examples, and would otherwise put the same text in the evaluation and the calibration part."""
    path = _require(data_dir / "longbench" / "multi_news.jsonl")
    examples = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            context = json.loads(line)["context"].replace(" NEWLINE_CHAR ", "\n").replace("NEWLINE_CHAR", "\n")
            examples.append([d.strip() for d in _PASSAGE.split(context) if d.strip()])
    seen: dict[str, int] = {}
    for ex in examples:
        for d in ex:
            seen[d[:300]] = seen.get(d[:300], 0) + 1
    return [[d for d in ex if seen[d[:300]] == 1] for ex in examples]


def _news_part(root: Path | None, calibration: bool) -> TextPart:
    if root is None:
        raise UserError("the news domain needs ../shared/data/longbench/multi_news.jsonl (or --data-dir)")
    path = root / "longbench" / "multi_news.jsonl"
    examples = news_documents(root)
    if len(examples) <= NEWS_EVAL_EXAMPLES:
        raise UserError(f"{path} has {len(examples)} examples; the news domain needs more than {NEWS_EVAL_EXAMPLES}")
    span = [NEWS_EVAL_EXAMPLES, len(examples)] if calibration else [0, NEWS_EVAL_EXAMPLES]
    docs = [d for ex in examples[span[0]:span[1]] for d in ex]
    return TextPart("\n\n".join(docs), {"file": str(path), "sha256": _sha256(path), "examples": span,
                                        "documents": len(docs)})


# -- Code: the Python standard library of the running interpreter -------------------------------------------------


def stdlib_files(root: Path | None = None) -> tuple[Path, list[str]]:
    """The interpreter's standard-library folder and its .py files (sorted relative paths), tests excluded."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(base):
        rel = Path(folder).relative_to(base)
        if any(p in _CODE_SKIP_DIRS for p in rel.parts):
            dirs[:] = []
            continue
        files += [(rel / n).as_posix() for n in names if n.endswith(".py")]
    return base, sorted(files)


def _is_code_calibration(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % CODE_CALIB_MODULUS == 0


def code_part(calibration: bool, root: Path | None = None) -> TextPart:
    base, files = stdlib_files(root)
    chosen = [f for f in files if _is_code_calibration(f) == calibration]
    texts, used, size = [], [], 0
    for rel in chosen:
        if size >= CODE_MAX_CHARS:
            break
        try:
            body = (base / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(body)
        used.append(rel)
        size += len(body) + 2
    if not texts:
        raise UserError(f"no Python source found under {base} for the code domain")
    text = "\n\n".join(texts)[:CODE_MAX_CHARS]
    return TextPart(text, {"stdlib": str(base), "python": sys.version.split()[0],
                           "rule": f"sha256(path) % {CODE_CALIB_MODULUS} {'==' if calibration else '!='} 0, sorted, "
                                   f"first {CODE_MAX_CHARS} characters",
                           "files": used, "text_sha256": _text_digest(text)})


DOMAINS: dict[str, Domain] = {d.name: d for d in (
    Domain("wikitext2", "WikiText-2 raw test (Wikipedia articles)", _wikitext2_eval, _wikitext2_calib,
           capped=False),
    Domain("c4", "C4 validation sample (web text)", _c4_eval, _c4_calib),
    Domain("news", "news articles: the documents of LongBench's multi_news file",
           lambda root: _news_part(root, False), lambda root: _news_part(root, True)),
    Domain("code", "Python source: the standard library of the interpreter running the command",
           lambda root: code_part(False), lambda root: code_part(True), needs_data_dir=False),
)}
DATASETS = tuple(DOMAINS)
# Calibration sources besides the domains: a mix of domains, WikiText-2's train split from the hub, a text file.
MIX_DEFAULT = ("c4", "wikitext2", "news", "code")


def _file_part(spec: str) -> TextPart | None:
    path = Path(spec)
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    if not text.strip():
        raise UserError(f"{path} is empty")
    return TextPart(text, {"file": str(path.resolve()), "sha256": _sha256(path)})


def _unknown(spec: str, what: str, extra: str = "") -> UserError:
    if any(sep in spec for sep in ("/", "\\", ".")):
        return UserError(f"text file {spec} does not exist")
    return UserError(f"unknown {what} {spec!r}; choose {', '.join(DOMAINS)}{extra} or give a text file path")


def load_eval_part(dataset: str, data_dir: str | Path | None = None) -> TextPart:
    """The evaluation text of a domain name or a path to a UTF-8 text file, with its provenance."""
    domain = DOMAINS.get(dataset)
    if domain is None:
        part = _file_part(dataset)
        if part is None:
            raise _unknown(dataset, "dataset")
        return part
    root = find_data_dir(data_dir) if domain.needs_data_dir else None
    return domain.evaluation(root)


def load_eval_text(dataset: str, data_dir: str | Path | None = None) -> str:
    """The evaluation text of a dataset name or a path to a UTF-8 text file."""
    return load_eval_part(dataset, data_dir).text


def is_capped(dataset: str) -> bool:
    """Whether a dataset's evaluation windows come from its first 256 x seq-len tokens only."""
    return DOMAINS[dataset].capped if dataset in DOMAINS else False


def load_calibration_part(source: str = "c4", data_dir: str | Path | None = None) -> TextPart:
    """Calibration text disjoint from the evaluation text of the same domain: a domain's calibration part, the
    WikiText-2 train split (hub only), or a user file (a mix is built from domains in harness/search/calibration.py)."""
    domain = DOMAINS.get(source)
    if domain is not None:
        root = find_data_dir(data_dir) if domain.needs_data_dir else None
        return domain.calibration(root)
    if source == "wikitext2-train":
        return TextPart(_hub_text("wikitext2", "train"), {"source": "hub: wikitext-2-raw-v1 train"})
    part = _file_part(source)
    if part is None:
        raise _unknown(source, "calibration data", ", mix, mix:A+B, wikitext2-train")
    return part


def load_calibration_text(source: str = "c4", data_dir: str | Path | None = None) -> str:
    return load_calibration_part(source, data_dir).text
