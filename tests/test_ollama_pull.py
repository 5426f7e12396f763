"""Models managed through Ollama's API (`/api/pull`, `/api/delete`, `/api/copy`) as Ollama's
clients use them: a real `edgespec serve` process, the official `ollama` client, and the real
hub client in the server talking HTTP to a local hub (tests/hubserver.py) through
HF_ENDPOINT, with a registry (EDGESPEC_REGISTRY) whose models are the SmolLM2 files published
on that hub. Progress as Ollama's status objects, the pulled model answering at once, a pull
whose client goes away stopped with nothing half-written and continued by the next pull,
deletions and copies."""

from __future__ import annotations

import http.client
import json
import re

import ollama
import pytest

from hubserver import FakeHub
from server_helpers import ServerProcess, request, wait_until

REPO = "edgespec-test/SmolLM2-135M-Instruct-GGUF"
TARGET, DRAFT = "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q2_K.gguf"
REGISTRY = f"""
[models.hub-smollm2-q4_1]
approx_gb = 0.1
license = "Apache-2.0"
source = {{ kind = "hub", repo = "{REPO}", filename = "{TARGET}", revision = "main" }}

[models.hub-smollm2-q2_k]
approx_gb = 0.09
license = "Apache-2.0"
source = {{ kind = "hub", repo = "{REPO}", filename = "{DRAFT}", revision = "main" }}

[models.hub-altered]
approx_gb = 0.01
license = "Apache-2.0"
source = {{ kind = "hub", repo = "{REPO}", filename = "altered.gguf", revision = "main" }}

[pairs.tiny]
target = "hub-smollm2-q4_1"
draft = "hub-smollm2-q2_k"
description = "SmolLM2-135M Q4_1 drafted by its own Q2_K weights, from the local hub"
why = "self-speculative test pair"
"""
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def site(tmp_path_factory, smollm2_q4_path, smollm2_q2k_path, smollm2_f16_path):
    """(hub, server, client, the folder holding the server's hub cache ``hf/`` and models
    folder ``models/``): the server starts with a model of its own (F16), outside its empty
    models folder."""
    tmp = tmp_path_factory.mktemp("pull")
    with FakeHub(tmp / "hub") as hub:
        hub.add_file(REPO, TARGET, smollm2_q4_path)
        hub.add_file(REPO, DRAFT, smollm2_q2k_path)
        hub.add_file(REPO, "notes.bin", b"not a model " * 100)
        hub.add_file(REPO, "altered.gguf", b"GGUF" + bytes(range(256)) * 64)
        hub.tamper(REPO, "altered.gguf")            # served with a byte flipped
        (tmp / "pairs.toml").write_text(REGISTRY)
        env = hub.env(tmp / "hf", EDGESPEC_MODELS=str(tmp / "models"),
                      EDGESPEC_REGISTRY=str(tmp / "pairs.toml"))
        server = ServerProcess("--target", smollm2_f16_path, "--ctx-size", 512,
                               "--max-loaded", 1, env=env)
        try:
            client = ollama.Client(host=f"http://127.0.0.1:{server.port}", timeout=300)
            yield hub, server, client, tmp
        finally:
            hub.release()
            rc = server.stop()
    log = server.log()
    assert rc in (0, 130) and "Traceback" not in log and "Exception" not in log, log
    # the only 5xx: the altered file's pull, answered 502 (test_a_failed_pull_ends_with_…)
    assert all('"POST /api/pull HTTP/1.1" 502' in line for line in log.splitlines()
               if re.search(r'HTTP/1\.1" 5\d\d', line)), log


def names(client) -> set[str]:
    return {m.model for m in client.list().models}


def digests(hub, *files: str) -> dict[str, int]:
    """Ollama's digest of each published file, and its size."""
    return {f"sha256:{hub.repos[REPO].files[f].sha256}": hub.repos[REPO].files[f].size
            for f in files}


def partials(tmp) -> list:
    """Files being written: the hub client's partial transfers, the models folder's."""
    return sorted([*tmp.rglob("*.incomplete"), *tmp.rglob("*.partial")])


def ggufs(tmp) -> list[str]:
    """The GGUF files the hub cache and the models folder show (links to blobs included)."""
    return sorted(p.name for p in tmp.rglob("*.gguf*") if p.relative_to(tmp).parts[0] != "hub")


