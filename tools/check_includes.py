#!/usr/bin/env python3
"""check_includes.py — the include rules of core/ and kernels/ (issue 13, part 8).

Reads every quoted #include of core/ and kernels/ and fails (exit 1) on:
  * an include cycle between core/ units (a unit is a .c and its .h: a.c
    including b.h and b.c including a.h is a cycle, as a.h <-> b.h is; a
    folder's private header, NAME_internal.h, belongs to the files of its
    folder that include it, so those edges are not counted);
  * a forbidden direction: core/lua/ or core/server/ -> core/cli/.
Rules another change still has to make true are PENDING: their violations
are printed as "pending: ..." lines and do not fail; once such a rule
holds, the script says so, and the rule belongs in STRICT from then on.

  python3 tools/check_includes.py [ROOT]     (run by ctest: tools/check_includes)
  python3 tools/check_includes.py --self-test (ctest: tools/check_includes_self_test)
The self-test builds small trees in a temporary folder and checks that a
cycle and a forbidden include fail, a private header and a pending rule
do not.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# (name, from-prefixes, to-prefix, from-prefixes excluded)
STRICT = [
    ("core/lua and core/server do not include core/cli", ("core/lua/", "core/server/"), "core/cli/", ()),
    ("core/kv does not include core/model", ("core/kv/",), "core/model/", ()),
    ("kernels/ outside kernels/cpu/ does not include kernels/cpu/", ("kernels/",), "kernels/cpu/", ("kernels/cpu/",)),
]
PENDING = []


def sources(root):
    for top in ("core", "kernels"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith((".c", ".h", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")


def resolve(root, src, inc):
    """The repository path an include names (the build's include dirs:
    the file's folder, core/, kernels/, the root), or None (a system or
    generated header)."""
    for base in (os.path.dirname(src), "core", "kernels", ""):
        p = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, p)):
            return p
    return None


def unit(path):
    return os.path.splitext(path)[0]


def graph(root):
    edges = {}  # file -> [(included file, line)]
    for src in sources(root):
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            dst = resolve(root, src, m.group(1))
            if dst:
                edges.setdefault(src, []).append((dst, text.count("\n", 0, m.start()) + 1))
    return edges


def cycles(edges):
    """Strongly connected components of more than one core/ unit (Tarjan)."""
    g = {}
    for src, dsts in edges.items():
        if not src.startswith("core/"):
            continue
        for dst, _ in dsts:
            private = dst.endswith("_internal.h") and os.path.dirname(dst) == os.path.dirname(src)
            if dst.startswith("core/") and unit(dst) != unit(src) and not private:
                g.setdefault(unit(src), set()).add(unit(dst))
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            strong(v)
    return out, g


def violations(edges, rule):
    _, froms, to, excluded = rule
    bad = []
    for src, dsts in sorted(edges.items()):
        if not src.startswith(froms) or src.startswith(excluded):
            continue
        for dst, line in dsts:
            if dst.startswith(to):
                bad.append(f"{src}:{line} includes {dst}")
    return bad


def check(root):
    edges = graph(root)
    if not edges:
        print(f"check_includes: no sources under {root}")
        return 1
    failed = False
    comps, g = cycles(edges)
    for comp in comps:
        failed = True
        inside = set(comp)
        print("FAIL: include cycle between " + ", ".join(comp))
        for u in comp:
            for w in sorted(g.get(u, ()) & inside):
                print(f"    {u} -> {w}")
    if not comps:
        n_units = len({unit(s) for s in sources(root) if s.startswith("core/")})
        print(f"ok: no include cycle between the {n_units} core/ units")
    for rule in STRICT:
        bad = violations(edges, rule)
        for b in bad:
            print(f"FAIL: {rule[0]}: {b}")
        failed |= bool(bad)
        if not bad:
            print(f"ok: {rule[0]}")
    for rule in PENDING:
        bad = violations(edges, rule)
        for b in bad:
            print(f"pending: {rule[0]}: {b}")
        if not bad:
            print(f"ok: {rule[0]} (holds now: move it from PENDING to STRICT)")
    return 1 if failed else 0


def self_test():
    import contextlib
    import io
    import tempfile

    def run(files):
        with tempfile.TemporaryDirectory() as d:
            for path, text in files.items():
                os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(d, path), "w") as f:
                    f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = check(d)
            return rc, out.getvalue()

    base = {"core/util/common.h": "", "core/util/common.c": '#include "util/common.h"\n'}
    cases = [
        ("clean tree", {}, 0, "ok: no include cycle"),
        ("a.c -> b.h, b.c -> a.h", {"core/x/a.h": "", "core/x/a.c": '#include "x/b.h"\n',
                                    "core/x/b.h": "", "core/x/b.c": '#include "x/a.h"\n'}, 1, "FAIL: include cycle"),
        ("header cycle", {"core/x/a.h": '#include "x/b.h"\n', "core/x/b.h": '#include "x/a.h"\n'}, 1,
         "FAIL: include cycle"),
        ("private header", {"core/t/t.h": "", "core/t/t_internal.h": '#include "t/t.h"\n',
                            "core/t/t.c": '#include "t/t_internal.h"\n'}, 0, "ok: no include cycle"),
        ("lua -> cli", {"core/cli/cli.h": "", "core/lua/l.c": '#include "cli/cli.h"\n'}, 1,
         "FAIL: core/lua and core/server do not include core/cli"),
        ("server -> cli", {"core/cli/args.h": "", "core/server/s.c": '  #  include "cli/args.h"\n'}, 1,
         "FAIL: core/lua and core/server do not include core/cli"),
        ("kv -> model", {"core/model/model.h": "", "core/kv/kv.h": '#include "model/model.h"\n'}, 1,
         "FAIL: core/kv does not include core/model"),
        ("kernels -> kernels/cpu", {"kernels/cpu/cpu.h": "", "kernels/types.c": '#include "cpu/cpu.h"\n'}, 1,
         "FAIL: kernels/ outside kernels/cpu/ does not include kernels/cpu/"),
    ]
    bad = 0
    for name, files, want_rc, want_text in cases:
        rc, out = run({**base, **files})
        ok = rc == want_rc and want_text in out
        print(f"{'ok  ' if ok else 'FAIL'} self-test: {name} (exit {rc})")
        if not ok:
            print(out)
            bad += 1
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return check(os.path.abspath(root))


if __name__ == "__main__":
    sys.exit(main())
