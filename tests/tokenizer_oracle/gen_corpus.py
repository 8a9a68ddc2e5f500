#!/usr/bin/env python3
"""Writes the tokenizer oracle corpus: deterministic (fixed seed, no input files) JSON lines
{"i": index, "cat": category, "hex": the string's bytes as hex}. Strings are bytes, so the corpus
can hold invalid UTF-8 (category "invalid_utf8"); everything else is valid UTF-8.

Usage: gen_corpus.py OUT.jsonl [COUNT_PER_CATEGORY]
"""
import json
import random
import sys
import unicodedata

WORDS = ("the of and to in is that it was for on are as with his they at be this from have or "
         "by one had not but what all were when we there can an your which their said if do will "
         "each about how up out them then she many some so these would other into has more her two "
         "like him see time could no make than first been its who now people my made over did down "
         "only way find use may water long little very after words called just where most know "
         "Hello World OpenAI Qwen Llama tokenizer prefill decode KV-cache GPU's isn't I'M we'LL "
         "they'RE you'VE he'D it'S don't can't won't naïve café résumé Zürich façade coöperate").split()
CODE = [
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\ta[i] += b[i];\n}",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }", "x = [i**2 for i in range(10)]",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;", "fn main() { println!(\"hi\"); }",
    "const a = {b: [1, 2, 3], 'c': null};", "if __name__ == '__main__':\n\tmain()\r\n",
    "<div class=\"x\">&nbsp;</div>", "$ ls -la | grep '.cc$' >> out.txt 2>&1", "a->b::c<<=d>>e",
    "    \n        \n", "/* comment */ // another\n", "λx.λy.x y", "std::vector<int32_t> v{1,2};",
]
CJK = ["你好，世界！", "今天天气很好。", "日本語のテキストです。", "한국어 문장입니다.", "漢字とかな交じり文",
       "中文标点：“引号”、《书名》……", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", "𠀀𠀁𪜀 rare ideographs"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵🇫🇷", "❤️", "🏳️‍🌈", "🤖🚀✨", "☕️", "1️⃣", "🧑🏿‍💻", "🫠"]
ARABIC = ["مرحبا بالعالم", "اللغة العربية جميلة", "٠١٢٣٤٥٦٧٨٩", "السَّلَامُ عَلَيْكُمْ", "שלום עולם",
          "नमस्ते दुनिया", "Привет, мир!", "Γειά σου Κόσμε", "สวัสดีชาวโลก", "Xin chào thế giới"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
            "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|reserved_special_token_5|>", "<|im_start", "|>", "<|", "<s>", "</s>"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u200b", "\u0085",
          "\u2028", "\ufeff", "\x0b", "\x0c", "\u1680", "\u180e"]
NFD_BASES = "aeiouAEIOUnNcCyY"
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0303", "\u0327", "\u030a", "\u0323"]
# Code point ranges sampled for random text (excluding surrogates).
RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
          (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF),
          (0x2000, 0x206F), (0xFF00, 0xFFEF), (0x10000, 0x1007F), (0x1D400, 0x1D7FF)]


def english(r):
    n = r.randint(1, 25)
    s = " ".join(r.choice(WORDS) for _ in range(n))
    if r.random() < 0.5:
        s = s[0].upper() + s[1:] + r.choice([".", "!", "?", ",", "...", ";", ""])
    return s


def code(r):
    return "".join(r.choice(CODE) for _ in range(r.randint(1, 3)))


