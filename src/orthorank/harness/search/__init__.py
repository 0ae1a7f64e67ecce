"""Where to skip work: greedy and one-shot layer searches (OrthoRank, SLEB, Shortened LLaMA, ShortGPT)."""
