"""Every decoder family people bring: a tiny random model of each, saved with save_pretrained as a user's own
model, runs summarize in every mode with every draft kind, and greedy output is the target alone's, token for
token, in fp32 and bf16 — sliding-window families (Mistral, Gemma 2, Gemma 3) on prompts longer than their window.

The fast tier runs each family with a model draft and lookup+self:1 in bf16; the slow tier the whole matrix."""

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import WORDS, left_pad, word_tokenizer
from specdec_cli import internals
from specdec_cli.decoding import Decoder, generate
from specdec_cli.drafts.lookup import Lookup
from specdec_cli.models import LoadedModel, load_causal_lm
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as S

WINDOW = 16  # the sliding window of the families that have one: shorter than every prompt below
COMMON = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, eos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
FAMILIES = {  # model_type -> what its config needs beyond COMMON (None: its own argument names)
    "llama": {}, "mistral": dict(sliding_window=WINDOW), "qwen2": {}, "qwen3": dict(head_dim=16),
    "gemma": dict(head_dim=16), "gemma2": dict(head_dim=16, sliding_window=WINDOW),
    "gemma3_text": dict(head_dim=16, sliding_window=WINDOW), "phi3": {}, "olmo2": {}, "granite": {},
    "starcoder2": {}, "gpt_neox": {}, "gpt2": None, "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
}
SLIDING = {"mistral", "gemma2", "gemma3_text"}
ARTICLE = " ".join(WORDS[2 + (i * 7) % 300] for i in range(60))  # 60 words, some repeated: lookup finds tails


def save(family: str, path: Path, layers: int = 4, seed: int = 0) -> Path:
    if FAMILIES[family] is None:  # GPT-2 names its sizes its own way
        kw = dict(vocab_size=1000, n_embd=64, n_layer=layers, n_head=4, n_positions=512, eos_token_id=1, bos_token_id=1)
    else:
        kw = {**COMMON, **FAMILIES[family], "num_hidden_layers": layers}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **kw)).eval()
    model.save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return request.param, save(request.param, root / "target"), save(request.param, root / "draft", layers=2, seed=1)


def _check(family, dtype, drafts, modes, batch=1):
    name, target_dir, draft_dir = family
    target = load_causal_lm(str(target_dir), dtype=dtype, progress=False)
    if name in SLIDING:
        assert internals.sliding_window(target.model.config) == WINDOW
    opts = SummarizeOptions(target=str(target_dir), dtype=dtype, max_new_tokens=24, gamma=3, gamma_schedule="constant",
                            draft_vocab=0, draft_quantized=False, batch_size=batch)
    articles = [S.Article("a", ARTICLE), S.Article("b", " ".join(reversed(ARTICLE.split())))][:max(batch, 1)]
    assert len(target.tokenizer(S.build_prompt(target.tokenizer, ARTICLE))["input_ids"]) > 3 * WINDOW
    want = [s.text for s in S.summarize(target, None, articles, opts, mode="autoregressive")]
    for spec in drafts:
        spec = spec.replace("MODEL", str(draft_dir))
        draft = S.load_draft(spec, target, opts, progress=False)
        for mode in modes:
            if mode == "sigmoid" and spec.startswith("lookup"):
                continue  # refused in one line: a deterministic draft has no logits (tests/test_lookup.py)
            got = [s.text for s in S.summarize(target, draft, articles, opts, mode=mode)]
            assert got == want, f"{name} {dtype} --draft {spec} --mode {mode}"


def test_every_family_speculates_greedy_as_the_target_alone(family):
    _check(family, "bfloat16", ["MODEL", "lookup+self:1"], ["exact"])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_family_in_every_mode_with_every_draft(family, dtype):
    _check(family, dtype, ["MODEL", "self:1", "lookup", "lookup+MODEL"], ["baseline", "exact", "sigmoid"])


def test_a_batch_of_a_sliding_window_family_is_its_rows_alone(tmp_path):
    """Rows that accept different counts leave holes in a batch; with a window that counts slots, a row would see
    fewer of its own tokens: the loop runs such a pair row by row, and each row is the target's own."""
    family = ("mistral", save("mistral", tmp_path / "t"), save("mistral", tmp_path / "d", layers=2, seed=1))
    _check(family, "bfloat16", ["lookup+MODEL"], ["exact"], batch=2)


