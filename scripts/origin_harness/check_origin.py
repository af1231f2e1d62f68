"""Checks aten/origin_capture.cpp through the _origin_harness module (check.sh builds it): a
capture with the GIL released returns the same origin id as one with the GIL held, the id
resolves to the calling line, and on CPython 3.11-3.14 the GIL path stops running once this
thread's caches are warm (the GIL-free fast path serves the captures). Two threads at once."""
import importlib.util
import os
import re
import sys
import tempfile
import threading

import _origin_harness as h

sys.dont_write_bytecode = True  # origin_sites.py is loaded from the source tree

HERE = os.path.dirname(os.path.abspath(__file__))
FAST = (3, 11) <= sys.version_info[:2] < (3, 15)  # versions with the fast path
ROUNDS = 200
THREADS = 2
ATTEMPTS = 8  # see the NOTE in main()

INTERNAL_SRC = '''
def call(fn):
    return fn()

def via_c(fn):
    return list(map(lambda _: fn(), [0]))[0]

def deep(n, fn):
    return deep(n - 1, fn) if n else fn()
'''


def expected_texts():
    path = os.path.join(HERE, "origin_sites.py")
    out = {}
    with open(path) as f:
        for no, line in enumerate(f, 1):
            m = re.search(r"# SITE (\w+)$", line.rstrip())
            if m:
                out[m.group(1)] = "origin_sites.py:%d in %s" % (no, m.group(1))
    return out


def load(name, path):
    # A fresh module each attempt: new code objects at new addresses.
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_round(got, want_ids, texts, label):
    assert [s for s, _ in got] == [s for s, _ in want_ids], label
    for (site, i), (_, w) in zip(got, want_ids):
        assert i == w, "%s: %s: id %d, expected %d (%r vs %r)" % (
            label, site, i, w, h.resolve(i), h.resolve(w))
        if site is None:
            assert i == 0, "%s: too_deep: id %d (%r), expected 0" % (label, i, h.resolve(i))
        else:
            assert h.resolve(i) == texts[site], f"{label}: {site}: {h.resolve(i)!r}, expected {texts[site]!r}"


def attempt(k, internal_dir, texts):
    internal = load("openneuron_fake_internal_%d" % k, os.path.join(internal_dir, "internal.py"))
    sites = load("origin_sites_%d" % k, os.path.join(HERE, "origin_sites.py"))
    sites.internal = internal

    # This thread first: a cold GIL-released capture takes the GIL path and must agree.
    ref = sites.round_(h.capture)
    check_round(ref, ref, texts, "main, GIL held")
    check_round(sites.round_(h.capture_nogil), ref, texts, "main, GIL released")

    warm = threading.Barrier(THREADS + 1)
    done = threading.Barrier(THREADS + 1)
    errors = []

    def worker(t):
        try:
            check_round(sites.round_(h.capture_nogil), ref, texts, "thread %d, cold" % t)
            check_round(sites.round_(h.capture), ref, texts, "thread %d, GIL held" % t)
            warm.wait()
            warm.wait()
            for r in range(ROUNDS):
                fn = h.capture_nogil if (r + t) % 2 else h.capture
                check_round(sites.round_(fn), ref, texts, "thread %d, round %d" % (t, r))
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            warm.abort()
            done.abort()
        finally:
            try:
                done.wait()
            except threading.BrokenBarrierError:
                pass

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    try:
        warm.wait()
        before = h.slow_captures()
        warm.wait()
        done.wait()
    except threading.BrokenBarrierError:
        pass
    after = h.slow_captures()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    per_round = len(ref)
    return after - before, THREADS * ROUNDS * per_round


def main():
    texts = expected_texts()
    with tempfile.TemporaryDirectory() as tmp:
        internal_dir = os.path.join(tmp, "openneuron")
        os.mkdir(internal_dir)
        with open(os.path.join(internal_dir, "internal.py"), "w") as f:
            f.write(INTERNAL_SRC)
        for k in range(ATTEMPTS):
            grew, captures = attempt(k, internal_dir, texts)
            print("attempt %d: %d captures after warm-up, GIL path ran %d times" % (
                k, captures, grew))
            if not FAST:
                assert grew == captures, "no fast path here: every capture takes the GIL path"
                break
            if grew == 0:
                break
            # NOTE: the per-thread caches are 2-way set-associative; three of this attempt's code
            # objects could still share a set and evict each other (rare). Fresh code objects
            # land in other sets.
        else:
            raise AssertionError("GIL path kept running after warm-up in %d attempts" % ATTEMPTS)
    for site in sorted(texts):
        print("  %-20s %s" % (site, texts[site]))
    print("OK: %s, fast path %s, %d threads x %d rounds, ids and texts match" % (
        sys.version.split()[0], "on" if FAST else "off (GIL path only)", THREADS, ROUNDS))


if __name__ == "__main__":
    main()