def test_a_pull_streams_progress_and_the_model_answers_at_once(site):
    hub, server, client, tmp = site
    assert "tiny:latest" not in names(client)
    statuses = list(client.pull("tiny:latest", stream=True))
    assert statuses[0].status == "pulling manifest" and statuses[-1].status == "success"
    assert "verifying sha256 digest" in [s.status for s in statuses]
    files = digests(hub, TARGET, DRAFT)
    seen: dict[str, list[int]] = {}
    for s in statuses:
        if s.digest:
            assert s.status == f"pulling {s.digest[7:19]}" and s.total == files[s.digest]
            seen.setdefault(s.digest, []).append(s.completed)
    assert set(seen) == set(files)
    for digest, done in seen.items():
        assert done == sorted(done) and done[-1] == files[digest] and len(done) > 2, done

    assert "tiny:latest" in names(client)                  # listed at once
    r = client.chat("tiny", CHAT, options=GREEDY)
    assert r.message.content and r.eval_count <= 8

    before = len(hub.cdn_gets())
    again = client.pull("tiny", stream=False)               # all here: nothing transferred
    assert again.status == "success" and len(hub.cdn_gets()) == before


def test_copy_is_another_name_until_deleted(site):
    hub, server, client, tmp = site
    assert client.copy("tiny", "my-tiny:latest").status == "success"
    assert {"tiny:latest", "my-tiny:latest"} <= names(client)
    r = client.chat("my-tiny", CHAT, options=GREEDY)
    assert r.message.content == client.chat("tiny", CHAT, options=GREEDY).message.content
    for source, dest, status in (("no-such-model", "x", 404), ("tiny", "tiny", 400),
                                 ("tiny", "bad name!", 400)):
        with pytest.raises(ollama.ResponseError) as e:
            client.copy(source, dest)
        assert e.value.status_code == status
    assert client.delete("my-tiny").status == "success"    # the name goes, the files stay
    assert "my-tiny:latest" not in names(client) and "tiny:latest" in names(client)


