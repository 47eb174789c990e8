// grammar: structured output. JSON Schema, "any JSON object", regular
// expressions, a choice of strings and GBNF grammars compile to one kind of
// automaton over bytes (a DFA per rule, rules calling rules: a pushdown
// automaton), which is then matched against the tokenizer's vocabulary
// once, at compile time, so that each decoding step's allowed-token mask
// costs little: for every automaton position the tokens it admits on its
// own are stored as a set, and only the few tokens that run past the end
// of a rule are checked against the live stack (XGrammar's idea, our code).
//
// Objects and their lifetimes:
//   grammar_vocab   one per tokenizer; immutable; outlives every grammar,
//                   cache and matcher made with it.
//   grammar         immutable and reference-counted; any number of threads
//                   and matchers may share one.
//   grammar_cache   compiled grammars by (kind, text); thread-safe.
//   grammar_matcher one per sequence; not thread-safe (one thread at a time).
//
// What the compiled languages are (each is refused, with a sentence naming
// the keyword or construct, when we cannot honour it exactly: never loosened):
//   JSON output has no whitespace except between tokens of JSON syntax, and
//   there at most GRAMMAR_JSON_MAX_WS bytes of space, tab, newline or
//   carriage return, so that a model cannot spin on whitespace forever.
//   Object properties come in the schema's order; optional ones may be left
//   out. An object schema without additionalProperties allows no other
//   properties (as OpenAI's strict mode). Integers have at most
//   GRAMMAR_JSON_MAX_DIGITS digits, fractions as many, exponents 2 (within a
//   double). Bounded numbers have at most 15 significant digits, so that the
//   double a client reads keeps an exclusive bound exclusive.
#ifndef MOESERVE_GRAMMAR_GRAMMAR_H
#define MOESERVE_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct grammar;
struct grammar_vocab;
struct grammar_cache;
struct grammar_matcher;

#define GRAMMAR_JSON_MAX_WS 12
#define GRAMMAR_JSON_MAX_DIGITS 20
#define GRAMMAR_MAX_TEXT (1u << 20)   // bytes of schema, regex or grammar text accepted
#define GRAMMAR_MAX_JSON_DEPTH 64     // nesting of a schema document

// ---- Vocabulary ----
// The tokenizer's tokens as byte strings, sorted into a trie. model_vocab_size
// may exceed the tokenizer's (padded rows of the embedding): those ids, and
// ids with no bytes, are never allowed. eos_ids (n_eos >= 1) are allowed
// exactly where a grammar may end. Special tokens that are not EOS are never
// allowed, unless a grammar spells their text in a literal (a GBNF string,
// a choice, a prefix or suffix); added tokens that are not special (Qwen3's
// <tool_call>) are ordinary byte strings. tok is only read during the call.
int grammar_vocab_create(const struct tokenizer *tok, int model_vocab_size,
                         const int32_t *eos_ids, int n_eos,
                         struct grammar_vocab **out, char *err, size_t errlen);
void grammar_vocab_destroy(struct grammar_vocab *v);
int grammar_vocab_size(const struct grammar_vocab *v);       // model_vocab_size
int grammar_vocab_mask_words(const struct grammar_vocab *v); // (size + 31) / 32

// ---- Compiling ----
enum grammar_kind {
    GRAMMAR_JSON_SCHEMA, // text: a JSON Schema document
    GRAMMAR_JSON_OBJECT, // any JSON object; text ignored (may be empty)
    GRAMMAR_REGEX,       // text: a regular expression, anchored at both ends
    GRAMMAR_CHOICE,      // text: a JSON array of strings; output is one of them
    GRAMMAR_GBNF,        // text: llama.cpp GBNF, start rule "root"
    GRAMMAR_KIND_COUNT,
};

