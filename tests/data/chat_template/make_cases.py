#!/usr/bin/env python3
"""make_cases: writes cases.jsonl, the chat requests rendered with the Qwen3 and
Qwen2.5 templates by moeserve and by the references. Deterministic (fixed seed);
run from this directory. Lines: {"name", "messages", "tools"?,
"add_generation_prompt", "kwargs"?, "differs"?}.

"differs" maps a template name to the reason @huggingface/jinja renders that case
differently from Python Jinja2 (transformers); moeserve follows transformers there,
and the test checks the difference is still real. Known reasons:
  strip_args   - @huggingface/jinja ignores the argument of str.strip/lstrip/rstrip
                 ('\\n'), stripping all whitespace; Python strips only newlines.
  undefined_attr - @huggingface/jinja makes an attribute of an undefined value
                 undefined (messages[0].role with no messages); Jinja raises.
  no_reject_filter - @huggingface/jinja has no `reject` filter (Llama 3.1 uses it).
  float_json   - tojson of an integral float (1.0) or one Python writes with an
                 exponent (1e-07): json.dumps writes 1.0 / 1e-07, JSON.stringify 1 / 1e-7.
"""
import json
import random

rng = random.Random(20240603)

TEXTS = [
    "Hello!", "What is the capital of France?", "Explain quicksort in two sentences.",
    "你好，请介绍一下你自己。", "مرحبا، كيف حالك؟", "Привет! Как дела?", "こんにちは 😀👍🏽",
    "Line one\nLine two\n\nLine four", "Tabs\tand\ttabs", "Quotes: 'single' \"double\" `back`",
    "Backslashes \\ and \\n literal", "Braces {{ not a template }} {% nor this %} {# nor #}",
    "Code:\n```python\ndef f(x):\n    return {'a': x}\n```", "JSON: {\"k\": [1, 2, {\"z\": null}]}",
    "Special <|im_start|> and <|im_end|> tokens in text", "Trailing spaces   ", "   leading spaces",
    "\n\nleading newlines", "trailing newlines\n\n", "", "a", "Emoji ZWJ 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "Mixed: café naïve Ünïcödé", "Math: ∑ x² ≤ ∞", "control \u0001 char", "NUL-free but \u2028 separator",
    "<tool_response>\nnot really a tool response\n</tool_response>", "Ends with </think> tag",
    "Very long " + "word " * 200,
]
THOUGHTS = [
    "Let me think step by step.", "The user wants a greeting.\nI should be brief.",
    "思考：用户在问首都。", "First, 2+2=4.\n\nThen the answer.", "",
]
REASON_VARIANTS = [
    "<think>\n{t}\n</think>\n\n{a}", "<think>{t}</think>{a}",
    "<think>\n\n{t}\n\n</think>\n\n\n{a}", "{t}\n</think>\n\n{a}",
    "<think>\n{t}\n</think>\n\n  {a}",   # spaces after the newlines
    "<think>\n {t} \n</think>\n\n{a}",   # spaces around the reasoning
]


def qwen3_strip_args_visible(messages):
    """Whether the Qwen3 template's output changes when str.strip/lstrip/rstrip
    ignore their '\\n' argument (as @huggingface/jinja does): replays the
    template's reasoning split and last-query logic with both semantics."""
    n, last_query, multi = len(messages), len(messages) - 1, True
    for i in reversed(range(n)):
        m = messages[i]
        c = m.get("content")
        if multi and m.get("role") == "user" and isinstance(c, str) and not (
                c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            multi, last_query = False, i
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or not isinstance(m.get("content"), str):
            continue
        pieces = []
        for chars in ("\n", None):
            content, reasoning = m["content"], ""
            if m.get("reasoning_content") is not None:
                reasoning = m["reasoning_content"]
            elif "</think>" in content:
                reasoning = content.split("</think>")[0].rstrip(chars).split("<think>")[-1].lstrip(chars)
                content = content.split("</think>")[-1].lstrip(chars)
            if i > last_query and (i == n - 1 or reasoning):
                pieces.append((reasoning.strip(chars), content.lstrip(chars)))
            else:
                pieces.append(content)
        if pieces[0] != pieces[1]:
            return True
    return False


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web — returns snippets «quoted».",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
                    "required": ["query"]}}},
    {"type": "function", "function": {"name": "run_code", "description": "Run Python code.\nReturns stdout.",
     "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "timeout": {"type": "number", "default": 2.5},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "no_params", "description": "", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "计算", "description": "中文工具描述", "parameters": {"type": "object",
     "properties": {"表达式": {"type": "string"}}, "required": ["表达式"]}}},
]
FLOAT_TOOL = {"type": "function", "function": {"name": "scale", "description": "Scale a value.",
              "parameters": {"type": "object", "properties": {"factor": {"type": "number", "default": 1.0}}}}}

