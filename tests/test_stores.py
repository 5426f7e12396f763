"""Models other apps keep (edgespec/stores/), read where they are: real store layouts built in a
temporary folder from the real test models (an Ollama store of manifests and sha256-named
blobs, LM Studio's folders, llama.cpp's cache, a Hugging Face cache snapshot, a folder of
EDGESPEC_MODEL_DIRS), each with files llama.cpp cannot load. Their names are listed, loaded
(the Engine, `edgespec run`, `edgespec serve`) and refused with a reason, and at the end every
file in the stores is byte-identical, with no file added, removed or touched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from hubserver import sha256_of
from server_helpers import ServerProcess, post, request, stop_checked

pytestmark = pytest.mark.real

OLLAMA_LIBRARY = ("registry.ollama.ai", "library")
Q2K_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
LMS_Q2K = f"{Q2K_REPO}/SmolLM2-135M-Instruct-Q2_K.gguf"
LMS_MMPROJ = f"{Q2K_REPO}/mmproj-SmolLM2-135M-f16.gguf"
LMS_GEMMA = "google/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"
LLAMA_CPP_Q4 = "bartowski_SmolLM2-135M-Instruct-GGUF_SmolLM2-135M-Instruct-Q4_1"
HF_GEMMA = "unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf"
HF_ON_OLLAMA = "hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q2_K"
USABLE = {"smollm2:135m": "ollama", "jane/gemma3:270m": "ollama", HF_ON_OLLAMA: "ollama",
          LMS_Q2K: "lmstudio", LMS_GEMMA: "lmstudio", LLAMA_CPP_Q4: "llama.cpp",
          HF_GEMMA: "huggingface", "my-smollm": "folder"}
UNUSABLE = {"broken": "runs past the end of the file", "notes": "bad magic",
            "gone:1b": "is missing (a pull not finished?)",
            "jane/gemma3:270m (projector)": "vision projector",
            "gemma3:vision": "holds an image or audio encoder too",
            "llama3.2-vision:11b": "architecture 'mllama' is not one this llama.cpp knows",
            LMS_MMPROJ: "vision projector"}


def tiny_gguf(path: Path, arch: str, tensors: tuple[str, ...], general_type: str = "") -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    if general_type:
        w.add_type(general_type)
    w.add_token_list([b"<s>", b"</s>", b"a", b"b"])
    for name in tensors:
        w.add_tensor(name, np.ones((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Ollama:
    """An Ollama store as Ollama writes it: blobs named by their sha256, manifests by name."""

    def __init__(self, home: Path):
        self.home = home
        (home / "blobs").mkdir(parents=True)

    def blob(self, source: Path | bytes) -> tuple[str, int, Path]:
        """(digest, size, path) of a blob made of ``source`` (a file, linked; or bytes)."""
        if isinstance(source, bytes):
            digest, size = hashlib.sha256(source).hexdigest(), len(source)
        else:
            digest, size = sha256_of(source), source.stat().st_size
        path = self.home / "blobs" / f"sha256-{digest}"
        if not path.exists():
            if isinstance(source, bytes):
                path.write_bytes(source)
            else:
                os.link(source, path)
        return f"sha256:{digest}", size, path

    def model(self, name: tuple[str, str, str, str], model: Path | bytes | None,
              projector: Path | None = None, missing: bool = False) -> Path:
        layers = []
        if model is not None:
            digest, size, path = self.blob(model)
            if missing:
                path.unlink()
            layers.append({"mediaType": "application/vnd.ollama.image.model",
                           "digest": digest, "size": size})
        for kind, text in (("template", "{{ .Prompt }}"), ("params", '{"stop": ["<|im_end|>"]}'),
                           ("license", "Apache License 2.0")):
            digest, size, _ = self.blob(text.encode())
            layers.append({"mediaType": f"application/vnd.ollama.image.{kind}",
                           "digest": digest, "size": size})
        if projector is not None:
            digest, size, _ = self.blob(projector)
            layers.append({"mediaType": "application/vnd.ollama.image.projector",
                           "digest": digest, "size": size})
        config, size, _ = self.blob(json.dumps({"model_format": "gguf",
                                                "model_family": "llama"}).encode())
        manifest = {"schemaVersion": 2,
                    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                               "digest": config, "size": size},
                    "layers": layers}
        path = self.home / "manifests" / Path(*name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest))
        return path


def state(folders) -> dict:
    """Every file and folder under ``folders``: (size, mtime_ns, inode, sha256 of a file)."""
    hashes: dict[tuple[int, int], str] = {}         # hard links are hashed once
    out = {}
    for top in folders:
        for folder, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                p = Path(folder) / name
                st = p.lstat()
                digest = None
                if p.is_file() and not p.is_symlink():
                    digest = hashes.get((st.st_dev, st.st_ino)) or sha256_of(p)
                    hashes[(st.st_dev, st.st_ino)] = digest
                out[str(p)] = (st.st_size, st.st_mtime_ns, st.st_ino, digest)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory, smollm2_q4_path, smollm2_q2k_path, gemma_q4_path):
    """The stores, and the environment that points edgespec at them (and at nothing else)."""
    root = tmp_path_factory.mktemp("stores")
    originals = root / "originals"          # copies: a store's files are links to these
    originals.mkdir()
    q4, q2k, gemma = (Path(shutil.copyfile(p, originals / p.name))
                      for p in (smollm2_q4_path, smollm2_q2k_path, gemma_q4_path))
    projector = tiny_gguf(originals / "mmproj.gguf", "clip", ("mm.0.weight",), "mmproj")
    with_vision = tiny_gguf(originals / "vision.gguf", "gemma3",
                            ("token_embd.weight", "v.blk.0.attn_q.weight"))
    unknown = tiny_gguf(originals / "mllama.gguf", "mllama", ("token_embd.weight",))

    ollama = Ollama(root / "ollama")
    ollama.model((*OLLAMA_LIBRARY, "smollm2", "135m"), q4)
    ollama.model(("registry.ollama.ai", "jane", "gemma3", "270m"), gemma, projector=projector)
    ollama.model(("hf.co", "bartowski", "SmolLM2-135M-Instruct-GGUF", "Q2_K"), q2k)
    ollama.model((*OLLAMA_LIBRARY, "broken", "latest"), q4.read_bytes()[:3_000_000])
    ollama.model((*OLLAMA_LIBRARY, "notes", "latest"), b"my notes, not a model " * 10)
    ollama.model((*OLLAMA_LIBRARY, "gone", "1b"), b"a pull that stopped", missing=True)
    ollama.model((*OLLAMA_LIBRARY, "gemma3", "vision"), with_vision)
    ollama.model((*OLLAMA_LIBRARY, "llama3.2-vision", "11b"), unknown)

    home = root / "home"
    for store, name, source in ((".lmstudio", LMS_Q2K, q2k), (".lmstudio", LMS_MMPROJ, projector),
                                (".cache/lm-studio", LMS_GEMMA, gemma)):
        path = home / store / "models" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, path)

    llama_cache = root / "llama.cpp"
    llama_cache.mkdir()
    os.link(q4, llama_cache / f"{LLAMA_CPP_Q4}.gguf")
    (llama_cache / f"{LLAMA_CPP_Q4}.gguf.json").write_text('{"etag": "x"}')   # its sidecar

    hub = root / "hub"
    repo = hub / "models--unsloth--gemma-3-270m-it-GGUF"
    rev = "a" * 40
    (repo / "blobs").mkdir(parents=True)
    os.link(gemma, repo / "blobs" / sha256_of(gemma))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    (snapshot / Path(HF_GEMMA).name).symlink_to(Path("../../blobs") / sha256_of(gemma))

    folder, late = root / "folder", root / "late"
    folder.mkdir()
    late.mkdir()
    os.link(q2k, folder / "my-smollm.gguf")
    (root / "models").mkdir()
    env = {"HOME": str(home), "OLLAMA_MODELS": str(ollama.home), "LLAMA_CACHE": str(llama_cache),
           "HF_HUB_CACHE": str(hub), "EDGESPEC_MODELS": str(root / "models"),
           "EDGESPEC_MODEL_DIRS": os.pathsep.join((str(folder), str(late))),
           # the real cache: this CPU's checks are kept there (llama.cpp's and the hub's
           # caches are the ones above)
           "XDG_CACHE_HOME": str(Path(os.environ.get("XDG_CACHE_HOME")
                                      or Path.home() / ".cache"))}
    watched = [ollama.home, home / ".lmstudio", home / ".cache" / "lm-studio", llama_cache,
               hub, folder]
    yield {"env": env, "root": root, "late": late, "watched": watched,
           "before": state(watched), "ollama": ollama, "q4": q4}


@pytest.fixture(autouse=True)
def _pointed_at_the_stores(stores, monkeypatch):
    for key, value in stores["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EDGESPEC_STORES")


def ours(files, root: Path) -> dict:
    """The files of ``files`` under the tests' stores (a machine may have its own: the Linux
    service's Ollama store), by name."""
    return {f.name: f for f in files if str(f.path).startswith(str(root))}


