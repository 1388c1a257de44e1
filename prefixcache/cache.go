package prefixcache

import (
	"container/list"

	"webdraft/engine"
)

// Entry is one cached sequence: its KV cache holds exactly Tokens.
type Entry struct {
	Tokens  []int
	Seq     engine.Sequence
	lastUse uint64
	node    *node
	lru     *list.Element
}

// Cache holds idle sequences under a budget of cached tokens. It is not safe
// for concurrent use: the scheduler owns it.
type Cache struct {
	root   *node
	budget int // tokens
	tokens int // tokens held by cached entries
	clock  uint64
	lru    *list.List // of *Entry, most recently used at the front
}

// New returns an empty cache holding at most budget tokens.
func New(budget int) *Cache {
	return &Cache{root: newNode(nil, nil), budget: budget, lru: list.New()}
}

// Len is the number of cached sequences; Tokens the positions they hold.
func (c *Cache) Len() int    { return c.lru.Len() }
func (c *Cache) Tokens() int { return c.tokens }

// Take removes and returns the cached sequence sharing the longest prefix
// with tokens, and the length of that prefix; nil and 0 when none shares any.
// The caller truncates the sequence to what it reuses.
func (c *Cache) Take(tokens []int) (*Entry, int) {
	n, depth := c.root.longest(tokens)
	if depth == 0 {
		return nil, 0
	}
	e := n.any()
	if e == nil {
		return nil, 0
	}
	c.drop(e)
	return e, depth
}

// Put caches seq, whose KV cache holds tokens, then evicts least recently
// used entries (releasing their sequences) until the budget holds.
func (c *Cache) Put(tokens []int, seq engine.Sequence) {
	c.clock++
	e := &Entry{Tokens: tokens, Seq: seq, lastUse: c.clock}
	c.root.insert(e)
	e.lru = c.lru.PushFront(e)
	c.tokens += len(tokens)
	c.Shrink(c.budget)
}

// Shrink evicts least recently used entries until at most limit tokens are
// cached, and reports whether it got there.
func (c *Cache) Shrink(limit int) bool {
	for c.tokens > limit && c.lru.Len() > 0 {
		oldest := c.lru.Back().Value.(*Entry)
		c.drop(oldest)
		oldest.Seq.Release()
	}
	return c.tokens <= limit
}

// Clear releases every cached sequence.
func (c *Cache) Clear() { c.Shrink(0) }

func (c *Cache) drop(e *Entry) {
	e.remove()
	c.lru.Remove(e.lru)
	c.tokens -= len(e.Tokens)
}
