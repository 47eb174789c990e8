// tokenizer_internal: the loaded tokenizer's layout, shared by tokenizer/tokenizer*.c
// only (the public interface is tokenizer/tokenizer.h).
#ifndef MOESERVE_TOKENIZER_TOKENIZER_INTERNAL_H
#define MOESERVE_TOKENIZER_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"
#include "base/utf8.h"

// A growable buffer of bytes or int32 ids; every push is checked.
struct tok_buf {
    uint8_t *p;
    size_t len, cap;
};
struct tok_ids {
    int32_t *p;
    size_t len, cap;
};
int tok_buf_reserve(struct tok_buf *b, size_t extra);
int tok_buf_push(struct tok_buf *b, const void *src, size_t n);
int tok_ids_push(struct tok_ids *v, int32_t id);

// ---- Unicode helpers (tokenizer_text.c) ----
bool tok_is_white_space(uint32_t cp); // the Unicode White_Space property
bool tok_is_word_char(uint32_t cp);   // \w as Rust's regex crate defines it

// ---- Normalizers ----
enum tok_norm { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD };
#define TOK_MAX_NORMALIZERS 8
// Normalizes s through each step in turn into out (cleared first).
int tok_normalize(const enum tok_norm *steps, int n_steps, const uint8_t *s, size_t n,
                  struct tok_buf *out);

// ---- Regex patterns and the Split pre-tokenizer ----
enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};
struct tok_regex {
    pcre2_code *code;
    bool jit;
};
// Compiles a pattern written for Oniguruma (what Hugging Face tokenizers uses
// for Split regexes) with PCRE2, rewriting the escapes whose meaning differs.
int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, bool literal,
                      char *err, size_t errlen);
void tok_regex_free(struct tok_regex *re);

// A span of the text being pre-tokenized.
struct tok_span {
    uint32_t off, len;
};
struct tok_spans {
    struct tok_span *p;
    size_t len, cap;
};
int tok_spans_push(struct tok_spans *v, uint32_t off, uint32_t len);

// Per-call matching state (PCRE2 match data is not shareable between threads).
struct tok_seg {
    uint32_t start, end;
    bool match;
};
struct tok_matcher {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    struct tok_seg *segs;
    size_t segs_cap;
};
void tok_matcher_free(struct tok_matcher *m);
// Appends to out the pieces of s[span] that splitting with re and behavior gives.
int tok_split_span(const struct tok_regex *re, enum tok_split_behavior behavior, bool invert,
                   struct tok_matcher *m, const uint8_t *s, struct tok_span span,
                   struct tok_spans *out, char *err, size_t errlen);

// ---- Added tokens ----
struct tok_added {
    char *content; // as written in tokenizer.json
    size_t len;
    uint8_t *pattern; // what is matched: content, normalized when normalized is set
    size_t pattern_len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
};
// A byte trie over added-token patterns for leftmost-longest matching.
// Children are a sibling list: added tokens are few and short.
#define TOK_TRIE_NONE UINT32_MAX
struct tok_trie_node {
    uint32_t first_child, next_sibling;
    int32_t token; // index into tokenizer.added, or -1
    uint8_t byte;
};
struct tok_trie {
    struct tok_trie_node *nodes;
    uint32_t n_nodes, cap;
    bool empty;
    bool first_byte[256];
};
int tok_trie_build(struct tok_trie *trie, const struct tok_added *added, size_t n_added,
                   bool normalized_set, bool skip_special);
void tok_trie_free(struct tok_trie *trie);
// One piece of the text after added-token matching: either an added token
// (token >= 0, index into tokenizer.added) or text to pre-tokenize.
struct tok_piece {
    uint32_t off, len;
    int32_t added; // -1 for text
};
struct tok_pieces {
    struct tok_piece *p;
    size_t len, cap;
};
int tok_pieces_push(struct tok_pieces *v, uint32_t off, uint32_t len, int32_t added);
// Splits s[0, n) on the trie's tokens, honouring single_word, lstrip and rstrip.
int tok_added_split(const struct tok_trie *trie, const struct tok_added *added,
                    const uint8_t *s, size_t n, struct tok_pieces *out);

