"""Ollama's model endpoints in this process, without a model: `/api/delete` and `/api/copy`
over a ModelManager of fake Engines and small files in a models folder of the test's own, and
a pull's worker thread (`model_store.Pull`) with a fake download: its statuses, and stopping
it. tests/test_ollama_pull.py runs them all for real, with the `ollama` client and a hub."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import anyio
import pytest
from starlette.testclient import TestClient

from edgespec.catalogue import CatalogEntry
from edgespec.registry.downloads import DownloadCancelled, Progress
from edgespec.server.app import create_app
from edgespec.server.model_store import Pull, Target, status_of
from edgespec.server.models import ModelManager

SHA = "ab" * 32


class FakeEngine:
    """What the manager needs of an Engine, and a load request (Ollama's, with no prompt)."""

    n_ctx = 64
    target = SimpleNamespace(token_bytes=lambda token: b"")

    def __init__(self):
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def site(tmp_path, monkeypatch):
    """(client, manager, models folder): the server started with ``started.gguf``; ``other``
    and ``third`` are files of the models folder too."""
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv("EDGESPEC_MODELS", str(folder))
    entries = {}
    for name in ("started", "other", "third"):
        (folder / f"{name}.gguf").write_bytes(b"GGUF" + name.encode())
        entries[name] = CatalogEntry(name, folder / f"{name}.gguf", None, "gguf", 10, 0.0,
                                     {"format": "gguf"}, "0" * 64)
    manager = ModelManager(lambda: {n: e for n, e in entries.items()
                                    if e.target.is_file()},
                           lambda entry, n_ctx: FakeEngine(), preloaded=("started", FakeEngine()),
                           max_loaded=2, keep_alive=-1)
    client = TestClient(create_app(manager=manager, n_ctx=64), base_url="http://127.0.0.1")
    return client, manager, folder


def tags(client) -> set[str]:
    return {m["name"] for m in client.get("/api/tags").json()["models"]}


def delete(client, name: str):
    return client.request("DELETE", "/api/delete", json={"model": name})


def test_delete_unloads_then_removes_and_refuses_the_started_model(site):
    client, manager, folder = site
    assert client.post("/api/generate", json={"model": "other"}).status_code == 200  # loaded
    engine = manager.engine_for("other")
    assert engine is not None and {m.name for m in manager.loaded()} == {"started", "other"}

    r = delete(client, "other:latest")
    assert r.status_code == 200 and engine.closed and not (folder / "other.gguf").exists()
    assert "other:latest" not in tags(client)               # seen at once
    r = delete(client, "other")
    assert r.status_code == 404 and set(r.json()) == {"error"}

    r = delete(client, "started")
    assert r.status_code == 400 and "started with" in r.json()["error"]
    assert (folder / "started.gguf").is_file()
    r = client.request("DELETE", "/api/delete", json={"model": "x", "extra": 1})
    assert r.status_code == 400 and "extra" in r.json()["error"]


def test_copy_names_the_same_model_and_delete_forgets_the_name(site):
    client, manager, folder = site
    assert client.post("/api/copy", json={"source": "third", "destination": "mine"}
                       ).status_code == 200
    assert {"third:latest", "mine:latest"} <= tags(client)
    assert manager.resolve("mine:latest").name == "third"   # one model, one Engine
    for body, status in (({"source": "nope", "destination": "x"}, 404),
                         ({"source": "third", "destination": "other"}, 400),
                         ({"source": "third"}, 400),
                         ({"source": "third", "destination": "a b"}, 400)):
        r = client.post("/api/copy", json=body)
        assert r.status_code == status and set(r.json()) == {"error"}, r.json()
    assert client.post("/api/copy", json={"source": "other", "destination": "mine"}
                       ).status_code == 200                  # a copy's name is reused
    assert manager.resolve("mine").name == "other"
    assert delete(client, "mine").status_code == 200
    assert "mine:latest" not in tags(client) and (folder / "other.gguf").is_file()


def test_a_name_here_that_no_registry_knows_is_pulled_at_once(site):
    client, manager, folder = site
    lines = client.post("/api/pull", json={"model": "third"}).text.splitlines()
    assert lines == ['{"status":"pulling manifest"}', '{"status":"success"}']
    r = client.post("/api/pull", json={"model": "nowhere-to-be-found"})
    assert r.status_code == 404 and "edgespec pairs" in r.json()["error"]


# ---------------------------------------------------------------------------------------------
# A pull's worker thread


def test_statuses_of_progress():
    assert status_of(Progress("f.gguf", SHA, 5, 10)) == {
        "status": f"pulling {SHA[:12]}", "digest": f"sha256:{SHA}", "total": 10,
        "completed": 5}
    assert status_of(Progress("f.gguf", None, 0, None)) == {"status": "pulling f.gguf"}
    assert status_of(Progress("f.gguf", SHA, 10, 10, verifying=True)) == {
        "status": "verifying sha256 digest"}


def test_a_pull_reports_each_change_once_then_ends():
    def fetch(target, progress):
        for done in (0, 4, 4, 8, 10):
            progress(Progress("f.gguf", SHA, done, 10))
        progress(Progress("f.gguf", SHA, 10, 10, verifying=True))

    async def main():
        pull = Pull(Target("model", "m"), fetch)
        got = [s async for s in pull.statuses()]
        await pull.finished()
        return got, pull.running

    got, running = anyio.run(main)
    assert [s.get("completed") for s in got] == [0, 4, 8, 10, None] and not running


def test_a_cancelled_pull_stops_at_its_next_report():
    seen, go = [], threading.Event()

    def fetch(target, progress):
        progress(Progress("f.gguf", SHA, 0, 10))
        go.wait(30)                     # the next chunk comes once the pull is cancelled
        try:
            progress(Progress("f.gguf", SHA, 5, 10))
        except DownloadCancelled as e:
            seen.append(e)
            raise

    async def main():
        pull = Pull(Target("model", "m"), fetch)
        statuses = pull.statuses()
        first = await statuses.__anext__()
        pull.cancel()
        go.set()
        with pytest.raises(DownloadCancelled):
            async for _ in statuses:
                pass
        await pull.finished()
        return first

    assert anyio.run(main)["completed"] == 0 and len(seen) == 1
