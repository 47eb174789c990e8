// output_parser: splits the generated text of one chat choice into reasoning
// (Qwen3's <think>…</think>), content and tool calls (Hermes / Qwen3
// <tool_call>{"name", "arguments"}</tool_call> blocks), delta by delta, and
// builds the JSON of message.tool_calls, reasoning_content and stream deltas.
//
// The promise: for every way a text is split into deltas, the events of all
// the feeds plus finish concatenate (per kind; per call index for arguments)
// to the events of the same text fed whole. To keep it, the parser holds back
// bytes until they are decided: a possible start of a tag, an incomplete
// UTF-8 character, whitespace that may precede a call, and a whole call until
// its </tool_call> (or the end of the output) shows that it parses.
//
// What the text means (rules, all deterministic functions of the text):
// - Reasoning (opts.reasoning): an output that starts with exactly "<think>"
//   opens reasoning (the tag itself is dropped); with opts.start_in_reasoning
//   (the prompt already ended inside <think>) the output starts in reasoning
//   with or without that tag. Reasoning runs to the first "</think>" (dropped)
//   or to the end of the output; the rest is content. Tags are not looked for
//   inside reasoning, and a later "<think>" or "</think>" is content text.
//   With opts.reasoning off every byte is content or a call.
// - Tool calls (opts.tools): outside reasoning, "<tool_call>" opens a call and
//   the first "</tool_call>" after it closes it (or the end of the output). The
//   call is kept when its body, trimmed of whitespace, is one JSON object with
//   a string "name" (1..OUTPUT_PARSER_MAX_NAME bytes, no NUL) and an object
//   "arguments" (the last one wins when a key repeats), and the body is at
//   most max_call_bytes long. Its arguments are the model's own bytes of that
//   object, not a re-serialisation. A call that fails any of this is content:
//   the "<tool_call>", its body and its "</tool_call>" as raw text (a
//   "<tool_call>" inside that raw text opens nothing).
// - With opts.tool_format OUTPUT_TOOLS_QWEN3_XML (Qwen3-Coder's format, vLLM's
//   qwen3_coder parser) a body that starts with "<function=NAME>" is a call
//   of NAME whose arguments are its "<parameter=KEY>\nVALUE\n</parameter>"
//   pieces (one newline trimmed at each end of a value; a piece also ends
//   where the next begins or the function ends), up to "</function>" (or the
//   body's end), after which only whitespace may follow. Each value becomes
//   JSON by the type the tool's parameters give KEY in opts.tool_defs, as vLLM
//   converts: "null" (any case) is null; string types and keys the schema
//   does not name stay strings; integer and number types become numbers,
//   boolean ones true when "true" (any case) and else false, object and
//   array ones (and any other type) their JSON, else their value as a Python
//   literal ({'k': True}, as vLLM's ast.literal_eval reads it: py_literal.h);
//   a value that does not convert stays a string.
//   The arguments are that object serialized (keys in order, a repeated key
//   keeping its first place and its last value). A JSON body as above is a
//   call too (the grammar of a forced call writes one).
// - With opts.max_calls > 0 (parallel_tool_calls false) a call that would be
//   kept after max_calls were kept is dropped whole, tags, body and the
//   whitespace before it: what vLLM does, which keeps only the first call.
//   A later block that does not parse stays content, as above.
// - Whitespace (space, tab, CR, LF) right before a kept call is dropped, and
//   so is whitespace at the end of the output once a call was kept; otherwise
//   content keeps the model's bytes.
// - Every text handed out is valid UTF-8: each byte that is not part of a
//   well-formed character becomes U+FFFD (utf8_decode's rule).
// Known limit: JSON numbers beyond a double's range (1e400) fail jansson's
// parse, so such a call is content.
#ifndef MOESERVE_API_OUTPUT_PARSER_H
#define MOESERVE_API_OUTPUT_PARSER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define OUTPUT_PARSER_MAX_NAME 256                  // bytes in a function name
#define OUTPUT_PARSER_MAX_ID 64                     // bytes in a call id, NUL included
#define OUTPUT_PARSER_DEFAULT_MAX_CALL (4u << 20)   // bytes in one call's body

enum output_tool_format {
    OUTPUT_TOOLS_HERMES,     // <tool_call>{"name", "arguments"}</tool_call> (Qwen3, vLLM's hermes)
    OUTPUT_TOOLS_QWEN3_XML,  // <tool_call><function=...><parameter=...> (Qwen3-Coder, vLLM's qwen3_coder)
};

struct output_parser_opts {
    bool reasoning;          // split off <think> reasoning (--reasoning-parser qwen3)
    bool start_in_reasoning; // the prompt ended inside <think> (output_parser_prompt_in_reasoning)
    bool tools;              // parse <tool_call> blocks (false when no tools or tool_choice "none")
    size_t max_call_bytes;   // a longer call body is content; 0: OUTPUT_PARSER_DEFAULT_MAX_CALL
    int max_calls;           // calls kept at most, later ones dropped; 0: any number
    enum output_tool_format tool_format;
    // QWEN3_XML: the request's tools ([{type, function: {name, parameters}}]),
    // whose parameter types convert the values; borrowed, must outlive the
    // parser; NULL: every value a string.
    const json_t *tool_defs;
    // Writes the id of call `index` (0, 1, ... in this choice) as a NUL-
    // terminated string of at most cap bytes, "call_" + something unique (the
    // server passes random digits). NULL: "call_<index>", unique only within
    // the choice. Called from feed/finish, on the caller's thread.
    void (*make_id)(void *ctx, int index, char *out, size_t cap);
    void *make_id_ctx;
};

