"""Every use of a library's private internals, behind one door.

Each function here names what it relies on. A transformers or torch upgrade that moves one of them fails
`check()` (run by tests/test_layout.py) with a line that names it, instead of failing deep inside a run.
Tested with transformers 5.6–5.24 (the fast tier from 5.0) and torch 2.13 (`make compat`; pyproject.toml's range says which releases);
where an internal moved within that range, the function says what each release has.

This module imports nothing of specdec, so every layer may use it; torch and transformers are imported
on use.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading

# ----------------------------------------------------------------------------------------------------
# transformers


def rollback_cache(config):
    """A DynamicCache for `config` whose sliding-window layers keep what a rollback needs: they record every
    state past the window until the next crop_cache, which drops the rejected slots and trims the rest back to
    the window. Relies on: `DynamicCache(config=...)` building one layer per `config.layer_types` (sliding ones
    with `.is_sliding` and `.sliding_window`), and `activate_past_recording()` on them (from transformers 5.15).
    Before 5.15 a sliding layer cannot roll back past its window: a DynamicCache without the config keeps every
    slot of every layer, and the model's sliding-window mask still shows each query only its window."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    sliding = _sliding_layers(cache, recording=False)
    if any(not hasattr(layer, "activate_past_recording") for layer in sliding):
        return DynamicCache()
    for layer in sliding:
        layer.activate_past_recording()
    return cache


def cache_kwargs(model, cache) -> dict:
    """The keyword a model's forward takes its KV cache by: `cache` from transformers 5.24 (where past_key_values
    still works but warns that it goes in 5.40), `past_key_values` before. Relies on: the model class's forward
    naming the parameter (the deprecation decorator keeps the signature)."""
    return {_cache_name(type(model)): cache}  # type: ignore[arg-type]  # a class hashes; mypy reads type[Any] as not Hashable


@functools.cache
def _cache_name(cls) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def crop_cache(cache, remove: int) -> None:
    """Drop the last `remove` slots of a KV cache (0: none), then trim the sliding-window layers back to their
    window (rollback_cache: they record past it between crops). Relies on: `Cache.crop(n)` with n < 0 removing −n
    tokens: `crop(max_length)` in 5.0–5.14 (negative: remove; it also fails on a layer never filled),
    `crop(tokens_to_remove)` from 5.15 (refuses the positive "final length" form); and a sliding layer's `crop(0)`
    trimming to the window once `get_seq_length()` reached it (below it, crop(0) would empty it)."""
    if remove > 0:
        cache.crop(-remove)
    for layer in _sliding_layers(cache):
        if layer.get_seq_length() >= layer.sliding_window and layer.keys.shape[-2] > layer.sliding_window - 1:
            layer.crop(0)


def cache_is_empty(cache) -> bool:
    """Whether a forward left nothing in `cache` (a model that keeps its state elsewhere ignores it). Relies on:
    `cache.layers` (EncoderDecoderCache: `.self_attention_cache.layers`), each with `is_initialized` (key/value
    layers) or `is_conv_states_initialized` / `is_recurrent_states_initialized` dicts (linear attention)."""
    cache = getattr(cache, "self_attention_cache", cache)
    for layer in getattr(cache, "layers", ()):
        if getattr(layer, "is_initialized", False) or any(getattr(layer, "is_conv_states_initialized", {}).values()) \
                or any(getattr(layer, "is_recurrent_states_initialized", {}).values()):
            return False
    return True


def rollback_problem(cache) -> str | None:
    """Why `cache` cannot be cropped back to fewer tokens, or None. Relies on: transformers' linear-attention
    layers (Mamba and the like: a recurrent state, `get_max_length() == -1`, no `keys`) in `cache.layers`."""
    for layer in getattr(cache, "layers", ()):
        if not hasattr(layer, "keys") and hasattr(layer, "recurrent_states"):
            return "its cache holds a recurrent state, which cannot be rolled back to the accepted tokens"
    return None


def _sliding_layers(cache, recording: bool = True) -> list:
    """The sliding-window layers of a cache (none for other kinds); with `recording`, only those that can record past
    their window (transformers 5.15 on). Relies on: `cache.layers`, `layer.is_sliding`."""
    return [layer for layer in getattr(cache, "layers", ()) if getattr(layer, "is_sliding", False)
            and (not recording or hasattr(layer, "activate_past_recording"))]


