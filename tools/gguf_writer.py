"""gguf_writer.py — the output side shared by the tokenizer test-model generators
(tools/gen_bpe_test_model.py, tools/gen_spm_test_model.py):

  write_vocab_gguf   a vocab-only GGUF (architecture "llama", no tensors) with
                     the minimal hyper-parameters llama.cpp needs to load it
                     with vocab_only, and the tokenizer.ggml.* keys
  write_golden       the golden ids as gzipped JSON lines
                     {"text", "ids"[, "rt": false]}, byte-reproducible (mtime 0,
                     no file name in the gzip header)

Keys are written in a fixed order (optional ones skipped when None), so a
generator that passes the same vocabulary writes the same bytes.

A library, not a generator: `make golden` runs tools/gen_*.py, so this file
must not be named gen_*.py.
"""
import gzip
import json


def write_vocab_gguf(path, name, *, model, pre, tokens, types, scores=None, merges=None,
                     bos_id, eos_id, eot_id=None, unk_id=None, add_bos=True, add_eos=None,
                     add_space_prefix=None):
    """Write tokens (list of str), their gguf.TokenType values and the
    optional scores / merges as a vocab-only llama GGUF at path."""
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    # Minimal hyper-parameters so llama.cpp accepts the file (vocab_only).
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if scores is not None:
        w.add_token_scores(scores)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    w.add_bos_token_id(bos_id)
    w.add_eos_token_id(eos_id)
    if eot_id is not None:
        w.add_eot_token_id(eot_id)
    if unk_id is not None:
        w.add_unk_token_id(unk_id)
    w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_golden(path, corpus, golden, rt):
    """One line per string: its text, its ids, and "rt": false when the ids
    do not decode back to the text."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        for s, ids, ok in zip(corpus, golden, rt):
            rec = {"text": s, "ids": ids}
            if not ok:
                rec["rt"] = False
            f.write((json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
