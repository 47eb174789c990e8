// render_chat_template: the reference renderer for the chat-template tests —
// @huggingface/jinja (transformers.js's engine) given the variables
// transformers' apply_chat_template passes.
//
//   node render_chat_template.mjs --template FILE [--bos-token S] [--eos-token S] < requests.jsonl
//   node render_chat_template.mjs --per-line < cases.jsonl   (lines: {"template", "vars"})
//
// Request lines are {"messages", "tools"?, "add_generation_prompt"?, "kwargs"?}; each
// output line is the rendered JSON string, or {"error": message}.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Template } from "@huggingface/jinja";

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const perLine = args.includes("--per-line");
const templateFile = opt("--template");
const bos = opt("--bos-token");
const eos = opt("--eos-token");
if (!perLine && !templateFile) {
  console.error("usage: render_chat_template.mjs --template FILE | --per-line");
  process.exit(2);
}

let shared = null;
if (templateFile) {
  try {
    shared = new Template(readFileSync(templateFile, "utf8"));
  } catch (e) {
    shared = e;
  }
}

function render(template, vars) {
  if (template instanceof Error) throw template;
  return template.render(vars);
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let out;
  try {
    const req = JSON.parse(line);
    if (perLine) {
      out = render(new Template(req.template), req.vars || {});
    } else {
      const vars = {
        messages: req.messages,
        tools: req.tools ?? null,
        documents: null,
        add_generation_prompt: !!req.add_generation_prompt,
      };
      if (bos !== undefined) vars.bos_token = bos;
      if (eos !== undefined) vars.eos_token = eos;
      Object.assign(vars, req.kwargs || {});
      out = render(shared, vars);
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: String(e && e.message ? e.message : e) }) + "\n");
  }
}