@pytest.mark.parametrize("name", sorted(SLIDING))
def test_the_window_each_row_sees_is_the_models_own(tmp_path, name):
    """Rounds of passes and rollbacks through the loop's cache (its sliding layers record past the window, and a
    crop trims them back) give every row the logits transformers' own full forward gives it, which attends to
    exactly W keys: not more (the recorded states) and not fewer (the trimmed ones)."""
    target = load_causal_lm(str(save(name, tmp_path / "t")), dtype="float32", progress=False)
    ids = torch.randint(2, 1000, (1, 3 * WINDOW + 5), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full = target.model(ids).logits  # [1, T, V]: the model's own sliding-window attention, no cache
        dec = Decoder(target.model)
        positions = torch.arange(ids.shape[1])[None]
        dec.prefill(ids[:, :WINDOW + 3], None, positions[:, :WINDOW + 3])
        at = WINDOW + 3
        for step, rejected in [(5, 2), (7, 0), (4, 3), (9, 1)]:  # a pass over `step` slots, then drop `rejected`
            got = dec.forward(ids[:, at : at + step], None, positions[:, at : at + step])
            torch.testing.assert_close(got, full[:, at : at + step], rtol=1e-4, atol=1e-4)
            dec.crop(at + step - rejected)
            at += step - rejected


@pytest.mark.slow
def test_the_python_api_gives_what_transformers_generate_gives(smollm2):
    """generate(target, draft, ids) with plain transformers models, greedy, with a model draft, lookup and the
    baseline sampler: in fp32 token for token the target's own generate(); in bf16 token for token our own
    autoregressive output (exact_rows: a pass's rows are its steps'), which transformers' bf16 generate() may leave
    where its one-row attention rounds otherwise (README, Python)."""
    import copy

    from specdec_cli.drafts.layers import self_draft

    ids, mask = left_pad([smollm2.tokenizer("Bumblebees raise more queens near wildflower strips")["input_ids"]])
    eos = smollm2.tokenizer.eos_token_id
    fp32 = copy.deepcopy(smollm2.model).float()
    for target, dtype in ((fp32, "fp32"), (smollm2.model, "bf16")):
        if dtype == "fp32":
            want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40,
                                   pad_token_id=eos)[0, ids.shape[1]:].tolist()
        else:
            want = generate(target, None, ids, mask, mode="autoregressive", max_new_tokens=40, eos_token_ids=eos).tokens[0]
        draft = self_draft(LoadedModel(target, smollm2.tokenizer, "smollm2", "local"), 10).model
        for d, mode in ((draft, "exact"), (Lookup(), "exact"), (draft, "baseline")):
            got = generate(target, d, ids, mask, mode=mode, gamma=4, gamma_schedule="constant", max_new_tokens=40,
                           eos_token_ids=eos).tokens[0]
            assert got == want[: len(got)] and (len(got) == len(want) or got[-1] == eos), (dtype, mode)


@pytest.mark.slow
def test_the_real_gemma_3_270m_on_a_prompt_longer_than_its_window(session_model_cache, monkeypatch):
    """gemma-3-270m (PyPI, MODELS.md), sliding window 512 on most layers: a ~1 000-token prompt, greedy with
    self:K and lookup, token for token its autoregressive output."""
    from specdec_cli.bench.runners import data_files

    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))
    target = load_causal_lm("embedded:gemma-3-270m", dtype="bfloat16", progress=False)
    window = internals.sliding_window(target.model.config)
    text = " ".join(Path(p).read_text() for p in data_files("summarize", None)[:2])
    opts = SummarizeOptions(max_new_tokens=32, gamma=4, gamma_schedule="constant")
    assert window and len(S.encode(target.tokenizer, target.model, [S.Article("x", text)], 32, False)[0]) > 1.5 * window
    want = S.summarize(target, None, [S.Article("x", text)], opts, mode="autoregressive")[0].text
    for spec in ("self:6", "lookup"):
        got = S.summarize(target, S.load_draft(spec, target, opts, progress=False), [S.Article("x", text)], opts)[0]
        assert got.text == want and got.stats.draft_tokens > 0, spec
        assert got.stats.accepted_tokens > 0 or spec != "lookup", "lookup copies the article's phrases"
