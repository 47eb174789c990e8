// dashboard: the live page served at GET /dashboard (server/dashboard.html,
// carried in the binary by server/embed_text.py): self-contained HTML that
// polls /metrics and draws expert load per rank and layer, the imbalance
// gauge, KV usage per rank, all-to-all time per step, running and waiting
// requests, TTFT and ITL percentiles.
#ifndef MOESERVE_SERVER_DASHBOARD_H
#define MOESERVE_SERVER_DASHBOARD_H

#include <stddef.h>

extern const char dashboard_html[];   // (dashboard_html_len) bytes, then a NUL
extern const size_t dashboard_html_len;

#endif
