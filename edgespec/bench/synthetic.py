"""Random-weight GGUF models of architectures whose real weights cannot be fetched here: the
hybrid and recurrent ones (Qwen3.5's Gated DeltaNet + gated attention, LFM2's short
convolutions + attention, Mamba2, Granite 4.0-H's Mamba2 + attention) and, as their
attention-only twin of equal size, Qwen3.

A :class:`Shape` names an architecture and its dimensions; :func:`write_model` writes it as an
F32 (or F16) GGUF with seeded weights and a real tokenizer copied from another GGUF, so the
file is byte-reproducible (the same shape, seed and tokenizer give the same bytes). The keys
and tensor shapes are llama.cpp's own (``src/models/<arch>.cpp`` ``load_arch_hparams`` and
``load_arch_tensors``; tensor and key names from gguf-py's constants). What decoding costs
does not depend on the weights' values, so a shape with a released model's dimensions
(:data:`SHAPES`) measures that model's pass, checkpoint and restore costs; the small shapes
are for tests. The output head is untied and scaled so that greedy output stays varied.
"""

from __future__ import annotations

import functools
import os
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

# A residual branch's output projection is scaled down so that a layer nudges the stream rather
# than overwriting it: the low-bit copies then agree with the full-precision model on most
# tokens (as trained models' do), where unit-scale random layers amplify rounding noise.
BRANCH = 0.3

@dataclass(frozen=True)
class Shape:
    """An architecture and its dimensions (the names of the Hugging Face configs)."""

    arch: str                   # llama.cpp's name: qwen35, lfm2, mamba2, granitehybrid, qwen3
    n_embd: int
    n_layer: int
    n_ff: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    head_dim: int = 0
    attn_every: int = 0         # every attn_every-th layer is attention (hybrids); 0: none
    # the recurrent mixer: Gated DeltaNet (qwen35) or Mamba2 (mamba2, granitehybrid)
    ssm_conv: int = 4
    ssm_state: int = 0          # key head size (DeltaNet) / d_state (Mamba2)
    ssm_groups: int = 0         # key heads (DeltaNet) / groups (Mamba2)
    ssm_heads: int = 0          # value heads (DeltaNet) / heads (Mamba2)
    ssm_head_dim: int = 0       # value head size (DeltaNet) / head size (Mamba2)
    l_cache: int = 3            # LFM2's short convolution
    n_vocab: Optional[int] = None   # pad the tokenizer to this many entries (real vocab size)
    # How strongly the output head favours each token's own next token (see _values): at 1,
    # a Q8_0 copy picks the F32 model's greedy token ~96% of the time, a Q4_0 copy ~65%; at 2,
    # ~99% and ~95%.
    sharpness: float = 1.0
    # Text stays among this many lowest token ids (see _values); None: the whole vocabulary.
    common: Optional[int] = None
    n_ctx_train: int = 32768

    def is_attention(self, il: int) -> bool:
        if self.arch == "qwen3":
            return True
        if self.arch == "mamba2" or not self.attn_every:
            return False
        return (il + 1) % self.attn_every == 0

    @property
    def ssm_inner(self) -> int:
        return self.ssm_heads * self.ssm_head_dim


# Test shapes: small (tens of MB in F32 with a 49k vocabulary), a few of each layer kind.
TINY = {
    "qwen35": Shape("qwen35", 256, 8, 512, 4, 2, 64, attn_every=4, ssm_state=32,
                    ssm_groups=2, ssm_heads=4, ssm_head_dim=32),
    "lfm2": Shape("lfm2", 256, 6, 512, 4, 2, 64, attn_every=3),
    "mamba2": Shape("mamba2", 256, 4, ssm_state=32, ssm_groups=1, ssm_heads=8,
                    ssm_head_dim=64),
    "granitehybrid": Shape("granitehybrid", 256, 6, 512, 4, 2, 64, attn_every=3,
                           ssm_state=32, ssm_groups=1, ssm_heads=8, ssm_head_dim=64),
    "qwen3": Shape("qwen3", 256, 4, 512, 4, 2, 64),
}