def test_delete_removes_the_files_then_404(site):
    hub, server, client, tmp = site
    client.pull("tiny", stream=False)
    assert client.delete("tiny").status == "success"
    assert "tiny:latest" not in names(client) and ggufs(tmp) == []
    for call in (lambda: client.delete("tiny"), lambda: client.chat("tiny", CHAT),
                 lambda: client.delete("no-such-model")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:      # the server's own model: kept
        client.delete("SmolLM2-135M-Instruct.F16")
    assert e.value.status_code == 400 and "started with" in e.value.error
    assert "SmolLM2-135M-Instruct.F16:latest" in names(client)


def pull_lines(port: int, body: dict):
    """Open a streamed pull and return (connection, a reader of its NDJSON objects)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/api/pull", json.dumps(body).encode())
    resp = conn.getresponse()
    assert resp.status == 200

    def objects():
        while line := resp.readline():
            yield json.loads(line)
    return conn, objects()


def test_a_pull_whose_client_goes_away_stops_and_the_next_continues(site):
    hub, server, client, tmp = site
    client.pull("hub-smollm2-q4_1", stream=False)          # the pair's target is here
    gets = len(hub.cdn_gets())
    draft = next(iter(digests(hub, DRAFT)))
    hub.stall_after = 15 << 20                              # the draft's transfer stalls

    conn, lines = pull_lines(server.port, {"model": "tiny"})
    for obj in lines:
        assert "error" not in obj, obj
        if obj.get("digest") == draft and obj["completed"] > 0:
            break                                           # its first chunk is written
    conn.close()                                            # the client goes away
    wait_until(lambda: "pull stopped" in server.log(), timeout=30)
    hub.release()                                           # the transfer moves: it stops
    wait_until(lambda: "tiny: the pull ended" in server.log(), timeout=60)

    assert partials(tmp) == [] and "tiny:latest" not in names(client)
    assert ggufs(tmp) == [TARGET]                          # no draft, whole or not
    statuses = list(client.pull("tiny", stream=True))       # continues: only the draft moves
    assert statuses[-1].status == "success" and "tiny:latest" in names(client)
    moved = hub.cdn_gets()[gets:]
    assert len(moved) == 2 and all(g.path.endswith(draft[7:]) for g in moved)


def test_names_it_cannot_pull(site):
    hub, server, client, tmp = site
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("tinny")
    assert e.value.status_code == 404 and "did you mean tiny" in e.value.error
    for name in (f"{REPO}/../../etc/passwd", ""):
        with pytest.raises((ollama.ResponseError, ValueError)):
            client.pull(name)
    # a file of the hub: pulled as `edgespec pull` pulls it; served by its name if a model
    assert client.pull(f"{REPO}/notes.bin").status == "success"
    assert client.pull(f"{REPO}/{DRAFT}").status == "success"
    assert f"{REPO}/{DRAFT}:latest" in names(client) and f"{REPO}/notes.bin" not in str(
        names(client))
    status, _, data = request(server.port, "POST", "/api/pull", b'{"model": 5}')
    assert status == 400 and set(json.loads(data)) == {"error"}


def test_a_failed_pull_ends_with_an_error(site):
    hub, server, client, tmp = site
    with pytest.raises(ollama.ResponseError) as e:
        for _ in client.pull("hub-altered", stream=True):
            pass
    assert "sha256 mismatch" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("hub-altered", stream=False)
    assert e.value.status_code == 502 and "sha256 mismatch" in e.value.error
    assert partials(tmp) == [] and "hub-altered:latest" not in names(client)


def own_gguf(source, folder, name: str):
    """A plain GGUF file ``name`` in the models ``folder``: a hard link to ``source`` (deleting
    it leaves ``source``), or a copy across file systems."""
    import os
    import shutil
    folder.mkdir(exist_ok=True)
    try:
        os.link(source, folder / name)
    except OSError:
        shutil.copyfile(source, folder / name)


STARTED = "SmolLM2-135M-Instruct.F16:latest"           # the model the server started with


def test_every_listed_name_answers_show_chat_copy_and_delete(site, smollm2_q2k_path):
    hub, server, client, tmp = site
    assert client.pull("hub-smollm2-q4_1").status == "success"     # a registry model
    assert client.pull(f"{REPO}/{DRAFT}").status == "success"      # a hub file
    own_gguf(smollm2_q2k_path, tmp / "models", "own-model.gguf")    # a plain GGUF
    assert client.copy("hub-smollm2-q4_1:latest", "a-copy").status == "success"
    kinds = ["a-copy:latest", f"{REPO}/{DRAFT}:latest", "own-model:latest",
             "hub-smollm2-q4_1:latest"]
    assert {*kinds, STARTED} <= names(client), names(client)
    for i, name in enumerate([*kinds, STARTED]):
        assert client.show(name).details.format == "gguf", name
        r = client.chat(name, CHAT, options={"temperature": 0, "num_predict": 2})
        assert r.done and r.model == name and r.eval_count <= 2, name
        other = f"copy-{i}:latest"
        assert client.copy(name, other).status == "success" and other in names(client)
        assert client.show(other).details.format == "gguf"
        assert client.delete(other).status == "success" and other not in names(client)
    for name in kinds:
        assert client.delete(name).status == "success", name
        assert name not in names(client)
        with pytest.raises(ollama.ResponseError) as e:
            client.delete(name)
        assert e.value.status_code == 404 and "not found" in e.value.error, e.value.error
    assert not (tmp / "models" / "own-model.gguf").exists() and smollm2_q2k_path.is_file()
    with pytest.raises(ollama.ResponseError) as e:              # listed, not removed here
        client.delete(STARTED)
    assert e.value.status_code == 400 and "started with" in e.value.error


BAD_NAMES = ["no-such-model", "no-such-model:7b", f"{REPO}/no-such.gguf:latest",
             f"{REPO}/../../etc/passwd", f"{REPO}/", "a//b/c", "x" * 300, "~nobody-here/x.gguf",
             "back\\slash/x/y", "/etc/passwd", "../outside", f"{REPO}/x.gguf@..", "nul\0x"]


def test_names_typed_wrong_are_4xx_in_one_line(site):
    hub, server, client, tmp = site
    calls = {"show": client.show, "delete": client.delete,
             "chat": lambda n: client.chat(n, CHAT, options={"num_predict": 1}),
             "copy": lambda n: client.copy(n, "some-copy")}
    for name in BAD_NAMES:
        for what, call in calls.items():
            with pytest.raises(ollama.ResponseError) as e:
                call(name)
            status, message = e.value.status_code, e.value.error
            assert status in (400, 404), (what, name, status, message)
            assert message and "\n" not in message, (what, name, message)
            if status == 404 and what != "delete":
                assert "pull" in message, (what, name, message)
    assert "some-copy:latest" not in names(client)
    check_log_4xx_only(server)


def check_log_4xx_only(server) -> None:
    """No 5xx but the altered file's pull (502), no traceback."""
    log = server.log()
    assert "Traceback" not in log, log
    assert all('"POST /api/pull HTTP/1.1" 502' in line for line in log.splitlines()
               if re.search(r'HTTP/1\.1" 5\d\d', line)), log