ARGS = [
    {"city": "Paris"}, {"city": "東京", "unit": "celsius"}, {"query": "jinja \"templates\"", "limit": 5},
    {"code": "print('hi')\nprint({'a': 1})", "timeout": 0.5}, {}, {"nested": {"list": [1, "two", None, True, False], "x": -3}},
    {"表达式": "1+1"}, {"text": "tab\there\nnewline \\ backslash"},
]


def text():
    return rng.choice(TEXTS)


def tool_call(flat=False, string_args=None, float_args=False):
    args = rng.choice(ARGS)
    if float_args:
        args = {"factor": rng.choice([2.0, 1e-07, 100.0])}
    if string_args is None:
        string_args = rng.random() < 0.5
    name = rng.choice(["get_weather", "search", "run_code", "计算"])
    a = json.dumps(args, ensure_ascii=rng.random() < 0.5) if string_args else args
    fn = {"name": name, "arguments": a}
    if flat:
        return fn
    return {"id": "call_%06d" % rng.randrange(10**6), "type": "function", "function": fn}


cases = []


def add(name, messages, tools=None, differs=None, **kw):
    if qwen3_strip_args_visible(messages):
        differs = dict(differs or {}, qwen3="strip_args")
    for agp in (True, False):
        for think in (None, True, False):
            case = {"name": f"{name}/agp={int(agp)}/think={think}", "messages": messages, "add_generation_prompt": agp}
            if tools is not None:
                case["tools"] = tools
            if think is not None:
                case["kwargs"] = {"enable_thinking": think}
            if differs:
                case["differs"] = differs
            cases.append(case)
            if kw.get("once"):
                return


def assistant_reply(with_reasoning=True):
    """An assistant turn (and a flag the callers no longer need)."""
    t, a = rng.choice(THOUGHTS), text()
    kind = rng.randrange(4) if with_reasoning else 0
    if kind == 1:
        return {"role": "assistant", "content": rng.choice(REASON_VARIANTS).format(t=t, a=a)}, False
    if kind == 2:
        return {"role": "assistant", "content": a, "reasoning_content": t}, False
    if kind == 3:
        return {"role": "assistant", "content": a, "reasoning_content": None}, False
    return {"role": "assistant", "content": a}, False


# 1. Plain conversations, with and without a system message, 1..6 turns.
for i in range(20):
    msgs, odd = [], False
    if i % 2 == 0:
        msgs.append({"role": "system", "content": text() or "You are helpful."})
    for _ in range(1 + i % 6):
        msgs.append({"role": "user", "content": text()})
        reply, o = assistant_reply()
        msgs.append(reply)
        odd |= o
    msgs.append({"role": "user", "content": text()})
    add(f"chat{i}", msgs, differs={"qwen3": "strip_args"} if odd else None, once=i >= 14)

# 2. A final assistant turn (continuing a prefill) and a system message in the middle.
for i in range(4):
    reply, odd = assistant_reply()
    msgs = [{"role": "user", "content": text()}, reply]
    if i % 2:
        msgs = [{"role": "system", "content": "first"}] + msgs + [{"role": "system", "content": "late system"}, {"role": "user", "content": "ok"}]
    add(f"final_assistant{i}", msgs, differs={"qwen3": "strip_args"} if odd else None, once=i >= 2)

# 3. Tool use: tools lists, tool calls with string and object arguments, flat calls,
#    content with and without text, consecutive tool responses, several rounds.
for i in range(28):
    tools = rng.sample(TOOLS, 1 + i % len(TOOLS))
    msgs = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": text() or "Use tools."})
    msgs.append({"role": "user", "content": text()})
    for rnd in range(1 + i % 3):
        calls = [tool_call(flat=(i % 7 == 3), string_args=(None if i % 4 else (rnd % 2 == 0))) for _ in range(1 + (i + rnd) % 3)]
        content = rng.choice(["", "", "Let me check.", "<think>\nNeed a tool.\n</think>\n\nCalling tools."])
        am = {"role": "assistant", "content": content, "tool_calls": calls}
        if i % 5 == 1:
            am["reasoning_content"] = "I will call " + calls[0].get("function", calls[0])["name"]
        msgs.append(am)
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c.get("id", "x"), "content": rng.choice(
                ['{"temp": 21, "sky": "clear"}', "result: ok", "多行\n结果", "", "<tool_response>nested</tool_response>"])})
    reply, odd = assistant_reply(with_reasoning=i % 2 == 0)
    msgs.append(reply)
    msgs.append({"role": "user", "content": text()})
    add(f"tools{i}", msgs, tools=tools, differs={"qwen3": "strip_args"} if odd else None, once=i >= 20)

# 4. Tools offered but not called; tools with no system message; empty tools list.
for i in range(4):
    add(f"tools_offered{i}", [{"role": "user", "content": text()}], tools=rng.sample(TOOLS, 2), once=i >= 2)
add("tools_empty_list", [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], tools=[])

# 5. A user turn that looks like a tool response (Qwen3's multi-step tool logic).
for i in range(3):
    msgs = [{"role": "user", "content": "question"},
            {"role": "assistant", "content": "", "tool_calls": [tool_call()]},
            {"role": "tool", "content": "r"},
            {"role": "user", "content": "<tool_response>\nfrom user\n</tool_response>"},
            {"role": "assistant", "content": "<think>\nok\n</think>\n\ndone"}]
    add(f"multi_step{i}", msgs, tools=TOOLS[:1], once=i >= 1)

