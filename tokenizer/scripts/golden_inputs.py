"""The strings whose Hugging Face encodings are the tokenizer's golden tests.

inputs(corpus) returns [(name, text)]: hand-written cases by category, strings
generated from fragments with a fixed seed, long repeats (the heap path of
BPE), and a few long documents cut from the benchmark corpus. Deterministic.
"""
import random

HAND = {
    "english": [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "Hello world",
        " Hello world",
        "hello   world",
        "A sentence. Another one! And a question? Yes...",
        "Mr. O'Neil's dog barked at 5 o'clock; it wasn't amused.",
        "e.g., i.e., etc., vs. U.S.A. — and—em dashes – en dashes",
        "“Smart quotes” and ‘single ones’ and «guillemets» and „German“",
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE",
        "ALL CAPS SENTENCE WITH SOME WORDS",
        "Tokenization isn't always straightforward: it's subtle.",
        "The year 1984 and the number 3.14159265358979 and 1,234,567.89",
    ],
    "contractions": [
        "I'm you're we've they'll she'd it's don't",
        "I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T",
        "I'm YoU'Re wE'vE ThEy'Ll sHe'D It'S dOn'T",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "''s '''t 'x 'sup 'really 'llama 'dad",
        "rock'n'roll y'all ma'am o'clock",
        "it'ſ IT'ſ 'ſ ſ",
        "it'ﬆ 'ﬅ",
        "don’t it’s (curly apostrophes)",
        "'",
        "''",
        "a'",
        "'1 '  's'",
        "John's, James', the boss's, the bosses' cars",
    ],
    "whitespace": [
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\r",
        "\r\n",
        "\n\n\n",
        "\r\n\r\n",
        "\r\r\n\n",
        "a b",
        "a  b",
        "a   b",
        "a\tb",
        "a\t\tb",
        "a\nb",
        "a\n\nb",
        "a\r\nb",
        "a \nb",
        "a\n b",
        "a \n b",
        "a  \n\n  b",
        "a \t \n \t b",
        "trailing space ",
        "trailing spaces   ",
        "trailing newline\n",
        "trailing newlines\n\n\n",
        "   leading spaces",
        "\tleading tab",
        "\n\nleading newlines",
        "line1\r\nline2\r\nline3\r\n",
        "mixed \t tabs\t \tand spaces",
        " !",
        "  !!",
        " \t!",
        "\t!",
        "x  !",
        "x\n!",
        "x \n!",
        "!\n\nfoo",
        "! \n foo",
        "   \n",
        "    x",
        "\u00a0",
        "a\u00a0b",
        "a\u00a0\u00a0b",
        "a \u00a0b",
        "x\u3000y\u3000\u3000z",
        "a\u2028b\u2029c",
        "a\u0085b",
        "a\u000bb\u000cc",
        "a\u1680b\u2000c\u2001d\u2002e\u2003f\u2004g\u2005h\u2006i\u2007j\u2008k\u2009l\u200am",
        "a\u202fb\u205fc",
        "a\u180eb",
        "a\u200bb\u200cc\u200dd",
        "a\ufeffb\u2060c",
        "\u3000\u3000indent",
        "x \u00a0\n\u3000y",
    ],
    "numbers": [
        "0",
        "12",
        "123",
        "1234567890",
        "3.14159",
        "1,000,000",
        "1 000 000",
        "2024-01-15T13:45:30Z",
        "0x1F 0b1010 0o777 1e-10 6.02e23 -42 +7",
        "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679",
        "phone: +1 (555) 123-4567 ext. 89",
        "v1.2.3-beta.4+build.567",
        "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳۴۵۶۷۸۹",
        "०१२३४५६७८९ ১২৩",
        "①②③ ⑴⑵ ⅠⅡⅢⅫ ½ ¾ ² ³ ⁴",
        "１２３４５ ６７８９０",
        "𝟎𝟏𝟐 𝟘𝟙𝟚",
        "abc123def456",
        "x2 y10 z100",
        "$1,234.56 €99,99 ¥1000 £5",
        "50% 3/4 2^10 10**6",
    ],
    "code": [
        "func main() {\n\tfmt.Println(\"Hello, 世界\")\n}\n",
        "package tokenizer\n\nimport (\n\t\"strings\"\n\t\"unicode\"\n)\n\n// Split cuts s.\nfunc Split(s string) []string {\n\treturn strings.Fields(s)\n}\n",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
        "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        self._x = x  # comment\n",
        "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);\nlet arr = [...xs].map(x => x ** 2);\n",
        "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
        "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"%d\\n\", argc);\n    return 0;\n}\n",
        "template <typename T>\nstd::vector<T> f(const std::vector<T>& v) { return {v.rbegin(), v.rend()}; }\n",
        "public static void main(String[] args) {\n    System.out.println(\"hi\");\n}\n",
        "SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 5;",
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test</title></head>\n<body><p class=\"x\">Hi &amp; bye</p></body>\n</html>\n",
        ".btn:hover { color: #ff0000; margin: 0 auto; }\n@media (max-width: 600px) { .btn { display: none; } }\n",
        "{\"name\": \"webdraft\", \"version\": \"1.0.0\", \"tags\": [\"a\", \"b\"], \"nested\": {\"x\": null, \"y\": true}}",
        "key: value\nlist:\n  - one\n  - two\nnested:\n  deep: 3\n",
        "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | wc -c\ndone\n",
        "main :: IO ()\nmain = mapM_ print $ take 10 $ filter even [1..]\n",
        "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n",
        "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$",
        "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
        "    indented code block\n        more indented\n\t\ttabs\n",
        "if (x != y && z <= 10 || !flag) { a += b; c <<= 2; d >>>= 1; }",
        "x = {'a': 1, \"b\": [1, 2, 3], 'c': (4, 5)}",
        "```go\nfmt.Println(\"fenced\")\n```",
        "// TODO(someone): fix this\n/* block\n * comment */\n",
        "i++; j--; k **= 2; ptr->field; obj?.prop ?? def; a ?: b",
    ],
    "cjk": [
        "你好，世界！",
        "我爱自然语言处理。今天天气很好。",
        "中文和English混合的句子，还有123数字。",
        "日本語のテキストです。ひらがな、カタカナ、漢字。",
        "東京都渋谷区で、ラーメンを食べました！",
        "ｶﾀｶﾅ ﾊﾝｶｸ ﾃｷｽﾄ",
        "한국어 텍스트입니다. 안녕하세요!",
        "\u1100\u1161\u11a8 \u1112\u1161\u11ab",
        "繁體中文：臺灣、香港。",
        "「引用」『二重引用』【括弧】〈山括弧〉",
        "一二三四五六七八九十百千万亿",
        "𠀀𠀁𪜀 rare CJK extension B",
    ],
    "scripts": [
        "Привет, мир! Как дела?",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Ґанок їжак єнот",
        "مرحبا بالعالم! كيف حالك؟",
        "السَّلَامُ عَلَيْكُمْ",
        "سلام دنیا، حال شما چطور است؟",
        "שלום עולם! מה שלומך?",
        "בְּרֵאשִׁית בָּרָא אֱלֹהִים",
        "नमस्ते दुनिया! आप कैसे हैं?",
        "হ্যালো বিশ্ব",
        "வணக்கம் உலகம்",
        "Γειά σου Κόσμε! Ἐν ἀρχῇ ἦν ὁ λόγος",
        "สวัสดีชาวโลก ภาษาไทย",
        "Xin chào thế giới! Tiếng Việt có dấu.",
        "Merhaba Dünya! İstanbul ılık.",
        "გამარჯობა მსოფლიო",
        "Բարեւ աշխարհ",
        "ሰላም ዓለም",
        "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ",
        "ᚠᚢᚦᚨᚱᚲ runes",
        "𝔉𝔯𝔞𝔨𝔱𝔲𝔯 𝓢𝓬𝓻𝓲𝓹𝓽 𝕯𝖔𝖚𝖇𝖑𝖊",
        "Zażółć gęślą jaźń",
        "Ærøskøbing Þórður ðæ",
        "Straße STRASSE ẞ",
    ],
    "emoji": [
        "😀",
        "I love it 😍😍😍",
        "👍🏽 👍🏿 👋🏻",
        "👨‍👩‍👧‍👦",
        "👩🏽‍💻 🧑‍🚀 🏳️‍🌈 🏳️‍⚧️",
        "🇺🇸🇯🇵🇩🇪🇫🇷",
        "1️⃣ #️⃣ *️⃣",
        "❤️ ❤ ♥️ ☺️",
        "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland flag",
        "emoji🙂inside🙃words",
        "🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂",
        "🤖: Beep boop! 🚀✨",
    ],
    "combining": [
        "e\u0301",
        "cafe\u0301 na\u0131\u0308ve",
        "a\u0308\u0301 o\u0323\u0302",
        "\u0301leading combining mark",
        "A\u030a vs \u00c5 vs \u212b",
        "n\u0303 vs \u00f1",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
        "\u1e9b\u0323",
        "\ufb01 \ufb02 ligatures",
        "q\u0307\u0323 x\u0323\u0307",
        "\u0915\u093c \u0958",
        "\u00c7a va? \u00e7a va.",
        "Tie\u0302\u0301ng Vie\u0323\u0302t NFD",
    ],
    "fullwidth": [
        "ＡＢＣ　ｄｅｆ！",
        "（全角）ｈｅｌｌｏ，ｗｏｒｌｄ．",
        "ｈｔｔｐｓ：／／ｅｘａｍｐｌｅ．ｃｏｍ",
        "＜｜ｉｍ＿ｅｎｄ｜＞",
        "～！＠＃＄％＾＆＊（）＿＋",
    ],
    "urls": [
        "https://www.example.com/path/to/page?query=1&other=two#section",
        "http://localhost:8080/api/v1/draft",
        "Visit https://github.com/huggingface/tokenizers for more.",
        "mailto:someone@example.org user.name+tag@sub.domain.co.uk",
        "C:\\Users\\Admin\\Documents\\file.txt",
        "/usr/local/bin/webdraft --model ./models/qwen3 --text \"hi\"",
        "ftp://files.example.net/pub/README.md",
        "https://例え.テスト/パス?q=日本",
        "git@github.com:owner/repo.git",
        "192.168.0.1:443 [::1]:8080 2001:db8::ff00:42:8329",
    ],
    "special": [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n",
        "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
        "text before<|endoftext|>text after",
        "a<|im_end|>b<|im_end|>c",
        "<|im_start|><|im_end|><|endoftext|>",
        " <|im_end|> ",
        "  <|im_end|>  ",
        "\n<|im_end|>\n",
        "<|im_start",
        "im_start|>",
        "<|im_end|>>",
        "<<|im_end|>",
        "<|IM_END|>",
        "< |im_end| >",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<tool_response>\nok\n</tool_response>",
        "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
        "<|repo_name|>owner/repo\n<|file_sep|>main.go\npackage main",
        "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>",
        "<|object_ref_start|>cat<|object_ref_end|><|box_start|>(1,2),(3,4)<|box_end|>",
        "<|quad_start|><|quad_end|><|video_pad|><|vision_pad|>",
        "<think></think>",
        "<thinking>not a token</thinking>",
        "<|im_end|>\u0338",
        "x<|endoftext|>\u0301",
        "<|im_start|>user\ncafe\u0301<|im_end|>",
    ],
    "control": [
        "\x00",
        "a\x00b",
        "\x01\x02\x03\x1f",
        "\x7f",
        "\x1b[31mred\x1b[0m",
        "\u00ad soft\u00adhyphen",
        "\ufffd replacement",
        "\ue000\uf8ff private use",
        "\uffff \ufffe nonchar",
        "\U0010fffd \U000f0000",
        "\u200e\u200f\u202a\u202e bidi",
        "\ufe0f\ufe0e variation selectors alone",
    ],
    "unicode_versions": [
        # Unicode 14: Toto, Vithkuqi.
        "x\U0001e290y \U00010570",
        # Unicode 15.0: Kawi letters and digit, CJK Ext H, Nag Mundari, Kaktovik numerals.
        "x\U00011f04y 1\U00011f502 \U00031350\U00031351 \U0001e4d0a \U0001d2c0\U0001d2c1",
        # Unicode 15.1: CJK Ext I.
        "x\U0002ebf0y",
        # Unicode 16.0: Garay, Todhri, Sunuwar, Kirat Rai letters and digits.
        "x\U00010d50y \U000105c0a \U00011bc0b \U00016d43c 1\U00011bf02 1\U00016d702 1\U00010d402",
        # Unicode 16.0 compositions (Kirat Rai, Tulu-Tigalari).
        "\U00016d63\U00016d67 \U000113c2\U000113b8",
        # Unicode 17.0: Sidetic, Tolong Siki, Beria Erfe letters.
        "x\U00010940y \U00011db0a \U00016ea0b",
    ],
    "mixed": [
        "Hello 世界! Привет мир! مرحبا 🌍",
        "The price is ¥1,000 (about $7) — 安い!",
        "Résumé naïve façade coöperate",
        "MLP(x) = W₂·σ(W₁x + b₁) + b₂ where σ is ReLU",
        "∀x∈ℝ: x² ≥ 0 ∧ ∑ᵢ aᵢ ≤ ∞ → ∫f dμ",
        "→ ← ↑ ↓ ⇒ ⇔ ★ ☆ ♠ ♣ ✓ ✗",
        "©2024 ™ ® § ¶ † ‡ • … ‰",
        "ASCII art:\n  /\\_/\\\n ( o.o )\n  > ^ <\n",
        "----====****####____",
        "!!!???...,,,;;;:::",
        "(((nested))) [[[brackets]]] {{{braces}}}",
        "word.word,word;word:word!word?word",
        "a-b_c.d/e\\f|g",
        "tab\tseparated\tvalues\t1\t2.5\tx",
        "x==y!=z<=w>=v&&u||t",
        "Email me at a@b.co!\nThanks,\n-- \nSig",
        "Dear Sir/Madam,\r\n\r\nPlease find attached.\r\n\r\nRegards\r\n",
        "1. first\n2. second\n   - nested\n   - items\n3. third",
        "> quoted\n>> double quoted\n\nnormal",
        "**bold** _italic_ `code` ~~strike~~ [link](http://x.y)",
    ],
}

