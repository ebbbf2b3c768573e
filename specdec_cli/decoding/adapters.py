"""How a model enters the decoding loop: `Decoder`, a small adapter (prefill / forward / crop / select)
over a Hugging Face decoder with a KV cache, so that the loop never sees a model's own calling convention.

    Decoder          a causal LM (input_ids, attention_mask, position_ids, past_key_values)
    Seq2SeqDecoder   the decoder half of an encoder-decoder (Whisper: decoder_input_ids, encoder_outputs)

A draft that is not a transformers model (drafts/lean_whisper.py) subclasses Decoder and overrides the
same four methods.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from specdec_cli import internals
from specdec_cli.errors import SpecdecError, first_line

# logits [B, T, V], positions [B, T] of the tokens these logits predict, tokens [B, S]: the token of every
# slot up to the last logits row's input (−1 where a slot is not in the row's sequence: padding, holes);
# logits row t reads the first S − (T − 1 − t) slots -> logits (e.g. −inf where a token is suppressed)
LogitsHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Decoder:
    """A decoder with a KV cache, as the loop sees it. Subclass and override `_call` / `new_cache`
    for models whose forward differs from a causal LM's (Whisper: decoder_input_ids, encoder_outputs).

    forward_kwargs: passed to every forward (e.g. encoder_outputs); tensors whose first dim is the
    batch are row-selected with the cache when sequences finish.
    logits_hook: applied to every logits tensor this decoder returns.
    """

    def __init__(self, model, *, forward_kwargs: dict | None = None, logits_hook: LogitsHook | None = None):
        self.model = model
        self.forward_kwargs = dict(forward_kwargs or {})
        self.logits_hook = logits_hook
        self.cache: Any = None  # a transformers Cache
        self.length = 0  # slots in the cache
        self.seen = torch.empty(0, 0, dtype=torch.int64)  # int64 [B, length]: the token in each cache slot, for the logits hook
        params = inspect.signature(model.forward).parameters
        self._keeps_logits = "logits_to_keep" in params

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()
        return head.weight.shape[0] if head is not None else self.model.config.vocab_size

    def new_cache(self):
        return internals.rollback_cache(self.model.config)

    @property
    def sliding_window(self) -> int | None:
        """W when some of its layers attend to the last W slots only (the loop then keeps rows apart: a hole in
        a row would leave fewer than W of its own tokens in the window)."""
        return internals.sliding_window(self.model.config)

    def reset(self) -> None:
        self.cache = self.new_cache()
        self.length = 0

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        """One forward over tokens [B, T] at slots length..length+T -> logits [B, T or keep, V]."""
        kwargs = dict(self.forward_kwargs)
        if self._keeps_logits and keep:
            # the rows' indices, not a count: a count makes transformers slice a view [B, keep, H] whose batch
            # stride spans all T rows, and for a weight that needs no grad torch's matmul then will not fold it
            # into one product but copies the whole [V, H] output layer into a batched one (0.6 s a call for
            # Qwen2.5-0.5B's head on a 2-core EPYC, against 20 ms); indexing gives a dense copy of `keep` rows
            T = tokens.shape[1]
            kwargs["logits_to_keep"] = keep if keep >= T else torch.arange(T - keep, T, device=tokens.device)
        with self.driving():
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                             **internals.cache_kwargs(self.model, self.cache), use_cache=True, **kwargs)
        return out.logits[:, -keep:] if keep else out.logits

    @contextlib.contextmanager
    def driving(self):
        """A failure inside the model's own forward, said in one line that names the model (SpecdecError, its cause
        kept for SPECDEC_DEBUG=1): the loop cannot drive it."""
        try:
            yield
        except SpecdecError:
            raise
        except Exception as e:
            raise SpecdecError(f"{type(self.model).__name__} cannot be driven by the decoding loop: its forward failed "
                               f"({type(e).__name__}: {first_line(e)})") from e

    def forward(self, tokens, mask, positions, keep: int = 0) -> torch.Tensor:
        """tokens [B, T], mask [B, length+T] bool or None (all valid), positions [B, T]
        -> logits [B, T, V] (the last `keep` positions only, when keep > 0); the cache grows by T."""
        logits = self._call(tokens, mask, positions, keep)
        self.seen = torch.cat([self.seen[:, : self.length], tokens], 1) if self.length else tokens
        self.length += tokens.shape[1]
        if self.logits_hook is not None:
            seen = self.seen if mask is None else self.seen.masked_fill(~mask[:, : self.length], -1)
            logits = self.logits_hook(logits, positions[:, -logits.shape[1] :] + 1, seen)
        return logits

    def prefill(self, tokens, mask, positions) -> None:
        """Fill a fresh cache with the prompt slots; their logits are not needed. A model that left its KV cache
        empty (it keeps its state elsewhere, e.g. RWKV) is refused: its steps would not see the prompt."""
        self.reset()
        if tokens.shape[1] > 0:
            self._call(tokens, mask, positions, keep=1)
            self.length, self.seen = tokens.shape[1], tokens
            if internals.cache_is_empty(self.cache):
                raise SpecdecError(f"{type(self.model).__name__} cannot be driven by the decoding loop: it keeps no "
                                   "KV cache in past_key_values (its state lives elsewhere)")

    def check_rollback(self) -> None:
        """Refuse, in one line, a model whose cache cannot be cropped back to the accepted tokens (a recurrent
        state, as Mamba's): speculative decoding must drop rejected tokens."""
        problem = internals.rollback_problem(self.cache)
        if problem:
            raise SpecdecError(f"{type(self.model).__name__} cannot speculate: {problem} (--mode autoregressive runs it)")

    def crop(self, length: int) -> None:
        """Drop every slot from `length` on (no recomputation of the prefix); sliding-window layers are trimmed
        back to their window."""
        internals.crop_cache(self.cache, max(0, self.length - length))
        self.length = min(self.length, length)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (int64 [B'])."""
        if self.length > 0:
            self.cache.batch_select_indices(rows)
            self.seen = self.seen.index_select(0, rows)
        self.forward_kwargs = {k: _select_rows(v, rows) for k, v in self.forward_kwargs.items()}


class Seq2SeqDecoder(Decoder):
    """The decoder half of an encoder-decoder model (Whisper). Run the encoder once and pass its output
    as forward_kwargs={"encoder_outputs": ...} to both the target's and the draft's Seq2SeqDecoder."""

    def new_cache(self):
        from transformers import DynamicCache, EncoderDecoderCache

        return EncoderDecoderCache(DynamicCache(), DynamicCache())  # self-attention, cross-attention

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        out = self.model(
            decoder_input_ids=tokens,
            decoder_attention_mask=mask,
            decoder_position_ids=positions,
            **internals.cache_kwargs(self.model, self.cache),
            use_cache=True,
            **self.forward_kwargs,
        )
        return out.logits[:, -keep:] if keep else out.logits


def layers_path(model) -> tuple[str, ...] | None:
    """Where a causal LM keeps its decoder layers, as attribute names from the model: ("model", "layers") for
    Llama, Qwen, Mistral, Gemma, Phi-3, ...; ("transformer", "h") for GPT-2; ("gpt_neox", "layers"); ("model",
    "decoder", "layers") for OPT. The ModuleList of config.num_hidden_layers under the base model, at most one
    module down; None when there is none."""
    prefix = getattr(model, "base_model_prefix", "model")
    base, n = getattr(model, prefix, None), getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(base, torch.nn.Module) or not n:
        return None
    for name, module in base.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n and name.count(".") <= 1:
            return (prefix, *name.split("."))
    return None


def _select_rows(value, rows: torch.Tensor):
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.index_select(0, rows.to(value.device))
    if isinstance(value, dict):  # includes transformers' ModelOutput (e.g. BaseModelOutput)
        return type(value)(**{k: _select_rows(v, rows) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(_select_rows(v, rows) for v in value)
    return value
