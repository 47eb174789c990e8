// fuzz_py_literal: a model's text through api/py_literal. Promises: no
// crash, hang or leak on any bytes; a value read is plain JSON (no tag of
// the reader left in it) that json_dumps_py writes as valid UTF-8 JSON,
// which reads back equal; reading the same text again gives the same value.
#include <stdbool.h>

#include "api/py_literal.h"
#include "base/json.h"
#include "base/utf8.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    json_t *v = py_literal_parse((const char *)data, n);
    json_t *again = py_literal_parse((const char *)data, n);
    FUZZ_CHECK(!v == !again, "read once as %s, once as %s", v ? "a value" : "NULL", again ? "a value" : "NULL");
    if (v) {
        char *text = json_dumps_py(v);
        if (!text) abort(); // out of memory or nested past 1000: neither can be (depth 200)
        const size_t len = strlen(text);
        FUZZ_CHECK(utf8_valid_prefix((const uint8_t *)text, len) == len, "not UTF-8: %s", text);
        json_error_t je;
        json_t *back = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        // jansson reads no key holding a NUL ("\u0000" is valid JSON, and
        // Python reads it): that one refusal is jansson's, not the text's.
        const bool nul_key = !back && strstr(je.text, "NUL byte in object key");
        FUZZ_CHECK(back != NULL || nul_key, "not JSON (%s): %s", je.text, text);
        FUZZ_CHECK(nul_key || json_equal(back, v), "does not read back equal: %s", text);
        // By text: jansson's json_equal also cuts keys at a NUL.
        char *text2 = json_dumps_py(again);
        if (!text2) abort();
        FUZZ_CHECK(!strcmp(text, text2), "read twice, two values: %s and %s", text, text2);
        free(text2);
        json_decref(back);
        free(text);
    }
    json_decref(v);
    json_decref(again);
    return 0;
}
