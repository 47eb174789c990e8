// main: dispatches `moeserve <command>` to the subcommands in commands.h.
#include <stdio.h>
#include <string.h>

#include "moeserve_build.h"
#include "server/commands.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

// Keep sorted by name; `moeserve help` prints them in this order.
static const struct command commands[] = {
    {"bench", cmd_bench, "load-test an OpenAI-compatible server (like vllm bench serve)"},
    {"bench-offline", cmd_bench_offline, "offline throughput on random prompts (vllm bench throughput)"},
    {"chat-template", cmd_chat_template, "render a model's chat template for JSON request lines"},
    {"generate", cmd_generate, "run a model on one prompt (token ids or text); --bench for speed"},
    {"make-model", cmd_make_model, "write a random-weight checkpoint (tiny for tests, demo)"},
    {"plan", cmd_plan, "size a deployment from config.json: parameters, memory, KV capacity"},
    {"serve", cmd_serve, "serve the OpenAI-compatible HTTP API (chat, completions, streaming)"},
    {"tokenize", cmd_tokenize, "encode or decode JSON lines with a model's tokenizer"},
    {"version", cmd_version, "print the version and the backends this build has"},
};

static void print_usage(FILE *f)
{
    fprintf(f, "usage: moeserve <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`moeserve <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version")) name = "version";
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "moeserve: unknown command '%s'\n\n", name);
    print_usage(stderr);
    return 2;
}
