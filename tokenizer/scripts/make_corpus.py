#!/usr/bin/env python3
"""Build tokenizer/testdata/corpus.txt.gz, the mixed benchmark corpus (~1.1 MB).

It concatenates, each part headed by a line "==> NAME <==":
  - Go sources and docs from GOROOT (Go, HTML, assembly, C, JS, Perl, Python,
    shell; BSD-3-Clause, the Go Authors),
  - the UTF-8 texts in golang.org/x/text/encoding/testdata (French, Japanese,
    Chinese, Korean classics; public domain, distributed with x/text under
    BSD-3-Clause),
  - the short multilingual paragraphs below (written for this corpus).

Run from the repository root (needs `go` and golang.org/x/text in the module
cache, as go.mod pins it):
    python3 tokenizer/scripts/make_corpus.py
The output is byte-for-byte reproducible for a given Go version and x/text
version; the committed file was made with go1.26.8 and x/text v0.42.0.
"""
import gzip
import os
import subprocess

GOROOT_FILES = [
    "doc/go_spec.html",
    "doc/go_mem.html",
    "src/net/http/server.go",
    "src/go/parser/parser.go",
    "src/regexp/syntax/parse.go",
    "src/encoding/json/encode.go",
    "src/strings/strings.go",
    "src/fmt/print.go",
    "src/cmd/go/alldocs.go",
    "src/runtime/asm_amd64.s",
    "src/runtime/cgo/gcc_libinit.c",
    "src/runtime/runtime-gdb.py",
    "lib/wasm/wasm_exec.js",
    "src/syscall/mksyscall.pl",
    "src/make.bash",
]

XTEXT_FILES = [
    "encoding/testdata/candide-utf-8.txt",
    "encoding/testdata/rashomon-utf-8.txt",
    "encoding/testdata/sunzi-bingfa-simplified-utf-8.txt",
    "encoding/testdata/sunzi-bingfa-traditional-utf-8.txt",
    "encoding/testdata/unsu-joh-eun-nal-utf-8.txt",
]

PARAGRAPHS = {
    "ru": "Токенизатор разбивает текст на части, которые модель умеет читать. "
    "Сначала строка нормализуется (NFC), затем регулярное выражение делит её на слова, "
    "числа и знаки препинания, а потом алгоритм BPE склеивает байты в токены по рангу слияния.\n"
    "Например, «Привет, мир!» превращается в несколько токенов, а редкое слово — в много коротких. "
    "В 2024 году модели Qwen3 получили словарь из 151 669 токенов.\n",
    "uk": "Швидкий бурий лис перестрибує через ледачого пса. Ґанок, їжак, єнот і щука — "
    "усі літери української абетки мають свої байти в UTF-8.\n",
    "ar": "المُرمِّز يقسم النص إلى وحدات صغيرة تُسمّى الرموز. تبدأ العملية بتوحيد الشكل، "
    "ثم يُقسَّم النص إلى كلمات وأرقام وعلامات ترقيم، وأخيراً تُدمج البايتات وفق ترتيب الدمج. "
    "في عام ٢٠٢٤ صدر النموذج، وعدد رموزه ١٥١٦٦٩ رمزاً.\n",
    "fa": "این یک متن آزمایشی به زبان فارسی است که برای سنجش سرعت نوشته شده است؛ "
    "اعداد فارسی مانند ۱۲۳۴ هم در آن آمده‌اند.\n",
    "he": "מפרק האסימונים מחלק את הטקסט לחלקים קטנים. שָׁלוֹם עֲלֵיכֶם! "
    "המספר 42 הוא התשובה.\n",
    "hi": "टोकनाइज़र पाठ को छोटे टुकड़ों में बाँटता है। पहले पाठ को सामान्य किया जाता है, "
    "फिर शब्दों, अंकों और विराम चिह्नों में बाँटा जाता है। संख्या १२३४५ भी एक उदाहरण है।\n",
    "el": "Ο αναλυτής λεκτικών μονάδων χωρίζει το κείμενο σε μικρά κομμάτια. "
    "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν.\n",
    "th": "ตัวตัดคำแบ่งข้อความออกเป็นส่วนเล็ก ๆ ภาษาไทยไม่มีช่องว่างระหว่างคำ "
    "จึงเป็นกรณีทดสอบที่ดี ปี ๒๕๖๗\n",
    "vi": "Bộ tách từ chia văn bản thành các phần nhỏ. Tiếng Việt có rất nhiều dấu: "
    "ă, â, đ, ê, ô, ơ, ư và các thanh huyền, sắc, hỏi, ngã, nặng.\n",
    "tr": "Hızlı kahverengi tilki tembel köpeğin üzerinden atlar. İstanbul'da ılık bir "
    "akşam; ĞÜŞİÖÇ ğüşıöç.\n",
    "de": "Die Straße ist naß, und Jürgen fährt trotzdem mit dem Fahrrad zur Universität. "
    "Größenordnungen wie 3,5 Mio. € sind üblich.\n",
    "es": "¿Dónde está la biblioteca? ¡Qué día tan bonito! El niño comió piñones en "
    "la montaña.\n",
    "pl": "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.\n",
    "ka": "ქართული ენა ერთ-ერთი უძველესი ენაა კავკასიაში.\n",
    "hy": "Հայերենը հնդեվրոպական լեզվաընտանիքի առանձին ճյուղ է։\n",
    "am": "የአማርኛ ቋንቋ በኢትዮጵያ ውስጥ በስፋት ይነገራል።\n",
    "ta": "தமிழ் மொழி உலகின் மிகப் பழமையான மொழிகளில் ஒன்றாகும்.\n",
    "bn": "বাংলা ভাষা দক্ষিণ এশিয়ার একটি প্রধান ভাষা। ১২৩৪৫\n",
    "chat": "lol that's hilarious 😂😂😂 can't believe u did that!!! 👍🏽🔥\n"
    "family: 👨‍👩‍👧‍👦 flags: 🇺🇸🇯🇵🇩🇪 heart: ❤️ rainbow: 🏳️‍🌈 keycap: 1️⃣\n"
    "ＦＵＬＬ－ＷＩＤＴＨ　ｔｅｘｔ（全角）！ and ｶﾀｶﾅ half-width\n",
}


def main():
    goroot = subprocess.check_output(["go", "env", "GOROOT"], text=True).strip()
    xtext = subprocess.check_output(
        ["go", "list", "-m", "-f", "{{.Dir}}", "golang.org/x/text"], text=True
    ).strip()
    parts = []
    for rel in GOROOT_FILES:
        with open(os.path.join(goroot, rel), encoding="utf-8") as f:
            parts.append(("GOROOT/" + rel, f.read()))
    for rel in XTEXT_FILES:
        with open(os.path.join(xtext, rel), encoding="utf-8") as f:
            parts.append(("x/text/" + rel, f.read()))
    for lang, text in PARAGRAPHS.items():
        parts.append(("paragraph/" + lang, text))
    corpus = "".join(f"==> {name} <==\n{text}\n" for name, text in parts)
    out = os.path.join(os.path.dirname(__file__), "..", "testdata", "corpus.txt.gz")
    with open(out, "wb") as f:
        f.write(gzip.compress(corpus.encode("utf-8"), compresslevel=9, mtime=0))
    print(f"{out}: {len(corpus.encode('utf-8'))} bytes, {len(parts)} parts")


if __name__ == "__main__":
    main()
