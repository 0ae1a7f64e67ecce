"""An offline long-context suite in the style of RULER (Hsieh et al. 2024), generated from a seed, no downloads.

Tasks (RULER's names in brackets):
- niah_single   [niah_single]: one "special magic number" sentence hidden in a haystack; recall the number.
- niah_multikey [niah_multikey]: four needles with different keys; recall the asked key's number.
- niah_multivalue [niah_multivalue]: four numbers for the same key; recall all of them.
- variable_tracking [vt]: a chain VAR A = 12345, VAR B = VAR A, ... hidden in the haystack; name every variable
  that holds the value.
- common_words [cwe]: a numbered word list in which ten words recur many times; name the ten.
Haystacks are consecutive sentences of WikiText-2 and C4 text (alternating by sample); every sample is a pure
function of (seed, task, length, index). Prompts end with an answer prefix (completion style, as RULER does
for base models) and are built to the target length in tokens of the model's tokenizer. A sample counts as
correct when every expected string appears in the prediction (exact match of each answer; RULER's
string_match_all at the sample level).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

from orthorank.errors import UserError
from orthorank.evaluation.data import load_eval_text

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "common_words")
LENGTHS = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192}
MAX_NEW_TOKENS = {"niah_single": 16, "niah_multikey": 16, "niah_multivalue": 48, "variable_tracking": 32,
                  "common_words": 80}
_KEYS = ["apple", "river", "lantern", "violet", "harbor", "cobalt", "meadow", "falcon", "marble", "cedar",
         "quartz", "willow", "ember", "glacier", "saffron", "orchid", "canyon", "thistle", "nectar", "summit"]


@dataclass
class Sample:
    task: str
    length: int  # target prompt length in tokens
    index: int
    prompt: str
    answers: list[str]
    max_new_tokens: int
    meta: dict = field(default_factory=dict)


def parse_lengths(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in LENGTHS:
            out.append(LENGTHS[part])
        elif part.isdigit() and int(part) >= 256:
            out.append(int(part))
        else:
            raise UserError(f"unknown length {part!r}; use {', '.join(LENGTHS)} or a token count >= 256")
    return out


def parse_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise UserError(f"unknown task {bad[0] if bad else text!r}; choose from {', '.join(TASKS)}")
    return tasks


def _rng(seed: int, task: str, length: int, index: int) -> random.Random:
    h = hashlib.sha256(f"{seed}/{task}/{length}/{index}".encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def split_sentences(text: str) -> list[str]:
    text = re.sub(r"\s+", " ", text.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", "."))
    parts = re.split(r"(?<=[.!?])\s+", text)
    return [p.strip() for p in parts if len(p.split()) >= 4 and "=" not in p]


class SuiteBuilder:
    """Builds samples to a token budget with one tokenizer over sentence pools (e.g. WikiText-2 and C4)."""

    def __init__(self, tokenizer, pools: dict[str, list[str]], seed: int = 0) -> None:
        if not pools or any(len(p) < 100 for p in pools.values()):
            raise UserError("the haystack text is too short to build the long-context suite")
        self.tok = tokenizer
        self.pools = pools
        self.seed = seed
        self._lens: dict[str, list] = {}  # per pool: sentence token counts; "vocab:<pool>": its word list

    def _n_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False).input_ids)

    def _sentence_lengths(self, name: str) -> list[int]:
        if name not in self._lens:
            sents = self.pools[name]
            # tokenised in blocks: lengths only guide the fill; the prompt is measured exactly afterwards
            self._lens[name] = [len(ids) for ids in self.tok(sents, add_special_tokens=False).input_ids]
        return self._lens[name]

    def _haystack(self, rng: random.Random, pool: str, budget: int) -> list[str]:
        sents, lens = self.pools[pool], self._sentence_lengths(pool)
        start = rng.randrange(len(sents))
        out, used, i = [], 0, start
        while used < budget:
            out.append(sents[i % len(sents)])
            used += lens[i % len(sents)] + 1
            i += 1
            if i - start > len(sents):
                break
        return out

    def sample(self, task: str, length: int, index: int) -> Sample:
        rng = _rng(self.seed, task, length, index)
        pool = sorted(self.pools)[index % len(self.pools)]
        build = getattr(self, f"_{task}")
        # Fill to the budget, then trim sentences until the prompt fits the target length.
        reserve = MAX_NEW_TOKENS[task]
        budget = length - reserve - 120
        for _ in range(6):
            prompt, answers, meta = build(_rng(self.seed, task, length, index), pool, max(budget, 64))
            n = self._n_tokens(prompt)
            if n <= length - reserve:
                break
            budget -= (n - (length - reserve)) + 16
        else:
            raise UserError(f"could not fit a {task} sample into {length} tokens")
        meta.update(pool=pool, prompt_tokens=n)
        del rng
        return Sample(task, length, index, prompt, answers, MAX_NEW_TOKENS[task], meta)

    # -- tasks ----------------------------------------------------------------------------------------------------

    @staticmethod
    def _insert(hay: list[str], needles: list[str], rng: random.Random) -> str:
        hay = list(hay)
        for needle in needles:
            hay.insert(rng.randint(0, len(hay)), needle)
        return " ".join(hay)

    @staticmethod
    def _number(rng: random.Random) -> str:
        return str(rng.randint(1_000_000, 9_999_999))

    def _niah(self, rng, pool, budget, keys: int, values: int):
        chosen = rng.sample(_KEYS, keys)
        target = chosen[0]
        needles, answers = [], []
        for k in chosen:
            for _ in range(values if k == target else 1):
                v = self._number(rng)
                needles.append(f"One of the special magic numbers for {k} is: {v}.")
                if k == target:
                    answers.append(v)
        rng.shuffle(needles)
        context = self._insert(self._haystack(rng, pool, budget), needles, rng)
        head = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the numbers afterwards.\n")
        if values == 1:
            q = (f"\nWhat is the special magic number for {target} mentioned in the provided text? "
                 f"The special magic number for {target} mentioned in the provided text is")
        else:
            q = (f"\nWhat are all the special magic numbers for {target} mentioned in the provided text? "
                 f"The special magic numbers for {target} mentioned in the provided text are")
        return head + context + q, answers, {"key": target}

    def _niah_single(self, rng, pool, budget):
        return self._niah(rng, pool, budget, keys=1, values=1)

    def _niah_multikey(self, rng, pool, budget):
        return self._niah(rng, pool, budget, keys=4, values=1)

    def _niah_multivalue(self, rng, pool, budget):
        return self._niah(rng, pool, budget, keys=1, values=4)

    def _variable_tracking(self, rng, pool, budget):
        names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(5)]
        value = str(rng.randint(10000, 99999))
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
        hay = self._haystack(rng, pool, budget)
        # keep the chain in order: insert at increasing positions
        positions = sorted(rng.randint(0, len(hay)) for _ in chain)
        for offset, (pos, stmt) in enumerate(zip(positions, chain)):
            hay.insert(pos + offset, stmt)
        head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        q = (f"\nQuestion: Find all variables that are assigned the value {value} in the text above. "
             f"Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
             f"assigned the value {value}, they are:")
        return head + " ".join(hay) + q, names, {"value": value}

    def _vocab(self, pool: str) -> list[str]:
        key = f"vocab:{pool}"
        if key not in self._lens:
            words = {w.lower() for sent in self.pools[pool][:6000] for w in re.findall(r"\b[A-Za-z]{4,9}\b", sent)}
            self._lens[key] = sorted(words)
        return self._lens[key]

    def _common_words(self, rng, pool, budget):
        vocab = self._vocab(pool)
        # tokens per numbered item, measured on a trial list with this tokenizer
        trial = " ".join(f"{i + 1}. {w}" for i, w in enumerate(vocab[:60]))
        per_item = self._n_tokens(trial) / 60
        n_items = max(40, int(budget / per_item))
        n_common = max(30, n_items // 3)  # ten words, each n_common / 10 (>= 3) times; every other word once
        words = rng.sample(vocab, min(len(vocab), 10 + n_items - n_common))
        common, rare = words[:10], words[10:]
        items = [common[i % 10] for i in range(n_common)] + rare
        rng.shuffle(items)
        listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))
        head = "Below is a numbered list of words. In these words, some appear more often than others.\n"
        q = ("\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that "
             "appear most often in the list are:")
        return head + listing + q, common, {}


def score(prediction: str, answers: list[str]) -> float:
    """1.0 when every expected string appears in the prediction (case-insensitive), else 0.0."""
    p = prediction.lower()
    return float(all(a.lower() in p for a in answers))


def load_pools(data_dir=None) -> dict[str, list[str]]:
    """Sentence pools from the offline WikiText-2 test text and the C4 validation sample."""
    return {name: split_sentences(load_eval_text(name, data_dir)) for name in ("wikitext2", "c4")}
