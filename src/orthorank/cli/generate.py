"""`orthorank generate`: text from a model under a plan, streamed as it comes, with time to first token and
decode speed at the end.

    orthorank generate --method orthorank --sparsity 0.2 --prompt "The attention sink is" --max-new-tokens 40
    orthorank generate --plan plans/smollm2-135m/sleb-0.2.json --file prompts.txt --chat
"""

from __future__ import annotations

import argparse

from orthorank.cli.common import add_model_args, add_output_args, add_plan_args, non_negative_int, positive_int
from orthorank.method.registry import saved


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text under a plan (streamed; time to first token, tokens/s)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_plan_args(p, methods=("dense", "prune", *saved()), saved=True)
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="a setting chosen by the evidence, e.g. long-prompt (docs/long-prompts.md); it replaces "
                        "--method/--plan (default: none)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt (required: --prompt or --file)")
    src.add_argument("--file", help="a text file of prompts, one per line; batched with left padding (required: "
                                    "--prompt or --file)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64,
                   help="tokens generated per prompt (default %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per batch for --file (default %(default)s)")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to each prompt")
    p.add_argument("--global-head", type=non_negative_int, default=None, metavar="H",
                   help="local attention (the long-prompt preset): the prompt's first H tokens, its instruction, are "
                        "read by every query; counted from the first token, a chat template's own turns included "
                        "(default: the preset's)")
    p.add_argument("--global-tail", type=non_negative_int, default=None, metavar="W",
                   help="local attention: the prompt's last W tokens, its question or answer cue, read every key "
                        "(default: the preset's)")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode step with torch.compile (static cache; the first tokens pay the "
                        "compilation); eager with one warning line where compile cannot run")
    add_output_args(p)
