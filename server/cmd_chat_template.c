// cmd_chat_template: `moeserve chat-template MODEL_DIR` (or --template FILE)
// renders the model's chat template for each JSON request line on stdin and
// prints the prompt as one JSON string per line.
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/chat_template.h"
#include "base/base.h"
#include "base/cli.h"
#include "server/commands.h"
#include "tokenizer/tokenizer.h"

#define MAX_TEMPLATE_BYTES ((size_t)16 << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve chat-template MODEL_DIR [--repeat N]\n"
            "       moeserve chat-template --template FILE [--bos-token S] [--eos-token S] [--repeat N]\n"
            "\n"
            "Reads one JSON object per line on stdin:\n"
            "  {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true,\n"
            "   \"kwargs\": {\"enable_thinking\": false}}\n"
            "and prints the rendered prompt as one JSON string per line. A line that cannot be\n"
            "rendered prints {\"error\": \"...\"} instead, and the exit status is 1.\n"
            "\n"
            "MODEL_DIR supplies chat_template.jinja or tokenizer_config.json's chat_template,\n"
            "bos_token and eos_token. --repeat N renders each line N times and reports the\n"
            "time per render on stderr.\n");
}

// What the model directory says about chat templating.
struct model_template {
    char *source;         // the default template
    char *tool_source;    // a "tool_use" named template, or NULL
    char *bos, *eos;      // special token strings, or NULL
};

static void model_template_free(struct model_template *m)
{
    free(m->source);
    free(m->tool_source);
    free(m->bos);
    free(m->eos);
    memset(m, 0, sizeof *m);
}

// A special token is a string, an AddedToken object ({"content": ...}) or null.
static int token_string(const json_t *v, const char *field, char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return ms_err(err, errlen, MS_EFORMAT,
                      "tokenizer_config.json: %s must be a string, an object with \"content\", or null",
                      field);
    *out = strdup(json_string_value(v));
    return *out ? 0 : ms_err(err, errlen, MS_ENOMEM, "out of memory");
}

// Reads the template and special tokens from a model directory, as transformers
// does: chat_template.jinja when present, else tokenizer_config.json's chat_template
// (a string, or a list of {"name", "template"}). Kept in one place so it can move
// to the tokenizer module later.
static int model_template_load(const char *dir, struct model_template *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    char path[4096];
    int rc = ms_path_join(path, sizeof path, dir, "tokenizer_config.json");
    if (rc) return ms_err(err, errlen, rc, "model directory path too long: %s", dir);
    char *text = NULL;
    size_t len;
    rc = ms_read_file(path, (size_t)64 << 20, &text, &len, err, errlen);
    if (rc) return rc;
    json_error_t je;
    json_t *cfg = json_loadb(text, len, 0, &je);
    free(text);
    if (!cfg || !json_is_object(cfg)) {
        json_decref(cfg);
        return ms_err(err, errlen, MS_EFORMAT, "%s: not a JSON object (line %d: %s)", path, je.line,
                      je.text);
    }
    rc = token_string(json_object_get(cfg, "bos_token"), "bos_token", &m->bos, err, errlen);
    if (!rc) rc = token_string(json_object_get(cfg, "eos_token"), "eos_token", &m->eos, err, errlen);
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (!rc && json_is_string(ct)) {
        m->source = strdup(json_string_value(ct));
        if (!m->source) rc = ms_err(err, errlen, MS_ENOMEM, "out of memory");
    } else if (!rc && json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            const char *tpl = json_string_value(json_object_get(e, "template"));
            if (!name || !tpl) {
                rc = ms_err(err, errlen, MS_EFORMAT,
                            "%s: chat_template[%zu] needs string \"name\" and \"template\"", path, i);
                break;
            }
            char **slot = !strcmp(name, "default") ? &m->source : !strcmp(name, "tool_use") ? &m->tool_source : NULL;
            if (slot && !*slot && !(*slot = strdup(tpl))) {
                rc = ms_err(err, errlen, MS_ENOMEM, "out of memory");
                break;
            }
        }
    }
    json_decref(cfg);
    if (rc) {
        model_template_free(m);
        return rc;
    }
    // A separate chat_template.jinja takes precedence, as serve's tokenizer
    // takes it (newer checkpoints ship one).
    char *jinja;
    if ((rc = tok_read_chat_template_file(dir, &jinja, err, errlen))) {
        model_template_free(m);
        return rc;
    }
    if (jinja) {
        free(m->source);
        m->source = jinja;
    }
    if (!m->source) {
        model_template_free(m);
        return ms_err(err, errlen, MS_ENOTFOUND,
                      "%s/tokenizer_config.json has no chat_template (and there is no chat_template.jinja)",
                      dir);
    }
    return 0;
}

static void print_error(const char *msg)
{
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
    free(s);
    json_decref(o);
}

