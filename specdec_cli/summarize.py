"""Summarization: articles in, summaries out, through the speculative decoding loop.

Instruct models (a tokenizer with a chat template) get the template with a summarization instruction;
base models get the paper's prompt  "Article: …\\n\\nSummary:".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_cli.decoding import GenerationStats, generate
from specdec_cli.draft_head import frequent_ids, restrict_head
from specdec_cli.errors import SpecdecError
from specdec_cli.int8 import quantize_draft
from specdec_cli.sampling import SamplingParams

INSTRUCTION = "Summarize the following news article in two or three sentences. Reply with the summary only."


@dataclass
class Article:
    name: str  # the path as given, or "-" for stdin
    text: str


@dataclass
class Summary:
    input: str
    text: str
    finish_reason: str  # "eos" | "length"
    stats: GenerationStats  # the stats of the batch this article ran in


def read_article(path: str) -> Article:
    """One article from a UTF-8 text file, or stdin for "-". Refuses what cannot be an article."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        p = Path(path)
        if not p.exists():
            raise SpecdecError(f"{path}: no such file")
        if p.is_dir():
            raise SpecdecError(f"{path}: is a directory, not a text file")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise SpecdecError(f"{path}: cannot read: {e.strerror}") from None
    if b"\x00" in data:
        raise SpecdecError(f"{path}: looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecdecError(f"{path}: is not UTF-8 text") from None
    if not text.strip():
        raise SpecdecError(f"{path}: is empty")
    return Article(path, text.strip())


def build_prompt(tokenizer, article: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"{INSTRUCTION}\n\n{article}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"Article: {article}\n\nSummary:"


def context_limit(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def encode(tokenizer, model, articles: list[Article], max_new_tokens: int, truncate: bool) -> list[list[int]]:
    """Token ids of each prompt; an article too long for the context is refused, or cut with `truncate`."""
    limit = context_limit(model)
    prompts = []
    for a in articles:
        text = a.text
        while True:
            ids = tokenizer(build_prompt(tokenizer, text), add_special_tokens=False)["input_ids"]
            if limit is None or len(ids) + max_new_tokens <= limit:
                break
            if not truncate:
                raise SpecdecError(
                    f"{a.name}: {len(ids)} prompt tokens + {max_new_tokens} new tokens exceed the model's "
                    f"context of {limit}; pass --truncate to cut the article"
                )
            words = text.split()
            if len(words) <= 1:
                raise SpecdecError(f"{a.name}: --max-new-tokens {max_new_tokens} leaves no room for the article")
            text = " ".join(words[: int(len(words) * 0.9)])  # cut the end by a tenth until it fits
        prompts.append(ids)
    return prompts


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, T] and attention_mask [B, T], padded on the left."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :] = torch.tensor(r)
        mask[i, T - len(r) :] = 1
    return ids, mask


def eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


def summarize(
    target,
    draft,
    articles: list[Article],
    *,
    mode: str = "exact",
    gamma: int = 5,
    gamma_schedule: str = "constant",
    params: SamplingParams = SamplingParams(temperature=0.0),
    max_new_tokens: int = 100,
    batch_size: int = 1,
    truncate: bool = False,
    alpha: float = -1e4,
    beta: float = 1e4,
    backend: str = "auto",
    draft_vocab: int = 0,
    draft_int8: bool = False,
    draft_stop: float = 0.0,
    on_batch=None,
) -> list[Summary]:
    """Summaries of `articles` in input order. target/draft: models.LoadedModel (draft None for
    autoregressive). draft_vocab > 0 cuts the draft's output layer to the draft_vocab most frequent
    tokens plus the batch's prompt tokens (draft_head.py); draft_int8 gives the draft int8 weights on a
    CPU (int8.py). Both make the draft cheaper and leave the output exactly the target's. draft_stop > 0
    ends a round's drafting once the draft is less sure than that of its token (decoding.draft). on_batch(done, total) is called after each
    batch (progress)."""
    if batch_size < 1:
        raise SpecdecError(f"--batch-size must be at least 1 (got {batch_size})")
    if max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    tok, model = target.tokenizer, target.model
    prompts = encode(tok, model, articles, max_new_tokens, truncate)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids(tok, model)), 0)
    eos = eos_ids(tok, model)
    vocab = None
    if draft is not None:
        from specdec_cli.models import check_compatible

        vocab = check_compatible(target, draft)  # lm_heads may pad rows past the shared vocabulary
    out: list[Summary] = []
    for start in range(0, len(articles), batch_size):
        chunk = slice(start, start + batch_size)
        input_ids, attention_mask = left_pad(prompts[chunk], pad)
        if draft is not None and draft_vocab > 0:
            keep = torch.cat([frequent_ids(draft_vocab, draft.output_size), input_ids.flatten(), torch.tensor(sorted(eos))])
            restrict_head(draft.model, keep)
        if draft is not None and draft_int8:
            quantize_draft(draft)
        result = generate(
            model, None if draft is None else draft.model, input_ids.to(target.device), attention_mask.to(target.device),
            mode=mode, gamma=gamma, gamma_schedule=gamma_schedule, params=params, max_new_tokens=max_new_tokens,
            eos_token_ids=eos, alpha=alpha, beta=beta, backend=backend, vocab_size=vocab, draft_stop_below=draft_stop,
        )
        for article, tokens, reason in zip(articles[chunk], result.tokens, result.finish_reasons):
            text = tok.decode([t for t in tokens if t not in eos], skip_special_tokens=True).strip()
            out.append(Summary(article.name, text, reason, result.stats))
        if on_batch:
            on_batch(min(start + batch_size, len(articles)), len(articles))
    return out


