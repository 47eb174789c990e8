// cli: command-line number parsing and its one refusal sentence (see cli.h).
#include "base/cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

// How counts read, said where the range leaves room for a suffix.
#define COUNT_SUFFIXES "(2K = 2048, 2k = 2000)"
#define BYTES_EXAMPLES "(e.g. 4GiB, 512MiB, 4GB, 1073741824)"

int cli_refuse(const char *flag, const char *value, const char *what, char *err, size_t errlen)
{
    return ms_err(err, errlen, MS_EINVAL, "%s must be %s, not \"%.200s\"", flag, what, value);
}

// "a whole number from LO to HI", or "... >= LO" when there is no upper end.
static int refuse_range(const char *flag, const char *s, int64_t lo, int64_t hi,
                        const char *examples, char *err, size_t errlen)
{
    char what[160];
    if (hi == INT64_MAX)
        snprintf(what, sizeof what, "a whole number >= %lld%s%s", (long long)lo,
                 examples ? " " : "", examples ? examples : "");
    else
        snprintf(what, sizeof what, "a whole number from %lld to %lld%s%s", (long long)lo,
                 (long long)hi, examples ? " " : "", examples ? examples : "");
    return cli_refuse(flag, s, what, err, errlen);
}

int cli_parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out,
                  char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return refuse_range(flag, s, lo, hi, NULL, err, errlen);
    *out = v;
    return 0;
}

int cli_parse_u64(const char *flag, const char *s, uint64_t *out, char *err, size_t errlen)
{
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    char *end = (char *)p;
    errno = 0;
    // strtoull would take "-1" as 2^64 - 1.
    unsigned long long v = *p == '-' ? 0 : strtoull(p, &end, 10);
    if (errno || end == p || *end)
        return cli_refuse(flag, s, "a whole number from 0 to 18446744073709551615", err, errlen);
    *out = v;
    return 0;
}

int cli_parse_double(const char *flag, const char *s, double lo, double hi, double *out,
                     char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        char what[96];
        if (isinf(hi)) snprintf(what, sizeof what, "a number >= %g", lo);
        else snprintf(what, sizeof what, "a number from %g to %g", lo, hi);
        return cli_refuse(flag, s, what, err, errlen);
    }
    *out = v;
    return 0;
}

// The value of a multiplier letter; 0 when c is not one.
static double suffix_mult(char c, bool binary)
{
    static const char letters[] = "kmgt";
    const char *p = strchr(letters, tolower((unsigned char)c));
    if (!p || !c) return 0;
    int e = (int)(p - letters) + 1;
    return binary ? ldexp(1.0, 10 * e) : pow(1000.0, e);
}

// Splits "<number><suffix>" and returns the number times the multiplier.
// bytes_units admits the B, iB and decimal-B spellings.
static int parse_scaled(const char *s, bool bytes_units, long double *out)
{
    if (!s || !*s) return MS_EINVAL;
    const char *p = s;
    while (*p == ' ') p++;
    if (*p == '-' || *p == '+') return MS_EINVAL; // sizes and counts are never signed
    errno = 0;
    char *end;
    long double v = strtold(p, &end);
    if (end == p || errno == ERANGE || !isfinite((double)v) || v < 0) return MS_EINVAL;
    // strtold takes hex and inf/nan too; allow only digits, '.', and exponents.
    for (const char *q = p; q < end; q++)
        if (!isdigit((unsigned char)*q) && *q != '.' && *q != 'e' && *q != 'E' && *q != '+' &&
            *q != '-')
            return MS_EINVAL;
    const char *u = end;
    long double mult = 1;
    if (*u) {
        char c = *u;
        bool upper = isupper((unsigned char)c);
        if (!suffix_mult(c, true)) {
            if (bytes_units && (!strcmp(u, "B") || !strcmp(u, "b"))) u += 1, c = 0;
            else return MS_EINVAL;
        }
        if (c) {
            u++;
            if (!*u) {
                mult = suffix_mult(c, upper); // K = 1024, k = 1000, as vLLM reads them
            } else if (bytes_units && (!strcmp(u, "iB") || !strcmp(u, "ib") || !strcmp(u, "i"))) {
                mult = suffix_mult(c, true);
                u += strlen(u);
            } else if (bytes_units && (!strcmp(u, "B") || !strcmp(u, "b"))) {
                mult = suffix_mult(c, false);
                u += 1;
            } else {
                return MS_EINVAL;
            }
        }
        if (*u) return MS_EINVAL;
    }
    v *= mult;
    // Decimal fractions such as 25.6k are not exact in binary: snap to the
    // whole number they mean.
    long double r = roundl(v);
    if (fabsl(v - r) <= 1e-9L * (r > 1 ? r : 1)) v = r;
    *out = v;
    return 0;
}

int cli_parse_count(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen)
{
    long double v;
    if (parse_scaled(s, false, &v) || v != floorl(v) || v < (long double)lo ||
        v > (long double)hi)
        return refuse_range(flag, s ? s : "", lo, hi, hi >= 2000 ? COUNT_SUFFIXES : NULL, err,
                            errlen);
    *out = (int64_t)v;
    return 0;
}

int cli_parse_bytes(const char *flag, const char *s, size_t lo, size_t *out, char *err,
                    size_t errlen)
{
    long double v;
    int rc = parse_scaled(s, true, &v);
    if (!rc) v = floorl(v);
    if (rc || v > (long double)SIZE_MAX || v < (long double)lo) {
        char what[160];
        if (lo <= 1)
            snprintf(what, sizeof what, "a %ssize " BYTES_EXAMPLES, lo ? "positive " : "");
        else
            snprintf(what, sizeof what, "a size of at least %zu bytes " BYTES_EXAMPLES, lo);
        return cli_refuse(flag, s ? s : "", what, err, errlen);
    }
    *out = (size_t)v;
    return 0;
}

int cli_match(const char *name, bool takes_value, int argc, char **argv, int *i,
              const char **value, char *err, size_t errlen)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n)) return 0;
    if (arg[n] == '=') {
        if (!takes_value)
            return ms_err(err, errlen, MS_EINVAL, "%s takes no value (got \"%s\")", name, arg + n + 1);
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n]) return 0;
    if (!takes_value) {
        *value = NULL;
        return 1;
    }
    if (*i + 1 >= argc) return ms_err(err, errlen, MS_EINVAL, "%s needs a value", name);
    *value = argv[++*i];
    return 1;
}
