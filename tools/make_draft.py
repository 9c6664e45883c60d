#!/usr/bin/env python3
"""make_draft.py — a draft model cut from a Llama GGUF: its first N layers.

Every tensor outside the dropped layers (embeddings, output norm, output
matrix) and every metadata key are copied unchanged, raw bytes as stored;
only llama.block_count changes. The vocabulary is the source's, so the
result can be an engine's draft for the source (core/engine/runner.h).

    .venv/bin/python tools/make_draft.py SRC.gguf DST.gguf [--layers 4]

The file is written to DST.tmp and renamed, so a reader never sees half of it.
"""
import argparse
import os
import re
import sys

try:
    import gguf
except ImportError:
    sys.exit("make_draft: the 'gguf' Python package is missing (pip install gguf)")

LAYER = re.compile(r"^blk\.(\d+)\.")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, default=4, help="layers to keep (default 4)")
    a = ap.parse_args()

    r = gguf.GGUFReader(a.src)
    arch_f = r.fields.get("general.architecture")
    if arch_f is None:
        sys.exit(f"make_draft: {a.src} has no general.architecture")
    arch = arch_f.contents()
    count_key = f"{arch}.block_count"
    if count_key not in r.fields:
        sys.exit(f"make_draft: {a.src} has no {count_key}")
    n_layer = int(r.fields[count_key].contents())
    if not 1 <= a.layers <= n_layer:
        sys.exit(f"make_draft: --layers must be in [1, {n_layer}], got {a.layers}")

    tmp = a.dst + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    for key, f in r.fields.items():
        # the writer writes the header's own fields and the architecture itself
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        if key == count_key:
            w.add_key_value(key, a.layers, vtype)
        elif vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    kept = 0
    for t in r.tensors:
        m = LAYER.match(t.name)
        if m and int(m.group(1)) >= a.layers:
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        kept += 1
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, a.dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"make_draft: {a.dst}: {a.layers} of {n_layer} layers, {kept} tensors")


if __name__ == "__main__":
    main()
