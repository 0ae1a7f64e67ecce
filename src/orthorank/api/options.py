"""Each command's options as one typed dataclass: what the library functions in orthorank.api take, what the CLI
fills from its parser and what the study builds from a budget, so nothing passes argv between them.

The field names are the parser's destinations and the defaults its defaults (tests/test_api.py keeps the two equal);
`argv()` writes the equivalent command line, which every result file records as the command that made it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self


@dataclass(kw_only=True)
class Options:
    command: ClassVar[str] = ""

    @classmethod
    def from_namespace(cls, namespace: Any) -> Self:
        """The options a parsed command line gave (argparse's namespace: same names, values already checked)."""
        return cls(**{f.name: getattr(namespace, f.name) for f in fields(cls)})

    def argv(self) -> list[str]:
        """The command line that gives these options: the command, then every option that differs from its default."""
        out = [self.command]
        model = [f.name for f in fields(ModelOptions)]  # the model first, as people write it
        for f in sorted(fields(self), key=lambda f: model.index(f.name) if f.name in model else len(model)):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if default is not MISSING and value == default:
                continue
            flag, kind = f.metadata["flag"], f.metadata["kind"]
            if kind == "switch":
                out += [flag] if value else []
            elif value is None:
                raise ValueError(f"{type(self).__name__}.{f.name}: None where the command line needs a value")
            elif kind == "repeat":
                out += [x for item in value for x in (flag, str(item))]
            elif kind == "several":
                out += [flag, *map(str, value)]
            elif kind == "list":
                out += [flag, ",".join(map(str, value))]
            else:
                out += [flag, str(value)]
        return out


@dataclass(kw_only=True)
class ModelOptions(Options):
    """The model and how it runs (every command)."""

    model: str = field(default='smollm2-135m', metadata={"flag": "--model", "kind": "value"})
    device: str | None = field(default=None, metadata={"flag": "--device", "kind": "value"})
    dtype: str = field(default='auto', metadata={"flag": "--dtype", "kind": "value"})
    seed: int = field(default=0, metadata={"flag": "--seed", "kind": "value"})
    threads: int | None = field(default=None, metadata={"flag": "--threads", "kind": "value"})
    max_memory: str | None = field(default=None, metadata={"flag": "--max-memory", "kind": "value"})
    offload_dir: str | None = field(default=None, metadata={"flag": "--offload-dir", "kind": "value"})
    sliding_kernel: str = field(default='model', metadata={"flag": "--sliding-kernel", "kind": "value"})


@dataclass(kw_only=True)
class SelectionOptions(Options):
    """Selection settings; each left None keeps a saved plan's own, else the paper's."""

    ratio: float | None = field(default=None, metadata={"flag": "--ratio", "kind": "value"})
    criterion: str | None = field(default=None, metadata={"flag": "--criterion", "kind": "value"})
    source: str | None = field(default=None, metadata={"flag": "--source", "kind": "value"})
    policy: str | None = field(default=None, metadata={"flag": "--policy", "kind": "value"})
    keep_recent: int | None = field(default=None, metadata={"flag": "--keep-recent", "kind": "value"})
    keep_first: int | None = field(default=None, metadata={"flag": "--keep-first", "kind": "value"})
    no_bypass_kv: bool = field(default=False, metadata={"flag": "--no-bypass-kv", "kind": "switch"})
    decode: str | None = field(default=None, metadata={"flag": "--decode", "kind": "value"})


@dataclass(kw_only=True)
class StoreOptions(Options):
    """The result store that makes runs resumable."""

    store: str = field(default='results/store', metadata={"flag": "--store", "kind": "value"})
    no_store: bool = field(default=False, metadata={"flag": "--no-store", "kind": "switch"})
    recompute_corrupt: bool = field(default=False, metadata={"flag": "--recompute-corrupt", "kind": "switch"})


@dataclass(kw_only=True)
class PplOptions(ModelOptions, SelectionOptions):
    """`orthorank ppl`."""

    command: ClassVar[str] = "ppl"
    dataset: str = field(default='wikitext2', metadata={"flag": "--dataset", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    seq_len: int = field(default=2048, metadata={"flag": "--seq-len", "kind": "value"})
    max_windows: int | None = field(default=None, metadata={"flag": "--max-windows", "kind": "value"})
    batch_size: int = field(default=1, metadata={"flag": "--batch-size", "kind": "value"})
    method: str = field(default='dense', metadata={"flag": "--method", "kind": "value"})
    layers: str | None = field(default=None, metadata={"flag": "--layers", "kind": "value"})
    plan: str | None = field(default=None, metadata={"flag": "--plan", "kind": "value"})
    sparsity: float | None = field(default=None, metadata={"flag": "--sparsity", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    json_out: str | None = field(default=None, metadata={"flag": "--json", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class BenchOptions(ModelOptions, SelectionOptions):
    """`orthorank bench`."""

    command: ClassVar[str] = "bench"
    num_layers: int | None = field(default=None, metadata={"flag": "--num-layers", "kind": "value"})
    methods: list[str] = field(default_factory=lambda: ['dense', 'spread-prune', 'spread-orthorank'], metadata={"flag": "--methods", "kind": "list"})
    sparsity: float = field(default=0.2, metadata={"flag": "--sparsity", "kind": "value"})
    plan: list[str] = field(default_factory=lambda: [], metadata={"flag": "--plan", "kind": "repeat"})
    mode: list[str] = field(default_factory=lambda: ['prefill'], metadata={"flag": "--mode", "kind": "list"})
    batch: list[int] = field(default_factory=lambda: [1], metadata={"flag": "--batch-size", "kind": "list"})
    seq_len: list[int] = field(default_factory=lambda: [1024], metadata={"flag": "--seq-len", "kind": "list"})
    decode_batch: list[int] | None = field(default=None, metadata={"flag": "--decode-batch-size", "kind": "list"})
    prompt_len: int | None = field(default=None, metadata={"flag": "--prompt-len", "kind": "value"})
    new_tokens: int = field(default=32, metadata={"flag": "--new-tokens", "kind": "value"})
    decode_impl: list[str] = field(default_factory=lambda: ['eager'], metadata={"flag": "--decode-impl", "kind": "list"})
    warmup: int = field(default=1, metadata={"flag": "--warmup", "kind": "value"})
    repeats: int = field(default=5, metadata={"flag": "--repeats", "kind": "value"})
    cache: bool = field(default=False, metadata={"flag": "--cache", "kind": "switch"})
    fit_batch: bool = field(default=False, metadata={"flag": "--fit-batch", "kind": "switch"})
    layer_index: int | None = field(default=None, metadata={"flag": "--layer-index", "kind": "value"})
    profile: bool = field(default=False, metadata={"flag": "--profile", "kind": "switch"})
    cost_table: str | None = field(default=None, metadata={"flag": "--cost-table", "kind": "value"})
    ratios: str | None = field(default=None, metadata={"flag": "--ratios", "kind": "value"})
    cost_layers: str | None = field(default=None, metadata={"flag": "--cost-layers", "kind": "value"})
    policies: str | None = field(default=None, metadata={"flag": "--policies", "kind": "value"})
    json_out: str | None = field(default=None, metadata={"flag": "--json", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class AnalyzeOptions(ModelOptions):
    """`orthorank analyze`."""

    command: ClassVar[str] = "analyze"
    dataset: str | None = field(default=None, metadata={"flag": "--dataset", "kind": "value"})
    text: str | None = field(default=None, metadata={"flag": "--text", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    samples: int = field(default=4, metadata={"flag": "--samples", "kind": "value"})
    seq_len: int = field(default=512, metadata={"flag": "--seq-len", "kind": "value"})
    ratio: float = field(default=0.33, metadata={"flag": "--ratio", "kind": "value"})
    criterion: str = field(default='dot', metadata={"flag": "--criterion", "kind": "value"})
    sample_tokens: int = field(default=48, metadata={"flag": "--sample-tokens", "kind": "value"})
    compare_json: list[str] = field(default_factory=lambda: [], metadata={"flag": "--compare-json", "kind": "repeat"})
    selection_map: list[str] = field(default_factory=lambda: [], metadata={"flag": "--selection-map", "kind": "repeat"})
    out: str = field(metadata={"flag": "--out", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class SelectionMapOptions(ModelOptions, SelectionOptions):
    """`orthorank selection-map`."""

    command: ClassVar[str] = "selection-map"
    method: str = field(default='orthorank', metadata={"flag": "--method", "kind": "value"})
    layers: str | None = field(default=None, metadata={"flag": "--layers", "kind": "value"})
    plan: str | None = field(default=None, metadata={"flag": "--plan", "kind": "value"})
    sparsity: float | None = field(default=None, metadata={"flag": "--sparsity", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    prompts: str = field(default='needle:2k,longbench:multi_news', metadata={"flag": "--prompts", "kind": "value"})
    max_tokens: int = field(default=2048, metadata={"flag": "--max-tokens", "kind": "value"})
    policies: str | None = field(default=None, metadata={"flag": "--policies", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    out: str = field(metadata={"flag": "--out", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class CalibrateOptions(ModelOptions, SelectionOptions, StoreOptions):
    """`orthorank calibrate`."""

    command: ClassVar[str] = "calibrate"
    method: str = field(metadata={"flag": "--method", "kind": "value"})
    sparsity: str | None = field(default=None, metadata={"flag": "--sparsity", "kind": "value"})
    target_speedup: str | None = field(default=None, metadata={"flag": "--target-speedup", "kind": "value"})
    cost_table: str | None = field(default=None, metadata={"flag": "--cost-table", "kind": "value"})
    ratios: str | None = field(default=None, metadata={"flag": "--ratios", "kind": "value"})
    router: str | None = field(default=None, metadata={"flag": "--router", "kind": "value"})
    calib_data: str = field(default='mix', metadata={"flag": "--calib-data", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    calib_samples: int | None = field(default=None, metadata={"flag": "--calib-samples", "kind": "value"})
    calib_tokens: int | None = field(default=None, metadata={"flag": "--calib-tokens", "kind": "value"})
    seq_len: int = field(default=256, metadata={"flag": "--seq-len", "kind": "value"})
    batch_size: int = field(default=4, metadata={"flag": "--batch-size", "kind": "value"})
    match: list[str] = field(default_factory=lambda: ['compute'], metadata={"flag": "--match", "kind": "list"})
    cost_seq_len: int = field(default=2048, metadata={"flag": "--cost-seq-len", "kind": "value"})
    screen_fraction: float | None = field(default=None, metadata={"flag": "--screen-fraction", "kind": "value"})
    exhaustive: bool = field(default=False, metadata={"flag": "--exhaustive", "kind": "switch"})
    recheck: int = field(default=1, metadata={"flag": "--recheck", "kind": "value"})
    measure_speed: int = field(default=5, metadata={"flag": "--measure-speed", "kind": "value"})
    out: str | None = field(default=None, metadata={"flag": "--out", "kind": "value"})
    json_out: str | None = field(default=None, metadata={"flag": "--json", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class FitRouterOptions(ModelOptions, StoreOptions):
    """`orthorank fit-router`."""

    command: ClassVar[str] = "fit-router"
    plan: str = field(metadata={"flag": "--plan", "kind": "value"})
    json_out: str | None = field(default=None, metadata={"flag": "--json", "kind": "value"})
    calib_data: str = field(default='mix', metadata={"flag": "--calib-data", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    calib_samples: int = field(default=32, metadata={"flag": "--calib-samples", "kind": "value"})
    seq_len: int = field(default=512, metadata={"flag": "--seq-len", "kind": "value"})
    targets: str = field(default='update,relative,loss,loss-abs,fisher', metadata={"flag": "--targets", "kind": "value"})
    alphas: str = field(default='0.1,1,10,100,1000,10000', metadata={"flag": "--alphas", "kind": "value"})
    iterations: int = field(default=2, metadata={"flag": "--iterations", "kind": "value"})
    fisher_samples: int = field(default=2, metadata={"flag": "--fisher-samples", "kind": "value"})
    batch_size: int = field(default=4, metadata={"flag": "--batch-size", "kind": "value"})
    keep_ratio: bool = field(default=False, metadata={"flag": "--keep-ratio", "kind": "switch"})
    match_compute_of: str | None = field(default=None, metadata={"flag": "--match-compute-of", "kind": "value"})
    cost_seq_len: int | None = field(default=None, metadata={"flag": "--cost-seq-len", "kind": "value"})
    layers: str | None = field(default=None, metadata={"flag": "--layers", "kind": "value"})
    always_route: bool = field(default=False, metadata={"flag": "--always-route", "kind": "switch"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class CompareOptions(ModelOptions, StoreOptions):
    """`orthorank compare`."""

    command: ClassVar[str] = "compare"
    methods: str = field(default='dense,sleb,shortened-ppl,shortgpt,orthorank', metadata={"flag": "--methods", "kind": "value"})
    sparsity: str = field(default='0.1,0.2', metadata={"flag": "--sparsity", "kind": "value"})
    datasets: str = field(default='wikitext2,c4', metadata={"flag": "--datasets", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    seq_len: int = field(default=2048, metadata={"flag": "--seq-len", "kind": "value"})
    max_windows: int | None = field(default=None, metadata={"flag": "--max-windows", "kind": "value"})
    skip_windows: int = field(default=0, metadata={"flag": "--skip-windows", "kind": "value"})
    batch_size: int = field(default=1, metadata={"flag": "--batch-size", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    match: str = field(default='compute', metadata={"flag": "--match", "kind": "value"})
    ablations: bool = field(default=False, metadata={"flag": "--ablations", "kind": "switch"})
    ablation_levels: str | None = field(default=None, metadata={"flag": "--ablation-levels", "kind": "value"})
    policies: str | None = field(default=None, metadata={"flag": "--policies", "kind": "value"})
    measure_speed: int = field(default=0, metadata={"flag": "--measure-speed", "kind": "value"})
    continuation: bool = field(default=False, metadata={"flag": "--continuation", "kind": "switch"})
    no_ppl: bool = field(default=False, metadata={"flag": "--no-ppl", "kind": "switch"})
    zeroshot: bool = field(default=False, metadata={"flag": "--zeroshot", "kind": "switch"})
    tasks: str = field(default='piqa,winogrande,hellaswag,arc_easy,arc_challenge', metadata={"flag": "--tasks", "kind": "value"})
    limit: int | None = field(default=None, metadata={"flag": "--limit", "kind": "value"})
    zeroshot_batch_size: int = field(default=16, metadata={"flag": "--zeroshot-batch-size", "kind": "value"})
    out: str = field(default='results/compare', metadata={"flag": "--out", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class ZeroshotOptions(ModelOptions, SelectionOptions, StoreOptions):
    """`orthorank zeroshot`."""

    command: ClassVar[str] = "zeroshot"
    method: str = field(default='dense', metadata={"flag": "--method", "kind": "value"})
    layers: str | None = field(default=None, metadata={"flag": "--layers", "kind": "value"})
    plan: str | None = field(default=None, metadata={"flag": "--plan", "kind": "value"})
    sparsity: float | None = field(default=None, metadata={"flag": "--sparsity", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    tasks: str = field(default='piqa,winogrande,hellaswag,arc_easy,arc_challenge', metadata={"flag": "--tasks", "kind": "value"})
    limit: int | None = field(default=None, metadata={"flag": "--limit", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    batch_size: int | str | None = field(default=None, metadata={"flag": "--batch-size", "kind": "value"})
    metric: str = field(default='acc', metadata={"flag": "--metric", "kind": "value"})
    json_out: str | None = field(default=None, metadata={"flag": "--json", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class GenerateOptions(ModelOptions, SelectionOptions):
    """`orthorank generate`."""

    command: ClassVar[str] = "generate"
    method: str = field(default='dense', metadata={"flag": "--method", "kind": "value"})
    layers: str | None = field(default=None, metadata={"flag": "--layers", "kind": "value"})
    plan: str | None = field(default=None, metadata={"flag": "--plan", "kind": "value"})
    sparsity: float | None = field(default=None, metadata={"flag": "--sparsity", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    preset: str | None = field(default=None, metadata={"flag": "--preset", "kind": "value"})
    prompt: str | None = field(default=None, metadata={"flag": "--prompt", "kind": "value"})
    file: str | None = field(default=None, metadata={"flag": "--file", "kind": "value"})
    max_new_tokens: int = field(default=64, metadata={"flag": "--max-new-tokens", "kind": "value"})
    batch_size: int = field(default=8, metadata={"flag": "--batch-size", "kind": "value"})
    chat: bool = field(default=False, metadata={"flag": "--chat", "kind": "switch"})
    global_head: int | None = field(default=None, metadata={"flag": "--global-head", "kind": "value"})
    global_tail: int | None = field(default=None, metadata={"flag": "--global-tail", "kind": "value"})
    compile: bool = field(default=False, metadata={"flag": "--compile", "kind": "switch"})
    json_out: str | None = field(default=None, metadata={"flag": "--json", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class LongInputOptions(ModelOptions, StoreOptions):
    """What `longctx` and `longbench` share (the CLI's longctx._add_common)."""

    methods: str = field(default='dense,sleb,orthorank', metadata={"flag": "--methods", "kind": "value"})
    sparsity: float = field(default=0.2, metadata={"flag": "--sparsity", "kind": "value"})
    decode_modes: str = field(default='dense,threshold', metadata={"flag": "--decode-modes", "kind": "value"})
    policies: str | None = field(default=None, metadata={"flag": "--policies", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    batch_size: int = field(default=1, metadata={"flag": "--batch-size", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    out: str = field(metadata={"flag": "--out", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class LongctxOptions(LongInputOptions):
    """`orthorank longctx`."""

    command: ClassVar[str] = "longctx"
    tasks: str = field(default='niah_single,niah_multikey,niah_multivalue,variable_tracking,common_words', metadata={"flag": "--tasks", "kind": "value"})
    lengths: str = field(default='1k,2k,4k', metadata={"flag": "--lengths", "kind": "value"})
    samples: int = field(default=50, metadata={"flag": "--samples", "kind": "value"})


@dataclass(kw_only=True)
class FrontierOptions(ModelOptions, StoreOptions):
    """`orthorank frontier`."""

    command: ClassVar[str] = "frontier"
    methods: str = field(default='dense,sleb,shortgpt,orthorank,depth,progressive,local', metadata={"flag": "--methods", "kind": "value"})
    levels: str = field(default='0.05,0.1,0.15,0.2', metadata={"flag": "--levels", "kind": "value"})
    policies: str | None = field(default=None, metadata={"flag": "--policies", "kind": "value"})
    preset: str | None = field(default=None, metadata={"flag": "--preset", "kind": "value"})
    schedule_start: float | None = field(default=None, metadata={"flag": "--schedule-start", "kind": "value"})
    tails: str | None = field(default=None, metadata={"flag": "--tails", "kind": "value"})
    calib_samples: int = field(default=8, metadata={"flag": "--calib-samples", "kind": "value"})
    score_on: str = field(default='evaluation', metadata={"flag": "--score-on", "kind": "value"})
    stop_after_loss: bool = field(default=False, metadata={"flag": "--stop-after-loss", "kind": "switch"})
    lengths: str = field(default='4k,8k', metadata={"flag": "--lengths", "kind": "value"})
    tasks: str = field(default='niah_single,niah_multikey', metadata={"flag": "--tasks", "kind": "value"})
    layouts: str = field(default='last', metadata={"flag": "--layouts", "kind": "value"})
    chat: str = field(default='off', metadata={"flag": "--chat", "kind": "value"})
    spans: str | None = field(default=None, metadata={"flag": "--spans", "kind": "value"})
    longbench: int | None = field(default=None, metadata={"flag": "--longbench", "kind": "value"})
    longbench_task: str = field(default='multi_news', metadata={"flag": "--longbench-task", "kind": "value"})
    longbench_new_tokens: int | None = field(default=None, metadata={"flag": "--longbench-new-tokens", "kind": "value"})
    longbench_dir: str | None = field(default=None, metadata={"flag": "--longbench-dir", "kind": "value"})
    samples: int = field(default=10, metadata={"flag": "--samples", "kind": "value"})
    repeats: int = field(default=5, metadata={"flag": "--repeats", "kind": "value"})
    plans_dir: str | None = field(default=None, metadata={"flag": "--plans-dir", "kind": "value"})
    batch_size: int = field(default=1, metadata={"flag": "--batch-size", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    out: str = field(metadata={"flag": "--out", "kind": "value"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


@dataclass(kw_only=True)
class LongbenchOptions(LongInputOptions):
    """`orthorank longbench`."""

    command: ClassVar[str] = "longbench"
    tasks: str | None = field(default=None, metadata={"flag": "--tasks", "kind": "value"})
    limit: int | None = field(default=None, metadata={"flag": "--limit", "kind": "value"})
    max_length: int | None = field(default=None, metadata={"flag": "--max-length", "kind": "value"})
    no_chat: bool = field(default=False, metadata={"flag": "--no-chat", "kind": "switch"})


@dataclass(kw_only=True)
class StudyOptions(ModelOptions):
    """`orthorank study`."""

    command: ClassVar[str] = "study"
    out: str = field(metadata={"flag": "--out", "kind": "value"})
    budget: str = field(default='quick', metadata={"flag": "--budget", "kind": "value"})
    stages: str | None = field(default=None, metadata={"flag": "--stages", "kind": "value"})
    data_dir: str | None = field(default=None, metadata={"flag": "--data-dir", "kind": "value"})
    store: str | None = field(default=None, metadata={"flag": "--store", "kind": "value"})
    summary: list[str] | None = field(default=None, metadata={"flag": "--summary", "kind": "several"})
    overwrite: bool = field(default=False, metadata={"flag": "--overwrite", "kind": "switch"})


BY_COMMAND: dict[str, type[Options]] = {c.command: c for c in (
    PplOptions, BenchOptions, AnalyzeOptions, SelectionMapOptions, CalibrateOptions, FitRouterOptions, CompareOptions,
    ZeroshotOptions, GenerateOptions, LongctxOptions, LongbenchOptions, FrontierOptions, StudyOptions)}
