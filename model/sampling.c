// sampling: the parameters' defaults, their range checks and the merge of
// generation_config.json's defaults — one copy for the API, the engine and
// the command line.
#include "model/sampling.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

void sampling_params_default(struct sampling_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
}

void sampling_params_merge_defaults(struct sampling_params *p, const struct sampling_set *set,
                                    const struct gen_defaults *g)
{
    if (!g) return;
    if (!set->temperature && g->has_temperature) p->temperature = g->temperature;
    if (!set->top_p && g->has_top_p) p->top_p = g->top_p;
    if (!set->top_k && g->has_top_k) p->top_k = g->top_k > 0 ? g->top_k : 0;
    if (!set->min_p && g->has_min_p) p->min_p = g->min_p;
    if (!set->repetition_penalty && g->has_repetition_penalty)
        p->repetition_penalty = g->repetition_penalty;
}

// A float field's closed or half-open range, in one table so that every
// caller refuses the same values with the same sentence.
struct range {
    const char *name;
    size_t off;
    float lo, hi;
    bool lo_open;
};

#define FIELD(f) #f, offsetof(struct sampling_params, f)
static const struct range ranges[] = {
    {FIELD(temperature), 0.0f, 2.0f, false},
    {FIELD(top_p), 0.0f, 1.0f, true},
    {FIELD(min_p), 0.0f, 1.0f, false},
    {FIELD(presence_penalty), -2.0f, 2.0f, false},
    {FIELD(frequency_penalty), -2.0f, 2.0f, false},
    {FIELD(repetition_penalty), 0.0f, FLT_MAX, true}, // vLLM: any finite value above 0
};
#undef FIELD

bool sampling_param_range(const char *name, double *lo, double *hi, bool *lo_open)
{
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (!strcmp(ranges[i].name, name)) {
            *lo = ranges[i].lo;
            *hi = ranges[i].hi;
            *lo_open = ranges[i].lo_open;
            return true;
        }
    return false;
}

static int refuse(const char *param, const char **param_out, char *err, size_t errlen,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int refuse(const char *param, const char **param_out, char *err, size_t errlen,
                  const char *fmt, ...)
{
    if (param_out) *param_out = param;
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return MS_EINVAL;
}

int sampling_params_check(const struct sampling_params *p, int vocab, const char **param_out,
                          char *err, size_t errlen)
{
    if (param_out) *param_out = NULL;
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        const struct range *r = &ranges[i];
        float v;
        memcpy(&v, (const char *)p + r->off, sizeof v);
        bool ok = isfinite(v) && v <= r->hi && (r->lo_open ? v > r->lo : v >= r->lo);
        if (!ok)
            return r->hi >= FLT_MAX
                       ? refuse(r->name, param_out, err, errlen, "%s must be finite and %s %g, not %g", r->name,
                                r->lo_open ? "above" : "at least", (double)r->lo, (double)v)
                       : refuse(r->name, param_out, err, errlen, "%s must be in %c%g, %g], not %g", r->name,
                                r->lo_open ? '(' : '[', (double)r->lo, (double)r->hi, (double)v);
    }
    if (p->logprobs < -1 || p->logprobs > SAMPLING_MAX_LOGPROBS)
        return refuse("logprobs", param_out, err, errlen, "logprobs must be from 0 to %d, not %d",
                      SAMPLING_MAX_LOGPROBS, p->logprobs);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > SAMPLING_MAX_LOGPROBS)
        return refuse("prompt_logprobs", param_out, err, errlen,
                      "prompt_logprobs must be from 0 to %d, not %d", SAMPLING_MAX_LOGPROBS,
                      p->prompt_logprobs);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias) || p->n_logit_bias > vocab)
        return refuse("logit_bias", param_out, err, errlen,
                      "logit_bias has %d entries; at most %d (the vocabulary)", p->n_logit_bias,
                      vocab);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].id < 0 || p->logit_bias[i].id >= vocab)
            return refuse("logit_bias", param_out, err, errlen,
                          "logit_bias names token id %d; ids run from 0 to %d",
                          (int)p->logit_bias[i].id, vocab - 1);
        if (!isfinite(p->logit_bias[i].bias) || fabsf(p->logit_bias[i].bias) > 100)
            return refuse("logit_bias", param_out, err, errlen,
                          "logit_bias for token %d is %g; it must be in [-100, 100]",
                          (int)p->logit_bias[i].id, (double)p->logit_bias[i].bias);
    }
    return 0;
}
