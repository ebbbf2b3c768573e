"""Other tools as contenders beside specdec's own (`specdec bench --peers`), on the same inputs at the same
thread count:

    faster-whisper  (transcribe) the embedded Whisper's own CTranslate2 files (models.whisper_convert.ensure_ct2:
                    joined once into the cache), decoding as specdec does: greedy (beam 1, temperature 0, no
                    fallback), no timestamps, no conditioning on the previous window, no VAD, the run's --language
                    (auto: its own detection). One record per compute type (float32, int8); load excluded. Its
                    time covers features, encoder and decoder, so it is set beside specdec's end_to_end_s (not
                    wall_s, which is specdec's decoding loops alone). An optional extra (`pip install
                    'specdec[peers]'`): when it is not installed, `skipped` gives the one line the bench shows,
                    and the rest of the bench runs.
    hf-assisted     (summarize) transformers' own speculative decoding, `generate()` on the same target and
                    prompts: with assistant_model = the run's draft model (its own γ heuristic; the draft as
                    transformers users run it, in the target's dtype with its whole output layer) and with
                    prompt_lookup_num_tokens (its prompt lookup). Greedy, batch 1, the same EOS and
                    max_new_tokens. Its time covers the prefill and the decoding, as specdec's wall_s does, so
                    it gets a tokens/s speedup over the target alone.
    llama.cpp       (summarize) llama-cpp-python on the target's own GGUF file (the embedded one joined in the
                    cache, or the .gguf given), fed the very prompt tokens specdec decodes (its chat template),
                    greedy (temperature 0: argmax, no penalties), the same EOS, max_new_tokens and threads
                    (n_threads = n_threads_batch). Its time covers the prefill and the decoding, as wall_s does;
                    prefill_s is its time to the first token, target_ms_per_forward its ms per token after it. An
                    optional extra built from source (LLAMA_INSTALL); skipped with one line when it is not
                    installed or the target has no GGUF.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from specdec_cli import internals
from specdec_cli.bench.contenders import Run, TaskRecord, score_quality
from specdec_cli.bench.machine import PeakMemory
from specdec_cli.drafts import model_draft, spec
from specdec_cli.models.causal_lm import eos_ids

INSTALL = "pip install 'specdec-cli[peers]'"


@dataclass(frozen=True)
class Peer:
    name: str  # as --peers spells it
    task: str  # the task it runs beside
    module: str  # what must import
    variants: tuple[str, ...]  # one record each: faster-whisper's compute types, hf-assisted's drafts
    embedded_only: bool = False  # reads only an embedded target
    gguf_only: bool = False  # reads only a target that is a GGUF (models.causal_lm.gguf_file)
    install: str = INSTALL  # how to get it, in the line that says it is missing


# llama-cpp-python has CPU wheels for no machine here: it builds llama.cpp from source (cmake, a C++ compiler)
LLAMA_INSTALL = ("CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'specdec-cli[llama-cpp]' (llama-cpp-python 0.3.36, built "
                 "from source: ~25 min on 2 cores)")
PEERS = {"faster-whisper": Peer("faster-whisper", "transcribe", "faster_whisper", ("float32", "int8"), embedded_only=True),
         "hf-assisted": Peer("hf-assisted", "summarize", "transformers", ("draft", "prompt lookup")),
         "llama.cpp": Peer("llama.cpp", "summarize", "llama_cpp", ("greedy",), gguf_only=True, install=LLAMA_INSTALL)}
PROMPT_LOOKUP_TOKENS = 10  # hf-assisted's n-gram lookup: the value transformers' documentation uses
WARMUP_SECONDS = 5  # the untimed first call: the first seconds of the first clip


def variants(name: str, draft: str) -> tuple[str, ...]:
    """The variants of peer `name` that run with --draft `draft`: hf-assisted's "draft" needs a draft model,
    which --draft lookup alone does not have."""
    if name == "hf-assisted" and spec.split_lookup(draft)[1] is None:
        return tuple(v for v in PEERS[name].variants if v != "draft")
    return PEERS[name].variants


def skipped(name: str, target: str = "embedded") -> str | None:
    """The one line saying why peer `name` does not run here (not installed; a target it cannot read), or None."""
    peer = PEERS[name]
    try:
        __import__(peer.module)
    except ImportError:
        return f"--peers {name}: {peer.module} is not installed ({peer.install}): its contenders are skipped"
    if peer.embedded_only and _embedded_name(target) is None:
        return f"--peers {name}: runs only on an embedded target (got {target!r}): its contenders are skipped"
    if peer.gguf_only and _gguf_of(target) is None:
        return f"--peers {name}: runs only on a GGUF target (got {target!r}): its contenders are skipped"
    return None


def _gguf_of(target: str):
    """The GGUF file of a summarize target (the embedded one joined once into the cache), or None."""
    from specdec_cli.errors import SpecdecError
    from specdec_cli.models.causal_lm import gguf_file

    try:
        return gguf_file(target, "target", progress=False)
    except SpecdecError:
        return None


def _embedded_name(target: str) -> str | None:
    from specdec_cli.models.whisper import EMBEDDED_DEFAULT
    from specdec_cli.models.whisper_convert import EMBEDDED

    kind, _, name = target.partition(":")
    if kind != "embedded":
        return None
    name = name or EMBEDDED_DEFAULT
    return name if name in EMBEDDED else None


def _record(task: str, mode: str, texts: list[str], tokens: int, wall: float, mib: float | None,
            references: list[str] | None, threads: int, peer: str, target_ms_per_forward: float | None = None,
            **more) -> TaskRecord:
    """A peer's TaskRecord from its fastest pass (no draft, no verification of its own); `more`: its other
    measured fields (end_to_end_s, prefill_s, input_wall_s)."""
    return TaskRecord(
        task=task, gamma=0, mode=mode, new_tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0,
        acceptance_rate=None, mean_accepted_per_call=None, verify_ms_per_call=None, draft_ms_per_forward=None,
        target_ms_per_forward=target_ms_per_forward, peak_memory_mib=mib,
        quality=score_quality(task, texts, references) if references else {}, outputs=texts, threads=threads,
        peer=peer, **more)


def faster_whisper_runs(target: str, audios: list[np.ndarray], references: list[str] | None, *, threads: int,
                        language: str, max_new_tokens: int) -> list[Run]:
    """One run per compute type (contenders.Run): faster-whisper over every audio (16 kHz mono float32); its record's
    wall_s = end_to_end_s = a pass's time, load excluded."""
    from faster_whisper import WhisperModel

    from specdec_cli.models.whisper_convert import ensure_ct2

    folder = str(ensure_ct2(_embedded_name(target)))
    lang = None if language == "auto" else language
    runs = []
    for compute in PEERS["faster-whisper"].variants:
        model = WhisperModel(folder, device="cpu", compute_type=compute, cpu_threads=threads)

        def once(model=model):
            t0 = time.perf_counter()
            texts, tokens = _transcribe(model, audios, lang, max_new_tokens)
            wall = time.perf_counter() - t0
            return wall, (texts, tokens, wall), None

        def record(result, mib, compute=compute):
            texts, tokens, wall = result
            return _record("transcribe", f"faster-whisper {compute}", texts, tokens, wall, mib, references, threads,
                           "faster-whisper", end_to_end_s=wall)

        warm = lambda model=model: _transcribe(model, [audios[0][: WARMUP_SECONDS * 16000]], lang, max_new_tokens)  # noqa: E731
        runs.append(Run(f"faster-whisper {compute}", warm, once, record))
    return runs