# Fragments for generated strings: chosen to hit the pre-tokenizer's
# alternatives and their boundaries.
FRAGMENTS = [
    "a", "Z", "word", "Word", "WORD", "é", "e\u0301", "ß", "ſ", "中文", "日本", "한국", "Ωμέγα", "Дом",
    "عربي", "עברית", "हिन्दी", "ไทย", "0", "7", "42", "٣", "①", "Ⅻ", "½", "１",
    " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2028", "\u0085",
    "'", "'s", "'S", "'re", "'LL", "'d", "'ve", "'M", "'t", "'x",
    ".", ",", "!", "?", "...", "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "\"",
    "#", "@", "$", "%", "^", "&", "*", "+", "=", "|", "~", "`", ";", ":", "—", "…", "«", "»",
    "😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "\u200d", "\ufe0f", "\u0301", "\u0308", "\u0338",
    "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|im_start|>", "<|", "|>",
    "http://", "x.com", "\x00", "\x7f", "\ufeff", "\u200b",
]


def generated(n, seed=20240601):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(1, 24)
        out.append((f"generated/{i:03d}", "".join(rng.choice(FRAGMENTS) for _ in range(k))))
    return out


def repeats():
    return [
        ("repeat/a5000", "a" * 5000),
        ("repeat/space5000", " " * 5000),
        ("repeat/space5000x", " " * 5000 + "x"),
        ("repeat/newline1000", "\n" * 1000),
        ("repeat/crlf500", "\r\n" * 500),
        ("repeat/tab500", "\t" * 500),
        ("repeat/ab2000", "ab" * 2000),
        ("repeat/a_space2000", "a " * 2000),
        ("repeat/digits1000", "1234567890" * 100),
        ("repeat/bang3000", "!" * 3000),
        ("repeat/emoji500", "🙂" * 500),
        ("repeat/zh1000", "中文" * 500),
        ("repeat/longword", "Pneumonoultramicroscopicsilicovolcanoconiosis" * 20),
        ("repeat/hyphens", "-" * 200 + "\n" + "=" * 200),
        ("repeat/mixedlong", "x" * 100 + " " * 100 + "y" * 100 + "\n" * 10 + "z" * 60),
    ]


