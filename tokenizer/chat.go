package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// Message is one turn of a conversation.
type Message struct {
	Role    string `json:"role"` // "system", "user", "assistant" or "tool"
	Content string `json:"content"`
}

// ApplyChatTemplate renders msgs with Qwen3's chat template (the Jinja
// template in Qwen3's tokenizer_config.json, without tool definitions):
//
//	<|im_start|>system\n{system}<|im_end|>\n
//	<|im_start|>user\n{user}<|im_end|>\n
//	<|im_start|>assistant\n{answer}<|im_end|>\n
//
// Assistant turns after the last user query keep their reasoning, written
// as <think>\n…\n</think>\n\n; earlier ones lose it. addGenerationPrompt
// appends "<|im_start|>assistant\n", and with enableThinking false also the
// empty block "<think>\n\n</think>\n\n" that tells Qwen3 not to think.
// The result is text: encode it with Encode, which matches the special
// tokens in it.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt, enableThinking bool) (string, error) {
	return applyQwen3Template(msgs, addGenerationPrompt, enableThinking)
}

func applyQwen3Template(msgs []Message, addGenerationPrompt, enableThinking bool) (string, error) {
	if len(msgs) == 0 {
		return "", errors.New("chat template: no messages")
	}
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			return "", fmt.Errorf("chat template: messages[%d].role %q is not system, user, assistant or tool", i, m.Role)
		}
	}
	var b strings.Builder
	if msgs[0].Role == "system" {
		b.WriteString("<|im_start|>system\n" + msgs[0].Content + "<|im_end|>\n")
	}

	// The last user message that is a query, not a tool response.
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == "user" && !(strings.HasPrefix(m.Content, "<tool_response>") && strings.HasSuffix(m.Content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}

	for i, m := range msgs {
		last := i == len(msgs)-1
		switch {
		case m.Role == "user" || (m.Role == "system" && i > 0):
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		case m.Role == "assistant":
			content, reasoning := m.Content, ""
			if before, after, ok := cutLast(m.Content, "</think>"); ok {
				content = strings.TrimLeft(after, "\n")
				before, _, _ = strings.Cut(m.Content, "</think>") // split('</think>')[0]
				before = strings.TrimRight(before, "\n")
				if _, r, ok := cutLast(before, "<think>"); ok {
					before = r
				}
				reasoning = strings.TrimLeft(before, "\n")
			}
			if i > lastQuery && (last || reasoning != "") {
				b.WriteString("<|im_start|>assistant\n<think>\n" + strings.Trim(reasoning, "\n") +
					"\n</think>\n\n" + strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString("<|im_start|>assistant\n" + content)
			}
			b.WriteString("<|im_end|>\n")
		case m.Role == "tool":
			if i == 0 || msgs[i-1].Role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if last || msgs[i+1].Role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
		if !enableThinking {
			b.WriteString("<think>\n\n</think>\n\n")
		}
	}
	return b.String(), nil
}

// cutLast splits s around the last sep.
func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
