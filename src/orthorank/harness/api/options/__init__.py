"""Each command's options as one typed dataclass (base.py: how an option is written, once, as a field), grouped by
what the commands do; the option groups several commands share are in groups.py. `orthorank study`'s options live
beside the study (harness/study/options.py), which sits above the library."""

from orthorank.harness.api.options.base import (
    Options,
    batch_size_or_auto,
    comma_list,
    finite_float,
    flag,
    match_rules,
    non_negative_int,
    policy_name,
    positive_int,
    token_count,
)
from orthorank.harness.api.options.groups import (
    DataOptions,
    JsonOutputOptions,
    ModelOptions,
    OverwriteOptions,
    PlanOptions,
    SavedPlansOptions,
    SelectionOptions,
    StoreOptions,
)
from orthorank.harness.api.options.long_inputs import FrontierOptions, LongbenchOptions, LongctxOptions, LongInputOptions
from orthorank.harness.api.options.quality import (
    AnalyzeOptions,
    CompareOptions,
    PplOptions,
    SelectionMapOptions,
    ZeroshotOptions,
)
from orthorank.harness.api.options.run import BenchOptions, GenerateOptions
from orthorank.harness.api.options.search import (CalibrateOptions, FitRouterOptions, FitThresholdsOptions,
                                                  MatchSpeedOptions)

# The library's commands, in the order `orthorank --help` lists them.
BY_COMMAND: dict[str, type[Options]] = {c.command: c for c in (
    PplOptions, BenchOptions, AnalyzeOptions, SelectionMapOptions, CalibrateOptions, FitRouterOptions,
    FitThresholdsOptions, MatchSpeedOptions, CompareOptions, ZeroshotOptions, GenerateOptions, LongctxOptions, LongbenchOptions, FrontierOptions)}

__all__ = [
    "AnalyzeOptions", "BY_COMMAND", "BenchOptions", "CalibrateOptions", "CompareOptions", "DataOptions",
    "FitRouterOptions", "FitThresholdsOptions", "FrontierOptions", "GenerateOptions", "JsonOutputOptions",
    "LongInputOptions",
    "LongbenchOptions", "LongctxOptions", "MatchSpeedOptions", "ModelOptions", "Options", "OverwriteOptions",
    "PlanOptions", "PplOptions", "SavedPlansOptions", "SelectionMapOptions", "SelectionOptions", "StoreOptions", "ZeroshotOptions",
    "batch_size_or_auto", "comma_list", "finite_float", "flag", "match_rules", "non_negative_int", "policy_name",
    "positive_int", "token_count",
]
