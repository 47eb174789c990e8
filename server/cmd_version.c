// cmd_version: `moeserve version` — the version and what this build was compiled with.
#include <stdio.h>

#include "moeserve_build.h"
#include "server/commands.h"

int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("moeserve %s\n", MOESERVE_VERSION);
    printf("cuda: %s\nnccl: %s\nsystemd: %s\n", MOESERVE_HAVE_CUDA ? "yes" : "no",
           MOESERVE_HAVE_NCCL ? "yes" : "no", MOESERVE_HAVE_SYSTEMD ? "yes" : "no");
    return 0;
}
