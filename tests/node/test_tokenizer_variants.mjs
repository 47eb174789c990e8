// test_tokenizer_variants: the components Qwen3's tokenizer.json does not use
// (the other Split behaviours, invert, ByteLevel's own regex and prefix space,
// added tokens with lstrip/rstrip/single_word/normalized, TemplateProcessing,
// other normalizers, Oniguruma escapes and anchors) — each as a variant of
// that file, encoded by `moeserve tokenize` and by Hugging Face's tokenizers.
//   node test_tokenizer_variants.mjs MODEL_DIR CORPUS.jsonl WORK_DIR
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { loadRef, readJsonLines } from './tokenizer_refs.mjs';

const [modelDir, corpusFile, workDir] = process.argv.slice(2);
const bin = process.env.MOESERVE_BIN;
if (!modelDir || !corpusFile || !workDir || !bin) {
  console.error('usage: MOESERVE_BIN=... node test_tokenizer_variants.mjs MODEL_DIR CORPUS WORK_DIR');
  process.exit(2);
}
const base = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));
const qwenRegex = base.pre_tokenizer.pretokenizers[0].pattern.Regex;
const byteLevel = (add_prefix_space, use_regex) => ({ type: 'ByteLevel', add_prefix_space, trim_offsets: false, use_regex });
const split = (pattern, behavior, invert = false) => ({ type: 'Split', pattern, behavior, invert });
const seq = (...p) => ({ type: 'Sequence', pretokenizers: p });
const withAdded = (changes) =>
  base.added_tokens.map((t) => (changes[t.content] ? { ...t, ...changes[t.content] } : t));

const variants = {
  gpt2_byte_level: { pre_tokenizer: byteLevel(true, true), normalizer: null },
  byte_level_regex_no_prefix: { pre_tokenizer: byteLevel(false, true) },
  merged_with_previous: { pre_tokenizer: seq(split({ Regex: qwenRegex }, 'MergedWithPrevious'), byteLevel(false, false)) },
  merged_with_next: { pre_tokenizer: seq(split({ Regex: qwenRegex }, 'MergedWithNext'), byteLevel(false, false)) },
  contiguous: { pre_tokenizer: seq(split({ Regex: '\\s+|\\p{N}' }, 'Contiguous'), byteLevel(false, false)) },
  removed: { pre_tokenizer: seq(split({ Regex: '\\s+' }, 'Removed'), byteLevel(false, false)) },
  invert_isolated: { pre_tokenizer: seq(split({ Regex: '\\p{L}+|\\p{N}+' }, 'Isolated', true), byteLevel(false, false)) },
  invert_removed: { pre_tokenizer: seq(split({ Regex: qwenRegex }, 'Removed', true), byteLevel(false, false)) },
  literal_then_regex_prefix_space: {
    pre_tokenizer: seq(split({ String: '. ' }, 'MergedWithPrevious'), split({ Regex: qwenRegex }, 'Isolated'),
                       byteLevel(true, false)),
  },
  oniguruma_escapes: {
    pre_tokenizer: seq(split({ Regex: '\\w+|\\W' }, 'Isolated'), split({ Regex: '\\h+' }, 'Isolated'),
                       split({ Regex: '[\\w\\s]+' }, 'Isolated', true), byteLevel(false, false)),
  },
  anchors: { pre_tokenizer: seq(split({ Regex: '^\\s+|\\s+$|\\d' }, 'Isolated'), byteLevel(false, false)) },
  empty_matches: { pre_tokenizer: seq(split({ Regex: 'x*' }, 'Isolated'), byteLevel(false, false)) },
  nfkc: { normalizer: { type: 'NFKC' } },
  nfd_sequence: { normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'NFC' }, { type: 'NFKD' }] } },
  no_normalizer: { normalizer: null },
  added_token_options: {
    added_tokens: withAdded({
      '<think>': { lstrip: true },
      '</think>': { rstrip: true },
      '<tool_call>': { lstrip: true, rstrip: true },
      '<|im_start|>': { single_word: true },
      '<|fim_pad|>': { content: 'ﬁne', normalized: true, special: false },
      '<|repo_name|>': { content: 'zyxw', single_word: true, special: false },
      '<|file_sep|>': { content: 'Café', normalized: true, special: false },
    }),
    normalizer: { type: 'NFKC' },
  },
  template_processing: {
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
               { SpecialToken: { id: '<|im_end|>', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: {
        '<|endoftext|>': { id: '<|endoftext|>', ids: [151643], tokens: ['<|endoftext|>'] },
        '<|im_end|>': { id: '<|im_end|>', ids: [151645], tokens: ['<|im_end|>'] },
      },
    },
  },
};

// Strings that exercise the variants: every corpus string with something
// interesting in it, shorter ones only (each variant loads two tokenizers).
const corpus = readJsonLines(corpusFile).filter((s) => s.length < 400);
const extra = ['Hi <think> there </think>  after', 'x<tool_call>y', ' \t<tool_call>\n z', 'a<|im_start|>b <|im_start|> c',
               'zyxw world, zyxws, azyxw zyxw! zyxw_ zyxw\u0301 (zyxw)', 'ﬁne fine ﬁnest', 'Cafe\u0301 Café CAFÉ', 'xxxyx', 'x', 'ax xa',
               '  lead and trail  ', '\n\nline\n\n', 'Dr. Smith. Mr. Jones.', 'abc123def 456', 'a_b-c d\u00e9f'];
const strings = [...extra, ...corpus.filter((_, i) => i % 5 === 0)];

let passed = 0, failed = 0;
fs.mkdirSync(workDir, { recursive: true });
const cfg = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
delete cfg.added_tokens_decoder; // the variants change added tokens
// Each variant as tokenizer(text) encodes; the post-processor's one also with
// add_special_tokens=False (what a rendered chat template is encoded with).
const runs = Object.entries(variants).map(([name, change]) => [name, change, true]);
runs.push(['template_processing', variants.template_processing, false]);
for (const [name, change, special] of runs) {
  const dir = path.join(workDir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify({ ...base, ...change }));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
  const hf = loadRef('hf', dir);
  const out = execFileSync(bin, ['tokenize', dir, ...(special ? [] : ['--no-add-special-tokens'])], {
    input: strings.map((s) => JSON.stringify(s)).join('\n') + '\n',
    maxBuffer: 1 << 30,
  }).toString().split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  let bad = 0;
  for (let i = 0; i < strings.length; i++) {
    const h = await hf.encode(strings[i], special);
    if (JSON.stringify(h) === JSON.stringify(out[i])) {
      passed++;
      continue;
    }
    failed++;
    if (bad++ < 4)
      console.log(`FAIL ${name}: ${JSON.stringify(strings[i]).slice(0, 100)}: ours ${JSON.stringify(out[i])} ` +
                  `reference ${JSON.stringify(h)} (pieces ${JSON.stringify(hf.preTokenize(strings[i])).slice(0, 300)})`);
  }
  console.log(`# ${name}${special ? '' : ', add_special_tokens false'}: ${strings.length - bad} of ${strings.length} agree`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