# Released models' dimensions (their config.json): for measuring costs, not for text.
SHAPES = {
    "qwen3.5-0.8b": Shape("qwen35", 1024, 24, 3584, 8, 2, 256, attn_every=4, ssm_state=128,
                          ssm_groups=16, ssm_heads=16, ssm_head_dim=128, n_vocab=248320,
                          common=8192, n_ctx_train=262144),
    "qwen3.5-2b": Shape("qwen35", 2048, 24, 6144, 8, 2, 256, attn_every=4, ssm_state=128,
                        ssm_groups=16, ssm_heads=16, ssm_head_dim=128, n_vocab=248320,
                        common=8192, n_ctx_train=262144),
}
# A draft-sized model of Qwen3.5's vocabulary (no such release: the family's smallest is the
# 0.8B), whose text follows the same chain of favourite tokens (the same seed): a cheap draft
# that agrees with the others on most tokens.
SHAPES["qwen3.5-draft"] = replace(TINY["qwen35"], n_vocab=248320, common=8192,
                                  n_ctx_train=262144)
# The attention-only twin of each: every layer attention, the same width, depth, MLP and
# vocabulary (Qwen3's architecture: q/k norms, no gates).
for _name, _s in list(SHAPES.items()):
    SHAPES[_name + "-attention"] = replace(_s, arch="qwen3", attn_every=0)


