// utf8: the one UTF-8 codec the tokenizer, the chat-template engine and the
// API share — validation, decoding and encoding of code points.
#ifndef MOESERVE_BASE_UTF8_H
#define MOESERVE_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT 0xfffdu

// Length of the longest prefix of s that is well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF); n when all of s is.
size_t utf8_valid_prefix(const uint8_t *s, size_t n);

// Decodes the code point that starts s (n >= 1 bytes available) and returns
// the bytes it used (1..4). A byte that does not start a well-formed
// sequence within n decodes as U+FFFD and uses one byte, so a loop over
// untrusted bytes always advances and never reads past s + n.
size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

// Writes cp (at most U+10FFFF) as 1..4 bytes into out and returns how many.
size_t utf8_encode(uint32_t cp, uint8_t out[4]);

#endif