def _transcribe(model, audios: list[np.ndarray], language: str | None, max_new_tokens: int) -> tuple[list[str], int]:
    """(each audio's text, tokens over all) from a faster_whisper.WhisperModel, decoding as specdec does."""
    texts, tokens = [], 0
    for audio in audios:
        segments, _ = model.transcribe(audio, language=language, beam_size=1, temperature=0.0, without_timestamps=True,
                                       condition_on_previous_text=False, vad_filter=False, max_new_tokens=max_new_tokens)
        segments = list(segments)  # the generator decodes as it is read
        texts.append(" ".join(s.text.strip() for s in segments if s.text.strip()))
        tokens += sum(len(s.tokens) for s in segments)
    return texts, tokens


def hf_assisted_runs(opts, articles: list, references: list[str] | None, *, threads: int) -> list[Run]:
    """One run per variant (PEERS["hf-assisted"]; contenders.Run): transformers' generate() over every article, warmed
    by a two-token call; opts: the run's SummarizeOptions (target, draft, dtype, device, max_new_tokens,
    truncation). The draft variant runs where the draft has a model (`variants`)."""
    from specdec_cli.tasks import summarize as task

    target, draft = task.load_pair(opts.replace(mode="exact"), progress=False)
    tok, model = target.tokenizer, target.model
    eos = eos_ids(target)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos), 0)
    prompts = [task.left_pad([row], pad) for row in task.encode(tok, model, articles, opts.max_new_tokens, opts.truncate,
                                                                   opts.max_input_tokens)]
    runs = model_draft(draft)  # None for --draft lookup; lookup+DRAFT: DRAFT's
    assistant = None if runs is None else runs.model
    for m in (model, assistant):
        if m is not None:  # as from_pretrained leaves them; with loading's requires_grad_(False), torch's matmul copies
            m.requires_grad_(True)  # the whole output layer on transformers' sliced last rows (decoding/adapters.py)
    generate_kwargs = {"draft": {"assistant_model": assistant},
                       "prompt lookup": {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}}
    out = []
    for name in variants("hf-assisted", opts.draft):

        def run(ids, mask, new_tokens, kwargs=generate_kwargs[name]) -> list[int]:
            with torch.no_grad(), _no_transformers_warnings():  # assisted generation warns about its own internal call
                out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), do_sample=False,
                                     max_new_tokens=new_tokens, eos_token_id=sorted(eos), pad_token_id=pad, **kwargs)
            new = out[0, ids.shape[1]:].tolist()
            return next((new[: i + 1] for i, t in enumerate(new) if t in eos), new)  # through the first EOS, as specdec counts

        def once(run=run):
            t0 = time.perf_counter()
            outputs = [run(ids, mask, opts.max_new_tokens) for ids, mask in prompts]
            wall = time.perf_counter() - t0
            return wall, (outputs, wall), None

        def record(result, mib, name=name):
            outputs, wall = result
            texts = [task.summary_text(tok, tokens, eos) for tokens in outputs]
            return _record("summarize", f"hf-assisted {name}", texts, sum(len(t) for t in outputs), wall, mib,
                           references, threads, "hf-assisted")

        out.append(Run(f"hf-assisted {name}", lambda run=run: run(*prompts[0], 2), once, record))  # warm: each shape's first calls
    return out


