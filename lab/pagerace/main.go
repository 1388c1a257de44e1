// Command pagerace measures the live page's race against a running
// `webdraft serve` over its websocket, as the page's "the server" mode runs
// it: each round a start with race (speculative decoding, then the target
// alone on the same prompt, each token's top 5 read out as the page shows
// them), printing both runs' tokens/s, the speedup and the speculative
// run's mean draft and verification times a step.
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
	flag.Parse()
	if err := run(*addr, *prompt, *k, *n, *rounds); err != nil {
		slog.Error("pagerace", "err", err)
		os.Exit(1)
	}
}

func run(addr, prompt string, k, n, rounds int) error {
	u := url.URL{Scheme: "ws", Host: addr, Path: "/ws"}
	d := websocket.Dialer{Subprotocols: []string{"webdraft"}}
	c, _, err := d.Dial(u.String(), http.Header{"Origin": {"http://" + addr}})
	if err != nil {
		return fmt.Errorf("dial %s: %w", u.String(), err)
	}
	defer c.Close()
	for range rounds {
		if err := c.WriteJSON(map[string]any{"type": "start", "prompt": prompt, "k": k, "max_tokens": n, "race": true}); err != nil {
			return err
		}
		var draftMS, verifyMS float64
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
			case "race":
				fmt.Printf("k %d: speculative %.1f tok/s, target alone %.1f tok/s, %.2f×; a step %.2f ms drafting, %.2f ms verifying (%d steps)\n", k,
					m["speculative_tokens_per_s"], m["target_tokens_per_s"], m["speedup"], draftMS/float64(steps), verifyMS/float64(steps), steps)
			case "error":
				return errors.New(fmt.Sprint(m["message"]))
			case "finished":
				break events
			}
		}
	}
	return nil
}