def long_docs(corpus):
    """Cuts of the corpus, starting at part headers so each is a real document."""
    docs = []
    for header, length in [
        ("==> GOROOT/src/net/http/server.go <==", 40000),
        ("==> GOROOT/doc/go_spec.html <==", 30000),
        ("==> x/text/encoding/testdata/rashomon-utf-8.txt <==", 18000),
        ("==> x/text/encoding/testdata/candide-utf-8.txt <==", 12000),
        ("==> paragraph/ru <==", 6000),
    ]:
        i = corpus.index(header)
        docs.append(("long/" + header.split()[1].replace("/", "_"), corpus[i : i + length]))
    return docs


def inputs(corpus):
    out = []
    for cat, items in HAND.items():
        for i, s in enumerate(items):
            out.append((f"{cat}/{i:02d}", s))
    out += generated(150)
    out += repeats()
    out += long_docs(corpus)
    return out


# Added tokens with the flags Qwen3's own tokens leave false, appended to the
# Qwen3 tokenizer.json's added_tokens for the "flags" golden cases. ("hello" is
# in the model's vocabulary, so HF gives it that id rather than a new one.)
def _added(content, **flags):
    tok = {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": False}
    tok.update(flags)
    return tok


FLAG_TOKENS = [
    _added("<ls>", lstrip=True),
    _added("<rs>", rstrip=True),
    _added("<both>", lstrip=True, rstrip=True, special=True),
    _added("hello", single_word=True),
    _added("w\u00f6rd", single_word=True, normalized=True),
    _added("caf\u00e9", normalized=True),
    _added("e\u0301x"),
    _added("<sp>", special=True, normalized=True),
    _added("@@", single_word=True, rstrip=True),
]

FLAG_TEXTS = [
    "a <ls> b", "a  \t<ls>  b", "<ls>x", "x<ls>", "\n\n<ls>", " <rs> x", "x <rs>\n\ny", "x<rs>",
    " <both> ", "a\u3000<both>\u3000b", "<ls><ls>  <ls>", "<rs>  <rs>", "<rs> <ls>", "say hello world",
    "sayhello world", "hello", "hello_x", "(hello)", "hello,hello hello", "hello\u0301", "x hello2",
    "w\u00f6rd w\u00f6rds", "wo\u0308rd!", "caf\u00e9 and cafe\u0301", "cafe\u0301s",
    "e\u0301x and \u00e9x", "<sp> <sp>", "@@ @@x x@@", "a @@  b", "<|im_end|> <ls> <|im_end|>",
    "hello<|endoftext|>hello", "\u00dcn\u00efc\u00f6d\u00e9 <both>\u00a0x", "",
]
