#!/usr/bin/env python3
"""openai_client.py — the official `openai` client against luainfer's
OpenAI-compatible HTTP API: a completion, then a streamed chat.

    ./build/luainfer serve --http 127.0.0.1:8000 &
    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1] [--api-key KEY]

Nothing here is luainfer-specific: the same script talks to vLLM or
llama.cpp's server. The model name comes from /v1/models.
"""
import argparse
import sys

from openai import OpenAI


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none", help="the server's --api-key, if it has one")
    a = ap.parse_args()
    client = OpenAI(base_url=a.base_url, api_key=a.api_key, timeout=120)
    model = client.models.list().data[0].id

    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=12, temperature=0)
    print(f"completion: {c.choices[0].text!r} ({c.choices[0].finish_reason}, {c.usage.completion_tokens} tokens)")

    print("chat (streamed): ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a haiku about caches."}],
        max_tokens=40, temperature=0.7, seed=3, stream=True)
    finish = None
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
            finish = chunk.choices[0].finish_reason or finish
    print(f"\n({finish})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
