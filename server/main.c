// main: dispatches `moeserve <command>` to the subcommands in commands.h,
// and says what a SIGBUS means before the process dies of it.
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

// The weights (the checkpoint's safetensors, the weights cache) are files
// mapped into memory: one truncated under a running process (root's cp over
// the read-only cache, a checkpoint rewritten in place) or unreadable (an
// I/O error) takes its pages away, and the next touch is a SIGBUS, which
// would end the server with only "Bus error". The first thread to fault
// writes the sentence in one write(2) (every compute thread may fault at
// once: the others wait, so that none ends the process mid-sentence), puts
// the default action back and returns: the access runs again and ends the
// process with its core dump. A SIGBUS another process sent (kill -BUS) has
// no address and is only named, then raised again to end the process as it
// would have. Async-signal-safe: a lock-free flag, clock_gettime, write,
// sigaction, raise.
static atomic_flag sigbus_first = ATOMIC_FLAG_INIT;
static atomic_int sigbus_done;

static void sigbus_default(void)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    if (atomic_flag_test_and_set(&sigbus_first)) {
        // Another thread is saying why. Its write may block (stderr a full
        // pipe whose reader stalled): after 2 s the default action is put
        // back here, and the access running again ends the process.
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (!atomic_load(&sigbus_done)) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > 2) {
                sigbus_default();
                break;
            }
        }
        return;
    }
    static const char why[] =
        ": a file this process maps (the checkpoint's safetensors, or the weights cache its log "
        "named) was truncated or could not be read (an I/O error) under it. Replace such files by "
        "renaming a new one over them, never by writing into them (cp, truncate), and start again.\n";
    static const char other[] = ": not a mapped file's missing page (a misaligned access, or a memory "
                                "error the hardware reported)\n";
    static const char sent[] = "moeserve: SIGBUS sent by another process (kill -BUS): ending\n";
    char msg[64 + sizeof why] = "moeserve: SIGBUS at address 0x";
    size_t n = strlen(msg);
    const bool fault = si && si->si_code > 0;
    if (fault) {
        const uintptr_t a = (uintptr_t)si->si_addr;
        for (int i = (int)sizeof a * 8 - 4; i >= 0; i -= 4) msg[n++] = "0123456789abcdef"[(a >> i) & 15];
        // A page past a file's end is BUS_ADRERR; the rest are not ours to explain.
        const char *tail = si->si_code == BUS_ADRERR ? why : other;
        const size_t tl = si->si_code == BUS_ADRERR ? sizeof why - 1 : sizeof other - 1;
        memcpy(msg + n, tail, tl);
        n += tl;
    }
    ssize_t r = fault ? write(STDERR_FILENO, msg, n) : write(STDERR_FILENO, sent, sizeof sent - 1);
    (void)r;
    sigbus_default();
    atomic_store(&sigbus_done, 1);
    if (!fault) raise(sig); // blocked in here: pending until the handler returns, then the default
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
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
