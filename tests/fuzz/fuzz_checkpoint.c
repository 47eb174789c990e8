// fuzz_checkpoint: quantized checkpoints as a hostile or broken tool edits
// them, through model/model.c's binding and model/quant.c's reading. The
// safetensors layer has its own target (fuzz_safetensors); this one starts
// from valid files, so that every input reaches the binder. At the first
// call make-model writes a micro model (hidden 32, one MoE layer of two
// experts, vocabulary 32) in each quantized format: FP8 by block, GPTQ
// symmetric and with zero points, AWQ, compressed-tensors int4 symmetric
// and with zero points, int8 and FP8 by channel, GPTQ and compressed-tensors
// int4 in act-order. An input is the format's
// index, then edits of 8 bytes each: a tensor's dtype or one dimension
// changed, the tensor dropped, copied under a companion's name (g_idx,
// zero points, scales, weight_shape), bytes of its data overwritten, or a
// config.json setting changed (group size, symmetry, act-order). The edited
// tensors are laid out again as safetensors lays them out and the model
// loaded. Promises: a refusal with a sentence, or a model whose every
// quantized projection reads back into its canonical rows within its
// tensors (ASan sees any byte outside), with finite-or-not values but no
// crash, and an act-order one's input and output orders permutations;
// nothing leaks.
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/makemodel.h"
#include "model/model.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "tests/fuzz/fuzz.h"

static const struct {
    enum quant_method q;
    int group, bits;
    bool asym, act;
} formats[] = {
    {QUANT_METHOD_FP8, 16, 0, false, false},   {QUANT_METHOD_GPTQ, 16, 0, false, false},
    {QUANT_METHOD_GPTQ, 16, 0, true, false},   {QUANT_METHOD_AWQ, 16, 0, false, false},
    {QUANT_METHOD_CT_INT, 16, 4, false, false}, {QUANT_METHOD_CT_INT, 16, 4, true, false},
    {QUANT_METHOD_CT_INT, 16, 8, false, false}, {QUANT_METHOD_CT_FP8, 0, 0, false, false},
    // act-order: g_idx groups the inputs out of their order
    {QUANT_METHOD_GPTQ, 8, 0, true, true},     {QUANT_METHOD_CT_INT, 8, 4, false, true},
    {QUANT_METHOD_CT_INT, 8, 4, true, true}, // five tensors a weight
};
#define N_FORMATS (sizeof formats / sizeof formats[0])
#define MAX_TENSORS 128

struct tensor_copy {
    char name[160];
    char dtype[16];
    int ndim;
    int64_t shape[4];
    uint8_t *data;
    size_t n;
};

struct format_base {
    char *config; // config.json's text
    struct tensor_copy t[MAX_TENSORS];
    int n;
};

static struct format_base bases[N_FORMATS];
static char root[128], work[160];
static long loads, refusals; // FUZZ_CHECKPOINT_STATS=1 prints them at exit

static void print_stats(void)
{
    if (getenv("FUZZ_CHECKPOINT_STATS")) fprintf(stderr, "fuzz_checkpoint: %ld loaded, %ld refused\n", loads, refusals);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void forget_files(void) { remove_tree(root); }

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) abort();
    b[n] = 0;
    fclose(f);
    return b;
}

static void make_bases(void)
{
    snprintf(root, sizeof root, "/dev/shm/moeserve-fuzz-ckpt-%d", (int)getpid());
    snprintf(work, sizeof work, "%s/work", root);
    if (mkdir(root, 0700) || mkdir(work, 0700)) abort();
    atexit(forget_files);
    atexit(print_stats);
    for (size_t f = 0; f < N_FORMATS; f++) {
        struct makemodel_spec s;
        char err[512], dir[256], path[320];
        if (makemodel_spec_for_shape("tiny", &s, err, sizeof err)) abort();
        s.vocab_size = 32;
        s.hidden_size = 32;
        s.intermediate_size = 32;
        s.n_layers = 1;
        s.n_heads = 2;
        s.n_kv_heads = 1;
        s.head_dim = 16;
        s.n_experts = 2;
        s.n_experts_per_tok = 1;
        s.moe_intermediate_size = 16;
        s.quant = formats[f].q;
        s.quant_group = formats[f].group;
        s.quant_bits = formats[f].bits;
        s.quant_asym = formats[f].asym;
        s.quant_act_order = formats[f].act;
        snprintf(dir, sizeof dir, "%s/f%zu", root, f);
        if (makemodel_write(&s, dir, 3, NULL, err, sizeof err)) {
            fprintf(stderr, "make-model: %s\n", err);
            abort();
        }
        snprintf(path, sizeof path, "%s/config.json", dir);
        bases[f].config = slurp(path);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        struct safetensors *st;
        if (safetensors_open_file(path, &st, err, sizeof err)) abort();
        for (size_t i = 0; i < safetensors_count(st) && bases[f].n < MAX_TENSORS; i++) {
            const struct st_tensor *t = safetensors_get(st, i);
            struct tensor_copy *c = &bases[f].t[bases[f].n++];
            snprintf(c->name, sizeof c->name, "%s", t->name);
            snprintf(c->dtype, sizeof c->dtype, "%s", t->dtype_str);
            c->ndim = t->ndim;
            for (int k = 0; k < t->ndim && k < 4; k++) c->shape[k] = t->shape[k];
            c->n = t->nbytes;
            c->data = malloc(c->n ? c->n : 1);
            if (!c->data) abort();
            memcpy(c->data, t->data, c->n);
        }
        safetensors_close(st);
    }
}