enum output_event_kind {
    OUTPUT_EVENT_REASONING,  // text: reasoning
    OUTPUT_EVENT_CONTENT,    // text: content
    OUTPUT_EVENT_TOOL_BEGIN, // a call: index, id, text = its function name
    OUTPUT_EVENT_TOOL_ARGS,  // text: a fragment of call `index`'s arguments
};

// One event. Texts are valid UTF-8 (NUL bytes may occur inside), not
// NUL-terminated; id is NUL-terminated. All pointers belong to the parser and
// stay valid until its next feed, finish or destroy.
struct output_event {
    enum output_event_kind kind;
    int index;       // tool events: the call's index among kept calls (0, 1, 2...); else -1
    const char *text;
    size_t len;
    const char *id;  // TOOL_BEGIN: "call_…"; else NULL
};

// One kept call, for the non-streamed message.
struct output_call {
    const char *id;        // NUL-terminated
    const char *name;      // valid UTF-8, NUL-terminated (contains no NUL)
    size_t name_len;
    const char *arguments; // the JSON object's bytes, NUL-terminated
    size_t arguments_len;
};

struct output_parser;

// Creates a parser for one choice. Not thread-safe: one thread at a time
// (it may move between threads). Returns 0, or MS_ENOMEM / MS_EINVAL.
int output_parser_create(const struct output_parser_opts *opts, struct output_parser **out,
                         char *err, size_t errlen);
void output_parser_destroy(struct output_parser *p); // NULL is fine

// Feeds the next n bytes of the choice's text (any split, any bytes) and
// points *ev at the events they decided (*n_ev may be 0). Adjacent texts of
// one kind come merged into one event; a kept call comes as TOOL_BEGIN then
// TOOL_ARGS in the same batch. Returns 0, or MS_ENOMEM (the parser is then
// spent: every later call fails; destroy it).
int output_parser_feed(struct output_parser *p, const char *text, size_t n,
                       const struct output_event **ev, size_t *n_ev, char *err, size_t errlen);
// The end of the output (stop, length, abort): decides and emits everything
// still held. Feeding after finish is MS_EINVAL.
int output_parser_finish(struct output_parser *p, const struct output_event **ev, size_t *n_ev,
                         char *err, size_t errlen);

// Bytes fed so far that no event has accounted for yet (they are the last
// bytes fed): a possible tag start, an incomplete character, held
// whitespace, or an open call with its "<tool_call>". An engine may use it to
// tell the client nothing more is coming for them; it need not.
size_t output_parser_held(const struct output_parser *p);
// True while the parser is inside an open <tool_call> body. An engine that
// would rather not let a stop string cut a call in half may defer stop-string
// checks while this holds (the parser itself keeps a cut call whose JSON is
// complete and gives back a broken one as content, so nothing is lost).
bool output_parser_in_call(const struct output_parser *p);

// Calls kept so far (all of them after finish).
int output_parser_n_calls(const struct output_parser *p);
// Call i (0 <= i < n_calls). Its pointers stay valid until the next feed or
// finish, and after finish until destroy. Returns 0 or MS_EINVAL.
int output_parser_call(const struct output_parser *p, int i, struct output_call *out);
// Everything emitted so far as content / reasoning (after finish: the whole
// non-streamed answer). Valid until the next feed, finish or destroy.
const char *output_parser_content(const struct output_parser *p, size_t *len);
const char *output_parser_reasoning(const struct output_parser *p, size_t *len);

// The finish_reason to send: "tool_calls" when the engine stopped on its own
// ("stop") after at least one kept call, else engine_reason unchanged.
const char *output_parser_finish_reason(const struct output_parser *p, const char *engine_reason);

// True when a rendered prompt ends inside an open <think> (it ends with
// "<think>" and optional whitespace), as Qwen3 thinking-2507 templates do;
// the caller passes it as opts.start_in_reasoning. A prompt that closed an
// empty think block (enable_thinking false) gives false.
bool output_parser_prompt_in_reasoning(const char *prompt, size_t len);

// ---- JSON for the response -----------------------------------------------------

// message.tool_calls: [{id, type: "function", function: {name, arguments}}]
// (empty when no call was kept); a new reference, or NULL when out of memory.
json_t *output_parser_tool_calls_json(const struct output_parser *p);
// Sets the non-streamed message's "content" (null when empty) and, when
// include_reasoning, "reasoning_content" and "reasoning" (the same text; null
// when empty), and "tool_calls" when a call was kept. Returns 0 or MS_ENOMEM.
int output_parser_message_fill(const struct output_parser *p, json_t *message,
                               bool include_reasoning);
// Sets a stream chunk's delta from one batch of events: "content",
// "reasoning_content" + "reasoning" (when include_reasoning), and
// "tool_calls": one entry per call index, in order, {index, id, type,
// function: {name, arguments}} for a call's first delta and {index, function:
// {arguments}} for later ones. Fields with nothing to say are left unset.
// Returns 0 or MS_ENOMEM.
int output_events_delta_fill(json_t *delta, const struct output_event *ev, size_t n_ev,
                             bool include_reasoning);

#endif
