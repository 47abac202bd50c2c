// tests/gen_tok_goldens.js — regenerates tests/fixtures/tok/golden_extra_*.jsonl.
//
// NEEDS npm and Node 20; NOT run by ./build.sh or CI (the generated files are committed):
//   mkdir -p /tmp/hft && (cd /tmp/hft && npm install @huggingface/tokenizers@0.2.0)
//   NODE_PATH=/tmp/hft/node_modules node tests/gen_tok_goldens.js tests/fixtures/tok
//
// The oracle is @huggingface/tokenizers 0.2.0 (pure JavaScript, a port of Hugging Face
// tokenizers that translates the Oniguruma regex to JavaScript). Each line is
// {"text", "ids", "decoded"}: encode(text, add_special_tokens = false) and decode(ids);
// golden_pieces_*.jsonl hold the Split pieces of the NFC text (pre_tokenize_text).
// The strings are tricky cases by hand (mixed scripts, combining marks, Hangul, whitespace
// runs, CRLF, contractions in capitals, digits, emoji ZWJ sequences, non-NFC input, added
// tokens) plus seeded random mixes of such pieces. Two known differences from the Rust crate
// are kept out of the inputs: this port folds case in (?i:...) for ASCII only (Oniguruma also
// folds U+017F to 's'), and its Unicode is newer (17.0) than the tables here (15.0), so only
// characters assigned by Unicode 15 are used.
'use strict';
const fs = require('fs');
const path = require('path');
const {Tokenizer} = require('@huggingface/tokenizers');

// DIR holds the tokenizer files read here and receives the goldens
const [outDir] = process.argv.slice(2);
if (!outDir) {
  console.error('usage: node gen_tok_goldens.js DIR');
  process.exit(2);
}

const handpicked = [
  // mixed scripts
  'Hello世界مرحبا123', 'naïve café résumé façade', 'Привет, мир! Καλημέρα κόσμε', 'abcабвαβγ אבג',
  // combining marks (several, out of canonical order, enclosing, spacing)
  'e\u0301\u0301', 'a\u0323\u0307', '\u1e0b\u0323', 'x\u20dd y', 'q\u0307\u0323', 'क्षत्रिय', 'ก้ ก๊ กำ',
  '\u0627\u064e\u0644\u0652', 'Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA',
  // Hangul: conjoining jamo compose under NFC, syllables stay
  '\u1100\u1161\u11a8', '\u1100\u1161 \u1112\u1161\u11ab', '\uac00\u11a8 \ud55c\uad6d\uc5b4', '\u1100\u1100\u1161\u1161',
  // whitespace runs
  ' '.repeat(50) + 'x', '\t'.repeat(20), 'x' + ' '.repeat(33), '\n'.repeat(40), ' \n'.repeat(10) + 'end',
  '\u3000'.repeat(5) + '字', ' \t \u00a0 \u2009x', 'a  \n  b', 'end   ',
  // CRLF and lone CR
  'line1\r\nline2\r\n\r\n  indented\r\n', '\r\r\n\n\r', 'a\rb\r\n', 'x:\r\n\r\n\ty',
  // contractions, capitals
  "DON'T I'M YOU'RE WE'VE HE'LL SHE'D IT'S", "'S'T'RE'VE'M'LL'D", "O'Neil's rock'n'roll", "'", " '", "''", "'''s",
  "it's 'tis y'all", "We'Ve They'rE",
  // digits of several kinds
  '3.14159 2,718 1e10', '\u0661\u0662\u0663 \u00b2\u00b3 \u216b \u00bd \uff11\uff12\uff13', '0000000000', 'v1.2.3-rc4',
  // emoji, ZWJ sequences, flags, skin tones, variation selectors
  '👩\u200d💻 👨\u200d👩\u200d👧 ❤\ufe0f\u200d🔥 🏳\ufe0f\u200d🌈 👍🏿', '🇺🇸🇯🇵', '😀😃😄😁', 'a👍b',
  // not in NFC: composed by the normalizer; singletons and exclusions
  'A\u030angstro\u0308m', '\u212b \u212a \u2126', '\u0958\u0959 \u2adc', '\u1f80\u0345', '\u01d5 vs U\u0308\u0304',
  'e\u0301 vs \u00e9', '\u0344', '\u0041\u0308\u0301',
  // added tokens, whole and broken
  '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>',
  '<think></think><tool_call>{}</tool_call>', '<|im_start|><|im_start|>', '<<|im_end|>>', '<|im_start|', 'x<think>y',
  '<|endoftext|>\n\n<|endoftext|>',
  // other spaces and format characters
  'a\u0085b c\u00a0d e\u200bf', '\ufeffBOM', 'x\u2028y\u2029z', 'tab\u000bvt\u000cff', '\u001f\u001e',
  // code and URLs
  'for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n', 'def f(x):\n    return x**2  # square\n',
  'mailto:someone@example.org?subject=Hi%20there', '{"a": [1, 2.5e-3, null], "b": "\\u00e9"}',
];

