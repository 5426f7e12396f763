"""`edgespec pull | pairs | rm | pair derive` run as a user runs them: real processes, the real
hub client talking HTTP to a local hub (tests/hubserver.py), real GGUF files, real exit codes.

The registry is replaced (EDGESPEC_REGISTRY) by one whose hub models are the SmolLM2 and Gemma
files that scripts/fetch_models.py provides, published on the local hub.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hubserver import FakeHub

REPO = "edgespec-test/SmolLM2-135M-Instruct-GGUF"
GEMMA_REPO = "edgespec-test/gemma-3-270m-GGUF"

REGISTRY = f"""
[models.hub-smollm2-q4_1]
approx_gb = 0.1
license = "Apache-2.0"
[models.hub-smollm2-q4_1.source]
kind = "hub"
repo = "{REPO}"
filename = "SmolLM2-135M-Instruct.Q4_1.gguf"
revision = "main"

[models.hub-smollm2-q2_k]
approx_gb = 0.09
license = "Apache-2.0"
[models.hub-smollm2-q2_k.source]
kind = "hub"
repo = "{REPO}"
filename = "SmolLM2-135M-Instruct.Q2_K.gguf"
revision = "main"

[models.hub-gemma-q4_k_m]
approx_gb = 0.25
license = "Gemma"
[models.hub-gemma-q4_k_m.source]
kind = "hub"
repo = "{GEMMA_REPO}"
filename = "gemma-3-270m.Q4_K_M.gguf"
revision = "main"

[pairs.tiny]
target = "hub-smollm2-q4_1"
draft = "hub-smollm2-q2_k"
description = "SmolLM2-135M Q4_1 drafted by its own Q2_K weights, from the local hub"
why = "self-speculative test pair"

[pairs.mismatched]
target = "hub-smollm2-q4_1"
draft = "hub-gemma-q4_k_m"
description = "two different tokenizers"
why = "must be refused by the pair check: few of Gemma's tokens are SmolLM2's"

