"""Prompts of a given token length for the benchmark and the long-prompt smoke check.

A prompt is a fixed-width request number followed by filler words. The number comes first so
every request of a run has its own first KV block: with --enable-prefix-caching (SPEC 4)
identical prompts would be served from the cache and flatter time to first token.

Length: with the server's POST /tokenize (vLLM), the word count is calibrated until the chat
prompt, template included, has exactly the target count (a few calls per context). Without
it the documented approximation is one token per filler word (each is a common lowercase
English word that large SentencePiece/BPE vocabularies, Gemma's 262,144 entries among them,
hold as a single token with its leading space) plus APPROX_OVERHEAD tokens for the request
number (digits are split one per token) and the chat template's turn markers. The benchmark
reports the prompt_tokens the server counted (usage), so the approximation shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_WORD_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which "
    "she do how their if will up other about out many then them these so some her would make "
    "like him into time has look two more write go see number no way could people my than "
    "first water been call who its now find long down day did get come made may part over new "
    "sound take only little work know place year live me back give most very after thing our "
    "just name good man think say great where help through much before line right too mean "
    "old any same tell boy follow came want show also around form three small set put end "
    "does another well large must big even such because turn here why ask went men read need "
    "land different home us move try kind hand picture again change off play spell air away"
)
WORDS = tuple(_WORD_TEXT.split())
NONCE_DIGITS = 8
# Approximation without /tokenize: 8 digit tokens of the request number, ~9 for the template.
APPROX_OVERHEAD = NONCE_DIGITS + 9
CALIBRATION_STEPS = 8

Messages = list[dict[str, Any]]
Counter = Callable[[Messages], int | None]


def filler(n_words: int, seed: int) -> str:
    """n_words words, a different sequence per seed (deterministic)."""
    k = len(WORDS)
    step = 1 + (seed * 7919) % (k - 1)
    return " ".join(WORDS[(seed + i * step) % k] for i in range(max(n_words, 0)))


def messages(n_words: int, nonce: int) -> Messages:
    text = f"{nonce % 10**NONCE_DIGITS:0{NONCE_DIGITS}d} {filler(n_words, nonce)}"
    return [{"role": "user", "content": text}]


def approx_words(target_tokens: int) -> int:
    return max(1, target_tokens - APPROX_OVERHEAD)


def calibrate(target_tokens: int, count: Counter) -> tuple[int, int | None]:
    """Words needed for a `target_tokens`-token chat prompt, and the count /tokenize gave for
    it (None: no /tokenize, the approximation was used). Picks the closest count not over the
    target when it cannot hit it exactly (a word can be worth more than one token)."""
    n = approx_words(target_tokens)
    best: tuple[int, int] | None = None  # (words, tokens) closest from below
    seen: dict[int, int] = {}
    for _ in range(CALIBRATION_STEPS):
        c = count(messages(n, 0))
        if c is None:
            return approx_words(target_tokens), None
        seen[n] = c
        if c == target_tokens:
            return n, c
        if c < target_tokens and (best is None or c > best[1]):
            best = (n, c)
        ratio = max(c / n, 0.05) if n else 1.0
        step = round((target_tokens - c) / ratio) or (1 if c < target_tokens else -1)
        n = max(1, n + step)
        if n in seen:
            break
    if best is None:
        n = min(seen, key=lambda w: seen[w])
        return n, seen[n]
    return best
