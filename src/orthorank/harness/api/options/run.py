"""Options of the commands that run a model for speed or text: `bench` and `generate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orthorank.harness.api.options.base import finite_float, flag, non_negative_int, positive_int
from orthorank.harness.api.options.groups import (DataOptions, JsonOutputOptions, ModelOptions, PlanOptions,
                                                  SelectionOptions)
from orthorank.method.registry import benched, default_methods


@dataclass(kw_only=True)
class BenchOptions(ModelOptions, SelectionOptions, DataOptions, JsonOutputOptions):
    command: ClassVar[str] = "bench"
    about: ClassVar[str] = "throughput: dense vs layer removal vs OrthoRank (prefill, decode, layer)"
    description: ClassVar[str] = """\
`orthorank bench`: throughput of dense vs layer removal vs OrthoRank, side by side, with the cost model.

Modes: prefill (one forward over B x T tokens, logits for the last position only), decode (greedy steps after an
untimed prompt of T tokens, with the KV cache), layer (one decoder layer alone, dense vs selective, plus the
selection step alone). --mode, --batch-size and --seq-len take comma-separated lists; every combination is run on one
loaded model.
"""
    examples: ClassVar[bool] = True

    num_layers: int | None = flag("--num-layers", default=None, type=positive_int,
                                  help="shrink a random-weight shape (llama2-7b, llama3-8b, mistral-7b, ...) to this "
                                       "many layers (default: the shape's own count)")
    methods: list[str] = flag("--methods", factory=lambda: default_methods("bench").split(","), kind="list", item=str,
                              help=f"comma-separated, from {', '.join(benched())}: searched methods use their saved "
                                   "plan at --sparsity (or --plan), spread-* spread their layers evenly (any shape; "
                                   f"default {default_methods('bench')})")
    sparsity: float = flag("--sparsity", default=0.2, type=finite_float,
                           help="target sparsity: picks the saved plans of searched methods and the layer count of "
                                "spread-* (default %(default)s)")
    plan: list[str] = flag("--plan", factory=list, kind="repeat",
                           help="plan file overriding the layers of its method (orthorank, prune or hybrid); may "
                                "repeat (default: none, the plans --methods and --sparsity pick)")
    mode: list[str] = flag("--mode", factory=lambda: ["prefill"], kind="list", item=str,
                           help="prefill, decode, layer, or a comma-separated list (default prefill)")
    batch: list[int] = flag("--batch-size", factory=lambda: [1], kind="list", item=positive_int,
                            deprecated=("--batch",), help="batch size, or a comma-separated list (default 1)")
    seq_len: list[int] = flag("--seq-len", factory=lambda: [1024], kind="list", item=positive_int,
                              help="tokens per row, or a comma-separated list (default 1024)")
    decode_batch: list[int] | None = flag("--decode-batch-size", default=None, kind="list", item=positive_int,
                                          deprecated=("--decode-batch",),
                                          help="decode mode's batch sizes, if other than --batch-size (default: those "
                                               "of --batch-size)")
    prompt_len: int | None = flag("--prompt-len", default=None, type=positive_int,
                                  help="decode mode: untimed prompt tokens before the timed steps (default --seq-len)")
    new_tokens: int = flag("--new-tokens", default=32, type=positive_int,
                           help="decode steps timed per run (default 32)")
    prompt_text: str | None = flag("--prompt-text", default=None, metavar="SOURCE",
                                   help="prompts from calibration text instead of random tokens: a domain's held-out "
                                        "part (c4, wikitext2, news, code), mix, mix:A+B, or a text file (a causal "
                                        "router's decode speed depends on what it reads; default: random tokens)")
    decode_impl: list[str] = flag("--decode-impl", factory=lambda: ["eager"], kind="list", item=str,
                                  help="decode mode: eager (transformers' dynamic cache), static (a static cache), "
                                       "compile (a static cache and the step compiled with torch.compile; each method "
                                       "decodes its own copy of the model; eager static cache with one warning where "
                                       "compile cannot run), or a comma-separated list, run one after another "
                                       "(default eager)")
    warmup: int = flag("--warmup", default=1, type=non_negative_int, help="untimed runs per method first (default 1)")
    repeats: int = flag("--repeats", default=5, type=positive_int, help="timed runs per method (default 5)")
    cache: bool = flag("--cache", default=False, kind="switch", help="prefill: fill a KV cache, as generation does")
    fit_batch: bool = flag("--fit-batch", default=False, kind="switch",
                           help="on CUDA out-of-memory, halve the batch and retry (the batch used is recorded)")
    layer_index: int | None = flag("--layer-index", default=None, type=int,
                                   help="layer mode: which layer (default: a --plan's first selection layer, "
                                        "run with that plan's selection; else the middle one)")
    profile: bool = flag("--profile", default=False, kind="switch",
                         help="layer mode: print a profiler table per layer type and the selective "
                         "layer's time per phase against its FLOP ideal")
    cost_table: str | None = flag("--cost-table", default=None, metavar="FILE",
                                  help="instead of the modes above, measure this device's cost table for hybrid plans "
                                       "and write it to FILE: one dense decoder layer, a selective layer at each of "
                                       "--ratios, and the rest of the model, at --batch-size x --seq-len (`orthorank "
                                       "calibrate --method hybrid` reads it; default: none, run the modes)")
    ratios: str | None = flag("--ratios", default=None,
                              help="cost table: selection ratios to measure (default 0.25,0.33,0.5)")
    cost_layers: str | None = flag("--cost-layers", default=None,
                                   help="cost table: layers to time (comma-separated or 'all'; default the middle one, "
                                        "since layers of one model have the same shape)")
    policies: str | None = flag("--policies", default=None, metavar="SPECS",
                                help="add OrthoRank rows on the same layers with other selection or decode policies, "
                                     "timed side by side: comma-separated NAME[+recent=W][+first=W][+decode=MODE], "
                                     "e.g. +decode=threshold (default: none, the plan's own policy only)")


@dataclass(kw_only=True)
class GenerateOptions(ModelOptions, PlanOptions, JsonOutputOptions):
    command: ClassVar[str] = "generate"
    about: ClassVar[str] = "generate text under a plan (streamed; time to first token, tokens/s)"
    description: ClassVar[str] = """\
