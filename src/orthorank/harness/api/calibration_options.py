"""Options shared by the calibration commands (`calibrate` and its hybrid search): sparsity lists, token counts,
match rules and the calibration source, each checked before a model is loaded."""

from __future__ import annotations

import math

from orthorank.harness.api.options import Options
from orthorank.errors import UserError, number_list
from orthorank.harness.evaluation.data import load_calibration_part
from orthorank.method.plan import Plan, check_sparsity
from orthorank.method.policies import FITTED, get_policy
from orthorank.method.selection import SelectionConfig
from orthorank.harness.search.calibration import DEFAULT_CALIB_TOKENS, FIRST_RACE_TOKENS, parse_mix


def screen_batches(opts: Options, batches: int) -> int | None:
    """The batches every candidate is scored on first (None: exhaustive). --screen-fraction when given, else the
    batches of the first FIRST_RACE_TOKENS calibration tokens."""
    if opts.exhaustive:
        return None
    if opts.screen_fraction is not None:
        if not 0.0 < opts.screen_fraction <= 1.0:
            raise UserError(f"--screen-fraction must be in (0, 1], got {opts.screen_fraction}")
        screen = max(1, math.ceil(opts.screen_fraction * batches - 1e-9))
    else:
        screen = max(1, math.ceil(FIRST_RACE_TOKENS / (opts.batch_size * opts.seq_len) - 1e-9))
    return None if screen >= batches else screen


def parse_sparsities(text: str, search: bool = False) -> list[float]:
    """--sparsity values; search=True (a plan is searched for each): 0 asks for a plan that changes nothing."""
    values = number_list(text, "--sparsity")
    for v in values:
        check_sparsity(v)
        if search and v == 0:
            raise UserError("--sparsity 0 changes no layer, so there is nothing to search; give values in (0, 1)")
    return sorted(set(values))


def calibration_samples(opts: Options) -> int:
    """--calib-tokens (a multiple of --seq-len) or --calib-samples (default: DEFAULT_CALIB_TOKENS)."""
    if opts.calib_tokens is not None and opts.calib_samples is not None:
        raise UserError("give --calib-tokens or --calib-samples, not both")
    if opts.calib_samples is not None:
        return opts.calib_samples
    if opts.calib_tokens is None:
        return max(1, DEFAULT_CALIB_TOKENS // opts.seq_len)
    if opts.calib_tokens % opts.seq_len:
        raise UserError(f"--calib-tokens {opts.calib_tokens} is not a multiple of --seq-len {opts.seq_len}")
    return opts.calib_tokens // opts.seq_len


def check_calibration_source(source: str, data_dir) -> None:
    """A missing or unknown calibration source, found before the model is loaded."""
    for name in parse_mix(source) or [source]:
        if name != "wikitext2-train":
            load_calibration_part(name, data_dir)


def router_base(opts: Options) -> SelectionConfig | None:
    """--policy router searches under a router bank (`fit-router --layers inner`): its fitted state, or None."""
    if opts.policy is None or FITTED not in get_policy(opts.policy).needs:
        if opts.router:
            raise UserError("--router gives the router policy's fitted state: add --policy router")
        return None
    if not opts.router:
        raise UserError("--policy router searches under fitted routers: give --router BANK (a plan from "
                        "`orthorank fit-router --layers inner`) whose routers cover every candidate layer")
    bank = Plan.load(opts.router)
    if bank.selection is None or bank.selection.fitted is None:
        raise UserError(f"{opts.router} holds no fitted router")
    return SelectionConfig(policy=opts.policy, fitted=bank.selection.fitted)
