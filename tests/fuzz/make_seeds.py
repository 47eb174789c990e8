#!/usr/bin/env python3
"""make_seeds.py: writes the seed corpora under tests/fuzz/corpus/ (committed;
rerun after changing this file). Each seed is an input in the target's own
format: for targets whose first byte picks a mode, that byte comes first."""
import hashlib, json, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
corpus = os.path.join(here, "corpus")


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- OpenAI requests: byte 0 picks chat, completions, tokenize, detokenize ----
chat = [
    {"model": "m", "messages": [{"role": "user", "content": "Hello"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
     "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "max_tokens": 16, "n": 2, "seed": 7,
     "stop": ["\n", "END"], "stop_token_ids": [3, 4], "logit_bias": {"5": -100, "9": 2.5}, "stream": True,
     "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "logprobs": True, "top_logprobs": 3,
     "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "user": "u", "ignore_eos": False,
     "skip_special_tokens": True, "add_generation_prompt": True, "chat_template_kwargs": {"enable_thinking": False},
     "request_id": "r1", "max_completion_tokens": 8, "unknown_field": 1},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "reasoning_content": "r",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "42"}],
     "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
     "tool_choice": "auto", "response_format": {"type": "json_object"}},
    {"messages": [{"role": "\u00e9" * 25, "content": "\ud83d\ude00"}]},
    {"messages": []},
]
completion = [
    {"model": "m", "prompt": "Once upon", "max_tokens": 5, "echo": True, "logprobs": 2},
    {"prompt": ["a", "b"], "n": 3, "temperature": 0},
    {"prompt": [1, 2, 3], "stream": True},
    {"prompt": [[1, 2], [3]], "best_of": 1, "suffix": None},
]
tokenize = [
    {"prompt": "hello", "add_special_tokens": True, "return_token_strs": True},
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
]
detokenize = [{"tokens": [1, 2, 3]}, {"model": "m", "tokens": []}]
for mode, bodies in enumerate([chat, completion, tokenize, detokenize]):
    for b in bodies:
        put("fuzz_openai_request", bytes([mode]) + json.dumps(b).encode())
for raw in ['{"a":"\\u0\u00e9"}', '{"messages": [{"role": "user", "content": "x"}]', "[]", "null",
            '{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}']:
    put("fuzz_openai_request", b"\x00" + raw.encode())

