"""What a study measures at each budget: window, item and sample counts, printed in every caption.

quick is a newcomer's first run (the embedded model on 2 cores within 15 minutes, with its committed plans);
standard is what the README reports; full is the paper's protocol where this machine allows it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orthorank.errors import UserError
from orthorank.harness.search.calibration import DEFAULT_CALIB_BATCH as CALIB_BATCH
from orthorank.harness.search.calibration import FIRST_RACE_TOKENS  # racing from 2K tokens at any size

# what every study evaluates: its text domains and zero-shot tasks
DOMAINS = ("wikitext2", "c4", "code", "news")
ZEROSHOT_TASKS = ("piqa", "winogrande", "hellaswag", "arc_easy", "arc_challenge")


@dataclass(frozen=True)
class TransferSetting:
    source: str  # a calibration source of `calibrate --calib-data`
    tokens: int

    @property
    def name(self) -> str:
        return f"{self.source}-{self.tokens // 1024}k" if self.tokens % 1024 == 0 else f"{self.source}-{self.tokens}"

    def calibrate_options(self, seq_len: int) -> dict[str, Any]:
        """This setting's calibration, as CalibrateOptions fields."""
        return {"calib_data": self.source, "calib_tokens": self.tokens, "seq_len": seq_len,
                "batch_size": CALIB_BATCH, "screen_fraction": min(1.0, FIRST_RACE_TOKENS / self.tokens)}


@dataclass(frozen=True)
class TransferBudget:
    settings: tuple[TransferSetting, ...]
    windows: int  # first windows of each domain
    seq_len: int  # evaluation windows, and the length at which compute is matched
    levels: tuple[float, ...]  # evaluated levels (plans are searched at every level of the budget)
    calib_seq_len: int = 256  # calibration windows (batches of CALIB_BATCH)
    calibrate: dict[str, Any] = field(default_factory=dict)  # more CalibrateOptions fields for its searches

    def caption(self) -> str:
        return (f"calibration settings {', '.join(s.name for s in self.settings)}; evaluation on the first "
                f"{self.windows} windows of {self.seq_len} tokens of {', '.join(DOMAINS)} (a slice)")


# The issue's matrix: four sources at 8K tokens, and C4 at 2K and 32K for the size effect.
ISSUE_SETTINGS = (TransferSetting("c4", 8192), TransferSetting("mix", 8192), TransferSetting("code", 8192),
                  TransferSetting("wikitext2", 8192), TransferSetting("c4", 2048), TransferSetting("c4", 32768))


# the rules a serving engine could compute, the paper's ablations, and the oracle (the bound)
RULES = ("random", "inverse", "oracle", "norm", "attention", "prev-update")
# modifiers of the paper's rule that keep a prompt's end updated (the long-input candidates)
RECENT = ("orthogonal+recent=8", "orthogonal+recent=64", "orthogonal+recent=256")


@dataclass(frozen=True)
class PolicyBudget:
    lengths: str  # the offline suite's prompt lengths
    samples: int  # per suite task and length
    tasks: tuple[str, ...]  # suite tasks
    longbench_limit: int  # first multi_news examples
    levels: tuple[float, ...] = (0.1, 0.2)
    policies: tuple[str, ...] = RULES + RECENT
    longbench_max_length: int | None = None  # prompt tokens before middle truncation (None: the model's context)

    def caption(self) -> str:
        return (f"long inputs: {', '.join(self.tasks)} at {self.lengths} tokens, {self.samples} samples per task "
                f"and length; LongBench multi_news, the first {self.longbench_limit} examples (a slice)")


@dataclass(frozen=True)
class RouterBudget:
    """The router stage: a router fitted per level on the study's OrthoRank plans (calibration text only), then
    compared with SLEB and the paper's rule on the perplexity stage's windows."""

    calib_samples: int = 32  # calibration windows (a quarter held out to choose the target and regularisation)
    calib_seq_len: int = 512
    iterations: int = 2
    targets: tuple[str, ...] = ()  # () = every target of harness/search/router_fit.py

    def fit_options(self) -> dict[str, Any]:
        """The fit's settings, as FitRouterOptions fields."""
        out: dict[str, Any] = {"calib_samples": self.calib_samples, "seq_len": self.calib_seq_len,
                               "iterations": self.iterations}
        return out | ({"targets": ",".join(self.targets)} if self.targets else {})


@dataclass(frozen=True)
class LongPromptBudget:
    """The long-prompt stage: the retrieval frontier (`orthorank frontier`) at these lengths, every method at every
    level, scored on the needle tasks and timed against dense at batch 1; tails chosen on calibration prompts."""

    # standard: 7 methods at levels to 40% (past 20% only local attention, whose share of a long prefill grows with
    # its length, is still scored: every other method lost below it on the frontiers measured, and --stop-after-loss
    # leaves out the levels above a loss), the question-scored policy and a tail on the selecting ones; 40-60 minutes
    # per model at 4k on 2 cores in bfloat16 and 2.5 times that at 8k
    lengths: str = "4k,8k"
    levels: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4)
    samples: int = 10  # per task
    repeats: int = 5  # interleaved timing rounds per length
    methods: str = "dense,sleb,shortgpt,orthorank,depth,progressive,local"
    tasks: str = "niah_single,niah_multikey"
    tails: str | None = "0,64"
    calib_samples: int = 8
    policies: str | None = "attention+window=64"
    stop_after_loss: bool = True  # levels above a lost one are not scored (harness/api/frontier.py)

    def frontier_options(self) -> dict[str, Any]:
        """The stage's settings, as FrontierOptions fields."""
        return {"lengths": self.lengths, "levels": ",".join(f"{s:g}" for s in self.levels), "samples": self.samples,
                "repeats": self.repeats, "methods": self.methods, "tasks": self.tasks, "tails": self.tails,
                "calib_samples": self.calib_samples, "policies": self.policies,
                "stop_after_loss": self.stop_after_loss}


