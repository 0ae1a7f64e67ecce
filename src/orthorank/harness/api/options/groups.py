"""The option groups several commands share, each written once: the model, a plan, its selection settings, the data
folder, the result store and the output files. A command's options class inherits the groups it takes (a field
redefined in a command overrides the group's, as `selection-map` does with --method)."""

from __future__ import annotations

from dataclasses import dataclass

from orthorank.harness.api.options.base import MODEL_GROUP, Options, finite_float, flag, policy_name, positive_int
from orthorank.method.policies import DECODE_MODES
from orthorank.method.registry import saved
from orthorank.method.selection import CRITERIA, ORDERS, SOURCES
from orthorank.models.loading import EMBEDDED_MODEL

PLAN_GROUP, SELECTION_GROUP, DATA_GROUP, STORE_GROUP, OUTPUT_GROUP = "plan", "selection", "data", "result store", "output"
SECTIONS = (None, MODEL_GROUP, PLAN_GROUP, SELECTION_GROUP, DATA_GROUP, STORE_GROUP, OUTPUT_GROUP)  # --help order


@dataclass(kw_only=True)
class ModelOptions(Options):
    """The model and how it runs (every command)."""

    model: str = flag("--model", default=EMBEDDED_MODEL, group=MODEL_GROUP,
                      help=f"{EMBEDDED_MODEL} (embedded default), gemma3-270m, a .gguf file, an installed model "
                           "package, a local HF folder, a hub id, or a random-weight shape name")
    device: str | None = flag("--device", default=None, group=MODEL_GROUP,
                              help="cpu or cuda (default: cuda if available)")
    dtype: str = flag("--dtype", default="auto", group=MODEL_GROUP,
                      help="auto, float32 or bfloat16 (default auto: float32 on CPU, bfloat16 on GPU)")
    seed: int = flag("--seed", default=0, type=int, group=MODEL_GROUP, help="random seed (default %(default)s)")
    threads: int | None = flag("--threads", default=None, type=positive_int, group=MODEL_GROUP,
                               help="CPU threads for torch (default: torch's own choice, all cores)")
    max_memory: str | None = flag("--max-memory", default=None, group=MODEL_GROUP,
                                  help="spread the model with accelerate: device=size pairs, e.g. cuda=10GiB,cpu=30GiB "
                                       "(the rest goes to --offload-dir); under torchrun each process gets this budget "
                                       "on its own GPU (default: the whole model on --device)")
    offload_dir: str | None = flag("--offload-dir", default=None, group=MODEL_GROUP,
                                   help="folder for weights offloaded to disk under --max-memory (default: none; a "
                                        "model that needs disk offload then stops with an error)")
    sliding_kernel: str = flag("--sliding-kernel", default="auto", choices=("auto", "model", "blocked"),
                               group=MODEL_GROUP,
                               help="sliding-window layers' prefill: the model's own attention (transformers' SDPA "
                                    "over every key with a band mask), the exact blocked kernel that reads only the "
                                    "window's keys (models/sliding_attention.py; dense and every plan alike), or auto: "
                                    "blocked on a CPU, the model's own elsewhere; result files record it under "
                                    "environment.kernels (default %(default)s)")


@dataclass(kw_only=True)
class SelectionOptions(Options):
    """Selection settings; each left None keeps a saved plan's own, else the paper's (SelectionConfig)."""

    ratio: float | None = flag("--ratio", default=None, type=finite_float, group=SELECTION_GROUP,
                               help="share of tokens a selection layer updates (default: a saved plan's own, else "
                                    "0.33)")
    criterion: str | None = flag("--criterion", default=None, choices=CRITERIA, group=SELECTION_GROUP,
                                 help="|<x_sink,x_i>| (dot) or |cos| (default: a saved plan's own, else dot)")
    source: str | None = flag("--source", default=None, choices=SOURCES, group=SELECTION_GROUP,
                              help="score normalized (normed) or raw states (default: a saved plan's own, else "
                                   "normed)")
    policy: str | None = flag("--policy", default=None, type=policy_name, metavar="NAME", aliases=("--order",),
                              group=SELECTION_GROUP,
                              help=f"which tokens a selection layer updates: {', '.join(ORDERS)} (default: a saved "
                                   "plan's own, else orthogonal, the paper's; random and inverse are its ablations; "
                                   "oracle runs the layer densely: an upper bound, never a speed-up)")
    keep_recent: int | None = flag("--keep-recent", default=None, type=int, metavar="W", group=SELECTION_GROUP,
                                   help="always update the last W real tokens (within the K updated; default: a saved "
                                        "plan's own, else 0, off)")
    keep_first: int | None = flag("--keep-first", default=None, type=int, metavar="W", group=SELECTION_GROUP,
                                  help="always update the first W real tokens after the sink (within the K updated; "
                                       "default: a saved plan's own, else 0, off)")
    no_bypass_kv: bool = flag("--no-bypass-kv", default=False, kind="switch", group=SELECTION_GROUP,
                              help="ablation: bypassed tokens give no K/V")
    decode: str | None = flag("--decode", default=None, choices=DECODE_MODES, group=SELECTION_GROUP,
                              help="behaviour when decoding one token (default: a saved plan's own, else dense: every "
                                   "new token is updated)")


