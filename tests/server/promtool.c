// promtool: runs promtool on a temporary file and filters its lints (see promtool.h).
#include "tests/server/promtool.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

// The lints vLLM's names draw; any other line promtool prints is a finding.
static int expected_lint(const char *line)
{
    if (strstr(line, "metric names should not contain ':'")) return 1;
    return (!strncmp(line, "moeserve:iteration_tokens_total ", 32) ||
            !strncmp(line, "vllm:iteration_tokens_total ", 28)) &&
           strstr(line, "non-counter metrics should not have \"_total\" suffix");
}

void promtool_check_metrics(const char *text)
{
    const char *promtool = getenv("MOESERVE_PROMTOOL");
    if (!promtool || !*promtool)
        fail_msg("promtool not found: install it with `apt-get install prometheus` "
                 "(deploy/setup.sh does), then run `meson setup --reconfigure build`");
    char in[] = "/tmp/moeserve-metrics-XXXXXX";
    int fd = mkstemp(in);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' check metrics < '%s' 2>&1", promtool, in);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    int other = 0;
    while (fgets(line, sizeof line, p)) {
        if (expected_lint(line)) continue;
        fprintf(stderr, "promtool: %s", line);
        other++;
    }
    int st = pclose(p);
    unlink(in);
    assert_int_equal(other, 0);
    // 3: lint findings only (the expected ones, filtered above).
    assert_true(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3));
}