[pairs.across]
target = "hub-gemma-q4_k_m"
draft = "hub-smollm2-q4_1"
description = "a draft of another family"
why = "most of SmolLM2's tokens are Gemma's: drafts across the vocabularies"
"""


@pytest.fixture
def site(tmp_path, smollm2_q4_path, smollm2_q2k_path):
    """(hub server, environment for edgespec processes)."""
    with FakeHub(tmp_path / "server") as server:
        server.add_file(REPO, "SmolLM2-135M-Instruct.Q4_1.gguf", smollm2_q4_path)
        server.add_file(REPO, "SmolLM2-135M-Instruct.Q2_K.gguf", smollm2_q2k_path)
        server.add_file(REPO, "notes.bin", b"a small synthetic file " * 100)
        registry = tmp_path / "pairs.toml"
        registry.write_text(REGISTRY)
        env = server.env(tmp_path / "hf", EDGESPEC_MODELS=str(tmp_path / "models"),
                         EDGESPEC_REGISTRY=str(registry))
        yield server, env


def edgespec(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "edgespec", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_user_error(proc, *fragments):
    """Exit 1, no traceback, and the error is one line: the last one on stderr (progress
    notes such as "downloading …" may come before it)."""
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert errors == lines[-1:], proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[-1], lines[-1]


def test_pull_a_pair_verifies_checks_and_then_resolves_offline(site, tmp_path, smollm2_q4_path):
    server, env = site
    assert "not downloaded" in edgespec(env, "pairs").stdout

    proc = edgespec(env, "pull", "tiny")
    assert proc.returncode == 0, proc.stderr
    paths = dict(line.split(": ", 1) for line in proc.stdout.strip().splitlines())
    q4 = Path(paths["hub-smollm2-q4_1"])
    assert q4.is_relative_to(tmp_path / "hf" / "hub")
    assert hashlib.sha256(q4.read_bytes()).hexdigest() == \
        hashlib.sha256(smollm2_q4_path.read_bytes()).hexdigest()
    assert "pair check passed" in proc.stderr
    assert "`edgespec serve` offers it as 'tiny'" in proc.stderr     # the catalogue's name
    assert "tiny                 downloaded" in edgespec(env, "pairs").stdout

    # Offline: the cached pair is found and runs, and not one request reaches the hub.
    before = server.count()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    again = edgespec(offline, "pull", "tiny")
    assert again.returncode == 0, again.stderr
    assert again.stdout == proc.stdout
    # what `edgespec run/chat --pair tiny` and Engine.load(pair="tiny") resolve the pair with
    code = "from edgespec.registry import resolve_pair; print(*resolve_pair('tiny'), sep='\\n')"
    resolved = subprocess.run([sys.executable, "-c", code], env=offline, capture_output=True,
                              text=True)
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.split() == [paths["hub-smollm2-q4_1"], paths["hub-smollm2-q2_k"]]
    assert server.count() == before

    # rm frees the space; the pair is no longer listed as downloaded.
    rm = edgespec(env, "rm", "tiny")
    assert rm.returncode == 0, rm.stderr
    assert "hub-smollm2-q4_1: removed, 98.4 MB freed" in rm.stderr
    assert not q4.exists()
    assert "tiny                 not downloaded" in edgespec(env, "pairs").stdout


def test_a_pair_with_different_tokenizers_is_refused_after_pull(site, gemma_q4_path):
    server, env = site
    server.add_file(GEMMA_REPO, "gemma-3-270m.Q4_K_M.gguf", gemma_q4_path)
    assert_user_error(edgespec(env, "pull", "mismatched"), "not compatible",
                      "tokenizer types differ", "only 17.6% of the draft's tokens map to the "
                      "target's (drafting across vocabularies needs 50%)")


def test_a_draft_of_another_family_is_pulled_and_said_to_draft_across(site, gemma_q4_path):
    server, env = site
    server.add_file(GEMMA_REPO, "gemma-3-270m.Q4_K_M.gguf", gemma_q4_path)
    proc = edgespec(env, "pull", "across")
    assert proc.returncode == 0, proc.stderr
    assert ("pair check passed: draft and target use different vocabularies: 93.8% of the "
            "draft's tokens map to the target's; drafting across them; run `edgespec chat "
            "--pair across`") in proc.stderr
    assert "across               downloaded" in edgespec(env, "pairs").stdout


def test_offline_and_not_cached_names_the_command_that_downloads_it(site):
    server, env = site
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    assert_user_error(edgespec(offline, "pull", "tiny"), "HF_HUB_OFFLINE=1",
                      "run `edgespec pull hub-smollm2-q4_1`")
    assert_user_error(edgespec(offline, "run", "hi", "--pair", "tiny"),
                      "pair 'tiny' is not downloaded", "run `edgespec pull tiny`",
                      "HF_HUB_OFFLINE=1")
    assert_user_error(edgespec(offline, "pull", f"{REPO}/notes.bin"),
                      f"run `edgespec pull {REPO}/notes.bin`")
    assert server.count() == 0


def test_pull_any_single_file_by_repo_and_name(site, tmp_path):
    server, env = site
    proc = edgespec(env, "pull", f"{REPO}/notes.bin")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().split(": ", 1)[1])
    assert path.read_bytes() == b"a small synthetic file " * 100

    commit = server.repos[REPO].commit
    pinned = edgespec(env, "pull", f"{REPO}/notes.bin", "--revision", commit, "--pinned")
    assert pinned.returncode == 0, pinned.stderr


@pytest.mark.parametrize("args, fragments", [
    (["pull", "nobody/nothing-GGUF/x.gguf"], ["repository nobody/nothing-GGUF not found"]),
    (["pull", f"{REPO}/missing.gguf"], ["has no file 'missing.gguf'"]),
    (["pull", f"{REPO}/notes.bin", "--revision", "v9"], ["revision 'v9' not found"]),
    (["pull", f"{REPO}/notes.bin", "--pinned"], ["not a commit id"]),
    (["pull", f"{REPO}/../../etc/passwd"], ["refusing file name"]),
    (["pull", "tiny", "--revision", "abc"], ["--revision applies to REPO_ID/FILENAME"]),
    (["pull", "tinny"], ["unknown pair or model 'tinny'", "did you mean tiny"]),
    (["rm", "tinny"], ["did you mean tiny"]),
    (["pair"], ["required"]),
])
def test_user_errors_are_one_line(site, args, fragments):
    assert_user_error(edgespec(site[1], *args), *fragments)


def test_tampered_download_fails_with_both_hashes(site):
    server, env = site
    good = server.repos[REPO].files["notes.bin"].sha256
    bad_path = server.tamper(REPO, "notes.bin")
    bad = hashlib.sha256(bad_path.read_bytes()).hexdigest()
    assert_user_error(edgespec(env, "pull", f"{REPO}/notes.bin"), "sha256 mismatch", good, bad,
                      "deleted")


def test_pair_derive_builds_a_checked_self_speculative_draft(tmp_path, smollm2_q4_path):
    env = {**os.environ, "EDGESPEC_MODELS": str(tmp_path / "models")}
    out = tmp_path / "draft.gguf"
    proc = edgespec(env, "pair", "derive", smollm2_q4_path, "--quant", "Q2_K", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and proc.stdout.strip() == f"draft: {out}"
    assert "pair check passed" in proc.stderr
    assert f"edgespec chat --target {smollm2_q4_path} --draft {out}" in proc.stderr

    assert_user_error(edgespec(env, "pair", "derive", smollm2_q4_path, "--quant", "Q2_K",
                               "--out", out), "already exists", "--force")
    assert_user_error(edgespec(env, "pair", "derive", smollm2_q4_path, "--quant", "Q9"),
                      "unknown quantisation 'Q9'", "Q4_K_M")
    assert_user_error(edgespec(env, "pair", "derive", tmp_path / "none.gguf"), "no such file")


def test_pair_derive_chooses_the_draft_precision_by_measurement(tmp_path, smollm2_f32_path):
    """Without --quant, Q8_0, Q4_K_M and Q4_0 are derived and measured against the target:
    the one expected to be fastest is kept, the others deleted."""
    models = tmp_path / "models"
    env = {**os.environ, "EDGESPEC_MODELS": str(models)}
    proc = edgespec(env, "pair", "derive", smollm2_f32_path)
    assert proc.returncode == 0, proc.stderr
    expected = {q: float(re.search(rf"^{q}: agrees on [0-9.]+% .*, ([0-9.]+)x a whole request",
                                   proc.stderr, re.M).group(1))
                for q in ("Q8_0", "Q4_K_M", "Q4_0")}
    chosen = re.search(r"^chosen: (\S+) ", proc.stderr, re.M).group(1)
    assert expected[chosen] == max(expected.values())
    draft = models / f"SmolLM2-135M-Instruct.F32.draft-{chosen}.gguf"
    assert proc.stdout.strip() == f"draft: {draft}"
    assert [p.name for p in models.iterdir()] == [draft.name]     # the others deleted


CHOOSING = REGISTRY + """
[pairs.choosing]
target = "hub-smollm2-q4_1"
draft = "hub-smollm2-q2_k"
description = "SmolLM2-135M Q4_1 whose draft is chosen on this machine"
why = "draft_candidates: the first pull derives Q8_0 and measures it beside Q2_K"
draft_candidates = ["Q8_0"]
"""


def test_a_pair_pull_chooses_its_draft_on_this_machine_once(site, tmp_path):
    """`edgespec pull` of a pair with draft_candidates derives them, measures them beside the
    listed draft, and records the fastest: the pair resolves to it, `pairs` does not list it
    as a file of the user's own, a second pull does not measure again, and `rm` forgets it."""
    server, env = site
    registry = tmp_path / "choosing.toml"
    registry.write_text(CHOOSING)
    env = {**env, "EDGESPEC_REGISTRY": str(registry)}
    models = tmp_path / "models"
    proc = edgespec(env, "pull", "choosing")
    assert proc.returncode == 0, proc.stderr
    assert "choosing the draft of 'choosing' for this machine" in proc.stderr
    whole = {q: float(re.search(rf"^{q}: agrees on [0-9.]+% .*, ([0-9.]+)x a whole request",
                                proc.stderr, re.M).group(1)) for q in ("Q8_0", "Q2_K")}
    # The choice ranks the unrounded figures: on a tie as printed (two decimals) either may win.
    picked = re.search(r"^'choosing' drafts with (\S+) on this machine", proc.stderr,
                       re.M).group(1)
    best = "Q8_0" if picked.endswith("-draft-Q8_0.gguf") else "Q2_K"
    assert whole[best] == max(whole.values())
    code = "from edgespec.registry import resolve_pair; print(resolve_pair('choosing')[1])"
    resolved = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True).stdout.strip()
    lines = dict(line.split(": ", 1) for line in proc.stdout.strip().splitlines())
    if best == "Q8_0":
        chosen = models / "SmolLM2-135M-Instruct.Q4_1.choosing-draft-Q8_0.gguf"
        assert chosen.is_file() and resolved == str(chosen) == lines["draft"]
        listed = edgespec(env, "pairs").stdout
        assert "drafts with Q8_0 (chosen here)" in listed and str(chosen) in listed
        assert "your models" not in listed          # not a file of the user's own
    else:
        assert resolved == lines["hub-smollm2-q2_k"] and "draft" not in lines
    assert not [p for p in models.iterdir() if "candidate" in p.name]      # none left behind

    again = edgespec(env, "pull", "choosing")
    assert again.returncode == 0, again.stderr
    assert "choosing the draft" not in again.stderr and again.stdout == proc.stdout

    rm = edgespec(env, "rm", "choosing")
    assert rm.returncode == 0, rm.stderr
    assert not [p for p in models.iterdir() if p.suffix == ".gguf"]
    assert "choosing" not in (models / "draft-choices.json").read_text()


