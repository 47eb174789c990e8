// notify: sd_notify messages (READY, STOPPING, STATUS) when built with libsystemd.
#include "server/notify.h"

#include <stdio.h>

#include "moeserve_build.h"

#if MOESERVE_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static bool send_state(const char *state, const char *status)
{
    // sd_notify returns > 0 when sent, 0 when $NOTIFY_SOCKET is unset.
    int rc = status ? sd_notifyf(0, "%s%sSTATUS=%s", state, *state ? "\n" : "", status)
                    : sd_notify(0, state);
    return rc > 0;
}
#else
static bool send_state(const char *state, const char *status)
{
    (void)state;
    (void)status;
    return false;
}
#endif

bool notify_ready(const char *status) { return send_state("READY=1", status); }
bool notify_stopping(const char *status) { return send_state("STOPPING=1", status); }
bool notify_status(const char *status) { return send_state("", status ? status : ""); }
