// cli: flags and numbers on the subcommands' command lines, each number read
// whole and range checked, and refused with one wording: `FLAG must be WHAT, not "VALUE"`.
// Every parser returns 0 with *out set, or MS_EINVAL with that sentence in
// err (out untouched). Pure functions: any thread.
#ifndef MOESERVE_BASE_CLI_H
#define MOESERVE_BASE_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The refusal sentence for a check the parsers below do not make ("--request-rate
// must be a positive number or inf, not \"0\""). Returns MS_EINVAL.
int cli_refuse(const char *flag, const char *value, const char *what, char *err, size_t errlen);

// A decimal integer in [lo, hi], in strtoll's form (leading blanks, a sign).
// Empty text, trailing characters and values beyond 64 bits are refused.
int cli_parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out,
                  char *err, size_t errlen);
// A decimal integer from 0 to UINT64_MAX with no sign (seeds).
int cli_parse_u64(const char *flag, const char *s, uint64_t *out, char *err, size_t errlen);
// A number in strtod's forms within [lo, hi] (hi may be INFINITY, and then
// "inf" is taken); NaN and values beyond double's range are refused.
int cli_parse_double(const char *flag, const char *s, double lo, double hi, double *out,
                     char *err, size_t errlen);
// vLLM's human-readable counts: "32K" = 32768, "32k" = 32000, "25.6k" =
// 25600, "1M", "1m", "1G", "1g", "1T", "1t", "1e3"; no sign, no hex. The
// value must be a whole number in [lo, hi].
int cli_parse_count(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen);
// A size in bytes, at least lo: "4GiB", "512MiB", "2G" (binary: an upper-case
// K/M/G/T alone or with iB), "2g" or "2GB" (decimal), "1e9", "123"; a
// fraction of a byte is dropped. Beyond SIZE_MAX is refused.
int cli_parse_bytes(const char *flag, const char *s, size_t lo, size_t *out, char *err,
                    size_t errlen);

// Whether argv[*i] is the flag name: "--name value", "--name=value", or
// "--name" alone when it takes no value. 1 with *value set (NULL for a flag
// without one) and *i advanced past a separate value; 0 when argv[*i] is
// another argument; MS_EINVAL with a sentence when the value is missing or
// a flag without one got one.
int cli_match(const char *name, bool takes_value, int argc, char **argv, int *i,
              const char **value, char *err, size_t errlen);

#endif
