"""The preflight's child (:mod:`.preflight`): a tiny model written, quantised and decoded.

    python -m edgespec.backend.probe on|off|repack

``on``: with llama.cpp's extra CPU buffer types; ``off``: without; ``repack``: without, but for
the weights the repacked kernels take, named to them (:mod:`.repack`).

It prints a ``step …`` line before each decode, so that the parent can say where a child that
died by a signal died, and ``ok`` at the end; it exits 0 unless something failed in Python.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import llama_cpp.llama_cpp as C

from .runtime import ensure_init

# What the child quantises the probe model to (llama_ftype): every weight type the AMX and
# repack kernels of llama.cpp handle on x86 (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K).
PROBE_FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q2_K": 10}
PROBE_BATCHES = (8, 1)             # a batch takes the tile kernels; one token may not


def write_probe_model(path: Path, n_vocab: int = 512, n_embd: int = 256, n_ff: int = 512,
                      tokenizer: str = "llama") -> None:
    """A one-layer llama-architecture GGUF with random F32 weights, shaped so that every
    weight matrix is eligible for llama.cpp's AMX and repack kernels (rows a multiple of 32,
    columns of 256). ``tokenizer="none"``: a model without a vocabulary (tests)."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("edgespec-cpu-check")
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(n_embd // 4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model(tokenizer)
    if tokenizer != "none":
        w.add_token_list([b"<unk>", b"<s>", b"</s>"]
                         + [f"t{i}".encode() for i in range(n_vocab - 3)])
        w.add_token_scores([0.0] * n_vocab)
        w.add_token_types([2, 3, 3] + [1] * (n_vocab - 3))
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    rng = np.random.default_rng(0)

    def weight(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32))
    weight("token_embd.weight", n_vocab, n_embd)
    weight("output.weight", n_vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        weight(f"blk.0.{name}.weight", n_embd, n_embd)
    weight("blk.0.ffn_gate.weight", n_ff, n_embd)
    weight("blk.0.ffn_up.weight", n_ff, n_embd)
    weight("blk.0.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _decode_probe(path: Path, mode: str, n_threads: int) -> None:
    mparams = C.llama_model_default_params()
    mparams.use_extra_bufts = mode == "on"
    kept = None
    if mode == "repack":
        from ..gguf_file import read_gguf
        from .repack import overrides
        kept = overrides(read_gguf(path).tensors)       # (kept alive while it loads)
        if kept is not None:                            # (none of a type they do not take)
            mparams.tensor_buft_overrides = kept.pointer
    model = C.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise SystemExit(f"cannot load {path}")
    cparams = C.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 64
    cparams.n_threads = cparams.n_threads_batch = n_threads
    ctx = C.llama_init_from_model(model, cparams)
    batch = C.llama_batch_init(64, 0, 1)
    pos = 0
    for n in PROBE_BATCHES:
        print(f"step {path.stem} weights, a batch of {n} token{'s' * (n > 1)}", flush=True)
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 3 + i, pos + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == n - 1
        batch.n_tokens = n
        if C.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        C.llama_synchronize(ctx)
        pos += n
    C.llama_batch_free(batch)
    C.llama_free(ctx)
    C.llama_model_free(model)


def main(mode: str) -> int:
    ensure_init()
    threads = max(2, min(os.cpu_count() or 2, 4))
    with tempfile.TemporaryDirectory(prefix="edgespec-cpu-check-") as tmp:
        f32 = Path(tmp) / "probe-F32.gguf"
        write_probe_model(f32)
        for name, ftype in PROBE_FTYPES.items():
            out = Path(tmp) / f"{name}.gguf"
            qp = C.llama_model_quantize_default_params()
            qp.ftype, qp.allow_requantize, qp.nthread = ftype, True, 1
            if C.llama_model_quantize(str(f32).encode(), str(out).encode(), qp) != 0:
                continue
            _decode_probe(out, mode, threads)
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("on", "off", "repack"):
        sys.exit(main(sys.argv[1]))
    sys.exit("usage: python -m edgespec.backend.probe on|off|repack")
