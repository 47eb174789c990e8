// fuzz_output_parser: the check behind api/output_parser's promise, shared by
// the unit tests (tests/api/test_output_parser.c) and the libFuzzer entry.
#ifndef MOESERVE_TESTS_FUZZ_OUTPUT_PARSER_H
#define MOESERVE_TESTS_FUZZ_OUTPUT_PARSER_H

#include <stddef.h>
#include <stdint.h>

#include "api/output_parser.h"

// Feeds text[0..n) whole, then cut at cuts[0..n_cuts) (ascending offsets in
// [0, n]; a repeated offset feeds an empty delta), and checks that both runs
// keep the promise: every event is well formed (valid UTF-8, no empty text,
// call indices 0, 1, 2... with arguments only for a begun call), the events
// add up to the parser's own totals, nothing is held after finish, and the
// split run adds up to exactly what the whole run did. Returns 0, or 1 with
// a sentence in why.
int output_parser_check_split(const struct output_parser_opts *o, const char *text, size_t n,
                              const size_t *cuts, size_t n_cuts, char *why, size_t whylen);

// The fuzz target: data[0] picks the options, data[1] seeds the cut points,
// the rest is the text. Returns 0, or 1 when the promise broke (libFuzzer's
// entry aborts then).
int fuzz_output_parser(const uint8_t *data, size_t n);

#endif