def llama_cpp_runs(opts, articles: list, references: list[str] | None, *, threads: int) -> list[Run]:
    """One run (contenders.Run): llama.cpp over every article (the module docstring), warmed by a two-token call.
    opts: the run's SummarizeOptions (target, max_new_tokens, truncation)."""
    from llama_cpp import Llama

    from specdec_cli.models.causal_lm import load_causal_lm
    from specdec_cli.tasks import summarize as task

    loaded = load_causal_lm(opts.target, dtype=opts.dtype, progress=False)  # its tokenizer and context: the prompts
    tok, eos = loaded.tokenizer, eos_ids(loaded)
    prompts = task.encode(tok, loaded.model, articles, opts.max_new_tokens, opts.truncate, opts.max_input_tokens)
    del loaded
    path, n_ctx = str(_gguf_of(opts.target)), max(map(len, prompts)) + opts.max_new_tokens + 8
    extra = _extra_buffers_run(path, max(prompts, key=len), n_ctx, threads)
    with contextlib.nullcontext() if extra else internals.llama_without_extra_buffers():
        llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    label = "llama.cpp" if extra else "llama.cpp no-repack"

    def run(ids: list[int], new_tokens: int) -> tuple[list[int], float, float]:
        """(new tokens through the first EOS, seconds to the first token, seconds in all)."""
        llm.reset()  # no KV cache reused from the call before: every prompt is read whole
        out, first, t0 = [], 0.0, time.perf_counter()
        for t in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            first = first or time.perf_counter() - t0
            out.append(int(t))
            if t in eos or len(out) >= new_tokens:
                break  # the generator evaluates a token only when asked for the next: nothing more is computed
        return out, first, time.perf_counter() - t0

    def once():
        runs = [run(ids, opts.max_new_tokens) for ids in prompts]
        return sum(r[2] for r in runs), runs, None

    def record(runs, mib):
        wall, prefill = sum(r[2] for r in runs), sum(r[1] for r in runs)
        tokens = sum(len(r[0]) for r in runs)
        texts = [task.summary_text(tok, r[0], eos) for r in runs]
        return _record("summarize", label, texts, tokens, wall, mib, references, threads, "llama.cpp",
                       target_ms_per_forward=1e3 * (wall - prefill) / (tokens - len(runs)) if tokens > len(runs) else None,
                       prefill_s=prefill, input_wall_s=[r[2] for r in runs])

    return [Run(label, lambda: run(prompts[0], 2), once, record)]


