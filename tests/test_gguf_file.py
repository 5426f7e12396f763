"""The defensive GGUF header reader, on tiny files written with the gguf package."""

import struct

import numpy as np
import pytest

import gguf

from edgespec.errors import InvalidModelError, ModelLoadError
from edgespec.gguf_file import GGML_BLOCK, check_causal_lm, read_gguf


def write_tiny(path, arch="llama", general_type=None, template=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    if general_type:
        w.add_type(general_type)
    if template:
        w.add_chat_template(template)
    w.add_token_list([b"<s>", b"</s>", b"a", b"b"])
    w.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    w.add_tensor("output.weight", np.ones((4, 8), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reads_a_valid_file(tmp_path):
    info = read_gguf(write_tiny(tmp_path / "t.gguf", template="{{ messages }}"))
    assert info.architecture == "llama"
    assert info.name == "tiny"
    assert info.n_tensors == 2
    assert info.n_vocab == 4
    assert info.chat_template == "{{ messages }}"
    check_causal_lm(info)


def test_block_table_matches_ggml():
    for qtype, (blck, size) in gguf.GGML_QUANT_SIZES.items():
        assert GGML_BLOCK.get(int(qtype)) == (blck, size), qtype.name


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        read_gguf(tmp_path / "nope.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        read_gguf(tmp_path)


def test_bad_magic(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(InvalidModelError, match=r"not a valid GGUF model \(bad magic"):
        read_gguf(p)


@pytest.mark.parametrize("keep", [30, 100, 200, -1])
def test_truncated_anywhere(tmp_path, keep):
    good = write_tiny(tmp_path / "t.gguf").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(good[:keep] if keep > 0 else good[:-8])
    with pytest.raises(InvalidModelError, match="truncated|past the end"):
        read_gguf(p)


def test_absurd_counts(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 2**60) + bytes(64))
    with pytest.raises(InvalidModelError, match="claims"):
        read_gguf(p)


def test_absurd_string_length(tmp_path):
    p = tmp_path / "x.gguf"
    key = b"general.name"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                  + struct.pack("<IQ", 8, 2**62) + bytes(64))
    with pytest.raises(InvalidModelError, match="claims"):
        read_gguf(p)


def test_tensor_data_past_end_of_file(tmp_path):
    good = bytearray(write_tiny(tmp_path / "t.gguf").read_bytes())
    info = read_gguf(tmp_path / "t.gguf")
    # Point the last tensor's offset far beyond the file: find its offset field by value.
    # The header's last 8 bytes before alignment padding are that offset; rewrite it.
    name = b"output.weight"
    at = good.rfind(name) + len(name)
    n_dims = struct.unpack_from("<I", good, at)[0]
    off_at = at + 4 + 8 * n_dims + 4
    struct.pack_into("<Q", good, off_at, 10**9)
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(good))
    assert info.n_tensors == 2
    with pytest.raises(InvalidModelError, match="output.weight.*past the end"):
        read_gguf(p)


def test_lora_adapter_is_refused(tmp_path):
    info = read_gguf(write_tiny(tmp_path / "a.gguf", general_type="adapter"))
    with pytest.raises(ModelLoadError, match="adapter, not a language model"):
        check_causal_lm(info)


def test_embedding_model_is_refused(tmp_path):
    info = read_gguf(write_tiny(tmp_path / "b.gguf", arch="bert"))
    with pytest.raises(ModelLoadError, match="not a text-generation model"):
        check_causal_lm(info)