def write_model(shape: Shape, path: str | os.PathLike, tokenizer_from: str | os.PathLike,
                seed: int = 0, dtype: str = "F32") -> Path:
    """Write ``shape`` with seeded random weights to ``path`` (atomically), its tokenizer
    copied from the GGUF ``tokenizer_from`` (padded with unused control tokens to
    ``shape.n_vocab``). ``dtype``: "F32" or "F16" for the matrices (norms stay F32)."""
    import gguf
    path = Path(path)
    tok = _tokenizer_fields(Path(tokenizer_from), shape.n_vocab)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    tmp = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(tmp), shape.arch)
    w.add_name(f"edgespec synthetic {shape.arch} {shape.n_embd}x{shape.n_layer} seed {seed}")
    for key, (value, vtype, sub) in _hparams(shape).items():
        w.add_key_value(key.format(arch=shape.arch), value, vtype, sub)
    for key, (value, vtype, sub) in tok.items():
        w.add_key_value(key, value, vtype, sub)
    w.add_file_type(0 if dtype == "F32" else 1)
    tensors = list(_tensors(shape, n_vocab))
    for name, ne, init in tensors:
        np_dtype = _dtype(dtype, name, ne, init)
        n = int(np.prod(ne))
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np_dtype),
                          n * np.dtype(np_dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, ne, init in tensors:
        np_dtype = _dtype(dtype, name, ne, init)
        w.write_tensor_data(_values(name, ne, init, seed, shape.sharpness, shape.common)
                            .astype(np_dtype, copy=False))
    w.close()
    os.replace(tmp, path)
    return path


# -- keys ---------------------------------------------------------------------------------

def _hparams(s: Shape) -> dict:
    from gguf import GGUFValueType as T
    from gguf import Keys
    u32, f32, arr = T.UINT32, T.FLOAT32, T.ARRAY
    kv = {Keys.LLM.CONTEXT_LENGTH: (s.n_ctx_train, u32, None),
          Keys.LLM.EMBEDDING_LENGTH: (s.n_embd, u32, None),
          Keys.LLM.BLOCK_COUNT: (s.n_layer, u32, None),
          Keys.Attention.LAYERNORM_RMS_EPS: (1e-6, f32, None)}
    if s.arch != "mamba2":
        kv[Keys.LLM.FEED_FORWARD_LENGTH] = (s.n_ff, u32, None)
        kv[Keys.Rope.FREQ_BASE] = (10000.0, f32, None)
    if s.n_head:
        kv[Keys.Attention.HEAD_COUNT] = (s.n_head, u32, None)
        kv[Keys.Attention.HEAD_COUNT_KV] = (s.n_head_kv, u32, None)
    if s.arch in ("lfm2", "granitehybrid"):     # a layer with no KV heads is a recurrent one
        kv[Keys.Attention.HEAD_COUNT_KV] = (
            [s.n_head_kv if s.is_attention(i) else 0 for i in range(s.n_layer)], arr, u32)
    if s.arch in ("qwen35", "qwen3", "granitehybrid"):
        kv[Keys.Attention.KEY_LENGTH] = (s.head_dim, u32, None)
        kv[Keys.Attention.VALUE_LENGTH] = (s.head_dim, u32, None)
    if s.arch == "qwen35":
        n_rot = s.head_dim // 4             # partial rotary (a quarter of each head)
        half = n_rot // 2
        sections = [half - 2 * (half // 3), half // 3, half // 3, 0]
        kv[Keys.Rope.DIMENSION_COUNT] = (n_rot, u32, None)
        kv[Keys.Rope.DIMENSION_SECTIONS] = (sections, arr, T.INT32)
        kv[Keys.LLM.FULL_ATTENTION_INTERVAL] = (s.attn_every, u32, None)
        kv[Keys.SSM.INNER_SIZE] = (s.ssm_inner, u32, None)
    elif s.arch in ("mamba2", "granitehybrid"):
        kv[Keys.SSM.INNER_SIZE] = (s.ssm_inner, u32, None)
    if s.arch in ("qwen35", "mamba2", "granitehybrid"):
        kv[Keys.SSM.CONV_KERNEL] = (s.ssm_conv, u32, None)
        kv[Keys.SSM.STATE_SIZE] = (s.ssm_state, u32, None)
        kv[Keys.SSM.TIME_STEP_RANK] = (s.ssm_heads, u32, None)
        kv[Keys.SSM.GROUP_COUNT] = (s.ssm_groups, u32, None)
    if s.arch == "lfm2":
        kv[Keys.ShortConv.L_CACHE] = (s.l_cache, u32, None)
    if s.arch == "granitehybrid":
        kv[Keys.Rope.DIMENSION_COUNT] = (s.head_dim, u32, None)
    return kv


# GGUF metadata value types (gguf-py's GGUFValueType): numpy dtypes of the fixed-size ones
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY, _BOOL = 8, 9, 7


@functools.lru_cache(maxsize=4)
def _read_tokenizer(src: str, size: int, mtime_ns: int) -> dict:
    """The ``tokenizer.*`` keys of the GGUF ``src`` (of that size and time: a rewritten file
    is read again), as gguf-py's reader gives them (value, type, sub-type), read straight from
    the header: gguf-py's reader takes ~4 s over SmolLM2's 49k-entry vocabulary and ~13 s
    over Gemma's 262k, this a fraction of a second."""
    import gguf
    T = gguf.GGUFValueType
    data = memoryview(Path(src).read_bytes())
    at = 24                 # magic, version, tensor count, metadata count

    def take(n: int) -> memoryview:
        nonlocal at
        at += n
        return data[at - n:at]

    def string() -> str:
        n = int(np.frombuffer(take(8), "<u8")[0])
        return bytes(take(n)).decode("utf-8")

    def scalar(vtype: int):
        if vtype == _STRING:
            return string()
        dt = np.dtype(_SCALARS[vtype])
        v = np.frombuffer(take(dt.itemsize), dt)[0].item()
        return bool(v) if vtype == _BOOL else v

    out = {}
    for _ in range(int(np.frombuffer(data[16:24], "<u8")[0])):
        key = string()
        vtype = int(np.frombuffer(take(4), "<u4")[0])
        if vtype != _ARRAY:
            value, sub = scalar(vtype), None
        else:
            sub = int(np.frombuffer(take(4), "<u4")[0])
            n = int(np.frombuffer(take(8), "<u8")[0])
            if sub in (_STRING, _ARRAY):
                value = [scalar(sub) for _ in range(n)]
            else:
                dt = np.dtype(_SCALARS[sub])
                value = np.frombuffer(take(n * dt.itemsize), dt).tolist()
                value = [bool(v) for v in value] if sub == _BOOL else value
            sub = T(sub)
        if key.startswith("tokenizer."):
            out[key] = (value, T(vtype), sub)
    return out


def _tokenizer_fields(src: Path, n_vocab: Optional[int]) -> dict:
    """The ``tokenizer.*`` keys of ``src`` as (value, type, sub-type), the vocabulary padded
    with unused control tokens to ``n_vocab`` entries."""
    from gguf import GGUFValueType as T
    st = src.stat()
    out = dict(_read_tokenizer(str(src.resolve()), st.st_size, st.st_mtime_ns))
    tokens = out["tokenizer.ggml.tokens"][0]
    if n_vocab is not None and n_vocab > len(tokens):
        extra = n_vocab - len(tokens)
        out["tokenizer.ggml.tokens"] = (tokens + [f"<|edgespec_unused_{i}|>" for i in
                                                  range(extra)], T.ARRAY, T.STRING)
        if "tokenizer.ggml.token_type" in out:
            types = out["tokenizer.ggml.token_type"][0]
            out["tokenizer.ggml.token_type"] = (types + [3] * extra, T.ARRAY, T.INT32)
        if "tokenizer.ggml.scores" in out:
            scores = out["tokenizer.ggml.scores"][0]
            out["tokenizer.ggml.scores"] = (scores + [0.0] * extra, T.ARRAY, T.FLOAT32)
    return out


# -- tensors ------------------------------------------------------------------------------
# Each: (name, ggml dims ne0-first, how to fill it): "w" a matrix scaled by 1/sqrt(ne0),
# "norm" ones with a little noise, "out" the output head (scaled up: varied greedy text),
# "decay" negative (a state's decay), "small" a bias, "one" ones.

def _tensors(s: Shape, n_vocab: int) -> Iterator[tuple[str, tuple, str]]:
    e = s.n_embd
    yield "token_embd.weight", (e, n_vocab), "embd"
    yield ("token_embd_norm.weight" if s.arch == "lfm2" else "output_norm.weight"), (e,), "norm"
    yield "output.weight", (e, n_vocab), "out"
    for il in range(s.n_layer):
        b = f"blk.{il}."
        yield b + "attn_norm.weight", (e,), "norm"
        if s.arch == "qwen35":
            yield b + "post_attention_norm.weight", (e,), "norm"
        if s.is_attention(il):
            yield from _attention(s, b)
        elif s.arch == "qwen35":
            yield from _delta_net(s, b)
        elif s.arch == "lfm2":
            yield b + "shortconv.conv.weight", (s.l_cache, e), "w"
            yield b + "shortconv.in_proj.weight", (e, 3 * e), "w"
            yield b + "shortconv.out_proj.weight", (e, e), "branch"
        else:
            yield from _mamba2(s, b)
        if s.arch != "mamba2":
            if s.arch in ("lfm2", "granitehybrid", "qwen3"):
                yield b + "ffn_norm.weight", (e,), "norm"
            yield b + "ffn_gate.weight", (e, s.n_ff), "w"
            yield b + "ffn_up.weight", (e, s.n_ff), "w"
            yield b + "ffn_down.weight", (s.n_ff, e), "branch"


def _attention(s: Shape, b: str) -> Iterator[tuple[str, tuple, str]]:
    e, hd = s.n_embd, s.head_dim
    q = hd * s.n_head * (2 if s.arch == "qwen35" else 1)     # qwen35: query and its gate
    yield b + "attn_q.weight", (e, q), "w"
    yield b + "attn_k.weight", (e, hd * s.n_head_kv), "w"
    yield b + "attn_v.weight", (e, hd * s.n_head_kv), "w"
    yield b + "attn_output.weight", (hd * s.n_head, e), "branch"
    if s.arch in ("qwen35", "lfm2", "qwen3"):
        yield b + "attn_q_norm.weight", (hd,), "norm"
        yield b + "attn_k_norm.weight", (hd,), "norm"


def _delta_net(s: Shape, b: str) -> Iterator[tuple[str, tuple, str]]:
    e = s.n_embd
    key_dim, value_dim = s.ssm_state * s.ssm_groups, s.ssm_inner
    conv_dim = 2 * key_dim + value_dim
    yield b + "attn_qkv.weight", (e, conv_dim), "w"
    yield b + "attn_gate.weight", (e, value_dim), "w"
    yield b + "ssm_conv1d.weight", (s.ssm_conv, conv_dim), "w"
    yield b + "ssm_dt.bias", (s.ssm_heads,), "small"
    yield b + "ssm_a", (s.ssm_heads,), "decay"
    yield b + "ssm_beta.weight", (e, s.ssm_heads), "w"
    yield b + "ssm_alpha.weight", (e, s.ssm_heads), "w"
    yield b + "ssm_norm.weight", (s.ssm_head_dim,), "norm"
    yield b + "ssm_out.weight", (value_dim, e), "branch"


def _mamba2(s: Shape, b: str) -> Iterator[tuple[str, tuple, str]]:
    e, inner = s.n_embd, s.ssm_inner
    conv_dim = inner + 2 * s.ssm_groups * s.ssm_state
    yield b + "ssm_in.weight", (e, inner + conv_dim + s.ssm_heads), "w"
    yield b + "ssm_conv1d.weight", (s.ssm_conv, conv_dim), "w"
    yield b + "ssm_conv1d.bias", (conv_dim,), "small"
    yield b + "ssm_dt.bias", (s.ssm_heads,), "small"
    yield b + "ssm_a", (1, s.ssm_heads), "decay"
    yield b + "ssm_d", (1, s.ssm_heads), "one"
    yield b + "ssm_norm.weight", (inner // s.ssm_groups, s.ssm_groups), "norm"
    yield b + "ssm_out.weight", (inner, e), "branch"


def _dtype(dtype: str, name: str, ne: tuple, init: str) -> type:
    """F16 for the matrices when asked (the convolutions' kernels and vectors stay F32, as
    llama.cpp's converters keep them)."""
    half = dtype == "F16" and init in ("w", "out", "branch", "embd") and ne[0] % 32 == 0 \
        and "conv" not in name
    return np.float16 if half else np.float32


def _values(name: str, ne: tuple, init: str, seed: int, sharpness: float = 1.0,
            common: Optional[int] = None) -> np.ndarray:
    """The tensor's values, numpy-shaped (ne reversed), from a stream keyed by its name."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    shape = tuple(reversed(ne))
    if init == "out":
        # Each token's embedding points at one next token (a random permutation), as a trained
        # head's rows line up with what follows: a clear favourite at most positions, which a
        # low-bit copy keeps, on top of random rows that make the rest of the text vary.
        # The common tokens (the lowest ids of a BPE vocabulary, ordered by merge rank) point
        # at common tokens, the rest at the rest: text stays among the ``common`` ids, as real text
        # mostly does (a draft's reduced output layer keeps the low ids: drafting/reduced_head).
        embd = _values("token_embd.weight", ne, "embd", seed)
        perm = np.random.default_rng([seed, 1]).permutation
        low = min(common or ne[1], ne[1])
        follow = np.concatenate([perm(low), low + perm(ne[1] - low)])
        out = rng.standard_normal(shape, dtype=np.float32) * np.float32(4.0 / np.sqrt(ne[0]))
        out += np.float32(sharpness / np.sqrt(ne[0])) * embd[follow]
        return out
    if init == "norm":
        return 1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)
    if init == "decay":
        return -rng.uniform(0.5, 4.0, shape).astype(np.float32)
    if init == "small":
        return 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if init == "one":
        return np.ones(shape, np.float32)
    if init == "embd":      # the residual stream starts at unit scale
        return rng.standard_normal(shape, dtype=np.float32)
    scale = (BRANCH if init == "branch" else 1.0) / np.sqrt(ne[0])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