# ---- Responses and Anthropic Messages: byte 0 picks responses, messages, count_tokens ----
responses = [
    {"model": "m", "input": "Hello", "max_output_tokens": 16, "stream": True},
    {"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "<think>x</think>ok<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"}]}],
     "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "auto",
     "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
     "reasoning": {"effort": "low"}, "temperature": 0.5, "store": False, "metadata": {"k": "v"}},
]
messages = [
    {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}], "stream": True},
    {"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "S"}], "messages": [
        {"role": "user", "content": "w?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"},
                                     {"type": "text", "text": "<think>a</think>b<tool_call>{\"name\": \"w\", \"arguments\": {}}"}]}],
     "tools": [{"name": "w", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
     "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 64}, "top_k": 5},
]
for mode, bodies in enumerate([responses, messages, messages]):
    for b in bodies:
        put("fuzz_api_fronts", bytes([mode]) + json.dumps(b).encode())

# ---- Jinja: the Qwen3 template, the construct tests' templates ----------------
with open(os.path.join(root, "third_party", "qwen3-tokenizer", "tokenizer_config.json")) as f:
    put("fuzz_jinja", json.load(f)["chat_template"])
with open(os.path.join(root, "tests", "data", "chat_template", "constructs.jsonl")) as f:
    for line in f:
        put("fuzz_jinja", json.loads(line)["template"])
for t in ["{{ messages|select|list }}", "{% for m in messages %}{{ loop.index }}{{ m.role|upper }}{% endfor %}",
          "{% macro f(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ f(1) }}{% set ns = namespace(x=1) %}{{ ns.x }}",
          "{{ tools|tojson(indent=2) }}{{ d|dictsort }}{{ s|replace('a', 'b') }}{{ x|int }}{{ n|abs }}"]:
    put("fuzz_jinja", t)

# ---- SSE: byte 0 seeds the cuts -----------------------------------------------
for s in ['data: {"a":1}\n\ndata: [DONE]\n\n', ": keep-alive\n\ndata: x\r\ndata: y\r\n\r\n",
          "event: e\nid: 1\nretry: 5\ndata:no-space\n\n", "data: a\rdata: b\r\rdata: end-without-blank",
          "data: " + "z" * 300 + "\n\n"]:
    for seed in (0, 7):
        put("fuzz_sse", bytes([seed]) + s.encode())

# ---- HTTP request heads: byte 0 seeds the cuts, byte 1 the limit (255: 4096, 0: 64) ----
heads = [
    "GET / HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
    "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
    "Content-Length: 2\r\n\r\n{}",
    "\r\n\nPUT /x HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\nX-Fold: a\n\tb\n\n2\r\n{}\r\n0\r\n\r\n",
    "GET / HTTP/1.0\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\nhello",
    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "GET / HTTP/1.1\r\n\r\n",
    "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\nContent-Length: +5\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    "GET /a b HTTP/1.1\r\nHost : a\r\n\r\n",
    "GET / HTTP/1.1\r\n folded\r\nHost: a\rX: \x00\xff\r\n\r\n",
    "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
]
for i, h in enumerate(heads):
    put("fuzz_http_head", bytes([i, 255]) + h.encode("latin-1"))
put("fuzz_http_head", bytes([3, 0]) + b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"p" * 80 + b"\r\n\r\n")

# ---- config.json (byte 0 odd) and generation_config.json (even) ----------------
for d in ["qwen3-0.6b", "qwen3-30b-a3b", "qwen3moe-v2048"]:
    with open(os.path.join(root, "tests", "data", d, "config.json"), "rb") as f:
        put("fuzz_config", b"\x01" + f.read())
# The same config with each quantized format's quantization_config.
with open(os.path.join(root, "tests", "data", "qwen3moe-v2048", "config.json"), "rb") as f:
    base_cfg = json.load(f)
for qc in [
    {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
     "checkpoint_format": "gptq_v2"},
    {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
     "modules_to_not_convert": ["gate"]},
    {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
     "ignore": ["lm_head", "re:.*mlp.gate$"], "sparsity_config": {},
     "config_groups": {"group_0": {"targets": ["Linear"],
                                   "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                               "strategy": "channel", "dynamic": False},
                                   "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                                         "strategy": "token", "dynamic": True}}}},
    {"quant_method": "compressed-tensors", "format": "pack-quantized",
     "config_groups": {"group_0": {"targets": ["Linear"],
                                   "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                               "strategy": "group", "group_size": 128, "actorder": "weight"}}}},
    {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"W4A16": ["Linear"]}},
]:
    put("fuzz_config", b"\x01" + json.dumps(dict(base_cfg, quantization_config=qc)).encode())
with open(os.path.join(root, "tests", "data", "qwen3moe-v2048", "generation_config.json"), "rb") as f:
    put("fuzz_config", b"\x00" + f.read())
put("fuzz_config", b'\x00{"eos_token_id": [1, 2, 151645], "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0, '
    b'"repetition_penalty": 1.05, "max_new_tokens": 100, "do_sample": true}')

# ---- checkpoints: a format's index, then 8-byte edits (fuzz_checkpoint.c) --------
for f in range(10):
    put("fuzz_checkpoint", bytes([f]))
# Some edits of each kind: a dtype, a dimension, a drop, a companion, bytes,
# a config setting, a fill.
for f, edits in [(1, [[0, 5, 3, 0, 0, 0, 0, 0]]), (3, [[1, 7, 40, 0, 2, 1, 0, 0]]), (4, [[2, 9, 0, 0, 0, 0, 0, 0]]),
                 (5, [[3, 11, 2, 0, 0, 0, 0, 0]]), (6, [[4, 13, 3, 0, 0xff, 0x80, 7, 1]]),
                 (2, [[6, 0, 0, 1, 0, 0, 0, 0]]), (7, [[7, 15, 0, 0, 0x7f, 0, 0, 0]]),
                 (0, [[6, 0, 8, 15, 0, 0, 0, 0], [1, 20, 7, 0, 3, 0, 0, 0]]),
                 (8, [[4, 3, 3, 0, 1, 0, 0, 0]]), (9, [[4, 7, 3, 0, 0xff, 0xff, 0xff, 0xff]])]:
    put("fuzz_checkpoint", bytes([f]) + b"".join(bytes(e) for e in edits))

# ---- safetensors: small files of every dtype and shape kind ---------------------
def st(header, data=b"", pad=True):
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

put("fuzz_safetensors", st({"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]},
                            "__metadata__": {"format": "pt"}}, bytes(16)))
put("fuzz_safetensors", st({"w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]},
                            "s": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]},
                            "z": {"dtype": "F16", "shape": [0, 5], "data_offsets": [24, 24]}}, bytes(24)))
put("fuzz_safetensors", st({}, b""))
put("fuzz_safetensors", st({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, bytes(4), pad=False))

# ---- tokenizer: byte 0 odd fuzzes tokenizer.json, even tokenizer_config.json ----
def byte_alphabet():
    cps, extra = [], 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
            cps.append(b)
        else:
            cps.append(256 + extra)
            extra += 1
    return [chr(c) for c in cps]

alpha = byte_alphabet()
vocab = {c: i for i, c in enumerate(alpha)}
vocab.update({"he": 256, "ll": 257, "hell": 258, "hello": 259})
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": 260, "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": True}],
       "normalizer": {"type": "NFC"},
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
           {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\s+|\\p{N}"}, "behavior": "Isolated", "invert": False},
           {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
       "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o"],
                 "dropout": None, "unk_token": None, "byte_fallback": False}}
put("fuzz_tokenizer", b"\x01" + json.dumps(tok).encode())
tok2 = dict(tok, normalizer=None, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "use_regex": True})
tok2["model"] = dict(tok["model"], merges=[["h", "e"], ["l", "l"]])
put("fuzz_tokenizer", b"\x01" + json.dumps(tok2).encode())
with open(os.path.join(root, "third_party", "qwen3-tokenizer", "tokenizer_config.json"), "rb") as f:
    put("fuzz_tokenizer", b"\x00" + f.read())
put("fuzz_tokenizer", b'\x00{"eos_token": {"content": "<|end|>"}, "bos_token": null, "pad_token": "<|end|>", '
    b'"added_tokens_decoder": {"260": {"content": "<|end|>", "special": true}}, "model_max_length": 100}')

# ---- output parser: byte 0 options, byte 1 cut seed, then text -------------------
for opts in (0x07, 0x05, 0x0f, 0x1d):
    for text in ["<think>plan</think>answer", "hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
                 "a</think>b<tool_call>{\"name\": \"g\", \"arguments\": \"x\"}</tool_call><tool_call>{bad}</tool_call>",
                 "\u00e9\ud83d\ude00<thi"]:
        put("fuzz_output_parser", bytes([opts, 3]) + text.encode("utf-8", "surrogatepass"))
# Qwen3-Coder's XML calls (option bit 0x40), typed by the harness's tools
for text in ["ok <tool_call>\n<function=f>\n<parameter=i>\n42\n</parameter>\n<parameter=o>\n{\"k\": [1]}\n"
             "</parameter>\n<parameter=b>\nTrue\n</parameter>\n</function>\n</tool_call>",
             "<tool_call><function=f><parameter=s>a<parameter=n>1.5</function></tool_call> after"]:
    put("fuzz_output_parser", bytes([0x45, 3]) + text.encode())
# ---- grammar: byte 0 kind (0 schema, 1 json_object, 2 regex, 3 choice, 4 GBNF), +8 tool-call tags ----
schemas = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "minimum": 0}},
     "required": ["city"]},
    {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "minItems": 1, "maxItems": 4},
    {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "number"}}}}, "anyOf": [{"$ref": "#/$defs/p"}, {"type": "null"}]},
    {"type": "string", "format": "date-time"},
    {"oneOf": [{"type": "boolean"}, {"type": "string", "pattern": "^[a-z]{2,4}$"}]},
]
for sch in schemas:
    put("fuzz_grammar", bytes([0]) + json.dumps(sch).encode())
    put("fuzz_grammar", bytes([8]) + json.dumps({"type": "object", "properties": {"name": {"const": "f"}, "arguments": sch},
                                                 "required": ["name", "arguments"]}).encode())