let seed = 20261129;
function rnd(n) { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; }
const pool = [
  ...'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789', ' ', ' ', ' ', ' ', '\t', '\n', '\n', '\r', '\r\n',
  "'", "'s", "'S", "'ll", "'LL", "'Re", "'vE", "'d", "'M", "'t", ...'.,!?-_"(){}[]<>|/\\@#$%^&*+=~`;:',
  'é', 'ß', 'ñ', 'Å', '\u00a0', '\u0085', '\u00ad', '×', 'µ',
  '\u0301', '\u0308', '\u0323', '\u0327', '\u030a', '\u20dd', '\u093f', '\u0345', '\u0313', '\u0300',
  'क', '्', 'ि', 'ं', 'ก', '้', 'า', '한', '\u1100', '\u1161', '\u11a8', '가',
  '中', '日', 'ー', '、', '\u3000', 'ب', '\u064e', '٣', '²', 'Ⅻ', '½', 'Ａ', '１',
  '👍', '🏽', '\u200d', '👨', '❤', '\ufe0f', '🇵', '🇱',
  '\u2000', '\u2009', '\u202f', '\u205f', '\u200b', '\ufeff', '\u2028', '\u2029', '\u000b', '\u000c', '\u001f',
  '\u212b', '\u212a', '\u2126', '\u0958', '\u2adc', '\ud834\udd5e', 'A\u030a', '\u1f80', 'α', 'ω', 'ᾳ',
  '<|im_start|>', '<|im_end|>', '<think>', '</think>', '<|endoftext|>', '<tool_call>', '<|im_', '<think', 'think>',
  'Ǖ', 'ǖ', '\u0344', 'ḋ', 'ḍ', 'ṩ',
];
function randomText() {
  let s = '';
  const k = 1 + rnd(24);
  for (let j = 0; j < k; j++) {
    let c = pool[rnd(pool.length)];
    if (rnd(10) === 0) c = c.repeat(1 + rnd(30));
    s += c;
  }
  return s;
}
const random = [];
for (let i = 0; i < 150; i++) random.push(randomText());

// The byte-level alphabet back to bytes, for the Split pieces below.
const byteOf = {};
{
  const bs = [], cs = [];
  for (let b = 0; b < 256; b++) if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae) { bs.push(b); cs.push(b); }
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  bs.forEach((b, i) => { byteOf[String.fromCodePoint(cs[i])] = b; });
}

// The Qwen3.5 pre-tokenizer regex on the Qwen3 vocabulary (as tests/test_tokenizer.c derives it:
// qwen3-tokenizer.json with its Split regex replaced; no file of its own in the repository).
const QWEN35_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
function loadTokenizerJson(file) {
  const json = JSON.parse(fs.readFileSync(path.join(outDir, file === 'qwen35' ? 'qwen3-tokenizer.json' : file), 'utf8'));
  if (file === 'qwen35') json.pre_tokenizer.pretokenizers[0].pattern.Regex = QWEN35_REGEX;
  return json;
}

for (const [name, file] of [['qwen35', 'qwen35'], ['qwen3', 'qwen3-tokenizer.json'], ['tiny', 'tiny-tokenizer.json']]) {
  const json = loadTokenizerJson(file);
  const tok = new Tokenizer(json, {});
  const lines = [];
  for (const text of [...handpicked, ...random]) {
    const ids = tok.encode(text, {add_special_tokens: false}).ids;
    const decoded = tok.decode(ids, {skip_special_tokens: false, clean_up_tokenization_spaces: false});
    lines.push(JSON.stringify({text, ids, decoded}));
  }
  fs.writeFileSync(path.join(outDir, `golden_extra_${name}.jsonl`), lines.join('\n') + '\n');
  if (name === 'tiny') continue;
  // golden_pieces_*.jsonl: {"text" (NFC), "pieces"}: the Split regex alone (the two Qwen regexes
  // give the same ids on most text, so their piece boundaries are checked directly)
  const plines = [];
  for (const raw of [...handpicked, ...random]) {
    const text = raw.normalize('NFC');
    const pieces = tok.pre_tokenizer.pre_tokenize_text(text).map(p => Buffer.from([...p].map(c => byteOf[c])).toString('utf8'));
    plines.push(JSON.stringify({text, pieces}));
  }
  fs.writeFileSync(path.join(outDir, `golden_pieces_${name}.jsonl`), plines.join('\n') + '\n');
}