# A child that loads the GGUF as llama.cpp does by default and evaluates one prompt (argv: path, n_ctx, threads, ids)
_PROBE = """import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]), n_threads_batch=int(sys.argv[3]),
            verbose=False)
llm.eval([int(t) for t in sys.argv[4].split(",")])
"""


def _extra_buffers_run(path: str, ids: list[int], n_ctx: int, threads: int) -> bool:
    """Whether llama.cpp evaluates the prompt `ids` with its extra buffer types (its default: AMX or repacked weights
    where the CPU has them) without being killed by a signal, tried in a process of its own (one more load and
    prompt). Its AMX product segfaulted on the AMX Xeon of the thirty-eighth session (llama.cpp issue 20824); a
    llama.cpp user there runs `--no-repack`, and so does the bench, saying so in one line and in the record's mode.
    Any other failure keeps the defaults: the load that follows says what it is."""
    import signal
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PROBE, path, str(n_ctx), str(threads), ",".join(map(str, ids))],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode >= 0:
        return True
    print(f"--peers llama.cpp: its default weights (extra buffer types: AMX, repacking) crashed on this CPU "
          f"({signal.Signals(-done.returncode).name}): it runs without them (--no-repack)", file=sys.stderr)
    return False


def served(name: str, *args, threads: int, device: str = "cpu", **kwargs) -> list[Run]:
    """Peer `name`'s runs (BUILDERS[name](*args, threads=threads, **kwargs)) built and run by a worker process of its
    own (spawned), each pass's time and peak memory (PeakMemory(device)) measured there: its models, memory and
    thread pools stay apart from specdec's (in one process, faster-whisper's thread pools once run slowed torch's
    decoding by ~25 %, benchmarks/longform.py; and a process's peak memory would hold every model of the bench). The
    worker ends when the runs are let go (its pipe closed)."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    here, there = spawn.Pipe()
    worker = spawn.Process(target=_serve, args=(name, args, kwargs, threads, device, there), daemon=True)
    worker.start()
    there.close()

    def call(*message):
        try:
            here.send(message)
            out = here.recv()
        except (EOFError, OSError):  # it died (a crash, the kernel's OOM killer): say so in one line
            worker.join(5)
            raise RuntimeError(f"--peers {name}: its worker process ended without an answer "
                               f"(exit code {worker.exitcode})") from None
        if isinstance(out, BaseException):
            raise out
        return out

    labels = call("labels")
    return [Run(label, lambda i=i: call("warm", i), lambda i=i: call("once", i),
                lambda result, mib, i=i: call("record", i, result, mib)) for i, label in enumerate(labels)]


BUILDERS = {"faster-whisper": faster_whisper_runs, "hf-assisted": hf_assisted_runs, "llama.cpp": llama_cpp_runs}


def _serve(name: str, args: tuple, kwargs: dict, threads: int, device: str, conn) -> None:
    """served()'s worker: builds the runs, then answers ("labels"), ("warm", i), ("once", i) -> (seconds, result, peak
    MiB here), ("record", i, result, MiB) until its pipe closes; an exception is sent back in place of an answer."""
    torch.set_num_threads(threads)
    runs = None
    while True:
        try:
            op, *rest = conn.recv()
        except EOFError:
            return
        try:
            if runs is None:
                runs = BUILDERS[name](*args, threads=threads, **kwargs)
            if op == "labels":
                conn.send([r.label for r in runs])
            elif op == "warm":
                runs[rest[0]].warm()
                conn.send(None)
            elif op == "once":
                with PeakMemory(device) as peak:
                    seconds, result, _ = runs[rest[0]].once()
                conn.send((seconds, result, peak.mib))
            else:
                conn.send(runs[rest[0]].record(*rest[1:]))
        except Exception as e:  # sent back: raised where the bench runs
            try:
                conn.send(e)
            except Exception:  # it does not pickle: its words
                conn.send(RuntimeError(f"{name}: {type(e).__name__}: {e}"))


@contextlib.contextmanager
def _no_transformers_warnings():
    """transformers' warnings off for the block, errors still shown (models.progress.quiet_transformers, its
    twin, turns transformers' progress bars off instead: loading keeps its warnings)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
