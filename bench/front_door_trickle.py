#!/usr/bin/env python3
# front_door_trickle.py: what clients that trickle their request heads cost
# a running server's front gate (server/http.c), and whether /health keeps
# answering meanwhile. A benchmark, not a test: it asserts nothing.
#
#   bench/front_door_trickle.py PORT SERVER_PID [CLIENTS] [SECONDS]
#
# CLIENTS connections (100) each send 30 KiB of a head at once, then one
# more byte every 20 ms for SECONDS (10), never ending the head; /health is
# timed every half second on a fresh connection. Prints the server's CPU
# seconds over the run (from /proc) and the slowest /health. Run it once
# with CLIENTS 0 for the idle baseline, e.g. against
#   build/server/moeserve serve build/tests/tiny-model --port 8741
import os
import socket
import sys
import time


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health(port):
    t = time.time()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return time.time() - t, data.split(b"\r\n")[0].decode(errors="replace")


def main():
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    clients = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 10
    c0 = cpu_seconds(pid)
    socks = []
    for _ in range(clients):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 30000)
        socks.append(s)
    end = time.time() + seconds
    worst, sent, n, line = 0.0, 0, 0, ""
    while time.time() < end:
        for s in socks:
            try:
                s.send(b"a")
                sent += 1
            except OSError:
                pass
        if n % 25 == 0:
            dt, line = health(port)
            worst = max(worst, dt)
        n += 1
        time.sleep(0.02)
    used = cpu_seconds(pid) - c0
    print(f"{clients} clients trickled {sent} bytes in {seconds:g} s: server CPU {used:.2f} s, "
          f"slowest /health {worst * 1000:.1f} ms ({line})")


if __name__ == "__main__":
    main()
