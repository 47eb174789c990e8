// json: the shared jansson helpers (see json.h).
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"

const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "null";
}

void json_format_py_float(double d, char buf[40])
{
    if (isnan(d)) {
        strcpy(buf, "nan");
        return;
    }
    if (isinf(d)) {
        strcpy(buf, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        strcpy(buf, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    // The shortest digits that read back as d, placed the way Python's repr does.
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    const char *s = tmp;
    char *o = buf;
    if (*s == '-') {
        *o++ = '-';
        s++;
    }
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp10 = atoi(s + 1);
    int decpt = exp10 + 1;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) *o++ = digits[i];
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            for (int i = 0; i < decpt; i++) *o++ = digits[i];
            *o++ = '.';
            for (int i = decpt; i < nd; i++) *o++ = digits[i];
        }
        *o = 0;
        return;
    }
    *o++ = digits[0];
    if (nd > 1) {
        *o++ = '.';
        for (int i = 1; i < nd; i++) *o++ = digits[i];
    }
    int e = exp10 < 0 ? -exp10 : exp10;
    *o++ = 'e';
    *o++ = exp10 < 0 ? '-' : '+';
    if (e >= 100) *o++ = (char)('0' + e / 100);
    *o++ = (char)('0' + e / 10 % 10);
    *o++ = (char)('0' + e % 10);
    *o = 0;
}


// Python's json.dumps(v, ensure_ascii=False): ", " and ": " between items,
// strings escaped as Python escapes them (quote, backslash, the C escapes and
// \u00xx in lower-case hex for other control bytes), floats as repr.
static int dump_py(const json_t *v, struct ms_buf *b, int depth)
{
    if (depth > 1000) return MS_EINVAL;
    char num[40];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        size_t k_len;
        json_t *x;
        bool first = true;
        if (ms_buf_append(b, "{", 1)) return MS_ENOMEM;
        // By length: a key may hold a NUL (a Python literal's '\x00').
        json_object_keylen_foreach((json_t *)v, k, k_len, x) {
            json_t *key = json_stringn(k, k_len);
            int rc = key ? 0 : MS_ENOMEM;
            if (!rc && !first) rc = ms_buf_append(b, ", ", 2);
            if (!rc) rc = dump_py(key, b, depth + 1);
            json_decref(key);
            if (!rc) rc = ms_buf_append(b, ": ", 2);
            if (!rc) rc = dump_py(x, b, depth + 1);
            if (rc) return rc;
            first = false;
        }
        return ms_buf_append(b, "}", 1);
    }
    case JSON_ARRAY: {
        if (ms_buf_append(b, "[", 1)) return MS_ENOMEM;
        for (size_t i = 0; i < json_array_size(v); i++) {
            int rc = i ? ms_buf_append(b, ", ", 2) : 0;
            if (!rc) rc = dump_py(json_array_get(v, i), b, depth + 1);
            if (rc) return rc;
        }
        return ms_buf_append(b, "]", 1);
    }
    case JSON_REAL:
        json_format_py_float(json_real_value(v), num);
        return ms_buf_append(b, num, strlen(num));
    case JSON_STRING: {
        // Runs of bytes that need no escape go out whole; ensure_ascii=False
        // leaves everything from 0x20 up (DEL and UTF-8 included) as it is.
        const char *t = json_string_value(v);
        const size_t n = json_string_length(v);
        int rc = ms_buf_append(b, "\"", 1);
        size_t run = 0;
        for (size_t i = 0; i <= n && !rc; i++) {
            const unsigned char ch = i < n ? (unsigned char)t[i] : 0;
            if (i < n && ch >= 0x20 && ch != '"' && ch != '\\') continue;
            rc = ms_buf_append(b, t + run, i - run);
            run = i + 1;
            if (rc || i == n) break;
            const char *esc = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\n' ? "\\n" : ch == '\r' ? "\\r"
                              : ch == '\t' ? "\\t" : ch == '\b' ? "\\b" : ch == '\f' ? "\\f" : NULL;
            char u[8];
            if (!esc) {
                snprintf(u, sizeof u, "\\u%04x", ch);
                esc = u;
            }
            rc = ms_buf_append(b, esc, strlen(esc));
        }
        return rc ? rc : ms_buf_append(b, "\"", 1);
    }
    default: {
        char *t = json_dumps(v, JSON_ENCODE_ANY);
        int rc = t ? ms_buf_append(b, t, strlen(t)) : MS_ENOMEM;
        free(t);
        return rc;
    }
    }
}

char *json_dumps_py(const json_t *v)
{
    struct ms_buf b = {0};
    if (dump_py(v, &b, 0)) {
        ms_buf_free(&b);
        return NULL;
    }
    return ms_buf_steal(&b, NULL);
}

json_t *json_loadb_wide(const char *buf, size_t len, size_t flags)
{
    json_error_t je;
    json_t *v = json_loadb(buf, len, flags, &je);
    if (v || json_error_code(&je) != json_error_numeric_overflow) return v;
    return json_loadb(buf, len, flags | JSON_DECODE_INT_AS_REAL, NULL);
}