def load_pair(target_spec: str, draft_spec: str, *, mode: str, dtype: str, device: str, progress: bool = True):
    """(target, draft) LoadedModels; draft is None for autoregressive. Vocabularies are checked."""
    from specdec_cli import models

    device = models.resolve_device(device)
    dtype = models.resolve_dtype(dtype, device)
    target = models.load_causal_lm(target_spec, role="target", dtype=dtype, device=device, progress=progress)
    if mode == "autoregressive":
        return target, None
    return target, models.load_draft(draft_spec, target, progress=progress)


# ----------------------------------------------------------------------------------------------------
# `specdec bench --task summarize`

DEFAULT_DRAFT_VOCAB = 32768  # `specdec summarize --draft-vocab`'s default


def bench_runner(config, progress) -> list:
    """The summarize task runner for specdec_cli.bench (TASK_RUNNERS["summarize"]): one TaskRecord per
    (γ, mode) plus autoregressive (bench.run_contenders), over the articles of --data (bench.task_inputs:
    examples/articles/*.txt by default, ROUGE against their .ref.txt references). wall_s is the decoding
    loops' time (prefill included; tokenizing left out); articles too long for the context are cut as
    with `summarize --truncate`.

    options: target ("embedded"), draft ("embedded"), draft_vocab (DEFAULT_DRAFT_VOCAB; 0 = full), draft_int8 (True),
    max_new_tokens (100), temperature (0: greedy), data / inputs / references / limit (task_inputs).
    config.dtype is the models' dtype; config.batch the articles decoded together."""
    from specdec_cli import bench
    from specdec_cli.decoding import merge_stats

    opts = config.options
    inputs, refs = bench.task_inputs(config)
    articles = [read_article(p) for p in inputs]  # every article is checked before the models load
    target, draft = load_pair(opts.get("target") or "embedded", opts.get("draft") or "embedded", mode="exact",
                              dtype=config.dtype, device=config.device, progress=False)
    params = SamplingParams(temperature=float(opts.get("temperature") or 0.0), seed=config.seed)
    max_new = int(opts.get("max_new_tokens") or 100)
    draft_vocab = opts.get("draft_vocab")
    draft_vocab = DEFAULT_DRAFT_VOCAB if draft_vocab is None else int(draft_vocab)

    def decode(mode: str, gamma: int, short: bool):
        out = summarize(
            target, None if mode == "autoregressive" else draft, articles[:1] if short else articles, mode=mode,
            gamma=max(gamma, 1), params=params, max_new_tokens=min(max_new, bench.WARMUP_TOKENS) if short else max_new,
            batch_size=config.batch, truncate=True, alpha=config.alpha, beta=config.beta, backend=config.backend,
            draft_vocab=draft_vocab, draft_int8=bool(opts.get("draft_int8", True)),
        )
        batches = {id(s.stats): s.stats for s in out}.values()  # the articles of a batch share its stats
        stats = merge_stats(batches, GenerationStats(mode, gamma, "constant", config.batch)).finish()
        return [s.text for s in out], stats

    return bench.run_contenders(config, decode, refs, progress)
