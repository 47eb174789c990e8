// Pins the sd_notify messages: with $NOTIFY_SOCKET naming a datagram socket
// (what systemd passes a Type=notify service), READY=1 and STOPPING=1 arrive
// with their STATUS line; without it nothing is sent and nothing fails.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "moeserve_build.h"
#include "server/notify.h"

static void messages_reach_the_notify_socket(void **state)
{
    (void)state;
    if (!MOESERVE_HAVE_SYSTEMD) skip();
    char dir[] = "/tmp/moeserve-notify-XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/notify", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    setenv("NOTIFY_SOCKET", a.sun_path, 1);
    char buf[512];
    assert_true(notify_ready("serving qwen3 on 127.0.0.1:8000"));
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    assert_string_equal(buf, "READY=1\nSTATUS=serving qwen3 on 127.0.0.1:8000");
    assert_true(notify_stopping("draining: 3 requests running"));
    n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    assert_string_equal(buf, "STOPPING=1\nSTATUS=draining: 3 requests running");
    assert_true(notify_status("loading"));
    n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    assert_string_equal(buf, "STATUS=loading");
    unsetenv("NOTIFY_SOCKET");
    assert_false(notify_ready(NULL));
    close(fd);
    unlink(a.sun_path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(messages_reach_the_notify_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
