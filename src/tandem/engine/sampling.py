"""Per-sequence token sampling: greedy, temperature, top-k, top-p, min-p, min_tokens.

Order of one step: the model's logits (float32 copy) → the structured-output mask (when
the request has a constraint) → logprobs, when asked (``engine/logprobs.py``) →
logit_bias → repetition, frequency and presence penalties → min_tokens → greedy, or
temperature then top-k / top-p / min-p and a draw. So every later stage sees the masked
logits, and a masked token stays -inf whatever bias it gets.

Filters run in a fixed order on a stably sorted copy of the logits (highest first, ties
broken towards the lower token id), so every filter keeps a prefix of that order. That
makes ``top_k=1`` and a tiny ``top_p`` pick exactly the greedy token, ties included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import torch

from tandem.engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, raw_logprobs, token_logprob

# Temperatures below this are treated as greedy: dividing by them would overflow.
_GREEDY_EPS = 1e-5


def _is_int(value: object) -> bool:
    # bool is an int subclass; a flag passed where a count belongs is a caller bug.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True, kw_only=True)
class SamplingConfig:
    """Validated sampling parameters of one sequence (wire defaults already resolved)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    repetition_penalty: float = 1.0
    # OpenAI / vLLM penalties on the generated tokens: frequency per occurrence, presence once.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # (token id, bias) added to the logits before anything else (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None: no logprobs (and no cost); k: the sampled token's logprob and k alternatives.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        # Accept any iterable of ids (e.g. a list from the wire) but store an immutable tuple.
        self.stop_token_ids = tuple(self.stop_token_ids)
        for tid in self.stop_token_ids:
            if not _is_int(tid) or tid < 0:
                raise ValueError(f"stop_token_ids must be integers >= 0, got {tid!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be finite and > 0, got {self.repetition_penalty!r}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        self.logit_bias = tuple((int(t), float(b)) for t, b in self.logit_bias)
        for tid, bias in self.logit_bias:
            if tid < 0 or not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
                raise ValueError(
                    f"logit_bias {tid}: {bias} needs an id >= 0 and -100 <= bias <= 100"
                )
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(
                f"logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, got {self.logprobs!r}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS


class Sampler:
    """Chooses the next token of one sequence; owns that sequence's random stream.

    Each sequence gets its own ``torch.Generator`` so a seeded request reproduces its
    tokens regardless of what other sequences are sampled alongside it.
    """

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self._generator = torch.Generator(device="cpu")
        if config.seed is None:
            self._generator.seed()  # non-deterministic seed from the OS
        else:
            # The wire seed is int32 and may be negative; torch wants a uint64.
            self._generator.manual_seed(config.seed & 0xFFFF_FFFF_FFFF_FFFF)

    def next_token(
        self,
        logits: torch.Tensor,
        generated: Sequence[int],
        eos_ids: Iterable[int],
        *,
        prompt_ids: Sequence[int] = (),
    ) -> int:
        """Pick the next token from ``logits`` ([vocab]) given the tokens generated so far."""
        return self.pick(logits, generated, eos_ids, prompt_ids=prompt_ids)[0]

    def pick(
        self,
        logits: torch.Tensor,
        generated: Sequence[int],
        eos_ids: Iterable[int],
        *,
        prompt_ids: Sequence[int] = (),
        constrain: Callable[[torch.Tensor], None] | None = None,
    ) -> tuple[int, TokenLogprob | None]:
        """The next token, and its logprob entry when the config asks for logprobs.

        ``constrain`` masks a float32 score vector in place (a structured-output matcher's
        ``apply_mask``). ``prompt_ids`` only feed the repetition penalty (which, as in vLLM,
        covers the prompt and the output); ``min_tokens`` counts ``generated`` alone.
        """
        if logits.dim() != 1 or logits.numel() == 0:
            raise ValueError(f"logits must be a non-empty 1-D tensor, got {tuple(logits.shape)}")
        cfg = self.config
        # Work on a float32 CPU copy: the caller's tensor must not change under it.
        scores = logits.detach().to(device="cpu", dtype=torch.float32).clone()
        scores[torch.isnan(scores)] = -math.inf
        pos_inf = torch.isposinf(scores)
        if bool(pos_inf.any()):
            # Only +inf entries can win; make them equal finite scores so softmax works.
            scores = torch.where(pos_inf, 0.0, -math.inf)
        if constrain is not None:
            constrain(scores)
        logprobs = raw_logprobs(scores) if cfg.logprobs is not None else None
        if cfg.logit_bias:
            ids = torch.tensor([t for t, _ in cfg.logit_bias], dtype=torch.long)
            if int(ids.max()) >= scores.numel():
                raise ValueError(
                    f"logit_bias names token ids outside the vocabulary of {scores.numel()}"
                )
            scores[ids] += torch.tensor([b for _, b in cfg.logit_bias], dtype=torch.float32)
        if cfg.repetition_penalty != 1.0:
            _apply_repetition_penalty(scores, prompt_ids, generated, cfg.repetition_penalty)
        if generated and (cfg.frequency_penalty or cfg.presence_penalty):
            counts = torch.bincount(
                torch.tensor(list(generated), dtype=torch.long), minlength=scores.numel()
            )[: scores.numel()].to(torch.float32)
            scores -= cfg.frequency_penalty * counts + cfg.presence_penalty * (counts > 0)
        if len(generated) < cfg.min_tokens:
            banned = set(cfg.stop_token_ids)
            if not cfg.ignore_eos:
                # With ignore_eos an eos does not end the sequence, so no need to hide it.
                banned.update(eos_ids)
            _mask_unless_all(scores, banned)
        if not bool(torch.isfinite(scores).any()):
            raise ValueError("logits have no finite entry to sample from")
        # torch.argmax returns the first maximal index: ties go to the lowest id.
        token = int(torch.argmax(scores)) if cfg.greedy else self._sample(scores)
        if logprobs is None:
            return token, None
        return token, token_logprob(logprobs, token, cfg.logprobs or 0)

    def _sample(self, scores: torch.Tensor) -> int:
        cfg = self.config
        # Stable descending sort keeps equal scores in id order (lowest id first).
        values, order = torch.sort(scores / cfg.temperature, descending=True, stable=True)
        keep = int(torch.isfinite(values).sum())  # -inf entries sort last
        if cfg.top_k > 0:
            keep = min(keep, cfg.top_k)
        probs = torch.softmax(values[:keep], dim=0)
        if cfg.top_p < 1.0:
            # Keep a token while the mass strictly before it is below top_p; the first
            # token has zero mass before it, so at least one always survives.
            before = torch.cumsum(probs, dim=0) - probs
            before[0] = 0.0
            keep = max(1, int((before < cfg.top_p).sum()))
            probs = probs[:keep]
        if cfg.min_p > 0.0:
            # Relative to the top token, so renormalising after top-p changes nothing.
            keep = max(1, int((probs >= cfg.min_p * probs[0]).sum()))
            probs = probs[:keep]
        choice = torch.multinomial(probs, 1, generator=self._generator)
        return int(order[int(choice)])


def _apply_repetition_penalty(
    scores: torch.Tensor, prompt_ids: Sequence[int], generated: Sequence[int], penalty: float
) -> None:
    vocab = scores.numel()
    seen = {t for t in (*prompt_ids, *generated) if 0 <= t < vocab}
    if not seen:
        return
    idx = torch.tensor(sorted(seen), dtype=torch.long)
    picked = scores[idx]
    # Divide positive scores and multiply negative ones: both make the token less likely.
    scores[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)


def _mask_unless_all(scores: torch.Tensor, banned: set[int]) -> None:
    vocab = scores.numel()
    ids = [t for t in banned if 0 <= t < vocab]
    if not ids:
        return
    idx = torch.tensor(ids, dtype=torch.long)
    masked = scores.clone()
    masked[idx] = -math.inf
    # Masking every candidate would leave nothing to sample; then min_tokens yields.
    if bool(torch.isfinite(masked).any()):
        scores.copy_(masked)


def finish_reason(
    token: int, num_generated: int, config: SamplingConfig, eos_ids: Collection[int]
) -> str | None:
    """Why a sequence ends after emitting ``token`` as its ``num_generated``-th token.

    A stop token ends it once ``min_tokens`` have been produced (counting this one, as
    vLLM does); "stop" wins over "length" when both apply.
    """
    if num_generated >= config.min_tokens:
        if not config.ignore_eos and token in eos_ids:
            return "stop"
        if token in config.stop_token_ids:
            return "stop"
    if num_generated >= config.max_tokens:
        return "length"
    return None
