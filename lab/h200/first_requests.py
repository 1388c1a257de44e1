"""Times a fresh `webdraft serve`'s first requests: how long /health takes
to answer 200 from this script's start, then ROUNDS rounds of the same
requests — a greedy completion, a sampled one, one with logprobs, a
/draft, one after another, then four greedy completions at once — each
with its wall-clock time. With the server's
warm-up the first round runs as fast as the later ones; without it the
first run of each shape builds its pipelines.

    python3 lab/h200/first_requests.py [--addr 127.0.0.1:8096] [--rounds 3] [--tokens 64]
"""
import argparse
import concurrent.futures
import json
import time
import urllib.error
import urllib.request

# No proxy: the server is local (the GPU machine's environment may name one).
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(addr, path, body):
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with opener.open(req, timeout=120) as r:
        out = json.load(r)
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:8096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--wait", type=float, default=120, help="seconds to wait for /health")
    a = ap.parse_args()
    t0 = time.perf_counter()
    while True:
        try:
            with opener.open(f"http://{a.addr}/health", timeout=5) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.perf_counter() - t0 > a.wait:
            raise SystemExit(f"the server was not ready within {a.wait:.0f} s")
        time.sleep(0.05)
    print(f"ready after {time.perf_counter() - t0:.2f} s")
    kinds = [
        ("greedy completion", "/v1/completions", {"prompt": "def fibonacci(n):", "max_tokens": a.tokens, "temperature": 0}),
        ("sampled completion", "/v1/completions", {"prompt": "class Stack:", "max_tokens": a.tokens, "temperature": 0.7, "seed": 3}),
        ("greedy, logprobs 5", "/v1/completions", {"prompt": "import json\n", "max_tokens": a.tokens, "temperature": 0, "logprobs": 5}),
        ("/draft, 16 tokens", "/draft", {"text": "for i in range(10):", "n": 16}),
    ]
    for rnd in range(1, a.rounds + 1):
        for name, path, body in kinds:
            secs, out = post(a.addr, path, body)
            n = out.get("usage", {}).get("completion_tokens", len(out.get("draft", [])))
            print(f"round {rnd}: {name}: {secs * 1000:.1f} ms, {n} tokens")
        prompts = ["def parse(line):", "class Queue:\n    def __init__(self):", "import sys\n\n\ndef main():", "for key, value in"]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            list(ex.map(lambda p: post(a.addr, "/v1/completions", {"prompt": p, "max_tokens": a.tokens, "temperature": 0}), prompts))
        print(f"round {rnd}: {len(prompts)} greedy completions at once: {(time.perf_counter() - t0) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