static const char *const dtypes[] = {"BF16", "F16", "F32", "I32", "I64", "I8", "U8", "F8_E4M3", "F64", "BOOL"};
static size_t dtype_bytes(const char *d)
{
    if (!strcmp(d, "I64") || !strcmp(d, "F64")) return 8;
    if (!strcmp(d, "F32") || !strcmp(d, "I32")) return 4;
    if (!strcmp(d, "BF16") || !strcmp(d, "F16")) return 2;
    return 1;
}

// A tensor's data resized to its shape, the old bytes kept where they fit.
static void reshape(struct tensor_copy *c)
{
    size_t n = dtype_bytes(c->dtype);
    for (int k = 0; k < c->ndim; k++) n *= (size_t)c->shape[k];
    uint8_t *d = calloc(n ? n : 1, 1);
    if (!d) abort();
    memcpy(d, c->data, n < c->n ? n : c->n);
    free(c->data);
    c->data = d;
    c->n = n;
}

static const char *const companions[] = {".g_idx", ".qzeros", ".weight_zero_point", ".weight_scale",
                                         ".weight_scale_inv", ".weight_shape", ".weight_g_idx", ".input_scale"};

// config.json edits: a key's value replaced where the text has it.
static void edit_config(char **cfg, const char *key, const char *value)
{
    char *at = strstr(*cfg, key);
    if (!at) return;
    char *v = strchr(at + strlen(key), ':');
    if (!v) return;
    v++;
    while (*v == ' ') v++;
    size_t old = strcspn(v, ",\n}");
    const size_t head = (size_t)(v - *cfg), tail = strlen(v + old);
    char *out = malloc(head + strlen(value) + tail + 1);
    if (!out) abort();
    memcpy(out, *cfg, head);
    strcpy(out + head, value);
    strcpy(out + head + strlen(value), v + old);
    free(*cfg);
    *cfg = out;
}

static void write_files(const char *config, const struct tensor_copy *t, int n)
{
    char path[320];
    snprintf(path, sizeof path, "%s/config.json", work);
    fuzz_write(path, config, strlen(config));
    json_t *h = json_object();
    size_t off = 0;
    for (size_t esz = 8; esz >= 1; esz /= 2)
        for (int i = 0; i < n; i++) {
            if (dtype_bytes(t[i].dtype) != esz) continue;
            json_t *shape = json_array();
            for (int k = 0; k < t[i].ndim; k++) json_array_append_new(shape, json_integer(t[i].shape[k]));
            json_object_set_new(h, t[i].name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", t[i].dtype, "shape", shape,
                                                         "data_offsets", (json_int_t)off,
                                                         (json_int_t)(off + t[i].n)));
            off += t[i].n;
        }
    char *text = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (!text) abort();
    const size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7;
    snprintf(path, sizeof path, "%s/model.safetensors", work);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    uint8_t l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(text, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    for (size_t esz = 8; esz >= 1; esz /= 2)
        for (int i = 0; i < n; i++)
            if (dtype_bytes(t[i].dtype) == esz) fwrite(t[i].data, 1, t[i].n, f);
    if (fclose(f)) abort();
    free(text);
}

