"""A result store that makes long evaluations resumable and shardable.

Layout: <root>/<kind>/<key hash>/meta.json holds the full key (model fingerprint, plan content, dataset and
protocol, code version; the fingerprint and code version come from orthorank.harness.store_keys); entries live beside it in
small JSON files, each {"entries": {index: value}, "sha256": ..} written atomically (temporary file, fsync,
rename), so a run killed mid-write loses only the unfinished entry. A run reads what is there and computes the
rest; shards computed elsewhere merge by copying their entry files into the same folder (`merge`). An entry made
under another key lives in another folder and is never read; a corrupt entry file raises an error naming it (or,
with recompute=True, is set aside and its entries recomputed).

Two more rules in `fill`:
- Carry-over across code versions. A change to a numeric module's code is a new key, so a refactor that keeps every
  number would throw hours of results away. When the same key under an earlier code version holds entries this one
  lacks, two chunks (ones already computed here, else its first and last, computed now) are compared with the
  stored values
  (floats to CARRY_RTOL = 1e-5 relative, float32 rounding; everything else exactly); only if they agree are the earlier entries taken over, and
  the namespace records where they came from (carried.json). A refactor that changes numbers fails the check and
  everything is recomputed.
- Claims for concurrent runs. Before computing a chunk a process creates <folder>/c-<first>-<last>.claim with
  O_EXCL (atomic on a local or NFSv3+ file system; a lock file held per chunk, not per store, so two runs with
  overlapping work split it instead of queueing behind each other). A chunk another live process has claimed is
  left for later; when its claim goes away the entries are read back, or, if the claimer died without writing them
  (a stale claim: its pid is gone on this host, or the claim is older than CLAIM_TIMEOUT_S), the chunk is claimed
  and computed here. Runs under torchrun split chunks across ranks already and do not claim.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

from orthorank.harness import distributed as dist
from orthorank.errors import UserError
# Keys of stored results (code versions, model fingerprints) live in store_keys; other modules import them from here.
from orthorank.harness.store_keys import NUMERIC_MODULES, canonical, code_version, digest, model_fingerprint

__all__ = ["CARRY_RTOL", "CLAIM_POLL_S", "CLAIM_TIMEOUT_S", "NUMERIC_MODULES", "Namespace", "ResultStore",
           "StoreError", "code_version", "digest", "fill", "model_fingerprint"]


class StoreError(UserError):
    pass


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Namespace:
    """The entries of one key (one model, plan, protocol and code version), by integer index."""

    def __init__(self, folder: Path, key: dict[str, Any], recompute_corrupt: bool = False) -> None:
        self.folder = folder
        self.key = key
        self.recompute_corrupt = recompute_corrupt
        meta = folder / "meta.json"
        if meta.is_file():
            try:
                stored = json.loads(meta.read_text())
            except json.JSONDecodeError:
                raise StoreError(f"result store entry {meta} is corrupt (not JSON); delete that folder to "
                                 "recompute it") from None
            if canonical(stored) != canonical(json.loads(canonical(key))):
                raise StoreError(f"result store folder {folder} holds results for another key; delete it")

    def _ensure(self) -> None:
        if not (self.folder / "meta.json").is_file():
            self.folder.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.folder / "meta.json", json.dumps(self.key, indent=1, sort_keys=True,
                                                                default=str).encode())

    def _entry_files(self) -> list[Path]:
        return sorted(p for p in self.folder.glob("e-*.json")) if self.folder.is_dir() else []

    def load(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for path in self._entry_files():
            try:
                body = json.loads(path.read_text())
                entries = body["entries"]
                ok = body.get("sha256") == digest(entries, 64)
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                ok = False
            if not ok:
                if not self.recompute_corrupt:
                    raise StoreError(f"result store entry {path} is corrupt (bad JSON or checksum); delete it or "
                                     "pass --recompute-corrupt to recompute its entries")
                warnings.warn(f"result store entry {path} is corrupt; moved aside and recomputed")
                path.rename(path.with_suffix(".corrupt"))
                continue
            for k, v in entries.items():
                out.setdefault(int(k), v)
        return out

    def predecessors(self) -> list["Namespace"]:
        """Namespaces of this key under earlier code versions, those with the most entry files first (then the
        most recently written)."""
        key = {k: v for k, v in self.key.items() if k != "code"}
        if "code" not in self.key or not self.folder.parent.is_dir():
            return []
        found = []
        for meta in self.folder.parent.glob("*/meta.json"):
            if meta.parent == self.folder:
                continue
            try:
                other = json.loads(meta.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if "code" in other and {k: v for k, v in other.items() if k != "code"} == json.loads(canonical(key)):
                files = list(meta.parent.glob("e-*.json"))
                if files:
                    newest = max(f.stat().st_mtime for f in files)
                    found.append((-len(files), -newest, Namespace(meta.parent, other, self.recompute_corrupt)))
        return [ns for _, _, ns in sorted(found, key=lambda t: t[:2])]

    def claim(self, chunk: list[int]) -> Path | None:
        """Claim a chunk for this process: the claim file's path, or None when a live process holds it."""
        self._ensure()
        path = self.folder / f"c-{chunk[0]:07d}-{chunk[-1]:07d}.claim"
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}).encode()
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not _stale(path):
                    return None
                path.unlink(missing_ok=True)  # its holder died: take it over
                continue
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
            return path
        return None

    def put(self, entries: dict[int, Any], tag: str = "") -> Path:
        """Write entries atomically as one file (call from one process: rank 0)."""
        self._ensure()
        idx = sorted(entries)
        body = {str(i): entries[i] for i in idx}
        name = f"e-{idx[0]:07d}-{idx[-1]:07d}{('-' + tag) if tag else ''}.json"
        path = self.folder / name
        _atomic_write(path, json.dumps({"entries": body, "sha256": digest(body, 64)}).encode())
        return path


