"""Measurement only: where the replay's ledger process spends CPU around its exports.

    EXPORT13_PROF=/tmp/prof.json PYTHONPATH=bench/export_profile \
        .venv/bin/python bench/replay_trace.py --no-reverify --kafka HOST:PORT ...

Python imports this ``sitecustomize`` in every process (PYTHONPATH); with EXPORT13_PROF
set it wraps, when ``gridledger.replay`` is imported (the ledger process: spawned, it
imports it to run ``ledger_main``), ``export_closed`` and the functions it calls, and
after each call rewrites the JSON file with running totals: the process's CPU during
the calls (RUSAGE_SELF), the CPU of the calling thread, of the export's pool threads
(``ledger-export`` writers, ``export-sync``), of the process's other threads
(``/proc/self/task``: ``main`` is the event loop, ``native`` DuckDB's own threads), the
thread CPU and wall of each part (attestation, staging, file writes), the garbage
collections during and outside exports, and the store's WAL size around each call (a
shrink: a checkpoint ran in the export). Not imported by anything else."""

import os

_OUT = os.environ.get("EXPORT13_PROF")
if _OUT:
    import functools
    import gc
    import importlib.abc
    import importlib.machinery
    import inspect
    import json
    import resource
    import sys
    import threading
    import time

    _lock = threading.Lock()
    _acc = {
        "calls": 0,
        "exports": 0,
        "process": 0.0,
        "wall": 0.0,
        "caller_thread": 0.0,
        "wal_shrank_calls": 0,
        "fold_process": 0.0,
        "parts": {},
        "gc": {},
        "pools": {},
        "threads": {},
    }
    _state = {"in_export": False}
    _tl = threading.local()

    def _self():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def _add(bucket, name, cpu, wall):
        with _lock:
            d = _acc[bucket].setdefault(name, [0, 0.0, 0.0])
            d[0] += 1
            d[1] += cpu
            d[2] += wall

    def _gc_cb(phase, info):
        if phase == "start":
            _tl.gc = (time.thread_time(), time.perf_counter())
        elif getattr(_tl, "gc", None) is not None:
            t, w = _tl.gc
            _tl.gc = None
            where = "export" if _state["in_export"] else "other"
            _add(
                "gc",
                f"{where}-gen{info['generation']}",
                time.thread_time() - t,
                time.perf_counter() - w,
            )

    gc.callbacks.append(_gc_cb)

    def _timed(name, fn, bucket="parts"):
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen(*a, **k):
                it = fn(*a, **k)
                while True:
                    t, w = time.thread_time(), time.perf_counter()
                    try:
                        item = next(it)
                    except StopIteration:
                        _add(bucket, name, time.thread_time() - t, time.perf_counter() - w)
                        return
                    _add(bucket, name, time.thread_time() - t, time.perf_counter() - w)
                    yield item

            return gen

        @functools.wraps(fn)
        def wrapper(*a, **k):
            t, w = time.thread_time(), time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                _add(bucket, name, time.thread_time() - t, time.perf_counter() - w)

        return wrapper

    def _tasks():
        out = {}
        hz = os.sysconf("SC_CLK_TCK")
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    data = f.read()
            except OSError:
                continue
            rest = data[data.rindex(")") + 2 :].split()
            out[int(tid)] = (int(rest[11]) + int(rest[12])) / hz
        return out

    def _names():
        names = {os.getpid(): "main"}
        for t in threading.enumerate():
            if t.native_id is not None and t.native_id != os.getpid():
                names[t.native_id] = "py:" + t.name.rstrip("0123456789_-")
        return names

    def _dump():
        with open(_OUT + ".tmp", "w") as f:
            json.dump(_acc, f, indent=1)
        os.replace(_OUT + ".tmp", _OUT)

    def _install():
        import gridledger.replay.ledger_process as replay_ledger
        import gridledger.replay.run as replay_run
        from ledger import export, issuer
        from ledger.store import Store

        for name in ("_summaries", "_leaves", "_statements", "checkpoint_over_leaves"):
            setattr(issuer, name, _timed(f"issuer.{name}", getattr(issuer, name)))
        export.attest_chunks = _timed("attest_chunks(next)", export.attest_chunks)
        for name in ("_stage", "_write_tmp", "_finish", "_pages", "_remove_leftovers"):
            setattr(export, name, _timed(f"export.{name}", getattr(export, name)))
        for name in (
            "add_attestations",
            "commit_ranges",
            "statement_heads",
            "checkpoint_sizes",
            "dropped_counts",
            "arrival",
            "placements",
        ):
            setattr(Store, name, _timed(f"Store.{name}", getattr(Store, name)))
        # Where they are called: the ledger process's exports and the replay's own.
        for module in (replay_ledger, replay_run):
            for name in ("closed_placements", "export_chunk"):
                setattr(module, name, _timed(name, getattr(module, name)))

        base = export.ThreadPoolExecutor

        class Pool(base):
            def __init__(self, *a, thread_name_prefix="", **k):
                super().__init__(*a, thread_name_prefix=thread_name_prefix, **k)
                self._prefix = thread_name_prefix

            def submit(self, fn, *a, **k):
                return super().submit(_timed(self._prefix, fn, "pools"), *a, **k)

        export.ThreadPoolExecutor = Pool

        orig_export_closed = replay_ledger.export_closed

        def export_closed(store, key, exports, exported):
            wal = str(store.path) + ".wal" if hasattr(store, "path") else None
            try:
                w_before = os.path.getsize(wal) if wal else -1
            except OSError:
                w_before = -1
            before = _tasks()
            p0, w0, t0 = _self(), time.perf_counter(), time.thread_time()
            _state["in_export"] = True
            try:
                return orig_export_closed(store, key, exports, exported)
            finally:
                _state["in_export"] = False
                t1, w1, p1 = time.thread_time(), time.perf_counter(), _self()
                after, names = _tasks(), _names()
                me = threading.get_native_id()
                for tid, cpu in after.items():
                    d = cpu - before.get(tid, 0.0)
                    if d > 0 and tid != me:
                        name = names.get(tid, "native")
                        _acc["threads"][name] = _acc["threads"].get(name, 0.0) + d
                try:
                    w_after = os.path.getsize(wal) if wal else -1
                except OSError:
                    w_after = -1
                with _lock:
                    _acc["calls"] += 1
                    _acc["exports"] = len(exported)
                    _acc["process"] += p1 - p0
                    _acc["wall"] += w1 - w0
                    _acc["caller_thread"] += t1 - t0
                    if 0 <= w_after < w_before:
                        _acc["wal_shrank_calls"] += 1
                    _acc.setdefault("wal_sizes", []).append((w_before, w_after))
                _dump()

        replay_ledger.export_closed = export_closed

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "gridledger.replay":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None:
                return None
            orig_exec = spec.loader.exec_module

            def exec_module(module):
                orig_exec(module)
                _install()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
