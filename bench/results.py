"""results.py — what the Python benchmark programs share: --json output.

write(path, results) writes the results (a dict with a "bench" name) as
JSON with sorted keys, through a temporary file renamed into place, so a
failed run never leaves half a file. The Lua benchmarks do the same through
lua/luainfer/bench.lua."""
import json
import os
import tempfile


def write(path, results):
    assert isinstance(results.get("bench"), str), "results need a bench name"
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(results, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"results written to {path}")
