"""Sessions kept across server restarts (nexus_mlx.server.session_store, ``serve --session-dir``).

Oracles: a conversation resumed on a restarted server reuses the restored rows and gets the
reply a fresh server gives the same request (greedy); a restored session's cache equals a fresh
prefill of its ids. Files the server cannot restore are refused with the reason, never break the
start, and only the server's own file pattern is ever removed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tiny_models import VOCAB, tiny_model

openai = pytest.importorskip("openai")

from test_server import _tiny_llama, client, healthy, running  # noqa: E402

from nexus_mlx.agent.session import Session  # noqa: E402
from nexus_mlx.agent.session_file import read_session, save_session  # noqa: E402
from nexus_mlx.errors import ArgumentError  # noqa: E402
from nexus_mlx.models.forward import forward, make_cache  # noqa: E402
from nexus_mlx.server.pool import SessionPool  # noqa: E402
from nexus_mlx.server.session_store import INDEX, LOCK, SessionStore  # noqa: E402

FIRST = [{"role": "user", "content": "Name three colours of the rainbow."}]
MAX_TOKENS = 6


def _ask(server, messages):
    return client(server).chat.completions.create(model="tiny", messages=messages,
                                                  max_tokens=MAX_TOKENS, temperature=0)


def test_a_conversation_resumed_after_a_restart_appends_to_its_restored_cache(
        default_model, tmp_path):
    model, tokenizer = _tiny_llama(), default_model[1]
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as first:
        reply = _ask(first, FIRST).choices[0].message.content
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == \
        [LOCK, "responses.json", "session", INDEX]
    follow = [*FIRST, {"role": "assistant", "content": reply},
              {"role": "user", "content": "And two more."}]
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as second:
        health = healthy(second)
        assert health["sessions_restored"] == 1 and health["session_files_refused"] == 0
        resumed = _ask(second, follow)
    with running(model, tokenizer, model_name="tiny") as fresh:
        alone = _ask(fresh, follow)
    cached = resumed.usage.prompt_tokens_details.cached_tokens
    assert cached >= health["session_rows_restored"] - MAX_TOKENS > 0, resumed.usage
    assert alone.usage.prompt_tokens_details.cached_tokens == 0
    assert resumed.choices[0].message.content == alone.choices[0].message.content


def test_files_that_cannot_be_restored_are_refused_and_only_the_pattern_is_replaced(
        default_model, tmp_path):
    model, tokenizer = _tiny_llama(), default_model[1]
    other = tiny_model("qwen2")
    stranger = Session(other, None)
    stranger.step_ids(np.arange(1, 30) % VOCAB)
    save_session(stranger, tmp_path / "session-00000000000a.safetensors")  # another model's
    (tmp_path / "session-00000000000b.safetensors").write_bytes(b"not a session")  # damaged
    (tmp_path / "notes.txt").write_text("keep me")
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as server:
        health = healthy(server)
        assert health["sessions_restored"] == 0 and health["session_files_refused"] == 2
        refused = dict(server.engine.restored.refused)
        assert "another model" in refused["session-00000000000a.safetensors"]
        assert "not a readable safetensors file" in refused["session-00000000000b.safetensors"]
        _ask(server, FIRST)
    left = {p.name for p in tmp_path.iterdir()} - {"notes.txt", INDEX, LOCK, "responses.json"}
    [kept] = left
    assert kept not in refused and kept.startswith("session-") and (tmp_path / "notes.txt").exists()
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as again:
        assert healthy(again)["sessions_restored"] == 1


def test_a_session_dir_that_is_a_file_is_refused_by_name(default_model, tmp_path):
    file = tmp_path / "taken"
    file.write_text("x")
    with pytest.raises(ArgumentError, match="session_dir"):
        with running(_tiny_llama(), default_model[1], model_name="tiny", session_dir=file):
            pass


def _fresh_logits(model, ids) -> mx.array:
    return forward(model, ids, make_cache(model), logits="last")[0, -1]


def test_restored_sessions_take_the_server_s_policy_and_keep_the_newest(tmp_path: Path):
    """A repair session saved with stale rows restores exactly under policy exact (healed); past
    max_sessions the oldest files are not restored; save order is most recently used first."""
    model = tiny_model("llama")
    rng = np.random.default_rng(5)
    source = SessionPool(lambda: Session(model, None, min_reuse=8, allocator="dense_tokens"),
                         max_sessions=4)
    texts = [rng.integers(0, VOCAB, n) for n in (60, 50, 40)]
    for ids in texts:
        entry = source.acquire(ids)
        assert entry is not None
        entry.session.step_ids(ids)
        source.release(entry)
    edited = np.r_[texts[2][:10], texts[2][20:]]  # a deleted span: the suffix is repaired
    entry = source.acquire(edited)
    assert entry is not None
    assert entry.session.step_ids(edited).path == "repair" and entry.session.stale_rows
    source.release(entry)
    saved = SessionStore(tmp_path).save(source)
    assert (saved.sessions, saved.written, saved.rows) == (3, 3, 60 + 50 + 30)
    for path in tmp_path.glob("session-*"):  # the index, not the files' times, gives the order
        os.utime(path, ns=(1, 1))

    target = SessionPool(lambda: Session(model, None, policy="exact"), max_sessions=2)
    report = SessionStore(tmp_path).restore(target, model, None,
                                            lambda: Session(model, None, policy="exact"))
    assert (report.sessions, report.refused) == (2, [])
    newest, older = target.idle()
    assert list(newest.tokens) == list(edited) and list(older.tokens) == list(texts[1])
    assert newest.session.stale_rows == 0 and newest.session.policy == "exact"
    assert (newest.prompt, older.prompt) == (edited.size, texts[1].size)  # as before the stop
    follow = np.r_[edited, 7, 8, 9]
    step = newest.session.step_ids(follow)
    assert (step.path, step.reused) == ("append", edited.size)
    got = newest.session.next_token_logits()
    assert float(mx.abs(got - _fresh_logits(model, follow)).max()) < 1e-4


def test_a_session_that_cannot_be_written_is_reported_and_the_others_are_saved(
        tmp_path: Path, monkeypatch):
    import nexus_mlx.server.session_store as store

    model = tiny_model("llama")
    pool = SessionPool(lambda: Session(model, None), max_sessions=3)
    for ids in (np.arange(1, 40) % VOCAB, np.arange(50, 70) % VOCAB):
        entry = pool.acquire(ids)
        assert entry is not None
        entry.session.step_ids(ids)
        pool.release(entry)
    real = store.save_session

    def full_disk(session, path, annotations=None):
        if session.cache.n_past == 20:
            raise OSError(28, "No space left on device")
        return real(session, path, annotations)

    monkeypatch.setattr(store, "save_session", full_disk)
    report = SessionStore(tmp_path).save(pool)
    assert (report.sessions, report.written, report.rows) == (1, 1, 39)
    [(name, why)] = report.refused
    assert why == "not saved: No space left on device"
    assert json.loads((tmp_path / INDEX).read_text())["sessions"] != [name]
    assert len(list(tmp_path.glob("session-*"))) == 1


def _served(pool: SessionPool, ids: np.ndarray) -> None:
    entry = pool.acquire(ids)
    assert entry is not None
    entry.session.step_ids(ids)
    pool.release(entry)


def test_a_save_writes_only_the_sessions_that_changed_and_drops_the_files_of_dropped_ones(
        tmp_path: Path):
    model = tiny_model("llama")
    pool = SessionPool(lambda: Session(model, None), max_sessions=2)
    a, b, c = (np.arange(k, k + 30) % VOCAB for k in (1, 40, 80))
    _served(pool, a)
    _served(pool, b)
    store = SessionStore(tmp_path)
    assert store.save(pool).written == 2
    files = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("session-*")}
    assert store.save(pool).written == 0  # nothing served since: every file kept as it is
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("session-*")} == files
    _served(pool, np.r_[a, 5, 6])  # a's conversation goes on
    report = store.save(pool)
    assert (report.written, report.sessions) == (1, 2)
    _served(pool, c)  # no room: b's session, the least recently used, is overwritten
    store.save(pool)
    order = json.loads((tmp_path / INDEX).read_text())["sessions"]
    assert sorted(p.name for p in tmp_path.glob("session-*")) == sorted(order)
    again = SessionPool(lambda: Session(model, None), max_sessions=2)
    store.close()  # one store owns a directory at a time
    SessionStore(tmp_path).restore(again, model, None, lambda: Session(model, None))
    assert [list(e.tokens) for e in again.idle()] == [list(c), list(np.r_[a, 5, 6])]


def test_without_an_index_the_newest_files_are_restored_first(tmp_path: Path):
    model = tiny_model("llama")
    pool = SessionPool(lambda: Session(model, None), max_sessions=3)
    texts = [np.arange(k, k + 20) % VOCAB for k in (1, 30, 60)]
    for ids in texts:
        _served(pool, ids)
    SessionStore(tmp_path).save(pool)
    (tmp_path / INDEX).write_text("{not json")
    for i, path in enumerate(sorted(tmp_path.glob("session-*"))):
        os.utime(path, ns=(10**9 * (i + 1), 10**9 * (i + 1)))
    newest = sorted(tmp_path.glob("session-*"))[-1]
    target = SessionPool(lambda: Session(model, None), max_sessions=1)
    report = SessionStore(tmp_path).restore(target, model, None, lambda: Session(model, None))
    assert report.sessions == 1
    [entry] = target.idle()
    assert list(entry.tokens) == list(read_session(model, None, newest).session.tokens)


def test_an_idle_server_checkpoints_its_sessions(default_model, tmp_path):
    import time

    with running(_tiny_llama(), default_model[1], model_name="tiny", session_dir=tmp_path,
                 idle_release_s=0.3) as server:
        _ask(server, FIRST)
        deadline = time.monotonic() + 20
        while server.engine.saved.written == 0:  # the report lands once the save is whole
            assert time.monotonic() < deadline, healthy(server)
            time.sleep(0.05)
        assert server.engine.saved.written == 1
        assert len(json.loads((tmp_path / INDEX).read_text())["sessions"]) == 1


def test_a_busy_session_or_one_that_cannot_be_rewritten_keeps_its_earlier_file(
        tmp_path: Path, monkeypatch):
    import nexus_mlx.server.session_store as store_module

    model = tiny_model("llama")
    pool = SessionPool(lambda: Session(model, None), max_sessions=2)
    a, b = np.arange(1, 31) % VOCAB, np.arange(40, 70) % VOCAB
    _served(pool, a)
    _served(pool, b)
    store = SessionStore(tmp_path)
    store.save(pool)
    files = sorted(p.name for p in tmp_path.glob("session-*"))
    held = pool.acquire(np.r_[a, 9])  # a request the stop cuts off
    assert held is not None and held.busy
    report = store.save(pool)
    assert (report.sessions, report.written) == (1, 0)
    assert sorted(p.name for p in tmp_path.glob("session-*")) == files
    held.session.step_ids(np.r_[a, 9])
    pool.release(held)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "save_session", full_disk)
    report = store.save(pool)  # a's session changed and cannot be rewritten
    assert report.written == 0 and len(report.refused) == 1
    assert sorted(p.name for p in tmp_path.glob("session-*")) == files
    assert sorted(json.loads((tmp_path / INDEX).read_text())["sessions"]) == files


def test_one_server_at_a_time_owns_a_session_dir(default_model, tmp_path):
    model, tokenizer = _tiny_llama(), default_model[1]
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path):
        with pytest.raises(ArgumentError, match="in use by another nexus-mlx server"):
            running(model, tokenizer, model_name="tiny", session_dir=tmp_path).__enter__()
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as after:
        assert healthy(after)["session_files_refused"] == 0  # the first one let it go
