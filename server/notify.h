// notify: tells the service manager where the server stands (systemd's
// Type=notify protocol, via libsystemd's sd_notify): READY=1 once the model
// is loaded and the engine runs, STOPPING=1 when the drain begins, STATUS=
// lines for `systemctl status`. Without libsystemd at build time, or when
// not started by systemd (no $NOTIFY_SOCKET), every call does nothing.
#ifndef MOESERVE_SERVER_NOTIFY_H
#define MOESERVE_SERVER_NOTIFY_H

#include <stdbool.h>

// Each returns true when a message was sent to a service manager.
bool notify_ready(const char *status);
bool notify_stopping(const char *status);
bool notify_status(const char *status);

#endif