def test_a_recorded_draft_choice_counts_only_on_its_machine(tmp_path, monkeypatch):
    from edgespec.registry import draft_choice as choices, store
    registry = tmp_path / "choosing.toml"
    registry.write_text(CHOOSING)
    monkeypatch.setenv("EDGESPEC_REGISTRY", str(registry))
    monkeypatch.setenv("EDGESPEC_MODELS", str(tmp_path / "models"))
    (tmp_path / "models").mkdir()
    chosen = tmp_path / "models" / "derived.gguf"
    chosen.write_bytes(b"GGUF")
    choices.record_choice("choosing", {"quant": "Q8_0", "file": chosen.name})
    assert choices.chosen_draft("choosing") == chosen
    assert store.pair_draft_path("choosing") == chosen
    monkeypatch.setattr(choices, "machine_id", lambda: "another cpu")
    assert choices.chosen_draft("choosing") is None and choices.choice_record("choosing") is None
    assert store.pair_draft_path("choosing") == store.model_path("hub-smollm2-q2_k")
    assert choices.forget_choice("choosing") == 4 and not chosen.exists()


def test_expected_speedup_rewards_agreement_and_cheap_steps():
    from edgespec.registry.draft_choice import expected_speedup

    def rows(n):
        return 1 + 0.05 * (n - 1)
    assert expected_speedup(0.0, 0.1, rows) == (1.0, 0)
    x, k = expected_speedup(0.9, 0.3, rows)
    assert k >= 1 and x >= (1 + 0.9) / (0.3 + rows(2))          # at least K = 1's
    assert x < expected_speedup(0.95, 0.3, rows)[0]
    assert x < expected_speedup(0.9, 0.1, rows)[0]


