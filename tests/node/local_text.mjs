// local_text: natural text found on a Debian machine, for the tokenizer corpus
// and benchmark — translations from gettext catalogues (.mo) in many scripts,
// license texts and package documentation (English prose), headers and
// library sources (code).
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';

// The translated strings of one .mo catalogue (the header entry skipped).
export function moStrings(file) {
  let b;
  try {
    b = fs.readFileSync(file);
  } catch {
    return [];
  }
  if (b.length < 28) return [];
  const magic = b.readUInt32LE(0);
  const le = magic === 0x950412de;
  if (!le && b.readUInt32BE(0) !== 0x950412de) return [];
  const u32 = (o) => (le ? b.readUInt32LE(o) : b.readUInt32BE(o));
  const n = u32(8), origs = u32(12), trans = u32(16);
  const out = [];
  for (let i = 0; i < n; i++) {
    if (trans + 8 * i + 8 > b.length || origs + 8 * i + 8 > b.length) break;
    const olen = u32(origs + 8 * i);
    const len = u32(trans + 8 * i), off = u32(trans + 8 * i + 4);
    if (olen === 0 || off + len > b.length) continue; // the header
    const s = b.subarray(off, off + len).toString('utf8').split('\0')[0];
    if (s.length) out.push(s);
  }
  return out;
}

// Every translated string for a locale, catalogues in name order.
export function localeStrings(locale) {
  const dir = `/usr/share/locale/${locale}/LC_MESSAGES`;
  let files = [];
  try {
    files = fs.readdirSync(dir).filter((f) => f.endsWith('.mo')).sort();
  } catch {
    return [];
  }
  return files.flatMap((f) => moStrings(path.join(dir, f)));
}

function readMaybeGz(file) {
  try {
    const b = fs.readFileSync(file);
    return (file.endsWith('.gz') ? zlib.gunzipSync(b) : b).toString('utf8');
  } catch {
    return '';
  }
}

function walk(dir, pred, out, limit) {
  let ents;
  try {
    ents = fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1));
  } catch {
    return;
  }
  for (const e of ents) {
    if (out.length >= limit) return;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, pred, out, limit);
    else if (e.isFile() && pred(p)) out.push(p);
  }
}

// English prose: the common licenses, then package copyright files,
// READMEs and NEWS, until about `bytes` bytes.
export function englishProse(bytes) {
  const parts = [];
  let total = 0;
  const add = (t) => {
    if (!t || total >= bytes) return;
    parts.push(t);
    total += Buffer.byteLength(t);
  };
  for (const f of fs.readdirSync('/usr/share/common-licenses').sort()) add(readMaybeGz(path.join('/usr/share/common-licenses', f)));
  const docs = [];
  walk('/usr/share/doc', (p) => /\/(copyright|README[^/]*|NEWS[^/]*|changelog[^/]*)$/i.test(p), docs, 100000);
  for (const f of docs) add(readMaybeGz(f));
  return parts.join('\n');
}

// Code: C headers, then Python and JavaScript sources.
export function codeText(bytes) {
  const files = [];
  walk('/usr/include', (p) => p.endsWith('.h'), files, 4000);
  const roots = [];
  try {
    for (const v of fs.readdirSync('/root/.pyenv/versions')) roots.push(`/root/.pyenv/versions/${v}/lib`);
  } catch {}
  roots.push('/usr/lib/python3');
  const py = [];
  for (const r of roots) walk(r, (p) => p.endsWith('.py'), py, 2000);
  const js = [];
  walk('/usr/share/nodejs', (p) => p.endsWith('.js'), js, 2000);
  // Interleave the languages so that any prefix has all three.
  const order = [];
  for (let i = 0; i < Math.max(files.length, py.length, js.length); i++)
    for (const l of [files, py, js]) if (i < l.length) order.push(l[i]);
  const parts = [];
  let total = 0;
  for (const f of order) {
    if (total >= bytes) break;
    const t = readMaybeGz(f);
    if (!t || t.includes('\uFFFD')) continue;
    parts.push(t);
    total += Buffer.byteLength(t);
  }
  return parts.join('\n');
}

// Chinese: the Simplified and Traditional Chinese catalogues' translations.
export function chineseText(bytes) {
  const parts = [];
  let total = 0;
  for (const loc of ['zh_CN', 'zh_TW', 'zh_HK']) {
    for (const s of localeStrings(loc)) {
      if (total >= bytes) break;
      parts.push(s);
      total += Buffer.byteLength(s) + 1;
    }
  }
  return parts.join('\n');
}
