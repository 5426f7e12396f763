"""edgespec/server/models.py: the catalog of models on disk and the manager that loads them on
demand. The scheduling rules (one load for concurrent requests, eviction order, waiting for a
lease, keep-alive, failures) run on fake engines; the catalog and one load-and-evict cycle run
on the real SmolLM2 files."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import anyio
import pytest

from edgespec.errors import EdgespecError, EngineClosedError, InvalidParameterError, ModelLoadError
from edgespec.catalogue import CatalogEntry, ModelNotFound, entry_for, find_entry, scan_catalog
from edgespec.server.models import ModelManager


class FakeEngine:
    """What the manager needs of an Engine: n_ctx and close()."""

    n_ctx = 100

    def __init__(self, name: str, n_ctx: int | None = None):
        self.name = name
        self.closed = False
        self.n_ctx = n_ctx or FakeEngine.n_ctx

    def close(self) -> None:
        self.closed = True


def fake_entry(name: str, size: int = 1000, kv: int = 0, file: str | None = None,
               trained: int = 0) -> CatalogEntry:
    return CatalogEntry(name, Path("/nowhere") / (file or f"{name}.gguf"), None, "gguf", size,
                        0.0, {"format": "gguf"}, "0" * 64, kv, trained)


class Loader:
    """A fake ``load``: records what it loaded, can take time, can fail."""

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.delay, self.fail = delay, fail
        self.loads: list[str] = []
        self.contexts: list[int | None] = []     # each load's n_ctx
        self.engines: dict[str, FakeEngine] = {}

    def __call__(self, entry: CatalogEntry, n_ctx: int | None = None) -> FakeEngine:
        self.loads.append(entry.name)
        self.contexts.append(n_ctx)
        time.sleep(self.delay)
        if self.fail:
            raise ModelLoadError(entry.target, "not a valid GGUF model (bad magic)")
        self.engines[entry.name] = FakeEngine(entry.name, n_ctx)
        return self.engines[entry.name]


def manager(names=("a", "b", "c"), loader=None, **kw) -> tuple[ModelManager, Loader]:
    entries = {n: fake_entry(n) for n in names} if isinstance(names, tuple) else names
    loader = loader or Loader()
    kw.setdefault("keep_alive", -1)
    return ModelManager(lambda: dict(entries), loader, **kw), loader


# ---------------------------------------------------------------------------------------------
# Scheduling


def test_concurrent_requests_for_one_model_wait_for_one_load():
    mgr, loader = manager(loader=Loader(delay=0.3))
    leases = []

    async def request():
        async with mgr.acquire("a") as lease:
            leases.append(lease)
            await anyio.sleep(0.05)

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(request)
        await mgr.close()

    anyio.run(main)
    assert loader.loads == ["a"]
    assert len({id(lease.engine) for lease in leases}) == 1
    assert all(lease.load_seconds >= 0.2 for lease in leases)   # each waited for the load
    assert leases[0].name == "a" and leases[0].entry.name == "a"


def test_a_loaded_model_is_leased_without_loading_again():
    mgr, loader = manager()

    async def main():
        async with mgr.acquire("a") as first:
            pass
        async with mgr.acquire("a:latest") as second:
            assert second.engine is first.engine and second.load_seconds == 0
        assert mgr.engine_for("a") is first.engine and mgr.engine_for("b") is None
        await mgr.close()
        assert first.engine.closed

    anyio.run(main)
    assert loader.loads == ["a"]


def test_a_failed_load_reaches_every_waiter_and_leaves_nothing_behind():
    loader = Loader(delay=0.2, fail=True)
    mgr, _ = manager(loader=loader)
    errors = []

    async def request():
        try:
            async with mgr.acquire("a"):
                raise AssertionError("the load should have failed")
        except ModelLoadError as e:
            errors.append(e)

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(request)
        assert mgr.loaded() == [] and mgr.engine_for("a") is None
        loader.fail = False                       # the next request tries again
        async with mgr.acquire("a") as lease:
            assert lease.engine.name == "a"
        await mgr.close()

    anyio.run(main)
    assert len(errors) == 3 and "bad magic" in str(errors[0])
    assert loader.loads == ["a", "a"]


def test_loading_evicts_the_least_recently_used_idle_model():
    mgr, loader = manager(max_loaded=2)

    async def main():
        for name in ("a", "b", "a", "c"):
            async with mgr.acquire(name):
                await anyio.sleep(0.01)
        assert sorted(i.name for i in mgr.loaded()) == ["a", "c"]
        await mgr.close()

    anyio.run(main)
    assert loader.loads == ["a", "b", "c"]
    assert loader.engines["b"].closed


def test_a_model_in_use_is_never_evicted_the_load_waits_for_its_lease():
    mgr, loader = manager(max_loaded=1)
    release = None

    async def hold_a(task_status=anyio.TASK_STATUS_IGNORED):
        nonlocal release
        release = anyio.Event()
        async with mgr.acquire("a"):
            task_status.started()
            await release.wait()

    async def main():
        async with anyio.create_task_group() as tg:
            await tg.start(hold_a)
            got_b = anyio.Event()

            async def want_b():
                async with mgr.acquire("b") as lease:
                    assert loader.engines["a"].closed and not lease.engine.closed
                    got_b.set()
            tg.start_soon(want_b)
            await anyio.sleep(0.2)
            assert loader.loads == ["a"] and not loader.engines["a"].closed   # b waits
            assert [i.in_use for i in mgr.loaded()] == [1]
            release.set()
            with anyio.fail_after(5):
                await got_b.wait()
        await mgr.close()

    anyio.run(main)
    assert loader.loads == ["a", "b"]


def test_max_ram_evicts_to_fit_and_refuses_a_model_larger_than_it_alone():
    # In MiB: a load's measured growth of this process's memory (a few pages of Python
    # objects, here) counts when it is larger than the files and KV caches.
    mib = 1 << 20
    entries = {"a": fake_entry("a", size=600 * mib),
               "b": fake_entry("b", size=300 * mib, kv=mib),
               "huge": fake_entry("huge", size=5000 * mib)}
    mgr, loader = manager(entries, max_loaded=3, max_ram=1000 * mib)

    async def main():
        async with mgr.acquire("a"):
            pass
        async with mgr.acquire("b"):      # 600 + 300 + 1 × 100 (KV at n_ctx) fits
            pass
        assert {i.name: i.size // mib for i in mgr.loaded()} == {"a": 600, "b": 400}
        entries["c"] = fake_entry("c", size=500 * mib)
        async with mgr.acquire("c"):      # 1000 + 500 > 1000: the oldest, a, goes
            pass
        assert sorted(i.name for i in mgr.loaded()) == ["b", "c"]
        with pytest.raises(EdgespecError) as e:
            async with mgr.acquire("huge"):
                pass
        await mgr.close()
        return str(e.value)

    message = anyio.run(main)
    assert loader.engines["a"].closed and loader.loads == ["a", "b", "c"]
    assert "--max-ram" in message and "huge" in message and "\n" not in message


def test_keep_alive_unloads_an_idle_model_when_it_runs_out():
    mgr, loader = manager(keep_alive=0.6)

    async def main():
        async with mgr.acquire("a"):
            [info] = mgr.loaded()
            assert info.in_use == 1 and info.expires_at is None and info.n_ctx == 100
        [info] = mgr.loaded()
        assert info.in_use == 0 and 0 < info.expires_at - time.time() <= 0.6
        await anyio.sleep(0.1)
        assert not loader.engines["a"].closed
        await anyio.sleep(1.0)
        assert loader.engines["a"].closed and mgr.loaded() == []

        async with mgr.acquire("b", keep_alive=0):     # 0: unloaded as soon as idle
            pass
        await anyio.sleep(0.2)
        assert loader.engines["b"].closed

        async with mgr.acquire("c", keep_alive=-1):    # negative: for ever
            pass
        await anyio.sleep(0.5)
        [info] = mgr.loaded()
        assert info.name == "c" and info.expires_at is None
        await mgr.close()
        assert loader.engines["c"].closed

    anyio.run(main)


def test_unload_waits_for_the_lease_then_closes_the_engine():
    mgr, loader = manager()

    async def main():
        assert await mgr.unload("a") is False          # not loaded
        unloaded = []
        async with anyio.create_task_group() as tg:
            async with mgr.acquire("a") as lease:
                async def unload():
                    unloaded.append(await mgr.unload("a"))
                tg.start_soon(unload)
                await anyio.sleep(0.1)
                assert not unloaded and not lease.engine.closed
        assert unloaded == [True] and loader.engines["a"].closed and mgr.loaded() == []
        async with mgr.acquire("a") as lease:          # asked again: loaded again
            assert not lease.engine.closed
        await mgr.close()

    anyio.run(main)
    assert loader.loads == ["a", "a"]


def test_close_closes_every_engine_and_refuses_new_requests():
    mgr, loader = manager(max_loaded=2)

    async def main():
        for name in ("a", "b"):
            async with mgr.acquire(name):
                pass
        await mgr.close()
        with pytest.raises(EngineClosedError):
            async with mgr.acquire("a"):
                pass

    anyio.run(main)
    assert all(e.closed for e in loader.engines.values()) and len(loader.engines) == 2


def test_the_preloaded_model_is_the_default_and_is_not_loaded_again():
    engine = FakeEngine("a")
    mgr, loader = manager(preloaded=("a", engine))
    assert mgr.resolve(None).name == "a" and mgr.resolve("").name == "a"
    assert mgr.engine_for(None) is engine

    async def main():
        async with mgr.acquire(None) as lease:
            assert lease.engine is engine and lease.load_seconds == 0
        await mgr.close()

    anyio.run(main)
    assert loader.loads == [] and engine.closed


# ---------------------------------------------------------------------------------------------
# The context a request asks for (server/contexts.py)


def test_a_larger_context_reloads_once_a_smaller_one_never():
    mgr, loader = manager(("a", "b"), n_ctx=100, max_loaded=2)

    async def main():
        assert mgr.context_for("a") == 100 and mgr.context_for("a", 300) == 300
        async with mgr.acquire("a", n_ctx=50) as lease:      # less than the default: as is
            assert lease.engine.n_ctx == 100
        async with mgr.acquire("a", n_ctx=300) as lease:     # more: reloaded with it
            assert lease.engine.n_ctx == 300 and lease.load_seconds >= 0
        for asked in (200, 300, None):                       # no reload for less
            async with mgr.acquire("a", n_ctx=asked) as lease:
                assert lease.engine.n_ctx == 300
        assert mgr.context_for("a") == 300 and mgr.context_for("a", 200) == 300
        assert mgr.context_for("b") == 100 and mgr.context_for("nowhere", 50) == 100
        assert [i.n_ctx for i in mgr.loaded()] == [300]
        await mgr.unload("a")                     # unloaded: it comes back as it was asked
        async with mgr.acquire("a") as lease:
            assert lease.engine.n_ctx == 300
        await mgr.close()

    anyio.run(main)
    assert (loader.loads, loader.contexts) == (["a"] * 3, [100, 300, 300])


def test_a_reload_waits_for_the_requests_using_the_model_and_others_wait_for_it():
    mgr, loader = manager(("a",), n_ctx=100)
    release = anyio.Event()
    served: list[tuple[str, int]] = []

    async def hold(task_status=anyio.TASK_STATUS_IGNORED):
        async with mgr.acquire("a") as lease:
            task_status.started()
            await release.wait()
            assert not lease.engine.closed                 # never unloaded under a lease
            served.append(("held", lease.engine.n_ctx))

    async def ask(who: str, n_ctx):
        async with mgr.acquire("a", n_ctx=n_ctx) as lease:
            served.append((who, lease.engine.n_ctx))

    async def main():
        async with anyio.create_task_group() as tg:
            await tg.start(hold)
            tg.start_soon(ask, "bigger", 400)
            await anyio.sleep(0.1)
            tg.start_soon(ask, "any", None)               # arrives during the reload's wait
            await anyio.sleep(0.1)
            assert served == [] and loader.contexts == [100]
            release.set()
        await mgr.close()

    anyio.run(main)
    assert served[0] == ("held", 100)
    assert sorted(served[1:]) == [("any", 400), ("bigger", 400)]    # the newcomer waited too
    assert loader.contexts == [100, 400]


def test_a_context_whose_load_fails_is_forgotten():
    mgr, loader = manager(("a",), n_ctx=100)

    async def main():
        loader.fail = True
        with pytest.raises(ModelLoadError):
            async with mgr.acquire("a", n_ctx=5000):
                pass
        loader.fail = False
        assert mgr.context_for("a") == 100
        async with mgr.acquire("a") as lease:                 # the default again
            assert lease.engine.n_ctx == 100
        await mgr.close()

    anyio.run(main)
    assert loader.contexts == [5000, 100]


def test_a_context_over_the_models_limits_is_clamped_and_only_memory_refuses(caplog):
    """As Ollama: a num_ctx over the trained context is served with the trained context (and
    logged); what --max-ram cannot hold is refused before anything loads."""
    entries = {"a": fake_entry("a", size=600, kv=1, trained=1000)}
    mgr, loader = manager(entries, n_ctx=100, max_ram=1000)
    roomy, loads = manager({"a": fake_entry("a", size=600, kv=1, trained=1000)}, n_ctx=100)

    async def refused(n_ctx, *words):
        with pytest.raises(InvalidParameterError) as e:
            async with mgr.acquire("a", n_ctx=n_ctx):
                pass
        assert e.value.name == "num_ctx" and all(w in str(e.value) for w in words), e.value

    async def main():
        await refused(1001, "at most 400", "at 1000 tokens", "--max-ram")   # clamped, then
        await refused(500, "at most 400", "needs about", "--max-ram")   # 600 + 500 × 1 > 1000
        async with mgr.acquire("a", n_ctx=400) as lease:           # fits exactly
            assert lease.engine.n_ctx == 400
        await mgr.close()
        assert roomy.context_for("a", 20000) == 1000
        async with roomy.acquire("a", n_ctx=20000) as lease:       # aider's 1.25 × prompt + 8192
            assert lease.engine.n_ctx == 1000
        await roomy.close()

    anyio.run(main)
    assert loader.contexts == [400] and loads.contexts == [1000]
    assert "num_ctx 20000 asked for a is more than its 1000 tokens (the context it was " \
        "trained with): served with 1000" in caplog.text
    fixed, loads = manager(("a",), n_ctx=100, max_ctx=100)         # an Engine served as it is

    async def one_engine():
        async with fixed.acquire("a", n_ctx=101) as lease:
            assert lease.engine.n_ctx == 100
        await fixed.close()
    anyio.run(one_engine)
    assert loads.contexts == [100] and "cannot load it with another context" in caplog.text


# ---------------------------------------------------------------------------------------------
# Names


def test_names_resolve_exactly_by_tag_by_alias_and_by_unique_case():
    entries = {n: fake_entry(n) for n in ("qwen3-4b", "Mixed-Case", "ab", "AB")}
    entries["SmolLM2-135M-Instruct.Q4_1"] = fake_entry(
        "SmolLM2-135M-Instruct.Q4_1", file="SmolLM2-135M-Instruct.Q4_1.gguf")
    mgr, _ = manager(entries, aliases={"gpt-4o": "qwen3-4b"}, default="ab")
    assert mgr.resolve("qwen3-4b:latest").name == "qwen3-4b"
    assert mgr.resolve("mixed-case").name == "Mixed-Case"
    assert mgr.resolve("AB").name == "AB" and mgr.resolve("ab").name == "ab"
    assert mgr.resolve("gpt-4o").name == "qwen3-4b"
    assert mgr.resolve(None).name == "ab"
    # a registry model's name finds its file in the models folder
    assert mgr.resolve("smollm2-135m-instruct-q4_1").name == "SmolLM2-135M-Instruct.Q4_1"
    with pytest.raises(ModelNotFound):
        mgr.resolve("Ab")                      # two case-insensitive matches: neither
    assert find_entry(entries, "nothing") is None


def test_model_not_found_says_what_is_here_and_how_to_get_it():
    mgr, _ = manager(("b", "a"))
    with pytest.raises(ModelNotFound) as e:
        mgr.resolve("qwen3-8b:latest")         # a registry pair not downloaded
    msg = str(e.value)
    assert msg == ("the model 'qwen3-8b:latest' is not on this machine: `edgespec pull "
                   "qwen3-8b` downloads it; the models here are: a, b")
    assert e.value.name == "qwen3-8b:latest"
    with pytest.raises(ModelNotFound) as e:
        mgr.resolve("my-model")
    msg = str(e.value)
    assert "put its GGUF file in" in msg and "`edgespec pairs`" in msg and "\n" not in msg
    assert msg.endswith("the models here are: a, b")
    with pytest.raises(ModelNotFound) as e:
        mgr.resolve(None)                      # no default: name one
    assert "names no model" in str(e.value)
    empty, _ = manager(())
    with pytest.raises(ModelNotFound) as e:
        empty.resolve("a")
    assert str(e.value).endswith("there are no models here yet")


def test_the_listing_is_rescanned_at_most_every_few_seconds_or_on_a_miss():
    scans = []
    entries = {"a": fake_entry("a")}

    def catalog():
        scans.append(1)
        return dict(entries)
    mgr = ModelManager(catalog, Loader())
    assert [e.name for e in mgr.listing()] == ["a"]
    assert [e.name for e in mgr.listing()] == ["a"] and len(scans) == 1
    entries["b"] = fake_entry("b")
    assert mgr.resolve("b").name == "b" and len(scans) == 2      # a miss re-scans at once


# ---------------------------------------------------------------------------------------------
# The catalog on disk


@pytest.fixture
def models_folder(tmp_path, monkeypatch) -> Path:
    """An empty models folder and hub cache for this test alone."""
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv("EDGESPEC_MODELS", str(folder))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("EDGESPEC_REGISTRY", raising=False)
    return folder


def test_the_scan_leaves_out_partial_hidden_and_unreadable_files(models_folder, caplog):
    (models_folder / "broken.gguf").write_bytes(b"not a gguf file at all, just bytes")
    (models_folder / "downloading.gguf.partial").write_bytes(b"GGUF")
    (models_folder / ".hidden.gguf").write_bytes(b"GGUF")
    (models_folder / "folder.gguf").mkdir()
    with caplog.at_level(logging.WARNING, logger="edgespec.server.models"):
        assert scan_catalog() == {}
        assert scan_catalog() == {}
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "broken.gguf" in w]) == 1, warnings   # once, not per scan
    assert "bad magic" in warnings[0]


@pytest.mark.real
def test_the_catalog_and_the_manager_on_real_models(models_folder, smollm2_q4_path,
                                                    smollm2_q2k_path, smollm2_f32_path):
    from edgespec import Engine
    for path in (smollm2_q4_path, smollm2_q2k_path, smollm2_f32_path):
        (models_folder / path.name).symlink_to(path)
    outside = entry_for("started-with", smollm2_q4_path)
    catalog = scan_catalog(extra=[outside])
    q4, q2 = "SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q2_K"
    assert set(catalog) == {"smollm2-135m", q4, q2, "SmolLM2-135M-Instruct.F32", "started-with"}
    pair = catalog["smollm2-135m"]          # the registry pair: its two files are here
    assert pair.kind == "pair" and pair.draft == models_folder / smollm2_q4_path.name
    assert pair.size == smollm2_f32_path.stat().st_size + smollm2_q4_path.stat().st_size
    entry = catalog[q4]
    assert entry.kind == "gguf" and entry.draft is None and entry.target.name == f"{q4}.gguf"
    assert entry.size == smollm2_q4_path.stat().st_size
    assert entry.modified == os.stat(smollm2_q4_path).st_mtime
    assert entry.details == {"format": "gguf", "family": "llama", "families": ["llama"],
                             "parameter_size": "135M", "quantization_level": "Q4_1"}
    assert catalog[q2].details["quantization_level"] == "Q2_K"
    assert entry.kv_bytes_per_token == 30 * 3 * (64 + 64) * 2      # layers × KV heads × dims
    assert len(entry.digest) == 64 and entry.digest != catalog[q2].digest
    assert scan_catalog(extra=[outside])[q4].digest == entry.digest    # stable

    def load(e: CatalogEntry, n_ctx: int | None) -> Engine:
        return Engine.load(e.target, n_ctx=n_ctx or 512, drafter="none")
    mgr = ModelManager(lambda: scan_catalog(extra=[outside]), load, max_loaded=1)

    async def main():
        async with mgr.acquire(f"{q4}:latest") as lease:
            assert isinstance(lease.engine, Engine) and lease.load_seconds > 0
            first = lease.engine
            result = await anyio.to_thread.run_sync(
                lambda: first.generate("Hi", max_tokens=4, raw=True))
            assert result.stats.completion_tokens >= 1
        [info] = mgr.loaded()
        # at least the files and the KV cache; more when the load's own growth was more
        assert info.size >= entry.size + entry.kv_bytes_per_token * 512 and info.n_ctx == 512
        assert info.size < 4 * (entry.size + entry.kv_bytes_per_token * 512)
        async with mgr.acquire(q2) as lease:       # max_loaded=1: the first goes
            assert first.closed and not lease.engine.closed
            second = lease.engine
        await mgr.close()
        assert second.closed

    anyio.run(main)


def test_without_ctx_size_each_model_gets_its_trained_context_as_far_as_memory_allows():
    """Both models' KV caches for every lane count; a multiple of 256; never below 4096 (or
    the trained context if smaller); the server's manager uses it for every model."""
    from edgespec.server.contexts import auto_context
    from edgespec.server.slots import Budget
    gib = 2**30
    small = fake_entry("small", size=gib // 4, kv=24_576, trained=8192)
    big = fake_entry("big", size=gib, kv=40_960, trained=32768)
    tiny = fake_entry("tiny", size=1000, kv=10, trained=512)
    four = Budget(max_ram=6 * gib, parallel=4)
    assert auto_context(small, four)[0] == 8192                       # trained: it fits
    n, why = auto_context(big, four)                                  # 5 GiB / (4 × 40 KiB)
    assert n == (5 * gib // (4 * 40_960)) // 256 * 256 == 32768 and "trained" in why
    n, why = auto_context(big, Budget(max_ram=2 * gib, parallel=4))
    assert n == (gib // (4 * 40_960)) // 256 * 256 == 6400 and "--max-ram" in why
    assert auto_context(big, Budget(max_ram=gib + 1, parallel=4))[0] == 4096    # the floor
    assert auto_context(tiny, four)[0] == 512
    mgr, loader = manager({"small": small, "big": big}, auto_ctx=True, n_ctx=4096,
                          max_ram=2 * gib, parallel=4)

    async def main():
        async with mgr.acquire("small") as lease:
            assert lease.engine.n_ctx == 8192
        async with mgr.acquire("big") as lease:
            assert lease.engine.n_ctx == 6400
        await mgr.close()
    anyio.run(main)