# 6. Floats in tool schemas and arguments (tojson formatting differs in the reference).
add("float_tool_schema", [{"role": "user", "content": "scale it"}], tools=[FLOAT_TOOL],
    differs={"qwen3": "float_json", "qwen2.5": "float_json"}, once=True)
add("float_arguments", [{"role": "user", "content": "scale"},
                         {"role": "assistant", "content": "", "tool_calls": [tool_call(string_args=False, float_args=True)]},
                         {"role": "tool", "content": "scaled"}],
    differs={"qwen3": "float_json", "qwen2.5": "float_json"}, once=True)
add("float_non_integral", [{"role": "user", "content": "x"},
                            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "scale", "arguments": {"factor": 0.25, "n": 3}}}]},
                            {"role": "tool", "content": "ok"}], once=True)

# 7. Inputs the templates reject or cannot handle (both references must fail too).
add("err_assistant_content_null", [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": None, "tool_calls": [tool_call()]},
                                    {"role": "tool", "content": "r"}], differs=None, once=True)
add("err_missing_content", [{"role": "user"}], once=True)
add("err_no_messages_with_tools", [], tools=TOOLS[:1],
    differs={"qwen3": "undefined_attr", "qwen2.5": "undefined_attr"}, once=True)

with open("cases.jsonl", "w", encoding="utf-8") as f:
    for c in cases:
        f.write(json.dumps(c) + "\n")
print(f"wrote {len(cases)} cases to cases.jsonl")

# ---- style_cases.jsonl: requests for the *-style templates (other families' constructs) ----
style = []


def sadd(template, name, messages, tools=None, kwargs=None, differs=None):
    for agp in (True, False):
        c = {"template": template, "name": f"{template}/{name}/agp={int(agp)}", "messages": messages,
             "add_generation_prompt": agp}
        if differs:
            c["differs"] = {template: differs}
        if tools is not None:
            c["tools"] = tools
        if kwargs:
            c["kwargs"] = kwargs
        style.append(c)


def alternating(n, system=None, parts=False):
    msgs = [{"role": "system", "content": system}] if system is not None else []
    for i in range(n):
        if parts and i % 2 == 0:
            msgs.append({"role": "user", "content": [{"type": "text", "text": "  look:  "},
                                                     {"type": "image", "url": "x.png"},
                                                     {"type": "text", "text": text() + "\n"}]})
        else:
            msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": "  " + text() + "  \n"})
    return msgs


for i in range(6):
    sadd("gemma3-style", f"chat{i}", alternating(1 + 2 * (i % 3), system="Be brief." if i % 2 else None, parts=i >= 3))
sadd("gemma3-style", "system_parts", [{"role": "system", "content": [{"type": "text", "text": "sys as parts"}]},
                                      {"role": "user", "content": "hi"}])
sadd("gemma3-style", "err_not_alternating", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
sadd("gemma3-style", "err_bad_content", [{"role": "user", "content": 5}])

for i in range(4):
    sadd("mistral-style", f"chat{i}", alternating(1 + 2 * i, system="System prompt." if i % 2 else None))
sadd("mistral-style", "system_then_assistant", [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}])
sadd("mistral-style", "err_tool_role", [{"role": "user", "content": "u"}, {"role": "tool", "content": "t"}])

LT = [TOOLS[0], TOOLS[2]]
llama_tool_chat = [{"role": "system", "content": "You are a bot."}, {"role": "user", "content": "weather?"},
                   {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                   {"role": "tool", "content": {"temp": 3, "sky": ["snow", "wind"]}},
                   {"role": "tool", "content": "plain text result"},
                   {"role": "assistant", "content": "It snows."}, {"role": "user", "content": "thanks"}]
sadd("llama3.1-style", "plain", alternating(3, system="Sys"))
sadd("llama3.1-style", "tools_in_user", llama_tool_chat, tools=LT)
sadd("llama3.1-style", "tools_in_system", llama_tool_chat, tools=LT, kwargs={"tools_in_user_message": False})
sadd("llama3.1-style", "builtin", [{"role": "user", "content": "search"},
                                   {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "jinja", "lang": "en"}}}]},
                                   {"role": "ipython", "content": "results"}],
     kwargs={"builtin_tools": ["brave_search", "code_interpreter"], "date_string": "03 Jun 2024"},
     differs="no_reject_filter")
sadd("llama3.1-style", "err_two_tool_calls", [{"role": "user", "content": "x"},
                                              {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}])
sadd("llama3.1-style", "err_tools_without_user", [{"role": "system", "content": "s"}], tools=LT)

with open("style_cases.jsonl", "w", encoding="utf-8") as f:
    for c in style:
        f.write(json.dumps(c) + "\n")
print(f"wrote {len(style)} cases to style_cases.jsonl")
