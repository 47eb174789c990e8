// grammar_internal: what grammar/*.c share and nothing outside grammar/ sees —
// the expression tree the compilers build, the automaton it becomes (one DFA
// per rule over byte classes and rule calls), the vocabulary trie, the
// per-position token sets, and the stack machine that runs all of it.
#ifndef MOESERVE_GRAMMAR_GRAMMAR_INTERNAL_H
#define MOESERVE_GRAMMAR_GRAMMAR_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

struct arena;

// ---- Expressions (what each compiler builds) ----
// A tree of byte classes, sequences, alternations, bounded repetitions and
// calls of named rules. Nodes live in the builder's arena and may be shared
// (a DAG); turning them into automata copies what is shared.
// GX_PROPS: an object's members in order, each optional or not, with the
// separator only between members that are present: kids are the n = min
// members, then the separator, then the repeatable extra member (or NULL);
// opt[i] marks member i optional. Built as a graph, so each member is
// copied twice, not once per possible predecessor.
enum gx_kind { GX_EMPTY, GX_CLASS, GX_SEQ, GX_ALT, GX_REPEAT, GX_CALL, GX_PROPS };
#define GX_INF UINT32_MAX // REPEAT max: unbounded

struct gx {
    uint8_t kind;
    uint32_t min, max;   // GX_REPEAT
    int32_t rule;        // GX_CALL
    uint32_t n_kids;     // GX_SEQ, GX_ALT; GX_REPEAT has one
    struct gx **kids;
    uint8_t *opt;        // GX_PROPS
    uint8_t cls[32];     // GX_CLASS: bit b set = byte b allowed
};

struct gb_rule {
    const char *name;
    struct gx *body;     // NULL until defined
};

// The builder: rules being defined, the arena, the first error. Every
// constructor returns NULL once an error is set (or on allocation failure,
// which sets one), so compilers chain calls and check once.
struct gbuild {
    struct arena *arena;
    struct gb_rule *rules;
    int n_rules, cap_rules;
    size_t n_nodes;              // expression nodes made (bounded)
    char **literals;             // user-written literal texts (special-token opt-in)
    size_t *literal_lens;
    int n_literals, cap_literals;
    int status;                  // first error (0 = none)
    char err[256];
    bool json_compact;           // grammar_source.json_compact
};

