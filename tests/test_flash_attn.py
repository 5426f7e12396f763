"""`--flash-attn` / ``flash_attn``: llama.cpp's flash attention, checked before anything loads
(with `--cpu-extra-buffers`, the other auto/on/off setting) and applied to the real context
(llama.cpp's own log says which kernel it built)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgespec.errors import InvalidParameterError


@pytest.mark.parametrize("field", ["flash_attn", "cpu_extra_buffers"])
def test_a_bad_setting_is_refused_before_anything_loads(tmp_path, field):
    """The llama.cpp settings with auto/on/off values (flash attention, and the extra CPU
    kernels of test_preflight.py): the API and the command line refuse any other."""
    from edgespec.config import ModelConfig
    flag = "--" + field.replace("_", "-")
    with pytest.raises(InvalidParameterError, match=f"{field}='sometimes' is invalid"):
        ModelConfig(tmp_path / "x.gguf", **{field: "sometimes"})
    proc = subprocess.run([sys.executable, "-m", "edgespec", "run", "hi", "--target",
                           str(tmp_path / "x.gguf"), flag, "maybe"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert flag in proc.stderr and "invalid choice" in proc.stderr


@pytest.mark.parametrize("mode,built", [("off", "disabled"), ("on", "enabled")])
def test_the_setting_reaches_llama_cpp_and_decodes(smollm2_q4_path, mode, built):
    proc = subprocess.run([sys.executable, "-m", "edgespec", "run", "The capital of France is",
                           "--raw", "--target", str(smollm2_q4_path), "--no-spec", "-n", "4",
                           "--ctx-size", "256", "--flash-attn", mode, "--verbose", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernel = [line for line in proc.stderr.splitlines()
              if line.startswith("llama_context:") and "flash_attn" in line]
    assert kernel and kernel[0].split("=")[-1].strip() == built, kernel
    assert '"tokens"' in proc.stdout