@dataclass(frozen=True)
class Budget:
    name: str
    levels: tuple[float, ...]  # sparsities of every plan and perplexity row
    claim_levels: tuple[float, ...]  # sparsities of zero-shot, long-context and speed rows
    ppl_windows: int  # first windows of each domain
    ppl_seq_len: int
    zeroshot_limit: int  # first items of each task
    longctx_lengths: str
    longctx_samples: int  # per task and length
    speed_repeats: int  # interleaved prefill timings (standard: 15; with 5 the +-10% speed claim stayed undecided,
    # its interval 0.87-1.08 on a quiet 2-core machine, where one timing varies by ~10%)
    speed_seq_len: int  # prefill tokens, and the prompt before the timed decode steps
    sink_samples: int
    hybrid: bool  # the hybrid frontier: a cost table of this machine, a hybrid search, its perplexity
    decode_tokens: int = 32  # timed decode steps
    calibration: dict[str, Any] = field(default_factory=dict)  # CalibrateOptions fields for plans searched here
    # (default: calibrate's defaults)
    transfer: TransferBudget | None = None  # the transfer stage (run only when asked for: hours per model)
    decode_policies: bool = True  # the decode stage: continuation perplexity under each decode policy
    policies: PolicyBudget | None = None  # the policies stage (run only when asked for: hours per model)
    router: RouterBudget | None = None  # the router stage (None: skipped)
    long_prompt: LongPromptBudget | None = None  # the long-prompt stage (run only when asked for: hours per model)

    def caption(self) -> str:
        return (f"budget {self.name}: perplexity on the first {self.ppl_windows} windows of {self.ppl_seq_len} tokens "
                f"per domain, zero-shot on the first {self.zeroshot_limit} items per task, long inputs "
                f"{self.longctx_samples} samples per task at {self.longctx_lengths} tokens, prefill speed "
                f"{self.speed_repeats} interleaved repeats at {self.speed_seq_len} tokens (decode: {self.decode_tokens} steps)")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


BUDGETS: dict[str, Budget] = {
    # quick: 9 prefill repeats at 512 tokens (seconds), enough for the speed claim's interval to decide
    "quick": Budget("quick", (0.1, 0.2), (0.2,), 4, 256, 10, "512", 2, 9, 512, 2, False, decode_tokens=8,
                    decode_policies=False, policies=PolicyBudget("512", 2, ("niah_single",), 1, (0.2,)),
                    router=RouterBudget(8, 256, 1, ("update", "relative"))),
    "standard": Budget("standard", (0.1, 0.2), (0.2,), 16, 512, 100, "1k", 6, 15, 1024, 4, True,
                       transfer=TransferBudget(ISSUE_SETTINGS, 32, 512, (0.1, 0.2)),
                       policies=PolicyBudget("1k,2k", 20, ("niah_single", "niah_multikey"), 8),
                       router=RouterBudget(), long_prompt=LongPromptBudget()),
    "full": Budget("full", (0.1, 0.2), (0.1, 0.2), 128, 2048, 1000, "1k,2k,4k", 50, 9, 2048, 8, True,
                   transfer=TransferBudget(ISSUE_SETTINGS, 64, 2048, (0.1, 0.2)),
                   policies=PolicyBudget("1k,2k,4k", 50, ("niah_single", "niah_multikey"), 20),
                   router=RouterBudget(64, 2048),
                   long_prompt=LongPromptBudget("4k,8k,16k", (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5), 25, 9,
                                                 tails="0,16,64,256")),
    # for tests and a smoke run of a new setup: every stage, seconds on a tiny model
    "test": Budget("test", (0.1, 0.2), (0.2,), 2, 64, 4, "512", 2, 6, 64, 1, False, 4,
                   {"calib_samples": 4, "seq_len": 64, "measure_speed": 0},
                   TransferBudget((TransferSetting("c4", 128), TransferSetting("code", 128)), 2, 64, (0.2,),
                                  calib_seq_len=32, calibrate={"measure_speed": 0}),
                   policies=PolicyBudget("512", 1, ("niah_single",), 1, (0.2,), ("random", "oracle", "orthogonal+recent=8"),
                                         longbench_max_length=256),
                   router=RouterBudget(4, 32, 1, ("update", "loss")),
                   long_prompt=LongPromptBudget("256", (0.2,), 1, 2, "dense,sleb,orthorank,depth,progressive",
                                                "niah_single", "0,8", 1, None)),
}


def get_budget(name: str) -> Budget:
    if name not in BUDGETS:
        raise UserError(f"unknown budget {name!r}; choose one of {', '.join(BUDGETS)}")
    return BUDGETS[name]