int gb_init(struct gbuild *b);
void gb_free(struct gbuild *b);
// Records the first error; returns code.
int gb_fail(struct gbuild *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gb_rule_new(struct gbuild *b, const char *name);   // -1 on error
int gb_rule_find(const struct gbuild *b, const char *name, size_t len); // -1 if none
void gb_rule_set(struct gbuild *b, int rule, struct gx *body);
void gb_note_literal(struct gbuild *b, const uint8_t *s, size_t n);

struct gx *gx_empty(struct gbuild *b);
struct gx *gx_class(struct gbuild *b, const uint8_t cls[32]);
struct gx *gx_range(struct gbuild *b, uint8_t lo, uint8_t hi);
struct gx *gx_byte(struct gbuild *b, uint8_t c);
struct gx *gx_lit(struct gbuild *b, const void *s, size_t n);
struct gx *gx_str(struct gbuild *b, const char *s);
struct gx *gx_seqv(struct gbuild *b, struct gx *const *kids, size_t n);
struct gx *gx_altv(struct gbuild *b, struct gx *const *kids, size_t n);
struct gx *gx_seq2(struct gbuild *b, struct gx *x, struct gx *y);
struct gx *gx_seq3(struct gbuild *b, struct gx *x, struct gx *y, struct gx *z);
struct gx *gx_alt2(struct gbuild *b, struct gx *x, struct gx *y);
struct gx *gx_repeat(struct gbuild *b, struct gx *x, uint32_t min, uint32_t max);
struct gx *gx_opt(struct gbuild *b, struct gx *x);
struct gx *gx_star(struct gbuild *b, struct gx *x);
struct gx *gx_call(struct gbuild *b, int rule);
// members[n], optional[n] (copied), sep, extra (may be NULL).
struct gx *gx_props(struct gbuild *b, struct gx *const *members, const bool *optional, size_t n,
                    struct gx *sep, struct gx *extra);

// A growable list of expressions (for sequences and alternations of
// unknown length); kids is arena memory.
struct gx_list {
    struct gx **kids;
    size_t n, cap;
};
void gx_list_push(struct gbuild *b, struct gx_list *l, struct gx *x);

// Code-point classes: sorted disjoint ranges of Unicode scalar values, and
// the UTF-8 byte expression that matches exactly one of them.
struct cp_range {
    uint32_t lo, hi;
};
struct cp_class {
    struct cp_range *r;
    size_t n, cap;
};
int cp_class_add(struct cp_class *c, uint32_t lo, uint32_t hi); // MS_ENOMEM
void cp_class_normalize(struct cp_class *c);                     // sort and merge
int cp_class_negate(struct cp_class *c);                         // within U+0000..U+10FFFF
void cp_class_free(struct cp_class *c);
struct gx *gx_utf8_class(struct gbuild *b, const struct cp_class *c);

// Readers shared by the regex and GBNF parsers, over [*p, end).
// Decimal digits (at least one; saturating below UINT32_MAX): false, *p
// unchanged, when there are none.
bool gx_read_uint(const uint8_t **p, const uint8_t *end, uint32_t *v);
// Exactly n hex digits: false when fewer are there (*p then past the good ones).
bool gx_read_hex(const uint8_t **p, const uint8_t *end, int n, uint32_t *v);

// Expressions shared by the compilers.
// One character of a JSON string body, escapes included: a code point, so
// an escaped surrogate pair is one character (JSON Schema's minLength and
// maxLength count code points) and a lone escaped surrogate is none (it is
// not Unicode, and jansson, the server's own parser, refuses it).
struct gx *gx_json_string_char(struct gbuild *b);

// ---- Limits (hostile input) ----
// The fuzz build (tests/fuzz/run.sh) scales the compile-time budgets down
// 20x: the same code and the same exits, reached by inputs 20x smaller, so
// that an input at a budget costs a fuzzer ~0.3 s instead of ~6 s under
// ASan and a long run reaches its million executions (the full budgets are
// pinned by tests/grammar's unit tests). The run-time limits stay.
#ifdef MOESERVE_LIBFUZZER
#define GRAMMAR_LIMIT_SCALE 20
#else
#define GRAMMAR_LIMIT_SCALE 1
#endif
#define GRAMMAR_MAX_EXPR_NODES (200000 / GRAMMAR_LIMIT_SCALE)   // expression nodes per compile
#define GRAMMAR_MAX_NFA_STATES (400000 / GRAMMAR_LIMIT_SCALE)   // before determinization, all rules together
#define GRAMMAR_MAX_DFA_STATES (60000 / GRAMMAR_LIMIT_SCALE)    // after, all rules together
#define GRAMMAR_MAX_SUBSET_STEPS (40000000ull / GRAMMAR_LIMIT_SCALE) // NFA edges and set members while determinizing
#define GRAMMAR_MAX_RULES (20000 / GRAMMAR_LIMIT_SCALE)
#define GRAMMAR_MAX_REPEAT (10000 / GRAMMAR_LIMIT_SCALE)        // {m,n} bounds
#define GRAMMAR_MAX_MINIMIZE_WORK (50000000ull / GRAMMAR_LIMIT_SCALE) // signature entries over all refinement rounds
#define GRAMMAR_MAX_WALK_STEPS (80000000ull / GRAMMAR_LIMIT_SCALE) // vocabulary-trie steps while precomputing
#define GRAMMAR_MAX_KEY_BYTES 1024      // a property name beside additionalProperties (a level of recursion a code point)
#define GRAMMAR_MAX_STACK_DEPTH 1024    // nested rule calls at run time
#define GRAMMAR_MAX_TOPS 4096           // simultaneous stacks at run time

// ---- The automaton ----
// One DFA per rule over byte classes, where a call of a rule is one more
// kind of edge. A state is a "position" when it has byte edges: only
// positions are ever the top of a stack.
struct gcall {
    int32_t rule;
    int32_t ret;  // the state to continue in, in the caller's rule, after the callee returns
};

struct gstate {
    int32_t rule;
    uint32_t call_begin, call_end; // into grammar.calls
    uint8_t final;                 // the rule may return here
    uint8_t has_bytes;             // a position
    int32_t pos;                   // index into grammar.pos, or -1
};

// What a position admits on its own (context-independent) and which tokens
// need the caller's stack (those that leave the rule before they end).
struct gpos {
    uint32_t n_acc;       // accepted tokens
    uint32_t acc_off;     // into grammar.words: a bitmask (mask_words) or n_acc ids
    uint8_t acc_bitmask;
    uint32_t unc_begin, unc_end; // trie nodes (grammar.unc) of the suffixes to check
};

// A node of a preorder trie: children follow their parent; end is the index
// past the node's subtree, so a dead prefix skips it at once.
struct gtrie {
    uint32_t end;
    uint32_t tok_begin;  // into the owner's token-id array
    uint16_t tok_n;      // tokens ending exactly here
    uint16_t depth;      // 1 for the first byte
    uint8_t byte;
};

struct gtrie_entry {
    const uint8_t *bytes;
    size_t len;
    int32_t id;
};
void gtrie_sort(struct gtrie_entry *e, size_t n);
// Appends the preorder trie of sorted entries (lengths 1..UINT16_MAX) to
// the growable arrays nodes and ids.
int gtrie_build(const struct gtrie_entry *e, size_t n, struct gtrie **nodes, size_t *n_nodes,
                size_t *cap_nodes, int32_t **ids, size_t *n_ids, size_t *cap_ids);

struct grammar {
    atomic_int refs;
    const struct grammar_vocab *vocab;
    int n_rules, root;
    int n_states, n_classes, n_pos;
    uint8_t cls[256];          // byte -> class
    int32_t *rule_start;       // n_rules
    struct gstate *states;     // n_states
    int32_t *trans;            // n_states * n_classes, -1 none
    struct gcall *calls;
    size_t n_calls;
    uint8_t *follow;           // n_rules * 32: bytes that may follow a return
    struct gpos *pos;          // n_pos
    uint32_t *words;           // accepted sets
    size_t n_words;
    struct gtrie *unc;         // uncertain-suffix tries, all positions
    size_t n_unc;
    int32_t *unc_tok;          // their token ids
    size_t n_unc_tok;
    int32_t *specials;         // special tokens the grammar spelled, checked one by one
    int n_specials;
    size_t bytes;              // memory held, for the cache
    double compile_ms;
};

// The automaton half of grammar_build: DFAs, trimming, minimization, the
// left-recursion check and FOLLOW sets (grammar_automaton.c).
int grammar_automaton(struct grammar *g, struct gbuild *b, char *err, size_t errlen);
// Rebuilds a matcher's frame pool from its live stacks (the matcher does it
// by itself past a size; exposed for tests).
int grammar_matcher_compact(struct grammar_matcher *m);

// Builds the automaton from the builder's rules (root = rule index) and
// precomputes the token sets against vocab. On success *out holds one reference.
int grammar_build(struct gbuild *b, int root, const struct grammar_vocab *v,
                  struct grammar **out, char *err, size_t errlen);

// ---- The vocabulary ----
struct grammar_vocab {
    int n_vocab;          // the model's (mask bits)
    int n_tok;            // the tokenizer's
    int mask_words;       // (n_vocab + 31) / 32
    uint8_t **bytes;      // n_tok, into blob (NULL: never allowed)
    uint8_t *blob;
    uint32_t *len;
    uint8_t *is_eos;      // n_tok
    int32_t *eos;
    int n_eos;
    int32_t *special;     // special non-EOS tokens with text: allowed only when a grammar spells them
    int n_special;
    struct gtrie *trie;   // all ordinary tokens
    size_t n_trie;
    int32_t *trie_tok;
    size_t n_trie_tok;
    int max_len;
};

// ---- The stack machine ----
// A stack is a top (state, parent) plus interned frames below it: a frame
// is (state to continue in, parent frame). GS_ROOT ends the grammar,
// GS_BOTTOM marks the edge of a precomputation (leaving the rule).
#define GS_ROOT (-1)
#define GS_BOTTOM (-2)

struct gs_top {
    int32_t state;
    int32_t parent;
};

struct gs_pool {
    struct gs_top *nodes;
    size_t n, cap;
    uint32_t *hash;     // open addressing, node index + 1, 0 empty
    size_t hcap;
    int32_t *depth;     // frames below and including each node
};

struct gs_set {
    struct gs_top *t;
    size_t n, cap;
    bool ended;   // the root rule returned
    bool popped;  // a GS_BOTTOM frame was returned to
};

// Scratch for closures (visited set, work list); one per thread of use.
struct gs_scratch {
    uint64_t *seen;
    uint32_t *seen_gen;
    size_t seen_cap, seen_n;
    uint32_t gen;
    struct gs_top *work;
    size_t work_cap;
    int status;   // MS_ENOMEM or MS_EUNSUPPORTED once a limit is hit
};

void gs_pool_free(struct gs_pool *p);
void gs_pool_clear(struct gs_pool *p);
int32_t gs_pool_intern(struct gs_pool *p, int32_t state, int32_t parent); // -1 on failure
void gs_scratch_free(struct gs_scratch *s);
void gs_set_free(struct gs_set *s);
// Adds to out every position reachable from (state, parent) without
// consuming a byte (calls pushed, finished rules returned).
void gs_closure(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
                int32_t state, int32_t parent, struct gs_set *out);
// out = the stacks after consuming byte c from every stack of in.
void gs_step(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
             const struct gs_set *in, uint8_t c, struct gs_set *out);
// Starts a set at the continuation frame `node` (after a return to it).
void gs_set_from_frame(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
                       int32_t node, struct gs_set *out);

static inline bool gx_cls_has(const uint8_t cls[32], unsigned c) { return cls[c >> 3] >> (c & 7) & 1; }
static inline void gx_cls_set(uint8_t cls[32], unsigned c) { cls[c >> 3] |= (uint8_t)(1u << (c & 7)); }

// ---- Compilers (one per grammar_kind; each builds into b and names its root) ----
int grammar_schema_build(struct gbuild *b, const char *text, size_t len, bool any_object, int *root);
int grammar_regex_build(struct gbuild *b, const char *text, size_t len, int *root);
int grammar_gbnf_build(struct gbuild *b, const char *text, size_t len, int *root);
int grammar_choice_build(struct gbuild *b, const char *text, size_t len, int *root);
// A regex as an expression: json_string escapes each character as a JSON
// string body must (for "pattern").
struct gx *grammar_regex_expr(struct gbuild *b, const char *pat, size_t len, bool json_string);

#endif
