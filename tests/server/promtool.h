// promtool: `promtool check metrics` for every test that produces /metrics
// text, with one policy: promtool must be present (meson finds it and passes
// its path in MOESERVE_PROMTOOL; deploy/setup.sh installs it), and a test
// that needs it fails, saying how to install it, when it is not.
#ifndef MOESERVE_TESTS_SERVER_PROMTOOL_H
#define MOESERVE_TESTS_SERVER_PROMTOOL_H

// Fails the running cmocka test unless promtool parses text and reports
// nothing but the two lints that vLLM's series names (which moeserve keeps,
// so dashboards built for vLLM read the same) draw: the colon of the
// `moeserve:` prefix, and `_total` on the iteration_tokens_total histogram.
void promtool_check_metrics(const char *text);

#endif
