"""The task builders of the offline RULER-style suite; longctx_suite.py lays the parts out, fits them to the length,
tokenizes and scores them.

Each builder takes (rng, pool, budget, index) and returns the `Parts` of one sample: an instruction head, the
document (the haystack holding what is asked for; `budget` is its approximate size in tokens), the question, the
task's answer prefix, and the answers. The texts follow RULER's templates (Hsieh et al. 2024, scripts/data/synthetic
in its repository) where RULER has one. The five tasks the suite started with (niah_single, niah_multikey,
niah_multivalue, variable_tracking, common_words) must keep drawing from the rng in the same order and produce the
same strings: committed results were scored on their prompts.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

from orthorank.errors import UserError

_KEYS = ["apple", "river", "lantern", "violet", "harbor", "cobalt", "meadow", "falcon", "marble", "cedar",
         "quartz", "willow", "ember", "glacier", "saffron", "orchid", "canyon", "thistle", "nectar", "summit"]
# RULER's "needle" haystack uses adjective-noun keys (wonderwords); 64 x 64 = 4,096 keys, about 70k tokens of
# needles, and further rounds ("amber-falcon-2") where a longer haystack needs more.
_ADJECTIVES = ["amber", "ancient", "bold", "brave", "bright", "brisk", "calm", "clever", "cosmic", "crimson",
               "curious", "daring", "dusty", "eager", "electric", "elegant", "emerald", "fancy", "fierce", "flat",
               "frosty", "gentle", "giant", "golden", "graceful", "hidden", "hollow", "humble", "icy", "idle",
               "jolly", "keen", "lively", "lofty", "lucky", "mellow", "misty", "modern", "narrow", "noble",
               "obscure", "odd", "pale", "patient", "plain", "polished", "proud", "quiet", "rapid", "rustic",
               "scarlet", "shiny", "silent", "silver", "sleepy", "smooth", "solid", "steady", "sturdy", "swift",
               "tender", "tidy", "vivid", "wild"]
_NOUNS = ["anchor", "badger", "basket", "beacon", "bridge", "button", "candle", "castle", "cloud", "comet",
          "compass", "cottage", "crystal", "desert", "dolphin", "dragon", "engine", "feather", "forest", "fountain",
          "garden", "giraffe", "hammer", "helmet", "island", "jacket", "kettle", "ladder", "lemon", "magnet",
          "mirror", "monkey", "needle", "ocean", "otter", "paddle", "parrot", "pebble", "pepper", "pillow",
          "planet", "pocket", "puzzle", "rabbit", "ribbon", "rocket", "saddle", "sailor", "shadow", "spider",
          "sponge", "squirrel", "statue", "teapot", "temple", "thunder", "tiger", "tunnel", "turtle", "valley",
          "wagon", "walnut", "whistle", "window"]
# RULER's noise haystack (niah with type_haystack=noise, and variable tracking).
_NOISE = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."]

_NIAH_HEAD = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.\n")
_NIAH_HEAD_FIRST = ("Some special magic numbers are hidden within the following text. Read the question, then "
                    "find the answer in the text.\n")
_VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
_QA_RULE = ("Answer the question based on the given documents with yes or no. Only give me the answer and do "
            "not output any other words.")


@dataclass
class Parts:
    head: str  # instructions before the document
    doc: str  # the document: haystack with the needles, word list or passages
    question: str  # after the document (layouts "last" and "long"); starts with "\n"
    prefix: str  # the task's answer prefix (completion style), right after the question
    answers: list[str]
    haystack: str  # "text", "noise", "needles", "words" or "passages"
    meta: dict = field(default_factory=dict)
    # Layout "first" puts the question before the document: wordings that point at the document ("above",
    # "afterwards") are replaced where the task has them.
    head_first: str | None = None
    question_first: str | None = None
    match: str = "all"  # how a prediction is scored: "all" answers in it, or "yes_no" (the first yes/no word)


def needle_keys(count: int) -> list[str]:
    """At least `count` distinct adjective-noun keys, always in the same order."""
    base = [f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS]
    keys, rnd = list(base), 2
    while len(keys) < count:
        keys += [f"{k}-{rnd}" for k in base]
        rnd += 1
    return keys


class TaskBuilders:
    """Mixin of SuiteBuilder: `_<task>(rng, pool, budget, index) -> Parts` for every task, and the haystacks."""

    tok: object
    pools: dict[str, list[str]]
    qa_rows: list[dict] | None
    _lens: dict[str, list]

    def _n_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False).input_ids)

    def _cached(self, key: str, make) -> list:
        if key not in self._lens:
            self._lens[key] = make()
        return self._lens[key]

    def _sentence_lengths(self, name: str) -> list[int]:
        # tokenised in blocks: lengths only guide the fill; the prompt is measured exactly afterwards
        return self._cached(name, lambda: [len(ids) for ids in
                                           self.tok(self.pools[name], add_special_tokens=False).input_ids])

    # -- haystacks ----------------------------------------------------------------------------------------------

    def _haystack(self, rng: random.Random, pool: str, budget: int) -> list[str]:
        """Consecutive sentences of a pool from a random start ("text")."""
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

    def _noise(self, budget: int) -> list[str]:
        """RULER's noise sentences, repeated from the first one to the budget ("noise")."""
        # tokens per sentence in running text (the joining space usually merges into the next word's token)
        per = self._cached("noise", lambda: [self._n_tokens(" ".join(_NOISE * 20)) / (20 * len(_NOISE))])[0]
        return [_NOISE[i % len(_NOISE)] for i in range(max(1, int(budget / per)))]

    @staticmethod
    def _insert(hay: list[str], needles: list[str], rng: random.Random) -> str:
        hay = list(hay)
        for needle in needles:
            hay.insert(rng.randint(0, len(hay)), needle)
        return " ".join(hay)

    @staticmethod
    def _number(rng: random.Random) -> str:
        return str(rng.randint(1_000_000, 9_999_999))

    def _vocab(self, pool: str) -> list[str]:
        return self._cached(f"vocab:{pool}", lambda: sorted(
            {w.lower() for sent in self.pools[pool][:6000] for w in re.findall(r"\b[A-Za-z]{4,9}\b", sent)}))

    # -- needle in a haystack -----------------------------------------------------------------------------------

    def _niah(self, rng, pool, budget, keys: int, values: int, queries: int = 1, haystack: str = "text") -> Parts:
        chosen = rng.sample(_KEYS, keys)
        targets = chosen[:queries]
        needles, answers = [], []
        for k in chosen:
            for _ in range(values if k in targets else 1):
                v = self._number(rng)
                needles.append(f"One of the special magic numbers for {k} is: {v}.")
                if k in targets:
                    answers.append(v)
        rng.shuffle(needles)
        hay = self._haystack(rng, pool, budget) if haystack == "text" else self._noise(budget)
        context = self._insert(hay, needles, rng)
        if values == 1 and queries == 1:
            target = targets[0]
            question = f"\nWhat is the special magic number for {target} mentioned in the provided text?"
            prefix = f" The special magic number for {target} mentioned in the provided text is"
        else:
            target = ", ".join(targets[:-1]) + (" and " if queries > 1 else "") + targets[-1]
            question = f"\nWhat are all the special magic numbers for {target} mentioned in the provided text?"
            prefix = f" The special magic numbers for {target} mentioned in the provided text are"
        meta = {"key": targets[0]} if queries == 1 else {"keys": targets}
        return Parts(_NIAH_HEAD, context, question, prefix, answers, haystack, meta, head_first=_NIAH_HEAD_FIRST)

    def _niah_single(self, rng, pool, budget, index):
        return self._niah(rng, pool, budget, keys=1, values=1)

    def _niah_single_noise(self, rng, pool, budget, index):
        return self._niah(rng, pool, budget, keys=1, values=1, haystack="noise")

    def _niah_multikey(self, rng, pool, budget, index):
        return self._niah(rng, pool, budget, keys=4, values=1)

    def _niah_multivalue(self, rng, pool, budget, index):
        return self._niah(rng, pool, budget, keys=1, values=4)

    def _niah_multiquery(self, rng, pool, budget, index):
        # RULER's multiquery asks for all four keys; two keep the answer short for small models
        return self._niah(rng, pool, budget, keys=4, values=1, queries=2)

    def _niah_single_needles(self, rng, pool, budget, index):
        """RULER's "needle" haystack: nothing but needles, each with its own key; one of them is asked for."""
        def per_needle():
            trial = " ".join(f"One of the special magic numbers for {k} is: {1_000_000 + 7919 * i}."
                             for i, k in enumerate(needle_keys(64)[::64]))
            return [self._n_tokens(trial) / 64]
        n = max(8, int(budget / self._cached("needle_tokens", per_needle)[0]))
        keys = rng.sample(needle_keys(n), n)
        numbers: list[str] = []
        seen: set[str] = set()
        while len(numbers) < n:  # distinct numbers: a distractor never carries the answer
            v = self._number(rng)
            if v not in seen:
                seen.add(v)
                numbers.append(v)
        needles = [f"One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, numbers)]
        rng.shuffle(needles)
        target, answer = keys[0], numbers[0]
        question = f"\nWhat is the special magic number for {target} mentioned in the provided text?"
        prefix = f" The special magic number for {target} mentioned in the provided text is"
        return Parts(_NIAH_HEAD, " ".join(needles), question, prefix, [answer], "needles",
                     {"key": target, "needles": n}, head_first=_NIAH_HEAD_FIRST)

    # -- variable tracking --------------------------------------------------------------------------------------

    def _variable_tracking(self, rng, pool, budget, index):
        names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(5)]
        value = str(rng.randint(10000, 99999))
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
        hay = self._haystack(rng, pool, budget)
        # keep the chain in order: insert at increasing positions
        positions = sorted(rng.randint(0, len(hay)) for _ in chain)
        for offset, (pos, stmt) in enumerate(zip(positions, chain)):
            hay.insert(pos + offset, stmt)
        return self._vt_parts(" ".join(hay), names, value, "text")

    def _vt_hops(self, rng, pool, budget, index):
        """RULER's vt: a chain of 1-4 hops (by index) and a distractor chain of as many hops with another value,
        in the noise haystack."""
        hops = 1 + index % 4
        names: list[str] = []
        while len(names) < 2 * (hops + 1):
            name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
            if name not in names:
                names.append(name)
        value, other = rng.sample(range(10000, 100000), 2)
        chains = []
        for names_c, v in ((names[:hops + 1], value), (names[hops + 1:], other)):
            chains.append([f"VAR {names_c[0]} = {v}."] +
                          [f"VAR {names_c[i]} = VAR {names_c[i - 1]}." for i in range(1, hops + 1)])
        hay = self._noise(budget)
        # each chain at increasing positions; sorting by (position, step) keeps every chain in order
        placed = sorted((pos, step, c) for c, chain in enumerate(chains)
                        for step, pos in enumerate(sorted(rng.randint(0, len(hay)) for _ in chain)))
        out, k = [], 0
        for i in range(len(hay) + 1):
            while k < len(placed) and placed[k][0] == i:
                out.append(chains[placed[k][2]][placed[k][1]])
                k += 1
            if i < len(hay):
                out.append(hay[i])
        parts = self._vt_parts(" ".join(out), names[:hops + 1], str(value), "noise")
        parts.meta.update(hops=hops, distractor_value=str(other))
        return parts

    @staticmethod
    def _vt_parts(doc: str, names: list[str], value: str, haystack: str) -> Parts:
        question = f"\nQuestion: Find all variables that are assigned the value {value} in the text above."
        prefix = (f" Answer: According to the chain(s) of variable assignment in the text above, {len(names)} "
                  f"variables are assigned the value {value}, they are:")
        return Parts(_VT_HEAD, doc, question, prefix, names, haystack, {"value": value},
                     question_first=question.replace("in the text above", "in the text below"))

    # -- aggregation ----------------------------------------------------------------------------------------------

    def _common_words(self, rng, pool, budget, index):
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
        question = "\nQuestion: What are the 10 most common words in the above list?"
        prefix = " Answer: The top 10 words that appear most often in the list are:"
        return Parts(head, listing, question, prefix, common, "words",
                     question_first=question.replace("in the above list", "in the list below"))

    def _frequent_words(self, rng, pool, budget, index):
        """RULER's fwe: coded words with Zipf counts n k^-2 / zeta(2) by rank k; the top rank is the dots "....",
        which the question says to ignore, so the answer is ranks 2-4."""
        head = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words.\n")
        question = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                    "most frequently appeared coded words in the above coded text?")
        prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"
        reserved = set(re.findall(r"[a-z]+", (head + question + prefix).lower()))
        vocab: list[str] = []
        while len(vocab) < 2000:  # RULER's vocabulary size
            w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 7)))
            if w not in reserved:
                reserved.add(w)
                vocab.append(w)
        vocab[0] = "...."

        def counts(n: int) -> list[int]:
            return [int(n * k ** -2.0 / (math.pi ** 2 / 6)) for k in range(1, len(vocab) + 1)]

        # words per token, measured on this mix with this tokenizer, sets the number of words for the budget
        trial = counts(max(budget, 64))
        measured = self._n_tokens(" ".join(w for w, c in zip(vocab, trial) for _ in range(c)))
        cnt = counts(max(64, int(max(budget, 64) * max(budget, 64) / max(measured, 1))))
        if not cnt[1] > cnt[2] > cnt[3] > cnt[4]:
            raise UserError(f"a frequent_words sample needs a longer budget than {budget} tokens")
        words = [w for w, c in zip(vocab, cnt) for _ in range(c)]
        rng.shuffle(words)
        return Parts(head, " ".join(words), question, prefix, vocab[1:4], "words", {"counts": cnt[1:5]},
                     question_first=question.replace("in the above coded text", "in the coded text below"))

    # -- question answering -------------------------------------------------------------------------------------

    def _qa(self, rng, pool, budget, index):
        """RULER's qa with BoolQ: the gold passage among distractor passages of other rows, shuffled."""
        rows = self.qa_rows
        if not rows:
            raise UserError("the qa task needs BoolQ rows: build the suite with "
                            "qa_rows=load_qa_rows(data_dir, 'evaluation') (or 'calibration')")
        lens = self._cached("qa", lambda: [len(ids) + 6 for ids in  # + "Document N:\n" and the blank line
                                           self.tok([r["passage"] for r in rows], add_special_tokens=False).input_ids])
        gold = rng.randrange(len(rows))
        docs, used, seen = [gold], lens[gold], {rows[gold]["passage"]}
        for i in rng.sample(range(len(rows)), len(rows)):
            if used >= budget:
                break
            if rows[i]["passage"] not in seen:  # BoolQ asks several questions about some passages
                seen.add(rows[i]["passage"])
                docs.append(i)
                used += lens[i]
        if len(docs) > 1 and used > budget:
            used -= lens[docs.pop()]
        rng.shuffle(docs)
        doc = "\n\n".join(f"Document {n + 1}:\n{rows[i]['passage']}" for n, i in enumerate(docs))
        row = rows[gold]
        head = f"{_QA_RULE}\n\nThe following are given documents.\n\n"
        question = f"\n\n{_QA_RULE}\n\nQuestion: {row['question']}?"
        return Parts(head, doc, question, " Answer:", [row["answer"]], "passages",
                     {"row": row["index"], "gold_document": docs.index(gold) + 1, "documents": len(docs)},
                     head_first=f"{_QA_RULE}\n\n", question_first=f"Question: {row['question']}?\n\n"
                     "The following are given documents.", match="yes_no")
