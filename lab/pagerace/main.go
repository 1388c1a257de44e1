// Command pagerace measures the live page's race against a running
// `webdraft serve` over its websocket, as the page's "the server" mode runs
// it: each round a start with race (speculative decoding, then the target
// alone on the same prompt, each token's top 5 read out as the page shows
// them), printing both runs' tokens/s, the speedup and the speculative
// run's τ and mean draft and verification times a step, and whether both
// runs generated the same tokens. With
// --temperature the runs sample (round i with seed i + 1, the same in both
// runs of a round).
//
//	webdraft serve --addr 127.0.0.1:8080 &
//	go run ./lab/pagerace --k 2 --rounds 4
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"

	"github.com/gorilla/websocket"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "the server's address")
	k := flag.Int("k", 2, "draft length")
	n := flag.Int("max-tokens", 40, "tokens a run")
	rounds := flag.Int("rounds", 3, "races")
	prompt := flag.String("prompt", "import os\n\n\ndef read_config(path):\n    \"\"\"", "the prompt (the page's default)")
	temperature := flag.Float64("temperature", 0, "sampling temperature (0: greedy)")
	flag.Parse()
	if err := run(*addr, *prompt, *k, *n, *rounds, *temperature); err != nil {
		slog.Error("pagerace", "err", err)
		os.Exit(1)
	}
}

func run(addr, prompt string, k, n, rounds int, temperature float64) error {
	u := url.URL{Scheme: "ws", Host: addr, Path: "/ws"}
	d := websocket.Dialer{Subprotocols: []string{"webdraft"}}
	c, _, err := d.Dial(u.String(), http.Header{"Origin": {"http://" + addr}})
	if err != nil {
		return fmt.Errorf("dial %s: %w", u.String(), err)
	}
	defer c.Close()
	for round := range rounds {
		start := map[string]any{"type": "start", "prompt": prompt, "k": k, "max_tokens": n, "race": true, "temperature": temperature, "top_p": 1, "seed": round + 1}
		if err := c.WriteJSON(start); err != nil {
			return err
		}
		var draftMS, verifyMS float64
		tau := 0.0
		steps := 0
	events:
		for {
			var m map[string]any
			if err := c.ReadJSON(&m); err != nil {
				return err
			}
			switch m["type"] {
			case "step":
				if m["run"] == "speculative" {
					steps++
					draftMS += m["draft_ms"].(float64)
					verifyMS += m["verify_ms"].(float64)
				}
			case "done":
				if m["run"] == "speculative" {
					tau = m["tau"].(float64)
				}
			case "race":
				same := "the same tokens"
				if m["same_tokens"] != true {
					same = "different tokens"
				}
				fmt.Printf("k %d: speculative %.1f tok/s, target alone %.1f tok/s, %.2f×; τ %.2f; a step %.2f ms drafting, %.2f ms verifying (%d steps); %s\n", k,
					m["speculative_tokens_per_s"], m["target_tokens_per_s"], m["speedup"], tau, draftMS/float64(steps), verifyMS/float64(steps), steps, same)
			case "error":
				return errors.New(fmt.Sprint(m["message"]))
			case "finished":
				break events
			}
		}
	}
	return nil
}