def digits(r):
    n = r.randint(1, 40)
    s = "".join(r.choice("0123456789") for _ in range(n))
    style = r.randint(0, 5)
    if style == 1:
        s = f"{int(s):,}"
    elif style == 2:
        s = s[: max(1, n // 2)] + "." + s[n // 2:]
    elif style == 3:
        s = r.choice(WORDS) + s + r.choice(WORDS)
    elif style == 4:
        s = " ".join(s[i:i + r.randint(1, 5)] for i in range(0, n, 3))
    elif style == 5:
        s = "-" + s + "e" + str(r.randint(-30, 30))
    return s


def whitespace(r):
    parts = []
    for _ in range(r.randint(1, 8)):
        parts.append(r.choice(SPACES) * r.randint(1, 6))
        if r.random() < 0.6:
            parts.append(r.choice(WORDS + ["1", "22", "!", "😀", "中"]))
    return "".join(parts)


def special(r):
    parts = []
    for _ in range(r.randint(1, 6)):
        x = r.random()
        parts.append(r.choice(SPECIALS) if x < 0.5 else english(r) if x < 0.8 else
                     r.choice(SPACES) * r.randint(1, 3))
    return "".join(parts)


def nfd(r):
    s = "".join(r.choice(NFD_BASES) + (r.choice(COMBINING) if r.random() < 0.7 else "")
                for _ in range(r.randint(1, 12)))
    return unicodedata.normalize("NFD", english(r)) + " " + s if r.random() < 0.5 else s


def random_unicode(r):
    out = []
    for _ in range(r.randint(1, 30)):
        lo, hi = r.choice(RANGES)
        out.append(chr(r.randint(lo, hi)))
    return "".join(out)


def mixed(r):
    gens = [english, code, digits, whitespace, special, lambda r: r.choice(CJK),
            lambda r: r.choice(EMOJI), lambda r: r.choice(ARABIC), random_unicode]
    return "".join(r.choice(gens)(r) for _ in range(r.randint(2, 6)))


def invalid(r):
    """Valid text with bytes that are not UTF-8 spliced in (lone continuation bytes, truncated
    sequences, overlongs, surrogates, bytes 0xF5..0xFF)."""
    bad = [b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80",
           b"\xf5", b"\xff", b"\xfe\xfe", b"\xe0\x80\x80", b"\xf4\x90\x80\x80"]
    base = mixed(r).encode()
    for _ in range(r.randint(1, 4)):
        cut = r.randint(0, len(base))
        base = base[:cut] + r.choice(bad) + base[cut:]
    return base


CATEGORIES = {
    "english": english, "code": code, "cjk": lambda r: "".join(
        r.choice(CJK) for _ in range(r.randint(1, 3))), "emoji": lambda r: "".join(
        r.choice(EMOJI + [" ", "a", "!"]) for _ in range(r.randint(1, 8))), "arabic_etc": lambda r: " ".join(
        r.choice(ARABIC) for _ in range(r.randint(1, 3))), "digits": digits,
    "whitespace": whitespace, "special_tokens": special, "nfd_combining": nfd,
    "random_unicode": random_unicode, "mixed": mixed, "invalid_utf8": invalid,
}

FIXED = ["", " ", "a", "  leading", "trailing  ", "\n\n\n", "I'M HERE", "'s", "Don'T",
         "x'Ll", "ǅ'S", "1234567", "٣٤٥٦٧", "½⅓¼", "①②③", "a\u0301", "é", "Å", "ﬁ", "ℌ",
         "\u00a0\u00a0x", "\t\tx\t", "a\r\nb", "<|im_start|>user\nhi<|im_end|>\n",
         "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
         "it'\u017f", "it\u2019s", "a\u0085b", "a\u180eb", "a \ufeffb", "\u212a'LL"]


def main():
    out = sys.argv[1]
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 180
    r = random.Random(20261201)
    rows = [("fixed", s.encode()) for s in FIXED]
    for cat, gen in CATEGORIES.items():
        for _ in range(per):
            v = gen(r)
            rows.append((cat, v if isinstance(v, bytes) else v.encode("utf-8")))
    with open(out, "w") as f:
        for i, (cat, b) in enumerate(rows):
            f.write(json.dumps({"i": i, "cat": cat, "hex": b.hex()}) + "\n")
    print(f"gen_corpus: {len(rows)} strings in {len(CATEGORIES) + 1} categories -> {out}")


if __name__ == "__main__":
    main()
