// tokenizer: Hugging Face tokenizer.json (byte-level BPE) and
// tokenizer_config.json — encoding, decoding, and the streaming decoder.
// Immutable after tok_load, so any number of threads may share one.
#ifndef MOESERVE_TOKENIZER_TOKENIZER_H
#define MOESERVE_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;

// Reads DIR/tokenizer.json and DIR/tokenizer_config.json. A component we do
// not implement is refused with its name.
int tok_load(const char *dir, struct tokenizer **out, char *err, size_t errlen);
void tok_destroy(struct tokenizer *t);

// Encodes UTF-8 text as Hugging Face's tokenizer(text) does (special tokens
// in the text are matched; no BOS added unless the post-processor says so).
// *ids is malloc'd. Invalid UTF-8 is refused with MS_EFORMAT.
int tok_encode(const struct tokenizer *t, const char *text, size_t len,
               int32_t **ids, size_t *n_ids, char *err, size_t errlen);
// The same, giving up with MS_ETOOLONG as soon as more than max_ids ids are
// out: a prompt far over a context costs only the work up to it. With
// add_special false the post-processor's ids (a BOS, an EOS) are left out, as
// tokenizer(text, add_special_tokens=False) does: a rendered chat template
// already holds them.
int tok_encode_max(const struct tokenizer *t, const char *text, size_t len, size_t max_ids,
                   bool add_special, int32_t **ids, size_t *n_ids, char *err, size_t errlen);
// The most bytes of input text one id can stand for: no text of L bytes
// encodes to fewer than L / tok_max_bytes_per_id ids. The longest token's
// bytes, times 3 when a normalizer may compose characters first.
size_t tok_max_bytes_per_id(const struct tokenizer *t);

// Decodes ids to UTF-8 text (*text malloc'd, NUL-terminated); byte
// sequences that are not valid UTF-8 become U+FFFD as in Hugging Face's
// decode. Ids out of range are refused with MS_EINVAL.
int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               char **text, size_t *len, char *err, size_t errlen);

int tok_vocab_size(const struct tokenizer *t);  // including added tokens
bool tok_is_special(const struct tokenizer *t, int32_t id);
// The raw bytes a token stands for (after byte-level decoding); NULL when out of range.
const uint8_t *tok_token_bytes(const struct tokenizer *t, int32_t id, size_t *len);
// The id of an added or vocabulary token with exactly this content, or -1.
int32_t tok_find_token(const struct tokenizer *t, const char *content);

// The cache of recent pre-tokens is on after tok_load. This empties it and
// turns it on or off (for benchmarks); call it before the tokenizer is shared
// between threads.
void tok_set_cache(struct tokenizer *t, bool enabled);

// The chat template: DIR/chat_template.jinja where tok_load found one (it
// takes precedence, as in transformers and vLLM), else tokenizer_config.json's
// (NULL when neither has one).
const char *tok_chat_template(const struct tokenizer *t);
// DIR/chat_template.jinja: 0 with *out its text (malloc'd), 0 with *out NULL
// when there is none, or an error (unreadable, over 16 MiB, not a regular file,
// holding a NUL byte).
int tok_read_chat_template_file(const char *dir, char **out, char *err, size_t errlen);
const char *tok_bos_token(const struct tokenizer *t);
const char *tok_eos_token(const struct tokenizer *t);

// Streaming decoder: never emits part of a UTF-8 sequence, emits each
// character as soon as its last byte arrives, and the concatenation of its
// output equals tok_decode of all ids fed.
struct tok_stream {
    const struct tokenizer *tok;
    bool skip_special;
    uint8_t pending[4];  // bytes of an incomplete UTF-8 sequence
    int n_pending;
};
void tok_stream_init(struct tok_stream *s, const struct tokenizer *t, bool skip_special);
// Writes to out (capacity cap) the text completed by id; *n_out receives the
// bytes written (not NUL-terminated). Returns 0, or MS_EINVAL for an id out of
// range or when cap is too small for this id's text — the stream is then
// unchanged. tok_stream_max_output(t) always suffices; the longest token's
// byte count (tok_token_bytes) plus 3 suffices whenever the bytes fed form
// valid UTF-8 (each broken byte becomes a 3-byte U+FFFD).
int tok_stream_feed(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out);
size_t tok_stream_max_output(const struct tokenizer *t);
// At end of stream: emits U+FFFD for a trailing incomplete sequence, as a full decode would.
int tok_stream_finish(struct tok_stream *s, char *out, size_t cap, size_t *n_out);

#endif