put("fuzz_grammar", bytes([1]))
for rx in ["[A-Z][a-z]{2,5} [0-9]{3}", "(ab|cd)*e?", "\\d+(\\.\\d+)?", "[^\\n]{1,20}"]:
    put("fuzz_grammar", bytes([2]) + rx.encode())
put("fuzz_grammar", bytes([3]) + json.dumps(["red", "green", "<think>x</think>y"]).encode())
put("fuzz_grammar", bytes([4]) + b'root ::= ("yes" | "no") " " [0-9]+\nws ::= [ \\t]*')
put("fuzz_grammar", bytes([4]) + b'root ::= obj\nobj ::= "{" ws pair ("," ws pair)* "}"\npair ::= [a-z]+ ":" [0-9]\nws ::= " "?')
# ---- Python literals (Qwen3-Coder tool arguments) ------------------------------
for lit in ["{'path': 'a.txt', 'lines': [1, 2, 3]}", "(1, 'b', None, True, False)", "[1_000, 0x1f, 0o17, 0b1, .5, 1e-3]",
            "{1: 'a', 1.0: 'b', True: 'c', None: [], (1,): {}}", r"r'\d+' u'\u00e9' '\x41\101\n'",
            "'''multi\nline'''", "[1, # comment\n 2,]", "{'a': b'x', 'a': {1, 2}, 'a': 1-2j, 'a': ...}", "-(1.5), +2",
            "set()", "[[[[[[[[]]]]]]]]", r"{'k': '\ud800', 'k': 0}"]:
    put("fuzz_py_literal", lit)
print("seeds written under", corpus)