`orthorank generate`: text from a model under a plan, streamed as it comes, with time to first token and
decode speed at the end.

    orthorank generate --method orthorank --sparsity 0.2 --prompt "The attention sink is" --max-new-tokens 40
    orthorank generate --plan plans/smollm2-135m/sleb-0.2.json --file prompts.txt --chat
"""
    examples: ClassVar[bool] = True
    exclusive: ClassVar[dict[str, bool]] = {"source": True}

    preset: str | None = flag("--preset", default=None, metavar="NAME", group="plan",
                              help="a setting chosen by the evidence, e.g. long-prompt (docs/long-prompts.md); it "
                                   "replaces --method/--plan (default: none)")
    prompt: str | None = flag("--prompt", default=None, exclusive="source",
                              help="one prompt (required: --prompt or --file)")
    file: str | None = flag("--file", default=None, exclusive="source",
                            help="a text file of prompts, one per line; batched with left padding (required: --prompt "
                                 "or --file)")
    max_new_tokens: int = flag("--max-new-tokens", default=64, type=positive_int,
                               help="tokens generated per prompt (default %(default)s)")
    batch_size: int = flag("--batch-size", default=8, type=positive_int,
                           help="prompts per batch for --file (default %(default)s)")
    chat: bool = flag("--chat", default=False, kind="switch",
                      help="apply the tokenizer's chat template to each prompt")
    global_head: int | None = flag("--global-head", default=None, type=non_negative_int, metavar="H",
                                   help="local attention (the long-prompt preset): the prompt's first H tokens, its "
                                        "instruction, are read by every query; counted from the first token, a chat "
                                        "template's own turns included (default: the preset's)")
    global_tail: int | None = flag("--global-tail", default=None, type=non_negative_int, metavar="W",
                                   help="local attention: the prompt's last W tokens, its question or answer cue, read "
                                        "every key (default: the preset's)")
    compile: bool = flag("--compile", default=False, kind="switch",
                         help="compile the decode step with torch.compile (static cache; the first tokens pay the "
                              "compilation); eager with one warning line where compile cannot run")