// ---- BPE (tokenizer_bpe.c) ----
// The merge table: (left id, right id) -> rank, packed into 8-byte slots
// (20 bits each) so that Qwen3's 151k merges fit a 2 MiB table; the merged
// id is merged[rank]. Pairs of single bytes, which start every word, have a
// direct table.
#define TOK_MERGE_BITS 20
#define TOK_MERGE_MAX (1u << TOK_MERGE_BITS) // ids and ranks stay below this
#define TOK_NO_MERGE UINT32_MAX
struct tok_merges {
    uint64_t *slots; // UINT64_MAX when empty
    size_t mask;     // capacity - 1
    int32_t *merged; // (n_ranks)
    uint32_t n_ranks;
    // When merged[r] == r + offset for every rank (vocabularies built as the
    // bytes, then one token per merge, in order), that sum replaces the load.
    bool affine;
    int32_t offset;
    uint32_t byte_pair[256 * 256]; // rank of (byte_id[a], byte_id[b]), or TOK_NO_MERGE
};
int tok_merges_init(struct tok_merges *m, size_t n_merges);
void tok_merges_free(struct tok_merges *m);
// Later duplicates replace earlier ones, as Hugging Face's HashMap collect does.
void tok_merges_put(struct tok_merges *m, int32_t left, int32_t right, uint32_t rank,
                    int32_t merged);
uint32_t tok_merges_rank(const struct tok_merges *m, int32_t left, int32_t right);
static inline int32_t tok_merged_id(const struct tok_merges *m, uint32_t rank)
{
    return m->affine ? (int32_t)rank + m->offset : m->merged[rank];
}
// Fills byte_pair and affine once the merges and byte ids are known.
void tok_merges_index_bytes(struct tok_merges *m, const int32_t byte_id[256]);

// The cache of recent pre-tokens: sharded, each shard a small direct-mapped
// table under its own mutex, so HTTP threads rarely meet on a lock.
#define TOK_CACHE_SHARDS 64
#define TOK_CACHE_SLOTS 512 // per shard
#define TOK_CACHE_KEY_MAX 46
#define TOK_CACHE_IDS_MAX 18
struct tok_cache_entry {
    uint64_t hash;
    uint8_t key_len; // 0: empty
    uint8_t n_ids;
    uint8_t key[TOK_CACHE_KEY_MAX];
    int32_t ids[TOK_CACHE_IDS_MAX];
};
struct tok_cache_shard {
    pthread_mutex_t lock;
    struct tok_cache_entry *entries;
};
struct tok_cache {
    struct tok_cache_shard shards[TOK_CACHE_SHARDS];
    bool enabled;
};
int tok_cache_init(struct tok_cache *c);
void tok_cache_free(struct tok_cache *c);

// Scratch memory one encode call reuses across words.
struct tok_bpe_scratch {
    int32_t *ids;
    int32_t *prev, *next;
    uint32_t *ranks;
    uint64_t *heap; // (rank << 32) | position
    size_t cap;     // symbols
    size_t heap_cap;
};
void tok_bpe_scratch_free(struct tok_bpe_scratch *s);
// Encodes one pre-token (raw bytes; the byte-level alphabet is implicit) and
// appends its ids.
int tok_bpe_word(const struct tokenizer *t, struct tok_bpe_scratch *s, const uint8_t *w,
                 size_t n, struct tok_ids *out);

// ---- the tokenizer ----
struct tok_split_step {
    struct tok_regex re;
    enum tok_split_behavior behavior;
    bool invert;
};
#define TOK_MAX_SPLITS 8

struct tokenizer {
    // Ids 0 .. n_ids-1; an id with no token (a gap) has has_token false.
    int32_t n_ids;
    bool *has_token;
    bool *special;            // (n_ids) skipped by decode when asked
    int32_t *added_index;     // (n_ids) index into added, or -1
    uint8_t **bytes;          // (n_ids) what each token decodes to
    uint32_t *bytes_len;      // (n_ids)
    char **content;           // (n_ids) the token as written in tokenizer.json
    size_t max_token_bytes;

    // content -> id for every vocabulary and added token (open addressing).
    int32_t *str_slots;
    size_t str_mask;

    int32_t byte_id[256]; // the vocabulary id of each single byte
    struct tok_merges *merges;

    enum tok_norm norm[TOK_MAX_NORMALIZERS];
    int n_norm;

    struct tok_split_step splits[TOK_MAX_SPLITS];
    int n_splits;
    bool bl_add_prefix_space;
    bool bl_use_regex;
    struct tok_regex bl_regex; // the GPT-2 pattern when bl_use_regex

    struct tok_added *added;
    size_t n_added;
    struct tok_trie trie_raw;  // tokens with normalized == false
    struct tok_trie trie_norm; // tokens with normalized == true
    bool have_norm_added;

    // Post-processor for a single sequence: ids before and after it.
    int32_t *post_prefix, *post_suffix;
    size_t n_post_prefix, n_post_suffix;

    char *chat_template, *bos_token, *eos_token;

    struct tok_cache cache;
};

// The loader (tokenizer_load.c) fills t from the two files' text.
int tok_load_json(struct tokenizer *t, const char *tok_json, size_t tok_len,
                  const char *cfg_json, size_t cfg_len, char *err, size_t errlen);
void tok_free_fields(struct tokenizer *t);
int32_t tok_str_lookup(const struct tokenizer *t, const char *s, size_t n);

#endif