// Every quantized projection read back whole (quant_tensor_rows).
static void read_back(const struct tensor *t)
{
    if (t->quant.format == QUANT_NONE) return;
    const int rows = (int)t->shape[0], K = (int)t->shape[1];
    FUZZ_CHECK(rows > 0 && K > 0, "a %d x %d projection", rows, K);
    const int G = t->quant.group > 0 ? t->quant.group : K;
    void *buf = malloc(quant_rows_bytes(1, K, t->quant.format, G));
    float *tmp = malloc((size_t)K * sizeof *tmp);
    if (!buf || !tmp) abort();
    struct quant_rows r;
    quant_rows_init(&r, buf, 1, K, t->quant.format, G);
    // An act-order input (or output) order: each input (output) once.
    for (int side = 0; side < 2; side++) {
        const int32_t *order = side ? t->quant.row_perm : t->quant.perm;
        const int n = side ? rows : K;
        if (!order) continue;
        bool *seen = calloc((size_t)n, 1);
        if (!seen) abort();
        for (int j = 0; j < n; j++) {
            FUZZ_CHECK(order[j] >= 0 && order[j] < n && !seen[order[j]], "%s order entry %d is %d of %d",
                       side ? "output" : "input", j, (int)order[j], n);
            seen[order[j]] = true;
        }
        free(seen);
    }
    for (int o = 0; o < rows; o++) {
        quant_tensor_rows(t, o, 1, &r, tmp);
        for (int g = 0; g < r.n_groups; g++)
            FUZZ_CHECK(t->quant.format != QUANT_INT4 || r.zero[g] <= 16, "zero point %d", r.zero[g]);
    }
    free(tmp);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (!root[0]) make_bases();
    if (n < 1) return 0;
    const struct format_base *b = &bases[data[0] % N_FORMATS];
    static struct tensor_copy t[MAX_TENSORS + 8];
    int nt = 0;
    for (int i = 0; i < b->n; i++) {
        t[nt] = b->t[i];
        t[nt].data = malloc(b->t[i].n ? b->t[i].n : 1);
        if (!t[nt].data) abort();
        memcpy(t[nt].data, b->t[i].data, b->t[i].n);
        nt++;
    }
    char *config = strdup(b->config);
    if (!config) abort();
    for (size_t at = 1; at + 8 <= n; at += 8) {
        const uint8_t *e = data + at;
        struct tensor_copy *c = nt ? &t[e[1] % nt] : NULL;
        const unsigned v = (unsigned)e[2] | (unsigned)e[3] << 8;
        switch (e[0] % 8) {
        case 0: // another dtype
            if (!c) break;
            snprintf(c->dtype, sizeof c->dtype, "%s", dtypes[e[2] % (sizeof dtypes / sizeof dtypes[0])]);
            reshape(c);
            break;
        case 1: // one dimension (0 to 300), or one more or fewer of them
            if (!c) break;
            if (e[4] % 8 == 0 && c->ndim < 4) c->shape[c->ndim++] = 1 + v % 3;
            else if (e[4] % 8 == 1 && c->ndim > 0) c->ndim--;
            else if (c->ndim > 0) c->shape[e[5] % c->ndim] = v % 301;
            reshape(c);
            break;
        case 2: // dropped
            if (!c) break;
            free(c->data);
            *c = t[--nt];
            break;
        case 3: { // copied under a companion's name
            if (!c || nt >= MAX_TENSORS + 8) break;
            struct tensor_copy *d = &t[nt];
            *d = *c;
            char *dot = strrchr(d->name, '.');
            if (dot) *dot = 0;
            const size_t l = strlen(d->name);
            snprintf(d->name + l, sizeof d->name - l, "%s", companions[e[2] % (sizeof companions / sizeof companions[0])]);
            bool dup = false;
            for (int i = 0; i < nt && !dup; i++) dup = !strcmp(t[i].name, d->name);
            if (dup) break;
            d->data = malloc(c->n ? c->n : 1);
            if (!d->data) abort();
            memcpy(d->data, c->data, c->n);
            nt++;
            break;
        }
        case 4: // bytes of its data
        case 5:
            if (!c || !c->n) break;
            for (int k = 0; k < 4; k++) c->data[(v + (size_t)k) % c->n] = e[4 + k];
            break;
        case 6: { // a config setting
            static const char *const keys[] = {"\"group_size\"", "\"sym\"", "\"symmetric\"", "\"desc_act\"",
                                               "\"actorder\"", "\"strategy\"", "\"num_bits\"", "\"bits\"",
                                               "\"weight_block_size\"", "\"zero_point\""};
            static const char *const values[] = {"8", "16", "32", "-1", "0", "24", "true", "false", "null",
                                                 "\"group\"", "\"channel\"", "\"tensor\"", "\"block\"", "4",
                                                 "[16, 16]", "[8, 32]"};
            edit_config(&config, keys[e[2] % (sizeof keys / sizeof keys[0])],
                        values[e[3] % (sizeof values / sizeof values[0])]);
            break;
        }
        default: // the whole data area of one tensor set to one byte value
            if (!c) break;
            memset(c->data, e[4], c->n);
            break;
        }
    }
    write_files(config, t, nt);
    for (int i = 0; i < nt; i++) free(t[i].data);
    free(config);
    struct model *m = NULL;
    char err[1024] = "";
    const struct model_load_opts o = {.cache_dir = "none"};
    const int rc = model_load_opts(work, &o, &m, err, sizeof err);
    if (rc) {
        FUZZ_REFUSAL(rc, err);
        refusals++;
        if (getenv("FUZZ_CHECKPOINT_STATS") && getenv("FUZZ_CHECKPOINT_ERRORS")) fprintf(stderr, "%s\n", err);
        return 0;
    }
    loads++;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const struct layer_weights *L = &m->layers[i];
        read_back(&L->wq);
        read_back(&L->wk);
        read_back(&L->wv);
        read_back(&L->wo);
        if (L->is_moe) {
            for (int x = 0; x < m->cfg.n_experts; x++) {
                read_back(&L->experts[x].gate);
                read_back(&L->experts[x].up);
                read_back(&L->experts[x].down);
            }
        } else {
            read_back(&L->gate);
            read_back(&L->up);
            read_back(&L->down);
        }
    }
    model_destroy(m);
    return 0;
}
