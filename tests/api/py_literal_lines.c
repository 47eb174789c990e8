// py_literal_lines: for tests/api/compare_py_literals.py, each line of stdin
// a JSON string, the text py_literal_parse reads; each line of stdout that
// value as json.dumps writes it (json_dumps_py), or "!" where it is NULL.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/py_literal.h"
#include "base/json.h"

int main(void)
{
    static char line[1 << 20];
    while (fgets(line, sizeof line, stdin)) {
        json_error_t je;
        json_t *in = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!json_is_string(in)) {
            fprintf(stderr, "py_literal_lines: not a JSON string: %s", line);
            return 2;
        }
        json_t *v = py_literal_parse(json_string_value(in), json_string_length(in));
        char *out = v ? json_dumps_py(v) : NULL;
        printf("%s\n", out ? out : "!");
        free(out);
        json_decref(v);
        json_decref(in);
    }
    return 0;
}
