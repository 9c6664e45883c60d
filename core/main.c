/* main.c — the luainfer binary: one executable, many subcommands. */
#include "cli/cli.h"
#include "policy/policy_proc.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: luainfer COMMAND [options]\n\n"
            "commands:\n"
            "  serve        serve a model: msgpack-RPC (TCP/Unix) and OpenAI-style HTTP\n"
            "  repl         a LuaJIT prompt with a live engine (or --connect to a server)\n"
            "  generate     generate text from a prompt\n"
            "  perplexity   perplexity of a text file (llama.cpp's scheme)\n"
            "  info         what a GGUF model holds; --kv for KV-cache sizing\n"
            "  run          run a Lua script with the luainfer module (engines, policies)\n"
            "  quantize     requantize a GGUF: f16, bf16, q8_0, q4_0, q4_1, w8a8 (SmoothQuant), fp8\n"
            "  distill      train a student on a teacher's logits (core/train/: KL at a temperature + CE)\n"
            "  train-medusa train Medusa heads on a frozen base (its own distributions, shifted)\n"
            "  train-eagle  train an EAGLE-3 draft block on a frozen base (its features, training-time test)\n"
            "  prune        remove layers, KV groups or FFN channels, ranked on calibration text\n"
            "  bench        run a benchmark from bench/ (batching, prefix, policy_overhead, ...)\n"
            "\n'luainfer COMMAND --help' lists a command's options.\n"
            "The model defaults to $LUAINFER_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {
        {"generate", li_cmd_generate},
        {"perplexity", li_cmd_perplexity},
        {"info", li_cmd_info},
        {"run", li_cmd_run},
        {"bench", li_cmd_bench},
        {"quantize", li_cmd_quantize},
        {"distill", li_cmd_distill},
        {"train-medusa", li_cmd_train_medusa},
        {"train-eagle", li_cmd_train_eagle},
        {"prune", li_cmd_prune},
        {"policy-host", li_cmd_policy_host},
        {"serve", li_cmd_serve},
        {"repl", li_cmd_repl},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "luainfer: error: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