def edgespec(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """The command line, in this test's environment (pointed at the stores)."""
    return subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_every_store_lists_its_models_by_their_apps_names_and_why_not(stores):
    from edgespec.catalogue import find_entry, scan_catalog
    from edgespec.stores import store_files
    files = ours(store_files(), stores["root"])
    assert {n for n, f in files.items() if not f.problem} == set(USABLE)
    for name, store in USABLE.items():
        assert files[name].store == store, files[name]
    for name, why in UNUSABLE.items():
        assert why in files[name].problem, files[name]
    assert set(files) == set(USABLE) | set(UNUSABLE)
    blob = files["smollm2:135m"].path          # the blob itself, by its sha256
    assert blob.parent == stores["ollama"].home / "blobs" and blob.name.startswith("sha256-")
    assert files[LMS_Q2K].short == ("SmolLM2-135M-Instruct-Q2_K", "SmolLM2-135M-Instruct-GGUF")

    catalog = scan_catalog()
    assert set(USABLE) <= set(catalog) and not set(UNUSABLE) & set(catalog)
    entry = catalog["smollm2:135m"]
    assert (entry.store, entry.target, entry.kind) == ("ollama", blob, "gguf")
    assert entry.details["quantization_level"] == "Q4_1"
    for asked, name in (("smollm2:135m", "smollm2:135m"), ("SmolLM2:135M", "smollm2:135m"),
                        ("broken:latest", None), ("SmolLM2-135M-Instruct-Q2_K", LMS_Q2K),
                        ("gemma-3-270m-it-GGUF", HF_GEMMA), ("my-smollm:latest", "my-smollm"),
                        (f"{HF_ON_OLLAMA}", HF_ON_OLLAMA)):
        found = find_entry(catalog, asked)
        assert (found.name if found else None) == name, asked


def test_the_engine_loads_an_ollama_model_by_its_name(stores):
    from edgespec import Engine, SamplingParams
    from edgespec.errors import ModelLoadError, ModelNotFoundError
    with Engine.load(target="smollm2:135m", drafter="none", n_ctx=256) as eng:
        assert eng.target.path.parent == stores["ollama"].home / "blobs"     # not a copy
        out = eng.generate("The capital of France is", max_tokens=4,
                           sampling=SamplingParams(temperature=0.0), raw=True)
        assert out.text.strip()
    with pytest.raises(ModelLoadError, match=r"'broken' \(Ollama: .*past the end of the file"):
        Engine.load(target="broken")
    with pytest.raises(ModelNotFoundError) as e:
        Engine.load(target="nosuch:1b")
    assert f"Ollama ({stores['ollama'].home})" in str(e.value) and "edgespec pairs" in str(e.value)


def one_error_line(proc) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_the_command_line_runs_lists_and_refuses_them(stores):
    run = edgespec("run", "The capital of France is", "--target", "smollm2:135m",
                   "--no-spec", "--raw", "--max-tokens", "4", "--temperature", "0",
                   "--ctx-size", "256")
    assert run.returncode == 0 and run.stdout.strip(), run.stderr
    error = one_error_line(edgespec("run", "hi", "--target", "nosuch:1b"))
    assert "no model 'nosuch:1b'" in error and str(stores["ollama"].home) in error
    assert "`edgespec pairs`" in error
    error = one_error_line(edgespec("run", "hi", "--target", "notes"))
    assert "'notes' (Ollama: " in error and "bad magic" in error
    error = one_error_line(edgespec("rm", "smollm2:135m"))
    assert "never changes another app's store" in error and "ollama rm smollm2:135m" in error

    pairs = edgespec("pairs")
    assert pairs.returncode == 0, pairs.stderr
    lines = pairs.stdout.splitlines()
    for name in USABLE:
        assert any(line.split()[:1] == [name] and "unusable" not in line for line in lines), name
    for name, why in UNUSABLE.items():
        assert any(line.strip().startswith(name) and "unusable: " in line and why in line
                   for line in lines), (name, pairs.stdout)


def test_the_server_lists_serves_and_keeps_them(stores):
    s = ServerProcess("--target", "smollm2:135m", "--drafter", "none", "--ctx-size", "256")
    try:
        status, _, body = request(s.port, "GET", "/api/tags")
        tags = {m["name"]: m for m in json.loads(body)["models"]}
        listed = {n.removesuffix(":latest") for n in tags}
        assert set(USABLE) <= listed and not set(UNUSABLE) & listed
        ollama = tags["smollm2:135m"]["edgespec"]
        assert ollama["store"] == "ollama" and "/blobs/sha256-" in ollama["path"]
        status, _, body = request(s.port, "GET", "/v1/models")
        cards = {c["id"]: c for c in json.loads(body)["data"]}
        assert set(USABLE) <= set(cards)
        assert cards[LMS_Q2K]["edgespec"]["store"] == "lmstudio"
        assert cards["smollm2:135m"]["edgespec"]["loaded"] is True

        status, reply = post(s.port, "/v1/chat/completions",
                             {"model": "SmolLM2-135M-Instruct-Q2_K", "max_tokens": 3,
                              "messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200 and reply["choices"][0]["message"]["content"], reply
        status, reply = post(s.port, "/api/generate", {"model": "broken", "prompt": "x"})
        assert status == 404, reply
        status, _, body = request(s.port, "DELETE", "/api/delete",
                                  json.dumps({"model": "smollm2:135m"}).encode())
        assert status == 400 and b"never changes it" in body, body

        os.link(stores["q4"], stores["late"] / "late-arrival.gguf")  # a store changes
        status, reply = post(s.port, "/api/show", {"model": "late-arrival"})
        assert status == 200 and reply["edgespec"]["store"] == "folder", reply
    finally:
        stop_checked(s)


def test_nothing_in_the_stores_changed(stores):
    assert state(stores["watched"]) == stores["before"]