@dataclass(kw_only=True)
class PlanOptions(SelectionOptions):
    """The plan a command runs: a method at --layers, a saved plan at --sparsity, or a plan file."""

    method: str = flag("--method", default="dense", choices=("dense", "prune", *saved()), group=PLAN_GROUP,
                       help="dense: the model unchanged; prune: at --layers; orthorank: at --layers; a searched "
                            "method: its saved plan at --sparsity (default %(default)s)")
    layers: str | None = flag("--layers", default=None, group=PLAN_GROUP,
                              help="comma-separated layer indices, e.g. 3,5,7 (default: none; --method orthorank or "
                                   "prune needs them, --sparsity or --plan)")
    plan: str | None = flag("--plan", default=None, group=PLAN_GROUP,
                            help="JSON plan file from `orthorank calibrate` (default: none; the plan comes from "
                                 "--method and --sparsity or --layers)")
    sparsity: float | None = flag("--sparsity", default=None, type=finite_float, group=PLAN_GROUP,
                                  help="use the saved plan <method>-<S>.json of --method in --plans-dir (from "
                                       "`orthorank calibrate`; default: none, --layers or --plan give the plan)")
    plans_dir: str | None = flag("--plans-dir", default=None, group=PLAN_GROUP,
                                 help="folder of <method>-<sparsity>.json plans for --sparsity (default: "
                                      "plans/<model>/ here or in the repository)")


@dataclass(kw_only=True)
class SavedPlansOptions(Options):
    """Where the saved plans of the methods named by --methods are read from."""

    plans_dir: str | None = flag("--plans-dir", default=None, group=PLAN_GROUP,
                                 help="folder of <method>-<sparsity>.json plans (default: plans/<model>/ here or in "
                                      "the repository)")


@dataclass(kw_only=True)
class DataOptions(Options):
    """Where the evaluation and calibration data are read from."""

    data_dir: str | None = flag("--data-dir", default=None, group=DATA_GROUP,
                                help="data folder laid out like ../shared/data (default: $ORTHORANK_DATA_DIR, else "
                                     "../shared/data or shared/data from here or from the repository)")


@dataclass(kw_only=True)
class StoreOptions(Options):
    """The result store that makes runs resumable."""

    store: str = flag("--store", default="results/store", group=STORE_GROUP,
                      help="result store folder: finished windows and items are kept here and reused (default "
                           "%(default)s)")
    no_store: bool = flag("--no-store", default=False, kind="switch", group=STORE_GROUP,
                          help="compute everything, keep nothing")
    recompute_corrupt: bool = flag("--recompute-corrupt", default=False, kind="switch", group=STORE_GROUP,
                                   help="set aside corrupt store entries and recompute them (default: stop with an "
                                        "error)")


@dataclass(kw_only=True)
class OverwriteOptions(Options):
    overwrite: bool = flag("--overwrite", default=False, kind="switch", group=OUTPUT_GROUP,
                           help="replace existing output files")


@dataclass(kw_only=True)
class JsonOutputOptions(OverwriteOptions):
    """The result as a JSON file, beside what is printed."""

    json_out: str | None = flag("--json", default=None, metavar="FILE", group=OUTPUT_GROUP,
                                help="write the JSON result to FILE (default: none, the result is only printed)")