static int render_line(const struct chat_template *def, const struct chat_template *tool,
                       const struct model_template *m, const char *line, size_t len, long repeat,
                       double *seconds, char *err, size_t errlen)
{
    json_error_t je;
    json_t *req = json_loadb(line, len, 0, &je);
    if (!req || !json_is_object(req)) {
        json_decref(req);
        return ms_err(err, errlen, MS_EFORMAT, "the line is not a JSON object (column %d: %s)",
                      je.column, je.text);
    }
    int rc = 0;
    const json_t *agp = json_object_get(req, "add_generation_prompt");
    const json_t *tools = json_object_get(req, "tools");
    const json_t *kwargs = json_object_get(req, "kwargs");
    if (agp && !json_is_boolean(agp)) rc = ms_err(err, errlen, MS_EINVAL, "add_generation_prompt must be true or false");
    else if (kwargs && !json_is_object(kwargs) && !json_is_null(kwargs)) rc = ms_err(err, errlen, MS_EINVAL, "kwargs must be an object");
    if (rc) {
        json_decref(req);
        return rc;
    }
    struct chat_template_args a = {
        .messages = json_object_get(req, "messages"),
        .tools = json_is_null(tools) ? NULL : tools,
        .add_generation_prompt = agp && json_is_true(agp),
        .kwargs = json_is_object(kwargs) ? kwargs : NULL,
        .bos_token = m->bos,
        .eos_token = m->eos,
    };
    const struct chat_template *t = (tool && a.tools) ? tool : def;
    char *out = NULL;
    size_t outlen = 0;
    double t0 = ms_now();
    for (long i = 0; i < repeat && !rc; i++) {
        free(out);
        out = NULL;
        rc = chat_template_render(t, &a, &out, &outlen, err, errlen);
    }
    *seconds += ms_now() - t0;
    if (!rc) {
        json_t *s = json_stringn(out, outlen);
        char *dumped = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        if (!dumped) rc = ms_err(err, errlen, MS_EINVAL, "the rendered prompt is not valid UTF-8");
        else printf("%s\n", dumped);
        free(dumped);
        json_decref(s);
    }
    free(out);
    json_decref(req);
    return rc;
}

int cmd_chat_template(int argc, char **argv)
{
    static const struct option opts[] = {
        {"template", required_argument, NULL, 't'},
        {"bos-token", required_argument, NULL, 'b'},
        {"eos-token", required_argument, NULL, 'e'},
        {"repeat", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *template_file = NULL, *bos = NULL, *eos = NULL;
    long repeat = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': template_file = optarg; break;
        case 'b': bos = optarg; break;
        case 'e': eos = optarg; break;
        case 'r': {
            char err[256];
            int64_t v;
            if (cli_parse_int("--repeat", optarg, 1, 100000000, &v, err, sizeof err)) {
                fprintf(stderr, "chat-template: %s\n", err);
                return 2;
            }
            repeat = (long)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    const char *model_dir = optind < argc ? argv[optind] : NULL;
    if ((!model_dir) == (!template_file) || optind + (model_dir ? 1 : 0) != argc) {
        fprintf(stderr, "chat-template: give either MODEL_DIR or --template FILE\n\n");
        usage(stderr);
        return 2;
    }
    char err[1024];
    struct model_template m = {0};
    if (model_dir) {
        if (model_template_load(model_dir, &m, err, sizeof err)) {
            fprintf(stderr, "chat-template: %s\n", err);
            return 1;
        }
    } else {
        size_t len;
        if (ms_read_file(template_file, MAX_TEMPLATE_BYTES, &m.source, &len, err, sizeof err)) {
            fprintf(stderr, "chat-template: %s\n", err);
            return 1;
        }
    }
    if (bos) {
        free(m.bos);
        m.bos = strdup(bos);
    }
    if (eos) {
        free(m.eos);
        m.eos = strdup(eos);
    }
    struct chat_template *def = NULL, *tool = NULL;
    if (chat_template_parse(m.source, strlen(m.source), &def, err, sizeof err) ||
        (m.tool_source && chat_template_parse(m.tool_source, strlen(m.tool_source), &tool, err, sizeof err))) {
        fprintf(stderr, "chat-template: %s\n", err);
        chat_template_destroy(def);
        model_template_free(&m);
        return 1;
    }
    int status = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lines = 0;
    double seconds = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        if (n == 0) continue;
        lines++;
        if (render_line(def, tool, &m, line, (size_t)n, repeat, &seconds, err, sizeof err)) {
            print_error(err);
            status = 1;
        }
        fflush(stdout);
    }
    free(line);
    if (repeat > 1 && lines)
        fprintf(stderr, "chat-template: %ld line(s) x %ld renders: %.2f us per render\n", lines,
                repeat, seconds * 1e6 / (double)(lines * repeat));
    chat_template_destroy(def);
    chat_template_destroy(tool);
    model_template_free(&m);
    return status;
}