def sliding_window(config) -> int | None:
    """The attention window of a model whose layers (some or all) attend to the last W positions only, else None.
    Relies on: `config.sliding_window`, and `config.layer_types` naming "sliding_attention" where only some do."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def prefilled_cross_cache(kv):
    """An EncoderDecoderCache whose cross-attention part already holds kv = [(K, V)] per decoder layer
    (K, V [B, heads, S, head_dim]), so the decoder never recomputes them. Relies on: `DynamicLayer()`
    with `lazy_initialization(k, v)` then `keys` / `values` assignable, and `DynamicCache.layers` a list."""
    from transformers import DynamicCache, EncoderDecoderCache
    from transformers.cache_utils import DynamicLayer

    cross = DynamicCache()
    for k, v in kv:
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cross.layers.append(layer)
    return EncoderDecoderCache(DynamicCache(), cross)


def attention_implementation(config) -> str | None:
    """Which attention a model runs ("sdpa", "eager", ...). Relies on: `config._attn_implementation`."""
    return getattr(config, "_attn_implementation", None)


def config_with_attention(config, name: str, fn):
    """A shallow copy of `config` whose modules run attention function `fn` (registered as `name`; the
    masks stay those of the original implementation). Relies on: `AttentionInterface.register` (public)
    and modules reading `config._attn_implementation` on every call."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, fn)
    config = copy.copy(config)
    config._attn_implementation = name
    return config


def sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' own sdpa attention function. Relies on: `transformers.integrations.sdpa_attention.
    sdpa_attention_forward(module, q, k, v, mask, **kwargs) -> (out [B, T, heads, head_dim], None)`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def sdpa_mask_for_one_query(mask):
    """The mask transformers hands sdpa for one query row: none at all when a boolean mask hides nothing
    (a copy of transformers' rule for dropping masks; with a mask, sdpa takes another kernel that rounds
    differently)."""
    import torch

    if mask is not None and mask.dtype == torch.bool and bool(mask.all()):
        return None
    return mask


@contextlib.contextmanager
def gguf_tensor_progress(track):
    """While the block runs, transformers' GGUF reader walks its tensors through `track(iterable, ...)`
    instead of a bare tqdm. Relies on: `transformers.modeling_gguf_pytorch_utils.tqdm` being the name it
    calls."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    previous = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = track
    try:
        yield
    finally:
        gguf_utils.tqdm = previous


def gguf_to_hf_names(model) -> dict[str, str]:
    """{GGUF tensor name: the model's state-dict name} for a transformers model of a GGUF architecture.
    Relies on: `transformers.modeling_gguf_pytorch_utils.get_gguf_hf_weights_map(model, processor)` and its
    `TENSOR_PROCESSORS` / `TensorProcessor` (the processor only renames MoE experts here); and on it importing
    `gguf.get_tensor_name_map` (a pure function of the architecture and block count) at each of its calls, one
    per module: cached for the call, it took 4 s of a 1.5B model's load (371 modules, 10 ms each) and now one."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(model.config.model_type, TensorProcessor)(config=model.config.to_dict())
    with _GGUF_NAMES:
        built = gguf.get_tensor_name_map
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(built)
        try:
            return get_gguf_hf_weights_map(model, processor)
        finally:
            gguf.get_tensor_name_map = built


_GGUF_NAMES = threading.Lock()  # gguf_to_hf_names swaps a module attribute of gguf's while it runs


@contextlib.contextmanager
def gguf_parsed_once(read_metadata):
    """While open, transformers' GGUF loader reads a file's metadata from read_metadata(path) -> (header, fields)
    (models/gguf_tensors.read_metadata), once per file, where gguf's `GGUFReader` took 6 s for the
    embedded target's 151 936-token vocabulary, and a config and a tokenizer read from the same file each built one.
    For metadata only: the stand-in has no tensor data (an
    AttributeError, not a wrong value, if something reads it). Relies on: `load_gguf_checkpoint` importing
    `GGUFReader` from gguf at each call and reading, without tensors, `reader.fields[key].parts / .data / .types`
    (parts[i] parsed by `_gguf_parse_value`: a scalar's value at [0], a string's bytes) and `reader.tensors[i].name`:
    transformers 5.x."""
    import gguf

    with _GGUF_READERS:
        built, readers = gguf.GGUFReader, {}

        def reader(path, *args, **kwargs):
            key = str(path)
            if key not in readers:
                readers[key] = _MetadataReader(*read_metadata(path))
            return readers[key]

        gguf.GGUFReader = reader  # type: ignore[misc, assignment]
        try:
            yield
        finally:
            gguf.GGUFReader = built  # type: ignore[misc]


class _MetadataReader:
    """What `load_gguf_checkpoint` reads of a GGUFReader when it reads no tensors (gguf_parsed_once)."""

    class Field:
        def __init__(self, name: str, types: list[int], values: list):
            self.name, self.types, self.data = name, types, range(len(values))
            # GGUFReader's parts hold a scalar as a one-element array, a string as its bytes
            self.parts = values if types[-1] == 8 else _OneElement(values)

    class Tensor:
        def __init__(self, name: str):
            self.name = name

    def __init__(self, header, fields):
        """header: .version and .tensors (names); fields: {key: .types, .values}, in the file's order."""
        self.tensors = [self.Tensor(name) for name in header.tensors]
        # GGUFReader's own entries first, as it lists them
        self.fields = {key: self.Field(key, [t], [v]) for key, t, v in (
            ("GGUF.version", 4, header.version), ("GGUF.tensor_count", 10, len(header.tensors)),
            ("GGUF.kv_count", 10, len(fields)))}
        self.fields.update({key: self.Field(key, f.types, f.values) for key, f in fields.items()})


class _OneElement:
    """values[i] as a one-element tuple."""

    def __init__(self, values: list):
        self.values = values

    def __getitem__(self, i: int) -> tuple:
        return (self.values[i],)


_GGUF_READERS = threading.Lock()  # gguf_parsed_once swaps a module attribute of gguf's while it is open


def gguf_state_dict(model, architecture: str | None, tensors, dtype) -> dict:
    """{the model's state-dict name: tensor in `dtype`} for (GGUF name, load) pairs, load(None) giving the tensor's
    fp32 values as numpy and load(dtype) a torch tensor in `dtype`: each tensor through the tensor processor of the
    file's `architecture` (general.architecture) and named as transformers' GGUF loader names it: that loader's
    loop over the tensors, on those given (the caller leaves out what runs on blocks). Where the architecture has
    no processor of its own (qwen2, ...), the base one changes nothing: each tensor is loaded straight into `dtype`
    (no fp32 copy: the embedded target's embeddings 0.93 GB). Relies on: `TENSOR_PROCESSORS` /
    `TensorProcessor(config=dict).process(weights=, name=, tensor_key_mapping=, parsed_parameters=)` returning
    `.weights` and `.name` (the base class: both as given), and processors that merge tensors (MoE experts)
    writing them into `parsed_parameters["tensors"]` themselves: `load_gguf_checkpoint`'s loop in 5.x."""
    import numpy as np
    import torch
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    mapping = gguf_to_hf_names(model)
    config = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(architecture or "", TensorProcessor)(config=config)
    parsed: dict = {"config": config, "tensors": {}}
    for name, load in tensors:
        if type(processor) is TensorProcessor:
            if name in mapping:
                parsed["tensors"][mapping[name]] = load(dtype)
            continue
        result = processor.process(weights=load(None), name=name, tensor_key_mapping=mapping, parsed_parameters=parsed)
        if result.name in mapping:  # a fresh array: no copy unless the processor gave a view
            parsed["tensors"][mapping[result.name]] = torch.from_numpy(np.ascontiguousarray(result.weights)).to(dtype)
    return parsed["tensors"]


def init_meta_buffers(model) -> None:
    """Compute, on the CPU, the buffers a model built on the meta device holds (a rotary embedding's inv_freq,
    Gemma 3's embed_scale), as from_pretrained does. Relies on: transformers 5's `_init_weights(module)` computing a
    module's non-persistent buffers from the config, and `transformers.initialization`'s functions leaving a tensor
    flagged `_is_hf_initialized` as it is (the module's loaded weights: checked by torch's `_version`, which every
    in-place write moves; RuntimeError if one was written)."""
    import torch

    for module in model.modules():
        meta = [name for name, b in module.named_buffers(recurse=False) if b.is_meta]
        if not meta:
            continue
        kept = [t for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)) if not t.is_meta]
        versions = [t._version for t in kept]
        for t in kept:
            t._is_hf_initialized = True
        for name in meta:
            module._buffers[name] = torch.empty_like(module._buffers[name], device="cpu")
        model._init_weights(module)
        if [t._version for t in kept] != versions:
            raise RuntimeError(f"{type(module).__name__}'s initialization wrote into its loaded tensors")


def gguf_dequantized():
    """from_pretrained kwargs that load a GGUF file with every weight unpacked to a plain dense model. Relies on:
    `GgufConfig(dequantize=True)` from 5.17 (which otherwise keeps the GGUF blocks); 5.0–5.16 have no GgufConfig,
    always dequantize and refuse any quantization_config beside a gguf_file."""
    import transformers

    if not hasattr(transformers, "GgufConfig"):
        return {}
    return {"quantization_config": transformers.GgufConfig(dequantize=True)}


def drop_quantization_config(config) -> None:
    """Forget that a config was loaded from a quantized (GGUF) file, so the dequantized model saves as a
    plain one. Relies on: the attribute living in `config.__dict__`."""
    config.__dict__.pop("quantization_config", None)


def speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits):
    """transformers' own verification step (`bench --modes hf`). Relies on: `transformers.generation.utils.
    _speculative_sampling(candidate_input_ids, candidate_logits, γ, new_logits, ...) -> (tokens, n_matches)`;
    5.0–5.17 also require `is_done_candidate` (False here: no EOS among the candidates); 5.18 dropped it."""
    fn, extra = _speculative_sampling()
    return fn(candidate_input_ids, candidate_logits, candidate_length, new_logits, **extra)


@functools.cache
def _speculative_sampling():  # looked up once: `bench --modes hf` times each call
    import inspect

    from transformers.generation.utils import _speculative_sampling as fn

    return fn, {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(fn).parameters else {}


# ----------------------------------------------------------------------------------------------------
# torch


def shallow_copy(module):
    """A new module object whose children, parameters and buffers are the original's own objects;
    assigning a child on the copy leaves the original untouched. Relies on: nn.Module keeping them in
    the dicts `_modules`, `_parameters`, `_buffers`."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


# ----------------------------------------------------------------------------------------------------


def dynamic_int8_linear(linear):
    """An fp32 nn.Linear as torch's dynamic int8 linear (fbgemm: int8 weights, one scale per output row;
    activations quantized per call, over the whole call's rows). Relies on: `torch.ao.nn.quantized.dynamic.
    Linear.from_float` and `torch.ao.quantization.per_channel_dynamic_qconfig` (deprecated, still in 2.13)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        linear.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        return torch.ao.nn.quantized.dynamic.Linear.from_float(linear)


# ----------------------------------------------------------------------------------------------------
# llama-cpp-python (an optional peer of the bench)


@contextlib.contextmanager
def llama_without_extra_buffers():
    """Llama() made inside the block loads its weights without llama.cpp's extra buffer types (its AMX and repacked
    weights: what `--no-repack` turns off in llama.cpp's own CLI). Relies on: Llama.__init__ taking its model
    parameters from llama_cpp.llama_cpp.llama_model_default_params() at the call (llama-cpp-python 0.3.36), and
    their field use_extra_bufts."""
    import llama_cpp.llama_cpp as low

    default = low.llama_model_default_params

    def params():
        out = default()
        out.use_extra_bufts = False
        return out

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def check() -> list[str]:
    """What has moved: one line per internal this module relies on and cannot find (empty: all there)."""
    import importlib
    import inspect

    import torch

    problems = []

    def need(what: str, ok) -> None:
        try:
            found = ok()
        except Exception as e:
            found, what = False, f"{what} ({type(e).__name__}: {e})"
        if not found:
            problems.append(what)

    def attr(module: str, name: str):
        return lambda: hasattr(importlib.import_module(module), name)

    need("transformers.cache_utils.DynamicLayer", attr("transformers.cache_utils", "DynamicLayer"))
    need("DynamicLayer.lazy_initialization", lambda: hasattr(
        importlib.import_module("transformers.cache_utils").DynamicLayer, "lazy_initialization"))
    need("DynamicCache.layers is a list", lambda: isinstance(importlib.import_module("transformers").DynamicCache().layers, list))
    need("Cache.crop takes a negative count", lambda: {"tokens_to_remove", "max_length"} & set(inspect.signature(
        importlib.import_module("transformers.cache_utils").DynamicLayer.crop).parameters))
    need("transformers.AttentionInterface.register", lambda: hasattr(importlib.import_module("transformers").AttentionInterface, "register"))
    need("PretrainedConfig._attn_implementation", lambda: hasattr(importlib.import_module("transformers").PretrainedConfig(), "_attn_implementation"))
    need("transformers.integrations.sdpa_attention.sdpa_attention_forward",
         attr("transformers.integrations.sdpa_attention", "sdpa_attention_forward"))
    need("torch.ao.nn.quantized.dynamic.Linear.from_float", lambda: hasattr(torch.ao.nn.quantized.dynamic.Linear, "from_float"))
    need("torch.ao.quantization.per_channel_dynamic_qconfig", lambda: hasattr(torch.ao.quantization, "per_channel_dynamic_qconfig"))
    need("transformers.modeling_gguf_pytorch_utils.tqdm", attr("transformers.modeling_gguf_pytorch_utils", "tqdm"))
    need("transformers.modeling_gguf_pytorch_utils.get_gguf_hf_weights_map",
         lambda: all(hasattr(importlib.import_module("transformers.modeling_gguf_pytorch_utils"), n)
                     for n in ("get_gguf_hf_weights_map", "TENSOR_PROCESSORS", "TensorProcessor")))
    need("transformers.generation.utils._speculative_sampling(ids, logits, γ, new_logits)",
         lambda: inspect.signature(_speculative_sampling()[0]).bind(0, 0, 0, 0, **_speculative_sampling()[1]))
    need("torch.nn.Module._modules / _parameters / _buffers",
         lambda: all(isinstance(getattr(torch.nn.Linear(1, 1), n), dict) for n in ("_modules", "_parameters", "_buffers")))
    return problems
