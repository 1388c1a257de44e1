// Package prefixcache keeps the KV caches of finished requests so that a later
// request sharing a prefix with one of them prefills only what is new — the
// common case for a verifier, which calls again with the previous tokens plus
// the few it accepted.
//
// Cached sequences are indexed by the tokens their KV cache holds in a radix
// tree (a trie whose edges carry token runs), so the sequence with the longest
// common prefix is found in time proportional to the request's length, and
// they are evicted least recently used first under a budget of cached tokens.
package prefixcache

// node is a radix-tree node: the edge into it carries label; entries are the
// cached sequences whose tokens end exactly here.
type node struct {
	parent   *node
	label    []int
	children map[int]*node // keyed by the first token of the child's label
	entries  map[*Entry]struct{}
	// count is the number of entries in this node's subtree.
	count int
}

func newNode(parent *node, label []int) *node {
	return &node{parent: parent, label: label, children: map[int]*node{}, entries: map[*Entry]struct{}{}}
}

// insert adds e, whose key is e.Tokens, below n.
func (n *node) insert(e *Entry) {
	key := e.Tokens
	cur := n
	for {
		cur.count++
		if len(key) == 0 {
			cur.entries[e] = struct{}{}
			e.node = cur
			return
		}
		child, ok := cur.children[key[0]]
		if !ok {
			leaf := newNode(cur, append([]int(nil), key...))
			cur.children[key[0]] = leaf
			leaf.count++
			leaf.entries[e] = struct{}{}
			e.node = leaf
			return
		}
		k := commonPrefix(child.label, key)
		if k < len(child.label) { // split the edge at k
			mid := newNode(cur, child.label[:k:k])
			mid.count = child.count
			child.label = child.label[k:]
			child.parent = mid
			mid.children[child.label[0]] = child
			cur.children[key[0]] = mid
			child = mid
		}
		cur, key = child, key[k:]
	}
}

// longest walks down as far as tokens match and returns the deepest node
// reached whose subtree holds every entry sharing the longest prefix, and the
// length of that prefix.
func (n *node) longest(tokens []int) (*node, int) {
	cur, depth := n, 0
	for depth < len(tokens) {
		child, ok := cur.children[tokens[depth]]
		if !ok {
			break
		}
		k := commonPrefix(child.label, tokens[depth:])
		depth += k
		cur = child // entries below child share depth tokens, even if k < len(label)
		if k < len(child.label) {
			break
		}
	}
	return cur, depth
}

// any returns an entry of n's subtree, preferring the most recently used
// among those found first on a walk toward the shallowest entries.
func (n *node) any() *Entry {
	var best *Entry
	for e := range n.entries {
		if best == nil || e.lastUse > best.lastUse {
			best = e
		}
	}
	if best != nil {
		return best
	}
	for _, c := range n.children {
		if c.count > 0 {
			return c.any()
		}
	}
	return nil
}

// remove deletes e from the tree, pruning empty nodes and merging chains.
func (e *Entry) remove() {
	n := e.node
	delete(n.entries, e)
	e.node = nil
	for p := n; p != nil; p = p.parent {
		p.count--
	}
	for n.parent != nil && n.count == 0 {
		delete(n.parent.children, n.label[0])
		n = n.parent
	}
	// A non-root node with no entries and one child merges into it.
	if n.parent != nil && len(n.entries) == 0 && len(n.children) == 1 {
		for _, c := range n.children {
			c.label = append(append([]int(nil), n.label...), c.label...)
			c.parent = n.parent
			n.parent.children[c.label[0]] = c
		}
	}
}

func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