// What to compile: prefix and suffix are literal bytes around the language
// (for example "<tool_call>\n" and "\n</tool_call>"); either may be NULL.
struct grammar_source {
    enum grammar_kind kind;
    const char *text;
    size_t len;
    const char *prefix;
    size_t prefix_len;
    const char *suffix;
    size_t suffix_len;
    // JSON kinds: no free whitespace, ", " after a comma and ": " after a
    // colon ({"a": 1, "b": [2, 3]}), as xgrammar writes JSON with
    // any_whitespace false (vLLM's disable_any_whitespace). Other kinds: unused.
    bool json_compact;
};

// Compiles src against v. Returns 0 with *out holding one reference, or
// MS_EUNSUPPORTED (a schema keyword or construct we do not implement; the
// sentence names it), MS_EINVAL / MS_EFORMAT (malformed text), MS_ENOFIT
// (over a size limit: states, repetitions, nesting), MS_ENOMEM.
int grammar_compile(const struct grammar_vocab *v, const struct grammar_source *src,
                    struct grammar **out, char *err, size_t errlen);
struct grammar *grammar_ref(struct grammar *g);
void grammar_unref(struct grammar *g);   // frees at zero; NULL is fine
size_t grammar_bytes(const struct grammar *g);   // memory held
int grammar_states(const struct grammar *g);     // automaton states

// ---- Cache ----
// Compiled grammars keyed by (kind, text, prefix, suffix), least recently
// used dropped first beyond max_entries or max_bytes (max_bytes 0: no byte
// bound; a single grammar larger than max_bytes is still kept, alone).
// Refusals of the text (its code and sentence) are cached as grammars are;
// running out of memory is not. Thread-safe; compilation runs outside the lock (two threads asking
// for the same new text at once may both compile it; one result is kept).
int grammar_cache_create(const struct grammar_vocab *v, size_t max_entries, size_t max_bytes,
                         struct grammar_cache **out, char *err, size_t errlen);
void grammar_cache_destroy(struct grammar_cache *c); // grammars handed out stay valid
// As grammar_compile, through the cache; *out holds a reference for the caller.
int grammar_cache_get(struct grammar_cache *c, const struct grammar_source *src,
                      struct grammar **out, char *err, size_t errlen);
void grammar_cache_stats(struct grammar_cache *c, size_t *entries, size_t *bytes,
                         uint64_t *hits, uint64_t *misses);

// ---- Matching (one per sequence) ----
// The matcher holds a reference on g. Memory grows with the nesting of the
// output, not its length.
int grammar_matcher_create(struct grammar *g, struct grammar_matcher **out, char *err, size_t errlen);
void grammar_matcher_destroy(struct grammar_matcher *m);
// Writes grammar_vocab_mask_words words: bit (id % 32) of word id / 32 set =
// id allowed. Never all zero (once terminated: the EOS ids only, which
// accept then refuses). Typical cost on the Qwen3 vocabulary: a few
// microseconds (tests/grammar/bench_grammar). Returns 0, or
// MS_ENOFIT when the output went past GRAMMAR_MAX_STACK_DEPTH nesting or
// the grammar is so ambiguous that more than GRAMMAR_MAX_TOPS parses are
// alive (the request should be ended), MS_ENOMEM.
int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask);
// Advances by one token. MS_EINVAL (matcher unchanged) when id is not
// allowed here; accepting an EOS id terminates the matcher.
int grammar_matcher_accept(struct grammar_matcher *m, int32_t id, char *err, size_t errlen);
// Whether accept(id) would succeed now, without advancing (a sampler may
// draw from the unmasked logits first and build the mask only when this
// says no).
bool grammar_matcher_allows(struct grammar_matcher *m, int32_t id);
// Advances by raw bytes (forced text, tests); MS_EINVAL, unchanged, when the
// bytes do not continue the language.
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const void *bytes, size_t n,
                                 char *err, size_t errlen);
bool grammar_matcher_can_end(const struct grammar_matcher *m);     // EOS allowed now
bool grammar_matcher_must_end(const struct grammar_matcher *m);    // only EOS allowed now
bool grammar_matcher_is_terminated(const struct grammar_matcher *m); // EOS accepted
// Back to the start state, as just created.
int grammar_matcher_reset(struct grammar_matcher *m);

#endif