class ResultStore:
    def __init__(self, root: str | Path, recompute_corrupt: bool = False) -> None:
        self.root = Path(root)
        self.recompute_corrupt = recompute_corrupt

    def namespace(self, kind: str, key: dict[str, Any]) -> Namespace:
        full = {"kind": kind, **key}
        return Namespace(self.root / kind / digest(full), full, self.recompute_corrupt)

    def merge(self, other: str | Path) -> int:
        """Copy the entry files of another store (a shard computed elsewhere) into this one; returns files copied.
        Folders are matched by key hash, so entries of different keys never mix."""
        other = Path(other)
        if not other.is_dir():
            raise UserError(f"result store {other} does not exist")
        copied = 0
        for meta in other.glob("*/*/meta.json"):
            rel = meta.parent.relative_to(other)
            dest = self.root / rel
            Namespace(dest, json.loads(meta.read_text()))  # refuses a folder of another key
            dest.mkdir(parents=True, exist_ok=True)
            if not (dest / "meta.json").is_file():
                shutil.copy2(meta, dest / "meta.json")
            for src in meta.parent.glob("e-*.json"):
                target = dest / src.name
                if not target.exists():
                    shutil.copy2(src, target)
                    copied += 1
        return copied

    def rekey_model(self, old: Iterable[str], new: str) -> int:
        """Move every result stored under one of the model fingerprints `old` to fingerprint `new` (results taken
        before a fingerprint change, once the caller has shown that `old` and `new` name the same weights). Where an
        entry file of the same name is already under the new key, that one is kept (with a warning if the two
        differ). Returns the files moved."""
        old = set(old) - {new}
        moved = 0
        for meta in sorted(self.root.glob("*/*/meta.json")):
            key = json.loads(meta.read_text())
            if key.get("model") not in old:
                continue
            kind = key.pop("kind")
            key["model"] = new
            dest = self.namespace(kind, key)
            dest._ensure()
            for src in sorted(meta.parent.glob("e-*.json")):
                target = dest.folder / src.name
                if target.exists():
                    if target.read_bytes() != src.read_bytes():
                        warnings.warn(f"{src} differs from {target}, which is kept")
                    src.unlink()
                else:
                    src.rename(target)
                    moved += 1
            shutil.rmtree(meta.parent)
        return moved


CLAIM_TIMEOUT_S = 6 * 3600.0  # a claim from another host older than this is taken over (its holder is presumed gone)
CLAIM_POLL_S = 0.5
# float32 sums in another order (a thread count, a kernel's choice) differ by about 1e-6 relative (a window's NLL:
# 2338.8354 vs 2338.8325); a change to what is computed moves them by orders of magnitude more.
CARRY_RTOL = 1e-5


def _stale(path: Path) -> bool:
    """A claim whose holder is gone: a dead pid on this host, an unreadable claim, or one older than the timeout."""
    try:
        info = json.loads(path.read_text())
        pid, host, when = int(info["pid"]), str(info["host"]), float(info["time"])
    except FileNotFoundError:
        return False  # released meanwhile: not stale, just gone (the caller retries)
    except (OSError, ValueError, KeyError, TypeError):
        try:  # half-written by a process killed between creating and writing it
            return time.time() - path.stat().st_mtime > 5.0
        except FileNotFoundError:
            return False
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return time.time() - when > CLAIM_TIMEOUT_S