def test_rm_removes_a_derived_draft_from_the_models_folder(tmp_path, smollm2_q4_path):
    models = tmp_path / "models"
    env = {**os.environ, "EDGESPEC_MODELS": str(models)}
    proc = edgespec(env, "pair", "derive", smollm2_q4_path, "--quant", "Q2_K")
    assert proc.returncode == 0, proc.stderr
    draft = models / "SmolLM2-135M-Instruct.Q4_1.draft-Q2_K.gguf"
    assert draft.is_file() and f"edgespec rm {draft.name}" in proc.stderr

    listed = edgespec(env, "pairs")
    assert listed.returncode == 0 and draft.name in listed.stdout

    proc = edgespec(env, "rm", draft.name)                  # by its file name
    assert proc.returncode == 0, proc.stderr
    assert not draft.exists() and f"{draft.name}: removed" in proc.stderr

    assert edgespec(env, "pair", "derive", smollm2_q4_path, "--quant", "Q2_K").returncode == 0
    proc = edgespec(env, "rm", draft.stem)                   # without .gguf
    assert proc.returncode == 0 and not draft.exists(), proc.stderr

    # A GGUF outside the models folder is the user's own: refused, and kept.
    elsewhere = tmp_path / "mine.gguf"
    elsewhere.write_bytes(smollm2_q4_path.read_bytes()[:1024])
    assert_user_error(edgespec(env, "rm", elsewhere), "is not in the models folder")
    assert elsewhere.is_file()