def _same(a: Any, b: Any) -> bool:
    """Stored values agree: floats to CARRY_RTOL relative (1e-9 absolute), everything else exactly."""
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= CARRY_RTOL * max(abs(float(a)), abs(float(b))) + 1e-9
        except (TypeError, ValueError):
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _carry_over(namespace: Namespace, chunks: list[list[int]], compute, tag: str,
                done: dict[int, Any]) -> dict[int, Any]:
    """`done` plus the entries of the same key under an earlier code version, taken over from the first (most
    entries) whose values agree on two chunks: ones already computed here, else its first and last, computed now
    (see the module docstring)."""
    done = dict(done)
    for old in namespace.predecessors():
        stored = old.load()
        missing = [c for c in chunks if all(i in stored for i in c) and not all(i in done for i in c)]
        if not missing:
            continue
        checks = [c for c in chunks if all(i in stored and i in done for i in c)][:2]
        for c in [missing[0], missing[-1]][:max(0, 2 - len(checks))]:
            if c in checks:
                continue
            new = compute(c)
            namespace.put(new, tag)
            done.update(new)
            checks.append(c)
        if not all(_same(done[i], stored[i]) for c in checks for i in c):
            warnings.warn(f"results under an earlier code version in {old.folder} differ from this code's; not "
                          "taken over")
            continue
        carried = {i: v for i, v in stored.items() if i not in done}
        if carried:
            namespace.put(carried, "carried")
            done.update(carried)
        _atomic_write(namespace.folder / "carried.json", json.dumps({
            "from": str(old.folder), "from_code": old.key.get("code"), "to_code": namespace.key.get("code"),
            "checked": sorted(i for c in checks for i in c), "entries": len(carried)}, indent=1).encode())
        break
    return done


def _fill_claiming(namespace: Namespace, chunks: list[list[int]], done: dict[int, Any], compute,
                   tag: str) -> None:
    """One process's fill with claims: compute the chunks nobody holds, then wait for (or take over) the rest."""
    waiting = list(chunks)
    while waiting:
        held = []
        for c in waiting:
            if all(i in done for i in c):
                continue
            path = namespace.claim(c)
            if path is None:
                held.append(c)
                continue
            try:
                done.update({i: v for i, v in namespace.load().items() if i not in done})  # finished meanwhile?
                if not all(i in done for i in c):
                    new = {i: v for i, v in compute(c).items() if i not in done}
                    if new:
                        done.update(new)
                        namespace.put(new, tag)
            finally:
                path.unlink(missing_ok=True)
        if held:
            time.sleep(CLAIM_POLL_S)
            done.update({i: v for i, v in namespace.load().items() if i not in done})
        waiting = [c for c in held if not all(i in done for i in c)]


def fill(namespace: Namespace | None, indices: Iterable[int], compute, chunk: int, tag: str = "") -> dict[int, Any]:
    """Values for `indices`: read from the store, the rest computed `chunk` indices at a time by `compute(list)`
    -> {index: value} across the ranks of a distributed run, each chunk written as soon as it is done.

    Chunks are fixed by index (not by what is missing or by the world size), so a chunk is always computed with
    the same batch composition: 1 process and N processes, fresh or resumed, give the same numbers."""
    indices = list(indices)
    chunks = [indices[i:i + chunk] for i in range(0, len(indices), chunk)]
    n = dist.world_size()
    if namespace is not None and n == 1:
        done = _carry_over(namespace, chunks, compute, tag, namespace.load())
        _fill_claiming(namespace, chunks, done, compute, tag)
        return {i: done[i] for i in indices}
    done = dist.broadcast(namespace.load() if namespace is not None and dist.is_main() else {})
    todo = [c for c in chunks if not all(i in done for i in c)]
    for start in range(0, len(todo), n):
        group = todo[start:start + n]
        mine = group[dist.rank()] if dist.rank() < len(group) else []
        result = compute(mine) if mine else {}
        for part in dist.all_gather(result):
            new = {i: v for i, v in (part or {}).items() if i not in done}  # stored values stay as they were
            if new:
                done.update(new)
                if namespace is not None and dist.is_main():
                    namespace.put(new, tag)
    return {i: done[i] for i in indices}
